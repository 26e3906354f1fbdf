"""The run protocol: one rank's whole run over a process group, for any job (``check``, ``sweep``).

    exit_code = run(session, job)

The protocol owns the order of steps, every failure branch, the lock between finishing and aborting,
and the one exit code every rank leaves with. A :class:`Job` supplies pure pieces: this rank's local
facts, its payload, the outcome of what every rank sent, and how an outcome is published.

The steps, the same on every rank whatever its inputs (a rank that returns early is how hangs start):

1. arm the watchdog, the backstop and the SIGTERM watcher; make the group (a bad ``--backend`` is an
   ``error`` outcome on this rank: no exchange can happen).
2. ``job.local``: what this rank knows before any collective. A user's error here, or one this rank
   brought with it (its command line or environment could not be read: :func:`refused`), becomes the
   rank's header status and message; every rank still joins.
3. connect, then the header gather. Another wire schema -> ``error``. Any rank not ok -> the text gather
   of every rank's message -> ``error`` naming each failing rank, grouped by message.
   ``job.mismatch`` -> ``error`` (sweeps of different sizes).
4. ``job.payload`` behind a status prefix, in one gather: a rank whose payload raised still sends the
   agreed length and its message -> ``error`` naming it. Otherwise ``job.decide`` -> the outcome.
5. finish: rank 0 publishes, then announces its exit code in the store; every other rank waits for
   that announcement (bounded) and leaves with the same code, or prints the outcome itself when rank 0
   never announces. A non-zero code goes into torchrun's error file.

Failures: a collective that fails -> ``job.lost`` naming the gone ranks (rank 0 at once; the others only
if rank 0 never announces); a stale store -> ``error``; the watchdog or SIGTERM -> :meth:`_Run.abort`,
which publishes ``job.lost`` and leaves with 3. Finishing and aborting take one lock: whichever comes
first publishes, the other never does.

Where later work slots in: a watcher thread that names a lost rank while the others wait in a collective
calls :meth:`_Run.abort` (it takes the same lock); a fallback writer (the lowest surviving rank publishes
when rank 0 is lost) replaces ``job.fallback`` in :meth:`_Run.finish`'s branch where the announcement
never comes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar

from checker.bounded import call_bounded
from checker.core.errors import CheckerInputError
from checker.distributed.faults import maybe_inject
from checker.distributed.launch_env import RankEnv
from checker.distributed.session import Abort, Gathered, SchemaMismatch, record_for_torchrun
from checker.distributed.wire import Header, WireError
from checker.status import ERROR, EXIT_CODES, INFRASTRUCTURE_FAILURE, ROW_INTERNAL, ROW_OK

if TYPE_CHECKING:
    import torch

L = TypeVar("L")
O = TypeVar("O")  # noqa: E741 (the outcome type)

EXIT_INFRASTRUCTURE = EXIT_CODES[INFRASTRUCTURE_FAILURE]
GRACE_S = 3.0
"""How long the other ranks wait for rank 0's announcement after a verdict, or longer while rank 0 is
alive (its heartbeat advances) and still publishing, up to :data:`PUBLISH_WAIT_S`."""
PUBLISH_WAIT_S = 60.0
"""The longest another rank waits for a live rank 0 to publish: three bounded writes (report, JUnit,
step summary) and a plot, with room to spare."""
SIGTERM_BUDGET_S = 10.0
"""What rank 0 may spend publishing after SIGTERM: well inside torchrun's 30 s grace."""
ABORT_BUDGET_S = GRACE_S + 2 * 2.0 + 2
"""What an abort from the watchdog may spend naming the gone ranks and publishing."""
FINISH_S = PUBLISH_WAIT_S + ABORT_BUDGET_S + 10.0
"""The backstop's bound on finishing: waiting for a live rank 0, printing, the group's teardown."""


@dataclass(frozen=True, kw_only=True)
class RankError:
    """An error that ends the run before any outcome could be decided."""

    message: str
    ranks: tuple[int, ...] = ()
    """The ranks that reported it; empty: this rank's own finding, not exchanged (the same on every rank:
    a --backend it cannot use, a stale store, ranks of another checker version)."""

    def line(self) -> str:
        from checker.outputs.tables import rank_ranges

        return f"{rank_ranges(self.ranks)}: {self.message}" if self.ranks else self.message


def group_errors(messages: Sequence[str]) -> list[RankError]:
    """Each distinct message once, with the ranks that sent it (ranks with an empty message are ok)."""
    by: dict[str, list[int]] = {}
    for rank, message in enumerate(messages):
        if message:
            by.setdefault(message, []).append(rank)
    return [RankError(message=m, ranks=tuple(rs)) for m, rs in by.items()]


def internal_error(exc: BaseException) -> str:
    return f"internal error: {type(exc).__name__}: {exc}"


class Job(Protocol[L, O]):
    """What a command hands the protocol. ``local`` and ``payload`` may raise: a user's error as
    :class:`CheckerInputError`, anything else is reported as an internal error of that rank; every rank
    still joins every gather. The other pieces run where a rank cannot leave the others waiting: an
    exception there is a bug, printed with its traceback and ended as an ``error``."""

    name: str

    def local(self, device: torch.device | None) -> L:
        """What this rank knows before any collective (no collective here)."""
        ...

    def header(self, local: L) -> Header:
        """This rank's header: ``payload_len`` (and ``device_free_bytes`` where the job needs it); its
        ``rank`` and ``status`` are the protocol's."""
        ...

    def mismatch(self, headers: Sequence[Header]) -> str | None:
        """A disagreement the headers already show (then no payload is gathered), or None."""
        ...

    def payload(self, local: L, headers: Sequence[Header]) -> Sequence[int] | torch.Tensor:
        """This rank's ints for the payload gather, ``payload_len`` of them."""
        ...

    def decide(self, gathered: torch.Tensor, headers: Sequence[Header]) -> O:
        """The outcome from every rank's payload, (world_size, payload_len): the same on every rank."""
        ...

    def errors(self, errors: Sequence[RankError]) -> O:
        """The outcome when the run ends on errors before anything could be decided."""
        ...

    def lost(self, detail: str, missing_ranks: Sequence[int]) -> O:
        """The outcome when a rank is lost, hung or unreachable (or the run was stopped)."""
        ...

    def exit_code(self, outcome: O) -> int: ...

    def one_line(self, outcome: O) -> str:
        """The outcome in one line, for torchrun's error file."""
        ...

    def publish(self, outcome: O) -> str | None:
        """Rank 0: print the outcome, write its files. A problem that makes the run an error (a file
        the job cannot do without, not written), or None."""
        ...

    def fallback(self, outcome: O) -> None:
        """Another rank, when rank 0 never announces: print the outcome on this rank's stderr."""
        ...


class SessionLike(Protocol):
    """What the protocol asks of :class:`checker.distributed.session.Session` (tests hand a fake)."""

    @property
    def is_rank0(self) -> bool: ...
    @property
    def device(self) -> torch.device | None: ...
    @property
    def has_store(self) -> bool: ...

    env: RankEnv
    timings: dict[str, float]

    def elapsed_s(self) -> float: ...
    def start(self, on_abort: Callable[[str, bool], None]) -> Any: ...
    def stand_down(self, finish_s: float) -> None: ...
    def make_group(self) -> None: ...
    def connect(self) -> None: ...
    def exchange_headers(self, header: Header) -> list[Header]: ...
    def gather_text(self, text: str) -> list[str]: ...
    def gather_payload(self, status: int, text: str, body: Sequence[int] | torch.Tensor) -> Gathered: ...
    def failed(self, detail: str, *, stopping: bool = False, behind_is_hung: bool = True) -> Abort: ...
    def shorten_store_timeout(self) -> None: ...
    def mark_exiting(self, why: str) -> None: ...
    def announce(self, exit_code: int, line: str) -> None: ...
    def await_announcement(self, wait_s: float, *, while_alive_s: float = 0.0) -> tuple[int, str] | None: ...
    def close(self, exit_code: int, *, clean: bool) -> int: ...
    def exit_now(self, exit_code: int) -> NoReturn: ...
    def wait_for_exit(self, seconds: float) -> NoReturn: ...


runs_begun = 0
"""Runs this process has begun: an exception that escapes one must not start another (the CLI asks)."""


def run(session: SessionLike, job: Job[L, O], *, refused: RankError | None = None) -> int:
    """This rank's whole run; its exit code, the same on every rank. ``refused``: this rank cannot run
    the job (its command line or environment failed); it joins anyway so its error reaches the report."""
    global runs_begun
    runs_begun += 1
    return _Run(session, job, refused=refused).run()


class _Run(Generic[L, O]):
    def __init__(self, session: SessionLike, job: Job[L, O], *, refused: RankError | None) -> None:
        self.session, self.job, self.refused = session, job, refused
        self.rank: int = session.env.rank
        self._lock = threading.Lock()
        """Held by whichever of finish and abort comes first: only that one publishes."""

    def say(self, text: str) -> None:
        print(f"[rank {self.rank}] checker {self.job.name}: {text}", file=sys.stderr, flush=True)

    # -- the steps -----------------------------------------------------------------------------------
    def run(self) -> int:
        s, job = self.session, self.job
        s.start(self.abort)
        maybe_inject(self.rank, "start")
        try:
            s.make_group()
        except CheckerInputError as exc:  # --backend: this rank cannot join any exchange
            return self._error(str(exc), clean=False)
        local, status, message = self._local()
        try:
            s.connect()
            s.timings["init_s"] = s.elapsed_s()
            maybe_inject(self.rank, "exchange")
            mine = Header(rank=self.rank, status=status)
            if local is not None:
                mine = replace(job.header(local), rank=self.rank, status=ROW_OK)
            headers = s.exchange_headers(mine)
            if any(h.status != ROW_OK for h in headers):
                errors = group_errors(s.gather_text(message))
                return self.finish(lambda: job.errors(errors), record=False)
            why = job.mismatch(headers) or _size_mismatch(headers)
            if why:
                return self._error(why)
            assert local is not None  # every header is ok, this rank's too
            status, message, body = self._payload(local, headers)
            t0 = s.elapsed_s()
            gathered = s.gather_payload(status, message, body)
            s.timings["exchange_s"] = s.elapsed_s() - t0
            if any(st != ROW_OK for st in gathered.statuses):
                errors = group_errors(gathered.messages)
                return self.finish(lambda: job.errors(errors), record=False)
            outcome = job.decide(gathered.body, headers)
            maybe_inject(self.rank, "verdict")
        except CheckerInputError as exc:  # a stale rendezvous store: the user's to fix
            return self._error(str(exc), clean=False)
        except (SchemaMismatch, WireError) as exc:
            return self._error(str(exc))
        except Exception as exc:
            return self._failed(exc)
        return self.finish(lambda: outcome)

    def _error(self, message: str | None, *, clean: bool = True) -> int:
        """End on this rank's own finding (not exchanged; the same on every rank), after this rank's
        refusal when it has one (the exchange that would have carried it could not be reached)."""
        errors = [RankError(message=self.refused.message, ranks=(self.rank,))] if self.refused else []
        if message:
            errors.append(RankError(message=message))
        return self.finish(lambda: self.job.errors(errors), clean=clean)

    def _local(self) -> tuple[L | None, int, str]:
        if self.refused is not None:
            return None, CheckerInputError.code, self.refused.message
        try:
            return self.job.local(self.session.device), ROW_OK, ""
        except CheckerInputError as exc:
            return None, exc.code, str(exc)
        except Exception as exc:  # a bug or a broken environment: still join, still report
            return None, ROW_INTERNAL, internal_error(exc)

    def _payload(self, local: L, headers: Sequence[Header]) -> tuple[int, str, Sequence[int] | torch.Tensor]:
        try:
            return ROW_OK, "", self.job.payload(local, headers)
        except CheckerInputError as exc:
            status, message = exc.code, str(exc)
        except Exception as exc:
            status, message = ROW_INTERNAL, internal_error(exc)
        return status, message, [0] * headers[self.rank].payload_len  # the gather must still match

    def _failed(self, exc: Exception) -> int:
        from checker.distributed.group import InfrastructureFailure

        if self.refused is not None and isinstance(exc, InfrastructureFailure):
            return self._error(None, clean=False)  # its own error is what this rank knows for sure
        if not isinstance(exc, InfrastructureFailure):  # a bug in a job's piece: never silent
            import traceback

            traceback.print_exception(type(exc), exc, exc.__traceback__)
            return self._error(internal_error(exc), clean=False)
        # A collective failed. Rank 0 names the gone ranks and publishes at once; the others look for
        # them only if rank 0's announcement never comes (on a cut link every store call costs its bound).
        detail, timed_out = str(exc), exc.timed_out

        def lost() -> O:
            abort: Abort = self.session.failed(detail, behind_is_hung=timed_out)
            return self.job.lost(abort.detail, abort.missing_ranks)

        if self.session.is_rank0:
            return self.finish(lost, clean=False)
        return self.finish(lambda: self.job.lost(detail, []), clean=False, fallback=lost)

    # -- the end -------------------------------------------------------------------------------------
    def finish(
        self,
        decide: Callable[[], O],
        *,
        clean: bool = True,
        fallback: Callable[[], O] | None = None,
        record: bool = True,
    ) -> int:
        """Rank 0 publishes, then announces the exit code every rank leaves with; the others adopt it,
        or print their own outcome when it never comes (torchrun kills the rest on the first failure,
        so no rank may leave non-zero before rank 0 has published).

        ``record``: put a failing outcome in torchrun's error file. Not for ranks' own errors gathered
        before the job ran (a command line, an environment): rank 0 prints them once and the report
        names them; torchrun would repeat the line once per rank."""
        s, job = self.session, self.job
        s.stand_down(FINISH_S)
        if not self._lock.acquire(blocking=False):
            s.wait_for_exit(SIGTERM_BUDGET_S + ABORT_BUDGET_S)  # an abort is publishing; it ends the process
        if not clean:
            s.shorten_store_timeout()  # a store on a lost node must not hold us
        decided = decide()  # under the lock: an abort can no longer publish another verdict
        code, line = job.exit_code(decided), job.one_line(decided)
        if s.is_rank0:
            s.timings["total_s"] = s.elapsed_s()
            code, line = self._publish(decided, code, line)
            s.announce(code, line)
        else:
            heard = s.await_announcement(GRACE_S + 2, while_alive_s=PUBLISH_WAIT_S) if s.has_store else None
            if heard is not None:
                code, line = heard
            else:  # rank 0 is gone or unreachable: this rank's verdict must not be lost
                shown = fallback() if fallback is not None else decided
                call_bounded(lambda: job.fallback(shown), ABORT_BUDGET_S).report("printing the verdict")
                clean = False  # a store call may still hang in an abandoned thread
        if code and (record or line != job.one_line(decided)):
            record_for_torchrun(line)
        return s.close(code, clean=clean)

    def _publish(self, outcome: O, code: int, line: str) -> tuple[int, str]:
        try:
            problem = self.job.publish(outcome)
        except Exception as exc:  # a bug in rendering: never silent, and never a passing exit code
            import traceback

            traceback.print_exc()
            problem = f"the verdict could not be published: {internal_error(exc)}"
        if problem is None:
            return code, line
        self.say(f"error: {problem}")
        failed = code or EXIT_CODES[ERROR]
        return failed, f"checker {self.job.name} error: {problem}"

    def abort(self, detail: str, sigterm: bool) -> None:
        """The watchdog or SIGTERM (another thread): publish an infrastructure failure (rank 0; another
        rank prints its own unless it was merely told to stop), then leave with 3."""
        if not self._lock.acquire(blocking=False):
            return  # finishing or aborting already: that path publishes and leaves
        s, job = self.session, self.job
        # First: no rank may blame this one for stopping, whether told to stop or ending on its
        # watchdog (it leaves with a verdict, it is not lost).
        s.mark_exiting("sigterm" if sigterm else "watchdog")
        print(f"[rank {self.rank}] checker: {detail}", file=sys.stderr, flush=True)
        box: list[O] = [job.lost(detail, [])]
        if s.is_rank0 or not sigterm:

            def publish() -> None:
                abort = s.failed(detail, stopping=sigterm)
                box[0] = job.lost(abort.detail, abort.missing_ranks)
                if s.is_rank0:
                    s.timings["total_s"] = s.elapsed_s()
                    try:
                        job.publish(box[0])
                    finally:  # ranks waiting for rank 0 (its heartbeat still beats) stop waiting
                        s.announce(EXIT_INFRASTRUCTURE, job.one_line(box[0]))
                else:
                    job.fallback(box[0])

            budget = SIGTERM_BUDGET_S if sigterm else ABORT_BUDGET_S
            call_bounded(publish, budget, name="checker-abort").report("publishing the verdict")
        record_for_torchrun(job.one_line(box[0]))
        s.exit_now(EXIT_INFRASTRUCTURE)


def _size_mismatch(headers: Sequence[Header]) -> str | None:
    from checker.outputs.tables import rank_ranges

    by: dict[int, list[int]] = {}
    for h in headers:
        by.setdefault(h.payload_len, []).append(h.rank)
    if len(by) == 1:
        return None
    return "ranks send payloads of different lengths: " + "; ".join(
        f"{rank_ranges(rs)} {n} ints" for n, rs in by.items()
    )
