"""Process-group lifecycle with bounded waits: the store, init, the int64 all-gather, liveness keys.

Every wait here has a timeout. Failures become :class:`InfrastructureFailure`, which the check turns
into the ``infrastructure_failure`` verdict instead of a traceback or a hang.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from checker.dist.launch_env import RankEnv


class InfrastructureFailure(RuntimeError):
    """The process group could not be formed or a collective failed: a lost, hung or unreachable rank."""

    def __init__(self, phase: str, detail: str) -> None:
        super().__init__(f"{phase}: {detail}")
        self.phase = phase
        self.detail = detail


def resolve_backend(requested: str) -> str:
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise InfrastructureFailure("init", "--backend nccl needs a CUDA GPU; use --backend gloo")
    return requested


class Group:
    """One run's store and process group. ``connect`` -> collectives -> ``close``."""

    def __init__(self, env: RankEnv, *, backend: str, timeout_s: float, init_method: str | None) -> None:
        self.env = env
        self.backend = resolve_backend(backend)
        self.timeout = timedelta(seconds=timeout_s)
        self.init_method = init_method
        self.store: dist.Store | None = None
        self._base: dist.Store | None = None
        self._liveness_s = min(timeout_s, 5.0)
        """Bound on one liveness store call (set/announce), whatever the store's own timeout."""
        self.device = torch.device("cpu")
        if self.backend == "nccl":
            torch.cuda.set_device(env.local_rank)
            self.device = torch.device("cuda", env.local_rank)

    # -- setup -------------------------------------------------------------------------------------
    def _base_store(self) -> dist.Store:
        env, method = self.env, self.init_method
        if method and method.startswith("file://"):
            path = method.removeprefix("file://")
            # FileStore retries a missing directory forever while holding the GIL: refuse it up front.
            if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
                raise InfrastructureFailure(
                    "init", f"--init-method {method}: directory {os.path.dirname(path)!r} does not exist"
                )
            return dist.FileStore(path, env.world_size)
        if method and method != "env://":
            raise InfrastructureFailure(
                "init", f"--init-method {method!r} is not supported; use file:///path or env://"
            )
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

    def connect(self) -> None:
        try:
            base = self._base_store()
            base.set_timeout(self.timeout)
            self._base = base
            # A restarted attempt must not see the previous attempt's keys (e.g. "report written").
            self.store = dist.PrefixStore(f"checker/{self.env.restart_count}/", base)
            self.store.set(f"arrived/{self.env.rank}", self.env.host)
            kwargs = {}
            if self.backend == "nccl":
                kwargs["device_id"] = self.device
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore("pg/", self.store),
                rank=self.env.rank,
                world_size=self.env.world_size,
                timeout=self.timeout,
                **kwargs,
            )
        except InfrastructureFailure:
            raise
        except Exception as exc:  # torch raises several types (DistStoreError, RuntimeError, ...)
            raise InfrastructureFailure("init", _one_line(exc)) from None

    # -- collectives -------------------------------------------------------------------------------
    def all_gather_int64(self, values: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """All-gather one 1-D int64 tensor of the same length from every rank -> (world_size, n) on CPU."""
        t = values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=torch.int64)
        t = t.to(device=self.device, dtype=torch.int64).contiguous()
        out = torch.empty(self.env.world_size * t.numel(), dtype=torch.int64, device=self.device)
        # torch >= 2.12 renamed all_gather_into_tensor to all_gather_single.
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        try:
            work = gather(out, t, async_op=True)
            work.wait(self.timeout)
        except Exception as exc:
            raise InfrastructureFailure("exchange", _one_line(exc)) from None
        return out.view(self.env.world_size, -1).cpu()

    # -- liveness through the store ----------------------------------------------------------------
    def shorten_store_timeout(self, seconds: float) -> None:
        """After a failure: a store on a lost node must not block each liveness call for --timeout-s."""
        for store in (self._base, self.store):
            if store is not None:
                try:
                    store.set_timeout(timedelta(seconds=seconds))
                except Exception:
                    pass

    def mark(self, key: str) -> bool:
        """Set ``key/<rank>``; False if the store is unreachable (then nothing else will work either)."""
        store = self.store
        if store is None:
            return False
        return bool(_bounded(lambda: store.set(f"{key}/{self.env.rank}", self.env.host) or True,
                             self._liveness_s, False))

    def ranks_with(self, key: str, *, wait_s: float) -> set[int]:
        """Ranks that set ``key`` within ``wait_s`` seconds (polling; never blocks longer)."""
        store = self.store
        if store is None:
            return {self.env.rank}
        found: set[int] = set()
        deadline = time.monotonic() + wait_s

        def poll() -> None:
            while time.monotonic() < deadline:
                for r in range(self.env.world_size):
                    if r not in found and store.check([f"{key}/{r}"]):
                        found.add(r)
                if len(found) == self.env.world_size:
                    return
                time.sleep(0.05)

        _bounded(poll, wait_s, None)
        return set(found)

    def announce(self, key: str) -> None:
        store = self.store
        if store is not None:
            _bounded(lambda: store.set(key, "1"), self._liveness_s, None)

    def wait_for(self, key: str, *, wait_s: float) -> bool:
        """Wait (bounded) for a key another rank sets, e.g. rank 0's "report written"."""
        store = self.store
        if store is None:
            return False
        deadline = time.monotonic() + wait_s

        def poll() -> bool:
            while time.monotonic() < deadline:
                if store.check([key]):
                    return True
                time.sleep(0.05)
            return False

        return bool(_bounded(poll, wait_s, False))

    def close(self) -> None:
        """Clean path only: destroying a group while a peer is stuck in a collective can deadlock."""
        if dist.is_initialized():
            dist.destroy_process_group()


def _bounded(fn, seconds: float, default):
    """Run ``fn`` in a daemon thread; its result, or ``default`` after ``seconds`` or on any error.

    On a cut link a TCPStore call can block far past its own timeout (seen with ``ip link set down``:
    ``check``/``get`` never returned). Those calls release the GIL, so the caller's wait still ends on
    time and the abandoned thread dies with the process.
    """
    box: list = [default]

    def target() -> None:
        try:
            box[0] = fn()
        except Exception:
            pass

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    return box[0]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"
