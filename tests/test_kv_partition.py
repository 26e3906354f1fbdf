"""``plan --suggest-partition``'s KV objective: where the KV pool binds max_running_requests, a partition
that moves attention layers off the stage that sets the MIN of the KV pools replaces the state optimum;
where the state pool binds, the state optimum stays and the gain in tokens is only named.

tests/fixtures/kv_skewed_spec.json: 10 layers, attention at 4, 5, 6 and 9, a tiny state per layer (so
the state pool holds hundreds of thousands of requests) and a 262,144-token context. SGLang's even split
[5, 5] already has the fewest linear layers on its busiest stage (4), but puts 3 attention layers on stage
1, whose own KV pool is then the MIN; [6, 4] has 2 and 2 at the same 4 linear layers."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from checker.core.sizing.kv_partition import _prefix, closest_partition
from checker.core.sizing.partition import default_partition
from checker.core.sizing.planning import partition_bounds, suggest_partition

SPEC = Path(__file__).resolve().parent / "fixtures" / "kv_skewed_spec.json"
BASE = ["--model-config", str(SPEC), "--pp-size", "2", "--budget-gib", "8", "--disable-radix-cache"]


def _derive(cli, partition: str | None) -> dict:
    env = {"SGLANG_PP_LAYER_PARTITION": partition} if partition else {}
    res = cli(["derive", *BASE, "--format", "json"], env=env)
    assert res.rc == 0, res.err
    return json.loads(res.out)


def test_the_state_objective_alone_keeps_the_even_split():
    spec = json.loads(SPEC.read_text())
    plan = suggest_partition(
        num_hidden_layers=10, linear_layer_ids=tuple(spec["linear_layer_ids"]), pp_size=2
    )
    assert plan.partition == plan.default_partition == (5, 5)


def test_where_the_kv_pool_binds_the_suggestion_moves_attention_layers(cli):
    res = cli(["plan", *BASE, "--suggest-partition", "--format", "json"])
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert doc["SGLANG_PP_LAYER_PARTITION"] == "6,4"
    kv = doc["kv_objective"]
    assert kv["adopted"] and kv["kv_binds_requests"]
    default, moved = _derive(cli, None), _derive(cli, "6,4")
    before = (
        min(r["max_total_num_tokens"] for r in default["ranks"]),
        default["ranks"][0]["max_running_requests"],
    )
    after = (
        min(r["max_total_num_tokens"] for r in moved["ranks"]),
        moved["ranks"][0]["max_running_requests"],
    )
    assert kv["max_total_num_tokens"] == [before[0], after[0]] and kv["max_running_requests"] == [
        before[1],
        after[1],
    ]
    # 3 attention layers on the limiting stage -> 2: the MIN grows by half, and the request estimate with it
    assert after[0] / before[0] == pytest.approx(1.5, rel=1e-5)
    assert before[1] < after[1] < moved["ranks"][0]["max_mamba_cache_size"]
    assert [r["kv_limiting"] for r in default["ranks"]] == [False, True]
    text = cli(["plan", *BASE, "--suggest-partition"]).out
    assert "the KV pool binds max_running_requests here" in text and "(+50.0%)" in text
    assert "export SGLANG_PP_LAYER_PARTITION=6,4" in text


def test_where_the_state_pool_binds_the_answer_stays_and_the_gain_is_named(cli):
    """kimi-k3 at pp 4 (slack 2): the state pool binds 13 requests; the even split stays the suggestion,
    and the line names the partition that would raise max_total_num_tokens, by derive's own numbers."""
    argv = ["--model", "kimi-k3", "--pp-size", "4", "--budget-gib", "8"]
    res = cli(["plan", *argv, "--suggest-partition", "--partition-slack", "2", "--format", "json"])
    doc = json.loads(res.out)
    assert doc["suggested"]["layers_per_stage"] == doc["default"]["layers_per_stage"] == [23, 23, 23, 24]
    kv = doc["kv_objective"]
    assert not kv["adopted"] and not kv["kv_binds_requests"]
    d = cli(
        ["derive", *argv, "--format", "json"],
        env={"SGLANG_PP_LAYER_PARTITION": kv["SGLANG_PP_LAYER_PARTITION"]},
    )
    ranks = json.loads(d.out)["ranks"]
    assert (
        kv["max_total_num_tokens"][1]
        == min(r["max_total_num_tokens"] for r in ranks)
        > kv["max_total_num_tokens"][0]
    )
    assert kv["max_running_requests"] == [13, 13]


def test_closest_partition_is_the_brute_force_optimum():
    """Every (linear, attention) bound on the spec at pp 2 and 3, slack 2: the DP's partition is the
    closest to the even split (then lexicographically smallest) of all that satisfy both bounds."""
    spec = json.loads(SPEC.read_text())
    lin_ids, attn_ids = set(spec["linear_layer_ids"]), set(spec["attention"]["full_attention_layer_ids"])
    lin, attn = _prefix(lin_ids, 10), _prefix(attn_ids, 10)
    for pp in (2, 3):
        bounds, default = partition_bounds(10, pp, 2), default_partition(10, pp)
        sizes = range(bounds.lower, bounds.upper + 1)
        parts_all = [p for p in itertools.product(sizes, repeat=pp) if sum(p) == 10]
        for max_lin, max_attn in itertools.product(range(7), range(5)):
            ok = []
            for p in parts_all:
                edges = [0, *itertools.accumulate(p)]
                if all(
                    lin[b] - lin[a] <= max_lin and attn[b] - attn[a] <= max_attn
                    for a, b in zip(edges, edges[1:], strict=False)
                ):
                    ok.append((sum(abs(x - y) for x, y in zip(p, default, strict=True)), p))
            want = min(ok)[1] if ok else None
            assert closest_partition(lin, attn, pp, bounds, default, max_lin, max_attn) == want
