"""The distributed layer's pure logic against fakes, in milliseconds: which ranks are named gone
(heartbeats, steps, exit marks, store errors, over a fake clock), the heartbeat thread, the bounded-call
helper and the header's decoding. Real FileStore and torchrun worlds: tests/test_check.py, test_faults.py.
"""

from __future__ import annotations

import io
import threading
import time

import pytest
from fakes import BeatingWorld, FakeStore

from checker.bounded import call_bounded
from checker.distributed import liveness
from checker.distributed.liveness import Heartbeat, gone_ranks, mark
from checker.distributed.wire import HEADER_LEN, MAGIC, ROW_LEN, SCHEMA_VERSION, Header, WireError


def gone(world: BeatingWorld, size: int, *, me: int = 0, my_step: int = 2, **kw) -> list[int]:
    return gone_ranks(world.store, size, me=me, my_step=my_step, sleep=world.sleep, **kw)


# -- gone_ranks ---------------------------------------------------------------------------------------


def test_a_rank_whose_beat_stopped_is_gone_and_one_stuck_in_the_collective_is_not():
    """Rank 1 is stuck in the gloo ring (alive, reached the collective), rank 2 was killed (its beat
    stopped): only rank 2 is named."""
    world = BeatingWorld()
    world.rank(0, steps=2)
    world.rank(1, steps=2)
    world.rank(2, steps=2, beating=False)
    assert gone(world, 3) == [2]


def test_a_rank_that_never_reached_the_collective_is_hung_only_when_the_collective_timed_out():
    """Rank 1 beats but is one collective behind: after a gather that ran out its time it is hung;
    after one that failed at once (a peer dropped out) it is merely slower, and named only if its beat
    stopped too (rank 2)."""
    world = BeatingWorld()
    world.rank(0, steps=2)
    world.rank(1, steps=1)
    world.rank(2, steps=2, beating=False)
    assert gone(world, 3) == [1, 2]
    assert gone(world, 3, behind_is_hung=False) == [2]


def test_ranks_that_said_they_were_leaving_are_never_blamed():
    world = BeatingWorld()
    world.rank(0, steps=2)
    world.rank(1, steps=1, beating=False, exiting="done")
    world.rank(2, steps=2, beating=False, exiting="sigterm")
    assert gone(world, 3) == []


def test_when_every_rank_is_being_stopped_only_ranks_that_beat_and_stopped_are_named():
    """torchrun's SIGTERM reaches everyone: a rank that never beat may be a slow starter told to stop,
    and one behind in the collectives is not hung; only a rank that beat then stopped is named."""
    world = BeatingWorld()
    world.rank(0, steps=1)
    world.rank(1, beats=0, steps=0, beating=False)  # never reached the store
    world.rank(2, steps=0)  # behind, beating
    world.rank(3, steps=1, beating=False)  # killed
    assert gone(world, 4, my_step=1, stopping=True) == [3]


def test_a_store_that_cannot_be_read_names_nobody_rather_than_everybody():
    world = BeatingWorld()
    for r in range(3):
        world.rank(r, beating=False)
    world.store.fail_calls = 1_000
    assert gone(world, 3) == []
    assert gone_ranks(None, 3, me=0) == []


def test_exit_marks_that_cannot_be_read_name_nobody():
    """Rank 1 left on purpose (its beat stopped, its exit mark set): when the exit marks cannot be
    read, it must not be blamed for stopping (it used to be: a failed read counted as "nobody left")."""
    world = BeatingWorld()
    world.rank(0)
    world.rank(1, beating=False, exiting="done")
    assert gone(world, 2) == []
    world.store.fail_methods = {"check"}
    assert gone(world, 2) == []


# -- the heartbeat thread -----------------------------------------------------------------------------


def test_the_heartbeat_beats_marks_its_steps_and_its_leaving_and_stops():
    store = FakeStore()
    beat = Heartbeat(store, 2, interval_s=0.001).start()
    beat.enter_step()
    beat.enter_step()
    beat.mark_exiting("done")
    deadline = time.monotonic() + 2
    while store.data.get("hb/2", 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
    beat.stop()
    after = store.data["hb/2"]
    time.sleep(0.02)
    assert after >= 3 and store.data["hb/2"] == after  # stopped for good
    assert store.data["step/2"] == 2 and store.data["marks"] == "2:done,"


def test_the_heartbeat_gives_up_only_on_a_store_that_stays_gone(monkeypatch):
    from checker.distributed import liveness

    monkeypatch.setattr(liveness, "GIVE_UP_AFTER_FAILED_BEATS", 5)
    store = FakeStore()
    store.fail_calls = 10**6
    beat = Heartbeat(store, 0, interval_s=0.001).start()
    beat._thread.join(2)
    assert not beat._thread.is_alive() and store.calls == 5


def test_a_store_call_that_hangs_is_abandoned_in_time():
    from checker.distributed.liveness import store_call

    release = threading.Event()
    t0 = time.monotonic()
    assert store_call(lambda: release.wait(10), "default", seconds=0.05) == "default"
    assert time.monotonic() - t0 < 1
    release.set()


# -- the bounded-call helper --------------------------------------------------------------------------


def test_bounded_returns_the_value_the_exception_or_that_time_ran_out():
    ok = call_bounded(lambda: 42, 1)
    assert (ok.done, ok.value, ok.error, ok.get(0)) == (True, 42, None, 42)
    boom = call_bounded(lambda: 1 // 0, 1)
    assert boom.done and isinstance(boom.error, ZeroDivisionError) and boom.get(-1) == -1
    gate = threading.Event()
    slow = call_bounded(lambda: gate.wait(10), 0.05)
    gate.set()
    assert not slow.done and slow.get("late") == "late"


def test_bounded_reports_a_bug_with_its_traceback_and_a_timeout_with_a_line():
    out = io.StringIO()
    assert call_bounded(lambda: 1, 1).report("writing", stream=out) and out.getvalue() == ""
    assert not call_bounded(lambda: {}["x"], 1).report("rendering the report", stream=out)
    text = out.getvalue()
    assert "checker: rendering the report failed:" in text and "Traceback" in text and "KeyError: 'x'" in text
    out = io.StringIO()
    gate = threading.Event()
    assert not call_bounded(lambda: gate.wait(10), 0.02).report("writing", stream=out)
    gate.set()
    assert out.getvalue() == "checker: writing did not finish in time; given up\n"


# -- the header ---------------------------------------------------------------------------------------


def test_a_header_reads_back_what_was_sent():
    h = Header(rank=5, device_free_bytes=123 << 30, payload_len=1305, status=3)
    ints = h.encode()
    assert len(ints) == HEADER_LEN and ints[:3] == [MAGIC, SCHEMA_VERSION, ROW_LEN]
    assert Header.decode(ints) == h


def test_any_schemas_header_decodes_and_shows_its_schema():
    """A peer of another checker version still decodes (its first slots never change meaning), so the
    mismatch can be named instead of a garbled gather."""
    other = Header.decode([MAGIC, 3, 77, 1, -1, 0, 0, 0])
    assert other.schema == (MAGIC, 3, 77) and other.rank == 1


@pytest.mark.parametrize("n", [HEADER_LEN - 1, HEADER_LEN + 1])
def test_a_header_of_another_length_is_a_wire_error(n):
    with pytest.raises(WireError, match=f"header of {n} ints"):
        Header.decode([0] * n)


# -- waiting for rank 0's announcement ----------------------------------------------------------------


def _session_on(store: FakeStore, rank: int = 1):
    from types import SimpleNamespace

    from checker.distributed.launch_env import GroupOptions, RankEnv
    from checker.distributed.session import Session

    session = Session(RankEnv.from_environ({"RANK": str(rank), "WORLD_SIZE": "2"}), GroupOptions())
    session.group = SimpleNamespace(store=store, liveness_store=store, heartbeat=None)  # type: ignore[assignment]
    return session


@pytest.mark.parametrize("rank0_alive", [True, False])
def test_another_rank_waits_for_a_live_rank_0_to_finish_publishing(monkeypatch, rank0_alive):
    """Rank 0 takes a while to publish (a dense sweep's plot): while its heartbeat advances the others
    keep waiting and adopt its exit code; a rank 0 whose beat stood still for the lease's bound is
    given up (``stopped``: its lease is over) before it would have announced."""
    from checker.distributed import session as session_module

    monkeypatch.setattr(session_module, "STALE_AFTER_S", 0.02)
    monkeypatch.setattr(session_module, "PUBLISHER_LOST_AFTER_S", 0.1)
    store = FakeStore()
    for r in range(2):
        liveness.join(store, r)
    store.data["hb/0"] = 1
    done = threading.Event()

    def rank0() -> None:  # publishes for 0.4 s, beating
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.4 and not done.is_set():
            if rank0_alive:
                store.add("hb/0", 1)
            time.sleep(0.005)
        store.set("report_written", "2\nchecker sweep error: cannot write --plot")

    threading.Thread(target=rank0, daemon=True).start()
    t0 = time.monotonic()
    wait = _session_on(store).await_announcement(5)
    done.set()
    if rank0_alive:
        assert wait.announced == (2, "checker sweep error: cannot write --plot")
    else:
        assert wait.stopped == 0 and wait.announced is None and time.monotonic() - t0 < 0.35


def test_a_store_on_a_cut_link_ends_the_wait_for_rank_0_at_once(monkeypatch):
    """Node 1 is cut off: its store calls block past any timeout. Waiting for rank 0's announcement
    must end within one store-call bound (rank 0 cannot announce to it), not wait out the time a live
    rank 0 would get to publish."""
    from checker.distributed import liveness

    monkeypatch.setattr(liveness, "STORE_CALL_S", 0.05)
    release = threading.Event()

    class CutStore(FakeStore):
        def check(self, keys: list[str]) -> bool:
            release.wait(30)
            return False

    t0 = time.monotonic()
    wait = _session_on(CutStore()).await_announcement(60)
    assert wait.announced is None and wait.stopped is None
    release.set()
    assert time.monotonic() - t0 < 1


@pytest.mark.parametrize("store_lost", [False, True])
def test_a_rank_that_leaves_with_its_own_verdict_says_so_unless_its_store_is_gone(store_lost):
    """A rank that printed its own verdict (rank 0 never announced) leaves without tearing the group
    down, but first marks itself as leaving, so a rank 0 still naming the gone does not blame it; on a
    store that stopped answering it does not spend another store call's bound on that."""
    from types import SimpleNamespace

    from checker.distributed.launch_env import GroupOptions, RankEnv
    from checker.distributed.session import Session

    class Left(Exception):
        pass

    def leave(code: int):
        raise Left(code)

    store = FakeStore()
    session = Session(
        RankEnv.from_environ({"RANK": "2", "WORLD_SIZE": "4"}), GroupOptions(), exit_process=leave
    )
    session.group = SimpleNamespace(store=store, heartbeat=Heartbeat(store, 2))  # type: ignore[assignment]
    session.store_lost = store_lost
    with pytest.raises(Left):
        session.close(3, clean=False)
    assert ("2:done," in store.data.get("marks", "")) is not store_lost


def test_a_rank_ended_by_its_own_watchdog_is_named_only_if_it_never_reached_the_collective():
    """Rank 1 waited in the collective and its watchdog ended it (its beat stopped): not blamed. Rank 2
    hung before the collective and its watchdog ended it too: still the hung one."""
    world = BeatingWorld()
    world.rank(0, steps=1)
    world.rank(1, steps=1, beating=False)
    world.rank(2, steps=0, beating=False)
    for r in (1, 2):
        mark(world.store, r, "watchdog")
    assert gone(world, 3, my_step=1) == [2]


def test_the_announcement_poll_is_quick_in_small_worlds_and_bounded_for_the_store_in_large_ones():
    """The other ranks' wait for rank 0's announcement ends every job: a small world looks every 10 ms
    (2 ranks waited 54 ms at 50 ms polls), and the store's load from these checks stays at most about
    1,000 calls/s below 50 ranks and one per rank per 50 ms above (the cost model's row)."""
    from checker.distributed.session import announcement_poll_s

    assert announcement_poll_s(2) == 0.01
    assert announcement_poll_s(8) == 0.01
    assert announcement_poll_s(4096) == 0.05
    for world in range(1, 5000):
        poll = announcement_poll_s(world)
        assert 0.01 <= poll <= 0.05
        assert (world - 1) / poll <= max(1000, 20 * world)
