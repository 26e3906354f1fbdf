"""The preflight on real gloo process groups: ranks meet through a FileStore in tmp_path (no ports).

Each test launches real ``python -m checker check`` processes (or torchrun): what is tested here is what
only a real world shows: the exchange, every rank's exit code, rank 0's report, stdout and CI files.
The verdict and its renderings are tested in-process on wire-encoded rows in tests/test_report.py.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from harness import requires_gpu, run_world

HOST = os.environ.get("CHECKER_HOSTNAME") or socket.gethostname()
"""Where every rank of these one-machine worlds runs: each error names it."""

KIMI = ["--model", "kimi-k3", "--budget-gib", "8", "--mamba-full-memory-ratio", "0.5"]
FAST = ["--timeout-s", "60"]  # generous: ranks start slowly when the suite loads both cores
VALUES = ("max_mamba_cache_size", "max_running_requests", "pp_max_micro_batch_size")


def test_one_rank_without_allow_single_rank_is_refused(cli, monkeypatch):
    """A world of one compares nothing: exit 2 with one line naming the flag, before any process group."""
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    res = cli(["check", *KIMI])
    assert res.rc == 2 and res.out == ""
    (line,) = res.err.splitlines()
    assert (
        line.startswith("checker check: error: check is running as one rank")
        and "--allow-single-rank" in line
    )


@pytest.mark.parametrize(
    ("world_size", "output"),
    [(1, "text"), (2, "json"), pytest.param(4, "quiet", marks=pytest.mark.slow)],
)
def test_consistent_world(tmp_path, world_size, output):
    """max-share at pp = world: every rank exits 0 and rank 0 reports every rank. Default flags under PP:
    auto -> extra_buffer without overlap, 4 slots a request; at pp 1 no PP rules apply."""
    argv = ["check", *KIMI, *FAST]
    argv += {"text": ["--allow-single-rank"], "json": ["--format", "json"], "quiet": ["--quiet"]}[output]
    res = run_world(argv, world_size=world_size, tmp_path=tmp_path)
    assert res.codes == [0] * world_size, [r.stderr[-400:] for r in res.ranks]
    rep = res.report()
    assert (rep["status"], rep["exit_code"], rep["world_size"]) == ("consistent", 0, world_size)
    assert rep["layout"] == {"world_size": world_size, "pp_size": world_size, "tp_size": 1}
    assert [(r["rank"], r["pp_rank"], r["status"]) for r in rep["ranks"]] == [
        (i, i, "ok") for i in range(world_size)
    ]
    assert rep["divergent"] == [] and rep["differing_inputs"] == [] and rep["missing_ranks"] == []
    assert {"init_s", "exchange_s", "total_s"} <= rep["timings"].keys()
    if world_size == 4:
        # The worked arithmetic of tests/test_sizing.py at pp 4: B = 2,863,311,530.67 bytes; the busiest
        # stage holds 18 of 69 linear layers, 18 x 4,218,880 = 75,939,840 bytes a slot -> 37.7 -> 37,
        # less the padding slot: 36; 4 slots a request: 9; 9 // 4 stages: 2.
        assert {tuple(r[v] for v in VALUES) for r in rep["ranks"]} == {(36, 9, 2)}
    out = res.ranks[0].stdout
    if output == "json":
        assert json.loads(out) == rep
    elif output == "quiet":
        assert out == "checker verdict consistent\n"
    else:
        assert out.splitlines()[-1] == "verdict: consistent (exit 0)"
    assert all(r.stdout == "" for r in res.ranks[1:])


@pytest.mark.slow
def test_divergence_end_to_end_with_ci_files(tmp_path):
    """own-share at pp 4: every rank exits 1; the report, the JUnit file and the step summary agree on
    which ranks derived what."""
    from junitparser import Failure, JUnitXml
    from test_report import md_blocks

    summary, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
    res = run_world(
        ["check", *KIMI, "--policy", "own-share", "--junit", str(junit), *FAST],
        world_size=4,
        tmp_path=tmp_path,
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert res.codes == [1] * 4, [r.stderr[-300:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "divergent" and "max_mamba_cache_size" in rep["divergent"]
    groups = rep["divergent_groups"]["max_mamba_cache_size"]
    assert sorted(r for g in groups for r in g["ranks"]) == [0, 1, 2, 3]
    by_rank = {r["rank"]: r["max_mamba_cache_size"] for r in rep["ranks"]}
    assert {g["value"]: g["ranks"] for g in groups} == {
        v: [r for r in range(4) if by_rank[r] == v] for v in set(by_rank.values())
    }
    (suite,) = JUnitXml.fromfile(str(junit))
    cases = {c.name: c for c in suite}
    (failure,) = cases["max_mamba_cache_size"].result
    assert isinstance(failure, Failure)
    assert failure.message.startswith("max_mamba_cache_size differs across ranks: ")
    assert "own-share" in failure.message  # the root cause travels with the failing case
    blocks = md_blocks(summary.read_text())
    assert blocks[0] == ("heading", "PP capacity preflight: DIVERGENT")
    per_rank = [b for b in blocks if b[0] == "table"][-1]
    col = per_rank[1].index("max_mamba_cache_size")
    assert [int(row[0][0]) for row in per_rank[2]] == [0, 1, 2, 3]
    assert [int(row[col][0].replace(",", "")) for row in per_rank[2]] == [by_rank[r] for r in range(4)]


@pytest.mark.slow
def test_partition_env_on_some_ranks_is_root_caused(tmp_path):
    """A partition env set on one node only: values diverge and the report names the env var."""
    part = {"SGLANG_PP_LAYER_PARTITION": "30,21,21,21"}
    res = run_world(["check", *KIMI, *FAST], world_size=4, tmp_path=tmp_path, rank_env={2: part, 3: part})
    assert res.codes == [1] * 4
    rep = res.report()
    assert rep["status"] == "divergent"
    assert rep["differing_inputs"] == ["SGLANG_PP_LAYER_PARTITION"]
    assert rep["inputs"]["SGLANG_PP_LAYER_PARTITION"] == {
        "by_rank": [None, None, "30,21,21,21", "30,21,21,21"]
    }
    # First the pipeline's own fault (layers 46-50 on no stage), then who set the variable.
    gap, cause = rep["root_causes"]
    assert gap.startswith("pipeline: layers [46, 51) are on no stage: rank 1 holds [23, 46) (pp_rank 1)")
    assert cause.startswith(
        "SGLANG_PP_LAYER_PARTITION: ranks 0-1 leave it unset; "
        "ranks 2-3 set SGLANG_PP_LAYER_PARTITION=30,21,21,21"
    )
    out = res.ranks[0].stdout.splitlines()
    assert out[2:5] == ["root cause:", f"  {gap}", f"  {cause}"]


@pytest.mark.slow
def test_rank_that_raises_is_reported_by_every_rank(tmp_path):
    """An unexpected exception on rank 1 still joins the exchange: every rank exits 2, one message."""
    res = run_world(
        ["check", *KIMI, *FAST],
        world_size=3,
        tmp_path=tmp_path,
        env={"CHECKER_INJECT_FAULT": "1:derive:raise"},
        rank_env={},
    )
    assert res.codes == [2, 2, 2]
    rep = res.report()
    assert rep["status"] == "error"
    assert rep["errors"] == [
        f"rank 1 ({HOST}): internal error: RuntimeError: injected fault on rank 1 at derive"
    ]
    assert "Traceback" not in "".join(r.stderr for r in res.ranks)


@pytest.mark.slow
def test_bad_input_on_every_rank_is_one_error(tmp_path):
    """A world that is not pp x tp: every rank reports the same usage error and exits 2."""
    res = run_world(["check", *KIMI, "--pp-size", "3", *FAST], world_size=2, tmp_path=tmp_path)
    assert res.codes == [2, 2]
    rep = res.report()
    assert rep["status"] == "error" and len(rep["errors"]) == 1
    assert rep["errors"][0].startswith(f"ranks 0-1 ({HOST}): world_size 2 is not pp_size x tp_size")


@pytest.mark.faults
@pytest.mark.parametrize("action", ["hang", "exit"])
def test_lost_rank_ends_in_infrastructure_failure(tmp_path, action):
    """A rank that hangs (alive, never joins the exchange) or dies: the others end within the
    timeout plus a few seconds, exit 3, and rank 0's report names the missing rank."""
    timeout_s = 6
    t0 = time.monotonic()
    res = run_world(
        ["check", *KIMI, "--timeout-s", str(timeout_s)],
        world_size=3,
        tmp_path=tmp_path,
        env={"CHECKER_INJECT_FAULT": f"2:exchange:{action}"},
        kill_after_s=timeout_s + 40,
    )
    survivors = [r for r in res.ranks if r.rank != 2]
    assert [r.returncode for r in survivors] == [3, 3], [r.stderr[-500:] for r in survivors]
    # Bounded: timeout + grace, plus process start and torch import (slow when the suite loads both
    # cores). Without the bound the survivors would wait for the hung rank forever (until killed).
    assert max(r.elapsed_s for r in survivors) < timeout_s + 25, time.monotonic() - t0
    rep = res.report()
    assert rep["status"] == "infrastructure_failure"
    assert rep["missing_ranks"] == [2]


@pytest.mark.faults
def test_a_rank_stuck_in_the_ring_is_not_blamed(tmp_path):
    """World 4, rank 3 exits at the exchange: rank 1 is alive but stuck in the gloo ring until the
    collective times out. Only rank 3 is named (the report used to say [1, 3], 7 times out of 7)."""
    res = run_world(
        ["check", *KIMI, "--timeout-s", "6"],
        world_size=4,
        tmp_path=tmp_path,
        env={"CHECKER_INJECT_FAULT": "3:exchange:exit"},
        kill_after_s=60,
    )
    assert res.codes[:3] == [3, 3, 3], [r.stderr[-300:] for r in res.ranks]
    assert res.report()["missing_ranks"] == [3]


@pytest.mark.faults
def test_frozen_rank_0_is_named_by_the_survivors(tmp_path):
    """Rank 0 frozen (SIGSTOP) in the exchange: the survivors name rank 0 (they used to print "missing:
    none identified"); rank 1, the lowest survivor, publishes the verdict in rank 0's place."""
    res = run_world(
        ["check", *KIMI, "--timeout-s", "6"],
        world_size=3,
        tmp_path=tmp_path,
        env={"CHECKER_INJECT_FAULT": "0:exchange:stop"},
        kill_after_s=45,
    )
    survivors = [r for r in res.ranks if r.rank != 0]
    assert [r.returncode for r in survivors] == [3, 3], [r.stderr[-300:] for r in survivors]
    # Printed once: the stand-in's verdict names rank 0; rank 2 leaves with the published exit code.
    stand_in = survivors[0]
    assert "INFRASTRUCTURE FAILURE" in stand_in.stdout, stand_in.stdout[-800:]
    assert "missing or unresponsive: rank 0" in stand_in.stdout, stand_in.stdout[-800:]
    assert "INFRASTRUCTURE FAILURE" not in survivors[1].stdout + survivors[1].stderr


@pytest.mark.faults
def test_rank_that_never_arrives(tmp_path):
    """Only ranks 0-1 of 3 start: init times out, rank 0 names rank 2."""
    res = run_world(
        ["check", *KIMI, "--timeout-s", "5"], world_size=3, tmp_path=tmp_path, launch={0, 1}, kill_after_s=40
    )
    assert res.codes == [3, 3]
    rep = res.report()
    assert rep["status"] == "infrastructure_failure" and rep["missing_ranks"] == [2]


@pytest.mark.slow
def test_budget_from_device_agrees_by_min(tmp_path):
    """Free memory differs per rank and travels in the header gather; the MIN makes every stage use
    9.5 GiB x 0.8 (SGLang's all-reduce MIN)."""
    argv = [
        "check",
        "--model",
        "kimi-k3",
        "--budget-from-device",
        "--device-free-gib",
        "10,9.5,12,9.75",
        "--mem-fraction-static",
        "0.8",
        *FAST,
    ]
    res = run_world(argv, world_size=4, tmp_path=tmp_path)
    assert res.codes == [0] * 4
    rep = res.report()
    assert [r["budget_gib"] for r in rep["ranks"]] == pytest.approx([9.5 * 0.8] * 4)
    assert [r["device_free_bytes"] for r in rep["ranks"]] == [int(g * 2**30) for g in (10, 9.5, 12, 9.75)]


@requires_gpu
def test_nccl_world_one(tmp_path):
    """On a GPU host: NCCL with device tensors at world 1."""
    res = run_world(
        ["check", *KIMI, "--pp-size", "1", "--backend", "nccl", "--allow-single-rank", *FAST],
        world_size=1,
        tmp_path=tmp_path,
    )
    assert res.codes == [0]
    assert res.report()["backend"] == "nccl"


def _torchrun(args, tmp_path, timeout=120):
    import shutil
    import subprocess
    import sys

    report = tmp_path / "torchrun-report.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "0",
        *args,
        "--report",
        str(report),
        "--timeout-s",
        "30",
    ]
    if args[0] == "--no-python":
        assert shutil.which("pp-capacity-checker"), "console script not installed (pip install -e .)"
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    return proc, report


@pytest.mark.slow
def test_torchrun_console_script(tmp_path):
    """The real launcher with the console script: `torchrun --no-python pp-capacity-checker`."""
    proc, report = _torchrun(["--no-python", "pp-capacity-checker", *KIMI], tmp_path)
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert json.loads(report.read_text())["status"] == "consistent"
    assert "verdict: consistent (exit 0)" in proc.stdout


@pytest.mark.slow  # 10 s of torchrun; the divergent verdict on real ranks stays quick in-process
def test_torchrun_root_cause_names_the_verdict(tmp_path):
    """torchrun turns a divergence into exit 1; its Root Cause block quotes the verdict, and the
    report (what a CI job must read) says divergent."""
    # pp 2 splits kimi-k3's linear layers 35/34: own-share pools differ at 40 GiB.
    proc, report = _torchrun(
        ["-m", "checker", *KIMI, "--budget-gib", "40", "--policy", "own-share", "--pp-size", "2"], tmp_path
    )
    assert proc.returncode == 1, proc.stderr[-1000:]
    assert json.loads(report.read_text())["status"] == "divergent"
    assert "checker verdict divergent: max_mamba_cache_size" in proc.stderr


@pytest.mark.slow
def test_device_derivation_disagreeing_with_the_scalar_core_is_an_error(tmp_path):
    """Each rank derives its stage twice: the scalar core and the same formulas on its device's tensors.
    A rank whose device arithmetic is off (its float-to-int conversion one slot high, patched through
    sitecustomize on rank 1 only: what a device whose arithmetic differs from Python's would give) must be
    caught and reported by every rank, not pass as consistent."""
    import os

    patch = tmp_path / "broken_device"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(
        "from checker.device import sweep\n"
        "_real = sweep._TorchOps.to_int\n"
        "sweep._TorchOps.to_int = lambda self, x: _real(self, x) + 1\n"
    )
    path = os.pathsep.join(p for p in (str(patch), os.environ.get("PYTHONPATH", "")) if p)
    res = run_world(
        ["check", *KIMI, *FAST], world_size=2, tmp_path=tmp_path, rank_env={1: {"PYTHONPATH": path}}
    )
    assert res.codes == [2, 2], [r.stderr[-400:] for r in res.ranks]
    err = res.report()["errors"]
    assert len(err) == 1 and err[0].startswith(
        f"rank 1 ({HOST}): internal error: RuntimeError: the derivation on cpu"
    )
