"""The post-flight holds each stage's KV pool (``max_total_num_tokens`` after the MIN), ``context_len`` and
the request cap to the prediction, and names the input that explains a difference (issue 36 item 4).

The server is the checker's own derivation with one input changed (the weights, the free memory, the
fraction, ``--context-length``), rendered in SGLang's own line format; the prediction is the preflight with
the inputs it was given. What a user relies on: the shipped example start holds, and the pool the log shows
recomputes from the log's own memory figures and launch command; each changed input is named, with the
figure it implies.
"""

from __future__ import annotations

import json
import re

import pytest
from postflight_logs import EXAMPLE_MODEL, EXAMPLES, ServerLog, preflight_report

from checker.config import BudgetSource, ModelChoice
from checker.postflight.ranks import ranks_read
from checker.postflight.reader import read_logs

POOL_VALUES = {"max_total_num_tokens", "max_running_requests", "pp_max_micro_batch_size"}


def _device(fraction: float = 0.8, free: float = 130.0, weights: float = 18.62) -> BudgetSource:
    return BudgetSource(
        from_device=True, mem_fraction_static=fraction, device_free_gib=(free,), weights_gib=(weights,)
    )


@pytest.fixture
def hold(cli, tmp_path):
    """Hold the log of a server derived with ``server`` inputs to the preflight of the defaults."""

    def go(server: dict, *, free: float = 130.0, weights: float = 18.62, sizing: dict | None = None):
        predicted = preflight_report(4, budget=_device())
        started = preflight_report(4, budget=_device(**server), sizing=sizing)
        rp, lp = tmp_path / "preflight.json", tmp_path / "server.log"
        rp.write_text(json.dumps(predicted))
        lp.write_text(ServerLog(started, free_gib=free, weights_gib=lambda r: weights).text())
        res = cli(["postflight", "--report", str(rp), str(lp), "--format", "json"])
        doc = json.loads(res.out)
        off = {(c["rank"], c["value"]): c for c in doc["checks"] if c["status"] == "divergent"}
        return res, doc, off, predicted, started

    return go


def test_the_example_start_holds_its_pool_context_and_requests(cli):
    """examples/logs: every stage's TP 0 logs the pool after the MIN, the context length and the request
    cap the preflight predicted for it."""
    res = cli(
        [
            "postflight",
            "--report",
            str(EXAMPLES / "preflight.json"),
            str(EXAMPLES / "node0.log"),
            str(EXAMPLES / "node1.log"),
            "--format",
            "json",
        ]
    )
    doc = json.loads(res.out)
    assert res.rc == 0 and doc["status"] == "consistent", doc["root_causes"]
    report = json.loads((EXAMPLES / "preflight.json").read_text())
    held = {(c["rank"], c["value"]): c for c in doc["checks"]}
    for rank in (0, 2):  # each stage's TP 0
        row = report["ranks"][rank]
        for value in ("max_total_num_tokens", "context_len", "max_running_requests"):
            c = held[(rank, value)]
            assert (c["status"], c["predicted"], c["logged"]) == ("ok", row[value], row[value]), c
    assert (1, "max_total_num_tokens") not in held  # TP 1 logs no summary line


def test_the_example_pool_recomputes_from_the_logs_memory_and_launch_command():
    """What the log carries (every rank's free memory before its weights and what its weights took, the
    fraction on its server_args line) given to the derivation as the budget's inputs gives the pool, the
    context length and the request cap the server logged."""
    text = (EXAMPLES / "node0.log").read_text() + (EXAMPLES / "node1.log").read_text()
    fraction = float(re.search(r"mem_fraction_static=([\d.]+)", text).group(1))  # type: ignore[union-attr]
    paths = [str(EXAMPLES / "node0.log"), str(EXAMPLES / "node1.log")]
    reads = ranks_read(read_logs(paths))
    free = min(float(r.free_before_gib.value) for r in reads)  # type: ignore[arg-type]
    weights = tuple(float(r.weights_gib.value) for r in reads)  # type: ignore[arg-type]
    budget = BudgetSource(
        from_device=True, mem_fraction_static=fraction, device_free_gib=(free,), weights_gib=weights
    )
    derived = preflight_report(
        4,
        sizing={"tp_size": 2, "mamba_full_memory_ratio": 0.9},
        budget=budget,
        model=ModelChoice(model_config=EXAMPLE_MODEL),
    )
    for read in reads:
        if read.key.tp:
            continue
        row = derived["ranks"][read.key.pp * 2]
        logged = (read.max_total_num_tokens.value, read.context_len.value, read.max_running_requests.value)
        assert logged == (row["max_total_num_tokens"], row["context_len"], row["max_running_requests"])


def test_heavier_weights_are_named_with_the_budget_they_took(hold):
    res, doc, off, predicted, started = hold({"weights": 20.62}, weights=20.62)
    assert res.rc == 1
    T = off[(2, "max_total_num_tokens")]
    assert (T["predicted"], T["logged"]) == (
        predicted["ranks"][2]["max_total_num_tokens"],
        started["ranks"][2]["max_total_num_tokens"],
    )
    assert T["logged"] < T["predicted"]
    for value in POOL_VALUES:
        cause = off[(0, value)]["cause"]
        assert (
            "the weights: the server's weights took 20.62 GiB, the preflight's budget assumed 18.62" in cause
        )
        assert "free memory" not in cause and "the fraction" not in cause


def test_less_free_memory_is_named_not_the_weights(hold):
    res, doc, off, _, _ = hold({"free": 126.0}, free=126.0)
    cause = off[(2, "max_total_num_tokens")]["cause"]
    assert "free memory: the server found 126.00 GiB free before its weights" in cause, cause
    assert "130.00 GiB" in cause and "the weights" not in cause and "the fraction" not in cause
    assert off[(0, "max_running_requests")]["cause"] == cause


def test_another_fraction_is_named_with_the_fraction_the_pool_implies(hold):
    res, doc, off, _, _ = hold({"fraction": 0.75})
    cause = off[(2, "max_total_num_tokens")]["cause"]
    m = re.search(r"the fraction: .* --mem-fraction-static ([\d.]+) where the preflight used 0.8", cause)
    assert m and abs(float(m.group(1)) - 0.75) <= 0.005, cause
    assert "the weights" not in cause and "free memory" not in cause
    # the state pool comes from the same budget: one cause for every value it moved
    assert off[(0, "max_mamba_cache_size")]["cause"] == cause
    assert len(doc["root_causes"]) == 1, doc["root_causes"]


def test_another_context_length_is_named(hold):
    res, doc, off, predicted, _ = hold({}, sizing={"context_len": 2048})
    c = off[(0, "context_len")]
    assert (c["predicted"], c["logged"]) == (predicted["ranks"][0]["context_len"], 2048)
    assert c["cause"].startswith("the context length: the server resolved context_len 2048")
    assert (0, "max_total_num_tokens") not in off  # the same memory, the same pool


def test_a_log_of_another_release_is_named_before_any_memory(run_edit):
    """A log in 0.5.9's line form whose pool and context differ: the release explains them."""
    off = run_edit({"release": "0.5.9", "max_total_num_tokens": 1000, "context_len": 2048})
    for value in ("max_total_num_tokens", "context_len"):
        assert off[value].startswith("another SGLang release: its lines are in the form SGLang 0.5.9"), off


@pytest.fixture
def run_edit(cli, tmp_path):
    def go(edit: dict) -> dict[str, str]:
        report = preflight_report(4, budget=_device())
        rp, lp = tmp_path / "preflight.json", tmp_path / "server.log"
        rp.write_text(json.dumps(report))
        lp.write_text(ServerLog(report, free_gib=130.0, override={2: edit}).text())
        res = cli(["postflight", "--report", str(rp), str(lp), "--format", "json"])
        assert res.rc == 1
        doc = json.loads(res.out)
        return {
            c["value"]: c["cause"] for c in doc["checks"] if c["rank"] == 2 and c["status"] == "divergent"
        }

    return go


def test_a_report_without_the_kv_pool_shows_the_logged_pool_not_held(cli, tmp_path):
    """A preflight report of a checker before the KV pool (no max_total_num_tokens per rank): the logged
    values are shown, not held, and the verdict stands on the rest."""
    report = preflight_report(2)
    log = ServerLog(report).text()
    for r in report["ranks"]:
        del r["max_total_num_tokens"], r["context_len"]
    rp, lp = tmp_path / "preflight.json", tmp_path / "server.log"
    rp.write_text(json.dumps(report))
    lp.write_text(log)
    res = cli(["postflight", "--report", str(rp), str(lp), "--format", "json"])
    doc = json.loads(res.out)
    assert res.rc == 0, doc
    c = next(c for c in doc["checks"] if c["value"] == "max_total_num_tokens")
    assert c["status"] == "not_checked" and isinstance(c["logged"], int)


OLD_LOG = (
    "[2024-12-05 10:00:00 TP0] Load weight begin. avail mem=78.50 GB\n"
    "[2024-12-05 10:00:31 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=63.20 GB\n"
    "[2024-12-05 10:00:33 TP0] max_total_num_tokens=1032191, max_prefill_tokens=16384, "
    "max_running_requests=4097, context_len=32768\n"
)


def test_a_log_of_sglang_0_4_held_to_a_report_is_one_line(cli, tmp_path):
    rp, lp = tmp_path / "preflight.json", tmp_path / "server.log"
    rp.write_text(json.dumps(preflight_report(2)))
    lp.write_text(OLD_LOG)
    res = cli(["postflight", "--report", str(rp), str(lp)])
    (line,) = res.err.strip().splitlines()
    assert res.rc == 2 and "older than any modelled release" in line, res
