"""``check`` as a job of the run protocol (:mod:`checker.distributed.exchange`): its pieces, no order.

local facts (layout, free device memory) -> header -> this rank's row (derived after the header gather,
which carries every rank's free memory) -> every rank's row -> the verdict -> the report, the JUnit
file, the step summary and stdout (rank 0).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from checker import __version__
from checker.config import OutputOptions, PreflightConfig
from checker.core.weights_source import WeightsSource
from checker.distributed.exchange import RankError
from checker.distributed.launch_env import RankEnv
from checker.distributed.session import Session
from checker.distributed.wire import ROW_LEN, Header, decode_row, encode_row
from checker.outputs import report
from checker.outputs.report import launch_command_doc, one_line
from checker.preflight.derivation import LocalFacts, derive_row, local_facts
from checker.preflight.verdict import Verdict, decide, infrastructure_failure
from checker.status import ERROR

if TYPE_CHECKING:
    import torch

    from checker.core.row import RankRow


@dataclass(frozen=True, kw_only=True)
class CheckOutcome:
    verdict: Verdict
    summary: str
    """The first line of the text report: the world and what it derived."""
    before_rows: tuple[RankError, ...] = ()
    """Ranks that failed before any row was derived (a command line, an environment): printed as error
    lines on stderr, like a usage error, rather than as a report with no rows."""


class CheckJob:
    """One rank's preflight. ``config`` is None on a rank that could not read its command line: it
    only ever reports (the protocol never asks it for local facts or a row)."""

    name = "check"

    def __init__(
        self, *, config: PreflightConfig | None, env: RankEnv, session: Session, output: OutputOptions
    ) -> None:
        self.config, self.env, self.session, self.output = config, env, session, output
        self.summary = f"world {env.world_size}"
        self.own_inputs: dict[str, str | None] = {}

    # -- before and during the exchange ----------------------------------------------------------------
    def local(self, device: torch.device | None) -> LocalFacts:
        assert self.config is not None
        return local_facts(self.config, self.env, device)

    def header(self, local: LocalFacts) -> Header:
        return Header(rank=self.env.rank, device_free_bytes=local.device_free_bytes, payload_len=ROW_LEN)

    def mismatch(self, headers: Sequence[Header]) -> str | None:
        return None  # a rank whose local facts failed says so in its row

    def payload(self, local: LocalFacts, headers: Sequence[Header]) -> list[int]:
        config, session = self.config, self.session
        assert config is not None
        t0 = time.monotonic()
        row = derive_row(
            config,
            self.env,
            local,
            all_free=[h.device_free_bytes for h in headers],
            torch_version=_torch_version(),
            device=session.device,
            deadline=session.t0 + config.group.timeout_s,
            timings=session.timings,
        )
        session.timings["derive_s"] = time.monotonic() - t0
        self.summary = self._summary(row)
        self.own_inputs = dict(row.inputs)  # whole: the wire cuts each text to its width
        return encode_row(row)

    def decide(self, gathered: torch.Tensor, headers: Sequence[Header]) -> CheckOutcome:
        assert self.config is not None
        rows = [decode_row(r) for r in gathered.tolist()]
        verdict = decide(rows, world_size=self.env.world_size, strict_inputs=self.config.strict_inputs)
        return CheckOutcome(verdict=verdict, summary=self.summary)

    # -- outcomes without rows -----------------------------------------------------------------------
    def errors(self, errors: Sequence[RankError]) -> CheckOutcome:
        # Each names its ranks and their hosts; a world of one has nobody else to tell it from.
        lines = [e.message if self.env.world_size == 1 else e.line() for e in errors]
        verdict = Verdict(status=ERROR, world_size=self.env.world_size, errors=lines)
        exchanged = tuple(errors) if any(e.ranks for e in errors) else ()
        return CheckOutcome(verdict=verdict, summary=self.summary, before_rows=exchanged)

    def lost(self, detail: str, missing_ranks: Sequence[int]) -> CheckOutcome:
        verdict = infrastructure_failure(
            world_size=self.env.world_size, detail=detail, missing_ranks=missing_ranks
        )
        return CheckOutcome(verdict=verdict, summary=self.summary)

    def exit_code(self, outcome: CheckOutcome) -> int:
        return outcome.verdict.exit_code

    def one_line(self, outcome: CheckOutcome) -> str:
        return one_line(outcome.verdict)

    # -- publishing ----------------------------------------------------------------------------------
    def publish(self, outcome: CheckOutcome) -> str | None:
        """The publisher: every artefact (each write bounded), then stdout; what could not be written
        (the verdict still prints, and the run fails by :func:`checker.status.exit_after_outputs`)."""

        out, verdict, session = self.output, outcome.verdict, self.session
        elapsed = session.elapsed_s()
        extra: dict[str, object] = {
            "checker_version": __version__,
            "torch_version": _torch_version(),
            "backend": session.backend,
            "timings": {**session.timings, "total_s": elapsed},
            "launch_command": launch_command_doc(self.config.launch if self.config is not None else None),
            "own_inputs": self.own_inputs,
            **_weights_doc(self.config, verdict.rows),
        }
        problems = report.write_all(
            verdict,
            report=out.report,
            junit=out.junit,
            summary=outcome.summary,
            elapsed_s=elapsed,
            extra=extra,
            step_summary=not outcome.before_rows,
        )
        if outcome.before_rows:  # ranks' own errors: one line each on stderr, as any usage error
            for line in self._error_lines(outcome.before_rows):
                print(line, file=sys.stderr, flush=True)
        if not outcome.before_rows or out.format == "json":
            report.print_verdict(
                verdict,
                summary=outcome.summary,
                elapsed_s=elapsed,
                format=out.format,
                quiet=out.quiet,
                extra=extra,
            )
        return "; ".join(problems) or None

    def fallback(self, outcome: CheckOutcome) -> None:
        if outcome.before_rows:
            text = "\n".join(self._error_lines(outcome.before_rows))
        else:
            text = report.to_text(
                outcome.verdict, summary=outcome.summary, elapsed_s=self.session.elapsed_s()
            )
        print(f"[rank {self.env.rank}] " + text, file=sys.stderr, flush=True)

    def _error_lines(self, errors: Sequence[RankError]) -> list[str]:
        """A message every rank gave is printed as given (a usage error reads as one); another names
        its ranks."""
        world = tuple(range(self.env.world_size))
        return [e.message if e.ranks == world else e.line() for e in errors]

    def _summary(self, row: RankRow) -> str:
        c = self.config
        assert c is not None
        # Only what is known: a rank that failed before laying out the world or resolving its budget,
        # model or release says what it was given instead (never a "?" for a value the user passed).
        w, tp, dp = self.env.world_size, c.sizing.tp_size, c.sizing.dp_size
        # The TP group, SGLang's --tp-size: attention TP x attention DP (the checker's --tp-size is the
        # attention TP width).
        group = f"tp {tp}" if dp == 1 else f"tp {c.sizing.tp_group_size} (attention TP {tp} x DP {dp})"
        given = f"--tp-size {tp}" if dp == 1 else group
        if row.pp_size > 0:
            layout = f"world {w} = pp {row.pp_size} x {group}"
        elif c.sizing.pp_size:
            layout = f"world {w}, --pp-size {c.sizing.pp_size} x {given} given"
        else:
            layout = f"world {w}, {given}"
        if row.budget_gib is not None:
            budget = f"budget {row.budget_gib:.6g} GiB ({c.budget.label})"
        elif c.budget.budget_gib is not None:
            budget = f"budget {c.budget.budget_gib:g} GiB ({c.budget.label})"
        else:
            budget = f"budget from {c.budget.label}"
        model = row.inputs.get("model") or c.model.label
        parts = [f"{layout}, {self.session.backend}", f"{model}, {budget}"]
        release = row.inputs.get("derived_as")
        if release:
            parts.append(release + (f", policy {c.sizing.policy}" if c.sizing.policy else ""))
        elif c.sizing.policy:
            parts.append(f"policy {c.sizing.policy}")
        return "; ".join(parts)


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "?"))


def _weights_doc(config: PreflightConfig | None, rows: Sequence[RankRow] = ()) -> dict[str, object]:
    """The weights figures the budget used, whole (the ranks' ``budget_source`` text is cut at the wire's
    width): what the post-flight holds each rank's logged ``mem usage`` to. Empty without a device
    budget. Figures from the checkpoint are each rank's own, from the rows (rank order)."""
    if config is None or not config.budget.from_device:
        return {}
    b = config.budget
    if not b.weights_gib and rows and all(r.weights_source == int(WeightsSource.CHECKPOINT) for r in rows):
        figures = [r.weights_bytes / 2**30 for r in sorted(rows, key=lambda r: r.rank)]
        return {
            "weights_gib": [round(f, 6) for f in figures],
            "weights_source": "the checkpoint: each rank's parameters as its release's class holds them, "
            "plus the stated margin",
        }
    return {
        "weights_gib": list(b.weights_gib) or [0.0],
        "weights_source": b.weights_source or ("--weights-gib" if b.weights_gib else "none (0 GiB)"),
    }
