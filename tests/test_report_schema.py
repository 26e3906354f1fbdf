"""docs/report.schema.json describes the check report as it is written: every verdict's report validates,
in-process (rows from the real derivation, round-tripped through the wire) and from a real gloo world."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from harness import run_world
from jsonschema import Draft202012Validator
from test_report import (
    CONV_SPELLED_STRICT_2,
    DEVICE_OWN_4,
    DRIFT_2,
    NOT_PP_X_TP_2,
    OWN_SHARE_8,
    PARTITION_HALF_4,
    TINY_BUDGET_2,
    TP_INNER_4,
    WHOLE_MODEL_8,
    report,
)

from checker.report import to_json
from checker.verdict import infrastructure_failure

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "report.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)


def errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


def test_the_schema_is_a_valid_draft_2020_12_schema():
    Draft202012Validator.check_schema(SCHEMA)


WORLDS = {
    "whole-model": WHOLE_MODEL_8,
    "own-share": OWN_SHARE_8,
    "partition-split": PARTITION_HALF_4,
    "tp-inner": TP_INNER_4,
    "strict-inputs": CONV_SPELLED_STRICT_2,
    "not-pp-x-tp": NOT_PP_X_TP_2,
    "budget-too-small": TINY_BUDGET_2,
    "device-budget-not-agreed": DEVICE_OWN_4,
    "drift": DRIFT_2,
}


@pytest.mark.parametrize("world", WORLDS.values(), ids=WORLDS.keys())
def test_every_verdict_validates(world):
    assert errors(report(world)) == []


def test_infrastructure_failure_without_rows_validates():
    v = infrastructure_failure(world_size=3, detail="rank 2 never joined", missing_ranks=[2])
    doc = json.loads(json.dumps(to_json(v, extra={"checker_version": "0", "timings": {"total_s": 6.0}})))
    assert errors(doc) == []


@pytest.mark.parametrize(
    ("path", "bad", "why"),
    [
        (("ranks", 0, "inputs", "tp_size"), "1", "a number sent as text"),
        (("ranks", 0, "inputs", "disable_radix_cache"), "false", "a flag sent as text"),
        (("ranks", 0, "max_mamba_cache_size"), -1, "the wire's MISSING leaking into the report"),
        (("status",), "passed", "a status outside checker/status.py"),
        (("divergent_groups", "max_mamba_cache_size", 0, "share"), "outliers", "an unknown share"),
    ],
)
def test_the_schema_rejects_what_a_consumer_could_not_rely_on(path, bad, why):
    doc = copy.deepcopy(report(PARTITION_HALF_4))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad
    assert errors(doc), why


def test_a_real_world_report_and_its_stdout_validate(tmp_path):
    """Two gloo ranks, the partition env on rank 1 only: --report and --format json both validate, and
    the differing input has its per-rank view."""
    part = {"SGLANG_PP_LAYER_PARTITION": "47,46"}
    res = run_world(
        ["check", "--model", "kimi-k3", "--budget-gib", "8", "--format", "json", "--timeout-s", "60"],
        world_size=2,
        tmp_path=tmp_path,
        rank_env={1: part},
    )
    assert res.codes[0] == res.codes[1] and res.codes[0] in (0, 1), [r.stderr[-400:] for r in res.ranks]
    doc = res.report()
    assert errors(doc) == []
    assert json.loads(res.ranks[0].stdout) == doc
    assert doc["inputs"]["SGLANG_PP_LAYER_PARTITION"] == {"by_rank": [None, "47,46"]}
    assert doc["inputs"]["budget_gib"] == 8.0 and doc["layout"]["pp_size"] == 2
