"""AWQ checkpoints (issue 39 item 1): served by SGLang 0.5.10-0.5.23 on Hopper as awq_marlin, per rank.

The per-rank figures are held to 0.5.23's own AWQMarlinLinearScheme / AWQMoEScheme / AWQLinearScheme built on
the meta device by the ``*/awq-*`` cases of tests/fixtures/weights/expected.json (tests/test_weights.py);
here: what ``derive`` on an AWQ model directory reports, what the Marlin classes hold and keep, which method
the release picks, and every way the directory can contradict itself (one line, exit 2).
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
from checker.families.qwen3_5 import rules as qwen3_5_rules
from checker.families.rules import model_weights, rank_params
from tests.checkpoints import awq_tensors, write_checkpoint

REPO = Path(__file__).resolve().parent.parent
W = REPO / "tests/fixtures/weights"
NEMOTRON = W / "nemotron_h_awq_int4.json"
FALLBACK = W / "nemotron_h_awq_int4_fallback.json"
QWEN = W / "qwen3_next_awq_int4.json"
QWEN35 = W / "qwen3_5_awq_int4.json"
QWEN35_DENSE = W / "qwen3_5_dense_awq_int4.json"
LANGUAGE = (("model.language_model.", "model."),)
# Qwen3.5's split linear-attention projections and the fused modules that load them (its family's rule)
QWEN35_PACKED = qwen3_5_rules.RULES.weights.packed_modules
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
    write_checkpoint(d, awq_tensors(cfg, prefixes=BACKBONE) if tensors is None else tensors, shards=3)
    return d


def _one_line(res: Any) -> str:
    assert res.rc == 2 and res.out == "", res
    (line,) = res.err.strip().splitlines()
    assert "Traceback" not in line
    return line


def test_an_awq_nemotron_h_checkpoint_derives_sglangs_figure(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Nemotron-H 8B in AWQ INT4 group 128 (qweight, qzeros, scales): the shards' headers are held to the
    config, every rank of pp 2 x tp 2 equals what 0.5.23's awq_marlin classes build (the Marlin repack keeps
    every size), about a third of the bf16 figure, and derive reports it."""
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(NEMOTRON)
    layout = WeightsLayout(pp_size=2, tp_size=2)
    d = _dir(tmp_path, cfg)
    mw, ckpt = checkpoint_weights(d, layout, release="0.5.23")
    for rank in range(4):
        assert mw.ranks[rank].param_bytes == _figure("nemotron_h/awq-int4", {"pp": 2, "tp": 2}, rank)
    assert 0 < ckpt.header_bytes < ckpt.total_bytes // 1000
    bf16 = {k: v for k, v in cfg.items() if k != "quantization_config"}
    plain = model_weights(bf16, layout, release="0.5.23")
    assert mw.ranks[2].param_bytes < 0.4 * plain.ranks[2].param_bytes
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    per_rank = json.loads(res.out)["weights"]["per_rank"]
    assert [r["param_bytes"] for r in per_rank] == [r.param_bytes for r in mw.ranks]


def test_an_awq_linear_is_packed_along_its_output_and_keeps_a_workspace() -> None:
    """AWQMarlinLinearScheme: qweight int32 [in_p, out/8] (AWQ packs the output, GPTQ the input), zeros and
    scales of the rank's own groups (a row-split down_proj at tp 2: 10752/128 = 84), a Marlin workspace
    after loading; layer 0's mixer stays bf16 ('layers.0.mixer' a substring of its prefix), layer 2's does
    not. A linear whose full size Marlin cannot take runs the plain AWQ scheme: the same three tensors, no
    workspace."""
    rp = rank_params(_cfg(NEMOTRON), WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    by = {p.name: p for p in rp[0][1]}
    down = "model.layers.1.mixer.down_proj"
    assert (by[f"{down}.qweight"].shape, by[f"{down}.qweight"].dtype) == ((10752, 512), "int32")
    assert (by[f"{down}.scales"].shape, by[f"{down}.scales"].dtype) == ((84, 4096), "bfloat16")
    assert (by[f"{down}.qzeros"].shape, by[f"{down}.qzeros"].dtype) == ((84, 512), "int32")
    assert by[f"{down}.marlin_workspace"].part == "copies" and by[f"{down}.marlin_workspace"].nbytes == 528
    assert "model.layers.0.mixer.in_proj.weight" in by and "model.layers.2.mixer.in_proj.qweight" in by
    rp = rank_params(_cfg(FALLBACK), WeightsLayout(pp_size=1, tp_size=1), release="0.5.23")
    by = {p.name: p for p in rp[0][1]}
    assert by[f"{down}.scales"].shape == (673, 4096) and f"{down}.marlin_workspace" not in by
    assert "model.layers.0.mixer.in_proj.marlin_workspace" in by


def test_an_awq_moe_holds_scales_in_the_model_dtype_and_partition_groups() -> None:
    """AWQMoEScheme on Qwen3-Next at tp 4: int32 weights packed along the output ([E, H, 2 I_p / 8]), scales
    in the model dtype (GPTQ's are float16) of the partition's groups (128 / 128 = 1 for w2); layer 3's
    attention bf16 by modules_to_not_convert."""
    ((_, params), *_) = rank_params(_cfg(QWEN), WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    by = {p.name: p for p in params}
    ex = "model.layers.0.mlp.experts"
    assert by[f"{ex}.w13_qweight"].shape == (513, 2048, 32)
    assert (by[f"{ex}.w2_scales"].shape, by[f"{ex}.w2_scales"].dtype) == ((513, 1, 2048), "bfloat16")
    assert (by[f"{ex}.w13_qzeros"].shape, by[f"{ex}.w13_qzeros"].dtype) == ((513, 16, 32), "int32")
    assert "model.layers.3.qkv_proj.weight" in by and "model.layers.7.qkv_proj.qweight" in by


@pytest.mark.parametrize(
    ("quant", "flag", "error", "says"),
    [
        ({"zero_point": False}, None, FlagError, "loader.py:268"),
        ({"group_size": 256}, None, FlagError, "not supported for quantization method awq"),
        ({"bits": 8}, None, ConfigError, "only 4-bit"),
        ({"zero_point": None}, None, FlagError, "no zero_point"),
        ({}, "awq", FlagError, "forces it"),
        ({"zero_point": False}, "awq_marlin", FlagError, "does not match"),
        ({}, "gptq_marlin", FlagError, "does not match"),
        ({}, "moe_wna16", FlagError, "MoeWNA16Config"),
        ({"lm_head": True}, None, FlagError, "quantized LM head"),
        ({"zero_point": False, "_dtype": "float16"}, None, FlagError, "does not model"),
        ({"modules_to_not_convert": "linear_attn"}, None, ConfigError, "must be a list"),
    ],
    ids=[
        "no-zero-point",
        "group-256",
        "bits-8",
        "zero-point-missing",
        "flag-awq",
        "flag-awq-marlin",
        "flag-gptq-marlin",
        "flag-moe-wna16",
        "lm-head",
        "plain-awq-fp16",
        "not-convert-string",
    ],
)
def test_an_awq_config_the_release_or_the_checker_refuses_is_one_line(
    quant: dict[str, Any], flag: str | None, error: type[Exception], says: str
) -> None:
    """What 0.5.23 refuses on CUDA (a config Marlin cannot take stays plain awq: 4 bits and float16 only; a
    flag that contradicts it) and what the checker does not model."""
    cfg = _cfg(QWEN)
    q = {**cfg["quantization_config"], **quant}
    if "_dtype" in q:
        cfg["torch_dtype"] = q.pop("_dtype")
    cfg["quantization_config"] = {k: v for k, v in q.items() if v is not None}
    with pytest.raises(error, match=says):
        read_scheme(cfg, flag=flag, source="config.json")


@pytest.mark.parametrize("flag", [None, "awq_marlin", "marlin", "AWQ_MARLIN"])
def test_the_flags_sglang_serves_awq_marlin_under_agree(flag: str | None) -> None:
    scheme = read_scheme(_cfg(QWEN), flag=flag, source="config.json")
    assert scheme is not None and scheme.method == "awq_marlin"


def test_the_release_refusals_under_awq_marlin_are_one_line() -> None:
    """Qwen3-Next's linear_attn in_proj quantized (its class reads module.weight); Nemotron-H at tp 4 (the
    in_proj partition 4640 is not a multiple of 64: 0.5.23's ValueError, recorded in expected.json); Qwen3-
    Next at tp 8 (I_p 64: the MoeWNA16 fallback, not modelled); a non-auto MoE runner; float32; the plain
    AWQ fallback's partition of broken groups; a release whose classes were not checked."""
    cfg = _cfg(QWEN)
    cfg["quantization_config"]["modules_to_not_convert"] = ["layers.3.self_attn"]
    with pytest.raises(ConfigError, match="qwen3_next.py:311"):
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    with pytest.raises(LayoutError, match="output 4640|out 4640"):
        model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    with pytest.raises(LayoutError, match="MoeWNA16"):
        model_weights(_cfg(QWEN), WeightsLayout(pp_size=1, tp_size=8), release="0.5.23")
    with pytest.raises(FlagError, match="awq_moe.py:241"):
        model_weights(
            _cfg(QWEN), WeightsLayout(pp_size=1, tp_size=2, moe_runner_backend="triton"), release="0.5.23"
        )
    with pytest.raises(FlagError, match="loader.py:268"):
        model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=1, tp_size=2, dtype="float32"), release="0.5.23")
    with pytest.raises(LayoutError, match="awq_linear.py:39-51"):
        model_weights(_cfg(FALLBACK), WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    # 0.5.20's classes are checked (its figure); 0.5.18's, between two CPU environments, are not
    mw = model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=2, tp_size=2), release="0.5.20")
    doc = json.loads((W / "expected.json").read_text())["figures"]["0.5.20"]["nemotron_h/awq-int4"]
    (entry,) = [e for e in doc["layouts"] if e["layout"] == {"pp": 2, "tp": 2}]
    assert [r.param_bytes for r in mw.ranks] == [r[1] for r in entry["ranks"]]
    with pytest.raises(FlagError, match="0.5.17, 0.5.20.*not 0.5.18's"):
        model_weights(_cfg(NEMOTRON), WeightsLayout(pp_size=1, tp_size=2), release="0.5.18")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ("no-scales", "no shard holds its 'backbone.layers.5.mixer.up_proj.scales'"),
        ("scales-shape", "[33, 21504]"),
        ("bf16-qweight", "is BF16, but"),
        ("not-converted", "keeps SGLang's 'model.layers.5.mixer.up_proj' unquantized"),
        ("group", "does not divide the input size 21440"),
    ],
)
def test_awq_shards_that_contradict_the_config_are_one_line(
    cli: Callable[..., Any], tmp_path: Path, edit: str, says: str
) -> None:
    cfg = _cfg(NEMOTRON)
    up = "backbone.layers.5.mixer.up_proj"
    tensors = awq_tensors(cfg, prefixes=BACKBONE)
    if edit == "no-scales":
        tensors = [t for t in tensors if t[0] != f"{up}.scales"]
    elif edit == "scales-shape":
        tensors = [(n, (33, 21504) if n == f"{up}.scales" else s, dt) for n, s, dt in tensors]
    elif edit == "bf16-qweight":
        tensors = [(n, s, "BF16" if n == f"{up}.qweight" else dt) for n, s, dt in tensors]
    elif edit == "not-converted":
        cfg["quantization_config"]["modules_to_not_convert"] = ["layers.0.mixer", "layers.5.mixer"]
    elif edit == "group":  # an MLP width of whole 32-groups, not 128-groups
        cfg["intermediate_size"] = 21440
        tensors = awq_tensors(cfg, prefixes=BACKBONE)
    d = _dir(tmp_path, cfg, tensors)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert says in line, line


def test_an_awq_qweight_under_a_bf16_config_is_refused(cli: Callable[..., Any], tmp_path: Path) -> None:
    cfg = _cfg(NEMOTRON)
    tensors = awq_tensors(cfg, prefixes=BACKBONE)
    cfg.pop("quantization_config")
    d = _dir(tmp_path, cfg, tensors)
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "qweight" in line and "declares no quantization" in line, line


def test_a_config_only_awq_directory_gets_the_figure(cli: Callable[..., Any], tmp_path: Path) -> None:
    """No shards: the same figure from config.json (the class decides the bytes)."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(NEMOTRON.read_text())
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    assert [r["param_bytes"] for r in json.loads(res.out)["weights"]["per_rank"]] == [
        _figure("nemotron_h/awq-int4", {"pp": 2, "tp": 2}, rank) for rank in range(4)
    ]


@pytest.mark.slow  # an 80B-parameter checkpoint's 300k tensors written and read: the slow step runs it
def test_an_awq_qwen3_next_checkpoint_derives_sglangs_figure(cli: Callable[..., Any], tmp_path: Path) -> None:
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(QWEN)
    layout = WeightsLayout(pp_size=1, tp_size=4, ep_size=4)
    d = _dir(tmp_path, cfg)
    mw, _ = checkpoint_weights(d, layout, release="0.5.23")
    assert mw.ranks[0].param_bytes == _figure("qwen3_next/awq-int4", {"pp": 1, "tp": 4, "ep": 4}, 0)
    res = cli([*DERIVE, "--pp-size", "1", "--tp-size", "4", "--model-config", str(d)])
    assert res.rc == 0, res.err


def _qwen35_tensors(cfg: dict[str, Any]) -> list[Any]:
    """Qwen3.5's AWQ export: the language model packed, the vision tower bf16 (as its class loads it)."""
    q = cfg["quantization_config"]
    kept = {**q, "modules_to_not_convert": [*q.get("modules_to_not_convert", []), "visual"]}
    return awq_tensors({**cfg, "quantization_config": kept}, prefixes=LANGUAGE, packed=QWEN35_PACKED)


def test_an_awq_qwen3_5_checkpoint_derives_sglangs_figure(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Qwen3.5 dense (a vision tower) in AWQ INT4 with in_proj_qkv/z/b/a packed: its split projections are
    held to the class's fused in_proj_qkvz/in_proj_ba, the tower stays bf16 (quant_config=None), and every
    rank of pp 2 x tp 2 equals 0.5.23's awq_marlin classes; derive reports it."""
    from checker.families.weights_source import checkpoint_weights

    cfg = _cfg(QWEN35_DENSE)
    tensors = _qwen35_tensors(cfg)
    assert any(n.endswith("linear_attn.in_proj_b.qweight") for n, _, _ in tensors)
    assert not any(n.startswith("model.visual.") and n.endswith(".qweight") for n, _, _ in tensors)
    d = _dir(tmp_path, cfg, tensors)
    mw, _ = checkpoint_weights(d, WeightsLayout(pp_size=2, tp_size=2), release="0.5.23")
    assert [r.param_bytes for r in mw.ranks] == [
        _figure("qwen3_5/awq-int4-dense", {"pp": 2, "tp": 2}, rank) for rank in range(4)
    ]
    res = cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d), "--format", "json"])
    assert res.rc == 0, res.err
    assert [r["param_bytes"] for r in json.loads(res.out)["weights"]["per_rank"]] == [
        r.param_bytes for r in mw.ranks
    ]


def test_a_qwen3_5_awq_checkpoint_that_contradicts_its_class_is_one_line(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    """A packed vision tower (its class takes no quant config), a packed in_proj_b under a config whose
    modules_to_not_convert keeps SGLang's fused in_proj_ba bf16, and the dense in_proj_ba at tp 4 (a 32-row
    partition, under Marlin's 64: 0.5.23 raises at construction) are each one line, exit 2."""
    dense = _cfg(QWEN35_DENSE)
    (tmp_path / "vision").mkdir()
    (tmp_path / "ba").mkdir()
    d = _dir(tmp_path / "vision", dense, awq_tensors(dense, prefixes=LANGUAGE, packed=QWEN35_PACKED))
    line = _one_line(cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d)]))
    assert "model.visual." in line and "vision tower" in line, line
    moe = _cfg(QWEN35)
    packed = awq_tensors(
        {
            **dense,
            "quantization_config": {**moe["quantization_config"], "modules_to_not_convert": ["visual"]},
        },
        prefixes=LANGUAGE,
        packed=QWEN35_PACKED,
    )
    d = _dir(tmp_path / "ba", dense | {"quantization_config": moe["quantization_config"]}, packed)
    line = _one_line(cli([*DERIVE, "--pp-size", "2", "--tp-size", "2", "--model-config", str(d)]))
    assert "in_proj_b.qweight" in line and "in_proj_ba' unquantized" in line, line
    with pytest.raises(LayoutError, match="marlin_utils.py:161-193"):
        model_weights(dense, WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")


def test_the_awq_figures_of_every_checked_release_are_in_the_fixture() -> None:
    doc = json.loads((W / "expected.json").read_text())
    for case in (
        "qwen3_next/awq-int4",
        "nemotron_h/awq-int4",
        "nemotron_h/awq-int4-fallback",
        "qwen3_5/awq-int4",
        "qwen3_5/awq-int4-dense",
    ):
        assert "layouts" in doc["figures"]["0.5.23"][case], case
    for case in ("nemotron_h/awq-int4-tp4", "nemotron_h/awq-int4-fallback-tp2", "qwen3_5/awq-int4-dense-tp4"):
        assert "is not divisible" in doc["figures"]["0.5.23"][case].get("error", "") or "not aligned" in (
            doc["figures"]["0.5.23"][case].get("error", "")
        ), case


def test_an_mxfp4_checkpoint_gets_the_releases_refusal(cli: Callable[..., Any], tmp_path: Path) -> None:
    """MXFP4 (issue 39 item 1, decided from 0.5.23's code): Mxfp4Config gives a linear built with the quant
    config no method on CUDA (mxfp4.py:356-381), and every modelled family builds its linears with it: the
    class fails at construction (linear.py:482). One line, exit 2, never sized as bf16."""
    cfg = _cfg(NEMOTRON)
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    with pytest.raises(ConfigError, match="linear.py:482"):
        read_scheme(cfg, source="config.json")
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    line = _one_line(cli([*DERIVE, "--pp-size", "1", "--tp-size", "2", "--model-config", str(d)]))
    assert "mxfp4.py:356-381" in line, line
