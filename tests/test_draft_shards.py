"""The speculative draft's shards held to its class (issue 39 item 3, with item 2's rules): the target's own
``mtp.*`` tensors under EAGLE/NEXTN, a separate ``--speculative-draft-model-path`` directory's shards, and
Kimi-K3, for which no release has a NEXTN class.

Checkpoints are sparse safetensors (tests/checkpoints.py) of Qwen3-Next-80B-A3B's and SpecForge's EAGLE3
config.json shapes; the CLI cases cut Qwen3-Next to 4 layers and 16 experts (every tensor keeps its real
shape) so that a whole directory is written in well under a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import ConfigError
from checker.core.weights.checkpoint import read_checkpoint
from checker.families.drafts import check_draft_checkpoint, check_mtp_shards, eagle3_tensors
from tests.checkpoints import Spec, model_dir, mtp_tensors, write_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
QWEN3_NEXT = json.loads((FIXTURES / "qwen3_next_80b_a3b.json").read_text())
SMALL = dict(QWEN3_NEXT, num_hidden_layers=4, num_experts=16, num_experts_per_tok=4)
EAGLE3 = json.loads((FIXTURES / "weights/eagle3_qwen3_next_draft.json").read_text())
DERIVE = ["derive", "--gpu-free-gib", "139", "--format", "json", "--sglang-version", "0.5.23", "--"]
LAUNCH = ["--tp-size", "2", "--mem-fraction-static", "0.85", "--speculative-algorithm", "NEXTN"]


def _target(path: Path, *, mtp: list[Spec]) -> Path:
    config = path.parent / f"{path.name}.json"
    config.write_text(json.dumps(SMALL))
    return model_dir(path, config, shards=2, extra=mtp)


def _only(path: Path, config: dict[str, Any], tensors: list[Spec]) -> Path:
    write_checkpoint(path, tensors, shards=2)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_target_without_mtp_tensors_under_nextn_is_one_line_and_exit_2(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """SGLang starts it: Qwen3NextForCausalLMMTP's load_weights keeps only names with 'mtp'
    (qwen3_next.py:1173-1175) and no loader checks a parameter was filled, so its draft would run on
    torch.empty memory. The checker refuses that in one line; the same checkpoint with its mtp.* tensors
    (as published) is sized, draft included, and without speculative decoding it needs none."""
    bare = _target(tmp_path / "bare", mtp=[])
    code, out, err = cli([*DERIVE, "--model-path", str(bare), *LAUNCH])
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and "no mtp.* tensor" in line and "uninitialised memory" in line
    assert "qwen3_next.py:1173-1184" in line
    code, out, err = cli([*DERIVE, "--model-path", str(bare), *LAUNCH[:4]])
    assert code == 0, err
    whole = _target(tmp_path / "whole", mtp=mtp_tensors(SMALL))
    code, out, err = cli([*DERIVE, "--model-path", str(whole), *LAUNCH])
    assert code == 0, err
    assert min(r["draft_bytes"] for r in json.loads(out)["weights"]["per_rank"]) > 0


@pytest.mark.parametrize(
    "change, words",
    [
        (
            lambda t: [x for x in t if x[0] != "mtp.layers.0.self_attn.k_proj.weight"],
            "tensor 'mtp.layers.0.self_attn.k_proj.weight' is in no shard",
        ),
        (
            lambda t: [x for x in t if ".experts.7." not in x[0]],
            "mtp.layers.0.mlp.experts.7.gate_proj.weight",
        ),
        (
            lambda t: [(n, (s[0], s[1] // 2) if n == "mtp.fc.weight" else s, d) for n, s, d in t],
            "has shape [2048, 2048] but",
        ),
    ],
    ids=["missing-attention", "missing-expert", "fc-shape"],
)
def test_an_mtp_tensor_missing_or_misshapen_is_named_in_one_line(
    tmp_path: Path, change: Callable[[list[Spec]], list[Spec]], words: str
) -> None:
    d = _only(tmp_path / "ck", SMALL, change(mtp_tensors(SMALL)))
    with pytest.raises(ConfigError) as exc:
        check_mtp_shards(read_checkpoint(d), SMALL, release="0.5.23", source="config.json")
    msg = str(exc.value)
    assert words in msg and "Qwen3NextForCausalLMMTP" in msg and "\n" not in msg
    if "shape" in words:
        assert "model-0000" in msg  # the shard that holds it


def _eagle3(names: Callable[[str], str] = lambda n: n) -> list[Spec]:
    return [(names(n), s, "BF16") for n, s in eagle3_tensors(EAGLE3, "0.5.23", "config.json")]


def test_a_whole_eagle3_draft_directory_passes_under_either_naming(tmp_path: Path) -> None:
    """SpecForge writes 'midlayer.*' (legacy, mapped to layers.0 by llama_eagle3.py:336-341) or
    'model.layers.0.*'; both load, extra tensors (d2t, t2d, an embedding) are skipped by load_weights."""
    extra: list[Spec] = [("d2t", (32000,), "I64"), ("t2d", (151936,), "BOOL")]
    legacy = _only(tmp_path / "a", EAGLE3, _eagle3(lambda n: n.replace("layers.0", "midlayer")) + extra)
    check_draft_checkpoint(str(legacy), release="0.5.23")
    prefixed = _only(tmp_path / "b", EAGLE3, _eagle3(lambda n: "model." + n))
    check_draft_checkpoint(str(prefixed), release="0.5.23")
    # no shards: nothing to hold, the figure is config.json's
    (tmp_path / "c").mkdir()
    (tmp_path / "c/config.json").write_text(json.dumps(EAGLE3))
    check_draft_checkpoint(str(tmp_path / "c"), release="0.5.23")


@pytest.mark.parametrize(
    "tensors, words",
    [
        ([x for x in _eagle3() if x[0] != "lm_head.weight"], "tensor 'lm_head.weight' is in no shard"),
        ([x for x in _eagle3() if "hidden_norm" not in x[0]], "layers.0.hidden_norm.weight"),
        (
            [(n, (s[0], s[1] // 2) if "q_proj" in n else s, d) for n, s, d in _eagle3()],
            "has shape [4096, 2048] but",
        ),
        ([(n, s, "F8_E4M3" if "o_proj" in n else d) for n, s, d in _eagle3()], "is F8_E4M3"),
    ],
    ids=["head", "hidden-norm", "qkv-width", "float8"],
)
def test_an_eagle3_draft_directory_that_contradicts_its_class_is_one_line_and_exit_2(
    tmp_path: Path, tensors: list[Spec], words: str, cli: Callable[..., Any]
) -> None:
    """The draft's shards are read beside the target's (here a 4-layer Qwen3-Next): a tensor the class
    loads that no shard holds (its parameter stays uninitialised: EAGLE3's load_weights skips a miss), a
    shape the weight loader rejects, float8 under a config that declares no quantization."""
    target = _target(tmp_path / "target", mtp=mtp_tensors(SMALL))
    draft = _only(tmp_path / "draft", EAGLE3, tensors)
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft)]
    code, out, err = cli([*DERIVE, "--model-path", str(target), *LAUNCH[:4], *spec])
    assert code == 2 and out == "", err
    assert words in err and "\n" not in err.strip()


def test_a_separate_mtp_directory_without_mtp_tensors_is_refused(tmp_path: Path) -> None:
    """A Qwen3-Next directory given as the draft becomes Qwen3NextForCausalLMMTP, which reads only its
    mtp.* tensors: shards that hold only the target's leave the draft uninitialised."""
    d = _only(tmp_path / "d", SMALL, [("model.norm.weight", (2048,), "BF16")])
    with pytest.raises(ConfigError, match="no mtp.\\* tensor"):
        check_draft_checkpoint(str(d), release="0.5.23")


def test_kimi_k3_under_nextn_is_refused_in_one_line(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """No release has a NEXTN/MTP class for Kimi-K3 (configs/model_config.py rewrites no Kimi architecture
    for the draft): the draft worker would build KimiK3ForConditionalGeneration whole from --model-path.
    Its config declaring a NEXTN layer names the target dropping it (kimi_k3.py:3199-3205)."""
    config = json.loads((FIXTURES / "kimi_k3_config.json").read_text())
    config["text_config"]["num_nextn_predict_layers"] = 1
    d = tmp_path / "k3"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    code, out, err = cli([*DERIVE, "--model-path", str(d), "--tp-size", "8", *LAUNCH[2:]])
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and "no NEXTN/MTP draft class for Kimi-K3" in line
    assert "KimiK3ForConditionalGeneration whole" in line and "kimi_k3.py:3199-3205" in line
