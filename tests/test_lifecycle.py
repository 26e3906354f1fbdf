"""One lifecycle for every rank (issue 28), and every error named with its rank and host (issue 27).

A rank refused at parse time runs the same run protocol as every other rank, with the group and output
flags its own parser reads (``checker/cli/refusal.py``: abbreviations included); an output that cannot
be written fails the run the same way in every command; the report names where each rank ran (its host,
torchrun's node number and the operator's NODE_RANK); ``launchers/read-verdict.sh`` prints why a run did
not pass. In-process where possible; real worlds (``slow``) where only ranks meeting can show it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checker.cli.main import build_parser
from checker.cli.refusal import UNREADABLE_BACKEND, group_flags
from checker.status import EXIT_CODES

KIMI = ["--model", "kimi-k3", "--budget-gib", "8"]
REPO = Path(__file__).resolve().parent.parent


def flags(command: str, *words: str):
    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    return group_flags(sub.choices[command], list(words))


# -- a refused rank reads its own flags with its own parser ----------------------------------------------


def test_a_refused_rank_reads_abbreviated_group_and_output_flags_as_its_parser_does():
    """`--timeout 5 --back gloo --rep r.json` beside a flag the parser refuses: the rank still meets the
    others with timeout 5 and gloo, and rank 0 writes r.json (the hand-made reader took 60 s, auto and
    no report)."""
    got = flags("check", *KIMI, "--polcy", "own-share", "--timeout", "5", "--back", "gloo", "--rep", "r.json")
    assert (got.group.timeout_s, got.group.backend, got.output.report) == (5.0, "gloo", "r.json")
    got = flags("check", "--junit=j.xml", "--format=json", "-q", "--init-method=env://", "--zzz")
    assert (got.output.junit, got.output.format, got.output.quiet, got.group.init_method) == (
        "j.xml",
        "json",
        True,
        "env://",
    )
    # sweep's own options: --report, no --junit.
    got = flags("sweep", "--budgets", "8,16", "--rep", "s.json", "--polcy", "x")
    assert (got.output.report, got.output.junit) == ("s.json", None)


def test_a_refused_value_takes_the_flags_default_but_a_backend_is_kept_as_typed():
    """A --timeout-s the flag refuses takes its default, an --init-method it refuses none (torchrun's
    store); a --backend it refuses is kept as typed, so the rank never guesses a backend its peers may
    not use (it then takes part through the store only)."""
    got = flags("check", "--timeout-s", "-5", "--init-method", "bogus://x", "--backend", "ncl")
    assert (got.group.timeout_s, got.group.init_method, got.group.backend) == (60.0, None, "ncl")


def test_a_command_line_that_cannot_be_split_leaves_the_backend_unknown():
    got = flags("check", "--timeout-s")  # a flag missing its value: nothing is readable
    assert got.group.backend == UNREADABLE_BACKEND and got.output.report is None


def test_a_refused_rank_alone_writes_its_error_report_through_an_abbreviated_flag(cli, tmp_path):
    """A world of one (no torchrun) with a mistyped flag: one line, exit 2, and the error report CI
    reads, written where the abbreviated --rep says."""
    report = tmp_path / "r.json"
    res = cli(["check", *KIMI, "--polcy", "x", "--rep", str(report)])
    assert res.rc == 2 and res.out == ""
    (line,) = res.err.splitlines()
    assert "unrecognized arguments: --polcy" in line
    doc = json.loads(report.read_text())
    assert (doc["status"], doc["exit_code"], doc["errors"]) == ("error", 2, [line])


def test_a_usage_error_alone_never_imports_torch():
    """The refused rank of a world of one gathers with itself: a usage error costs no torch import
    (2.5 s on a loaded node) and still runs the one lifecycle."""
    code = (
        "import sys\nfrom checker.cli.main import main\n"
        "rc = main(['check', '--model', 'kimi-k3', '--budget-gib', '8', '--polcy', 'x'])\n"
        "print(rc, 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.stdout.split() == ["2", "False"], proc.stderr


# -- one policy for an output that cannot be written ---------------------------------------------------


def test_an_output_that_cannot_be_written_fails_a_passing_sweep(cli):
    """sweep in one process whose findings pass (exit 0) but whose --report cannot be written: the
    findings still print, one line names the report, and the run exits 2: CI never reads a pass from
    a report that is not there (check does the same: tests/test_protocol.py)."""
    res = cli(["sweep", "--budgets", "8,16", "--no-progress", "-q", "--report", "/proc/self/cannot.json"])
    assert res.rc == EXIT_CODES["error"], res
    assert "required consistent" in res.out
    assert (
        res.err.strip()
        == "checker sweep: error: cannot write --report /proc/self/cannot.json: No such file or directory "
        "(the verdict above stands, but the run exits 2: an output not delivered)"
    )


# -- read-verdict.sh says why -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "why"),
    [
        (
            {"status": "error", "errors": ["rank 3 (node-b): checker check: error: bad flag\x1b[31m"]},
            "read-verdict: error: rank 3 (node-b): checker check: error: bad flag\\x1b[31m",
        ),
        (
            {
                "status": "infrastructure_failure",
                "infrastructure_detail": "rank 0 (node-a) stopped",
                "missing_ranks": [0],
            },
            "read-verdict: infrastructure_failure: rank 0 (node-a) stopped; missing ranks: 0",
        ),
        (
            {"status": "divergent", "root_causes": ["ranks 1-3 have --page-size=64", "x"]},
            "read-verdict: divergent: root cause: ranks 1-3 have --page-size=64 | x",
        ),
    ],
)
def test_read_verdict_prints_the_root_cause_line(tmp_path, report, why):
    """stdout stays the status alone (scripts capture it); stderr gets one line saying why, its control
    characters escaped (a report is data, not terminal codes)."""
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**report, "exit_code": EXIT_CODES[report["status"]]}))
    proc = subprocess.run(
        ["bash", str(REPO / "launchers" / "read-verdict.sh"), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (EXIT_CODES[report["status"]], report["status"] + "\n")
    assert proc.stderr == why + "\n"


# -- real worlds: every error names its rank and host ---------------------------------------------------


def _hosts(world: int) -> dict[int, dict[str, str]]:
    return {r: {"CHECKER_HOSTNAME": f"node-{r // 2}"} for r in range(world)}


@pytest.mark.slow
def test_a_rank_that_cannot_use_its_backend_is_named_with_its_host(tmp_path):
    """Rank 2 alone given --backend nccl on a CPU node: every rank exits 2 and the report says error,
    naming rank 2 and its host (it was an infrastructure failure naming nobody, with networking
    advice): rank 2 says why in the rendezvous store and rank 0's watcher publishes it."""
    from harness import run_world

    argv = ["check", *KIMI, "--timeout-s", "60"]
    res = run_world(
        argv,
        world_size=4,
        tmp_path=tmp_path,
        rank_env=_hosts(4),
        rank_argv={2: [*argv, "--backend", "nccl"]},
    )
    assert res.codes == [2, 2, 2, 2], [r.stderr[-800:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "error" and rep["missing_ranks"] == []
    assert rep["errors"] == [
        "rank 2 (node-1): --backend nccl needs a CUDA GPU and this rank sees none; use --backend gloo"
    ]
    assert max(r.elapsed_s for r in res.ranks) < 45, [round(r.elapsed_s, 1) for r in res.ranks]


@pytest.mark.slow
def test_the_report_records_the_operators_node_rank_beside_torchruns(tmp_path):
    """Each rank's entry gives torchrun's GROUP_RANK (`node_rank`) and the NODE_RANK the operator
    exported on its node (`operator_node_rank`, null where unset): under c10d the two differ."""
    from harness import run_world

    envs = {0: {"NODE_RANK": "1"}, 1: {"NODE_RANK": "0", "GROUP_RANK": "1"}}
    res = run_world(["check", *KIMI, "--timeout-s", "60"], world_size=2, tmp_path=tmp_path, rank_env=envs)
    assert res.codes == [0, 0], [r.stderr[-800:] for r in res.ranks]
    ranks = res.report()["ranks"]
    assert [(r["node_rank"], r["operator_node_rank"]) for r in ranks] == [(0, 1), (1, 0)]


WRAPPER = """\
import os, sys
rank = os.environ.get("RANK", "0")
os.environ["CHECKER_HOSTNAME"] = "node-" + str(int(rank) // 2)
argv = sys.argv[1:]
extra = os.environ.get("TEST_EXTRA_ARGV_RANK_" + rank)
if extra:
    argv += extra.split()
from checker.cli.main import main
sys.exit(main(argv))
"""


def _torchrun(tmp_path: Path, extra: dict[int, str]) -> tuple[subprocess.CompletedProcess[str], dict]:
    wrapper = tmp_path / "rank_wrapper.py"
    wrapper.write_text(WRAPPER)
    report = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.update({f"TEST_EXTRA_ARGV_RANK_{r}": words for r, words in extra.items()})
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "--max-restarts", "0", str(wrapper), *KIMI, "--timeout-s", "30", "--report", str(report),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert report.exists(), f"no report: {proc.stderr[-2000:]}"
    return proc, json.loads(report.read_text())


@pytest.mark.slow
def test_a_rank_whose_init_method_is_refused_still_meets_the_others_under_torchrun(tmp_path):
    """Rank 2 alone given --init-method bogus://x: its parser refuses it, and the rank meets the others
    through torchrun's own store, so the report names rank 2 and its host (it was an infrastructure
    failure naming nobody)."""
    proc, rep = _torchrun(tmp_path, {2: "--init-method bogus://x"})
    assert rep["status"] == "error", rep
    (error,) = rep["errors"]
    assert error.startswith("rank 2 (node-1): checker check: error: --init-method"), error


@pytest.mark.slow
def test_a_usage_error_on_one_node_is_named_in_torchruns_error_file_on_every_node(tmp_path):
    """Rank 3 (node 1) mistyped a flag: the report names rank 3 and its host, the line is printed once
    by the checker, and torchrun's own summary (its error file, on each node's local rank 0) quotes it
    rather than only a traceback hint."""
    proc, rep = _torchrun(tmp_path, {3: "--polcy own-share"})
    said = (
        "rank 3 (node-1): checker check: error: unrecognized arguments: --polcy; did you mean --policy? "
        "(see checker check --help)"
    )
    assert rep["errors"] == [said], rep
    printed = [line for line in proc.stderr.splitlines() if "unrecognized arguments: --polcy" in line]
    by_torchrun = [line for line in printed if "traceback :" in line]
    assert len(printed) - len(by_torchrun) == 1, proc.stderr[-3000:]
    assert by_torchrun and all(said in line for line in by_torchrun), proc.stderr[-3000:]


def test_a_postflight_that_cannot_write_its_report_fails_too(cli, tmp_path):
    """The same policy in the post-flight: its findings print, one line names the file, exit 2 for a
    start that held to nothing worse."""
    logs = REPO / "examples" / "logs"
    res = cli(
        [
            "postflight",
            "--report",
            str(logs / "preflight.json"),
            "--postflight-report",
            "/proc/self/cannot.json",
            str(logs / "node0.log"),
            str(logs / "node1.log"),
        ]
    )
    assert res.rc == EXIT_CODES["error"], res
    said = "checker postflight: error: cannot write --postflight-report /proc/self/cannot.json"
    assert res.out and said in res.err
    assert "the run exits 2: an output not delivered" in res.err  # the verdict printed says exit 0


def test_checks_publisher_says_what_it_could_not_write(capsys):
    """The real check job hands the protocol what it could not write (the protocol then fails the run:
    tests/test_protocol.py), where it used to print a warning and let the run pass."""
    from checker.commands.check_job import CheckJob
    from checker.config import OutputOptions
    from checker.distributed.exchange import JobContext, RankError
    from checker.distributed.launch_env import RankEnv

    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2"})
    ctx = JobContext(env=env, backend="gloo", device=None, deadline=0.0, elapsed_s=0.1)
    output = OutputOptions(report="/proc/self/cannot.json")
    job = CheckJob(config=None, output=output)
    outcome = job.errors(ctx, None, [RankError(message="bad flag", ranks=(1,), hosts={1: "node-b"})])
    problem = job.publish(ctx, outcome)
    assert problem == "cannot write --report /proc/self/cannot.json: No such file or directory"
    assert capsys.readouterr().err == "rank 1 (node-b): bad flag\n"
