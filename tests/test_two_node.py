"""A genuine two-node torchrun job: two network namespaces joined by a veth pair, one
``launchers/torchrun.sh`` agent in each, the checker's ranks talking gloo across the link.

The normal verdicts first (consistent, divergent, an input set on one node only), then the failures of
real clusters: a worker killed, a worker frozen, the link cut mid-run, a node that never arrives. Each
fault must end in bounded time with an ``infrastructure_failure`` report from rank 0 that names the
ranks that were lost where they can be known. Needs root (skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import netns
import pytest

pytestmark = pytest.mark.netns

KIMI = ["--model", "kimi-k3", "--budget-gib", "8", "--mamba-full-memory-ratio", "0.5"]
FAULT_TIMEOUT_S = 6
"""--timeout-s for the fault tests: how long a rank waits for a lost peer."""
GRACE_S = 12.0
"""What a surviving rank may take beyond --timeout-s, from its process start: python + torch import and
init on two loaded cores, rank 0's wait for survivors to check in (3 s), and the report."""
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
    codes: list[int | None]
    agents: list[netns.Agent]
    ranks: dict[int, netns.RankProc]
    report_path: Path

    def report(self) -> dict:
        assert self.report_path.exists(), "rank 0 wrote no report:\n" + self.logs()
        return json.loads(self.report_path.read_text())

    def logs(self) -> str:
        return "\n".join(f"--- node {a.node.index} (exit {a.proc.returncode}, {a.elapsed_s:.1f} s)\n"
                         f"{a.output()[-3000:]}" for a in self.agents)

    def on_node(self, index: int) -> list[int]:
        return sorted(r for r, p in self.ranks.items() if p.node == index)


def run_pair(pair: netns.NodePair, tmp_path: Path, args: list[str], *, env: dict[str, str] | None = None,
             node_env: dict[int, dict[str, str]] | None = None, nodes: tuple[int, ...] = (0, 1),
             rdzv_conf: str = "join_timeout=30", during=None) -> PairRun:
    """Launch the agents, optionally act mid-run (``during(watch)``), wait for every agent (bounded)."""
    report = tmp_path / "report.json"
    argv = [*args, "--report", str(report)]
    with netns.RankWatch(pair) as watch:
        agents = [pair.launch(i, argv, log_dir=tmp_path, rdzv_conf=rdzv_conf,
                              env={**(env or {}), **(node_env or {}).get(i, {})}) for i in nodes]
        if during is not None:
            during(watch)
        codes = [a.wait(AGENT_LIMIT_S - a.elapsed_s) for a in agents]
        watch.poll()
        ranks = watch.snapshot()
    return PairRun(codes=codes, agents=agents, ranks=ranks, report_path=report)


def read_verdict(report: Path) -> tuple[int, str]:
    """What a CI job reads: launchers/read-verdict.sh's exit code and printed status."""
    res = subprocess.run(["bash", str(READ_VERDICT), str(report)], capture_output=True, text=True,
                         timeout=30)
    return res.returncode, res.stdout.strip()


def assert_hosts_follow_namespaces(run: PairRun, rep: dict) -> None:
    """Each rank reports the host of the namespace its process really ran in (seen through /proc)."""
    assert sorted(run.ranks) == list(range(rep["world_size"])), run.logs()
    for row in rep["ranks"]:
        assert row["host"] == f"node{run.ranks[row['rank']].node}", row


def assert_survivors_bounded(run: PairRun, lost: set[int], timeout_s: float) -> None:
    """Every rank not hit by the fault ended within --timeout-s + GRACE_S of its own start."""
    for rank, proc in sorted(run.ranks.items()):
        if rank in lost:
            continue
        assert proc.lifetime_s is not None, f"rank {rank} never ended\n{run.logs()}"
        assert proc.lifetime_s < timeout_s + GRACE_S, (rank, proc.lifetime_s, run.logs())


def rx_bytes(node: netns.Node) -> int:
    out = subprocess.run(["ip", "-n", node.ns, "-s", "-j", "link", "show", "dev", node.dev],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])


# -- verdicts across the link ---------------------------------------------------------------------------


def test_consistent_across_two_nodes(pair, tmp_path):
    """max-share over 2 nodes x 2 ranks: both agents exit 0, rank 0's report shows every rank on the
    node it ran on. Breaks if a pitfall (is_host, --local-addr) keeps the nodes from meeting."""
    before = rx_bytes(pair.nodes[1])
    run = run_pair(pair, tmp_path, [*KIMI, "--timeout-s", "20"])
    assert run.codes == [0, 0], run.logs()
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
    assert run.codes == [1, 1], run.logs()
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
    run = run_pair(pair, tmp_path, [*KIMI, "--timeout-s", "20"],
                   node_env={1: {"SGLANG_PP_LAYER_PARTITION": "30,21,21,21"}})
    assert run.codes == [1, 1], run.logs()
    rep = run.report()
    assert rep["status"] == "divergent"
    assert rep["differing_inputs"] == ["SGLANG_PP_LAYER_PARTITION"]
    assert_hosts_follow_namespaces(run, rep)
    node1 = run.on_node(1)
    assert len(node1) == 2 and node1[1] == node1[0] + 1
    cause = rep["root_causes"][0]
    assert f"ranks {node1[0]}-{node1[1]} set SGLANG_PP_LAYER_PARTITION=30,21,21,21" in cause, cause
    assert "node1" in cause and "leave it unset" in cause, cause


# -- faults ---------------------------------------------------------------------------------------------


def _fault_args() -> list[str]:
    return [*KIMI, "--timeout-s", str(FAULT_TIMEOUT_S)]


def test_worker_killed_before_exchange(pair, tmp_path):
    """Rank 3 (node 1) dies after the group formed, before the exchange. Node 1's agent then kills its
    other rank; node 0's ranks end within the timeout with infrastructure_failure naming rank 3."""
    run = run_pair(pair, tmp_path, _fault_args(), env={"CHECKER_INJECT_FAULT": "3:exchange:exit"})
    assert run.ranks[3].node == 1, run.ranks
    assert run.codes == [1, 1], run.logs()  # torchrun: 1 for any failed worker; the report has the truth
    rep = run.report()
    assert rep["status"] == "infrastructure_failure", rep
    # Rank 2 is named too when its agent killed it before it could check in: it is gone as well.
    assert 3 in rep["missing_ranks"] and set(rep["missing_ranks"]) <= set(run.on_node(1)), rep
    assert_survivors_bounded(run, {3}, FAULT_TIMEOUT_S)
    assert read_verdict(run.report_path) == (3, "infrastructure_failure")


def test_worker_frozen_with_sigstop(pair, tmp_path):
    """Rank 3 stops itself (SIGSTOP) at the exchange: alive to its agent, silent to its peers. The other
    three time out, rank 0 names exactly rank 3, and node 1's agent reaps the frozen rank."""
    run = run_pair(pair, tmp_path, _fault_args(), env={"CHECKER_INJECT_FAULT": "3:exchange:stop"})
    assert run.ranks[3].node == 1 and run.ranks[3].stopped_seen, run.ranks
    rep = run.report()
    assert rep["status"] == "infrastructure_failure", rep
    assert rep["missing_ranks"] == [3], rep
    assert_survivors_bounded(run, {3}, FAULT_TIMEOUT_S)
    assert run.codes == [1, 1], run.logs()
    assert read_verdict(run.report_path) == (3, "infrastructure_failure")


def test_link_cut_mid_run(pair, tmp_path):
    """The link goes down while the ranks wait in the exchange (rank 3 pauses there so the cut lands
    mid-run, then resumes). Both halves time out; rank 0 names node 1's ranks, which it cannot reach;
    node 1's ranks end too and print their own verdict, since rank 0's report is out of reach."""

    def cut(watch: netns.RankWatch) -> None:
        frozen = watch.wait_until(lambda ranks: 3 in ranks and ranks[3].stopped_seen, timeout_s=60)
        assert frozen, "rank 3 never reached the exchange"
        pair.cut_link()
        os.kill(watch.snapshot()[3].pid, signal.SIGCONT)

    run = run_pair(pair, tmp_path, _fault_args(), env={"CHECKER_INJECT_FAULT": "3:exchange:stop"},
                   during=cut)
    rep = run.report()
    assert rep["status"] == "infrastructure_failure", rep
    assert rep["missing_ranks"] == run.on_node(1) == [2, 3], rep
    assert_survivors_bounded(run, set(), FAULT_TIMEOUT_S)
    node1_log = run.agents[1].output()
    for rank in (2, 3):
        assert f"[rank {rank}] checker: INFRASTRUCTURE FAILURE" in node1_log, node1_log[-2000:]
    assert run.codes[0] == 1, run.logs()
    assert read_verdict(run.report_path) == (3, "infrastructure_failure")


def test_node_that_never_arrives(pair, tmp_path):
    """Only node 0's agent starts. The rendezvous never completes, so no rank runs and no report exists:
    node 0's agent gives up after join_timeout, and the CI verdict is infrastructure_failure."""
    join_timeout = 6
    run = run_pair(pair, tmp_path, _fault_args(), nodes=(0,), rdzv_conf=f"join_timeout={join_timeout}")
    assert run.codes == [1], run.logs()
    assert run.agents[0].elapsed_s < join_timeout + GRACE_S, run.logs()
    assert run.ranks == {}  # the world never formed: which ranks are missing cannot be known
    assert not run.report_path.exists()
    assert "RendezvousTimeoutError" in run.agents[0].output(), run.logs()
    assert read_verdict(run.report_path) == (3, "infrastructure_failure")
