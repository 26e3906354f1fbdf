"""Which group of ranks the verdict calls the odd one, and where it runs, when the groups are unequal.

Rows are built in-process (``RankRow`` with the wire's digests, what rank 0 decides on after the
all-gather) and handed to ``decide``: no process group. The expectations are written out by hand from
the layout of each case (which ranks set what, which host each rank runs on): with 3 ranks against 1,
or 5 against 3, the smaller group is the odd one, named after the majority with its own hosts; with an
even split there is no odd one.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import pytest
from rank_rows import world

from checker.core.ranks import is_split, outliers
from checker.core.sizing.row import RankRow
from checker.distributed.wire import VALUE_BYTES, decode_row, encode_row, sent_text
from checker.preflight.verdict import decide, explain_input, infrastructure_failure
from checker.status import ROW_DRIFT, ROW_INTERNAL

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
        "max_running_requests: ranks 0-1, 5-7 leave --max-running-requests unset; ranks 2-4 have "
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


FLOOR = (
    "0.5.23 floors --max-running-requests // dp at 1 (resolver, no-radix pool, spec reservation); 0.5.22 "
    "lets it reach 0 and refuses to start"
)
SPEC_UNDER_PP = (
    "0.5.20 refuses speculative decoding under pipeline parallelism; 0.5.21 accepts EAGLE with "
    "SGLANG_ENABLE_PP_SPEC=1"
)
SKIP_LOCK = "0.5.17 and later read SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK (base 2 slots per request instead of 3)"
BUDGET_RULE = "0.5.17 and 0.5.18 compute the memory handed to sizing differently"


@pytest.mark.parametrize(
    ("old", "new", "inputs", "changed"),
    [
        ("0.5.22", "0.5.23", {"max_running_requests": "8"}, FLOOR),
        ("0.5.22", "0.5.23", {}, None),  # no --max-running-requests: the floor cannot matter
        ("0.5.20", "0.5.21", {"speculative_num_draft_tokens": "2"}, SPEC_UNDER_PP),
        ("0.5.20", "0.5.21", {}, None),
        (
            "0.5.17",
            "0.5.18",
            {"budget_source": "device free (MIN over ranks): total_rest_memory = 7.2 GiB"},
            BUDGET_RULE,
        ),
        ("0.5.17", "0.5.18", {"budget_source": "--budget-gib"}, None),
    ],
)
def test_the_release_line_names_only_the_changes_that_matter_here(
    old: str, new: str, inputs: dict[str, str], changed: str | None
) -> None:
    """Half the ranks on each release; what the ranks exchanged (the flags, the budget source) decides
    which release changes can explain the difference: the line says those, and nothing when none can."""
    rows = world(4, inputs_of=lambda r: {"sglang_installed": old if r < 2 else new, **inputs})
    cause = decide(rows, world_size=4).root_causes[0]
    if changed is None:
        assert " -- what changed" not in cause, cause
    else:
        assert cause.split(" -- what changed: ")[1].startswith(changed), cause


def test_the_decode_lock_change_is_named_when_any_rank_sets_the_switch() -> None:
    """SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK exported on one rank only is enough for the 0.5.16 -> 0.5.17
    change in how it is read to matter (that rank's slots per request change)."""
    lock = "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"
    rows = world(
        4,
        inputs_of=lambda r: {
            "sglang_installed": "0.5.16" if r < 2 else "0.5.17",
            **({lock: "1"} if r == 3 else {}),
        },
    )
    release_line = next(c for c in decide(rows, world_size=4).root_causes if c.startswith("sglang_installed"))
    assert SKIP_LOCK in release_line
    plain = world(4, inputs_of=lambda r: {"sglang_installed": "0.5.16" if r < 2 else "0.5.17"})
    assert SKIP_LOCK not in decide(plain, world_size=4).root_causes[0]


LAZY_SPEC = "0.5.17 and later accept extra_buffer_lazy with speculative decoding; 0.5.16 refuses it"


@pytest.mark.parametrize(
    ("inputs", "pp_size", "named"),
    [
        ({"mamba_radix_cache_strategy": "extra_buffer_lazy", "speculative_num_draft_tokens": "2"}, 1, True),
        ({"mamba_radix_cache_strategy": "extra_buffer_lazy"}, 1, False),  # lazy without spec decoding
        ({"speculative_num_draft_tokens": "2"}, 1, False),  # spec decoding without lazy
    ],
)
def test_the_lazy_with_spec_change_needs_both(inputs: dict[str, str], pp_size: int, named: bool) -> None:
    rows = world(2, inputs_of=lambda r: {"sglang_installed": "0.5.16" if r == 0 else "0.5.17", **inputs})
    for r in rows:
        r.pp_size = pp_size
    assert (LAZY_SPEC in decide(rows, world_size=2).root_causes[0]) == named


def test_spec_under_pp_matters_only_under_pp() -> None:
    """0.5.20 -> 0.5.21 changed what happens to speculative decoding under pipeline parallelism: a
    deployment at pp 1 is not affected, whatever its flags."""
    rows = world(
        2,
        inputs_of=lambda r: {
            "sglang_installed": "0.5.20" if r == 0 else "0.5.21",
            "speculative_num_draft_tokens": "2",
        },
    )
    for r in rows:
        r.pp_size = 1
    assert " -- what changed" not in decide(rows, world_size=2).root_causes[0]


def test_three_releases_explain_each_step_and_skip_an_unknown_one() -> None:
    """Ranks on 0.4.0 (not modelled), 0.5.22 and 0.5.23, with --max-running-requests: each modelled step
    is explained (the floor of 0.5.23), the unknown release is named but explains nothing, and it does
    not stop the explanation of the others."""
    version = {0: "0.4.0", 1: "0.5.22", 2: "0.5.23", 3: "0.5.23"}
    rows = world(4, inputs_of=lambda r: {"sglang_installed": version[r], "max_running_requests": "8"})
    cause = decide(rows, world_size=4).root_causes[0]
    assert cause.startswith("sglang_installed: nodes 2-3 (node-2, node-3, ranks 2-3) run SGLang 0.5.23; ")
    assert (
        "node 0 (node-0, rank 0) runs SGLang 0.4.0" in cause
        and "node 1 (node-1, rank 1) runs SGLang 0.5.22" in cause
    )
    assert cause.endswith(" -- what changed: " + FLOOR)


def test_two_release_steps_are_both_explained() -> None:
    """0.5.16, 0.5.17 and 0.5.23 side by side: the what-changed part holds the steps 0.5.16 -> 0.5.17
    (the charge, among others) and 0.5.17 -> 0.5.23 (the floor), in release order."""
    version = {0: "0.5.16", 1: "0.5.17", 2: "0.5.23"}
    rows = world(3, inputs_of=lambda r: {"sglang_installed": version[r], "max_running_requests": "8"})
    why = decide(rows, world_size=3).root_causes[0].split(" -- what changed: ")[1]
    assert why.startswith("0.5.16 charges each stage for the whole model's state; 0.5.17 and later charge")
    assert why.endswith(
        "0.5.23 floors --max-running-requests // dp at 1 (resolver, no-radix pool, spec "
        "reservation); 0.5.17 lets it reach 0 and refuses to start"
    )
    # Each change is its own "; "-separated clause naming the release it is about.
    assert all(re.match(r"0\.5\.\d+ ", clause) for clause in why.split("; ")), why


def test_ranks_without_sglang_are_named_as_such() -> None:
    """A node with no SGLang installed is "has no SGLang installed" (several: "have"), never a release
    called "not installed"; nothing is explained for it."""
    rows = world(4, inputs_of=lambda r: {"sglang_installed": "not installed" if r < 3 else "0.5.23"})
    assert decide(rows, world_size=4).root_causes[0] == (
        "sglang_installed: nodes 0-2 (node-0, node-1, node-2, ranks 0-2) have no SGLang installed; node 3 "
        "(node-3, rank 3) runs SGLang 0.5.23"
    )
    rows = world(4, inputs_of=lambda r: {"sglang_installed": "not installed" if r == 3 else "0.5.23"})
    assert (
        decide(rows, world_size=4)
        .root_causes[0]
        .endswith("; node 3 (node-3, rank 3) has no SGLang installed")
    )


def test_a_node_with_two_releases_is_described_by_ranks() -> None:
    """Two ranks to a host and node 1 mixed (rank 2 on 0.5.16, rank 3 without SGLang): node 0 is still
    named whole, node 1's ranks are named one by one with their host ("runs" / "has no" for one rank)."""
    version = {0: "0.5.23", 1: "0.5.23", 2: "0.5.16", 3: "not installed"}
    rows = world(4, per_node=2, inputs_of=lambda r: {"sglang_installed": version[r]})
    assert (
        decide(rows, world_size=4)
        .root_causes[0]
        .startswith(
            "sglang_installed: node 0 (node-0, ranks 0-1) runs SGLang 0.5.23; rank 2 (on node-1) runs SGLang "
            "0.5.16; rank 3 (on node-1) has no SGLang installed -- what changed: "
        )
    )


def test_ranks_whose_node_is_unknown_are_described_by_ranks() -> None:
    """A row without a node rank (MISSING, -1: a rank that could not read its environment) is not a
    "node -1"."""
    rows = world(3, inputs_of=lambda r: {"sglang_installed": "0.5.16" if r == 0 else "0.5.23"})
    for r in rows:
        r.node_rank = -1
    cause = decide(rows, world_size=3).root_causes[0]
    assert cause.startswith(
        "sglang_installed: ranks 1-2 (on node-1, node-2) run SGLang 0.5.23; rank 0 (on node-0) runs SGLang "
        "0.5.16"
    )
    assert "node -1" not in cause


def test_releases_past_0_5_9_are_explained_in_release_order() -> None:
    """0.5.9, 0.5.10 and 0.5.23 side by side: the steps explained are 0.5.9 -> 0.5.10 and 0.5.10 ->
    0.5.23, as the release numbers go ("0.5.10" sorts before "0.5.9" as text)."""
    version = {0: "0.5.9", 1: "0.5.10", 2: "0.5.23"}
    rows = world(3, inputs_of=lambda r: {"sglang_installed": version[r]})
    why = decide(rows, world_size=3).root_causes[0].split(" -- what changed: ")[1]
    assert why.startswith("0.5.9 and 0.5.10 cap max_running_requests differently (tp-worker vs estimate)")
    assert "0.5.23 and 0.5.9" not in why and "0.5.9 and 0.5.23" not in why


def test_four_hosts_are_all_named_and_a_fifth_is_elided() -> None:
    """An odd group on four hosts names all four; on five, four and ", ..." (a line per host would bury
    the cause)."""
    rows = world(9, inputs_of=lambda r: {PARTITION: SET} if r >= 5 else {})
    assert explain_input(PARTITION, rows).endswith("(on node-5, node-6, node-7, node-8)")
    rows = world(11, inputs_of=lambda r: {PARTITION: SET} if r >= 6 else {})
    for r in rows:
        r.host = f"host-{chr(ord('a') + r.rank)}"
    assert explain_input(PARTITION, rows).endswith("(on host-g, host-h, host-i, host-j, ...)")


@pytest.mark.parametrize(
    ("name", "values", "line"),
    [
        (
            "torch_version",
            ("2.13.0", "2.12.1"),
            "torch_version: ranks 0-2 run torch 2.13.0; rank 3 runs torch 2.12.1 (on node-3)",
        ),
        (
            "model",
            ("kimi-k3 #56a8a0b3", "kimi-k3 #cf34bb09"),
            "model: ranks 0-2 load kimi-k3 #56a8a0b3; rank 3 loads kimi-k3 #cf34bb09 (on node-3)",
        ),
        (
            "launch_command",
            ("python -m sglang.launch_server: --enable-mixed-chunk", None),
            "launch_command: ranks 0-2 ran `python -m sglang.launch_server ...` with --enable-mixed-chunk; "
            "rank 3 was started without one (on node-3)",
        ),
    ],
)
def test_each_kind_of_input_is_worded_for_what_it_is(name: str, values: tuple, line: str) -> None:
    rows = world(4, inputs_of=lambda r: {name: values[r == 3]})
    assert explain_input(name, rows) == line


def test_a_value_cut_on_the_wire_is_shown_cut() -> None:
    """Values travel in VALUE_BYTES bytes (the digest covers the whole text): one the wire cut is shown
    with "...", the mark the JSON report gives it too (one rule: checker.distributed.wire.sent_text); one
    that exactly fills the slot, or is a byte shorter, is whole and shown as is."""
    cut, full, short = "a" * (VALUE_BYTES + 8), "c" * VALUE_BYTES, "b" * (VALUE_BYTES - 1)
    values = {1: cut, 2: short, 3: full}
    sent = [decode_row(encode_row(r)) for r in world(4, inputs_of=lambda r: {PARTITION: values.get(r)})]
    line = explain_input(PARTITION, sent)
    assert f"rank 1 sets {PARTITION}={cut[:VALUE_BYTES]}... (on node-1)" in line
    assert f"rank 2 sets {PARTITION}={short} (on node-2)" in line
    assert f"rank 3 sets {PARTITION}={full} (on node-3)" in line
    assert sent_text(sent[1], PARTITION) == cut[:VALUE_BYTES] + "..."
    assert sent_text(sent[3], PARTITION) == full


def test_an_infrastructure_failure_keeps_the_rows_it_has() -> None:
    """The rows that did arrive stay in the verdict (the report lists what each rank derived)."""
    rows = world(2)
    v = infrastructure_failure(world_size=3, detail="rank 2 lost", missing_ranks=[2], rows=rows)
    assert v.rows == rows and v.missing_ranks == [2] and v.status == "infrastructure_failure"


# -- the verdict's status, in the order a user reads it: drift, errors, divergence, inputs ---------------

DRIFT = "max_mamba_cache_size: builtin 74, sglang 73"


def test_a_drifted_model_is_the_verdict_even_where_values_differ() -> None:
    """When the builtin model and SGLang disagree on some ranks, their values are not evidence: the verdict
    is model_drift (exit 4), each drift message once with the ranks that sent it."""
    rows = world(4, k_of=lambda r: 83 if r == 3 else 74)
    for r in rows[1:3]:
        r.status, r.error = ROW_DRIFT, DRIFT
    rows[3].status, rows[3].error = ROW_DRIFT, "max_running_requests: builtin 18, sglang 20"
    v = decide(rows, world_size=4)
    assert (v.status, v.exit_code) == ("model_drift", 4)
    assert v.errors == [
        f"ranks 1-2 (node-1, node-2): {DRIFT}",
        "rank 3 (node-3): max_running_requests: builtin 18, sglang 20",
    ]
    assert v.divergent == []


def test_a_rank_that_failed_outranks_a_drifted_one() -> None:
    rows = world(3)
    rows[0].status, rows[0].error = ROW_INTERNAL, "internal error: KeyError 'x'"
    rows[2].status, rows[2].error = ROW_DRIFT, DRIFT
    v = decide(rows, world_size=3)
    assert (v.status, v.exit_code) == ("error", 2)
    assert v.errors == ["rank 0 (node-0): internal error: KeyError 'x'"]


def test_inputs_that_differ_under_equal_values_warn_and_fail_only_with_strict_inputs() -> None:
    conv, part = "SGLANG_MAMBA_CONV_DTYPE", PARTITION
    rows = world(3, inputs_of=lambda r: {conv: "bfloat16", part: SET} if r == 2 else {})
    v = decide(rows, world_size=3)
    assert (v.status, v.errors) == ("consistent", [])
    (warning,) = v.warnings
    lead, names = warning.split(": ")
    assert lead == "inputs differ across ranks although every derived value agrees"
    assert sorted(names.split(", ")) == sorted([part, conv])
    strict = decide(rows, world_size=3, strict_inputs=True)
    assert (strict.status, strict.exit_code, strict.warnings) == ("divergent", 1, [])
    assert strict.errors == [warning + " (--strict-inputs)"]


def test_the_verdict_keeps_the_world_it_was_decided_for() -> None:
    assert decide(world(4), world_size=4).world_size == 4
    lost = infrastructure_failure(world_size=3, detail="rank 2 lost", missing_ranks=[2], rows=world(2))
    assert lost.world_size == 3


def test_a_world_of_one_rank_is_consistent() -> None:
    v = decide(world(1), world_size=1)
    assert (v.status, v.differing_inputs, v.root_causes, v.warnings) == ("consistent", [], [], [])


def test_the_release_derived_as_is_a_cause_only_when_the_installed_ones_agree() -> None:
    """Ranks on other installed releases also derive as other releases: that follows, it is one cause.
    Ranks on one installed release told to derive as different ones (--sglang-version): that is the cause."""

    def derived(r: int) -> str:
        return f"SGLang {'0.5.22' if r == 3 else '0.5.23'} (--sglang-version)"

    upgraded = world(
        4,
        inputs_of=lambda r: {"sglang_installed": "0.5.22" if r == 3 else "0.5.23", "derived_as": derived(r)},
    )
    v = decide(upgraded, world_size=4)
    # derived_as follows from sglang_installed here: neither a cause nor a differing input of its own.
    assert set(v.differing_inputs) == {"sglang_installed"}
    assert [c.split(":")[0] for c in v.root_causes] == ["sglang_installed"]
    told = world(4, inputs_of=lambda r: {"sglang_installed": "0.5.23", "derived_as": derived(r)})
    assert decide(told, world_size=4).root_causes == [
        "derived_as: ranks 0-2 derive as SGLang 0.5.23 (--sglang-version); "
        "rank 3 derives as SGLang 0.5.22 (--sglang-version) (on node-3)"
    ]


def test_each_value_group_says_which_stages_derived_it() -> None:
    """Rank 3 derives 83 slots where ranks 0-2 derive 74: the groups name the value, the ranks, their
    pipeline stages, the layer slices and the distinct linear-layer counts in slice order."""
    rows = world(4, k_of=lambda r: 83 if r == 3 else 74)
    for r, linear in zip(rows, (2, 1, 2, 3), strict=True):
        r.stage_linear_layers = linear
    majority, odd = decide(rows, world_size=4).divergent_groups["max_mamba_cache_size"]
    assert (majority.value, majority.ranks, majority.pp_ranks) == (74, [0, 1, 2], [0, 1, 2])
    assert majority.layers == [(0, 1), (1, 2), (2, 3)] and majority.linear_layers == [2, 1]
    assert (majority.share, majority.outlier) == ("majority", False)
    assert (odd.value, odd.ranks, odd.pp_ranks, odd.layers, odd.linear_layers) == (
        83,
        [3],
        [3],
        [(3, 4)],
        [3],
    )
    assert (odd.share, odd.outlier, odd.hosts) == ("outlier", True, ["node-3"])


def test_a_stage_charged_for_no_state_does_not_stop_the_efficiency_check() -> None:
    """A stage holding no linear layers allocates and is charged nothing; the others, allocating an eighth
    of what they are charged, still get the warning."""
    rows = world(4)
    rows[0].state_allocated_bytes = rows[0].state_charged_bytes = 0
    for r in rows[1:]:
        r.state_allocated_bytes, r.state_charged_bytes = 1 << 20, 8 << 20
    (warning,) = decide(rows, world_size=4).warnings
    assert warning.startswith("consistent, but stages allocate only about 1/8 of the state memory")
