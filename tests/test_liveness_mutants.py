"""Liveness edges the other liveness tests leave open (issue 18 item 8, mutation round 2): the keys a
rank writes when it joins, ranks listed past the world, who claims the verdict, where "lost" starts,
the heartbeat's retry and stop, the watch window, and that a rank never names itself. Fake store and
fake clock, in-process, milliseconds (tests/test_liveness_logic.py, tests/test_watcher.py: the rest).
The watcher's look: what it hands over, what a silent store means, its intervals, and its stop.
"""

from __future__ import annotations

import threading
import time

from fakes import BeatingWorld, FakeStore, StoreDown

from checker.distributed import liveness
from checker.distributed.liveness import (
    HEARTBEAT_S,
    LOST_AFTER_S,
    STALE_AFTER_S,
    Heartbeat,
    Snapshot,
    Staleness,
    claim_publisher,
    describe,
    gone_ranks,
    read,
)
from checker.distributed.watcher import WATCHERS, Watcher


def _wait_for(predicate, seconds: float = 2.0) -> bool:  # noqa: ANN001 - a zero-argument callable
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.001)
    return predicate()


# -- the keys a rank writes, and reading them back ----------------------------------------------------


def test_a_joined_rank_reads_as_not_yet_beating_and_its_counters_count_from_zero():
    """join writes counters the heartbeat and the steps add to (TCPStore's add needs an integer
    there): a rank's first beat and first step read back as 1, and no exit mark."""
    store = FakeStore()
    liveness.join(store, 1)
    liveness.join(store, 0)
    first = read(store, 2, steps=True)
    assert first is not None and first.joined == {0, 1}
    assert (first.beat(1), first.step(1), first.mark(1)) == (0, 0, "")
    store.add("hb/1", 1)
    store.add("step/1", 1)
    second = read(store, 2, steps=True)
    assert second is not None and (second.beat(1), second.step(1)) == (1, 1)
    assert (second.beat(0), second.step(0)) == (0, 0)


def test_ranks_listed_past_the_world_are_not_read_and_never_named():
    """The store lists ranks 0-3 but this run has 2 ranks: ranks 2 and 3 are not this run's (a
    world_size that does not match the job's), so their keys are not asked for and nobody names
    them, neither the watcher nor a failed collective."""
    store = FakeStore()
    for r in range(4):
        liveness.join(store, r)
    asked: list[list[str]] = []
    multi_get = store.multi_get
    store.multi_get = lambda keys: asked.append(list(keys)) or multi_get(keys)  # type: ignore[method-assign]
    snapshot = read(store, 2)
    assert snapshot is not None and snapshot.joined == {0, 1} and snapshot.not_joined() == []
    assert asked[-1] == ["hb/0", "hb/1"]
    staleness = Staleness(lost_after_s=1.0)
    assert staleness.observe(snapshot, 0.0) == [] and staleness.observe(snapshot, 5.0) == [0, 1]


# -- who publishes --------------------------------------------------------------------------------------


def test_exactly_the_first_rank_to_claim_the_verdict_publishes_it():
    """Rank 0 and a stand-in may both try (rank 0 was only slow): the first claim wins, every later
    one loses, whoever makes it, and the winner's claim stands when it asks again; with no store to
    ask, each rank keeps its default. (Keys are str, as torch's Store requires: a claim on any other key
    is an error, read as "no answer".)"""

    class StrKeys(FakeStore):
        def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
            if not all(isinstance(v, str) for v in (key, expected_value, desired_value)):
                raise TypeError(f"compare_set(): incompatible arguments {key!r}")
            return super().compare_set(key, expected_value, desired_value)

    store = StrKeys()
    liveness.join(store, 0)
    claims = [claim_publisher(store, r, default=d) for r, d in ((1, False), (0, True), (2, True), (1, False))]
    assert claims == [True, False, False, True]
    assert claim_publisher(None, 0, default=True) is True
    assert claim_publisher(None, 1, default=False) is False
    down = FakeStore()
    down.fail_calls = 10
    assert claim_publisher(down, 0, default=True) is True
    assert claim_publisher(down, 1, default=False) is False


def test_a_lease_is_taken_over_only_from_a_lost_holder_and_only_once():
    """Rank 0 holds the lease and stops beating: ranks 1 and 2 both see it lost and both claim; exactly
    one takes it over. A claim from a holder nobody saw lost (rank 2 names rank 3) takes nothing. The
    key keeps every holder in turn, so the last publisher can name each lost one."""
    store = FakeStore()
    liveness.join(store, 0)
    assert claim_publisher(store, 0, default=True)
    assert not claim_publisher(store, 2, lost=[3], default=False)
    assert [claim_publisher(store, r, lost=[0], default=False) for r in (1, 2)] == [True, False]
    assert liveness.publishers(store) == [0, 1] and liveness.publisher(store) == 1
    assert claim_publisher(store, 2, lost=[0, 1], default=False)
    assert liveness.publishers(store) == [0, 1, 2]
    assert not claim_publisher(store, 0, default=True)  # rank 0 resumed: it publishes nothing now


# -- while the run waits: when a rank is lost -----------------------------------------------------------


def test_a_rank_is_lost_once_its_beat_stood_still_for_the_whole_window_not_before():
    """lost_after_s is "has not advanced for this long": a beat unchanged for exactly the window is
    lost; one observed changing restarts the window; a rank that left with a mark never is."""
    joined = frozenset({0, 1, 2})

    def snap(beats: dict[int, int]) -> Snapshot:
        return Snapshot(world_size=3, joined=joined, beats=beats, marks={2: "done"})

    staleness = Staleness(lost_after_s=3.0)
    assert staleness.observe(snap({0: 1, 1: 1, 2: 1}), 10.0) == []
    assert staleness.observe(snap({0: 1, 1: 2, 2: 1}), 12.0) == []
    assert staleness.observe(snap({0: 1, 1: 2, 2: 1}), 12.999) == []
    assert staleness.observe(snap({0: 1, 1: 2, 2: 1}), 13.0) == [0]
    assert staleness.observe(snap({0: 1, 1: 2, 2: 1}), 15.0) == [0, 1]


# -- the heartbeat thread -------------------------------------------------------------------------------


def test_a_heartbeat_beats_every_heartbeat_interval_by_default_and_never_holds_the_process():
    """The windows that call a rank stopped (STALE_AFTER_S, LOST_AFTER_S) are counted in beats of
    HEARTBEAT_S; a heartbeat thread that kept the interpreter alive would hang a rank's exit."""
    beat = Heartbeat(FakeStore(), 0)
    assert beat.interval_s == HEARTBEAT_S and beat._thread.daemon
    assert Heartbeat(FakeStore(), 0, interval_s=0.01).interval_s == 0.01


def test_transient_store_errors_between_good_beats_never_add_up_to_giving_up(monkeypatch):
    """A store that drops every call but one in five (a flapping link) is still reachable: the beats
    that get through reset the count, so the thread keeps beating; only consecutive failures count."""
    monkeypatch.setattr(liveness, "GIVE_UP_AFTER_FAILED_BEATS", 5)

    class Flapping(FakeStore):
        def add(self, key: str, value: int) -> int:
            with self._lock:
                self.calls += 1
                if self.calls % 5:  # calls 1-4 fail, 5 gets through, 6-9 fail, ...
                    raise StoreDown("store: connection reset by peer")
                self.data[key] = int(self.data.get(key, 0)) + value
                return int(self.data[key])

    store = Flapping()
    beat = Heartbeat(store, 3, interval_s=0.001).start()
    try:
        assert _wait_for(lambda: store.calls >= 30)
        assert beat._thread.is_alive() and store.data["hb/3"] >= 6
    finally:
        beat.stop()


def test_stop_returns_once_the_thread_is_done_and_within_its_bound_on_a_hung_store():
    """stop waits for a beat in flight (a daemon thread inside a store call at interpreter exit can
    abort the process), but no longer than join_s: a hung store call must not hang the rank's exit."""
    entered, release = threading.Event(), threading.Event()

    class Slow(FakeStore):
        def __init__(self, hold_s: float) -> None:
            super().__init__()
            self.hold_s = hold_s

        def add(self, key: str, value: int) -> int:
            entered.set()
            release.wait(self.hold_s)
            return super().add(key, value)

    _assert_stop_waits_but_is_bounded(
        lambda hold_s: Heartbeat(Slow(hold_s), 0, interval_s=0.001).start(), entered, release
    )


def _assert_stop_waits_but_is_bounded(start, entered: threading.Event, release: threading.Event) -> None:
    """``start(hold_s)`` starts a thread (heartbeat or watcher) whose store call sets ``entered`` and
    holds until ``release`` or ``hold_s``: ``stop`` waits for a short call to finish, and returns within
    its ``join_s`` from one that hangs."""
    quick = start(0.05)
    assert entered.wait(2)
    quick.stop(join_s=2.0)
    assert not quick._thread.is_alive()

    entered.clear()
    hung = start(10.0)
    assert entered.wait(2)
    t0 = time.monotonic()
    hung.stop(join_s=0.05)
    took = time.monotonic() - t0
    release.set()
    assert took < 1.0
    hung.stop()


# -- after a failure: who is gone -----------------------------------------------------------------------


def test_gone_ranks_watches_for_the_stale_window_by_default():
    """Between its two reads gone_ranks lets STALE_AFTER_S pass (4 missed beats): shorter and a live
    rank starved for a moment would look stopped."""
    world = BeatingWorld()
    world.rank(0, steps=1)
    world.rank(1, steps=1, beating=False)
    assert gone_ranks(world.store, 2, me=0, my_step=1, sleep=world.sleep) == [1]
    assert world.now == STALE_AFTER_S


def test_a_store_lost_during_the_watch_names_nobody():
    """The first read worked, the second did not (the store went away meanwhile): nothing is known
    about the window, so nobody is named rather than everybody."""
    world = BeatingWorld()
    world.rank(0, steps=1)
    world.rank(1, steps=1, beating=False)

    def sleep_then_lose_the_store(seconds: float) -> None:
        world.sleep(seconds)
        world.store.fail_calls = 1_000

    assert gone_ranks(world.store, 2, me=0, my_step=1, sleep=sleep_then_lose_the_store) == []


def test_a_rank_never_names_itself_even_when_its_own_beat_stopped():
    """This rank's heartbeat thread gave up (its store went away and came back) and it is behind the
    others' count: it still does not report itself gone; the stopped peer is named."""
    world = BeatingWorld()
    world.rank(0, steps=0, beating=False)
    world.rank(1, steps=2, beating=False)
    world.rank(2, steps=2)
    assert gone_ranks(world.store, 3, me=0, my_step=1, sleep=world.sleep) == [1]
    assert gone_ranks(world.store, 3, me=0, my_step=1, sleep=world.sleep, stopping=True) == [1]


def test_no_identified_rank_reads_as_the_report_says_it():
    """The abort detail and the report both say "none identified" when liveness names nobody
    (outputs/report.py writes the same words for a verdict with no missing ranks)."""
    assert describe([]) == "none identified"
    assert describe([3]) == "rank 3"


def test_ranks_are_named_with_their_hosts_a_few_at_most():
    assert describe([2], {2: "node-b"}) == "rank 2 (node-b)"
    assert describe([0, 1, 3], {0: "a", 1: "a", 3: "b"}) == "ranks 0-1, 3 (a, b)"
    hosts = {r: f"n{r}" for r in range(5)}
    assert describe(range(5), hosts) == "ranks 0-4 (n0, n1, n2, ... (5 hosts))"
    assert describe([4], {0: "a"}) == "rank 4"  # a rank that never joined has no host to name


def test_hosts_are_read_for_joined_ranks_only():
    """A rank that never joined wrote no host: asking for it must not wait for a key never written
    (torch's multi_get would block until its timeout)."""
    store = FakeStore()
    liveness.join(store, 0, "node-a")
    liveness.join(store, 2, "node-b")
    assert liveness.hosts(store, [0, 1, 2]) == {0: "node-a", 2: "node-b"}
    liveness.refuse(store, 2, "--backend nccl needs a CUDA GPU")
    assert liveness.refusals(store, [2]) == {2: "--backend nccl needs a CUDA GPU"}
    assert liveness.read(store, 3).refused() == [2]


# -- the watcher's look ---------------------------------------------------------------------------------


def _watcher(store: FakeStore, rank: int, now: list[float], seen: list, announced: list) -> Watcher:
    return Watcher(
        store,
        rank=rank,
        world_size=3,
        on_lost=lambda ranks: seen.append(list(ranks)),
        on_announced=lambda: announced.append(True),
        announcement="report_written",
        clock=lambda: now[0],
    )


def test_a_watcher_hands_over_the_ranks_lost_on_its_clock_but_never_itself():
    """Ranks 0 and 2 stand still for LOST_AFTER_S of the watcher's clock while rank 1 beats: rank 2 is
    handed over; rank 0 is the watcher itself (its own heartbeat thread may be starved, its main thread
    is plainly alive), so it is not."""
    store = FakeStore()
    for r in range(3):
        liveness.join(store, r)
    now, seen, announced = [100.0], [], []
    watcher = _watcher(store, 0, now, seen, announced)
    assert watcher.poll() is False and seen == []
    now[0] += 1.0
    store.add("hb/1", 1)
    assert watcher.poll() is False and seen == []
    now[0] = 100.0 + LOST_AFTER_S
    assert watcher.poll() is False and seen == [[2]] and not announced


def test_a_store_that_does_not_answer_is_neither_a_verdict_nor_a_loss():
    """While the store does not answer, a watcher neither leaves as if a verdict were published nor
    names anyone; once it answers, the published verdict is heard, once, and the watcher is done."""
    store = FakeStore()
    for r in range(3):
        liveness.join(store, r)
    now, seen, announced = [0.0], [], []
    watcher = _watcher(store, 1, now, seen, announced)
    store.fail_calls = 1_000
    for t in (0.0, 10.0):
        now[0] = t
        assert watcher.poll() is False
    assert (seen, announced) == ([], [])
    store.fail_calls = 0
    store.set("report_written", "3\nchecker lost")
    assert watcher.poll() is True and announced == [True]


def test_a_watcher_stopped_from_its_own_callback_ends_quietly(capsys):
    """on_announced leaves the process; the run may stop the watcher from inside that callback: the
    watcher's thread cannot join itself, and must not print a traceback trying."""
    store = FakeStore()
    liveness.join(store, 2)
    store.set("report_written", "0\n")
    done = threading.Event()
    box: list[Watcher] = []

    def on_announced() -> None:
        box[0].stop()
        done.set()

    box.append(
        Watcher(
            store,
            rank=2,
            world_size=3,
            on_lost=lambda ranks: None,
            on_announced=on_announced,
            announcement="report_written",
            announce_poll_s=0.001,
        )
    )
    box[0].start()  # held first: the callback may run before start() returns
    assert done.wait(2)
    box[0]._thread.join(2)
    assert not box[0]._thread.is_alive() and capsys.readouterr().err == ""


def test_only_the_watchers_poll_fast_and_no_watcher_holds_the_process():
    """The first WATCHERS ranks read every rank's keys every poll_s; the others look for the verdict
    every announce_poll_s (the store's load is O(world) per poll, not O(world squared)). A watcher
    thread that kept the interpreter alive would hang a rank's exit."""
    kw = dict(world_size=4, on_lost=lambda r: None, on_announced=lambda: None, announcement="x")
    polls = [Watcher(FakeStore(), rank=r, poll_s=0.5, announce_poll_s=1.0, **kw) for r in range(4)]
    assert [w.poll_s for w in polls] == [0.5] * WATCHERS + [1.0] * (4 - WATCHERS)
    assert all(w._thread.daemon for w in polls)


def test_stop_waits_for_a_look_in_flight_but_not_past_its_bound():
    """stop waits for a poll in flight (a daemon thread inside a store call at interpreter exit can
    abort the process), but no longer than join_s when the store hangs."""
    entered, release = threading.Event(), threading.Event()

    class Slow(FakeStore):
        def __init__(self, hold_s: float) -> None:
            super().__init__()
            self.hold_s = hold_s

        def check(self, keys: list[str]) -> bool:
            entered.set()
            release.wait(self.hold_s)
            return super().check(keys)

    def watcher(store: FakeStore) -> Watcher:
        return Watcher(
            store, rank=3, world_size=4, on_lost=lambda r: None, on_announced=lambda: None,
            announcement="x", announce_poll_s=0.001,
        ).start()  # fmt: skip

    _assert_stop_waits_but_is_bounded(lambda hold_s: watcher(Slow(hold_s)), entered, release)
