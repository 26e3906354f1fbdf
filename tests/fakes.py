"""Fakes for the distributed layer's logic, in-process and in milliseconds (not a test module).

* :class:`FakeStore`: the rendezvous store's counters and keys, with transient errors on demand, and
  :class:`BeatingWorld`: a fake clock over it (ranks that beat, step, stop, hang, leave).
* :class:`World` + :class:`FakeSession`: a world of ranks as threads whose all-gathers meet at a barrier,
  so the run protocol (:func:`checker.distributed.exchange.run`) runs on every rank at once; a rank
  that skips a gather leaves the others at the barrier, which fails them as a real collective would.
* :class:`FakeJob`: a job whose every piece is scripted per rank.

The real Session's decisions are tested at its own seam in tests/seam.py (a store whose reads block as
torch's do, on a virtual clock). Real process groups stay in the transport and end-to-end tests
(tests/test_check.py, test_faults.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch.distributed import DistStoreError

from checker.core.errors import FlagError, LayoutError
from checker.distributed import exchange, liveness
from checker.distributed.exchange import Job, JobContext, RankError, SessionLike
from checker.distributed.group import InfrastructureFailure, StaleStore
from checker.distributed.launch_env import RankEnv
from checker.distributed.liveness import Store
from checker.distributed.session import (
    BEAT_STOPPED,
    Abort,
    Arrivals,
    Gathered,
    SchemaMismatch,
    Wait,
    schema_mismatch_message,
)
from checker.distributed.wire import Header
from checker.status import EXIT_CODES, INFRASTRUCTURE_FAILURE

# -- a store and a clock --------------------------------------------------------------------------------


class StoreDown(RuntimeError):
    """What a store call raises while the fake store is failing (a dropped connection)."""


class FakeStore(Store):
    """``add``/``set``/``check``/``get``/``append``/``multi_get``/``multi_set`` of torch's Store, without
    time. ``fail_calls``: the next N calls raise; ``fail_methods``: calls of these methods always raise.
    ``calls``: round trips made (a ``multi_get`` is one). A read of a key nobody set would block until the
    store's timeout under torch: it raises torch's ``DistStoreError`` at once and is noted in ``blocked``
    (a test asserts none; tests/seam.py has a store that really waits, on a virtual clock)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.blocked: list[str] = []
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

    def _present(self, keys: Sequence[str]) -> None:
        missing = [k for k in keys if k not in self.data]
        if missing:
            self.blocked.extend(missing)
            raise DistStoreError("wait timeout after 300000ms, keys: " + ", ".join(f"/{k}" for k in missing))

    def get(self, key: str) -> bytes:
        with self._lock:
            self._maybe_fail("get")
            self._present([key])
            return str(self.data[key]).encode()

    def append(self, key: str, value: str) -> None:
        with self._lock:
            self._maybe_fail("append")
            self.data[key] = str(self.data.get(key, "")) + value

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self._lock:
            self._maybe_fail("multi_get")
            self._present(keys)
            return [str(self.data[k]).encode() for k in keys]

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        with self._lock:
            self._maybe_fail("multi_set")
            self.data.update(zip(keys, values, strict=True))

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
        """torch's: set ``desired_value`` when the key holds ``expected_value`` (or is absent and
        ``expected_value`` is empty); the value the key holds afterwards (``expected_value`` when it is
        absent and nothing was set)."""
        with self._lock:
            self._maybe_fail("compare_set")
            if key not in self.data:
                if expected_value == "":
                    self.data[key] = desired_value
                    return desired_value.encode()
                return expected_value.encode()
            if str(self.data[key]) == expected_value:
                self.data[key] = desired_value
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
        """Rank ``r`` as it would have written its keys (``beats`` 0: it never reached the store)."""
        if beats > 0:
            liveness.join(self.store, r)
            self.store.data[f"hb/{r}"] = beats
            self.store.data[f"step/{r}"] = steps
        if exiting:
            liveness.mark(self.store, r, exiting)
        if beating:
            self.beating.add(r)

    def sleep(self, seconds: float) -> None:
        """Straight on the data: the beats are the ranks' store calls, not the observer's."""
        self.now += seconds
        joined = {int(w) for w in str(self.store.data.get(liveness.JOINED, "")).split(",") if w}
        for r in self.beating:
            self.store.data[f"hb/{r}"] = int(self.store.data.get(f"hb/{r}", 0)) + max(
                1, int(seconds / self.interval_s)
            )
            if r not in joined:  # a rank that starts beating has joined
                self.store.data.setdefault(f"step/{r}", 0)
                self.store.data.setdefault(liveness.MARKS, "")
                self.store.data[liveness.JOINED] = str(self.store.data.get(liveness.JOINED, "")) + f"{r},"

    def clock(self) -> float:
        return self.now


# -- a world of ranks as threads ------------------------------------------------------------------------


class Exited(Exception):
    """A fake session's process exit (the real one calls os._exit)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class World:
    """What every rank shares: the gathers (a barrier), the store's announcement and publisher lease,
    what went wrong."""

    size: int
    gather_timeout_s: float = 2.0
    announce_wait_s: float = 0.5
    fail_gather: dict[int, set[int]] = field(default_factory=dict)
    """gather index -> ranks whose gather fails (a peer dropped out)."""
    missing: list[int] = field(default_factory=list)
    """What liveness would name after a failure."""
    group_error: str | None = None
    """Every rank cannot use its --backend."""
    group_errors: dict[int, str] = field(default_factory=dict)
    """These ranks cannot use their --backend."""
    store_down: bool = False
    """Nobody reaches the store (its host is gone)."""
    stale_store: bool = False
    schema: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    """rank -> the schema its header claims (another checker version)."""
    frozen: set[int] = field(default_factory=set)
    """Ranks whose heartbeat stopped (killed or frozen): a rank waiting on one of them for the verdict
    sees its lease lapse (at once: the fake's clock)."""
    frozen_after: set[int] = field(default_factory=set)
    """Ranks frozen after the last gather: the publisher's wait for every rank to arrive names them."""

    def __post_init__(self) -> None:
        self.barrier = threading.Barrier(self.size)
        self.lock = threading.Lock()
        self.dropped = False
        self.slots: list[Any] = [None] * self.size
        self.announced: tuple[int, str] | None = None
        self.holders: list[int] = []
        """Who held the publisher lease, in turn (the last holds it)."""
        self.claims = 0
        """Claims of the publisher lease, won or not."""
        self.exiting: dict[int, str] = {}
        self.refused: dict[int, str] = {}
        """What ranks that cannot take part in the group said in the store."""
        self.waited_for_exit: set[int] = set()
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


def host_of(rank: int) -> str:
    """Where a fake world's rank runs: two ranks a node."""
    return f"node-{rank // 2}"


class FakeSession(SessionLike):
    """The session surface the run protocol uses (:class:`checker.distributed.exchange.SessionLike`),
    over a :class:`World`."""

    def __init__(self, world: World, rank: int) -> None:
        self.world = world
        self.env = RankEnv.from_environ(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world.size),
                "LOCAL_RANK": str(rank % 2),
                "LOCAL_WORLD_SIZE": "2",
                "CHECKER_HOSTNAME": host_of(rank),
            }
        )
        self.timings: dict[str, float] = {}
        self.on_abort: Callable[[str, bool], None] | None = None
        self.gathers = 0
        self.closed: tuple[int, bool] | None = None
        self.t0 = time.monotonic()
        self.store_lost = False
        self._joined = False
        self.needs_device: bool | None = None

    @property
    def is_rank0(self) -> bool:
        return self.env.rank == 0

    @property
    def device(self) -> None:
        return None

    @property
    def backend(self) -> str:
        return "gloo"

    @property
    def deadline(self) -> float:
        return self.t0 + 60.0

    @property
    def timeout_s(self) -> float:
        return 60.0

    @property
    def may_publish_alone(self) -> bool:
        return self.has_store or self.world.size == 1

    @property
    def joined(self) -> bool:
        return self._joined

    def await_joined(self) -> bool:
        return self._joined

    def arrive(self) -> None:
        pass

    def await_arrivals(self, within_s: float) -> Arrivals:
        """Every rank arrived, except those the world has frozen after the exchange."""
        return Arrivals(missing=sorted(self.world.frozen_after), cause=BEAT_STOPPED)

    @property
    def has_store(self) -> bool:
        return self._joined and not self.world.store_down

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def start(
        self,
        on_abort: Callable[[str, bool], None],
        *,
        on_lost: Callable[[Sequence[int]], None] | None = None,
        on_announced: Callable[[], None] | None = None,
        on_refused: Callable[[Sequence[int]], None] | None = None,
    ) -> FakeSession:
        self.on_abort = on_abort
        self.on_lost, self.on_announced, self.on_refused = on_lost, on_announced, on_refused
        return self

    def stand_down(self, finish_s: float) -> None:
        pass

    def make_group(self, *, needs_device: bool = True) -> None:
        self.needs_device = needs_device
        error = self.world.group_error or self.world.group_errors.get(self.env.rank)
        if error:
            raise FlagError(error)

    def join(self) -> None:
        if self.world.store_down:
            raise InfrastructureFailure("init", "the rendezvous store does not answer")
        if self.world.stale_store:
            raise StaleStore("the rendezvous store already holds an earlier run")
        self._joined = True

    def connect(self) -> None:
        self.join()

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

    def gather_payload(self, status: int, text: str, body: Sequence[int] | torch.Tensor) -> Gathered:
        """As the real one: the job's ints of every rank, (world_size, payload_len) int64 on CPU."""
        ints = body.reshape(-1).tolist() if isinstance(body, torch.Tensor) else [int(v) for v in body]
        rows = self._gather((status, text, ints))
        return Gathered(
            statuses=[r[0] for r in rows],
            messages=[r[1] for r in rows],
            body=torch.tensor([r[2] for r in rows], dtype=torch.int64),
        )

    def failed(self, detail: str, *, stopping: bool = False, behind_is_hung: bool = True) -> Abort:
        return Abort(detail=detail, missing_ranks=list(self.world.missing))

    def claim_publisher(
        self, *, default: bool, lost: Sequence[int] = (), unclaimed_by: Sequence[int] = ()
    ) -> bool:
        with self.world.lock:
            self.world.claims += 1
            if self.world.store_down:
                return default
            me, holders = self.env.rank, self.world.holders
            if not holders:
                holders.extend(r for r in unclaimed_by if r != me)
                holders.append(me)
            elif holders[-1] in lost and holders[-1] != me:
                holders.append(me)
            return holders[-1] == me

    def earlier_publishers(self) -> list[int]:
        return self.world.holders[:-1]

    def hosts(self, ranks: Sequence[int]) -> dict[int, str]:
        return {} if self.world.store_down else {r: host_of(r) for r in ranks}

    def refuse(self, message: str) -> None:
        self.join()
        self.world.refused[self.env.rank] = message

    def refusals(self, ranks: Sequence[int]) -> dict[int, str]:
        return {r: self.world.refused[r] for r in ranks if r in self.world.refused}

    def announcement(self) -> tuple[int, str] | None:
        return self.world.announced

    def shorten_store_timeout(self) -> None:
        pass

    def mark_exiting(self, why: str) -> None:
        self.world.exiting[self.env.rank] = why

    def announce(self, exit_code: int, line: str) -> None:
        with self.world.lock:  # the first announcement stands
            if self.world.announced is None:
                self.world.announced = (exit_code, line)

    def await_announcement(self, within_s: float, **kw: float) -> Wait:
        """Bounded by ``within_s`` and the world's ``announce_wait_s``; a holder in ``frozen`` is seen
        stopped at once."""
        if not self.has_store:
            return Wait()
        deadline = time.monotonic() + min(within_s, self.world.announce_wait_s)
        while True:
            if self.world.announced is not None:
                return Wait(announced=self.world.announced)
            holder = self.world.holders[-1] if self.world.holders else 0
            if holder in self.world.frozen:
                return Wait(stopped=holder, cause=BEAT_STOPPED)
            if time.monotonic() >= deadline:
                return Wait()
            time.sleep(0.002)

    def close(self, exit_code: int, *, clean: bool) -> int:
        self.closed = (exit_code, clean)
        return exit_code

    def exit_now(self, exit_code: int) -> NoReturn:
        raise Exited(exit_code)

    def wait_for_exit(self, seconds: float) -> NoReturn:
        """The real session sleeps for the other thread to end the process, then leaves itself with the
        verdict announced by then (else 3)."""
        self.world.waited_for_exit.add(self.env.rank)
        t0 = time.monotonic()  # real time, cut short: the other thread announces within milliseconds here
        while self.world.announced is None and time.monotonic() - t0 < min(seconds, 1.0):
            time.sleep(0.002)
        heard = self.world.announced
        raise Exited(heard[0] if heard is not None else EXIT_CODES[INFRASTRUCTURE_FAILURE])


class Killed(BaseException):
    """A fake rank killed (``kill -9``) at a point of the protocol: its thread ends there (no ``except
    Exception`` of the protocol catches it, as nothing in a killed process runs)."""


# -- a scripted job -------------------------------------------------------------------------------------


Outcome = tuple[Any, ...]
"""A fake job's outcome: ("decided", code, rows), ("errors", [lines]) or ("lost", detail, missing)."""


@dataclass
class FakeJob(Job[str, Outcome]):
    """A job whose pieces are scripted per rank (:class:`checker.distributed.exchange.Job`): its local
    facts are a string, its outcomes :data:`Outcome` tuples."""

    rank: int
    code: int = 0
    local_error: Exception | None = None
    payload_error: Exception | None = None
    payload_len: int = 2
    publish_problem: str | None = None
    publish_error: Exception | None = None
    publish_gate: threading.Event | None = None
    """publish waits for this (a slow report write), after setting ``publishing``."""
    before_publish: Callable[[], None] | None = None
    """Runs first when publishing (a slow report write on a virtual clock: tests/seam.py)."""
    dies_publishing: set[int] | None = None
    """Killed as it publishes: its rank joins this set (the world's ``frozen``: its beat stops)."""
    name: str = "fake"

    def __post_init__(self) -> None:
        self.published: list[Outcome] = []
        self.fallbacks: list[Outcome] = []
        self.publishing = threading.Event()

    def local(self, ctx: JobContext) -> str:
        if self.local_error is not None:
            raise self.local_error
        return f"facts of rank {self.rank}"

    def header(self, ctx: JobContext, local: str) -> Header:
        return Header(rank=self.rank, payload_len=self.payload_len)

    def mismatch(self, headers: Sequence[Header]) -> str | None:
        return None

    def payload(self, ctx: JobContext, local: str, headers: Sequence[Header]) -> tuple[str, list[int]]:
        if self.payload_error is not None:
            raise self.payload_error
        return local, [self.rank] * self.payload_len

    def decide(
        self, ctx: JobContext, local: str, gathered: torch.Tensor, headers: Sequence[Header]
    ) -> Outcome:
        return ("decided", self.code, gathered.tolist())

    def errors(self, ctx: JobContext, local: str | None, errors: Sequence[RankError]) -> Outcome:
        return ("errors", [e.line() for e in errors])

    def lost(self, ctx: JobContext, local: str | None, detail: str, missing_ranks: Sequence[int]) -> Outcome:
        return ("lost", detail, list(missing_ranks))

    def exit_code(self, outcome: Outcome) -> int:
        codes: dict[str, int] = {"decided": outcome[1], "errors": 2, "lost": 3}
        return codes[outcome[0]]

    def one_line(self, outcome: Outcome) -> str:
        return f"fake {outcome[0]}"

    def publish(self, ctx: JobContext, outcome: Outcome) -> str | None:
        if self.before_publish is not None:
            self.before_publish()
        if self.dies_publishing is not None:
            self.dies_publishing.add(self.rank)
            raise Killed(f"rank {self.rank} killed while publishing")
        self.publishing.set()
        if self.publish_gate is not None:
            self.publish_gate.wait(5)
        self.published.append(outcome)
        if self.publish_error is not None:
            raise self.publish_error
        return self.publish_problem

    def fallback(self, ctx: JobContext, outcome: Outcome) -> None:
        self.fallbacks.append(outcome)


def bad_input(message: str = "world_size 2 is not pp_size x tp_size") -> Exception:
    return LayoutError(message)


@dataclass
class RankRun:
    code: int | None = None
    error: BaseException | None = None


def run_ranks(
    world: World,
    jobs: Sequence[FakeJob],
    *,
    timeout_s: float = 10.0,
    refused: dict[int, str] | None = None,
) -> list[RankRun]:
    """Run the protocol on every rank at once (threads); each rank's exit code. ``refused``: ranks whose
    command line failed, with their messages."""
    results = [RankRun() for _ in jobs]

    def one(rank: int) -> None:
        said = (refused or {}).get(rank)
        try:
            results[rank].code = exchange.run(
                world.sessions[rank],
                jobs[rank],
                refused=RankError(message=said) if said is not None else None,
            )
        except Exited as exc:
            results[rank].code = exc.code
        except BaseException as exc:  # surfaced by the test
            results[rank].error = exc

    threads = [
        threading.Thread(target=one, args=(r,), daemon=True, name=f"rank-{r}") for r in range(world.size)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a rank never finished: the protocol hung"
    return results
