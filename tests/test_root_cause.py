"""Which group of ranks the verdict calls the odd one, and where it runs, when the groups are unequal.

Rows are built in-process (``RankRow`` with the wire's digests, what rank 0 decides on after the
all-gather) and handed to ``decide``: no process group. The expectations are written out by hand from
the layout of each case (which ranks set what, which host each rank runs on): with 3 ranks against 1,
or 5 against 3, the smaller group is the odd one, named after the majority with its own hosts; with an
even split there is no odd one.
"""

from __future__ import annotations

from collections.abc import Collection

import pytest
from rank_rows import world

from checker.outputs.tables import is_split, outliers
from checker.preflight.row import RankRow
from checker.preflight.verdict import decide, explain_input

PARTITION = "SGLANG_PP_LAYER_PARTITION"
SET = "30,21,21,21"


def partition_on(ranks: Collection[int], n: int, per_node: int = 1) -> list[RankRow]:
    """SGLANG_PP_LAYER_PARTITION exported on ``ranks`` only; those stages derive 83 slots, the rest 74."""
    return world(
        n,
        per_node=per_node,
        inputs_of=lambda r: {PARTITION: SET} if r in ranks else {},
        k_of=lambda r: 83 if r in ranks else 74,
    )


@pytest.mark.parametrize(
    ("odd", "cause"),
    [
        ({0}, f"{PARTITION}: ranks 1-3 leave it unset; rank 0 sets {PARTITION}={SET} (on node-0)"),
        ({1}, f"{PARTITION}: ranks 0, 2-3 leave it unset; rank 1 sets {PARTITION}={SET} (on node-1)"),
        ({3}, f"{PARTITION}: ranks 0-2 leave it unset; rank 3 sets {PARTITION}={SET} (on node-3)"),
        # The variable on every rank but one: the odd rank is the one that leaves it unset.
        ({0, 1, 2}, f"{PARTITION}: ranks 0-2 set {PARTITION}={SET}; rank 3 leaves it unset (on node-3)"),
        ({1, 2, 3}, f"{PARTITION}: ranks 1-3 set {PARTITION}={SET}; rank 0 leaves it unset (on node-0)"),
    ],
)
def test_three_ranks_against_one_name_the_one_and_its_host(odd: set[int], cause: str) -> None:
    """4 ranks on 4 hosts, one rank unlike the others (wherever it sits, rank 0 included): the root cause
    puts the three first and names the one with its host, and the value groups mark it the outlier.
    Naming the three as the odd ones (or the hosts of the three) sends the reader to the wrong nodes."""
    v = decide(partition_on(odd, 4), world_size=4)
    assert v.status == "divergent" and v.differing_inputs == [PARTITION]
    assert v.root_causes == [cause]
    lone = ({0, 1, 2, 3} - odd) if len(odd) == 3 else odd
    for name in v.divergent:
        majority, outlier = v.divergent_groups[name]
        assert (majority.share, majority.outlier) == ("majority", False)
        assert (outlier.ranks, outlier.share, outlier.outlier) == (sorted(lone), "outlier", True)
        assert outlier.hosts == [f"node-{r}" for r in sorted(lone)]


@pytest.mark.parametrize(
    ("odd", "cause"),
    [
        # Two ranks to a host: ranks 0-2 run on node-0 and node-1 (node-1 also holds rank 3).
        ({0, 1, 2}, f"{PARTITION}: ranks 3-7 leave it unset; ranks 0-2 set {PARTITION}={SET} "
         "(on node-0, node-1)"),
        ({5, 6, 7}, f"{PARTITION}: ranks 0-4 leave it unset; ranks 5-7 set {PARTITION}={SET} "
         "(on node-2, node-3)"),
        ({0, 2, 4}, f"{PARTITION}: ranks 1, 3, 5-7 leave it unset; ranks 0, 2, 4 set {PARTITION}={SET} "
         "(on node-0, node-1, node-2)"),
        # Set on five: the three that leave it unset are the odd ones.
        ({0, 1, 2, 3, 4}, f"{PARTITION}: ranks 0-4 set {PARTITION}={SET}; ranks 5-7 leave it unset "
         "(on node-2, node-3)"),
    ],
)  # fmt: skip
def test_five_ranks_against_three_name_the_three_and_only_their_hosts(odd: set[int], cause: str) -> None:
    """8 ranks, 2 to a host: the three are the odd ones wherever they sit, and only their hosts are
    named (node-3, which holds only majority ranks when the three are 0-2, is not among them)."""
    v = decide(partition_on(odd, 8, per_node=2), world_size=8)
    assert v.root_causes == [cause]
    three = odd if len(odd) == 3 else set(range(8)) - odd
    (outlier,) = [g for g in v.divergent_groups["max_mamba_cache_size"] if g.outlier]
    assert outlier.ranks == sorted(three) and outlier.share == "outlier"
    assert outlier.hosts == sorted({f"node-{r // 2}" for r in three})


def test_two_odd_groups_each_name_their_own_hosts() -> None:
    """4 ranks agree, 2 set one partition, 2 another: each odd group is followed by its own hosts, not
    by one list of both (which would not say which host set what)."""
    env = {4: "10,20,30,33", 5: "10,20,30,33", 6: SET, 7: SET}
    rows = world(8, per_node=2, inputs_of=lambda r: {PARTITION: env[r]} if r in env else {})
    assert explain_input(PARTITION, rows) == (
        f"{PARTITION}: ranks 0-3 leave it unset; ranks 4-5 set {PARTITION}=10,20,30,33 (on node-2); "
        f"ranks 6-7 set {PARTITION}={SET} (on node-3)"
    )


def test_an_even_split_has_no_odd_group() -> None:
    """2 against 2: no majority, so no outlier; the groups come in rank order and the second names its
    hosts (the existing report wording)."""
    v = decide(partition_on({2, 3}, 4, per_node=2), world_size=4)
    assert v.root_causes == [
        f"{PARTITION}: ranks 0-1 leave it unset; ranks 2-3 set {PARTITION}={SET} (on node-1)"
    ]
    for groups in v.divergent_groups.values():
        assert [(g.ranks, g.share, g.outlier) for g in groups] == [
            ([0, 1], "split", False),
            ([2, 3], "split", False),
        ]


def test_a_launch_command_flag_on_three_of_eight() -> None:
    """A sizing flag given on three ranks' launch commands only (--max-running-requests 8): named as the
    flag, the three last with their hosts."""
    rows = world(8, per_node=2, inputs_of=lambda r: {"max_running_requests": "8"} if r in (2, 3, 4) else {})
    assert explain_input("max_running_requests", rows) == (
        "max_running_requests: ranks 0-1, 5-7 have --max-running-requests=<unset>; ranks 2-4 have "
        "--max-running-requests=8 (on node-1, node-2)"
    )


@pytest.mark.parametrize(
    ("old", "cause"),
    [
        ({0}, "nodes 1-3 (node-1, node-2, node-3, ranks 1-3) run SGLang 0.5.23; node 0 (node-0, rank 0) runs "
         "SGLang 0.5.16"),
        ({3}, "nodes 0-2 (node-0, node-1, node-2, ranks 0-2) run SGLang 0.5.23; node 3 (node-3, rank 3) runs "
         "SGLang 0.5.16"),
        ({0, 1, 2}, "nodes 3-7 (node-3, node-4, node-5, node-6, ..., ranks 3-7) run SGLang 0.5.23; nodes 0-2 "
         "(node-0, node-1, node-2, ranks 0-2) run SGLang 0.5.16"),
        # Most nodes still on the old release: they are the majority, the upgraded three the odd ones.
        ({0, 1, 2, 3, 4}, "nodes 0-4 (node-0, node-1, node-2, node-3, ..., ranks 0-4) run SGLang 0.5.16; "
         "nodes 5-7 (node-5, node-6, node-7, ranks 5-7) run SGLang 0.5.23"),
    ],
)  # fmt: skip
def test_installed_releases_put_the_majority_first(old: set[int], cause: str) -> None:
    """One node per rank, some on 0.5.16 and the rest on 0.5.23: the release line reads like every other
    root cause, the larger group first and the smaller one after it, "nodes 1-3 ... run" rather than
    "node 1, node 2, node 3 ... runs", at most four hosts a group."""
    n = 4 if len(old) == 1 else 8
    rows = world(n, inputs_of=lambda r: {"sglang_installed": "0.5.16" if r in old else "0.5.23"})
    v = decide(rows, world_size=n)
    assert v.differing_inputs[0] == "sglang_installed"
    assert v.root_causes[0].startswith(f"sglang_installed: {cause} -- what changed: "), v.root_causes[0]


@pytest.mark.parametrize(
    ("values", "odd", "split"),
    [
        (["a", "a", "a", "b"], {3}, False),
        (["b", "a", "a", "a"], {0}, False),
        (["b", "b", "b", "a", "a", "a", "a", "a"], {0, 1, 2}, False),
        (["a", "a", "a", "a", "a", "b", "b", "b"], {5, 6, 7}, False),
        (["a", "a", "a", "a", "b", "b", "c", "c"], {4, 5, 6, 7}, False),
        (["a", "a", "b", "b"], set(), True),
        (["a", "a", "a", "b", "b", "b", "c", "c"], set(), True),  # the two largest tie: no majority
        (["a", "a", "a"], set(), False),
    ],
)
def test_outliers_are_the_ranks_off_a_strict_majority(values: list[str], odd: set[int], split: bool) -> None:
    assert outliers(values) == odd
    assert is_split(values) == split


@pytest.mark.parametrize(
    ("name", "value", "one", "many"),
    [
        ("page_size", "64", "has --page-size=64", "have --page-size=64"),
        (PARTITION, SET, f"sets {PARTITION}={SET}", f"set {PARTITION}={SET}"),
        ("torch_version", "2.5.1", "runs torch 2.5.1", "run torch 2.5.1"),
        ("model", "m #1", "loads m #1", "load m #1"),
        ("derived_as", "SGLang 0.5.16", "derives as SGLang 0.5.16", "derive as SGLang 0.5.16"),
    ],
)
def test_a_per_rank_line_agrees_with_one_rank_and_with_many(
    name: str, value: str, one: str, many: str
) -> None:
    """ "rank 3 has --page-size=64", "ranks 2-3 have --page-size=64" (it said "rank 3 have")."""
    # An input every rank resolves while deriving (derived_as) is compared only between ranks that did.
    base = {"derived_as": {"derived_as": "SGLang 0.5.23"}}.get(name, {})
    lone = explain_input(name, world(4, inputs_of=lambda r: {name: value} if r == 3 else base))
    assert f"; rank 3 {one} (on node-3)" in lone
    pair = explain_input(name, world(4, inputs_of=lambda r: {name: value} if r >= 2 else base))
    assert f"ranks 2-3 {many}" in pair


def test_a_rank_started_without_a_launch_command_is_singular() -> None:
    given = "python -m sglang.launch_server: --enable-mixed-chunk"  # FORM: the flags no other input compares
    rows = world(4, inputs_of=lambda r: {"launch_command": None if r == 3 else given})
    assert "; rank 3 was started without one (on node-3)" in explain_input("launch_command", rows)
    rows = world(4, inputs_of=lambda r: {"launch_command": None if r == 0 else given})
    line = explain_input("launch_command", rows)
    assert "ranks 1-3 ran `python -m sglang.launch_server ...` with --enable-mixed-chunk;" in line, line


def test_one_rank_on_another_release_than_its_node_is_singular() -> None:
    rows = world(4, per_node=2, inputs_of=lambda r: {"sglang_installed": "0.5.16" if r == 3 else "0.5.23"})
    assert "; rank 3 (on node-1) runs SGLang 0.5.16" in explain_input("sglang_installed", rows)
    rows = world(4, per_node=2, inputs_of=lambda r: {"sglang_installed": "0.5.16" if r else "0.5.23"})
    assert "ranks 1-3 (on node-0, node-1) run SGLang 0.5.16" in explain_input("sglang_installed", rows)
