"""One rank's process group, liveness, timers and way out: the mechanics the run protocol drives.

:mod:`checker.distributed.exchange` owns the order of steps and every decision; a :class:`Session` only
does what it is told, each step bounded:

1. :meth:`Session.start` arms a Python watchdog (``--timeout-s`` + :data:`WATCHDOG_EXTRA_S`), a
   GIL-free backstop behind it (:mod:`checker.distributed.backstop`), and a SIGTERM watcher (torchrun's
   agent sends SIGTERM to every other worker when one dies, then SIGKILL after its grace period). The
   watchdog and the watcher call the protocol's abort.
2. :meth:`Session.make_group`, :meth:`Session.join` and :meth:`Session.connect` form the store and the
   process group (``--timeout-s``); once this rank has joined the store, its heartbeat
   (:mod:`checker.distributed.liveness`) and its watcher (:mod:`checker.distributed.watcher`) start,
   so a rank lost during the rendezvous or any collective is named in seconds. A rank that cannot use
   its backend joins the store only and says why there (:meth:`Session.refuse`); a rank that only
   reports, alone, gathers with itself (:mod:`checker.distributed.solo`).
3. :meth:`Session.exchange_headers`, :meth:`Session.gather_text` and :meth:`Session.gather_payload`:
   the int64 all-gathers, each bounded by ``--timeout-s``; each step is marked in the store first.
4. :meth:`Session.announce` / :meth:`Session.await_announcement`: the publishing rank (the holder of the
   publisher lease, :meth:`Session.claim_publisher`: rank 0, or the survivor that took the lease over
   when its holder stopped beating) says its report is written and which exit code every rank leaves
   with; the others wait for that (bounded), and learn when the holder stopped.
5. :meth:`Session.close`: on the clean path the group is destroyed and only then is the backstop
   disarmed (and the process's signal handling given back); otherwise the process leaves at once (a
   broken group's destructor can block).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from checker.core.ranks import ranks_do
from checker.distributed import liveness, sigterm
from checker.distributed.backstop import Backstop
from checker.distributed.launch_env import GroupOptions, RankEnv
from checker.distributed.liveness import (
    LOST_AFTER_S,
    STALE_AFTER_S,
    STORE_CALL_S,
    Heartbeat,
    Staleness,
    Store,
    describe,
    gone_ranks,
    read,
    store_call,
)
from checker.distributed.solo import SoloGroup
from checker.distributed.watcher import Watcher
from checker.distributed.wire import ERROR_BYTES, PAYLOAD_PREFIX_LEN, Header, pack_text, unpack_text
from checker.files import write_file
from checker.loading import load_torch
from checker.status import EXIT_CODES, INFRASTRUCTURE_FAILURE, ROW_OK

if TYPE_CHECKING:  # torch is imported when the group is made, so --help and input errors cost none
    import torch

WATCHDOG_EXTRA_S = 10.0
"""The watchdog fires this long after --timeout-s; the GIL-free backstop twice as long after."""
ANNOUNCEMENT = "report_written"
"""The store key rank 0 sets once it has published: its value is the exit code and one line."""
SIGTERM_DETAIL = (
    "terminated by SIGTERM (torchrun's agent stops every worker when one fails, or the job was cancelled)"
)
PUBLISHER_LOST_AFTER_S = LOST_AFTER_S
"""A rank waiting for the verdict takes the publisher's lease over once the holder's beat has stood still
this long on its own clock: as long as the watcher waits before naming a lost rank, so that a live
publisher starved of CPU is never taken over (two writers)."""
STOP_JOIN_S = 5.0
"""Told to stop (SIGTERM) before it joined the store, a rank still joins, up to this long after the
signal, so that it can say it is leaving and is never taken for the rank that failed; the rank that
publishes waits as long for every rank to have joined, and names the ones that never did (torch's import
and the store's connection take 1-3 s on a loaded node)."""
ARRIVALS_LOOK_S = 0.5
"""How often the publisher, waiting for every rank to reach the verdict, reads every rank's beat (as
often as a watcher does)."""

# Why a rank waiting for the verdict holds its publisher lost (:attr:`Wait.cause`), and why the publisher
# holds a rank that never reached the verdict lost (:attr:`Arrivals.cause`).
BEAT_STOPPED = "beat"
"""Its beat stood still for :data:`PUBLISHER_LOST_AFTER_S`: killed, frozen or cut off."""
NEVER_JOINED = "never_joined"
"""It never joined the rendezvous store, and this rank's own wait for it ran out its time."""
BEHIND = "behind"
"""Alive, but it never reached the step this rank is at (the collective that failed, or the verdict)
within the time every rank is given (``--timeout-s``): hung."""
HELD = "held"
"""It holds the publisher lease and did not publish within the time a publisher is given: hung."""


class Clock(Protocol):
    """The session's time: :data:`SYSTEM_CLOCK`, or a test's virtual clock (tests/seam.py), under which a
    30 s wait costs milliseconds."""

    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class _SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK: Clock = _SystemClock()


class BackstopLike(Protocol):
    """:class:`checker.distributed.backstop.Backstop`: a GIL-free timer that ends the process."""

    def arm(self, seconds: float) -> Any: ...
    def close(self) -> None: ...


class GroupLike(Protocol):
    """What a session drives: :class:`checker.distributed.group.Group`, or, for a world of one that
    only reports, :class:`checker.distributed.solo.SoloGroup`."""

    backend: str
    heartbeat: Heartbeat | None

    @property
    def store(self) -> Any: ...
    @property
    def liveness_store(self) -> Store | None: ...
    @property
    def device(self) -> torch.device | None: ...
    def resolve(self) -> None: ...
    def join(self) -> None: ...
    def init(self) -> None: ...
    def gather_rows(self, values: Sequence[int]) -> list[list[int]]: ...
    def all_gather_int64(self, values: Sequence[int] | torch.Tensor) -> torch.Tensor: ...
    def shorten_store_timeout(self, seconds: float) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Wait:
    """How a wait for the published verdict ended (:meth:`Session.await_announcement`); neither field
    set: the store stopped answering, or a live publisher ran out of time."""

    announced: tuple[int, str] | None = None
    """The exit code every rank leaves with, and the line for torchrun's error file."""
    stopped: int | None = None
    """The rank whose turn it was to publish (the lease holder; rank 0 while nobody holds it), held lost:
    its lease is over."""
    cause: str = ""
    """Why ``stopped`` is held lost: :data:`BEAT_STOPPED`, :data:`NEVER_JOINED`, :data:`BEHIND` or
    :data:`HELD`."""


@dataclass(frozen=True, kw_only=True)
class Arrivals:
    """How the publisher's wait for every rank to reach the verdict ended (:meth:`Session.await_arrivals`):
    no rank missing, or the ranks lost on the way and why."""

    missing: list[int]
    cause: str = ""
    """:data:`BEAT_STOPPED` (their beat stood still) or :data:`BEHIND` (alive, they never came)."""


@dataclass(frozen=True, kw_only=True)
class Abort:
    """Why a run ended without a verdict from the exchange: the detail, and the ranks that are gone."""

    detail: str
    missing_ranks: list[int]


class SchemaMismatch(Exception):
    """Ranks run checker versions whose rows cannot be compared."""


def schema_mismatch_message(headers: Sequence[Header]) -> str:
    by: dict[tuple[int, int], list[int]] = {}
    for r, h in enumerate(headers):
        by.setdefault((h.schema[1], h.schema[2]), []).append(r)
    parts = [f"{ranks_do(rs, 'speaks', 'speak')} wire schema {k[0]} ({k[1]} ints)" for k, rs in by.items()]
    return (
        "ranks run different checker versions: "
        + "; ".join(parts)
        + "; install the same checker on every node"
    )


@dataclass(frozen=True, kw_only=True)
class Gathered:
    """The payload gather, split: each rank's prefix (status and message) and the job's ints."""

    statuses: list[int]
    messages: list[str]
    body: torch.Tensor
    """(world_size, payload_len) int64 on CPU."""


class Session:
    """This rank's process group, liveness, watchdog and exit path. See the module docstring."""

    def __init__(
        self,
        env: RankEnv,
        options: GroupOptions,
        *,
        exit_process: Callable[[int], NoReturn] = os._exit,
        clock: Clock = SYSTEM_CLOCK,
        make_group: Callable[[RankEnv, GroupOptions], GroupLike] | None = None,
        backstop: Callable[[], BackstopLike] = Backstop,
        watcher: Callable[..., Watcher] = Watcher,
    ) -> None:
        """The keywords are the seams a test replaces (tests/seam.py): how the process ends (``os._exit``),
        time, the group (:class:`checker.distributed.group.Group` or the solo one), the GIL-free backstop,
        and the watcher (a test polls it itself)."""
        self.env = env
        self.options = options
        self.group: GroupLike | None = None
        self.clock = clock
        self.t0 = clock.monotonic()
        self._exit_process = exit_process
        self._make_group = make_group
        self._make_backstop = backstop
        self._make_watcher = watcher
        self._timer: threading.Timer | None = None
        self._steps = 0
        """Collectives this rank has entered (the liveness store's ``step/<rank>``)."""
        self.store_lost = False
        """The store stopped answering (a cut link): leave without the store calls that would each
        cost their bound."""
        self._on_lost: Callable[[Sequence[int]], None] | None = None
        self._on_announced: Callable[[], None] | None = None
        self._on_refused: Callable[[Sequence[int]], None] | None = None
        self.watcher: Watcher | None = None
        self._joined = False
        self.sigterm_at: float | None = None
        """When SIGTERM arrived (the session's clock), once it did."""
        self._backstop: BackstopLike | None = None
        self._give_back_signals: Callable[[], None] | None = None

    @property
    def is_rank0(self) -> bool:
        return self.env.rank == 0

    @property
    def deadline(self) -> float:
        """The clock's time at which ``--timeout-s`` ends for this rank."""
        return self.t0 + self.options.timeout_s

    @property
    def timeout_s(self) -> float:
        """``--timeout-s``: what every wait for another rank is given."""
        return self.options.timeout_s

    @property
    def joined(self) -> bool:
        """This rank has joined the store (its keys written, its heartbeat beating)."""
        return self._joined

    @property
    def backend(self) -> str:
        return self.group.backend if self.group is not None else self.options.backend

    @property
    def device(self) -> torch.device | None:
        return self.group.device if self.group is not None else None

    @property
    def has_store(self) -> bool:
        return self.group is not None and self.group.store is not None

    def elapsed_s(self) -> float:
        return self.clock.monotonic() - self.t0

    # -- 1. start ------------------------------------------------------------------------------------
    def start(
        self,
        on_abort: Callable[[str, bool], None],
        *,
        on_lost: Callable[[Sequence[int]], None] | None = None,
        on_announced: Callable[[], None] | None = None,
        on_refused: Callable[[Sequence[int]], None] | None = None,
    ) -> Session:
        """Arm the watchdog, the backstop and the SIGTERM watcher; each calls ``on_abort(detail,
        sigterm)``, which publishes a verdict and leaves the process. Once this rank has joined, its
        watcher (:mod:`checker.distributed.watcher`) hands ranks that stopped beating to ``on_lost``, a
        verdict published while this rank waits to ``on_announced``, and ranks that cannot take part in
        the group to ``on_refused`` (all from the watcher's thread)."""
        self._on_lost, self._on_announced, self._on_refused = on_lost, on_announced, on_refused
        self.on_abort = on_abort
        """What the watchdog and SIGTERM call (a test calls it as SIGTERM would)."""
        timeout = self.options.timeout_s
        detail = f"no verdict within --timeout-s {timeout:g} s + {WATCHDOG_EXTRA_S:g} s (watchdog)"
        self._timer = threading.Timer(timeout + WATCHDOG_EXTRA_S, on_abort, args=(detail, False))
        self._timer.daemon = True
        self._timer.start()
        # A C++ call that blocks holding the GIL stalls every Python thread: the backstop dumps the
        # stacks and ends the process a little later, whatever holds the GIL.
        self._backstop = self._make_backstop()
        self._backstop.arm(timeout + 2 * WATCHDOG_EXTRA_S)

        def on_sigterm() -> None:
            self.sigterm_at = self.clock.monotonic()
            on_abort(SIGTERM_DETAIL, True)

        self._give_back_signals = sigterm.watch(on_sigterm)
        if self.env.max_restarts > 0 and self.is_rank0:
            print(
                f"checker: warning: torchrun --max-restarts {self.env.max_restarts} only repeats a "
                "deterministic disagreement; use --max-restarts 0",
                file=sys.stderr,
            )
        return self

    def stand_down(self, finish_s: float) -> None:
        """A verdict is being published: the Python watchdog stands down, and the GIL-free backstop is
        re-armed for the finish (publishing, waiting for rank 0, the teardown), which may take longer
        than what was left of the run's bound; it stays armed until :meth:`close` is past the last
        unbounded call."""
        if self._timer is not None:
            self._timer.cancel()
            if self._backstop is not None:
                self._backstop.arm(finish_s)

    # -- 2. connect ----------------------------------------------------------------------------------
    @property
    def alone(self) -> bool:
        """A world of one with nowhere to meet (no --init-method, no torchrun store)."""
        return self.env.world_size == 1 and not self.options.init_method and not self.env.master_port

    def make_group(self, *, needs_device: bool = True) -> None:
        """The group object (no waiting yet), then its backend: raises the user's error (--backend) with
        the group still there to :meth:`join` its store. ``needs_device``: this rank computes on the
        group's device; one that only reports, alone, gathers with itself (no torch)."""
        o = self.options
        if self._make_group is not None:
            self.group = self._make_group(self.env, o)
            self.group.resolve()
            return
        if not needs_device and self.alone:
            self.group = SoloGroup(o.backend)
            return
        load_torch()  # here, not at module level, so --help and input errors cost none
        from checker.distributed.group import Group  # torch: loaded just above

        self.group = Group(self.env, backend=o.backend, timeout_s=o.timeout_s, init_method=o.init_method)
        self.group.resolve()

    def join(self) -> None:
        """Join the store (this rank's liveness keys and heartbeat) and start the watcher."""
        group = self.group
        assert group is not None
        if self._joined:
            return
        group.join()
        self._joined = True
        live = group.liveness_store
        if live is not None and self._on_lost is not None and self._on_announced is not None:
            self.watcher = self._make_watcher(
                live,
                rank=self.env.rank,
                world_size=self.env.world_size,
                on_lost=self._on_lost,
                on_announced=self._on_announced,
                on_refused=self._on_refused or (lambda ranks: None),
                announcement=ANNOUNCEMENT,
                clock=self.clock.monotonic,
            ).start()

    def connect(self) -> None:
        """Join the store, then form the group (the wait for every rank: a step, so that a rank alive
        but stuck before it is named hung when the others' wait runs out)."""
        self.join()
        self._enter_step().init()

    # -- 3. exchange ---------------------------------------------------------------------------------
    def _enter_step(self) -> GroupLike:
        self._steps += 1
        assert self.group is not None
        if self.group.heartbeat is not None:
            self.group.heartbeat.enter_step()
        return self.group

    def exchange_headers(self, header: Header) -> list[Header]:
        rows = self._enter_step().gather_rows(header.encode())
        headers = [Header.decode(h) for h in rows]
        if len({h.schema for h in headers}) > 1:
            raise SchemaMismatch(schema_mismatch_message(headers))
        return headers

    def gather_text(self, text: str) -> list[str]:
        """Every rank's message (fixed width, cut at ``ERROR_BYTES``): one gather."""
        rows = self._enter_step().gather_rows(pack_text(text, ERROR_BYTES))
        return [unpack_text(r) for r in rows]

    def gather_payload(self, status: int, text: str, body: Sequence[int] | torch.Tensor) -> Gathered:
        """The job's payload behind a status and message prefix, in one gather."""
        import torch  # torch: loaded with the group by now; the module stays torch-free for --help

        prefix = torch.tensor([status, *pack_text(text, ERROR_BYTES)], dtype=torch.int64)
        values = body if isinstance(body, torch.Tensor) else torch.tensor(list(body), dtype=torch.int64)
        values = torch.cat([prefix, values.reshape(-1).to(device="cpu", dtype=torch.int64)])
        out = self._enter_step().all_gather_int64(values)
        head = out[:, :PAYLOAD_PREFIX_LEN].tolist()
        return Gathered(
            statuses=[int(h[0]) for h in head],
            messages=[unpack_text(h[1:]) if h[0] != ROW_OK else "" for h in head],
            body=out[:, PAYLOAD_PREFIX_LEN:],
        )

    # -- 4. after a failure, and the announcement ----------------------------------------------------
    def failed(self, detail: str, *, stopping: bool = False, behind_is_hung: bool = True) -> Abort:
        """After a failed collective (or SIGTERM: ``stopping``): which ranks are gone (this one is not).
        When not every rank has joined yet, the detail says how many did and which did not: at start-up
        a slow start and a lost rank look alike, and the count is what the user can act on. Told to stop,
        this rank first waits (up to :data:`STOP_JOIN_S` after the signal) for every rank to have joined:
        each rank told to stop joins before it leaves, so the ranks that never did are the gone ones."""
        group = self.group
        missing: list[int] = []
        if group is not None and group.store is not None:
            group.shorten_store_timeout(STORE_CALL_S)
            # One bounded read first: a store this rank cannot reach (a cut link) answers nothing, and
            # waiting on it again for the names would only delay this rank's verdict.
            snapshot = read(group.liveness_store, self.env.world_size)
            if snapshot is not None and stopping:
                snapshot = self._await_every_join(snapshot)
            if snapshot is not None:
                missing = gone_ranks(
                    group.liveness_store,
                    self.env.world_size,
                    me=self.env.rank,
                    my_step=self._steps,
                    stopping=stopping,
                    behind_is_hung=behind_is_hung,
                    unjoined_gone=stopping,
                    sleep=self.clock.sleep,
                )
                if len(snapshot.joined) < self.env.world_size:
                    line = starting_line(len(snapshot.joined), snapshot.not_joined(), self.elapsed_s())
                    if stopping:
                        line += (
                            " when the job was stopped (each failed before it joined, or was stopped first)"
                        )
                    detail += "; " + line
                where = self.hosts(missing)
                if where:  # the report's missing_ranks are numbers: say here where they ran
                    detail += f"; gone: {describe(missing, where)}"
        return Abort(detail=detail, missing_ranks=missing)

    def _await_every_join(self, snapshot: liveness.Snapshot) -> liveness.Snapshot:
        """Told to stop: the latest snapshot once every rank has joined, or :data:`STOP_JOIN_S` after the
        signal. A rank other than 0 looks only for whether rank 0 is there to publish (else it may stand
        in): it stops waiting once rank 0 has joined."""
        clock = self.clock
        since = self.sigterm_at if self.sigterm_at is not None else clock.monotonic()

        def waiting(snap: liveness.Snapshot) -> bool:
            if self.env.rank != 0 and 0 in snap.joined:
                return False
            return len(snap.joined) < self.env.world_size and clock.monotonic() < since + STOP_JOIN_S

        while waiting(snapshot):
            clock.sleep(0.1)
            latest = read(self.group.liveness_store if self.group is not None else None, self.env.world_size)
            if latest is None:
                break
            snapshot = latest
        return snapshot

    def await_joined(self) -> bool:
        """Told to stop before it joined the store: wait (up to :data:`STOP_JOIN_S` after the signal) for
        this rank's main thread to join, so that it can say it is leaving; whether it has."""
        clock = self.clock
        since = self.sigterm_at if self.sigterm_at is not None else clock.monotonic()
        while not self._joined and clock.monotonic() < since + STOP_JOIN_S:
            clock.sleep(0.05)
        return self._joined

    @property
    def may_publish_alone(self) -> bool:
        """This rank may publish from an abort: it has joined the store (where another rank's verdict
        would show), or it is the only rank. A rank that never joined cannot see whether another one
        published, and the others name it in their report."""
        return self.has_store or self.env.world_size == 1

    def claim_publisher(
        self, *, default: bool, lost: Sequence[int] = (), unclaimed_by: Sequence[int] = ()
    ) -> bool:
        """Whether this rank publishes the verdict: it holds the publisher lease (the first claim, after
        ``unclaimed_by`` when it is in their place; or a lease whose holder is in ``lost``, taken over by
        exactly one claimant). ``default`` when the store cannot answer."""
        store = self.group.liveness_store if self.group is not None else None
        return liveness.claim_publisher(
            store, self.env.rank, lost=lost, unclaimed_by=unclaimed_by, default=default
        )

    def earlier_publishers(self) -> list[int]:
        """The ranks that held the publisher lease before its holder now (each lost in turn)."""
        store = self.group.liveness_store if self.group is not None else None
        if store is None:
            return []
        holders: list[int] = store_call(lambda: liveness.publishers(store), [])
        return holders[:-1]

    def hosts(self, ranks: Sequence[int]) -> dict[int, str]:
        """Where each of ``ranks`` runs, as each wrote when it joined (one bounded read)."""
        if not ranks:
            return {}
        store = self.group.liveness_store if self.group is not None else None
        if store is None:  # alone: this rank is the only one
            return {r: self.env.host for r in ranks if r == self.env.rank}
        return liveness.hosts(store, ranks)

    def refuse(self, message: str) -> None:
        """This rank cannot take part in the group: join the store (:meth:`join`, which raises as it
        does: no store, or a stale one) and say why there (bounded), for rank 0's watcher to publish."""
        self.join()
        store = self.group.liveness_store if self.group is not None else None
        if store is not None:
            store_call(lambda: liveness.refuse(store, self.env.rank, message), None)

    def refusals(self, ranks: Sequence[int]) -> dict[int, str]:
        """The reasons of ranks that said they cannot take part (one bounded read)."""
        store = self.group.liveness_store if self.group is not None else None
        return liveness.refusals(store, ranks)

    def shorten_store_timeout(self) -> None:
        """After a failure: a store on a lost node must not block each call for --timeout-s."""
        if self.group is not None:
            self.group.shorten_store_timeout(STORE_CALL_S)

    def mark_exiting(self, why: str) -> None:
        """Leaving on purpose: a later failure must not blame this rank."""
        group = self.group
        if group is not None and group.heartbeat is not None:
            group.heartbeat.mark_exiting(why)

    def announce(self, exit_code: int, line: str) -> None:
        """The publisher: the report is written, and every rank leaves with ``exit_code`` (``line`` for
        torchrun's error file). The first announcement stands: a publisher whose lease was taken over
        (it was frozen, then resumed) cannot replace the verdict its stand-in announced."""
        store = self.group.store if self.group is not None else None
        if store is not None:
            value = f"{exit_code}\n{line}"
            store_call(lambda: store.compare_set(ANNOUNCEMENT, "", value), None)

    def arrive(self) -> None:
        """This rank reached the end of a run whose gathers every rank took part in: it counts as arrived
        for the publisher (:meth:`await_arrivals`), and as past the last collective for anyone naming the
        ranks that never came (bounded)."""
        group = self.group
        live = group.liveness_store if group is not None else None
        if group is None or live is None:
            return
        self._steps += 1
        if group.heartbeat is not None:
            group.heartbeat.enter_step()
        store_call(lambda: liveness.arrive(live), None)

    def await_arrivals(self, within_s: float) -> Arrivals:
        """The publisher, before it publishes the verdict: wait until every rank has arrived
        (:meth:`arrive`), so that none is left frozen or hung behind a verdict that lets the others leave
        with 0 (torchrun would wait for it for good). A rank whose beat stood still for
        :data:`checker.distributed.liveness.LOST_AFTER_S` is missing at once; one alive that has not
        arrived within ``within_s`` is missing then (hung). No rank missing when the store stops
        answering: the decided verdict is then published as it stands."""
        group = self.group
        live = group.liveness_store if group is not None else None
        if live is None:
            return Arrivals(missing=[])
        clock, world = self.clock, self.env.world_size
        t0 = clock.monotonic()
        staleness = Staleness()
        look, unanswered = t0, 0
        while True:
            count = store_call(lambda: liveness.arrived(live), None)
            if count is not None and count >= world:
                return Arrivals(missing=[])
            unanswered = 0 if count is not None else unanswered + 1
            if unanswered >= 2:
                return Arrivals(missing=[])
            now = clock.monotonic()
            if now >= look:
                snapshot = read(live, world)
                lost = [r for r in staleness.observe(snapshot, now) if r != self.env.rank] if snapshot else []
                if lost:
                    return Arrivals(missing=lost, cause=BEAT_STOPPED)
                look = now + ARRIVALS_LOOK_S
            if now >= t0 + within_s:
                snapshot = read(live, world, steps=True)
                me, step = self.env.rank, self._steps
                behind = [r for r in range(world) if r != me and snapshot.step(r) < step] if snapshot else []
                return Arrivals(missing=behind, cause=BEHIND)
            clock.sleep(announcement_poll_s(world))

    def await_announcement(
        self, within_s: float, *, patience_s: float = math.inf, held_s: float = math.inf
    ) -> Wait:
        """Another rank: the published exit code and line, waiting while the publisher is alive up to
        ``within_s``. The publisher is the lease holder, rank 0 while nobody holds it; the wait ends with
        ``stopped`` (and its :attr:`Wait.cause`), so a survivor takes the lease over, when
        (:class:`PublisherTracker`): its beat has stood still for :data:`PUBLISHER_LOST_AFTER_S`
        (``kill -9`` or SIGSTOP after the exchange, or while it publishes); it never joined, or is
        behind this rank's step, for ``patience_s`` (0 after this rank's own wait for it ran out its
        time: it had as long as everyone); it has held the lease for ``held_s`` without publishing."""
        group = self.group
        store = group.store if group is not None else None
        live = group.liveness_store if group is not None else None
        if store is None or live is None:
            return Wait()
        clock = self.clock
        t0 = clock.monotonic()
        deadline = t0 + within_s
        # The publisher is sampled at once and every STALE_AFTER_S, measured on this rank's clock.
        tracker = PublisherTracker(patience_s=patience_s, held_s=held_s, lost_after_s=PUBLISHER_LOST_AFTER_S)
        sampled, unanswered = t0 - STALE_AFTER_S, 0
        # Each store call bounded on its own: on a cut link one can block far past the store's timeout,
        # and a store that does not answer twice in a row means no verdict can reach this rank.
        while True:
            announced = store_call(lambda: store.check([ANNOUNCEMENT]), None)
            if announced:
                heard = self.announcement()
                if heard is not None:
                    return Wait(announced=heard)
            answered = announced is not None
            now = clock.monotonic()
            if answered and now >= sampled + STALE_AFTER_S:
                state = store_call(lambda: liveness.publisher_state(live), None)
                if state is None:
                    answered = False
                else:
                    sampled = now
                    cause = tracker.observe(state, now, my_step=self._steps)
                    if cause:
                        return Wait(stopped=state.rank, cause=cause)
            unanswered = 0 if answered else unanswered + 1
            if unanswered >= 2:
                self.store_lost = True
                return Wait()
            if now >= deadline:
                return Wait()
            clock.sleep(announcement_poll_s(self.env.world_size))

    # -- 5. leave ------------------------------------------------------------------------------------
    def announcement(self) -> tuple[int, str] | None:
        """The published verdict's exit code and line, if one was published (bounded)."""
        store = self.group.store if self.group is not None else None
        if store is None:
            return None

        def read() -> str | None:
            if not store.check([ANNOUNCEMENT]):  # a get would wait for it
                return None
            value: str = store.get(ANNOUNCEMENT).decode(errors="replace")
            return value

        code, _, line = (store_call(read, None) or "").partition("\n")
        return (int(code), line) if code.strip().lstrip("-").isdigit() else None

    def close(self, exit_code: int, *, clean: bool) -> int:
        """Leave: on the clean path destroy the group and return ``exit_code``; otherwise end the
        process now (a store call may still hang in an abandoned thread, and a broken group's
        destructor can block)."""
        if self.watcher is not None:  # on the clean path, out of any store call before the teardown
            self.watcher.stop(join_s=1.0 if clean else 0.0)
        group = self.group
        if clean and group is not None and group.store is not None:
            self.mark_exiting("done")
            if group.heartbeat is not None:
                group.heartbeat.stop()
            group.close()  # unbounded (destroy_process_group): the backstop still covers it
        if clean:
            self._give_back()
            return exit_code
        if not self.store_lost:
            self.mark_exiting("done")  # bounded: a rank that printed its own verdict is not lost
        self.exit_now(exit_code)

    def _give_back(self) -> None:
        """The run is over and this process goes on (the CLI returns; an embedding caller continues):
        no watchdog, no backstop, SIGTERM as it was."""
        if self._timer is not None:
            self._timer.cancel()
            # cancel() only wakes the timer's thread: wait (bounded) for it to leave, so the caller gets
            # its process back without a thread of ours still in it.
            if self._timer is not threading.current_thread():
                self._timer.join(timeout=2.0)
        if self._backstop is not None:
            self._backstop.close()
        if self._give_back_signals is not None and threading.current_thread() is threading.main_thread():
            self._give_back_signals()
            self._give_back_signals = None

    def exit_now(self, exit_code: int) -> NoReturn:
        sys.stdout.flush()
        sys.stderr.flush()
        if self._timer is not None:  # past the flushes (they can block): only the process's end is left
            self._timer.cancel()
        self._exit_process(exit_code)

    def wait_for_exit(self, seconds: float) -> NoReturn:
        """Another thread of this rank is publishing and ends the process: leave once a verdict is
        announced (this rank's or another's: the code every rank leaves with), or after ``seconds`` with
        3 (no verdict)."""
        deadline = self.clock.monotonic() + seconds
        while True:
            heard = self.announcement()
            if heard is not None:
                # The publishing thread leaves right after it announced (its exit code, its line in
                # torchrun's error file): it goes first, this one only if it did not.
                self.clock.sleep(min(1.0, max(0.0, deadline - self.clock.monotonic())))
                if heard[0]:
                    record_for_torchrun(heard[1])
                self.exit_now(heard[0])
            if self.clock.monotonic() >= deadline:
                self.exit_now(EXIT_CODES[INFRASTRUCTURE_FAILURE])
            self.clock.sleep(0.05)


def announcement_poll_s(world_size: int) -> float:
    """How often a rank that has its verdict looks for rank 0's announcement. The wait is what the
    other ranks add to the end of every job, so a small world looks every 10 ms; the interval grows
    with the world (1 ms per rank) up to 50 ms, so these checks cost the store at most about 1,000
    calls a second below 50 ranks and one per rank per 50 ms above (docs/performance.md)."""
    return min(0.05, max(0.01, world_size * 0.001))


@dataclass(kw_only=True)
class PublisherTracker:
    """What a rank waiting for the verdict remembers of the publisher between samples, and when it holds
    it lost (pure: the samples and the times are handed in)."""

    patience_s: float
    """How long the publisher may be behind this rank (or not joined) while nobody holds the lease."""
    held_s: float
    """How long the lease may be held without a verdict."""
    lost_after_s: float
    """How long its beat may stand still (:data:`PUBLISHER_LOST_AFTER_S`)."""
    _key: tuple[int, int | None] | None = None
    _beat: int = 0
    _beat_since: float = 0.0
    _behind_since: float | None = None
    _held_since: float | None = None

    def observe(self, state: liveness.PublisherState, now: float, *, my_step: int) -> str | None:
        """Why the publisher is lost as of ``now`` (:data:`BEAT_STOPPED`, :data:`NEVER_JOINED`,
        :data:`BEHIND`, :data:`HELD`), or None while it may still publish."""
        key = (state.rank, state.holder)
        if key != self._key:  # another publisher, or it claimed the lease: watched afresh
            self._key, self._beat, self._beat_since = key, state.beat, now
            self._behind_since = None
            self._held_since = now if state.holder is not None else None
        if not state.joined or state.beat == 0 or state.beat != self._beat:
            # Beating (or not yet: a beat of 0 has not started), so its stillness counts from here.
            self._beat, self._beat_since = state.beat, now
        elif now - self._beat_since >= self.lost_after_s:
            return BEAT_STOPPED
        # Nobody holds the lease yet: rank 0 has not reached the verdict, or is still in the collective
        # (or start-up) this rank has left.
        if state.holder is None and (not state.joined or state.step < my_step):
            self._behind_since = now if self._behind_since is None else self._behind_since
            if now - self._behind_since >= self.patience_s:
                return BEHIND if state.joined else NEVER_JOINED
        else:
            self._behind_since = None
        if self._held_since is not None and now - self._held_since >= self.held_s:
            return HELD
        return None


def starting_line(joined: int, not_joined: Sequence[int], elapsed_s: float) -> str:
    """How far start-up got: ``ranks still starting: 30 of 32 joined after 10 s (not joined: ranks
    7, 12)``."""
    world = joined + len(not_joined)
    return (
        f"ranks still starting: {joined} of {world} joined after {elapsed_s:.0f} s "
        f"(not joined: {describe(not_joined)})"
    )


def record_for_torchrun(line: str) -> None:
    """Put the verdict in torchrun's error file so its "Root Cause" names it, not just "exitcode 1".

    The format of torch elastic's ``record`` (message + extraInfo), written directly so no traceback
    is involved: torchrun shows the message where it would show a traceback.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}
    # Written as every output is: atomic for a file, never replacing a device or FIFO; bounded.
    problem = write_file(path, json.dumps(data), what="TORCHELASTIC_ERROR_FILE", seconds=STORE_CALL_S)
    if problem:  # torchrun then shows "exitcode N" only; the verdict itself is on stdout and the report
        print(f"checker: warning: {problem}", file=sys.stderr, flush=True)
