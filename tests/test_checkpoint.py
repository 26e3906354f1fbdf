"""Reading a checkpoint from its safetensors headers only: the tensors, and one line for a broken download.

The checkpoints are sparse files with real headers (tests/checkpoints.py): a Qwen3-Next-80B checkpoint of
160 GB takes a few MB of disk. Every bad input is one ConfigError line naming the file, read before any
tensor data, and the reader never reads a byte past a shard's header.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from checker.core.errors import ConfigError
from checker.core.weights.checkpoint import (
    INDEX_NAME,
    MAX_HEADER_BYTES,
    has_safetensors,
    read_checkpoint,
    read_header,
)
from checker.families.rules import check_shapes, expected_tensors
from tests.checkpoints import disk_bytes, header_bytes, model_dir, write_checkpoint, write_shard

FIXTURES = Path(__file__).parent / "fixtures"
KIMI = FIXTURES / "kimi_linear_48b_a3b.json"
NEMOTRON = FIXTURES / "nemotron_h_8b.json"

SMALL = [
    ("model.embed_tokens.weight", (1024, 64), "BF16"),
    ("model.layers.0.linear_attn.A_log", (8,), "F32"),
    ("model.norm.weight", (64,), "BF16"),
]


def one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_real_sized_checkpoint_is_read_from_headers_on_a_few_mb_of_disk(tmp_path: Path) -> None:
    """Kimi-Linear-48B's 20,493 tensors over 8 shards: every tensor's dtype and shape comes back, and the
    logical size (what the headers say) is the model's 98 GB while the disk holds only headers."""
    d = model_dir(tmp_path / "m", KIMI, shards=8)
    ckpt = read_checkpoint(d)
    want = dict(expected_tensors(json.loads(KIMI.read_text())))
    assert set(ckpt.tensors) == set(want)
    assert ckpt.tensors["model.layers.3.self_attn.kv_b_proj.weight"].shape == (8192, 512)
    assert ckpt.tensors["model.layers.0.self_attn.A_log"].dtype == "F32"
    assert len(ckpt.shards) == 8 and ckpt.indexed
    assert 98e9 < ckpt.total_bytes < 99e9
    assert disk_bytes(d) < 8 * 2**20
    assert ckpt.header_bytes < 4 * 2**20


def test_reads_stop_at_the_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No read goes past ``8 + N`` bytes of a shard: the data region is never touched."""
    d = tmp_path / "m"
    d.mkdir()
    head, data = header_bytes(SMALL)
    write_shard(d / "model.safetensors", SMALL)
    reads: list[tuple[int, int]] = []
    real = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        reads.append((offset, n))
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    ckpt = read_checkpoint(d)
    assert set(ckpt.tensors) == {t[0] for t in SMALL}
    assert reads and max(off + n for off, n in reads) <= len(head)
    assert ckpt.header_bytes == len(head)
    assert data > 0


def test_without_an_index_every_shard_in_the_directory_is_read(tmp_path: Path) -> None:
    d = tmp_path / "m"
    write_checkpoint(d, SMALL, shards=2, index=False)
    ckpt = read_checkpoint(d)
    assert not ckpt.indexed and len(ckpt.shards) == 2 and len(ckpt.tensors) == 3
    assert has_safetensors(d)
    assert not has_safetensors(tmp_path)


def _broken(tmp_path: Path) -> Path:
    d = tmp_path / "m"
    write_checkpoint(d, SMALL, shards=2)
    return d


def test_a_shard_the_index_names_but_the_directory_lacks(tmp_path: Path) -> None:
    d = _broken(tmp_path)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    text = one_line(exc)
    assert "names shard 'model-00002-of-00002.safetensors'" in text and "does not hold" in text
    assert "re-download" in text


def test_a_truncated_shard(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    head, data = header_bytes(SMALL)
    write_shard(d / "model.safetensors", SMALL, data_bytes=data - 1000)
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    text = one_line(exc)
    assert "truncated" in text and "1,000 bytes missing" in text


def test_headers_read_again_are_the_same_answer_and_a_change_is_seen(tmp_path: Path) -> None:
    """The same shard headers read again (another release of ``--sglang-version A,B``, another test) come
    from the parsed-header cache: the same tensors, and nothing the caller does to its copy reaches the
    next reader. A shard rewritten in place with other shapes, or cut short under the same header, is
    read as it now is."""
    d = tmp_path / "m"
    d.mkdir()
    write_shard(d / "model.safetensors", SMALL)
    first = read_checkpoint(d)
    shard = d / "model.safetensors"
    found, _ = read_header(shard, shard.name)
    del found["model.norm.weight"]  # a caller's dict, changed
    assert "model.norm.weight" in read_header(shard, shard.name)[0]
    assert read_checkpoint(d).tensors == first.tensors
    wider = [(n, (2 * shape[0], *shape[1:]), dt) for n, shape, dt in SMALL]
    write_shard(d / "model.safetensors", wider)
    assert read_checkpoint(d).tensors["model.norm.weight"].shape == (128,)
    head, data = header_bytes(wider)
    write_shard(d / "model.safetensors", wider, data_bytes=data - 8)
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    assert "8 bytes missing" in one_line(exc)


def test_a_header_longer_than_its_file(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    head, _ = header_bytes(SMALL)
    (d / "model.safetensors").write_bytes(head[: len(head) // 2])
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    text = one_line(exc)
    assert f"declares a {len(head) - 8:,}-byte header but the file is {len(head) // 2:,} bytes" in text


def test_a_header_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes((MAX_HEADER_BYTES + 1).to_bytes(8, "little") + b"{}")
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    assert f"over the {MAX_HEADER_BYTES:,}-byte cap" in one_line(exc)


def test_a_file_shorter_than_the_length_word(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    assert "shorter than the 8-byte header length" in one_line(exc)


@pytest.mark.parametrize(
    "entry, words",
    [
        (
            {"dtype": "Q4_K", "shape": [4], "data_offsets": [0, 4]},
            "dtype 'Q4_K', which safetensors does not define",
        ),
        ({"dtype": "BF16", "shape": [4, -1], "data_offsets": [0, 8]}, "has shape [4, -1]"),
        ({"dtype": "BF16", "shape": [4], "data_offsets": [0]}, "has data_offsets [0]"),
        ({"dtype": "BF16", "shape": [4], "data_offsets": [0, 6]}, "takes 8 bytes (a corrupt header)"),
        ("BF16", "is a string"),
    ],
)
def test_a_bad_header_entry(tmp_path: Path, entry: object, words: str) -> None:
    d = tmp_path / "m"
    d.mkdir()
    raw = json.dumps({"w": entry}).encode()
    (d / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 64)
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    text = one_line(exc)
    assert words in text and "tensor 'w'" in text


def test_a_header_that_is_not_json(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes((4).to_bytes(8, "little") + b"\xff\xfe{[")
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    assert "its header is not JSON" in one_line(exc)


def test_an_index_that_points_outside_the_directory(tmp_path: Path) -> None:
    d = _broken(tmp_path)
    (d / INDEX_NAME).write_text(json.dumps({"weight_map": {"w": "../../etc/x.safetensors"}}))
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    assert "outside the model directory" in one_line(exc)


def test_an_index_whose_tensor_is_in_no_shard(tmp_path: Path) -> None:
    d = _broken(tmp_path)
    doc = json.loads((d / INDEX_NAME).read_text())
    doc["weight_map"]["model.layers.9.mlp.gate.weight"] = "model-00001-of-00002.safetensors"
    (d / INDEX_NAME).write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    text = one_line(exc)
    assert "places tensor 'model.layers.9.mlp.gate.weight' in 'model-00001-of-00002.safetensors'" in text
    assert "but no shard holds it" in text


def test_a_tensor_in_two_shards(tmp_path: Path) -> None:
    d = tmp_path / "m"
    write_checkpoint(d, SMALL, shards=1, index=False)
    write_shard(d / "extra.safetensors", SMALL[:1])
    with pytest.raises(ConfigError) as exc:
        read_checkpoint(d)
    assert "is in two shards" in one_line(exc)


def test_a_tensor_whose_shape_contradicts_config_json(tmp_path: Path) -> None:
    """A shard of another model beside this config.json: the first tensor whose shape the config
    contradicts is named with both shapes."""
    cfg = json.loads(NEMOTRON.read_text())
    layer = cfg["hybrid_override_pattern"].index("*")  # the first attention layer
    bad = f"backbone.layers.{layer}.mixer.k_proj.weight"
    tensors = [(n, (s[0] * 2,) + s[1:] if n == bad else s, "BF16") for n, s in expected_tensors(cfg)]
    d = tmp_path / "m"
    write_checkpoint(d, tensors, shards=2)
    ckpt = read_checkpoint(d)
    with pytest.raises(ConfigError) as exc:
        check_shapes(ckpt, cfg)
    text = one_line(exc)
    assert bad in text and "shape [2048, 4096] but" in text and "gives [1024, 4096]" in text


def test_a_consistent_checkpoint_passes_the_shape_check(tmp_path: Path) -> None:
    cfg = json.loads(NEMOTRON.read_text())
    d = model_dir(tmp_path / "m", NEMOTRON, shards=3)
    assert check_shapes(read_checkpoint(d), cfg) == len(list(expected_tensors(cfg)))
