"""The fault matrix on real torchrun jobs (issue 37): every fault phase ends, with one report naming the lost
rank and its host.

For 3 ranks at ``--timeout-s 5``, a fault at each phase (``start``, ``derive``, ``exchange``,
``verdict``, ``publish``; checker/distributed/faults.py) on rank 0 and on another rank, by each action
(``kill``, ``stop``, ``hang``, ``exit``). Each case holds what a CI job relies on:

* torchrun ends within ``--timeout-s`` + :data:`MARGIN_S` of the fault, plus torchrun's own 30 s grace
  before it SIGKILLs a frozen (``stop``) worker, plus :data:`checker.distributed.exchange.PUBLISH_WAIT_S`
  for a publisher hung while it holds the lease (the bound a publisher is given);
* exactly one report, ``infrastructure_failure`` (exit 3), whose ``missing_ranks`` is the lost rank and
  whose detail names it with its host; one verdict printed;
* every surviving rank ends on its own with 3 (none is SIGKILLed), and every rank alive when torchrun's
  agent sent its SIGTERM (a frozen one aside) has ended within :data:`SIGTERM_LEAVE_S` of it.

Folded, because the survivors meet the same code path (each folded case runs a case kept here):

* ``exit`` at ``derive``, ``exchange`` and ``publish`` -> ``kill``: the survivors see exactly what a kill
  gives them (a worker ended non-zero, so the agent SIGTERMs them); the two differ only in torchrun's
  summary (17 against -9). ``exit`` stays at ``start`` and ``verdict``.
* ``kill`` and ``stop`` at ``derive`` -> ``exchange``: the others wait in a collective either way (the
  payload gather or the header gather): the agent's SIGTERM, or the watcher seeing the beat stop.
* ``hang`` at ``exchange`` -> ``derive``: the hung rank is behind the collective the others time out in
  either way.
* ``publish`` on a rank other than 0: only the publisher lease's holder reaches it, which another rank
  is only as the stand-in of a lost rank 0: ``0:verdict:stop,1:publish:stop`` (both named, by rank 2).

A frozen worker is only ever ended by torchrun's SIGKILL 30 s after its SIGTERM; each ``stop`` case is
watched until the agent has sent that SIGTERM and the others have ended, then the test ends the frozen
worker itself and counts the grace (tests/torchrun_faults.py); ``1:verdict:stop`` (the issue's case)
waits it out for real. Each case's times are recorded (``fault_case``) and listed at the end of the run
(conftest.py; ``CHECKER_FAULT_TABLE=PATH`` writes them as the markdown table of docs/preflight.md).

Marked ``faults``: ``.ci/run``'s faults step (``pytest -m faults -n 2``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from torchrun_faults import AGENT_GRACE_S, HOST, run_job

from checker.distributed.exchange import PUBLISH_WAIT_S
from checker.distributed.liveness import describe

pytestmark = pytest.mark.faults

WORLD = 3
TIMEOUT_S = 5.0
MARGIN_S = 15.0
"""Past ``--timeout-s``, from the fault to torchrun's end: the survivors' start-up before their own wait
begins (torch's import, 1-3 s), the liveness look that names the gone (1 s), the wait of up to 5 s
(STOP_JOIN_S) for ranks still joining when the agent stops the job, the report, and the load of a 2-core
machine shared with other test runs."""
SIGTERM_LEAVE_S = 10.0
"""From the agent's SIGTERM to every rank it reached having ended: at most the wait for ranks still
joining (5 s) and the look that names the gone (1 s) on the publisher, with room for the load; the
others leave within about a second."""


@dataclass(frozen=True)
class Case:
    fault: str
    """CHECKER_INJECT_FAULT."""
    lost: tuple[int, ...]
    real_grace: bool = False
    """Wait out torchrun's 30 s grace for the frozen worker for real."""

    @property
    def action(self) -> str:
        return self.fault.split(",")[-1].split(":")[2]

    @property
    def stops(self) -> bool:
        return any(part.endswith(":stop") for part in self.fault.split(","))

    @property
    def bound_s(self) -> float:
        bound = TIMEOUT_S + MARGIN_S
        if self.stops:
            bound += AGENT_GRACE_S
        if self.fault == "0:publish:hang":
            bound += PUBLISH_WAIT_S
        return bound


def _case(lost: int, phase: str, action: str) -> Case:
    return Case(f"{lost}:{phase}:{action}", (lost,))


CASES = [
    *(_case(r, "start", a) for a in ("kill", "exit", "stop", "hang") for r in (0, 2)),
    *(_case(r, "derive", "hang") for r in (0, 2)),
    *(_case(r, "exchange", a) for a in ("kill", "stop") for r in (0, 2)),
    *(_case(r, "verdict", a) for a in ("kill", "exit", "stop", "hang") for r in (0, 2)),
    Case("1:verdict:stop", (1,), real_grace=True),
    *(_case(0, "publish", a) for a in ("kill", "stop", "hang")),
    Case("0:verdict:stop,1:publish:stop", (0, 1)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.fault)
def test_every_fault_phase_ends_with_one_report_naming_the_lost_rank(tmp_path, record_property, case):
    job = run_job(tmp_path, case.fault, world=WORLD, timeout_s=TIMEOUT_S, skip_grace=not case.real_grace)
    record_property(
        "fault_case",
        {
            "fault": case.fault,
            "report_s": job.report_s,
            "end_s": job.end_s,
            "bound_s": case.bound_s,
            "wall_s": job.wall_s,
            "grace_counted": job.skipped_grace,
            "sigterm_leave_s": job.sigterm_leave_s,
        },
    )
    why = job.stderr[-3000:]
    assert job.report is not None, f"no report: {why}"
    assert job.report["status"] == "infrastructure_failure", job.report
    assert job.report["exit_code"] == 3
    assert job.report["missing_ranks"] == list(case.lost), (job.report["infrastructure_detail"], why)
    # Every lost rank named with its host: together when they were seen lost together, else each in
    # turn (0:verdict:stop,1:publish:stop: rank 1 stood in for rank 0 and was lost in its turn; which
    # wording depends on whether the survivor saw rank 1's beat stop before or after it took the lease).
    detail = job.report["infrastructure_detail"]
    together = describe(case.lost, {r: HOST for r in case.lost})
    each = [describe((r,), {r: HOST}) for r in case.lost]
    assert together in detail or all(named in detail for named in each), detail
    assert job.writes == 1, job.stdout[-3000:]
    survivors = [r for r in range(WORLD) if r not in case.lost]
    assert [job.exit_codes.get(r) for r in survivors] == [3] * len(survivors), (job.exit_codes, why)
    assert job.returncode != 0
    if case.real_grace:
        assert not job.skipped_grace and job.grace_from is not None
        # The model the other stop cases count with: torchrun ended its grace after the SIGTERM.
        assert job.ended - job.grace_from == pytest.approx(AGENT_GRACE_S, abs=3.0)
    elif case.stops:
        assert job.skipped_grace, "the agent never began its grace for the frozen worker"
    assert job.sigterm_leave_s is None or job.sigterm_leave_s < SIGTERM_LEAVE_S, why
    assert job.end_s < case.bound_s, why


def test_a_worker_that_exits_0_early_is_named_at_the_timeout(tmp_path, record_property):
    """A worker leaves with code 0 before joining: torchrun waits for the rest (a 0 is no failure to it),
    which end at --timeout-s and name it."""
    job = run_job(tmp_path, "2:start:exit0", world=WORLD, timeout_s=TIMEOUT_S)
    assert job.report is not None and job.report["missing_ranks"] == [2], job.stderr[-2000:]
    assert job.writes == 1
    assert job.end_s < TIMEOUT_S + MARGIN_S


def test_sigterm_to_the_agent_ends_every_rank_with_one_report_naming_nobody(tmp_path):
    """The CI job is cancelled while rank 2 hangs in the exchange: the agent forwards SIGTERM to every
    worker; rank 0 writes one infrastructure_failure report naming nobody (every rank was alive and told
    to stop), and every rank leaves on its own within SIGTERM_LEAVE_S."""
    job = run_job(tmp_path, "2:exchange:hang", world=WORLD, timeout_s=60, sigterm_agent_after_mark_s=0.5)
    assert job.report is not None, job.stderr[-2000:]
    assert job.report["status"] == "infrastructure_failure"
    assert "SIGTERM" in job.report["infrastructure_detail"]
    assert job.report["missing_ranks"] == []
    assert job.writes == 1
    assert job.sigterm_leave_s is not None and job.sigterm_leave_s < SIGTERM_LEAVE_S
