"""Wall time of the preflight against a bare torchrun gloo job, side by side, alternating.

    python bench/preflight_bench.py                 # 2, 4, 8 and 32 ranks, 5 rounds each
    python bench/preflight_bench.py --ranks 8 --rounds 3
    python bench/preflight_bench.py --ranks 8 --against /tmp/base   # also another checkout's preflight

Each round runs the bare job (bench/bare_allgather.py: init gloo, all-gather one int64, exit) and the
preflight (``torchrun --standalone --nproc-per-node N -m checker``) back to back, alternating which goes
first, so drift in machine load hits both alike. Reported: median wall seconds of each, the median of
the rounds' ratios (preflight / bare of the same round: the headline, free of drift between rounds)
and the ratio of the medians (target: <= 1.05 at 2, 4 and 8 ranks, <= 1.10 at 32). ``--against DIR``
times a third command in each round, the preflight of the checkout in DIR (run there, with
``PYTHONPATH=DIR``): a change's own cost, measured under the same load as the change, whatever else the
machine is doing. Each checkout's bytecode is compiled first (``compileall``), as ``pip install`` does:
without it every rank compiles each module it imports from source (+0.45 s of CPU a rank where
PYTHONDONTWRITEBYTECODE is set, as on the development machine), a cost no installed checker pays.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def wall(cmd: list[str], timeout_s: float, tree: Path | None = None, cpu: list[float] | None = None) -> float:
    """The job's wall seconds; ``cpu`` gets the CPU seconds (user + system) of every process it ran,
    torchrun's agent included: what the job cost the machine, which drifts less than its wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(tree or HERE.parent)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
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
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
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
    for tree in (HERE.parent, args.against):
        if tree is not None:
            compileall.compile_dir(str(tree / "checker"), quiet=1)
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
        # Per job kind ("other": --against's tree): wall seconds and CPU seconds, one entry a round.
        walls: dict[str, list[float]] = {"bare": [], "check": [], "other": []}
        cpu: dict[str, list[float]] = {"bare": [], "check": [], "other": []}
        for i in range(args.rounds):
            order = [(bare_cmd, None, "bare"), (check_cmd, None, "check")]
            if args.against is not None:
                order.append((check_cmd, args.against, "other"))
            for cmd, tree, name in order if i % 2 == 0 else order[::-1]:
                walls[name].append(wall(cmd, args.timeout_s, tree, cpu[name]))
        bare, check, other = walls["bare"], walls["check"], walls["other"]
        b, c = statistics.median(bare), statistics.median(check)
        # Each round's two jobs ran back to back: their ratio is free of the machine's drift between
        # rounds (a 4-rank bare job went from 11.5 s to 8.3 s within one series), which the ratio of
        # the medians is not. Both are reported; the pairs' median is the headline.
        pairs = statistics.median(x / y for x, y in zip(check, bare, strict=True))
        rows.append((n, b, c, c / b, pairs))
        print(
            f"ranks {n:>3}: bare {b:6.2f} s  preflight {c:6.2f} s  median of pair ratios {pairs:5.3f}  "
            f"ratio of medians {c / b:5.3f}  "
            f"(bare {[round(x, 2) for x in bare]}, preflight {[round(x, 2) for x in check]})",
            flush=True,
        )
        cb, cc = statistics.median(cpu["bare"]), statistics.median(cpu["check"])
        print(
            f"ranks {n:>3}: CPU seconds per job (every process): bare {cb:6.2f}  preflight {cc:6.2f}  "
            f"ratio {cc / cb:5.3f}; extra per rank {(cc - cb) / n * 1000:+.0f} ms",
            flush=True,
        )
        if other:
            o = statistics.median(other)
            print(
                f"ranks {n:>3}: {args.against} preflight {o:6.2f} s  ratio {o / b:5.3f}; this checkout / "
                f"that one {c / o:5.3f}  ({[round(x, 2) for x in other]})",
                flush=True,
            )
            # CPU seconds do not drift with the machine's load as wall seconds do: the change's own cost.
            co = statistics.median(cpu["other"])
            print(
                f"ranks {n:>3}: CPU seconds per job: {args.against} preflight {co:6.2f}; this checkout "
                f"{(cc - co) / n * 1000:+.0f} ms per rank against it",
                flush=True,
            )
    print()
    print(
        "| ranks | bare torchrun + gloo all-gather (s) | preflight (s) | median of pair ratios "
        "| ratio of medians |"
    )
    print("|---|---|---|---|---|")
    for n, b, c, r, pairs in rows:
        print(f"| {n} | {b:.2f} | {c:.2f} | {pairs:.3f} | {r:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
