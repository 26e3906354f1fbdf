"""Budget sweeps vectorised with torch: one stage's three checked values at every budget at once.

:func:`derive_sweep` is bit-identical to the scalar core (``checker.core.sizing.sizing.size_pool``) budget by
budget: it reuses :func:`~checker.core.sizing.sizing.plan_stage` for the budget-independent half and repeats
``size_pool``'s float64 arithmetic one IEEE operation at a time, in the same order, on float64 tensors.
``torch.div(..., rounding_mode="floor")`` on float64 runs CPython's own float ``//`` algorithm
(fmod, then a correction step), checked against ``//`` on millions of values, so the pool size K lands
on the same slot, including at the budgets where it steps.

:func:`local_sweep` is what one stage derives for every policy; a sweep is the stack of those over
stages, however it was gathered, and :func:`analyse` reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from checker.core.errors import BudgetError, ConfigError, FlagError, LayoutError
from checker.core.sizing.kv_pool import INT64_MAX, code_of, draft_layers_of, kv_dtype_bytes, stage_cell
from checker.core.sizing.sizing import (
    BOOT_FAILURE,
    CHECKED_VALUES,
    GIB,
    CapacityInputs,
    StagePlan,
    plan_stage,
    requests_per_worker,
    size_pool,
    spec_headroom,
)
from checker.core.sizing.sweep import PolicyFlags, flags_from_stack, summarise

if TYPE_CHECKING:  # the sweep's tables load with the sweep; check derives one budget without them
    from checker.core.sizing.sweep import PolicyFlags, SweepSummary

# Products below are formed in float64 from exact operands, so each is rounded once, exactly as
# Python's int product followed by int / 2**30 (correctly rounded) is. That holds while the operands
# are integers float64 represents exactly.
_EXACT = 2**53


def _state_sweep(
    inputs: CapacityInputs, plan: StagePlan, rest: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One stage's state pool per budget: (K, the GiB left for the KV pool), as ``size_pool`` sizes them.
    Budget-independent refusals raise (probed on the scalar core, which words them)."""
    rules = inputs.release.rules
    pad = 1 if rules.padding_slot else 0
    dp = inputs.dp_size
    ratio = plan.slots_per_request
    spr, extra = plan.stage_per_req_bytes, plan.extra_per_slot_bytes
    per_slot = spr + extra
    fixed = plan.replayssm_fixed_bytes  # the GDN ReplaySSM ring, charged once (checker.core.sizing.replay)
    # No speculative intermediate state is reserved under the ReplaySSM ring, as in size_pool.
    D = 0 if plan.replayssm_active else inputs.speculative_num_draft_tokens or 0
    if rest.numel():
        # Budget-independent refusals (a stage the policy charges 0 bytes in the auto-fit branch, a
        # fixed pool that floors to 0 per dp worker, 0 requests per worker before 0.5.23) are the
        # scalar core's to make and to word: probe it at one budget.
        try:
            size_pool(plan, inputs, float(rest[0]))
        except BudgetError:
            pass
    user = requests_per_worker(inputs)  # the same per-release floor as the scalar core
    if per_slot >= _EXACT or spr * max(D, 1) >= _EXACT or fixed >= _EXACT:
        raise BudgetError(
            f"stage {plan.pp_rank} charges {per_slot:,} bytes per slot, beyond what a sweep derives "
            "exactly (2**53); use the derive command for this geometry"
        )
    zeros = torch.zeros_like(rest, dtype=torch.int64)

    # The pool size K, first matching branch of SGLang's KVCacheConfigurator._handle_max_mamba_cache
    # (sglang/srt/mem_cache/kv_cache_configurator.py), as size_pool does it.
    reserved: torch.Tensor | int = 0
    if (inputs.max_mamba_cache_size or 0) >= _EXACT or (user or 0) >= _EXACT:
        raise FlagError(
            "--max-mamba-cache-size / --max-running-requests of 2**53 or more are beyond what a sweep "
            "derives exactly; use the derive command"
        )
    state_bytes: torch.Tensor | None = None  # 0.5.3.post2-0.5.6.post2: K * spr * (1 + D) in one step
    pool_rule = rules.pool_rule
    no_radix = inputs.radix_cache_disabled
    # 0.5.8-0.5.12.post1: per_req * (mrr // dp) * D off the budget before any branch.
    up_front = D * (user or 0) if rules.spec_reserve == "up-front" else 0
    if up_front:
        rest = rest - float(spr * up_front) / GIB  # int bytes / 2**30, one rounding, as in SGLang
    raw_reserve = 0.0  # 0.5.7: per_req * mrr * D, in the auto-fit branch only
    joint = bool(D) and rules.spec_reserve == "joint"
    if pool_rule == "fixed" or (pool_rule == "ratio" and (no_radix or spr == 0)):
        # Up to 0.5.6.post2 with the radix cache off: (mmcs or mrr or 512) // dp, whatever the budget.
        split = dp if inputs.splits_over_dp() else 1
        K = zeros + (inputs.max_mamba_cache_size or inputs.max_running_requests or 512) // split
        if pool_rule == "ratio":
            state_bytes = (K * (spr * (1 + D))).to(torch.float64)
    elif pool_rule == "ratio":
        split = dp if inputs.splits_over_dp() else 1
        B = rest * inputs.mamba_full_memory_ratio / (1 + inputs.mamba_full_memory_ratio) * GIB
        K_f = torch.div(torch.div(B, float(spr), rounding_mode="floor"), float(1 + D), rounding_mode="floor")
        if bool((K_f >= _EXACT).any()):
            raise BudgetError(
                f"a budget of {float(rest.max()):g} GiB gives more than 2**53 state slots on stage "
                f"{plan.pp_rank}; sweep smaller budgets"
            )
        K = torch.div(K_f.to(torch.int64), split, rounding_mode="floor")
        state_bytes = (K * (spr * (1 + D))).to(torch.float64)
    elif pool_rule == "explicit-or-fit" and (no_radix or inputs.max_mamba_cache_size is not None):
        K = zeros + (inputs.max_mamba_cache_size or inputs.max_running_requests or 512) // dp
    elif pool_rule == "branches" and inputs.max_mamba_cache_size is not None:  # branch A: fixed K
        k_fixed = inputs.max_mamba_cache_size // dp
        K = zeros + k_fixed
        if joint and user is not None:
            reserved = min(user, k_fixed // ratio) + pad
    elif pool_rule == "branches" and no_radix and user is not None:  # branch B: K from the request cap
        k_fixed = user
        K = zeros + k_fixed
        if joint:
            reserved = k_fixed + pad
    else:  # branch C: auto-fit
        if D and rules.spec_reserve == "auto-fit-raw":
            raw_reserve = float(spr * inputs.max_running_requests * D)  # type: ignore[operator]
            rest = rest - raw_reserve / GIB
        # ((rest * r) / (1 + r)) * 2**30, left to right as Python evaluates it.
        B = rest * inputs.mamba_full_memory_ratio / (1 + inputs.mamba_full_memory_ratio) * GIB
        if joint and pad:
            # (B - int) - int: Python converts each int to the nearest double, as float() does.
            num = B - float(spr * (1 + D)) - float(extra)
            den = spr * (1 + D / ratio) + extra  # budget-independent: the very Python float SGLang uses
            K_f = torch.div(num, den, rounding_mode="floor")
        elif joint:
            K_f = torch.div(B, spr * (1 + D / ratio), rounding_mode="floor")
        elif pad:
            # (B - fixed) - per_slot: each int converted to the nearest double, as Python does.
            K_f = torch.div(B - float(fixed) - float(per_slot), float(per_slot), rounding_mode="floor")
        else:
            K_f = torch.div(B, float(spr), rounding_mode="floor")
        if bool((K_f >= _EXACT).any()):
            raise BudgetError(
                f"a budget of {float(rest.max()):g} GiB gives more than 2**53 state slots on stage "
                f"{plan.pp_rank}; sweep smaller budgets"
            )
        K = K_f.to(torch.int64)  # int() of an integral float: exact below 2**53
        if joint and user is not None:
            per_ratio = torch.div(K, ratio, rounding_mode="floor")
            reserved = torch.clamp(per_ratio, max=user) + pad

    # What is left for KV, in SGLang's order: (rest - intermediate / 2**30) - (K + pad) * per_slot / 2**30.
    left = rest
    if state_bytes is not None:
        kv_gib = rest - state_bytes / GIB  # int / 2**30 in SGLang: one rounding, as here
    else:
        if joint:
            res = torch.as_tensor(reserved, dtype=torch.float64, device=rest.device)
            left = rest - float(spr * D) * res / GIB  # spr * slots * D bytes, rounded once
        # ((K + pad) * per_slot + fixed) / 2**30: the int sum is exact below 2**53, then rounded once.
        kv_gib = left - ((K + pad).to(torch.float64) * float(per_slot) + float(fixed)) / GIB
    return K, kv_gib


def _own_tokens(
    inputs: CapacityInputs, plan: StagePlan, K: torch.Tensor, kv_gib: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One stage's own KV capacity per budget, as ``checker.core.sizing.sizing.stage_kv`` sizes it: (profiled,
    what up to 0.5.9 estimates requests from, own capacity before the MIN)."""
    zeros = torch.zeros_like(K)
    version = inputs.release.version
    code = code_of(version)
    context = inputs.resolved_context_len
    assert context is not None  # CapacityInputs refuses a model without one
    a = inputs.geometry.attention
    cell = 0
    if a is not None:
        draft = draft_layers_of(
            version,
            a,
            speculative=bool(inputs.speculative_num_draft_tokens),
            draft_path=inputs.speculative_draft_model_path,
        )
        _, cell = stage_cell(
            version,
            a,
            start_layer=plan.start_layer,
            end_layer=plan.end_layer,
            attn_tp=inputs.tp_size,
            elem_bytes=kv_dtype_bytes(version, inputs.kv_cache_dtype, a),
            draft_layers=draft,
        )
    if inputs.token_capacity is not None:
        profiled = zeros + inputs.token_capacity
    elif cell == 0:  # a stage whose KV lives on other stages (0.5.17+); before, size_pool refused it
        profiled = zeros + (INT64_MAX if inputs.pp_size > 1 else inputs.max_total_tokens or context)
    elif code.profile == "float-floor":
        profiled = torch.div(kv_gib * GIB, float(cell), rounding_mode="floor").to(torch.int64)
    else:
        if bool((kv_gib * GIB >= 2**62).any()):
            raise BudgetError("a budget this large leaves more than 2**62 bytes of KV; sweep smaller budgets")
        profiled = torch.div((kv_gib * GIB).to(torch.int64), cell, rounding_mode="floor")
    estimate_from = profiled
    D = inputs.speculative_num_draft_tokens or 0
    if D and code.spec_headroom_at and cell:
        headroom = spec_headroom(inputs)
        pool = (
            zeros + inputs.max_running_requests
            if inputs.max_running_requests
            else _estimate(profiled, context)
        )
        slots = torch.minimum(pool, torch.div(K, plan.slots_per_request, rounding_mode="floor"))
        profiled = profiled + slots * headroom + 100
    page, cap = inputs.kv_page_size, inputs.max_total_tokens
    if code.order == "configurator":
        own = torch.div(profiled, page, rounding_mode="floor") * page
        if cap is not None:
            own = torch.clamp(own, max=cap)
    else:
        own = torch.clamp(profiled, max=cap) if cap is not None else profiled
        own = torch.div(own, page, rounding_mode="floor") * page
    return profiled, estimate_from, own


def _estimate(tokens: torch.Tensor, context_len: int) -> torch.Tensor:
    """``clamp(int(T / context_len * 512), 2048, 4096)`` in float64, as Python divides (T < 2**53)."""
    return torch.clamp(torch.trunc(tokens.to(torch.float64) / context_len * 512).to(torch.int64), 2048, 4096)


_Sized = tuple[StagePlan, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _stage_sweep(inputs: CapacityInputs, k: int, rest: torch.Tensor) -> _Sized:
    """Stage ``k``'s own pools per budget: (plan, K, KV GiB, profiled, estimate_from, own capacity)."""
    plan = plan_stage(inputs, k)
    K, kv_gib = _state_sweep(inputs, plan, rest)
    profiled, estimate_from, own = _own_tokens(inputs, plan, K, kv_gib)
    return plan, K, kv_gib, profiled, estimate_from, own


def _stage_sweeps(inputs: CapacityInputs, rest: torch.Tensor, *, required: int | None) -> list[_Sized | None]:
    """Every stage's own pools per budget (None: a stage with a budget-independent refusal, which only
    ``required`` raises, or every stage when ``required`` is None)."""
    out: list[_Sized | None] = []
    for k in range(inputs.pp_size):
        try:
            out.append(_stage_sweep(inputs, k, rest))
        except (LayoutError, FlagError, ConfigError):
            if required is None or k == required:
                raise
            out.append(None)
    return out


def _boots_alone(inputs: CapacityInputs, st: _Sized) -> torch.Tensor:
    """Per budget: whether the stage's own pools size there (``derive_stage`` leaves it out of the MIN
    where its ``size_pool`` raises)."""
    plan, K, kv_gib, profiled, estimate_from, own = st
    return _resolve(inputs, plan, K, kv_gib, profiled, estimate_from, own, own)[:, 0] != BOOT_FAILURE


def _after_min(inputs: CapacityInputs, st: _Sized, ok: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    values = _resolve(inputs, *st, minimum)
    # A stage whose own pools do not size there does not boot, whatever the MIN of the others.
    return torch.where(ok.unsqueeze(1), values, torch.full_like(values, BOOT_FAILURE))


def _pipeline(
    inputs: CapacityInputs, rest: torch.Tensor, *, required: int | None
) -> list[torch.Tensor | None]:
    stages = _stage_sweeps(inputs, rest, required=required)
    # The MIN covers the stages that size their own pools at a budget (those whose own pool would boot
    # alone: checker.core.sizing.sizing.derive_stage leaves out a stage whose size_pool raises there).
    sentinel = torch.full_like(rest, INT64_MAX, dtype=torch.int64)
    sized = [None if st is None else _boots_alone(inputs, st) for st in stages]
    minimum = (
        torch.stack(
            [
                torch.where(ok, st[5], sentinel)
                for st, ok in zip(stages, sized, strict=True)
                if st is not None and ok is not None
            ]
        )
        .min(0)
        .values
    )
    return [
        None if st is None or ok is None else _after_min(inputs, st, ok, minimum)
        for st, ok in zip(stages, sized, strict=True)
    ]


def derive_pipeline_sweep(
    inputs: CapacityInputs, budgets: Sequence[float] | torch.Tensor, device: torch.device | str | None = "cpu"
) -> torch.Tensor:
    """Every stage's (max_mamba_cache_size, max_running_requests, pp_max_micro_batch_size) per budget:
    int64 (pp_size, num_budgets, 3) on ``device``, :data:`BOOT_FAILURE` where the scalar core raises
    :class:`BudgetError` at that budget. Each stage's KV pool is the MIN of every stage's own capacity at
    that budget (a stage whose own pools do not size there stays out of it), then its request cap by the
    release's rule (``checker.core.sizing.sizing.derive_stage``, budget by budget). ``inputs.budget_gib`` is
    ignored. A budget-independent error (LayoutError, FlagError) of any stage raises, as the scalar core
    does for any budget."""
    rest = torch.as_tensor(budgets, dtype=torch.float64, device=device).reshape(-1)
    if not rest.numel():
        return torch.zeros((inputs.pp_size, 0, 3), dtype=torch.int64, device=rest.device)
    return torch.stack([t for t in _pipeline(inputs, rest, required=None) if t is not None])


def _resolve(
    inputs: CapacityInputs,
    plan: StagePlan,
    K: torch.Tensor,
    kv_gib: torch.Tensor,
    profiled: torch.Tensor,
    estimate_from: torch.Tensor,
    own: torch.Tensor,
    minimum: torch.Tensor,
) -> torch.Tensor:
    """One stage after the MIN (``checker.core.sizing.kv_pool.resolve_one``), per budget."""
    rules = inputs.release.rules
    code = code_of(inputs.release.version)
    page = inputs.kv_page_size
    synced = minimum if inputs.pp_size > 1 else own
    if code.order == "configurator":
        aligned = torch.div(profiled, page, rounding_mode="floor") * page
        T = torch.where(synced != aligned, torch.div(synced, page, rounding_mode="floor") * page, aligned)
    else:
        T = synced
    context = inputs.resolved_context_len
    assert context is not None  # CapacityInputs refuses a model without one
    user = requests_per_worker(inputs)
    half = torch.div(T, 2, rounding_mode="floor")
    if rules.request_cap == "tp-worker":
        raw = inputs.max_running_requests
        pool = torch.zeros_like(T) + raw if raw is not None else _estimate(estimate_from, context)
        first = torch.zeros_like(T) + user if user is not None else half
        n = torch.minimum(first, pool)
    else:
        est = _estimate(T, context)
        if rules.request_cap == "estimate":
            n = torch.clamp(est, max=user) if user is not None else torch.minimum(est, half)
        else:
            n = torch.minimum(torch.zeros_like(T) + user if user is not None else est, half)
    n = torch.minimum(n, torch.div(K, plan.slots_per_request, rounding_mode="floor"))
    if inputs.pp_max_micro_batch_size:
        micro = torch.zeros_like(n) + inputs.pp_max_micro_batch_size
    else:
        micro = torch.clamp(torch.div(n, inputs.pp_size, rounding_mode="floor"), min=1)
    # _profile_available_bytes refuses rest_memory <= 0 (an exactly empty KV budget does not boot), the
    # pool config a pool of 0 tokens, resolve_max_num_reqs 0 requests.
    boots = (K > 0) & (kv_gib > 0) & (T > 0) & (n > 0)
    values = torch.stack((K, n, micro), dim=1)
    return torch.where(boots.unsqueeze(1), values, torch.full_like(values, BOOT_FAILURE))


def derive_sweep(
    inputs: CapacityInputs,
    pp_rank: int,
    budgets: Sequence[float] | torch.Tensor,
    device: torch.device | str | None = "cpu",
    *,
    minimum: int | None = None,
) -> torch.Tensor:
    """Stage ``pp_rank``'s (max_mamba_cache_size, max_running_requests, pp_max_micro_batch_size) per budget,
    its KV pool after the MIN over every stage: int64 (num_budgets, 3) on ``device`` (see
    :func:`derive_pipeline_sweep`); an empty ``budgets`` gives an empty (0, 3) tensor. ``minimum``: the
    MIN over stages of their own KV capacity, when known, for every budget (then no other stage is sized)."""
    rest = torch.as_tensor(budgets, dtype=torch.float64, device=device).reshape(-1)
    if not rest.numel():
        return torch.zeros((0, 3), dtype=torch.int64, device=rest.device)
    if minimum is not None:
        # The MIN is given (a rank re-deriving its own stage on its device): only this stage is sized, so
        # a rank's cost does not grow with the pipeline's length.
        st = _stage_sweep(inputs, pp_rank, rest)
        return _after_min(inputs, st, _boots_alone(inputs, st), torch.full_like(st[5], minimum))
    out = _pipeline(inputs, rest, required=pp_rank)[pp_rank]
    assert out is not None  # its own refusal raised
    return out


def local_sweep(
    inputs_by_policy: Mapping[str, CapacityInputs],
    pp_rank: int,
    budgets: Sequence[float] | torch.Tensor,
    device: torch.device | str | None = "cpu",
) -> torch.Tensor:
    """One stage's sweep for every policy: int64 (num_policies, num_budgets, 3), policies in mapping order.

    This is all a rank derives locally; a distributed sweep gathers these over stages, once.
    """
    rest = torch.as_tensor(budgets, dtype=torch.float64, device=device).reshape(-1)
    return torch.stack([derive_sweep(inp, pp_rank, rest, device) for inp in inputs_by_policy.values()])


def stack_stages(
    inputs_by_policy: Mapping[str, CapacityInputs],
    budgets: Sequence[float],
    device: torch.device,
    on_stage: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """Every stage's :func:`local_sweep` in this process: int64 (P, policies, budgets, 3), on CPU.

    A distributed sweep replaces this with one all-gather of each rank's own ``local_sweep``.
    ``on_stage`` is called after each stage (a progress line).
    """
    pp_size = next(iter(inputs_by_policy.values())).pp_size
    rest = torch.tensor(budgets, dtype=torch.float64, device=device)
    per_policy = [derive_pipeline_sweep(inp, rest, device) for inp in inputs_by_policy.values()]
    for _ in range(pp_size):
        on_stage()
    return torch.stack(per_policy, dim=1).cpu()


def flags_from_tensor(stack: torch.Tensor) -> list[PolicyFlags]:
    """:func:`checker.core.sizing.sweep.flags_from_stack`, vectorised over a (P, policies, budgets, 3)
    tensor."""

    stack = stack.cpu()
    failed = stack[..., 0] == BOOT_FAILURE  # (P, policies, budgets)
    all_failed = failed.all(0)
    partial = failed.any(0) & ~all_failed
    # A stage that failed holds the sentinel in every value, so a partial boot differs in all three.
    divergent = (stack != stack[:1]).any(0)  # (policies, budgets, 3)

    def idx(mask: torch.Tensor) -> list[int]:
        return mask.nonzero().flatten().tolist()

    return [
        PolicyFlags(
            divergent={name: idx(divergent[p, :, v]) for v, name in enumerate(CHECKED_VALUES)},
            boot_failures=idx(all_failed[p]),
            partial_boot=idx(partial[p]),
        )
        for p in range(stack.shape[1])
    ]


def analyse(
    stack: torch.Tensor | Sequence[Sequence[Sequence[Sequence[int]]]],
    budgets: Sequence[float],
    policies: Sequence[str],
) -> SweepSummary:
    """The sweep's findings from a (P, policies, budgets, 3) stack, a tensor or nested lists alike."""

    if isinstance(stack, torch.Tensor):
        expected = (len(policies), len(budgets), len(CHECKED_VALUES))
        if stack.dim() != 4 or tuple(stack.shape[1:]) != expected:
            raise ValueError(f"stack shape {tuple(stack.shape)} is not (P, {', '.join(map(str, expected))})")
        return summarise(flags_from_tensor(stack), budgets, policies)
    return summarise(flags_from_stack(stack, len(policies)), budgets, policies)
