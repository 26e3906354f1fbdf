"""Writing the files a user asked for (--report, --junit, --plot, GITHUB_STEP_SUMMARY, torchrun's
TORCHELASTIC_ERROR_FILE), torch-free: the one place outputs are checked and written.

Before anything is written, :func:`check_outputs` (or :func:`usable_outputs`, which drops what it would
refuse) resolves every output path and compares it with every input the run reads (the model config, the
model directory, the launch command's model path, ...) and with the other outputs: one that is an input,
lies inside the model directory, or is another output's file is one line, exit 2, naming both. A path the
kernel would refuse (a trailing slash, a component that is a file: ``a.txt/../r.json``) is refused as the
kernel would refuse it, not normalised into another file.

What is at the path then decides how it is written (a symlink is followed: its target decides, and the
link stays a link):

* one of this process's open streams (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``,
  ``/proc/self/fd/N``, or a link to one): written to that descriptor as it is, after what was written
  there before. Opening the path instead would open the file behind it anew and replace a CI log that
  stdout is redirected to; a pipe would get nothing.
* nothing yet, or a regular file: atomically (a temp file beside the target, then a rename), leaving no
  temp file behind on any path. A new file gets the mode the umask gives (as ``open`` would, not mkstemp's
  0600); an existing one keeps its mode and owner. A file with several hard links, or one whose owner
  this process cannot give the replacement, is written in place (truncated, then written): a rename would
  split the links or change the owner.
* a character device (``/dev/null``, a tty) or a FIFO: written in place, never replaced. Renaming a temp
  file over ``/dev/null`` as root would turn it into a regular file for every process on the node.
* anything else (a directory, a socket, a block device): the user's error, exit 2 naming it, found up
  front; a write that meets one later only reports it.

A write that fails (a full disk) removes the file the run meant to replace, or where it cannot, empties
it: a previous run's report left there would be read as this run's verdict (launchers/read-verdict.sh).
Every write is bounded (:data:`WRITE_S`): a path on a hung filesystem, or a FIFO nobody reads, costs at
most that long and is reported, never a hang.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import select
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from checker.bounded import call_bounded
from checker.core.errors import FlagError, printable

WRITE_S = 5.0
_RETRY_S = 0.02
"""How often a FIFO with no reader yet is tried again, until the write's bound."""
_CHUNK = 4096
"""PIPE_BUF: a blocking pipe select() calls writable takes this much without blocking."""
_MAX_DIR_ENTRIES = 100_000
"""How many entries of a model directory are compared with the outputs (a checkpoint has hundreds)."""
_FD_PATH = re.compile(r"/proc/(?:self|thread-self|(\d+)(?:/task/\d+)?)/fd/(\d+)")
_LINK_HOPS = 40  # the kernel's own limit (MAXSYMLINKS)


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
    """``target``'s stat, None when nothing is there yet (also under a file: the checks say so)."""
    try:
        return os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _short(path: str, limit: int = 200) -> str:
    """A path as a message line shows it: control characters escaped, a very long one cut."""
    text = path if len(path) <= limit else f"{path[: limit // 2]}...({len(path)} characters)"
    return printable(text)


# ------------------------------------------------------------------------------------------------------
# What a path names
# ------------------------------------------------------------------------------------------------------


def stream_fd(path: str) -> int | None:
    """The descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/fd/N``,
    ``/proc/self/fd/N``, ``/proc/<this pid>/fd/N``, or a symlink to one); None for any other path.

    Each directory is resolved as the kernel resolves it, then the last component's link is followed one
    hop at a time, so the descriptor is recognised before its own link (to a log file, to ``pipe:[N]``)
    is followed."""
    try:
        p = os.path.abspath(path)
        for _ in range(_LINK_HOPS):
            parent, name = os.path.split(p)
            p = os.path.join(os.path.realpath(parent), name)
            m = _FD_PATH.fullmatch(p)
            if m:
                return int(m.group(2)) if m.group(1) in (None, str(os.getpid())) else None
            try:
                link = os.readlink(p)
            except OSError:
                return None
            p = os.path.normpath(os.path.join(os.path.dirname(p), link))
    except (OSError, ValueError):
        return None
    return None


def _kernel_refusal(path: str) -> str | None:
    """Why the kernel would refuse to create ``path`` as a file (None: it would not). ``os.path.realpath``
    reads ``a.txt/../r.json`` as ``r.json``; the kernel refuses it (ENOTDIR), and ``out.json/`` names a
    directory, never the file ``out.json``."""
    if path.endswith("/") or os.path.basename(path) in (".", ".."):
        return "ends in a directory name (a trailing slash, . or ..); name a file"
    parent = os.path.dirname(path) or "."
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        st = None  # created by the write (as mkdir -p would), unless a file is in the way
    except NotADirectoryError:
        st = None
    if st is not None:
        return None if stat.S_ISDIR(st.st_mode) else f"{_short(parent)} is a file, not a directory"
    # Which component is a file: the first prefix that exists and is not a directory.
    parts = parent.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i]) or "/"
        try:
            s = os.stat(prefix)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return f"{_short('/'.join(parts[: i - 1]) or '/')} is a file, not a directory"
        if not stat.S_ISDIR(s.st_mode):
            return f"{_short(prefix)} is a file, not a directory"
    return None


@dataclass(frozen=True)
class _Place:
    """A path as the collision check compares it: the file there (device and inode) when there is one,
    and where it resolves to."""

    label: str
    path: str
    real: str
    ident: tuple[int, int] | None
    mode: int = 0
    fd: int | None = None

    @property
    def shared_freely(self) -> bool:
        """A character device (/dev/null, a tty): any number of writers and readers, nothing replaced."""
        return stat.S_ISCHR(self.mode)

    def same(self, other: _Place) -> bool:
        if self.ident is not None and self.ident == other.ident:
            return True
        return bool(self.real) and self.real == other.real


def _resolve_stream(flag: str, path: str, fd: int) -> _Place:
    shown = _short(path)
    try:
        st = os.fstat(fd)
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        raise FlagError(f"{flag} {shown}: descriptor {fd} is not open in this process") from None
    if stat.S_ISDIR(st.st_mode):
        raise FlagError(f"{flag} {shown}: descriptor {fd} is a directory; name a file")
    if access == os.O_RDONLY:
        raise FlagError(f"{flag} {shown}: descriptor {fd} is open for reading only; name a file")
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = ""
    return _Place(flag, path, real if real.startswith("/") else "", (st.st_dev, st.st_ino), st.st_mode, fd)


def resolve_output(flag: str, path: str) -> _Place:
    """One output path, checked: one line naming ``flag`` for a path that can never be written as a file
    (a directory, a socket, a block device, a closed or read-only descriptor, a path the kernel refuses,
    a name too long, a NUL byte, a loop of links)."""
    shown = _short(path)
    if "\0" in path:
        raise FlagError(f"{flag} {shown}: a path cannot hold a NUL byte")
    fd = stream_fd(path)
    if fd is not None:
        return _resolve_stream(flag, path, fd)
    try:
        why = _kernel_refusal(path)
        target = os.path.realpath(path)
        st = _stat(target)
    except OSError as exc:  # a name too long, a symlink loop, a parent it may not search
        raise FlagError(f"{flag} {shown}: {exc.strerror or exc}") from None
    if why is not None:
        raise FlagError(f"{flag} {shown}: {why}")
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
        return _Place(flag, path, target, (st.st_dev, st.st_ino), st.st_mode)
    probe = os.path.dirname(target) or "."
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise FlagError(f"{flag} {shown}: {_short(probe)} is a file, not a directory")
    return _Place(flag, path, target, None)


def check_output_path(flag: str, path: str | None) -> None:
    """Refuse, with one line naming the flag, a path that can never be written as a file."""
    if path:
        resolve_output(flag, path)


@dataclass(frozen=True)
class _Input:
    """A file or directory the run reads, as the collision check compares it."""

    place: _Place
    is_dir: bool
    entries: frozenset[tuple[int, int]]
    """A directory's files (device, inode), through links: an output must not be one of them either (a
    Hugging Face snapshot's config.json and weights are links into ``blobs/``)."""

    def holds(self, out: _Place) -> bool:
        if self.place.same(out):
            return True
        if not self.is_dir:
            return False
        inside = bool(out.real) and out.real.startswith(self.place.real.rstrip("/") + "/")
        return inside or (out.ident is not None and out.ident in self.entries)


def _input(label: str, path: str) -> _Input | None:
    """An input as it is now; None when nothing is there (nothing to protect)."""
    try:
        st = os.stat(path)
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    place = _Place(label, path, real, (st.st_dev, st.st_ino), st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return _Input(place, False, frozenset())
    entries: set[tuple[int, int]] = set()
    try:
        with os.scandir(path) as it:
            for i, entry in enumerate(it):
                if i >= _MAX_DIR_ENTRIES:
                    break
                try:
                    s = entry.stat()
                except OSError:
                    continue
                entries.add((s.st_dev, s.st_ino))
    except OSError:
        pass
    return _Input(place, True, frozenset(entries))


def _what(place: _Place) -> str:
    return f"{place.label} {_short(place.path)}"


def usable_outputs(
    outputs: Sequence[tuple[str, str | None]], inputs: Sequence[tuple[str, str | None]]
) -> tuple[dict[str, str | None], list[str]]:
    """Every output that may be written, by flag (None: not given, or dropped), and one line per output
    dropped: a path that can never be written, an input of the run (or a file in the model directory),
    or an earlier output's file. The check of :func:`check_outputs`, for a path (a usage error) that
    still writes what it can."""
    ins = [i for label, p in inputs if p for i in [_input(label, p)] if i is not None]
    kept: dict[str, str | None] = {}
    places: list[_Place] = []
    problems: list[str] = []
    for flag, path in outputs:
        kept[flag] = None
        if not path:
            continue
        try:
            out = resolve_output(flag, path)
        except FlagError as exc:
            problems.append(str(exc))
            continue
        problem = None if out.shared_freely else _collision(out, ins, places)
        if problem is not None:
            problems.append(problem)
            continue
        kept[flag] = path
        places.append(out)
    return kept, problems


def _collision(out: _Place, ins: Sequence[_Input], earlier: Sequence[_Place]) -> str | None:
    for i in ins:
        if not i.holds(out):
            continue
        if i.place.same(out):
            where, way_out = f"is {_what(i.place)}", "give the output another path"
        else:
            where, way_out = f"is inside {_what(i.place)}", "name a file outside it"
        return f"{_what(out)} {where}, which this run reads: an output never replaces an input; {way_out}"
    for other in earlier:
        if not other.shared_freely and other.same(out):
            return f"{_what(other)} and {_what(out)} are one file; give each output its own path"
    return None


def check_outputs(
    outputs: Sequence[tuple[str, str | None]], inputs: Sequence[tuple[str, str | None]]
) -> None:
    """Before anything is written: refuse (FlagError, one line naming both) an output that can never be
    written, that is an input of the run or lies in the model directory, or that another output names.
    ``outputs``: (flag or variable, path) in the order they are written; ``inputs``: (what it is, path)."""
    _, problems = usable_outputs(outputs, inputs)
    if problems:
        raise FlagError(problems[0])


# ------------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------------


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


class _KeepInPlace(Exception):
    """The replacement cannot be given the file's owner (or the directory takes no new file): write the
    file itself instead, which keeps its owner, mode and links."""


def _write_atomic(target: Path, data: bytes, old: os.stat_result | None) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except PermissionError:
        if old is None:
            raise
        raise _KeepInPlace from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if old is None:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            else:
                mine = os.fstat(f.fileno())
                if (mine.st_uid, mine.st_gid) != (old.st_uid, old.st_gid):
                    try:
                        os.fchown(f.fileno(), old.st_uid, old.st_gid)
                    except PermissionError:
                        raise _KeepInPlace from None
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))  # after fchown, which clears set-id bits
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_file_in_place(target: str, data: bytes) -> None:
    """A regular file rewritten through its own inode: its owner, mode and hard links stay."""
    fd = os.open(target, os.O_WRONLY | os.O_TRUNC | os.O_NOCTTY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        try:
            os.ftruncate(fd, 0)  # never half a report: nothing is read as a verdict then
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def _forget_previous(target: str, linked: bool) -> str:
    """After a failed write: remove the file the run meant to replace, so a previous run's report is not
    read as this run's; where that fails, empty it. A hard-linked one is emptied first (removing this
    name would leave the stale verdict under the others). Says what became of it."""

    def remove() -> str:
        os.unlink(target)
        return "the previous file there was removed"

    def empty() -> str:
        os.close(os.open(target, os.O_WRONLY | os.O_TRUNC | os.O_NOCTTY))
        return "the previous file there was emptied"

    for attempt in (empty, remove) if linked else (remove, empty):
        try:
            return attempt()
        except FileNotFoundError:
            return "no previous file is left there"
        except OSError:
            continue
    return "the previous file there could be neither removed nor emptied: do not read it as this run's"


def _write_regular(target: str, data: bytes, old: os.stat_result | None) -> None:
    linked = old is not None and old.st_nlink > 1
    try:
        if old is None:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
        if linked:
            _write_file_in_place(target, data)
            return
        try:
            _write_atomic(Path(target), data, old)
        except _KeepInPlace:
            _write_file_in_place(target, data)
    except OSError as exc:
        if old is None:
            raise
        fate = _forget_previous(target, linked)
        raise OSError(exc.errno, f"{exc.strerror or exc}; {fate}") from None


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


def _write_stream(fd: int, data: bytes, *, deadline: float) -> None:
    """This process's own descriptor, as it is: after whatever Python buffered for it, at its offset (or
    appended, as it was opened), never reopened or replaced. Its blocking mode is shared with the shell
    that opened it and is left alone: select, then at most PIPE_BUF bytes, keeps each write bounded."""
    for f in (sys.stdout, sys.stderr):
        try:
            if f is not None and f.fileno() == fd:
                f.flush()
        except (OSError, ValueError, AttributeError):
            pass
    view = memoryview(data)
    while view:
        _, ready, _ = select.select([], [fd], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError(errno.ETIMEDOUT, "its reader stopped reading")
        view = view[os.write(fd, view[:_CHUNK]) :]


def _write(path: str, data: bytes, *, append: bool, deadline: float) -> None:
    fd = stream_fd(path)
    if fd is not None:
        _write_stream(fd, data, deadline=deadline)
        return
    why = _kernel_refusal(path)
    if why is not None:
        raise NotAFile(errno.ENOTDIR, why)
    target = os.path.realpath(path)  # through a symlink: the link stays, its target is written
    st = _stat(target)
    if st is None or stat.S_ISREG(st.st_mode):
        if append:
            if st is None:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
            with open(target, "ab") as f:
                f.write(data)
        else:
            _write_regular(target, data, st)
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
    """Write ``path`` (a stream of this process as it is, a regular file atomically or in place, a
    device or FIFO in place), bounded; returns a problem line or None."""
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
