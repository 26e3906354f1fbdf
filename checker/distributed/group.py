"""Process-group lifecycle with bounded waits: the store, init, the int64 all-gather, liveness keys.

Every wait here has a timeout. Failures become :class:`InfrastructureFailure`, which the check turns
into the ``infrastructure_failure`` verdict instead of a traceback or a hang.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from checker.core.errors import FlagError
from checker.distributed.launch_env import RankEnv
from checker.distributed.liveness import Heartbeat, join
from checker.distributed.liveness import Store as LivenessStore


class InfrastructureFailure(RuntimeError):
    """The process group could not be formed or a collective failed: a lost, hung or unreachable rank."""

    def __init__(self, phase: str, detail: str, *, timed_out: bool = True) -> None:
        super().__init__(f"{phase}: {detail}")
        self.phase = phase
        self.detail = detail
        self.timed_out = timed_out
        """The wait ran out its time (a rank never came), rather than failing at once because a peer
        dropped out (then a rank still behind is merely slower, not hung)."""


class StaleStore(FlagError):
    """The rendezvous store was used by an earlier run: the user's to fix (a fresh path)."""


BACKENDS = ("auto", "gloo", "nccl")


def resolve_backend(requested: str) -> str:
    if requested not in BACKENDS:  # a refused rank's --backend as typed, which its parser refused
        raise FlagError(f"--backend {requested!r} is none of {', '.join(BACKENDS)}")
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise FlagError("--backend nccl needs a CUDA GPU and this rank sees none; use --backend gloo")
    return requested


class Group:
    """One run's store and process group. ``resolve`` -> ``join`` -> ``init`` -> collectives -> ``close``;
    a rank whose backend cannot be resolved may still ``join`` the store (to say why)."""

    def __init__(self, env: RankEnv, *, backend: str, timeout_s: float, init_method: str | None) -> None:
        """``init_method``: checked where the flag was read (:mod:`checker.distributed.rendezvous`)."""
        self.env = env
        self.backend = backend
        """As requested until :meth:`resolve`; then the backend the group uses."""
        self.timeout = timedelta(seconds=timeout_s)
        self.init_method = init_method
        self.store: dist.Store | None = None
        self._base: dist.Store | None = None
        self.heartbeat: Heartbeat | None = None
        self.device = torch.device("cpu")

    def resolve(self) -> None:
        """The backend this rank can use (``auto``: nccl with a GPU); the user's error (FlagError) when it
        cannot use the one asked for."""
        self.backend = resolve_backend(self.backend)
        if self.backend == "nccl":
            torch.cuda.set_device(self.env.local_rank)
            self.device = torch.device("cuda", self.env.local_rank)

    # -- setup -------------------------------------------------------------------------------------
    def _base_store(self) -> dist.Store:
        """The rendezvous store: this rank's one client of it, for liveness and the process group alike
        (:meth:`_wait_until_all_at_init` says why one is enough)."""
        env, method = self.env, self.init_method
        if method and method.startswith("file://"):
            return dist.FileStore(method.removeprefix("file://"), env.world_size)
        if env.world_size == 1 and not env.master_port:
            return dist.HashStore()
        if not env.master_addr or not env.master_port:
            raise InfrastructureFailure(
                "init", "MASTER_ADDR/MASTER_PORT are not set; launch with torchrun or pass --init-method"
            )
        # Under torchrun the agent already hosts a TCPStore at MASTER_ADDR:PORT: connect as a client.
        return dist.TCPStore(
            env.master_addr,
            env.master_port,
            env.world_size,
            is_master=not env.use_agent_store and env.rank == 0,
            timeout=self.timeout,
            wait_for_workers=False,
        )

    def _tcp_store(self) -> bool:
        """The store is a TCPStore: one client, which runs one call at a time."""
        method = self.init_method
        if method and method.startswith("file://"):
            return False
        return not (self.env.world_size == 1 and not self.env.master_port)

    @property
    def liveness_store(self) -> LivenessStore | None:
        """The store as liveness uses it: torch 2.13's type stubs omit ``Store.append`` and
        ``Store.multi_set``, which every store (File, TCP, Hash, Prefix) has at run time."""
        return cast("LivenessStore | None", self.store)

    def join(self) -> None:
        """Connect to the rendezvous store, list this rank as joined (its liveness keys) and start its
        heartbeat: from here on the watchers can see it, while it still waits for the others."""
        try:
            base = self._base_store()
            base.set_timeout(self.timeout)
            self._base = base
            # A restarted attempt must not see the previous attempt's keys (e.g. "report written").
            self.store = dist.PrefixStore(f"checker/{self.env.restart_count}/", base)
            # A store that already counted a whole world is left over from an earlier run (a reused
            # --init-method file): its keys would name the wrong ranks, so refuse it.
            arrivals = self.store.add("arrivals", 1)
            if arrivals > self.env.world_size:
                raise StaleStore(
                    f"the rendezvous store already holds an earlier run ({arrivals - 1} arrivals for world "
                    f"size {self.env.world_size}); pass a fresh --init-method path"
                )
            live = self.liveness_store
            assert live is not None
            join(live, self.env.rank, self.env.host, node=self.env.node_ranks)
            self.heartbeat = Heartbeat(live, self.env.rank).start()
        except (InfrastructureFailure, StaleStore):
            raise
        except Exception as exc:  # torch raises several types (DistStoreError, RuntimeError, ...)
            raise InfrastructureFailure("init", _one_line(exc)) from None

    def init(self) -> None:
        """The process group: waits (``--timeout-s``) until every rank has come. On a TCPStore the wait
        is :meth:`_wait_until_all_at_init`'s, so that the process group's own rendezvous, on the same
        client, finds every rank there and holds the client only for its few calls."""
        assert self.store is not None, "join first"
        try:
            if self._tcp_store():
                self._wait_until_all_at_init()
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore("pg/", self.store),
                rank=self.env.rank,
                world_size=self.env.world_size,
                timeout=self.timeout,
                device_id=self.device if self.backend == "nccl" else None,
            )
        except InfrastructureFailure:
            raise
        except Exception as exc:  # torch raises several types (DistStoreError, RuntimeError, ...)
            raise InfrastructureFailure("init", _one_line(exc)) from None

    def _wait_until_all_at_init(self) -> None:
        """Wait, in short calls, until every rank has reached :meth:`init` (``--timeout-s``).

        A TCPStore client runs one call at a time, and the process group's rendezvous blocks in its
        calls until the last rank comes: on this rank's one client that would hold up its heartbeat,
        its watcher and its publisher lease for as long as a late rank takes (a rank waiting for a late
        one would look frozen, and could neither name nor hear anyone). So the wait for the late ranks
        happens here, one short ``add`` at a time, with the liveness calls between them; the
        rendezvous then finds every rank there. Why not a second client for the process group: c10d
        looks up each new client socket's host name (a reverse DNS query, for its log lines), and a
        resolver that drops part of a burst answers those after its 5 s retry; two clients a rank
        doubled the burst of a 32-rank start and cost it about 5 s (bench/connect_burst.py)."""
        assert self.store is not None
        world, limit = self.env.world_size, self.timeout.total_seconds()
        deadline = time.monotonic() + limit
        came = self.store.add("at_init", 1)
        pause = 0.005
        while came < world:
            if time.monotonic() >= deadline:
                raise InfrastructureFailure(
                    "init",
                    f"{world - came} of {world} ranks did not reach the process group in {limit:g} s",
                )
            time.sleep(pause)
            pause = min(pause * 1.5, 0.1)  # quick when the ranks come together, light on the store when not
            came = self.store.add("at_init", 0)

    def connect(self) -> None:
        self.join()
        self.init()

    # -- collectives -------------------------------------------------------------------------------
    def all_gather_int64(self, values: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """All-gather one 1-D int64 tensor of the same length from every rank -> (world_size, n) on CPU."""
        t = values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=torch.int64)
        t = t.to(device=self.device, dtype=torch.int64).contiguous()
        out = torch.empty(self.env.world_size * t.numel(), dtype=torch.int64, device=self.device)
        # torch >= 2.12 renamed all_gather_into_tensor to all_gather_single.
        gather: Any = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        t0 = time.monotonic()
        try:
            work = gather(out, t, async_op=True)
            work.wait(self.timeout)
        except Exception as exc:
            # Within a second of the bound: it ran out its time; well before: a peer dropped out.
            timed_out = time.monotonic() - t0 >= self.timeout.total_seconds() - 1.0
            raise InfrastructureFailure("exchange", _one_line(exc), timed_out=timed_out) from None
        return out.view(self.env.world_size, -1).cpu()

    def gather_rows(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's ``values`` (the same length everywhere), as lists."""
        rows: list[list[int]] = self.all_gather_int64(values).tolist()
        return rows

    # -- liveness through the store ----------------------------------------------------------------
    def shorten_store_timeout(self, seconds: float) -> None:
        """After a failure: a store on a lost node must not block each liveness call for --timeout-s."""
        for store in (self._base, self.store):
            if store is not None:
                try:
                    store.set_timeout(timedelta(seconds=seconds))
                except Exception:
                    pass

    def close(self) -> None:
        """Clean path only: destroying a group while a peer is stuck in a collective can deadlock."""
        if dist.is_initialized():
            dist.destroy_process_group()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"
