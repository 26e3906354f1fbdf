"""Budget sweeps vectorised with torch: one stage's three checked values at every budget at once.

:func:`derive_sweep` is bit-identical to the scalar core (``checker.core.sizing.size_pool``) budget by
budget: it reuses :func:`~checker.core.sizing.plan_stage` for the budget-independent half and repeats
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

from checker.core.errors import BudgetError, FlagError
from checker.core.sizing import (
    BOOT_FAILURE,
    CHECKED_VALUES,
    GIB,
    CapacityInputs,
    plan_stage,
    requests_per_worker,
    running_request_cap,
    size_pool,
)
from checker.core.sweep import PolicyFlags, flags_from_stack, summarise

if TYPE_CHECKING:  # the sweep's tables load with the sweep; check derives one budget without them
    from checker.core.sweep import PolicyFlags, SweepSummary

# Products below are formed in float64 from exact operands, so each is rounded once, exactly as
# Python's int product followed by int / 2**30 (correctly rounded) is. That holds while the operands
# are integers float64 represents exactly.
_EXACT = 2**53


def derive_sweep(
    inputs: CapacityInputs,
    pp_rank: int,
    budgets: Sequence[float] | torch.Tensor,
    device: torch.device | str | None = "cpu",
) -> torch.Tensor:
    """Stage ``pp_rank``'s (max_mamba_cache_size, max_running_requests, pp_max_micro_batch_size) per budget.

    Returns an int64 tensor of shape (num_budgets, 3) on ``device``; a row is :data:`BOOT_FAILURE`
    where the scalar core raises :class:`BudgetError` at that budget. ``inputs.budget_gib`` is ignored.
    Budget-independent errors (LayoutError, FlagError) raise, as the scalar core does for any budget;
    an empty ``budgets`` gives an empty (0, 3) tensor.
    """
    plan = plan_stage(inputs, pp_rank)
    rules = inputs.release.rules
    pad = 1 if rules.padding_slot else 0
    dp = inputs.dp_size
    ratio = plan.slots_per_request
    spr, extra = plan.stage_per_req_bytes, plan.extra_per_slot_bytes
    per_slot = spr + extra
    fixed = plan.replayssm_fixed_bytes  # the GDN ReplaySSM ring, charged once (checker.core.replay)
    # No speculative intermediate state is reserved under the ReplaySSM ring, as in size_pool.
    D = 0 if plan.replayssm_active else inputs.speculative_num_draft_tokens or 0
    rest = torch.as_tensor(budgets, dtype=torch.float64, device=device).reshape(-1)
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

    # max_running_requests as KVCacheConfigurator.resolve_max_num_reqs derives it: the shared cap, then
    # K // ratio.
    n = torch.clamp(torch.div(K, ratio, rounding_mode="floor"), max=running_request_cap(inputs))
    if inputs.pp_max_micro_batch_size:
        micro = zeros + inputs.pp_max_micro_batch_size
    else:
        micro = torch.clamp(torch.div(n, inputs.pp_size, rounding_mode="floor"), min=1)

    # _profile_available_bytes refuses rest_memory <= 0: an exactly empty KV budget does not boot.
    boots = (K > 0) & (kv_gib > 0) & (n > 0)
    values = torch.stack((K, n, micro), dim=1)
    return torch.where(boots.unsqueeze(1), values, torch.full_like(values, BOOT_FAILURE))


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
    stages = []
    for k in range(pp_size):
        stages.append(local_sweep(inputs_by_policy, k, rest, device))
        on_stage()
    return torch.stack(stages).cpu()


def flags_from_tensor(stack: torch.Tensor) -> list[PolicyFlags]:
    """:func:`checker.core.sweep.flags_from_stack`, vectorised over a (P, policies, budgets, 3) tensor."""

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
