"""``checker plan``: the smallest budget for a running-request target, and the suggested layer partition.

Core properties are checked against independent oracles (brute force over partitions, the public
``derive_all`` at the budget a user would type), the CLI end to end in-process, and the suggested
partition on real gloo ranks through the preflight.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import attentions

from checker.core.errors import BudgetError, CheckerInputError
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.partition import default_partition, stage_partition
from checker.core.sizing.planning import min_budget, suggest_partition
from checker.core.sizing.sizing import POLICIES, CapacityInputs, derive_all
from checker.families.geometry import load_geometry

REPO = Path(__file__).resolve().parents[1]
NEMOTRON = REPO / "tests" / "fixtures" / "nemotron_h_8b.json"


# --- the partition optimiser --------------------------------------------------------------------------


FIXTURES = Path(__file__).parent / "fixtures"


def brute_force(L: int, P: int, ids: set[int], slack: int) -> tuple[int, tuple[int, ...]]:
    """Every partition within the bounds, ranked by (largest linear count, distance to the even split,
    the counts themselves): the documented objective, computed without the optimiser's code. Returns the
    best partition's largest linear count and the partition."""
    base, rem = divmod(L, P)
    lower = max(1, base - slack)
    upper = base + (1 if rem else 0) + slack
    even = tuple(base + (1 if k >= P - rem else 0) for k in range(P))
    best: tuple[int, int, tuple[int, ...]] | None = None
    for parts in itertools.product(range(lower, upper + 1), repeat=P):
        if sum(parts) != L:
            continue
        start, largest = 0, 0
        for n in parts:
            largest = max(largest, sum(1 for i in range(start, start + n) if i in ids))
            start += n
        key = (largest, sum(abs(a - b) for a, b in zip(parts, even, strict=True)), parts)
        if best is None or key < best:
            best = key
    assert best is not None, "the even split is always within the bounds"
    return best[0], best[2]


@st.composite
def small_layouts(draw: st.DrawFn) -> tuple[int, int, frozenset[int], int]:
    P = draw(st.integers(1, 5))
    L = draw(st.integers(P, 14))
    ids = draw(st.sets(st.integers(0, L - 1), min_size=1, max_size=L))
    slack = draw(st.integers(0, 2))
    return L, P, frozenset(ids), slack


@settings(max_examples=150, deadline=None)
@given(small_layouts())
def test_suggested_partition_matches_brute_force(layout: tuple[int, int, frozenset[int], int]) -> None:
    """Optimality: no partition within floor(L/P)-slack .. ceil(L/P)+slack (at least 1) has a smaller
    busiest-stage linear count, and ties go to the closest-to-even then lexicographically smallest. A
    heuristic or an off-by-one in the DP shows as a different partition than the exhaustive search."""
    L, P, ids, slack = layout
    got = suggest_partition(num_hidden_layers=L, linear_layer_ids=tuple(sorted(ids)), pp_size=P, slack=slack)
    largest, expected = brute_force(L, P, set(ids), slack)
    assert got.partition == expected
    assert got.largest_stage_linear_layers == largest
    # The env value, parsed as every rank parses SGLANG_PP_LAYER_PARTITION, gives that partition back.
    assert stage_partition(L, P, got.env) == expected


def test_nemotron_h_8b_pp8_busiest_stage_drops_from_4_to_3(cli: Callable[..., Any]) -> None:
    """The issue's claim: at pp 8 the even split puts 4 of Nemotron-H-8B's 24 Mamba layers on one stage
    where 3 are possible, and under max-share that enlarges every stage's pool. If the optimiser or the
    fixture's pattern were wrong, the largest count or the pool comparison would not move."""
    code, out, err = cli(
        [
            "plan",
            "--model-config",
            str(NEMOTRON),
            "--pp-size",
            "8",
            "--budget-gib",
            "8",
            "--suggest-partition",
            "--format",
            "json",
        ]
    )
    assert code == 0, err
    doc = json.loads(out)
    geometry = load_geometry(model_config=NEMOTRON)
    # Worked numbers: the fixture's 24 Mamba layers of 52; the even split 6,6,6,6,7,7,7,7 puts 4 on the
    # sixth stage, and the exhaustive search over every split within 5..8 layers a stage finds 3 at most.
    assert geometry.num_linear_layers == 24
    assert doc["default"]["layers_per_stage"] == [6, 6, 6, 6, 7, 7, 7, 7]
    assert doc["default"]["max_stage_linear_layers"] == 4
    largest, best = brute_force(52, 8, set(geometry.linear_layer_ids), 1)
    assert (largest, tuple(doc["suggested"]["layers_per_stage"])) == (3, best)
    assert doc["suggested"]["max_stage_linear_layers"] == 3
    assert doc["suggested"]["stage_linear_layers"] == [3] * 8
    assert (
        doc["SGLANG_PP_LAYER_PARTITION"] == doc["suggested"]["SGLANG_PP_LAYER_PARTITION"] == "6,6,6,7,7,6,7,7"
    )
    assert doc["default"]["SGLANG_PP_LAYER_PARTITION"] is None
    # The env value, read back by the same core every rank runs, gives the printed derivation.
    inputs = CapacityInputs(
        geometry=geometry, budget_gib=8.0, pp_size=8, partition_env=doc["SGLANG_PP_LAYER_PARTITION"]
    )
    stages = derive_all(inputs)
    assert [s.max_mamba_cache_size for s in stages] == [
        r["max_mamba_cache_size"] for r in doc["suggested"]["ranks"]
    ]
    assert {s.max_stage_linear_layers for s in stages} == {3}
    default_pool = {r["max_mamba_cache_size"] for r in doc["default"]["ranks"]}
    suggested_pool = {r["max_mamba_cache_size"] for r in doc["suggested"]["ranks"]}
    assert len(default_pool) == len(suggested_pool) == 1  # max-share: every stage agrees
    assert suggested_pool.pop() > default_pool.pop()


def test_suggest_partition_text_prints_the_export_line(cli: Callable[..., Any]) -> None:
    """The text mode's one actionable line is the export; without it a user has nothing to paste."""
    code, out, _ = cli(["plan", "--model-config", str(NEMOTRON), "--pp-size", "8", "--suggest-partition"])
    assert code == 0
    plan = suggest_partition(
        num_hidden_layers=52,
        linear_layer_ids=load_geometry(model_config=NEMOTRON).linear_layer_ids,
        pp_size=8,
    )
    assert f"export SGLANG_PP_LAYER_PARTITION={plan.env}\n" in out
    assert "default split" in out and "suggested" in out


def test_default_split_already_best_says_no_change_and_exports_nothing(cli: Callable[..., Any]) -> None:
    """kimi-k3 at pp 4: the default split puts 18 linear layers on its busiest stage and no split within
    the slack does better (69 linear layers over 4 stages need at least ceil(69 / 4) = 18). Telling the
    user to export the variable anyway invites the classic bug: an export on some nodes only."""
    code, out, _ = cli(["plan", "--model", "kimi-k3", "--pp-size", "4", "--suggest-partition"])
    assert code == 0
    assert "no change needed" in out and "leave SGLANG_PP_LAYER_PARTITION unset" in out
    assert "export " not in out


def test_partition_slack_zero_keeps_the_even_sizes() -> None:
    """Slack 0 allows only floor/ceil sizes; a partition outside them would break the user's bound."""
    ids = tuple(i for i in range(52) if i % 2 == 0)
    got = suggest_partition(num_hidden_layers=52, linear_layer_ids=ids, pp_size=8, slack=0)
    assert set(got.partition) <= {6, 7}
    with pytest.raises(CheckerInputError):
        suggest_partition(num_hidden_layers=52, linear_layer_ids=ids, pp_size=8, slack=-1)


# --- the smallest budget for a target -----------------------------------------------------------------


@st.composite
def budget_cases(draw: st.DrawFn) -> tuple[CapacityInputs, int]:
    P = draw(st.integers(1, 4))
    L = draw(st.integers(P, 16))
    ids = draw(st.sets(st.integers(0, L - 1), min_size=1, max_size=L))
    geometry = ModelGeometry(
        name="random",
        num_hidden_layers=L,
        linear_layer_ids=tuple(sorted(ids)),
        conv_shapes=((draw(st.integers(64, 8192)), draw(st.integers(1, 4))),),
        temporal_shape=(draw(st.integers(1, 64)), draw(st.sampled_from([16, 64, 128])), 128),
        extra_per_slot_bytes=draw(st.sampled_from([0, 0, 4096])),
        context_len=draw(st.sampled_from([4096, 262144])),
        attention=draw(attentions(num_layers=L, linear=frozenset(ids))),
    )
    flags: dict[str, object] = {}
    dp = draw(st.sampled_from([1, 1, 2]))
    if draw(st.booleans()):
        flags["max_running_requests"] = draw(st.integers(1, 300))
        # Under PP SGLang 0.5.21+ start speculative decoding only with SGLANG_ENABLE_PP_SPEC (exported
        # below) and without attention DP.
        if draw(st.booleans()) and (P == 1 or dp == 1):
            flags["speculative_num_draft_tokens"] = draw(st.integers(1, 4))
    if draw(st.integers(0, 4)) == 0:
        flags["disable_radix_cache"] = True
    if draw(st.integers(0, 4)) == 0:
        flags["max_mamba_cache_size"] = draw(st.integers(1, 600))
    if draw(st.integers(0, 3)) == 0:
        flags["token_capacity"] = draw(st.integers(2, 2000))
        flags["context_len"] = draw(st.integers(1, 4096))  # not above the model's own
    inputs = CapacityInputs(
        geometry=geometry,
        budget_gib=8.0,
        pp_size=P,
        dp_size=dp,
        pp_spec_env=True,
        policy=draw(st.sampled_from(["max-share", "whole-model"])),
        mamba_full_memory_ratio=draw(st.sampled_from([0.5, 0.9, 1.7])),
        mamba_radix_cache_strategy=draw(st.sampled_from(["auto", "no_buffer", "extra_buffer"])),
        **flags,  # type: ignore[arg-type]
    )
    return inputs, draw(st.integers(1, 250))


def meets(inputs: CapacityInputs, budget_text: str, target: int) -> bool:
    """What a user sees typing ``--budget-gib budget_text`` into derive: every stage boots and reaches
    the target. Parsed from the decimal string, not from the search's hundredths."""
    try:
        stages = derive_all(replace(inputs, budget_gib=float(budget_text)))
    except BudgetError:
        return False
    return all(s.max_running_requests >= target for s in stages)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget_cases())
def test_min_budget_is_met_and_0_01_gib_less_is_not(case: tuple[CapacityInputs, int]) -> None:
    """Exactness: at the printed budget every stage derives max_running_requests >= N, and 0.01 GiB
    less some stage does not (or the pool does not boot). When the search says no budget can reach N,
    a huge budget indeed misses it. A search that stops early, rounds a budget, or names a cap that
    does not bind shows as a budget where derive disagrees with plan."""
    inputs, target = case
    policy = inputs.policy
    try:
        result = min_budget(inputs, target, policy=policy)
    except BudgetError as exc:
        assert "no budget" in str(exc)
        assert not meets(inputs, "1000000", target)
        return
    except CheckerInputError as exc:
        # A refusal no budget cures must be the one derive itself gives, at any budget.
        with pytest.raises(type(exc)) as derived:
            derive_all(replace(inputs, budget_gib=1e6))
        assert str(derived.value) == str(exc)
        return
    h = result.budget_hundredths
    assert f"{result.budget_gib:.2f}" == f"{h // 100}.{h % 100:02d}"
    assert meets(inputs, f"{h // 100}.{h % 100:02d}", target)
    below = h - 1
    assert below == 0 or not meets(inputs, f"{below // 100}.{below % 100:02d}", target)
    if h <= 1500:
        # Small enough to scan: no smaller budget at all meets the target (not just the neighbour).
        assert not any(meets(inputs, f"{b // 100}.{b % 100:02d}", target) for b in range(1, h))


def test_min_budget_for_the_upstream_numbers_is_at_most_their_budget() -> None:
    """The upstream unit test's worked numbers (docs/how-it-computes.md, "What is modelled"): kimi-k3 at
    pp 8, r 0.5, 3 slots per request (no_buffer with --disable-overlap-schedule, the 3 slots those numbers
    assume), 8 GiB gives max-share 24 running requests on every stage. The smallest budget for 24 can
    then be no more than 8 GiB, and whole-model (charging the whole model on each stage) must need more
    than max-share."""
    geometry = load_geometry(model="kimi-k3")
    inputs = CapacityInputs(
        geometry=geometry,
        budget_gib=8.0,
        pp_size=8,
        mamba_full_memory_ratio=0.5,
        mamba_radix_cache_strategy="no_buffer",
        disable_overlap_schedule=True,
    )
    assert {s.max_running_requests for s in derive_all(inputs)} == {24}
    share = min_budget(inputs, 24, policy="max-share")
    whole = min_budget(inputs, 24, policy="whole-model")
    assert share.budget_gib <= 8.0
    assert whole.budget_gib > share.budget_gib


def test_target_json_and_text(cli: Callable[..., Any]) -> None:
    """JSON carries min_budget_gib per policy (--all-policies: all three) and the derivation there; the
    text table names every policy with its budget, the release's own marked. Re-deriving at each printed
    budget through the CLI must reach the target."""
    code, out, err = cli(
        [
            "plan",
            "--pp-size",
            "8",
            "--target-max-running-requests",
            "30",
            "--all-policies",
            "--format",
            "json",
        ]
    )
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc["min_budget_gib"]) == set(POLICIES) and doc["own_policy"] == "max-share"
    for policy, gib in doc["min_budget_gib"].items():
        ranks = doc["policies"][policy]["ranks"]
        assert len(ranks) == 8 and min(r["max_running_requests"] for r in ranks) >= 30
        code, out, err = cli(
            ["derive", "--pp-size", "8", "--policy", policy, "--budget-gib", str(gib), "--format", "json"]
        )
        assert code == 0, err
        assert min(r["max_running_requests"] for r in json.loads(out)["ranks"]) >= 30
    code, out, _ = cli(["plan", "--pp-size", "8", "--target-max-running-requests", "30", "--all-policies"])
    assert code == 0
    for policy, gib in doc["min_budget_gib"].items():
        assert any(line.split()[:1] == [policy] and f"{gib:.2f}" in line.split() for line in out.splitlines())
    assert any(line.startswith("max-share (SGLang 0.5.23's own)") for line in out.splitlines())


def test_plan_searches_the_release_own_policy_unless_asked_for_all(cli: Callable[..., Any]) -> None:
    """With --sglang-version 0.5.16 (whole-model charging) plan shows whole-model alone, and names it as
    that release's own: the max-share figure a 0.5.23 server would need is not the one shown first.
    (Nemotron-H: a class 0.5.16 starts under PP; Kimi-Linear's load_weights there has no stage filter.)"""
    argv = ["plan", "--model-config", str(FIXTURES / "nemotron_h_8b.json"), "--pp-size", "3"]
    argv += ["--target-max-running-requests", "30", "--sglang-version", "0.5.16"]
    code, out, err = cli([*argv, "--format", "json"])
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc["min_budget_gib"]) == ["whole-model"] and doc["own_policy"] == "whole-model"
    code, out, err = cli(argv)
    assert code == 0, err
    assert "policy: whole-model, SGLang 0.5.16's own (--all-policies: all three)" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--target-max-running-requests", "0"], "must be a positive integer"),
        ([], "one of the arguments"),
        (["--target-max-running-requests", "3", "--suggest-partition"], "not allowed with"),
        (["--suggest-partition", "--partition-slack", "-1"], "--partition-slack"),
        (
            ["--target-max-running-requests", "50", "--max-running-requests", "40"],
            "capped at 40 by --max-running-requests 40",
        ),
        (["--target-max-running-requests", "5000"], "4096"),
        (
            ["--target-max-running-requests", "50", "--token-capacity", "90", "--context-len", "100"],
            "--token-capacity 90",
        ),
        (
            ["--target-max-running-requests", "50", "--max-mamba-cache-size", "100"],
            "--max-mamba-cache-size 100",
        ),
        (
            ["--target-max-running-requests", "50", "--disable-radix-cache", "--max-running-requests", "30"],
            "branch B",
        ),
        (["--target-max-running-requests", "5", "--budget-gib", "3"], "--budget-gib"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv: list[str], needle: str, cli: Callable[..., Any]) -> None:
    """Bad planning input is one line on stderr and exit 2: a traceback, a silent exit 0, or a message
    that does not name the offending flag or cap would fail here."""
    code, out, err = cli(["plan", "--pp-size", "8", *argv])
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and needle in err
    assert "Traceback" not in err


def test_bad_input_through_the_real_entry_point(
    run_checker: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """The same contract through ``python -m checker``: exit 2 and one stderr line, no traceback, as a
    CI script calling the tool sees it (in-process tests cannot see what the interpreter prints)."""
    proc = run_checker(["plan", "--target-max-running-requests", "5000"])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "4096" in proc.stderr


# --- the suggested partition on real gloo ranks -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(
    not (REPO / "checker" / "commands" / "check.py").exists(),
    reason="the preflight (checker/commands/check.py) is not in this tree yet",
)
def test_suggested_partition_passes_the_preflight_on_gloo_ranks(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """The suggested partition, exported identically on all 8 ranks, must pass the preflight: status
    consistent, exit 0, and every rank derives the pool plan printed. A partition SGLang's parser
    rejects, or a plan whose numbers differ from what ranks derive, shows as a non-consistent report or
    a different max_mamba_cache_size."""
    code, out, err = cli(
        [
            "plan",
            "--model-config",
            str(NEMOTRON),
            "--pp-size",
            "8",
            "--budget-gib",
            "8",
            "--suggest-partition",
            "--format",
            "json",
        ]
    )
    assert code == 0, err
    doc = json.loads(out)
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}  # no leaks from the shell
    env.update(SGLANG_PP_LAYER_PARTITION=doc["SGLANG_PP_LAYER_PARTITION"], OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "8",
            "-m",
            "checker",
            "check",
            "--model-config",
            str(NEMOTRON),
            "--pp-size",
            "8",
            "--budget-gib",
            "8",
            "--timeout-s",
            "60",
            "--report",
            str(report),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["status"] == "consistent"
    assert result["world_size"] == 8
    planned = {r["pp_rank"]: r["max_mamba_cache_size"] for r in doc["suggested"]["ranks"]}
    assert {r["pp_rank"]: r["max_mamba_cache_size"] for r in result["ranks"]} == planned
    # the env really changed the layout
    assert default_partition(52, 8) != tuple(doc["suggested"]["layers_per_stage"])
