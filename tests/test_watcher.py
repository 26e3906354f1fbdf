"""The watcher's logic in milliseconds (issue 20): which ranks are lost while the others still wait, over
a fake clock; that reading the liveness state costs the same few store round trips at 4 or 4,096 ranks;
who publishes when rank 0 is the one lost (exactly one writer); the start-up line. The same paths on
real torchrun jobs: tests/test_faults_watcher.py.
"""

from __future__ import annotations

import threading
import time

import pytest
from fakes import BeatingWorld, Exited, FakeJob, FakeStore, World

from checker.distributed import liveness
from checker.distributed.liveness import HEARTBEAT_S, LOST_AFTER_S, Staleness
from checker.distributed.watcher import POLL_S, Watcher


@pytest.fixture(autouse=True)
def _no_error_file(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)


def watch(world: BeatingWorld, size: int, seconds: float, staleness: Staleness) -> dict[int, float]:
    """Poll like a watcher every POLL_S of the fake clock for ``seconds``: when each rank was first
    reported lost."""
    first: dict[int, float] = {}
    t_end = world.now + seconds
    while world.now < t_end:
        world.sleep(POLL_S)
        snapshot = liveness.read(world.store, size)
        assert snapshot is not None
        for r in staleness.observe(snapshot, world.now):
            first.setdefault(r, world.now)
    return first


# -- which ranks are lost, over a fake clock ----------------------------------------------------------


def test_a_rank_that_stops_beating_is_lost_within_the_bound_and_not_before():
    """Rank 2 is killed (or frozen) at t = 2 s while every rank waits: it is named no earlier than
    LOST_AFTER_S after its last beat and no later than that plus one poll and one beat interval, so
    the verdict comes within 5 s of the loss whatever --timeout-s is. The others, beating, never are."""
    world = BeatingWorld()
    for r in range(4):
        world.rank(r, steps=1)
    staleness = Staleness()
    assert watch(world, 4, 2.0, staleness) == {}
    world.beating.discard(2)
    lost_at = world.now
    first = watch(world, 4, 10.0, staleness)
    assert list(first) == [2]
    assert LOST_AFTER_S - POLL_S <= first[2] - lost_at <= LOST_AFTER_S + POLL_S + HEARTBEAT_S
    assert first[2] - lost_at < 5.0 - 0.5  # leaves half a second to write the report


def test_a_node_that_goes_away_is_named_whole_not_one_rank_of_it():
    """Ranks 2 and 3 (one node) stop at one instant, their last beats seen one poll apart (the
    watcher's clock is quantised by its poll): rank 2 crosses LOST_AFTER_S first, and the watcher waits
    for rank 3 (half a second here) instead of ending the run naming rank 2 alone. A rank that was only
    slow, seen beating again meanwhile, is not named and costs that one wait."""
    joined = frozenset(range(4))

    def snap(beats: dict[int, int]) -> liveness.Snapshot:
        return liveness.Snapshot(world_size=4, joined=joined, beats=beats, marks={})

    staleness = Staleness()
    assert staleness.observe(snap({0: 5, 1: 5, 2: 5, 3: 4}), 10.0) == []
    assert staleness.observe(snap({0: 6, 1: 6, 2: 5, 3: 5}), 10.5) == []  # rank 3's last beat
    assert staleness.observe(snap({0: 12, 1: 12, 2: 5, 3: 5}), 10.0 + LOST_AFTER_S) == []
    assert staleness.observe(snap({0: 14, 1: 14, 2: 5, 3: 5}), 10.5 + LOST_AFTER_S) == [2, 3]

    slow = Staleness()
    assert slow.observe(snap({0: 5, 1: 5, 2: 5, 3: 5}), 10.0) == []
    assert slow.observe(snap({0: 6, 1: 6, 2: 5, 3: 6}), 10.5) == []
    assert slow.observe(snap({0: 12, 1: 12, 2: 5, 3: 6}), 10.0 + LOST_AFTER_S) == []  # rank 3 is slow
    assert slow.observe(snap({0: 14, 1: 14, 2: 5, 3: 7}), 10.5 + LOST_AFTER_S) == [2]  # it beat again


def test_a_rank_starved_for_a_few_seconds_is_not_lost():
    """A loaded machine: rank 1's heartbeat thread gets no CPU for 2.5 s, then beats again. Rank 3's
    stalls for just over LOST_AFTER_S and is named: the line is at LOST_AFTER_S, not at a missed beat."""
    world = BeatingWorld()
    for r in range(4):
        world.rank(r, steps=1)
    staleness = Staleness()
    watch(world, 4, 1.0, staleness)
    world.beating -= {1, 3}
    assert watch(world, 4, 2.5, staleness) == {}
    world.beating.add(1)
    assert list(watch(world, 4, 1.5, staleness)) == [3]


def test_a_watcher_that_polls_late_does_not_take_live_ranks_for_lost():
    """The watcher itself was starved for 6 s: what it sees then has advanced, so nobody is lost
    (staleness is measured from what this watcher saw change, not from the clock alone)."""
    world = BeatingWorld()
    for r in range(3):
        world.rank(r)
    staleness = Staleness()
    watch(world, 3, 1.0, staleness)
    world.sleep(6.0)
    snapshot = liveness.read(world.store, 3)
    assert snapshot is not None and staleness.observe(snapshot, world.now) == []


def test_ranks_that_left_on_purpose_or_never_joined_are_not_lost_while_waiting():
    """Rank 1 left with a verdict (its mark says so); rank 2 never reached the store (a slow start
    looks the same: the start-up line, not the watcher, speaks of it)."""
    world = BeatingWorld()
    world.rank(0)
    world.rank(1, beating=False, exiting="done")
    world.rank(2, beats=0, beating=False)
    world.rank(3, beating=False, exiting="watchdog")
    assert watch(world, 4, 10.0, Staleness()) == {}


# -- the cost of a read --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 4096])
def test_reading_every_ranks_state_costs_three_round_trips_whatever_the_world_size(size):
    """And asks the store for one key per rank: TCPStore's multi_get grows faster than linearly."""
    store = FakeStore()
    for r in range(size):
        liveness.join(store, r)
    store.add(f"hb/{size - 1}", 5)
    liveness.mark(store, 1, "done")
    store.calls = 0
    asked: list[int] = []
    multi_get = store.multi_get
    store.multi_get = lambda keys: asked.append(len(keys)) or multi_get(keys)  # type: ignore[method-assign]
    snapshot = liveness.read(store, size)
    assert store.calls == 3 and asked == [2, size]
    assert snapshot is not None and len(snapshot.joined) == size
    assert snapshot.beat(size - 1) == 5 and snapshot.mark(1) == "done" and snapshot.mark(0) == ""


def test_gone_ranks_costs_the_same_round_trips_at_any_size():
    calls = []
    for size in (8, 2048):
        world = BeatingWorld()
        for r in range(size):
            world.rank(r, steps=1, beating=r != 3)
        world.store.calls = 0
        assert liveness.gone_ranks(world.store, size, me=0, my_step=1, sleep=world.sleep) == [3]
        calls.append(world.store.calls)
    assert calls[0] == calls[1] <= 6


def test_a_rank_not_joined_reads_as_never_beating_and_its_keys_are_never_waited_on():
    """torch's multi_get blocks on a missing key: only joined ranks' keys are asked for."""
    store = FakeStore()
    liveness.join(store, 1)
    snapshot = liveness.read(store, 3)
    assert snapshot is not None and snapshot.joined == {1} and snapshot.not_joined() == [0, 2]
    empty = FakeStore()
    assert liveness.read(empty, 3) == liveness.Snapshot(world_size=3, joined=frozenset())
    assert store.blocked == empty.blocked == []  # no read of a key nobody set (torch's would wait)


# -- the watcher thread --------------------------------------------------------------------------------


def test_the_watcher_thread_names_the_rank_that_stopped_and_hears_a_verdict():
    store = FakeStore()
    for r in range(4):
        liveness.join(store, r)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            for r in (0, 1, 3):
                store.add(f"hb/{r}", 1)
            time.sleep(0.002)

    threading.Thread(target=beat, daemon=True).start()
    seen: list[list[int]] = []
    announced = threading.Event()
    watcher = Watcher(
        store,
        rank=0,
        world_size=4,
        on_lost=lambda ranks: seen.append(list(ranks)),
        on_announced=announced.set,
        announcement="report_written",
        poll_s=0.005,
        staleness=Staleness(lost_after_s=0.05),
    ).start()
    try:
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.005)
        assert seen and seen[0] == [2]
        store.set("report_written", "3\nchecker lost")
        assert announced.wait(5)
    finally:
        stop.set()
        watcher.stop()


def test_a_rank_that_is_not_a_watcher_only_looks_for_the_verdict():
    """Ranks past the first two read one key per poll, not every rank's state (O(world) store load,
    not O(world squared))."""
    store = FakeStore()
    for r in range(3):
        liveness.join(store, r)
    watcher = Watcher(
        store, rank=2, world_size=3, on_lost=lambda r: None, on_announced=lambda: None, announcement="x"
    )
    store.calls = 0
    assert watcher.poll() is False and store.calls == 1


# -- who publishes when a rank is lost ----------------------------------------------------------------


def _runs(world: World, js: list[FakeJob]):
    from checker.distributed.exchange import _Run

    runs = [_Run(world.sessions[r], js[r], refused=None) for r in range(world.size)]
    for r, run in enumerate(runs):
        world.sessions[r].start(run.abort)
        world.sessions[r].join()  # the watcher runs on a rank that joined the store
    return runs


def test_rank_0_ends_the_run_naming_the_lost_rank_and_others_only_wait():
    world = World(4)
    js = [FakeJob(rank=r) for r in range(4)]
    runs = _runs(world, js)
    runs[1].lost_seen([2])  # rank 0 is alive: rank 1 leaves it to rank 0
    assert not js[1].published and not js[1].fallbacks
    with pytest.raises(Exited) as exited:
        runs[0].lost_seen([2])
    assert exited.value.code == 3
    assert js[0].published == [("lost", js[0].published[0][1], [2])]
    assert "rank 2 (node-1) stopped beating" in js[0].published[0][1]
    assert world.announced == (3, "fake lost") and world.exiting[0] == "done"


def test_when_rank_0_is_lost_the_lowest_surviving_rank_publishes_once_in_its_place():
    """Rank 0 frozen: rank 1 (the lowest survivor) publishes naming it. Rank 2, which saw ranks 0
    and 1 lost a moment later, and rank 0 itself, were it only slow, do not publish a second time:
    they leave with the verdict published."""
    world = World(4)
    js = [FakeJob(rank=r) for r in range(4)]
    runs = _runs(world, js)
    runs[2].lost_seen([0])  # not the lowest survivor: nothing
    with pytest.raises(Exited):
        runs[1].lost_seen([0])
    assert js[1].published == [("lost", js[1].published[0][1], [0])]
    assert "rank 0 (node-0) stopped beating" in js[1].published[0][1]
    assert world.announced == (3, "fake lost")
    with pytest.raises(Exited) as adopted:
        runs[2].lost_seen([0, 1])
    with pytest.raises(Exited):
        runs[0].lost_seen([3])
    assert [len(j.published) for j in js] == [0, 1, 0, 0]
    # Each adopts the verdict rank 1 published (its exit code), printing no second one.
    assert adopted.value.code == 3 and not js[2].fallbacks and not js[0].fallbacks


def test_a_rank_waiting_in_a_collective_leaves_with_the_published_code():
    world = World(3)
    world.announced = (3, "fake lost")
    runs = _runs(world, [FakeJob(rank=r) for r in range(3)])
    with pytest.raises(Exited) as exited:
        runs[2].announced()
    assert exited.value.code == 3 and world.exiting == {2: "done"}


def test_when_rank_0_never_announces_after_a_failed_gather_a_survivor_publishes_once():
    """The payload gather fails and rank 0 is gone (its beat stopped; it never claims the verdict):
    one survivor takes the publisher lease and publishes the lost outcome naming rank 0, every rank
    leaves with 3, nobody else publishes."""
    from fakes import run_ranks

    world = World(3, missing=[0], announce_wait_s=0.05, frozen={0})
    world.fail_gather[2] = {0}
    js = [FakeJob(rank=r) for r in range(3)]
    world.sessions[0].claim_publisher = lambda **kw: False  # type: ignore[method-assign]
    results = run_ranks(world, js)
    assert [r.code for r in results] == [3, 3, 3], [r.error for r in results]
    ((writer, outcome),) = [(j.rank, o) for j in js for o in j.published]
    assert writer in (1, 2) and outcome == ("lost", "exchange: a peer left the gather", [0])


# -- start-up ----------------------------------------------------------------------------------------


def test_a_start_up_timeout_says_how_many_ranks_joined_and_which_did_not(monkeypatch):
    from types import SimpleNamespace

    from checker.distributed import session as session_module
    from checker.distributed.launch_env import GroupOptions, RankEnv
    from checker.distributed.session import Session

    monkeypatch.setattr(session_module, "gone_ranks", lambda *a, **kw: [5, 7])
    store = FakeStore()
    for r in (0, 1, 2, 3, 4, 6):
        liveness.join(store, r)
    session = Session(RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "8"}), GroupOptions())
    session.group = SimpleNamespace(  # type: ignore[assignment]
        store=store, liveness_store=store, heartbeat=None, shorten_store_timeout=lambda s: None
    )
    abort = session.failed("init: timed out")
    assert abort.missing_ranks == [5, 7]
    assert abort.detail.startswith("init: timed out; ranks still starting: 6 of 8 joined after ")
    assert abort.detail.endswith(" s (not joined: ranks 5, 7)")
    for r in (5, 7):
        liveness.join(store, r)
    assert session.failed("exchange: timed out").detail == "exchange: timed out"


def test_a_rank_waiting_for_rank_0_stops_waiting_once_rank_0_is_seen_stopped(monkeypatch):
    """Rank 0 was killed after the exchange: its beat stands still, so a waiting rank learns it within
    the lease's bound (and takes the lease over) instead of waiting out the time a live rank 0 gets."""
    from types import SimpleNamespace

    from checker.distributed import session as session_module
    from checker.distributed.launch_env import GroupOptions, RankEnv
    from checker.distributed.session import Session

    monkeypatch.setattr(session_module, "STALE_AFTER_S", 0.02)
    monkeypatch.setattr(session_module, "PUBLISHER_LOST_AFTER_S", 0.1)
    store = FakeStore()
    liveness.join(store, 0)
    store.add("hb/0", 7)
    session = Session(RankEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2"}), GroupOptions())
    session.group = SimpleNamespace(  # type: ignore[assignment]
        store=store, liveness_store=store, heartbeat=None
    )
    t0 = time.monotonic()
    assert session.await_announcement(60).stopped == 0
    assert time.monotonic() - t0 < 1.0


def test_a_rank_not_yet_beating_is_never_taken_for_a_stopped_publisher(monkeypatch):
    """A rank that cannot take part waits for rank 0's verdict before rank 0 has even joined (its beat
    still 0): that is a slow start, not a lost publisher; the wait runs its course."""
    from types import SimpleNamespace

    from checker.distributed import session as session_module
    from checker.distributed.launch_env import GroupOptions, RankEnv
    from checker.distributed.session import Session

    monkeypatch.setattr(session_module, "STALE_AFTER_S", 0.02)
    monkeypatch.setattr(session_module, "PUBLISHER_LOST_AFTER_S", 0.05)
    store = FakeStore()
    liveness.join(store, 1)
    session = Session(RankEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2"}), GroupOptions())
    session.group = SimpleNamespace(  # type: ignore[assignment]
        store=store, liveness_store=store, heartbeat=None
    )
    wait = session.await_announcement(0.3)
    assert wait.stopped is None and wait.announced is None
