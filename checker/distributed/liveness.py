"""Which ranks are gone: heartbeats and exit marks in the rendezvous store (torch-free).

A rank's heartbeat thread bumps ``hb/<rank>`` every :data:`HEARTBEAT_S`, and the rank bumps
``step/<rank>`` as it enters each collective. After a failure, any rank can tell the gone from the
merely stuck: a rank blocked in a collective (a gloo ring waits on its neighbour) still beats and has
reached the collective that failed; a killed, frozen (SIGSTOP) or never-started rank does not beat;
a hung rank (alive, its main thread stuck before the exchange) beats but never reaches the
collective. A rank that leaves on purpose (a verdict reached, or SIGTERM from torchrun's agent) first
sets ``exiting/<rank>``, so it is not blamed for stopping. A rank whose own watchdog ends it sets
``watchdog/<rank>`` instead: its stopped heartbeat is not held against it, but if it never reached the
collective the others failed in, it is still the hung one.

Every store call is bounded (:func:`checker.bounded.call_bounded`): on a cut link a TCPStore call can
block far past its own timeout. A store call that fails is retried by the heartbeat (a transient error
must not make a live rank look gone) and read as "nothing known" by :func:`gone_ranks` (nobody is named
rather than everybody).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from checker.bounded import call_bounded

HEARTBEAT_S = 0.25
STALE_AFTER_S = 1.0
"""A heartbeat that has not advanced for this long is stopped (4 missed beats)."""
STORE_CALL_S = 2.0
"""Bound on one liveness store call, whatever the store's own timeout."""
GIVE_UP_AFTER_FAILED_BEATS = 120
"""Consecutive failed beats (30 s at :data:`HEARTBEAT_S`) after which the store is taken as gone for
good (its host is down): nobody could read a beat any more, and the thread stops trying."""

T = TypeVar("T")


class Store(Protocol):
    """The part of ``torch.distributed.Store`` liveness uses (a fake store implements it in tests)."""

    def add(self, key: str, value: int) -> int: ...
    def set(self, key: str, value: str) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...


def store_call(fn: Callable[[], T], default: T, seconds: float | None = None) -> T:
    """One store call, bounded (by :data:`STORE_CALL_S` unless ``seconds``); ``default`` when it fails
    or runs past the bound (a store that is gone is an answer here, not a bug)."""
    bound = STORE_CALL_S if seconds is None else seconds
    return call_bounded(fn, bound, name="checker-store").get(default)


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
        key = "watchdog" if why == "watchdog" else "exiting"
        store_call(lambda: self.store.set(f"{key}/{self.rank}", why), None)

    def stop(self, join_s: float = 1.0) -> None:
        """Stop beating and wait (bounded) for the thread: a daemon thread still inside a store call
        when the interpreter finalises the store can abort the process ("terminate called without an
        active exception")."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(join_s)


def _counts(store: Store, world_size: int, key: str = "hb") -> list[int] | None:
    # add(key, 0) reads a counter without blocking on a key that was never set (get would wait).
    return store_call(lambda: [int(store.add(f"{key}/{r}", 0)) for r in range(world_size)], None)


def _marked(store: Store, world_size: int, key: str) -> set[int] | None:
    return store_call(lambda: {r for r in range(world_size) if store.check([f"{key}/{r}"])}, None)


def gone_ranks(
    store: Store | None,
    world_size: int,
    *,
    me: int,
    my_step: int = 0,
    watch_s: float = STALE_AFTER_S,
    stopping: bool = False,
    behind_is_hung: bool = True,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Ranks whose heartbeat does not advance over ``watch_s``, or that never reached the collective
    this rank failed in (``my_step``), and that did not say they were leaving.

    ``behind_is_hung``: a rank still before the failed collective is hung. True when the collective ran
    out its time (the rank never came); False when it failed at once because a peer dropped out: a live
    rank still deriving is merely slower, not lost.
    ``stopping``: every rank is being stopped at this moment (torchrun's SIGTERM). A rank that never
    beat may then be a slow starter told to stop before it reached the store, not a lost one, and a
    rank behind in the collectives is not hung: only ranks that beat and then stopped are named.
    Empty when the store cannot be read (then nobody can be named, rather than everybody).
    ``sleep``: how to let ``watch_s`` pass (tests hand a fake clock's).
    """
    if store is None:
        return []
    first = _counts(store, world_size)
    if first is None:
        return []
    sleep(watch_s)
    second = _counts(store, world_size)
    steps = _counts(store, world_size, "step")
    leaving = _marked(store, world_size, "exiting")
    ended = _marked(store, world_size, "watchdog")
    if second is None or steps is None or leaving is None or ended is None:
        return []
    if stopping:
        quiet = leaving | ended
        return [r for r in range(world_size) if r != me and r not in quiet and 0 < second[r] == first[r]]
    return [
        r
        for r in range(world_size)
        if r != me
        and r not in leaving
        and ((second[r] == first[r] and r not in ended) or (behind_is_hung and steps[r] < my_step))
    ]


def describe(ranks: Sequence[int]) -> str:
    from checker.outputs.tables import rank_ranges

    return rank_ranges(ranks) if ranks else "none identified"
