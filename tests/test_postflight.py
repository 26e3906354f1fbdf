"""``checker postflight``: the server's log held to the preflight's prediction, rank by rank.

The prediction is a real preflight report (tests/postflight_logs.py: the derivation, the wire, the
verdict, ``to_json``) and the log is rendered from SGLang's own format strings, so each test reads what
a user's CI would. What a user relies on: the server that started as predicted is ``consistent`` (exit
0) in every layout; a rank that logged another value is ``divergent`` (exit 1) naming the rank, its
host, the value predicted and logged, and the most likely cause; a rank the logs lack is named (exit
2); every rendering (text, JSON against docs/postflight.schema.json, JUnit, the step summary) says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from postflight_logs import ServerLog, preflight_report

from checker.config import BudgetSource

Draft202012Validator = pytest.importorskip("jsonschema").Draft202012Validator
junitparser = pytest.importorskip("junitparser")
SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "postflight.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)


def schema_errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


@pytest.fixture
def run(cli, tmp_path):
    """Write the report and the log, run ``postflight --format json`` in-process, check the schema."""

    def go(report: dict, log: ServerLog | str, *extra: str, env: dict | None = None):
        rp = tmp_path / "preflight.json"
        rp.write_text(json.dumps(report))
        lp = tmp_path / "server.log"
        lp.write_text(log if isinstance(log, str) else log.text())
        r = cli(["postflight", "--report", str(rp), str(lp), "--format", "json", *extra], env=env)
        doc = json.loads(r.out)
        assert schema_errors(doc) == []
        assert doc["exit_code"] == r.rc
        return r, doc

    return go


LAYOUTS = {
    "pp8": (8, {}, {}),
    "pp4-tp2": (8, {"tp_size": 2}, {}),
    "pp2-tp2-attention-dp2": (8, {"tp_size": 2, "dp_size": 2}, {"dp_attention": True}),
    "pp2-tp2-ep2": (4, {"tp_size": 2}, {"ep_size": 2}),
    "pp2-tp2-two-dp-replicas": (4, {"tp_size": 2}, {"plain_dp": 2}),
    "one-gpu": (1, {"pp_size": 1}, {}),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_server_that_started_as_predicted_is_consistent(run, layout):
    n, sizing, kw = LAYOUTS[layout]
    report = preflight_report(n, sizing=sizing)
    r, doc = run(report, ServerLog(report, **kw))
    assert r.rc == 0 and doc["status"] == "consistent", (doc["errors"], doc["root_causes"])
    replicas = kw.get("plain_dp", 1)
    assert len(doc["ranks"]) == n * replicas
    held = {(c["value"], c["status"]) for c in doc["checks"]}
    assert ("max_mamba_cache_size", "ok") in held and ("max_running_requests", "ok") in held
    assert ("pp_max_micro_batch_size", "ok") in held
    stages = n // (sizing.get("tp_size", 1) * sizing.get("dp_size", 1))
    # max_running_requests: once per stage (its TP 0) per replica; the pool size on every rank
    assert sum(c["value"] == "max_running_requests" for c in doc["checks"]) == stages * replicas
    assert sum(c["value"] == "max_mamba_cache_size" for c in doc["checks"]) == n * replicas


def test_a_divergence_on_one_rank_names_it_its_host_both_values_and_the_cause(run, cli, tmp_path):
    """Rank 5 (node-2) started with a smaller pool: the verdict is divergent, exit 1, and every
    rendering names rank 5, node-2, 74 predicted and 70 logged, and the line it came from."""
    report = preflight_report(8)
    log = ServerLog(report, override={5: {"max_mamba_cache_size": 70, "max_running_requests": 17}})
    r, doc = run(report, log)
    assert r.rc == 1 and doc["status"] == "divergent"
    off = {(c["rank"], c["value"]): c for c in doc["checks"] if c["status"] == "divergent"}
    assert set(off) == {(5, "max_mamba_cache_size"), (5, "max_running_requests")}
    k = off[(5, "max_mamba_cache_size")]
    assert (k["host"], k["prefix"], k["predicted"], k["logged"]) == ("node-2", "PP5", 74, 70)
    assert k["where"].endswith("server.log:23")  # rank 5's Mamba line
    assert "flags or environment" in k["cause"]
    (cause,) = doc["root_causes"]
    assert cause.startswith("rank 5 on node-2 (max_mamba_cache_size, max_running_requests)")
    # micro-batch recomputed from the logged 17 // 8 = 2: the same as predicted, so not a divergence
    (micro,) = [c for c in doc["checks"] if c["rank"] == 5 and c["value"] == "pp_max_micro_batch_size"]
    assert micro["status"] == "ok" and micro["logged"] == 2
    # text: the grouped table and the marked cell
    text = cli(["postflight", "--report", str(tmp_path / "preflight.json"), str(tmp_path / "server.log")])
    assert text.rc == 1
    row = next(
        line for line in text.out.splitlines() if line.startswith("5 ") and "max_mamba_cache_size" in line
    )
    assert row.split()[:6] == ["5", "PP5", "node-2", "max_mamba_cache_size", "74", "70"]
    assert "70 (predicted 74) *" in text.out and text.out.rstrip().endswith("verdict: divergent (exit 1)")
    quiet = cli(
        ["postflight", "-q", "--report", str(tmp_path / "preflight.json"), str(tmp_path / "server.log")]
    )
    assert quiet.out.startswith(
        "checker postflight divergent: rank 5 (PP5, node-2) max_mamba_cache_size predicted 74, logged 70"
    )


def test_a_micro_batch_size_that_only_the_recomputation_shows(run):
    """pp_max_micro_batch_size is never logged: 18 // 8 = 2 predicted, a stage that logged 15 running
    requests gives 15 // 8 = 1."""
    report = preflight_report(8)
    r, doc = run(report, ServerLog(report, override={2: {"max_running_requests": 15}}))
    (micro,) = [
        c for c in doc["checks"] if c["value"] == "pp_max_micro_batch_size" and c["status"] == "divergent"
    ]
    assert (micro["rank"], micro["predicted"], micro["logged"]) == (2, 2, 1)
    assert "max(max_running_requests 15 // pp_size 8, 1)" in micro["detail"]


def test_ranks_the_logs_lack_or_the_prediction_lacks_are_named(run):
    report = preflight_report(8, sizing={"tp_size": 2})
    r, doc = run(report, ServerLog(report, skip=frozenset({6, 7})))
    assert r.rc == 2 and doc["status"] == "error"
    assert [m.split(":")[0] for m in doc["missing_ranks"]] == [
        "rank 6 (PP3 TP0, node-3)",
        "rank 7 (PP3 TP1, node-3)",
    ]
    # the server ran pp 8 where the preflight checked pp 4: the extra stages are named, divergent
    wider = ServerLog(preflight_report(16, sizing={"tp_size": 2}))
    r, doc = run(report, wider)
    assert r.rc == 1 and doc["status"] == "divergent"
    assert len(doc["extra_ranks"]) == 8 and doc["extra_ranks"][0].startswith("[PP4 TP0]")


WEIGHTS_CASES = [
    # (--weights-gib as given, logged per rank, rank that diverges, its status)
    pytest.param("19", lambda r: 18.62, 0, "divergent", id="one-figure-above-every-rank"),
    pytest.param("18.62", lambda r: 18.62, None, "consistent", id="one-figure-exact"),
    pytest.param(
        "18.62", lambda r: 18.62 + (0.3 if r == 3 else 0), 3, "divergent", id="one-rank-over-the-figure"
    ),
    pytest.param(
        "18.62", lambda r: 18.62 - (0.5 if r else 0), None, "consistent", id="lighter-ranks-under-the-busiest"
    ),
]


@pytest.mark.parametrize(("given", "logged", "rank", "status"), WEIGHTS_CASES)
def test_the_weights_are_held_to_the_figure_the_preflight_used(run, given, logged, rank, status):
    """With --budget-from-device --weights-gib W the budget used W for the busiest rank: a rank whose
    weights took more than W + margin, or a busiest rank that took less than W - margin, means the
    server's budget was not the one predicted."""
    weights = tuple(float(w) for w in given.split(","))
    budget = BudgetSource(
        from_device=True, mem_fraction_static=0.8, device_free_gib=(120.0,), weights_gib=weights, agree=False
    )
    report = preflight_report(4, budget=budget)
    r, doc = run(report, ServerLog(report, weights_gib=logged))
    assert doc["status"] == status, doc["checks"]
    off = [c for c in doc["checks"] if c["status"] == "divergent"]
    if rank is None:
        assert off == []
    else:
        (c,) = off
        assert (c["rank"], c["value"]) == (rank, "weights_gib")
        assert "rerun the preflight with --weights-from-log" in c["cause"]


def test_the_agreed_budgets_weights_figure_is_read_from_its_formula(run):
    budget = BudgetSource(
        from_device=True, mem_fraction_static=0.8, device_free_gib=(120.0,), weights_gib=(20.0,)
    )
    report = preflight_report(4, budget=budget)
    r, doc = run(report, ServerLog(report, weights_gib=lambda rank: 20.0))
    assert r.rc == 0, doc["checks"]
    assert {c["predicted"] for c in doc["checks"] if c["value"] == "weights_gib"} == {20.0}
    r, doc = run(report, ServerLog(report, weights_gib=lambda rank: 21.0))
    assert r.rc == 1 and {c["rank"] for c in doc["checks"] if c["status"] == "divergent"} == {0, 1, 2, 3}


def test_without_a_weights_figure_the_logged_ones_are_shown_not_held(run):
    report = preflight_report(2)
    r, doc = run(report, ServerLog(report))
    assert r.rc == 0
    assert {(c["status"], c["logged"]) for c in doc["checks"] if c["value"] == "weights_gib"} == {
        ("not_checked", 18.62)
    }
    assert any("used no weights figure" in w for w in doc["warnings"])


def test_causes_other_release_post_capture_cap_and_kv_cap(run):
    """Each cause the logs can show: a rank whose lines are in another release's form; a stage whose
    max_running_requests SGLANG_ENABLE_POST_CAPTURE_KV_SIZING capped; a stage capped by its KV pool."""
    report = preflight_report(4)
    old = ServerLog(report, override={1: {"release": "0.5.9"}, 2: {"max_running_requests": 10}})
    r, doc = run(report, old)
    causes = {c["rank"]: c["cause"] for c in doc["checks"] if c["status"] == "divergent"}
    assert list(causes) == [2], causes  # rank 1's values are the same: another release is no divergence
    log = ServerLog(report, override={1: {"release": "0.5.9", "max_mamba_cache_size": 60}})
    r, doc = run(report, log)
    (cause,) = {c["cause"] for c in doc["checks"] if c["status"] == "divergent"}
    assert cause.startswith("another SGLang release: its lines are in the form SGLang 0.5.9 writes")
    predicted = report["ranks"][2]["max_running_requests"]
    capped = ServerLog(
        report, override={2: {"capped_from": predicted, "max_running_requests": predicted - 3}}
    )
    r, doc = run(report, capped)
    cause = next(c["cause"] for c in doc["checks"] if c["rank"] == 2 and c["status"] == "divergent")
    assert cause.startswith(
        f"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: the server capped max_running_requests {predicted} -> "
        f"{predicted - 3}"
    )
    # The preflight sizes the KV pool now: a stage whose pool is 24 tokens while its state pool (sized from
    # the same budget) is as predicted was capped by a KV-only input (--max-total-tokens), not by memory.
    kv = ServerLog(report, override={3: {"max_total_num_tokens": 24, "max_running_requests": 12}})
    r, doc = run(report, kv)
    off = {c["value"]: c["cause"] for c in doc["checks"] if c["rank"] == 3 and c["status"] == "divergent"}
    assert set(off) == {"max_total_num_tokens", "max_running_requests", "pp_max_micro_batch_size"}, off
    assert len(set(off.values())) == 1, off
    assert off["max_running_requests"].startswith("the KV pool alone: max_total_num_tokens 24 logged"), off
    assert "--max-total-tokens" in off["max_running_requests"]


def test_less_free_memory_than_the_preflight_measured_is_named(run):
    budget = BudgetSource(
        from_device=True, mem_fraction_static=0.8, device_free_gib=(130.0,), weights_gib=(18.62,)
    )
    report = preflight_report(2, budget=budget)
    log = ServerLog(report, override={1: {"max_mamba_cache_size": 50}})  # the log's free memory: 120 GiB
    r, doc = run(report, log)
    (c,) = [c for c in doc["checks"] if c["status"] == "divergent"]
    assert c["cause"].startswith(
        "the environment: the server found 120.00 GiB free on this GPU before its weights"
    )


def test_junit_and_the_step_summary_say_the_same(run, tmp_path):
    report = preflight_report(4)
    log = ServerLog(report, override={3: {"max_mamba_cache_size": 70}})
    summary = tmp_path / "summary.md"
    r, doc = run(
        report,
        log,
        "--junit",
        str(tmp_path / "pf.xml"),
        "--postflight-report",
        str(tmp_path / "pf.json"),
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert r.rc == 1
    assert json.loads((tmp_path / "pf.json").read_text()) == doc
    (suite,) = junitparser.JUnitXml.fromfile(str(tmp_path / "pf.xml"))
    cases = {c.name: c for c in suite}
    assert set(cases) == {
        "max_mamba_cache_size",
        "max_total_num_tokens",
        "context_len",
        "max_running_requests",
        "pp_max_micro_batch_size",
        "weights_gib",
        "ranks",
    }
    (failure,) = cases["max_mamba_cache_size"].result
    assert isinstance(failure, junitparser.Failure)
    k = report["ranks"][3]["max_mamba_cache_size"]
    assert f"rank 3 (PP3, node-1): predicted {k}, logged 70" in failure.message
    assert cases["max_running_requests"].result == [] and cases["max_total_num_tokens"].result == []
    md = summary.read_text()
    assert (
        md.startswith("### PP capacity post-flight: DIVERGENT")
        and f"| 3 | PP3 | node-1 | max_mamba_cache_size | {k} | 70 |" in md
    )


def test_the_log_alone_prints_every_ranks_values_with_its_prefix(cli, tmp_path):
    """No --report: each rank's values as logged, with the prefix and the line they came from; ranks
    that logged different values are marked (the server itself shows the stages disagree), exit 0."""
    report = preflight_report(4, sizing={"tp_size": 2})
    (tmp_path / "a.log").write_text(ServerLog(report).text())
    r = cli(["postflight", str(tmp_path / "a.log"), "--format", "json"])
    assert r.rc == 0
    doc = json.loads(r.out)
    assert schema_errors(doc) == [] and doc["status"] == "consistent"
    rank1 = next(x for x in doc["ranks"] if x["prefix"] == "PP0 TP1")
    assert rank1["rank"] == 1 and rank1["values"]["max_mamba_cache_size"]["logged"] == 37
    assert rank1["values"]["max_mamba_cache_size"]["where"].endswith("a.log:7")
    (tmp_path / "b.log").write_text(ServerLog(report, override={2: {"max_mamba_cache_size": 30}}).text())
    r = cli(["postflight", str(tmp_path / "b.log")])
    assert r.rc == 0 and "checker postflight: DIVERGENT" in r.out
    row = next(line for line in r.out.splitlines() if line.startswith("2 "))
    assert row.split()[:4] == ["2", "PP1", "TP0", "-"] and "30 *" in row


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{", "not JSON (line 1"),
        ('{"command": "derive", "ranks": []}', "`checker derive`'s output, not the preflight's report"),
        ("[1, 2]", "a list, not the preflight's JSON report"),
        ('{"command": "check"}', "no `ranks` list"),
    ],
    ids=["not-json", "derive-report", "a-list", "cut-short"],
)
def test_a_report_that_is_not_the_preflights_is_one_line(cli, tmp_path, content, says):
    (tmp_path / "r.json").write_text(content)
    (tmp_path / "s.log").write_text("x\n")
    r = cli(["postflight", "--report", str(tmp_path / "r.json"), str(tmp_path / "s.log")])
    assert r.rc == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert line.startswith("checker postflight: error: --report") and says in line


def test_an_output_that_would_overwrite_an_input_is_refused(cli, tmp_path):
    report = preflight_report(2)
    (tmp_path / "p.json").write_text(json.dumps(report))
    (tmp_path / "s.log").write_text(ServerLog(report).text())
    for flag, path in (("--postflight-report", "p.json"), ("--junit", "s.log")):
        r = cli(
            [
                "postflight",
                "--report",
                str(tmp_path / "p.json"),
                str(tmp_path / "s.log"),
                flag,
                str(tmp_path / path),
            ]
        )
        assert r.rc == 2
        (line,) = r.err.strip().splitlines()
        assert flag in line and "an output never replaces an input" in line
    assert json.loads((tmp_path / "p.json").read_text()) == report


def test_an_unreadable_input_still_writes_the_error_report(cli, tmp_path):
    (tmp_path / "s.log").write_text("nothing\n")
    out = tmp_path / "pf.json"
    r = cli(
        [
            "postflight",
            "--report",
            str(tmp_path / "missing.json"),
            str(tmp_path / "s.log"),
            "--postflight-report",
            str(out),
        ]
    )
    assert r.rc == 2
    doc = json.loads(out.read_text())
    assert schema_errors(doc) == [] and doc["status"] == "error" and "cannot read it" in doc["errors"][0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["s.log", "--", "python", "-m", "sglang.launch_server"], "not a launch command after --"),
        (["-", "-"], "- (standard input) is given twice"),
        (["s.log", "--weights-margin-gib", "-1"], "--weights-margin-gib -1 must be in [0, 1,024] GiB"),
    ],
    ids=["launch-command", "stdin-twice", "negative-margin"],
)
def test_a_command_line_postflight_cannot_run_is_one_line(cli, tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.log").write_text("x\n")
    r = cli(["postflight", *argv])
    assert r.rc == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert says in line, line


def test_the_reports_whole_weights_figures_are_held_and_a_cut_text_is_not_read_as_zero(run):
    """check's report carries the weights figures whole (``weights_gib``, ``weights_source``): each rank
    is held to its own. An older report has them only inside ``budget_source``, which the wire cuts at
    120 bytes: a figure cut away is unknown (not held, said), never 0 GiB."""
    budget = BudgetSource(
        from_device=True, mem_fraction_static=0.8, device_free_gib=(120.0,), weights_gib=(18.0,)
    )
    report = preflight_report(2, budget=budget)
    report["weights_gib"], report["weights_source"] = [18.0, 17.0], "--weights-from-log node.log"
    report_schema = Draft202012Validator(
        json.loads((Path(__file__).resolve().parent.parent / "docs" / "report.schema.json").read_text())
    )
    assert list(report_schema.iter_errors(report)) == []
    r, doc = run(report, ServerLog(report, weights_gib=lambda rank: 18.0))
    (off,) = [c for c in doc["checks"] if c["status"] == "divergent"]
    assert (off["rank"], off["predicted"], off["logged"]) == (1, 17.0, 18.0)
    assert doc["inputs"]["weights_source"] == "--weights-from-log node.log"
    del report["weights_gib"], report["weights_source"]
    for rank in report["ranks"]:
        rank["inputs"]["budget_source"] = "device free (MIN over ranks): total_rest_memory = free_aft..."
    r, doc = run(report, ServerLog(report, weights_gib=lambda rank: 18.0))
    assert r.rc == 0 and {c["status"] for c in doc["checks"] if c["value"] == "weights_gib"} == {
        "not_checked"
    }
    assert any("cut before the figure" in w for w in doc["warnings"])


def test_releases_that_log_no_pool_size_are_held_by_their_pools_state_size(run):
    """0.5.2-0.5.3.post1 log ``Mamba Cache is allocated. conv_state size: ..GB, ssm_state size: ..GB``
    and no max_mamba_cache_size: the state they allocated, (K + 1) slots, is held to the prediction's
    within the line's rounding; a pool of another size shows there."""
    from checker.config import ModelChoice

    report = preflight_report(
        1,
        sizing={"pp_size": 1},
        release="0.5.2",
        model=ModelChoice(model_config=str(Path(__file__).parent / "fixtures" / "qwen3_next_80b_a3b.json")),
        budget=BudgetSource(budget_gib=80.0),
    )
    r, doc = run(report, ServerLog(report, release="0.5.2"))
    assert r.rc == 0, doc["checks"]
    (k,) = [c for c in doc["checks"] if c["value"] == "max_mamba_cache_size"]
    assert k["status"] == "ok" and "not logged by SGLang 0.5.2-0.5.3.post1" in k["detail"]
    r, doc = run(report, ServerLog(report, release="0.5.2", override={0: {"max_mamba_cache_size": 400}}))
    (k,) = [c for c in doc["checks"] if c["value"] == "max_mamba_cache_size"]
    assert (
        r.rc == 1
        and k["status"] == "divergent"
        and k["predicted"] == report["ranks"][0]["max_mamba_cache_size"]
    )


def test_the_example_logs_are_what_their_generator_writes():
    """examples/logs/ (the files the README, docs/postflight.md and --help run) are regenerated by
    ``python tests/postflight_logs.py``; a change of the checker or of the table that changes them shows
    here, and the shipped start holds to its shipped prediction (and its divergent node does not)."""
    from postflight_logs import EXAMPLES, example_files

    for name, text in example_files().items():
        assert (EXAMPLES / name).read_text() == text, (
            f"examples/logs/{name}: run python tests/postflight_logs.py"
        )
