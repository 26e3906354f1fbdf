"""Launch a real world of checker ranks as subprocesses that meet through a FileStore (no ports).

Not a test module: imported by the distributed tests (``pythonpath = ["tests"]`` in pyproject).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# Torch prints thread warnings and OMP messages per process; one thread per rank keeps 2 cores usable.
BASE_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class RankResult:
    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    elapsed_s: float


@dataclass
class WorldResult:
    ranks: list[RankResult]
    report_path: Path

    @property
    def codes(self) -> list[int | None]:
        return [r.returncode for r in self.ranks]

    def report(self) -> dict:
        return json.loads(self.report_path.read_text())


def run_world(
    argv: list[str],
    *,
    world_size: int,
    tmp_path: Path,
    rank_env: dict[int, dict[str, str]] | None = None,
    launch: set[int] | None = None,
    kill_after_s: float = 90.0,
    env: dict[str, str] | None = None,
    init_method: str | None = None,
    rank_argv: dict[int, list[str]] | None = None,
) -> WorldResult:
    """Run ``python -m checker <argv>`` as ``world_size`` ranks; ``launch`` limits which ranks start,
    ``rank_argv`` gives some ranks another command line (a node started differently).

    Ranks that outlive ``kill_after_s`` are killed and get returncode None: a test asserting exit codes
    then fails instead of hanging.
    """
    store = tmp_path / f"store-{time.monotonic_ns()}"
    report = tmp_path / f"report-{store.name}.json"
    procs: dict[int, tuple[subprocess.Popen, float]] = {}
    for rank in sorted(launch if launch is not None else range(world_size)):
        e = {**os.environ, **BASE_ENV, **(env or {})}
        e.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            GROUP_RANK="0",
        )
        for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"):
            e.pop(key, None)
        e.update((rank_env or {}).get(rank, {}))
        words = (rank_argv or {}).get(rank, argv)
        # Our flags go before a launch command's `--`, which takes everything after it.
        cut = words.index("--") if "--" in words else len(words)
        cmd = [
            sys.executable,
            "-m",
            "checker",
            *words[:cut],
            "--init-method",
            init_method or f"file://{store}",
            "--report",
            str(report),
            *words[cut:],
        ]
        procs[rank] = (
            subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            time.monotonic(),
        )
    deadline = time.monotonic() + kill_after_s
    results = []
    for rank, (p, started) in procs.items():
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            code = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate(timeout=10)
            code = None
        results.append(RankResult(rank, code, out, err, time.monotonic() - started))
    return WorldResult(results, report)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


requires_gpu = pytest.mark.skipif(
    not cuda_available(),
    reason="no CUDA GPU on this machine: the NCCL path runs in bench/gpu_check.sh on a GPU host",
)
