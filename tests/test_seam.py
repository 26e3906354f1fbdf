"""The lifecycle's decisions at the real seam: the real Session and run protocol over a store whose reads
block as torch's do, on a virtual clock (tests/seam.py), so a 30 s timeout costs milliseconds.

Each test runs :func:`checker.distributed.exchange.run` on real :class:`checker.distributed.session.Session`
objects: a rank that never arrives, a late announcement, the publisher lease taken over, a refused rank,
a rank killed while the others wait, a store that stops answering, the verdict's publication. The
subprocess matrices (tests/test_faults.py, test_liveness.py) stay the end-to-end proof under torchrun.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from fakes import FakeJob, Killed
from seam import ProcessExit, SeamWorld, VirtualClock
from torch.distributed import DistStoreError

from checker.distributed import exchange
from checker.distributed.liveness import LOST_AFTER_S, STALE_AFTER_S
from checker.distributed.session import ANNOUNCEMENT, STOP_JOIN_S


@pytest.fixture(autouse=True)
def _no_error_file(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.delenv("CHECKER_INJECT_FAULT", raising=False)


def jobs(n: int, **per_rank) -> list[FakeJob]:
    """``per_rank``: field -> {rank: value}."""
    return [FakeJob(rank=r, **{k: v[r] for k, v in per_rank.items() if r in v}) for r in range(n)]


def codes(processes) -> list[int | None]:
    return [p.code for p in processes]


# -- the fakes keep torch's semantics ------------------------------------------------------------------


def test_a_read_of_a_missing_key_blocks_until_the_store_timeout_then_raises_torchs_error():
    """torch 2.13's TCPStore: ``get`` of a key nobody sets waits out the store's timeout and raises
    DistStoreError ("wait timeout after 30000ms, keys: /k"); the fake does the same on the virtual
    clock (30 s of it), where the old fake raised KeyError at once."""
    world = SeamWorld(1)
    client = world.store.client(timeout_s=30)
    t0 = world.clock.monotonic()
    with pytest.raises(DistStoreError, match=r"wait timeout after 30000ms, keys: /report_written"):
        client.get("report_written")
    assert world.clock.monotonic() - t0 == pytest.approx(30.0)
    client.set_timeout(timedelta(seconds=2))
    with pytest.raises(DistStoreError, match="after 2000ms"):
        client.multi_get(["a", "b"])


def test_a_blocked_read_returns_once_another_party_sets_the_key():
    """A reader waits (time stands still while the writer still works), and returns the value it set."""
    clock = VirtualClock()
    world = SeamWorld(2, clock=clock)
    reader, writer = world.store.client(30), world.store.client(30)
    got: list[bytes] = []
    with clock.cond:
        clock.parties = 2

    def read() -> None:
        try:
            got.append(reader.get("k"))
        finally:
            with clock.cond:
                clock.parties -= 1

    t = threading.Thread(target=read, daemon=True)
    t.start()
    time.sleep(0.02)  # the writer is busy (real time): virtual time must not pass for the reader
    assert clock.monotonic() == 1000.0
    clock.sleep(5.0)  # now the writer waits too: time passes, and the reader is still waiting
    writer.set("k", "v")
    with clock.cond:
        clock.parties -= 1
    t.join(5)
    assert got == [b"v"] and clock.monotonic() == 1005.0


# -- the lifecycle's decisions ---------------------------------------------------------------------------


def test_the_verdict_is_published_once_and_every_rank_leaves_with_its_code():
    """Rank 0 holds the publisher lease, publishes what every rank sent, announces the code in the
    store; the others adopt it and every group is torn down cleanly."""
    world = SeamWorld(3)
    js = jobs(3, code={0: 1, 1: 1, 2: 1})
    t0 = time.monotonic()
    processes = world.run(js)
    assert codes(processes) == [1, 1, 1]
    assert js[0].published == [("decided", 1, [[0, 0], [1, 1], [2, 2]])]
    assert not js[1].published and not js[2].published
    assert world.value(ANNOUNCEMENT) == "1\nfake decided"
    assert world.value("publisher") == "0"
    assert set((world.value("marks") or "").strip(",").split(",")) == {"0:done", "1:done", "2:done"}
    assert all(p.session.group.closed for p in processes)  # type: ignore[union-attr]
    assert time.monotonic() - t0 < 2.0


def test_a_rank_that_never_arrives_is_named_when_the_rendezvous_times_out():
    """Rank 1 never starts: rank 0 waits out --timeout-s 30 in the rendezvous (virtual: milliseconds),
    then names rank 1 as never joined, publishes an infrastructure failure and leaves with 3."""
    world = SeamWorld(2, timeout_s=30)
    js = jobs(2)
    t0 = time.monotonic()
    (rank0,) = world.run(js, ranks=[0])
    assert rank0.code == 3
    ((kind, detail, missing),) = js[0].published
    assert kind == "lost" and missing == [1]
    assert "init: DistStoreError: wait timeout after 30000ms" in detail
    # Counted after the rendezvous timeout and the liveness look that names the gone (STALE_AFTER_S).
    assert f"1 of 2 joined after {30 + STALE_AFTER_S:.0f} s (not joined: rank 1)" in detail
    assert world.value(ANNOUNCEMENT) == "3\nfake lost"
    assert time.monotonic() - t0 < 2.0


def test_a_late_announcement_is_waited_for_while_the_publisher_beats():
    """Rank 0 takes 5 s to publish (a slow report write, longer than LOST_AFTER_S) while beating: rank 1
    waits for it, never takes the lease over, and leaves with rank 0's code."""
    world = SeamWorld(2)
    js = jobs(2, code={0: 1, 1: 1}, before_publish={0: lambda: world.clock.sleep(5.0)})
    t0 = world.clock.monotonic()
    processes = world.run(js)
    assert codes(processes) == [1, 1]
    assert world.clock.monotonic() - t0 >= 5.0 > LOST_AFTER_S
    assert [o[0] for o in js[0].published] == ["decided"] and not js[1].published
    assert world.value("publisher") == "0"  # nobody took the lease over


def test_the_publisher_lease_is_taken_over_when_its_holder_dies_publishing():
    """Rank 0 is killed while it publishes: its beat stops; rank 1 takes the lease over after
    LOST_AFTER_S, publishes an infrastructure failure naming rank 0 and its host, and leaves with 3."""
    died: set[int] = set()
    world = SeamWorld(2)
    js = jobs(2, dies_publishing={0: died})
    processes = world.run(js)
    assert died == {0} and isinstance(processes[0].error, Killed)
    assert processes[1].code == 3
    ((kind, detail, missing),) = js[1].published
    assert kind == "lost" and missing == [0]
    assert detail.startswith(f"rank 0 (node-0) stopped beating for {LOST_AFTER_S:g} s before the verdict")
    assert world.value("publisher") == "0,1"
    assert world.value(ANNOUNCEMENT) == "3\nfake lost"


def test_a_rank_that_cannot_use_its_backend_is_named_by_rank_0s_watcher():
    """Rank 1 cannot use its --backend: it joins the store only and says why; rank 0 waits in the
    rendezvous, its watcher finds the refusal and ends the run at once with an error naming rank 1 and
    its host (long before --timeout-s); rank 1 adopts the verdict. Both leave with 2."""
    world = SeamWorld(2, timeout_s=30, backend_errors={1: "--backend nccl needs a CUDA GPU"})
    js = jobs(2)
    t0 = world.clock.monotonic()
    processes = world.run(js)
    assert codes(processes) == [2, 2]
    assert js[0].published == [("errors", ["rank 1 (node-0): --backend nccl needs a CUDA GPU"])]
    assert world.clock.monotonic() - t0 < 30  # the watcher, not the rendezvous timeout
    assert world.value(ANNOUNCEMENT) == "2\nfake errors"


def test_a_refused_rank_joins_and_its_error_reaches_the_report():
    """Rank 2's command line was refused: it joins with its message only; rank 0 names it."""
    world = SeamWorld(3)
    js = jobs(3)
    said = "checker check: error: unrecognized arguments: --polcy"
    processes = world.run(js, refused={2: said})
    assert codes(processes) == [2, 2, 2]
    assert js[0].published == [("errors", [f"rank 2 (node-1): {said}"])]


def test_an_unwritable_output_fails_a_passing_run_on_every_rank(monkeypatch, tmp_path):
    """The publisher could not deliver an output (checker.status.exit_after_outputs): a run that would
    have passed leaves with 2 on every rank, the reason in each rank's torchrun error file."""
    recorded: list[str] = []
    monkeypatch.setattr(exchange, "record_for_torchrun", recorded.append)
    world = SeamWorld(2)
    js = jobs(2, publish_problem={0: "cannot write --report /r.json: Permission denied"})
    assert codes(world.run(js)) == [2, 2]
    line = "checker fake error: cannot write --report /r.json: Permission denied"
    assert world.value(ANNOUNCEMENT) == f"2\n{line}"
    assert recorded == [line, line]


def test_a_rank_killed_before_the_exchange_is_named_by_the_watcher_in_seconds():
    """Rank 1 joined, then its process stops (killed) before the header gather: rank 0's watcher sees
    its beat stand still for LOST_AFTER_S and ends the run naming it, long before --timeout-s 30."""
    world = SeamWorld(2, timeout_s=30)

    def killed(ctx, local):  # rank 1's process ends while rank 0 waits in the header gather
        raise Killed("rank 1 killed")

    js = jobs(2)
    js[1].header = killed  # type: ignore[method-assign]
    t0 = world.clock.monotonic()
    processes = world.run(js)
    assert processes[0].code == 3 and isinstance(processes[1].error, Killed)
    ((kind, detail, missing),) = js[0].published
    assert kind == "lost" and missing == [1]
    assert "rank 1 (node-0) stopped beating" in detail
    assert world.clock.monotonic() - t0 < 10


def test_a_rank_no_verdict_can_reach_prints_its_own():
    """Rank 0's node goes down as it publishes, and the store with it: rank 1's reads fail twice in a
    row, so no verdict can reach it; it prints its own (the decided outcome) on its stderr and leaves with
    that outcome's code, without a clean teardown."""
    world = SeamWorld(2)

    def node_down() -> None:
        world.store.down = True
        raise Killed("rank 0's node is gone")

    js = jobs(2, code={0: 1, 1: 1}, before_publish={0: node_down})
    processes = world.run(js)
    assert isinstance(processes[0].error, Killed) and processes[1].code == 1
    assert js[1].fallbacks == [("decided", 1, [[0, 0], [1, 1]])] and not js[1].published
    session = processes[1].session
    assert session is not None and session.store_lost
    assert not session.group.closed  # type: ignore[union-attr]


def test_a_jobs_state_never_changes_during_a_run(tmp_path):
    """The real jobs are frozen: the protocol hands them a context at each step and they keep nothing
    (check and sweep); a job whose attribute is set fails at once."""
    from dataclasses import FrozenInstanceError

    from checker.commands.check_job import CheckJob
    from checker.commands.sweep_job import SweepJob
    from checker.config import OutputOptions

    for job in (CheckJob(config=None, output=OutputOptions()), SweepJob(config=None, output=OutputOptions())):
        before = dict(vars(job))
        with pytest.raises(FrozenInstanceError):
            job.summary = "x"  # type: ignore[misc,attr-defined]
        assert vars(job) == before


def test_a_check_job_run_over_the_seam_keeps_nothing_and_publishes_its_report(tmp_path):
    """The real CheckJob on ranks that were refused (no config): the protocol's verdict is the report's,
    and the job's attributes are the same after the run as before."""
    from checker.commands.check_job import CheckJob
    from checker.config import OutputOptions

    report = tmp_path / "report.json"
    world = SeamWorld(2)
    js = [CheckJob(config=None, output=OutputOptions(report=str(report))) for _ in range(2)]
    before = [dict(vars(j)) for j in js]
    said = "checker check: error: --pp-size 3 does not divide world size 2"
    processes = world.run(js, refused={0: said, 1: said})
    assert codes(processes) == [2, 2]
    assert [dict(vars(j)) for j in js] == before
    doc = json.loads(report.read_text())
    assert doc["status"] == "error" and doc["exit_code"] == 2
    assert set(doc["timings"]) >= {"init_s", "total_s"}


def test_process_exit_ends_every_thread_of_a_rank():
    """What os._exit does, in the fake: the first exit code is the process's, and another of its threads
    stops at its next wait."""
    world = SeamWorld(1)
    process = world.processes[0]
    with pytest.raises(ProcessExit):
        process.exit(3)
    with pytest.raises(ProcessExit):
        process.exit(0)
    assert process.code == 3


# -- every fault phase ends (issue 37): one report naming the lost rank, every survivor non-zero ------------


def _fault(world: SeamWorld, js: list[FakeJob], rank: int, piece: str, action: str) -> None:
    """Make ``rank`` fail in ``piece`` of its job (``header``: after the group formed, before the exchange;
    ``payload``: while it derives; ``decide``: after the exchange; ``publish``: holding the lease):
    ``kill`` (kill -9), ``stop`` (SIGSTOP) or ``hang`` (its main thread stuck, alive)."""
    job = js[rank]
    process = world.processes[rank]
    original = getattr(job, piece) if piece != "publish" else None

    def fail() -> None:
        if action == "kill":
            process.kill()
            raise ProcessExit(-9)
        if action == "stop":
            process.freeze()
        world.hang()

    if piece == "publish":
        job.before_publish = fail
        return

    def faulty(*args, **kwargs):
        if piece == "decide":  # after the exchange: every rank decided
            original(*args, **kwargs)
        fail()

    setattr(job, piece, faulty)


def _one_report(js: list[FakeJob]) -> tuple[int, tuple]:
    """The one publisher and what it published (a test fails on two)."""
    ((writer, outcome),) = [(j.rank, o) for j in js for o in j.published]
    return writer, outcome


@pytest.mark.parametrize("lost", [1, 2])
def test_a_rank_frozen_after_the_exchange_is_named_and_the_others_leave_non_zero(lost):
    """Issue 37: rank 1 (or 2) freezes right after the exchange. Before, rank 0 published "consistent",
    the others left with 0, and torchrun waited for the frozen worker for good (its agent stops workers
    only when one fails). Now rank 0 waits for every rank to arrive, sees the frozen one's beat stand
    still and publishes an infrastructure failure naming it (what was decided in the detail); every
    survivor leaves with 3, so the agent stops the frozen worker."""
    world = SeamWorld(3, timeout_s=30, agent=True)
    js = jobs(3)
    _fault(world, js, lost, "decide", "stop")
    t0 = world.clock.monotonic()
    processes = world.run(js)
    survivors = [p for p in processes if p.rank != lost]
    assert [p.code for p in survivors] == [3, 3]
    writer, (kind, detail, missing) = _one_report(js)
    assert writer == 0 and kind == "lost" and missing == [lost]
    assert detail.startswith(
        f"rank {lost} (node-{lost // 2}) stopped beating for {LOST_AFTER_S:g} s after the exchange"
    )
    assert detail.endswith("every rank had decided: fake decided")
    assert processes[lost].killed  # by the agent, once the others failed
    assert world.clock.monotonic() - t0 < LOST_AFTER_S + 2


def test_a_rank_hung_after_the_exchange_is_named_at_the_timeout():
    """Rank 2 hangs (alive, beating) after the exchange: rank 0 names it once --timeout-s has passed since
    it arrived, and the agent's SIGTERM then ends rank 2 with the published code."""
    world = SeamWorld(3, timeout_s=20, agent=True)
    js = jobs(3)
    _fault(world, js, 2, "decide", "hang")
    t0 = world.clock.monotonic()
    processes = world.run(js)
    assert codes(processes) == [3, 3, 3]
    writer, (kind, detail, missing) = _one_report(js)
    assert writer == 0 and missing == [2]
    assert detail.startswith("rank 2 (node-1) did not reach the verdict within --timeout-s 20 s")
    assert 20 <= world.clock.monotonic() - t0 < 20 + 2
    assert processes[2].sigterm


def test_rank_0_that_never_joined_is_named_by_one_survivor_at_the_timeout():
    """Issue 37: rank 0 frozen before it joined. Before, ranks 1-2 waited 60 s more for a publisher that
    never joined (its beat of 0 never counted as stopped) and wrote no report. Now, once their own wait
    for it ran out (--timeout-s), one survivor takes the lease and names rank 0 and its host (known from
    rank 1, on its node)."""
    world = SeamWorld(3, timeout_s=30)
    js = jobs(3)
    t0 = world.clock.monotonic()
    processes = world.run(js, ranks=[1, 2])
    assert codes(processes) == [3, 3]
    writer, (kind, detail, missing) = _one_report(js)
    assert writer == 1 and kind == "lost" and missing == [0]  # the lowest survivor
    assert "rank 0 (node-0)" in detail and "not joined: rank 0" in detail
    assert world.clock.monotonic() - t0 < 30 + 5


@pytest.mark.parametrize("piece", ["header", "payload", "decide"])
def test_rank_0_hung_alive_is_named_by_one_survivor(piece):
    """Issue 37: rank 0 hangs, alive and beating, before the exchange (``header``), while it derives
    (``payload``: a stuck NFS read of the checkpoint headers) or after it (``decide``). Before, the report
    was rank 0's own watchdog's, naming nobody. Now the survivors hold it behind once --timeout-s has
    passed and one of them publishes naming it; rank 0 then leaves with that code, without publishing:
    by the agent's SIGTERM or by its own watcher reading the announcement, whichever comes first (two
    threads racing in wall time; a loaded machine ran either first)."""
    world = SeamWorld(3, timeout_s=20, agent=True)
    js = jobs(3)
    _fault(world, js, 0, piece, "hang")
    t0 = world.clock.monotonic()
    processes = world.run(js)
    assert codes(processes) == [3, 3, 3]
    writer, (kind, detail, missing) = _one_report(js)
    assert writer == 1 and kind == "lost" and missing == [0]  # the lowest survivor
    assert "rank 0 (node-0)" in detail
    assert world.clock.monotonic() - t0 < 20 + 5
    assert processes[0].code == 3 and not js[0].published


@pytest.mark.slow  # 4 s of real waiting (the publish bound): in the slow step, not the quick loop
def test_rank_0_hung_holding_the_lease_is_taken_over_after_the_publish_bound():
    """Rank 0 claimed the publisher lease and hangs before writing anything: after PUBLISH_WAIT_S a
    survivor takes the lease over and publishes naming it; rank 0, told to stop, leaves with that code."""
    world = SeamWorld(3, timeout_s=20, agent=True)
    js = jobs(3)
    _fault(world, js, 0, "publish", "hang")
    t0 = world.clock.monotonic()
    processes = world.run(js)
    assert codes(processes) == [3, 3, 3]
    writer, (kind, detail, missing) = _one_report(js)
    assert writer == 1 and missing == [0]  # the lowest survivor
    assert f"held the publisher lease for {exchange.PUBLISH_WAIT_S:g} s without publishing" in detail
    assert world.value("publisher") == f"0,{writer}"
    assert exchange.PUBLISH_WAIT_S <= world.clock.monotonic() - t0 < exchange.PUBLISH_WAIT_S + 5


@pytest.mark.parametrize("lost", [0, 1])
def test_a_rank_killed_before_it_joined_is_named_when_the_agent_stops_the_rest(lost):
    """Issue 37: a rank dies as it starts (before it joined the store) and torchrun's agent SIGTERMs the
    others at once. Each rank told to stop still joins and says it is leaving; the publisher (rank 0,
    or rank 1 in its place) waits for every rank to have joined, up to STOP_JOIN_S after the signal, and
    names the one that never did, with its host (from a rank of its node). Before, the report named
    nobody (rank 2 lost) or none was written (rank 0 lost)."""
    world = SeamWorld(3, timeout_s=30, agent=True)
    js = jobs(3)
    t0 = world.clock.monotonic()
    processes = world.run(js, killed_at_start=[lost])
    assert codes(processes) == [3, 3]
    writer, (kind, detail, missing) = _one_report(js)
    assert writer == (1 if lost == 0 else 0) and missing == [lost]
    assert f"gone: rank {lost} (node-0)" in detail and "when the job was stopped" in detail
    assert world.clock.monotonic() - t0 < STOP_JOIN_S + STALE_AFTER_S + 1


def test_sigterm_ends_every_finishing_rank_at_once_and_the_publisher_names_the_lost_rank():
    """Issue 37: rank 2 is killed after the exchange; the agent SIGTERMs ranks 0 and 1 while they finish
    (rank 0 waiting for every rank to arrive, rank 1 for the verdict). Before, SIGTERM was ignored while
    finishing (the lock was the finisher's) and a waiting rank lived until the agent's SIGKILL. Now each
    leaves at once; rank 0 publishes the infrastructure failure naming rank 2 first."""
    world = SeamWorld(3, timeout_s=30, agent=True)
    js = jobs(3)
    _fault(world, js, 2, "decide", "kill")
    # "While they finish": rank 2 dies once ranks 0 and 1 have decided (each rank's thread runs at the
    # OS's pace; on a loaded machine rank 0 could otherwise be told to stop before its own decision).
    decided = {r: threading.Event() for r in (0, 1)}
    for r in (0, 1):
        own = js[r].decide

        def deciding(*args, _own=own, _done=decided[r], **kwargs):
            try:
                return _own(*args, **kwargs)
            finally:
                _done.set()

        js[r].decide = deciding
    dying = js[2].decide

    def after_the_others(*args, **kwargs):
        assert all(e.wait(10.0) for e in decided.values()), "ranks 0 and 1 never decided"
        return dying(*args, **kwargs)

    js[2].decide = after_the_others
    t0 = world.clock.monotonic()
    processes = world.run(js)
    assert codes(processes[:2]) == [3, 3] and processes[2].killed
    writer, (kind, detail, missing) = _one_report(js)
    assert writer == 0 and missing == [2]
    assert detail.startswith("terminated by SIGTERM") and detail.endswith(
        "every rank had decided: fake decided"
    )
    assert world.clock.monotonic() - t0 < STALE_AFTER_S + 1  # not LOST_AFTER_S, not the timeout
