"""A lost rank named in seconds, not at the timeout (issue 20), on real torchrun jobs with ``--timeout-s
60``: a rank killed (``kill -9``) or frozen (``SIGSTOP``) while the others wait in the exchange is named
in the report within :data:`BOUND_S` of the fault, and when the lost rank is rank 0 the lowest surviving
rank writes that report in its place, once.

The time is the report's mtime minus the fault mark's (the injector writes the mark just before it
kills or stops its own process): fault to verdict, whatever torchrun does afterwards (a stopped worker
is only ended by torchrun's SIGKILL after its 30 s grace, which tests/torchrun_faults.py counts rather
than waits out).

Marked ``faults`` (each case is a 3-rank torchrun job, about 10 s).
"""

from __future__ import annotations

import pytest
from torchrun_faults import HOST, run_job

pytestmark = pytest.mark.faults

WORLD = 3
TIMEOUT_S = 60
BOUND_S = 5.0
"""What the issue asks: the lost rank named within 5 s of the loss."""
SLACK_S = 2.0
"""For the shared 2-core machine the tests run on (load averages of 10-15 measured while other
sessions run their suites): the watcher thread, the report write and the rank that must wake to do them
each wait for a core. Measured figures are in docs/performance.md."""


@pytest.mark.parametrize(
    ("lost", "action"), [(2, "kill"), (2, "stop"), (0, "kill"), (0, "stop")], ids=lambda v: str(v)
)
def test_a_lost_rank_is_named_within_seconds_whatever_the_timeout(tmp_path, lost, action):
    """Rank ``lost`` is killed or frozen after the group formed, while the others wait in the header
    gather with --timeout-s 60: the report (and JUnit file) names exactly it and its host within
    BOUND_S + SLACK_S of the fault, written once; for rank 0, by rank 1 in its place. (A frozen rank is
    then ended by torchrun's SIGKILL after its grace: tests/torchrun_faults.py counts that grace rather
    than wait it out.)"""
    junit = tmp_path / "junit.xml"
    job = run_job(
        tmp_path,
        f"{lost}:exchange:{action}",
        world=WORLD,
        timeout_s=TIMEOUT_S,
        skip_grace=True,
        extra=("--junit", str(junit)),
    )
    assert job.report is not None, f"no report: {job.stderr[-2000:]}"
    assert job.report["status"] == "infrastructure_failure", job.report
    assert job.report["missing_ranks"] == [lost], (job.report, job.stderr[-2000:])
    assert f"rank {lost} ({HOST})" in job.report["infrastructure_detail"]
    assert job.returncode != 0
    assert junit.exists()
    assert job.writes == 1, job.stdout[-3000:]
    assert job.report_s is not None
    print(f"fault {lost}:{action}: verdict {job.report_s:.2f} s after the fault")
    assert job.report_s < BOUND_S + SLACK_S, job.stderr[-2000:]
