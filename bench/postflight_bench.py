"""The post-flight on very large server logs: time and peak memory against the log's size.

    python bench/postflight_bench.py                 # 0.2 GiB and 2 GiB logs, 3 rounds each
    python bench/postflight_bench.py --gib 0.5 --rounds 1 --keep /tmp/logs

Each log is what a long-running server leaves: the start of 64 ranks (pp 8 x tp 8, every rank's
``Load weight begin.``, ``Load weight end.``, ``Mamba Cache is allocated.`` lines and each stage's
summary, rendered from SGLang 0.5.23's own format strings) at its head, a restart of every rank in its
middle, then serving noise to the size asked for: decode and prefill batch lines of every rank, HTTP
access lines, a progress bar glued by ``\\r``, a container runtime's prefix on every line. The checker
runs as a user runs it (``python -m checker postflight --report preflight.json LOG --quiet``, a fresh
process, the log in the page cache after a first untimed ``cat``); its wall time and its peak RSS
(``os.wait4``'s ``ru_maxrss``) are the median of the rounds. ``cat LOG > /dev/null`` and ``wc -l`` on the
same log give the floor a reader of the file cannot beat. Peak RSS that stays the same from 0.2 to
2 GiB is the bounded memory the reader promises (8 MiB chunks; checker/postflight/reader.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from postflight_logs import ServerLog, preflight_report  # noqa: E402

STAMP = "2026-01-01T10:00:00.123456789+02:00 stderr F "


def noise_block(pp: int, tp: int, target: int = 1 << 20) -> bytes:
    """About ``target`` bytes of what a serving server logs, for every rank, with the runtime prefix."""
    lines = []
    i = 0
    while sum(map(len, lines)) < target:
        p, t = i % pp, (i // pp) % tp
        lines.append(
            f"{STAMP}[2026-01-01 10:{i % 60:02d}:00 PP{p} TP{t}] Decode batch. #running-req: {i % 18}, "
            f"#token: {1000 + i}, token usage: 0.{i % 100:02d}, cuda graph: True, gen throughput (token/s): "
            f"{1000 + i % 997}.12, #queue-req: 0\n"
        )
        if i % 7 == 0:
            lines.append(
                f"{STAMP}[2026-01-01 10:{i % 60:02d}:00 PP{p} TP{t}] Prefill batch. #new-seq: 1, #new-token: "
                f"{i % 4096}, #cached-token: 0, token usage: 0.01, #running-req: 3, #queue-req: 0\n"
            )
        if i % 11 == 0:
            lines.append(
                f"{STAMP}[2026-01-01 10:00:00] INFO:     10.0.0.{i % 255}:5{i % 999:03d} - "
                '"POST /generate HTTP/1.1" 200 OK\n'
            )
        if i % 101 == 0:
            lines.append(
                f"{STAMP}Capturing batches (bs=4 avail_mem=20.00 GB):  40%|####      | 2/5 [00:01<00:01]\r"
            )
        i += 1
    return "".join(lines).encode()


def write_log(path: Path, size: int, report: dict) -> int:
    """The log, ``size`` bytes or a little more; returns its size."""
    start = ServerLog(report).text()
    restart = "\n".join(
        line for rank in report["ranks"] for line in ServerLog(report).lines(rank, created=1_767_229_200.0)
    )
    head = "".join(f"{STAMP}{line}\n" for line in start.splitlines()).encode()
    middle = "".join(f"{STAMP}{line}\n" for line in restart.splitlines()).encode()
    block = noise_block(report["layout"]["pp_size"], report["layout"]["tp_size"])
    with open(path, "wb") as f:
        f.write(head)
        written = len(head)
        while written < size:
            if middle and written >= size // 2:
                f.write(middle)
                written += len(middle)
                middle = b""
            f.write(block)
            written += len(block)
    return written


def count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += chunk.count(b"\n")
    return n


def run_once(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int]:
    """(wall s, peak RSS bytes, exit code) of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss * 1024, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, action="append", help="log sizes in GiB (default 0.2 and 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the logs here and keep them (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = args.gib or [0.2, 2.0]
    work = args.keep or Path(tempfile.mkdtemp(prefix="postflight-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    report = preflight_report(64, sizing={"tp_size": 8}, per_node=8)
    report_path = work / "preflight.json"
    report_path.write_text(json.dumps(report))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows = []
    for gib in sizes:
        log = work / f"server-{gib:g}GiB.log"
        t0 = time.perf_counter()
        size = write_log(log, int(gib * 2**30), report)
        lines = count_lines(log)
        print(
            f"wrote {log} ({size / 2**30:.2f} GiB, {lines:,} lines) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        checker = [
            sys.executable,
            "-m",
            "checker",
            "postflight",
            "--report",
            str(report_path),
            str(log),
            "--quiet",
        ]
        measures: dict[str, list[tuple[float, int, int]]] = {"checker": [], "cat": [], "wc -l": []}
        for _ in range(args.rounds):
            measures["checker"].append(run_once(checker, env))
            measures["cat"].append(run_once(["sh", "-c", f"cat '{log}' > /dev/null"]))
            measures["wc -l"].append(run_once(["wc", "-l", str(log)]))
        codes = {c for _, _, c in measures["checker"]}
        if codes != {0}:
            raise SystemExit(f"the checker exited {codes} on {log} (expected 0: consistent)")
        row = {"gib": round(size / 2**30, 2), "lines": lines}
        for name, ms in measures.items():
            row[f"{name} s"] = round(statistics.median(w for w, _, _ in ms), 2)
        row["checker MB/s"] = round(size / 1e6 / row["checker s"], 0)
        row["checker peak RSS MiB"] = round(
            statistics.median(r for _, r, _ in measures["checker"]) / 2**20, 1
        )
        rows.append(row)
        if not args.keep:
            log.unlink()
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; median of {args.rounds} round(s)")
    headers = list(rows[0])
    print("  ".join(f"{h:>20}" for h in headers))
    for row in rows:
        print(
            "  ".join(
                f"{row[h]:>20,}" if isinstance(row[h], (int, float)) else f"{row[h]:>20}" for h in headers
            )
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
