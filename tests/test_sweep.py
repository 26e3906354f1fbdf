"""Budget sweeps (docs/derive-plan-sweep.md, "Budget sweeps: where each policy breaks"): the grid, the
vectorised derivation against the scalar core, the analysis, the command's exit status, report and plot."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import geometries

from checker.core.errors import BudgetError, CheckerInputError
from checker.core.sizing.sizing import (
    CHECKED_VALUES,
    GIB,
    POLICIES,
    STRATEGIES,
    CapacityInputs,
    derive_stage,
    plan_stage,
    size_pool,
)
from checker.core.sizing.sweep import BOOT_FAILURE, budget_runs, parse_budgets, scalar_sweep
from checker.core.sizing.sweep import analyse as analyse_lists
from checker.device.sweep import analyse, derive_sweep, local_sweep
from checker.families.geometry import load_geometry

REPO_ROOT = Path(__file__).resolve().parent.parent
KIMI = ["--model", "kimi-k3", "--pp-size", "8", "--mamba-full-memory-ratio", "0.5"]


# --- the budget grid -----------------------------------------------------------------------------


def test_upstream_grid_is_145_budgets_typed_as_decimals() -> None:
    """STOP is included and each budget equals the float of its decimal; an off-by-one or a drifting
    accumulation (4 + i * 0.25 summed) shows as 144 budgets or a budget that is not float('x.yz')."""
    grid = parse_budgets("4:40:0.25")
    assert len(grid) == 145
    assert grid.budgets[0] == 4.0 and grid.budgets[-1] == 40.0
    assert all(b == float(f"{4 + i * 0.25:.2f}") for i, b in enumerate(grid.budgets))
    # The classic drift trap: 0.1 + 0.1 + 0.1 != 0.3, but the user typed 0.3.
    assert parse_budgets("0.1:0.3:0.1").budgets == (0.1, 0.2, 0.3)
    assert parse_budgets("1:2:0.3").budgets == (1.0, 1.3, 1.6, 1.9)  # STOP not on the grid: not added


def test_comma_list_is_sorted_and_distinct() -> None:
    """A comma list is the set of budgets typed, ascending; a duplicate would count a budget twice."""
    assert parse_budgets("16, 8,8 ,24").budgets == (8.0, 16.0, 24.0)
    assert parse_budgets("12.5").budgets == (12.5,)


@pytest.mark.parametrize(
    "spec", ["4:3:1", "0:4:1", "-1,2", "4:40:0", "4:40", "a,b", "", "4:inf:1", "1:1e9:1e-9", "1e400"]
)
def test_bad_grid_is_one_budget_error(spec: str) -> None:
    """Every malformed grid is a BudgetError naming --budgets, never a crash or a silent empty sweep."""
    with pytest.raises(BudgetError, match="--budgets"):
        parse_budgets(spec)


def test_a_grid_in_powers_of_ten_is_the_budgets_typed() -> None:
    """1E+5:3E+5:1E+5 is 100000, 200000 and 300000 GiB exactly, as typed: a grid whose parts all have
    a positive exponent has no decimals to scale by (scaling by 10**-5 as a float gives
    99999.99999999999)."""
    assert parse_budgets("1E+5:3E+5:1E+5").budgets == (100000.0, 200000.0, 300000.0)


def test_the_report_describes_the_grid_as_the_schema_says() -> None:
    """The report's ``budget_grid`` (docs/report.schema.json requires spec, num_budgets, min_gib,
    max_gib): the text typed, the count, and the first and last budget swept, which for a range whose
    STOP is off the grid is the last point on it (1.9 for 1:2:0.3), not STOP."""
    assert parse_budgets(" 1:2:0.3 ").describe() == {
        "spec": "1:2:0.3",
        "num_budgets": 4,
        "min_gib": 1.0,
        "max_gib": 1.9,
    }
    assert parse_budgets("24,8,16").describe()["min_gib"] == 8.0


def test_grid_edges_are_accepted() -> None:
    """The edges of what a grid may be: one budget (START = STOP), exactly 1 PiB, exactly MAX_BUDGETS
    budgets, and decimals written with an exponent (1E+1 has a positive exponent: no decimals)."""
    assert parse_budgets("4:4:1").budgets == (4.0,)
    assert parse_budgets("1048576").budgets == (1048576.0,)
    assert len(parse_budgets("1:1000000:1")) == 1_000_000
    assert parse_budgets("1E+1:3E+1:1E+1").budgets == (10.0, 20.0, 30.0)
    assert parse_budgets("2.5E-1:1:0.25").budgets == (0.25, 0.5, 0.75, 1.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "1048576.5",
            "--budgets '1048576.5': 1048576.5 GiB is above 1,048,576 GiB (1 PiB), more than any device holds",
        ),
        ("1e400", "--budgets '1e400': 1e400 GiB is above 1,048,576 GiB (1 PiB), more than any device holds"),
        ("1e-400,8", "--budgets '1e-400,8': '1e-400' is too small to be a budget in GiB"),
        ("inf", "--budgets 'inf': 'inf' must be a finite number of GiB"),
        (
            "4:x:1",
            "--budgets '4:x:1': 'x' is not a number; use START:STOP:STEP (e.g. 4:40:0.25) or a comma list "
            "(e.g. 8,16,24)",
        ),
        (
            "1:1000001:1",
            "--budgets '1:1000001:1' gives 1,000,001 budgets, more than the 1,000,000 a sweep holds; use a "
            "larger STEP or a narrower range",
        ),
    ],
)
def test_grid_past_its_edges_is_refused_quoting_the_grid(spec: str, message: str) -> None:
    """One past each edge is refused, and the message quotes the whole --budgets text and says what to
    type instead: a budget that rounds to 0 GiB in a double is not silently swept as 0, and one too
    large for a double (1e400) is named as too large, not as "not finite"."""
    with pytest.raises(BudgetError) as info:
        parse_budgets(spec)
    assert str(info.value) == message


@pytest.mark.parametrize(("spec", "bad"), [("0,8", "0"), ("8, 0.0", "0.0"), ("-0,8", "-0")])
def test_a_zero_budget_in_a_list_is_refused_naming_it(spec: str, bad: str) -> None:
    """0 GiB is no budget (SGLang refuses rest_memory <= 0): a list holding it is refused, quoting the
    --budgets text and the entry, rather than sweeping a budget no server starts with."""
    with pytest.raises(BudgetError) as info:
        parse_budgets(spec)
    assert str(info.value) == f"--budgets {spec!r}: {bad} must be a positive number of GiB"


def test_a_list_too_long_names_the_grid() -> None:
    """Past MAX_BUDGETS the refusal quotes the --budgets text the user typed."""
    spec = ",".join(["1"] * 1_000_001)
    with pytest.raises(BudgetError, match=r"--budgets '1,1,1.*gives 1,000,001 budgets"):
        parse_budgets(spec)


# --- vectorised == scalar --------------------------------------------------------------------------


@st.composite
def capacity_inputs(draw: st.DrawFn) -> CapacityInputs:
    g = draw(
        geometries(max_layers=40, max_conv_channels=8192, max_heads=128, extras=(0, 0, 4096, 12_345_678))
    )
    D = draw(st.one_of(st.none(), st.integers(1, 8)))
    mrr = draw(st.one_of(st.none(), st.integers(1, 5000)))
    if D and mrr is None:
        mrr = draw(st.integers(1, 5000))  # SGLang needs it for spec decoding
    T = draw(st.one_of(st.none(), st.integers(1, 2_000_000)))
    pp = draw(st.integers(1, min(8, g.num_hidden_layers)))
    # SGLang 0.5.21+ start speculative decoding under PP only with SGLANG_ENABLE_PP_SPEC (exported here),
    # and not with attention DP: such a deployment is refused, not swept.
    dp = 1 if D and pp > 1 else draw(st.sampled_from([1, 1, 2, 4]))
    return CapacityInputs(
        geometry=g,
        budget_gib=8.0,
        pp_size=pp,
        dp_size=dp,
        pp_spec_env=True,
        policy=draw(st.sampled_from(POLICIES)),
        mamba_full_memory_ratio=draw(st.one_of(st.sampled_from([0.5, 0.9]), st.floats(0.01, 20))),
        mamba_radix_cache_strategy=draw(st.sampled_from(STRATEGIES)),
        page_size=draw(st.sampled_from([1, 1, 16])),
        disable_radix_cache=draw(st.booleans()),
        disable_overlap_schedule=draw(st.booleans()),
        max_running_requests=mrr,
        max_mamba_cache_size=draw(st.one_of(st.none(), st.none(), st.integers(1, 3000))),
        speculative_num_draft_tokens=D,
        pp_max_micro_batch_size=draw(st.one_of(st.none(), st.none(), st.integers(1, 64))),
        token_capacity=T,
        context_len=draw(st.one_of(st.none(), st.integers(1, 1_000_000))),
        allow_longer_context=True,  # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: any --context-length
        max_total_tokens=draw(st.one_of(st.none(), st.none(), st.integers(1, 3_000_000))),
        kv_cache_dtype=draw(st.sampled_from(["auto", "auto", "fp8_e4m3", "bf16"])),
        skip_decode_lock=draw(st.booleans()),
    )


def edge_budgets(inputs: CapacityInputs, pp_rank: int) -> list[float]:
    """Budgets at which the pool size K steps (branch C) or the state pool just fits (A, B), one and two
    ulps either side: where a float op done in another order or rounded differently shows first."""
    try:
        plan = plan_stage(inputs, pp_rank)
    except CheckerInputError:
        return []
    spr, extra = plan.stage_per_req_bytes, plan.extra_per_slot_bytes
    per_slot, ratio = spr + extra, plan.slots_per_request
    if per_slot <= 0:
        return []
    r, D = inputs.mamba_full_memory_ratio, inputs.speculative_num_draft_tokens or 0
    centres = []
    for m in (1, 2, 3, ratio, ratio + 1, 2 * ratio, 97, 4096 * ratio):
        if D:
            B = m * (spr * (1 + D / ratio) + extra) + spr * (1 + D) + extra
        else:
            B = (m + 1) * per_slot
        centres.append(B / GIB * (1 + r) / r)
        centres.append((m + 1) * per_slot / GIB)  # kv budget exactly spent by a fixed K = m
    out = []
    for c in centres:
        for k in (-2, -1, 0, 1, 2):
            b = c
            for _ in range(abs(k)):
                b = math.nextafter(b, math.inf if k > 0 else 0.0)
            if b > 0 and math.isfinite(b):
                out.append(b)
    return out


def scalar_rows(inputs: CapacityInputs, pp_rank: int, budgets: list[float]) -> list[list[int]]:
    return [list(t) for t in scalar_sweep(inputs, pp_rank, budgets)]


def vector_rows(inputs: CapacityInputs, pp_rank: int, budgets: list[float]) -> list[list[int]]:
    return derive_sweep(inputs, pp_rank, budgets, "cpu").tolist()


def outcome(fn, *args):  # noqa: ANN001, ANN201 - the value or the error class, compared as a pair
    try:
        return "ok", fn(*args)
    except CheckerInputError as exc:
        return "error", type(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inputs=capacity_inputs(),
    random_budgets=st.lists(
        st.one_of(st.floats(1e-6, 1e4), st.floats(1e-9, 0.05), st.floats(3.9, 40.1)), min_size=1, max_size=40
    ),
)
@pytest.mark.slow  # 7 s of CPU (every geometry x release through both paths): in the slow step
def test_vectorised_matches_scalar_core(inputs: CapacityInputs, random_budgets: list[float]) -> None:
    """derive_sweep is the scalar core, budget by budget, on random geometries, policies, strategies,
    spec decoding, fixed pools and token capacities, at budgets where K steps and budgets too small to
    boot. A float op reordered, a floor that rounds differently, a missed clamp or boot check shows as
    one triple that differs; a budget-independent error must be the same error on both paths."""
    for k in range(inputs.pp_size):
        budgets = random_budgets + edge_budgets(inputs, k)
        want = outcome(scalar_rows, inputs, k, budgets)
        got = outcome(vector_rows, inputs, k, budgets)
        assert got == want, f"pp_rank {k}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=capacity_inputs(), budget=st.one_of(st.floats(1e-6, 1e4), st.floats(3.9, 40.1)))
def test_own_stage_given_the_min_matches_the_pipeline(inputs: CapacityInputs, budget: float) -> None:
    """What a rank checks on its device (check_on_device): its own stage only, from the scalar core's
    pool after the MIN, gives the triple the whole-pipeline sweep gives that stage. A resolution that
    needs another stage's pools, or a MIN that does not resolve to itself, shows as a differing triple."""
    for k in range(inputs.pp_size):
        try:
            stage = derive_stage(inputs, k, budget)
        except CheckerInputError:
            continue  # the scalar core refuses: nothing for the device to re-derive (the rank reports it)
        got = derive_sweep(inputs, k, [budget], minimum=stage.max_total_num_tokens).tolist()
        assert got == derive_sweep(inputs, k, [budget]).tolist(), f"pp_rank {k}"


@pytest.mark.slow
def test_dense_kimi_sweep_matches_scalar_core() -> None:
    """The upstream fixture over 2,000 random budgets (4 to 40 GiB, plus sub-GiB ones that cannot boot),
    every policy and both strategies under PP: the vectorised loops (not only the scalar tail of a short
    tensor) agree with the scalar core exactly."""
    gen = torch.Generator().manual_seed(5)
    budgets = (torch.rand(2000, generator=gen, dtype=torch.float64) * 36 + 4).tolist()
    budgets += (torch.rand(200, generator=gen, dtype=torch.float64) * 0.5).tolist()
    g = load_geometry(model="kimi-k3")
    for strategy in ("no_buffer", "extra_buffer"):
        for policy in POLICIES:
            # no_buffer needs --disable-overlap-schedule in SGLang 0.5.23, even under PP.
            inputs = CapacityInputs(
                geometry=g,
                budget_gib=8.0,
                pp_size=8,
                policy=policy,
                mamba_full_memory_ratio=0.5,
                mamba_radix_cache_strategy=strategy,
                disable_overlap_schedule=strategy == "no_buffer",
            )
            for k in range(8):
                want = [list(t) for t in scalar_sweep(inputs, k, budgets)]
                assert derive_sweep(inputs, k, budgets).tolist() == want, (strategy, policy, k)


def test_local_sweep_stacks_policies_in_order() -> None:
    """local_sweep is (policies, budgets, 3) in the mapping's order: a transposed or reordered stack
    would attribute one policy's divergence to another."""
    g = load_geometry(model="kimi-k3")
    ibp = {
        p: CapacityInputs(geometry=g, budget_gib=8.0, pp_size=8, policy=p, mamba_full_memory_ratio=0.5)
        for p in ("own-share", "max-share")
    }
    got = local_sweep(ibp, 1, [8.0, 0.01])
    assert got.dtype == torch.int64 and got.shape == (2, 2, 3)
    assert got[1, 0].tolist() == list(scalar_sweep(ibp["max-share"], 1, [8.0])[0])
    assert got[0, 0].tolist() == list(scalar_sweep(ibp["own-share"], 1, [8.0])[0])
    assert got[:, 1].eq(BOOT_FAILURE).all()  # 10 MiB boots nothing


def test_the_scalar_reference_sizes_each_budget_of_the_grid() -> None:
    """scalar_sweep sizes every budget of the grid, not the one the inputs hold (8 GiB here): a sweep
    point is what the core derives with that budget (derive --budget 40), 10 MiB boots no stage (as
    local_sweep finds), and five times the budget gives a larger pool."""
    g = load_geometry(model="kimi-k3")
    inputs = CapacityInputs(
        geometry=g, budget_gib=8.0, pp_size=8, policy="max-share", mamba_full_memory_ratio=0.5
    )
    tiny, at_8, at_40 = scalar_sweep(inputs, 1, [0.01, 8.0, 40.0])
    assert tiny == (BOOT_FAILURE,) * 3
    i40 = dataclasses.replace(inputs, budget_gib=40.0)
    s40 = size_pool(plan_stage(i40, 1), i40)
    assert at_40 == (s40.max_mamba_cache_size, s40.max_running_requests, s40.pp_max_micro_batch_size)
    assert at_8[0] < at_40[0]


# --- the analysis -----------------------------------------------------------------------------------

OK = (74, 24, 3)
FAIL = (BOOT_FAILURE,) * 3


def hand_stack() -> list:
    """3 stages, 2 policies, 4 budgets. Policy 0: budget 0 fails on every stage, budget 1 fails on
    stage 1 only, budget 2 disagrees on pp_max_micro_batch_size only, budget 3 agrees. Policy 1 agrees."""
    p0 = [[FAIL, OK, (74, 24, 2), OK], [FAIL, FAIL, OK, OK], [FAIL, OK, OK, OK]]
    return [[p0[k], [OK] * 4] for k in range(3)]


@pytest.mark.parametrize("as_tensor", [False, True])
def test_analysis_separates_boot_failures_from_divergence(as_tensor: bool) -> None:
    """All stages failing alike is a boot failure, not a divergence; some stages failing is divergent
    in every value; a micro-batch-only disagreement counts for that value alone. The tensor and the
    nested-list paths give the same dict."""
    budgets = [1.0, 2.0, 3.0, 4.0]
    stack = hand_stack()
    found = analyse(torch.tensor(stack) if as_tensor else stack, budgets, ["own-share", "max-share"])
    assert found == analyse_lists(stack, budgets, ["own-share", "max-share"])
    own, mx = found["policies"]["own-share"], found["policies"]["max-share"]
    assert found["num_budgets"] == 4
    assert own["divergent"] == {
        "max_mamba_cache_size": 1,
        "max_running_requests": 1,
        "pp_max_micro_batch_size": 2,
    }
    assert own["divergent_budgets"]["pp_max_micro_batch_size"] == [2.0, 3.0]
    assert own["divergent_budgets"]["max_mamba_cache_size"] == [2.0]
    assert (own["boot_failures"], own["boot_failure_budgets"]) == (1, [1.0])
    assert (own["partial_boot_failures"], own["partial_boot_budgets"]) == (1, [2.0])
    assert own["consistent"] is False
    assert mx["consistent"] is True and mx["boot_failures"] == 0
    assert set(mx["divergent"].values()) == {0}


@pytest.mark.parametrize(
    "stack",
    [
        [[[OK] * 4]] * 3,  # one policy where two are named
        [[[OK] * 3, [OK] * 3]] * 3,  # three budgets where four are given (stage 0 already)
        [[[OK] * 4, [OK] * 4], [[OK] * 3, [OK] * 3], [[OK] * 4, [OK] * 4]],  # stage 1 short a budget
    ],
    ids=["policies", "budgets", "ragged-stage"],
)
def test_a_stack_of_the_wrong_shape_is_refused(stack: list) -> None:
    """A stack gathered wrong (a policy or a budget missing, on any stage) is a ValueError, never an
    analysis of the budgets that happen to line up (which could report a divergence as agreement)."""
    with pytest.raises(ValueError):
        analyse_lists(stack, [1.0, 2.0, 3.0, 4.0], ["own-share", "max-share"])
    if stack[0] != stack[1]:
        return  # ragged: stage 1 is short, the stages' zip says so
    with pytest.raises(ValueError, match=r"^stack shape does not match \(stages, policies, budgets, 3\)$"):
        analyse_lists(stack, [1.0, 2.0, 3.0, 4.0], ["own-share", "max-share"])


def test_a_single_stage_agrees_with_itself() -> None:
    """--pp-size 1 sweeps one stage: nothing can diverge, and a budget it cannot boot at is a boot
    failure of every stage, not a partial one."""
    found = analyse_lists([[[FAIL, OK, OK]]], [1.0, 2.0, 3.0], ["own-share"])
    own = found["policies"]["own-share"]
    assert own["consistent"] is True and set(own["divergent"].values()) == {0}
    assert (own["boot_failure_budgets"], own["partial_boot_failures"]) == ([1.0], 0)


@pytest.mark.parametrize(
    ("indices", "runs"),
    [
        ([], []),
        ([3], [(3.0, 3.0)]),
        ([0, 1, 2], [(0.0, 2.0)]),
        ([0, 1, 2, 5, 7, 8], [(0.0, 2.0), (5.0, 5.0), (7.0, 8.0)]),
        ([1, 3, 5], [(1.0, 1.0), (3.0, 3.0), (5.0, 5.0)]),
        ([8], [(8.0, 8.0)]),
    ],
)
def test_budget_runs_merge_consecutive_budgets_only(indices: list[int], runs: list) -> None:
    """The short listings ("diverges at 4-6.5, 8 GiB") merge neighbouring grid points and nothing else:
    a gap of one budget starts a new run, a lone budget is a run of one, and no budget is dropped."""
    budgets = [float(i) for i in range(9)]
    assert budget_runs(indices, budgets) == runs


# --- the command ------------------------------------------------------------------------------------


def test_quiet_names_every_value_that_diverges(cli, tmp_path: Path) -> None:
    """-q is for a CI log: every policy and value that diverges, one line each, then the verdict line.
    (It printed the verdict line alone: "max-share never diverges" hid that own-share diverges in all
    three values.) The lines are the JSON report's findings, not a second opinion."""
    report = tmp_path / "sweep.json"
    res = cli(["sweep", "--budgets", "4:40:0.25", *KIMI, "-q", "--report", str(report)])
    assert res.rc == 0 and not res.err, res.err
    lines = res.out.strip().splitlines()
    doc = json.loads(report.read_text())
    diverging = [
        (p, v) for p, info in doc["policies"].items() for v, n in info["divergent_counts"].items() if n
    ]
    assert {("own-share", v) for v in CHECKED_VALUES} <= set(diverging)
    for policy, value in diverging:
        assert sum(line.startswith(f"{policy}: {value} diverges at ") for line in lines) == 1, (policy, value)
    assert lines[-1] == "required consistent: max-share never diverges -> exit 0"
    full = cli(["sweep", "--budgets", "4:40:0.25", *KIMI, "--no-progress"]).out
    assert all(f"  {line}" in full.splitlines() for line in lines[:-1])  # the same lines as the full text


def test_plot_without_matplotlib_is_refused_before_any_verdict(tmp_path: Path) -> None:
    """--plot where matplotlib cannot be imported: one line and exit 2 before the sweep prints anything
    (it printed its findings and "-> exit 0", then exited 2), with an install hint that works from a
    clone (the project's own extra, never an unpublished package name)."""
    hidden = tmp_path / "hide" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{hidden.parent}{os.pathsep}{root}"}
    argv = [
        sys.executable,
        "-m",
        "checker",
        "sweep",
        "--budgets",
        "4:8:1",
        *KIMI,
        "--plot",
        str(tmp_path / "s.png"),
    ]
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root, timeout=60)
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert res.stderr.strip().splitlines() == [
        "checker sweep: error: --plot needs matplotlib (the 'plot' extra): pip install '.[plot]'"
    ]
    assert not (tmp_path / "s.png").exists()


def test_own_share_fails_require_consistent_and_max_share_passes(cli, tmp_path: Path) -> None:
    """The exit status a CI job relies on: kimi-k3 at pp 8, r 0.5 diverges under own-share (exit 1) and
    never under max-share (exit 0). The report carries the counts the text table prints."""
    bad = cli(["sweep", "--budgets", "4:40:0.25", *KIMI, "--require-consistent", "own-share"])
    assert bad.rc == 1, bad.err
    report = tmp_path / "sweep.json"
    good = cli(
        [
            "sweep",
            "--budgets",
            "4:40:0.25",
            *KIMI,
            "--require-consistent",
            "max-share",
            "--report",
            str(report),
        ]
    )
    assert good.rc == 0, good.err
    doc = json.loads(report.read_text())
    assert doc["num_budgets"] == 145 and len(doc["budgets_gib"]) == 145
    own = doc["policies"]["own-share"]
    assert doc["policies"]["max-share"]["divergent_counts"] == {v: 0 for v in CHECKED_VALUES}
    assert doc["policies"]["max-share"]["divergent"] == []
    micro = own["divergent_counts"]["pp_max_micro_batch_size"]
    assert "pp_max_micro_batch_size" in own["divergent"]
    assert 0 < micro == len(own["divergent_budgets"]["pp_max_micro_batch_size"])
    own_row = next(line for line in good.out.splitlines() if line.startswith("own-share "))
    assert f"{micro} (" in own_row
    a = doc["inputs"]
    # The default strategy under PP: auto resolves before SGLang forces overlap off -> extra_buffer
    # without overlap, 4 slots a request. The report must say so, since the counts depend on it.
    assert a["mamba_full_memory_ratio"] == 0.5 and a["slots_per_request"] == 4
    assert a["mamba_radix_cache_strategy"] == "auto" and a["overlap_schedule"] is False
    assert a["resolved_strategy"] == "extra_buffer" and a["token_capacity"] is None
    assert "strategy extra_buffer (auto), 4 slots per request" in good.out
    assert doc["budget_grid"]["spec"] == "4:40:0.25" and a["model"].startswith("kimi-k3 #")
    assert (doc["command"], doc["status"], doc["exit_code"]) == ("sweep", "consistent", 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--budgets", "4:3:0.25"],
        ["--policy", "own-share", "--require-consistent", "max-share"],
        ["--mamba-radix-cache-strategy", "extra_buffer_lazy"],
        ["--mamba-radix-cache-strategy", "no_buffer"],  # without --disable-overlap-schedule
        ["--page-size", "3"],  # does not divide mamba_track_interval 256
        ["--device", "nonsense"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, argv: list[str]) -> None:
    """A budget grid, a requirement on a policy not swept, cache flags SGLang refuses at startup, a bad
    device: each ends in exit 2 with one line on stderr, never a traceback or a silent pass."""
    res = cli(["sweep", *KIMI, *argv])
    assert res.rc == 2
    assert len(res.err.strip().splitlines()) == 1 and "Traceback" not in res.err


@pytest.mark.parametrize("budget", ["0.000001", "8"])
def test_derive_and_sweep_name_the_same_refusal_at_any_budget(cli, budget: str) -> None:
    """Stage 1 holds no layer (SGLANG_PP_LAYER_PARTITION=93,0), so own-share charges it 0 bytes and
    SGLang's auto-fit asserts on it at every budget; stage 0 merely lacks memory at 1e-6 GiB. derive at
    either budget and the sweep over both print the same line (the layout, not "raise the budget", which
    would not help). Issue 18: derive named stage 0's memory at the small budget."""
    argv = ["--model", "kimi-k3", "--pp-size", "2", "--policy", "own-share"]
    env = {"SGLANG_PP_LAYER_PARTITION": "93,0"}
    derive = cli(["derive", *argv, "--budget-gib", budget], env=env)
    sweep = cli(["sweep", *argv, "--budgets", "0.000001,8"], env=env)
    assert (derive.rc, sweep.rc) == (2, 2)
    assert "stage 1 holds no linear layers" in derive.err
    assert derive.err.split("error: ", 1)[1] == sweep.err.split("error: ", 1)[1]


def test_default_requirement_follows_the_policies_swept(cli) -> None:
    """Sweeping only own-share with no --require-consistent has nothing to require: exit 0 with the
    divergence still reported, rather than an error about max-share."""
    res = cli(["sweep", "--budgets", "8,16", *KIMI, "--policy", "own-share"])
    assert res.rc == 0, res.err
    assert "DIVERGENT" in res.out


def test_long_sweep_reports_progress_on_stderr_only(cli) -> None:
    """A long sweep says it is working on stderr even without a terminal; stdout stays the report.
    A short one with stderr captured (not a TTY) prints nothing there."""
    long = cli(["sweep", "--budgets", "4:40:0.003", *KIMI])
    assert long.rc == 0
    assert "sweep:" in long.err and "sweep:" not in long.out
    short = cli(["sweep", "--budgets", "4:40:0.25", *KIMI])
    assert short.err == ""


def _pixels_near(path: Path, rgb: tuple[int, int, int], tol: int = 3) -> int:
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        pixels = np.asarray(img.convert("RGB"), dtype=np.int64)
    return int((np.abs(pixels - np.array(rgb)).max(axis=2) <= tol).sum())


@pytest.mark.slow  # 4 s; tests/test_plot.py keeps the quick checks of what the figure shows
def test_plot_is_a_valid_png(cli, tmp_path: Path) -> None:
    """--plot writes a real PNG a person can open (magic bytes, PIL decodes it, screen-sized,
    commit-sized) that shows the sweep it reports: the stages' lines (#1f77b4) in every plot, and the
    pink "differs" band (#f4a3a8 at alpha 0.75 on white) exactly when the report finds a divergence
    (own-share here; max-share alone never diverges). A blank canvas, a plot without lines, or a plot
    whose bands disagree with the report fails here."""
    from PIL import Image

    path, agreeing = tmp_path / "sweep.png", tmp_path / "max-share.png"
    res = cli(["sweep", "--budgets", "4:40:0.25", *KIMI, "--plot", str(path)])
    assert res.rc == 0, res.err
    assert "own-share" in res.out and "DIVERGENT" in res.out
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        w, h = img.size
    assert 800 <= w <= 2000 and 600 <= h <= 2000
    assert 10_000 < len(data) < 300_000
    assert _pixels_near(path, (31, 119, 180)) > 2_000 and _pixels_near(path, (247, 186, 190)) > 20_000
    res = cli(["sweep", "--budgets", "4:40:1", *KIMI, "--policy", "max-share", "--plot", str(agreeing)])
    assert res.rc == 0, res.err
    assert _pixels_near(agreeing, (31, 119, 180)) > 1_000 and _pixels_near(agreeing, (247, 186, 190)) == 0


def test_sweep_modules_import_without_torch_until_run() -> None:
    """The core sweep, the command module and the plot module stay torch-free at import, so --help and
    bad input cost no torch import; a stray import shows as 'torch' in a fresh sys.modules."""
    code = textwrap.dedent(
        """
        import sys
        import checker.core.sizing.sweep, checker.commands.sweep, checker.outputs.plot
        print("LEAKED" if "torch" in sys.modules else "CLEAN")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "CLEAN"
