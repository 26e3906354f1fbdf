"""Budget sweeps vectorised with torch: one stage's three checked values at every budget at once.

:func:`derive_sweep` is the scalar core (``checker.core.sizing.sizing.size_pool`` / ``derive_stage``)
budget by budget because it runs the same functions: :func:`~checker.core.sizing.sizing.plan_stage` for the
budget-independent half, and the rules of :mod:`checker.core.sizing.formulas` with torch ops on a float64
tensor of budgets for the rest. ``tensor // x`` on float64 runs CPython's own float ``//`` algorithm (fmod,
then a correction step), checked against ``//`` on millions of values, so the pool size K lands on the
same slot, including at the budgets where it steps.

:func:`local_sweep` is what one stage derives for every policy; a sweep is the stack of those over
stages, however it was gathered, and :func:`analyse` reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from checker.core.errors import BudgetError, ConfigError, FlagError, LayoutError
from checker.core.sizing.formulas import (
    OwnTokens,
    StatePool,
    handle_max_mamba_cache,
    profile_tokens,
    resolve_max_num_reqs,
    speculative_draft_tokens,
)
from checker.core.sizing.kv_pool import (
    INT64_MAX,
    code_of,
    draft_layers_of,
    kv_dtype_bytes,
    no_cell_tokens,
    stage_cell,
)
from checker.core.sizing.sizing import (
    BOOT_FAILURE,
    CHECKED_VALUES,
    GIB,
    CapacityInputs,
    StagePlan,
    plan_stage,
    requests_per_worker,
    spec_headroom,
)
from checker.core.sizing.sweep import PolicyFlags, flags_from_stack, summarise

if TYPE_CHECKING:  # the sweep's tables load with the sweep; check derives one budget without them
    from checker.core.sizing.sweep import PolicyFlags, SweepSummary

# Products below are formed in float64 from exact operands, so each is rounded once, exactly as
# Python's int product followed by int / 2**30 (correctly rounded) is. That holds while the operands
# are integers float64 represents exactly.
_EXACT = 2**53


class _TorchOps:
    """checker.core.sizing.formulas.Ops on a float64 tensor of budgets (one entry per budget)."""

    def __init__(self, rest: torch.Tensor) -> None:
        self._rest = rest

    def full(self, value: int) -> torch.Tensor:
        return torch.full_like(self._rest, value, dtype=torch.int64)

    def to_int(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int64)  # toward zero, as int()

    def to_float(self, x: torch.Tensor | int) -> torch.Tensor | float:
        return x.to(torch.float64) if isinstance(x, torch.Tensor) else float(x)

    def minimum(self, a: torch.Tensor | int, b: torch.Tensor | int) -> torch.Tensor:
        if not isinstance(b, torch.Tensor):
            return torch.clamp(torch.as_tensor(a), max=b)
        if not isinstance(a, torch.Tensor):
            return torch.clamp(b, max=a)
        return torch.minimum(a, b)

    def maximum(self, a: torch.Tensor | int, b: torch.Tensor | int) -> torch.Tensor:
        if not isinstance(b, torch.Tensor):
            return torch.clamp(torch.as_tensor(a), min=b)
        if not isinstance(a, torch.Tensor):
            return torch.clamp(b, min=a)
        return torch.maximum(a, b)

    def where(self, cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(cond, a, b)

    def exact_slots(self, slots: torch.Tensor, rest: torch.Tensor, pp_rank: int) -> None:
        if bool((slots >= _EXACT).any()):
            raise BudgetError(
                f"a budget of {float(rest.max()):g} GiB gives more than 2**53 state slots on stage "
                f"{pp_rank}; sweep smaller budgets"
            )


def _state_sweep(inputs: CapacityInputs, plan: StagePlan, rest: torch.Tensor) -> StatePool:
    """One stage's state pool per budget (checker.core.sizing.formulas.handle_max_mamba_cache, as the scalar
    core sizes it). Budget-independent refusals raise, as on the scalar core."""
    spr, per_slot = plan.stage_per_req_bytes, plan.stage_per_req_bytes + plan.extra_per_slot_bytes
    D = speculative_draft_tokens(inputs, plan)
    user = requests_per_worker(inputs)  # the same per-release floor as the scalar core
    # Integers the float64 arithmetic holds exactly, or no sweep: the scalar core's Python ints have no
    # such bound.
    if per_slot >= _EXACT or spr * max(D, 1) >= _EXACT or plan.replayssm_fixed_bytes >= _EXACT:
        raise BudgetError(
            f"stage {plan.pp_rank} charges {per_slot:,} bytes per slot, beyond what a sweep derives "
            "exactly (2**53); use the derive command for this geometry"
        )
    if (inputs.max_mamba_cache_size or 0) >= _EXACT or (user or 0) >= _EXACT:
        raise FlagError(
            "--max-mamba-cache-size / --max-running-requests of 2**53 or more are beyond what a sweep "
            "derives exactly; use the derive command"
        )
    return handle_max_mamba_cache(_TorchOps(rest), inputs, plan, rest, user=user)


def _own_tokens(inputs: CapacityInputs, plan: StagePlan, pool: StatePool) -> OwnTokens:
    """One stage's own KV capacity per budget (checker.core.sizing.formulas.profile_tokens, as
    ``checker.core.sizing.sizing.stage_kv`` sizes it)."""
    version = inputs.release.version
    code = code_of(version)
    context = inputs.resolved_context_len
    assert context is not None  # CapacityInputs refuses a model without one
    a = inputs.geometry.attention
    cell, headroom, no_cell = 0, 0, 0
    D = inputs.speculative_num_draft_tokens or 0
    if a is not None:
        draft = draft_layers_of(
            version, a, speculative=bool(D), draft_path=inputs.speculative_draft_model_path
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
        headroom = spec_headroom(inputs) if D and code.spec_headroom_at else 0
        no_cell = no_cell_tokens(
            a, pp_size=inputs.pp_size, max_total_tokens=inputs.max_total_tokens, context_len=context
        )
    if cell and inputs.token_capacity is None and bool((pool.kv_gib * GIB >= 2**62).any()):
        raise BudgetError("a budget this large leaves more than 2**62 bytes of KV; sweep smaller budgets")
    return profile_tokens(
        _TorchOps(pool.kv_gib),
        kv_gib=pool.kv_gib,
        cell=cell,
        profile=code.profile,
        order=code.order,
        no_cell_tokens=no_cell,
        token_capacity=inputs.token_capacity,
        max_total_tokens=inputs.max_total_tokens,
        page_size=inputs.kv_page_size,
        context_len=context,
        headroom=headroom,
        max_running_requests=inputs.max_running_requests,
        K=pool.K,
        slots_per_request=plan.slots_per_request,
    )


_Sized = tuple[StagePlan, StatePool, OwnTokens]


def _stage_sweep(inputs: CapacityInputs, k: int, rest: torch.Tensor) -> _Sized:
    """Stage ``k``'s own pools per budget: its plan, its state pool, its own KV capacity."""
    plan = plan_stage(inputs, k)
    pool = _state_sweep(inputs, plan, rest)
    return plan, pool, _own_tokens(inputs, plan, pool)


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
    return _resolve(inputs, st, st[2].own)[:, 0] != BOOT_FAILURE


def _after_min(inputs: CapacityInputs, st: _Sized, ok: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    values = _resolve(inputs, st, minimum)
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
                torch.where(ok, st[2].own, sentinel)
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


def _resolve(inputs: CapacityInputs, st: _Sized, minimum: torch.Tensor) -> torch.Tensor:
    """One stage after the MIN (checker.core.sizing.formulas.resolve_max_num_reqs, as
    ``checker.core.sizing.kv_pool.resolve_one`` resolves it), per budget: (K, requests, micro-batch), or
    :data:`BOOT_FAILURE` where the scalar core raises."""
    plan, pool, own = st
    context = inputs.resolved_context_len
    assert context is not None  # CapacityInputs refuses a model without one
    r = resolve_max_num_reqs(
        _TorchOps(pool.kv_gib),
        rule=inputs.release.rules.request_cap,
        order=code_of(inputs.release.version).order,
        pp_size=inputs.pp_size,
        page_size=inputs.kv_page_size,
        context_len=context,
        profiled=own.profiled,
        estimate_from=own.estimate_from,
        own=own.own,
        minimum=minimum,
        K=pool.K,
        slots_per_request=plan.slots_per_request,
        requests_per_worker=requests_per_worker(inputs),
        user_max_running_requests=inputs.max_running_requests,
        user_micro=inputs.pp_max_micro_batch_size,
    )
    # size_pool refuses K <= 0 and an empty KV budget (_profile_available_bytes: rest_memory <= 0),
    # resolve_one a pool of 0 tokens and 0 requests.
    boots = (pool.K > 0) & (pool.kv_gib > 0) & (r.T > 0) & (r.requests > 0)
    values = torch.stack((pool.K, r.requests, r.micro), dim=1)
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
        return _after_min(inputs, st, _boots_alone(inputs, st), torch.full_like(st[2].own, minimum))
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
