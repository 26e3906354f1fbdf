"""A rolling SGLang upgrade: some ranks see 0.5.16 installed, the others 0.5.23.

Each rank reads its release from the package metadata on its own path (a real ``sglang-X.dist-info``
per node, tests/netns.py ``release_site``; nothing patched) and derives as that release. Half-way through
an upgrade the stages disagree, and the report must say why: which node runs which release, and what
changed between them. Here the ranks meet through a FileStore (tests/harness.py), each rank told its node
by GROUP_RANK and CHECKER_HOSTNAME; tests/test_two_node.py runs the same upgrade on two real nodes.

The expected values are worked by hand from the released code (docs/sglang-releases.md says where each
rule lives in the wheel), for the upstream unit test's Kimi-K3 shape as a JSON model spec
(tests/fixtures/kimi_k3_shape_spec.json: the kimi-k3 preset's layers and shapes; as a spec it names no
architecture, so both releases load it: the preset itself is KimiK3ForConditionalGeneration, which
0.5.16 cannot load, see the last test), 8 GiB, --mamba-full-memory-ratio 0.5, no_buffer with
--disable-overlap-schedule, pp 4:

* 93 layers, full attention where (i + 1) % 4 == 0 and at 91 and 92: 69 linear layers. A layer's state
  is conv (4096, 3) bf16 = 24,576 B plus temporal (64, 128, 128) fp32 = 4,194,304 B = 4,218,880 B, so
  ``mamba_cache_per_req`` = 69 x 4,218,880 = 291,102,720 B.
* The state budget B = 8 x 0.5 / 1.5 GiB = 2,863,311,530.67 B in both releases.
* no_buffer with the radix cache on: ``_calculate_mamba_ratio`` gives 3 slots per request in both.
* 0.5.16, ``mem_cache/kv_cache_configurator.py`` ``KVCacheConfigurator._handle_max_mamba_cache``: every
  stage is charged the whole ``per_req``, no padding slot: K = int(B // 291,102,720) = int(9.84) = 9;
  ``resolve_max_num_reqs``: 9 // 3 = 3 running requests; ``managers/scheduler.py``
  ``Scheduler.__init__``: micro batch max(3 // 4, 1) = 1. Every stage: (9, 3, 1).
* 0.5.23, same function: ``distributed/utils.py`` ``get_pp_indices(93, k, 4)`` gives 23 layers a stage,
  the remainder on the last: [0, 23), [23, 46), [46, 69), [69, 93), holding 18, 17, 17, 17 linear
  layers. ``pp_layer_scale`` = 18 / 69, ``stage_per_req`` = int(291,102,720 x 18 / 69) = 75,939,840 B;
  no per-slot extra state here, so per_slot = 75,939,840 and, the padding slot charged, K =
  int((B - 75,939,840) // 75,939,840) = int(36.71) = 36; 36 // 3 = 12 requests; max(12 // 4, 1) = 3.
  Every stage: (36, 12, 3).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import netns
import pytest
from harness import run_world

SPEC = str(Path(__file__).resolve().parent / "fixtures" / "kimi_k3_shape_spec.json")
KIMI = ["--model-config", SPEC, "--budget-gib", "8", "--mamba-full-memory-ratio", "0.5"]
FLAGS = [*KIMI, "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"]
FAST = ["--timeout-s", "60"]  # generous: ranks start slowly when the suite loads both cores
VALUES = ("max_mamba_cache_size", "max_running_requests", "pp_max_micro_batch_size")
OLD, NEW = "0.5.16", "0.5.23"
EXPECTED = {OLD: (9, 3, 1), NEW: (36, 12, 3)}
"""(pool, running requests, micro batch) on every stage at pp 4: the module docstring's arithmetic."""
WHAT_CHANGED = f"{OLD} charges each stage for the whole model's state"
PADDING_SLOT = "reserve the pool's padding slot"


def values(row: dict) -> tuple[int, ...]:
    return tuple(row[n] for n in VALUES)


def assert_half_upgraded(rep: dict, release_of_host: dict[str, str]) -> None:
    """The verdict a half-upgraded cluster gets: divergent on every value, each rank with its node's
    installed release and that release's values, and one root cause naming the release of each node
    and the change in SGLang that makes them disagree."""
    assert (rep["status"], rep["exit_code"]) == ("divergent", 1), rep["root_causes"]
    assert rep["divergent"] == list(VALUES)
    by_node: dict[int, list[dict]] = defaultdict(list)
    for row in rep["ranks"]:
        release = release_of_host[row["host"]]
        assert row["inputs"]["sglang_installed"] == release, row  # read from this rank's own path
        assert values(row) == EXPECTED[release], row
        by_node[row["node_rank"]].append(row)
    assert len(by_node) == 2, by_node
    assert rep["differing_inputs"][0] == "sglang_installed", rep["differing_inputs"]
    # The release each rank derived as follows from what is installed: one cause, not two.
    (cause,) = rep["root_causes"]
    parts = []
    for node, rows in sorted(by_node.items()):
        ranks = sorted(r["rank"] for r in rows)
        (host,) = {r["host"] for r in rows}
        assert ranks == list(range(ranks[0], ranks[0] + len(ranks))), ranks
        parts.append(
            f"node {node} ({host}, ranks {ranks[0]}-{ranks[-1]}) runs SGLang {release_of_host[host]}"
        )
    assert cause.startswith("sglang_installed: " + "; ".join(parts) + " -- what changed: "), cause
    assert WHAT_CHANGED in cause and PADDING_SLOT in cause, cause


def assert_one_release(rep: dict, release: str) -> None:
    """Every rank on ``release``: consistent, that release's values, nothing to root-cause."""
    assert (rep["status"], rep["exit_code"]) == ("consistent", 0), rep["root_causes"]
    assert {r["inputs"]["sglang_installed"] for r in rep["ranks"]} == {release}
    assert {values(r) for r in rep["ranks"]} == {EXPECTED[release]}
    assert rep["differing_inputs"] == [] and rep["root_causes"] == [] and rep["divergent"] == []


def _world(tmp_path, releases: list[str]):
    """Four ranks, two a node; node n's ranks see ``releases[n]`` installed (its own site directory)."""
    sites = [netns.release_site(tmp_path / f"node{n}", v) for n, v in enumerate(releases)]
    rank_env = {
        rank: {
            "PYTHONPATH": netns.python_path(sites[rank // 2]),
            "GROUP_RANK": str(rank // 2),
            "CHECKER_HOSTNAME": f"node{rank // 2}",
        }
        for rank in range(4)
    }
    res = run_world(["check", *FLAGS, *FAST], world_size=4, tmp_path=tmp_path, rank_env=rank_env)
    return res, res.report()


@pytest.mark.slow
def test_half_upgraded_world_is_root_caused(tmp_path, run_checker):
    """Node 0 on 0.5.16, node 1 on 0.5.23: every rank exits 1 with the releases per node named, and each
    node's values are what ``derive --sglang-version X`` gives for that release on its own."""
    res, rep = _world(tmp_path, [OLD, NEW])
    assert res.codes == [1] * 4, [r.stderr[-600:] for r in res.ranks]
    assert_half_upgraded(rep, {"node0": OLD, "node1": NEW})
    assert "root cause:" in res.ranks[0].stdout and WHAT_CHANGED in res.ranks[0].stdout
    for release in (OLD, NEW):
        out = run_checker(
            ["derive", *FLAGS, "--pp-size", "4", "--sglang-version", release, "--format", "json"]
        )
        assert out.returncode == 0, out.stderr
        alone = json.loads(out.stdout)["ranks"]
        for row in rep["ranks"]:
            if row["inputs"]["sglang_installed"] == release:
                assert values(row) == values(alone[row["pp_rank"]]), (release, row["rank"])


@pytest.mark.slow
def test_not_yet_upgraded_world_is_consistent(tmp_path):
    """Both nodes still on 0.5.16: whole-model charging on every stage, so they agree."""
    res, rep = _world(tmp_path, [OLD, OLD])
    assert res.codes == [0] * 4, [r.stderr[-600:] for r in res.ranks]
    assert_one_release(rep, OLD)


# -- planning the upgrade: derive --sglang-version A,B -------------------------------------------------


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    """The side-by-side table of ``derive --sglang-version A,B``: headers and rows of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pp_rank"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        rows.append(_cells(line))
    return _cells(lines[start]), rows


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("  ") if c.strip()]


def test_derive_compares_two_releases_in_text(cli):
    """The text a planner reads: every stage's values under both releases, the differing ones marked,
    then which values differ and why (only the changes that matter for these flags)."""
    res = cli(["derive", *FLAGS, "--pp-size", "4", "--sglang-version", f"{OLD},{NEW}"])
    assert res.rc == 0 and res.err == "", res.err
    headers, rows = _table(res.out)
    assert headers == [
        "pp_rank",
        "layers",
        f"pool {OLD}",
        f"pool {NEW}",
        f"requests {OLD}",
        f"requests {NEW}",
        f"micro-batch {OLD}",
        f"micro-batch {NEW}",
    ]
    layers = ["[0, 23)", "[23, 46)", "[46, 69)", "[69, 93)"]
    (o_pool, o_req, o_mb), (n_pool, n_req, n_mb) = EXPECTED[OLD], EXPECTED[NEW]
    assert rows == [
        [str(k), layers[k], *(f"{v} *" for v in (o_pool, n_pool, o_req, n_req, o_mb, n_mb))] for k in range(4)
    ]
    assert f"SGLang {OLD} and {NEW} derive different {', '.join(VALUES)}" in res.out
    why = [line.strip() for line in res.out.splitlines() if line.strip().startswith("why:")]
    assert len(why) == 2, why
    assert WHAT_CHANGED in why[0] and PADDING_SLOT in why[1], why


def test_derive_compares_two_releases_in_json(cli):
    """--format json: each release's stages, one difference per value and stage, and the explanations.
    The budget rule changed too (0.5.16 -> 0.5.18), but with --budget-gib it cannot matter: not named."""
    res = cli(["derive", *FLAGS, "--pp-size", "4", "--sglang-version", f"{OLD},{NEW}", "--format", "json"])
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert doc["releases"] == [OLD, NEW]
    for release, policy in ((OLD, "whole-model"), (NEW, "max-share")):
        side = doc["by_release"][release]
        assert side["error"] is None and side["resolved_policy"] == policy
        assert [values(s) for s in side["ranks"]] == [EXPECTED[release]] * 4
    expected = {
        (name, k): {OLD: EXPECTED[OLD][i], NEW: EXPECTED[NEW][i]}
        for i, name in enumerate(VALUES)
        for k in range(4)
    }
    assert {(d["value"], d["pp_rank"]): d["by_release"] for d in doc["differences"]} == expected
    assert len(doc["differences"]) == 12
    assert len(doc["explanations"]) == 2, doc["explanations"]
    assert WHAT_CHANGED in doc["explanations"][0] and PADDING_SLOT in doc["explanations"][1]
    assert not any("budget" in line for line in doc["explanations"]), doc["explanations"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_derive_finds_releases_of_one_group_agree(cli, fmt):
    """0.5.18 and 0.5.21 size the pool by the same rules (docs/sglang-releases.md, G4): an upgrade
    between them cannot make the stages disagree, and nothing is explained."""
    res = cli(["derive", *FLAGS, "--pp-size", "4", "--sglang-version", "0.5.18,0.5.21", "--format", fmt])
    assert res.rc == 0, res.err
    if fmt == "json":
        doc = json.loads(res.out)
        assert doc["differences"] == [] and doc["explanations"] == []
        assert {values(s) for v in ("0.5.18", "0.5.21") for s in doc["by_release"][v]["ranks"]} == {
            EXPECTED[NEW]
        }
    else:
        assert "SGLang 0.5.18 and 0.5.21 derive the same values on every stage" in res.out
        assert "why:" not in res.out and "*" not in _table(res.out)[1][0][2]


def test_derive_refuses_the_same_release_twice(cli):
    """A comparison of a release with itself is a typo: one line, exit 2, no traceback."""
    res = cli(["derive", *FLAGS, "--sglang-version", f"{OLD},{OLD}"])
    assert res.rc == 2 and res.out == ""
    (line,) = res.err.strip().splitlines()
    assert f"--sglang-version {OLD},{OLD} names a release twice" in line


@pytest.mark.slow  # a world of two ranks (~10 s); derive's side is in tests/test_model_support.py
def test_a_node_whose_release_cannot_load_the_model_is_the_root_cause(tmp_path):
    """The kimi-k3 preset is KimiK3ForConditionalGeneration, first registered by SGLang 0.5.17's
    models/kimi_k3.py: node 0 on 0.5.16 cannot load it, so its rank carries that error (not a pool size),
    the verdict is error (exit 2), and the root cause names the installed release per node."""
    sites = [netns.release_site(tmp_path / f"node{n}", v) for n, v in enumerate([OLD, NEW])]
    rank_env = {
        rank: {
            "PYTHONPATH": netns.python_path(sites[rank]),
            "GROUP_RANK": str(rank),
            "CHECKER_HOSTNAME": f"node{rank}",
        }
        for rank in range(2)
    }
    argv = ["check", "--model", "kimi-k3", "--budget-gib", "8", *FAST]
    res = run_world(argv, world_size=2, tmp_path=tmp_path, rank_env=rank_env)
    assert res.codes == [2] * 2, [r.stderr[-600:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "error"
    (error,) = rep["errors"]
    assert error.startswith("rank 0 (node0): ") and f"SGLang {OLD} cannot load kimi-k3" in error
    assert "KimiK3ForConditionalGeneration" in error and "arrived in SGLang 0.5.17" in error
    assert rep["root_causes"][0].startswith(f"sglang_installed: node 0 (node0, rank 0) runs SGLang {OLD}")
    assert [r["status"] for r in rep["ranks"]] == ["error", "ok"]


def _capacity_inputs(env: dict[str, str] | None = None, **flags: object):
    from checker.config import ModelChoice, SizingFlags
    from checker.preflight.resolve import capacity_inputs

    sizing = SizingFlags(**flags)  # type: ignore[arg-type]
    return capacity_inputs(ModelChoice(model="kimi-k3"), sizing, budget_gib=8.0, env=env or {})


def test_the_upgrade_facts_describe_the_deployment_as_configured() -> None:
    """What derive and plan --sglang-version A,B filter the release changes by: each fact from its flag
    (or the decode-lock switch in the environment), the model's per-slot extra state from its geometry."""
    from checker.core.sizing.upgrade import UpgradeFacts

    plain = UpgradeFacts.of(_capacity_inputs(pp_size=1))
    assert plain == UpgradeFacts(strategy=plain.strategy, pp_size=1)
    assert plain.strategy != "extra_buffer_lazy"
    given = UpgradeFacts.of(
        _capacity_inputs(
            {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "1", "SGLANG_ENABLE_PP_SPEC": "1"},
            pp_size=4,
            max_running_requests=8,
            speculative_num_draft_tokens=3,
            mamba_radix_cache_strategy="no_buffer",
        ),
        budget_from_device=True,
    )
    assert given == UpgradeFacts(
        max_running_requests=True,
        extra_per_slot=False,
        skip_decode_lock=True,
        strategy="no_buffer",
        speculative=True,
        pp_size=4,
        budget_from_device=True,
    )
