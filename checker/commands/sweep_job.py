"""The distributed sweep as a job of the run protocol (:mod:`checker.distributed.exchange`).

Under torchrun each rank derives only its own stage for every budget and policy, and ONE all-gather of
an int64 tensor (policies x budgets x 3 values) carries the whole sweep; every rank is a row, so tp
ranks of one stage must agree too. Rank 0 shows the findings (:func:`checker.commands.sweep_plan.present`),
or what went wrong: some rank's error, a lost rank (stderr, and ``--report``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from checker.commands.sweep_plan import SweepFindings, SweepPlan, present
from checker.config import OutputOptions, SweepConfig
from checker.core.errors import CheckerInputError
from checker.core.sizing.layout import layout
from checker.core.sizing.sizing import CHECKED_VALUES
from checker.device.choice import sweep_device, use_one_cpu_thread
from checker.distributed.exchange import JobContext, RankError
from checker.distributed.launch_env import RankEnv
from checker.distributed.liveness import describe
from checker.distributed.wire import Header
from checker.outputs.progress import Progress, progress_wanted
from checker.outputs.render import emit, write_artifacts
from checker.outputs.sweep_report import document, failure_report
from checker.status import CONSISTENT, DIVERGENT, ERROR, EXIT_CODES, INFRASTRUCTURE_FAILURE

if TYPE_CHECKING:  # torch is imported when the sweep runs, so --help and input errors cost none
    import torch


@dataclass(frozen=True, kw_only=True)
class SweepLocal:
    plan: SweepPlan
    payload: Any
    """torch.Tensor: this rank's stage, (policies x budgets x 3) int64, flattened."""


@dataclass(frozen=True, kw_only=True)
class SweepOutcome:
    status: str
    world_size: int = 1
    findings: SweepFindings | None = None
    errors: tuple[RankError, ...] = ()
    missing_ranks: tuple[int, ...] = ()
    detail: str = ""

    @property
    def exit_code(self) -> int:
        return self.findings.exit_code if self.findings is not None else EXIT_CODES[self.status]

    def lines(self) -> list[str]:
        """What went wrong, one line each (errors and lost ranks; findings print as a table)."""
        if self.status == INFRASTRUCTURE_FAILURE:
            return [f"{self.detail}; missing: {describe(self.missing_ranks)}"]
        return [_error_line(e) for e in self.errors]

    def failure_report(self) -> dict[str, object]:
        """The ``--report`` document of a sweep that ended without findings."""
        return failure_report(
            status=self.status,
            world_size=self.world_size,
            errors=[e.line() for e in self.errors],
            missing_ranks=self.missing_ranks,
            infrastructure_detail=self.detail or None,
        )


def _error_line(error: RankError) -> str:
    if not error.ranks:
        return error.message
    return f"{error.where()} could not derive the sweep: {error.message}"


@dataclass(frozen=True, kw_only=True)
class SweepJob:
    """Each rank derives its own stage for every budget and policy. ``config`` is None on a rank that
    could not read its command line: it only ever reports. Frozen: every piece is a function of its
    context and inputs."""

    config: SweepConfig | None
    output: OutputOptions
    name: ClassVar[str] = "sweep"

    def local(self, ctx: JobContext) -> SweepLocal:
        try:
            return self._derive(ctx.env, ctx.device)
        except CheckerInputError as exc:
            _say(ctx, ERROR, str(exc))  # on this rank's own log too (a node's log may be all one reads)
            raise

    def _derive(self, env: RankEnv, device: torch.device | None) -> SweepLocal:
        # torch: device.sweep imports it
        from checker.device.sweep import local_sweep

        config = self.config
        assert config is not None
        pp_size, pp_rank = layout(
            env.world_size,
            env.rank,
            pp_size=config.sizing.pp_size,
            tp_size=config.sizing.tp_size,
            dp_size=config.sizing.dp_size,
        )
        plan = SweepPlan.build(config, pp_size)
        if device is None or device.type != "cuda":
            device = sweep_device(config.device)
        use_one_cpu_thread(device)
        # Rank 0 reports progress for its own stage (every rank derives one stage, in parallel).
        progress = Progress(
            1,
            f"{len(plan.grid):,} budgets x {len(plan.policies)} policies on each of {env.world_size} ranks",
            enabled=env.rank == 0 and progress_wanted(config.progress, len(plan.grid)),
        )
        payload = local_sweep(plan.inputs_by_policy, pp_rank, plan.grid.budgets, device).reshape(-1)
        progress.step()
        progress.close()
        return SweepLocal(plan=plan, payload=payload)

    def header(self, ctx: JobContext, local: SweepLocal) -> Header:
        return Header(rank=ctx.rank, payload_len=int(local.payload.numel()))

    def mismatch(self, headers: Sequence[Header]) -> str | None:
        if len({h.payload_len for h in headers}) > 1:
            return "ranks derive sweeps of different sizes: pass the same --budgets and --policy everywhere"
        return None

    def payload(
        self, ctx: JobContext, local: SweepLocal, headers: Sequence[Header]
    ) -> tuple[SweepLocal, torch.Tensor]:
        payload: torch.Tensor = local.payload
        return local, payload

    def decide(
        self, ctx: JobContext, local: SweepLocal, gathered: torch.Tensor, headers: Sequence[Header]
    ) -> SweepOutcome:
        plan = local.plan
        stack = gathered.view(ctx.world_size, len(plan.policies), len(plan.grid), len(CHECKED_VALUES))
        findings = SweepFindings.analyse(
            stack,
            plan,
            device=str(ctx.device),
            mode="distributed",
            world_size=ctx.world_size,
        )
        status = DIVERGENT if findings.exit_code else CONSISTENT
        return SweepOutcome(status=status, findings=findings)

    def errors(self, ctx: JobContext, local: SweepLocal | None, errors: Sequence[RankError]) -> SweepOutcome:
        return SweepOutcome(status=ERROR, world_size=ctx.world_size, errors=tuple(errors))

    def lost(
        self, ctx: JobContext, local: SweepLocal | None, detail: str, missing_ranks: Sequence[int]
    ) -> SweepOutcome:
        return SweepOutcome(
            status=INFRASTRUCTURE_FAILURE,
            world_size=ctx.world_size,
            detail=detail,
            missing_ranks=tuple(missing_ranks),
        )

    def exit_code(self, outcome: SweepOutcome) -> int:
        return outcome.exit_code

    def one_line(self, outcome: SweepOutcome) -> str:
        if outcome.findings is not None:
            return f"checker sweep: a required policy diverges (exit {outcome.exit_code})"
        return f"checker sweep {outcome.status}: " + "; ".join(outcome.lines())

    def publish(self, ctx: JobContext, outcome: SweepOutcome) -> str | None:
        """The publisher: the findings (stdout, --report, --plot), or what went wrong (stderr, and
        --report); what could not be written, or None."""
        if outcome.findings is not None:
            assert self.config is not None
            return "; ".join(present(self.config, outcome.findings)) or None
        for line in outcome.lines():
            _say(ctx, outcome.status, line)
        doc = document(outcome.failure_report())
        emit(doc, self.output)
        return "; ".join(write_artifacts(doc, report=self.output.report)) or None

    def fallback(self, ctx: JobContext, outcome: SweepOutcome) -> None:
        for line in outcome.lines():
            _say(ctx, outcome.status, line)


def _say(ctx: JobContext, status: str, detail: str) -> None:
    print(f"[rank {ctx.rank}] checker sweep: {status}: {detail}", file=sys.stderr, flush=True)
