"""Sweeps on real gloo process groups: each rank derives its own stage, one gather for the sweep."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from harness import run_world

ARGS = [
    "sweep",
    "--model",
    "kimi-k3",
    "--budgets",
    "4:40:0.25",
    "--mamba-full-memory-ratio",
    "0.5",
    "--mamba-radix-cache-strategy",
    "no_buffer",
    "--disable-overlap-schedule",
    "--timeout-s",
    "60",
    "--no-progress",
]


@pytest.mark.slow
def test_four_ranks_count_what_one_process_counts(tmp_path):
    """The distributed sweep's counts equal the single-process derivation's for every policy; breaks
    if a rank derived another stage, or the gather mixed up ranks, policies or budgets."""
    single = tmp_path / "single.json"
    proc = subprocess.run(
        [sys.executable, "-m", "checker", *ARGS, "--pp-size", "4", "--report", str(single)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    res = run_world(ARGS, world_size=4, tmp_path=tmp_path)
    assert res.codes == [0] * 4, [r.stderr[-300:] for r in res.ranks]
    dist, one = res.report(), json.loads(single.read_text())
    assert dist["mode"] == "distributed" and dist["world_size"] == 4
    assert dist["num_budgets"] == one["num_budgets"] == 145
    assert dist["policies"] == one["policies"]
    assert dist["policies"]["max-share"]["divergent_counts"]["pp_max_micro_batch_size"] == 0
    assert dist["policies"]["own-share"]["divergent_counts"]["max_mamba_cache_size"] > 0


@pytest.mark.slow
def test_require_consistent_own_share_fails_on_every_rank(tmp_path):
    res = run_world(
        [*ARGS, "--policy", "own-share", "--require-consistent", "own-share"], world_size=2, tmp_path=tmp_path
    )
    assert res.codes == [1, 1]


@pytest.mark.slow
def test_input_error_on_one_rank_ends_every_rank_with_2(tmp_path):
    """A rank whose inputs are invalid still joins: no hang, exit 2 everywhere."""
    rank_env = {1: {"SGLANG_PP_LAYER_PARTITION": "1,2,3", "CHECKER_HOSTNAME": "node-b"}}
    res = run_world(ARGS, world_size=2, tmp_path=tmp_path, rank_env=rank_env)
    assert res.codes == [2, 2]
    assert "SGLANG_PP_LAYER_PARTITION" in res.ranks[1].stderr
    assert "rank 1 (node-b) could not derive the sweep" in res.ranks[0].stderr  # its rank and host
