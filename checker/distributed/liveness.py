"""Which ranks are gone: heartbeats and exit marks in the rendezvous store (torch-free).

A rank's heartbeat thread bumps ``hb/<rank>`` every :data:`HEARTBEAT_S`, and the rank bumps
``step/<rank>`` as it enters each collective. After a failure, any rank can tell the gone from the
merely stuck: a rank blocked in a collective (a gloo ring waits on its neighbour) still beats and has
reached the collective that failed; a killed, frozen (SIGSTOP) or never-started rank does not beat;
a hung rank (alive, its main thread stuck before the exchange) beats but never reached the
collective. A rank that leaves on purpose (a verdict reached, or SIGTERM from torchrun's agent) first
sets ``exiting/<rank>``, so it is not blamed for stopping. Every store call is bounded
(:func:`bounded`): on a cut link a TCPStore call can block far past its own timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

HEARTBEAT_S = 0.25
STALE_AFTER_S = 1.0
"""A heartbeat that has not advanced for this long is stopped (4 missed beats)."""
STORE_CALL_S = 2.0
"""Bound on one liveness store call, whatever the store's own timeout."""

T = TypeVar("T")


class Store(Protocol):
    def add(self, key: str, value: int) -> int: ...
    def set(self, key: str, value: str) -> None: ...
    def check(self, keys: list[str]) -> bool: ...


def bounded(fn: Callable[[], T], seconds: float, default: T) -> T:
    """Run ``fn`` in a daemon thread: its result, or ``default`` after ``seconds`` or on any error.

    The store calls release the GIL while they block, so the caller's wait ends on time and an
    abandoned thread dies with the process.
    """
    box: list[Any] = [default]

    def target() -> None:
        try:
            box[0] = fn()
        except Exception:
            pass

    t = threading.Thread(target=target, daemon=True, name="checker-bounded")
    t.start()
    t.join(seconds)
    return box[0]


class Heartbeat:
    """This rank's heartbeat thread; ``mark_exiting`` before leaving on purpose."""

    def __init__(self, store: Store, rank: int) -> None:
        self.store, self.rank = store, rank
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="checker-heartbeat")

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _beat(self) -> None:
        key = f"hb/{self.rank}"
        while not self._stop.is_set():
            try:
                self.store.add(key, 1)
            except Exception:
                return  # the store is gone: nothing left to tell anyone
            self._stop.wait(HEARTBEAT_S)

    def enter_step(self) -> None:
        """Before each collective: this rank reached it (a hung rank never does)."""
        bounded(lambda: self.store.add(f"step/{self.rank}", 1), STORE_CALL_S, None)

    def mark_exiting(self, why: str) -> None:
        bounded(lambda: self.store.set(f"exiting/{self.rank}", why), STORE_CALL_S, None)

    def stop(self, join_s: float = 1.0) -> None:
        """Stop beating and wait (bounded) for the thread: a daemon thread still inside a store call
        when the interpreter finalises the store can abort the process ("terminate called without an
        active exception")."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(join_s)


def _counts(store: Store, world_size: int, key: str = "hb") -> list[int] | None:
    # add(key, 0) reads a counter without blocking on a key that was never set (get would wait).
    return bounded(lambda: [int(store.add(f"{key}/{r}", 0)) for r in range(world_size)], STORE_CALL_S, None)


def _exiting(store: Store, world_size: int) -> set[int]:
    return bounded(
        lambda: {r for r in range(world_size) if store.check([f"exiting/{r}"])}, STORE_CALL_S, set()
    )


def gone_ranks(
    store: Store | None,
    world_size: int,
    *,
    me: int,
    my_step: int = 0,
    watch_s: float = STALE_AFTER_S,
    stopping: bool = False,
) -> list[int]:
    """Ranks whose heartbeat does not advance over ``watch_s``, or that never reached the collective
    this rank failed in (``my_step``), and that did not say they were leaving.

    ``stopping``: every rank is being stopped at this moment (torchrun's SIGTERM). A rank that never
    beat may then be a slow starter told to stop before it reached the store, not a lost one, and a
    rank behind in the collectives is not hung: only ranks that beat and then stopped are named.
    Empty when the store cannot be read (then nobody can be named, rather than everybody).
    """
    if store is None:
        return []
    first = _counts(store, world_size)
    if first is None:
        return []
    time.sleep(watch_s)
    second = _counts(store, world_size)
    steps = _counts(store, world_size, "step")
    if second is None or steps is None:
        return []
    leaving = _exiting(store, world_size)
    if stopping:
        return [r for r in range(world_size) if r != me and r not in leaving and 0 < second[r] == first[r]]
    return [
        r
        for r in range(world_size)
        if r != me and r not in leaving and (second[r] == first[r] or steps[r] < my_step)
    ]


def describe(ranks: Sequence[int]) -> str:
    from checker.outputs.tables import rank_ranges

    return rank_ranges(ranks) if ranks else "none identified"
