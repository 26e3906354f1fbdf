"""Budgets per second of a sweep: the vectorised torch derivation against the scalar core, side by side.

    python bench/sweep_bench.py                          # 145 and 100,000 budgets, kimi-k3, pp 8, r 0.5
    python bench/sweep_bench.py --sizes 145 10000 1000000 --scalar-sample 500
    python bench/sweep_bench.py --cli                    # also time the whole command, 145 vs 100,000
    python bench/sweep_bench.py --torchrun 8             # and the distributed sweep on 8 gloo ranks

The scalar core takes about a microsecond-scale Python call per budget per stage per policy, so it is
timed on an evenly spaced subsample and extrapolated linearly to the full grid (and labelled so); the
subsample is also checked to agree exactly with the vectorised result. Both paths derive every stage
(pp_rank 0..P-1) for every policy, as the single-process ``checker sweep`` does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from checker.core.sizing.sizing import POLICIES, CapacityInputs
from checker.core.sizing.sweep import scalar_sweep
from checker.device.sweep import analyse, local_sweep
from checker.families.geometry import load_geometry

REPO_ROOT = Path(__file__).resolve().parent.parent
CLI_TIMEOUT_S = 300


def best_of(repeats: int, fn) -> float:  # noqa: ANN001 - any zero-argument callable
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_size(n: int, inputs_by_policy: dict[str, CapacityInputs], pp: int, sample: int) -> list[str]:
    budgets = torch.linspace(4.0, 40.0, n, dtype=torch.float64)
    as_list = budgets.tolist()
    policies = list(inputs_by_policy)

    def vectorised() -> dict:
        stack = torch.stack([local_sweep(inputs_by_policy, k, budgets) for k in range(pp)])
        return analyse(stack, as_list, policies)

    t_vec = best_of(3, vectorised)
    stride = max(1, n // sample)
    sub = as_list[::stride]
    stack_sub = torch.stack([local_sweep(inputs_by_policy, k, sub) for k in range(pp)]).tolist()

    def scalar() -> None:
        for k in range(pp):
            for p, inp in enumerate(inputs_by_policy.values()):
                got = scalar_sweep(inp, k, sub)
                assert [list(t) for t in got] == stack_sub[k][p], "vectorised and scalar disagree"

    t_sub = best_of(1, scalar)
    t_scalar = t_sub * n / len(sub)
    note = "measured" if len(sub) == n else f"extrapolated from {len(sub):,}"
    return [
        f"{n:,}",
        f"{t_vec * 1e3:,.1f}",
        f"{n / t_vec:,.0f}",
        f"{t_scalar * 1e3:,.1f}",
        f"{n / t_scalar:,.0f}",
        note,
        f"{t_scalar / t_vec:,.0f}x",
    ]


def bench_cli(grids: list[str], ranks: int = 0) -> list[str]:
    """Wall time of the whole command; ``ranks`` > 0 runs it under torchrun, one stage per rank."""
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for grid in grids:
            launch = (
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
                if ranks
                else [sys.executable]
            )
            cmd = [
                *launch,
                "-m",
                "checker",
                "sweep",
                "--budgets",
                grid,
                "--model",
                "kimi-k3",
                "--pp-size",
                str(ranks or 8),
                "--mamba-full-memory-ratio",
                "0.5",
                "--no-progress",
                "--report",
                os.path.join(tmp, "r.json"),
                "--plot",
                os.path.join(tmp, "p.png"),
            ]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
            wall = time.perf_counter() - t0
            if proc.returncode not in (0, 1):
                raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
            n = proc.stdout.split("budgets (of ", 1)[1].split(")", 1)[0]
            where = f"torchrun {ranks} ranks" if ranks else "one process"
            lines.append(
                f"  checker sweep --budgets {grid:<14} ({n} budgets, report + plot, {where}): "
                f"{wall:.2f} s wall"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[145, 100_000], help="budgets per sweep")
    parser.add_argument(
        "--scalar-sample", type=int, default=2_000, help="budgets the scalar core is timed on (default 2,000)"
    )
    parser.add_argument("--pp-size", type=int, default=8)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1, what checker sweep uses on CPU)",
    )
    parser.add_argument("--cli", action="store_true", help="also time the whole command end to end")
    parser.add_argument(
        "--torchrun",
        type=int,
        default=0,
        metavar="N",
        help="also time the distributed sweep on N gloo ranks (145 vs 100,001 budgets)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    g = load_geometry(model="kimi-k3")
    inputs_by_policy = {
        p: CapacityInputs(
            geometry=g, budget_gib=8.0, pp_size=args.pp_size, policy=p, mamba_full_memory_ratio=0.5
        )
        for p in POLICIES
    }
    print(
        f"kimi-k3, pp {args.pp_size}, r 0.5, {len(POLICIES)} policies, every stage in one process; "
        f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs"
    )
    print(
        "vectorised = local_sweep for every stage + analyse; scalar = checker.core.sizing.sweep.scalar_sweep"
    )
    headers = ["budgets", "vectorised ms", "budgets/s", "scalar ms", "budgets/s", "scalar timing", "speed-up"]
    rows = [headers] + [bench_size(n, inputs_by_policy, args.pp_size, args.scalar_sample) for n in args.sizes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    if args.cli:
        print("end to end (python -m checker sweep, one process, includes torch and matplotlib imports):")
        print("\n".join(bench_cli(["4:40:0.25", "4:40:0.00036"])))
    if args.torchrun:
        print(
            f"end to end under torchrun ({args.torchrun} gloo ranks, each derives its own stage, one gather):"
        )
        print("\n".join(bench_cli(["4:40:0.25", "4:40:0.00036"], ranks=args.torchrun)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
