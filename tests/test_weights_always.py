"""The weights figure always (issue 39 item 2): from config.json by the release's class whether or not
shards sit beside it, and the shards, where present, held to the class.

Model directories hold config.json from tests/fixtures and, where asked, a sparse checkpoint of its real
shapes (tests/checkpoints.py: real headers, no data). The figures are held to
:func:`checker.families.rules.model_weights` (itself held to SGLang's own classes in tests/test_weights.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import run_world

from checker.core.weights.weights import GIB, WeightsLayout
from checker.families.rules import model_weights
from tests.checkpoints import model_dir, model_tensors, write_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
KIMI = FIXTURES / "kimi_linear_48b_a3b.json"
NEMOTRON = FIXTURES / "nemotron_h_8b.json"
MODELLED = [  # (fixture, --pp-size): 0.5.23's Qwen3-Next and Falcon-H1 classes assert one stage
    ("kimi_linear_48b_a3b", 2),
    ("qwen3_next_80b_a3b", 1),
    ("nemotron_h_8b", 2),
    ("falcon_h1_0_5b", 1),
    ("granite_4_0_h_small", 1),
]
FAST = ["--timeout-s", "20", "--backend", "gloo"]
PLAN = ["plan", "--target-max-running-requests", "8", "--gpu-free-gib", "139", "--format", "json"]


def _config_only(directory: Path, config: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, directory / "config.json")
    return directory


def _figures(config: Path, layout: WeightsLayout) -> list[float]:
    mw = model_weights(json.loads(config.read_text()), layout, release="0.5.23")
    return [r.total_bytes / GIB for r in mw.ranks]


def _one_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("name", "pp"), MODELLED)
def test_a_config_only_directory_gets_the_figure_the_checkpoint_gives(
    name: str, pp: int, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """The class decides the bytes: config.json alone gives every rank the same figure as config.json with
    its checkpoint, said as config.json's (no shards), never a budget with the weights missing."""
    config = FIXTURES / f"{name}.json"
    launch = ["--", "--pp-size", str(pp), "--tp-size", "2", "--mem-fraction-static", "0.85", "--model-path"]
    code, out, err = cli([*PLAN, *launch, str(_config_only(tmp_path / "bare", config))])
    assert code == 0, err
    bare = json.loads(out)["weights"]
    code, out, err = cli([*PLAN, *launch, str(model_dir(tmp_path / "full", config, shards=2))])
    assert code == 0, err
    full = json.loads(out)["weights"]
    assert bare["source"] == "config" and full["source"] == "checkpoint"
    want = _figures(config, WeightsLayout(pp_size=pp, tp_size=2))
    assert bare["gib"] == pytest.approx(max(want)) and full["gib"] == pytest.approx(max(want))
    assert bare["per_rank_gib"] == pytest.approx(want)
    assert bare["gib"] > 0.5  # a real model's weights, not none


def test_derive_takes_the_config_only_figure_off_free_memory(tmp_path: Path, cli: Callable[..., Any]) -> None:
    d = _config_only(tmp_path / "Kimi-Linear-48B-A3B", KIMI)
    argv = ["derive", "--gpu-free-gib", "139", "--", "--model-path", str(d), "--pp-size", "2"]
    code, out, err = cli([*argv, "--mem-fraction-static", "0.85"])
    assert code == 0, err
    want = max(_figures(KIMI, WeightsLayout(pp_size=2, tp_size=1)))
    assert f"weights {want:.2f} GiB (config.json (no shards), busiest rank" in out


def test_an_unmodelled_family_without_a_figure_is_refused(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """Kimi-K3 (weights not modelled), config.json alone: the budget the server gets is not sized on free
    memory with the weights missing; --weights-gib gives them, --weights-gib 0 says "none" explicitly."""
    d = _config_only(tmp_path / "Kimi-K3", FIXTURES / "kimi_k3_config.json")
    launch = ["--", "--model-path", str(d), "--pp-size", "2", "--mem-fraction-static", "0.85"]
    line = _one_line(*cli([*PLAN, *launch])[::2])
    assert "model_type='kimi_k3'" in line and "--weights-gib" in line
    line = _one_line(*cli(["derive", "--gpu-free-gib", "139", *launch])[::2])
    assert "model_type='kimi_k3'" in line and "--weights-gib" in line
    code, out, err = cli([*PLAN, "--weights-gib", "40", *launch])
    assert code == 0, err
    assert json.loads(out)["weights"]["gib"] == 40 and json.loads(out)["weights"]["source"] == "flag"


def _llama_tensors(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """Llama's checkpoint names at the shapes of ``config`` (hidden, heads, vocab)."""
    h, v, layers = config["hidden_size"], config.get("vocab_size") or 131072, config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    out = [("model.embed_tokens.weight", (v, h), "BF16"), ("model.norm.weight", (h,), "BF16")]
    out.append(("lm_head.weight", (v, h), "BF16"))
    for i in range(layers):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", (h,), "BF16"),
            (f"{p}.post_attention_layernorm.weight", (h,), "BF16"),
        ]
        out += [(f"{p}.self_attn.{n}_proj.weight", (kv if n in "kv" else h, h), "BF16") for n in "qkvo"]
        out += [(f"{p}.mlp.{n}_proj.weight", (4 * h, h), "BF16") for n in ("gate", "up")]
        out.append((f"{p}.mlp.down_proj.weight", (h, 4 * h), "BF16"))
    return out


def test_llama_tensors_under_a_nemotron_h_config_are_refused_naming_a_tensor(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """The issue's case: Nemotron-H's load_weights skips a name it has no parameter for (a warning), so
    the server would start on uninitialized weights; the checker names the tensor no shard holds."""
    d = _config_only(tmp_path / "mixed", NEMOTRON)
    write_checkpoint(d, _llama_tensors(json.loads(NEMOTRON.read_text())), shards=3)
    line = _one_line(*cli([*PLAN, "--", "--model-path", str(d), "--mem-fraction-static", "0.85"])[::2])
    assert "tensor 'backbone.embeddings.weight'" in line and "in no shard" in line and "3 shards" in line


def test_a_tensor_no_shard_holds_is_one_line_naming_it(tmp_path: Path, cli: Callable[..., Any]) -> None:
    tensors = model_tensors(json.loads(KIMI.read_text()))
    gone = next(t for t in tensors if ".layers.5." in t[0] and t[0].endswith("o_proj.weight"))
    d = _config_only(tmp_path / "partial", KIMI)
    write_checkpoint(d, [t for t in tensors if t is not gone], shards=1)
    line = _one_line(*cli([*PLAN, "--", "--model-path", str(d), "--mem-fraction-static", "0.85"])[::2])
    assert f"tensor {gone[0]!r}" in line and "model.safetensors" in line


@pytest.mark.slow
def test_check_budget_from_device_on_a_config_only_directory(tmp_path: Path) -> None:
    """Two ranks at pp 2, config.json alone: each rank's figure is config.json's (source "config" in the
    JSON, "config.json, no shards" in the text), and the budget takes the busiest rank's off the agreed
    free memory, as the server's does."""
    d = _config_only(tmp_path / "Kimi-Linear-48B-A3B", KIMI)
    argv = ["check", "--budget-from-device", "--device-free-gib", "139", *FAST]
    argv += ["--", "--model-path", str(d), "--pp-size", "2", "--mem-fraction-static", "0.85"]
    res = run_world(argv, world_size=2, tmp_path=tmp_path)
    assert res.codes == [0, 0], res.ranks[0].stderr[-2000:]
    rep = res.report()
    want = _figures(KIMI, WeightsLayout(pp_size=2, tp_size=1))
    assert [r["weights_bytes"] / GIB for r in rep["ranks"]] == pytest.approx(want, abs=1e-6)
    assert [r["weights_source"] for r in rep["ranks"]] == ["config", "config"]
    assert rep["weights_source"].startswith("config.json (no shards)")
    budget = 139 - max(want) - 139 * 0.15
    assert [r["budget_gib"] for r in rep["ranks"]] == pytest.approx([budget] * 2, abs=1e-3)
    assert f"{want[1]:.2f} GiB (config.json, no shards)" in res.ranks[0].stdout


@pytest.mark.slow
def test_check_refuses_an_unmodelled_family_unless_weights_gib_says(tmp_path: Path) -> None:
    """Kimi-K3 (weights not modelled), config.json alone, under check --budget-from-device: one line and
    exit 2 on every rank; --weights-gib 0 is the explicit "no weights" and runs."""
    d = _config_only(tmp_path / "Kimi-K3", FIXTURES / "kimi_k3_config.json")
    argv = ["check", "--allow-single-rank", "--budget-from-device", "--device-free-gib", "139", *FAST]
    launch = ["--", "--model-path", str(d), "--mem-fraction-static", "0.85"]
    res = run_world([*argv, *launch], world_size=1, tmp_path=tmp_path)
    assert res.codes == [2], res.ranks[0].stderr[-2000:]
    assert "model_type='kimi_k3'" in res.report()["ranks"][0]["error"]
    res = run_world([*argv, "--weights-gib", "0", *launch], world_size=1, tmp_path=tmp_path)
    assert res.codes == [0], res.ranks[0].stderr[-2000:]
    assert [r["weights_source"] for r in res.report()["ranks"]] == ["flag"]
