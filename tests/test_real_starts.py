"""Real SGLang start-ups, recomputed: the figures of public start-up logs (tests/fixtures/real_starts/
real_starts.json, numbers only, each with its source) given to ``derive`` as the launch command and the
logged memory give the pools the server logged (issue 36's evidence).

SGLang prints its GiB figures with 2 decimals, so each logged memory figure is an interval of 0.01 GiB:
a pool is held exactly where that interval leaves one value, else the values the interval's corners
derive must enclose the logged one. A start whose log lacks a figure the sizing reads is listed with
the reason (``recomputable: false``, also in docs/postflight.md) and held to what it does carry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent / "fixtures" / "real_starts"
STARTS = {s["config"]: s for s in json.loads((HERE / "real_starts.json").read_text())["starts"]}
HALF_CENT = 0.005
"""Half the last printed digit of a logged GiB figure."""


def _derive(cli: Any, start: dict[str, Any], *budget: str) -> dict[str, Any]:
    argv = ["derive", "--model-config", str(HERE / start["config"]), "--sglang-version", start["release"]]
    res = cli([*argv, *start["launch"], *budget, "--format", "json"])
    assert res.rc == 0, res.err
    row: dict[str, Any] = json.loads(res.out)["ranks"][0]
    return row


def _logged_memory(cli: Any, start: dict[str, Any], *extra: str) -> list[dict[str, Any]]:
    """The derivation at each corner of the logged free-memory figures' rounding intervals (before and
    after the weights; the weights are their difference)."""
    log = start["logged"]
    fraction: tuple[str, ...] = ()
    if "mem_fraction_static" in start:
        fraction = ("--mem-fraction-static", str(start["mem_fraction_static"]))
    rows = []
    for before in (log["free_before_gib"] - HALF_CENT, log["free_before_gib"] + HALF_CENT):
        for after in (log["free_after_gib"] - HALF_CENT, log["free_after_gib"] + HALF_CENT):
            budget = ("--gpu-free-gib", f"{before:.4f}", "--weights-gib", f"{before - after:.4f}")
            rows.append(_derive(cli, start, *budget, *fraction, *extra))
    return rows


def test_every_start_names_its_source_release_and_figures() -> None:
    for start in STARTS.values():
        assert start["url"] or start["source_note"], start["name"]
        assert start["logged"]["max_total_num_tokens"] > 0
        log = start["logged"]  # the weights line's own arithmetic: before - after = mem usage
        assert abs(log["free_before_gib"] - log["free_after_gib"] - log["weights_gib"]) <= 0.01 + 1e-9
        assert start.get("recomputable", True) or start["why_not"]


def test_granite_4_0_h_micro_recomputes_from_its_logged_memory(cli: Any) -> None:
    """sglang PR 18040's bench_one_batch start (1 GPU): 0.5.9's default fraction for a 16 GB card (the
    card's total is not logged: 0.770 for 15.80-15.86 GiB) and the logged free memory give the logged
    state pool exactly and a KV pool whose rounding interval holds the logged 399,740 tokens; the cell
    and the slot are the ones the log's own K and ssm sizes imply."""
    start = STARTS["granite_4_0_h_micro.json"]
    log = start["logged"]
    total = ("--device-total-gib", str(start["device_total_gib"]))
    rows = _logged_memory(cli, start, *total)
    assert {r["max_mamba_cache_size"] for r in rows} == {log["max_mamba_cache_size"]}
    tokens = [r["max_total_num_tokens"] for r in rows]
    assert min(tokens) <= log["max_total_num_tokens"] <= max(tokens), tokens
    assert max(tokens) - min(tokens) < 3000  # the interval is the rounding's, not a wide net
    row = rows[0]
    assert abs(log["max_total_num_tokens"] * row["kv_cell_bytes"] / 2 / 2**30 - log["k_size_gib"]) < HALF_CENT
    # the pool holds max_mamba_cache_size + 1 slots (the padding slot); its ssm part is printed
    ssm_per_slot = 36 * 64 * 64 * 128 * 4
    assert abs((log["max_mamba_cache_size"] + 1) * ssm_per_slot / 2**30 - log["ssm_state_gib"]) < HALF_CENT


def test_qwen3_5_9b_pools_follow_from_the_budget_its_log_implies(cli: Any) -> None:
    """Qwen3.5-9B at tp 2, --mem-fraction-static 0.8: the log's 'Load weight end' free memory gives a
    budget ~38 MiB above the one SGLang sized with (it reads free memory again at the pools,
    model_runner_kv_cache_mixin.py:56-66 in 0.5.11, and that figure is not logged), so the log alone
    cannot give its 327,310 tokens exactly (docs/postflight.md). What it carries is held: the budget the
    logged pools occupy (their tokens x the checker's KV cell + their slots x the checker's state slot)
    lies just under the logged memory's, and handed to the derivation it gives the logged state pool,
    KV pool and request cap exactly (0.5.10-0.5.13.post1: clamp(int(T / 262144 x 512)) = 2048, then
    186 slots // 3 = 62); the context length is the launch command's."""
    start = STARTS["qwen3_5_9b.json"]
    log = start["logged"]
    rows = _logged_memory(cli, start)
    cell, slot = rows[0]["kv_cell_bytes"], rows[0]["per_req_bytes"]
    assert abs(log["max_total_num_tokens"] * cell / 2 / 2**30 - log["k_size_gib"]) < HALF_CENT
    occupied = log["max_total_num_tokens"] * cell + log["max_mamba_cache_size"] * slot
    logged_budgets = [r["kv_available_bytes"] + r["state_charged_bytes"] for r in rows]
    gap = min(logged_budgets) - occupied
    assert 0 < gap < 64 * 2**20, gap  # the unlogged memory SGLang read less of at the pools
    row = _derive(cli, start, "--budget-gib", repr((occupied + cell / 2) / 2**30))
    got = {k: row[k] for k in ("max_mamba_cache_size", "max_total_num_tokens", "max_running_requests")}
    want = {k: log[k] for k in got}
    assert got == want
    assert row["context_len"] == log["context_len"]


@pytest.mark.parametrize("config", sorted(STARTS))
def test_every_table_config_loads_as_a_model(cli: Any, config: str) -> None:
    """The configs beside the table are real model configs the checker reads (kept out of
    tests/fixtures/*.json, which test_bad_configs mutates)."""
    row = _derive(cli, STARTS[config], "--budget-gib", "4")
    assert row["status"] == "ok"


@pytest.mark.parametrize("config", sorted(STARTS))
def test_the_reader_reads_each_starts_lines_as_logged(tmp_path: Path, config: str) -> None:
    """Each start's lines rendered in its release's own forms (checker/postflight/formats.py) with the
    logged figures, on every TP rank of the start (TP 0 alone logs the summary; bench_one_batch logs
    none), read back as those figures."""
    from postflight_logs import form_of

    from checker.postflight import formats as F
    from checker.postflight.ranks import ranks_read
    from checker.postflight.reader import read_logs

    start = STARTS[config]
    log, release = start["logged"], start["release"]
    tp_size = int(start["launch"][start["launch"].index("--tp-size") + 1])
    ssm = log["ssm_state_gib"]
    values: dict[str, object] = {
        "avail_mem": log["free_after_gib"],
        "mem_usage": log["weights_gib"],
        "elapsed": 5.5,
        "type": "GraniteMoeHybridForCausalLM" if "granite" in config else "Qwen3_5ForConditionalGeneration",
        "dtype": "torch.bfloat16",
        "max_mamba_cache_size": log["max_mamba_cache_size"],
        "conv_state_size": 0.1,
        "ssm_state_size": ssm,
        "max_total_num_tokens": log["max_total_num_tokens"],
        "chunked_prefill_size": 2048,
        "max_prefill_tokens": 16384,
        "max_running_requests": log.get("max_running_requests", 0),
        "context_len": log.get("context_len", 0),
        "_10": "available_gpu_mem",
        "_12": 3.79,
    }
    lines = []
    for tp in range(tp_size):
        pre = f" TP{tp}"
        begin = form_of("weights_begin", release).render({"avail_mem": log["free_before_gib"]})
        kinds = ["weights", "mamba"] + (["summary"] if tp == 0 and "max_running_requests" in log else [])
        lines.append(F.render_line(release, begin, prefix_text=pre))
        lines += [F.render_line(release, form_of(k, release).render(values), prefix_text=pre) for k in kinds]
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    reads = ranks_read(read_logs([str(path)]))
    assert len(reads) == tp_size
    for read in reads:
        assert read.free_before_gib.value == log["free_before_gib"]
        assert read.weights_gib.value == log["weights_gib"]
        assert read.max_mamba_cache_size.value == log["max_mamba_cache_size"]
        assert release in read.releases, read.releases
    head = next(r for r in reads if r.key.tp == 0)
    if "max_running_requests" in log:
        assert head.max_total_num_tokens.value == log["max_total_num_tokens"]
        assert head.max_running_requests.value == log["max_running_requests"]
        assert head.context_len.value == log["context_len"]
