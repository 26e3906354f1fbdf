"""SIGTERM, caught from the first moment of a rank's process and handed to its run (torch-free).

torchrun's agent stops every worker with SIGTERM as soon as one fails (and SIGKILLs them after its 30 s
grace). A rank told to stop before its run has started would, by SIGTERM's default action, end at once,
before it joined the rendezvous store: then nothing would tell it from the rank whose failure made the
agent stop the job, and the report would blame both. So ``python -m checker`` under torchrun catches
SIGTERM first thing (:func:`catch_early`), and the run (:class:`checker.distributed.session.Session`)
takes the signal over when it starts (:func:`watch`): it joins the store (bounded), says it is leaving,
and the rank that publishes names only the ranks that never came. A signal that no run takes over within
:data:`EARLY_S` (a command that runs no process group, a rank stuck before its run) ends the process as
the default action would have, only later.

The C-level handler writes the signal's number to a pipe at once, even while the main thread blocks
inside a collective or an import (where a Python handler would not run until it returns); a thread
reading that pipe acts on it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

EARLY_S = 5.0
"""How long a SIGTERM caught before any run started waits for one to take it over."""
EXIT_SIGTERM = 128 + signal.SIGTERM
"""What a process ended by SIGTERM's default action reports to a shell (143)."""


class SigtermWatch:
    """The process's SIGTERM handling while a rank may run: installed once (main thread), handed to a run,
    given back when the run is over."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._on_sigterm: Callable[[], None] | None = None
        self._received = False
        self._handed = False
        self._given_back = False
        self._previous: tuple[Any, int] | None = None
        self._write_fd = -1

    def install(self) -> bool:
        """Catch SIGTERM from now on (the main thread only: elsewhere signals cannot be set up)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        r, w = os.pipe()
        os.set_blocking(w, False)
        handler = signal.signal(signal.SIGTERM, lambda *_: None)  # the reader thread does the work
        wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._previous, self._write_fd = (handler, wakeup), w
        threading.Thread(target=self._read, args=(r,), daemon=True, name="checker-sigterm").start()
        return True

    def hand_to(self, on_sigterm: Callable[[], None]) -> None:
        """A run takes the signal over: ``on_sigterm`` runs on the reader thread, at once for a signal
        already received."""
        with self._cond:
            self._on_sigterm = on_sigterm
            self._cond.notify_all()

    def give_back(self) -> None:
        """The run is over and the process goes on: SIGTERM's handler and the wakeup fd as they were
        before :meth:`install` (main thread only), and the reader thread ends."""
        with self._cond:
            self._given_back = True
            self._cond.notify_all()
        if self._previous is None or threading.current_thread() is not threading.main_thread():
            return
        handler, wakeup = self._previous
        self._previous = None
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGTERM, handler)
        os.close(self._write_fd)  # the reader sees end-of-file and ends

    def _read(self, fd: int) -> None:
        while True:
            data = os.read(fd, 16)
            if not data:  # given back: the write end is closed
                os.close(fd)
                return
            if signal.SIGTERM in data:
                break
        with self._cond:
            self._received = True
            deadline = time.monotonic() + EARLY_S
            while self._on_sigterm is None and not self._given_back:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            on_sigterm = self._on_sigterm
        if on_sigterm is not None:
            on_sigterm()
            return
        if self._given_back:
            return
        # Nothing took it over: end as the default action would have (it cannot be restored from here).
        print("checker: terminated by SIGTERM before the run started", file=sys.stderr, flush=True)
        os._exit(EXIT_SIGTERM)


_WATCH: SigtermWatch | None = None
"""The process's one watch, once installed."""


def catch_early(environ: Mapping[str, str] | None = None) -> None:
    """The entry point, first thing: under torchrun (``TORCHELASTIC_RUN_ID``), catch SIGTERM until the run
    takes it over."""
    global _WATCH
    env = os.environ if environ is None else environ
    if _WATCH is not None or not env.get("TORCHELASTIC_RUN_ID"):
        return
    watch = SigtermWatch()
    if watch.install():
        _WATCH = watch


def watch(on_sigterm: Callable[[], None]) -> Callable[[], None] | None:
    """The run takes SIGTERM over (catching it from now on if the entry point did not); what gives the
    process's SIGTERM handling back, or None where signals cannot be set up (not the main thread)."""
    global _WATCH
    if threading.current_thread() is not threading.main_thread():
        return None  # signals are the main thread's: a run on another thread (embedded) does without
    if _WATCH is None:
        fresh = SigtermWatch()
        if not fresh.install():
            return None
        _WATCH = fresh
    current = _WATCH
    current.hand_to(on_sigterm)

    def give_back() -> None:
        global _WATCH
        if _WATCH is current:
            _WATCH = None
        current.give_back()

    return give_back
