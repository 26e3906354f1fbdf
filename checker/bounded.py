"""Run one call with a time bound: the package's single "wait at most this long" helper (torch-free).

A store call on a cut link, a write to a hung filesystem or a FIFO nobody reads can block far past any
timeout of its own. :func:`call_bounded` runs the call in a daemon thread and waits at most ``seconds``:
the caller goes on in time, and an abandoned thread dies with the process. The calls it bounds release
the GIL while they block (socket and file I/O), so the caller's wait ends on time.

It never hides what happened: :class:`Bounded` says whether the call finished, its value, and the
exception it raised. Each caller decides what an exception means (a store that is gone is an expected
answer; a report that fails to render is a bug that must leave a traceback, see :meth:`Bounded.report`).
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TextIO, TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Bounded(Generic[T]):
    """What a bounded call came to."""

    done: bool
    """It returned or raised within the bound (False: still running, abandoned)."""
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.done and self.error is None

    def get(self, default: T) -> T:
        """The value, or ``default`` when the call timed out or raised (an expected failure)."""
        return cast(T, self.value) if self.ok else default

    def report(self, what: str, *, stream: TextIO | None = None) -> bool:
        """Say on stderr why ``what`` did not happen: the traceback of an exception, or the bound it ran
        past. True when it succeeded. For calls whose failure is a bug or a lost verdict."""
        if self.ok:
            return True
        out = sys.stderr if stream is None else stream
        if self.error is not None:
            print(f"checker: {what} failed:", file=out)
            traceback.print_exception(type(self.error), self.error, self.error.__traceback__, file=out)
        else:
            print(f"checker: {what} did not finish in time; given up", file=out)
        out.flush()
        return False


def call_bounded(fn: Callable[[], T], seconds: float, *, name: str = "checker-bounded") -> Bounded[T]:
    """Run ``fn`` in a daemon thread and wait at most ``seconds`` for it."""
    box: list[Bounded[T]] = [Bounded(done=False)]

    def target() -> None:
        try:
            box[0] = Bounded(done=True, value=fn())
        except BaseException as exc:  # handed to the caller, who decides; a thread cannot raise to it
            box[0] = Bounded(done=True, error=exc)

    t = threading.Thread(target=target, daemon=True, name=name)
    t.start()
    t.join(seconds)
    return box[0]
