"""The verdict and every rendering of it, in-process, in milliseconds.

Each rank's row comes from the real derivation (``checker.preflight.derivation.derive_row`` with a
``PreflightConfig``, one ``RankEnv`` and one environment per rank) and is round-tripped through the wire
encoding (``encode_row`` -> ``decode_row``), exactly what rank 0 decides on after the all-gather. Only
transport and the launchers are left to tests/test_check.py's real worlds.

Expected values are the worked numbers of kimi-k3 at 8 GiB, r 0.5 (tests/test_sizing.py derives them
from SGLang's arithmetic): 74 slots on every stage under max-share; [74, 83, 83, 74, 74, 74, 74, 83]
under own-share (stages 1, 2 and 7 hold 8 linear layers, the others 9); 8 under whole-model; with 4
slots a request (the default strategy under PP) 74 -> 18 running requests, 18 // 8 stages -> micro-batch
2; with 3 slots (no_buffer) 24 and 3. The renderings are parsed (tables, markdown, JUnit), not grepped.
"""

from __future__ import annotations

import hashlib
import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import pytest
from rank_rows import world

from checker.config import (
    BudgetSource,
    EngineChoice,
    ModelChoice,
    OutputOptions,
    PreflightConfig,
    SizingFlags,
)
from checker.distributed.launch_env import GroupOptions, RankEnv
from checker.distributed.wire import decode_row, encode_row
from checker.outputs.report import one_line, to_json, to_junit, to_markdown, to_text
from checker.preflight.derivation import derive_row, local_facts
from checker.preflight.verdict import Verdict, decide, infrastructure_failure
from checker.status import ROW_DRIFT

# The renderings are parsed with the test extra's parsers; a machine without them (the GPU host's
# bench/gpu_check.sh collects every module) skips this module instead of failing collection.
junitparser = pytest.importorskip("junitparser")
MarkdownIt = pytest.importorskip("markdown_it").MarkdownIt
Error, Failure, JUnitXml = junitparser.Error, junitparser.Failure, junitparser.JUnitXml

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PARTITION = "SGLANG_PP_LAYER_PARTITION"
SUMMARY = "world N (test)"
ELAPSED_S = 3.25


@dataclass(frozen=True)
class World:
    """One launch: world size, flags, budget source and per-rank environment (rank -> env vars)."""

    n: int
    sizing: tuple[tuple[str, object], ...] = ()
    budget: BudgetSource = BudgetSource(budget_gib=8.0)
    environ: tuple[tuple[int, tuple[tuple[str, str], ...]], ...] = ()
    per_node: int = 2
    strict: bool = False
    drift_rank: int | None = None


def _env(rank: int, world: World) -> RankEnv:
    return RankEnv(
        rank=rank,
        world_size=world.n,
        local_rank=rank % world.per_node,
        local_world_size=world.per_node,
        node_rank=rank // world.per_node,
        host=f"node-{rank // world.per_node}",
        master_addr=None,
        master_port=None,
        use_agent_store=False,
        restart_count=0,
        max_restarts=0,
    )


@cache
def decided(world: World) -> Verdict:
    sizing = SizingFlags(**{"mamba_full_memory_ratio": 0.5, **dict(world.sizing)})
    config = PreflightConfig(
        model=ModelChoice(model="kimi-k3"),
        sizing=sizing,
        engine=EngineChoice(),
        group=GroupOptions(),
        budget=world.budget,
        output=OutputOptions(),
        strict_inputs=world.strict,
    )
    envs = [_env(r, world) for r in range(world.n)]
    local = [local_facts(config, e, None) for e in envs]
    environ = {r: dict(kv) for r, kv in world.environ}
    rows = []
    for e, facts in zip(envs, local, strict=True):
        row = derive_row(
            config,
            e,
            facts,
            all_free=[f.device_free_bytes for f in local],
            torch_version="x",
            device=None,
            environ=environ.get(e.rank, {}),
        )
        if e.rank == world.drift_rank:  # what --engine both sends when SGLang derives another value
            row.status, row.error = ROW_DRIFT, "max_mamba_cache_size: builtin 74, sglang 73"
        rows.append(decode_row(encode_row(row)))
    return decide(rows, world_size=world.n, strict_inputs=world.strict)


@pytest.fixture(autouse=True)
def _decide_afresh_under_mutation() -> None:
    """Under mutmut (docs/development.md, "Mutation testing") each mutant runs in a process forked after
    the suite ran once unmutated: a verdict cached then would hide the mutant from every test here."""
    if os.environ.get("MUTANT_UNDER_TEST"):
        decided.cache_clear()


def report(world: World) -> dict:
    """The JSON report exactly as --report writes it (serialised and read back)."""
    return json.loads(json.dumps(to_json(decided(world), extra={"timings": {"total_s": ELAPSED_S}})))


def on_ranks(ranks: tuple[int, ...], **env: str) -> tuple[tuple[int, tuple[tuple[str, str], ...]], ...]:
    return tuple((r, tuple(env.items())) for r in ranks)


MAX_SHARE_8 = World(8)
THREE_SLOTS_8 = World(8, (("mamba_radix_cache_strategy", "no_buffer"), ("disable_overlap_schedule", True)))
OWN_SHARE_8 = World(8, (("policy", "own-share"),))
WHOLE_MODEL_8 = World(8, (("policy", "whole-model"),))
PARTITION_HALF_4 = World(4, environ=on_ranks((2, 3), **{PARTITION: "30,21,21,21"}))
TP_INNER_4 = World(4, (("tp_size", 2),))
CONV_SPELLED_2 = World(2, environ=on_ranks((1,), SGLANG_MAMBA_CONV_DTYPE="bfloat16"))
CONV_SPELLED_STRICT_2 = replace(CONV_SPELLED_2, strict=True)
NOT_PP_X_TP_2 = World(2, (("pp_size", 3),))
TINY_BUDGET_2 = World(2, budget=BudgetSource(budget_gib=0.05))
FREE = (10.0, 9.5, 12.0, 9.75)
DEVICE_MIN_4 = World(4, budget=BudgetSource(from_device=True, mem_fraction_static=0.8, device_free_gib=FREE))
DEVICE_OWN_4 = World(
    4, budget=BudgetSource(from_device=True, mem_fraction_static=0.8, device_free_gib=FREE, agree=False)
)
DRIFT_2 = World(2, drift_rank=1)


# ---- the verdict --------------------------------------------------------------------------------------

VALUES = [
    # world, status, exit code, per rank (max_mamba_cache_size, max_running_requests, pp_max_micro_batch)
    pytest.param(MAX_SHARE_8, "consistent", 0, [(74, 18, 2)] * 8, id="max-share-pp8"),
    pytest.param(THREE_SLOTS_8, "consistent", 0, [(74, 24, 3)] * 8, id="three-slots-pp8"),
    pytest.param(WHOLE_MODEL_8, "consistent", 0, [(8, 2, 1)] * 8, id="whole-model-pp8"),
    pytest.param(
        OWN_SHARE_8,
        "divergent",
        1,
        [(k, k // 4, 2) for k in (74, 83, 83, 74, 74, 74, 74, 83)],
        id="own-share-pp8",
    ),
    pytest.param(CONV_SPELLED_2, "consistent", 0, None, id="equal-values-differing-input"),
    pytest.param(CONV_SPELLED_STRICT_2, "divergent", 1, None, id="strict-inputs"),
    pytest.param(NOT_PP_X_TP_2, "error", 2, [(None, None, None)] * 2, id="not-pp-x-tp"),
    pytest.param(TINY_BUDGET_2, "error", 2, [(None, None, None)] * 2, id="budget-too-small"),
    pytest.param(DRIFT_2, "model_drift", 4, None, id="drift"),
]


@pytest.mark.parametrize(("world", "status", "code", "values"), VALUES)
def test_status_exit_code_and_values(world, status, code, values):
    rep = report(world)
    assert (rep["status"], rep["exit_code"]) == (status, code)
    if values is not None:
        got = [
            (r["max_mamba_cache_size"], r["max_running_requests"], r["pp_max_micro_batch_size"])
            for r in rep["ranks"]
        ]
        assert got == values


def test_own_share_groups_name_the_eight_layer_stages_as_outliers():
    v = decided(OWN_SHARE_8)
    assert v.divergent == ["max_mamba_cache_size", "max_running_requests"]
    k = v.divergent_groups["max_mamba_cache_size"]
    assert [(g.value, g.ranks, g.share, g.outlier) for g in k] == [
        (74, [0, 3, 4, 5, 6], "majority", False),
        (83, [1, 2, 7], "outlier", True),
    ]
    assert [g.linear_layers for g in k] == [[9], [8]]


def test_even_split_has_no_outliers():
    """Two ranks against two: neither side is the odd one out."""
    v = decided(PARTITION_HALF_4)
    assert v.status == "divergent" and v.differing_inputs == [PARTITION]
    for groups in v.divergent_groups.values():
        assert [g.ranks for g in groups] == [[0, 1], [2, 3]]
        assert {(g.share, g.outlier) for g in groups} == {("split", False)}


def test_partition_env_on_one_node_is_the_root_cause():
    """Ranks 0-1 split kimi-k3's 93 layers evenly (23, 23, 23, 24), ranks 2-3 by 30,21,21,21: stage 1
    ends at 46 and stage 2 starts at 51, so layers 46-50 run nowhere. The pipeline's fault comes first,
    naming the ranks, the layers and the input; then who sets the input."""
    assert decided(PARTITION_HALF_4).root_causes == [
        "pipeline: layers [46, 51) are on no stage: rank 1 holds [23, 46) (pp_rank 1), rank 2 holds "
        f"[51, 72) (pp_rank 2); these ranks differ in {PARTITION}",
        f"{PARTITION}: ranks 0-1 leave it unset; ranks 2-3 set {PARTITION}=30,21,21,21 (on node-1)",
    ]


def test_budget_from_device_agrees_on_the_smallest_free_memory():
    """SGLang all-reduces free memory with MIN: every rank derives from 9.5 GiB x 0.8; without the
    agreement each rank uses its own free memory and the inputs (and values) differ."""
    agreed = report(DEVICE_MIN_4)
    assert agreed["status"] == "consistent"
    assert [r["budget_gib"] for r in agreed["ranks"]] == pytest.approx([9.5 * 0.8] * 4)
    own = report(DEVICE_OWN_4)
    assert own["status"] == "divergent" and "budget_gib" in own["differing_inputs"]
    assert own["inputs"]["budget_gib"]["by_rank"] == pytest.approx([f * 0.8 for f in FREE])


def test_errors_are_one_line_per_message():
    (layout_err,) = decided(NOT_PP_X_TP_2).errors
    assert layout_err.startswith("ranks 0-1 (node-0): world_size 2 is not pp_size x tp_size = 3 x 1")
    # Each stage names itself in the message: one line per rank.
    errors = decided(TINY_BUDGET_2).errors
    assert [e.split(":")[0] for e in errors] == ["rank 0 (node-0)", "rank 1 (node-0)"]
    assert all("not enough memory for the state pool: --budget-gib 0.05" in e for e in errors)


def test_rank_that_raises_is_one_error(monkeypatch):
    monkeypatch.setenv("CHECKER_INJECT_FAULT", "1:derive:raise")
    v = decided.__wrapped__(World(3))
    assert v.status == "error"
    assert v.errors == ["rank 1 (node-0): internal error: RuntimeError: injected fault on rank 1 at derive"]


def test_differing_input_with_equal_values_warns_unless_strict():
    relaxed, strict = decided(CONV_SPELLED_2), decided(CONV_SPELLED_STRICT_2)
    assert relaxed.differing_inputs == strict.differing_inputs == ["SGLANG_MAMBA_CONV_DTYPE"]
    assert relaxed.errors == [] and any("inputs differ" in w for w in relaxed.warnings)
    assert strict.errors == [
        "inputs differ across ranks although every derived value agrees: SGLANG_MAMBA_CONV_DTYPE "
        "(--strict-inputs)"
    ]


def test_whole_model_warns_that_stages_use_an_eighth():
    assert any("allocate only about 1/8 of the state memory" in w for w in decided(WHOLE_MODEL_8).warnings)


def _charged(allocated: tuple[int, ...], k_of=lambda r: 74) -> Verdict:  # noqa: ANN001
    """A world whose rank r allocates ``allocated[r]`` of the 1,000 bytes it is charged."""
    rows = world(len(allocated), k_of=k_of)
    for r, a in zip(rows, allocated, strict=True):
        r.state_allocated_bytes, r.state_charged_bytes = a, 1_000
    return decide(rows, world_size=len(rows))


@pytest.mark.parametrize(
    ("allocated", "warning"),
    [
        ((500, 500), None),  # exactly half: not below the line
        ((501, 500), None),
        ((500, 499), "1/2 of the state memory they are charged for (worst stage 50%)"),  # 999 / 2000
        ((1_000, 0), None),  # the world's total counts, not the worst stage: 1000 / 2000
        ((999, 0), "1/2 of the state memory they are charged for (worst stage 0%)"),
        ((334, 333), "1/3 of the state memory they are charged for (worst stage 33%)"),
        ((125, 125, 125, 125), "1/8 of the state memory they are charged for (worst stage 12%)"),
    ],
)
def test_efficiency_warning_starts_just_below_half(allocated: tuple[int, ...], warning: str | None) -> None:
    """Stages that allocate less than half the state they are charged for, summed over the world, get
    the warning (rounded to 1/N, the worst stage in percent); exactly half or more gets none. Hand-made
    rows on both sides of the line: a threshold moved, or < read as <=, shows here."""
    v = _charged(allocated)
    assert v.status == "consistent"
    if warning is None:
        assert v.warnings == []
    else:
        assert v.warnings == [
            f"consistent, but stages allocate only about {warning}; max-share charging gives a larger "
            "pool at the same budget"
        ]


def test_efficiency_warning_does_not_call_a_divergent_world_consistent():
    """Whole-model charging on a world whose stages diverge (another budget on rank 0): the waste is
    still worth saying, but not as "consistent, but ..."."""
    v = _charged((125, 125), k_of=lambda r: 80 if r == 0 else 74)
    assert v.status == "divergent"
    assert v.warnings == [
        "stages allocate only about 1/8 of the state memory they are charged for (worst stage 12%); "
        "max-share charging gives a larger pool at the same budget"
    ]


# ---- JSON --------------------------------------------------------------------------------------------


def test_json_inputs_are_typed_and_the_layout_is_filled():
    rep = report(TP_INNER_4)
    assert rep["layout"] == {"world_size": 4, "pp_size": 2, "tp_size": 2}
    assert [(r["pp_rank"], r["tp_rank"], r["pp_size"], r["tp_size"]) for r in rep["ranks"]] == [
        (0, 0, 2, 2),
        (0, 1, 2, 2),
        (1, 0, 2, 2),
        (1, 1, 2, 2),
    ]
    inputs = rep["inputs"]
    expected = {
        "tp_size": 2,
        "pp_size": None,  # not given: the layout above is what the ranks derive with
        "dp_size": 1,
        "budget_gib": 8.0,
        "mamba_full_memory_ratio": 0.5,
        "page_size": 1,
        "disable_radix_cache": False,
        "disable_overlap_schedule": False,
        "policy": None,
        "max_running_requests": None,
        "mamba_radix_cache_strategy": "auto",
        PARTITION: None,
        "budget_source": "--budget-gib",
    }
    assert {k: inputs[k] for k in expected} == expected
    for k, v in expected.items():  # JSON types, not just equal values (True == 1 in Python)
        assert type(inputs[k]) is type(v), k
    assert rep["ranks"][0]["inputs"] == inputs  # every rank agrees: the top level is any rank's view


def test_json_differing_input_has_a_per_rank_view():
    rep = report(PARTITION_HALF_4)
    assert rep["inputs"][PARTITION] == {"by_rank": [None, None, "30,21,21,21", "30,21,21,21"]}
    assert rep["inputs"]["pp_size"] is None and rep["inputs"]["policy"] is None
    assert [r["inputs"][PARTITION] for r in rep["ranks"]] == [None, None, "30,21,21,21", "30,21,21,21"]


def test_json_groups_carry_layers_and_share():
    groups = report(PARTITION_HALF_4)["divergent_groups"]["max_mamba_cache_size"]
    assert [(g["ranks"], g["layers"], g["share"]) for g in groups] == [
        ([0, 1], [[0, 23], [23, 46]], "split"),
        ([2, 3], [[51, 72], [72, 93]], "split"),
    ]


# ---- text --------------------------------------------------------------------------------------------


def text_tables(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """Every format_table block in ``text``: (the line before it, rows as {header: cell}), cells cut at
    the column starts the dashes line gives."""
    lines = text.splitlines()
    tables = []
    for i, line in enumerate(lines):
        if i == 0 or not line or set(line) - {"-", " "}:
            continue
        starts = [j for j, c in enumerate(line) if c == "-" and (j == 0 or line[j - 1] == " ")]
        bounds = list(zip(starts, [*starts[1:], None], strict=True))

        def cells(row: str, bounds=bounds) -> list[str]:
            return [row[a:b].strip() for a, b in bounds]

        headers = cells(lines[i - 1])
        body = []
        for row in lines[i + 1 :]:
            if not row.strip():
                break
            body.append(dict(zip(headers, cells(row), strict=True)))
        tables.append((lines[i - 2] if i >= 2 else "", body))
    return tables


def test_text_root_cause_then_one_grouped_table_for_an_even_split():
    text = to_text(decided(PARTITION_HALF_4), summary=SUMMARY, elapsed_s=ELAPSED_S)
    lines = text.splitlines()
    assert lines[0].startswith("checker: DIVERGENT - world N (test) ") and "3.2 s" in lines[0]
    assert lines[2] == "root cause:"
    assert lines[3].strip().startswith("pipeline: layers [46, 51) are on no stage")
    assert lines[4].strip().startswith(PARTITION)
    (grouped_title, grouped), (_, per_rank) = text_tables(text)
    assert grouped_title.startswith("values that differ across ranks")
    assert [(r["value"], r["derived"], r["ranks"], r["share"]) for r in grouped] == [
        ("max_mamba_cache_size", "36", "0-1", "split"),
        ("", "28", "2-3", "split"),
        ("max_running_requests", "9", "0-1", "split"),
        ("", "7", "2-3", "split"),
        ("pp_max_micro_batch_size", "2", "0-1", "split"),
        ("", "1", "2-3", "split"),
    ]
    assert [r["layers"] for r in grouped[:2]] == ["[0, 23), [23, 46)", "[51, 72), [72, 93)"]
    assert [r["hosts"] for r in grouped[:2]] == ["node-0", "node-1"]
    assert not any("*" in cell for r in per_rank for cell in r.values()), "a split has no outliers"
    assert "outliers marked" not in text
    assert lines[-1] == "verdict: divergent (exit 1)"


def test_text_marks_only_the_outlier_cells():
    text = to_text(decided(OWN_SHARE_8), summary=SUMMARY, elapsed_s=ELAPSED_S)
    (_, grouped), (_, per_rank) = text_tables(text)
    assert [(r["derived"], r["share"], r["ranks"], r["linear"]) for r in grouped] == [
        ("74", "majority", "0, 3-6", "9"),
        ("83", "outlier", "1-2, 7", "8"),
        ("18", "majority", "0, 3-6", "9"),
        ("20", "outlier", "1-2, 7", "8"),
    ]
    marked = [int(r["rank"]) for r in per_rank if r["max_mamba_cache_size"].endswith("*")]
    assert marked == [1, 2, 7]
    assert all(not r["pp_max_micro_batch_size"].endswith("*") for r in per_rank)
    # identical inputs: the root cause is the stages themselves, said before the table
    assert text.index("root cause:") < text.index("values that differ")
    assert "own-share" in text.split("values that differ")[0]


def test_text_consistent_has_no_grouped_table():
    text = to_text(decided(MAX_SHARE_8), summary=SUMMARY, elapsed_s=ELAPSED_S)
    ((_, per_rank),) = text_tables(text)
    assert [r["max_mamba_cache_size"] for r in per_rank] == ["74"] * 8
    assert [r["layers"] for r in per_rank][:2] == ["[0, 11)", "[11, 22)"]
    assert text.splitlines()[-1] == "verdict: consistent (exit 0)"


def test_text_infrastructure_failure_names_the_missing_rank():
    v = infrastructure_failure(world_size=3, detail="rank 2 never joined the exchange", missing_ranks=[2])
    text = to_text(v, summary=SUMMARY, elapsed_s=ELAPSED_S)
    assert text_tables(text) == []
    assert "missing or unresponsive: rank 2" in text.splitlines()
    assert text.splitlines()[-1] == "verdict: infrastructure_failure (exit 3)"


# ---- one line ----------------------------------------------------------------------------------------

ONE_LINE = [
    pytest.param(MAX_SHARE_8, "checker verdict consistent", id="consistent"),
    pytest.param(
        OWN_SHARE_8,
        "checker verdict divergent: max_mamba_cache_size: ranks 0, 3-6 -> 74 (majority); ranks 1-2, 7 -> 83 "
        "(outlier) | max_running_requests: ranks 0, 3-6 -> 18 (majority); ranks 1-2, 7 -> 20 (outlier) "
        "(root cause: every input agrees across ranks: the values follow the stage. Under --policy "
        "own-share the stages, which hold 8, 9 linear layers, derive different values (see the layers of "
        "each group))",
        id="own-share",
    ),
    pytest.param(
        NOT_PP_X_TP_2,
        "checker verdict error: ranks 0-1 (node-0): world_size 2 is not pp_size x tp_size",
        id="error",
    ),
    pytest.param(
        DRIFT_2,
        "checker verdict model_drift: rank 1 (node-0): max_mamba_cache_size: builtin 74, sglang 73",
        id="drift",
    ),
]


@pytest.mark.parametrize(("world", "expected"), ONE_LINE)
def test_one_line(world, expected):
    line = one_line(decided(world))
    assert "\n" not in line and line.startswith(expected)


def test_one_line_divergent_quotes_the_root_cause():
    line = one_line(decided(PARTITION_HALF_4))
    assert line.startswith(
        "checker verdict divergent: max_mamba_cache_size: ranks 0-1 -> 36 (split); ranks 2-3 -> 28 (split) | "
    )
    assert line.endswith(f"(root cause: {' | '.join(decided(PARTITION_HALF_4).root_causes)})")


# ---- JUnit -------------------------------------------------------------------------------------------


def junit(world_or_verdict, tmp_path):
    v = world_or_verdict if isinstance(world_or_verdict, Verdict) else decided(world_or_verdict)
    path = tmp_path / "junit.xml"
    path.write_text(to_junit(v, elapsed_s=ELAPSED_S))
    (suite,) = JUnitXml.fromfile(str(path))
    return suite, {case.name: case for case in suite}


def test_junit_failing_case_message_carries_groups_and_root_cause(tmp_path):
    suite, cases = junit(PARTITION_HALF_4, tmp_path)
    assert (suite.tests, suite.failures, suite.errors) == (8, 4, 0)
    assert suite.time == pytest.approx(ELAPSED_S)
    gap, cause = decided(PARTITION_HALF_4).root_causes
    for name, groups in [
        ("max_mamba_cache_size", "ranks 0-1 -> 36 (split); ranks 2-3 -> 28 (split)"),
        ("pp_max_micro_batch_size", "ranks 0-1 -> 2 (split); ranks 2-3 -> 1 (split)"),
    ]:
        (failure,) = cases[name].result
        assert isinstance(failure, Failure)
        assert failure.message == f"{name} differs across ranks: {groups}. root cause: {gap} | {cause}"
        assert "pp_ranks 2-3, layers [51, 72), [72, 93)" in failure.text
    (failure,) = cases["pipeline"].result  # the stages leave layers 46-50 on no stage: a case of its own
    assert (
        failure.message == f"the stages are not one pipeline of one model: {gap.removeprefix('pipeline: ')}"
    )
    assert cases["inputs"].is_passed and cases["inputs"].system_out == cause


def test_junit_own_share_fails_two_cases(tmp_path):
    suite, cases = junit(OWN_SHARE_8, tmp_path)
    assert [n for n, c in cases.items() if not c.is_passed] == [
        "max_mamba_cache_size",
        "max_running_requests",
    ]
    assert "own-share" in cases["max_running_requests"].result[0].message
    assert cases["pp_max_micro_batch_size"].is_passed


def test_junit_strict_inputs_fails_the_inputs_case(tmp_path):
    suite, cases = junit(CONV_SPELLED_STRICT_2, tmp_path)
    (failure,) = cases["inputs"].result
    assert isinstance(failure, Failure)
    assert failure.message == (
        "inputs differ across ranks (--strict-inputs): SGLANG_MAMBA_CONV_DTYPE: "
        "rank 0 leaves it unset; rank 1 sets SGLANG_MAMBA_CONV_DTYPE=bfloat16 "
        "(on node-0)"
    )
    assert suite.failures == 1


@pytest.mark.parametrize(
    ("verdict", "message"),
    [
        pytest.param(
            lambda: decided(NOT_PP_X_TP_2), "error: ranks 0-1 (node-0): world_size 2 is not", id="error"
        ),
        pytest.param(
            lambda: infrastructure_failure(world_size=3, detail="rank 2 hung", missing_ranks=[2]),
            "infrastructure_failure: rank 2 hung; missing: rank 2",
            id="infrastructure",
        ),
        pytest.param(
            lambda: decided(DRIFT_2), "model_drift: rank 1 (node-0): max_mamba_cache_size", id="drift"
        ),
    ],
)
def test_junit_errors_on_every_value(tmp_path, verdict, message):
    suite, cases = junit(verdict(), tmp_path)
    assert suite.errors == 6 and suite.failures == 0
    for name in (
        "max_mamba_cache_size",
        "max_running_requests",
        "pp_max_micro_batch_size",
        "max_total_num_tokens",
        "context_len",
        "kv_own_tokens",
    ):
        (err,) = cases[name].result
        assert isinstance(err, Error) and err.message.startswith(message)


# ---- GitHub step summary -----------------------------------------------------------------------------


def md_blocks(text: str) -> list[tuple]:
    """Top-level blocks: ("heading", text), ("para", text), ("list", [items]), ("table", headers, rows)
    where each cell is (text, bold)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    blocks: list[tuple] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.type == "heading_open":
            blocks.append(("heading", tokens[i + 1].content))
        elif t.type == "paragraph_open" and t.level == 0:
            blocks.append(("para", tokens[i + 1].content))
        elif t.type == "bullet_list_open":
            items = []
            while tokens[i].type != "bullet_list_close":
                if tokens[i].type == "inline":
                    items.append(tokens[i].content)
                i += 1
            blocks.append(("list", items))
        elif t.type == "table_open":
            rows: list[list[tuple[str, bool]]] = []
            while tokens[i].type != "table_close":
                if tokens[i].type == "tr_open":
                    rows.append([])
                elif tokens[i].type == "inline":
                    kids = tokens[i].children or []
                    text_ = "".join(k.content for k in kids if k.type == "text")
                    rows[-1].append((text_, any(k.type == "strong_open" for k in kids)))
                i += 1
            blocks.append(("table", [c for c, _ in rows[0]], rows[1:]))
        i += 1
    return blocks


def test_markdown_root_cause_first_then_groups_then_ranks():
    blocks = md_blocks(to_markdown(decided(PARTITION_HALF_4), summary=SUMMARY))
    kinds = [b[0] for b in blocks]
    assert blocks[0] == ("heading", "PP capacity preflight: DIVERGENT")
    assert blocks[1][0] == "para" and "Root cause" in blocks[1][1]
    assert blocks[2] == ("list", decided(PARTITION_HALF_4).root_causes)
    assert kinds.count("table") == 2
    grouped, per_rank = [b for b in blocks if b[0] == "table"]
    assert grouped[1][:4] == ["value", "derived", "share", "ranks"] and "layers" in grouped[1]
    assert [[c for c, _ in row][:4] for row in grouped[2][:2]] == [
        ["max_mamba_cache_size", "36", "split", "0-1"],
        ["", "28", "split", "2-3"],
    ]
    assert per_rank[1][:5] == ["rank", "host", "pp_rank", "layers", "linear"]
    assert [row[3][0] for row in per_rank[2]] == ["[0, 23)", "[23, 46)", "[51, 72)", "[72, 93)"]
    assert not any(bold for row in per_rank[2] for _, bold in row), "a split has no outliers to mark"


def test_markdown_bolds_only_outlier_cells():
    blocks = md_blocks(to_markdown(decided(OWN_SHARE_8), summary=SUMMARY))
    headers, rows = [b for b in blocks if b[0] == "table"][1][1:]
    bold = {(int(row[0][0]), headers[j]) for row in rows for j, (_, b) in enumerate(row) if b}
    assert bold == {(r, n) for r in (1, 2, 7) for n in ("max_mamba_cache_size", "max_running_requests")}
    assert [row[headers.index("max_mamba_cache_size")][0] for row in rows] == [
        "74",
        "83",
        "83",
        "74",
        "74",
        "74",
        "74",
        "83",
    ]


def test_markdown_consistent_and_infrastructure():
    blocks = md_blocks(to_markdown(decided(WHOLE_MODEL_8), summary=SUMMARY))
    assert [b[0] for b in blocks] == ["heading", "para", "para", "table", "para", "list", "para"]
    assert blocks[4][1].startswith("KV pool: max_total_num_tokens ")
    assert "allocate only about 1/8" in blocks[5][1][0]
    assert blocks[-1] == ("para", "verdict: `consistent` (exit 0)")
    v = infrastructure_failure(world_size=3, detail="rank 2 hung", missing_ranks=[2])
    blocks = md_blocks(to_markdown(v, summary=SUMMARY))
    assert ("list", ["infrastructure failure: rank 2 hung; missing: rank 2"]) in blocks
    assert not any(b[0] == "table" for b in blocks)


# ---- the launch command, whole ------------------------------------------------------------------------

SERVE = ["python", "-m", "sglang.launch_server"]


def _model_dir(tmp_path: Path, name: str = "Kimi-Linear-48B-A3B-Instruct") -> str:
    model = tmp_path / name
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text((FIXTURES / "kimi_linear_48b_a3b.json").read_text())
    return str(model)


def _launch_world(commands: list[list[str]]) -> tuple[Verdict, dict]:
    """Each rank's launch command through the real CLI path (the check parser, the launch-command merge,
    config_from_args), derived and sent through the wire; returns the verdict and rank 0's report extra."""
    from checker.cli.main import _subparser, build_parser
    from checker.cli.namespace import apply_launch_command, given_dests
    from checker.commands.check_config import config_from_args
    from checker.outputs.report import launch_command_doc

    world = World(len(commands))
    parser = build_parser()
    rows, extra = [], {}
    for rank, launch in enumerate(commands):
        words = ["check", "--budget-gib", "8"]
        ns = parser.parse_args(words)
        ns, ns.launch = apply_launch_command(
            ns, launch, given=given_dests(_subparser(parser, "check"), words[1:])
        )
        env = _env(rank, world)
        config = config_from_args(ns, env)
        facts = local_facts(config, env, None)
        all_free = [facts.device_free_bytes] * world.n
        row = derive_row(config, env, facts, all_free=all_free, torch_version="x", device=None, environ={})
        rows.append(decode_row(encode_row(row)))
        if rank == 0:  # what CheckJob.publish adds: the command and the inputs, whole
            extra = {"launch_command": launch_command_doc(config.launch), "own_inputs": dict(row.inputs)}
    return decide(rows, world_size=world.n, strict_inputs=False), extra


# Long enough that the launch command's own sizing flags (those no other input carries) run past the
# wire's 120 bytes before --max-total-tokens, where rank 3 differs.
LONG = [
    "--pp-size", "4", "--mem-fraction-static", "0.85", "--page-size", "64", "--host", "0.0.0.0",
    "--chunked-prefill-size", "8192", "--max-prefill-tokens", "16384",
]  # fmt: skip


def test_the_report_keeps_the_whole_launch_command_and_names_a_rank_started_differently(tmp_path):
    """The rows carry the launch command's own sizing flags cut to 120 bytes, where two commands can look
    alike (here they differ only in --max-prefill-tokens' last digit, past the cut): the report keeps rank
    0's whole command (argv, text, sha256) and groups every rank by the digest of its whole input, so rank 3
    is named. The flags compared as inputs of their own (--pp-size, --page-size, the model) are not in it."""
    model = _model_dir(tmp_path)
    same = [*SERVE, "--model-path", model, *LONG, "--served-model-name"]
    same.append("a b")
    other = [*SERVE, "--model-path", model, *LONG, "--max-prefill-tokens", "16385"]
    verdict, extra = _launch_world([same, same, same, other])
    doc = json.loads(json.dumps(to_json(verdict, extra=extra)))
    lc = doc["launch_command"]
    assert lc["argv"] == same and lc["text"] == " ".join(same[:-1]) + " 'a b'"
    assert lc["sha256"] == hashlib.sha256(lc["text"].encode()).hexdigest()
    assert (lc["form"], lc["release"]) == ("python -m sglang.launch_server ARGS", "0.5.23")
    assert lc["input"] == (
        "python -m sglang.launch_server: mem_fraction_static=0.85 sglang.chunked_prefill_size=8192 "
        "sglang.max_prefill_tokens=16384"
    )
    assert [g["ranks"] for g in lc["groups"]] == [[0, 1, 2], [3]]
    assert lc["groups"][0]["input_digest"] == lc["input_digest"] != lc["groups"][1]["input_digest"]
    # Each group's whole command matches rank 0's sha256 where it is rank 0's, and no other's.
    assert lc["groups"][0]["sha256_prefix"] == lc["sha256"][:16] != lc["groups"][1]["sha256_prefix"]
    assert doc["differing_inputs"] == ["launch_command"]
    sent = doc["inputs"]["launch_command"]["by_rank"]
    assert len(set(sent)) == 1 and sent[0].endswith("...")  # cut where they differ, and it says so
    assert all(r["inputs"]["launch_command"] == sent[0] for r in doc["ranks"])
    text = to_text(verdict, summary=SUMMARY, elapsed_s=ELAPSED_S)
    assert "launch_command: each rank sends the first 120 bytes, shown ending in '...'" in text
    assert "the JSON report (--report) keeps rank 0's whole launch command" in text
    junit = to_junit(verdict, elapsed_s=ELAPSED_S)  # the failure's text says it too (GitLab, Jenkins)
    (inputs,) = [c for c in ET.fromstring(junit).iter("testcase") if c.get("name") == "inputs"]
    assert "keeps rank 0's whole launch command" in "".join(inputs.itertext())


def test_agreeing_ranks_report_the_whole_launch_input(tmp_path):
    command = [*SERVE, "--model-path", _model_dir(tmp_path), *LONG]
    verdict, extra = _launch_world([command, command])
    doc = to_json(verdict, extra=extra)
    assert doc["inputs"]["launch_command"] == doc["launch_command"]["input"]  # whole, not the wire's cut
    assert [g["ranks"] for g in doc["launch_command"]["groups"]] == [[0, 1]]
    assert "each rank sends the first" not in to_text(verdict, summary=SUMMARY, elapsed_s=ELAPSED_S)


def test_agreeing_ranks_report_a_long_model_path_whole(tmp_path):
    """A model path past the wire's 120 bytes: rank 0 reports its own whole where every rank sent the
    same digest (the rows keep the wire's cut text, marked)."""
    deep = tmp_path / "an-organisation-with-a-long-name"
    deep.mkdir(parents=True)
    model = _model_dir(deep, "Kimi-Linear-48B-A3B-Instruct-revision-2026-11-30")
    verdict, extra = _launch_world([[*SERVE, "--model-path", model, "--pp-size", "2"]] * 2)
    doc = to_json(verdict, extra=extra)
    assert len(f"{model}/config.json") > 120
    assert doc["inputs"]["model"].startswith(f"{model}/config.json (")
    assert all(r["inputs"]["model"].endswith("...") for r in doc["ranks"])
    assert "own_inputs" not in doc


def test_no_launch_command_is_null():
    assert report(MAX_SHARE_8)["launch_command"] is None
