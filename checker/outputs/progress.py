"""A progress line on stderr for long sweeps: redrawn in place on a terminal, two plain lines in a log."""

from __future__ import annotations

import sys
import time
from typing import TextIO

LONG_SWEEP_BUDGETS = 10_000
"""From this many budgets a sweep reports progress on stderr even when stderr is not a terminal."""


class Progress:
    """A progress line on stderr: redrawn in place on a terminal, two plain lines in a log.

    Cheap by construction: one update per stage derived, and a terminal redraw at most every 0.1 s.
    """

    def __init__(self, total: int, what: str, *, enabled: bool, stream: TextIO | None = None) -> None:
        stream = sys.stderr if stream is None else stream  # looked up now: tests and tools swap it
        self.total, self.what, self.enabled, self.stream = total, what, enabled, stream
        self.tty = enabled and isatty(stream)
        self.done = 0
        self.t0 = self.last = time.monotonic()
        if enabled and not self.tty:
            print(f"sweep: {what} ...", file=stream, flush=True)

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.tty and (now - self.last >= 0.1 or self.done == self.total):
            self.last = now
            width = 30
            filled = width * self.done // self.total
            self.stream.write(
                f"\rsweep: {self.what} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            )
            self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[K")  # leave the terminal as it was
        else:
            print(f"sweep: derived in {time.monotonic() - self.t0:.2f} s", file=self.stream)
        self.stream.flush()


def isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream is no terminal
        return False


def progress_wanted(requested: bool, num_budgets: int) -> bool:
    """Progress on stderr: asked for (no --no-progress/--quiet), and a terminal or a long sweep."""
    return requested and (isatty(sys.stderr) or num_budgets >= LONG_SWEEP_BUDGETS)
