"""One torchrun job with a fault injected, watched from outside as a CI job would see it (not a test module).

:func:`run_job` starts ``torchrun --standalone`` on a few ranks with ``CHECKER_INJECT_FAULT`` set
(checker/distributed/faults.py) and records what the fault matrix asserts: when the fault happened (the
injector's mark), when the report was written and what it says, how many verdicts were printed (one
publisher prints one on stdout), each worker's exit code as torchrun's summary gives it, when each
worker process ended, and when torchrun itself ended.

torchrun's agent, once a worker fails, sends SIGTERM to the others and SIGKILLs those still alive
``AGENT_GRACE_S`` later (``_close(death_sig, timeout=30)`` in torch/distributed/elastic/multiprocessing/
api.py, whatever ``--shutdown-timeout`` says on this path). A frozen (SIGSTOP) worker is only ever ended
by that SIGKILL, 30 s of fixed waiting that is torch's, not the checker's. With ``skip_grace`` the job is
watched until every other worker has ended and the agent has started that grace, and the test then ends
the frozen workers itself: the time torchrun would have ended is computed as the first worker's exit plus
the grace (:attr:`Job.end_s`), and one case of the matrix waits the grace out for real to hold that
model to torch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

AGENT_GRACE_S = 30.0
"""torchrun's agent: SIGTERM to the other workers, SIGKILL this long after (torch 2.13)."""
HOST = "fault-host"
"""The host every rank reports (CHECKER_HOSTNAME): the report must name it beside the lost rank."""
LIMIT_S = 150.0
"""The outer bound on one job: past it the test fails as unbounded."""


@dataclass
class Job:
    fault: str
    returncode: int
    launched: float
    """time.time() of the launch."""
    marked: float | None
    """When the injector wrote its mark (just before the fault)."""
    reported: float | None
    """The report's mtime."""
    ended: float
    """When torchrun ended (time.time()), as measured."""
    worker_ends: dict[int, float]
    """pid -> when that worker process ended."""
    grace_from: float | None
    """When the agent was seen sending its SIGTERM to a frozen worker: its grace began."""
    sigterm_seen: float | None
    """When the agent was first seen sending SIGTERM to its workers (its log line, read as written)."""
    sigterm_leave_s: float | None
    """How long after that the last worker it reached (a frozen one aside) ended; None without one."""
    skipped_grace: bool
    """The test ended the frozen workers itself once the agent's grace had begun (module docstring)."""
    report: dict | None
    stdout: str
    stderr: str
    exit_codes: dict[int, int] = field(default_factory=dict)
    """rank -> exit code, from torchrun's failure summary."""

    @property
    def writes(self) -> int:
        """Verdicts printed on stdout: only the rank that publishes prints there (text format)."""
        return len(re.findall(r"^checker: [A-Z_ ]+ - ", self.stdout, flags=re.M))

    @property
    def end_s(self) -> float:
        """Seconds from the fault (its mark) to torchrun's end; with the grace skipped, the end torchrun's
        agent would have reached: its SIGTERM to the frozen worker plus its grace."""
        since = self.marked if self.marked is not None else self.launched
        if self.skipped_grace and self.grace_from is not None:
            return self.grace_from + AGENT_GRACE_S - since
        return self.ended - since

    @property
    def report_s(self) -> float | None:
        """Seconds from the fault to the report."""
        if self.reported is None:
            return None
        return self.reported - (self.marked if self.marked is not None else self.launched)

    @property
    def wall_s(self) -> float:
        """The case's own wall time (launch to end, as run)."""
        return self.ended - self.launched


def _children(pid: int) -> dict[int, str]:
    """The direct children of ``pid`` and their state letter (``T``: stopped), from /proc."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 2 and fields[1] == str(pid):
            out[int(entry)] = fields[0]
    return out


def _exit_codes(stderr: str) -> dict[int, int]:
    """rank -> exitcode from torchrun's failure summary."""
    found = re.findall(r"rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)", stderr)
    return {int(rank): int(code) for rank, code in found}


def run_job(
    tmp_path: Path,
    fault: str,
    *,
    world: int = 3,
    timeout_s: float = 5,
    skip_grace: bool = False,
    sigterm_agent_after_mark_s: float | None = None,
    extra: tuple[str, ...] = (),
) -> Job:
    """One torchrun job of ``world`` ranks (the built-in kimi-k3 at pp ``world``) with ``fault``
    injected. ``sigterm_agent_after_mark_s``: SIGTERM torchrun itself that long after the fault's mark
    (a CI job cancelled)."""
    report = tmp_path / "report.json"
    mark = tmp_path / "fault.mark"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "CHECKER_FAULT_MARK": str(mark),
        "CHECKER_HOSTNAME": HOST,
    }
    env.pop("CHECKER_INJECT_FAULT", None)
    if fault:
        env["CHECKER_INJECT_FAULT"] = fault
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(world),
        "--max-restarts",
        "0",
        "-m",
        "checker",
        "--model",
        "kimi-k3",
        "--budget-gib",
        "8",
        "--pp-size",
        str(world),
        "--timeout-s",
        f"{timeout_s:g}",
        "--report",
        str(report),
        *extra,
    ]
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    launched = time.time()
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, start_new_session=True)
    seen: dict[int, str] = {}
    ends: dict[int, float] = {}
    skipped = signalled = False
    grace_from: float | None = None
    sigterm_seen: float | None = None
    alive_at_sigterm: set[int] = set()
    stopped: set[int] = set()
    try:
        while proc.poll() is None:
            now = time.time()
            if now - launched > LIMIT_S:
                pytest.fail(f"torchrun job not done within {LIMIT_S:g} s: unbounded. {fault}")
            # A worker that exited stays a zombie (Z) until the agent reaps it, which it does only after
            # its wait on the others: ended all the same.
            children = {pid: state for pid, state in _children(proc.pid).items() if state != "Z"}
            seen.update(children)
            stopped.update(pid for pid, state in children.items() if state == "T")
            for pid in seen:
                if pid not in children and pid not in ends:
                    ends[pid] = now
            told = err_path.read_text()
            if sigterm_seen is None and "closing signal SIGTERM" in told:
                sigterm_seen = now
                alive_at_sigterm = {pid for pid in children if pid not in stopped}
            if sigterm_agent_after_mark_s is not None and not signalled and mark.exists():
                if now - mark.stat().st_mtime >= sigterm_agent_after_mark_s:
                    proc.send_signal(signal.SIGTERM)
                    signalled = True
            frozen = [pid for pid, state in children.items() if state == "T"]
            if frozen and (grace_from is None or (skip_grace and len(frozen) == len(children))):
                if all(f"Sending process {pid} closing signal SIGTERM" in told for pid in frozen):
                    grace_from = now if grace_from is None else grace_from
                    if skip_grace and len(frozen) == len(children):
                        # Every other worker has ended and the agent has begun its grace: what is left is
                        # torch's fixed wait before its SIGKILL of the frozen ones (module docstring).
                        for pid in frozen:
                            os.kill(pid, signal.SIGKILL)
                        skipped = True
            time.sleep(0.05)
        ended = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    time.sleep(0.3)
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        pass
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"processes of the job were left behind ({fault})")
    stderr = err_path.read_text()
    return Job(
        fault=fault,
        returncode=proc.returncode,
        launched=launched,
        marked=mark.stat().st_mtime if mark.exists() else None,
        reported=report.stat().st_mtime if report.exists() else None,
        ended=ended,
        worker_ends=ends,
        grace_from=grace_from,
        sigterm_seen=sigterm_seen,
        sigterm_leave_s=(
            max(ends.get(pid, ended) - sigterm_seen for pid in alive_at_sigterm - stopped)
            if sigterm_seen is not None and alive_at_sigterm - stopped
            else None
        ),
        skipped_grace=skipped,
        report=json.loads(report.read_text()) if report.exists() else None,
        stdout=out_path.read_text(),
        stderr=stderr,
        exit_codes=_exit_codes(stderr),
    )
