"""The fault matrix on real torchrun jobs: every fault ends bounded, with the right status and the right
ranks named, and leaves no process behind.

torchrun is what a CI job runs, and it is what makes these faults hard: when one worker dies its agent
SIGTERMs every other worker at once (then SIGKILLs them after its 30 s grace), and a stopped worker is
only ever ended by that SIGKILL. Each case runs 4 ranks with ``--timeout-s 5``; faults are injected
with ``CHECKER_INJECT_FAULT=RANK:PHASE:ACTION`` (checker/distributed/faults.py).

Marked ``faults``: about three minutes in all, so the README's quick test command leaves them out and
``.ci/run`` runs them as their own step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

WORLD = 4
TIMEOUT_S = 5
ARGS = ["--model", "kimi-k3", "--budget-gib", "8", "--timeout-s", str(TIMEOUT_S)]
TORCHRUN_GRACE_S = 30  # torchrun's SIGTERM -> SIGKILL grace when it stops its workers
LIMIT_S = 120


@dataclass
class Job:
    returncode: int
    elapsed_s: float
    report: dict | None
    stdout: str
    stderr: str

    @property
    def writes(self) -> int:
        return self.stdout.count("checker: ")  # each published text verdict starts "checker: STATUS"


def _leftovers(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def run_job(tmp_path: Path, fault: str | None, *, sigterm_agent_after_mark: bool = False) -> Job:
    """One 4-rank torchrun job; ``writes`` counts the verdicts printed on stdout (only the rank that
    publishes prints there: one verdict is one writer)."""
    report = tmp_path / "report.json"
    mark = tmp_path / "fault.mark"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CHECKER_FAULT_MARK": str(mark)}
    env.pop("CHECKER_INJECT_FAULT", None)
    if fault:
        env["CHECKER_INJECT_FAULT"] = fault
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(WORLD),
        "--max-restarts",
        "0",
        "-m",
        "checker",
        *ARGS,
        "--report",
        str(report),
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        if sigterm_agent_after_mark:
            while not mark.exists() and time.monotonic() - t0 < 60:
                time.sleep(0.1)
            assert mark.exists(), "the fault never happened"
            time.sleep(0.5)  # every other rank is inside the exchange by now
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"torchrun job not done within {LIMIT_S} s: unbounded. stderr: {err[-2000:]}")
    elapsed = time.monotonic() - t0
    time.sleep(0.5)
    left = _leftovers(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, "processes of the job were left behind"
    rep = json.loads(report.read_text()) if report.exists() else None
    return Job(proc.returncode, elapsed, rep, out, err)


def _failure(job: Job, missing: list[int]) -> None:
    assert job.returncode != 0, job.stderr[-1500:]
    assert job.report is not None, f"no report: {job.stderr[-1500:]}"
    assert job.report["status"] == "infrastructure_failure", job.report
    assert job.report["exit_code"] == 3
    assert job.report["missing_ranks"] == missing, (job.report, job.stderr[-1500:])


@pytest.mark.parametrize("phase", ["exchange", "derive"])
def test_kill_9_before_or_during_the_exchange(tmp_path, phase):
    """A worker killed once the group is formed, before the header gather (exchange) or between the
    two gathers (derive): torchrun SIGTERMs the rest, rank 0's SIGTERM watcher writes the report
    naming exactly the killed rank (not the ones torchrun stopped).

    Not covered: a worker killed before it ever reached the rendezvous store, while others are still
    starting; nothing can tell it from a slow starter, and the report then names nobody."""
    job = run_job(tmp_path, f"2:{phase}:kill")
    _failure(job, [2])
    assert job.elapsed_s < TIMEOUT_S + 30


def test_kill_9_after_the_exchange(tmp_path):
    """Killed after every row arrived: the verdict stands (every rank's values were compared), or,
    if torchrun's SIGTERM reached rank 0 before it published, the failure names the killed rank."""
    job = run_job(tmp_path, "3:verdict:kill")
    assert job.report is not None, job.stderr[-1500:]
    if job.report["status"] != "consistent":
        _failure(job, [3])
    assert job.elapsed_s < TIMEOUT_S + 30


def test_worker_that_exits_0_early(tmp_path):
    """A worker that leaves with code 0 before joining: torchrun waits for the rest, which end at
    --timeout-s and name it."""
    job = run_job(tmp_path, "3:start:exit0")
    _failure(job, [3])
    assert job.elapsed_s < TIMEOUT_S + 30


def test_sigterm_to_the_agent(tmp_path):
    """The CI job is cancelled: the agent forwards SIGTERM to every worker; rank 0 still writes an
    infrastructure_failure report, and names nobody (every rank was alive and told to stop)."""
    job = run_job(tmp_path, "3:exchange:hang", sigterm_agent_after_mark=True)
    assert job.report is not None, job.stderr[-1500:]
    assert job.report["status"] == "infrastructure_failure"
    assert "SIGTERM" in job.report["infrastructure_detail"]
    assert job.report["missing_ranks"] == []


def test_sigstop_worker(tmp_path):
    """A frozen worker: the others' exchange times out, the report names it; torchrun then ends the
    stopped worker with SIGKILL after its grace period."""
    job = run_job(tmp_path, "2:exchange:stop")
    _failure(job, [2])
    assert job.elapsed_s < TIMEOUT_S + TORCHRUN_GRACE_S + 30


def test_rank_0_frozen(tmp_path):
    """Rank 0 frozen: rank 1, the lowest surviving rank, writes the report in its place naming rank 0
    (before issue 20 no report was written at all; each survivor only named rank 0 on stderr)."""
    job = run_job(tmp_path, "0:exchange:stop")
    _failure(job, [0])
    assert job.elapsed_s < TIMEOUT_S + TORCHRUN_GRACE_S + 30


@pytest.mark.parametrize("phase", ["verdict", "publish"])
@pytest.mark.parametrize("action", ["kill", "stop"])
def test_rank_0_lost_after_the_exchange_still_leaves_one_report_naming_it(tmp_path, phase, action):
    """Rank 0 killed or frozen after every rank decided (``verdict``), or while it holds the publisher
    lease (``publish``): its beat stops, one survivor takes the lease over and writes the report, an
    infrastructure failure naming rank 0 (and what the ranks had decided), and torchrun ends (a frozen
    rank 0 by torchrun's SIGKILL, once the survivors left non-zero). Before the lease: no report, ranks
    1-3 printed "consistent" and left with 0, and a frozen rank 0 kept torchrun running for good."""
    job = run_job(tmp_path, f"0:{phase}:{action}")
    _failure(job, [0])
    assert "rank 0" in job.report["infrastructure_detail"], job.report
    assert "every rank had decided: checker verdict consistent" in job.report["infrastructure_detail"]
    assert job.writes == 1, job.stdout[-3000:]
    bound = TIMEOUT_S + 30 + (TORCHRUN_GRACE_S if action == "stop" else 0)
    assert job.elapsed_s < bound, job.stderr[-1500:]
