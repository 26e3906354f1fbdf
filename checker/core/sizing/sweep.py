"""Budget sweeps, torch-free: the budget grid, the scalar reference, and the analysis of a sweep.

A sweep asks, for each charging policy, at which budgets the pipeline stages stop agreeing on the
three checked values (docs/how-it-computes.md, "The upstream claim, measured"). Its data is a *stack*:
per stage, per policy, per budget, the triple (max_mamba_cache_size, max_running_requests,
pp_max_micro_batch_size), with :data:`BOOT_FAILURE` in all three where that stage cannot boot at that
budget. Where the stack comes from (the vectorised derivation in ``checker.device.sweep``, one process or
one rank per stage, or :func:`scalar_sweep`) does not matter to :func:`analyse`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import TypedDict

from checker.core.errors import BudgetError
from checker.core.sizing.budget import MAX_BUDGET_GIB
from checker.core.sizing.sizing import BOOT_FAILURE as BOOT_FAILURE  # the sweeps' sentinel, re-exported
from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs, derive_stage

MAX_BUDGETS = 1_000_000
"""Largest grid accepted: the stack is 72 bytes per budget per stage for three policies, and a
distributed sweep gathers all of it on every rank."""
UPSTREAM_GRID = "4:40:0.25"
"""The grid of the upstream sweep (docs/how-it-computes.md, "The upstream claim, measured"): 145 budgets,
4 to 40 GiB in 0.25 GiB steps."""

Triple = tuple[int, int, int]


@dataclass(frozen=True)
class BudgetGrid:
    """The budgets of one sweep, in GiB, ascending and distinct, as the user wrote them."""

    spec: str
    """The ``--budgets`` text the grid came from."""
    budgets: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.budgets)

    def describe(self) -> dict[str, object]:
        return {
            "spec": self.spec,
            "num_budgets": len(self.budgets),
            "min_gib": self.budgets[0],
            "max_gib": self.budgets[-1],
        }


def _decimal(text: str, spec: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise BudgetError(
            f"--budgets {spec!r}: {text.strip()!r} is not a number; use START:STOP:STEP "
            "(e.g. 4:40:0.25) or a comma list (e.g. 8,16,24)"
        ) from None
    # Only NaN and the infinities: a finite decimal too large for a double (1e400) is refused below as
    # above 1 PiB, which is what is wrong with it (it used to read "must be a finite number").
    if not value.is_finite():
        raise BudgetError(f"--budgets {spec!r}: {text.strip()!r} must be a finite number of GiB")
    if value > 0 and float(value) == 0:
        raise BudgetError(f"--budgets {spec!r}: {text.strip()!r} is too small to be a budget in GiB")
    if value > MAX_BUDGET_GIB:
        raise BudgetError(
            f"--budgets {spec!r}: {text.strip()} GiB is above {MAX_BUDGET_GIB:,} GiB (1 PiB), more than "
            "any device holds"
        )
    return value


def _exponent(value: Decimal) -> int:
    """The decimal exponent of a finite Decimal (``_decimal`` refuses NaN and the infinities, whose
    exponent is a letter)."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int), value
    return exponent


def _scaled(value: Decimal, e: int) -> int:
    """``value * 10**e`` as an exact int (Decimal arithmetic would round to its context precision)."""
    sign, digits, _ = value.as_tuple()
    mantissa = int("".join(map(str, digits))) * (-1 if sign else 1)
    shift = _exponent(value) + e
    assert shift >= 0, (value, e)  # e is at least every value's count of decimals
    return mantissa * int(10**shift)  # int ** int is typed Any (a negative power is a float)


def _check_count(n: int, spec: str) -> None:
    if n > MAX_BUDGETS:
        raise BudgetError(
            f"--budgets {spec!r} gives {n:,} budgets, more than the {MAX_BUDGETS:,} a sweep holds; "
            "use a larger STEP or a narrower range"
        )


def _range(spec: str) -> tuple[float, ...]:
    start, stop, step = (_decimal(p, spec) for p in spec.split(":"))
    if start <= 0:
        raise BudgetError(f"--budgets {spec!r}: START {start} must be a positive number of GiB")
    if step <= 0:
        raise BudgetError(f"--budgets {spec!r}: STEP {step} must be positive")
    if stop < start:
        raise BudgetError(f"--budgets {spec!r}: STOP {stop} is below START {start}")
    # Exact integer arithmetic at a common decimal scale: budget i is (s + i*t) / 10**e, and Python's
    # int / int is correctly rounded, so each budget is the float the user gets typing that decimal
    # (4 + 3*0.1 would drift; 4.3 does not). STOP is included when the grid lands on it.
    e = max(0, *(-_exponent(d) for d in (start, stop, step)))
    scale = 10**e
    s, p, t = (_scaled(d, e) for d in (start, stop, step))
    n = (p - s) // t + 1
    _check_count(n, spec)
    return tuple((s + i * t) / scale for i in range(n))


def _list(spec: str) -> tuple[float, ...]:
    parts = [p for p in spec.split(",") if p.strip()]
    if not parts:
        raise BudgetError(f"--budgets {spec!r} names no budget; use START:STOP:STEP or a comma list")
    _check_count(len(parts), spec)
    values = []
    for p in parts:
        d = _decimal(p, spec)
        if d <= 0:
            raise BudgetError(f"--budgets {spec!r}: {p.strip()} must be a positive number of GiB")
        values.append(float(p.strip()))  # float() of the text: exactly what the user typed
    return tuple(sorted(set(values)))


def parse_budgets(spec: str) -> BudgetGrid:
    """``START:STOP:STEP`` (STOP included: ``4:40:0.25`` is 145 budgets) or ``a,b,c`` (sorted, distinct).

    Raises :class:`BudgetError` naming the part that is wrong.
    """
    text = spec.strip()
    if ":" in text:
        if text.count(":") != 2:
            raise BudgetError(
                f"--budgets {spec!r}: a range is START:STOP:STEP with three parts (e.g. 4:40:0.25)"
            )
        budgets = _range(text)
    else:
        budgets = _list(text)
    return BudgetGrid(spec=text, budgets=budgets)


def scalar_sweep(inputs: CapacityInputs, pp_rank: int, budgets: Iterable[float]) -> list[Triple]:
    """The reference: :func:`derive_stage` of the scalar core at each budget, one at a time (its KV pool
    after the MIN over every stage that boots there).

    A budget at which the core raises :class:`BudgetError` (pool or running requests <= 0, or a state
    pool larger than the budget) is a boot failure. Budget-independent errors (a layout the policy
    cannot size, a strategy SGLang rejects) propagate, as they would for any budget.
    """
    out: list[Triple] = []
    for b in budgets:
        try:
            s = derive_stage(inputs, pp_rank, b)
        except BudgetError:
            out.append((BOOT_FAILURE, BOOT_FAILURE, BOOT_FAILURE))
        else:
            out.append((s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size))
    return out


@dataclass
class PolicyFlags:
    """Which budgets (indices into the grid) misbehave under one policy."""

    divergent: dict[str, list[int]] = field(default_factory=lambda: {n: [] for n in CHECKED_VALUES})
    """Per checked value: budgets where the stages do not all agree, partial boots included."""
    boot_failures: list[int] = field(default_factory=list)
    """Budgets where every stage fails to boot alike: no disagreement, just no server."""
    partial_boot: list[int] = field(default_factory=list)
    """Budgets where some stages boot and others do not (also counted as divergent)."""


Stack = Sequence[Sequence[Sequence[Sequence[int]]]]
"""Nested lists ``[stage][policy][budget][value]``."""


def flags_from_stack(stack: Stack, num_policies: int) -> list[PolicyFlags]:
    """Pure-Python flags of a stack given as nested lists ``[stage][policy][budget][value]``."""
    flags = [PolicyFlags() for _ in range(num_policies)]
    for p, f in enumerate(flags):
        per_stage = [stage[p] for stage in stack]
        for i, triples in enumerate(zip(*per_stage, strict=True)):
            failed = [t[0] == BOOT_FAILURE for t in triples]
            if all(failed):
                f.boot_failures.append(i)
                continue
            if any(failed):
                f.partial_boot.append(i)
            for v, name in enumerate(CHECKED_VALUES):
                if len({t[v] for t in triples}) > 1:
                    f.divergent[name].append(i)
    return flags


class PolicySummary(TypedDict):
    """One policy's findings over the grid (the ``--report`` schema's ``policies.<policy>``)."""

    consistent: bool
    divergent: dict[str, int]
    divergent_budgets: dict[str, list[float]]
    boot_failures: int
    boot_failure_budgets: list[float]
    partial_boot_failures: int
    partial_boot_budgets: list[float]


class SweepSummary(TypedDict):
    """A sweep's findings, JSON-ready (a plain dict at run time)."""

    num_budgets: int
    policies: dict[str, PolicySummary]


def summarise(
    flags: Sequence[PolicyFlags], budgets: Sequence[float], policies: Sequence[str]
) -> SweepSummary:
    """The sweep's findings as a JSON-ready dict (the ``--report`` schema's ``policies`` part)."""
    n = len(budgets)
    out: SweepSummary = {"num_budgets": n, "policies": {}}
    for policy, f in zip(policies, flags, strict=True):
        out["policies"][policy] = {
            "consistent": not any(f.divergent.values()),
            "divergent": {name: len(idx) for name, idx in f.divergent.items()},
            "divergent_budgets": {name: [budgets[i] for i in idx] for name, idx in f.divergent.items()},
            "boot_failures": len(f.boot_failures),
            "boot_failure_budgets": [budgets[i] for i in f.boot_failures],
            "partial_boot_failures": len(f.partial_boot),
            "partial_boot_budgets": [budgets[i] for i in f.partial_boot],
        }
    return out


def analyse(stack: Stack, budgets: Sequence[float], policies: Sequence[str]) -> SweepSummary:
    """Count, per policy and checked value, the budgets where stages diverge, and which.

    ``stack[stage][policy][budget]`` is a triple in :data:`CHECKED_VALUES` order. A budget at which
    every stage fails to boot is a boot failure, not a divergence (the stages agree: nothing runs); one
    at which some stages boot and others do not is divergent in every value.
    """
    if stack and (len(stack[0]) != len(policies) or any(len(s) != len(budgets) for s in stack[0])):
        raise ValueError("stack shape does not match (stages, policies, budgets, 3)")
    return summarise(flags_from_stack(stack, len(policies)), budgets, policies)


def budget_runs(indices: Sequence[int], budgets: Sequence[float]) -> list[tuple[float, float]]:
    """Consecutive grid indices merged into (first, last) budget runs, for short human listings."""
    runs: list[tuple[float, float]] = []
    start: int | None = None
    prev = 0
    for i in indices:
        if start is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            runs.append((budgets[start], budgets[prev]))
        start = prev = i
    if start is not None:
        runs.append((budgets[start], budgets[prev]))
    return runs
