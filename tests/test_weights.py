"""Each rank's weights, held to SGLang's own model classes.

``tests/fixtures/weights/expected.json`` holds, per release and per case, every rank's parameter and
buffer bytes of SGLang's own class built on the meta device from that release's real code
(``scripts/build_weights_expected.py`` runs ``scripts/sglang_weights.py`` in each release's CPU
environment). The quick suite holds the torch-free rules of ``checker/core/weights/weights.py`` to them, rank
by rank, so a rule that drifts from a class fails here without SGLang. Where the release refuses the case
(a class that asserts one stage, a flag its arguments refuse, a layer it cannot shard), the rules must
refuse it too. ``pytest -m sglang`` builds the classes again where SGLang imports (the figures cannot go
stale against the installed release).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import CheckerInputError, ConfigError, FlagError, LayoutError
from checker.core.releases.model_support import check_architectures, registers
from checker.core.releases.releases import MODELLED_RELEASES
from checker.core.weights.weights import (
    GIB,
    Param,
    Place,
    WeightsLayout,
    allocator_bytes,
    release_partition,
)
from checker.families.drafts import EAGLE2, EAGLE3, separate_draft_rank_params
from checker.families.rules import draft_rank_params, model_weights, rank_params

REPO = Path(__file__).resolve().parent.parent
EXPECTED = json.loads((REPO / "tests/fixtures/weights/expected.json").read_text())
FIGURES: dict[str, dict[str, Any]] = EXPECTED["figures"]
CASES: dict[str, dict[str, Any]] = EXPECTED["cases"]
FAMILIES = ("qwen3_next", "qwen3_5", "kimi_linear", "nemotron_h", "falcon_h1", "granite_h")
DRAFTS = ("eagle3", "eagle2")
"""Separate draft classes with figures of their own (checker.families.drafts)."""


def _layout(layout: dict[str, int], case: dict[str, Any]) -> WeightsLayout:
    flags = case["flags"]
    return WeightsLayout(
        pp_size=layout["pp"],
        tp_size=layout["tp"],
        dp_size=layout.get("dp", 1),
        ep_size=layout.get("ep", 1),
        partition_env=case["partition"] if layout["pp"] > 1 else None,
        dtype=flags.get("dtype", "auto"),
        language_model_only=flags.get("language_model_only", False),
        disable_shared_experts_fusion=flags.get("disable_shared_experts_fusion", False),
    )


def _parse(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in text.split(","))}


def _config(case: dict[str, Any]) -> dict[str, Any]:
    """The case's config.json, with the ``hf_quant_config.json`` the harness puts beside it (a fixture's
    ``<config>.hf_quant_config.json``), read as the model directory's reader reads it."""
    from checker.core.weights.quant import HF_QUANT_KEY

    path = REPO / case["config"]
    config = dict(json.loads(path.read_text()))
    beside = path.with_name(path.name.removesuffix(".json") + ".hf_quant_config.json")
    if beside.is_file():
        config[HF_QUANT_KEY] = json.loads(beside.read_text())
    return config


def _params_of(config: dict[str, Any]) -> Callable[..., list[tuple[Place, list[Param]]]]:
    """Whose parameters a case's class holds: a draft class (the config as the draft's ModelConfig
    rewrites it) on the ranks that load the draft, a separate EAGLE3 draft there too, else the target's."""
    arch = str((config.get("architectures") or [""])[0])
    if arch == EAGLE3 or arch in EAGLE2:
        return separate_draft_rank_params
    return draft_rank_params if arch.endswith("MTP") else rank_params


RUNS = [(release, case) for release, cases in sorted(FIGURES.items()) for case in sorted(cases)]

# SGLang's figures the checker does not reproduce and refuses instead, naming the first release it
# models (checker/families/qwen3_5/rules.py _QUANT_FROM): the release's figures stay here as its evidence.
REFUSED_RUNS = {
    *(
        ("0.5.10", f"qwen3_5/ct-{c}")
        for c in ("fp8-channel", "fp8-dense", "w4a16", "w4a16-dense", "w4a16-ba-tp4")
    ),
    *((r, f"qwen3_5/modelopt-nvfp4{c}") for r in ("0.5.13", "0.5.15", "0.5.16") for c in ("", "-dense")),
}
_EARLIER_QUANT = ("/ct-", "/gptq-", "/modelopt-nvfp4", "/awq-")
"""The compressed-tensors, GPTQ, NVFP4 and AWQ cases of the releases before the newest: 245 runs, 9 s, held
in the slow group (the newest release's stay quick)."""


def _run(release: str, case: str) -> Any:
    slow = release != MODELLED_RELEASES[-1] and any(k in case for k in _EARLIER_QUANT)
    return pytest.param(release, case, id=f"{release}:{case}", marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("release, case", [_run(r, c) for r, c in RUNS])
def test_every_rank_holds_what_the_release_class_holds(release: str, case: str) -> None:
    """Per rank: the parameter bytes of SGLang's own class equal the rules' (a rule off by one tensor,
    one dtype or one sharding group shows as that rank's difference), and its buffer bytes too."""
    got = FIGURES[release][case]
    spec = CASES[case]
    config = _config(spec)
    if "error" in got:
        archs = config.get("architectures") or []
        if release in MODELLED_RELEASES and not any(registers(release, a) for a in archs):
            # the release has no class for it: the registry check refuses it before any weights
            with pytest.raises(FlagError):
                check_architectures(release, archs, model=case, env={})
            return
        # The harness stops at the first refusal: the case's one layout, or the one it names.
        assert len(spec["layouts"]) == 1 or "layout" in got, got["error"]
        refused = got.get("layout", spec["layouts"][0])
        with pytest.raises(CheckerInputError):
            _params_of(config)(config, _layout(_parse(refused), spec), release=release)
        return
    if (release, case) in REFUSED_RUNS:
        for entry in got["layouts"]:
            with pytest.raises(FlagError, match=f"is modelled from SGLang .*, not {release}'s class"):
                _params_of(config)(config, _layout(entry["layout"], spec), release=release)
        return
    for entry in got["layouts"]:
        layout = _layout(entry["layout"], spec)
        mine = _params_of(config)(config, layout, release=release)
        assert len(mine) == len(entry["ranks"]) == layout.world_size
        for (rank, param_bytes, buffer_bytes), (place, params) in zip(entry["ranks"], mine, strict=True):
            assert place.rank == rank
            held = sum(p.nbytes for p in params if p.part not in ("buffers", "copies"))
            buffers = sum(p.nbytes for p in params if p.part == "buffers")
            assert (held, buffers) == (param_bytes, buffer_bytes), (release, case, entry["layout"], rank)


# ---- the classes themselves, where SGLang imports ------------------------------------------------------

LIVE = {
    "qwen3_next": ("tests/fixtures/qwen3_next_80b_a3b.json", "pp=1,tp=4,ep=2"),
    "qwen3_5": ("tests/fixtures/weights/qwen3_5_397b_a17b.json", "pp=2,tp=2"),
    "kimi_linear": ("tests/fixtures/kimi_linear_48b_a3b.json", "pp=3,tp=2"),
    "nemotron_h": ("tests/fixtures/nemotron_h_8b.json", "pp=3,tp=2"),
    "falcon_h1": ("tests/fixtures/falcon_h1_0_5b.json", "pp=1,tp=4"),
    "granite_h": ("tests/fixtures/granite_4_0_h_small.json", "pp=1,tp=4"),
}


@pytest.fixture(scope="module")
def live_classes(sglang_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every family of :data:`LIVE` built by ``scripts/sglang_weights.py --cases`` in ONE process: the
    classes are each built from scratch, and the process imports the release once, not once a family."""
    cases = tmp_path_factory.mktemp("live") / "cases.json"
    cases.write_text(json.dumps({f: {"config": c, "layouts": [layout]} for f, (c, layout) in LIVE.items()}))
    proc = subprocess.run(
        [sys.executable, "scripts/sglang_weights.py", "--cases", str(cases)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["release"] == sglang_engine.version, (doc["release"], sglang_engine.version)
    return dict(doc["cases"])


@pytest.mark.sglang
@pytest.mark.parametrize("family", sorted(LIVE))
def test_the_installed_release_class_holds_what_the_rules_say(
    family: str, sglang_engine: Any, live_classes: dict[str, Any]
) -> None:
    """The installed release's own class, built on the meta device for every rank of one layout per
    family: its parameter bytes equal the rules' for that release (the checked-in figures cannot hide a
    release the table has not seen)."""
    config, layout_text = LIVE[family]
    built = live_classes[family]
    assert "error" not in built, built.get("error")
    layout = _layout(_parse(layout_text), {"flags": {}, "partition": None})
    mine = rank_params(json.loads((REPO / config).read_text()), layout, release=sglang_engine.version)
    for r, (place, params) in zip(built["layouts"][0]["ranks"], mine, strict=True):
        held = sum(p.nbytes for p in params if p.part not in ("buffers", "copies"))
        assert (place.rank, held) == (r["rank"], r["param_bytes"])


# ---- what a user relies on -----------------------------------------------------------------------------

QWEN3_5 = json.loads((REPO / "tests/fixtures/weights/qwen3_5_397b_a17b.json").read_text())
KIMI = json.loads((REPO / "tests/fixtures/kimi_linear_48b_a3b.json").read_text())
NEMOTRON_TIED = json.loads((REPO / "tests/fixtures/weights/nemotron_h_tied.json").read_text())


def test_the_stages_that_hold_the_embedding_or_the_head_show_more() -> None:
    """Kimi-Linear at pp 3: the first stage holds the embedding (0.75 GB), the last the head and the
    final norm; a rank's figure is its layers plus exactly those."""
    mw = model_weights(KIMI, WeightsLayout(pp_size=3, tp_size=1), release="0.5.23")
    first, middle, last = (r.by_part for r in mw.ranks)
    vocab_bytes = 163840 * 2304 * 2
    assert (first["embed"], middle["embed"], last["embed"]) == (vocab_bytes, 0, 0)
    assert (first["head"], middle["head"], last["head"]) == (0, 0, vocab_bytes + 2304 * 2)
    for r in mw.ranks:
        assert r.param_bytes == r.by_part["layers"] + r.by_part["embed"] + r.by_part["head"]


def test_a_tied_head_is_one_tensor_at_pp_1_and_a_copy_on_the_last_stage_under_pp() -> None:
    one = model_weights(NEMOTRON_TIED, WeightsLayout(pp_size=1, tp_size=1), release="0.5.23").ranks[0]
    two = model_weights(NEMOTRON_TIED, WeightsLayout(pp_size=2, tp_size=1), release="0.5.23").ranks
    vocab_bytes = 131072 * 4096 * 2
    assert one.by_part["embed"] == vocab_bytes and one.by_part["head"] == 4096 * 2  # the final norm only
    assert two[0].by_part["embed"] == vocab_bytes and two[1].by_part["head"] == vocab_bytes + 4096 * 2


def test_the_partition_env_moves_layers_and_their_bytes() -> None:
    even = model_weights(KIMI, WeightsLayout(pp_size=2, tp_size=1), release="0.5.23").ranks
    moved = model_weights(
        KIMI, WeightsLayout(pp_size=2, tp_size=1, partition_env="20,7"), release="0.5.23"
    ).ranks
    assert (moved[0].place.end_layer, even[0].place.end_layer) == (20, 13)
    assert moved[0].by_part["layers"] > even[0].by_part["layers"]
    assert sum(r.param_bytes for r in moved) == sum(r.param_bytes for r in even)


def test_releases_before_0_5_6_give_the_last_stage_the_remainder() -> None:
    """get_pp_indices: 0.5.2-0.5.5.post3 put every leftover layer on the last stage, later releases one
    each on the last L % P stages."""
    assert release_partition("0.5.5.post3", 27, 4, None) == (6, 6, 6, 9)
    assert release_partition("0.5.6", 27, 4, None) == (6, 7, 7, 7)
    assert release_partition("0.5.4", 27, 4, "7,7,7,6") == (7, 7, 7, 6)


def test_a_single_stage_class_under_pp_is_refused_in_one_line() -> None:
    cfg = json.loads((REPO / "tests/fixtures/qwen3_next_80b_a3b.json").read_text())
    with pytest.raises(LayoutError) as exc:
        rank_params(cfg, WeightsLayout(pp_size=2, tp_size=1), release="0.5.23")
    assert "asserts one stage" in str(exc.value) and "--pp-size 1" in str(exc.value)


def test_the_margin_is_buffers_copies_and_allocator_segments() -> None:
    """Kimi-Linear keeps w_kc/w_vc, copies of each MLA layer's kv_b_proj (59 MB at tp 1); Qwen3.5 holds
    a 64 MiB fp32 RoPE cache on every stage with a full-attention layer; the allocator rounding is what
    the segments add, under 2 MiB per large tensor."""
    kimi = model_weights(KIMI, WeightsLayout(pp_size=1, tp_size=1), release="0.5.23").ranks[0]
    kv_b = 7 * 32 * 256 * 512 * 2  # 7 MLA layers, heads * (nope + v) x kv_lora_rank, bf16
    assert kimi.copy_bytes == kv_b and 58e6 < kv_b < 60e6
    q = model_weights(QWEN3_5, WeightsLayout(pp_size=2, tp_size=2), release="0.5.23").ranks[0]
    assert q.buffer_bytes >= 262144 * 64 * 4
    assert 0 <= q.rounding_bytes < 2 * 2**20 * 2000
    assert q.total_bytes == q.param_bytes + q.buffer_bytes + q.copy_bytes + q.rounding_bytes


def test_the_allocator_simulation_follows_the_caching_allocator() -> None:
    """Small tensors share 2 MiB segments, 1-10 MiB ones 20 MiB segments, larger ones get their own
    segment rounded up to 2 MiB (c10/cuda/CUDACachingAllocator.cpp)."""
    assert allocator_bytes([100] * 4096) == 2 * 2**20  # 4096 blocks of 512 bytes fill one 2 MiB segment
    assert allocator_bytes([100] * 4097) == 4 * 2**20
    assert allocator_bytes([3 * 2**20] * 6) == 20 * 2**20  # six 3 MiB tensors in one 20 MiB segment
    assert allocator_bytes([3 * 2**20] * 7) == 40 * 2**20
    assert allocator_bytes([11 * 2**20 + 1]) == 12 * 2**20
    assert allocator_bytes([]) == 0


def test_the_newest_modelled_release_has_figures_for_every_family() -> None:
    """The checked-in figures cover every family at the newest modelled release (regenerate them with
    scripts/build_weights_expected.py when a release is added)."""
    newest = MODELLED_RELEASES[-1]
    covered = {case.split("/")[0] for case in FIGURES.get(newest, {})}
    assert covered == set(FAMILIES) | set(DRAFTS)


def test_a_rank_figure_in_gib() -> None:
    r = model_weights(KIMI, WeightsLayout(pp_size=1, tp_size=1), release="0.5.23").ranks[0]
    assert r.total_gib == r.total_bytes / GIB


def test_a_moe_runner_that_re_lays_the_experts_is_refused_in_one_line() -> None:
    cfg = json.loads((REPO / "tests/fixtures/qwen3_next_80b_a3b.json").read_text())
    with pytest.raises(FlagError) as exc:
        rank_params(
            cfg, WeightsLayout(pp_size=1, tp_size=2, moe_runner_backend="flashinfer_trtllm"), release="0.5.23"
        )
    assert "--moe-runner-backend 'flashinfer_trtllm'" in str(exc.value) and "--weights-gib" in str(exc.value)
    falcon = json.loads((REPO / "tests/fixtures/falcon_h1_0_5b.json").read_text())  # no experts: no matter
    assert rank_params(
        falcon, WeightsLayout(pp_size=1, tp_size=2, moe_runner_backend="flashinfer_trtllm"), release="0.5.23"
    )


def test_a_quantized_model_is_refused_in_one_line(tmp_path: Path) -> None:
    from checker.families.weights_source import checkpoint_weights
    from tests.checkpoints import model_dir

    cfg = json.loads((REPO / "tests/fixtures/qwen3_next_80b_a3b.json").read_text())
    # FP8, compressed-tensors, GPTQ are modelled (test_quant_weights, test_gptq_weights); bitsandbytes not
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    src = tmp_path / "config.json"
    src.write_text(json.dumps(cfg))
    d = model_dir(tmp_path / "m", REPO / "tests/fixtures/nemotron_h_8b.json", shards=1)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FlagError) as exc:
        checkpoint_weights(d, WeightsLayout(pp_size=1, tp_size=2), release="0.5.23")
    assert "quantized (bitsandbytes)" in str(exc.value) and "--weights-gib" in str(exc.value)


def test_an_unmodelled_family_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as exc:
        rank_params({"model_type": "kimi_k3"}, WeightsLayout(pp_size=1, tp_size=1), release="0.5.23")
    assert "model_type='kimi_k3' is not a family whose weights the checker models" in str(exc.value)
