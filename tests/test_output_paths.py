"""Output paths never destroy what is there: every kind of thing a path can name, as root.

``--report``, ``--junit``, ``--plot``, GITHUB_STEP_SUMMARY and torchrun's TORCHELASTIC_ERROR_FILE are
written by checker/outputs/files.py: a new path or a regular file atomically (temp file + rename), a
character device or a FIFO in place (bounded), anything else refused naming it. The device nodes are made
with mknod in tmp_path (the numbers of /dev/null for the character device), so a regression replaces a
node of the test's own and not the machine's /dev/null. A symlink is followed and its target obeys the
same rules.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checker.core.errors import FlagError
from checker.outputs.files import append_file, check_output_path, write_file

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="mknod of device nodes needs root")
KIMI = ["--model", "kimi-k3", "--budget-gib", "8", "--allow-single-rank", "--pp-size", "1"]


def _chardev(path: Path) -> Path:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    return path


def _blockdev(path: Path) -> Path:
    os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(7, 0))  # a loop device's numbers; never opened
    return path


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    """A bound unix socket (a short directory when tmp_path is too long for sun_path's 108 bytes)."""
    where = tmp_path if len(str(tmp_path)) < 90 else Path(tempfile.mkdtemp(prefix="ck"))
    path = where / "sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    yield path
    s.close()
    path.unlink()
    if where != tmp_path:
        where.rmdir()


def _mode(path: Path) -> int:
    return stat.S_IFMT(os.stat(path).st_mode)


class _FifoReader:
    """A reader that opens the FIFO a moment after the write starts (as `cat fifo` started alongside)."""

    def __init__(self, path: Path, delay_s: float = 0.2) -> None:
        self.data = b""
        self._thread = threading.Thread(target=self._read, args=(path, delay_s), daemon=True)
        self._thread.start()

    def _read(self, path: Path, delay_s: float) -> None:
        time.sleep(delay_s)
        with open(path, "rb") as f:
            self.data = f.read()

    def join(self) -> bytes:
        self._thread.join(10)
        return self.data


# ---- the writer, per kind ------------------------------------------------------------------------------


def test_a_new_path_and_a_regular_file_are_replaced_atomically(tmp_path):
    """A reader of the old report never sees a half-written one: the file is a new inode after the write."""
    path = tmp_path / "sub" / "r.json"
    assert write_file(str(path), "one", what="--report") is None
    before = path.stat().st_ino
    assert write_file(str(path), "two", what="--report") is None
    assert path.read_text() == "two" and path.stat().st_ino != before
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


@needs_root
@pytest.mark.parametrize("via_link", [False, True])
def test_a_character_device_is_written_in_place_never_replaced(tmp_path, via_link):
    """`--report /dev/null` as root must leave /dev/null a device: a rename over it would make it a
    regular file for every process on the node."""
    dev = _chardev(tmp_path / "null")
    path = tmp_path / "link" if via_link else dev
    if via_link:
        path.symlink_to(dev)
    assert write_file(str(path), "{}" * 2000, what="--report") is None
    assert append_file(str(path), "x", what="GITHUB_STEP_SUMMARY") is None
    assert _mode(dev) == stat.S_IFCHR and os.stat(dev).st_rdev == os.makedev(1, 3)
    assert path.is_symlink() == via_link
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"null", path.name})  # no temp file


@pytest.mark.parametrize("via_link", [False, True])
def test_a_fifo_is_written_in_place_to_its_reader(tmp_path, via_link):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    path = tmp_path / "link" if via_link else fifo
    if via_link:
        path.symlink_to(fifo)
    data = json.dumps({"status": "consistent", "pad": "x" * 200_000})  # more than a pipe holds
    reader = _FifoReader(fifo)
    assert write_file(str(path), data, what="--report", seconds=5) is None
    assert reader.join().decode() == data
    assert _mode(fifo) == stat.S_IFIFO and path.is_symlink() == via_link


def test_a_fifo_nobody_reads_is_bounded_and_left_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    problem = write_file(str(fifo), "{}", what="--report", seconds=0.5)
    assert time.monotonic() - t0 < 2
    assert problem is not None and problem.startswith(f"cannot write --report {fifo}") and "FIFO" in problem
    assert _mode(fifo) == stat.S_IFIFO and [p.name for p in tmp_path.iterdir()] == ["fifo"]


@needs_root
@pytest.mark.parametrize("kind", ["directory", "socket", "block device"])
@pytest.mark.parametrize("via_link", [False, True])
def test_a_directory_socket_or_block_device_is_refused_by_name(tmp_path, sock, kind, via_link):
    """Up front: one line naming the flag, the path and what it is; at write time (a path that changed
    kind after the check): a problem line, and the thing is left exactly as it was."""
    target = {
        "directory": lambda: (tmp_path / "d").mkdir() or tmp_path / "d",
        "socket": lambda: sock,
        "block device": lambda: _blockdev(tmp_path / "blk"),
    }[kind]()
    path = tmp_path / "link" if via_link else target
    if via_link:
        path.symlink_to(target)
    before = os.stat(target)
    with pytest.raises(FlagError, match=rf"^--junit {re.escape(str(path))}(:| is) .*{kind}"):
        check_output_path("--junit", str(path))
    problem = write_file(str(path), "<xml/>", what="--junit")
    assert problem is not None and kind in problem
    after = os.stat(target)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
    assert not any(p.name.endswith(".tmp") for p in target.parent.iterdir())


def test_an_impossible_path_is_one_line_not_a_traceback(tmp_path):
    """A name longer than the filesystem allows, and a symlink loop."""
    with pytest.raises(FlagError, match=r"^--report .*\(5001 characters\): File name too long$"):
        check_output_path("--report", "/" + "a" * 5000)
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(FlagError, match=r"^--report .*/a: Too many levels of symbolic links$"):
        check_output_path("--report", str(tmp_path / "a"))


def test_a_failing_write_leaves_no_temp_file(tmp_path):
    """A write that fails half-way (here: past the process's file-size limit, EFBIG) reports the problem,
    keeps the old report, and removes its `.name.*.tmp`: a CI artefact glob must not collect it."""
    path = tmp_path / "r.json"
    path.write_text("old")
    code = (
        "import resource, signal, sys\n"
        "from checker.outputs.files import write_file\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        f"print(write_file({str(path)!r}, 'x' * 100_000, what='--report'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"cannot write --report {path}: File too large"), proc.stdout
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# ---- through the commands ------------------------------------------------------------------------------


@needs_root
def test_check_writes_every_output_in_place_on_devices_and_fifos(tmp_path):
    """The reported case: `check ... --report X` with X a character device exited 0 and left X a 3 KB
    regular file. Now the report goes to the device, the JUnit to a FIFO's reader, the step summary to a
    device behind a symlink, and every node is still what it was."""
    report, summary_dev = _chardev(tmp_path / "report"), _chardev(tmp_path / "summary-dev")
    (tmp_path / "summary").symlink_to(summary_dev)
    junit = tmp_path / "junit"
    os.mkfifo(junit)
    reader = _FifoReader(junit, delay_s=0.0)
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_ERROR_FILE"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-m", "checker", *KIMI, "-q", "--report", str(report), "--junit", str(junit)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr[-2000:]
    assert "<testsuite" in reader.join().decode()
    assert _mode(report) == _mode(summary_dev) == stat.S_IFCHR and _mode(junit) == stat.S_IFIFO
    assert (tmp_path / "summary").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit", "report", "summary", "summary-dev"]


@needs_root
@pytest.mark.parametrize("flag", ["--report", "--junit", "GITHUB_STEP_SUMMARY"])
def test_check_refuses_a_socket_or_block_device_before_any_work(cli, tmp_path, sock, flag, monkeypatch):
    blk = _blockdev(tmp_path / "blk")
    for path, kind in ((sock, "a socket"), (blk, "a block device")):
        if flag == "GITHUB_STEP_SUMMARY":
            res = cli(["check", *KIMI], env={"GITHUB_STEP_SUMMARY": str(path)})
        else:
            res = cli(["check", *KIMI, flag, str(path)])
        (line,) = res.err.splitlines()
        assert res.rc == 2 and f"{flag} {path} is {kind}" in line, res
        assert _mode(path) == (stat.S_IFSOCK if path == sock else stat.S_IFBLK)


@pytest.mark.slow
@needs_root
def test_sweep_report_and_plot_on_a_device_stay_devices(cli, tmp_path):
    pytest.importorskip("matplotlib")
    report, plot = _chardev(tmp_path / "report"), _chardev(tmp_path / "plot")
    res = cli(
        ["sweep", "--budgets", "4:8:4", "--no-progress", "-q", "--report", str(report), "--plot", str(plot)]
    )
    assert res.rc in (0, 1) and "cannot write" not in res.err, res
    assert _mode(report) == _mode(plot) == stat.S_IFCHR


@needs_root
def test_a_usage_error_report_goes_to_a_device_in_place(cli, tmp_path):
    """`_error_report` (a usage error still leaves the report CI reads) follows the same rules; a socket
    is named on stderr, not replaced."""
    report = _chardev(tmp_path / "report")
    res = cli(["check", *KIMI, "--polcy", "x", "--report", str(report)])
    assert res.rc == 2 and "did you mean --policy" in res.err and _mode(report) == stat.S_IFCHR
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = _FifoReader(fifo)
    res = cli(["check", *KIMI, "--polcy", "x", "--report", str(fifo)])
    doc = json.loads(reader.join())
    assert res.rc == 2 and doc["status"] == "error" and "--polcy" in doc["errors"][0]


def test_a_usage_error_report_to_a_directory_is_said_not_made(cli, tmp_path):
    res = cli(["check", *KIMI, "--polcy", "x", "--report", str(tmp_path)])
    assert res.rc == 2 and list(tmp_path.iterdir()) == []
    assert f"no error report: --report {tmp_path} is a directory" in res.err


@needs_root
def test_torchruns_error_file_on_a_device_stays_a_device(tmp_path, monkeypatch):
    from checker.distributed.session import record_for_torchrun

    dev = _chardev(tmp_path / "error.json")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(dev))
    record_for_torchrun("checker verdict divergent: ...")
    assert _mode(dev) == stat.S_IFCHR
    regular = tmp_path / "regular.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(regular))
    record_for_torchrun("checker verdict divergent: x")
    assert json.loads(regular.read_text())["message"]["message"] == "checker verdict divergent: x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error.json", "regular.json"]
