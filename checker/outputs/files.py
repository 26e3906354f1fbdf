"""Writing the files a user asked for (--report, --junit, --plot, GITHUB_STEP_SUMMARY), torch-free.

* Paths are checked up front (:func:`check_output_path`): a directory, or a path under a file, is the
  user's error (exit 2) before any work is done.
* Writes are atomic (a temp file beside the target, then a rename), leave no temp file behind on any
  path, get the mode the umask gives (as ``open`` would, not mkstemp's 0600), and go *through* a
  symlink to its target rather than replacing the link.
* Every write is bounded (:data:`WRITE_S`): a path on a hung filesystem, or a step summary that is a
  FIFO nobody reads, costs at most that long and is reported, never a hang.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from checker.core.errors import FlagError

WRITE_S = 5.0


def check_output_path(flag: str, path: str | None) -> None:
    """Refuse, with one line naming the flag, a path that can never be written as a file."""
    if not path:
        return
    target = os.path.realpath(path)
    if os.path.isdir(target):
        raise FlagError(
            f"{flag} {path} is a directory; name a file, e.g. {os.path.join(path, 'report.json')}"
        )
    parent = os.path.dirname(target) or "."
    probe = parent
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise FlagError(f"{flag} {path}: {probe} is a file, not a directory")


def _umask() -> int:
    # Read, never set where it can be helped: os.umask has no getter, and setting it for a moment changes
    # it for every thread (a file another thread creates then gets the wrong mode). Linux (4.7+) says it
    # in /proc; elsewhere the set-and-restore is the only way.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomic(path: str, data: bytes) -> None:
    target = Path(os.path.realpath(path))  # through a symlink: the link stays, its target changes
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _bounded_io(fn, what: str, seconds: float) -> str | None:
    """Run a write in a daemon thread; a problem line, or None when it succeeded in time."""
    box: list[str | None] = [f"{what}: not written within {seconds:g} s (a hung filesystem or a FIFO?)"]

    def target() -> None:
        try:
            fn()
            box[0] = None
        except OSError as exc:
            box[0] = f"{what}: {exc.strerror or exc}"
        except Exception as exc:  # never let a write take the verdict down
            box[0] = f"{what}: {type(exc).__name__}: {exc}"

    t = threading.Thread(target=target, daemon=True, name="checker-write")
    t.start()
    t.join(seconds)
    return box[0]


def write_file(path: str, text: str | bytes, *, what: str, seconds: float = WRITE_S) -> str | None:
    """Write ``path`` atomically and bounded; returns a problem line or None."""
    data = text.encode() if isinstance(text, str) else text
    return _bounded_io(lambda: _write_atomic(path, data), f"cannot write {what} {path}", seconds)


def append_file(path: str, text: str, *, what: str, seconds: float = WRITE_S) -> str | None:
    return _bounded_io(lambda: _append(path, text.encode()), f"cannot append to {what} {path}", seconds)
