"""``checker sweep``'s text: the header (model, layout, grid) and the findings table, torch-free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs
from checker.core.sizing.sweep import BudgetGrid, budget_runs
from checker.outputs.tables import fmt_bytes, format_table
from checker.status import DIVERGENT, EXIT_CODES

SHOWN_RUNS = 8
"""Runs of divergent budgets listed in the text output; the report lists every budget."""


def fmt_budget(b: float) -> str:
    return f"{b:.15g}"


def fmt_runs(indices: Sequence[int], budgets: Sequence[float]) -> str:
    runs = budget_runs(indices, budgets)
    shown = [fmt_budget(a) if a == b else f"{fmt_budget(a)}-{fmt_budget(b)}" for a, b in runs[:SHOWN_RUNS]]
    more = f" and {len(runs) - SHOWN_RUNS} more runs (see --report)" if len(runs) > SHOWN_RUNS else ""
    return ", ".join(shown) + more + " GiB"


def header(inputs: CapacityInputs, grid: BudgetGrid) -> str:
    g = inputs.geometry
    strategy = inputs.strategy_label
    T = "not modelled (does not bind)" if inputs.token_capacity is None else f"{inputs.token_capacity:,}"
    b = grid.budgets
    return "\n".join(
        [
            f"model {g.name}: {g.num_hidden_layers} layers, {g.num_linear_layers} linear; per_req "
            f"{fmt_bytes(g.per_req_bytes)}",
            f"layout pp {inputs.pp_size} x tp {inputs.tp_size} (dp {inputs.dp_size}); r "
            f"{inputs.mamba_full_memory_ratio:g}; {strategy}, {inputs.slots_per_request()} slots per "
            f"request; KV token capacity {T}",
            f"budgets {grid.spec}: {len(b):,} from {fmt_budget(b[0])} to {fmt_budget(b[-1])} GiB",
        ]
    )


def text_report(report: Mapping[str, Any], grid: BudgetGrid) -> str:
    n = report["num_budgets"]

    def cell(count: int) -> str:
        return f"{count:,} ({100 * count / n:.1f}%)" if count else "0"

    rows = [
        [
            policy,
            *(cell(info["divergent_counts"][v]) for v in CHECKED_VALUES),
            cell(info["boot_failures"]),
            "consistent" if info["consistent"] else "DIVERGENT",
        ]
        for policy, info in report["policies"].items()
    ]
    lines = [
        f"budgets (of {n:,}) at which the stages diverge, per policy and value",
        format_table(["policy", *CHECKED_VALUES, "boot failures", "verdict"], rows),
    ]
    details = finding_lines(report, grid)
    if details:
        lines += ["", *(f"  {line}" for line in details)]
    required = required_line(report)
    if required:
        lines += ["", required]
    return "\n".join(lines)


def finding_lines(report: Mapping[str, Any], grid: BudgetGrid) -> list[str]:
    """One line per policy and value that diverges, and per policy with budgets where stages cannot boot:
    where, in runs of budgets."""
    budgets = grid.budgets
    index = {b: i for i, b in enumerate(budgets)}
    details = []
    for policy, info in report["policies"].items():
        for v in CHECKED_VALUES:
            if info["divergent_counts"][v]:
                idx = [index[b] for b in info["divergent_budgets"][v]]
                details.append(f"{policy}: {v} diverges at {fmt_runs(idx, budgets)}")
        if info["partial_boot_failures"]:
            idx = [index[b] for b in info["partial_boot_budgets"]]
            details.append(f"{policy}: some stages cannot boot at {fmt_runs(idx, budgets)}")
        if info["boot_failures"]:
            idx = [index[b] for b in info["boot_failure_budgets"]]
            details.append(f"{policy}: no stage can boot at {fmt_runs(idx, budgets)}")
    return details


def required_line(report: Mapping[str, Any]) -> str | None:
    """The verdict line: each --require-consistent policy, and the exit code it gives."""
    required = report["require_consistent"]
    if not required:
        return None
    failing = report["failing_required"]
    state = "; ".join(f"{p} {'DIVERGES' if p in failing else 'never diverges'}" for p in required)
    code = EXIT_CODES[DIVERGENT] if failing else 0
    return f"required consistent: {state} -> exit {code}"


def quiet_report(report: Mapping[str, Any], grid: BudgetGrid) -> str:
    """``--quiet``: what diverges, one line each (a summary line alone hid every other value that
    diverges), then the verdict line."""
    required = required_line(report)
    return "\n".join([*finding_lines(report, grid), *([required] if required else [])])
