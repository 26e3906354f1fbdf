"""Quantized weights of the families beyond Qwen3-Next and Nemotron-H (issue 39 item 1, evidence "at least
three families: one MoE, one dense-FFN, one with a vision tower").

Qwen3.5 (the family with a vision tower, MoE and dense) under compressed-tensors FP8 and W4A16, GPTQ,
ModelOpt NVFP4 and ModelOpt FP8; Falcon-H1 (dense FFN) and Granite-4.0-H (MoE) under compressed-tensors
and GPTQ. Every rank of their layouts is held to SGLang 0.5.23's own quantized classes built on the meta
device by the ``qwen3_5/ct-*``, ``qwen3_5/gptq-*``, ``qwen3_5/modelopt-*``, ``falcon_h1/ct-*``,
``falcon_h1/gptq-*``, ``granite_h/*`` cases of tests/fixtures/weights/expected.json (tests/test_weights.py);
here: what those classes hold that a user relies on (the vision tower bf16 whatever the ignore list says,
Falcon-H1's mixer and Granite's routers unquantized), what ``derive`` reports for such a checkpoint, and the
checkpoint SGLang would serve wrongly (a quantized vision tower): one line, exit 2.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.weights.weights import GIB, WeightsLayout
from checker.families.rules import model_weights, rank_params
from tests.checkpoints import (
    compressed_tensors,
    gptq_tensors,
    model_tensors,
    modelopt_tensors,
    nvfp4_tensors,
    packed_tensors,
    write_checkpoint,
)

REPO = Path(__file__).resolve().parent.parent
W = REPO / "tests/fixtures/weights"
DERIVE = ["derive", "--gpu-free-gib", "79", "--mem-fraction-static", "0.85"]
QWEN35 = (("model.language_model.", "model."),)
R = "0.5.23"


def _cfg(name: str) -> dict[str, Any]:
    """The fixture as the model directory's reader reads it: with the ``hf_quant_config.json`` beside it."""
    from checker.core.weights.quant import HF_QUANT_KEY

    config = dict(json.loads((W / name).read_text()))
    beside = W / name.replace(".json", ".hf_quant_config.json")
    if beside.is_file():
        config[HF_QUANT_KEY] = json.loads(beside.read_text())
    return config


def _figures(case: str, layout: dict[str, int]) -> list[int]:
    doc = json.loads((W / "expected.json").read_text())
    (entry,) = [e for e in doc["figures"]["0.5.23"][case]["layouts"] if e["layout"] == layout]
    return [int(r[1]) for r in entry["ranks"]]


def _language(module: str) -> bool:
    """The modules a Qwen3.5 ModelOpt export quantizes: the language model's linears but in_proj_b/a
    (excluded in the fixtures) and conv1d."""
    lm = module.startswith("model.language_model.layers.")
    return lm and not module.endswith(("in_proj_a", "in_proj_b", "conv1d"))


def _bf16_vision(tensors: list[Any], cfg: dict[str, Any]) -> list[Any]:
    """The checkpoint with its vision tower as the export leaves it: bf16 (GPTQModel quantizes only the
    decoder layers; the other fixtures ignore or exclude ``model.visual``)."""
    plain = [t for t in model_tensors(cfg) if t[0].startswith("model.visual.")]
    return [t for t in tensors if not t[0].startswith("model.visual.")] + plain


# (case, fixture, its checkpoint with the vision tower bf16, the same with it quantized)
DENSE: list[tuple[str, str, Callable[..., list[Any]], Callable[..., list[Any]]]] = [
    (
        "qwen3_5/ct-fp8-dense",
        "qwen3_5_dense_ct_fp8_channel.json",
        lambda c: _bf16_vision(compressed_tensors(c), c),
        compressed_tensors,  # the ignore list does not name the tower: llm-compressor quantizes it
    ),
    (
        "qwen3_5/ct-w4a16-dense",
        "qwen3_5_dense_ct_w4a16.json",
        packed_tensors,
        lambda c: packed_tensors(
            {**c, "quantization_config": {**c["quantization_config"], "ignore": ["lm_head"]}}
        ),
    ),
    (
        "qwen3_5/gptq-int4-dense",
        "qwen3_5_dense_gptq_int4.json",
        lambda c: _bf16_vision(gptq_tensors(c, prefixes=QWEN35), c),
        lambda c: gptq_tensors(c, prefixes=QWEN35),
    ),
    (
        "qwen3_5/modelopt-fp8-dense",
        "qwen3_5_dense_modelopt_fp8.json",
        lambda c: modelopt_tensors(c, _language),
        lambda c: modelopt_tensors(c, lambda m: _language(m) or m.startswith("model.visual.")),
    ),
    (
        "qwen3_5/modelopt-nvfp4-dense",
        "qwen3_5_dense_modelopt_nvfp4.json",
        lambda c: nvfp4_tensors(c, _language),
        lambda c: nvfp4_tensors(c, lambda m: _language(m) or m.startswith("model.visual.")),
    ),
]
IDS = [d[0] for d in DENSE]


def _dir(tmp_path: Path, cfg: dict[str, Any], tensors: list[Any]) -> Path:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    write_checkpoint(d, tensors, shards=3)
    return d


def test_qwen3_5_holds_its_vision_tower_bf16_under_every_method() -> None:
    """SGLang builds Qwen3.5's vision tower with quant_config=None (0.5.23 qwen3_vl.py:1332-1339): under
    each method, whether or not the ignore list names the tower, its linears are bf16 without a scale on
    every rank, while the language model's are quantized as the method holds them."""
    layout = WeightsLayout(pp_size=2, tp_size=2)
    quantized = {
        "qwen3_5_ct_fp8_channel.json": ("weight", "float8_e4m3fn"),  # the tower not in its ignore list
        "qwen3_5_dense_ct_w4a16.json": ("weight_packed", "int32"),
        "qwen3_5_gptq_int4.json": ("qweight", "int32"),
        "qwen3_5_dense_modelopt_fp8.json": ("weight", "float8_e4m3fn"),
        "qwen3_5_dense_modelopt_nvfp4.json": ("weight", "uint8"),
        "qwen3_5_modelopt_nvfp4.json": ("weight", "uint8"),
    }
    for name, (tensor, dtype) in quantized.items():
        cfg = _cfg(name)
        for place, params in rank_params(cfg, layout, release="0.5.23"):
            by = {p.name: p for p in params}
            vision = [p for p in params if p.part == "vision"]
            assert vision and all(p.dtype == "bfloat16" for p in vision), (name, place.rank)
            assert by["visual.blocks.0.mlp.linear_fc1.weight"].part == "vision"
            attn = next(p for p in params if p.name.endswith(f"qkv_proj.{tensor}") and "visual" not in p.name)
            assert attn.dtype == dtype, (name, attn)


def test_qwen3_5_quantizes_its_attention_under_nvfp4_where_qwen3_next_does_not() -> None:
    """Qwen3-Next builds qkv_proj without the quant config under NVFP4 (qwen3_next.py:665-675); Qwen3.5's
    attention takes it (qwen3_5.py:1331-1341): uint8 packed e2m1 with its float8 group scales, a quarter
    of the bf16 bytes, on the ranks of both stages."""
    cfg = _cfg("qwen3_5_modelopt_nvfp4.json")
    mine = rank_params(cfg, WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    by = {p.name: p for p in mine[0][1]}
    qkv, scale = by["model.layers.3.qkv_proj.weight"], by["model.layers.3.qkv_proj.weight_scale"]
    assert (qkv.dtype, scale.dtype) == ("uint8", "float8_e4m3fn")
    assert qkv.shape[1] * 2 == cfg["text_config"]["hidden_size"]
    figures = _figures("qwen3_5/modelopt-nvfp4", {"pp": 2, "tp": 2})
    held = [sum(p.nbytes for p in ps if p.part not in ("buffers", "copies")) for _, ps in mine]
    assert held == figures


def test_qwen3_5_dense_gate_up_holds_a_scale_per_shard() -> None:
    """The dense MLP's gate_up_proj is Qwen2MoeMLP's MergedColumnParallelLinear([I] * 2): under ModelOpt FP8
    it holds two per-tensor weight and input scales (as 0.5.23's class does), not one."""
    params = rank_params(
        _cfg("qwen3_5_dense_modelopt_fp8.json"), WeightsLayout(pp_size=1, tp_size=4), release="0.5.23"
    )
    by = {p.name: p for p in params[0][1]}
    assert by["model.layers.0.mlp.gate_up_proj.weight_scale"].shape == (2,)
    assert by["model.layers.0.mlp.gate_up_proj.input_scale"].shape == (2,)


@pytest.mark.slow  # five checkpoints written, read and derived (0.5 s): the slow step runs it
@pytest.mark.parametrize("case, fixture, plain, _quantized", DENSE, ids=IDS)
def test_a_quantized_qwen3_5_checkpoint_derives_sglangs_figure(
    cli: Callable[..., Any],
    tmp_path: Path,
    case: str,
    fixture: str,
    plain: Callable[..., list[Any]],
    _quantized: Callable[..., list[Any]],
) -> None:
    """A dense Qwen3.5 checkpoint of each method (sparse shards of the real shapes, the vision tower bf16):
    every rank of pp 2 x tp 2 read from the shards is 0.5.23's meta-built class's figure (less what the
    method frees after loading), and derive prints the busiest rank's, well under the bf16 one."""
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(fixture)
    beside = W / fixture.replace(".json", ".hf_quant_config.json")
    d = _dir(tmp_path, cfg, plain(cfg))
    if beside.is_file():
        (d / "hf_quant_config.json").write_text(beside.read_text())
    layout = WeightsLayout(pp_size=2, tp_size=2)
    mw, _ = checkpoint_weights(d, layout, release="0.5.23")
    dropped = [
        sum(p.nbytes for p in ps if p.part == "dropped") for _, ps in rank_params(cfg, layout, release=R)
    ]
    got = [r.param_bytes + x for r, x in zip(mw.ranks, dropped, strict=True)]
    assert got == _figures(case, {"pp": 2, "tp": 2})
    bf16 = {k: v for k, v in cfg.items() if k != "quantization_config"}
    assert mw.ranks[0].param_bytes < 0.8 * model_weights(bf16, layout, release="0.5.23").ranks[0].param_bytes
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d)])
    assert res.rc == 0, res.err
    busiest = max(r.total_bytes for r in mw.ranks)
    assert f"weights {busiest / GIB:.2f} GiB (the checkpoint" in res.out


@pytest.mark.parametrize("case, fixture, _plain, quantized", DENSE, ids=IDS)
def test_a_quantized_vision_tower_in_the_shards_is_one_line(
    cli: Callable[..., Any],
    tmp_path: Path,
    case: str,
    fixture: str,
    _plain: Callable[..., list[Any]],
    quantized: Callable[..., list[Any]],
) -> None:
    """A checkpoint that quantizes the vision tower (its ignore list or exclude list leaves it out): SGLang
    holds the tower in bf16 and loads none of its packed weights or scales (an NVFP4 one fails the shape
    check): refused in one line naming the tensor and its shard, before any figure."""
    cfg = _cfg(fixture)
    d = _dir(tmp_path, cfg, quantized(cfg))
    beside = W / fixture.replace(".json", ".hf_quant_config.json")
    if beside.is_file():
        (d / "hf_quant_config.json").write_text(beside.read_text())
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d)])
    assert res.rc == 2 and res.out == "", (case, res)
    (line,) = res.err.strip().splitlines()
    assert "Traceback" not in line
    assert "tensor 'model.visual." in line and "in shard 'model-0000" in line, line
    assert "Qwen3.5's vision tower" in line and "quant_config=None" in line, line


def test_falcon_h1_keeps_its_mixer_and_granite_its_routers_unquantized() -> None:
    """Falcon-H1's class builds its Mamba mixer without the quant config (falcon_h1.py:187-200) and its
    qkv/o without a prefix; Granite-4.0-H's router is a ReplicatedLinear with quant_config=None
    (granitemoe.py:127-133) while its mixer, attention, shared MLP and experts take the config: under
    compressed-tensors W4A16 and GPTQ, per rank as 0.5.23's classes hold them (expected.json)."""
    falcon = rank_params(
        _cfg("falcon_h1_gptq_int4.json"), WeightsLayout(pp_size=1, tp_size=4), release="0.5.23"
    )
    by = {p.name: p for p in falcon[0][1]}
    assert by["model.layers.0.mamba.in_proj.weight"].dtype == "bfloat16"
    assert by["model.layers.0.qkv_proj.qweight"].dtype == "int32"
    assert by["model.layers.0.feed_forward.down_proj.qweight"].dtype == "int32"
    held = [sum(p.nbytes for p in ps if p.part not in ("buffers", "copies")) for _, ps in falcon]
    assert held == _figures("falcon_h1/gptq-int4", {"pp": 1, "tp": 4})
    granite = rank_params(
        _cfg("granite_h_ct_w4a16.json"), WeightsLayout(pp_size=1, tp_size=1), release="0.5.23"
    )
    by = {p.name: p for p in granite[0][1]}
    assert by["model.layers.0.block_sparse_moe.gate.weight"].dtype == "bfloat16"
    assert by["model.layers.0.mamba.in_proj.weight_packed"].dtype == "int32"
    assert by["model.layers.0.block_sparse_moe.experts.w13_weight_packed"].dtype == "int32"


@pytest.mark.parametrize("fixture", ["granite_h_gptq_int4.json", "granite_h_ct_fp8_channel.json"])
def test_a_quantized_granite_over_more_than_one_tp_rank_is_the_release_refusal(
    cli: Callable[..., Any], tmp_path: Path, fixture: str
) -> None:
    """Granite-4.0-H's one Mamba group: a MambaMixer2 built with a quant config asserts the TP size divides
    n_groups (0.5.23 mamba.py:254-259), whatever the ignore list keeps bf16 (recorded in expected.json,
    ``granite_h/gptq-int4-tp2``): one line, exit 2; at tp 1 the figure."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_cfg(fixture)))
    res = cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)])
    assert res.rc == 2 and res.out == "", res
    (line,) = res.err.strip().splitlines()
    assert "n_groups = 1" in line and "mamba.py:254-259" in line, line
    res = cli([*DERIVE, "--pp-size", "1", "--tp-size", "1", "--model-config", str(d)])
    assert res.rc == 0, res.err
