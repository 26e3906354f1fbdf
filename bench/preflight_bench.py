"""Wall time of the preflight against a bare torchrun gloo job, side by side, alternating.

    python bench/preflight_bench.py                 # 2, 4, 8 and 32 ranks, 5 rounds each
    python bench/preflight_bench.py --ranks 8 --rounds 3
    python bench/preflight_bench.py --ranks 8 --against /tmp/base   # also another checkout's preflight

Each round runs the bare job (bench/bare_allgather.py: init gloo, all-gather one int64, exit) and the
preflight (``torchrun --standalone --nproc-per-node N -m checker``) back to back, alternating which goes
first, so drift in machine load hits both alike. Reported: median wall seconds of each and their ratio
(target: preflight <= 1.10 x bare). ``--against DIR`` times a third command in each round, the
preflight of the checkout in DIR (``PYTHONPATH=DIR``): a change's own cost, measured under the same
load as the change, whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def wall(cmd: list[str], timeout_s: float, tree: Path | None = None) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(tree or HERE.parent)
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout_s,
        env=env,
        # `-m checker` puts the working directory first on sys.path, ahead of PYTHONPATH: run in the tree.
        cwd=tree or HERE.parent,
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-800:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--against", type=Path, help="another checkout whose preflight is timed too")
    args = ap.parse_args()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    rows = []
    for n in args.ranks:
        bare_cmd = [*torchrun, f"--nproc-per-node={n}", str(HERE / "bare_allgather.py")]
        check_cmd = [
            *torchrun,
            f"--nproc-per-node={n}",
            "-m",
            "checker",
            "--model",
            "kimi-k3",
            "--budget-gib",
            "8",
            "--pp-size",
            "1" if n == 1 else str(n if n <= 93 else 1),
            *(["--allow-single-rank"] if n == 1 else []),
        ]
        bare: list[float] = []
        check: list[float] = []
        other: list[float] = []
        for i in range(args.rounds):
            order = [(bare_cmd, bare, None), (check_cmd, check, None)]
            if args.against is not None:
                order.append((check_cmd, other, args.against))
            for cmd, sink, tree in order if i % 2 == 0 else order[::-1]:
                sink.append(wall(cmd, args.timeout_s, tree))
        b, c = statistics.median(bare), statistics.median(check)
        rows.append((n, b, c, c / b))
        print(
            f"ranks {n:>3}: bare {b:6.2f} s  preflight {c:6.2f} s  ratio {c / b:5.3f}  "
            f"(bare {[round(x, 2) for x in bare]}, preflight {[round(x, 2) for x in check]})",
            flush=True,
        )
        if other:
            o = statistics.median(other)
            print(
                f"ranks {n:>3}: {args.against} preflight {o:6.2f} s  ratio {o / b:5.3f}; this checkout / "
                f"that one {c / o:5.3f}  ({[round(x, 2) for x in other]})",
                flush=True,
            )
    print()
    print("| ranks | bare torchrun + gloo all-gather (s) | preflight (s) | ratio |")
    print("|---|---|---|---|")
    for n, b, c, r in rows:
        print(f"| {n} | {b:.2f} | {c:.2f} | {r:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
