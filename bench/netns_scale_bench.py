"""Real ranks over network-namespace nodes: the preflight as a multi-node job runs it, with the checker's
own time per phase, and the bare torchrun job on the same nodes as the baseline.

    sudo python bench/netns_scale_bench.py                          # 8 nodes x 8 ranks, 1 round
    sudo python bench/netns_scale_bench.py --nodes 4 --nproc 2 --rounds 3

Each node is a Linux network namespace with its own address on one bridge (tests/netns.py, as the netns
tests use it), running ``launchers/torchrun.sh`` as a user would: NNODES, NODE_RANK, RDZV_ENDPOINT on
node 0, GLOO_SOCKET_IFNAME, and the layout ``--pp-size NODES --tp-size NPROC`` (pipeline stages across
nodes, tensor parallel inside one). Per round it runs the bare job (``bench/bare_allgather.py`` under the
same torchrun rendezvous) and the preflight, alternating which goes first, and reports:

- wall: from the first launcher started to the last one ended (the CI job's cost), for both;
- the publishing rank's own timings from the report: ``init_s`` (its start to every rank joined: mostly
  waiting for the slowest interpreter to import torch), ``derive_s`` (this rank's capacity),
  ``exchange_s`` (the two all-gathers over the bridge) and ``total_s`` (its start to the verdict);
- the checker's own time: ``total_s - init_s`` (derive, exchange, verdict, report).

Needs root and iproute2; 8 x 8 ranks need about 16 GiB (72 interpreters with torch imported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/netns.py: the namespaces the netns tests use

import netns  # noqa: E402


def _run_nodes(group: netns.NodePair, launch, timeout_s: float) -> float:
    """Start every node's launcher at once (``launch(index)`` starts one); wall seconds to the last end."""
    t0 = time.monotonic()
    agents = [launch(i) for i in range(len(group.nodes))]
    codes = [a.wait(timeout_s - (time.monotonic() - t0)) for a in agents]
    wall = max(a.elapsed_s for a in agents)
    bad = [(i, c) for i, c in enumerate(codes) if c != 0]
    if bad:
        i = bad[0][0]
        sys.exit(f"node {i} ended with {bad[0][1]}; its log:\n{agents[i].output()[-3000:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--nproc", type=int, default=8, help="ranks per node")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=600, help="bound on one job (all nodes)")
    args = ap.parse_args()
    reason = netns.unavailable_reason()
    if reason:
        print(f"netns_scale_bench: {reason}", file=sys.stderr)
        return 2
    world = args.nodes * args.nproc
    # Starting many interpreters on few cores takes a while: bounds well past it, so a slow start is
    # measured, not refused.
    checker_timeout = int(args.timeout_s * 0.6)
    bare_walls: list[float] = []
    check_walls: list[float] = []
    timings: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="netns-bench-") as tmp, netns.node_group(args.nodes) as group:
        out = Path(tmp)
        torchrun = [sys.executable, "-m", "torch.distributed.run"]

        def bare(index: int, round_: int) -> netns.Agent:
            node = group.nodes[index]
            cmd = [
                *node.exec_prefix(),
                *torchrun,
                f"--nnodes={args.nodes}",
                f"--nproc-per-node={args.nproc}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={group.endpoint}",
                f"--rdzv-id=bare-{round_}",
                f"--rdzv-conf=is_host={int(index == 0)},join_timeout={checker_timeout}",
                f"--local-addr={node.addr}",
                str(HERE / "bare_allgather.py"),
            ]
            return group.spawn(
                cmd, env=group.node_env(index), log=out / f"bare{round_}-node{index}.log", node=node
            )

        def check(index: int, round_: int) -> netns.Agent:
            report = out / f"report{round_}.json"
            logs = out / f"check{round_}"
            logs.mkdir(exist_ok=True)
            return group.launch(
                index,
                [
                    "--model",
                    "kimi-k3",
                    "--budget-gib",
                    "8",
                    "--pp-size",
                    str(args.nodes),
                    "--tp-size",
                    str(args.nproc),
                    "--timeout-s",
                    str(checker_timeout),
                    "--report",
                    str(report),
                ],
                log_dir=logs,
                nproc=args.nproc,
                rdzv_conf=f"join_timeout={checker_timeout}",
                env={"RDZV_ID": f"check-{round_}"},
            )

        for r in range(args.rounds):
            jobs = [("bare", bare, bare_walls), ("preflight", check, check_walls)]
            for name, launch, sink in jobs if r % 2 == 0 else jobs[::-1]:
                wall = _run_nodes(group, lambda i, launch=launch, r=r: launch(i, r), args.timeout_s)
                sink.append(wall)
                line = f"round {r + 1}: {name:9} {world} ranks on {args.nodes} nodes: {wall:6.2f} s"
                if name == "preflight":
                    doc = json.loads((out / f"report{r}.json").read_text())
                    t = {k: float(v) for k, v in doc.get("timings", {}).items()}
                    timings.append(t)
                    line += "  " + "  ".join(f"{k} {v:.3f}" for k, v in sorted(t.items()))
                print(line, flush=True)
    b, c = statistics.median(bare_walls), statistics.median(check_walls)

    def med(key: str) -> float:
        return statistics.median(t.get(key, float("nan")) for t in timings)

    own = statistics.median(t["total_s"] - t["init_s"] for t in timings)
    print()
    print(
        "| ranks | nodes | rounds | bare (s) | preflight (s) | ratio | init_s | derive_s | exchange_s | "
        "total_s | checker's own (total - init) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {world} | {args.nodes} | {args.rounds} | {b:.2f} | {c:.2f} | {c / b:.3f} | {med('init_s'):.2f} | "
        f"{med('derive_s') * 1000:.1f} ms | {med('exchange_s') * 1000:.1f} ms | {med('total_s'):.2f} | "
        f"{own * 1000:.0f} ms |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
