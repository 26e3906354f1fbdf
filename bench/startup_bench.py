"""Start-up cost of the command line: wall time of fresh ``python -m checker`` processes, per command.

    python bench/startup_bench.py                 # this tree (the directory above bench/)
    python bench/startup_bench.py --root /other/checkout --runs 21

For each command it starts ``--runs`` fresh interpreters running ``python -m checker <command> --help``
(the parser and the command's module, what a usage error also costs) and one ``derive`` of the default
model (a full single-process run), with ``PYTHONPATH`` at the tree, and prints the median and the best
wall time, the number of checker modules the process imported, and whether torch was imported (it must
not be for any of these). issue 28's function-level imports are kept only where this shows a cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = (
    ("derive --help", ["derive", "--help"]),
    ("check --help", ["check", "--help"]),
    ("plan --help", ["plan", "--help"]),
    ("sweep --help", ["sweep", "--help"]),
    ("postflight --help", ["postflight", "--help"]),
    ("derive (default model)", ["derive", "--pp-size", "2"]),
)
PROBE = (
    "import runpy, sys\n"
    "sys.argv = ['checker', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('checker', run_name='__main__')\n"
    "except SystemExit:\n    pass\n"
    "mods = [m for m in sys.modules if m == 'checker' or m.startswith('checker.')]\n"
    "print(len(mods), 'torch' in sys.modules, file=sys.stderr)\n"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": args.root}
    print(f"{'command':24} {'median s':>9} {'best s':>7} {'modules':>8} torch")
    for label, argv in CASES:
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "checker", *argv],
                env=env,
                cwd=args.root,
                capture_output=True,
                text=True,
                timeout=120,
            )
            times.append(time.perf_counter() - start)
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, *argv],
            env=env,
            cwd=args.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        modules, torch = probe.stderr.strip().splitlines()[-1].split()
        print(f"{label:24} {statistics.median(times):9.3f} {min(times):7.3f} {modules:>8} {torch}")
        if proc.returncode not in (0,):
            print(f"  (exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
