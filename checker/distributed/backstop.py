"""The GIL-free backstop: ends a rank with the table's code for "no verdict" when nothing in Python can.

A C call that blocks while holding the GIL (a driver call, a store call in a C++ extension) stalls every
Python thread, the run's own watchdog included. Two pieces that need no GIL stand behind it:

1. CPython's faulthandler dumps every thread's stack from its own C thread (where the rank was stuck);
2. a POSIX timer whose expiry calls ``_exit(EXIT_BACKSTOP)`` on a thread glibc starts for it
   (``SIGEV_THREAD``: C all the way), a moment later.

faulthandler alone could end the process too, but its ``exit=True`` always exits 1, the exit code of a
``divergent`` verdict; so it only dumps, and the timer exits with
:data:`checker.status.EXIT_BACKSTOP` (3, infrastructure failure: no verdict was reached). Where the timer
cannot be made (not Linux, no ``timer_create`` in the C library, a 32-bit ``sigevent``), faulthandler
exits instead, with 1 (:attr:`Backstop.exit_code` says which; docs/preflight.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import faulthandler
import sys
from typing import Any

from checker.status import EXIT_BACKSTOP

DUMP_LEAD_S = 0.5
"""The stacks are dumped this long before the timer ends the process."""
_CLOCK_MONOTONIC = 1
_SIGEV_THREAD = 2


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _SigevThread(ctypes.Structure):
    _fields_ = [("function", ctypes.c_void_p), ("attributes", ctypes.c_void_p)]


class _SigevUnion(ctypes.Union):
    _fields_ = [("pad", ctypes.c_int * 12), ("thread", _SigevThread)]


class _Sigevent(ctypes.Structure):
    """Linux's ``struct sigevent`` on a 64-bit ABI (glibc and musl lay it out alike: 64 bytes)."""

    _fields_ = [
        ("value", ctypes.c_void_p),  # union sigval: handed to the function, here the exit code
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("un", _SigevUnion),
    ]


def _libc_timer() -> tuple[Any, Any, Any, int] | None:
    """``timer_create``, ``timer_settime``, ``timer_delete`` and the address of ``_exit``, or None."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    if ctypes.sizeof(_Sigevent) != 64:
        return None
    for name in (None, ctypes.util.find_library("rt")):  # glibc 2.34+ has them in libc itself
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            create, settime, delete = lib.timer_create, lib.timer_settime, lib.timer_delete
            exit_now = ctypes.cast(ctypes.CDLL(None)._exit, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
        if exit_now:
            return create, settime, delete, exit_now
    return None


def _stderr() -> Any:
    """Where the stacks go: stderr, or file descriptor 2 when stderr is not a file (captured)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return 2
    return sys.stderr


class Backstop:
    """One rank's backstop: :meth:`arm` (again to move it), :meth:`disarm` once past the last unbounded
    call."""

    def __init__(self) -> None:
        self._timer: ctypes.c_void_p | None = None
        self._calls = _libc_timer()
        if self._calls is not None:
            create, _, _, exit_now = self._calls
            event = _Sigevent()
            event.notify = _SIGEV_THREAD
            event.value = EXIT_BACKSTOP  # _exit's argument
            event.un.thread.function = exit_now
            timer = ctypes.c_void_p()
            if create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) == 0:
                self._timer = timer

    @property
    def exit_code(self) -> int:
        """What the backstop exits with: the table's code, or faulthandler's fixed 1 without the timer."""
        return EXIT_BACKSTOP if self._timer is not None else 1

    def arm(self, seconds: float) -> Backstop:
        """End the process ``seconds`` from now (stacks dumped first) unless re-armed or disarmed."""
        if self._timer is None:
            faulthandler.dump_traceback_later(seconds, exit=True, file=_stderr())
            return self
        faulthandler.dump_traceback_later(max(0.001, seconds - DUMP_LEAD_S), exit=False, file=_stderr())
        self._set(seconds)
        return self

    def disarm(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        if self._timer is not None:
            self._set(0.0)  # a zero it_value disarms a POSIX timer

    def close(self) -> None:
        """Disarm and free the timer (a rank that returns to an embedding caller)."""
        self.disarm()
        if self._timer is not None and self._calls is not None:
            self._calls[2](self._timer)
            self._timer = None

    def _set(self, seconds: float) -> None:
        assert self._timer is not None and self._calls is not None
        whole = int(seconds)
        spec = _Itimerspec()
        spec.it_value.tv_sec = whole
        spec.it_value.tv_nsec = int((seconds - whole) * 1e9)
        self._calls[1](self._timer, 0, ctypes.byref(spec), None)
