"""``--enable-linear-replayssm-spec``: the ReplaySSM spec-verify ring is charged instead of the speculative
intermediate state, so the values differ from a deployment without it (issue 37).

SGLang 0.5.23's ``_handle_max_mamba_cache`` (``mem_cache/kv_cache_configurator.py:3269-3297``):
``reserves_spec_state = has_spec_dec and not replayssm_active``, and the ring is charged instead: once per
running request for a GDN model (Qwen3.5, Qwen3-Next), on every slot for a KDA model (Kimi-Linear); 0.5.17
to 0.5.19 charge it on every slot for both, 0.5.16 not at all. What a user relies on: the flag is read (a
launch command with it derives other values than one without), the values are SGLang's own (the
``sglang`` tests run each installed release's own sizing beside the builtin model, every field of the
stage), and the vectorised sweep derives the same values budget by budget.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checker.core.errors import CheckerInputError, FlagError
from checker.core.sizing.geometry import resolve_dtypes
from checker.core.sizing.sizing import GIB, CapacityInputs, derive_stage, plan_stage
from checker.core.sizing.sweep import scalar_sweep
from checker.families.geometry import load_geometry

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
QWEN35 = str(FIXTURES / "qwen3_5_397b_a17b.json")
KIMI_LINEAR = str(FIXTURES / "kimi_linear_48b_a3b.json")
NEMOTRON = str(FIXTURES / "nemotron_h_8b.json")
SERVE = ["python", "-m", "sglang.launch_server", "--model-path", QWEN35]
PP_SPEC = {"SGLANG_ENABLE_PP_SPEC": "1"}


def _inputs(config: str, **kw: Any) -> CapacityInputs:
    tp = kw.pop("tp_size", 1)
    g = resolve_dtypes(load_geometry(model_config=config, tp_size=tp), env={})
    base: dict[str, Any] = dict(geometry=g, budget_gib=40.0, pp_size=2, tp_size=tp, pp_spec_env=True)
    return CapacityInputs(**(base | kw))


# -- the issue's case ------------------------------------------------------------------------------------


def test_the_issues_case_derives_other_values_with_the_ring(cli) -> None:
    """Qwen3.5-397B at pp 2, 40 GiB, EAGLE with SGLANG_ENABLE_PP_SPEC=1: 101 / 25 / 12 without the ring;
    with it, SGLang 0.5.23's own sizing gives 198 / 48 / 24 (its intermediate state is not reserved, the
    ring is charged per request; run with --engine both in the 0.5.23 CPU environment, and
    test_the_builtin_ring_is_the_installed_releases_own below). Both through a launch command."""
    argv = ["derive", "--format", "json", "--budget-gib", "40", "--sglang-version", "0.5.23", "--"]
    launch = [*SERVE, "--pp-size", "2", "--speculative-algorithm", "EAGLE"]
    without = cli([*argv, *launch], env=PP_SPEC)
    with_ring = cli([*argv, *launch, "--enable-linear-replayssm-spec"], env=PP_SPEC)
    assert without.rc == with_ring.rc == 0, (without.err, with_ring.err)

    def values(out: str) -> list[tuple[int, int, int]]:
        return [
            (r["max_mamba_cache_size"], r["max_running_requests"], r["pp_max_micro_batch_size"])
            for r in json.loads(out)["ranks"]
        ]

    assert values(without.out) == [(101, 25, 12)] * 2
    assert values(with_ring.out) == [(198, 48, 24)] * 2


def _gdn_ring_per_layer(cfg: dict[str, Any], tp: int, window: int, *, release: str) -> int:
    """``replayssm_ring_bytes_per_req`` of one GDN layer, from the config's own numbers (SGLang's
    configs/mamba_utils.py, read independently of checker.core.sizing.replay): bf16 conv state."""
    text = cfg.get("text_config", cfg)
    hv = text["linear_num_value_heads"] // tp
    hk = text["linear_num_key_heads"] // tp
    v, k, c = text["linear_value_head_dim"], text["linear_key_head_dim"], 2
    if release in ("0.5.17", "0.5.18", "0.5.19"):  # rawv, rawk, beta, per-head gate
        return hv * window * v * c + hk * window * k * c + hv * window * 4 + hv * window * 4
    # d, k, the scalar gate, and the d / k low parts of a bf16 state
    return 2 * (hv * window * v * c + hk * window * k * c) + hv * window * 4


@pytest.mark.parametrize(("release", "rule"), [("0.5.23", "fixed"), ("0.5.19", "per-slot")])
def test_the_gdn_ring_is_charged_as_the_release_charges_it(release: str, rule: str) -> None:
    """0.5.20+: once per request, ``ring * (max_running_requests // dp + 1)``, nothing per slot;
    0.5.17-0.5.19: on every slot, the window the draft tokens (at pp 1: they refuse speculative decoding
    under PP). The intermediate state is never reserved."""
    cfg = json.loads(Path(QWEN35).read_text())
    inputs = _inputs(
        QWEN35,
        sglang_version=release,
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=4,
        max_running_requests=48,
        enable_linear_replayssm_spec=True,
        pp_size=2 if rule == "fixed" else 1,
    )
    plan = plan_stage(inputs, 0)
    layers = inputs.geometry.num_linear_layers
    scale = plan.scale
    stage = derive_stage(inputs, 0)
    assert plan.replayssm_active and stage.intermediate_state_bytes == 0
    if rule == "fixed":
        ring = int(_gdn_ring_per_layer(cfg, 1, 16, release=release) * layers * scale)
        assert (plan.replayssm_fixed_bytes, plan.extra_per_slot_bytes) == (ring * (48 + 1), 0)
    else:
        ring = int(_gdn_ring_per_layer(cfg, 1, 4, release=release) * layers * scale)
        assert (plan.replayssm_fixed_bytes, plan.extra_per_slot_bytes) == (0, ring)


def test_the_kda_ring_rides_on_every_slot_and_mamba2_has_none() -> None:
    """Kimi-Linear (KDA): the ring per slot, --linear-replayssm-cache-len long (0.5.23); Nemotron-H (Mamba2):
    the flag changes nothing in the sizing, speculative state included."""
    kda = _inputs(KIMI_LINEAR, sglang_version="0.5.23", enable_linear_replayssm_spec=True)
    longer = dataclasses.replace(kda, linear_replayssm_cache_len=32)
    a, b = plan_stage(kda, 0), plan_stage(longer, 0)
    assert a.replayssm_active and a.replayssm_fixed_bytes == 0 and a.extra_per_slot_bytes > 0
    assert b.extra_per_slot_bytes == pytest.approx(2 * a.extra_per_slot_bytes, abs=1)  # linear in the window
    spec = dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4, max_running_requests=48)
    plain = _inputs(NEMOTRON, sglang_version="0.5.23", **spec)
    ringed = dataclasses.replace(plain, enable_linear_replayssm_spec=True)
    assert derive_stage(plain, 0) == derive_stage(ringed, 0)


def test_0_5_16_builds_the_ring_without_charging_it() -> None:
    spec = dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4, max_running_requests=48)
    plain = _inputs(QWEN35, sglang_version="0.5.16", pp_size=1, **spec)
    assert derive_stage(plain, 0) == derive_stage(
        dataclasses.replace(plain, enable_linear_replayssm_spec=True), 0
    )


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(sglang_version="0.5.15"), r"has no ReplaySSM spec-verify ring \(the flag arrived in 0\.5\.16"),
        (dict(sglang_version="0.5.23", max_running_requests=None), "without --max-running-requests"),
    ],
    ids=["before-the-flag", "gdn-without-a-request-cap"],
)
def test_a_ring_the_release_cannot_size_is_one_line(kw: dict[str, Any], words: str) -> None:
    """A release without the flag; a GDN ring charged per request with no request cap (SGLang divides
    None and fails at start-up; speculative decoding sets 48 itself)."""
    with pytest.raises(FlagError, match=words):
        derive_stage(_inputs(QWEN35, pp_size=1, enable_linear_replayssm_spec=True, **kw), 0)


def test_a_model_spec_without_its_kind_is_refused_with_the_ring(tmp_path: Path) -> None:
    """SGLang charges the ring by the model's kind; a JSON model spec that names none cannot be sized."""
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "num_hidden_layers": 4,
                "linear_layer_ids": [0, 1, 2],
                "conv_shapes": [[8192, 3]],
                "temporal_shape": [32, 128, 128],
            }  # fmt: skip
        )
    )
    g = load_geometry(model_config=str(spec), tp_size=1)
    with pytest.raises(FlagError, match='names no model_type; add "model_type"'):
        CapacityInputs(geometry=g, budget_gib=8.0, enable_linear_replayssm_spec=True)


# -- the vectorised sweep is the scalar core, with the ring ----------------------------------------------


def _edges(inputs: CapacityInputs, k: int) -> list[float]:
    """Budgets where K steps (the auto-fit with the ring charged once), one ulp either side."""
    plan = plan_stage(inputs, k)
    per_slot, fixed = plan.stage_per_req_bytes + plan.extra_per_slot_bytes, plan.replayssm_fixed_bytes
    r = inputs.mamba_full_memory_ratio
    out = []
    for m in (1, 2, 3, 7, 100, 4095):
        c = ((m + 1) * per_slot + fixed) / GIB * (1 + r) / r
        out += [math.nextafter(c, 0.0), c, math.nextafter(c, math.inf)]
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=st.sampled_from([QWEN35, KIMI_LINEAR]),
    release=st.sampled_from(["0.5.17", "0.5.19", "0.5.20", "0.5.22", "0.5.23"]),
    spec=st.booleans(),
    mrr=st.sampled_from([None, 1, 48, 700]),
    cache_len=st.sampled_from([None, 1, 64]),
    branch=st.sampled_from(["auto", "explicit-K", "no-radix"]),
    pp=st.sampled_from([1, 2]),
    budgets=st.lists(st.floats(0.05, 200.0), min_size=1, max_size=12),
)
def test_the_sweep_is_the_scalar_core_with_the_ring(  # noqa: ANN001 - hypothesis draws them
    config, release, spec, mrr, cache_len, branch, pp, budgets
) -> None:
    """derive_sweep and size_pool agree on every budget, the ring charged per slot or once, every branch."""
    import torch  # noqa: F401 - the sweep's own dependency

    from checker.device.sweep import derive_sweep

    kw: dict[str, Any] = dict(
        sglang_version=release, enable_linear_replayssm_spec=True, linear_replayssm_cache_len=cache_len,
        max_running_requests=mrr if not spec or mrr else 48,
    )  # fmt: skip
    if spec:
        kw.update(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    if branch == "explicit-K":
        kw["max_mamba_cache_size"] = 300
    elif branch == "no-radix":
        kw["disable_radix_cache"] = True
    try:
        inputs = _inputs(config, **kw)
        plan_stage(inputs, 0)
    except CheckerInputError:
        return  # refused alike on both paths (a GDN ring without a request cap)
    for k in range(inputs.pp_size):
        grid = budgets + _edges(inputs, k)
        want = [list(t) for t in scalar_sweep(inputs, k, grid)]
        assert derive_sweep(inputs, k, grid).tolist() == want, (release, k)


# -- SGLang's own sizing, wherever it imports -------------------------------------------------------------

FIELDS = (
    "max_mamba_cache_size",
    "max_running_requests",
    "pp_max_micro_batch_size",
    "stage_per_req_bytes",
    "extra_per_slot_bytes",
    "replayssm_fixed_bytes",
    "intermediate_state_bytes",
    "branch",
    "padding_slot_charged",
)
CASES: dict[str, dict[str, Any]] = {
    "auto-spec": dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4, max_running_requests=48),
    "auto-spec-window-32": dict(
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=4,
        max_running_requests=48,
        linear_replayssm_cache_len=32,
    ),  # fmt: skip
    "auto-no-spec": dict(max_running_requests=64),
    "explicit-K-spec": dict(
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=3,
        max_running_requests=40,
        max_mamba_cache_size=120,
    ),  # fmt: skip
    "no-radix-spec": dict(
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=3,
        max_running_requests=40,
        disable_radix_cache=True,
    ),  # fmt: skip
}


@pytest.mark.sglang
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("config", [QWEN35, KIMI_LINEAR, NEMOTRON], ids=["gdn", "kda", "mamba2"])
@pytest.mark.parametrize("budget", [12.0, 40.0])
def test_the_builtin_ring_is_the_installed_releases_own(
    sglang_engine, config: str, case: str, budget: float
) -> None:
    """For the INSTALLED release, with --enable-linear-replayssm-spec: the builtin model and the release's
    own ``_handle_max_mamba_cache`` (run by the sglang engine) derive the same stage, field by field (the
    ring per slot and once, the intermediate state, the KV budget left), on every stage, or both refuse."""
    from checker.core.releases.releases import parse_version
    from checker.engines import ModelSource

    version = sglang_engine.version
    # Up to 0.5.20 speculative decoding does not start under PP (and 0.5.16's Kimi-Linear not at all):
    # the ring is compared at pp 1 there, at pp 2 from 0.5.21.
    pp = 2 if parse_version(version) >= parse_version("0.5.21") else 1
    kw = dict(
        CASES[case], sglang_version=version, enable_linear_replayssm_spec=True, budget_gib=budget, pp_size=pp
    )
    try:
        inputs = _inputs(config, **kw)
    except CheckerInputError as exc:
        pytest.skip(f"refused before either engine runs: {exc}")
    prepared = sglang_engine.prepare(inputs, ModelSource(model_config=config), {})
    for k in range(inputs.pp_size):
        try:
            mine = derive_stage(inputs, k)
        except CheckerInputError as exc:
            with pytest.raises(CheckerInputError):
                prepared.derive(k)
            assert str(exc)
            continue
        theirs = prepared.derive(k)
        assert {f: getattr(mine, f) for f in FIELDS} == {f: getattr(theirs, f) for f in FIELDS}, (version, k)
        assert mine.kv_budget_gib == pytest.approx(theirs.kv_budget_gib, rel=1e-12), (version, k)


@pytest.mark.parametrize("config", [QWEN35, KIMI_LINEAR], ids=["gdn", "kda"])
def test_materialize_allocates_the_ring_and_no_verify_scratch(config: str) -> None:
    """--materialize under the ring: no intermediate_ssm / conv window (SGLang allocates none), the ring
    per slot (KDA) or once (GDN), and the allocation equals the prediction."""
    from checker.device.materialize import materialize_stage, pool_tensors

    spec = dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4, max_running_requests=8)
    tp = 8 if config == QWEN35 else 4  # small per-rank states: the pool is allocated on this CPU
    inputs = _inputs(config, tp_size=tp, budget_gib=0.25, enable_linear_replayssm_spec=True, **spec)
    stage = derive_stage(inputs, 0)
    names = [t.name for t in pool_tensors(inputs, stage)]
    assert not any("intermediate" in n for n in names), names
    assert any("ReplaySSM" in n for n in names) == (config == QWEN35), names
    m = materialize_stage(inputs, stage, "cpu")
    assert m.ok and m.allocated_bytes == m.predicted_bytes, m.error
