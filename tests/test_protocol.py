"""The run protocol (checker/distributed/exchange.py) on a fake world: every rank a thread, every gather
a barrier, every job piece scripted. Each failure branch ends with the right outcome published once and
the same exit code on every rank, in milliseconds. Real process groups: tests/test_check.py, test_faults.py.
"""

from __future__ import annotations

import threading

import pytest
from fakes import Exited, FakeJob, World, bad_input, run_ranks

from checker.distributed import exchange
from checker.distributed.wire import MAGIC, ROW_LEN


@pytest.fixture(autouse=True)
def _no_error_file(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.delenv("CHECKER_INJECT_FAULT", raising=False)


def jobs(n: int, **per_rank) -> list[FakeJob]:
    """``per_rank``: field -> {rank: value}."""
    return [FakeJob(rank=r, **{k: v[r] for k, v in per_rank.items() if r in v}) for r in range(n)]


def codes(results) -> list[int | None]:
    for r in results:
        if r.error is not None:
            raise r.error
    return [r.code for r in results]


def published(js: list[FakeJob]) -> list:
    """What was published on rank 0 and printed by others as a fallback (both should be rare)."""
    return [(j.rank, o) for j in js for o in j.published] + [
        (j.rank, "fallback", o) for j in js for o in j.fallbacks
    ]


def test_every_rank_leaves_with_the_decided_code_and_only_rank_0_publishes():
    """The happy path: one header gather, one payload gather; rank 0 publishes what every rank sent."""
    world, js = World(3), jobs(3, code={0: 1, 1: 1, 2: 1})
    assert codes(run_ranks(world, js)) == [1, 1, 1]
    assert published(js) == [(0, ("decided", 1, [[0, 0], [1, 1], [2, 2]]))]
    assert [s.gathers for s in world.sessions] == [2, 2, 2]
    assert all(s.closed == (1, True) for s in world.sessions)


def test_a_report_the_real_check_job_cannot_write_fails_a_passing_run_on_every_rank(
    monkeypatch, tmp_path, capfd
):
    """The real CheckJob on the real Session (tests/seam.py): a consistent world whose --report cannot be
    written (its directory is a file). The job says so, the protocol turns the pass into 2
    (checker.status.exit_after_outputs) and announces it, and every rank leaves with 2, the reason in
    torchrun's error file; the verdict still prints."""
    from seam import SeamWorld

    from checker.cli.main import build_parser, join_negative_values, with_default_command
    from checker.commands.check_config import config_from_args
    from checker.commands.check_job import CheckJob
    from checker.config import OutputOptions

    recorded: list[str] = []
    monkeypatch.setattr(exchange, "record_for_torchrun", recorded.append)
    (tmp_path / "taken").write_text("a file, not a directory")
    report = tmp_path / "taken" / "report.json"
    words = ["check", "--model", "kimi-k3", "--budget-gib", "8", "--mamba-full-memory-ratio", "0.5"]
    args = build_parser().parse_args(join_negative_values(with_default_command(words)))
    args.launch = None
    world = SeamWorld(2)
    js = []
    for process in world.processes:
        env = process.make_session(world.options).env
        js.append(CheckJob(config=config_from_args(args, env), output=OutputOptions(report=str(report))))
    before = [dict(vars(j)) for j in js]
    processes = world.run(js)
    assert [p.code for p in processes] == [2, 2]
    assert [dict(vars(j)) for j in js] == before  # a pure job: nothing kept between its calls
    line = world.value("report_written") or ""
    assert line.startswith("2\nchecker check error: cannot write --report"), line
    assert recorded == [line.partition("\n")[2]] * 2
    out, err = capfd.readouterr()
    assert "CONSISTENT" in out and not report.exists()
    # The verdict line says "(exit 0)"; the error line under it says the code the run leaves with.
    assert "(the verdict above stands, but the run exits 2: an output not delivered)" in err


def test_an_input_error_on_one_rank_is_named_and_every_rank_exits_2(capfd):
    """Rank 2's local facts fail: it still joins; the text gather carries its message; every rank
    ends on the same error outcome naming rank 2 (no payload gathered, nothing in the error file)."""
    world = World(4)
    js = jobs(4, local_error={2: bad_input("SGLANG_PP_LAYER_PARTITION=1,2,3 does not sum to 93")})
    assert codes(run_ranks(world, js)) == [2, 2, 2, 2]
    assert published(js) == [
        (0, ("errors", ["rank 2 (node-1): SGLANG_PP_LAYER_PARTITION=1,2,3 does not sum to 93"]))
    ]
    assert [s.gathers for s in world.sessions] == [2, 2, 2, 2]  # header + text


def test_ranks_own_errors_go_into_torchruns_error_file_once_per_node(monkeypatch):
    """An error before any row (a command line, an environment) is in every node's torchrun error file,
    once: its local rank 0 records the publisher's line (naming the rank and its host); the others do
    not repeat it."""
    import threading

    recorded: list[tuple[str, str]] = []
    monkeypatch.setattr(
        exchange, "record_for_torchrun", lambda line: recorded.append((threading.current_thread().name, line))
    )
    world = World(4)  # two ranks a node: node-0 holds ranks 0-1, node-1 ranks 2-3
    js = jobs(4, local_error={3: bad_input("no such model")})
    assert codes(run_ranks(world, js)) == [2] * 4
    assert sorted(recorded) == [("rank-0", "fake errors"), ("rank-2", "fake errors")]


def test_the_same_error_on_many_ranks_is_grouped():
    world = World(4)
    js = jobs(4, local_error={1: bad_input("A"), 2: bad_input("B"), 3: bad_input("A")})
    assert codes(run_ranks(world, js)) == [2] * 4
    assert js[0].published == [("errors", ["ranks 1, 3 (node-0, node-1): A", "rank 2 (node-1): B"])]


def test_an_unexpected_exception_in_local_facts_is_that_ranks_internal_error():
    world, js = World(2), jobs(2, local_error={0: UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid")})
    assert codes(run_ranks(world, js)) == [2, 2]
    ((kind, lines),) = js[0].published
    assert kind == "errors" and lines[0].startswith("rank 0 (node-0): internal error: UnicodeDecodeError:")


def test_a_payload_that_raises_still_joins_the_gather_and_is_named():
    """Rank 1's payload fails after the header gather (its environment, read late): it sends the
    agreed length with its message in the prefix, so nobody is left waiting in the gather."""
    world, js = World(3), jobs(3, payload_error={1: bad_input("cannot read the installed SGLang's metadata")})
    assert codes(run_ranks(world, js)) == [2, 2, 2]
    assert js[0].published == [("errors", ["rank 1 (node-0): cannot read the installed SGLang's metadata"])]


def test_a_refused_rank_joins_and_its_command_line_error_reaches_the_report():
    """Rank 3 could not parse its command line (no job to run): it joins with only its message, so
    rank 0's report names it and its host rather than an infrastructure failure naming nobody."""
    world, js = World(4), jobs(4)
    said = "checker check: error: unrecognized arguments: --polcy"
    assert codes(run_ranks(world, js, refused={3: said})) == [2, 2, 2, 2]
    assert js[0].published == [("errors", [f"rank 3 (node-1): {said}"])]
    # A rank that only reports needs no device (alone, it gathers with itself: no torch to import).
    assert [s.needs_device for s in world.sessions] == [True, True, True, False]


def test_ranks_of_another_wire_schema_stop_at_the_header():
    world, js = World(2), jobs(2)
    world.schema[1] = (MAGIC, 99, ROW_LEN + 5)
    assert codes(run_ranks(world, js)) == [2, 2]
    ((kind, (line,)),) = js[0].published
    assert (
        kind == "errors"
        and "ranks run different checker versions" in line
        and "rank 1 speaks wire schema 99" in line
    )


def test_payloads_of_different_lengths_are_never_gathered():
    world, js = World(2), jobs(2, payload_len={1: 3})
    assert codes(run_ranks(world, js)) == [2, 2]
    assert js[0].published == [
        ("errors", ["ranks send payloads of different lengths: rank 0 2 ints; rank 1 3 ints"])
    ]
    assert [s.gathers for s in world.sessions] == [1, 1]


@pytest.mark.parametrize("failure", ["stale_store", "group_error"])
def test_a_store_or_group_this_rank_cannot_use_is_an_error_and_no_exchange_happens(failure):
    """A reused --init-method file, a --backend no rank can use: error (2), unclean exit (no teardown of
    a group that never formed), no exchange attempted. The backend's error names each rank: here rank
    0's, published at once."""
    world = World(2)
    if failure == "stale_store":
        world.stale_store = True
    else:
        world.group_error = "--backend nccl needs a CUDA GPU and this rank sees none; use --backend gloo"
    js = jobs(2)
    assert codes(run_ranks(world, js)) == [2, 2]
    ((kind, lines),) = js[0].published
    assert kind == "errors"
    if failure == "group_error":
        assert lines == [f"rank 0 (node-0): {world.group_error}"]
    assert all(s.closed == (2, False) for s in world.sessions)
    assert [s.gathers for s in world.sessions] == [0, 0]


def test_a_rank_that_cannot_use_its_backend_is_named_by_rank_0_while_the_others_wait():
    """Rank 2 alone was given --backend nccl on a CPU node: it cannot take part in the group, so it
    joins the store only and says why there; rank 0's watcher (still waiting to form the group) ends
    the run with an error naming rank 2 and its host, and rank 2 leaves with that verdict: never an
    infrastructure failure naming nobody."""
    world = World(4, announce_wait_s=5)
    why = "--backend nccl needs a CUDA GPU and this rank sees none; use --backend gloo"
    world.group_errors[2] = why
    js = jobs(4)
    outside: list = []
    t = threading.Thread(target=lambda: outside.append(exchange.run(world.sessions[2], js[2])))
    t.start()
    deadline = __import__("time").monotonic() + 5
    while 2 not in world.refused and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.005)
    assert world.refused == {2: why}
    rank0 = exchange._Run(world.sessions[0], js[0], refused=None)
    with pytest.raises(Exited) as exited:
        rank0.refusal_seen([2])  # rank 0's watcher, while its main thread waits in the rendezvous
    t.join(5)
    assert exited.value.code == 2 and outside == [2]
    assert js[0].published == [("errors", [f"rank 2 (node-1): {why}"])]
    assert world.announced == (2, "fake errors") and not js[2].published


def test_a_failed_collective_is_lost_on_every_rank_and_rank_0_names_the_gone():
    """The payload gather fails (a peer dropped out): rank 0 names the gone ranks and publishes; the
    others adopt its announcement without looking for the gone ranks themselves."""
    world = World(3, missing=[2])
    world.fail_gather[2] = {2}
    js = jobs(3)
    assert codes(run_ranks(world, js)) == [3, 3, 3]
    assert js[0].published == [("lost", "exchange: a peer left the gather", [2])]
    assert not js[1].fallbacks and all(s.closed[1] is False for s in world.sessions)


def test_a_rank_no_verdict_can_reach_prints_its_own():
    """Rank 0 is alive but never announces within the wait (a publish that hangs), and its beat goes
    on: nobody takes a live publisher's lease, so each other rank prints the outcome itself rather
    than leaving without a word."""
    world = World(3, missing=[0], announce_wait_s=0.05)
    world.fail_gather[1] = {0}
    js = jobs(3)
    js[0].publish_gate = threading.Event()  # rank 0 hangs in its publish
    threading.Timer(0.5, js[0].publish_gate.set).start()
    assert codes(run_ranks(world, js)) == [3, 3, 3]
    assert js[1].fallbacks == [("lost", "exchange: a peer left the gather", [0])]
    assert js[2].fallbacks == js[1].fallbacks


@pytest.mark.parametrize("when", ["holding the lease", "before claiming it"])
def test_rank_0_lost_after_the_exchange_leaves_exactly_one_report_naming_it(when):
    """Every rank decided (consistent) and rank 0 is killed, either while it publishes (it holds the
    publisher lease) or before it claimed it: its beat stops, one survivor takes the lease over and
    publishes an infrastructure failure naming rank 0 (the decided verdict in its detail: a rank was
    lost, so the run cannot pass), the other adopts that verdict. Before, both printed "consistent"
    and left with 0, and no report was written."""
    from fakes import Killed

    world = World(3)
    js = jobs(3, code={0: 0, 1: 0, 2: 0})
    if when == "holding the lease":
        js[0].dies_publishing = world.frozen
    else:
        world.frozen.add(0)
        world.sessions[0].claim_publisher = lambda **kw: (_ for _ in ()).throw(Killed("rank 0 killed"))
    results = run_ranks(world, js)
    assert isinstance(results[0].error, Killed)
    assert [r.code for r in results[1:]] == [3, 3]
    ((writer, outcome),) = [(j.rank, o) for j in js for o in j.published]
    assert writer in (1, 2) and outcome[0] == "lost" and outcome[2] == [0]
    assert outcome[1].startswith("rank 0 (node-0) stopped beating") and "fake decided" in outcome[1]
    assert world.announced == (3, "fake lost") and world.holders[-1] == writer
    assert not js[1].fallbacks and not js[2].fallbacks
    assert all(s.closed == (3, False) for s in world.sessions[1:])  # no teardown of a group short of a rank


def test_a_stand_in_lost_in_turn_is_taken_over_by_the_next_survivor():
    """Rank 0 and then rank 1, its stand-in, are killed while publishing: the lease passes once more,
    to rank 2, and its verdict names both (the lease keeps every holder in turn)."""
    import time

    world = World(3)
    js = jobs(3)
    js[0].dies_publishing = world.frozen
    js[1].dies_publishing = world.frozen
    later = world.sessions[2].await_announcement

    def rank_2_looks_later(within_s: float, **kw: float):
        time.sleep(0.2)  # rank 1 takes the lease first
        return later(within_s, **kw)

    world.sessions[2].await_announcement = rank_2_looks_later  # type: ignore[method-assign]
    results = run_ranks(world, js)
    assert [type(r.error).__name__ for r in results[:2]] == ["Killed", "Killed"] and results[2].code == 3
    assert [(j.rank, o[0], o[2]) for j in js for o in j.published] == [(2, "lost", [0, 1])]
    assert world.holders == [0, 1, 2]


@pytest.mark.parametrize("sigterm", [False, True])
def test_the_watchdog_or_sigterm_publishes_a_lost_outcome_and_leaves_with_3(sigterm):
    """Rank 0's abort names the gone ranks and publishes; another rank told to stop (SIGTERM) only
    marks itself as leaving, while one whose watchdog fired prints its own (and marks itself too)."""
    from checker.distributed.exchange import _Run

    world = World(2, missing=[1])
    js = jobs(2)
    for rank in (1, 0):  # rank 1 first: once rank 0 has published, an abort adopts its verdict
        run = _Run(world.sessions[rank], js[rank], refused=None)
        world.sessions[rank].start(run.abort)
        world.sessions[rank].join()  # in the run: a rank that never joined publishes nothing
        with pytest.raises(Exited) as exited:
            run.abort("no verdict within --timeout-s 5 s + 10 s (watchdog)", sigterm)
        assert exited.value.code == 3
    assert js[0].published == [("lost", "no verdict within --timeout-s 5 s + 10 s (watchdog)", [1])]
    assert world.announced == (3, "fake lost")  # ranks still waiting on rank 0 stop waiting
    assert js[1].fallbacks == ([] if sigterm else [js[0].published[0]])
    why = "sigterm" if sigterm else "watchdog"  # neither rank is blamed for stopping
    assert world.exiting == {0: why, 1: why}


def test_an_abort_adopts_a_verdict_already_published():
    """The publisher announced and left; torchrun then SIGTERMs this rank before it read the
    announcement: it leaves with the published code (2 here), not an infrastructure failure of its own."""
    world = World(2)
    world.announced = (2, "checker verdict error: rank 1 (node-0): bad flag")
    js = jobs(2)
    run = exchange._Run(world.sessions[1], js[1], refused=None)
    with pytest.raises(Exited) as exited:
        run.abort("terminated by SIGTERM", True)
    assert exited.value.code == 2 and not js[1].published and not js[1].fallbacks
    assert world.exiting == {1: "done"}


def test_sigterm_while_rank_0_publishes_never_publishes_twice_and_leaves_with_its_code():
    """Rank 0 is publishing its verdict when SIGTERM arrives: the verdict is published once, with its own
    exit code; SIGTERM's thread publishes nothing of its own but waits (bounded) for the process to end,
    and leaves with that verdict's code if it has not (before issue 37 it returned and ignored the signal,
    so a rank stuck after publishing lived until torchrun's SIGKILL)."""
    world = World(1)
    gate = threading.Event()
    js = jobs(1, code={0: 1}, publish_gate={0: gate})
    session = world.sessions[0]
    left: list[int] = []

    def sigterm_while_publishing() -> None:
        assert js[0].publishing.wait(5)

        def announce_then_end() -> None:
            gate.set()  # the main thread finishes publishing and announces

        threading.Timer(0.05, announce_then_end).start()
        try:
            session.on_abort("terminated by SIGTERM", True)
        except Exited as exited:  # the fake's exit: the real one ends the process with this code
            left.append(exited.code)

    t = threading.Thread(target=sigterm_while_publishing)
    t.start()
    assert codes(run_ranks(world, js)) == [1]
    t.join(5)
    assert js[0].published == [("decided", 1, [[0, 0]])]
    assert left == [1] and 0 in world.waited_for_exit  # the SIGTERM thread adopted the published code


def test_a_bug_in_publishing_leaves_a_traceback_and_fails_the_run(capfd):
    world, js = World(2), jobs(2, publish_error={0: ZeroDivisionError("in a renderer")})
    assert codes(run_ranks(world, js)) == [2, 2]
    err = capfd.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: in a renderer" in err
