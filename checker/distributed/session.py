"""One rank's whole run over a process group, shared by ``check`` and ``sweep``.

The lifecycle, in order, and what bounds each step:

1. :meth:`Session.start` arms a Python watchdog (``--timeout-s`` + :data:`WATCHDOG_EXTRA_S`), a
   GIL-free faulthandler backstop behind it, and a SIGTERM watcher (torchrun's agent sends SIGTERM to
   every other worker when one dies, then SIGKILL after its grace period).
2. :meth:`Session.connect` forms the store and the process group (``--timeout-s``), and starts this
   rank's heartbeat (:mod:`checker.distributed.liveness`).
3. :meth:`Session.exchange_headers` all-gathers the fixed header; ranks that speak another wire
   schema stop here with an error instead of a mismatched gather. :meth:`Session.all_gather` carries
   the rows (or a sweep's payload), each gather bounded by ``--timeout-s``.
4. :meth:`Session.finish`: rank 0 publishes (prints, writes the report) and announces it; the others
   wait for that announcement (bounded) and print their own verdict only when rank 0 is gone. A
   failing verdict goes into torchrun's error file, so its "Root Cause" names it.

Whatever goes wrong, the rank leaves with a verdict: a failed collective, the watchdog and SIGTERM all
end in :meth:`Session.abort`, which names the ranks whose heartbeat stopped.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from checker.config import GroupOptions
from checker.distributed.launch_env import RankEnv
from checker.distributed.liveness import STORE_CALL_S, bounded, gone_ranks
from checker.distributed.wire import Header
from checker.outputs.files import write_file
from checker.status import EXIT_CODES, INFRASTRUCTURE_FAILURE

GRACE_S = 3.0
"""How long the other ranks wait for rank 0's "report written" after a verdict."""
WATCHDOG_EXTRA_S = 10.0
"""The watchdog fires this long after --timeout-s; the faulthandler backstop twice as long after."""
SIGTERM_BUDGET_S = 10.0
"""What rank 0 may spend writing its report after SIGTERM: well inside torchrun's 30 s grace."""


@dataclass(frozen=True)
class Abort:
    """Why a run ended without a verdict from the exchange: the detail, and the ranks that are gone."""

    detail: str
    missing_ranks: list[int]


class SchemaMismatch(Exception):
    """Ranks run checker versions whose rows cannot be compared."""


def schema_mismatch_message(headers: Sequence[Header]) -> str:
    from checker.outputs.tables import rank_ranges

    by: dict[tuple[int, int], list[int]] = {}
    for r, h in enumerate(headers):
        by.setdefault((h.schema[1], h.schema[2]), []).append(r)
    parts = [f"{rank_ranges(rs)} speak wire schema {k[0]} ({k[1]} ints)" for k, rs in by.items()]
    return (
        "ranks run different checker versions: "
        + "; ".join(parts)
        + "; install the same checker on every node"
    )


class Session:
    """This rank's process group, liveness, watchdog and exit path. See the module docstring."""

    def __init__(self, env: RankEnv, options: GroupOptions) -> None:
        self.env = env
        self.options = options
        self.group = None
        self.t0 = time.monotonic()
        self._finishing = threading.Event()
        self._abort_lock = threading.Lock()
        self._on_abort: Callable[[Abort], None] | None = None
        self._timer: threading.Timer | None = None
        self._steps = 0
        """Collectives this rank has entered (the liveness store's ``step/<rank>``)."""

    @property
    def is_rank0(self) -> bool:
        return self.env.rank == 0

    @property
    def backend(self) -> str:
        return self.group.backend if self.group is not None else self.options.backend

    @property
    def device(self):
        return self.group.device if self.group is not None else None

    # -- 1. start ------------------------------------------------------------------------------------
    def start(self, on_abort: Callable[[Abort], None]) -> Session:
        """Arm the watchdog, the backstop and the SIGTERM watcher; ``on_abort`` publishes a verdict
        (rank 0 writes its report) before the rank exits with code 3."""
        self._on_abort = on_abort
        timeout = self.options.timeout_s
        self._timer = threading.Timer(timeout + WATCHDOG_EXTRA_S, self._watchdog_fired)
        self._timer.daemon = True
        self._timer.start()
        # A C++ call that blocks holding the GIL stalls every Python thread: faulthandler's own
        # thread dumps the stacks and exits a little later, whatever holds the GIL.
        faulthandler.dump_traceback_later(timeout + 2 * WATCHDOG_EXTRA_S, exit=True)
        self._watch_sigterm()
        if self.env.max_restarts > 0 and self.is_rank0:
            print(
                f"checker: warning: torchrun --max-restarts {self.env.max_restarts} only repeats a "
                "deterministic disagreement; use --max-restarts 0",
                file=sys.stderr,
            )
        return self

    def _watchdog_fired(self) -> None:
        if not self._finishing.is_set():
            t = self.options.timeout_s
            self.abort(f"no verdict within --timeout-s {t:g} s + {WATCHDOG_EXTRA_S:g} s (watchdog)")

    def _watch_sigterm(self) -> None:
        """SIGTERM may arrive while the main thread blocks inside a collective, where a Python signal
        handler would not run until it returns. The C-level handler writes to a wakeup pipe at once;
        a thread reading that pipe publishes the verdict."""
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be set up from the main thread (an embedding caller)
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.signal(signal.SIGTERM, lambda *_: None)  # the watcher thread does the work
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)

        def watch() -> None:
            while True:
                data = os.read(r, 16)
                if signal.SIGTERM in data:
                    self.abort(
                        "terminated by SIGTERM (torchrun's agent stops every worker when one "
                        "fails, or the job was cancelled)",
                        sigterm=True,
                    )
                    return

        threading.Thread(target=watch, daemon=True, name="checker-sigterm").start()

    # -- 2. connect ----------------------------------------------------------------------------------
    def make_group(self) -> None:
        """The group object (no waiting yet): raises the user's errors (--backend, --init-method)."""
        from checker.distributed.group import Group

        o = self.options
        self.group = Group(self.env, backend=o.backend, timeout_s=o.timeout_s, init_method=o.init_method)

    def connect(self) -> None:
        assert self.group is not None
        self.group.connect()

    # -- 3. exchange ---------------------------------------------------------------------------------
    def _enter_step(self) -> None:
        self._steps += 1
        assert self.group is not None
        if self.group.heartbeat is not None:
            self.group.heartbeat.enter_step()

    def exchange_headers(self, header: Header) -> list[Header]:
        assert self.group is not None
        self._enter_step()
        headers = [Header.decode(h) for h in self.group.all_gather_int64(header.encode()).tolist()]
        if len({h.schema for h in headers}) > 1:
            raise SchemaMismatch(schema_mismatch_message(headers))
        return headers

    def all_gather(self, values):
        assert self.group is not None
        self._enter_step()
        return self.group.all_gather_int64(values)

    # -- 4. finish -----------------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def finish(
        self,
        exit_code: int,
        *,
        publish: Callable[[], None],
        fallback: Callable[[], None],
        one_line: str,
        clean: bool = True,
    ) -> int:
        """Rank 0 publishes before anyone exits non-zero (torchrun kills the rest on the first failure);
        the others print their own verdict only when rank 0's announcement never comes."""
        self._finishing.set()  # the watchdog stands down; the GIL-free backstop stays armed
        # From here a SIGTERM or the watchdog must not overwrite the verdict being published: abort
        # finds the lock taken and leaves that to this thread (torchrun's SIGKILL bounds the rest).
        self._abort_lock.acquire(blocking=False)
        group = self.group
        if not clean and group is not None:
            group.shorten_store_timeout(STORE_CALL_S)  # a store on a lost node must not hold us
        if self.is_rank0:
            publish()
            if group is not None:
                group.announce("report_written")
        elif group is None or group.store is None or not group.wait_for("report_written", wait_s=GRACE_S + 2):
            fallback()  # rank 0 is gone or unreachable: this rank's verdict must not be lost
            # A store call may still hang in an abandoned thread: leave without finalising the store.
            clean = False
        if exit_code:
            record_for_torchrun(one_line)
        self._disarm()
        if clean and group is not None and group.store is not None:
            self._mark_exiting("done")  # leaving on purpose: a later failure must not blame this rank
            if group.heartbeat is not None:
                group.heartbeat.stop()
            group.close()
            return exit_code
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)  # a broken group's destructor can block; leave now

    def failed(self, detail: str, *, stopping: bool = False) -> Abort:
        """After a failed collective (or SIGTERM: ``stopping``): which ranks are gone (this one is not)."""
        group = self.group
        missing: list[int] = []
        if group is not None and group.store is not None:
            group.shorten_store_timeout(STORE_CALL_S)
            missing = gone_ranks(
                group.store, self.env.world_size, me=self.env.rank, my_step=self._steps, stopping=stopping
            )
        return Abort(detail=detail, missing_ranks=missing)

    def abort(self, detail: str, *, sigterm: bool = False) -> None:
        """The watchdog or SIGTERM: publish an infrastructure failure (rank 0), then leave with 3."""
        if not self._abort_lock.acquire(blocking=False):
            return  # one abort at a time; the first one exits the process
        self._finishing.set()
        if sigterm:
            self._mark_exiting("sigterm")  # first: rank 0 must not blame a rank told to stop
        code = EXIT_CODES[INFRASTRUCTURE_FAILURE]
        print(f"[rank {self.env.rank}] checker: {detail}", file=sys.stderr, flush=True)
        if self._on_abort is not None and (self.is_rank0 or not sigterm):
            budget = SIGTERM_BUDGET_S if sigterm else GRACE_S + 2 * STORE_CALL_S + 2
            bounded(lambda: self._on_abort(self.failed(detail, stopping=sigterm)), budget, None)
        record_for_torchrun(f"checker verdict {INFRASTRUCTURE_FAILURE}: {detail}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def _mark_exiting(self, why: str) -> None:
        group = self.group
        if group is not None and group.heartbeat is not None:
            group.heartbeat.mark_exiting(why)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        faulthandler.cancel_dump_traceback_later()


def record_for_torchrun(line: str) -> None:
    """Put the verdict in torchrun's error file so its "Root Cause" names it, not just "exitcode 1".

    The format of torch elastic's ``record`` (message + extraInfo), written directly so no traceback
    is involved: torchrun shows the message where it would show a traceback.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}
    # Written as every output is: atomic for a file, never replacing a device or FIFO; bounded.
    write_file(path, json.dumps(data), what="TORCHELASTIC_ERROR_FILE", seconds=STORE_CALL_S)
