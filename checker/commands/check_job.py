"""``check`` as a job of the run protocol (:mod:`checker.distributed.exchange`): its pieces, no order.

local facts (layout, free device memory) -> header -> this rank's row (derived after the header gather,
which carries every rank's free memory) -> every rank's row -> the verdict -> the report, the JUnit
file, the step summary and stdout (rank 0).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

from checker import __version__
from checker.config import OutputOptions, PreflightConfig
from checker.distributed.exchange import JobContext, RankError
from checker.distributed.wire import ROW_LEN, Header, decode_row, encode_row
from checker.outputs import report
from checker.outputs.check_run import run_timings, summary_line, torch_version, weights_doc
from checker.outputs.render import emit, write_artifacts
from checker.outputs.report import launch_command_doc, one_line
from checker.preflight.derivation import LocalFacts, derive_row, local_facts
from checker.preflight.verdict import Verdict, decide, infrastructure_failure
from checker.status import ERROR

if TYPE_CHECKING:
    import torch

    from checker.core.sizing.row import RankRow


@dataclass(frozen=True, kw_only=True)
class CheckLocal:
    """What this rank knows: its local facts, then (after the header gather) the row it derived."""

    facts: LocalFacts
    row: RankRow | None = None
    derive_s: float | None = None
    """How long the derivation took (with what it measured itself, e.g. ``materialize_s``)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """What the derivation measured (``materialize_s``)."""


@dataclass(frozen=True, kw_only=True)
class CheckOutcome:
    """Everything the publisher needs besides its context: the verdict, the summary line, this rank's
    inputs whole, the derivation's timings."""

    verdict: Verdict
    summary: str
    """The first line of the text report: the world and what it derived."""
    before_rows: tuple[RankError, ...] = ()
    """Ranks that failed before any row was derived (a command line, an environment): printed as error
    lines on stderr, like a usage error, rather than as a report with no rows."""
    own_inputs: Mapping[str, str | None] = field(default_factory=dict)
    """The publishing rank's inputs whole (the wire cuts each text to its width)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """What the publishing rank's derivation measured: ``derive_s``, ``materialize_s``."""


@dataclass(frozen=True, kw_only=True)
class CheckJob:
    """One rank's preflight. ``config`` is None on a rank that could not read its command line: it
    only ever reports (the protocol never asks it for local facts or a row). Frozen: every piece is a
    function of its context and inputs."""

    config: PreflightConfig | None
    output: OutputOptions
    name: ClassVar[str] = "check"

    # -- before and during the exchange ----------------------------------------------------------------
    def local(self, ctx: JobContext) -> CheckLocal:
        assert self.config is not None
        return CheckLocal(facts=local_facts(self.config, ctx.env, ctx.device))

    def header(self, ctx: JobContext, local: CheckLocal) -> Header:
        return Header(rank=ctx.rank, device_free_bytes=local.facts.device_free_bytes, payload_len=ROW_LEN)

    def mismatch(self, headers: Sequence[Header]) -> str | None:
        return None  # a rank whose local facts failed says so in its row

    def payload(
        self, ctx: JobContext, local: CheckLocal, headers: Sequence[Header]
    ) -> tuple[CheckLocal, list[int]]:
        config = self.config
        assert config is not None
        t0 = time.monotonic()
        measured: dict[str, float] = {}
        row = derive_row(
            config,
            ctx.env,
            local.facts,
            all_free=[h.device_free_bytes for h in headers],
            torch_version=torch_version(),
            device=ctx.device,
            deadline=ctx.deadline,
            timings=measured,
        )
        derived = replace(local, row=row, derive_s=time.monotonic() - t0, timings=measured)
        return derived, encode_row(row)

    def decide(
        self, ctx: JobContext, local: CheckLocal, gathered: torch.Tensor, headers: Sequence[Header]
    ) -> CheckOutcome:
        assert self.config is not None
        rows = [decode_row(r) for r in gathered.tolist()]
        verdict = decide(rows, world_size=ctx.world_size, strict_inputs=self.config.strict_inputs)
        return self._outcome(ctx, local, verdict)

    def _outcome(
        self,
        ctx: JobContext,
        local: CheckLocal | None,
        verdict: Verdict,
        before_rows: tuple[RankError, ...] = (),
    ) -> CheckOutcome:
        row = local.row if local is not None else None
        if row is None:
            return CheckOutcome(verdict=verdict, summary=f"world {ctx.world_size}", before_rows=before_rows)
        assert local is not None and local.derive_s is not None and self.config is not None
        return CheckOutcome(
            verdict=verdict,
            summary=summary_line(self.config, row, world_size=ctx.world_size, backend=ctx.backend),
            before_rows=before_rows,
            own_inputs=dict(row.inputs),  # whole: the wire cuts each text to its width
            timings={**local.timings, "derive_s": local.derive_s},
        )

    # -- outcomes without rows -----------------------------------------------------------------------
    def errors(self, ctx: JobContext, local: CheckLocal | None, errors: Sequence[RankError]) -> CheckOutcome:
        # Each names its ranks and their hosts; a world of one has nobody else to tell it from.
        lines = [e.message if ctx.world_size == 1 else e.line() for e in errors]
        verdict = Verdict(status=ERROR, world_size=ctx.world_size, errors=lines)
        exchanged = tuple(errors) if any(e.ranks for e in errors) else ()
        return self._outcome(ctx, local, verdict, exchanged)

    def lost(
        self, ctx: JobContext, local: CheckLocal | None, detail: str, missing_ranks: Sequence[int]
    ) -> CheckOutcome:
        verdict = infrastructure_failure(
            world_size=ctx.world_size, detail=detail, missing_ranks=missing_ranks
        )
        return self._outcome(ctx, local, verdict)

    def exit_code(self, outcome: CheckOutcome) -> int:
        return outcome.verdict.exit_code

    def one_line(self, outcome: CheckOutcome) -> str:
        return one_line(outcome.verdict)

    # -- publishing ----------------------------------------------------------------------------------
    def publish(self, ctx: JobContext, outcome: CheckOutcome) -> str | None:
        """The publisher: every artefact (each write bounded), then stdout; what could not be written
        (the verdict still prints, and the run fails by :func:`checker.status.exit_after_outputs`)."""
        out, verdict = self.output, outcome.verdict
        elapsed = ctx.elapsed_s
        extra: dict[str, object] = {
            "checker_version": __version__,
            "torch_version": torch_version(),
            "backend": ctx.backend,
            "timings": run_timings(ctx.timings, outcome.timings, ctx.elapsed_s),
            "launch_command": launch_command_doc(self.config.launch if self.config is not None else None),
            "own_inputs": dict(outcome.own_inputs),
            **weights_doc(self.config, verdict.rows),
        }
        problems = []
        if out.plot and verdict.rows:
            from checker.outputs.stage_plot import check_plot  # optional dependency: matplotlib, --plot only

            problems.append(check_plot(out.plot, verdict.rows))
        doc = report.document(
            verdict,
            summary=outcome.summary,
            elapsed_s=elapsed,
            extra=extra,
            plot=out.plot if out.plot and not any(problems) else None,
            text=not outcome.before_rows,
        )
        problems += write_artifacts(
            doc, report=out.report, junit=out.junit, step_summary=not outcome.before_rows
        )
        if outcome.before_rows:  # ranks' own errors: one line each on stderr, as any usage error
            for line in self._error_lines(ctx, outcome.before_rows):
                print(line, file=sys.stderr, flush=True)
        emit(doc, out)
        return "; ".join(p for p in problems if p) or None

    def fallback(self, ctx: JobContext, outcome: CheckOutcome) -> None:
        if outcome.before_rows:
            text = "\n".join(self._error_lines(ctx, outcome.before_rows))
        else:
            text = report.to_text(outcome.verdict, summary=outcome.summary, elapsed_s=ctx.elapsed_s)
        print(f"[rank {ctx.rank}] " + text, file=sys.stderr, flush=True)

    def _error_lines(self, ctx: JobContext, errors: Sequence[RankError]) -> list[str]:
        """A message every rank gave is printed as given (a usage error reads as one); another names
        its ranks."""
        world = tuple(range(ctx.world_size))
        return [e.message if e.ranks == world else e.line() for e in errors]
