"""Fault injection for the liveness tests: ``CHECKER_INJECT_FAULT=RANK:PHASE:ACTION[,...]``.

Phases: ``start`` (before joining), ``derive`` (during the local derivation), ``exchange`` (after the
group is formed, before the exchange), ``verdict`` (after the exchange, before the verdict is
published), ``publish`` (holding the publisher lease, before anything is written: rank 0, or a rank
that took the lease over). Actions: ``exit`` (die with code 17, as a crash might: not one of the
checker's exit codes), ``kill`` (SIGKILL itself, as ``kill -9`` would), ``exit0`` (leave early with code
0), ``stop`` (SIGSTOP itself: a frozen worker), ``hang`` (sleep forever: alive but never joins),
``raise`` (an unexpected exception). Unset in production; tests and the fault recipes set it on one rank.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "CHECKER_INJECT_FAULT"
MARK_ENV = "CHECKER_FAULT_MARK"
CRASH_EXIT = 17
"""``exit``'s code: a crash's, deliberately none of :data:`checker.status.EXIT_CODES`."""


def maybe_inject(rank: int, phase: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or parts[0] != str(rank) or parts[1] != phase:
            continue
        action = parts[2]
        mark = os.environ.get(MARK_ENV)
        if mark:  # test hook: tells a test the fault is about to happen (e.g. before SIGTERM-ing the agent)
            with open(mark, "w") as f:
                f.write(f"{rank}:{phase}:{action}\n")
        if action == "exit":
            os._exit(CRASH_EXIT)
        if action == "exit0":
            os._exit(0)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if action == "hang":
            while True:
                time.sleep(3600)
        if action == "raise":
            raise RuntimeError(f"injected fault on rank {rank} at {phase}")
