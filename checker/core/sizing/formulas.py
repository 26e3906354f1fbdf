"""SGLang's capacity arithmetic, written once, for one budget or for a tensor of budgets.

Each function is one sizing rule of the release: the state pool and what it leaves for KV
(:func:`handle_max_mamba_cache`), a stage's own KV capacity (:func:`profile_tokens`), and the pool and
request cap after the MIN over stages (:func:`resolve_max_num_reqs`). The scalar core
(:mod:`checker.core.sizing.sizing`, :mod:`checker.core.sizing.kv_pool`) calls them with :data:`SCALAR` on
Python
numbers and raises the release's refusal where a value does not boot; the sweep
(:mod:`checker.device.sweep`) calls them with torch ops on a float64 tensor of budgets and marks those
budgets instead. So the two paths agree because they are one, not because a test says so (the equality
tests stay, as a guard on the ops).

Python's operators mean the same on a Python number and on a tensor here: ``a // b`` of floats is
CPython's floor division on both (``torch.floor_divide`` on float64 runs the same fmod-and-correct
algorithm), int64 products are exact, and a Python int constant meets a float64 tensor as the nearest
double, as in Python. What the two do not share (``int()``, ``float()``, ``min``, a conditional) goes
through :class:`Ops`. Every byte count is formed as an exact integer and rounded to float once, then
divided by 2**30 (exact), which is what Python's ``int / int`` gives SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from checker.core.errors import FlagError, LayoutError

if TYPE_CHECKING:  # sizing imports this module: its types only for annotations
    from checker.core.sizing.sizing import CapacityInputs, StagePlan

GIB = 2**30
ESTIMATE_MIN, ESTIMATE_MAX = 2048, 4096

Num = Any
"""A Python int or float (the scalar core), or a torch tensor with one entry per budget (the sweep)."""


class Ops(Protocol):
    """What a scalar and a tensor of budgets do differently."""

    def full(self, value: int) -> Num:
        """A budget-independent int, at every budget."""

    def to_int(self, x: Num) -> Num:
        """``int(x)`` of a float: toward zero."""

    def to_float(self, x: Num) -> Num:
        """``float(x)`` of an int: the nearest double."""

    def minimum(self, a: Num, b: Num) -> Num: ...

    def maximum(self, a: Num, b: Num) -> Num: ...

    def where(self, cond: Num, a: Num, b: Num) -> Num: ...

    def exact_slots(self, slots: Num, rest: Num, pp_rank: int) -> None:
        """Refuse a slot count a float64 no longer holds exactly (the sweep; Python's ints are exact)."""


class _Scalar:
    def full(self, value: int) -> Num:
        return value

    def to_int(self, x: Num) -> Num:
        return int(x)

    def to_float(self, x: Num) -> Num:
        return float(x)

    def minimum(self, a: Num, b: Num) -> Num:
        return min(a, b)

    def maximum(self, a: Num, b: Num) -> Num:
        return max(a, b)

    def where(self, cond: Num, a: Num, b: Num) -> Num:
        return a if cond else b

    def exact_slots(self, slots: Num, rest: Num, pp_rank: int) -> None:
        return None


SCALAR: Ops = _Scalar()


# ------------------------------------------------------------------------------------------------------
# The state pool (KVCacheConfigurator._handle_max_mamba_cache and its predecessors)
# ------------------------------------------------------------------------------------------------------


def mamba_budget_bytes(budget_gib: Num, ratio: float) -> Num:
    """Bytes the auto-fit branch hands the state pool: ``((rest * r) / (1 + r)) * 2**30``, left to right
    as Python evaluates it (a float, or a float64 tensor of them)."""
    return budget_gib * ratio / (1 + ratio) * GIB


@dataclass(frozen=True)
class StatePool:
    branch: str
    """A: --max-mamba-cache-size; B: from the request cap; C: auto-fit from the budget."""
    K: Num
    """max_mamba_cache_size: state slots (0 or less: the release refuses the budget)."""
    kv_gib: Num
    """What the state pool leaves of the budget for the KV pool (0 or less: the release refuses it)."""
    intermediate_bytes: Num
    """The speculative intermediate state reserved beside the pool."""
    reserved: Num
    """Slots whose speculative state is reserved (0.5.13+ joint reservation), else 0."""


def speculative_draft_tokens(inputs: CapacityInputs, plan: StagePlan) -> int:
    """D: ``reserves_spec_state = has_spec_dec and not replayssm_active``, so no speculative intermediate
    state is reserved under the ReplaySSM ring (checker.core.sizing.replay)."""
    return 0 if plan.replayssm_active else inputs.speculative_num_draft_tokens or 0


def handle_max_mamba_cache(
    ops: Ops, inputs: CapacityInputs, plan: StagePlan, rest: Num, *, user: int | None
) -> StatePool:
    """K and the GiB left for the KV pool at budget ``rest`` (GiB), first matching branch in SGLang's
    order (see docs/sglang-releases.md); ``user``: ``--max-running-requests // dp`` as the release reads
    it. Budget-independent refusals raise here, on both paths."""
    rules = inputs.release.rules
    pad = 1 if rules.padding_slot else 0
    dp = inputs.dp_size
    ratio = plan.slots_per_request
    spr, extra = plan.stage_per_req_bytes, plan.extra_per_slot_bytes
    per_slot = spr + extra
    fixed = plan.replayssm_fixed_bytes  # the GDN ReplaySSM ring, charged once
    D = speculative_draft_tokens(inputs, plan)
    pool_rule = rules.pool_rule
    no_radix = inputs.radix_cache_disabled
    r = inputs.mamba_full_memory_ratio
    # ``state_bytes``: what the release takes off the budget for the pool itself (None: (K + pad) slots).
    state_bytes: Num | None = None
    reserved: Num = 0
    k_fixed = 0  # K where no budget changes it (branches A and B)
    # 0.5.8-0.5.12.post1 take per_req * (mrr // dp) * D off the budget before any branch (spec_reserve
    # "up-front"); 0.5.7 takes per_req * mrr * D off in the auto-fit branch only ("auto-fit-raw").
    up_front = D * (user or 0) if rules.spec_reserve == "up-front" else 0
    if up_front:
        rest = rest - spr * up_front / GIB  # int bytes / 2**30: one rounding, as in SGLang
    joint = bool(D) and rules.spec_reserve == "joint"

    if pool_rule == "fixed" or (pool_rule == "ratio" and (no_radix or spr == 0)):
        # Up to 0.5.6.post2 with the radix cache off (always off before 0.5.3.post2): K is
        # --max-mamba-cache-size, else --max-running-requests, else 512, then // dp (0.5.3.post2+: for
        # hybrid GDN only, handle_max_mamba_cache ``if self.hybrid_gdn_config is not None``).
        chosen = inputs.max_mamba_cache_size or inputs.max_running_requests or 512
        split = dp if inputs.splits_over_dp() else 1
        branch, k_fixed = ("A" if inputs.max_mamba_cache_size else "B"), chosen // split
        K = ops.full(k_fixed)
        if pool_rule == "ratio":
            state_bytes = K * (spr * (1 + D))  # handle_max_mamba_cache charges (1 + D) per slot
    elif pool_rule == "ratio":
        # int((B // per_req) // (1 + D)), then // dp; an explicit --max-mamba-cache-size is ignored.
        B = mamba_budget_bytes(rest, r)
        slots = B // spr // (1 + D)
        ops.exact_slots(slots, rest, plan.pp_rank)
        split = dp if inputs.splits_over_dp() else 1
        branch, K = "C", ops.to_int(slots) // split
        state_bytes = K * (spr * (1 + D))
    elif pool_rule == "explicit-or-fit" and (no_radix or inputs.max_mamba_cache_size is not None):
        # 0.5.7-0.5.8.post1 handle_max_mamba_cache: (mmcs or mrr or 512) // dp.
        chosen = inputs.max_mamba_cache_size or inputs.max_running_requests or 512
        branch, k_fixed = ("A" if inputs.max_mamba_cache_size else "B"), chosen // dp
        K = ops.full(k_fixed)
    elif pool_rule == "branches" and inputs.max_mamba_cache_size is not None:
        branch, k_fixed = "A", inputs.max_mamba_cache_size // dp
        K = ops.full(k_fixed)
        if joint and user is not None:
            reserved = min(user, k_fixed // ratio) + pad
    elif pool_rule == "branches" and no_radix and user is not None:
        branch, K = "B", ops.full(user)
        reserved = user + pad if joint else 0
    else:
        branch = "C"
        if spr <= 0:
            # Only the auto-fit branch asserts a positive per-request charge (``assert stage_per_req
            # > 0``); an explicit pool size (A, B) starts with a zero charge.
            raise LayoutError(
                f"stage {plan.pp_rank} holds no linear layers, so --policy {inputs.resolved_policy} "
                "charges it 0 bytes per request and SGLang cannot auto-fit its pool (it asserts a positive "
                "charge); use max-share, another partition, or --max-mamba-cache-size"
            )
        if D and rules.spec_reserve == "auto-fit-raw":
            # 0.5.7: per_req * --max-running-requests * D, the user's value not split over dp.
            rest = rest - spr * inputs.max_running_requests * D / GIB  # type: ignore[operator]
        B = mamba_budget_bytes(rest, r)
        if joint and pad:
            # (B - int) - int: Python converts each int to the nearest double.
            slots = (B - spr * (1 + D) - extra) // (spr * (1 + D / ratio) + extra)
        elif joint:
            slots = B // (spr * (1 + D / ratio))  # 0.5.13-0.5.16: no padding slot, no extra state
        elif pad:
            # One padding slot (the pool allocates K + 1); the GDN ring charged once comes off first.
            slots = (B - fixed - per_slot) // per_slot
        else:
            slots = B // spr
        ops.exact_slots(slots, rest, plan.pp_rank)
        K = ops.to_int(slots)
        if joint and user is not None:
            reserved = ops.minimum(K // ratio, user) + pad
    if branch == "A" and k_fixed <= 0:
        # Not a budget problem: the user's pool size is split over the dp workers and floors to 0.
        raise FlagError(
            f"--max-mamba-cache-size {inputs.max_mamba_cache_size} split over --dp-size {dp} gives "
            f"K=0 state slots per dp worker; set it to at least {dp}"
        )

    if state_bytes is not None:
        # 0.5.3.post2-0.5.6.post2: total_rest_memory - K * per_req * (1 + D) / 2**30, in one step.
        intermediate = K * (spr * D)
        kv_gib = rest - ops.to_float(state_bytes) / GIB
    elif rules.spec_reserve == "joint":
        intermediate = reserved * (spr * D) if D else 0
        # SGLang takes the spec reservation off first, then the state: total_rest_memory -
        # intermediate / 2**30, then - ((K + pad) * per_slot + fixed) / 2**30.
        left = rest - ops.to_float(intermediate) / GIB if D else rest
        kv_gib = left - ops.to_float((K + pad) * per_slot + fixed) / GIB
    else:
        # 0.5.7-0.5.12.post1: the reservation already came off ``rest`` above.
        if rules.spec_reserve == "up-front":
            intermediate = spr * up_front
        elif D and branch == "C":
            intermediate = spr * inputs.max_running_requests * D  # type: ignore[operator]
        else:
            intermediate = 0
        kv_gib = rest - ops.to_float((K + pad) * per_slot) / GIB
    return StatePool(branch=branch, K=K, kv_gib=kv_gib, intermediate_bytes=intermediate, reserved=reserved)


# ------------------------------------------------------------------------------------------------------
# A stage's own KV capacity (calculate_pool_sizes / _profile_available_bytes, then the cap and alignment)
# ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OwnTokens:
    profiled: Num
    """The profile: KV bytes over the cell (or --token-capacity), with an EAGLE target's headroom."""
    estimate_from: Num
    """What the release's request estimate reads when it reads the stage's own: before the headroom."""
    own: Num
    """After --max-total-tokens and page alignment: what the stage hands the MIN."""


def estimate(ops: Ops, tokens: Num, context_len: int) -> Num:
    """``clamp(int(T / context_len * 512), 2048, 4096)``: float division, as every release writes it."""
    return ops.maximum(
        ops.minimum(ops.to_int(ops.to_float(tokens) / context_len * 512), ESTIMATE_MAX), ESTIMATE_MIN
    )


def profile_tokens(
    ops: Ops,
    *,
    kv_gib: Num,
    cell: int,
    profile: str,
    order: str,
    no_cell_tokens: int,
    token_capacity: int | None,
    max_total_tokens: int | None,
    page_size: int,
    context_len: int,
    headroom: int = 0,
    max_running_requests: int | None = None,
    K: Num = 0,
    slots_per_request: int = 1,
) -> OwnTokens:
    """A stage's own capacity from the GiB the state pool left (steps 2-3 of checker.core.sizing.kv_pool).
    ``profile``: the release's division ("float-floor": ``int(rest * 2**30 // cell)``, else
    ``int(rest * 2**30) // cell``); ``order``: "configurator" aligns then caps, else caps then aligns;
    ``no_cell_tokens``: what a stage with a 0-byte cell reports; ``headroom``: an EAGLE target's draft and
    verify tokens per request up to 0.5.6.post2 (0 otherwise)."""
    if token_capacity is not None:
        profiled = ops.full(token_capacity)
    elif cell == 0:
        profiled = ops.full(no_cell_tokens)
    elif profile == "float-floor":
        profiled = ops.to_int(kv_gib * GIB // cell)
    else:
        profiled = ops.to_int(kv_gib * GIB) // cell
    estimate_from = profiled
    if headroom:
        # model_runner.py init_memory_pool (up to 0.5.6.post2): draft_runner_cache_size = T + max_num_reqs *
        # steps * topk + max_num_reqs * draft_tokens + 100, which becomes the target's token count; the
        # requests are --max-running-requests or the estimate from the profile, capped by the state pool.
        pool = (
            ops.full(max_running_requests) if max_running_requests else estimate(ops, profiled, context_len)
        )
        request_slots = ops.minimum(pool, K // slots_per_request)
        profiled = profiled + request_slots * headroom + 100
    if order == "configurator":
        # calculate_pool_sizes aligns; _apply_token_constraints caps (and MINs, then re-aligns).
        own = profiled // page_size * page_size
        if max_total_tokens is not None:
            own = ops.minimum(own, max_total_tokens)
    else:
        own = ops.minimum(profiled, max_total_tokens) if max_total_tokens is not None else profiled
        own = own // page_size * page_size
    return OwnTokens(profiled=profiled, estimate_from=estimate_from, own=own)


# ------------------------------------------------------------------------------------------------------
# After the MIN: the pool every stage keeps, and resolve_max_num_reqs
# ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    T: Num
    """max_total_num_tokens: the pool after the MIN (0 or less: the release refuses to start)."""
    requests: Num
    """max_running_requests (0 or less: no request fits)."""
    micro: Num
    """pp_max_micro_batch_size."""


def resolve_max_num_reqs(
    ops: Ops,
    *,
    rule: str,
    order: str,
    pp_size: int,
    page_size: int,
    context_len: int,
    profiled: Num,
    estimate_from: Num,
    own: Num,
    minimum: Num,
    K: Num,
    slots_per_request: int,
    requests_per_worker: int | None,
    user_max_running_requests: int | None,
    user_micro: int | None,
) -> Resolved:
    """Steps 4-5 of checker.core.sizing.kv_pool for one stage, given the world's MIN of own capacities
    (its own when pp == 1). ``rule``: ``ReleaseRules.request_cap``."""
    synced = minimum if pp_size > 1 else own
    if order == "configurator":
        aligned = profiled // page_size * page_size
        T = ops.where(synced != aligned, synced // page_size * page_size, aligned)
    else:
        T = synced
    user = requests_per_worker
    if rule == "tp-worker":
        # model_runner.py init_memory_pool / tp_worker.py (up to 0.5.9): the request pool is the user's
        # value or the estimate from the stage's OWN profile; then min(mrr // dp or T // 2, that pool).
        pool = ops.full(user_max_running_requests) if user_max_running_requests is not None else None
        if pool is None:
            pool = estimate(ops, estimate_from, context_len)
        first = ops.full(user) if user is not None else T // 2
        n = ops.minimum(first, pool)
    elif rule == "estimate":  # 0.5.10-0.5.13.post1 _resolve_max_num_reqs
        est = estimate(ops, T, context_len)
        n = ops.minimum(est, user) if user is not None else ops.minimum(est, T // 2)
    else:  # 0.5.14+ resolve_max_num_reqs
        first = ops.full(user) if user is not None else estimate(ops, T, context_len)
        n = ops.minimum(first, T // 2)
    n = ops.minimum(n, K // slots_per_request)
    micro = ops.full(user_micro) if user_micro else ops.maximum(n // pp_size, 1)
    return Resolved(T=T, requests=n, micro=micro)
