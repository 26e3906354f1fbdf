"""``plan`` in tokens: the smallest budget at which every stage holds N tokens of KV after the MIN over
the pipeline (``--target-tokens N``), or serves R requests of context C (``--target-requests R``, C the
context length the release resolves: ``--context-len``, a launch command's ``--context-length``, else the
config's). Pure arithmetic on the sizing core; no torch.

**Serves R requests of context C** means both, on every stage: ``max_total_num_tokens >= R x C`` (the KV
pool holds R requests at their full context) and ``max_running_requests >= R`` as the release resolves it
from that pool (``clamp(int(T / C x 512), 2048, 4096)``, ``T // 2``, a user's --max-running-requests, then
the state pool's ``K // ratio``: :func:`checker.core.sizing.kv_pool.resolve_one`).

**The search.** The KV pool is not monotone in the budget: in the auto-fit branch the state pool takes
``K`` whole slots of ``rest x r / (1 + r)``, so each new slot takes its bytes from the KV pool at once and
the KV bytes are a saw-tooth (rising with the budget between slots, dropping by one slot's bytes at each).
Its lower edge rises, so the doubling-and-bisection of :mod:`checker.core.sizing.planning` finds *a* budget
that meets the target with 0.01 GiB less missing it; then every budget below it within the window where met
and missed can alternate (:func:`checker.core.sizing.planning.sawtooth_window`) is tried too. So the answer
is the smallest budget that meets the target, and the one 0.01 GiB below misses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from checker.core.errors import BudgetError
from checker.core.sizing.planning import (
    MAX_BUDGET_HUNDREDTHS,
    RequestCap,
    budget_from_hundredths,
    running_request_caps,
    sawtooth_window,
)
from checker.core.sizing.sizing import (
    CapacityInputs,
    StageCapacity,
    kv_token_bound,
    plan_stage,
    resolve_stages,
    size_pool,
)


@dataclass(frozen=True, kw_only=True)
class TokenTarget:
    """``--target-tokens N`` (``tokens``), or ``--target-requests R`` at context C (``requests``,
    ``context``)."""

    tokens: int | None = None
    requests: int | None = None
    context: int | None = None

    @property
    def tokens_needed(self) -> int:
        if self.tokens is not None:
            return self.tokens
        assert self.requests is not None and self.context is not None
        return self.requests * self.context

    def met(self, stages: list[StageCapacity]) -> bool:
        if min(s.max_total_num_tokens for s in stages) < self.tokens_needed:
            return False
        return self.requests is None or min(s.max_running_requests for s in stages) >= self.requests

    @property
    def label(self) -> str:
        if self.tokens is not None:
            return f"every stage holds max_total_num_tokens >= {self.tokens:,} after the MIN"
        return (
            f"every stage serves {self.requests:,} requests of context {self.context:,}: "
            f"max_total_num_tokens >= {self.tokens_needed:,} and max_running_requests >= {self.requests:,}"
        )

    @property
    def flag(self) -> str:
        if self.tokens is not None:
            return f"--target-tokens {self.tokens}"
        return f"--target-requests {self.requests} at context {self.context}"


@dataclass(frozen=True, kw_only=True)
class TokenBudget:
    """The answer for one policy: the smallest budget, every stage there, and 0.01 GiB below."""

    policy: str
    target: TokenTarget
    budget_hundredths: int
    stages: list[StageCapacity]
    below: list[StageCapacity] | None
    below_error: str | None
    evaluations: int
    """Budgets derived to find it (the search's cost)."""

    @property
    def budget_gib(self) -> float:
        return budget_from_hundredths(self.budget_hundredths)

    @property
    def below_budget_gib(self) -> float:
        return budget_from_hundredths(self.budget_hundredths - 1)

    @property
    def limiting(self) -> list[int]:
        return [s.pp_rank for s in self.stages if s.kv_limiting]


def unreachable(inputs: CapacityInputs, target: TokenTarget) -> str | None:
    """Why no budget reaches the target (one line), before any search: a cap on the KV pool
    (--max-total-tokens, --token-capacity) below the tokens it needs, or a bound on max_running_requests
    the budget does not lift (the user's value, the estimate's 4096, the state pool's fixed size)."""
    need = target.tokens_needed
    bound = kv_token_bound(inputs)
    if bound is not None and bound < need:
        flags = ", ".join(
            f"{flag} {value}"
            for flag, value in (
                ("--token-capacity", inputs.token_capacity),
                ("--max-total-tokens", inputs.max_total_tokens),
            )
            if value is not None
        )
        return (
            f"no budget reaches {target.flag}: every stage's KV pool holds at most {bound:,} tokens "
            f"({flags}, page-aligned to {inputs.kv_page_size}) whatever the budget, below the {need:,} "
            "it needs; raise that flag or lower the target"
        )
    if target.requests is None:
        return None
    caps: list[RequestCap] = running_request_caps(inputs)
    if caps:
        cap = min(reversed(caps), key=lambda c: c.limit)
        if target.requests > cap.limit:
            return (
                f"no budget reaches {target.flag}: max_running_requests is capped at {cap.limit} by "
                f"{cap.reason}; lower the target or lift that cap"
            )
    return None


def min_budget_tokens(
    inputs: CapacityInputs, target: TokenTarget, *, policy: str | None = None
) -> TokenBudget:
    """The smallest budget (0.01 GiB steps) at which ``target`` is met on every stage (module docstring)."""
    if policy is not None:
        inputs = replace(inputs, policy=policy)
    why = unreachable(inputs, target)
    if why:
        raise BudgetError(why)
    plans = [plan_stage(inputs, k) for k in range(inputs.pp_size)]
    count = 0

    def derive_at(h: int) -> list[StageCapacity]:
        nonlocal count
        count += 1
        budget = budget_from_hundredths(h)
        return resolve_stages([size_pool(p, inputs, budget) for p in plans], inputs)

    def meets(h: int) -> bool:
        if h <= 0:
            return False
        try:
            return target.met(derive_at(h))
        except BudgetError:
            return False

    lo, hi = 0, 1
    while not meets(hi):
        if hi >= MAX_BUDGET_HUNDREDTHS:
            raise BudgetError(_out_of_reach(inputs, target, derive_at, hi))
        lo, hi = hi, min(2 * hi, MAX_BUDGET_HUNDREDTHS)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    # A budget below ``hi`` on an earlier tooth's peak may meet it too (sawtooth_window).
    window = sawtooth_window(inputs, plans)
    h = hi - 1
    while h > 0 and h >= hi - window:
        if meets(h):
            hi = h
        h -= 1
    stages = derive_at(hi)
    below: list[StageCapacity] | None = None
    below_error: str | None = None
    if hi - 1 <= 0:
        below_error = "0 GiB is not a budget"
    else:
        try:
            below = derive_at(hi - 1)
        except BudgetError as exc:
            below_error = str(exc)
    assert target.met(stages) and (below is None or not target.met(below)), "not a boundary"
    return TokenBudget(
        policy=inputs.resolved_policy,
        target=target,
        budget_hundredths=hi,
        stages=stages,
        below=below,
        below_error=below_error,
        evaluations=count,
    )


def _out_of_reach(
    inputs: CapacityInputs, target: TokenTarget, derive_at: Callable[[int], list[StageCapacity]], h: int
) -> str:
    """The largest budget misses: what it derives there, in one line."""
    try:
        stages = derive_at(h)
    except BudgetError as exc:
        return f"no budget up to {budget_from_hundredths(h):,.0f} GiB reaches {target.flag}: {exc}"
    T = min(s.max_total_num_tokens for s in stages)
    n = min(s.max_running_requests for s in stages)
    K = min(s.max_mamba_cache_size for s in stages)
    ratio = stages[0].slots_per_request
    what = f"max_total_num_tokens {T:,}, max_running_requests {n}"
    if target.requests is not None and T >= target.tokens_needed and K // ratio < target.requests:
        what += (
            f": the state pool holds {K} slots ({K // ratio} requests at {ratio} slots each), which "
            f"{inputs.release.label} sizes from --max-mamba-cache-size or --max-running-requests here, "
            "not from the budget"
        )
    top = budget_from_hundredths(h)
    return f"no budget up to {top:,.0f} GiB reaches {target.flag} ({what}); lower the target"
