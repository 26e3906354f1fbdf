"""Fakes for the distributed layer's logic, in-process and in milliseconds (not a test module).

* :class:`FakeStore`: the rendezvous store's counters and keys, with transient errors on demand, and
  :class:`BeatingWorld`: a fake clock over it (ranks that beat, step, stop, hang, leave).
* :class:`World` + :class:`FakeSession`: a world of ranks as threads whose all-gathers meet at a barrier,
  so the run protocol (:func:`checker.distributed.exchange.run`) runs on every rank at once; a rank
  that skips a gather leaves the others at the barrier, which fails them as a real collective would.
* :class:`FakeJob`: a job whose every piece is scripted per rank.

Real process groups stay in the transport and end-to-end tests (tests/test_check.py, test_faults.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from checker.core.errors import FlagError, LayoutError
from checker.distributed.group import InfrastructureFailure, StaleStore
from checker.distributed.session import Abort, Gathered, SchemaMismatch, schema_mismatch_message
from checker.distributed.wire import Header

# -- a store and a clock --------------------------------------------------------------------------------


class StoreDown(RuntimeError):
    """What a store call raises while the fake store is failing (a dropped connection)."""


class FakeStore:
    """``add``/``set``/``check``/``get`` of torch's Store. ``fail_calls``: the next N calls raise;
    ``fail_methods``: calls of these methods always raise."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.fail_calls = 0
        self.fail_methods: set[str] = set()
        self.calls = 0
        self._lock = threading.Lock()

    def _maybe_fail(self, method: str) -> None:
        self.calls += 1
        if self.fail_calls > 0 or method in self.fail_methods:
            self.fail_calls = max(0, self.fail_calls - 1)
            raise StoreDown("store: connection reset by peer")

    def add(self, key: str, value: int) -> int:
        with self._lock:
            self._maybe_fail("add")
            self.data[key] = int(self.data.get(key, 0)) + value
            return int(self.data[key])

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self._maybe_fail("set")
            self.data[key] = value

    def check(self, keys: list[str]) -> bool:
        with self._lock:
            self._maybe_fail("check")
            return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        with self._lock:
            self._maybe_fail("get")
            return str(self.data[key]).encode()


@dataclass
class BeatingWorld:
    """A fake clock over a :class:`FakeStore`: ``sleep(s)`` lets ``s`` seconds pass, in which every
    rank in ``beating`` beats once per heartbeat interval. Ranks are set up by what they did."""

    store: FakeStore = field(default_factory=FakeStore)
    beating: set[int] = field(default_factory=set)
    interval_s: float = 0.25
    now: float = 0.0

    def rank(
        self, r: int, *, beats: int = 1, steps: int = 0, beating: bool = True, exiting: str = ""
    ) -> None:
        self.store.data[f"hb/{r}"] = beats
        self.store.data[f"step/{r}"] = steps
        if exiting:
            self.store.data[f"exiting/{r}"] = exiting
        if beating:
            self.beating.add(r)

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for r in self.beating:
            self.store.data[f"hb/{r}"] += max(1, int(seconds / self.interval_s))


# -- a world of ranks as threads ------------------------------------------------------------------------


class Exited(Exception):
    """A fake session's process exit (the real one calls os._exit)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class World:
    """What every rank shares: the gathers (a barrier), the store's announcement, what went wrong."""

    size: int
    gather_timeout_s: float = 2.0
    announce_wait_s: float = 0.5
    fail_gather: dict[int, set[int]] = field(default_factory=dict)
    """gather index -> ranks whose gather fails (a peer dropped out)."""
    missing: list[int] = field(default_factory=list)
    """What liveness would name after a failure."""
    group_error: str | None = None
    stale_store: bool = False
    schema: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    """rank -> the schema its header claims (another checker version)."""

    def __post_init__(self) -> None:
        self.barrier = threading.Barrier(self.size)
        self.dropped = False
        self.slots: list[Any] = [None] * self.size
        self.announced: tuple[int, str] | None = None
        self.exiting: dict[int, str] = {}
        self.sessions: list[FakeSession] = [FakeSession(self, r) for r in range(self.size)]

    def gather(self, rank: int, index: int, value: Any) -> list[Any]:
        if rank in self.fail_gather.get(index, set()):
            self.dropped = True
            self.barrier.abort()  # the others' gather fails at once too, as a real ring does
            raise InfrastructureFailure("exchange", "Connection closed by peer", timed_out=False)
        try:
            self.slots[rank] = value
            self.barrier.wait(self.gather_timeout_s)
            out = list(self.slots)
            self.barrier.wait(self.gather_timeout_s)
        except threading.BrokenBarrierError:
            # A peer dropped out (at once), or never came: the gather ran out its time.
            raise InfrastructureFailure(
                "exchange", "a peer left the gather", timed_out=not self.dropped
            ) from None
        return out


class FakeSession:
    """The session surface the run protocol uses, over a :class:`World`."""

    def __init__(self, world: World, rank: int) -> None:
        self.world = world
        self.env = SimpleNamespace(rank=rank, world_size=world.size)
        self.timings: dict[str, float] = {}
        self.on_abort: Callable[[str, bool], None] | None = None
        self.gathers = 0
        self.closed: tuple[int, bool] | None = None
        self.t0 = time.monotonic()

    @property
    def is_rank0(self) -> bool:
        return self.env.rank == 0

    @property
    def device(self) -> None:
        return None

    @property
    def has_store(self) -> bool:
        return self.world.group_error is None

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def start(self, on_abort: Callable[[str, bool], None]) -> FakeSession:
        self.on_abort = on_abort
        return self

    def stand_down(self, finish_s: float) -> None:
        pass

    def make_group(self) -> None:
        if self.world.group_error:
            raise FlagError(self.world.group_error)

    def connect(self) -> None:
        if self.world.stale_store:
            raise StaleStore("the rendezvous store already holds an earlier run")

    def _gather(self, value: Any) -> list[Any]:
        self.gathers += 1
        return self.world.gather(self.env.rank, self.gathers, value)

    def exchange_headers(self, header: Header) -> list[Header]:
        ints = header.encode()
        schema = self.world.schema.get(self.env.rank)
        if schema:
            ints[:3] = schema
        headers = [Header.decode(h) for h in self._gather(ints)]
        if len({h.schema for h in headers}) > 1:
            raise SchemaMismatch(schema_mismatch_message(headers))
        return headers

    def gather_text(self, text: str) -> list[str]:
        return [str(t) for t in self._gather(text)]

    def gather_payload(self, status: int, text: str, body: Sequence[int]) -> Gathered:
        rows = self._gather((status, text, list(body)))
        return Gathered(
            statuses=[r[0] for r in rows], messages=[r[1] for r in rows], body=[r[2] for r in rows]
        )

    def failed(self, detail: str, *, stopping: bool = False, behind_is_hung: bool = True) -> Abort:
        return Abort(detail=detail, missing_ranks=list(self.world.missing))

    def shorten_store_timeout(self) -> None:
        pass

    def mark_exiting(self, why: str) -> None:
        self.world.exiting[self.env.rank] = why

    def announce(self, exit_code: int, line: str) -> None:
        self.world.announced = (exit_code, line)

    def await_announcement(self, wait_s: float, *, while_alive_s: float = 0.0) -> tuple[int, str] | None:
        deadline = time.monotonic() + self.world.announce_wait_s
        while time.monotonic() < deadline:
            if self.world.announced is not None:
                return self.world.announced
            time.sleep(0.002)
        return None

    def close(self, exit_code: int, *, clean: bool) -> int:
        self.closed = (exit_code, clean)
        return exit_code

    def exit_now(self, exit_code: int) -> Any:
        raise Exited(exit_code)

    def wait_for_exit(self, seconds: float) -> Any:
        raise Exited(-1)  # -1: this rank would have waited for the abort to end the process


# -- a scripted job -------------------------------------------------------------------------------------


@dataclass
class FakeJob:
    """A job whose pieces are scripted per rank. Outcomes are tuples: ("decided", code, rows),
    ("errors", [lines]), ("lost", detail, missing)."""

    rank: int
    code: int = 0
    local_error: Exception | None = None
    payload_error: Exception | None = None
    payload_len: int = 2
    publish_problem: str | None = None
    publish_error: Exception | None = None
    publish_gate: threading.Event | None = None
    """publish waits for this (a slow report write), after setting ``publishing``."""
    name: str = "fake"

    def __post_init__(self) -> None:
        self.published: list[Any] = []
        self.fallbacks: list[Any] = []
        self.publishing = threading.Event()

    def local(self, device: Any) -> str:
        if self.local_error is not None:
            raise self.local_error
        return f"facts of rank {self.rank}"

    def header(self, local: str) -> Header:
        return Header(rank=self.rank, payload_len=self.payload_len)

    def mismatch(self, headers: Sequence[Header]) -> str | None:
        return None

    def payload(self, local: str, headers: Sequence[Header]) -> list[int]:
        if self.payload_error is not None:
            raise self.payload_error
        return [self.rank] * self.payload_len

    def decide(self, gathered: Any, headers: Sequence[Header]) -> tuple[Any, ...]:
        return ("decided", self.code, [list(r) for r in gathered])

    def errors(self, errors: Sequence[Any]) -> tuple[Any, ...]:
        return ("errors", [e.line() for e in errors])

    def lost(self, detail: str, missing_ranks: Sequence[int]) -> tuple[Any, ...]:
        return ("lost", detail, list(missing_ranks))

    def exit_code(self, outcome: tuple[Any, ...]) -> int:
        return {"decided": outcome[1], "errors": 2, "lost": 3}[outcome[0]]

    def one_line(self, outcome: tuple[Any, ...]) -> str:
        return f"fake {outcome[0]}"

    def publish(self, outcome: tuple[Any, ...]) -> str | None:
        self.publishing.set()
        if self.publish_gate is not None:
            self.publish_gate.wait(5)
        self.published.append(outcome)
        if self.publish_error is not None:
            raise self.publish_error
        return self.publish_problem

    def fallback(self, outcome: tuple[Any, ...]) -> None:
        self.fallbacks.append(outcome)


def bad_input(message: str = "world_size 2 is not pp_size x tp_size") -> Exception:
    return LayoutError(message)


@dataclass
class RankRun:
    code: int | None = None
    error: BaseException | None = None


def run_ranks(world: World, jobs: Sequence[FakeJob], *, timeout_s: float = 10.0) -> list[RankRun]:
    """Run the protocol on every rank at once (threads); each rank's exit code."""
    from checker.distributed.exchange import run

    results = [RankRun() for _ in jobs]

    def one(rank: int) -> None:
        try:
            results[rank].code = run(world.sessions[rank], jobs[rank])  # type: ignore[arg-type]
        except Exited as exc:
            results[rank].code = exc.code
        except BaseException as exc:  # surfaced by the test
            results[rank].error = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(world.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a rank never finished: the protocol hung"
    return results
