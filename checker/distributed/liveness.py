"""Which ranks are gone: heartbeats and exit marks in the rendezvous store (torch-free).

Each rank joins by writing its keys, then appending its rank to ``joined`` (:func:`join`): a rank
listed there has every key, so the whole world's state is read in three store round trips whatever
the world size (:func:`read`: ``check``, one ``multi_get`` of ``joined`` and ``marks``, one
``multi_get`` of the joined ranks' counters; ``multi_get`` blocks on a key that does not exist, so it
only ever asks for joined ranks' keys).

* ``hb/<rank>``: bumped by the rank's heartbeat thread every :data:`HEARTBEAT_S`;
* ``step/<rank>``: bumped as the rank enters each collective (read only after a failure);
* ``host/<rank>``: where the rank runs, so that any rank naming it (lost, refused, in error) names its
  host too (:func:`hosts`);
* ``node/<rank>``: ``<first>,<count>``, the ranks torchrun started on this rank's node (its agent numbers
  them ``RANK - LOCAL_RANK`` on, ``LOCAL_WORLD_SIZE`` of them): a rank lost before it joined has no
  ``host/`` key, and is named with the host of a rank of its node that did join;
* ``decided``: how many ranks reached the end of a run whose gathers every rank took part in
  (:func:`arrive`): the publisher waits for all of them before it publishes, so a rank frozen or hung
  after the exchange is named instead of left behind for torchrun to wait on;
* ``marks``: one key every rank appends ``<rank>:<why>,`` to when it leaves on purpose: ``done`` or
  ``sigterm`` (a verdict reached, or torchrun's agent stopping it: never blamed) or ``watchdog`` (its
  own watchdog ended it: its stopped heartbeat is not held against it, but if it never reached the
  collective the others failed in, it is still the hung one), or ``refused`` (it cannot take part in the
  process group, e.g. its ``--backend``; its reason is in ``refused/<rank>``: :func:`refuse`). One key,
  not one per rank, so that a watcher's read asks for one key per rank: TCPStore's ``multi_get`` grows
  faster than linearly with its number of keys (measured: 3,072 keys 30-50 ms, 12,288 keys 240-1,000 ms
  on this machine);
* ``publisher``: the rank that holds the right to publish the verdict, a lease (:func:`claim_publisher`):
  the first claim wins, and a claim whose holder stopped beating is taken over by exactly one survivor.

After a failure, any rank can tell the gone from the merely stuck (:func:`gone_ranks`): a rank
blocked in a collective (a gloo ring waits on its neighbour) still beats and has reached the
collective that failed; a killed, frozen (SIGSTOP) or never-started rank does not beat; a hung rank
(alive, its main thread stuck before the exchange) beats but never reaches the collective. While the
run is still waiting, :class:`Staleness` tells a watcher which ranks stopped beating
(:mod:`checker.distributed.watcher`).

Every store call is bounded (:func:`checker.bounded.call_bounded`): on a cut link a TCPStore call can
block far past its own timeout. A store call that fails is retried by the heartbeat (a transient error
must not make a live rank look gone) and read as "nothing known" by :func:`gone_ranks` (nobody is named
rather than everybody).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from checker.bounded import call_bounded
from checker.core.errors import printable
from checker.core.ranks import rank_ranges

HEARTBEAT_S = 0.25
STALE_AFTER_S = 1.0
"""After a failed collective: a heartbeat that has not advanced over this window is stopped (4 missed
beats). Also how often a rank waiting for rank 0's announcement asks whether rank 0 still beats."""
LOST_AFTER_S = 3.0
"""While the run still waits: a rank whose heartbeat has not advanced for this long, as seen by a
watcher, is lost. Long enough that a live rank starved of CPU on a loaded machine is not (32 ranks
starting on 2 cores delay a heartbeat thread by up to about a second; a C extension's import can hold
the GIL for some hundreds of milliseconds), short enough that the loss is named within 5 s: the beat
interval, this, one watcher poll and the report write add up to about 4 s."""
TOGETHER_S = 1.0
"""Ranks that stop at one instant (a node killed, its link cut) cross :data:`LOST_AFTER_S` on a
watcher's clock up to one watcher poll (0.5 s) plus one beat apart: when one is lost, a rank whose beat
has stood still for more than ``LOST_AFTER_S - TOGETHER_S`` is waited for, up to this long, so a lost
node is named whole, never one rank of it. A rank that beats again meanwhile is not named."""
STORE_CALL_S = 2.0
"""Bound on one liveness store call, whatever the store's own timeout."""
SHOW_HOSTS = 3
"""Hosts named after a group of ranks (:func:`describe`); more are counted."""
GIVE_UP_AFTER_FAILED_BEATS = 120
"""Consecutive failed beats (30 s at :data:`HEARTBEAT_S`) after which the store is taken as gone for
good (its host is down): nobody could read a beat any more, and the thread stops trying."""
JOINED = "joined"
"""Ranks that wrote their liveness keys, appended as ``"<rank>,"``."""
MARKS = "marks"
"""Ranks that leave on purpose, appended as ``"<rank>:<why>,"`` (a later mark of a rank wins)."""
PUBLISHER = "publisher"
"""The ranks that held the right to publish the verdict, in turn (``0`` or ``0,1``: the last holds it);
"" while nobody claimed it."""
REFUSED = "refused"
"""The mark of a rank that cannot take part in the process group; its reason is under ``refused/<rank>``."""
DECIDED = "decided"
"""Ranks that reached the end of the run after the last gather (a counter: :func:`arrive`)."""

T = TypeVar("T")


class Store(Protocol):
    """The part of ``torch.distributed.Store`` liveness uses (a fake store implements it in tests)."""

    def add(self, key: str, value: int) -> int: ...
    def set(self, key: str, value: str) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def append(self, key: str, value: str) -> None: ...
    def multi_get(self, keys: list[str]) -> list[bytes]: ...
    def multi_set(self, keys: list[str], values: list[str]) -> None: ...
    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes: ...


def store_call(fn: Callable[[], T], default: T, seconds: float | None = None) -> T:
    """One store call, bounded (by :data:`STORE_CALL_S` unless ``seconds``); ``default`` when it fails
    or runs past the bound (a store that is gone is an answer here, not a bug)."""
    bound = STORE_CALL_S if seconds is None else seconds
    return call_bounded(fn, bound, name="checker-store").get(default)


def join(store: Store, rank: int, host: str = "", node: tuple[int, int] | None = None) -> None:
    """Write this rank's keys, then list it as joined (four round trips; the caller bounds them).
    ``node``: the first rank on this rank's node and how many there are (default: this rank alone)."""
    first, count = node if node is not None else (rank, 1)
    store.multi_set(
        [f"hb/{rank}", f"step/{rank}", f"host/{rank}", f"node/{rank}"], ["0", "0", host, f"{first},{count}"]
    )
    # These keys exist once anyone joined (appending "" never changes a value): a read never waits.
    store.append(MARKS, "")
    store.append(PUBLISHER, "")
    store.append(JOINED, f"{rank},")


def mark(store: Store, rank: int, why: str) -> None:
    """This rank leaves on purpose (``why``: ``done``, ``sigterm``, ``watchdog`` or ``refused``)."""
    store.append(MARKS, f"{rank}:{why},")


def refuse(store: Store, rank: int, message: str) -> None:
    """This rank cannot take part in the process group (``message`` says why): its reason first, then
    its mark, so a watcher that sees the mark always finds the reason."""
    store.set(f"{REFUSED}/{rank}", message)
    mark(store, rank, REFUSED)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """The liveness keys of every rank, read at once. A rank not (yet) joined reads as 0, 0, ""."""

    world_size: int
    joined: frozenset[int]
    beats: dict[int, int] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)
    marks: dict[int, str] = field(default_factory=dict)

    def beat(self, rank: int) -> int:
        return self.beats.get(rank, 0)

    def step(self, rank: int) -> int:
        return self.steps.get(rank, 0)

    def mark(self, rank: int) -> str:
        return self.marks.get(rank, "")

    def not_joined(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.joined]

    def refused(self) -> list[int]:
        """Joined ranks that cannot take part in the process group (:func:`refuse`)."""
        return [r for r in sorted(self.joined) if self.mark(r) == REFUSED]


def _parse_joined(raw: bytes, world_size: int) -> frozenset[int]:
    ranks = (int(w) for w in raw.decode(errors="replace").split(",") if w.strip().isdigit())
    return frozenset(r for r in ranks if 0 <= r < world_size)


def _parse_marks(raw: bytes) -> dict[int, str]:
    marks: dict[int, str] = {}
    for item in raw.decode(errors="replace").split(","):
        rank, _, why = item.partition(":")
        if rank.strip().isdigit() and why:
            marks[int(rank)] = why
    return marks


def _read(store: Store, world_size: int, steps: bool) -> Snapshot:
    if not store.check([JOINED]):  # nobody joined yet (a get would wait for the key)
        return Snapshot(world_size=world_size, joined=frozenset())
    raw_joined, raw_marks = store.multi_get([JOINED, MARKS])
    joined = _parse_joined(raw_joined, world_size)
    ranks = sorted(joined)
    keys = [f"hb/{r}" for r in ranks] + ([f"step/{r}" for r in ranks] if steps else [])
    text = [v.decode(errors="replace") for v in store.multi_get(keys)] if ranks else []
    n = len(ranks)
    return Snapshot(
        world_size=world_size,
        joined=joined,
        beats={r: _int(text[i]) for i, r in enumerate(ranks)},
        steps={r: _int(text[n + i]) for i, r in enumerate(ranks)} if steps else {},
        marks=_parse_marks(raw_marks),
    )


def _int(text: str) -> int:
    return int(text) if text.strip().lstrip("-").isdigit() else 0


def read(store: Store | None, world_size: int, *, steps: bool = False) -> Snapshot | None:
    """Every rank's beat and mark (and with ``steps``, its step) in three store round trips whatever
    ``world_size``; None when the store cannot be read in time (:data:`STORE_CALL_S`)."""
    if store is None:
        return None
    return store_call(lambda: _read(store, world_size, steps), None)


def claim_publisher(
    store: Store | None,
    rank: int,
    *,
    lost: Collection[int] = (),
    unclaimed_by: Sequence[int] = (),
    default: bool,
) -> bool:
    """Whether ``rank`` publishes the verdict: it holds the publisher lease. The first claim wins; a lease
    whose holder is in ``lost`` (its beat stopped) is taken over, by exactly one claimant (one
    compare-and-set from that holder). The key keeps every holder in turn (``0,1``), so whoever publishes
    in the end can name each one that was lost (:func:`publishers`); ``unclaimed_by``: the ranks whose
    turn it was, lost before they claimed it (rank 0), go first in the key when this claim is the first.
    ``default`` when the store cannot answer (rank 0 still writes its report; a stand-in does not)."""
    if store is None:
        return default
    me = str(rank)
    first = ",".join([*(str(r) for r in unclaimed_by if r != rank), me])
    held = store_call(lambda: store.compare_set(PUBLISHER, "", first), None)
    if held is None:
        return default
    chain = held.decode(errors="replace")
    holders = _holders(chain)
    if holders == [rank]:
        return True
    if not holders or holders[-1] == rank or holders[-1] not in lost:
        return holders[-1:] == [rank]
    taken = store_call(lambda: store.compare_set(PUBLISHER, chain, f"{chain},{me}"), None)
    return taken is not None and _holders(taken.decode(errors="replace"))[-1:] == [rank]


def _holders(chain: str) -> list[int]:
    return [int(w) for w in chain.split(",") if w.strip().isdigit()]


def publishers(store: Store) -> list[int]:
    """Every rank that held the publisher lease, in turn (the last holds it now); [] while nobody
    claimed it. Two round trips, unbounded: the caller bounds it."""
    if not store.check([PUBLISHER]):  # nobody joined yet (a get would wait for the key)
        return []
    return _holders(store.get(PUBLISHER).decode(errors="replace"))


def publisher(store: Store) -> int | None:
    """The rank holding the publisher lease, None while nobody claimed it (unbounded: the caller bounds
    it)."""
    holders = publishers(store)
    return holders[-1] if holders else None


def hosts(store: Store | None, ranks: Collection[int]) -> dict[int, str]:
    """Where each of ``ranks`` runs (bounded); {} when the store cannot answer. A rank that joined
    wrote its host; one that never joined (lost at start-up) runs where a rank of its node that did
    join runs (``node/<rank>``), and has no host to name when none of its node joined."""
    if store is None or not ranks:
        return {}

    def read_hosts() -> dict[int, str]:
        joined = sorted(_parse_joined(store.get(JOINED), 1 << 30)) if store.check([JOINED]) else []
        known = sorted(r for r in ranks if r in joined)  # multi_get would wait for a key never written
        unknown = sorted(r for r in ranks if r not in joined)
        # A rank not joined is placed by its node-mates' ranges: every joined rank's host and node.
        asked = joined if unknown else known
        values = store.multi_get([f"host/{r}" for r in asked]) if asked else []
        # Each rank wrote its own host (escaped where it read it); escaped again here, as what any peer
        # wrote to the store reaches this rank's output.
        host = {r: printable(v.decode(errors="replace")) for r, v in zip(asked, values, strict=True)}
        out = {r: host[r] for r in known if host.get(r)}
        nodes = [f"node/{r}" for r in asked]
        if unknown and asked and store.check(nodes):  # a rank of an older checker wrote no node key
            for r, raw in zip(asked, store.multi_get(nodes), strict=True):
                first, _, count = raw.decode(errors="replace").partition(",")
                if not (first.isdigit() and count.isdigit()) or not host.get(r):
                    continue
                for lost in unknown:
                    if int(first) <= lost < int(first) + int(count):
                        out.setdefault(lost, host[r])
        return out

    return store_call(read_hosts, {})


def arrive(store: Store) -> int:
    """This rank reached the end of the run after the last gather: how many ranks have (unbounded: the
    caller bounds it)."""
    return int(store.add(DECIDED, 1))


def arrived(store: Store) -> int:
    """How many ranks reached the end of the run (unbounded: the caller bounds it)."""
    return int(store.add(DECIDED, 0))


@dataclass(frozen=True, kw_only=True)
class PublisherState:
    """The rank whose turn it is to publish (the lease holder; rank 0 while nobody holds it) as a rank
    waiting for its verdict sees it."""

    rank: int
    holder: int | None
    """The lease holder, None while nobody claimed the lease."""
    joined: bool
    beat: int
    step: int


def publisher_state(store: Store) -> PublisherState:
    """Who publishes and how far it got: two or three round trips (unbounded: the caller bounds it).
    ``joined`` and ``publisher`` exist once this rank has joined, so the reads never wait."""
    raw_publisher, raw_joined = store.multi_get([PUBLISHER, JOINED])
    holders = _holders(raw_publisher.decode(errors="replace"))
    rank = holders[-1] if holders else 0
    joined = rank in _parse_joined(raw_joined, rank + 1)
    beat = step = 0
    if joined:  # its keys exist
        raw_beat, raw_step = store.multi_get([f"hb/{rank}", f"step/{rank}"])
        beat, step = _int(raw_beat.decode(errors="replace")), _int(raw_step.decode(errors="replace"))
    holder = holders[-1] if holders else None
    return PublisherState(rank=rank, holder=holder, joined=joined, beat=beat, step=step)


def refusals(store: Store | None, ranks: Collection[int]) -> dict[int, str]:
    """The reasons of ranks marked ``refused`` (one bounded ``multi_get``); {} when the store cannot
    answer."""
    if store is None or not ranks:
        return {}
    order = sorted(ranks)

    def read_reasons() -> dict[int, str]:
        values = store.multi_get([f"{REFUSED}/{r}" for r in order])
        return {r: v.decode(errors="replace") for r, v in zip(order, values, strict=True)}

    return store_call(read_reasons, {})


class Staleness:
    """Which ranks stopped beating, from snapshots taken over time (a watcher's memory).

    A rank is lost when it joined, has not said it is leaving, and its beat has not changed for
    :data:`LOST_AFTER_S` of this observer's clock since the observer first saw it or last saw it
    change. Measured on the observer's own clock and observations, so a watcher that was itself
    starved and polls late sees advanced beats, not stale ones."""

    def __init__(self, *, lost_after_s: float = LOST_AFTER_S, together_s: float = TOGETHER_S) -> None:
        self.lost_after_s, self.together_s = lost_after_s, together_s
        self._beat: dict[int, int] = {}
        self._since: dict[int, float] = {}
        self._first_lost: float | None = None

    def observe(self, snapshot: Snapshot, now: float) -> list[int]:
        """The ranks lost as of ``now`` (seconds, any monotonic clock); none yet while a rank that
        may have stopped with them is about to cross the line (:data:`TOGETHER_S`)."""
        lost, about_to = [], []
        for r in sorted(snapshot.joined):
            beat = snapshot.beat(r)
            if self._beat.get(r) != beat:
                self._beat[r], self._since[r] = beat, now
            elif not snapshot.mark(r):
                still = now - self._since[r]
                if still >= self.lost_after_s:
                    lost.append(r)
                elif still > self.lost_after_s - self.together_s:
                    about_to.append(r)
        if not lost:
            self._first_lost = None
            return []
        if self._first_lost is None:
            self._first_lost = now
        if about_to and now - self._first_lost < self.together_s:
            return []
        return lost


class Heartbeat:
    """This rank's heartbeat thread; ``mark_exiting`` before leaving on purpose."""

    def __init__(self, store: Store, rank: int, *, interval_s: float | None = None) -> None:
        self.store, self.rank = store, rank
        self.interval_s = HEARTBEAT_S if interval_s is None else interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="checker-heartbeat")

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _beat(self) -> None:
        key = f"hb/{self.rank}"
        failed = 0
        while not self._stop.is_set():
            try:
                self.store.add(key, 1)
                failed = 0
            except Exception:
                # A transient store error (a dropped connection that reconnects, a busy store) must not
                # end the beats for good: the others would name this live rank as gone.
                failed += 1
                if failed >= GIVE_UP_AFTER_FAILED_BEATS:
                    return
            self._stop.wait(self.interval_s)

    def enter_step(self) -> None:
        """Before each collective: this rank reached it (a hung rank never does)."""
        store_call(lambda: self.store.add(f"step/{self.rank}", 1), None)

    def mark_exiting(self, why: str) -> None:
        """``why``: ``done``/``sigterm`` (never blamed), or ``watchdog`` (blamed only if behind)."""
        store_call(lambda: mark(self.store, self.rank, why), None)

    def stop(self, join_s: float = 1.0) -> None:
        """Stop beating and wait (bounded) for the thread: a daemon thread still inside a store call
        when the interpreter finalises the store can abort the process ("terminate called without an
        active exception")."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(join_s)


def gone_ranks(
    store: Store | None,
    world_size: int,
    *,
    me: int,
    my_step: int = 0,
    watch_s: float = STALE_AFTER_S,
    stopping: bool = False,
    behind_is_hung: bool = True,
    unjoined_gone: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Ranks whose heartbeat does not advance over ``watch_s``, or that never reached the collective
    this rank failed in (``my_step``), and that did not say they were leaving. Two reads of the store
    (:func:`read`), a constant number of round trips whatever ``world_size``.

    ``behind_is_hung``: a rank still before the failed collective is hung. True when the collective ran
    out its time (the rank never came); False when it failed at once because a peer dropped out: a live
    rank still deriving is merely slower, not lost.
    ``stopping``: every rank is being stopped at this moment (torchrun's SIGTERM). A rank that never
    beat may then be a slow starter told to stop before it reached the store, not a lost one, and a
    rank behind in the collectives is not hung: only ranks that beat and then stopped are named, and
    with ``unjoined_gone`` the ranks that never joined (the stopping ranks waited for them: each rank
    told to stop joins before it leaves, so one that never came failed before it joined, or was ended
    before it could).
    Empty when the store cannot be read (then nobody can be named, rather than everybody).
    ``sleep``: how to let ``watch_s`` pass (tests hand a fake clock's).
    """
    first = read(store, world_size)
    if first is None:
        return []
    sleep(watch_s)
    second = read(store, world_size, steps=True)
    if second is None:
        return []
    return named_gone(
        first,
        second,
        me=me,
        my_step=my_step,
        stopping=stopping,
        behind_is_hung=behind_is_hung,
        unjoined_gone=unjoined_gone,
    )


def named_gone(
    first: Snapshot,
    second: Snapshot,
    *,
    me: int,
    my_step: int,
    stopping: bool,
    behind_is_hung: bool,
    unjoined_gone: bool = False,
) -> list[int]:
    """:func:`gone_ranks`'s decision from two snapshots ``watch_s`` apart (its arguments, whose
    defaults :func:`gone_ranks` holds)."""
    out = []
    for r in range(second.world_size):
        mark = second.mark(r)
        if r == me or mark in ("done", "sigterm", REFUSED):  # a refused rank is named with its reason
            continue
        stopped = second.beat(r) == first.beat(r)
        if stopping:
            if not mark and ((0 < second.beat(r) and stopped) or (unjoined_gone and r not in second.joined)):
                out.append(r)
        elif (stopped and mark != "watchdog") or (behind_is_hung and second.step(r) < my_step):
            out.append(r)
    return out


def describe(ranks: Sequence[int], hosts: Mapping[int, str] | None = None) -> str:
    """``rank 2 (node-b)``, ``ranks 0-3 (node-a, node-b)``: the ranks, and where they run when known (at
    most :data:`SHOW_HOSTS` hosts, then how many); "none identified" for no rank."""

    if not ranks:
        return "none identified"
    where = list(dict.fromkeys(h for r in sorted(ranks) if (h := (hosts or {}).get(r))))
    if not where:
        return rank_ranges(ranks)
    shown = ", ".join(where[:SHOW_HOSTS]) + (f", ... ({len(where)} hosts)" if len(where) > SHOW_HOSTS else "")
    return f"{rank_ranges(ranks)} ({shown})"
