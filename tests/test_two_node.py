"""A genuine two-node torchrun job: two network namespaces joined by a veth pair, one
``launchers/torchrun.sh`` agent in each, the checker's ranks talking gloo across the link.

The normal verdicts first (consistent, divergent, an input set on one node only, a node started with
another launch command, a rolling upgrade with another SGLang release installed on each node), then the
failures of real clusters: a worker killed, a worker frozen, the link cut mid-run, a node that never
arrives. Each fault must end in bounded time with an ``infrastructure_failure`` report from rank 0 that
names the ranks that were lost where they can be known. Needs root (skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import netns
import pytest
from test_upgrade import FLAGS as UPGRADE
from test_upgrade import NEW, OLD, assert_half_upgraded, assert_one_release

pytestmark = pytest.mark.netns

KIMI = ["--model", "kimi-k3", "--budget-gib", "8", "--mamba-full-memory-ratio", "0.5"]
FAULT_TIMEOUT_S = 6
"""--timeout-s for the fault tests: how long a rank waits for a lost peer."""
GRACE_S = 10.0
"""What a surviving rank may take beyond --timeout-s after the fault: rank 0 waits 3 s for survivors to
check in, the others up to 5 s for its report, plus 2 s of scheduling on two loaded cores."""
AGENT_START_S = 30.0
"""torchrun imports torch before it rendezvouses: seconds on two cores that other jobs load too."""
AGENT_LIMIT_S = 90.0
"""Outer bound on every agent: past it the agent's whole process group is killed and the test fails."""
READ_VERDICT = netns.REPO_ROOT / "launchers" / "read-verdict.sh"


@pytest.fixture
def pair():
    """Two fresh namespaces, deleted with everything running in them when the test ends (pass or fail)."""
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cm = netns.node_pair()
    try:
        p = cm.__enter__()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.skip(netns.make_error(exc))
    try:
        yield p
    finally:
        cm.__exit__(None, None, None)


@dataclass
class PairRun:
    codes: dict[int, int | None]
    """Exit code of each node's agent that the run waited for (None: killed at the outer bound)."""
    agents: list[netns.Agent]
    ranks: dict[int, netns.RankProc]
    report_path: Path
    fault_at: float | None

    def report(self) -> dict:
        assert self.report_path.exists(), "rank 0 wrote no report:\n" + self.logs()
        return json.loads(self.report_path.read_text())

    def logs(self) -> str:
        return "\n".join(
            f"--- {a.log.stem} (exit {a.proc.returncode}, {a.elapsed_s:.1f} s)\n{a.output()[-3000:]}"
            for a in self.agents
        )

    def timeline(self) -> str:
        t0 = min(a.started for a in self.agents)
        rel = lambda t: "-" if t is None else f"{t - t0:.1f}"
        rows = [
            f"rank {r} node {p.node}: seen {rel(p.seen)} stopped {rel(p.stopped_at)} ended {rel(p.ended)}"
            for r, p in sorted(self.ranks.items())
        ]
        rows += [f"{a.log.stem} agent: exit {a.proc.returncode} at {rel(a.ended)}" for a in self.agents]
        return f"timeline (s from launch; fault at {rel(self.fault_at)}): " + "; ".join(rows)

    def on_node(self, index: int) -> list[int]:
        return sorted(r for r, p in self.ranks.items() if p.node == index)


def run_pair(
    pair: netns.NodePair,
    tmp_path: Path,
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    node_env: dict[int, dict[str, str]] | None = None,
    node_args: dict[int, list[str]] | None = None,
    nodes: tuple[int, ...] = (0, 1),
    wait_nodes: tuple[int, ...] | None = None,
    lost: frozenset[int] = frozenset(),
    rdzv_conf: str = "join_timeout=30",
    during=None,
) -> PairRun:
    """Launch the agents (node i with ``node_args[i]`` in place of ``args``); ``during(watch)`` may act
    mid-run and returns the fault's time. Then wait (bounded) for the agents in ``wait_nodes`` and for
    every rank not in ``lost`` to end. Agents left running are killed with their namespaces by the
    fixture. ``--report`` goes before a ``--`` (after it would be the launch command's)."""
    report = tmp_path / "report.json"

    def with_report(words: list[str]) -> list[str]:
        cut = words.index("--") if "--" in words else len(words)
        return [*words[:cut], "--report", str(report), *words[cut:]]

    with netns.RankWatch(pair) as watch:
        agents = [
            pair.launch(
                i,
                with_report((node_args or {}).get(i, args)),
                log_dir=tmp_path,
                rdzv_conf=rdzv_conf,
                env={**(env or {}), **(node_env or {}).get(i, {})},
            )
            for i in nodes
        ]
        fault_at = during(watch) if during is not None else None
        codes = {
            a.node.index: a.wait(AGENT_LIMIT_S - a.elapsed_s)
            for a in agents
            if a.node.index in (nodes if wait_nodes is None else wait_nodes)
        }
        watch.wait_until(
            lambda ranks: all(p.ended is not None for r, p in ranks.items() if r not in lost),
            timeout_s=max(1.0, AGENT_LIMIT_S - agents[0].elapsed_s),
        )
        ranks = watch.snapshot()
    run = PairRun(codes=codes, agents=agents, ranks=ranks, report_path=report, fault_at=fault_at)
    print(run.timeline())  # shown when a test fails (and with -s): when each rank ran and ended
    return run


def assert_node0_exit_code(run: PairRun, code: int) -> None:
    """torchrun exits 1, but its failure summary on node 0 carries its ranks' own exit code."""
    summary = run.agents[0].output()
    assert re.search(rf"exitcode\s*:\s*{code} \(pid", summary), summary[-2000:]


def read_verdict(report: Path) -> tuple[int, str]:
    """What a CI job reads: launchers/read-verdict.sh's exit code and printed status."""
    res = subprocess.run(["bash", str(READ_VERDICT), str(report)], capture_output=True, text=True, timeout=30)
    return res.returncode, res.stdout.strip()


def assert_hosts_follow_namespaces(run: PairRun, rep: dict) -> None:
    """Each rank reports the host of the namespace its process really ran in (seen through /proc)."""
    assert sorted(run.ranks) == list(range(rep["world_size"])), run.logs()
    for row in rep["ranks"]:
        assert row["host"] == f"node{run.ranks[row['rank']].node}", row


def assert_survivors_bounded(run: PairRun, lost: set[int], fault_at: float | None) -> None:
    """Every rank not hit by the fault ended within --timeout-s + GRACE_S of the fault."""
    assert fault_at is not None, "the fault was never observed\n" + run.logs()
    for rank, proc in sorted(run.ranks.items()):
        if rank in lost:
            continue
        assert proc.ended is not None, f"rank {rank} never ended\n{run.logs()}"
        late = proc.ended - fault_at
        assert late < FAULT_TIMEOUT_S + GRACE_S, (rank, round(late, 1), run.logs())


def rx_bytes(node: netns.Node) -> int:
    out = subprocess.run(
        ["ip", "-n", node.ns, "-s", "-j", "link", "show", "dev", node.dev],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])


# -- verdicts across the link ---------------------------------------------------------------------------


def test_consistent_across_two_nodes(pair, tmp_path):
    """max-share over 2 nodes x 2 ranks: both agents exit 0, rank 0's report shows every rank on the
    node it ran on. Breaks if a pitfall (is_host, --local-addr) keeps the nodes from meeting."""
    before = rx_bytes(pair.nodes[1])
    run = run_pair(pair, tmp_path, [*KIMI, "--timeout-s", "20"])
    assert run.codes == {0: 0, 1: 0}, run.logs()
    rep = run.report()
    assert rep["status"] == "consistent" and rep["world_size"] == 4
    assert_hosts_follow_namespaces(run, rep)
    assert run.on_node(0) and run.on_node(1), run.ranks
    # GROUP_RANK is per node: one node rank per host, two of them.
    by_host = {(r["host"], r["node_rank"]) for r in rep["ranks"]}
    assert len(by_host) == 2 and len({nr for _, nr in by_host}) == 2, by_host
    assert len({r["max_mamba_cache_size"] for r in rep["ranks"]}) == 1
    assert rep["missing_ranks"] == [] and rep["divergent"] == []
    # The ranks really talked over the veth (the only path between the namespaces).
    assert rx_bytes(pair.nodes[1]) - before > 10_000
    assert read_verdict(run.report_path) == (0, "consistent")


def test_own_share_diverges_across_nodes(pair, tmp_path):
    """own-share: stages on the two nodes hold different linear-layer counts and derive different pools;
    the disagreement crosses the node boundary and every agent exits non-zero."""
    run = run_pair(pair, tmp_path, [*KIMI, "--policy", "own-share", "--timeout-s", "20"])
    assert run.codes == {0: 1, 1: 1}, run.logs()
    rep = run.report()
    assert rep["status"] == "divergent"
    assert "max_mamba_cache_size" in rep["divergent"]
    assert_hosts_follow_namespaces(run, rep)
    hosts_by_value: dict[int, set[str]] = {}
    for r in rep["ranks"]:
        hosts_by_value.setdefault(r["max_mamba_cache_size"], set()).add(r["host"])
    assert len(hosts_by_value) > 1, hosts_by_value
    # Values from both nodes take part in the disagreement.
    assert set().union(*hosts_by_value.values()) == {"node0", "node1"}
    assert read_verdict(run.report_path) == (1, "divergent")


def test_partition_env_on_one_node_is_root_caused(pair, tmp_path):
    """SGLANG_PP_LAYER_PARTITION exported on node 1 only: its stages get other layer ranges, the values
    diverge, and the report names the variable, the ranks that set it and their host."""
    run = run_pair(
        pair,
        tmp_path,
        [*KIMI, "--timeout-s", "20"],
        node_env={1: {"SGLANG_PP_LAYER_PARTITION": "30,21,21,21"}},
    )
    assert run.codes == {0: 1, 1: 1}, run.logs()
    rep = run.report()
    assert rep["status"] == "divergent"
    assert rep["differing_inputs"] == ["SGLANG_PP_LAYER_PARTITION"]
    assert_hosts_follow_namespaces(run, rep)
    node1 = run.on_node(1)
    assert len(node1) == 2 and node1[1] == node1[0] + 1
    # The pipeline's own fault first (issue 27: layers 46-50 on no stage or on two, by which node c10d
    # made ranks 0-1), then who set the variable.
    fault, cause = rep["root_causes"]
    assert fault.startswith("pipeline: layers [46, 51) are on ") and "SGLANG_PP_LAYER_PARTITION" in fault
    assert f"ranks {node1[0]}-{node1[1]} set SGLANG_PP_LAYER_PARTITION=30,21,21,21" in cause, cause
    assert "node1" in cause and "leave it unset" in cause, cause


# -- the deployment's launch command, one node started differently ---------------------------------------

SERVE = ["python", "-m", "sglang.launch_server"]


def _model_dir(tmp_path: Path) -> Path:
    """A model directory as SGLang's --model-path takes it: Qwen3.5-397B-A17B's config.json (a class that
    starts under PP; Qwen3-Next asserts a single stage)."""
    model = tmp_path / "Qwen3.5-397B-A17B"
    model.mkdir()
    shutil.copy(netns.REPO_ROOT / "tests" / "fixtures" / "qwen3_5_397b_a17b.json", model / "config.json")
    return model


def test_launch_command_differing_on_one_node_is_root_caused(pair, tmp_path):
    """Each node's agent is given the deployment's launch command after ``--`` (pp 4 over 2 nodes x 2
    ranks); node 1's adds --max-running-requests 8, as a node started from a stale command would. Each
    rank reads its own node's command: the stages on node 1 cap their requests at 8, the stages on node 0
    derive their own (larger) cap, and the report names the flag and its value on node 1's ranks, and
    nothing else (the ``launch_command`` input carries only what no other input does)."""
    model = _model_dir(tmp_path)
    launch = [*SERVE, "--model-path", str(model), "--pp-size", "4", "--host", "0.0.0.0", "--port", "30000"]
    ours = ["--budget-gib", "40", "--timeout-s", "20", "--"]
    run = run_pair(
        pair,
        tmp_path,
        [*ours, *launch],
        node_args={1: [*ours, *launch, "--max-running-requests", "8"]},
    )
    assert run.codes == {0: 1, 1: 1}, run.logs()
    rep = run.report()
    assert rep["status"] == "divergent", rep
    assert_hosts_follow_namespaces(run, rep)
    assert rep["differing_inputs"] == ["max_running_requests"], rep["differing_inputs"]
    caps = {r["host"]: set() for r in rep["ranks"]}
    for r in rep["ranks"]:
        caps[r["host"]].add(r["max_running_requests"])
    assert caps["node1"] == {8} and 8 not in caps["node0"], caps
    node1 = run.on_node(1)
    causes = "\n".join(rep["root_causes"])
    assert f"ranks {node1[0]}-{node1[1]} have --max-running-requests=8" in causes, causes
    assert "launch_command:" not in causes, causes
    assert read_verdict(run.report_path) == (1, "divergent")


# -- a rolling SGLang upgrade across the link -----------------------------------------------------------


def _installed(tmp_path: Path, releases: tuple[str, str]) -> dict[int, dict[str, str]]:
    """Node i's agent (and so its ranks) find SGLang ``releases[i]``'s package metadata on their path."""
    return {
        i: {"PYTHONPATH": netns.python_path(netns.release_site(tmp_path / f"site{i}", v))}
        for i, v in enumerate(releases)
    }


def test_rolling_upgrade_half_done_is_root_caused(pair, tmp_path):
    """Node 1 upgraded to 0.5.23, node 0 still on 0.5.16: each node's ranks derive as their own release
    (values worked by hand in tests/test_upgrade.py), the stages disagree, and the one root cause names
    each node's release and the change that makes them disagree."""
    run = run_pair(pair, tmp_path, [*UPGRADE, "--timeout-s", "20"], node_env=_installed(tmp_path, (OLD, NEW)))
    assert run.codes == {0: 1, 1: 1}, run.logs()
    rep = run.report()
    assert_hosts_follow_namespaces(run, rep)
    assert_half_upgraded(rep, {"node0": OLD, "node1": NEW})
    assert read_verdict(run.report_path) == (1, "divergent")


def test_rolling_upgrade_done_is_consistent(pair, tmp_path):
    """Both nodes on 0.5.23 (each its own installation): every stage agrees, nothing to root-cause."""
    run = run_pair(pair, tmp_path, [*UPGRADE, "--timeout-s", "20"], node_env=_installed(tmp_path, (NEW, NEW)))
    assert run.codes == {0: 0, 1: 0}, run.logs()
    rep = run.report()
    assert_hosts_follow_namespaces(run, rep)
    assert_one_release(rep, NEW)
    assert read_verdict(run.report_path) == (0, "consistent")


# -- faults ---------------------------------------------------------------------------------------------


def _fault_args() -> list[str]:
    return [*KIMI, "--timeout-s", str(FAULT_TIMEOUT_S)]


def _when_rank_stops(rank: int):
    """A ``during`` hook: the time the watch first sees ``rank`` frozen (state T)."""

    def hook(watch: netns.RankWatch) -> float | None:
        watch.wait_until(
            lambda ranks: rank in ranks and ranks[rank].stopped_at is not None, timeout_s=AGENT_START_S + 30
        )
        proc = watch.snapshot().get(rank)
        return proc.stopped_at if proc else None

    return hook


def test_worker_killed_before_exchange(pair, tmp_path):
    """Rank 3 (node 1) dies after the group formed, before the exchange; node 1's agent then stops its
    other rank. Node 0's ranks end within the timeout with infrastructure_failure naming rank 3."""
    run = run_pair(pair, tmp_path, _fault_args(), env={"CHECKER_INJECT_FAULT": "3:exchange:exit"})
    assert run.ranks[3].node == 1, run.ranks
    assert run.codes == {0: 1, 1: 1}, run.logs()  # torchrun: 1 for any failed worker; see the report
    rep = run.report()
    assert rep["status"] == "infrastructure_failure", rep
    # Rank 2 is named too when its agent stopped it before it could check in: it is gone as well.
    assert 3 in rep["missing_ranks"] and set(rep["missing_ranks"]) <= set(run.on_node(1)), rep
    assert_survivors_bounded(run, {3}, run.ranks[3].ended)
    assert_node0_exit_code(run, 3)
    assert read_verdict(run.report_path) == (3, "infrastructure_failure")


def test_worker_frozen_with_sigstop(pair, tmp_path):
    """Rank 3 stops itself (SIGSTOP) at the exchange: alive to its agent, silent to its peers. The other
    three time out and end, and rank 0 names exactly rank 3. (Node 1's torchrun SIGKILLs the frozen rank
    30 s after its SIGTERM, whatever --shutdown-timeout says: not waited for here.)"""
    run = run_pair(
        pair,
        tmp_path,
        _fault_args(),
        env={"CHECKER_INJECT_FAULT": "3:exchange:stop"},
        during=_when_rank_stops(3),
        wait_nodes=(0,),
        lost=frozenset({3}),
    )
    assert run.ranks[3].node == 1, run.ranks
    rep = run.report()
    assert rep["status"] == "infrastructure_failure", rep
    assert rep["missing_ranks"] == [3], rep
    assert_survivors_bounded(run, {3}, run.fault_at)
    assert run.codes == {0: 1}, run.logs()
    assert_node0_exit_code(run, 3)
    assert read_verdict(run.report_path) == (3, "infrastructure_failure")


def test_link_cut_mid_run(pair, tmp_path):
    """The link goes down while the ranks wait in the exchange (rank 3 pauses there so the cut lands
    mid-run, then resumes). Both halves time out; rank 0 names node 1's ranks, which it cannot reach;
    node 1's ranks end too and print their own verdict, since rank 0's report is out of their reach."""
    stopped = _when_rank_stops(3)

    def cut(watch: netns.RankWatch) -> float | None:
        if stopped(watch) is None:
            return None
        pair.cut_link()
        cut_at = time.monotonic()
        os.kill(watch.snapshot()[3].pid, signal.SIGCONT)
        return cut_at

    # Node 1's agent is cut off from the rendezvous store on node 0 and lingers on its own store
    # timeouts: only node 0's agent and the ranks are waited for.
    run = run_pair(
        pair,
        tmp_path,
        _fault_args(),
        env={"CHECKER_INJECT_FAULT": "3:exchange:stop"},
        during=cut,
        wait_nodes=(0,),
    )
    rep = run.report()
    assert rep["status"] == "infrastructure_failure", rep
    assert rep["missing_ranks"] == run.on_node(1) == [2, 3], rep
    assert run.codes == {0: 1}, run.logs()
    assert_node0_exit_code(run, 3)
    assert read_verdict(run.report_path) == (3, "infrastructure_failure")
    assert_survivors_bounded(run, {2, 3}, run.fault_at)  # node 0's ranks
    for rank in (2, 3):
        assert run.ranks[rank].ended is not None, f"rank {rank} never ended\n{run.logs()}"
    node1_log = run.agents[1].output()
    late = {r: round(run.ranks[r].ended - run.fault_at, 1) for r in (2, 3)}
    # A store call on the dead link never returns by itself: the checker must bound it (not the
    # faulthandler backstop, which would end them later, with exit 1 and a stack dump).
    assert max(late.values()) < FAULT_TIMEOUT_S + GRACE_S, (late, node1_log[-2000:])
    assert "Timeout (0:00:" not in node1_log, node1_log[-2000:]
    for rank in (2, 3):
        assert f"[rank {rank}] checker: INFRASTRUCTURE FAILURE" in node1_log, node1_log[-2000:]


def test_node_that_never_arrives(pair, tmp_path):
    """Only node 0's agent starts. The rendezvous never completes, so no rank runs and no report exists:
    node 0's agent gives up after join_timeout, and the CI verdict is infrastructure_failure."""
    join_timeout = 6
    run = run_pair(pair, tmp_path, _fault_args(), nodes=(0,), rdzv_conf=f"join_timeout={join_timeout}")
    assert run.codes == {0: 1}, run.logs()
    assert run.agents[0].elapsed_s < AGENT_START_S + join_timeout, run.logs()
    assert run.ranks == {}  # the world never formed: which ranks are missing cannot be known
    assert not run.report_path.exists()
    assert "RendezvousTimeoutError" in run.agents[0].output(), run.logs()
    assert read_verdict(run.report_path) == (3, "infrastructure_failure")


# -- the Slurm recipe, run for real -------------------------------------------------------------------------

FAKE_SCONTROL = """#!/usr/bin/env bash
# scontrol show hostnames LIST: one node name per line, SLURM_NODEID order.
[[ "$1 $2" == "show hostnames" ]] || {{ echo "fake scontrol: $*" >&2; exit 2; }}
printf '%s\\n' {names}
"""
FAKE_SRUN = """#!/usr/bin/env bash
# srun --ntasks-per-node=1 CMD...: CMD once per node, each in its node's namespace with Slurm's task env.
while [[ "$1" == -* ]]; do shift; done
pids=()
{starts}
rc=0
for p in "${{pids[@]}}"; do wait "$p" || rc=$?; done
exit "$rc"
"""


def test_slurm_recipe_across_two_nodes(pair, tmp_path):
    """launchers/slurm.sbatch as sbatch would run it, with scontrol and srun stood in for by scripts
    that start one task in each namespace: the head node comes from scontrol, the rendezvous id from the
    job id, the deployment's launch command after ``--`` reaches every rank through srun and
    torchrun.sh, and the batch script exits with the verdict read from the report."""
    model = _model_dir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    starts = []
    for node in pair.nodes:
        env = " ".join(f"{k}={v}" for k, v in pair.node_env(node.index).items())
        starts.append(
            f"{' '.join(node.exec_prefix())} env SLURM_NODEID={node.index} "
            f'SLURMD_NODENAME={node.addr} {env} "$@" &\npids+=($!)'
        )
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL.format(names=" ".join(n.addr for n in pair.nodes)))
    (bin_dir / "srun").write_text(FAKE_SRUN.format(starts="\n".join(starts)))
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    out = tmp_path / "out"
    job_id = "4242"
    # The recipe's fixed rendezvous port (29400) is safe here only because node 0's namespace is private.
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node[0-1]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": job_id,
        "SLURM_SUBMIT_DIR": str(netns.REPO_ROOT),
        "REPORT_DIR": str(out),
        "NPROC_PER_NODE": "2",
        "BACKEND": "gloo",
        "RDZV_CONF": "join_timeout=30",
    }
    with netns.RankWatch(pair) as watch:
        job = pair.spawn(
            ["bash", str(netns.REPO_ROOT / "launchers" / "slurm.sbatch"), "--budget-gib", "40", "--"]
            + [*SERVE, "--model-path", str(model), "--pp-size", "4", "--host", "0.0.0.0"],
            env=env,
            log=tmp_path / "slurm.log",
        )
        code = job.wait(AGENT_LIMIT_S)
        ranks = watch.snapshot()
    log = job.output()
    assert code == 0, log[-3000:]
    assert log.rstrip().endswith("consistent"), log[-500:]  # read-verdict's line, last
    rep = json.loads((out / "report.json").read_text())
    assert rep["status"] == "consistent" and rep["world_size"] == 4
    assert rep["inputs"]["launch_command"] == "python -m sglang.launch_server", rep["inputs"]
    assert rep["inputs"]["pp_size"] == 4, rep["inputs"]
    assert {r["host"] for r in rep["ranks"]} == {"node0", "node1"}
    assert (out / "junit.xml").exists()
    assert {p.run_id for p in ranks.values()} == {f"pp-capacity-{job_id}"}, ranks
    assert sorted(p.node for p in ranks.values()) == [0, 0, 1, 1]
