"""ModelOpt NVFP4 (``modelopt_fp4``) per rank, as SGLang 0.5.23 builds it and a Hopper rank holds it
(checker.core.weights.modelopt). The as-built bytes of every rank of the cases in
``tests/fixtures/weights/expected.json`` (``*/modelopt-nvfp4*``) are held by tests/test_weights.py; here:
what a user relies on (derive's figure from a checkpoint and from config.json alone), what loading adds
or frees on Hopper (Marlin), and the one-line refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import ConfigError, FlagError, LayoutError
from checker.core.weights.modelopt import marlin_padded
from checker.core.weights.quant import read_scheme
from checker.core.weights.weights import GIB, WeightsLayout
from checker.families.rules import model_weights, rank_params
from tests.checkpoints import model_tensors, nvfp4_tensors, write_checkpoint

REPO = Path(__file__).resolve().parent.parent
W = REPO / "tests/fixtures/weights"
NEMOTRON = W / "nemotron_h_modelopt_nvfp4.json"
QWEN = W / "qwen3_next_modelopt_nvfp4.json"
DERIVE = ["derive", "--gpu-free-gib", "79", "--mem-fraction-static", "0.85"]


def _cfg(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _with_beside(path: Path) -> dict[str, Any]:
    """config.json with the hf_quant_config.json beside it, as the model directory's reader hands it on."""
    from checker.core.weights.quant import HF_QUANT_KEY

    cfg = _cfg(path)
    beside = path.with_name(path.name.removesuffix(".json") + ".hf_quant_config.json")
    if beside.is_file():
        cfg[HF_QUANT_KEY] = json.loads(beside.read_text())
    return cfg


def _figure(case: str, layout: dict[str, int], rank: int) -> int:
    doc = json.loads((W / "expected.json").read_text())
    (entry,) = [e for e in doc["figures"]["0.5.23"][case]["layouts"] if e["layout"] == layout]
    return int(entry["ranks"][rank][1])


def _nemotron_quantized(module: str) -> bool:
    """The linears the fixture's ignore list leaves quantized: not layers 0 and 51, not the head."""
    return ".mixer." in module and not module.startswith(("backbone.layers.0.", "backbone.layers.51."))


def _nemotron_dir(
    tmp_path: Path, cfg: dict[str, Any] | None = None, tensors: list[Any] | None = None
) -> Path:
    cfg = cfg or _cfg(NEMOTRON)
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    write_checkpoint(d, nvfp4_tensors(cfg, _nemotron_quantized) if tensors is None else tensors, shards=3)
    return d


def _one_line(res: Any) -> str:
    assert res.rc == 2 and res.out == "", res
    (line,) = res.err.strip().splitlines()
    assert "Traceback" not in line
    return line


# -- the figure ---------------------------------------------------------------------------------------------


def test_a_nemotron_h_nvfp4_checkpoint_derives_sglangs_figure(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Nemotron-H-8B exported by ModelOpt NVFP4 (uint8 packed weights, fp8 16-groups, fp32 globals): the
    weights SGLang 0.5.23's class builds (expected.json, meta-built) less what Marlin frees after loading,
    and derive prints that figure, well under the bf16 one."""
    from checker.families.weights_source import checkpoint_weights

    d = _nemotron_dir(tmp_path)
    layout = WeightsLayout(pp_size=2, tp_size=2)
    mw, ckpt = checkpoint_weights(d, layout, release="0.5.23")
    params = rank_params(_cfg(NEMOTRON), layout, release="0.5.23")
    for rank, (r, (_, prm)) in enumerate(zip(mw.ranks, params, strict=True)):
        dropped = sum(p.nbytes for p in prm if p.part == "dropped")
        assert r.param_bytes + dropped == _figure("nemotron_h/modelopt-nvfp4", {"pp": 2, "tp": 2}, rank)
    assert 0 < ckpt.header_bytes < ckpt.total_bytes // 1000  # headers only
    bf16 = _cfg(NEMOTRON)
    del bf16["quantization_config"]
    plain = model_weights(bf16, layout, release="0.5.23")
    assert mw.ranks[0].param_bytes < 0.5 * plain.ranks[0].param_bytes
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d)])
    assert res.rc == 0, res.err
    busiest = max(r.total_bytes for r in mw.ranks) / GIB
    assert f"weights {busiest:.2f} GiB (the checkpoint" in res.out
    assert f"{max(r.total_bytes for r in plain.ranks) / GIB:.2f}" not in res.out


def test_a_qwen3_next_nvfp4_config_beside_its_hf_quant_config_derives_without_shards(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Qwen3-Next-80B with a nested NVFP4 hf_quant_config.json and no shards: the figure comes from the
    class (the meta-built bytes of 0.5.23 at tp 4 / ep 4 less the freed global scales)."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(QWEN.read_text())
    (d / "hf_quant_config.json").write_text(QWEN.with_name(QWEN.stem + ".hf_quant_config.json").read_text())
    layout = WeightsLayout(pp_size=1, tp_size=4, ep_size=4)
    mw = model_weights(_with_beside(QWEN), layout, release="0.5.23")
    params = rank_params(_with_beside(QWEN), layout, release="0.5.23")
    for rank, (r, (_, prm)) in enumerate(zip(mw.ranks, params, strict=True)):
        dropped = sum(p.nbytes for p in prm if p.part == "dropped")
        assert r.param_bytes + dropped == _figure(
            "qwen3_next/modelopt-nvfp4", {"pp": 1, "tp": 4, "ep": 4}, rank
        )
    launch = ["--model-path", str(d), "--tp-size", "4", "--ep-size", "4", "--mem-fraction-static", "0.85"]
    res = cli(["derive", "--gpu-free-gib", "79", "--", *launch])
    assert res.rc == 0, res.err
    assert f"weights {max(r.total_bytes for r in mw.ranks) / GIB:.2f} GiB" in res.out


# -- what loading adds and frees on Hopper (Marlin) ---------------------------------------------------------


def test_an_nvfp4_linear_keeps_its_scales_and_gains_marlins_after_loading() -> None:
    """ModelOptFp4LinearMethod on Hopper: input_scale and weight_scale_2 stay; alpha, input_scale_inv,
    input_global_scale (0-d fp32), weight_global_scale ([1] model dtype) and a workspace are added
    (modelopt_quant.py:1886-1917, marlin_utils_fp4.py:140-222)."""
    ((_, params), *_) = rank_params(_cfg(NEMOTRON), WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    by = {p.name: p for p in params}
    pre = "model.layers.2.mixer.in_proj"
    assert (by[f"{pre}.weight"].dtype, by[f"{pre}.weight"].shape) == ("uint8", (9280, 2048))
    assert by[f"{pre}.weight_scale"].shape == (9280, 256) and by[f"{pre}.weight_scale_2"].shape == (5,)
    assert by[f"{pre}.input_scale"].part == "layers"
    for scalar in ("alpha", "input_scale_inv", "input_global_scale"):
        assert (by[f"{pre}.{scalar}"].part, by[f"{pre}.{scalar}"].shape) == ("copies", ())
    assert (by[f"{pre}.weight_global_scale"].dtype, by[f"{pre}.weight_global_scale"].shape) == (
        "bfloat16",
        (1,),
    )
    assert by[f"{pre}.workspace"].part == "copies"
    # 9280 x 2048 is whole Marlin tiles: nothing padded, nothing freed
    assert marlin_padded(9280, 2048) == (9280, 2048) and not any(p.part == "dropped" for p in params)


def test_a_partition_that_is_not_whole_marlin_tiles_is_padded_after_loading() -> None:
    """Qwen3-Next's in_proj_ba at tp 2 is 32 rows: Marlin pads N to 64 (the smaller padded shape), the
    built weight and scale freed for the padded ones (marlin_utils_fp4.py:156-180)."""
    layout = WeightsLayout(pp_size=1, tp_size=2)
    ((_, params), *_) = rank_params(_with_beside(QWEN), layout, release="0.5.23")
    by = {p.name: p for p in params}
    pre = "model.layers.0.linear_attn.in_proj_ba"
    assert by[f"{pre}.weight"].part == "dropped" and by[f"{pre}.weight"].shape == (32, 1024)
    assert by[f"{pre}.weight.marlin"].shape == (64, 1024) and by[f"{pre}.weight_scale.marlin"].shape == (
        64,
        128,
    )
    assert marlin_padded(32, 2048) == (64, 2048) and marlin_padded(100, 100) == (128, 128)


def test_nvfp4_experts_free_their_fp32_global_scales_and_keep_the_swizzled_ones() -> None:
    """ModelOptNvFp4FusedMoEMethod under Marlin: w13/w2_weight_scale_2 ([E, 2], [E] fp32 as built) are
    freed for [E] in the model dtype; the swizzled block scales built beside the raw ones stay; the input
    scales are over every expert of the layer (fused shared expert included), not the EP rank's."""
    layout = WeightsLayout(pp_size=1, tp_size=4, ep_size=4)
    ((_, params), *_) = rank_params(_with_beside(QWEN), layout, release="0.5.23")
    by = {p.name: p for p in params}
    ex = "model.layers.0.mlp.experts"
    assert by[f"{ex}.w13_weight"].shape == (129, 1024, 1024)  # 128 routed + the fused shared expert
    assert by[f"{ex}.w13_weight_scale_2"].part == "dropped" and by[f"{ex}.w13_weight_scale_2"].shape == (
        129,
        2,
    )
    assert (by[f"{ex}.w13_weight_scale_2.marlin"].shape, by[f"{ex}.w13_weight_scale_2.marlin"].dtype) == (
        (129,),
        "bfloat16",
    )
    assert by[f"{ex}.w13_blockscale_swizzled"].part == "layers"
    assert by[f"{ex}.w13_input_scale"].shape == (513, 2)
    assert "model.layers.3.qkv_proj.weight" in by and by["model.layers.3.qkv_proj.weight"].dtype == "bfloat16"


def test_an_excluded_shared_expert_is_not_fused_under_nvfp4() -> None:
    """``can_fuse_shared_expert`` is False where exclude_modules names the shared expert: it stays a bf16
    MLP and the experts hold only the routed ones (modelopt_quant.py:1552-1559)."""
    cfg = _with_beside(W / "qwen3_next_modelopt_nvfp4_shared.json")
    ((_, params), *_) = rank_params(cfg, WeightsLayout(pp_size=1, tp_size=4, ep_size=4), release="0.5.23")
    by = {p.name: p for p in params}
    assert by["model.layers.0.mlp.experts.w13_weight"].shape[0] == 128
    assert by["model.layers.0.mlp.shared_expert.gate_up_proj.weight"].dtype == "bfloat16"


# -- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "flag", "error", "says"),
    [
        ({"group_size": 32}, None, ConfigError, "NVFP4 Marlin requires group_size=16"),
        ({"quant_algo": "NVFP4_AWQ"}, None, FlagError, "modelopt NVFP4_AWQ"),
        ({"quant_algo": "W4A16_NVFP4"}, None, FlagError, "ModelOptNvFp4A16"),
        ({"quant_algo": "MXFP4"}, None, ConfigError, "ModelOpt currently only supports"),
        ({"ignore": None}, None, ConfigError, "requires group_size and exclude_modules"),
        ({}, "fp8", FlagError, "contradicts"),
        ({}, "nvfp4_online", FlagError, "requantizes"),
    ],
    ids=["group-32", "awq", "w4a16", "mxfp4", "ignore-null", "flag", "requant-flag"],
)
def test_an_nvfp4_config_the_release_or_the_checker_refuses_is_one_line(
    change: dict[str, Any], flag: str | None, error: type[Exception], says: str
) -> None:
    cfg = _cfg(NEMOTRON)
    cfg["quantization_config"] = {**cfg["quantization_config"], **change}
    with pytest.raises(error) as exc:
        read_scheme(cfg, flag=flag, source="config.json")
    assert says in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("flag", [None, "modelopt", "modelopt_fp4"])
def test_the_flags_sglang_takes_for_an_nvfp4_checkpoint_agree(flag: str | None) -> None:
    scheme = read_scheme(_with_beside(QWEN), flag=flag, source="config.json")
    assert scheme is not None and scheme.method == "modelopt_fp4" and scheme.fp4 is not None
    assert scheme.fp4.group == 16 and scheme.kv  # kv_cache_quant_algo 'auto': truthy


def test_nvfp4_on_an_unchecked_release_an_fp32_model_and_a_split_of_16_are_refused() -> None:
    with pytest.raises(FlagError, match="not 0.5.21's"):  # no CPU environment holds 0.5.21's classes
        model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=1, tp_size=2), release="0.5.21")
    with pytest.raises(FlagError, match="FP16 or BF16"):
        model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=1, tp_size=2, dtype="float32"), release="0.5.23")
    odd = _cfg(NEMOTRON) | {"intermediate_size": 21504 + 64}  # 21568 / 8 = 2696: not a multiple of 16
    with pytest.raises(LayoutError, match="not a multiple of 16"):
        model_weights(odd, WeightsLayout(pp_size=1, tp_size=8), release="0.5.23")


def _tensors_with(change: Callable[[list[Any]], list[Any]]) -> list[Any]:
    return change(nvfp4_tensors(_cfg(NEMOTRON), _nemotron_quantized))


_UP = "backbone.layers.1.mixer.up_proj"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda ts: [t for t in ts if t[0] != f"{_UP}.weight_scale_2"], f"holds its {_UP}.weight_scale_2"),
        (lambda ts: [t for t in ts if t[0] != f"{_UP}.weight_scale"], f"holds its {_UP}.weight_scale,"),
        (
            lambda ts: [(n, (s[0], s[1] * 2) if n == f"{_UP}.weight_scale" else s, d) for n, s, d in ts],
            "takes F8_E4M3 [21504, 256]",
        ),
        (
            lambda ts: [(n, s, "F8_E4M3" if n == f"{_UP}.weight" else d) for n, s, d in ts],
            "packed two e2m1 values a byte (U8)",
        ),
        (lambda ts: model_tensors(_cfg(NEMOTRON)), "no shard holds a packed weight"),
    ],
    ids=["global-scale-absent", "block-scale-absent", "scale-shape", "not-uint8", "no-packed"],
)
def test_nvfp4_shards_that_contradict_the_config_are_one_line(
    cli: Callable[..., Any], tmp_path: Path, change: Callable[[list[Any]], list[Any]], says: str
) -> None:
    d = _nemotron_dir(tmp_path, tensors=_tensors_with(change))
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert says in line, line


def test_a_group_that_does_not_divide_a_packed_weights_input_is_one_line(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """An input size that is not whole 16-groups (config.json's intermediate_size 21512): SGLang sizes the
    scales ``in // 16`` groups and the checkpoint's ``ceil`` cannot load; refused from the headers."""
    cfg = _cfg(NEMOTRON) | {"intermediate_size": 21512}
    d = _nemotron_dir(tmp_path, cfg=cfg)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "1", "--model-config", str(d)]))
    assert "group size 16 does not divide the input size 21512" in line, line
