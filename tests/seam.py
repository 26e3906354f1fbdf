"""The real :class:`checker.distributed.session.Session` over a fake group and a fake store, on a virtual
clock (not a test module): the run protocol's lifecycle decisions, in milliseconds.

What is real: the Session (its waits, its store reads, its publisher lease, its announcement, its exit
path), the protocol (:func:`checker.distributed.exchange.run`), liveness and the watcher's decisions.
What is fake, with torch's semantics for what the Session uses:

* :class:`VirtualClock`: time passes only when every party (each rank's main thread and its watcher)
  waits, in one jump to the earliest deadline: a rank's 30 s rendezvous timeout costs microseconds, and
  no wait can end early because a busy machine was slow. Each live rank's heartbeat beats as that time
  passes (every :data:`checker.distributed.liveness.HEARTBEAT_S`); a rank that was killed beats no more.
* :class:`BlockingStore`: torch.distributed.Store's keys. ``get``, ``multi_get`` and ``wait`` block until
  every key is set or the store's timeout passes, then raise what torch 2.13's TCPStore raises
  (``DistStoreError: wait timeout after 30000ms, keys: /k``), so a read the code did not guard waits out
  its bound here as it would under torchrun (the old fake raised ``KeyError`` at once).
* :class:`SeamGroup`: the rendezvous (every rank's arrival, bounded by ``--timeout-s``) and the int64
  all-gather, both over that store, with torch's timeouts.
* :class:`Process`: what ``os._exit`` does to a rank: its first exit code is the process's; its threads
  stop at their next wait, its heartbeat stops and its watcher goes. :meth:`Process.freeze` is SIGSTOP
  (every thread stops, no beat, no exit code; a SIGTERM stays pending), :meth:`SeamWorld.hang` a main
  thread stuck while its heartbeat and other threads go on.
* ``SeamWorld(agent=True)``: torchrun's agent. When a process ends with a code other than 0 (or is
  killed) it sends SIGTERM to every other live process (the session's SIGTERM path, on a thread of that
  process); once the rest have ended, it SIGKILLs the frozen ones (its grace period, not modelled in
  time).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

import torch
from torch.distributed import DistNetworkError, DistStoreError

from checker.core.errors import FlagError
from checker.distributed import liveness
from checker.distributed.exchange import RankError, run
from checker.distributed.group import InfrastructureFailure, StaleStore, _one_line
from checker.distributed.launch_env import GroupOptions, RankEnv
from checker.distributed.liveness import Store
from checker.distributed.session import BackstopLike, Clock, GroupLike, Session
from checker.distributed.watcher import Watcher

_local = threading.local()
"""The :class:`Process` a thread belongs to (a rank's main thread and its watcher)."""


class ProcessExit(BaseException):
    """A rank's process ended (``os._exit``): nothing in it runs on, so no ``except Exception`` stops it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# -- time ----------------------------------------------------------------------------------------------


class VirtualClock(Clock):
    """A monotonic clock that moves only when every party waits on it (:meth:`sleep`, or a store read
    that blocks), straight to the earliest deadline among the waiters. A waiter that can go on (its key
    was set, its deadline reached) holds time still until it has gone on. ``lock`` guards the store's
    keys too, so a key set and a reader's wait are one step."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.cond = threading.Condition()
        self.parties = 0
        self._waiters: dict[int, tuple[float, Callable[[], bool], Process | None]] = {}
        self._ids = iter(range(1 << 62))
        self._tickers: list[Callable[[float, float], None]] = []
        self.jumps = 0

    def monotonic(self) -> float:
        with self.cond:
            return self.now

    @contextmanager
    def party(self) -> Iterator[None]:
        """The calling thread takes part: time waits for it whenever it is not waiting itself."""
        with self.cond:
            self.parties += 1
        try:
            yield
        finally:
            with self.cond:
                self.parties -= 1
                self._advance()
                self.cond.notify_all()

    def ticker(self, tick: Callable[[float, float], None]) -> None:
        """``tick(before, after)`` runs (under the lock) each time time passes."""
        with self.cond:
            self._tickers.append(tick)

    def sleep(self, seconds: float) -> None:
        with self.cond:
            self.wait_until(lambda: False, self.now + max(0.0, seconds))

    def wait_until(self, ready: Callable[[], bool], deadline: float) -> bool:
        """With the lock held: wait until ``ready()`` (True) or the clock reaches ``deadline`` (False).
        A thread of a process that has ended stops here (:class:`ProcessExit`)."""
        me = next(self._ids)
        try:
            while True:
                _stop_if_ended()
                if ready():
                    return True
                if self.now >= deadline:
                    return False
                self._waiters[me] = (deadline, ready, getattr(_local, "process", None))
                self._advance()
                if self.now < deadline and not ready():
                    self.cond.wait(0.05)  # a notify moves it on; the bound only guards a missed one
        finally:
            self._waiters.pop(me, None)

    def _advance(self) -> None:
        """Every party waits and none can go on: jump to the earliest deadline."""
        if not self._waiters or len(self._waiters) < self.parties:
            return
        for deadline, ready, process in self._waiters.values():
            if self.now >= deadline or ready() or (process is not None and not process.running):
                return  # it goes on first (a thread of an ended process stops there)
        before, self.now = self.now, min(d for d, _, _ in self._waiters.values())
        self.jumps += 1
        for tick in self._tickers:
            tick(before, self.now)
        self.cond.notify_all()

    def notify(self) -> None:
        """With the lock held: something changed (a key was set)."""
        self.cond.notify_all()


def _stop_if_ended() -> None:
    process: Process | None = getattr(_local, "process", None)
    if process is not None and not process.running:
        raise ProcessExit(process.code if process.code is not None else -9)


# -- the store -----------------------------------------------------------------------------------------


class BlockingStore:
    """The keys every rank shares (torch's store server). Ranks talk to it through a
    :class:`StoreClient`, each with its own timeout, as each TCPStore client has."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.data: dict[str, bytes] = {}
        self.down = False
        """Its host is gone: every call fails at once, as torch's client on a reset connection."""

    def client(self, timeout_s: float) -> StoreClient:
        return StoreClient(self, timeout_s)


def _b(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


class StoreClient(Store):
    """torch.distributed.Store's calls the checker makes, with its blocking reads: ``get``,
    ``multi_get`` and ``wait`` wait until each key is set or the timeout passes, then raise
    ``DistStoreError`` as torch 2.13's TCPStore does."""

    def __init__(self, server: BlockingStore, timeout_s: float) -> None:
        self.server, self.clock = server, server.clock
        self.timeout = timedelta(seconds=timeout_s)

    @property
    def data(self) -> dict[str, bytes]:
        return self.server.data

    def set_timeout(self, timeout: timedelta) -> None:
        self.timeout = timeout

    def _answer(self) -> None:
        _stop_if_ended()
        if self.server.down:
            raise DistNetworkError("failed to recv, got 0 bytes: Connection reset by peer")

    def _await(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        bound = (timeout or self.timeout).total_seconds()
        self._answer()
        if not self.clock.wait_until(lambda: all(k in self.data for k in keys), self.clock.now + bound):
            ms = int(bound * 1000)
            raise DistStoreError(f"wait timeout after {ms}ms, keys: " + ", ".join(f"/{k}" for k in keys))

    def get(self, key: str) -> bytes:
        with self.clock.cond:
            self._await([key])
            return self.data[key]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self.clock.cond:
            self._await(keys)
            return [self.data[k] for k in keys]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        with self.clock.cond:
            self._await(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        with self.clock.cond:
            self._answer()
            return all(k in self.data for k in keys)

    def set(self, key: str, value: str | bytes) -> None:
        with self.clock.cond:
            self._answer()
            self.data[key] = _b(value)
            self.clock.notify()

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        with self.clock.cond:
            self._answer()
            self.data.update({k: _b(v) for k, v in zip(keys, values, strict=True)})
            self.clock.notify()

    def add(self, key: str, value: int) -> int:
        with self.clock.cond:
            self._answer()
            total = int(self.data.get(key, b"0")) + value
            self.data[key] = str(total).encode()
            self.clock.notify()
            return total

    def append(self, key: str, value: str) -> None:
        with self.clock.cond:
            self._answer()
            self.data[key] = self.data.get(key, b"") + _b(value)
            self.clock.notify()

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
        """torch's: set ``desired_value`` when the key holds ``expected_value`` (or is absent and
        ``expected_value`` is empty); the value the key holds afterwards (``expected_value`` when it is
        absent and nothing was set)."""
        with self.clock.cond:
            self._answer()
            held = self.data.get(key)
            if (held is None and expected_value == "") or held == _b(expected_value):
                self.data[key] = _b(desired_value)
                self.clock.notify()
                return self.data[key]
            return _b(expected_value) if held is None else held


# -- the group -----------------------------------------------------------------------------------------


class ClockHeartbeat(liveness.Heartbeat):
    """A rank's heartbeat, beating as the virtual clock passes (no thread): stops when its process ends."""

    def __init__(self, store: StoreClient, rank: int, process: Process) -> None:
        super().__init__(store, rank)
        self.process = process
        self.beating = False

    def start(self) -> ClockHeartbeat:
        """The first beat at once, as the real thread's; then one per interval of virtual time."""
        self.beating = True
        clock = self.process.world.clock
        interval = self.interval_s
        self.store.add(f"hb/{self.rank}", 1)

        def tick(before: float, after: float) -> None:
            beats = int(after // interval) - int(before // interval)
            if beats and self.beating and self.process.running:
                key = f"hb/{self.rank}"
                data = self.process.world.store.data
                data[key] = str(int(data.get(key, b"0")) + beats).encode()

        clock.ticker(tick)
        return self

    def stop(self, join_s: float = 1.0) -> None:
        self.beating = False


class SeamGroup(GroupLike):
    """One rank's group over the world's store: the rendezvous and the int64 all-gather, each bounded by
    ``--timeout-s`` as torch's are (a missing rank fails them with ``DistStoreError`` at the timeout)."""

    backend = "gloo"

    def __init__(self, process: Process, options: GroupOptions) -> None:
        self.process, self.world, self.rank = process, process.world, process.rank
        self.timeout_s = options.timeout_s
        self.client: StoreClient | None = None
        self.heartbeat: liveness.Heartbeat | None = None
        self.gathers = 0
        self.closed = False

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def store(self) -> StoreClient | None:
        return self.client

    @property
    def liveness_store(self) -> StoreClient | None:
        return self.client

    def resolve(self) -> None:
        problem = self.world.backend_errors.get(self.rank)
        if problem:
            raise FlagError(problem)

    def join(self) -> None:
        client = self.world.store.client(self.timeout_s)
        arrivals = client.add("arrivals", 1)
        if arrivals > self.world.size:
            raise StaleStore(f"the rendezvous store already holds an earlier run ({arrivals - 1} arrivals)")
        self.client = client
        liveness.join(client, self.rank, self.process.host, node=self.process.node)
        self.heartbeat = ClockHeartbeat(client, self.rank, self.process).start()

    def init(self) -> None:
        assert self.client is not None, "join first"
        try:
            if self.client.add("pg/arrived", 1) == self.world.size:
                self.client.set("pg/ready", "1")
            self.client.wait(["pg/ready"], timedelta(seconds=self.timeout_s))
        except DistStoreError as exc:
            raise InfrastructureFailure("init", _one_line(exc)) from None

    def all_gather_int64(self, values: Sequence[int] | torch.Tensor) -> torch.Tensor:
        assert self.client is not None
        t = values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=torch.int64)
        self.gathers += 1
        keys = [f"gather/{self.gathers}/{r}" for r in range(self.world.size)]
        self.client.set(keys[self.rank], ",".join(str(int(v)) for v in t.reshape(-1).tolist()))
        try:
            self.client.wait(keys, timedelta(seconds=self.timeout_s))
        except DistStoreError as exc:
            raise InfrastructureFailure("exchange", _one_line(exc), timed_out=True) from None
        rows = [[int(v) for v in raw.decode().split(",") if v] for raw in self.client.multi_get(keys)]
        return torch.tensor(rows, dtype=torch.int64)

    def gather_rows(self, values: Sequence[int]) -> list[list[int]]:
        rows: list[list[int]] = self.all_gather_int64(values).tolist()
        return rows

    def shorten_store_timeout(self, seconds: float) -> None:
        if self.client is not None:
            self.client.set_timeout(timedelta(seconds=seconds))

    def close(self) -> None:
        self.closed = True


# -- ranks as processes --------------------------------------------------------------------------------


class SeamWatcher(Watcher):
    """The real watcher, its thread a party of the virtual clock (it polls every ``poll_s`` of it)."""

    process: Process

    def start(self) -> SeamWatcher:
        with self.process.world.clock.cond:  # a party from now: time waits for its first poll
            self.process.world.clock.parties += 1
        super().start()
        return self

    def stop(self, join_s: float = 1.0) -> None:
        with self.process.world.clock.cond:
            self._stop.set()
            self.process.world.clock.notify()
        super().stop(join_s)

    def _watch(self) -> None:
        clock = self.process.world.clock
        _local.process = self.process
        try:
            while True:
                with clock.cond:
                    clock.wait_until(self._stop.is_set, clock.now + self.poll_s)
                if self._stop.is_set() or self.poll():
                    return
        except ProcessExit:
            return
        finally:
            with clock.cond:
                clock.parties -= 1
                clock._advance()
                clock.notify()


class FakeBackstop(BackstopLike):
    """The GIL-free backstop, not armed (it would end the test's process): what it was asked."""

    def __init__(self) -> None:
        self.armed: list[float] = []
        self.closed = False

    def arm(self, seconds: float) -> FakeBackstop:
        self.armed.append(seconds)
        return self

    def close(self) -> None:
        self.closed = True


@dataclass
class Process:
    """One rank's process: its session, and how it ended."""

    world: SeamWorld
    rank: int
    code: int | None = None
    """The first exit code it left with (``os._exit``), or what ``run`` returned."""
    killed: bool = False
    """It was killed (``kill -9``): it left no exit code of its own."""
    session: Session | None = None
    error: BaseException | None = None
    frozen: bool = False
    """SIGSTOP: every thread stopped, no beat; alive (no exit code) until killed."""
    sigterm: bool = False
    """torchrun's agent sent it SIGTERM."""

    @property
    def running(self) -> bool:
        """Its threads run: alive and not frozen."""
        return self.alive and not self.frozen

    @property
    def host(self) -> str:
        return f"node-{self.rank // 2}"

    @property
    def node(self) -> tuple[int, int]:
        """The ranks of its node, as torchrun numbers them: two a node."""
        return self.rank - self.rank % 2, 2

    @property
    def alive(self) -> bool:
        return self.code is None and not self.killed

    def exit(self, code: int) -> NoReturn:
        """``os._exit``: the first call ends the process (this thread now, the others at their next wait)."""
        with self.world.clock.cond:
            if self.alive:
                self.code = code
                self.world.ended(self)
            self.world.clock.notify()
        raise ProcessExit(self.code if self.code is not None else code)

    def kill(self) -> None:
        with self.world.clock.cond:
            self.killed = True
            self.world.ended(self)
            self.world.clock.notify()

    def freeze(self) -> NoReturn:
        """SIGSTOP from one of its own threads: every thread stops where it is (this one now)."""
        with self.world.clock.cond:
            self.frozen = True
            self.world.clock.notify()
        raise ProcessExit(-19)

    def make_session(self, options: GroupOptions) -> Session:
        env = RankEnv.from_environ(
            {
                "RANK": str(self.rank),
                "WORLD_SIZE": str(self.world.size),
                "LOCAL_RANK": str(self.rank % 2),
                "LOCAL_WORLD_SIZE": "2",
                "CHECKER_HOSTNAME": self.host,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
            }
        )
        process = self

        def watcher(*args: Any, **kwargs: Any) -> Watcher:
            w = SeamWatcher(*args, **kwargs)
            w.process = process
            return w

        self.session = Session(
            env,
            options,
            exit_process=self.exit,
            clock=self.world.clock,
            make_group=lambda env, options: SeamGroup(process, options),
            backstop=FakeBackstop,
            watcher=watcher,
        )
        return self.session


@dataclass
class SeamWorld:
    """A world of ``size`` ranks over one store and one virtual clock."""

    size: int
    timeout_s: float = 30.0
    backend_errors: dict[int, str] = field(default_factory=dict)
    """These ranks cannot use their --backend (the real parser's error)."""
    clock: VirtualClock = field(default_factory=VirtualClock)
    agent: bool = False
    """torchrun's agent: SIGTERM to every other process once one fails (module docstring)."""

    def __post_init__(self) -> None:
        self.store = BlockingStore(self.clock)
        self.processes = [Process(self, r) for r in range(self.size)]
        self.stopping = False
        """The agent has sent its SIGTERMs."""
        self._signal_threads: list[threading.Thread] = []

    def ended(self, process: Process) -> None:
        """With the clock's lock held: ``process`` ended; the agent stops the rest if it failed."""
        if not self.agent or self.stopping or (process.code == 0 and not process.killed):
            return
        self.stopping = True
        for other in self.processes:
            if other is not process and other.alive and other.session is not None:
                self._sigterm(other)

    def _sigterm(self, process: Process) -> None:
        """SIGTERM to ``process``: its session's SIGTERM path on a thread of its own (a party of the
        clock), once the session has started; a frozen process keeps it pending."""
        process.sigterm = True
        clock = self.clock
        clock.parties += 1  # under the lock: time waits for the new thread

        def deliver() -> None:
            _local.process = process
            session = process.session
            try:
                with clock.cond:
                    clock.wait_until(lambda: hasattr(session, "on_abort"), clock.now + 60)
                if session is not None and hasattr(session, "on_abort") and process.running:
                    session.sigterm_at = clock.monotonic()
                    session.on_abort("terminated by SIGTERM", True)
            except ProcessExit:
                pass
            finally:
                with clock.cond:
                    clock.parties -= 1
                    clock._advance()
                    clock.notify()

        thread = threading.Thread(target=deliver, daemon=True, name=f"rank-{process.rank}-sigterm")
        self._signal_threads.append(thread)
        thread.start()

    def hang(self) -> None:
        """A rank's main thread stuck for good (its heartbeat beats on): call it from a job's piece. It
        ends only when its process does (a SIGTERM it handles, or a kill)."""
        with self.clock.cond:
            self.clock.wait_until(lambda: False, self.clock.now + 1e6)

    def run(
        self,
        jobs: Sequence[Any],
        *,
        ranks: Sequence[int] | None = None,
        refused: dict[int, str] | None = None,
        killed_at_start: Sequence[int] = (),
        real_timeout_s: float = 30.0,
    ) -> list[Process]:
        """The protocol on ``ranks`` (every rank by default; a rank left out never starts), each in its
        own thread, over real Sessions; every process as it ended. ``real_timeout_s``: wall seconds before
        a rank still running is a hang (the protocol's bounds are virtual; a loaded 2-core machine ran a
        healthy world past 10 s). ``killed_at_start``: these ranks'
        processes die as they start, before they join (the agent, if any, sees them fail)."""
        started = [r for r in (range(self.size) if ranks is None else ranks) if r not in killed_at_start]
        for r in started:
            self.processes[r].make_session(self.options)
        with self.clock.cond:
            self.clock.parties += len(started)  # counted before any starts: time waits for them all
        for r in killed_at_start:
            self.processes[r].kill()

        def one(rank: int) -> None:
            process = self.processes[rank]
            _local.process = process
            said = (refused or {}).get(rank)
            try:
                assert process.session is not None
                code = run(
                    process.session, jobs[rank], refused=RankError(message=said) if said is not None else None
                )
                with self.clock.cond:
                    if process.alive:
                        process.code = code
                        self.ended(process)
            except ProcessExit:
                pass
            except BaseException as exc:  # Killed (a fake kill -9), or a bug the test shows
                process.error = exc
                process.kill()
            finally:
                with self.clock.cond:
                    self.clock.parties -= 1
                    self.clock._advance()
                    self.clock.notify()
                session = process.session
                if session is not None:
                    if session._timer is not None:  # the real watchdog timer: nothing may fire later
                        session._timer.cancel()
                    if session.watcher is not None:
                        session.watcher.stop(join_s=0.0)

        threads = [threading.Thread(target=one, args=(r,), daemon=True, name=f"rank-{r}") for r in started]
        for t in threads:
            t.start()
        for t in threads:
            t.join(real_timeout_s)
        assert not any(t.is_alive() for t in threads), "a rank never finished: the protocol hung"
        for t in list(self._signal_threads):
            t.join(real_timeout_s)
        assert not any(t.is_alive() for t in self._signal_threads), "a SIGTERM never ended its rank"
        with self.clock.cond:  # the agent's SIGKILL, after its grace, of what SIGTERM could not end
            for process in self.processes:
                if process.alive and process.frozen and self.stopping:
                    process.killed = True
        for r in started:
            session = self.processes[r].session
            if session is not None and session.watcher is not None:
                session.watcher.stop(join_s=1.0)
        return [self.processes[r] for r in started]

    @property
    def options(self) -> GroupOptions:
        return GroupOptions(backend="gloo", timeout_s=self.timeout_s)

    def value(self, key: str) -> str | None:
        raw = self.store.data.get(key)
        return None if raw is None else raw.decode()
