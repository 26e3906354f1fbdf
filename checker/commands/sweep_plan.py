"""What a sweep derives (its plan: grid, policies, each policy's inputs) and how its findings are shown:
shared by the single-process sweep and the distributed one (:mod:`checker.commands.sweep_job`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from checker.config import SweepConfig
from checker.core.errors import CheckerInputError, FlagError
from checker.core.sizing.sizing import CapacityInputs
from checker.core.sizing.sweep import BudgetGrid, SweepSummary, parse_budgets
from checker.outputs.plot import plot_sweep, plot_title
from checker.outputs.render import emit, write_artifacts
from checker.outputs.sweep_report import build_report, document
from checker.outputs.sweep_text import header, quiet_report, text_report
from checker.preflight.resolve import capacity_inputs
from checker.status import DIVERGENT, EXIT_CODES, exit_after_outputs, undelivered_note

if TYPE_CHECKING:  # torch is imported when the sweep runs, so --help and input errors cost none
    import torch

EXIT_DIVERGENT = EXIT_CODES[DIVERGENT]


def required_policies(require: Sequence[str] | None, policies: Sequence[str]) -> list[str]:
    if require is None:
        return ["max-share"] if "max-share" in policies else []
    required = list(dict.fromkeys(require))
    missing = [p for p in required if p not in policies]
    if missing:
        raise FlagError(
            f"--require-consistent {' '.join(missing)} names a policy this sweep does not derive; "
            f"add --policy {' --policy '.join(missing)}"
        )
    return required


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """What a sweep derives: the grid, the policies (required ones too) and each policy's inputs."""

    grid: BudgetGrid
    policies: list[str]
    required: list[str]
    inputs_by_policy: dict[str, CapacityInputs]

    @property
    def inputs(self) -> CapacityInputs:
        return self.inputs_by_policy[self.policies[0]]

    @classmethod
    def build(cls, config: SweepConfig, pp_size: int) -> SweepPlan:
        """Every input checked before torch is imported; raises CheckerInputError (exit 2)."""
        grid = parse_budgets(config.budgets)
        policies = list(config.policies)
        required = required_policies(config.require_consistent, policies)
        # Inputs are validated at the grid's first budget: every other input is budget-independent.
        inputs_by_policy = {
            p: capacity_inputs(
                config.model,
                config.sizing,
                budget_gib=grid.budgets[0],
                policy=p,
                pp_size=pp_size,
                env=os.environ,
            )
            for p in policies
        }
        for inp in inputs_by_policy.values():
            inp.slots_per_request()  # a strategy SGLang rejects fails here
        return cls(grid=grid, policies=policies, required=required, inputs_by_policy=inputs_by_policy)


@dataclass(frozen=True, kw_only=True)
class SweepFindings:
    """A (stages, policies, budgets, 3) stack and its analysis, analysed once."""

    plan: SweepPlan
    stack: torch.Tensor
    """int64 on CPU."""
    analysis: SweepSummary
    device: str
    mode: str = "single-process"
    world_size: int = 1

    @classmethod
    def analyse(cls, stack: torch.Tensor, plan: SweepPlan, **how: Any) -> SweepFindings:
        # torch: device.sweep imports it
        from checker.device.sweep import analyse

        return cls(plan=plan, stack=stack, analysis=analyse(stack, plan.grid.budgets, plan.policies), **how)

    @property
    def exit_code(self) -> int:
        policies = self.analysis["policies"]
        return EXIT_DIVERGENT if any(not policies[p]["consistent"] for p in self.plan.required) else 0


def present(config: SweepConfig, findings: SweepFindings) -> list[str]:
    """Print the findings, write --report and --plot; what could not be written (one line each: every
    other output is still written)."""

    plan = findings.plan
    report = build_report(
        findings.analysis,
        plan.grid,
        plan.inputs,
        plan.required,
        findings.device,
        config.sizing,
        mode=findings.mode,
        world_size=findings.world_size,
    )
    doc = document(
        report,
        lambda: [header(plan.inputs, plan.grid), "", text_report(report, plan.grid)],
        lambda: quiet_report(report, plan.grid),
    )
    emit(doc, config.output)
    problems = write_artifacts(doc, report=config.output.report)
    if config.plot:
        values = {p: findings.stack[:, i].numpy() for i, p in enumerate(plan.policies)}
        try:
            plot_sweep(
                config.plot,
                budgets=plan.grid.budgets,
                values=values,
                analysis=findings.analysis,
                title=plot_title(plan.inputs, plan.grid),
            )
        except CheckerInputError as exc:  # the PNG could not be written
            problems.append(str(exc))
    return problems


def present_and_exit(config: SweepConfig, findings: SweepFindings) -> int:
    """:func:`present` in one process: each output that could not be written named on stderr, and the
    exit code by the one policy for that (:func:`checker.status.exit_after_outputs`)."""
    problems = present(config, findings)
    for problem in problems:
        print(
            f"checker sweep: error: {problem}{undelivered_note(findings.exit_code)}",
            file=sys.stderr,
            flush=True,
        )
    return exit_after_outputs(findings.exit_code, undelivered=bool(problems))
