"""Output paths never destroy what is there: every kind of thing a path can name, as root.

``--report``, ``--junit``, ``--plot``, GITHUB_STEP_SUMMARY and torchrun's TORCHELASTIC_ERROR_FILE are
written by checker/files.py: a new path or a regular file atomically (temp file + rename), a
character device or a FIFO in place (bounded), anything else refused naming it. The device nodes are made
with mknod in tmp_path (the numbers of /dev/null for the character device), so a regression replaces a
node of the test's own and not the machine's /dev/null. A symlink is followed and its target obeys the
same rules.
"""

from __future__ import annotations

import argparse
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
from checker.files import append_file, check_output_path, check_outputs, write_file
from checker.launch.inputs import run_inputs

REPO_ROOT = Path(__file__).resolve().parent.parent
READ_VERDICT = REPO_ROOT / "launchers" / "read-verdict.sh"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
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


def _fail_writing(path: Path) -> subprocess.CompletedProcess[str]:
    """write_file of 100 KB at ``path`` in a process whose file-size limit is 4 KB (EFBIG, as a full disk
    fails a write half-way)."""
    code = (
        "import resource, signal, sys\n"
        "from checker.files import write_file\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        f"print(write_file({str(path)!r}, 'x' * 100_000, what='--report'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def test_a_failing_write_removes_the_previous_report_and_leaves_no_temp_file(tmp_path):
    """A write that fails half-way (past the process's file-size limit, EFBIG, as a full disk) reports
    the problem, removes its `.name.*.tmp` (a CI artefact glob must not collect it) and removes the
    previous run's report: read-verdict.sh must not read that as this run's verdict."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"status": "consistent", "exit_code": 0}))
    proc = _fail_writing(path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"cannot write --report {path}: File too large"), proc.stdout
    assert "the previous file there was removed" in proc.stdout
    assert list(tmp_path.iterdir()) == []
    verdict = subprocess.run(
        ["bash", str(READ_VERDICT), str(path)], capture_output=True, text=True, timeout=60
    )
    assert (verdict.returncode, verdict.stdout.strip()) == (3, "infrastructure_failure")
    assert "could not write its report" in verdict.stderr


def test_a_failing_write_empties_a_hard_linked_report(tmp_path):
    """Removing one name of a hard-linked report would leave the stale verdict under the other: it is
    emptied in place instead, which read-verdict.sh reads as no verdict."""
    path, other = tmp_path / "r.json", tmp_path / "archive.json"
    path.write_text(json.dumps({"status": "consistent", "exit_code": 0}))
    os.link(path, other)
    proc = _fail_writing(path)
    assert "the previous file there was emptied" in proc.stdout, proc.stdout
    assert path.read_bytes() == other.read_bytes() == b"" and path.stat().st_ino == other.stat().st_ino
    verdict = subprocess.run(
        ["bash", str(READ_VERDICT), str(other)], capture_output=True, text=True, timeout=60
    )
    assert verdict.returncode == 3 and "empty" in verdict.stderr


@needs_root
def test_a_failing_write_empties_a_report_it_cannot_remove():
    """A user who may write the report but not its directory (no temp file, no unlink there): the write
    goes in place, and when it fails the previous report is emptied, never left whole."""
    shared = Path(tempfile.mkdtemp(prefix="ck-ro-"))
    try:
        path = shared / "r.json"
        path.write_text(json.dumps({"status": "consistent", "exit_code": 0}))
        path.chmod(0o666)
        shared.chmod(0o755)  # root's: user 1234 may not create or remove a name in it
        code = (
            "import os, resource, signal\n"
            "from checker.files import write_file\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "os.setegid(1234); os.seteuid(1234)\n"
            f"print(write_file({str(path)!r}, 'x' * 100_000, what='--report'))\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
        )
        assert "File too large; the previous file there was emptied" in proc.stdout, proc.stdout + proc.stderr
        assert path.read_bytes() == b"" and [p.name for p in shared.iterdir()] == ["r.json"]
    finally:
        for p in shared.iterdir():
            p.unlink()
        shared.rmdir()


# ---- replacing an existing file -------------------------------------------------------------------------


@needs_root
def test_replacing_a_report_keeps_its_mode_and_owner(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    os.chown(path, 1234, 2345)
    os.chmod(path, 0o600)
    assert write_file(str(path), "new", what="--report") is None
    st = path.stat()
    assert path.read_text() == "new"
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 2345, 0o600)


def test_a_hard_linked_report_is_written_in_place(tmp_path):
    """A rename would split the link: the other name would keep the old report."""
    path, other = tmp_path / "r.json", tmp_path / "copy.json"
    path.write_text("old report, longer than the new one")
    os.link(path, other)
    assert write_file(str(path), "new", what="--report") is None
    assert other.read_text() == path.read_text() == "new"
    assert path.stat().st_ino == other.stat().st_ino and path.stat().st_nlink == 2


@needs_root
def test_a_report_whose_owner_cannot_be_kept_is_written_in_place():
    """A user who may write someone else's report (world-writable, in a shared directory) but cannot give
    a replacement its owner: written through the file itself, so the owner stays. (A directory of its
    own under /tmp: the user must be able to reach it.)"""
    shared = Path(tempfile.mkdtemp(prefix="ck-shared-"))
    try:
        shared.chmod(0o777)
        path = shared / "r.json"
        path.write_text("old")
        os.chown(path, 4321, 4321)
        path.chmod(0o666)
        code = (
            "import os\n"
            "from checker.files import write_file\n"
            "os.setegid(1234); os.seteuid(1234)\n"
            f"print(write_file({str(path)!r}, 'new', what='--report'))\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        argv = [sys.executable, "-c", code]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert proc.stdout.strip() == "None", proc.stdout + proc.stderr
        st = path.stat()
        assert path.read_text() == "new" and (st.st_uid, stat.S_IMODE(st.st_mode)) == (4321, 0o666)
        assert [p.name for p in shared.iterdir()] == ["r.json"]
    finally:
        for p in shared.iterdir():
            p.unlink()
        shared.rmdir()


# ---- paths the kernel would refuse -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["trailing-slash", "dotdot-after-a-file", "under-a-file"])
def test_a_path_the_kernel_refuses_is_refused_not_normalised(tmp_path, shape):
    """`out.json/` names a directory, never the file out.json; `a.txt/../r.json` is ENOTDIR to the
    kernel, though os.path.realpath reads it as r.json."""
    (tmp_path / "out.json").write_text("keep")
    (tmp_path / "a.txt").write_text("keep")
    path = {
        "trailing-slash": f"{tmp_path}/out.json/",
        "dotdot-after-a-file": f"{tmp_path}/a.txt/../r.json",
        "under-a-file": f"{tmp_path}/a.txt/sub/r.json",
    }[shape]
    with pytest.raises(FlagError, match=r"^--report .*(a directory name|a.txt is a file, not a directory)"):
        check_output_path("--report", path)
    assert write_file(path, "{}", what="--report") is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "out.json"]
    assert (tmp_path / "out.json").read_text() == (tmp_path / "a.txt").read_text() == "keep"


# ---- this process's own streams --------------------------------------------------------------------------

_STREAM = """
import os, sys
from checker.files import write_file
print("before", flush=True)
print(write_file(sys.argv[1], "REPORT\\n", what="--report"), flush=True)
print("after", flush=True)
"""


@pytest.mark.parametrize("spelling", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "link"])
@pytest.mark.parametrize("stdout", ["file", "pipe"])
def test_a_stream_path_is_written_to_the_stream_as_it_is(tmp_path, spelling, stdout):
    """stdout redirected to a CI log: the report goes after what was printed, the log keeps its earlier
    lines and stays the same file (opening /dev/stdout anew and renaming over it replaced the log); on a
    pipe the reader gets it."""
    path = spelling
    if spelling == "link":
        (tmp_path / "out.json").symlink_to("/dev/stdout")
        path = str(tmp_path / "out.json")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, "-c", _STREAM, path]
    if stdout == "pipe":
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert proc.stdout == "before\nREPORT\nNone\nafter\n", proc.stdout + proc.stderr
        return
    log = tmp_path / "ci.log"
    with log.open("w") as f:
        f.write("earlier lines\n")
        f.flush()
        inode = os.fstat(f.fileno()).st_ino
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.PIPE, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text() == "earlier lines\nbefore\nREPORT\nNone\nafter\n"
    assert log.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"ci.log", Path(path).name} - {"stdout", "1"})


def test_a_descriptor_that_is_closed_or_read_only_is_refused(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    fd = os.open(config, os.O_RDONLY)
    try:
        with pytest.raises(
            FlagError, match=rf"^--report /dev/fd/{fd}: descriptor {fd} is open for reading only"
        ):
            check_output_path("--report", f"/dev/fd/{fd}")
    finally:
        os.close(fd)
    with pytest.raises(FlagError, match=rf"^--junit /proc/self/fd/{fd}: descriptor {fd} is not open"):
        check_output_path("--junit", f"/proc/self/fd/{fd}")


def test_a_stream_onto_an_input_is_a_collision(tmp_path):
    """`checker ... --report /dev/stdout >> m/config.json`: the descriptor's file is the model config."""
    config = tmp_path / "config.json"
    config.write_text("{}")
    fd = os.open(config, os.O_WRONLY | os.O_APPEND)
    try:
        with pytest.raises(FlagError, match=r"^--report /proc/self/fd/\d+ is --model-config .*config.json"):
            check_outputs([("--report", f"/proc/self/fd/{fd}")], [("--model-config", str(config))])
    finally:
        os.close(fd)
    assert config.read_text() == "{}"


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


# ---- an output never replaces an input or another output (through the commands) ----------------------


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model directory m/ holding a real config.json (Kimi-Linear: it runs under PP)."""
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_bytes((FIXTURES / "kimi_linear_48b_a3b.json").read_bytes())
    return m


CHECK = ["check", "--budget-gib", "8", "--allow-single-rank", "-q"]


def _intact(model: Path) -> None:
    assert (model / "config.json").read_bytes() == (FIXTURES / "kimi_linear_48b_a3b.json").read_bytes()


@pytest.mark.parametrize("via", ["flag", "symlink", "hard-link"])
@pytest.mark.parametrize("output", ["--report", "--junit", "GITHUB_STEP_SUMMARY"])
@pytest.mark.parametrize("model_by", ["--model-config", "launch --model-path"])
def test_an_output_that_is_the_model_config_is_refused_naming_both(
    cli, tmp_path, model, output, via, model_by
):
    """`check --model-config m/config.json --report m/config.json` replaced the model's config with the
    report (GITHUB_STEP_SUMMARY appended markdown to it), exit 0. Now: one line naming both, exit 2, and
    no error report written over it either."""
    path = model / "config.json"
    if via == "symlink":
        (tmp_path / "r.json").symlink_to(path)
        path = tmp_path / "r.json"
    elif via == "hard-link":
        os.link(model / "config.json", tmp_path / "r.json")
        path = tmp_path / "r.json"
    given = ["--model-config", str(model / "config.json")] if model_by == "--model-config" else []
    launch = ["--", "--model-path", str(model), "--pp-size", "1"] if model_by != "--model-config" else []
    env = {"GITHUB_STEP_SUMMARY": str(path)} if output == "GITHUB_STEP_SUMMARY" else {}
    out = [] if output == "GITHUB_STEP_SUMMARY" else [output, str(path)]
    res = cli(
        [*CHECK, *given, *out, "--pp-size", "1", *launch] if not launch else [*CHECK, *out, *launch], env=env
    )
    assert res.rc == 2, res
    line = res.err.splitlines()[0]
    named = "--model-config" if model_by == "--model-config" else "the launch command's --model-path"
    assert f"{output} {path} is" in line and named in line and "an output never replaces an input" in line
    _intact(model)


def test_an_output_inside_the_model_directory_is_refused(cli, model):
    res = cli(
        [*CHECK, "--report", str(model / "report.json"), "--", "--model-path", str(model), "--pp-size", "1"]
    )
    assert (
        res.rc == 2
        and f"--report {model / 'report.json'} is inside the launch command's --model-path" in res.err
    )
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_a_model_config_json_protects_its_directory_a_model_spec_only_itself(cli, tmp_path, model):
    """m/config.json is a model's config: m/ is the model SGLang loads (weights, tokenizer), so an output
    in it is refused. Another JSON (a fixture, a model spec) protects only itself."""
    res = cli(
        [*CHECK, "--pp-size", "1", "--model-config", str(model / "config.json"), "--report", str(model / "r")]
    )
    assert res.rc == 2 and "is inside the model directory of --model-config" in res.err, res
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]
    spec = tmp_path / "kimi.json"
    spec.write_bytes((FIXTURES / "kimi_linear_48b_a3b.json").read_bytes())
    check_outputs([("--report", str(tmp_path / "r.json"))], run_inputs(model_config=str(spec), launch=None))
    with pytest.raises(FlagError, match="is --model-config"):
        check_outputs([("--report", str(spec))], run_inputs(model_config=str(spec), launch=None))


def test_an_output_onto_a_cached_hub_snapshot_is_refused(cli, tmp_path, monkeypatch):
    """A hub id's snapshot files are links into blobs/: the report must not replace the blob either."""
    from test_hub_cache import MAIN, QWEN, make_cache

    folder = make_cache(tmp_path / "hub", config=FIXTURES / "kimi_linear_48b_a3b.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    link = folder / "snapshots" / MAIN / "config.json"
    blob = link.resolve()
    before = blob.read_bytes()
    for target in (blob, link):
        res = cli([*CHECK, "--report", str(target), "--", "--model-path", QWEN, "--pp-size", "1"])
        assert res.rc == 2 and "an output never replaces an input" in res.err, res
        assert blob.read_bytes() == before


@pytest.mark.parametrize("model_by", ["--model-config", "launch --model-path"])
def test_a_usage_error_never_writes_its_report_over_an_input(cli, model, model_by):
    """The usage-error path (checker/cli/refusal.py error_report) wrote the error report over the model's
    config.json: now the report is dropped with a warning naming both."""
    target = model / "config.json"
    if model_by == "--model-config":
        argv = [*CHECK, "--polcy", "x", "--model-config", str(target), "--report", str(target)]
    else:
        argv = [*CHECK, "--polcy", "x", "--report", str(target), "--", "--model-path", str(model)]
    res = cli(argv)
    assert res.rc == 2 and "did you mean --policy" in res.err
    assert f"no error report: --report {target} is" in res.err
    _intact(model)


def test_a_usage_error_report_and_junit_on_one_file_write_the_report_only(cli, tmp_path):
    same = tmp_path / "out.json"
    res = cli([*CHECK, "--model", "kimi-k3", "--polcy", "x", "--report", str(same), "--junit", str(same)])
    assert res.rc == 2 and json.loads(same.read_text())["status"] == "error"
    assert f"--report {same} and --junit {same} are one file" in res.err


@pytest.mark.parametrize("second", ["--junit", "GITHUB_STEP_SUMMARY", "TORCHELASTIC_ERROR_FILE"])
def test_two_outputs_on_one_file_are_refused(cli, tmp_path, second):
    """`--report x --junit x` (or GITHUB_STEP_SUMMARY = --report) left an unreadable report, exit 0."""
    same = tmp_path / "x.json"
    env = {second: str(same)} if second != "--junit" else {}
    flags = ["--junit", str(same)] if second == "--junit" else []
    res = cli([*CHECK, "--model", "kimi-k3", "--pp-size", "1", "--report", str(same), *flags], env=env)
    (line, *_) = res.err.splitlines()
    assert res.rc == 2 and f"--report {same} and {second} {same} are one file" in line, res
    report = json.loads(same.read_text())  # the error report alone: readable, this run's
    assert report["status"] == "error" and "are one file" in report["errors"][0]


def test_devices_may_take_every_output(cli, tmp_path):
    """/dev/null shared by every output is no collision: nothing is replaced there."""
    with pytest.raises(FlagError):
        check_outputs([("--report", str(tmp_path / "a")), ("--junit", str(tmp_path / "a"))], [])
    check_outputs([("--report", "/dev/null"), ("--junit", "/dev/null"), ("--plot", "/dev/null")], [])


@pytest.mark.parametrize(
    "flags", [["--report", "{cfg}"], ["--plot", "{cfg}"], ["--report", "{x}", "--plot", "{x}"]]
)
def test_sweep_refuses_an_output_on_an_input_or_another_output(cli, tmp_path, model, flags):
    cfg, x = model / "config.json", tmp_path / "x"
    argv = [f.format(cfg=cfg, x=x) for f in flags]
    res = cli(["sweep", "--budgets", "8", "--model-config", str(cfg), "--pp-size", "1", *argv])
    assert res.rc == 2 and ("an output never replaces an input" in res.err or "are one file" in res.err), res
    _intact(model)
    assert not x.exists()


@pytest.mark.parametrize("shape", ["out.json/", "a.txt/../r.json"])
def test_check_refuses_a_path_the_kernel_refuses(cli, tmp_path, shape):
    (tmp_path / "out.json").write_text("keep")
    (tmp_path / "a.txt").write_text("keep")
    res = cli([*CHECK, "--model", "kimi-k3", "--pp-size", "1", "--report", f"{tmp_path}/{shape}"])
    assert res.rc == 2 and f"--report {tmp_path}/{shape}:" in res.err, res
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "out.json"]
    assert (tmp_path / "out.json").read_text() == "keep"


@pytest.mark.parametrize("spelling", ["/dev/stdout", "/proc/self/fd/1"])
def test_check_report_to_stdout_redirected_to_a_log_is_appended(tmp_path, spelling):
    """`check --report /dev/stdout > ci.log`: the log's earlier lines, the report and the verdict line,
    in that order, in the same file (the report replaced the log before)."""
    log = tmp_path / "ci.log"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "checker", *KIMI, "-q", "--report", spelling]
    with log.open("w") as f:
        f.write("earlier lines\n")
        f.flush()
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr[-2000:]
    text = log.read_text()
    assert text.startswith("earlier lines\n{")
    head, _, verdict = text.removeprefix("earlier lines\n").rstrip("\n").rpartition("\n")
    assert json.loads(head)["status"] == "consistent" and verdict == "checker verdict consistent"


# ---- every file the run reads is an input no output replaces -------------------------------------------


def _server_log(path: Path) -> Path:
    """A one-rank start's log, in SGLang 0.5.23's own line format (``Load weight end. ... mem usage=``)."""
    from postflight_logs import ServerLog, preflight_report

    path.write_text(ServerLog(preflight_report(1)).text())
    return path


WEIGHTS_FROM_LOG = [
    "check",
    "--model",
    "kimi-k3",
    "--allow-single-rank",
    "--budget-from-device",
    "--mem-fraction-static",
    "0.85",
    "--device-free-gib",
    "120",
    "-q",
]


@pytest.mark.parametrize("via", ["same path", "symlink"])
@pytest.mark.parametrize("output", ["--report", "--junit", "GITHUB_STEP_SUMMARY"])
def test_the_log_of_weights_from_log_is_never_replaced_by_an_output(cli, tmp_path, output, via):
    """`check --weights-from-log server.log --report server.log` was consistent, and the log then held the
    report (also --junit, GITHUB_STEP_SUMMARY, a symlink to the log): run_inputs listed the model, the
    model config and the rendezvous file only. Now the log is an input: one line naming both, exit 2,
    the log byte for byte as it was."""
    log = _server_log(tmp_path / "server.log")
    before = log.read_bytes()
    target = log
    if via == "symlink":
        (tmp_path / "out").symlink_to(log)
        target = tmp_path / "out"
    env = {"GITHUB_STEP_SUMMARY": str(target)} if output == "GITHUB_STEP_SUMMARY" else {}
    out = [] if output == "GITHUB_STEP_SUMMARY" else [output, str(target)]
    res = cli([*WEIGHTS_FROM_LOG, "--weights-from-log", str(log), *out], env=env)
    assert res.rc == 2, res
    (line,) = res.err.strip().splitlines()
    assert f"{output} {target} is --weights-from-log {log}, which this run reads" in line, line
    assert log.read_bytes() == before
    elsewhere = {"GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    ok = cli(
        [*WEIGHTS_FROM_LOG, "--weights-from-log", str(log), "--report", str(tmp_path / "r.json")], elsewhere
    )
    assert ok.rc == 0, ok.err  # the same run with its outputs elsewhere
    assert log.read_bytes() == before


def test_the_download_dir_snapshot_the_weights_are_read_from_is_never_replaced(cli, tmp_path, monkeypatch):
    """A hub id with --download-dir DL: SGLang reads the weights from DL's snapshot
    (``snapshot_download(cache_dir=download_dir)``, as config.py's weights_directory does), but only the
    default hub cache was protected, so the report could replace DL/.../snapshots/C/config.json (and
    the blob it links to). Now the snapshot is an input too."""
    from test_hub_cache import MAIN, QWEN, make_cache

    config = FIXTURES / "kimi_linear_48b_a3b.json"
    make_cache(tmp_path / "hub", repo=QWEN, config=config)  # the default cache: the config SGLang reads
    dl = make_cache(tmp_path / "dl", repo=QWEN, config=config)  # --download-dir: the weights
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    link = dl / "snapshots" / MAIN / "config.json"
    blob = link.resolve()
    before = blob.read_bytes()
    launch = ["--", "--model-path", QWEN, "--download-dir", str(tmp_path / "dl"), "--pp-size", "1"]
    for target in (link, blob, dl / "snapshots" / MAIN / "report.json"):
        res = cli([*CHECK, "--report", str(target), *launch])
        assert res.rc == 2, res
        assert "which this run reads: an output never replaces an input" in res.err, res.err
        assert "--download-dir" in res.err, res.err
        assert blob.read_bytes() == before
    assert sorted(p.name for p in (dl / "snapshots" / MAIN).iterdir()) == ["config.json"]
    ok = cli([*CHECK, "--report", str(tmp_path / "r.json"), *launch])
    assert ok.rc == 0, ok.err


# Every option of every command that takes a value, by what its value is. An option that names a file
# the run reads is in READ (checker.launch.inputs.READ_OPTIONS, or postflight's own); one that names a
# file the run writes in OUTPUTS; the rest name no file. A new option must be placed in one of them.
NOT_A_FILE = {
    "model",
    "budget_gib",
    "gpu_free_gib",
    "weights_gib",
    "mem_fraction_static",
    "device_free_gib",
    "device_total_gib",
    "timeout_s",
    "backend",
    "format",
    "engine",
    "sglang_version",
    "materialize_device",
    "target_max_running_requests",
    "target_tokens",
    "target_requests",
    "partition_slack",
    "budgets",
    "policy",
    "policies",
    "require_consistent",
    "device",
    "weights_margin_gib",
    "gpu_sm_count",
    "command",
}
OUTPUTS = {
    "check": {"report", "junit", "plot"},
    "derive": {"plot"},
    "plan": set(),
    "sweep": {"report", "plot"},
    "postflight": {"postflight_report", "junit"},
}


def _value_options(command: str) -> dict[str, argparse.Action]:
    """The options and positionals of ``command`` that take a value, by dest."""
    from checker.cli.main import build_parser
    from checker.core.sizing.server_args import SIZING_FLAG_NAMES

    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {
        a.dest: a
        for a in sub._actions
        if a.nargs != 0
        and not isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
        and a.dest not in SIZING_FLAG_NAMES  # the sizing inputs: numbers and names, never paths
    }


def _reads(command: str) -> dict[str, str]:
    from checker.commands import postflight
    from checker.launch import inputs

    return postflight.READ_OPTIONS if command == "postflight" else inputs.READ_OPTIONS


@pytest.mark.parametrize("command", list(OUTPUTS))
def test_every_option_that_names_a_file_the_run_reads_is_an_input(command):
    """Each command's parser, walked: every option that takes a value is a number or a name, an output, or
    a file the run reads, and each one the run reads is in the list run_inputs protects. A new option
    that names a file (say --config-file) fails here until it is placed."""
    found = _value_options(command)
    reads = {d for d in _reads(command) if d in found}
    unplaced = set(found) - NOT_A_FILE - OUTPUTS[command] - reads
    assert not unplaced, (
        f"{command}: options not placed as a file read, a file written or no file: {unplaced}"
    )
    assert not OUTPUTS[command] - set(found), "an output listed here is gone from the parser"
    assert not reads & OUTPUTS[command]


def _read_cases() -> list[tuple[str, str, str]]:
    cases = []
    for command, outputs in OUTPUTS.items():
        found = _value_options(command)
        for dest in _reads(command):
            if dest in found:
                cases += [(command, dest, out) for out in sorted(outputs)]
    return cases


@pytest.mark.parametrize(("command", "read", "output"), _read_cases())
def test_no_output_replaces_a_file_given_to_an_option_the_run_reads(cli, tmp_path, command, read, output):
    """For every (file read, file written) pair of every command, as its parser has them: the output given
    the input's path is one line naming both, exit 2, and the input is byte for byte as it was."""
    from postflight_logs import ServerLog, preflight_report

    (tmp_path / "m").mkdir()
    paths = {
        "model_config": tmp_path / "m" / "config.json",
        "weights_from_log": tmp_path / "server.log",
        "logs": tmp_path / "server.log",
        "init_method": tmp_path / "rendezvous",
        "report": tmp_path / "preflight.json",
    }
    report = preflight_report(1)
    paths["model_config"].write_bytes((FIXTURES / "kimi_linear_48b_a3b.json").read_bytes())
    paths["weights_from_log"].write_text(ServerLog(report).text())
    paths["init_method"].write_text("")  # a FileStore file: empty until the first rank writes
    paths["report"].write_text(json.dumps(report))
    target = paths[read]
    before = target.read_bytes()
    value = f"file://{target}" if read == "init_method" else str(target)
    model = [] if read == "model_config" else ["--model", "kimi-k3"]
    one = ["--pp-size", "1", *model]
    base = {
        "check": ["check", "--allow-single-rank", "--budget-from-device", "--mem-fraction-static", "0.85",
                  "--device-free-gib", "120", *one],
        "derive": ["derive", "--budget-gib", "8", *one],
        "plan": ["plan", "--target-max-running-requests", "8", "--gpu-free-gib", "120", *one],
        "sweep": ["sweep", "--budgets", "8", "--no-progress", *one],
        "postflight": ["postflight", str(paths["logs"]), "--report", str(paths["report"])],
    }[command]  # fmt: skip
    given = [] if command == "postflight" else [_flag(command, read), value]
    res = cli([*base, *given, _flag(command, output), str(target)])
    assert res.rc == 2, res
    assert "which this run reads: an output never replaces an input" in res.err, res.err
    if read == "init_method":
        # The rendezvous file is the run's own store (the refused rank still meets the others through
        # it): it changes, but never into the report or the JUnit file.
        assert b'"status"' not in target.read_bytes() and b"<testsuite" not in target.read_bytes()
    else:
        assert target.read_bytes() == before


def _flag(command: str, dest: str) -> str:
    return _value_options(command)[dest].option_strings[0]


def test_a_refused_command_line_never_writes_its_error_report_over_a_weights_log(cli, tmp_path):
    """A rank whose command line fails still publishes an error report (checker/cli/refusal.py): the
    log of --weights-from-log (each of several) is an input there too, read as the parser would."""
    first, second = _server_log(tmp_path / "node0.log"), _server_log(tmp_path / "node1.log")
    before = second.read_bytes()
    logs = ["--weights-from-log", str(first), "--weights-from-log", str(second)]
    res = cli([*WEIGHTS_FROM_LOG, "--polcy", "x", *logs, "--report", str(second)])
    assert res.rc == 2 and "did you mean --policy" in res.err, res
    assert f"no error report: --report {second} is --weights-from-log {second}" in res.err, res.err
    assert second.read_bytes() == before
