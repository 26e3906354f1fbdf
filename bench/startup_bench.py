"""Start-up cost of the command line: wall time of fresh ``python -m checker`` processes, per command.

    python bench/startup_bench.py                 # this tree (the directory above bench/)
    python bench/startup_bench.py --root /other/checkout --runs 21

For each command it starts ``--runs`` fresh interpreters running ``python -m checker <command> --help``
(the parser and the command's module, what a usage error also costs) and one ``derive`` of the default
model (a full single-process run), with ``PYTHONPATH`` at the tree, and prints the median and the best
wall time, the number of checker modules the process imported, and whether torch was imported (it must
not be for any of these). issue 28's function-level imports are kept only where this shows a cost.

    python bench/startup_bench.py --deferred      # what each function-level import would cost at start-up

``--deferred`` lists every import of a checker module inside a function (tests/test_layers.py finds them)
with what importing its target costs on top of the entry point and the importing module, best of
``--runs`` fresh processes: milliseconds, modules added, and whether torch or sglang came with it. The
comment beside each such import quotes this figure.
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


DEFERRED = """
import sys, time, importlib
import checker.cli.main, {host}
before = set(sys.modules)
start = time.perf_counter()
importlib.import_module({target!r})
took = time.perf_counter() - start
print(round(took * 1000, 1), len(set(sys.modules) - before), 'torch' in sys.modules, 'sglang' in sys.modules)
"""


def deferred(root: str, runs: int) -> None:
    sys.path.insert(0, str(Path(root) / "tests"))
    from test_layers import imports  # the same walk the layer test makes

    env = {**os.environ, "PYTHONPATH": root}
    seen: set[tuple[str, str]] = set()
    for imp in imports(Path(root)):
        host = imp.path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        if not imp.in_function or (host, imp.target) in seen:
            continue
        seen.add((host, imp.target))
        best = None
        for _ in range(runs):
            code = DEFERRED.format(host=host, target=imp.target)
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
            )
            ms, modules, torch, sglang = out.stdout.split()
            best = min(best or (float(ms), modules, torch, sglang), (float(ms), modules, torch, sglang))
        assert best is not None
        ms, modules, torch, sglang = best
        where = f"{imp.path}:{imp.line} {imp.target}"
        print(f"{where}: {ms} ms, {modules} modules, torch {torch}, sglang {sglang}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--deferred", action="store_true", help="the cost of each function-level import")
    args = parser.parse_args()
    if args.deferred:
        deferred(args.root, min(args.runs, 5))
        return 0
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
