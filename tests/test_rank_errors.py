"""Any rank's usage or input error reaches the report (issue 19): status ``error``, the failing ranks
and each one's message, printed once, whichever rank it happens on; the same for a rank that cannot
read its own environment. And the sweep fails like check: one exit code on every rank, a report.

Real worlds: ranks meeting through a FileStore (tests/harness.py), and torchrun jobs (``slow``) where a
wrapper script changes one rank's command line or environment, as a node started differently would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness import run_world

from checker.status import EXIT_CODES

KIMI = ["--model", "kimi-k3", "--budget-gib", "8"]
HOST = os.environ.get("CHECKER_HOSTNAME") or socket.gethostname()
"""Where every rank of these one-machine worlds runs: each error names it (issue 27)."""
SWEEP = ["sweep", "--model", "kimi-k3", "--budgets", "8,16", "--no-progress", "--timeout-s", "60"]


def _stderr(res) -> str:
    return "".join(r.stderr for r in res.ranks)


@pytest.mark.slow
def test_a_bad_flag_on_one_rank_is_named_in_the_report_and_printed_once(tmp_path):
    """Only rank 1 was started with a mistyped flag: every rank exits 2 and rank 0's report says
    `error`, naming rank 1 and its message (it used to print nothing and report an infrastructure
    failure naming nobody)."""
    argv = ["check", *KIMI, "--timeout-s", "60"]
    res = run_world(argv, world_size=2, tmp_path=tmp_path, rank_argv={1: [*argv, "--polcy", "own-share"]})
    assert res.codes == [2, 2], [r.stderr[-800:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "error" and rep["exit_code"] == 2 and rep["missing_ranks"] == []
    (error,) = rep["errors"]
    assert error.startswith(f"rank 1 ({HOST}): checker check: error: unrecognized arguments: --polcy")
    assert "did you mean --policy?" in error
    assert _stderr(res).count("unrecognized arguments: --polcy") == 1, _stderr(res)[-2000:]


@pytest.mark.slow
def test_a_sweep_rank_that_cannot_write_its_plot_fails_every_rank_alike(tmp_path):
    """Rank 0 cannot write --plot: it used to exit 2 while the others exited 0. Every rank now leaves
    with rank 0's code."""
    plot = "/proc/self/checker-cannot-write-here.png"  # a directory nobody can create files in
    res = run_world(SWEEP, world_size=2, tmp_path=tmp_path, rank_argv={0: [*SWEEP, "--plot", plot]})
    assert res.codes == [2, 2], [r.stderr[-800:] for r in res.ranks]
    assert "--plot" in res.ranks[0].stderr


@pytest.mark.slow
def test_a_sweep_error_on_one_rank_writes_an_error_report(tmp_path):
    """A rank of a distributed sweep whose command line fails: every rank exits 2, and rank 0's
    --report says `error` with the rank and its message (the sweep used to write no report)."""
    from test_report_schema import errors as schema_errors

    res = run_world(SWEEP, world_size=2, tmp_path=tmp_path, rank_argv={1: [*SWEEP, "--polcy", "x"]})
    assert res.codes == [2, 2], [r.stderr[-800:] for r in res.ranks]
    rep = res.report()
    assert (rep["command"], rep["status"], rep["exit_code"]) == ("sweep", "error", 2)
    (error,) = rep["errors"]
    assert error.startswith(
        f"rank 1 ({HOST}): checker sweep: error: unrecognized arguments: --polcy; did you mean"
    )
    assert schema_errors(rep) == []
    assert f"rank 1 ({HOST}) could not derive the sweep" in res.ranks[0].stderr


@pytest.mark.faults
def test_a_sweep_that_loses_a_rank_writes_an_infrastructure_failure_report(tmp_path):
    """A rank never arrives: the sweep ends at --timeout-s with a report naming it, as check's does."""
    from test_report_schema import errors as schema_errors

    argv = [*SWEEP[:-2], "--timeout-s", "4"]
    res = run_world(argv, world_size=2, tmp_path=tmp_path, launch={0}, kill_after_s=60)
    assert res.codes == [EXIT_CODES["infrastructure_failure"]], res.ranks[0].stderr[-800:]
    rep = res.report()
    assert (rep["status"], rep["missing_ranks"]) == ("infrastructure_failure", [1])
    assert schema_errors(rep) == []


@pytest.mark.slow
@pytest.mark.parametrize("metadata", ["untabled release", "not utf-8"])
def test_a_launch_command_one_node_cannot_read_is_named(tmp_path, metadata):
    """Only rank 1's node has an SGLang the checker cannot read the launch command for (a release it
    has no flag table for; a METADATA that is not UTF-8, which raises before any check): the report
    names rank 1 and why, not an infrastructure failure."""
    site = tmp_path / "old-site" / "sglang-0.3.0.dist-info"
    site.mkdir(parents=True)
    summary = b"Summary: \xff\xfe\n" if metadata == "not utf-8" else b""
    (site / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: sglang\nVersion: 0.3.0\n" + summary)
    path = os.pathsep.join(p for p in (str(site.parent), os.environ.get("PYTHONPATH", "")) if p)
    model = Path(__file__).resolve().parent / "fixtures" / "launch-model"
    # tp 2 (Qwen3-Next, the model there, asserts a single pipeline stage)
    launch = ["--", "python", "-m", "sglang.launch_server", "--model-path", str(model), "--tp-size", "2"]
    res = run_world(
        ["check", "--budget-gib", "8", "--timeout-s", "60", *launch],
        world_size=2,
        tmp_path=tmp_path,
        rank_env={1: {"PYTHONPATH": path}},
    )
    assert res.codes == [2, 2], [r.stderr[-800:] for r in res.ranks]
    (error,) = res.report()["errors"]
    if metadata == "not utf-8":
        # A usage error naming what cannot be read and the way out, not an internal error.
        assert error.startswith(
            f"rank 1 ({HOST}): checker check: error: the installed SGLang's package metadata cannot be read"
        ), error
        assert "UnicodeDecodeError" in error and "--sglang-version" in error, error
    else:
        assert error.startswith(
            f"rank 1 ({HOST}): checker check: error: SGLang 0.3.0: the checker has no table"
        ), error


# -- torchrun jobs where one rank differs --------------------------------------------------------------

WRAPPER = """\
import os, sys
rank = os.environ.get("RANK")
argv = sys.argv[1:]
extra = os.environ.get("TEST_EXTRA_ARGV_RANK_" + str(rank))
if extra:
    argv += extra.split()
site = os.environ.get("TEST_SYS_PATH_RANK_" + str(rank)) or os.environ.get("TEST_SYS_PATH_EVERY_RANK")
if site:
    sys.path.insert(0, site)  # this rank's node has another site-packages
from checker.cli.main import main
sys.exit(main(argv))
"""


def torchrun(tmp_path: Path, env: dict[str, str], nproc: int = 4) -> tuple[subprocess.CompletedProcess, dict]:
    wrapper = tmp_path / "rank_wrapper.py"
    wrapper.write_text(WRAPPER)
    report = tmp_path / "report.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
        "--max-restarts", "0", str(wrapper), *KIMI, "--timeout-s", "30", "--report", str(report),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1", **env}
    )
    assert report.exists(), f"no report: {proc.stderr[-2000:]}"
    return proc, json.loads(report.read_text())


def broken_sglang(tmp_path: Path) -> str:
    """A site-packages whose sglang dist-info has a METADATA that is not UTF-8."""
    site = tmp_path / "broken-site"
    info = site / "sglang-0.5.20.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_bytes(
        b"Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.20\nSummary: \xff\xfe\n"
    )
    return str(site)


@pytest.mark.slow
def test_torchrun_a_bad_flag_on_rank_3_only(tmp_path):
    proc, rep = torchrun(tmp_path, {"TEST_EXTRA_ARGV_RANK_3": "--polcy own-share"})
    assert proc.returncode != 0
    assert rep["status"] == "error" and rep["missing_ranks"] == [], rep
    said = (
        f"rank 3 ({HOST}): checker check: error: unrecognized arguments: --polcy; did you mean --policy? "
        "(see checker check --help)"
    )
    assert rep["errors"] == [said]
    # Printed once by the checker; torchrun's summary quotes it from the error file (issue 27).
    printed = [line for line in proc.stderr.splitlines() if "unrecognized arguments: --polcy" in line]
    assert len([line for line in printed if "traceback :" not in line]) == 1, proc.stderr[-3000:]
    assert any("traceback :" in line and said in line for line in printed), proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["rank 2", "every rank"])
def test_torchrun_sglang_metadata_that_is_not_utf8(tmp_path, where):
    """A node whose installed SGLang has an undecodable METADATA: an error naming that rank (or every
    rank), never an infrastructure failure or no report at all."""
    site = broken_sglang(tmp_path)
    env = {"TEST_SYS_PATH_RANK_2": site} if where == "rank 2" else {"TEST_SYS_PATH_EVERY_RANK": site}
    proc, rep = torchrun(tmp_path, env)
    assert rep["status"] == "error", rep
    (error,) = rep["errors"]
    ranks = f"rank 2 ({HOST})" if where == "rank 2" else f"ranks 0-3 ({HOST})"
    assert error.startswith(f"{ranks}: ") and "UnicodeDecodeError" in error, error


def test_a_rank_whose_command_line_fails_alone_prints_it_once(tmp_path):
    """Without torchrun nothing changes: one line, exit 2, the error report."""
    report = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "checker", *KIMI, "--polcy", "x", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "unrecognized arguments: --polcy" in proc.stderr
    assert json.loads(report.read_text())["errors"] == [proc.stderr.strip()]
