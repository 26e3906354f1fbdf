"""``plan --target-tokens N`` and ``plan --target-requests R``: the smallest budget at which every stage
holds N KV tokens after the MIN over the pipeline, or serves R requests of the context length.

The KV pool is a saw-tooth in the budget (each new state slot takes its bytes from the KV pool at once),
so the answer is held to a brute-force scan of every 0.01 GiB budget below it, not only to its neighbour.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checker.core.errors import BudgetError
from checker.core.sizing.geometry import resolve_dtypes
from checker.core.sizing.sizing import CapacityInputs, derive_all
from checker.core.sizing.token_plan import TokenTarget, min_budget_tokens
from checker.families.geometry import load_geometry

KIMI_LINEAR = Path(__file__).resolve().parent / "fixtures" / "kimi_linear_48b_a3b.json"


def _kimi_k3(**flags: object) -> CapacityInputs:
    g = resolve_dtypes(load_geometry(model="kimi-k3"), env={})
    return CapacityInputs(geometry=g, **{"budget_gib": 8.0, "pp_size": 4} | flags)  # type: ignore[arg-type]


def _met_at(inputs: CapacityInputs, target: TokenTarget, h: int) -> bool:
    try:
        return target.met(derive_all(inputs, h / 100))
    except BudgetError:
        return False


def test_the_kv_pool_is_a_saw_tooth_in_the_budget():
    """Why the search scans below its bisection: a budget 0.01 GiB larger can hold fewer KV tokens (the
    state pool took one more slot), so "holds N tokens" is not monotone in the budget."""
    inputs = _kimi_k3()
    tokens = [min(s.max_total_num_tokens for s in derive_all(inputs, h / 100)) for h in range(1300, 1500)]
    assert any(b < a for a, b in zip(tokens, tokens[1:], strict=False))


@pytest.mark.parametrize(
    ("flags", "target"),
    [
        ({}, TokenTarget(tokens=1_000_000)),
        ({"policy": "own-share"}, TokenTarget(tokens=700_000)),
        ({"context_len": 4096}, TokenTarget(requests=40, context=4096)),
    ],
)
def test_the_answer_is_the_smallest_budget_that_meets_the_target(flags, target):
    """Every budget below the answer, 0.01 GiB at a time, misses the target; the answer meets it, with
    the pool and the request cap the release resolves there (derive's own values at that budget)."""
    inputs = _kimi_k3(**flags)
    result = min_budget_tokens(inputs, target)
    h = result.budget_hundredths
    assert not any(_met_at(inputs, target, b) for b in range(1, h))
    stages = derive_all(inputs, result.budget_gib)
    assert stages == result.stages
    assert min(s.max_total_num_tokens for s in stages) >= target.tokens_needed
    if target.requests is not None:
        assert min(s.max_running_requests for s in stages) >= target.requests
    assert result.limiting == [s.pp_rank for s in stages if s.kv_limiting] and result.limiting


def test_requests_of_a_long_context_are_bound_by_the_kv_pool():
    """Issue 36's Kimi-Linear (tp 4, pp 2, radix cache off): 64 requests of the config's 1,048,576-token
    context need 64 Mi tokens on every stage; the state pool would serve them far earlier, so the pool
    after the MIN (stage 1's, the limiting one) is what the budget is searched for."""
    g = resolve_dtypes(load_geometry(model_config=str(KIMI_LINEAR), tp_size=4), env={})
    inputs = CapacityInputs(
        geometry=g, budget_gib=60.0, tp_size=4, pp_size=2, disable_radix_cache=True, sglang_version="0.5.23"
    )
    target = TokenTarget(requests=64, context=1_048_576)
    result = min_budget_tokens(inputs, target)
    assert min(s.max_total_num_tokens for s in result.stages) >= 64 * 1_048_576
    assert result.below is not None
    assert min(s.max_total_num_tokens for s in result.below) < 64 * 1_048_576
    assert min(s.max_running_requests for s in result.below) >= 64  # the requests alone were met
    assert result.limiting == [1]


def test_plan_cli_in_tokens_matches_derive_at_its_budget(cli):
    """The JSON answer, and derive at that budget: every stage holds the tokens, 0.01 GiB less does not."""
    res = cli(
        ["plan", "--model", "kimi-k3", "--pp-size", "4", "--target-tokens", "900000", "--format", "json"]
    )
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    budget = doc["min_budget_gib"]["max-share"]
    assert doc["target_tokens"] == 900_000 and doc["policies"]["max-share"]["limiting_stages"] == [3]
    for b, met in ((budget, True), (round(budget - 0.01, 2), False)):
        d = cli(
            ["derive", "--model", "kimi-k3", "--pp-size", "4", "--budget-gib", str(b), "--format", "json"]
        )
        assert (min(r["max_total_num_tokens"] for r in json.loads(d.out)["ranks"]) >= 900_000) is met


def test_plan_cli_in_tokens_text_and_fraction(cli):
    res = cli(
        ["plan", "--model", "kimi-k3", "--target-requests", "16", "--context-len", "4096"]
        + ["--gpu-free-gib", "139", "--weights-gib", "40"]
    )
    assert res.rc == 0, res.err
    assert "target: every stage serves 16 requests of context 4,096" in res.out
    assert "--mem-fraction-static 0." in res.out


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--target-tokens", "100000", "--max-total-tokens", "5000"], "holds at most 5,000 tokens"),
        (["--target-tokens", "100000", "--token-capacity", "4096"], "--token-capacity 4096"),
        (
            ["--target-requests", "64", "--max-running-requests", "32"],
            "capped at 32 by --max-running-requests",
        ),
        (
            ["--target-requests", "64", "--max-mamba-cache-size", "40", "--context-len", "4096"],
            "--max-mamba-cache-size 40 (branch A: a fixed pool of 40 slots at 4 slots per request)",
        ),
        (
            ["--model-config", str(Path(__file__).parent / "fixtures" / "qwen3_next_80b_a3b.json")]
            + ["--pp-size", "1", "--target-requests", "600", "--context-len", "4096"]
            + ["--sglang-version", "0.5.6", "--disable-radix-cache"],
            "the state pool holds 512 slots (512 requests at 1 slots each), which SGLang 0.5.6 sizes from "
            "--max-mamba-cache-size or --max-running-requests here, not from the budget",
        ),
        (["--target-requests", "5000", "--context-len", "4096"], "tops out at 4096"),
    ],
)
def test_unreachable_targets_say_why_in_one_line(cli, argv, why):
    """A cap no budget lifts: one line naming it, exit 2, nothing on stdout."""
    model = [] if "--model-config" in argv else ["--model", "kimi-k3", "--pp-size", "4"]
    res = cli(["plan", *model, *argv])
    assert res.rc == 2 and res.out == "", res.out
    (line,) = res.err.splitlines()
    assert line.startswith("checker plan: error: no budget") and why in line, line


def test_token_targets_refuse_other_modes(cli):
    res = cli(["plan", "--model", "kimi-k3", "--target-tokens", "1000", "--target-requests", "4"])
    assert res.rc == 2 and "not allowed with argument" in res.err
    res = cli(["plan", "--model", "kimi-k3", "--target-tokens", "1000", "--sglang-version", "0.5.22,0.5.23"])
    assert res.rc == 2 and "builtin model of one release" in res.err
