"""FP8 checkpoints (issue 39 item 1): the per-rank weights of a quantized checkpoint, and its bad input.

The per-rank figures are held to the own quantized classes of SGLang 0.5.10-0.5.23 (eight releases)
by the ``*/fp8-*`` cases of tests/fixtures/weights/expected.json (tests/test_weights.py); here: what a
user of ``derive`` on an FP8 model directory sees, and every way such a directory can contradict
itself (one line, exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checker.core.errors import CheckerInputError, ConfigError, FlagError, LayoutError
from checker.core.weights.quant import _path_matches_any, read_scheme
from checker.core.weights.weights import GIB, WeightsLayout
from checker.families.rules import model_weights, rank_params
from tests.checkpoints import fp8_tensors, model_tensors, write_checkpoint

REPO = Path(__file__).resolve().parent.parent
W = REPO / "tests/fixtures/weights"
QWEN_BLOCK = W / "qwen3_next_fp8_block.json"
QWEN_TENSOR = W / "qwen3_next_fp8_tensor.json"
NEMOTRON_BLOCK = W / "nemotron_h_fp8_block.json"
QWEN35_BLOCK = W / "qwen3_5_fp8_block.json"
DERIVE = ["derive", "--gpu-free-gib", "79", "--mem-fraction-static", "0.85"]


def _cfg(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _few_layers(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` cut to 8 layers of 16 experts (linear and full attention both present, layers 0-7): a
    refusal that names one tensor reads the same there, at 2k tensors instead of the 80B model's 150k."""
    return {**cfg, "num_hidden_layers": 8, "num_experts": 16, "num_experts_per_tok": 4}


_TENSORS: dict[str, list[Any]] = {}


def _fp8_tensors(cfg: dict[str, Any]) -> list[Any]:
    """``fp8_tensors`` once per config (150k tensors for an 80B model: seconds a call); a copy each time."""
    key = json.dumps(cfg, sort_keys=True)
    if key not in _TENSORS:
        _TENSORS[key] = fp8_tensors(cfg)
    return list(_TENSORS[key])


def _fp8_dir(tmp_path: Path, cfg: dict[str, Any], tensors: list[Any] | None = None) -> Path:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    write_checkpoint(d, _fp8_tensors(cfg) if tensors is None else tensors, shards=3)
    return d


def _one_line(res: Any) -> str:
    assert res.rc == 2 and res.out == "", res
    (line,) = res.err.strip().splitlines()
    assert "Traceback" not in line
    return line


# -- the figure --------------------------------------------------------------------------------------------


@pytest.mark.slow  # an 80B-parameter checkpoint's 150k tensors written and read: the slow step runs it
def test_an_fp8_checkpoint_derives_with_its_quantized_figure(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Qwen3-Next-80B FP8 at tp 4: derive reads the shards and reports the quantized class's figure
    (about half the bf16 one), not a refusal and not the bf16 figure."""
    cfg = _cfg(QWEN_BLOCK)
    d = _fp8_dir(tmp_path, cfg)
    res = cli([*DERIVE, "--pp-size", "1", "--tp-size", "4", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    fp8 = model_weights(cfg, WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    bf16_cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    bf16 = model_weights(bf16_cfg, WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    assert 0.45 < fp8.ranks[0].param_bytes / bf16.ranks[0].param_bytes < 0.6
    shown = f"{fp8.ranks[0].total_bytes / GIB:.2f}"
    assert shown in res.out, (shown, res.out[:2000])


def test_the_scales_are_the_block_grid_of_each_rank_partition() -> None:
    """Block-wise: a [3072, 2048] in_proj_qkvz partition holds a [24, 16] float32 weight_scale_inv; the
    experts [E, 2 * I/128, H/128] and [E, H/128, I/128]; an ignored linear stays bf16 without a scale."""
    from checker.families.rules import rank_params

    (_, params), *_ = rank_params(_cfg(QWEN_BLOCK), WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    by = {p.name: p for p in params}
    pre = "model.layers.0.linear_attn"
    assert (by[f"{pre}.in_proj_qkvz.weight"].dtype, by[f"{pre}.in_proj_qkvz.weight_scale_inv"].shape) == (
        "float8_e4m3fn",
        (24, 16),
    )
    assert (
        by[f"{pre}.in_proj_ba.weight"].dtype == "bfloat16" and f"{pre}.in_proj_ba.weight_scale_inv" not in by
    )
    assert by["model.layers.0.mlp.experts.w13_weight_scale_inv"].shape == (513, 2, 16)
    assert by["model.layers.0.mlp.experts.w2_weight_scale_inv"].shape == (513, 16, 1)
    assert by["model.layers.3.attn.k_scale"].shape == () and by["lm_head.weight"].dtype == "bfloat16"


def test_per_tensor_fp8_keeps_a_per_channel_scale_after_loading() -> None:
    """Per-tensor: one scale per logical shard as built (qkv: 3), expanded after loading to one per
    output channel (the SM90 CUTLASS kernel's layout): a kept copy in the margin, not a parameter."""
    from checker.families.rules import rank_params

    (_, params), *_ = rank_params(_cfg(QWEN_TENSOR), WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    by = {p.name: p for p in params}
    assert by["model.layers.3.qkv_proj.weight_scale"].shape == (3,)
    assert by["model.layers.3.qkv_proj.input_scale"].shape == (3,)
    rows = by["model.layers.3.qkv_proj.weight"].shape[0]
    assert by["model.layers.3.qkv_proj.weight_scale.channelwise"].shape == (rows, 1)
    assert by["model.layers.3.qkv_proj.weight_scale.channelwise"].part == "copies"


@pytest.mark.parametrize("release", ["0.5.10", "0.5.23"])
def test_per_tensor_fp8_frees_the_per_shard_scales_it_replaces_not_held_twice(release: str) -> None:
    """Fp8LinearMethod replaces weight_scale [shards] by its per-channel expansion and a static
    input_scale [shards] by its 0-d maximum after loading (fp8.py:1257, :1269-1271); Fp8MoEMethod
    w13_weight_scale [E, 2] by its per-expert maximum and the input scales [E] by 0-d maxima
    (:2666-2671, :2725): the built ones are freed (dropped), so a linear holds its weight, rows + 1 float32
    scales, and the experts' scales E + E + 2 float32, on every checked release."""
    from checker.families.rules import rank_params

    ((_, params), _) = rank_params(_cfg(QWEN_TENSOR), WeightsLayout(pp_size=1, tp_size=2), release=release)
    qkv = "model.layers.3.qkv_proj"
    mine = [p for p in params if p.name.startswith(qkv + ".")]
    weight = next(p for p in mine if p.name == f"{qkv}.weight")
    rows = weight.shape[0]
    assert sum(p.nbytes for p in mine if p.part != "dropped") == weight.nbytes + 4 * rows + 4
    assert {p.name for p in mine if p.part == "dropped"} == {f"{qkv}.weight_scale", f"{qkv}.input_scale"}
    ex = "model.layers.0.mlp.experts"
    scales = [p for p in params if p.name.startswith(ex + ".") and "scale" in p.name]
    local = next(p for p in params if p.name == f"{ex}.w13_weight").shape[0]
    assert sum(p.nbytes for p in scales if p.part != "dropped") == 4 * (local + local + 2)
    assert {p.name.removeprefix(ex + ".") for p in scales if p.part == "dropped"} == {
        "w13_weight_scale",
        "w13_input_scale",
        "w2_input_scale",
    }


def test_nemotron_h_maps_its_backbone_names_in_the_ignore_list() -> None:
    """``backbone.layers.N.mixer.in_proj`` in the ignore list keeps model.layers.N.mixer.in_proj bf16
    (the class's hf_to_sglang_mapper); without the mapping the 5-shard in_proj is refused at tp 2."""
    from checker.families.rules import rank_params

    rp = rank_params(_cfg(NEMOTRON_BLOCK), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    by = {p.name: p for p in rp[0][1]}
    assert by["model.layers.0.mixer.in_proj.weight"].dtype == "bfloat16"
    assert by["model.layers.0.mixer.out_proj.weight"].dtype == "float8_e4m3fn"


def test_qwen3_5_keeps_its_vision_tower_unquantized_and_unfuses_its_own_packed_modules() -> None:
    """Qwen3.5 FP8: the vision tower is built with quant_config=None (qwen3_vl.py:1332-1336), so it
    stays bf16 whatever the checkpoint; ``in_proj_ba`` is skipped because the ignore list names both
    of its shards ``in_proj_b``/``in_proj_a`` (the class's packed_modules_mapping, qwen3_5.py:1710);
    ``in_proj_qkvz`` is quantized with its block grid."""
    from checker.families.rules import rank_params

    (_, params), *_ = rank_params(_cfg(QWEN35_BLOCK), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    by = {p.name: p for p in params}
    assert by["visual.blocks.0.attn.qkv_proj.weight"].dtype == "bfloat16"
    assert not any(n.startswith("visual.") and "scale" in n for n in by)
    pre = "model.layers.0.linear_attn"
    assert by[f"{pre}.in_proj_ba.weight"].dtype == "bfloat16"
    assert f"{pre}.in_proj_ba.weight_scale_inv" not in by
    assert by[f"{pre}.in_proj_qkvz.weight"].dtype == "float8_e4m3fn"
    assert by[f"{pre}.in_proj_qkvz.weight_scale_inv"].shape == (80, 32)
    assert by["model.layers.0.mlp.experts.w13_weight_scale_inv"].shape == (512, 8, 32)


def test_qwen3_5_ignoring_one_shard_of_a_packed_module_is_the_release_refusal() -> None:
    """``in_proj_a`` ignored but ``in_proj_b`` not: SGLang raises 'Detected some but not all shards'
    (quantization/utils.py:101) for the fused ``in_proj_ba``."""
    cfg = _cfg(QWEN35_BLOCK)
    q = cfg["quantization_config"]
    q["modules_to_not_convert"] = [n for n in q["modules_to_not_convert"] if not n.endswith("in_proj_b")]
    with pytest.raises(ConfigError, match="some but not all shards of model.layers.0.linear_attn.in_proj_ba"):
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")


@pytest.mark.slow  # an 80B-parameter checkpoint's 150k tensors written and read: the slow step runs it
def test_a_qwen3_5_fp8_checkpoint_derives_per_stage(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Qwen3.5-397B FP8 under pp 2 x tp 4: derive reads the shards (vision tower bf16, the language
    model FP8) and prints every stage's quantized figure."""
    cfg = _cfg(QWEN35_BLOCK)
    d = _fp8_dir(tmp_path, cfg)
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "4", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    mw = model_weights(cfg, WeightsLayout(pp_size=2, tp_size=4), release="0.5.23")
    for stage in (0, 4):
        shown = f"{mw.ranks[stage].total_bytes / GIB:.2f}"
        assert shown in res.out, (shown, res.out[:2000])


# -- what the release refuses --------------------------------------------------------------------------------


def test_a_block_that_does_not_divide_a_partition_is_the_release_refusal() -> None:
    """tp 8 splits Qwen3-Next's 512-wide experts into 64-wide partitions: 0.5.23 raises at construction
    (fp8.py:1586), as the tp8 case of expected.json records."""
    with pytest.raises(LayoutError, match="not divisible by the FP8 block"):
        model_weights(_cfg(QWEN_BLOCK), WeightsLayout(pp_size=1, tp_size=8), release="0.5.23")


@pytest.mark.parametrize("release", ["0.5.21", "0.5.9", "0.5.5"])
def test_fp8_on_a_release_whose_classes_were_not_checked_is_refused_in_one_line(release: str) -> None:
    """The FP8 rules are held to the classes of the releases with a CPU environment (0.5.10 ... 0.5.23,
    the ``*/fp8-*`` figures of each); a release between or before them is refused, naming those."""
    with pytest.raises(FlagError) as exc:
        model_weights(_cfg(NEMOTRON_BLOCK), WeightsLayout(pp_size=2, tp_size=2), release=release)
    msg = str(exc.value)
    assert f"not {release}'s" in msg and "0.5.10" in msg and "--weights-gib" in msg and "\n" not in msg


def test_the_fp8_figures_of_every_checked_release_are_in_the_fixture() -> None:
    """Every release the FP8 rules claim has SGLang's own figures for every FP8 case (a release added
    to CHECKED_RELEASES without them would be claimed unchecked)."""
    from checker.core.weights.quant import CHECKED_RELEASES

    doc = json.loads((W / "expected.json").read_text())
    cases = [c for c in doc["cases"] if "/fp8-" in c]
    assert len(cases) >= 7
    for release in CHECKED_RELEASES["fp8"]:
        assert all(c in doc["figures"].get(release, {}) for c in cases), release


@pytest.mark.parametrize(
    ("quant", "flag", "error", "says"),
    [
        ({"quant_method": "fp9"}, None, ConfigError, "Unknown quantization method"),
        ({"quant_method": "fp8"}, None, ConfigError, "activation_scheme"),
        ({"quant_method": "fp8", "activation_scheme": "eager"}, None, ConfigError, "Unsupported activation"),
        (
            {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128]},
            None,
            ConfigError,
            "weight_block_size",
        ),
        (
            {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
            None,
            ConfigError,
            "only supports dynamic",
        ),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "awq", FlagError, "contradicts"),
        (
            {"quant_method": "awq", "bits": 4},
            None,
            FlagError,
            "plain awq method (the config has no group_size",
        ),
        (None, "fp8", FlagError, "quantizes the weights while loading"),
        (None, "fp99", FlagError, "Unknown quantization method"),
    ],
    ids=[
        "unknown",
        "no-activation",
        "bad-activation",
        "bad-block",
        "static-block",
        "flag",
        "awq",
        "online",
        "bad-flag",
    ],
)
def test_a_quantization_the_release_or_the_checker_refuses_is_one_line(
    quant: dict[str, Any] | None, flag: str | None, error: type[Exception], says: str
) -> None:
    cfg = _cfg(QWEN_BLOCK)
    cfg.pop("quantization_config")
    if quant is not None:
        cfg["quantization_config"] = quant
    with pytest.raises(error) as exc:
        read_scheme(cfg, flag=flag, source="config.json")
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_fp8_on_a_family_whose_quantized_class_is_not_modelled_is_refused_naming_it() -> None:
    cfg = _cfg(REPO / "tests/fixtures/falcon_h1_0_5b.json")
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    with pytest.raises(FlagError, match="Qwen3-Next, Qwen3.5, Nemotron-H only, not Falcon-H1"):
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")


# -- shards that contradict the config: one line naming the tensor and shard ---------------------------


def test_an_fp8_weight_without_its_scale_is_refused(cli: Callable[..., Any], tmp_path: Path) -> None:
    cfg = _few_layers(_cfg(QWEN_BLOCK))
    tensors = [t for t in _fp8_tensors(cfg) if t[0] != "model.layers.5.linear_attn.out_proj.weight_scale_inv"]
    d = _fp8_dir(tmp_path, cfg, tensors)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "model.layers.5.linear_attn.out_proj.weight" in line and "weight_scale_inv" in line, line
    assert "in shard 'model-0000" in line, line


@pytest.mark.slow  # an 80B-parameter checkpoint's 150k tensors written and read: the slow step runs it
def test_a_scale_of_the_wrong_shape_is_refused(cli: Callable[..., Any], tmp_path: Path) -> None:
    cfg = _cfg(QWEN_BLOCK)
    name = "model.layers.3.self_attn.o_proj.weight_scale_inv"
    tensors = [(n, (1, 1) if n == name else s, dt) for n, s, dt in _fp8_tensors(cfg)]
    d = _fp8_dir(tmp_path, cfg, tensors)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert name in line and "[1, 1]" in line and "[16, 32]" in line, line


def test_an_fp8_config_over_bf16_shards_is_refused(cli: Callable[..., Any], tmp_path: Path) -> None:
    cfg = _few_layers(_cfg(QWEN_BLOCK))
    d = _fp8_dir(tmp_path, cfg, model_tensors(cfg))
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "no shard holds a float8 weight" in line, line


def test_an_int32_packed_weight_under_a_bf16_config_is_refused(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    cfg = _few_layers(_cfg(QWEN_BLOCK))
    cfg.pop("quantization_config")
    tensors = model_tensors(cfg) + [("model.layers.0.linear_attn.out_proj.qweight", (512, 2048), "I32")]
    d = _fp8_dir(tmp_path, cfg, tensors)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "out_proj.qweight" in line and "declares no quantization" in line, line


@pytest.mark.slow  # an 80B-parameter checkpoint's 150k tensors written and read: the slow step runs it
def test_nothing_past_the_headers_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The FP8 checks read the headers only: the bytes read are the headers' own."""
    from checker.families.weights_source import checkpoint_weights

    d = _fp8_dir(tmp_path, _cfg(QWEN_BLOCK))
    _, ckpt = checkpoint_weights(d, WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    assert 0 < ckpt.header_bytes < ckpt.total_bytes // 1000
    with pytest.raises(CheckerInputError):
        checkpoint_weights(d, WeightsLayout(pp_size=1, tp_size=8), release="0.5.23")


# -- ModelOpt FP8 (modelopt_fp8): hf_quant_config.json or config.json's flat quantization_config ---------

FALCON_MO = W / "falcon_h1_modelopt_fp8.json"
NEMOTRON_MO = W / "nemotron_h_modelopt_fp8.json"


def _falcon_attn_mlp(module: str) -> bool:
    """The projections 0.5.23's Falcon-H1 class quantizes: attention and MLP, not the Mamba mixer
    (built without the quant config, falcon_h1.py:187-200) nor the excluded head."""
    return ".self_attn." in module or ".feed_forward." in module


def _modelopt_dir(tmp_path: Path, config: Path, quantized: Callable[[str], bool]) -> Path:
    from tests.checkpoints import modelopt_tensors

    cfg = _cfg(config)
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    beside = config.with_name(config.name.removesuffix(".json") + ".hf_quant_config.json")
    if beside.is_file():
        (d / "hf_quant_config.json").write_text(beside.read_text())
    write_checkpoint(d, modelopt_tensors(cfg, quantized), shards=3)
    return d


def _sglang_figure(case: str, layout: dict[str, int], rank: int) -> int:
    doc = json.loads((W / "expected.json").read_text())
    (entry,) = [e for e in doc["figures"]["0.5.23"][case]["layouts"] if e["layout"] == layout]
    return int(entry["ranks"][rank][1])


def test_a_modelopt_fp8_falcon_h1_beside_its_hf_quant_config_derives_sglangs_figure(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """The issue's tried case: Falcon-H1-0.5B with F8_E4M3 projections, their weight_scale/input_scale, and
    a hf_quant_config.json beside config.json was "weights 1.09 GiB", the bf16 figure. Now derive reports
    the figure of 0.5.23's ModelOptFp8 classes (parameters equal to the meta-built class's, in
    expected.json), well under the bf16 one."""
    from checker.families.weights_source import checkpoint_weights

    d = _modelopt_dir(tmp_path, FALCON_MO, _falcon_attn_mlp)
    mw, _ = checkpoint_weights(d, WeightsLayout(pp_size=1, tp_size=1), release="0.5.23")
    # what the class builds, less the float32 weight_scale and input_scale per logical shard that
    # process_weights_after_loading replaces (modelopt_quant.py:626-627; the replacements are copies):
    # qkv 3 + o 1 + gate_up 2 + down 1 shards a layer
    built = _sglang_figure("falcon_h1/modelopt-fp8", {"pp": 1, "tp": 1}, 0)
    layers = _cfg(FALCON_MO)["num_hidden_layers"]
    assert mw.ranks[0].param_bytes == built - 8 * 7 * layers
    bf16 = model_weights(_cfg(FALCON_MO), WeightsLayout(pp_size=1, tp_size=1), release="0.5.23")
    assert mw.ranks[0].param_bytes < 0.8 * bf16.ranks[0].param_bytes
    res = cli([*DERIVE, "--pp-size", "1", "--tp-size", "1", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    assert f"{mw.ranks[0].total_bytes / GIB:.2f}" in res.out
    assert f"{bf16.ranks[0].total_bytes / GIB:.2f}" not in res.out


def test_falcon_h1_holds_its_mamba_mixer_unquantized_so_its_fp8_scales_are_the_load_keyerror(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """0.5.23's Falcon-H1 builds MambaMixer2 without the quant config: in_proj stays bf16 and has no
    weight_scale parameter, and its load_weights indexes params_dict with every name (falcon_h1.py:552):
    a checkpoint with F8 mixer projections cannot load. One line naming the scale and its shard."""
    d = _modelopt_dir(tmp_path, FALCON_MO, lambda m: _falcon_attn_mlp(m) or ".mamba." in m)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "model.layers.0.mamba.in_proj.weight_scale" in line or "mamba.in_proj.input_scale" in line, line
    assert "in shard 'model-0000" in line and "KeyError" in line and "unquantized" in line, line


def test_modelopt_fp8_holds_per_shard_scales_and_keeps_0d_or_per_channel_ones_after_loading() -> None:
    """ModelOptFp8LinearMethod: [shards] weight_scale and input_scale as built; after loading one 0-d
    scale where FlashInfer's per-tensor GEMM takes the layer (both dimensions divisible by 16), one per
    output channel where it does not (modelopt_quant.py:611-633), and the input scale's 0-d maximum."""
    from checker.families.rules import rank_params

    cfg = _cfg(FALCON_MO)
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}
    cfg["intermediate_size"] = 2040  # down_proj's input: not a multiple of 16
    ((_, params),) = rank_params(cfg, WeightsLayout(pp_size=1, tp_size=1), release="0.5.23")
    by = {p.name: p for p in params}
    qkv = "model.layers.0.qkv_proj"
    assert by[f"{qkv}.weight_scale"].shape == by[f"{qkv}.input_scale"].shape == (3,)
    assert by[f"{qkv}.weight_scale.max"].shape == () and by[f"{qkv}.weight_scale.max"].part == "copies"
    down = "model.layers.0.feed_forward.down_proj"
    assert by[f"{down}.weight_scale.max"].shape == (1024, 1)
    assert by[f"{down}.input_scale.max"].shape == ()
    assert by["lm_head.weight"].dtype == "float32" and "lm_head.weight_scale" not in by


def test_nemotron_h_modelopt_fp8_from_config_json_reads_ignore_globs_and_the_kv_cache_scheme() -> None:
    """config.json's flat ModelOpt quantization_config: ``backbone.layers.0.*`` (mapped to model.) keeps
    layer 0 bf16 and no other; ``kv_cache_scheme`` float 8 bits gives each attention layer k/v scales,
    which a config without it does not."""
    from checker.families.rules import rank_params

    cfg = _cfg(NEMOTRON_MO)
    ((_, params),) = rank_params(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")[:1]
    by = {p.name: p for p in params}
    assert by["model.layers.0.mixer.in_proj.weight"].dtype == "bfloat16"
    assert by["model.layers.4.mixer.in_proj.weight"].dtype == "float8_e4m3fn"
    assert by["model.layers.4.mixer.in_proj.weight_scale"].shape == (5,)
    # the glob's ``0.`` is a whole part: layer 20 is not layer 0's
    assert by["model.layers.20.mixer.in_proj.weight"].dtype == "float8_e4m3fn"
    assert by["model.layers.50.mixer.in_proj.weight"].dtype == "float8_e4m3fn"
    assert by["model.layers.51.mixer.up_proj.weight"].dtype == "bfloat16"
    assert by["model.layers.7.mixer.attn.k_scale"].shape == ()
    del cfg["quantization_config"]["kv_cache_scheme"]
    ((_, params),) = rank_params(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")[:1]
    assert not any(p.name.endswith("k_scale") for p in params)


@pytest.mark.parametrize(
    ("quant", "flag", "says"),
    [
        ({"quant_method": "modelopt", "quant_algo": "NVFP4_AWQ"}, None, "SGLang's modelopt_fp4 with"),
        ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, None, "(SGLang's mxfp8)"),
        ({"quant_algo": "W4A8_AWQ"}, None, "modelopt W4A8_AWQ"),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8", "contradicts"),
        ({"quant_method": "modelopt", "quant_algo": "FP8", "ignore": "lm_head"}, None, "list of module"),
    ],
    ids=["nvfp4-awq", "mxfp8", "other-algo", "flag", "bad-ignore"],
)
def test_a_modelopt_quantization_the_checker_or_the_release_refuses_is_one_line(
    quant: dict[str, Any], flag: str | None, says: str
) -> None:
    cfg = _cfg(NEMOTRON_MO)
    cfg["quantization_config"] = quant
    with pytest.raises(CheckerInputError) as exc:
        read_scheme(cfg, flag=flag, source="config.json")
    assert says in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("flag", ["modelopt", "modelopt_fp8"])
def test_the_modelopt_flags_sglang_takes_for_an_fp8_checkpoint_agree(flag: str) -> None:
    scheme = read_scheme(_cfg(NEMOTRON_MO), flag=flag, source="config.json")
    assert scheme is not None and scheme.method == "modelopt_fp8"


@pytest.mark.parametrize("release", ["0.5.21", "0.5.9"])
def test_modelopt_fp8_on_a_release_whose_classes_were_not_checked_is_refused(release: str) -> None:
    with pytest.raises(FlagError) as exc:
        model_weights(_cfg(NEMOTRON_MO), WeightsLayout(pp_size=2, tp_size=2), release=release)
    assert f"not {release}'s" in str(exc.value) and "modelopt_fp8" in str(exc.value)


@pytest.mark.parametrize(("release", "scale"), [("0.5.10", (4096, 1)), ("0.5.17", (4096, 1)), ("0.5.20", ())])
def test_modelopt_fp8_weight_scale_after_loading_follows_the_releases_flashinfer_rule(
    release: str, scale: tuple[int, ...]
) -> None:
    """The kept weight scale of a 4096x2048 linear on Hopper: per output channel up to 0.5.17 (the
    FlashInfer per-tensor GEMM is SM100/SM120 only, 0.5.17 modelopt_quant.py:508-510), 0-d from 0.5.18
    (0.5.20 checked)
    (flashinfer_per_tensor_fp8_supported includes SM90, 0.5.18 fp8_utils.py:354-357)."""
    ((_, params), *_) = rank_params(_cfg(NEMOTRON_MO), WeightsLayout(pp_size=1, tp_size=2), release=release)
    by = {p.name: p for p in params}
    assert by["model.layers.2.mixer.out_proj.weight_scale.max"].shape == scale


def test_modelopt_fp8_heads_take_the_linear_method_from_0_5_15() -> None:
    """ParallelLMHead under ModelOpt FP8: quantized from 0.5.15 (modelopt_quant.py:304-306), a plain head
    on 0.5.10-0.5.14 (LinearBase only); held to each release's class in expected.json."""
    from checker.core.weights.quant import HF_QUANT_KEY

    cfg = _cfg(W / "falcon_h1_modelopt_fp8_head.json")
    cfg[HF_QUANT_KEY] = _cfg(W / "falcon_h1_modelopt_fp8_head.hf_quant_config.json")
    for release, quantized in (("0.5.13", False), ("0.5.15", True)):
        ((_, params), *_) = rank_params(cfg, WeightsLayout(pp_size=1, tp_size=2), release=release)
        assert any(p.name == "lm_head.weight_scale" for p in params) is quantized


def test_a_modelopt_fp8_declaration_over_bf16_shards_is_refused(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    d = _modelopt_dir(tmp_path, FALCON_MO, lambda m: False)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "no shard holds a float8 weight" in line and "hf_quant_config.json" in line, line


def test_the_modelopt_figures_of_every_checked_release_are_in_the_fixture() -> None:
    from checker.core.weights.quant import CHECKED_RELEASES

    doc = json.loads((W / "expected.json").read_text())
    cases = [c for c in doc["cases"] if "/modelopt-fp8" in c]
    assert len(cases) >= 3
    for release in CHECKED_RELEASES["modelopt_fp8"]:
        assert all("layouts" in doc["figures"].get(release, {}).get(c, {}) for c in cases), release


def _module_path_match(ignored: str, prefix: str) -> bool:
    """SGLang 0.5.23's own rule, as written in quantization/utils.py:48-60 (the oracle)."""
    ignored, prefix = ignored.rstrip("."), prefix.rstrip(".")
    return ignored == prefix or prefix.startswith(ignored + ".") or f".{ignored}." in f".{prefix}."


_PART = st.sampled_from(
    ["model", "layers", "0", "1", "mlp", "gate", "gate_up_proj", "experts", "lm_head", "mtp"]
)
_PATH = st.lists(_PART, min_size=1, max_size=5).map(".".join)


@given(st.lists(st.one_of(_PATH, _PATH.map(lambda p: p + ".")), max_size=6), _PATH)
def test_the_ignore_list_matches_as_sglang_matches_it(ignored: list[str], prefix: str) -> None:
    """The set lookup the checker uses (fast on 512-expert models) skips exactly the modules SGLang's
    ``_module_path_match`` skips: whole dotted parts, ``mlp.gate`` never ``mlp.gate_up_proj``."""
    want = any(_module_path_match(i, prefix) for i in ignored)
    assert _path_matches_any(tuple(ignored), prefix) == want


# -- compressed-tensors FP8 W8A8 (quant_method compressed-tensors, config_groups / ignore) ---------------

NEMOTRON_CT = W / "nemotron_h_ct_fp8_tensor.json"
QWEN_CT = W / "qwen3_next_ct_fp8_channel.json"
QWEN_CT_BLOCK = W / "qwen3_next_ct_fp8_block.json"


def _ct_dir(tmp_path: Path, cfg: dict[str, Any], tensors: list[Any] | None = None) -> Path:
    from tests.checkpoints import compressed_tensors

    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    write_checkpoint(d, compressed_tensors(cfg) if tensors is None else tensors, shards=3)
    return d


def test_a_compressed_tensors_fp8_nemotron_h_checkpoint_derives_sglangs_figure(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Nemotron-H 8B as llm-compressor writes it (per-tensor FP8, static input scales, FP8 KV cache, the
    head and layer 0's mixer in_proj ignored under their HF names): every rank of pp 2 x tp 2 read from
    the shards equals what 0.5.23's CompressedTensorsW8A8Fp8 classes hold (expected.json), and derive
    prints that figure, not the bf16 one."""
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(NEMOTRON_CT)
    d = _ct_dir(tmp_path, cfg)
    mw, ckpt = checkpoint_weights(d, WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    for rank in range(4):
        want = _sglang_figure("nemotron_h/ct-fp8-tensor", {"pp": 2, "tp": 2}, rank)
        assert mw.ranks[rank].param_bytes == want, rank
    assert 0 < ckpt.header_bytes < ckpt.total_bytes // 1000  # headers only
    bf16 = {k: v for k, v in cfg.items() if k != "quantization_config"}
    plain = model_weights(bf16, WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    assert mw.ranks[2].param_bytes < 0.7 * plain.ranks[2].param_bytes
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    per_rank = json.loads(res.out)["weights"]["per_rank"]
    assert [r["param_bytes"] for r in per_rank] == [r.param_bytes for r in mw.ranks]
    busiest = max(r.total_bytes for r in mw.ranks)
    assert f"weights {busiest / GIB:.2f} GiB (the checkpoint" in res.out


def test_compressed_tensors_holds_each_strategys_scales_and_keeps_ignored_layers_bf16() -> None:
    """Per channel (Qwen3-Next FP8-dynamic): ``weight_scale`` [out, 1] on every quantized linear, the
    experts [E, 2I, 1] and [E, H, 1], no input scale (dynamic activations); ``in_proj_ba`` stays bf16
    without a scale (the ``re:`` ignore entry); no KV scales without a kv_cache_scheme. Per tensor with
    static inputs (Nemotron-H): [shards] scales, a 0-d maximum kept after loading, the ignored
    ``backbone.layers.0.mixer.in_proj`` (mapped to model.) bf16, k/v scales from the kv_cache_scheme."""
    from checker.families.rules import rank_params

    (_, params), *_ = rank_params(_cfg(QWEN_CT), WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    by = {p.name: p for p in params}
    pre = "model.layers.0.linear_attn"
    assert by[f"{pre}.in_proj_qkvz.weight_scale"].shape == (3072, 1)
    assert by[f"{pre}.in_proj_ba.weight"].dtype == "bfloat16" and f"{pre}.in_proj_ba.weight_scale" not in by
    assert by["model.layers.0.mlp.experts.w13_weight_scale"].shape == (513, 256, 1)
    assert by["model.layers.0.mlp.experts.w2_weight_scale"].shape == (513, 2048, 1)
    assert not any(n.endswith(("input_scale", "k_scale")) for n in by)
    ((_, params), *_) = rank_params(_cfg(NEMOTRON_CT), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    by = {p.name: p for p in params}
    assert by["model.layers.0.mixer.in_proj.weight"].dtype == "bfloat16"
    assert by["model.layers.4.mixer.in_proj.weight_scale"].shape == (5,)
    assert by["model.layers.4.mixer.in_proj.input_scale"].shape == (5,)
    assert by["model.layers.4.mixer.in_proj.weight_scale.max"].part == "copies"
    assert by["model.layers.7.mixer.attn.k_scale"].shape == ()


def test_compressed_tensors_block_scales_and_the_tp8_refusal() -> None:
    """FP8_BLOCK: the [ceil(out/128), ceil(in/128)] grid per linear, the experts' grids; tp 8 leaves
    64-wide expert partitions, 0.5.23's refusal (recorded in expected.json)."""
    from checker.families.rules import rank_params

    (_, params), *_ = rank_params(_cfg(QWEN_CT_BLOCK), WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    by = {p.name: p for p in params}
    assert by["model.layers.0.linear_attn.in_proj_qkvz.weight_scale"].shape == (24, 16)
    assert by["model.layers.0.mlp.experts.w13_weight_scale"].shape == (513, 2, 16)
    with pytest.raises(LayoutError, match="not divisible by the compressed-tensors FP8 block"):
        model_weights(_cfg(QWEN_CT_BLOCK), WeightsLayout(pp_size=1, tp_size=8), release="0.5.23")


def test_a_scheme_the_releases_moe_method_rejects_is_its_own_one_line(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Per-tensor FP8 weights with dynamic per-token activations: fine for 0.5.23's linears, an assertion
    in its FP8 MoE method (expected.json records the AssertionError): one line naming the layer, exit 2,
    from a config-only model directory."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((W / "qwen3_next_ct_fp8_tensor_token.json").read_text())
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "model.layers.0.mlp.experts" in line and "tensor FP8 weights with token activations" in line, line
    assert "compressed_tensors_w8a8_fp8_moe.py:65" in line, line


def _ct_with(**changes: Any) -> dict[str, Any]:
    cfg = _cfg(NEMOTRON_CT)
    q = cfg["quantization_config"]
    for key, value in changes.items():
        if key in ("weights", "input_activations"):
            q["config_groups"]["group_0"][key] = value
        else:
            q[key] = value
    return cfg


_INT4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
_INT8 = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}


@pytest.mark.parametrize(
    ("changes", "error", "says"),
    [
        ({"weights": _INT8, "format": "int-quantized"}, FlagError, "INT8 W8A8"),
        ({"weights": _INT4, "input_activations": None, "format": "marlin-24"}, ConfigError, "Sparse24"),
        ({"input_activations": None}, FlagError, "FP8 weight-only"),
        ({"format": "dense"}, ConfigError, "No compressed-tensors compatible scheme"),
        ({"ignore": ["backbone.layers.7.mixer.q_proj"]}, ConfigError, "some but not all of"),
        ({"sparsity_config": {"format": "sparse-24-bitmask"}}, FlagError, "sparsity_config"),
        ({"weights": {"num_bits": 8, "type": "fp", "strategy": "tensor"}}, ConfigError, "QuantizationArgs"),
        ({"ignore": ["re:("]}, ConfigError, "regular expression"),
    ],
    ids=[
        "int8-w8a8",
        "sparse24",
        "w8a16",
        "dense-format",
        "uneven-shards",
        "sparsity",
        "bad-type",
        "bad-regex",
    ],
)
def test_a_compressed_tensors_scheme_refused_by_the_release_or_the_checker_is_one_line(
    changes: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as exc:
        model_weights(_ct_with(**changes), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_a_module_no_target_matches_is_the_release_refusal() -> None:
    """Targets that name only the MLP projections: layer 0's mixer out_proj matches none, SGLang's 'Unable to
    find matching target' (compressed_tensors/utils.py:140)."""
    cfg = _cfg(NEMOTRON_CT)
    cfg["quantization_config"]["config_groups"]["group_0"]["targets"] = ["re:.*mixer[.](up|down)_proj$"]
    with pytest.raises(
        ConfigError, match="no compressed-tensors target matches model.layers.0.mixer.out_proj"
    ):
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")


def test_compression_config_is_read_as_quantization_config_and_flags_as_sglang_takes_them() -> None:
    cfg = _cfg(NEMOTRON_CT)
    cfg["compression_config"] = cfg.pop("quantization_config")
    scheme = read_scheme(cfg, source="config.json")
    assert scheme is not None and scheme.method == "compressed-tensors" and scheme.kv
    assert read_scheme(cfg, flag="compressed-tensors", source="config.json") is not None
    with pytest.raises(FlagError, match="serves it with its w8a8_fp8 method"):
        read_scheme(cfg, flag="w8a8_fp8", source="config.json")
    with pytest.raises(FlagError, match="contradicts"):
        read_scheme(cfg, flag="fp8", source="config.json")
    with pytest.raises(FlagError, match="not 0.5.21's"):
        model_weights(_cfg(NEMOTRON_CT), WeightsLayout(pp_size=2, tp_size=2), release="0.5.21")


def test_a_compressed_tensors_weight_without_its_scale_is_refused(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    from tests.checkpoints import compressed_tensors

    cfg = _cfg(NEMOTRON_CT)
    gone = "backbone.layers.5.mixer.up_proj.input_scale"
    d = _ct_dir(tmp_path, cfg, [t for t in compressed_tensors(cfg) if t[0] != gone])
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert gone in line and "in shard 'model-0000" in line and "compressed-tensors" in line, line


def test_a_compressed_tensors_scale_of_the_wrong_shape_is_refused(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    from tests.checkpoints import compressed_tensors

    cfg = _cfg(NEMOTRON_CT)
    name = "backbone.layers.3.mixer.down_proj.weight_scale"
    d = _ct_dir(tmp_path, cfg, [(n, (4096, 1) if n == name else s, t) for n, s, t in compressed_tensors(cfg)])
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert name in line and "[4096, 1]" in line and "[] or [1]" in line, line


def test_a_compressed_tensors_config_over_bf16_shards_is_refused(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    cfg = _cfg(NEMOTRON_CT)
    d = _ct_dir(tmp_path, cfg, model_tensors(cfg))
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "compressed-tensors" in line and "no shard holds a float8 weight" in line, line


def test_the_compressed_tensors_figures_of_every_checked_release_are_in_the_fixture() -> None:
    from checker.core.weights.quant import CHECKED_RELEASES

    doc = json.loads((W / "expected.json").read_text())
    cases = [c for c in doc["cases"] if "/ct-fp8" in c]
    assert len(cases) >= 5
    for release in CHECKED_RELEASES["compressed-tensors"]:
        assert all(c in doc["figures"].get(release, {}) for c in cases), release


# -- compressed-tensors INT weight-only, pack-quantized (W4A16/W8A16: CompressedTensorsWNA16, Marlin) -----

QWEN_W4A16 = W / "qwen3_next_ct_w4a16.json"
NEMOTRON_W4A16_ZP = W / "nemotron_h_ct_w4a16_zp.json"
NEMOTRON_W8A16 = W / "nemotron_h_ct_w8a16.json"


def _packed_dir(tmp_path: Path, cfg: dict[str, Any], tensors: list[Any] | None = None) -> Path:
    from tests.checkpoints import packed_tensors

    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    write_checkpoint(d, packed_tensors(cfg) if tensors is None else tensors, shards=3)
    return d


def test_a_w4a16_nemotron_h_checkpoint_with_zero_points_derives_sglangs_figure(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Nemotron-H 8B in W4A16 group 128 with zero points (weight_packed, weight_scale, weight_shape,
    weight_zero_point): the shards' headers are held to the config, every rank of pp 2 x tp 2 equals
    what 0.5.23's CompressedTensorsWNA16 builds (expected.json), about a third of the bf16 figure, and
    derive prints it; only the headers are read."""
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(NEMOTRON_W4A16_ZP)
    d = _packed_dir(tmp_path, cfg)
    mw, ckpt = checkpoint_weights(d, WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    for rank in range(4):
        want = _sglang_figure("nemotron_h/ct-w4a16-zp", {"pp": 2, "tp": 2}, rank)
        assert mw.ranks[rank].param_bytes == want, rank
    assert 0 < ckpt.header_bytes < ckpt.total_bytes // 1000
    bf16 = {k: v for k, v in cfg.items() if k != "quantization_config"}
    plain = model_weights(bf16, WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    assert mw.ranks[2].param_bytes < 0.4 * plain.ranks[2].param_bytes
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    per_rank = json.loads(res.out)["weights"]["per_rank"]
    assert [r["param_bytes"] for r in per_rank] == [r.param_bytes for r in mw.ranks]


def test_wna16_linears_hold_packed_weights_group_scales_and_a_marlin_workspace() -> None:
    """CompressedTensorsWNA16 per linear: int32 weight_packed [out, in/8], the model-dtype scales of the
    rank's own input groups (a row-split down_proj: 10752/128 = 84), int64 weight_shape, int32 zero
    points [out/8, groups]; after loading a Marlin workspace of one int32 per SM (a kept copy). Per
    channel (W8A16): one scale per output row, [out, 1], the packing four to an int32."""
    from checker.families.rules import rank_params

    rp = rank_params(_cfg(NEMOTRON_W4A16_ZP), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    by = {p.name: p for p in rp[0][1]}
    down = "model.layers.1.mixer.down_proj"
    assert (by[f"{down}.weight_packed"].shape, by[f"{down}.weight_packed"].dtype) == ((4096, 1344), "int32")
    assert by[f"{down}.weight_scale"].shape == (4096, 84) and by[f"{down}.weight_scale"].dtype == "bfloat16"
    assert by[f"{down}.weight_zero_point"].shape == (512, 84)
    assert by[f"{down}.weight_shape"].dtype == "int64"
    assert by[f"{down}.marlin_workspace"].part == "copies" and by[f"{down}.marlin_workspace"].nbytes == 528
    assert by["model.layers.0.mixer.in_proj.weight"].dtype == "bfloat16"  # ignored under its HF name
    rp = rank_params(_cfg(NEMOTRON_W8A16), WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    by = {p.name: p for p in rp[0][1]}
    assert by[f"{down}.weight_packed"].shape == (4096, 2688) and by[f"{down}.weight_scale"].shape == (4096, 1)


def test_a_wna16_moe_frees_its_unused_g_idx_after_loading_but_its_segments_stay() -> None:
    """CompressedTensorsWNA16MoE builds four int32 g_idx tensors per layer and, without activation order
    group, replaces them by empty ones after loading: not held (param_bytes is SGLang's built figure
    less them), yet the 20 MiB segments they share with the scales stay reserved (the margin keeps
    them); the Marlin workspace (four int32 per SM) is kept."""
    from checker.core.weights.weights import allocator_bytes
    from checker.families.rules import rank_params

    cfg = _cfg(QWEN_W4A16)
    layout = WeightsLayout(pp_size=1, tp_size=4)
    ((_, params), *_) = rank_params(cfg, layout, release="0.5.23")
    by = {p.name: p for p in params}
    ex = "model.layers.0.mlp.experts"
    assert by[f"{ex}.w13_weight_packed"].shape == (513, 256, 256)
    assert by[f"{ex}.w2_weight_scale"].shape == (513, 1, 2048)
    assert by[f"{ex}.w13_weight_g_idx"].part == "dropped" and by[f"{ex}.w13_weight_g_idx"].shape == (
        513,
        2048,
    )
    assert by[f"{ex}.marlin_workspace"].nbytes == 4 * 132 * 4
    dropped = sum(p.nbytes for p in params if p.part == "dropped")
    mw = model_weights(cfg, layout, release="0.5.23")
    built = _sglang_figure("qwen3_next/ct-w4a16", {"pp": 1, "tp": 4}, 0)
    assert mw.ranks[0].param_bytes == built - dropped and dropped > 400 * 2**20
    every = allocator_bytes([p.nbytes for p in params])
    assert mw.ranks[0].total_bytes == every  # no segment empties: the freed bytes stay reserved


def test_an_emptied_segment_is_returned_and_a_shared_one_kept() -> None:
    from checker.core.weights.weights import allocator_bytes

    mib = 2**20
    assert allocator_bytes([12 * mib, 3 * mib], freed=[0]) == 20 * mib  # its own 12 MiB segment returned
    assert allocator_bytes([3 * mib, 3 * mib], freed=[0]) == 20 * mib  # shares a 20 MiB segment: kept
    assert allocator_bytes([3 * mib, 3 * mib], freed=[0, 1]) == 0


def test_a_quantized_qwen3_next_linear_attn_projection_is_the_class_attributeerror(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """0.5.23's Qwen3-Next wraps in_proj_qkvz's loader through its .weight (qwen3_next.py:311): quantized
    weight-only it has none; expected.json records the AttributeError. One line, exit 2, from config.json."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((W / "qwen3_next_ct_w4a16_linear_attn.json").read_text())
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "linear_attn.in_proj_qkvz" in line and "qwen3_next.py:311" in line, line


def test_wna16_refusals_of_the_release_are_one_line() -> None:
    """Group 256 at tp 8: down_proj's 2688-wide input partition is not whole groups (the assertion
    expected.json records); experts under a top-level format other than pack-quantized
    (compressed_tensors_wNa16_moe.py:89); a group strategy without a size."""
    with pytest.raises(LayoutError, match="not divisible by the compressed-tensors group size 256"):
        model_weights(
            _cfg(W / "nemotron_h_ct_w4a16_g256.json"), WeightsLayout(pp_size=1, tp_size=8), release="0.5.23"
        )
    cfg = _cfg(QWEN_W4A16)
    cfg["quantization_config"]["format"] = "mixed-precision"
    with pytest.raises(ConfigError, match="compressed_tensors_wNa16_moe.py:89") as exc:
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ("no-scale", "no shard holds backbone.layers.5.mixer.up_proj.weight_scale"),
        ("scale-shape", "[10752, 33]"),
        ("no-zero-point", "backbone.layers.5.mixer.up_proj.weight_zero_point"),
        ("bf16-weight", "is BF16"),
        ("group", "group_size 96 does not divide"),
        ("bf16-shards", "no shard holds a weight_packed"),
    ],
)
def test_packed_shards_that_contradict_the_config_are_one_line(
    cli: Callable[..., Any], tmp_path: Path, edit: str, says: str
) -> None:
    from tests.checkpoints import packed_tensors

    cfg = _cfg(NEMOTRON_W4A16_ZP)
    up = "backbone.layers.5.mixer.up_proj"
    tensors = packed_tensors(cfg)
    if edit == "no-scale":
        tensors = [t for t in tensors if t[0] != f"{up}.weight_scale"]
    elif edit == "scale-shape":
        tensors = [(n, (10752, 33) if n == f"{up}.weight_scale" else s, dt) for n, s, dt in tensors]
    elif edit == "no-zero-point":
        tensors = [t for t in tensors if t[0] != f"{up}.weight_zero_point"]
    elif edit == "bf16-weight":
        tensors = [(n, s, "BF16" if n == f"{up}.weight_packed" else dt) for n, s, dt in tensors]
    elif edit == "group":
        cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 96
    else:
        tensors = model_tensors(cfg)
    d = _packed_dir(tmp_path, cfg, tensors)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert says in line, line


def test_an_int32_weight_packed_under_a_bf16_config_is_refused(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    from tests.checkpoints import packed_tensors

    cfg = _cfg(NEMOTRON_W4A16_ZP)
    tensors = packed_tensors(cfg)
    cfg.pop("quantization_config")
    line = _one_line(
        cli(
            [
                *DERIVE,
                "--pp-size",
                "1",
                "--tp-size",
                "2",
                "--model-config",
                str(_packed_dir(tmp_path, cfg, tensors)),
            ]
        )
    )
    assert "weight_packed" in line and "declares no quantization" in line, line


@pytest.mark.slow  # an 80B-parameter checkpoint's 220k tensors written and read: the slow step runs it
def test_a_w4a16_qwen3_next_checkpoint_derives_sglangs_figure(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Qwen3-Next-80B W4A16 at tp 4 x ep 4: the shards' headers held to the config, rank 0's figure
    SGLang's built one less the g_idx its MoE method frees, and derive takes it."""
    from checker.families.rules import rank_params
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(QWEN_W4A16)
    layout = WeightsLayout(pp_size=1, tp_size=4, ep_size=4)
    d = _packed_dir(tmp_path, cfg)
    mw, _ = checkpoint_weights(d, layout, release="0.5.23")
    params = rank_params(cfg, layout, release="0.5.23")[0][1]
    dropped = sum(p.nbytes for p in params if p.part == "dropped")
    built = _sglang_figure("qwen3_next/ct-w4a16", {"pp": 1, "tp": 4, "ep": 4}, 0)
    assert mw.ranks[0].param_bytes + dropped == built
    res = cli([*DERIVE, "--pp-size", "1", "--tp-size", "4", "--model-config", str(d)])
    assert res.rc == 0, res.err
    tp4 = model_weights(cfg, WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    assert f"weights {max(r.total_bytes for r in tp4.ranks) / GIB:.2f} GiB (the checkpoint" in res.out


def test_the_wna16_figures_of_every_checked_release_are_in_the_fixture() -> None:
    from checker.core.weights.quant import CHECKED_RELEASES

    doc = json.loads((W / "expected.json").read_text())
    cases = [c for c in doc["cases"] if "/ct-w4a16" in c or "/ct-w8a16" in c]
    assert len(cases) >= 8
    for release in CHECKED_RELEASES["compressed-tensors"]:
        assert all(c in doc["figures"].get(release, {}) for c in cases), release
        ok = [c for c in cases if "layouts" in doc["figures"][release][c]]
        # 0.5.10 and 0.5.13 refuse zero points (compressed.py ZERO_POINT_*_FROM), and every release
        # before 0.5.20 actorder group (PINNED_FROM)
        assert len(ok) >= {"0.5.10": 2, "0.5.13": 3}.get(release, 5 if release < "0.5.20" else 6), release


# -- the earlier releases' rules (issue 39.1): each held to its own classes in expected.json -----------------


def _quant_case(case: str) -> dict[str, Any]:
    from checker.core.weights.quant import HF_QUANT_KEY

    spec = json.loads((W / "expected.json").read_text())["cases"][case]
    path = REPO / spec["config"]
    cfg = _cfg(path)
    beside = path.with_name(path.name.removesuffix(".json") + ".hf_quant_config.json")
    if beside.is_file():
        cfg[HF_QUANT_KEY] = _cfg(beside)
    return cfg


def test_modelopt_fp8_per_shard_scales_are_freed_for_their_replacements_not_held_twice() -> None:
    """ModelOptFp8LinearMethod replaces weight_scale and input_scale [shards] after loading
    (modelopt_quant.py:626-627): the built ones are freed (dropped), the kept ones copies; each linear's
    bytes held after loading are its weight and the two kept scales, nothing more."""
    cfg = _cfg(FALCON_MO)
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}
    ((_, params),) = rank_params(cfg, WeightsLayout(pp_size=1, tp_size=1), release="0.5.23")
    qkv = "model.layers.0.qkv_proj"
    mine = [p for p in params if p.name.startswith(qkv + ".")]
    held = sum(p.nbytes for p in mine if p.part != "dropped")
    weight = next(p for p in mine if p.name == f"{qkv}.weight")
    assert held == weight.nbytes + 4 + 4  # the 0-d weight scale and the 0-d input scale
    assert {p.name for p in mine if p.part == "dropped"} == {f"{qkv}.weight_scale", f"{qkv}.input_scale"}


@pytest.mark.parametrize(
    ("case", "release", "says"),
    [
        ("nemotron_h/ct-w4a16-zp", "0.5.10", "compressed_tensors.py:629"),
        ("qwen3_next/ct-w8a16-zp", "0.5.10", "compressed_tensors.py:387"),
        ("qwen3_next/ct-w8a16-zp", "0.5.13", "compressed_tensors_wNa16_moe.py:72"),
        ("qwen3_next/ct-w4a16-gidx", "0.5.17", "does not pin compressed-tensors"),
        ("nemotron_h/modelopt-nvfp4", "0.5.10", "Minimum capability: 100"),
        ("nemotron_h/modelopt-nvfp4-head", "0.5.16", "requires group_size"),
    ],
)
def test_what_an_earlier_release_refuses_of_these_methods_is_its_one_line(
    case: str, release: str, says: str
) -> None:
    """Zero points (linears before 0.5.13, experts before 0.5.14), actorder group where compressed-tensors
    is unpinned (before 0.5.20), NVFP4 on Hopper before 0.5.13 and a flat NVFP4 config without a group size
    before 0.5.17: each the release's own refusal (recorded in expected.json), while the next checked
    release sizes the same config."""
    cfg = _quant_case(case)
    with pytest.raises(CheckerInputError) as exc:
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release=release)
    assert says in str(exc.value) and release in str(exc.value) and "\n" not in str(exc.value)
    later = {"0.5.10": "0.5.15", "0.5.13": "0.5.15", "0.5.16": "0.5.17", "0.5.17": "0.5.20"}[release]
    assert model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release=later).ranks


def test_compressed_tensors_kv_scales_arrive_with_0_5_19() -> None:
    """A static FP8 kv_cache_scheme gives attention k/v scales from 0.5.19 (CompressedTensorsKVCacheMethod);
    0.5.17's RadixAttention gets no quant method (8 bytes an attention layer, as its class holds)."""
    cfg = _cfg(NEMOTRON_CT)
    for release, scaled in (("0.5.17", False), ("0.5.20", True)):
        ((_, params),) = rank_params(cfg, WeightsLayout(pp_size=1, tp_size=1), release=release)
        assert any(p.name.endswith(".k_scale") for p in params) is scaled, release


def test_an_excluded_shared_expert_is_fused_as_an_nvfp4_slot_until_0_5_21() -> None:
    """0.5.15-0.5.20 fuse Qwen3-Next's shared expert into the NVFP4 experts even where exclude_modules
    keeps it bf16 (one more expert slot, no bf16 shared expert); 0.5.21+ veto it
    (ModelOptFp4Config.can_fuse_shared_expert)."""
    cfg = _quant_case("qwen3_next/modelopt-nvfp4-shared")
    layout = WeightsLayout(pp_size=1, tp_size=4, ep_size=4)
    for release, fused in (("0.5.20", True), ("0.5.22", False)):
        ((_, params), *_) = rank_params(cfg, layout, release=release)
        by = {p.name: p for p in params}
        assert by["model.layers.0.mlp.experts.w13_weight"].shape[0] == 128 + fused, release
        assert ("model.layers.0.mlp.shared_expert.down_proj.weight" in by) is not fused, release
