"""Capacity planning: the smallest budget a running-request target needs, and the layer partition that
makes the max-share pool largest. Pure arithmetic on the sizing core; no torch.

Budgets are searched as integer hundredths of a GiB and turned into floats with ``h / 100``: that is the
same IEEE double a user gets by typing the decimal on the command line (both are the correctly rounded
value of the decimal), so the budget we print derives exactly what we claim when passed to ``derive``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from checker.core.errors import BudgetError, LayoutError
from checker.core.sizing.budget import sizing_budget
from checker.core.sizing.kv_pool import ESTIMATE_MAX
from checker.core.sizing.partition import default_partition, stage_bounds, stage_partition
from checker.core.sizing.sizing import (
    GIB,
    CapacityInputs,
    StageCapacity,
    StagePlan,
    kv_token_bound,
    plan_stage,
    request_cap_terms,
    requests_per_worker,
    resolve_stages,
    size_pool,
)

# Upper end of the budget search: 2**40 hundredths of a GiB (about 11 EiB) is far beyond any device;
# reaching it means something other than the budget caps the target, which we then report.
MAX_BUDGET_HUNDREDTHS = 2**40


def budget_from_hundredths(h: int) -> float:
    """The float a user gets by typing ``h / 100`` GiB as a decimal (e.g. 837 -> 8.37)."""
    return h / 100


# ---------------------------------------------------------------------------------------------------
# Smallest budget for a max_running_requests target
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestCap:
    """A budget-independent upper bound on max_running_requests, and the input that sets it."""

    limit: int
    reason: str


def running_request_caps(inputs: CapacityInputs) -> list[RequestCap]:
    """Every bound on max_running_requests (per dp worker) that no budget can lift.

    The values come from the sizing core (:func:`checker.core.sizing.sizing.request_cap_terms`, the same
    terms ``size_pool`` and the vectorised sweep use): ``n = min(user or estimate, T // 2, K // ratio)``
    where only K can grow with the budget, and only in the auto-fit branch C.
    """
    dp = inputs.dp_size
    user = inputs.max_running_requests
    T = kv_token_bound(inputs)
    first, half_tokens = request_cap_terms(inputs)
    per_worker = requests_per_worker(inputs)
    caps: list[RequestCap] = []
    if per_worker is not None and first == per_worker:
        caps.append(
            RequestCap(first, f"--max-running-requests {user}" + (f" (// --dp-size {dp})" if dp > 1 else ""))
        )
    else:
        # No user value, or one the release caps by its estimate (0.5.10-0.5.13.post1
        # ``_resolve_max_num_reqs``: min(mrr // dp, estimate)): the estimate binds, so name it.
        way_out = (
            f"{inputs.release.label} caps --max-running-requests {user} by it"
            if user is not None
            else "set --max-running-requests to allow more"
        )
        if first == ESTIMATE_MAX:
            why = "SGLang's default running-request estimate, which tops out at 4096"
        else:
            why = (
                f"SGLang's running-request estimate clamp(int(T / context_len * 512), 2048, 4096) = {first} "
                f"from a KV pool of at most {T:,} tokens ({_bound_flags(inputs)}) and context length "
                f"{inputs.resolved_context_len}"
            )
        caps.append(RequestCap(first, f"{why} ({way_out})"))
    if half_tokens is not None:
        caps.append(
            RequestCap(
                half_tokens,
                f"a KV pool of at most {T:,} tokens ({_bound_flags(inputs)}), which allows at most "
                f"T // 2 = {half_tokens}",
            )
        )
    honours_size = inputs.release.rules.pool_rule in ("branches", "explicit-or-fit")
    if inputs.max_mamba_cache_size is not None and honours_size:
        K = inputs.max_mamba_cache_size // dp
        ratio = inputs.slots_per_request()
        caps.append(
            RequestCap(
                K // ratio,
                f"--max-mamba-cache-size {inputs.max_mamba_cache_size} "
                f"(branch A: a fixed pool of {K} slots at {ratio} slots per request)",
            )
        )
    elif inputs.radix_cache_disabled and per_worker is not None and honours_size:
        # Branch B: a pool of --max-running-requests // dp slots (the release's floor included). Its own
        # bound, not ``first``: where the estimate caps the user's value (0.5.10-0.5.13.post1) the
        # estimate binds, and the tie rule below must not blame branch B for it.
        caps.append(
            RequestCap(
                per_worker // inputs.slots_per_request(),
                f"--max-running-requests {user} with "
                "--disable-radix-cache (branch B: the pool is sized from it, not the budget)",
            )
        )
    return caps


def _bound_flags(inputs: CapacityInputs) -> str:
    flags = [
        f"{flag} {value}"
        for flag, value in (
            ("--token-capacity", inputs.token_capacity),
            ("--max-total-tokens", inputs.max_total_tokens),
        )
        if value is not None
    ]
    return ", ".join(flags)


@dataclass(frozen=True, kw_only=True)
class MinBudget:
    """The answer for one policy: the smallest budget and what every stage derives there and below."""

    policy: str
    target: int
    budget_hundredths: int
    stages: list[StageCapacity]
    """Every stage's derivation at the minimum budget (each meets the target)."""
    below: list[StageCapacity] | None
    """Every stage at 0.01 GiB less (some stage misses the target), or None where that fails to boot."""
    below_error: str | None
    """Why the budget 0.01 GiB below does not boot, when it does not (or is 0 GiB)."""

    @property
    def budget_gib(self) -> float:
        return budget_from_hundredths(self.budget_hundredths)

    @property
    def below_budget_gib(self) -> float:
        return budget_from_hundredths(self.budget_hundredths - 1)


def _derive_at(plans: list[StagePlan], inputs: CapacityInputs, h: int) -> list[StageCapacity]:
    """Every stage at ``h / 100`` GiB after the MIN of their own KV pools (a stage that does not boot
    there raises its BudgetError: the target is missed)."""
    budget = budget_from_hundredths(h)
    return resolve_stages([size_pool(p, inputs, budget) for p in plans], inputs)


def meets(derive_at: Callable[[int], list[StageCapacity]], h: int, target: int) -> bool:
    """Whether every stage boots at ``h / 100`` GiB and derives max_running_requests >= target."""
    if h <= 0:
        return False  # not a budget: CapacityInputs refuses 0 GiB
    try:
        stages = derive_at(h)
    except BudgetError:
        return False  # the pool or one running request does not fit: the target is not met
    return all(s.max_running_requests >= target for s in stages)


def _out_of_reach(derive_at: Callable[[int], list[StageCapacity]], h: int, inputs: CapacityInputs) -> str:
    """Why the largest budget still misses the target, and the way out. The caps that bind whatever
    the budget were named before the search; what is left is a state pool whose size the budget does
    not set: this release sizes it from the flags (``(--max-mamba-cache-size or --max-running-requests
    or 512) // dp``: the ``fixed`` pool, or radix cache off)."""
    try:
        top, half = derive_at(h), derive_at(h // 2)
    except BudgetError:
        return "; lower the target"
    reached = min(s.max_running_requests for s in top)
    if reached != min(s.max_running_requests for s in half):
        return "; lower the target"
    # Up to 0.5.8.post1 a pool the budget does not size falls back to 512 without either flag; from
    # 0.5.9 it auto-fits then, so only a flag given fixes it.
    default = " (512 when neither is given)" if inputs.release.rules.pool_rule != "branches" else ""
    return (
        f": max_running_requests is {reached} there and at half of it alike; {inputs.release.label} sizes "
        f"the state pool from --max-mamba-cache-size or --max-running-requests{default} here, not from the "
        "budget; raise that flag or lower the target"
    )


def bisect_boundary(
    derive_at: Callable[[int], list[StageCapacity]], target: int, lo: int, hi: int
) -> tuple[int, list[StageCapacity], list[StageCapacity] | None, str | None]:
    """Narrow ``lo`` (misses) and ``hi`` (meets) to adjacent hundredths; derive both ends again.

    Returns (hi, the stages at hi, the stages 0.01 GiB below or None, why there are none). Shared by
    the builtin search and the installed-SGLang one, which differ only in ``derive_at``.
    """
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(derive_at, mid, target):
            hi = mid
        else:
            lo = mid
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
    return hi, stages, below, below_error


def sawtooth_window(inputs: CapacityInputs, plans: list[StagePlan]) -> int:
    """How far below the bisection's answer an earlier budget may still meet the target, in hundredths.

    One tooth of the saw-tooth is the budget that buys one more state slot: ``P = slot x (1 + r) / r``
    (the state pool gets ``r / (1 + r)`` of the budget). Over a tooth the KV bytes rise by ``P`` and then
    drop by ``slot``, so each tooth's peak is ``slot / r`` above the last: once one tooth's peak meets the
    target, every tooth after the next ``ceil(r)`` meets it whole. Every budget where met and missed
    alternate, and so any answer of the bisection, lies within ``ceil(r) + 2`` teeth of the smallest budget
    that meets; ``slot`` is the largest stage's charge per slot, with the speculative state per slot."""
    per_slot = max(p.stage_per_req_bytes + p.extra_per_slot_bytes for p in plans)
    slot = per_slot * (1 + (inputs.speculative_num_draft_tokens or 0))
    r = inputs.mamba_full_memory_ratio
    tooth = slot * (1 + r) / r
    return math.ceil((math.ceil(r) + 2) * tooth / GIB * 100) + 2


def min_budget(inputs: CapacityInputs, target: int, *, policy: str | None = None) -> MinBudget:
    """The smallest budget, in hundredths of a GiB, at which every stage derives max_running_requests
    >= ``target`` under ``policy`` (None: ``inputs.policy``, which None in turn makes the release's own).

    Search: double an upper bracket until the target is met, then bisect with the invariant
    "``lo`` misses, ``hi`` meets" until they are 0.01 GiB apart. That invariant alone guarantees the
    promised boundary (met at the answer, missed 0.01 GiB below) whatever the function's shape. The
    state pool's K is monotone in the budget (``B = rest * r / (1 + r) * 2**30`` is a chain of IEEE
    operations with positive constants, and so are ``- per_slot``, ``// per_slot`` and ``int()``), but
    where the KV pool binds the request cap (``T // 2``, the estimate from T) "met" need not be: each new
    state slot takes its bytes from the KV pool at once, a saw-tooth. So every budget within
    :func:`sawtooth_window` below the bisection's answer is tried too, and the smallest that meets wins.

    The final two evaluations re-derive both ends through the same core, so the returned stages are
    exactly what ``derive`` prints at those budgets.
    """
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise BudgetError(f"--target-max-running-requests {target} must be a positive integer")
    if policy is not None:
        inputs = replace(inputs, policy=policy)
    policy = inputs.resolved_policy
    plans = [plan_stage(inputs, k) for k in range(inputs.pp_size)]
    # Refusals no budget can cure (a stage charged 0 bytes, a fixed pool that floors to 0 per dp
    # worker, ...) surface first, as the core's own error: probe every stage at the largest budget and
    # let anything but a BudgetError through.
    for p in plans:
        try:
            size_pool(p, inputs, budget_from_hundredths(MAX_BUDGET_HUNDREDTHS))
        except BudgetError:
            pass
    caps = running_request_caps(inputs)
    if caps:
        # The tightest cap binds; on a tie name the later, branch-specific one (it says why).
        cap = min(reversed(caps), key=lambda c: c.limit)
        if target > cap.limit:
            raise BudgetError(
                f"no budget reaches --target-max-running-requests {target}: max_running_requests is "
                f"capped at {cap.limit} by {cap.reason}; lower the target or lift that cap"
            )

    def derive_at(h: int) -> list[StageCapacity]:
        return _derive_at(plans, inputs, h)

    lo, hi = 0, 1  # invariant: lo misses (0 GiB is no budget), hi is the candidate
    while not meets(derive_at, hi, target):
        if hi >= MAX_BUDGET_HUNDREDTHS:
            raise BudgetError(
                f"no budget up to {budget_from_hundredths(hi):,.0f} GiB reaches "
                f"--target-max-running-requests {target} under --policy {policy}"
                + _out_of_reach(derive_at, hi, inputs)
            )
        lo, hi = hi, min(2 * hi, MAX_BUDGET_HUNDREDTHS)
    hi, stages, below, below_error = bisect_boundary(derive_at, target, lo, hi)
    lowest = hi
    for h in range(hi - 1, max(hi - sawtooth_window(inputs, plans), 0) - 1, -1):
        if meets(derive_at, h, target):  # an earlier tooth's peak (see sawtooth_window)
            lowest = h
    if lowest != hi:
        hi, stages, below, below_error = bisect_boundary(derive_at, target, lowest - 1, lowest)
    # Re-checked through the same core: met at hi, missed at hi - 1.
    assert all(s.max_running_requests >= target for s in stages), "bisection lost its invariant"
    assert below is None or any(s.max_running_requests < target for s in below), "not a boundary"
    return MinBudget(
        policy=policy,
        target=target,
        budget_hundredths=hi,
        stages=stages,
        below=below,
        below_error=below_error,
    )


@dataclass(frozen=True, kw_only=True)
class PartitionBounds:
    """Per-stage layer-count bounds around the even split."""

    lower: int
    upper: int


def partition_bounds(num_hidden_layers: int, pp_size: int, slack: int) -> PartitionBounds:
    """``floor(L/P) - slack`` to ``ceil(L/P) + slack`` layers per stage.

    A lower bound that would reach 0 or below is raised to 1: a stage with no layers does no work in
    the pipeline and only adds a hop, and SGLang's slicing was never meant for empty stages. The even
    split always lies inside these bounds, so a partition always exists.
    """
    if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
        raise LayoutError(f"--partition-slack {slack} must be an integer >= 0")
    even = stage_partition(num_hidden_layers, pp_size)  # validates pp size against the layers
    return PartitionBounds(
        lower=max(1, min(even) - slack),
        upper=min(num_hidden_layers, max(even) + slack),
    )


def stage_linear_counts(linear_layer_ids: tuple[int, ...], parts: tuple[int, ...]) -> list[int]:
    ids = set(linear_layer_ids)
    return [sum(1 for i in range(s, e) if i in ids) for s, e in stage_bounds(parts)]


@dataclass(frozen=True, kw_only=True)
class SuggestedPartition:
    partition: tuple[int, ...]
    largest_stage_linear_layers: int
    stage_linear_layers: list[int]
    default_partition: tuple[int, ...]
    default_largest_stage_linear_layers: int
    default_stage_linear_layers: list[int]
    bounds: PartitionBounds

    @property
    def env(self) -> str:
        """The SGLANG_PP_LAYER_PARTITION value every node must set."""
        return ",".join(str(p) for p in self.partition)


_INF = float("inf")


def _suffix_table(
    prefix: list[int], pp_size: int, bounds: PartitionBounds, max_linear: int, default: tuple[int, ...]
) -> list[list[float]]:
    """``cost[k][i]``: the least ``sum |parts[j] - default[j]|`` over stages k..P-1 covering layers
    [i, L), with every stage inside ``bounds`` and holding at most ``max_linear`` linear layers
    (infinity where no such completion exists). ``prefix[i]`` counts linear layers below layer i."""
    L = len(prefix) - 1
    cost = [[_INF] * (L + 1) for _ in range(pp_size + 1)]
    cost[pp_size][L] = 0
    for k in range(pp_size - 1, -1, -1):
        for i in range(L + 1):
            best = _INF
            for size in range(bounds.lower, min(bounds.upper, L - i) + 1):
                rest = cost[k + 1][i + size]
                if rest == _INF or prefix[i + size] - prefix[i] > max_linear:
                    continue
                best = min(best, abs(size - default[k]) + rest)
            cost[k][i] = best
    return cost


def suggest_partition(
    *, num_hidden_layers: int, linear_layer_ids: tuple[int, ...], pp_size: int, slack: int = 1
) -> SuggestedPartition:
    """The partition that minimises the largest stage's linear-layer count within the slack bounds.

    Exact, by lexicographic optimisation of (largest count, distance to the even split, the parts):
    1. Binary search over the largest count M: M is achievable iff a DP over layer prefixes finds a
       partition with every stage within bounds and at most M linear layers; achievability is monotone
       in M (a partition for M works for M + 1), so the search finds the least M.
    2. At that M the same DP gives, for every (stage, first layer), the least distance to the even split
       of any completion; walking forward and taking at each stage the *smallest* size that keeps the
       total at that optimum yields the lexicographically smallest of the closest partitions.

    Ties: among partitions with the least M, the one with the least ``sum |parts[k] - default[k]|``
    (``default`` is SGLang's even split, extra layers on the last stages), then the lexicographically
    smallest list of counts.
    """
    bounds = partition_bounds(num_hidden_layers, pp_size, slack)
    default = default_partition(num_hidden_layers, pp_size)
    ids = set(linear_layer_ids)
    prefix = [0]
    for i in range(num_hidden_layers):
        prefix.append(prefix[-1] + (1 if i in ids else 0))

    lo, hi = 0, max(stage_linear_counts(linear_layer_ids, default))  # the even split achieves hi
    while lo < hi:
        mid = (lo + hi) // 2
        if _suffix_table(prefix, pp_size, bounds, mid, default)[0][0] < _INF:
            hi = mid
        else:
            lo = mid + 1
    best_max = hi
    cost = _suffix_table(prefix, pp_size, bounds, best_max, default)
    assert cost[0][0] < _INF, "the even split lies within the bounds"

    parts: list[int] = []
    i = 0
    for k in range(pp_size):
        for size in range(bounds.lower, min(bounds.upper, num_hidden_layers - i) + 1):
            rest = cost[k + 1][i + size]
            if (
                rest < _INF
                and prefix[i + size] - prefix[i] <= best_max
                and abs(size - default[k]) + rest == cost[k][i]
            ):
                parts.append(size)
                i += size
                break
    result = tuple(parts)
    assert sum(result) == num_hidden_layers and len(result) == pp_size
    return SuggestedPartition(
        partition=result,
        largest_stage_linear_layers=best_max,
        stage_linear_layers=stage_linear_counts(linear_layer_ids, result),
        default_partition=default,
        default_largest_stage_linear_layers=max(stage_linear_counts(linear_layer_ids, default)),
        default_stage_linear_layers=stage_linear_counts(linear_layer_ids, default),
        bounds=bounds,
    )


# ---------------------------------------------------------------------------------------------------
# The --mem-fraction-static that reaches a budget
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MemFraction:
    """The smallest --mem-fraction-static (to 0.001) whose total_rest_memory reaches a budget."""

    value: float | None
    """None: not even 1.0 reaches the budget."""
    formula: str
    """How the release computes total_rest_memory at ``value`` (or what 1.0 leaves, when none reaches)."""
    budget_gib: float


def min_mem_fraction(
    sglang_version: str | None, *, free_before_gib: float, weights_gib: float, budget_gib: float
) -> MemFraction:
    """Solve SGLang's ``total_rest_memory(f) >= budget`` for f in 0.001 steps, each step checked with the
    release's own formula (:func:`checker.core.sizing.budget.sizing_budget`)."""

    def budget_gib_at(thousandths: int) -> float | None:
        try:
            return sizing_budget(
                sglang_version,
                free_before_gib=free_before_gib,
                weights_gib=weights_gib,
                mem_fraction_static=thousandths / 1000,
            ).budget_gib
        except BudgetError:
            return None

    lo, hi = 1, 1000  # the budget grows with f: bisect for the first f whose budget reaches budget_gib
    top = budget_gib_at(hi)
    if top is None or top < budget_gib:
        avail = free_before_gib - weights_gib
        return MemFraction(
            value=None,
            formula=f"even 1.0 leaves {top or 0:.2f} GiB ({avail:.2f} GiB free after the weights)",
            budget_gib=budget_gib,
        )
    while lo < hi:
        mid = (lo + hi) // 2
        r = budget_gib_at(mid)
        if r is not None and r >= budget_gib:
            hi = mid
        else:
            lo = mid + 1
    formula = sizing_budget(
        sglang_version,
        free_before_gib=free_before_gib,
        weights_gib=weights_gib,
        mem_fraction_static=hi / 1000,
    ).formula
    return MemFraction(value=hi / 1000, formula=formula, budget_gib=budget_gib)
