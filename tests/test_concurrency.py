"""The concurrency defects found by reading (issue 18), one regression test each, in-process and fast.

Each test failed on the code before its fix (checked against a checkout of that code):
a heartbeat that stopped for good on one store error; a finish that published although an abort
already was; an abort report whose rendering bug left no trace; the GIL-free backstop disarmed before
the unbounded group teardown; the process umask changed while other threads create files; the
backstop exiting 1, the "divergent" code (issue 28); a run that left its watchdog and SIGTERM handling
armed in a process that goes on.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from fakes import Exited, FakeJob, FakeStore, World

from checker.distributed import liveness


def test_a_heartbeat_survives_a_transient_store_error(monkeypatch):
    """One failed store call (a dropped connection that comes back) must not end the beats: a rank
    whose heartbeat stopped is named as gone by the others although it is alive."""
    monkeypatch.setattr(liveness, "HEARTBEAT_S", 0.002)
    store = FakeStore()
    store.fail_calls = 1  # the very first beat fails
    beat = liveness.Heartbeat(store, 3).start()
    try:
        deadline = time.monotonic() + 2
        while store.data.get("hb/3", 0) < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        beat.stop()
    assert store.data.get("hb/3", 0) >= 5, "the heartbeat stopped after one transient store error"


@pytest.mark.slow  # 5 s of real waiting (the abort's own bounds): in the slow step, not the quick loop
def test_an_abort_during_finish_never_publishes_a_second_verdict():
    """SIGTERM (or the watchdog) takes the verdict first and is still writing rank 0's report when the
    main thread reaches its own finish: the main thread must not publish too (two reports, the later
    one overwriting the infrastructure failure) but leave it to the abort, which ends the process with 3.
    On the real Session (tests/seam.py): the process's exit is the abort's, its verdict the only one."""
    from seam import ProcessExit, SeamWorld, _local

    gate = threading.Event()
    world = SeamWorld(1)
    job = FakeJob(rank=0, publish_gate=gate)
    process = world.processes[0]
    exits: list[tuple[str, int]] = []
    process_exit = process.exit

    def exit_process(code: int):  # os._exit, noting which thread ended the process
        exits.append((threading.current_thread().name, code))
        process_exit(code)

    process.exit = exit_process  # type: ignore[method-assign]

    def sigterm(ctx) -> str:  # SIGTERM arrives while the run is under way: the abort thread starts
        session = process.session
        assert session is not None
        wait_for_exit = session.wait_for_exit

        def waits(seconds: float):  # the main thread reached its finish: only now may the abort finish
            gate.set()
            wait_for_exit(seconds)

        session.wait_for_exit = waits  # type: ignore[method-assign]
        clock = world.clock
        with clock.cond:
            clock.parties += 1  # a thread of the rank's process: time waits for it too

        def abort() -> None:
            _local.process = process
            try:
                session.on_abort("terminated by SIGTERM", True)
            except ProcessExit:
                pass
            finally:
                with clock.cond:
                    clock.parties -= 1
                    clock.notify()

        aborting.append(threading.Thread(target=abort, daemon=True, name="rank-0-sigterm"))
        aborting[0].start()
        assert job.publishing.wait(5), "the abort never started publishing"
        return "facts"

    aborting: list[threading.Thread] = []
    job.local = sigterm  # type: ignore[method-assign]
    (rank0,) = world.run([job])
    aborting[0].join(5)
    assert [o[0] for o in job.published] == ["lost"], job.published
    assert rank0.code == 3 and exits[0] == ("rank-0-sigterm", 3), exits
    assert world.value("report_written") == "3\nfake lost"


def test_a_rendering_bug_in_the_abort_report_leaves_a_traceback(capfd):
    """The watchdog fires on rank 0 and rendering its report raises: the bug must leave a traceback
    on stderr (it used to vanish inside the bounded call), and the rank still leaves with 3."""
    world = World(1)
    job = FakeJob(rank=0, publish_error=KeyError("a renderer's bug"))
    session = world.sessions[0]
    session.start(lambda detail, sigterm: None)
    from checker.distributed.exchange import _Run

    run = _Run(session, job, refused=None)
    with pytest.raises(Exited) as exited:
        run.abort("no verdict within --timeout-s 1 s (watchdog)", False)
    assert exited.value.code == 3
    err = capfd.readouterr().err
    assert "Traceback" in err and 'KeyError: "a renderer\'s bug"' in err, err


def test_the_backstop_stays_armed_until_the_group_is_destroyed():
    """destroy_process_group can block (a peer stuck in a collective): the GIL-free backstop must still
    be armed while it runs, and disarmed only after it returned."""
    from checker.distributed.launch_env import GroupOptions, RankEnv
    from checker.distributed.session import Session

    events: list[str] = []

    class Backstop:
        def close(self) -> None:
            events.append("disarm")

    class Group:
        store = FakeStore()
        heartbeat = None
        backend = "gloo"
        device = None

        def close(self) -> None:
            events.append("destroy")

        def shorten_store_timeout(self, seconds: float) -> None:
            pass

    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "1"})
    session = Session(env, GroupOptions(timeout_s=5))
    session.group = Group()  # type: ignore[assignment]
    session._backstop = Backstop()  # type: ignore[assignment]
    assert session.close(0, clean=True) == 0
    assert events == ["destroy", "disarm"]


def test_the_backstop_ends_a_rank_stuck_holding_the_gil_with_the_no_verdict_code():
    """A C call that holds the GIL stalls every Python thread, the watchdog's too: the backstop dumps
    the stacks and ends the process with 3 (infrastructure failure: no verdict), not faulthandler's
    fixed 1, the "divergent" code; a disarmed backstop ends nothing."""
    from checker.distributed.backstop import Backstop
    from checker.status import EXIT_BACKSTOP

    if Backstop().exit_code != EXIT_BACKSTOP:
        pytest.skip("no POSIX timer_create here: faulthandler's exit 1 stands (docs/preflight.md)")
    stuck = textwrap.dedent(
        """
        import ctypes, ctypes.util, sys, time
        from checker.distributed.backstop import Backstop
        # Everything looked up before arming: the dump (DUMP_LEAD_S before the exit) must find the
        # thread stuck in C, as a rank's is; faulthandler reading the frames of a thread still running
        # Python (here find_library's regexes) can crash the process instead (seen under load).
        libc_sleep = ctypes.PyDLL(ctypes.util.find_library("c")).sleep
        backstop = Backstop().arm(0.8)
        if sys.argv[1] == "disarm":
            backstop.disarm()
            time.sleep(1.0)
            print("alive")
        else:
            libc_sleep(20)
        """
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", stuck, "fire"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_BACKSTOP == 3, proc.stderr
    assert "Timeout" in proc.stderr and "most recent call first" in proc.stderr  # the stacks, dumped first
    assert time.monotonic() - t0 < 15
    proc = subprocess.run([sys.executable, "-c", stuck, "disarm"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, "alive"), proc.stderr


def test_a_run_gives_the_process_back_as_it_found_it():
    """A run whose process goes on (the CLI returns; an embedding caller continues) leaves no watchdog,
    backstop or SIGTERM handling of its own behind: SIGTERM's handler and the wakeup fd are the caller's
    again, and the watcher thread has ended."""
    import signal

    from checker.distributed.launch_env import GroupOptions, RankEnv
    from checker.distributed.session import Session

    handler = signal.getsignal(signal.SIGTERM)
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "1"})
    session = Session(env, GroupOptions(timeout_s=30))
    session.start(lambda detail, sigterm: None)
    assert signal.getsignal(signal.SIGTERM) is not handler
    watchers = [t for t in threading.enumerate() if t.name == "checker-sigterm"]
    assert session.close(0, clean=True) == 0
    assert signal.getsignal(signal.SIGTERM) is handler
    assert signal.set_wakeup_fd(wakeup) == wakeup  # the caller's wakeup fd again
    for t in watchers:
        t.join(2)
    assert watchers and not any(t.is_alive() for t in watchers)
    assert session._timer is not None and not session._timer.is_alive()


def test_a_write_leaves_the_process_umask_alone(tmp_path, monkeypatch):
    """Reading the umask by setting it changes it for every thread: a file another thread creates in
    that moment gets the wrong mode (group/world-readable under a 077 umask). A write must read the
    umask without ever setting another one, and still give the file the umask's mode."""
    from checker.files import write_file

    old = os.umask(0o077)
    seen: list[int] = []
    real_umask = os.umask

    def spy(mask: int) -> int:
        seen.append(mask)
        return real_umask(mask)

    monkeypatch.setattr(os, "umask", spy)
    try:
        assert write_file(str(tmp_path / "r.json"), "{}", what="--report") is None
    finally:
        monkeypatch.undo()
        os.umask(old)
    assert all(m == 0o077 for m in seen), f"the umask was set to {[oct(m) for m in seen]}"
    assert stat.S_IMODE(Path(tmp_path / "r.json").stat().st_mode) == 0o600
