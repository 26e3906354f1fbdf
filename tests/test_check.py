"""The preflight on real gloo process groups: ranks meet through a FileStore in tmp_path (no ports).

Each test launches real ``python -m checker check`` processes; the verdict, the exit code of every
rank and rank 0's JSON report are what a CI job relies on.
"""

from __future__ import annotations

import time

import pytest
from harness import requires_gpu, run_world

KIMI = ["--model", "kimi-k3", "--budget-gib", "8", "--mamba-full-memory-ratio", "0.5"]
FAST = ["--timeout-s", "60"]  # generous: ranks start slowly when the suite loads both cores


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_consistent_at_every_world_size(tmp_path, world_size):
    """max-share at pp = world: every rank agrees; breaks if any rank derives a different value."""
    res = run_world(["check", *KIMI, *FAST], world_size=world_size, tmp_path=tmp_path)
    assert res.codes == [0] * world_size, [r.stderr[-400:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "consistent"
    assert rep["world_size"] == world_size
    assert [r["rank"] for r in rep["ranks"]] == list(range(world_size))
    assert [r["pp_rank"] for r in rep["ranks"]] == list(range(world_size))
    assert len({r["max_mamba_cache_size"] for r in rep["ranks"]}) == 1
    assert rep["divergent"] == [] and rep["differing_inputs"] == [] and rep["missing_ranks"] == []
    assert {"init_s", "exchange_s", "total_s"} <= rep["timings"].keys()
    if world_size == 8:
        # Default flags under PP: auto -> extra_buffer without overlap, 4 slots: 74 // 4 = 18.
        assert {(r["max_mamba_cache_size"], r["max_running_requests"], r["pp_max_micro_batch_size"])
                for r in rep["ranks"]} == {(74, 18, 2)}


def test_worked_numbers_with_three_slots(tmp_path):
    """Spec 9 on 8 real ranks: 3 slots per request (no_buffer, which SGLang 0.5.23 starts only with
    --disable-overlap-schedule) -> 74 slots, 24 requests, 3."""
    res = run_world(["check", *KIMI, "--mamba-radix-cache-strategy", "no_buffer",
                     "--disable-overlap-schedule", *FAST],
                    world_size=8, tmp_path=tmp_path)
    assert res.codes == [0] * 8
    assert {(r["max_mamba_cache_size"], r["max_running_requests"], r["pp_max_micro_batch_size"])
            for r in res.report()["ranks"]} == {(74, 24, 3)}
    assert "verdict: consistent (exit 0)" in res.ranks[0].stdout


def test_tp_inner_layout(tmp_path):
    """pp_rank = rank // tp_size: ranks 0-1 are stage 0, ranks 2-3 stage 1."""
    res = run_world(["check", *KIMI, "--tp-size", "2", *FAST], world_size=4, tmp_path=tmp_path)
    assert res.codes == [0] * 4
    rep = res.report()
    assert [r["pp_rank"] for r in rep["ranks"]] == [0, 0, 1, 1]
    assert [r["tp_rank"] for r in rep["ranks"]] == [0, 1, 0, 1]


def test_own_share_diverges_and_names_outliers(tmp_path):
    """own-share at pp 4: stages holding fewer linear layers derive a larger pool."""
    res = run_world(["check", *KIMI, "--policy", "own-share", *FAST], world_size=4, tmp_path=tmp_path)
    assert res.codes == [1] * 4, [r.stderr[-300:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "divergent"
    assert "max_mamba_cache_size" in rep["divergent"]
    groups = rep["divergent_groups"]["max_mamba_cache_size"]
    assert sum(len(g["ranks"]) for g in groups) == 4
    assert any(g["outlier"] for g in groups)
    out = res.ranks[0].stdout
    assert "max_mamba_cache_size differs across ranks" in out and " *" in out


def test_partition_env_on_some_ranks_is_root_caused(tmp_path):
    """A partition env set on one node only: values diverge and the report names the env var."""
    part = {"SGLANG_PP_LAYER_PARTITION": "30,21,21,21"}
    res = run_world(["check", *KIMI, *FAST], world_size=4, tmp_path=tmp_path,
                    rank_env={2: part, 3: part})
    assert res.codes == [1] * 4
    rep = res.report()
    assert rep["status"] == "divergent"
    assert rep["differing_inputs"] == ["SGLANG_PP_LAYER_PARTITION"]
    cause = rep["root_causes"][0]
    assert "ranks 2-3 set SGLANG_PP_LAYER_PARTITION=30,21,21,21" in cause
    assert "ranks 0-1 leave it unset" in cause


def test_differing_input_with_equal_values_warns_or_fails_strict(tmp_path):
    """An env var that changes nothing derived is a warning; --strict-inputs turns it into exit 1."""
    same = {"SGLANG_MAMBA_CONV_DTYPE": "bfloat16"}  # the default, spelled out on one rank
    res = run_world(["check", *KIMI, *FAST], world_size=2, tmp_path=tmp_path, rank_env={1: same})
    assert res.codes == [0, 0]
    rep = res.report()
    assert rep["status"] == "consistent" and rep["differing_inputs"] == ["SGLANG_MAMBA_CONV_DTYPE"]
    assert any("inputs differ" in w for w in rep["warnings"])
    strict = run_world(["check", *KIMI, "--strict-inputs", *FAST], world_size=2,
                       tmp_path=tmp_path, rank_env={1: same})
    assert strict.codes == [1, 1]
    assert strict.report()["status"] == "divergent"


def test_rank_that_raises_is_reported_by_every_rank(tmp_path):
    """An unexpected exception on rank 1 still joins the exchange: every rank exits 2, one message."""
    res = run_world(["check", *KIMI, *FAST], world_size=3, tmp_path=tmp_path,
                    env={"CHECKER_INJECT_FAULT": "1:derive:raise"}, rank_env={})
    assert res.codes == [2, 2, 2]
    rep = res.report()
    assert rep["status"] == "error"
    assert rep["errors"] == ["rank 1: internal error: RuntimeError: injected fault on rank 1 at derive"]
    assert "Traceback" not in "".join(r.stderr for r in res.ranks)


def test_bad_input_on_every_rank_is_one_error(tmp_path):
    """A world that is not pp x tp: every rank reports the same usage error and exits 2."""
    res = run_world(["check", *KIMI, "--pp-size", "3", *FAST], world_size=2, tmp_path=tmp_path)
    assert res.codes == [2, 2]
    rep = res.report()
    assert rep["status"] == "error" and len(rep["errors"]) == 1
    assert rep["errors"][0].startswith("ranks 0-1: world_size 2 is not pp_size x tp_size")


def test_budget_too_small_everywhere(tmp_path):
    res = run_world(["check", "--budget-gib", "0.05", *FAST], world_size=2, tmp_path=tmp_path)
    assert res.codes == [2, 2]
    assert "not enough memory for the state pool" in res.report()["errors"][0]


@pytest.mark.parametrize("action", ["hang", "exit"])
def test_lost_rank_ends_in_infrastructure_failure(tmp_path, action):
    """A rank that hangs (alive, never joins the exchange) or dies: the others end within the
    timeout plus a few seconds, exit 3, and rank 0's report names the missing rank."""
    timeout_s = 6
    t0 = time.monotonic()
    res = run_world(["check", *KIMI, "--timeout-s", str(timeout_s)], world_size=3, tmp_path=tmp_path,
                    env={"CHECKER_INJECT_FAULT": f"2:exchange:{action}"}, kill_after_s=timeout_s + 40)
    survivors = [r for r in res.ranks if r.rank != 2]
    assert [r.returncode for r in survivors] == [3, 3], [r.stderr[-500:] for r in survivors]
    # Bounded: timeout + grace, plus process start and torch import (slow when the suite loads both
    # cores). Without the bound the survivors would wait for the hung rank forever (until killed).
    assert max(r.elapsed_s for r in survivors) < timeout_s + 25, time.monotonic() - t0
    rep = res.report()
    assert rep["status"] == "infrastructure_failure"
    assert rep["missing_ranks"] == [2]


def test_rank_that_never_arrives(tmp_path):
    """Only ranks 0-1 of 3 start: init times out, rank 0 names rank 2."""
    res = run_world(["check", *KIMI, "--timeout-s", "5"], world_size=3, tmp_path=tmp_path,
                    launch={0, 1}, kill_after_s=40)
    assert res.codes == [3, 3]
    rep = res.report()
    assert rep["status"] == "infrastructure_failure" and rep["missing_ranks"] == [2]


def test_budget_from_device_agrees_by_min(tmp_path):
    """Free memory differs per rank; the MIN all-reduce makes every stage use the same budget,
    and --no-agree-budget shows the divergence a missing MIN would cause."""
    argv = ["check", "--budget-from-device", "--device-free-gib", "10,9.5,12,9.75",
            "--mem-fraction-static", "0.8", *FAST]
    res = run_world(argv, world_size=4, tmp_path=tmp_path)
    assert res.codes == [0] * 4
    rep = res.report()
    assert {round(r["budget_gib"], 5) for r in rep["ranks"]} == {round(9.5 * 0.8, 5)}
    res2 = run_world([*argv, "--no-agree-budget"], world_size=4, tmp_path=tmp_path)
    assert res2.codes == [1] * 4
    rep2 = res2.report()
    assert rep2["status"] == "divergent" and "budget_gib" in rep2["differing_inputs"]


def test_whole_model_warns_about_efficiency(tmp_path):
    """whole-model is consistent but charges every stage for the whole model's state."""
    res = run_world(["check", *KIMI, "--policy", "whole-model", *FAST], world_size=8, tmp_path=tmp_path)
    assert res.codes == [0] * 8
    warns = res.report()["warnings"]
    assert any("allocate only about 1/8 of the state memory" in w for w in warns), warns


def test_junit_and_github_summary(tmp_path):
    """CI artefacts: JUnit with one case per checked value, markdown appended to the step summary."""
    summary = tmp_path / "summary.md"
    junit = tmp_path / "junit.xml"
    res = run_world(["check", *KIMI, "--policy", "own-share", "--junit", str(junit), *FAST],
                    world_size=4, tmp_path=tmp_path, env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert res.codes == [1] * 4
    from xml.etree import ElementTree as ET

    suite = ET.parse(junit).getroot()
    names = [c.get("name") for c in suite.iter("testcase")]
    assert names[:3] == ["max_mamba_cache_size", "max_running_requests", "pp_max_micro_batch_size"]
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert "max_mamba_cache_size" in failed
    text = summary.read_text()
    assert "DIVERGENT" in text and text.count("| 0 |") + text.count("| 1 |") >= 2


@requires_gpu
def test_nccl_world_one(tmp_path):
    """On a GPU host: NCCL with device tensors at world 1."""
    res = run_world(["check", *KIMI, "--pp-size", "1", "--backend", "nccl", *FAST], world_size=1,
                    tmp_path=tmp_path)
    assert res.codes == [0]
    assert res.report()["backend"] == "nccl"


def _torchrun(args, tmp_path, timeout=120):
    import shutil
    import subprocess
    import sys

    report = tmp_path / "torchrun-report.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "0", *args, "--report", str(report), "--timeout-s", "30"]
    if args[0] == "--no-python":
        assert shutil.which("pp-capacity-checker"), "console script not installed (pip install -e .)"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    return proc, report


def test_torchrun_console_script(tmp_path):
    """The real launcher with the console script: `torchrun --no-python pp-capacity-checker`."""
    import json

    proc, report = _torchrun(["--no-python", "pp-capacity-checker", *KIMI], tmp_path)
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert json.loads(report.read_text())["status"] == "consistent"
    assert "verdict: consistent (exit 0)" in proc.stdout


def test_torchrun_root_cause_names_the_verdict(tmp_path):
    """torchrun turns a divergence into exit 1; its Root Cause block quotes the verdict, and the
    report (what a CI job must read) says divergent."""
    import json

    # pp 2 splits kimi-k3's linear layers 35/34: own-share pools differ at 40 GiB.
    proc, report = _torchrun(["-m", "checker", *KIMI, "--budget-gib", "40", "--policy", "own-share",
                              "--pp-size", "2"], tmp_path)
    assert proc.returncode == 1, proc.stderr[-1000:]
    assert json.loads(report.read_text())["status"] == "divergent"
    assert "checker verdict divergent: max_mamba_cache_size" in proc.stderr


def test_device_derivation_disagreeing_with_the_scalar_core_is_an_error(tmp_path):
    """Each rank derives its stage twice: the scalar core and the vectorised path on its device. A
    rank whose scalar core is off by half (patched through sitecustomize on rank 1 only) must be caught
    and reported by every rank, not pass as consistent."""
    import os

    patch = tmp_path / "broken_scalar"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(
        "from checker.core import sizing\n"
        "_real = sizing.mamba_budget_bytes\n"
        "sizing.mamba_budget_bytes = lambda budget_gib, ratio: _real(budget_gib, ratio) * 1.5\n"
    )
    path = os.pathsep.join(p for p in (str(patch), os.environ.get("PYTHONPATH", "")) if p)
    res = run_world(["check", *KIMI, *FAST], world_size=2, tmp_path=tmp_path,
                    rank_env={1: {"PYTHONPATH": path}})
    assert res.codes == [2, 2], [r.stderr[-400:] for r in res.ranks]
    err = res.report()["errors"]
    assert len(err) == 1 and err[0].startswith("rank 1: internal error: RuntimeError: the derivation on cpu")
