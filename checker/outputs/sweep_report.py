"""``checker sweep``'s JSON document (``--format json`` and ``--report``), torch-free.

The findings of a sweep (:func:`build_report`) or, under torchrun, why there are none
(:func:`failure_report`: an error on some rank, a lost rank); both in the vocabulary of
``docs/json-output.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from checker import __version__
from checker.config import SizingFlags
from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs
from checker.core.sizing.sweep import BudgetGrid, SweepSummary
from checker.outputs.jsondoc import json_inputs
from checker.outputs.render import Document
from checker.status import CONSISTENT, DIVERGENT, EXIT_CODES

PRETTY_REPORT_BUDGETS = 2_000
"""Up to this many budgets the --report JSON is indented."""


def notes(inputs: CapacityInputs) -> dict[str, str]:
    """What the counts assume beyond the inputs, in words."""
    return {
        "token_capacity": (
            "not modelled: the KV pool does not bind, so max_running_requests = min(4096, K // slots)"
            if inputs.token_capacity is None
            else "KV token capacity T clamps max_running_requests (docs/how-it-computes.md)"
        ),
        "boot_failure_rule": (
            "a stage cannot boot at a budget where its pool K <= 0, its state pool exceeds the budget, or "
            "max_running_requests <= 0; a boot failure when every stage fails alike, divergent otherwise"
        ),
    }


def sweep_json_inputs(inputs: CapacityInputs, sizing: SizingFlags | None) -> dict[str, object]:
    """Everything the counts depend on, under check's names: budget_gib null (the grid is
    ``budget_grid``) and no ``policy`` (the policies swept are the keys of ``policies``)."""

    d = json_inputs(inputs, replace(sizing or SizingFlags(), policy=None), None, budget_source=None)
    for k in ("policy", "resolved_policy"):
        d.pop(k)
    torch = sys.modules.get("torch")
    if torch is not None:
        d["torch_version"] = torch.__version__
    return d


def _policy_json(info: Mapping[str, object]) -> dict[str, object]:
    """One policy's analysis under check's names: ``divergent`` lists the values that diverge at some
    budget; ``divergent_counts`` says at how many budgets."""
    counts = info["divergent"]
    assert isinstance(counts, dict)
    out = {k: v for k, v in info.items() if k != "divergent"}
    out["divergent"] = [v for v in CHECKED_VALUES if counts[v]]
    out["divergent_counts"] = dict(counts)
    return out


def build_report(
    analysis: SweepSummary,
    grid: BudgetGrid,
    inputs: CapacityInputs,
    required: Sequence[str],
    device: str,
    sizing: SizingFlags | None = None,
    *,
    mode: str = "single-process",
    world_size: int = 1,
) -> dict[str, Any]:
    """The --report document (JSON values, read back by the text and the plot)."""
    failing = [p for p in required if not analysis["policies"][p]["consistent"]]
    return {
        "command": "sweep",
        "checker_version": __version__,
        "status": DIVERGENT if failing else CONSISTENT,
        "exit_code": EXIT_CODES[DIVERGENT] if failing else 0,
        "mode": mode,
        "device": device,
        "layout": {
            "world_size": inputs.pp_size * inputs.tp_size,
            "pp_size": inputs.pp_size,
            "tp_size": inputs.tp_size,
        },
        "inputs": sweep_json_inputs(inputs, sizing),
        "geometry": inputs.geometry.describe(),
        "budget_grid": grid.describe(),
        "notes": notes(inputs),
        "require_consistent": list(required),
        "failing_required": failing,
        **{k: v for k, v in analysis.items() if k != "policies"},
        "policies": {p: _policy_json(info) for p, info in analysis["policies"].items()},
        "budgets_gib": list(grid.budgets),
        "world_size": world_size,
    }


def failure_report(
    *,
    status: str,
    world_size: int,
    errors: Sequence[str] = (),
    missing_ranks: Sequence[int] = (),
    infrastructure_detail: str | None = None,
) -> dict[str, object]:
    """A distributed sweep that found nothing: some rank's error, or a lost rank (check's keys)."""
    return {
        "command": "sweep",
        "checker_version": __version__,
        "status": status,
        "exit_code": EXIT_CODES[status],
        "mode": "distributed",
        "world_size": world_size,
        "layout": {"world_size": world_size, "pp_size": None, "tp_size": None},
        "inputs": {},
        "errors": list(errors),
        "missing_ranks": sorted(missing_ranks),
        "infrastructure_detail": infrastructure_detail,
    }


def document(
    report: Mapping[str, object],
    lines: Callable[[], Sequence[str]] | None = None,
    line: Callable[[], str] | None = None,
) -> Document:
    """The sweep's findings (or why there are none) for every renderer. The JSON is indented for a person
    when it is short; compact when it lists many budgets, because json's indenting encoder is pure Python
    and costs seconds on a dense sweep (the C encoder, milliseconds)."""
    num = report.get("num_budgets", 0)
    indent = 1 if isinstance(num, int) and num <= PRETTY_REPORT_BUDGETS else None
    return Document(lambda: report, lines, line, indent=indent)
