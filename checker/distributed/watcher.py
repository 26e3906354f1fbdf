"""The watcher: names a lost rank while the others still wait, in seconds, not at ``--timeout-s``.

A rank blocked in a collective (or in the rendezvous) cannot look at anything until the collective
returns, which for a frozen peer is ``--timeout-s`` later. Each rank's watcher thread looks instead:

* the first :data:`WATCHERS` ranks read every rank's liveness keys once per :data:`POLL_S`
  (:func:`checker.distributed.liveness.read`: three store round trips whatever the world size) and
  hand the ranks that stopped beating (:class:`checker.distributed.liveness.Staleness`) to
  ``on_lost``, and ranks that said they cannot take part in the process group
  (:func:`checker.distributed.liveness.refuse`) to ``on_refused``; the run decides who publishes (rank
  0, or the lowest surviving rank when rank 0 is the one lost);
* every rank reads the one announcement key once per :data:`ANNOUNCE_POLL_S` and hands a verdict
  published while it still waits to ``on_announced``, so it leaves with that exit code instead of
  waiting out its collective.

Two watchers, not all ranks: every rank reading every rank's keys would cost the store O(world²) reads
per poll; two readers cost O(world), and the second covers the loss of the first. A world that loses
ranks 0 and 1 together is named at the timeout, as before.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence

from checker.distributed.liveness import Staleness, Store, read, store_call

WATCHERS = 2
"""Ranks ``0 .. WATCHERS-1`` read every rank's liveness keys."""
POLL_S = 0.5
"""How often a watcher reads the liveness keys: with :data:`checker.distributed.liveness.LOST_AFTER_S`
it bounds the time to name a lost rank."""
ANNOUNCE_POLL_S = 1.0
"""How often every rank looks for a verdict published while it waits (one ``check`` per poll)."""


class Watcher:
    """One rank's watcher thread; ``stop`` before leaving."""

    def __init__(
        self,
        store: Store,
        *,
        rank: int,
        world_size: int,
        on_lost: Callable[[Sequence[int]], None],
        on_announced: Callable[[], None],
        announcement: str,
        on_refused: Callable[[Sequence[int]], None] = lambda ranks: None,
        poll_s: float = POLL_S,
        announce_poll_s: float = ANNOUNCE_POLL_S,
        staleness: Staleness | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.on_lost, self.on_announced, self.announcement = on_lost, on_announced, announcement
        self.on_refused = on_refused
        self._refused: set[int] = set()
        """Refused ranks already handed over (each once)."""
        self.reads_all = rank < WATCHERS
        self.poll_s = poll_s if self.reads_all else announce_poll_s
        self.staleness = staleness or Staleness()
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="checker-watcher")

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self, join_s: float = 1.0) -> None:
        """Stop watching and wait (bounded) for the thread: a daemon thread still inside a store call
        when the interpreter finalises the store can abort the process."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(join_s)

    def poll(self) -> bool:
        """One look; True when the watcher has handed something over and is done."""
        if store_call(lambda: self.store.check([self.announcement]), False):
            self.on_announced()
            return True
        if not self.reads_all:
            return False
        snapshot = read(self.store, self.world_size)
        if snapshot is None:  # the store did not answer in time: nothing known, look again
            return False
        refused = [r for r in snapshot.refused() if r not in self._refused and r != self.rank]
        if refused:
            self._refused.update(refused)
            self.on_refused(refused)
        lost = [r for r in self.staleness.observe(snapshot, self.clock()) if r != self.rank]
        if lost:
            self.on_lost(lost)
        return False

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                if self.poll():
                    return
            except Exception:  # a bug here must not end the run; the timeout path still stands
                traceback.print_exc()
                return
