"""How long a TCPStore client takes to connect when many connect at once: the start of a big torchrun job.

    python bench/connect_burst.py              # bursts of 16, 32, 64 and 96 clients, libuv server
    python bench/connect_burst.py --sizes 64 --classic

One process hosts a TCPStore (as torchrun's agent does); N forked children connect at the same instant
and each does one ``add``. Printed per burst: the slowest connect and how many took over a second. On
the 2-core development machine a burst of 32 stalls about half its clients for 5 s, 64 stall all of
them for up to 10 s, 96 for up to 15 s, with either server; clients that come spread out do not stall.
The cause: c10d looks up each new client socket's host name for its log lines (socket.cpp warns "The
hostname of the client socket cannot be retrieved. err=-3", EAI_AGAIN), a reverse DNS query per
connect, and a resolver that drops part of a burst answers after its 5 s retry (64 processes calling
getnameinfo at once reproduce it without torch). This is why each rank keeps one client of the store
(checker/distributed/group.py ``_wait_until_all_at_init``): a second one per rank doubled the burst of a
32-rank start and cost it about 5 s (bench/preflight_bench.py).
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from datetime import timedelta

import torch.distributed as dist


def burst(n: int, libuv: bool) -> list[float]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    timeout = timedelta(seconds=60)
    server = dist.TCPStore(  # noqa: F841 (kept alive: it serves the children)
        "127.0.0.1", port, n + 1, is_master=True, timeout=timeout, wait_for_workers=False, use_libuv=libuv
    )
    go = time.time() + 1.0  # every child connects at this instant
    r, w = os.pipe()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            while time.time() < go:
                time.sleep(0.001)
            t0 = time.time()
            client = dist.TCPStore("127.0.0.1", port, n + 1, is_master=False, timeout=timeout)
            client.add("came", 1)
            os.write(w, f"{time.time() - t0:.3f}\n".encode())
            os._exit(0)
        pids.append(pid)
    os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    return sorted(float(x) for x in b"".join(chunks).split())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 96])
    ap.add_argument("--classic", action="store_true", help="the non-libuv server")
    args = ap.parse_args()
    for n in args.sizes:
        took = burst(n, libuv=not args.classic)
        print(
            f"{n:3d} clients at once ({'classic' if args.classic else 'libuv'} server): slowest connect "
            f"{took[-1]:5.2f} s, over 1 s: {sum(t > 1 for t in took)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
