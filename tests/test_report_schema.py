"""docs/report.schema.json describes every command's JSON as it is written: check's report for every
verdict (in-process rows from the real derivation, round-tripped through the wire, and a real gloo world),
and the real stdout of derive, plan and sweep (and sweep's --report file) in each of their modes. One
vocabulary: the same deployment through check and through derive gives the same inputs under the same
names, values included."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from harness import run_world
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
    World,
    decided,
)

from checker import __version__
from checker.outputs.report import to_json
from checker.preflight.verdict import infrastructure_failure
from checker.status import EXIT_CODES

Draft202012Validator = pytest.importorskip("jsonschema").Draft202012Validator

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "report.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)
# What check's publish passes as `extra` (checker/commands/check_job.py CheckJob.publish).
CHECK_EXTRA = {
    "checker_version": __version__,
    "torch_version": "x",
    "backend": "gloo",
    "timings": {"total_s": 1.0},
}


def errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


def check_report(world: World) -> dict:
    """check's JSON report exactly as --report writes it (serialised and read back)."""
    return json.loads(json.dumps(to_json(decided(world), extra=CHECK_EXTRA)))


def test_the_schema_is_a_valid_draft_2020_12_schema():
    Draft202012Validator.check_schema(SCHEMA)


# --- check ------------------------------------------------------------------------------------------

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
def test_every_check_verdict_validates(world):
    assert errors(check_report(world)) == []


def test_a_report_with_the_whole_launch_command_validates(tmp_path):
    """Rank 0's whole command and the per-rank digest groups, one rank started with another command."""
    from test_report import LONG, SERVE, _launch_world, _model_dir

    model = _model_dir(tmp_path)
    same = [*SERVE, "--model-path", model, *LONG]
    verdict, extra = _launch_world([same, same, [*same, "--max-total-tokens", "100000"]])
    doc = json.loads(json.dumps(to_json(verdict, extra={**CHECK_EXTRA, **extra})))
    assert doc["launch_command"]["groups"][1]["ranks"] == [2]
    assert errors(doc) == []
    doc["launch_command"]["sha256"] = "not a digest"
    assert errors(doc)


def test_infrastructure_failure_without_rows_validates():
    v = infrastructure_failure(world_size=3, detail="rank 2 never joined", missing_ranks=[2])
    doc = json.loads(json.dumps(to_json(v, extra=CHECK_EXTRA)))
    assert errors(doc) == []


@pytest.mark.parametrize(
    ("path", "bad", "why"),
    [
        (("ranks", 0, "inputs", "tp_size"), "1", "a number sent as text"),
        (("ranks", 0, "inputs", "disable_radix_cache"), "false", "a flag sent as text"),
        (("ranks", 0, "max_mamba_cache_size"), -1, "the wire's MISSING leaking into the report"),
        (("status",), "passed", "a status outside checker/status.py"),
        (("exit_code",), 0, "a divergent check that exits 0"),
        (("divergent_groups", "max_mamba_cache_size", 0, "share"), "outliers", "an unknown share"),
        (("inputs", "partition_env"), None, "an input outside the vocabulary (SGLANG_PP_LAYER_PARTITION)"),
    ],
)
def test_the_schema_rejects_what_a_consumer_could_not_rely_on(path, bad, why):
    doc = copy.deepcopy(check_report(PARTITION_HALF_4))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad
    assert errors(doc), why


@pytest.mark.slow
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


# --- derive, plan, sweep: their real stdout -----------------------------------------------------------

KIMI = ["--model", "kimi-k3", "--mamba-full-memory-ratio", "0.5"]
# The kimi-k3 preset is KimiK3ForConditionalGeneration, which SGLang 0.5.16 cannot load (it arrived in
# 0.5.17): an upgrade from 0.5.16 is shown on the same layers and shapes as a JSON model spec.
KIMI_SHAPE = [
    "--model-config",
    str(Path(__file__).resolve().parent / "fixtures" / "kimi_k3_shape_spec.json"),
    "--mamba-full-memory-ratio",
    "0.5",
]


def run_json(cli, argv: list[str], env: dict[str, str] | None = None) -> dict:
    """The command's stdout, which must be one JSON document whose exit_code is the process's."""
    res = cli([*argv, "--format", "json"], env)
    doc = json.loads(res.out)
    assert doc["exit_code"] == res.rc, res.err
    return doc


DERIVE = {
    "max-share": (["--pp-size", "8", "--budget-gib", "8"], "consistent"),
    "own-share": (["--pp-size", "8", "--budget-gib", "8", "--policy", "own-share"], "divergent"),
    "partition-env": (["--pp-size", "2"], "consistent"),
    "default-budget-tp2": (["--pp-size", "4", "--tp-size", "2", "--disable-radix-cache"], "consistent"),
    "upgrade": (
        [*KIMI_SHAPE, "--pp-size", "4", "--budget-gib", "8", "--sglang-version", "0.5.16,0.5.23"],
        "divergent",
    ),
    "materialize": (
        ["--pp-size", "2", "--budget-gib", "8", "--max-mamba-cache-size", "4", "--materialize"],
        "consistent",
    ),
}


@pytest.mark.parametrize(("argv", "status"), DERIVE.values(), ids=DERIVE.keys())
def test_derive_json_validates(cli, argv: list[str], status: str):
    env = {"SGLANG_PP_LAYER_PARTITION": "47,46", "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "1"}
    model = [] if "--model-config" in argv else KIMI
    doc = run_json(cli, ["derive", *model, *argv], env if argv[:2] == ["--pp-size", "2"] else None)
    assert errors(doc) == []
    assert (doc["command"], doc["status"]) == ("derive", status)
    assert doc["exit_code"] == 0  # derive answers a divergence, it does not fail on it


def test_derive_env_and_materialize_under_check_names(cli):
    """The env vars appear raw, as check's report gives them; a --materialize result is the rank's status."""
    env = {"SGLANG_PP_LAYER_PARTITION": "47,46", "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "1"}
    argv = ["derive", *KIMI, "--pp-size", "2", "--budget-gib", "8", "--max-mamba-cache-size", "4"]
    doc = run_json(cli, [*argv, "--materialize"], env)
    assert doc["inputs"]["SGLANG_PP_LAYER_PARTITION"] == "47,46"
    assert doc["inputs"]["SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"] == "1"
    assert [(r["rank"], r["status"], r["error"]) for r in doc["ranks"]] == [(0, "ok", None), (1, "ok", None)]
    assert all(r["allocated_bytes"] == r["predicted_bytes"] > 0 for r in doc["ranks"])


PLAN = {
    "target-all-policies": ["--pp-size", "8", "--target-max-running-requests", "30", "--all-policies"],
    "target-own-policy": ["--pp-size", "8", "--target-max-running-requests", "30"],
    "target-one-policy": ["--pp-size", "8", "--target-max-running-requests", "30", "--policy", "own-share"],
    "target-mem-fraction": [
        *["--pp-size", "8", "--target-max-running-requests", "30"],
        *["--gpu-free-gib", "139", "--weights-gib", "60"],
    ],
    "target-unreachable-fraction": [
        *["--pp-size", "8", "--target-max-running-requests", "30"],
        *["--gpu-free-gib", "20", "--weights-gib", "18"],
    ],
    "tokens": [
        "--pp-size",
        "8",
        "--target-tokens",
        "1000000",
        "--gpu-free-gib",
        "139",
        "--weights-gib",
        "60",
    ],
    "requests": ["--pp-size", "4", "--target-requests", "16", "--context-len", "4096", "--all-policies"],
    "partition": ["--pp-size", "8", "--budget-gib", "8", "--suggest-partition"],
    "partition-kv-note": ["--pp-size", "4", "--suggest-partition", "--partition-slack", "2"],
    "partition-no-change": ["--pp-size", "3", "--suggest-partition", "--policy", "own-share"],
}


@pytest.mark.parametrize("argv", PLAN.values(), ids=PLAN.keys())
def test_plan_json_validates(cli, fixtures_dir: Path, argv: list[str]):
    model = ["--model-config", str(fixtures_dir / "nemotron_h_8b.json")] if "partition" in argv[-1] else KIMI
    doc = run_json(cli, ["plan", *model, *argv])
    assert errors(doc) == []
    assert (doc["command"], doc["status"], doc["exit_code"]) == ("plan", "consistent", 0)


def test_plan_upgrade_json_validates_and_names_why(cli):
    """plan --sglang-version A,B: the budget the target needs under each release. kimi-k3 at pp 8, 3 slots
    per request (no_buffer), 24 requests -> 72 slots. 0.5.23 (max-share, padding slot) charges a stage
    9/69 of per_req: (72 + 1) x 291,102,720 x 9/69 x 3 (r 0.5 -> the pool is 1/3 of the budget) = 7.75
    GiB at 0.01 GiB steps; 0.5.16 (whole-model, no padding slot) 72 x per_req x 3 = 58.56 GiB."""
    argv = [
        *KIMI_SHAPE,
        "--pp-size",
        "8",
        "--target-max-running-requests",
        "24",
        "--mamba-full-memory-ratio",
        "0.5",
        "--mamba-radix-cache-strategy",
        "no_buffer",
        "--disable-overlap-schedule",
        "--sglang-version",
        "0.5.16,0.5.23",
    ]
    doc = run_json(cli, ["plan", *argv])
    assert errors(doc) == []
    assert (doc["status"], doc["exit_code"]) == ("divergent", 0)
    by = doc["by_release"]
    assert (by["0.5.16"]["min_budget_gib"], by["0.5.23"]["min_budget_gib"]) == (58.56, 7.75)
    assert any("whole model" in e for e in doc["explanations"])


@pytest.mark.parametrize(
    ("require", "status"), [("max-share", "consistent"), ("own-share", "divergent")], ids=["pass", "fail"]
)
def test_sweep_json_and_report_validate(cli, tmp_path: Path, require: str, status: str):
    """stdout and --report carry the same document; a required policy that diverges is status divergent,
    exit 1, as in check."""
    report = tmp_path / "sweep.json"
    argv = ["sweep", *KIMI, "--pp-size", "8", "--budgets", "4:12:0.5", "--require-consistent", require]
    doc = run_json(cli, [*argv, "--report", str(report)])
    assert errors(doc) == []
    assert json.loads(report.read_text()) == doc
    assert (doc["command"], doc["status"], doc["exit_code"]) == ("sweep", status, EXIT_CODES[status])
    assert doc["policies"]["max-share"]["divergent"] == []
    assert "max_mamba_cache_size" in doc["policies"]["own-share"]["divergent"]


@pytest.mark.parametrize(
    ("argv", "path", "bad", "why"),
    [
        (["derive", "--pp-size", "2"], ("exit_code",), 1, "derive exits 0 on its answer"),
        (["derive", "--pp-size", "2"], ("inputs", "partition_env"), None, "the old name"),
        (["derive", "--pp-size", "2"], ("inputs", "sglang_rules"), "0.5.23", "the old name"),
        (["derive", "--pp-size", "2"], ("ranks", 0, "materialize_status"), "ok", "status holds it"),
        (["plan", "--pp-size", "2", "--suggest-partition"], ("env",), "47,46", "the old name"),
        (
            ["plan", "--pp-size", "2", "--suggest-partition"],
            ("default", "largest_stage_linear_layers"),
            35,
            "",
        ),
        (["sweep", "--pp-size", "2", "--budgets", "8"], ("assumptions",), {}, "the old name"),
        (["sweep", "--pp-size", "2", "--budgets", "8"], ("policies", "max-share", "divergent"), {}, "counts"),
    ],
)
def test_old_names_are_rejected(cli, argv: list[str], path: tuple, bad: object, why: str):
    """The names this vocabulary replaced do not validate any more: a command that slipped back to one
    fails here rather than in a consumer."""
    doc = run_json(cli, [argv[0], *KIMI, *argv[1:]])
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad
    assert errors(doc), why


def test_check_and_derive_report_the_same_inputs_alike(cli):
    """The same deployment (kimi-k3, pp 4, 8 GiB, r 0.5) through check's report and derive's JSON: every
    input both report has the same name and the same value, the model's digest and the installed and
    derived-as releases included. A command that renames or retypes an input shows as a difference."""
    check = check_report(World(4, sizing=(("pp_size", 4),)))["inputs"]
    derive = run_json(cli, ["derive", *KIMI, "--pp-size", "4", "--budget-gib", "8"])["inputs"]
    shared = set(check) & set(derive)
    # derive needs no torch; attention_layout (the TP/attention-DP flags as typed) is what ranks compare
    # in place of the sizes they derive with, and one process compares nothing.
    assert set(check) - shared == {"torch_version", "attention_layout"}
    differ = {k: (check[k], derive[k]) for k in shared if check[k] != derive[k]}
    assert differ == {}
    assert derive["model"].startswith("kimi-k3 #") and derive["policy"] is None
