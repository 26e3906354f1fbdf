"""``--weights-from-log``: each rank's weights figure from an earlier start's own log, for check and plan.

What a user relies on: check takes rank r's figure from the line of SGLang's process PP(r // group)
TP(r % group), in rank order, and says where it came from; plan takes the busiest rank's; a log that
lacks a rank of the layout, or is another layout's, or has no weights line, is one line (exit 2), never
a figure for the wrong rank. The loop closes: a preflight fed the log of a start, and that start's log
held to the preflight's report, is consistent (``slow``: a real 4-rank world).
"""

from __future__ import annotations

import json

import pytest
from harness import run_world
from postflight_logs import ServerLog, preflight_report

from checker.cli.main import build_parser
from checker.commands.check_config import config_from_args
from checker.core.errors import FlagError
from checker.distributed.launch_env import RankEnv

WEIGHTS = {0: 18.75, 1: 18.5, 2: 17.25, 3: 17.0, 4: 17.0, 5: 16.75, 6: 19.5, 7: 19.25}


def _env(world: int) -> RankEnv:
    return RankEnv(
        rank=0,
        world_size=world,
        local_rank=0,
        local_world_size=world,
        node_rank=0,
        host="h",
        master_addr=None,
        master_port=None,
        use_agent_store=False,
        restart_count=0,
        max_restarts=0,
    )


def _check_config(argv: list[str], world: int):
    args = build_parser(only="check").parse_args(["check", "--model", "kimi-k3", *argv])
    args.launch = None
    return config_from_args(args, _env(world))


@pytest.fixture
def log(tmp_path):
    """A start of pp 4 x tp 2 whose ranks logged WEIGHTS, as two nodes' logs."""
    report = preflight_report(8, sizing={"tp_size": 2})
    text = ServerLog(report, weights_gib=WEIGHTS.__getitem__)
    paths = []
    for node in range(2):
        p = tmp_path / f"node{node}.log"
        p.write_text(text.text(ranks=list(range(4 * node, 4 * node + 4))))
        paths.append(str(p))
    return paths


def test_check_takes_each_ranks_figure_in_rank_order_and_says_where_from(log):
    config = _check_config(
        [
            "--tp-size",
            "2",
            "--budget-from-device",
            "--mem-fraction-static",
            "0.85",
            "--weights-from-log",
            log[0],
            "--weights-from-log",
            log[1],
        ],
        8,
    )
    assert config.budget.weights_gib == tuple(WEIGHTS[r] for r in range(8))
    assert config.budget.weights_source == f"--weights-from-log {log[0]}, {log[1]}"
    assert config.budget.label.endswith(f"(--weights-from-log {log[0]}, {log[1]}), MIN over ranks")


@pytest.mark.parametrize(
    ("argv", "world", "says"),
    [
        (
            ["--tp-size", "2", "--budget-from-device", "--mem-fraction-static", "0.85"],
            8,
            "no 'Load weight end. ... mem usage=' line of PP2 TP0, PP2 TP1",
        ),
        (
            ["--tp-size", "1", "--budget-from-device", "--mem-fraction-static", "0.85"],
            4,
            "the log has rank PP0 TP1 beyond this layout (pp 4 x tp 1)",
        ),
        (["--tp-size", "2", "--budget-gib", "8"], 8, "give it with --budget-from-device"),
        (
            ["--tp-size", "2", "--budget-from-device", "--mem-fraction-static", "0.85", "--weights-gib", "9"],
            8,
            "without --weights-gib",
        ),
    ],
    ids=["a-node-missing", "another-layout", "fixed-budget", "both-figures"],
)
def test_check_refuses_a_log_that_does_not_give_every_rank_its_figure(log, argv, world, says):
    with pytest.raises(FlagError) as exc:
        _check_config([*argv, "--weights-from-log", log[0]], world)
    assert says in str(exc.value)


def test_plan_takes_the_busiest_ranks_figure(cli, log):
    r = cli(
        [
            "plan",
            "--model",
            "kimi-k3",
            "--pp-size",
            "4",
            "--tp-size",
            "2",
            "--target-max-running-requests",
            "48",
            "--gpu-free-gib",
            "139",
            "--weights-from-log",
            log[0],
            "--weights-from-log",
            log[1],
        ]
    )
    assert r.rc == 0, r.err
    assert (
        "before 19.5 GiB of weights (the largest mem usage in "
        f"--weights-from-log {log[0]}, {log[1]}, [PP3 TP0])" in r.out
    )
    by_hand = cli(
        [
            "plan",
            "--model",
            "kimi-k3",
            "--pp-size",
            "4",
            "--tp-size",
            "2",
            "--target-max-running-requests",
            "48",
        ]
        + ["--gpu-free-gib", "139", "--weights-gib", "19.5"]
    )
    fractions = [line for line in r.out.splitlines() if "--mem-fraction-static 0." in line]
    assert fractions and fractions == [
        line for line in by_hand.out.splitlines() if "--mem-fraction-static 0." in line
    ]


def test_a_log_without_a_weights_line_is_one_line(cli, tmp_path):
    p = tmp_path / "x.log"
    p.write_text(
        "[2026-01-01 00:00:00 PP0] Mamba Cache is allocated. max_mamba_cache_size: 8, "
        "conv_state size: 0.10GB, ssm_state size: 0.20GB\n"
    )
    r = cli(
        [
            "plan",
            "--model",
            "kimi-k3",
            "--target-max-running-requests",
            "8",
            "--gpu-free-gib",
            "80",
            "--weights-from-log",
            str(p),
        ]
    )
    assert r.rc == 2
    (line,) = r.err.strip().splitlines()
    assert "no 'Load weight end. ... mem usage=X GB.' line; give --weights-gib" in line


@pytest.mark.slow
def test_the_loop_closes_preflight_from_a_logs_weights_then_that_start_held_to_it(cli, tmp_path, log):
    """4 ranks (pp 2 x tp 2) under a real gloo world: the preflight takes each rank's weights from the
    log, and the server's log, held to the preflight's report, is consistent."""
    report_4 = preflight_report(4, sizing={"tp_size": 2})
    start = ServerLog(report_4, weights_gib=WEIGHTS.__getitem__)
    server_log = tmp_path / "server.log"
    server_log.write_text(start.text())
    world = run_world(
        ["check", "--model", "kimi-k3", "--tp-size", "2", "--budget-from-device", "--device-free-gib", "120"]
        + ["--mem-fraction-static", "0.9", "--mamba-full-memory-ratio", "0.5"]
        + ["--weights-from-log", str(server_log)],
        world_size=4,
        tmp_path=tmp_path,
    )
    assert world.codes == [0, 0, 0, 0], [r.stderr[-500:] for r in world.ranks]
    preflight = world.report()
    assert preflight["weights_gib"] == [WEIGHTS[r] for r in range(4)]
    assert preflight["weights_source"] == f"--weights-from-log {server_log}"
    # the server's start, as predicted: its K and limits are the preflight's own
    served = ServerLog(preflight, weights_gib=WEIGHTS.__getitem__)
    server_log.write_text(served.text())
    (tmp_path / "preflight.json").write_text(json.dumps(preflight))
    r = cli(["postflight", "--report", str(tmp_path / "preflight.json"), str(server_log), "--format", "json"])
    doc = json.loads(r.out)
    assert r.rc == 0 and doc["status"] == "consistent", doc["checks"]
    assert {c["status"] for c in doc["checks"] if c["value"] == "weights_gib"} == {"ok"}
