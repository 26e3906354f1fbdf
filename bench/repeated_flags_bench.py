"""How long the checker's own command line takes against the number of options: linear, where argparse
alone is quadratic (issue 27 item 6: `--budget-gib` repeated 20,000 times took 10.9 s).

    python bench/repeated_flags_bench.py                  # this tree
    python bench/repeated_flags_bench.py --tree /path      # another checkout (e.g. main), to compare

For each n it runs ``python -m checker derive --model kimi-k3`` followed by n repetitions of
``--budget-gib 8`` in a fresh process (the whole entry point: parse, the "given" flags' second parse,
the derivation and the table; best of three), with PYTHONPATH set to the tree measured. n = 0 is the
cost of everything but the repeats. Doubling n should double the repeats' share (linear) where it used
to quadruple it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

SIZES = (0, 5_000, 10_000, 20_000)


def run_once(tree: Path, n: int) -> float:
    argv = [sys.executable, "-m", "checker", "derive", "--model", "kimi-k3", *["--budget-gib", "8"] * n]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=tree)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"n={n}: exit {proc.returncode}: {proc.stderr[-300:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"tree {args.tree}")
    print(f"{'n':>7}  {'best s':>7}")
    for n in SIZES:
        best = min(run_once(args.tree, n) for _ in range(args.repeat))
        print(f"{n:>7,}  {best:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
