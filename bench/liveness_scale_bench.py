"""The checker's store traffic at 64 to 4,096 ranks, against a real TCPStore on this machine.

    python bench/liveness_scale_bench.py                        # 64 256 1024 4096 ranks
    python bench/liveness_scale_bench.py --ranks 1024 --procs 4 --wait-s 8

Ranks are lightweight clients, not torch processes: ``--procs`` worker processes, each holding
``ranks / procs`` real TCPStore client connections (one per simulated rank, as real ranks have), make
exactly the store calls a rank of the checker makes, through the checker's own functions where there
is one (:func:`checker.distributed.liveness.join`, :func:`checker.distributed.liveness.read`):

1. start-up: ``add arrivals``, ``join`` (a ``multi_set`` and an ``append``);
2. waiting (``--wait-s``): every rank's heartbeat (``add hb/<rank>`` every 0.25 s), every other
   rank's look for a published verdict (one ``check`` per second, ranks 2 and up), and the two
   watchers' reads of every rank's state (three round trips every 0.5 s, on ranks 0 and 1);
3. a loss: two ranks stop beating; the watcher's time to name them, from the last beat they made;
4. the exchange's steps (an ``add step/<rank>`` per collective, three of them) and the finish: rank 0
   claims the verdict and announces it, every other rank polls for the announcement (one ``check``
   every 50 ms, as :meth:`checker.distributed.session.Session.await_announcement` does) until all have
   seen it.

The store runs in its own process, so its CPU time over the waiting phase is its load. Not simulated:
gloo's own rendezvous through the store inside ``init_process_group`` (torch's cost, the same without
the checker) and the all-gathers themselves (they go over gloo's sockets, not the store).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PREFIX = "checker/0/"
BEAT_S = 0.25
ANNOUNCE_POLL_S = 1.0
FINISH_POLL_S = 0.05


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve() -> None:
    """The store process: a TCPStore master on a free port, printed on stdout; lives until killed."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=timedelta(seconds=300))
    print(store.port, flush=True)
    while True:
        time.sleep(3600)


def worker(port: int, first: int, count: int, world: int, conns_per_proc: int) -> None:
    """``count`` simulated ranks from ``first``; a JSON line of what it measured on stdout."""
    import torch.distributed as dist

    from checker.distributed import liveness

    def client() -> dist.Store:
        base = dist.TCPStore(
            "127.0.0.1", port, world, False, wait_for_workers=False, timeout=timedelta(seconds=120)
        )
        return dist.PrefixStore(PREFIX, base)

    ctl = client()
    # The store accepts one connection at a time, and on this machine each accept waits about 0.17 s
    # for a reverse name lookup that cannot succeed (no DNS): 4,096 connections would take 12 min to
    # open. Past --conns-per-proc, simulated ranks share connections (the store's work per call is the
    # same; only its number of open sockets is smaller than a real world's).
    conns = [client() for _ in range(min(count, conns_per_proc))]
    stores = {r: conns[i % len(conns)] for i, r in enumerate(range(first, first + count))}
    ops = 0
    t0 = time.monotonic()
    for r, s in stores.items():
        s.add("arrivals", 1)
        liveness.join(s, r)
        ops += 3
    joined_s = time.monotonic() - t0
    ctl.add("bench/ready", 1)
    ctl.wait(["bench/go"])
    lost: set[int] = set()
    round_s: list[float] = []
    beat_ops = 0
    last_beat: dict[int, float] = {}
    n = 0
    wait_t0 = time.monotonic()
    while not ctl.check(["bench/finish"]):
        start = time.monotonic()
        if ctl.check(["bench/lost"]):
            lost = {int(x) for x in ctl.get("bench/lost").decode().split(",")}
        for r, s in stores.items():
            if r not in lost:
                s.add(f"hb/{r}", 1)
                last_beat[r] = time.monotonic()
                beat_ops += 1
            if n % round(ANNOUNCE_POLL_S / BEAT_S) == 0 and r >= 2:
                s.check(["report_written"])
                beat_ops += 1
        n += 1
        took = time.monotonic() - start
        round_s.append(took)
        time.sleep(max(0.0, BEAT_S - took))
    wait_s = time.monotonic() - wait_t0
    # The exchange's steps, then waiting for the announcement.
    for r, s in stores.items():
        for _ in range(3):
            s.add(f"step/{r}", 1)
    ctl.add("bench/stepped", 1)
    waiting = {r for r in stores if r != 0}
    finish_ops = 0
    seen_at: list[float] = []
    t_fin = time.monotonic()
    while waiting and time.monotonic() - t_fin < 120:
        for r in list(waiting):
            finish_ops += 1
            if stores[r].check(["report_written"]):
                waiting.discard(r)
                seen_at.append(time.time())
        time.sleep(FINISH_POLL_S)
    print(
        json.dumps(
            {
                "joined_s": joined_s,
                "beat_ops": beat_ops,
                "wait_s": wait_s,
                "round_max_s": max(round_s) if round_s else 0.0,
                "round_med_s": statistics.median(round_s) if round_s else 0.0,
                "last_beat": {str(r): t - wait_t0 for r, t in last_beat.items() if r in lost},
                "wait_t0_wall": time.time() - (time.monotonic() - wait_t0),
                "finish_ops": finish_ops,
                "last_seen_wall": max(seen_at) if seen_at else None,
                "unseen": len(waiting),
            }
        ),
        flush=True,
    )


def one_size(world: int, procs: int, wait_s: float, conns_per_proc: int) -> dict:
    import torch.distributed as dist

    from checker.distributed import liveness

    # stderr: torch warns once per client connection that it cannot resolve the client's hostname.
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    workers: list[subprocess.Popen] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        base = dist.TCPStore("127.0.0.1", port, world, False, wait_for_workers=False)
        store = dist.PrefixStore(PREFIX, base)
        per = -(-world // procs)
        for p in range(procs):
            first, count = p * per, min(per, world - p * per)
            if count <= 0:
                continue
            workers.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker"]
                    + [str(x) for x in (port, first, count, world, conns_per_proc)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            )
        t0 = time.monotonic()
        while int(store.add("bench/ready", 0)) < len(workers):
            if time.monotonic() - t0 > 300:
                raise RuntimeError("workers did not start")
            time.sleep(0.05)
        start_up_s = time.monotonic() - t0
        store.set("bench/go", "1")
        # The watchers (ranks 0 and 1), as the checker's: read every POLL_S, judge staleness.
        reads: list[float] = []
        staleness = liveness.Staleness()
        named: dict[int, float] = {}
        cpu0, t_cpu0 = _cpu_s(server.pid), time.monotonic()
        lost = [world - 1, world // 2]
        lost_set_at = None
        t_wait = time.monotonic()
        while True:
            now = time.monotonic()
            if lost_set_at is None and now - t_wait >= wait_s:
                cpu_wait = (_cpu_s(server.pid) - cpu0) / (now - t_cpu0)
                store.set("bench/lost", ",".join(map(str, lost)))
                lost_set_at = time.time()
            for _ in range(2):  # two watchers, one read each
                r0 = time.monotonic()
                snap = liveness.read(store, world, seconds=30)
                reads.append(time.monotonic() - r0)
                assert snap is not None and len(snap.joined) == world
            for r in staleness.observe(snap, time.monotonic()):
                named.setdefault(r, time.time())
            if lost_set_at is not None and all(r in named for r in lost):
                break
            if lost_set_at is not None and time.time() - lost_set_at > 30:
                break
            time.sleep(max(0.0, 0.5 - (time.monotonic() - now)))
        store.set("bench/finish", "1")
        while int(store.add("bench/stepped", 0)) < len(workers):
            time.sleep(0.02)
        claim = int(store.add(liveness.PUBLISHER, 1))
        announced_at = time.time()
        store.set("report_written", "0\nchecker: consistent")
        results = [json.loads(w.communicate(timeout=180)[0].splitlines()[-1]) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        server.kill()
        server.wait(10)
    beat_ops = sum(r["beat_ops"] for r in results)
    waited = statistics.median(r["wait_s"] for r in results)
    last_beat_wall = {}
    for r in results:
        for rank, t in r["last_beat"].items():
            last_beat_wall[int(rank)] = r["wait_t0_wall"] + t
    to_name = [named[r] - last_beat_wall[r] for r in lost if r in named and r in last_beat_wall]
    seen = [r["last_seen_wall"] for r in results if r["last_seen_wall"] is not None]
    watcher_reads_per_s = 2 / 0.5
    return {
        "ranks": world,
        "start_up_s": start_up_s,
        "join_s": max(r["joined_s"] for r in results),
        "ops_per_s": beat_ops / waited + watcher_reads_per_s * 3,
        "keys_read_per_s": watcher_reads_per_s * (world + 2),  # joined + marks + one beat per rank
        "store_cpu": cpu_wait,
        "round_max_s": max(r["round_max_s"] for r in results),
        "read_med_ms": 1000 * statistics.median(reads),
        "read_max_ms": 1000 * max(reads),
        "named_s": max(to_name) if len(to_name) == len(lost) else None,
        "announce_wave_s": (max(seen) - announced_at) if seen else None,
        "unseen": sum(r["unseen"] for r in results),
        "claimed_first": claim == 1,
        "connections": sum(min(-(-world // procs), conns_per_proc) for _ in workers) + 1,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve()
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*(int(x) for x in sys.argv[2:7]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--procs", type=int, default=4, help="worker processes holding the simulated ranks")
    ap.add_argument("--wait-s", type=float, default=8.0, help="seconds of steady waiting measured")
    ap.add_argument("--conns-per-proc", type=int, default=64, help="store connections per worker process")
    args = ap.parse_args()
    rows = []
    for n in args.ranks:
        row = one_size(n, min(args.procs, n), args.wait_s, args.conns_per_proc)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print(
        "| ranks | connections | join (s) | store ops/s | keys read/s | store CPU | slowest beat round (s) | "
        "read, median / max (ms) | loss named after (s) | announcement seen by all (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        named = f"{r['named_s']:.2f}" if r["named_s"] is not None else "not named"
        wave = f"{r['announce_wave_s']:.2f}" if r["announce_wave_s"] is not None else "-"
        print(
            f"| {r['ranks']} | {r['connections']} | {r['join_s']:.2f} | {r['ops_per_s']:,.0f} | "
            f"{r['keys_read_per_s']:,.0f} | "
            f"{100 * r['store_cpu']:.0f}% | {r['round_max_s']:.2f} | "
            f"{r['read_med_ms']:.1f} / {r['read_max_ms']:.1f} | {named} | {wave} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
