"""--materialize: each stage's state pool allocated for real, measured against the derivation, freed.

The world tests launch real ``python -m checker check --materialize`` ranks on gloo (FileStore in
tmp_path): what a deployment relies on is that every rank reports ``predicted_bytes ==
allocated_bytes`` and that one rank whose pool does not fit turns the whole run into status error.
Allocations stay small (each world under ``WORLD_ALLOC_LIMIT`` bytes in all, checked before launch)
so a test can never exhaust this machine's memory.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import socket
import time
from pathlib import Path

import pytest
from harness import requires_gpu, run_world

from checker.cli.main import build_parser
from checker.commands.options import DEFAULT_BUDGET_GIB
from checker.config import DeriveConfig
from checker.core.sizing.sizing import CapacityInputs, derive_all, derive_stage
from checker.device.materialize import (
    LIMIT_ENV,
    MATERIALIZE_FAILED,
    MATERIALIZE_MISMATCH,
    materialize_stage,
    pool_tensors,
)
from checker.families.geometry import load_geometry
from checker.preflight.resolve import derive_inputs, with_release

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAMILIES = {
    # GatedDeltaNet: conv state (channels, K-1), window axis last. Qwen3.5 (Qwen3-Next asserts a single
    # stage), at Qwen3-Next's linear-attention size so each world stays under WORLD_ALLOC_LIMIT.
    "qwen3.5": ["--model-config", str(FIXTURES / "qwen3_5_gdn_small.json")],
    # KDA: conv state (K-1, 3*H*d), window axis first; a different pool layout.
    "kimi-linear": ["--model-config", str(FIXTURES / "kimi_linear_48b_a3b.json")],
}
LAYOUTS = {1: (1, 1), 2: (2, 1), 3: (3, 1), 4: (2, 2)}
"""world_size -> (pp_size, tp_size)."""
WORLD_ALLOC_LIMIT = 2**29
"""Real bytes one test may allocate in all ranks together (0.5 GiB)."""
FAST = ["--timeout-s", "60", "--budget-gib", "8"]  # generous timeout: ranks start slowly on a loaded machine
SPEC_D = 2


PP_SPEC = {"SGLANG_ENABLE_PP_SPEC": "1"}
"""0.5.21+ start speculative decoding under PP only with it (or on a prefill node): every spec case here
is a deployment SGLang 0.5.23 starts."""


def _inputs(argv: list[str]) -> CapacityInputs:
    args = build_parser().parse_args(["derive", *argv])
    config = DeriveConfig.from_args(args, default_budget_gib=DEFAULT_BUDGET_GIB)
    return derive_inputs(with_release(config), PP_SPEC)


def _pool_args(family: str, world_size: int, spec: bool) -> list[str]:
    """Small pools: K = slots per request (one running request), or branch B with spec decoding."""
    pp, tp = LAYOUTS[world_size]
    base = [*FAMILIES[family], "--pp-size", str(pp), "--tp-size", str(tp)]
    if spec:
        # Branch B: K = max_running_requests = 1; the spec scratch holds (1 + 1) x D states.
        argv = [
            *base,
            "--disable-radix-cache",
            "--max-running-requests",
            "1",
            "--speculative-num-draft-tokens",
            str(SPEC_D),
        ]
    else:
        argv = [*base, "--max-mamba-cache-size", str(_inputs(base).slots_per_request())]
    return argv


def _world_alloc_bytes(argv: list[str]) -> int:
    """What the whole world will allocate: every stage once per TP rank (derived in-process)."""
    from checker.device.materialize import predicted_bytes

    inputs = _inputs(argv)
    return sum(predicted_bytes(inputs, s) for s in derive_all(inputs)) * inputs.tp_size


# The quick run keeps one case per family (each layout kind: KDA's window-first conv, GDN's channels-first;
# with and without the spec scratch); the whole family x world x spec matrix runs in the slow group.
QUICK_CASES = {("qwen3.5", 2, True)}  # one multi-rank case; the matrix runs in the slow step


def _matrix():
    for family in sorted(FAMILIES):
        for world_size in (1, 2, 3, 4):
            for spec in (False, True):
                marks = () if (family, world_size, spec) in QUICK_CASES else (pytest.mark.slow,)
                ident = f"{family}-{world_size}-{'spec' if spec else 'no-spec'}"
                yield pytest.param(family, world_size, spec, marks=marks, id=ident)


@pytest.mark.parametrize(("family", "world_size", "spec"), list(_matrix()))
def test_every_rank_allocates_exactly_the_prediction(tmp_path, family, world_size, spec):
    """Each rank's real pool equals its predicted bytes, and the stages together hold every layer once.

    Breaks if the derivation's bytes (state_allocated_bytes + spec scratch) drift from SGLang's shapes
    and dtypes: a rank's allocated_bytes differs from predicted_bytes and the run exits 2 instead of 0.
    """
    argv = _pool_args(family, world_size, spec)
    assert _world_alloc_bytes(argv) < WORLD_ALLOC_LIMIT, "test pool too large for this machine"
    single = ["--allow-single-rank"] if world_size == 1 else []
    res = run_world(
        ["check", *argv, *single, "--materialize", *FAST],
        world_size=world_size,
        tmp_path=tmp_path,
        env=PP_SPEC,
    )
    assert res.codes == [0] * world_size, [r.stderr[-500:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "consistent"
    assert "materialize_s" in rep["timings"]
    ranks = rep["ranks"]
    assert all(r["allocated_bytes"] == r["predicted_bytes"] > 0 for r in ranks), ranks

    # Independent of the checker's own arithmetic: SGLang's shapes for this stage, from the geometry.
    inputs = _inputs(argv)
    geo = inputs.geometry
    d = SPEC_D if spec else 0
    for r in ranks:
        own = r["stage_linear_layers"]
        scratch = own * geo.bytes_per_layer * (r["max_running_requests"] + 1) * d
        assert r["predicted_bytes"] == own * geo.bytes_per_layer * (r["max_mamba_cache_size"] + 1) + scratch
        assert r["predicted_bytes"] == r["state_allocated_bytes"] + scratch
    # One TP rank per stage: the stages between them materialise every linear layer exactly once.
    k = {r["max_mamba_cache_size"] for r in ranks}
    n = {r["max_running_requests"] for r in ranks}
    assert len(k) == len(n) == 1
    per_layer_slots = (k.pop() + 1) + (n.pop() + 1) * d
    stage_heads = [r for r in ranks if r["tp_rank"] == 0]
    assert sum(r["predicted_bytes"] for r in stage_heads) == (
        geo.num_linear_layers * geo.bytes_per_layer * per_layer_slots
    )
    if spec and inputs.pp_size == 1:
        # At pp 1 the allocation is exactly what SGLang reserves for the spec scratch.
        stage = derive_stage(inputs, 0)
        assert ranks[0]["predicted_bytes"] == stage.state_allocated_bytes + stage.intermediate_state_bytes
    out = res.ranks[0].stdout
    assert "predicted_bytes" in out and "allocated_bytes" in out


@pytest.mark.slow
def test_kimi_k3_preset_on_four_ranks(tmp_path):
    """The upstream unit test's geometry (kimi-k3 preset, temporal dtype overridden to bf16) on pp 2 x tp 2.

    Breaks if --mamba-ssm-dtype does not reach the allocation: the temporal tensors would be fp32 and
    allocated_bytes twice the temporal share of predicted_bytes.
    """
    argv = [
        "--model",
        "kimi-k3",
        "--pp-size",
        "2",
        "--tp-size",
        "2",
        "--mamba-ssm-dtype",
        "bfloat16",
        "--disable-radix-cache",
        "--max-mamba-cache-size",
        "1",
    ]
    assert _world_alloc_bytes(argv) < WORLD_ALLOC_LIMIT
    res = run_world(["check", *argv, "--materialize", *FAST], world_size=4, tmp_path=tmp_path)
    assert res.codes == [0] * 4, [r.stderr[-500:] for r in res.ranks]
    ranks = res.report()["ranks"]
    assert all(r["allocated_bytes"] == r["predicted_bytes"] > 0 for r in ranks)
    assert [r["predicted_bytes"] for r in ranks] == [r["state_allocated_bytes"] for r in ranks]


@pytest.mark.slow
def test_failed_allocation_is_an_error_every_rank_reports(tmp_path):
    """One rank runs out of memory (injected): every rank exits 2, the report names it with numbers.

    Breaks if a failing rank crashes or returns early (the others would hang or report consistent),
    or if the failure loses its numbers.
    """
    argv = _pool_args("qwen3.5", 3, spec=False)
    predicted = _world_alloc_bytes(argv) // 3
    limit = predicted // 2
    res = run_world(
        ["check", *argv, "--materialize", *FAST],
        world_size=3,
        tmp_path=tmp_path,
        rank_env={1: {LIMIT_ENV: str(limit)}},
    )
    assert res.codes == [2, 2, 2], [r.stderr[-500:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "error" and rep["exit_code"] == 2
    by_rank = {r["rank"]: r for r in rep["ranks"]}
    bad = by_rank[1]
    assert bad["status"] == "error" and 0 < bad["allocated_bytes"] <= limit < bad["predicted_bytes"]
    assert all(by_rank[i]["allocated_bytes"] == by_rank[i]["predicted_bytes"] for i in (0, 2))
    (err,) = rep["errors"]
    host = os.environ.get("CHECKER_HOSTNAME") or socket.gethostname()
    assert err.startswith(f"rank 1 ({host}): materialize failed") and "out of memory" in err
    assert f"{bad['allocated_bytes']:,} of {bad['predicted_bytes']:,} B" in err
    assert f"error: rank 1 ({host}): materialize failed" in res.ranks[0].stdout


# -- in-process: the pieces a world test cannot reach cheaply ------------------------------------


def _small_stage(spec: bool = False):
    # Nemotron-H: a Mamba2 layout whose class starts under PP (Falcon-H1's asserts a single stage).
    geo = load_geometry(model_config=str(FIXTURES / "nemotron_h_8b.json"), tp_size=1)
    inputs = CapacityInputs(
        geometry=geo,
        budget_gib=8.0,
        pp_size=4,
        disable_radix_cache=True,
        max_running_requests=1,
        max_mamba_cache_size=1,
        speculative_num_draft_tokens=SPEC_D if spec else None,
        pp_spec_env=True,
    )
    return inputs, derive_stage(inputs, 1)


def test_pool_tensors_follow_sglang_shapes():
    """Per own layer: (K+1, *conv) and (K+1, *temporal); with spec (S+1, D, *shape) scratch.

    Breaks if a layer outside the stage is allocated or the spec scratch loses its draft axis.
    """
    inputs, stage = _small_stage(spec=True)
    geo = inputs.geometry
    specs = pool_tensors(inputs, stage)
    own = stage.stage_linear_layers
    assert len(specs) == own * 2 * (len(geo.conv_shapes) + 1)
    slots, spec_slots = stage.max_mamba_cache_size + 1, stage.max_running_requests + 1
    assert {s.shape for s in specs} == {
        (slots, *geo.conv_shapes[0]),
        (slots, *geo.temporal_shape),
        (spec_slots, SPEC_D, *geo.conv_shapes[0]),
        (spec_slots, SPEC_D, *geo.temporal_shape),
    }
    layers = {int(s.name.split()[1]) for s in specs}
    assert layers == {i for i in geo.linear_layer_ids if stage.start_layer <= i < stage.end_layer}


def test_spec_scratch_is_own_layers_not_the_reservation():
    """At pp > 1 SGLang reserves stage_per_req x slots x D but allocates only the stage's own layers.

    kimi-k3 at pp 2: stage 1 holds 34 linear layers, the busiest 35. Breaks if the prediction switches
    to the reservation (stage 1 would then report a mismatch of exactly one layer's scratch).
    """
    from checker.device.materialize import predicted_bytes

    geo = load_geometry(model="kimi-k3", tp_size=8)
    inputs = CapacityInputs(
        geometry=geo,
        budget_gib=40.0,
        pp_size=2,
        max_running_requests=8,
        speculative_num_draft_tokens=SPEC_D,
        pp_spec_env=True,
    )
    s0, s1 = derive_all(inputs)
    for s in (s0, s1):
        scratch = predicted_bytes(inputs, s) - s.state_allocated_bytes
        assert scratch == sum(t.nbytes for t in pool_tensors(inputs, s) if "intermediate" in t.name)
    gap = s1.intermediate_state_bytes - (predicted_bytes(inputs, s1) - s1.state_allocated_bytes)
    assert s0.stage_linear_layers - s1.stage_linear_layers == 1
    assert (
        gap
        == (s1.stage_per_req_bytes - s1.own_state_bytes_per_slot) * (s1.max_running_requests + 1) * SPEC_D
        > 0
    )
    assert predicted_bytes(inputs, s0) - s0.state_allocated_bytes == s0.intermediate_state_bytes


def test_mismatch_is_a_finding_with_numbers():
    """A derivation one byte per slot off is caught: status mismatch, both numbers in the message."""
    inputs, stage = _small_stage()
    wrong = dataclasses.replace(stage, own_state_bytes_per_slot=stage.own_state_bytes_per_slot + 1)
    m = materialize_stage(inputs, wrong, "cpu")
    assert not m.ok and m.status == MATERIALIZE_MISMATCH
    assert m.allocated_bytes == m.predicted_bytes - (stage.max_mamba_cache_size + 1)
    assert f"predicted {m.predicted_bytes:,} B, allocated {m.allocated_bytes:,} B" in m.error


def test_everything_is_freed():
    """No tensor created by a materialisation outlives it (on CPU the storages go back)."""
    inputs, stage = _small_stage(spec=True)
    gc.collect()
    before = sum(1 for o in gc.get_objects() if type(o).__name__ == "Tensor")
    m = materialize_stage(inputs, stage, "cpu")
    gc.collect()
    after = sum(1 for o in gc.get_objects() if type(o).__name__ == "Tensor")
    assert m.ok, m.error
    assert m.num_tensors > 0 and after <= before


def test_host_guard_refuses_before_allocating():
    """A CPU pool above the host's share of MemAvailable is refused, naming --budget-gib: never an OOM."""
    inputs, stage = _small_stage()
    m = materialize_stage(inputs, stage, "cpu", host_share=10**12)
    assert not m.ok and m.status == MATERIALIZE_FAILED and m.allocated_bytes == 0
    assert "--budget-gib" in m.error and "MemAvailable" in m.error


def test_deadline_ends_materialisation():
    """A deadline already past: a failure naming --timeout-s, not an allocation that outlives it."""
    inputs, stage = _small_stage()
    m = materialize_stage(inputs, stage, "cpu", deadline=time.monotonic() - 1)
    assert not m.ok and m.status == MATERIALIZE_FAILED and "--timeout-s" in m.error


@pytest.mark.slow
def test_derive_materializes_every_stage(cli):
    """derive --materialize on the kimi-k3 preset with spec decoding: every stage allocated == predicted.

    Auto-fit branch (budget-driven K) at pp 8 x tp 4, one stage at a time. Breaks if any stage's
    allocation differs from its prediction (exit 2) or the JSON loses the two keys.
    """
    import json

    argv = [
        "derive",
        "--model",
        "kimi-k3",
        "--pp-size",
        "8",
        "--tp-size",
        "4",
        "--budget-gib",
        "0.25",
        "--max-running-requests",
        "1",
        "--speculative-num-draft-tokens",
        str(SPEC_D),
    ]
    inputs = _inputs(argv[1:])
    from checker.device.materialize import predicted_bytes

    assert max(predicted_bytes(inputs, s) for s in derive_all(inputs)) < WORLD_ALLOC_LIMIT
    res = cli([*argv, "--materialize", "--format", "json"], env=PP_SPEC)
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert doc["materialize"]["ok"] and doc["materialize"]["device"] == "cpu"
    assert all(r["status"] == "ok" and r["allocated_bytes"] == r["predicted_bytes"] for r in doc["ranks"])
    assert {r["branch"] for r in doc["ranks"]} == {"C"}


def test_derive_reports_a_failed_stage(cli):
    """An injected OOM in derive: exit 2 and one error line per stage with its numbers."""
    argv = [
        "derive",
        *FAMILIES["qwen3.5"],
        "--pp-size",
        "2",
        "--disable-radix-cache",
        "--max-mamba-cache-size",
        "1",
        "--materialize",
    ]
    res = cli(argv, env={LIMIT_ENV: "1000000"})
    assert res.rc == 2
    lines = [ln for ln in res.err.splitlines() if "materialize failed" in ln]
    assert len(lines) == 2 and all("out of memory" in ln for ln in lines)


def test_bad_materialize_device_is_one_line(cli):
    res = cli(["derive", "--pp-size", "2", "--materialize", "--materialize-device", "tpu"])
    assert res.rc == 2 and res.err.count("\n") == 1 and "--materialize-device" in res.err


@pytest.mark.gpu
@requires_gpu
def test_gpu_world_one_nccl_materialize(tmp_path):
    """On a GPU: NCCL at world 1, budget from the device, the pool allocated on cuda:0 and freed."""
    res = run_world(
        [
            "check",
            *FAMILIES["qwen3.5"],
            "--backend",
            "nccl",
            "--budget-from-device",
            "--mem-fraction-static",
            "0.05",
            "--materialize",
            "--timeout-s",
            "60",
            "--allow-single-rank",
        ],
        world_size=1,
        tmp_path=tmp_path,
    )
    assert res.codes == [0], res.ranks[0].stderr[-500:]
    (r,) = res.report()["ranks"]
    assert r["allocated_bytes"] == r["predicted_bytes"] > 0
