"""Writing the files a user asked for (--report, --junit, --plot, GITHUB_STEP_SUMMARY, torchrun's
TORCHELASTIC_ERROR_FILE), torch-free.

What is at the path decides how it is written (a symlink is followed: its target decides, and the link
stays a link):

* nothing yet, or a regular file: atomically (a temp file beside the target, then a rename), leaving no
  temp file behind on any path, with the mode the umask gives (as ``open`` would, not mkstemp's 0600).
* a character device (``/dev/null``, a tty) or a FIFO: written in place, never replaced. Renaming a temp
  file over ``/dev/null`` as root would turn it into a regular file for every process on the node.
* anything else (a directory, a socket, a block device): the user's error, exit 2 naming it, found up
  front by :func:`check_output_path`; a write that meets one later only reports it.

Every write is bounded (:data:`WRITE_S`): a path on a hung filesystem, or a FIFO nobody reads, costs at
most that long and is reported, never a hang.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from checker.bounded import call_bounded
from checker.core.errors import FlagError, printable

WRITE_S = 5.0
_RETRY_S = 0.02
"""How often a FIFO with no reader yet is tried again, until the write's bound."""


class NotAFile(OSError):
    """The path exists and is neither a regular file, a character device nor a FIFO."""


def _kind(mode: int) -> str | None:
    """None for what can be written (regular file, character device, FIFO); else what it is."""
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def _stat(target: str) -> os.stat_result | None:
    """``target``'s stat, None when nothing is there yet (also under a file: check_output_path says so)."""
    try:
        return os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        return None


def check_output_path(flag: str, path: str | None) -> None:
    """Refuse, with one line naming the flag, a path that can never be written as a file."""
    if not path:
        return
    shown = _short(path)
    try:
        target = os.path.realpath(path)
        st = _stat(target)
    except ValueError:  # an embedded NUL byte
        raise FlagError(f"{flag} {shown}: a path cannot hold a NUL byte") from None
    except OSError as exc:  # a name too long, a symlink loop, a parent it may not search
        raise FlagError(f"{flag} {shown}: {exc.strerror or exc}") from None
    if st is not None:
        what = _kind(st.st_mode)
        if what == "a directory":
            example = _short(os.path.join(path, "report.json"))
            raise FlagError(f"{flag} {shown} is a directory; name a file, e.g. {example}")
        if what is not None:
            via = "" if target == os.path.abspath(path) else f" (through the link, {_short(target)})"
            raise FlagError(
                f"{flag} {shown} is {what}{via}; name a regular file (a character device such as "
                "/dev/null, or a FIFO, is written in place)"
            )
        return
    probe = os.path.dirname(target) or "."
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise FlagError(f"{flag} {shown}: {_short(probe)} is a file, not a directory")


def _short(path: str, limit: int = 200) -> str:
    """A path as a message line shows it: control characters escaped, a very long one cut."""
    text = path if len(path) <= limit else f"{path[: limit // 2]}...({len(path)} characters)"
    return printable(text)


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


def _write_atomic(target: Path, data: bytes) -> None:
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


def _write_in_place(target: str, data: bytes, *, append: bool, deadline: float) -> None:
    """A character device or FIFO: opened and written without blocking past ``deadline``.

    A FIFO with no reader refuses a non-blocking open (ENXIO): tried again until the deadline, so a
    reader that starts a moment later still gets the data; a full pipe is waited on with select.
    """
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | (os.O_APPEND if append else 0)
    while True:
        try:
            fd = os.open(target, flags)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if time.monotonic() >= deadline:
                raise OSError(errno.ENXIO, "a FIFO that no process opened for reading") from None
            time.sleep(_RETRY_S)
    try:
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [fd], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(errno.ETIMEDOUT, "its reader stopped reading")
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
    finally:
        os.close(fd)


def _write(path: str, data: bytes, *, append: bool, deadline: float) -> None:
    target = os.path.realpath(path)  # through a symlink: the link stays, its target is written
    st = _stat(target)
    if st is None or stat.S_ISREG(st.st_mode):
        if append:
            with open(target, "ab") as f:
                f.write(data)
        else:
            _write_atomic(Path(target), data)
        return
    what = _kind(st.st_mode)
    if what is not None:
        raise NotAFile(errno.EINVAL, f"{target} is {what}, not a file")
    _write_in_place(target, data, append=append, deadline=deadline)


def _bounded_io(fn: Callable[[], None], what: str, seconds: float) -> str | None:
    """Run a write with the package's time bound; a problem line, or None when it succeeded in time.
    A write never takes the verdict down: any exception becomes the line."""
    result = call_bounded(fn, seconds, name="checker-write")
    if not result.done:
        return f"{what}: not written within {seconds:g} s (a hung filesystem or a FIFO?)"
    exc = result.error
    if exc is None:
        return None
    if isinstance(exc, OSError):
        return f"{what}: {exc.strerror or exc}"
    return f"{what}: {type(exc).__name__}: {exc}"


def _deadline(seconds: float) -> float:
    # A little before the thread's bound, so the write itself says why it gave up.
    return time.monotonic() + max(0.0, seconds - 5 * _RETRY_S)


def write_file(path: str, text: str | bytes, *, what: str, seconds: float = WRITE_S) -> str | None:
    """Write ``path`` (replacing a regular file atomically, a device or FIFO in place), bounded;
    returns a problem line or None."""
    data = text.encode() if isinstance(text, str) else text
    deadline = _deadline(seconds)
    return _bounded_io(
        lambda: _write(path, data, append=False, deadline=deadline), f"cannot write {what} {path}", seconds
    )


def append_file(path: str, text: str, *, what: str, seconds: float = WRITE_S) -> str | None:
    deadline = _deadline(seconds)
    return _bounded_io(
        lambda: _write(path, text.encode(), append=True, deadline=deadline),
        f"cannot append to {what} {path}",
        seconds,
    )
