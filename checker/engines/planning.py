"""``plan --engine sglang|both``: the planning answers re-derived by the installed SGLang.

The builtin search (:func:`checker.core.sizing.planning.min_budget`) finds the boundary with the checker's
model; here the same boundary ("met at the answer, missed 0.01 GiB below") is searched again with SGLang's own
derivation as the predicate, starting from the builtin's answer, so SGLang's answer is exact even when
the model drifts (the predicate is monotone in the budget for the same reasons the builtin's is: the
code is the same arithmetic). Under ``both`` any difference, in the budget or in a stage's values at
the builtin's budget, is a drift finding.
"""

from __future__ import annotations

from checker.core.errors import BudgetError
from checker.core.sizing.planning import (
    MAX_BUDGET_HUNDREDTHS,
    MinBudget,
    bisect_boundary,
    budget_from_hundredths,
    meets,
)
from checker.core.sizing.sizing import StageCapacity
from checker.engines import PreparedEngine
from checker.engines.drift import Drift, Outcome, compare


def derive_at(engine: PreparedEngine, pp_size: int, h: int) -> list[StageCapacity]:
    budget = budget_from_hundredths(h)
    return [engine.derive(k, budget) for k in range(pp_size)]


def engine_min_budget(engine: PreparedEngine, pp_size: int, start: MinBudget) -> MinBudget:
    """The engine's own smallest budget for ``start.target``, searched from the builtin's answer."""
    target = start.target
    h = start.budget_hundredths

    def at(hundredths: int) -> list[StageCapacity]:
        return derive_at(engine, pp_size, hundredths)

    if meets(at, h, target):
        hi, step = h, 1  # walk down until a budget misses: then lo misses, hi meets
        lo = hi - step
        while meets(at, lo, target):
            hi, step = lo, step * 2
            lo = max(hi - step, 0)
    else:
        lo, step = h, 1  # walk up until a budget meets
        hi = lo + step
        while not meets(at, hi, target):
            if hi >= MAX_BUDGET_HUNDREDTHS:
                raise BudgetError(
                    f"SGLang reaches --target-max-running-requests {target} at no budget up to "
                    f"{budget_from_hundredths(hi):g} GiB; lower the target"
                )
            lo, step = hi, step * 2
            hi = min(lo + step, MAX_BUDGET_HUNDREDTHS)
    hi, stages, below, below_error = bisect_boundary(at, target, lo, hi)
    return MinBudget(
        policy=start.policy,
        target=target,
        budget_hundredths=hi,
        stages=stages,
        below=below,
        below_error=below_error,
    )


def min_budget_drift(builtin: MinBudget, sglang: MinBudget, shadow: PreparedEngine) -> list[Drift]:
    """Where the two answers differ: the budget itself, then every stage at the builtin's budget."""
    drifts: list[Drift] = []
    if builtin.budget_hundredths != sglang.budget_hundredths:
        drifts.append(Drift(-1, "min_budget_gib", f"{builtin.budget_gib:.2f}", f"{sglang.budget_gib:.2f}"))
    at = builtin.budget_gib
    for s in builtin.stages:
        try:
            other = Outcome(s.pp_rank, stage=shadow.derive(s.pp_rank, at))
        except BudgetError as exc:
            other = Outcome(s.pp_rank, error=exc)
        drifts += compare(Outcome(s.pp_rank, stage=s), other)
    return drifts
