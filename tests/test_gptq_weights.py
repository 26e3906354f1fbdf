"""GPTQ checkpoints (issue 39 item 1): served by SGLang 0.5.23 on Hopper as gptq_marlin, per rank.

The per-rank figures are held to 0.5.23's own GPTQMarlinLinearScheme / GPTQMarlinMoEScheme built on the
meta device by the ``*/gptq-*`` cases of tests/fixtures/weights/expected.json (tests/test_weights.py);
here: what ``derive`` on a GPTQ model directory reports, what the Marlin repack keeps and frees, which
method the release picks, and every way the directory can contradict itself (one line, exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import ConfigError, FlagError, LayoutError
from checker.core.weights.quant import read_scheme
from checker.core.weights.weights import WeightsLayout
from checker.families.rules import model_weights, rank_params
from tests.checkpoints import gptq_tensors, model_tensors, write_checkpoint

REPO = Path(__file__).resolve().parent.parent
W = REPO / "tests/fixtures/weights"
NEMOTRON = W / "nemotron_h_gptq_int4.json"
NEMOTRON_ACT = W / "nemotron_h_gptq_int4_desc_act.json"
QWEN = W / "qwen3_next_gptq_int4.json"
QWEN_ACT = W / "qwen3_next_gptq_int4_desc_act.json"
DERIVE = ["derive", "--gpu-free-gib", "79", "--mem-fraction-static", "0.85"]
BACKBONE = (("backbone.", "model."),)


def _cfg(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _figure(case: str, layout: dict[str, int], rank: int) -> int:
    doc = json.loads((W / "expected.json").read_text())
    (entry,) = [e for e in doc["figures"]["0.5.23"][case]["layouts"] if e["layout"] == layout]
    return int(entry["ranks"][rank][1])


def _dir(tmp_path: Path, cfg: dict[str, Any], tensors: list[Any] | None = None) -> Path:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    write_checkpoint(d, gptq_tensors(cfg, prefixes=BACKBONE) if tensors is None else tensors, shards=3)
    return d


def _one_line(res: Any) -> str:
    assert res.rc == 2 and res.out == "", res
    (line,) = res.err.strip().splitlines()
    assert "Traceback" not in line
    return line


def test_a_gptq_nemotron_h_checkpoint_derives_sglangs_figure(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Nemotron-H 8B in GPTQ INT4 group 128 (qweight, qzeros, scales, g_idx): the shards' headers are held
    to the config, every rank of pp 2 x tp 2 equals what 0.5.23's gptq_marlin classes build less the
    g_idx and qzeros their repack frees, about a third of the bf16 figure, and derive reports it."""
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(NEMOTRON)
    layout = WeightsLayout(pp_size=2, tp_size=2)
    d = _dir(tmp_path, cfg)
    mw, ckpt = checkpoint_weights(d, layout, release="0.5.23")
    for rank, (_, params) in enumerate(rank_params(cfg, layout, release="0.5.23")):
        dropped = sum(p.nbytes for p in params if p.part == "dropped")
        assert mw.ranks[rank].param_bytes + dropped == _figure(
            "nemotron_h/gptq-int4", {"pp": 2, "tp": 2}, rank
        )
        assert dropped > 0
    assert 0 < ckpt.header_bytes < ckpt.total_bytes // 1000
    bf16 = {k: v for k, v in cfg.items() if k != "quantization_config"}
    plain = model_weights(bf16, layout, release="0.5.23")
    assert mw.ranks[2].param_bytes < 0.4 * plain.ranks[2].param_bytes
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    per_rank = json.loads(res.out)["weights"]["per_rank"]
    assert [r["param_bytes"] for r in per_rank] == [r.param_bytes for r in mw.ranks]


def test_a_gptq_linear_keeps_its_repack_and_frees_g_idx_and_qzeros() -> None:
    """GPTQMarlinLinearScheme: qweight int32 [in/8, out], scales of the rank's own groups (a row-split
    down_proj at tp 2: 10752/128 = 84); after loading a Marlin workspace is kept and, without activation
    order, g_idx and qzeros are freed. With activation order the scales of a row-split linear cover the
    whole input (168 groups) on every rank, and g_idx stays with its sort indices."""
    rp = rank_params(_cfg(NEMOTRON), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    by = {p.name: p for p in rp[0][1]}
    down = "model.layers.1.mixer.down_proj"
    assert (by[f"{down}.qweight"].shape, by[f"{down}.qweight"].dtype) == ((1344, 4096), "int32")
    assert (by[f"{down}.scales"].shape, by[f"{down}.scales"].dtype) == ((84, 4096), "bfloat16")
    assert by[f"{down}.qzeros"].part == by[f"{down}.g_idx"].part == "dropped"
    assert by[f"{down}.marlin_workspace"].part == "copies" and by[f"{down}.marlin_workspace"].nbytes == 528
    assert "model.layers.0.mixer.in_proj.weight" in by  # the '-:' dynamic rule keeps layer 0's mixer bf16
    rp = rank_params(_cfg(NEMOTRON_ACT), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    by = {p.name: p for p in rp[0][1]}
    assert by[f"{down}.scales"].shape == (168, 4096) and by[f"{down}.g_idx"].part == "layers"
    assert by[f"{down}.g_idx_sort_indices"].part == "copies"


def test_a_gptq_moe_holds_float16_scales_and_frees_its_g_idx() -> None:
    """GPTQMarlinMoEScheme on Qwen3-Next at tp 4: float16 scales whatever the model dtype, zeros in the model
    dtype, w2 scales of the whole intermediate size without activation order (128 x 4 / 128 = 4 groups,
    as the code sizes them: I_p x moe_tp, gptq_moe.py:195-201) and of the partition with it; the four g_idx
    freed without it."""
    layout = WeightsLayout(pp_size=1, tp_size=4)
    ((_, params), *_) = rank_params(_cfg(QWEN), layout, release="0.5.23")
    by = {p.name: p for p in params}
    ex = "model.layers.0.mlp.experts"
    assert by[f"{ex}.w13_qweight"].shape == (513, 256, 256)
    assert (by[f"{ex}.w2_scales"].shape, by[f"{ex}.w2_scales"].dtype) == ((513, 4, 2048), "float16")
    assert by[f"{ex}.w13_qzeros"].dtype == "bfloat16" and by[f"{ex}.w13_g_idx"].part == "dropped"
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in by
    ((_, params), *_) = rank_params(_cfg(QWEN_ACT), layout, release="0.5.23")
    by = {p.name: p for p in params}
    assert by[f"{ex}.w2_scales"].shape == (513, 1, 2048) and by[f"{ex}.w13_g_idx"].part == "layers"
    assert by["model.layers.3.qkv_proj.qweight"].shape == (512, 2560)  # '+:' bits 8: four to an int32


@pytest.mark.parametrize(
    ("quant", "flag", "error", "says"),
    [
        ({"bits": 4, "group_size": 128, "desc_act": False, "sym": False}, None, ConfigError, "sym=False"),
        ({"bits": 3, "group_size": 128, "desc_act": False, "sym": True}, None, ConfigError, "Unknown"),
        ({"bits": 4, "group_size": 256, "desc_act": False, "sym": True}, None, ConfigError, "group_size=256"),
        ({"bits": 4, "group_size": 128, "sym": True}, None, ConfigError, "no desc_act"),
        (
            {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "checkpoint_format": "marlin"},
            None,
            ConfigError,
            "Marlin format",
        ),
        ({"bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "gptq", ConfigError, "forces it"),
        ({"bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "awq", FlagError, "does not match"),
        ({"bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "moe_wna16", FlagError, "MoeWNA16"),
        (
            {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "lm_head": True},
            None,
            FlagError,
            "LM head",
        ),
        (
            {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "dynamic": {"+:(": {}}},
            None,
            ConfigError,
            "regular expression",
        ),
    ],
    ids=[
        "asym",
        "3-bit",
        "group-256",
        "no-desc-act",
        "marlin-format",
        "flag-gptq",
        "flag-awq",
        "moe-wna16",
        "lm-head",
        "bad-regex",
    ],
)
def test_a_gptq_config_the_release_or_the_checker_refuses_is_one_line(
    quant: dict[str, Any], flag: str | None, error: type[Exception], says: str
) -> None:
    """What 0.5.23 refuses on CUDA (a GPTQ config Marlin cannot take stays gptq, which CUDA does not register:
    'Unknown quantization method: gptq'; a flag that contradicts it) and what the checker does not model."""
    cfg = _cfg(NEMOTRON)
    cfg["quantization_config"] = {"quant_method": "gptq", **quant}
    with pytest.raises(error) as exc:
        read_scheme(cfg, flag=flag, source="config.json")
    assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


@pytest.mark.parametrize("flag", [None, "gptq_marlin", "marlin", "GPTQ_MARLIN"])
def test_the_flags_sglang_serves_gptq_marlin_under_agree(flag: str | None) -> None:
    scheme = read_scheme(_cfg(NEMOTRON), flag=flag, source="config.json")
    assert scheme is not None and scheme.method == "gptq_marlin"


def test_the_release_refusals_under_gptq_marlin_are_one_line() -> None:
    """Qwen3-Next with its linear_attn in_proj quantized: the class's AttributeError (qwen3_next.py:311);
    a '+:' rule with a group Marlin lacks; a float32 model; the Marlin MoE under another runner; a TP size
    whose row-split partition is not whole groups;
    a release whose classes were not checked."""
    cfg = _cfg(QWEN)
    cfg["quantization_config"]["dynamic"] = {}
    with pytest.raises(ConfigError, match="qwen3_next.py:311"):
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    cfg = _cfg(NEMOTRON)
    cfg["quantization_config"]["dynamic"] = {r"+:.*\.layers\.1\..*": {"group_size": 256}}
    with pytest.raises(ConfigError, match="marlin_utils.py:134"):
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    with pytest.raises(FlagError, match="loader.py:268"):
        model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=1, tp_size=2, dtype="float32"), release="0.5.23")
    with pytest.raises(FlagError, match="gptq_kernels.py:309"):
        model_weights(
            _cfg(QWEN), WeightsLayout(pp_size=1, tp_size=2, moe_runner_backend="triton"), release="0.5.23"
        )
    cfg = _cfg(NEMOTRON)
    cfg["intermediate_size"] = 21440  # down_proj's 10720-wide partition at tp 2: 83.75 groups of 128
    with pytest.raises(LayoutError, match="its input partition 10720 is not whole GPTQ groups of 128"):
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    with pytest.raises(FlagError, match="not 0.5.21's"):  # a release whose classes were not checked
        model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=1, tp_size=2), release="0.5.21")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ("no-scales", "no shard holds its 'backbone.layers.5.mixer.up_proj.scales'"),
        ("scales-shape", "[33, 21504]"),
        ("qzeros-shape", "backbone.layers.5.mixer.up_proj.qzeros"),
        ("bf16-qweight", "is BF16"),
        ("no-g-idx-desc-act", "desc_act"),
        ("group", "group_size 128 does not divide the input size 21440"),
        ("scales-group", "[64, 21504], but the [21504, 4096] weight"),
        ("bf16-shards", "no shard holds a qweight"),
        ("negative-rule", "keep SGLang's 'model.layers.5.mixer.up_proj' unquantized"),
    ],
)
def test_gptq_shards_that_contradict_the_config_are_one_line(
    cli: Callable[..., Any], tmp_path: Path, edit: str, says: str
) -> None:
    cfg = _cfg(NEMOTRON)
    up = "backbone.layers.5.mixer.up_proj"
    tensors = gptq_tensors(cfg, prefixes=BACKBONE)
    if edit == "no-scales":
        tensors = [t for t in tensors if t[0] != f"{up}.scales"]
    elif edit == "scales-shape":
        tensors = [(n, (33, 21504) if n == f"{up}.scales" else s, dt) for n, s, dt in tensors]
    elif edit == "qzeros-shape":
        tensors = [(n, (32, 21504) if n == f"{up}.qzeros" else s, dt) for n, s, dt in tensors]
    elif edit == "bf16-qweight":
        tensors = [(n, s, "BF16" if n == f"{up}.qweight" else dt) for n, s, dt in tensors]
    elif edit == "no-g-idx-desc-act":
        cfg["quantization_config"]["desc_act"] = True
        tensors = [t for t in tensors if t[0] != f"{up}.g_idx"]
    elif edit == "group":  # an MLP width of whole 32-groups, not 128-groups: the shards' ceil(in / 128)
        cfg["intermediate_size"] = 21440
        tensors = gptq_tensors(cfg, prefixes=BACKBONE)
    elif edit == "scales-group":  # shards written with group 64 under a group-128 config
        cfg["quantization_config"]["group_size"] = 64
        tensors = gptq_tensors(cfg, prefixes=BACKBONE)
        cfg["quantization_config"]["group_size"] = 128
    elif edit == "negative-rule":
        cfg["quantization_config"]["dynamic"] = {
            r"-:.*\.layers\.5\.mixer\..*": {},
            r"-:.*\.layers\.0\.mixer\..*": {},
        }
    else:
        tensors = model_tensors(cfg)
    d = _dir(tmp_path, cfg, tensors)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert says in line, line


def test_a_gptq_qweight_under_a_bf16_config_is_refused(cli: Callable[..., Any], tmp_path: Path) -> None:
    cfg = _cfg(NEMOTRON)
    tensors = gptq_tensors(cfg, prefixes=BACKBONE)
    cfg.pop("quantization_config")
    line = _one_line(
        cli(
            [*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(_dir(tmp_path, cfg, tensors))]
        )
    )
    assert "qweight" in line and "declares no quantization" in line, line


def test_a_config_only_gptq_directory_gets_the_figure(cli: Callable[..., Any], tmp_path: Path) -> None:
    """No shards: the same figure from config.json (the class decides the bytes)."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(NEMOTRON.read_text())
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    want = model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    assert [r["param_bytes"] for r in json.loads(res.out)["weights"]["per_rank"]] == [
        r.param_bytes for r in want.ranks
    ]


@pytest.mark.slow  # an 80B-parameter checkpoint's 300k tensors written and read: the slow step runs it
def test_a_gptq_qwen3_next_checkpoint_derives_sglangs_figure(cli: Callable[..., Any], tmp_path: Path) -> None:
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(QWEN)
    layout = WeightsLayout(pp_size=1, tp_size=4, ep_size=4)
    d = _dir(tmp_path, cfg)
    mw, _ = checkpoint_weights(d, layout, release="0.5.23")
    params = rank_params(cfg, layout, release="0.5.23")[0][1]
    dropped = sum(p.nbytes for p in params if p.part == "dropped")
    assert mw.ranks[0].param_bytes + dropped == _figure(
        "qwen3_next/gptq-int4", {"pp": 1, "tp": 4, "ep": 4}, 0
    )
    res = cli([*DERIVE, "--pp-size", "1", "--tp-size", "4", "--model-config", str(d)])
    assert res.rc == 0, res.err


def test_the_gptq_figures_of_every_checked_release_are_in_the_fixture() -> None:
    from checker.core.weights.quant import CHECKED_RELEASES

    doc = json.loads((W / "expected.json").read_text())
    cases = [c for c in doc["cases"] if "/gptq-" in c]
    assert len(cases) >= 5
    for release in CHECKED_RELEASES["gptq_marlin"]:
        assert all("layouts" in doc["figures"][release][c] for c in cases), release


def test_the_marlin_workspace_is_sized_by_the_gpus_sm_count_and_an_assumed_one_is_said(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """marlin_make_workspace holds one int32 per SM (marlin_utils.py:266-274): 132 (an H100 SXM's) where
    the GPU is not known, said in the weights line; ``--gpu-sm-count 114`` (an H100 PCIe) sizes it and
    the line no longer assumes. Every rank's margin moves by 4 bytes an SM a quantized linear."""
    cfg = _cfg(NEMOTRON)
    down = "model.layers.1.mixer.down_proj.marlin_workspace"
    for sms, size in ((None, 132 * 4), (114, 114 * 4)):
        layout = WeightsLayout(pp_size=2, tp_size=2, gpu_sm_count=sms)
        by = {p.name: p for p in rank_params(cfg, layout, release="0.5.23")[0][1]}
        assert by[down].nbytes == size
        (note, *_) = {r.note for r in model_weights(cfg, layout, release="0.5.23").ranks}
        assert note == ("Marlin workspace for 132 SMs (H100; --gpu-sm-count)" if sms is None else "")
    bf16 = {k: v for k, v in cfg.items() if k != "quantization_config"}
    plain = model_weights(bf16, WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    assert not any(r.note for r in plain.ranks)
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))  # config.json alone: the figure from the class
    args = [*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d)]
    assumed, given = cli(args), cli([*args, "--gpu-sm-count", "114"])
    assert assumed.rc == given.rc == 0, (assumed.err, given.err)
    assert "Marlin workspace for 132 SMs (H100; --gpu-sm-count)" in assumed.out
    assert "SMs" not in given.out
    assert "--gpu-sm-count 0 must be a positive integer" in _one_line(cli([*args, "--gpu-sm-count", "0"]))
