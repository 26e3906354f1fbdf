"""The run protocol: one rank's whole run over a process group, for any job (``check``, ``sweep``).

    exit_code = run(session, job, refused=None)

The protocol owns the order of steps, every failure branch, the lock between finishing and aborting,
and the one exit code every rank leaves with. A :class:`Job` supplies pure pieces, each handed a fresh
:class:`JobContext` (rank, backend, device, deadline, timings): this rank's local facts, its payload,
the outcome of what every rank sent, and how an outcome is published. The protocol keeps the run's
state (the timings, what the job's last step returned); the job keeps none.

The steps, the same on every rank whatever its inputs (a rank that returns early is how hangs start):

1. arm the watchdog, the backstop and the SIGTERM watcher; make the group. A rank that cannot use its
   ``--backend`` cannot take part in the group: it joins the store only, says why there, and rank 0's
   watcher ends the run with an ``error`` naming it (:meth:`_Run._outside`, :meth:`_Run.refusal_seen`).
2. ``job.local``: what this rank knows before any collective. A user's error here, or one this rank
   brought with it (its command line or environment could not be read: ``refused``), becomes the
   rank's header status and message; every rank still joins.
3. connect, then the header gather. Another wire schema -> ``error``. Any rank not ok -> the text gather
   of every rank's message -> ``error`` naming each failing rank and its host, grouped by message.
   ``job.mismatch`` -> ``error`` (sweeps of different sizes).
4. ``job.payload`` behind a status prefix, in one gather: a rank whose payload raised still sends the
   agreed length and its message -> ``error`` naming it. Otherwise ``job.decide`` -> the outcome.
5. finish: the holder of the publisher lease (rank 0 first) publishes, then announces its exit code in
   the store; every other rank waits for that announcement and leaves with the same code. The lease
   lasts while its holder beats: when the holder stops (killed or frozen after the exchange, or while
   it publishes), the first survivor to take the lease over publishes an ``infrastructure_failure``
   naming it, and the others adopt that verdict (:meth:`_Run._await_publisher`). A rank no verdict can
   reach (its store is gone) prints its own. A non-zero code goes into torchrun's error file.

Failures: a collective that fails -> ``job.lost`` naming the gone ranks (rank 0 at once; the others only
if the publisher's lease lapses); a stale store -> ``error``; the watchdog or SIGTERM -> :meth:`_Run.abort`,
which adopts a verdict already published, or publishes ``job.lost`` and leaves with 3. Finishing and
aborting take one lock: whichever comes first publishes, the other never does.

The watcher (:mod:`checker.distributed.watcher`) names a rank that stopped beating while the others
still wait, in seconds: rank 0 ends the run through :meth:`_Run.abort` (the same lock); when rank 0 is
the one lost, the lowest surviving rank publishes in its place (:meth:`_Run._stands_in`). Exactly one
rank publishes: each claims the store's publisher lease first, and a lease is taken over only from a
holder whose beat stopped, by one compare-and-set. A rank that sees a verdict published while it still
waits leaves with its exit code (:meth:`_Run.announced`).

Every exit code comes from :mod:`checker.status` (the job's verdict, :data:`EXIT_INFRASTRUCTURE`,
:func:`checker.status.exit_after_outputs`).
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar

from checker.bounded import call_bounded
from checker.core.errors import CheckerInputError
from checker.core.ranks import rank_ranges
from checker.distributed.faults import maybe_inject
from checker.distributed.launch_env import RankEnv
from checker.distributed.liveness import LOST_AFTER_S, describe
from checker.distributed.session import (
    BEAT_STOPPED,
    BEHIND,
    HELD,
    NEVER_JOINED,
    Abort,
    Arrivals,
    Gathered,
    SchemaMismatch,
    Wait,
    record_for_torchrun,
)
from checker.distributed.watcher import WATCHERS
from checker.distributed.wire import Header, WireError
from checker.status import (
    EXIT_CODES,
    INFRASTRUCTURE_FAILURE,
    ROW_INTERNAL,
    ROW_OK,
    exit_after_outputs,
    undelivered_note,
)

if TYPE_CHECKING:
    import torch

L = TypeVar("L")
O = TypeVar("O")  # noqa: E741 (the outcome type)

EXIT_INFRASTRUCTURE = EXIT_CODES[INFRASTRUCTURE_FAILURE]
PUBLISH_WAIT_S = 60.0
"""The longest a publisher may hold its lease without publishing: three bounded writes (report, JUnit,
step summary) and a plot, with room to spare. Then it is held lost (alive but stuck) and a survivor
publishes in its place; a publisher that stops beating is taken over long before."""
SIGTERM_BUDGET_S = 10.0
"""What rank 0 may spend publishing after SIGTERM: well inside torchrun's 30 s grace."""
ABORT_BUDGET_S = 10.0
"""What an abort from the watchdog may spend naming the gone ranks and publishing."""
FINISH_S = PUBLISH_WAIT_S + 2 * LOST_AFTER_S + 2 * ABORT_BUDGET_S + 10.0
"""The backstop's bound on finishing, past ``--timeout-s`` (the wait for every rank to arrive): waiting for
a live publisher, publishing in its place, printing, the group's teardown."""


@dataclass(frozen=True, kw_only=True)
class RankError:
    """An error that ends the run before any outcome could be decided."""

    message: str
    ranks: tuple[int, ...] = ()
    """The ranks that reported it; empty: a finding the same on every rank (ranks of another checker
    version, a stale store), named by its message."""
    hosts: Mapping[int, str] = field(default_factory=dict)
    """Where those ranks run, where known (the publishing rank looks them up)."""

    def where(self) -> str:
        """``rank 2 (node-b)``: the ranks, and their hosts where known."""
        return describe(self.ranks, self.hosts)

    def line(self) -> str:
        return f"{self.where()}: {self.message}" if self.ranks else self.message


def group_errors(messages: Sequence[str]) -> list[RankError]:
    """Each distinct message once, with the ranks that sent it (ranks with an empty message are ok)."""
    by: dict[str, list[int]] = {}
    for rank, message in enumerate(messages):
        if message:
            by.setdefault(message, []).append(rank)
    return [RankError(message=m, ranks=tuple(rs)) for m, rs in by.items()]


def internal_error(exc: BaseException) -> str:
    return f"internal error: {type(exc).__name__}: {exc}"


@dataclass(frozen=True, kw_only=True)
class JobContext:
    """What the protocol hands a job at each step: who this rank is, where it computes, and how long the
    run has taken so far. Frozen, and made afresh for each step: a job keeps nothing between calls."""

    env: RankEnv
    """This rank: ``rank``, ``world_size``, ``local_rank``, ``host``, ..."""
    backend: str
    """The process group's backend (``gloo``, ``nccl``), or the one asked for before the group exists."""
    device: torch.device | None
    """Where this rank computes (the group's device), None before the group is made."""
    deadline: float
    """The session clock's time (``time.monotonic()`` in a run) by which ``--timeout-s`` ends: a job's
    long step (materializing) stops by it."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """The protocol's timings so far, seconds from this rank's start: ``init_s``, ``exchange_s``,
    ``total_s`` (when publishing)."""
    elapsed_s: float = 0.0
    """Seconds from this rank's start when this context was made."""

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @classmethod
    def of(cls, rank: RankFacts, timings: Mapping[str, float]) -> JobContext:
        """This rank's facts and clock now, with the protocol's timings so far."""
        return cls(
            env=rank.env,
            backend=rank.backend,
            device=rank.device,
            deadline=rank.deadline,
            timings=dict(timings),
            elapsed_s=rank.elapsed_s(),
        )


class Job(Protocol[L, O]):
    """What a command hands the protocol: pure pieces, each a function of the :class:`JobContext` and
    its inputs (a job holds only what it was built with; nothing is kept between calls). ``local`` and
    ``payload`` may raise: a user's error as :class:`CheckerInputError`, anything else is reported as an
    internal error of that rank; every rank still joins every gather. The other pieces run where a rank
    cannot leave the others waiting: an exception there is a bug, printed with its traceback and ended
    as an ``error``."""

    @property
    def name(self) -> str: ...

    def local(self, ctx: JobContext) -> L:
        """What this rank knows before any collective (no collective here)."""
        ...

    def header(self, ctx: JobContext, local: L) -> Header:
        """This rank's header: ``payload_len`` (and ``device_free_bytes`` where the job needs it); its
        ``rank`` and ``status`` are the protocol's."""
        ...

    def mismatch(self, headers: Sequence[Header]) -> str | None:
        """A disagreement the headers already show (then no payload is gathered), or None."""
        ...

    def payload(
        self, ctx: JobContext, local: L, headers: Sequence[Header]
    ) -> tuple[L, Sequence[int] | torch.Tensor]:
        """What this rank knows now (``local`` with what it derived from the headers) and its ints for
        the payload gather, ``payload_len`` of them. The protocol hands that ``local`` on to ``decide``."""
        ...

    def decide(self, ctx: JobContext, local: L, gathered: torch.Tensor, headers: Sequence[Header]) -> O:
        """The outcome from every rank's payload, (world_size, payload_len): the same verdict on every rank,
        with everything publishing needs."""
        ...

    def errors(self, ctx: JobContext, local: L | None, errors: Sequence[RankError]) -> O:
        """The outcome when the run ends on errors before anything could be decided (``local``: what
        this rank knew by then, None when its local facts failed)."""
        ...

    def lost(self, ctx: JobContext, local: L | None, detail: str, missing_ranks: Sequence[int]) -> O:
        """The outcome when a rank is lost, hung or unreachable (or the run was stopped)."""
        ...

    def exit_code(self, outcome: O) -> int: ...

    def one_line(self, outcome: O) -> str:
        """The outcome in one line, for torchrun's error file."""
        ...

    def publish(self, ctx: JobContext, outcome: O) -> str | None:
        """The publisher: print the outcome, write its files. What could not be delivered (one line
        naming each output), or None: the run then fails by :func:`checker.status.exit_after_outputs`."""
        ...

    def fallback(self, ctx: JobContext, outcome: O) -> None:
        """Another rank, when no verdict can reach it: print the outcome on this rank's stderr."""
        ...


class RankFacts(Protocol):
    """Who this rank is, where it computes and its clock: what a :class:`JobContext` is made of
    (:meth:`JobContext.of`), and the bound every wait for another rank is given."""

    env: RankEnv

    @property
    def backend(self) -> str: ...
    @property
    def device(self) -> torch.device | None: ...
    @property
    def deadline(self) -> float: ...
    @property
    def timeout_s(self) -> float: ...
    def elapsed_s(self) -> float: ...


class Collectives(Protocol):
    """The process group and its gathers (steps 1, 3 and 4): make it, join its store, gather; after a
    collective failed, name the ranks that are gone."""

    def make_group(self, *, needs_device: bool = True) -> None: ...
    def join(self) -> None: ...
    def connect(self) -> None: ...
    def exchange_headers(self, header: Header) -> list[Header]: ...
    def gather_text(self, text: str) -> list[str]: ...
    def gather_payload(self, status: int, text: str, body: Sequence[int] | torch.Tensor) -> Gathered: ...
    def failed(self, detail: str, *, stopping: bool = False, behind_is_hung: bool = True) -> Abort: ...


class Roster(Protocol):
    """What the store holds about the ranks: who joined, where each runs, which cannot take part and
    why; and this rank's own mark as it leaves."""

    store_lost: bool

    @property
    def joined(self) -> bool: ...
    def await_joined(self) -> bool: ...
    def hosts(self, ranks: Sequence[int]) -> dict[int, str]: ...
    def refuse(self, message: str) -> None: ...
    def refusals(self, ranks: Sequence[int]) -> dict[int, str]: ...
    def mark_exiting(self, why: str) -> None: ...


class Verdict(Protocol):
    """The publisher lease and the announcement (step 5): which rank publishes, that every rank reached
    the verdict, and the exit code every rank leaves with."""

    @property
    def may_publish_alone(self) -> bool: ...
    def claim_publisher(
        self, *, default: bool, lost: Sequence[int] = (), unclaimed_by: Sequence[int] = ()
    ) -> bool: ...
    def earlier_publishers(self) -> list[int]: ...
    def arrive(self) -> None: ...
    def await_arrivals(self, within_s: float) -> Arrivals: ...
    def announce(self, exit_code: int, line: str) -> None: ...
    def announcement(self) -> tuple[int, str] | None: ...
    def await_announcement(
        self, within_s: float, *, patience_s: float = ..., held_s: float = ...
    ) -> Wait: ...


class Lifetime(Protocol):
    """This rank's timers and its way out: arm the watchdog, the backstop and the watchers, stand them
    down for the finish, and leave (cleanly, at once, or once another thread has ended the process)."""

    def start(
        self,
        on_abort: Callable[[str, bool], None],
        *,
        on_lost: Callable[[Sequence[int]], None],
        on_announced: Callable[[], None],
        on_refused: Callable[[Sequence[int]], None],
    ) -> Any: ...
    def stand_down(self, finish_s: float) -> None: ...
    def shorten_store_timeout(self) -> None: ...
    def close(self, exit_code: int, *, clean: bool) -> int: ...
    def exit_now(self, exit_code: int) -> NoReturn: ...
    def wait_for_exit(self, seconds: float) -> NoReturn: ...


class SessionLike(RankFacts, Collectives, Roster, Verdict, Lifetime, Protocol):
    """What the protocol asks of :class:`checker.distributed.session.Session` (the real one over a fake
    group and store in tests/seam.py; a scripted one in tests/fakes.py): its five roles together, since
    :class:`_Run` drives the whole lifecycle. A piece that needs less asks for one role (:class:`RankFacts`,
    :class:`Collectives`, :class:`Roster`, :class:`Verdict`, :class:`Lifetime`)."""


def placed(roster: Roster, errors: Sequence[RankError]) -> list[RankError]:
    """``errors`` with the hosts of their ranks, as the store holds them (one bounded store read)."""
    where = roster.hosts(sorted({r for e in errors for r in e.ranks}))
    return [replace(e, hosts={r: where[r] for r in e.ranks if r in where}) for e in errors]


def run(session: SessionLike, job: Job[L, O], *, refused: RankError | None = None) -> int:
    """This rank's whole run; its exit code, the same on every rank. ``refused``: this rank cannot run
    the job (its command line or environment failed); it joins anyway so its error reaches the report."""
    return _Run(session, job, refused=refused).run()


class _Run(Generic[L, O]):
    def __init__(self, session: SessionLike, job: Job[L, O], *, refused: RankError | None) -> None:
        self.session, self.job, self.refused = session, job, refused
        self.rank: int = session.env.rank
        self.is_rank0 = self.rank == 0
        self._lock = threading.Lock()
        """Held by whichever of finish and abort comes first: only that one publishes."""
        self._finishing = False
        """The lock's holder is :meth:`finish` (SIGTERM then still ends the rank)."""
        self._gate = threading.Lock()
        """The right to publish (or print) a verdict on this rank: finish takes it before it publishes,
        SIGTERM's thread when it ends a finishing rank; whoever is second waits for the process to end."""
        self._decided: O | None = None
        """The outcome every rank decided from the last gather, once known (an abort's detail says it)."""
        self.timings: dict[str, float] = {}
        """The protocol's own: init_s, exchange_s, total_s (handed to the job in each context)."""
        self.known: L | None = None
        """What this rank's job knew last (its ``local``, then what its ``payload`` derived): handed back
        to the job for an outcome without rows (the protocol keeps the state, the job keeps none)."""

    def context(self) -> JobContext:
        """A fresh context for the next step of the job: the timings so far."""
        return JobContext.of(self.session, self.timings)

    def say(self, text: str) -> None:
        print(f"[rank {self.rank}] checker {self.job.name}: {text}", file=sys.stderr, flush=True)

    # -- the steps -----------------------------------------------------------------------------------
    def run(self) -> int:
        s, job = self.session, self.job
        s.start(self.abort, on_lost=self.lost_seen, on_announced=self.announced, on_refused=self.refusal_seen)
        maybe_inject(self.rank, "start")
        try:
            s.make_group(needs_device=self.refused is None)
        except CheckerInputError as exc:  # --backend: this rank cannot take part in the group
            return self._outside(str(exc))
        try:
            # The store first: from here the watchers see this rank (a rank frozen while it reads its
            # local facts is named in seconds) and any report names its host.
            s.join()
            local, status, message = self._local()
            s.connect()
            self.timings["init_s"] = s.elapsed_s()
            maybe_inject(self.rank, "exchange")
            mine = Header(rank=self.rank, status=status)
            if local is not None:
                mine = replace(job.header(self.context(), local), rank=self.rank, status=ROW_OK)
            headers = s.exchange_headers(mine)
            if any(h.status != ROW_OK for h in headers):
                return self._ranks_failed(group_errors(self._whole(s.gather_text(message), message)))
            why = job.mismatch(headers) or _size_mismatch(headers)
            if why:
                return self._error(why)
            assert local is not None  # every header is ok, this rank's too
            status, message, body = self._payload(local, headers)
            local = self.known if self.known is not None else local
            t0 = s.elapsed_s()
            gathered = s.gather_payload(status, message, body)
            self.timings["exchange_s"] = s.elapsed_s() - t0
            if any(st != ROW_OK for st in gathered.statuses):
                return self._ranks_failed(group_errors(self._whole(gathered.messages, message)))
            outcome = job.decide(self.context(), local, gathered.body, headers)
            maybe_inject(self.rank, "verdict")
        except CheckerInputError as exc:  # a stale rendezvous store: the user's to fix
            return self._error(str(exc), clean=False)
        except (SchemaMismatch, WireError) as exc:
            return self._error(str(exc))
        except Exception as exc:
            return self._failed(exc)
        return self.finish(lambda named: outcome)

    def _ranks_failed(self, errors: Sequence[RankError], *, clean: bool = True) -> int:
        """End on ranks' own errors, exchanged: each named with its host by the rank that publishes.
        torchrun's error file gets the line once per node (its local rank 0), not once per rank."""
        return self.finish(lambda named: self._errors(errors, named), clean=clean, every_rank=False)

    def _error(self, message: str | None, *, mine: bool = False, clean: bool = True) -> int:
        """End on this rank's own finding, not exchanged: ``mine``, this rank's alone (named with its
        host); else the same on every rank (a stale store, ranks of another checker version). After this
        rank's refusal when it has one (the exchange that would have carried it could not be reached)."""
        errors = [RankError(message=self.refused.message, ranks=(self.rank,))] if self.refused else []
        if message:
            errors.append(RankError(message=message, ranks=(self.rank,) if mine else ()))
        return self.finish(lambda named: self._errors(errors, named), clean=clean)

    def _errors(self, errors: Sequence[RankError], named: bool) -> O:
        """The job's outcome for ``errors``; ``named``: this rank publishes it, naming their hosts."""
        return self.job.errors(self.context(), self.known, placed(self.session, errors) if named else errors)

    def _outside(self, problem: str) -> int:
        """This rank cannot take part in the process group (it cannot use its ``--backend``): it joins the
        store only and says why there; rank 0's watcher ends the run with an ``error`` naming it and its
        host while the others still wait to form the group (:meth:`refusal_seen`), and this rank leaves
        with that verdict. Rank 0 itself publishes its own at once."""
        said = problem if self.refused is None else f"{self.refused.message}; {problem}"
        try:
            self.session.refuse(said)  # joins the store first
        except CheckerInputError as exc:  # a stale rendezvous store
            return self._error(str(exc), clean=False)
        except Exception:  # no store either: this rank's own error, printed where it runs
            self.refused = None
            return self._error(said, mine=True, clean=False)
        return self._ranks_failed([RankError(message=said, ranks=(self.rank,))], clean=False)

    def _whole(self, messages: Sequence[str], mine: str) -> list[str]:
        """Every rank's message as gathered (cut at the wire's width), this rank's own whole where no
        other rank sent the same text (they are grouped under it): the publisher's own error, and a world
        of one's, are shown as given."""
        out = list(messages)
        if mine and out[self.rank] and out.count(out[self.rank]) == 1:
            out[self.rank] = mine
        return out

    def _local(self) -> tuple[L | None, int, str]:
        if self.refused is not None:
            return None, CheckerInputError.code, self.refused.message
        try:
            self.known = self.job.local(self.context())
            return self.known, ROW_OK, ""
        except CheckerInputError as exc:
            return None, exc.code, str(exc)
        except Exception as exc:  # a bug or a broken environment: still join, still report
            return None, ROW_INTERNAL, internal_error(exc)

    def _payload(self, local: L, headers: Sequence[Header]) -> tuple[int, str, Sequence[int] | torch.Tensor]:
        try:
            self.known, body = self.job.payload(self.context(), local, headers)
            return ROW_OK, "", body
        except CheckerInputError as exc:
            status, message = exc.code, str(exc)
        except Exception as exc:
            status, message = ROW_INTERNAL, internal_error(exc)
        return status, message, [0] * headers[self.rank].payload_len  # the gather must still match

    def _failed(self, exc: Exception) -> int:
        # torch: group imports it; a group failure exists only once the group was made
        from checker.distributed.group import InfrastructureFailure

        if self.refused is not None and isinstance(exc, InfrastructureFailure):
            return self._error(None, clean=False)  # its own error is what this rank knows for sure
        if not isinstance(exc, InfrastructureFailure):  # a bug in a job's piece: never silent
            traceback.print_exception(type(exc), exc, exc.__traceback__)
            return self._error(internal_error(exc), mine=True, clean=False)
        # A collective failed. Rank 0 names the gone ranks and publishes at once; the others look for
        # them only if the publisher's lease lapses (on a cut link every store call costs its bound).
        detail, timed_out = str(exc), exc.timed_out

        def lost() -> tuple[str, list[int]]:
            abort: Abort = self.session.failed(detail, behind_is_hung=timed_out)
            return abort.detail, abort.missing_ranks

        if self.is_rank0:
            return self.finish(lambda named: self._lost(*lost()), clean=False)
        # A wait that ran out its time gave the publisher as long as everyone: if it never came, it is
        # lost now. One that failed at once (a peer dropped out) leaves a live publisher its time.
        patience = 0.0 if timed_out else None
        return self.finish(
            lambda named: self._lost(detail, []), clean=False, fallback=lost, patience_s=patience
        )

    def _lost(self, detail: str, missing_ranks: Sequence[int]) -> O:
        return self.job.lost(self.context(), self.known, detail, missing_ranks)

    # -- the end -------------------------------------------------------------------------------------
    def finish(
        self,
        decide: Callable[[bool], O],
        *,
        clean: bool = True,
        fallback: Callable[[], tuple[str, list[int]]] | None = None,
        every_rank: bool = True,
        patience_s: float | None = None,
    ) -> int:
        """The publisher (rank 0, holding the lease) publishes, then announces the exit code every rank
        leaves with; the others adopt it (:meth:`_await_publisher`), whoever publishes it. No rank may
        leave non-zero before the verdict is published: torchrun stops every other worker on the first
        failure. After a gather every rank took part in (``clean``), each rank says it arrived and the
        publisher waits for all of them first: one frozen or hung after the exchange is named
        (``infrastructure_failure``), so that the others leave non-zero and torchrun stops it, rather
        than leave with 0 while torchrun waits for it for good.

        ``decide(named)``: the outcome; ``named``: this rank publishes it (then it names the failing
        ranks' hosts, a store read the others need not make). ``fallback``: after a failed collective,
        the detail and the gone ranks (a store read made only if the publisher is lost). ``every_rank``:
        a failing verdict goes into every rank's torchrun error file; else (ranks' own errors) into one
        per node, so torchrun names it once on each node. ``patience_s``: how long the publisher may be
        behind this rank before it is held lost (default ``--timeout-s``)."""
        s, job = self.session, self.job
        s.stand_down(s.timeout_s + FINISH_S)
        if not self._lock.acquire(blocking=False):
            s.wait_for_exit(SIGTERM_BUDGET_S + ABORT_BUDGET_S)  # an abort is publishing; it ends the process
        self._finishing = True
        if not clean:
            s.shorten_store_timeout()
        if clean:  # every rank took part in the last gather: each must reach this point
            self._decided = decide(False)
            s.arrive()
        publishes, arrivals = False, Arrivals(missing=[])
        if self.is_rank0:
            if clean:
                arrivals = s.await_arrivals(s.timeout_s)
            publishes = s.claim_publisher(default=True)
        if publishes:
            self._take_gate()
            maybe_inject(self.rank, "publish")
            decided = decide(True)  # under the lock: an abort can no longer publish another verdict
            if arrivals.missing:
                decided = self._lost(self._not_arrived(arrivals, decided), arrivals.missing)
                clean = False  # a group that lost a rank may not tear down
            code, line = self._publish(decided)
        else:
            decided = self._decided if self._decided is not None else decide(False)
            patience = s.timeout_s if patience_s is None else patience_s
            heard = self._await_publisher(decided, fallback, patience_s=patience)
            if heard is not None:
                code, line, publisher_lost = heard
                # A group that lost a rank may not tear down (a peer gone mid-teardown can block it).
                clean = clean and not publisher_lost and code != EXIT_INFRASTRUCTURE
            else:  # no verdict can reach this rank: it must not leave without one
                self._take_gate()
                shown = self._lost(*fallback()) if fallback is not None and not s.store_lost else decided
                ctx = self.context()
                call_bounded(lambda: job.fallback(ctx, shown), ABORT_BUDGET_S).report("printing the verdict")
                code, line = job.exit_code(shown), job.one_line(shown)
                clean = False  # a store call may still hang in an abandoned thread
        if code and (every_rank or s.env.local_rank == 0):
            record_for_torchrun(line)
        return s.close(code, clean=clean)

    def _take_gate(self) -> None:
        """This thread ends the run: the right to publish or print a verdict on this rank. When SIGTERM's
        thread has taken it (:meth:`_stopped_while_finishing`), it ends the process; this thread waits."""
        if not self._gate.acquire(blocking=False):
            self.session.wait_for_exit(SIGTERM_BUDGET_S + ABORT_BUDGET_S)

    def _not_arrived(self, arrivals: Arrivals, decided: O) -> str:
        """The detail of a verdict that ranks did not live to hear: who, why, and what was decided."""
        s = self.session
        who = describe(arrivals.missing, s.hosts(arrivals.missing))
        why = (
            f"stopped beating for {LOST_AFTER_S:g} s after the exchange (killed, frozen or cut off)"
            if arrivals.cause == BEAT_STOPPED
            else f"did not reach the verdict within --timeout-s {s.timeout_s:g} s after the exchange "
            "(alive but stuck)"
        )
        return f"{who} {why}; every rank had decided: {self.job.one_line(decided)}"

    def _await_publisher(
        self,
        decided: O,
        fallback: Callable[[], tuple[str, list[int]]] | None,
        *,
        patience_s: float,
    ) -> tuple[int, str, bool] | None:
        """Not the publisher: the published exit code and line, and whether the publisher was lost on
        the way. This rank waits while the publisher may still publish (:meth:`Session.await_announcement`:
        it beats, it is not behind for ``patience_s``, it has not held the lease for
        :data:`PUBLISH_WAIT_S`); once it is lost, this rank claims the lease: the one claim that wins
        publishes an ``infrastructure_failure`` naming the lost publisher (what the ranks had decided is
        in its detail: a rank was lost, so the run cannot pass), and the others wait for that verdict.
        A lease is taken over only from a holder that stopped beating or held it too long; a publisher
        behind (or never joined) is stood in for only while nobody holds the lease, so that one that
        comes late and claims it first still publishes alone. None when no verdict can reach this rank
        (its store stopped answering, or the wait ran out): it prints its own."""
        s = self.session
        deadline = s.elapsed_s() + s.timeout_s + PUBLISH_WAIT_S + 2 * LOST_AFTER_S
        lost: dict[int, str] = {}
        while True:
            wait = s.await_announcement(
                max(0.0, deadline - s.elapsed_s()), patience_s=patience_s, held_s=PUBLISH_WAIT_S
            )
            if wait.announced is not None:
                code, line = wait.announced
                return code, line, bool(lost)
            if wait.stopped is None or wait.stopped in lost:
                return None
            lost[wait.stopped] = wait.cause
            if not self._lowest_survivor(list(lost)):
                # The lowest rank not lost claims first (the "the lowest survivor names it"); this
                # one waits its turn, and claims only if that rank published nothing by then (it may be
                # gone too: then the lease's chain names both).
                heard = s.await_announcement(LOST_AFTER_S)
                if heard.announced is not None:
                    return (*heard.announced, True)
            takeover = [r for r, cause in lost.items() if cause in (BEAT_STOPPED, HELD)]
            if not s.claim_publisher(default=False, lost=takeover, unclaimed_by=[0] if 0 in lost else []):
                continue  # another survivor holds the lease now (or the publisher came): wait for its verdict
            self._take_gate()
            maybe_inject(self.rank, "publish")
            code, line = self._publish(self._in_place_of(decided, fallback, lost))
            return code, line, True

    def _in_place_of(
        self, decided: O, fallback: Callable[[], tuple[str, list[int]]] | None, lost: Mapping[int, str]
    ) -> O:
        """What a survivor publishes for a publisher held lost: an infrastructure failure naming it and
        every holder of the lease before it, and why (and, after a failed collective, every other gone
        rank)."""
        s, job = self.session, self.job
        ranks = sorted({*lost, *s.earlier_publishers()})
        hosts = s.hosts(ranks)

        def why(these: Sequence[int]) -> str:
            by = _by_cause({r: lost.get(r, "") for r in these})
            return "; ".join(
                f"{describe(rs, hosts)} {self._lost_why(cause, verdict=fallback is None)}"
                for cause, rs in by.items()
            )

        if fallback is not None:  # after a failed collective: its detail names the gone ranks it found
            detail, missing = fallback()
            unnamed = [r for r in ranks if r not in missing]
            return self._lost(f"{detail}; {why(unnamed)}" if unnamed else detail, sorted({*missing, *ranks}))
        return self._lost(f"{why(ranks)}; every rank had decided: {job.one_line(decided)}", ranks)

    def _lost_why(self, cause: str, *, verdict: bool) -> str:
        """Why a publisher is held lost (:attr:`checker.distributed.session.Wait.cause`), in words;
        ``verdict``: the others waited for the verdict (else in a collective that failed)."""
        timeout = self.session.timeout_s
        if cause == BEAT_STOPPED:
            return (
                f"stopped beating for {LOST_AFTER_S:g} s before the verdict was published "
                "(killed, frozen or cut off)"
            )
        if cause == NEVER_JOINED:
            return f"never joined the rendezvous store within --timeout-s {timeout:g} s"
        if cause == BEHIND:
            where = "the verdict" if verdict else "the collective the others failed in"
            return f"did not reach {where} within --timeout-s {timeout:g} s (alive but stuck)"
        if cause == HELD:
            return f"held the publisher lease for {PUBLISH_WAIT_S:g} s without publishing (alive but stuck)"
        return "was lost while it held the publisher lease"

    def _publish(self, outcome: O) -> tuple[int, str]:
        """Publish ``outcome`` and announce the exit code every rank leaves with; that code and line."""
        s, job = self.session, self.job
        self.timings["total_s"] = s.elapsed_s()
        code, line = job.exit_code(outcome), job.one_line(outcome)
        try:
            problem = job.publish(self.context(), outcome)
        except BrokenPipeError:  # stdout's reader left: an output not delivered, like a file
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            problem = "stdout: its reader left before the verdict was printed (broken pipe)"
        except Exception as exc:  # a bug in rendering: never silent, and never a passing exit code
            traceback.print_exc()
            problem = f"the verdict could not be published: {internal_error(exc)}"
        if problem is not None:
            self.say(f"error: {problem}{undelivered_note(code)}")
            code, line = exit_after_outputs(code, undelivered=True), f"checker {job.name} error: {problem}"
        s.announce(code, line)
        return code, line

    def _stands_in(self, missing: Sequence[int]) -> bool:
        """Rank 0 is gone and this is the lowest rank that is not: it publishes in rank 0's place, if
        it takes the lease over (exactly one writer, whatever each rank saw)."""
        if 0 not in missing or not self._lowest_survivor(missing):
            return False
        return self.session.claim_publisher(default=False, lost=missing, unclaimed_by=[0])

    def _writes(self, missing: Sequence[int]) -> bool:
        """An abort publishes: rank 0 holding the lease (when it has joined the store, where another
        rank's verdict would show, or is alone), or the stand-in for a lost rank 0."""
        if self.is_rank0:
            return self.session.may_publish_alone and self.session.claim_publisher(default=True)
        return self._stands_in(missing)

    def _lowest_survivor(self, missing: Sequence[int]) -> bool:
        survivors = [r for r in range(self.session.env.world_size) if r not in missing]
        return bool(survivors) and self.rank == min(survivors)

    def lost_seen(self, ranks: Sequence[int]) -> None:
        """The watcher (its thread): these ranks stopped beating while this one waits. Rank 0 ends the
        run naming them; when rank 0 is among them, the lowest surviving rank does in its place; every
        other rank waits for that verdict."""
        if self.is_rank0 or (0 in ranks and self._lowest_survivor(ranks)):
            detail = (
                f"{describe(ranks, self.session.hosts(ranks))} stopped beating for {LOST_AFTER_S:g} s "
                "while the others waited (killed, frozen or cut off)"
            )
            self.abort(detail, False, missing=list(ranks))

    def refusal_seen(self, ranks: Sequence[int]) -> None:
        """The watcher (its thread): these ranks cannot take part in the process group and said why in
        the store. Rank 0 ends the run now with an ``error`` naming them and their hosts (the others
        wait to form a group that can never form) and leaves with its exit code; every other rank hears
        that verdict."""
        if not self.is_rank0 or not self._lock.acquire(blocking=False):
            return
        s, job = self.session, self.job
        s.mark_exiting("done")
        said = s.refusals(ranks)
        by: dict[str, list[int]] = {}
        for r in ranks:
            by.setdefault(said.get(r) or "cannot take part in the process group", []).append(r)
        placed_errors = placed(self.session, [RankError(message=m, ranks=tuple(rs)) for m, rs in by.items()])
        outcome = job.errors(self.context(), self.known, placed_errors)
        verdict = [(job.exit_code(outcome), job.one_line(outcome))]

        def publish() -> None:
            if s.claim_publisher(default=True):
                verdict[0] = self._publish(outcome)

        call_bounded(publish, ABORT_BUDGET_S, name="checker-refused").report("publishing the verdict")
        code, line = verdict[0]
        if code:
            record_for_torchrun(line)
        s.exit_now(code)

    def announced(self) -> None:
        """The watcher (its thread): a verdict was published while this rank still waits in a
        collective; leave now with its exit code (not at --timeout-s)."""
        if not self._lock.acquire(blocking=False):
            return  # finishing or aborting already: that path adopts it
        s = self.session
        heard = s.announcement()
        code, line = heard if heard is not None else (EXIT_INFRASTRUCTURE, "")
        s.mark_exiting("done")
        if code and line:
            record_for_torchrun(line)
        s.exit_now(code)

    def abort(self, detail: str, sigterm: bool, *, missing: list[int] | None = None) -> None:
        """The watchdog, SIGTERM or the watcher (another thread): adopt a verdict already published (the
        publisher left and torchrun stops the rest); else publish an infrastructure failure (rank 0, or
        the stand-in for a lost rank 0; another rank prints its own unless it was merely told to stop),
        then leave with 3. ``missing``: the lost ranks, already known (the watcher). SIGTERM while this
        rank finishes ends it too (:meth:`_stopped_while_finishing`); the watchdog and the watcher leave
        a finishing rank to its finish, whose every wait is bounded."""
        if not self._lock.acquire(blocking=False):
            if sigterm and self._finishing:
                self._stopped_while_finishing(detail)
            return  # aborting already, or a verdict heard: that path publishes and leaves
        self._gate.acquire()  # free: only finish takes it, under the lock
        self._end(detail, sigterm, missing)

    def _stopped_while_finishing(self, detail: str) -> None:
        """SIGTERM (its thread) while this rank finishes: torchrun's agent is stopping every worker (one
        failed, or the job was cancelled) and SIGKILLs them after its grace, so this rank leaves now. While
        the main thread publishes (bounded writes), it ends the process with its verdict's code, or this
        thread does once the budget is spent; while it only waits (for every rank to arrive, or for the
        verdict), this thread ends the run as any stopped rank does, naming the gone ranks where it
        publishes (:meth:`_end`), and the main thread, finding the right to publish taken, waits for
        the end."""
        if not self._gate.acquire(blocking=False):
            self.session.wait_for_exit(SIGTERM_BUDGET_S)
        self._end(detail, True, None)

    def _end(self, detail: str, sigterm: bool, missing: list[int] | None) -> NoReturn:
        """End the run from another thread (holding the lock and the gate): see :meth:`abort`."""
        s, job = self.session, self.job
        if sigterm and not s.joined:  # say it is leaving first: it is not the rank that failed
            s.await_joined()
        heard = s.announcement()
        if heard is not None:
            s.mark_exiting("done")
            if heard[0]:
                record_for_torchrun(heard[1])
            s.exit_now(heard[0])
        # First: no rank may blame this one for stopping, whether told to stop or ending on its
        # watchdog (it leaves with a verdict, it is not lost).
        s.mark_exiting("sigterm" if sigterm else "done" if missing is not None else "watchdog")
        print(f"[rank {self.rank}] checker: {detail}", file=sys.stderr, flush=True)
        box: list[O] = [self._lost(self._with_decided(detail), missing or [])]
        # Told to stop, a rank other than 0 only looks for the gone ranks if it may have to stand in
        # for a lost rank 0 (torchrun stops every worker when rank 0 is killed): the watchers.
        if self.is_rank0 or not sigterm or self.rank < WATCHERS:

            def publish() -> None:
                abort = s.failed(detail, stopping=sigterm) if missing is None else None
                gone = abort.missing_ranks if abort is not None else list(missing or [])
                box[0] = self._lost(self._with_decided(abort.detail if abort is not None else detail), gone)
                if self._writes(gone):
                    self.timings["total_s"] = s.elapsed_s()
                    try:
                        job.publish(self.context(), box[0])
                    finally:  # ranks waiting for the verdict (its heartbeat still beats) stop waiting
                        s.announce(EXIT_INFRASTRUCTURE, job.one_line(box[0]))
                elif not sigterm:
                    job.fallback(self.context(), box[0])

            budget = SIGTERM_BUDGET_S if sigterm else ABORT_BUDGET_S
            call_bounded(publish, budget, name="checker-abort").report("publishing the verdict")
        record_for_torchrun(job.one_line(box[0]))
        s.exit_now(EXIT_INFRASTRUCTURE)

    def _with_decided(self, detail: str) -> str:
        """An abort's detail, with what every rank had decided when it came after the exchange."""
        if self._decided is None:
            return detail
        return f"{detail}; every rank had decided: {self.job.one_line(self._decided)}"


def _by_cause(causes: Mapping[int, str]) -> dict[str, list[int]]:
    """Ranks grouped by why each was lost, in rank order."""
    by: dict[str, list[int]] = {}
    for rank in sorted(causes):
        by.setdefault(causes[rank], []).append(rank)
    return by


def _size_mismatch(headers: Sequence[Header]) -> str | None:
    by: dict[int, list[int]] = {}
    for h in headers:
        by.setdefault(h.payload_len, []).append(h.rank)
    if len(by) == 1:
        return None
    return "ranks send payloads of different lengths: " + "; ".join(
        f"{rank_ranges(rs)} {n} ints" for n, rs in by.items()
    )
