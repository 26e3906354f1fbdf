"""Pool sizing on the core API, table-driven: charging, slots per request, pool size and limits, as
sglang/srt/mem_cache/kv_cache_configurator.py ``KVCacheConfigurator`` derives them
(``_handle_max_mamba_cache``, ``_calculate_mamba_ratio``, ``resolve_max_num_reqs``), and the upstream
unit test's worked numbers (docs/how-it-computes.md, "What is modelled").

Expected numbers come from SGLang's formulas written out here (or by hand in the comments) on the
upstream unit test's fixture (the kimi-k3 preset): 4,218,880 state bytes per linear layer, 69 linear
layers, per_req 291,102,720, stages holding [9, 8, 8, 9, 9, 9, 9, 8] linear layers at P=8. A slip in any
branch shows as a different K, a different max_running_requests or pp_max_micro_batch_size, or an error
where SGLang starts (or the reverse).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import BudgetError, FlagError, LayoutError
from checker.core.sizing.attention import AttentionGeometry
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.sizing import CapacityInputs, derive_all, derive_stage, divergent_values
from checker.families import FAMILY_TABLE
from checker.families.geometry import load_geometry

GIB = 2**30
PER_LAYER = 4096 * 3 * 2 + 64 * 128 * 128 * 4  # 4,218,880: conv bf16 + temporal fp32
PER_REQ = PER_LAYER * 69  # 291,102,720
SPR9 = int(PER_REQ * (9 / 69))  # max-share at P=8: the busiest stage holds 9 of 69 linear layers
PRESET = load_geometry(model="kimi-k3")


def make(**kw: Any) -> CapacityInputs:
    """The upstream test's setting (rest 8 GiB, r 0.5, P 8, radix cache on) with overrides. Every node
    exports SGLANG_ENABLE_PP_SPEC=1: with it SGLang 0.5.21+ start speculative decoding (EAGLE) under PP,
    and it sizes nothing (its refusal is tested with pp_spec_env=False)."""
    base: dict[str, Any] = dict(
        geometry=PRESET, budget_gib=8.0, pp_size=8, mamba_full_memory_ratio=0.5, pp_spec_env=True
    )
    base.update(kw)
    return CapacityInputs(**base)


# Auto-fit pool sizes worked by hand in exact rational arithmetic (SGLang 0.5.23's
# ``K = (B - per_slot) // per_slot`` with ``B = rest * r / (1 + r) * 2**30``; no budget below sits near a
# step, so IEEE doubles give the same integers):
#   rest 8, r 0.5:  B = 2,863,311,530.67 -> per_req 291,102,720: 8; SPR9 37,969,920: 74; 8 layers
#                   (33,751,040 bytes): 83.
#   rest 20, r 0.9: B = 10,172,290,964.21 -> per_req: 33; SPR9: 266; 8 layers: 300.
#   rest 8, r 0.9:  B = 4,068,916,385.68 -> SPR9: 106.
AUTO_FIT_K = {
    (8.0, 0.5): {PER_REQ: 8, SPR9: 74, int(PER_REQ * (8 / 69)): 83},
    (20.0, 0.9): {PER_REQ: 33, SPR9: 266, int(PER_REQ * (8 / 69)): 300},
}


# ---- the upstream unit test (8 GiB, r 0.5, pp 8) and its worked numbers ----


def test_upstream_assertions_on_the_preset() -> None:
    """The upstream test: the P=8 stage pool is more than 5x the P=1 pool, and all 8 stages agree.
    Charging every stage for the whole model (the old bug) fails the first; own-share fails the second."""
    k1 = derive_stage(make(pp_size=1), 0).max_mamba_cache_size
    stages = derive_all(make())
    ks = [s.max_mamba_cache_size for s in stages]
    assert ks[0] > 5 * k1
    assert len(set(ks)) == 1


def test_worked_numbers_all_three_policies() -> None:
    """The upstream unit test's worked numbers: K=8 at P=1; 74 on all 8 stages (max-share);
    [74,83,83,74,74,74,74,83] (own-share); 8 (whole-model); with 3 slots per request (no_buffer, which SGLang
    only starts with --disable-overlap-schedule) -> max_running_requests 24, pp_max_micro_batch_size 3.
    Under the default strategy (auto, which is extra_buffer without overlap under PP: 4 slots) the same
    K gives 18 and 2; a slot count that ignores the strategy shows as the wrong pair in one of the two."""
    assert derive_stage(make(pp_size=1), 0).max_mamba_cache_size == 8
    maxs = derive_all(
        make(policy="max-share", mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
    )
    assert [s.max_mamba_cache_size for s in maxs] == [74] * 8
    assert all(s.slots_per_request == 3 for s in maxs)
    assert [s.max_running_requests for s in maxs] == [24] * 8  # 74 // 3
    assert [s.pp_max_micro_batch_size for s in maxs] == [3] * 8  # 24 // 8
    auto = derive_all(make(policy="max-share"))
    assert [s.max_mamba_cache_size for s in auto] == [74] * 8  # K does not depend on the slots
    assert all(s.slots_per_request == 4 for s in auto)
    assert [s.max_running_requests for s in auto] == [18] * 8  # 74 // 4
    assert [s.pp_max_micro_batch_size for s in auto] == [2] * 8  # 18 // 8
    own = derive_all(make(policy="own-share"))
    assert [s.max_mamba_cache_size for s in own] == [74, 83, 83, 74, 74, 74, 74, 83]
    assert [s.max_mamba_cache_size for s in derive_all(make(policy="whole-model"))] == [8] * 8


# ---- every policy ----


@pytest.mark.parametrize(
    ("policy", "rest", "r", "stage_per_req"),
    [
        ("max-share", 8.0, 0.5, [SPR9] * 8),
        ("own-share", 8.0, 0.5, [int(PER_REQ * (n / 69)) for n in (9, 8, 8, 9, 9, 9, 9, 8)]),
        ("whole-model", 8.0, 0.5, [PER_REQ] * 8),
        ("max-share", 20.0, 0.9, [SPR9] * 8),
        ("own-share", 20.0, 0.9, [int(PER_REQ * (n / 69)) for n in (9, 8, 8, 9, 9, 9, 9, 8)]),
        ("whole-model", 20.0, 0.9, [PER_REQ] * 8),
    ],
)
def test_policy_charges_and_pool_sizes(policy: str, rest: float, r: float, stage_per_req: list[int]) -> None:
    """Each policy's stage_per_req (``int(per_req * scale)``, as ``_handle_max_mamba_cache`` charges it)
    and the auto-fit K it yields; only own-share diverges."""
    stages = derive_all(make(policy=policy, budget_gib=rest, mamba_full_memory_ratio=r))
    assert [s.stage_per_req_bytes for s in stages] == stage_per_req
    assert [s.max_mamba_cache_size for s in stages] == [AUTO_FIT_K[rest, r][b] for b in stage_per_req]
    # What a stage really allocates is its own layers only, whatever it is charged.
    assert [s.own_state_bytes_per_slot for s in stages] == [n * PER_LAYER for n in (9, 8, 8, 9, 9, 9, 9, 8)]
    assert bool(divergent_values(stages)) == (policy == "own-share")


@pytest.mark.parametrize("policy", ["max-share", "own-share", "whole-model"])
def test_policies_coincide_at_pp_1(policy: str) -> None:
    """With one stage every share is the whole model: all three policies give K=8."""
    s = derive_stage(make(pp_size=1, policy=policy), 0)
    assert (s.stage_per_req_bytes, s.max_mamba_cache_size) == (PER_REQ, 8)


def test_own_share_with_an_empty_stage_is_a_layout_error() -> None:
    """A stage with no linear layers is charged 0 bytes under own-share: SGLang cannot size it."""
    with pytest.raises(LayoutError, match="stage 0 holds no linear layers"):
        derive_all(make(policy="own-share", partition_env="0,12,12,12,12,12,12,21"))
    # max-share still charges the busiest stage's share on the empty stage.
    stages = derive_all(make(partition_env="0,12,12,12,12,12,12,21"))
    assert len({s.max_mamba_cache_size for s in stages}) == 1


# ---- slots per running request (kv_cache_configurator.py _calculate_mamba_ratio), every strategy incl.
# auto resolution ----
# SGLang 0.5.23 resolves auto (arg_groups/overrides.py _mamba_radix_cache_resolution) from the user's
# --disable-overlap-schedule BEFORE the PP pass (_pipeline_parallel_overlap_disable) forces overlap
# off: under PP with default flags auto is extra_buffer WITHOUT overlap, 3 + 1 = 4 slots (reading auto as
# no_buffer under PP does not match the released code). Slots: base 3 (2 with
# SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK); extra_buffer +2 with overlap, +1 without; no_buffer +0 (+1 with
# the env, so it stays 3).


# Stage 0's auto-fit K at 8 GiB, r 0.5 (B = 2,863,311,530.67 bytes), K = (B - spr) // spr: pp 1 charges
# per_req 291,102,720 (B // spr = 9, K = 8); pp 2 (stages of 35 and 34 linear layers) charges
# int(per_req * 35 / 69) = 147,660,800 (B // spr = 19, K = 18); pp 8 charges SPR9 (K = 74).
AUTO_FIT_K_8 = {1: 8, 2: 18, 8: 74}


@pytest.mark.parametrize(
    ("pp", "strategy", "page", "no_overlap", "skip_lock", "no_radix", "resolved", "slots"),
    [
        (1, "auto", 1, False, False, False, "extra_buffer", 5),  # overlap on -> extra_buffer, +2
        (1, "auto", 1, True, False, False, "no_buffer", 3),  # overlap off, page 1 -> no_buffer
        (1, "auto", 16, True, False, False, "extra_buffer", 4),  # page > 1 -> extra_buffer, +1
        # P > 1: auto resolves before overlap is forced off -> extra_buffer, then +1 (no overlap).
        # A pp-8 deployment's 26 -> 210 slots gave 6 -> 52 requests: 26 // 4, 210 // 4 (3 slots: 8, 70).
        (8, "auto", 1, False, False, False, "extra_buffer", 4),
        (8, "auto", 1, True, False, False, "no_buffer", 3),  # the user turned overlap off, page 1
        (8, "auto", 16, True, False, False, "extra_buffer", 4),  # page > 1 keeps extra_buffer
        (8, "auto", 16, False, False, False, "extra_buffer", 4),
        (2, "auto", 1, False, False, False, "extra_buffer", 4),  # any P > 1, not only 8
        (1, "extra_buffer", 1, False, False, False, "extra_buffer", 5),
        (1, "extra_buffer", 1, True, False, False, "extra_buffer", 4),
        (8, "extra_buffer", 1, False, False, False, "extra_buffer", 4),
        (1, "extra_buffer_lazy", 1, False, False, False, "extra_buffer_lazy", 4),
        # Explicit no_buffer: SGLang starts it only with --disable-overlap-schedule and page size 1.
        (1, "no_buffer", 1, True, False, False, "no_buffer", 3),
        (8, "no_buffer", 1, True, False, False, "no_buffer", 3),
        # SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK: base 2; no_buffer gets +1 back so it stays 3.
        (1, "no_buffer", 1, True, True, False, "no_buffer", 3),
        (8, "auto", 1, False, True, False, "extra_buffer", 3),  # 2 + 1 (no overlap under PP)
        (8, "auto", 1, True, True, False, "no_buffer", 3),  # 2 + 1 (no_buffer's env slot)
        (8, "auto", 16, True, True, False, "extra_buffer", 3),
        (1, "auto", 1, False, True, False, "extra_buffer", 4),  # 2 + 2 (overlap on at P=1)
        (1, "auto", 1, True, True, False, "no_buffer", 3),
        (1, "extra_buffer", 1, False, True, False, "extra_buffer", 4),
        (8, "extra_buffer", 1, False, True, False, "extra_buffer", 3),
        (1, "extra_buffer_lazy", 1, False, True, False, "extra_buffer_lazy", 3),
        # --disable-radix-cache: one slot per request, whatever the strategy.
        (1, "auto", 1, False, False, True, None, 1),
        (8, "extra_buffer", 16, False, True, True, None, 1),
    ],
)
def test_slots_per_request(
    pp: int,
    strategy: str,
    page: int,
    no_overlap: bool,
    skip_lock: bool,
    no_radix: bool,
    resolved: str | None,
    slots: int,
) -> None:
    """The slots a request holds divide K into max_running_requests; a wrong count shows there.
    The overlap schedule reported is on only at P=1 without --disable-overlap-schedule (PP forces it
    off, and auto -> no_buffer only happens when the user already turned it off)."""
    inp = make(
        pp_size=pp,
        mamba_radix_cache_strategy=strategy,
        page_size=page,
        disable_overlap_schedule=no_overlap,
        skip_decode_lock=skip_lock,
        disable_radix_cache=no_radix,
    )
    assert inp.slots_per_request() == slots
    if resolved is not None:
        assert inp.resolved_strategy == resolved
    assert inp.describe()["resolved_strategy"] == resolved
    assert inp.describe()["overlap_schedule"] == (pp == 1 and not no_overlap)
    # K does not depend on the slots: worked by hand at 8 GiB, r 0.5 (AUTO_FIT_K_8 below); the slots
    # divide it into running requests, and nothing else caps them here (no token capacity, no flag).
    K = AUTO_FIT_K_8[pp]
    s = derive_stage(inp, 0)
    assert (s.max_mamba_cache_size, s.max_running_requests) == (K, K // slots)


@pytest.mark.parametrize(
    ("pp", "no_overlap", "why"),
    [
        (8, False, "pp size > 1 forces it off"),
        (2, False, "pp size > 1 forces it off"),
        (1, True, "it is disabled"),
    ],
)
def test_extra_buffer_lazy_without_overlap_is_an_error(pp: int, no_overlap: bool, why: str) -> None:
    """extra_buffer_lazy needs the overlap schedule, which P > 1 forces off: SGLang refuses to start.
    The line says which of the two turned it off, since the fix differs."""
    inp = make(
        pp_size=pp, mamba_radix_cache_strategy="extra_buffer_lazy", disable_overlap_schedule=no_overlap
    )
    with pytest.raises(FlagError) as exc:
        inp.slots_per_request()
    assert str(exc.value) == (
        f"--mamba-radix-cache-strategy extra_buffer_lazy needs the overlap schedule, but {why}; "
        "use extra_buffer or no_buffer"
    )


@pytest.mark.parametrize(("pp", "no_overlap"), [(2, False), (1, True)])
def test_lazy_without_overlap_is_refused_by_0_5_13_too(pp: int, no_overlap: bool) -> None:
    """0.5.13's _calculate_mamba_ratio asserts "Lazy extra buffer requires overlap schedule", whether PP
    or the flag turned it off."""
    qwen = replace(PRESET, family="qwen3_next")
    inp = make(
        geometry=qwen,
        pp_size=pp,
        sglang_version="0.5.13",
        mamba_radix_cache_strategy="extra_buffer_lazy",
        disable_overlap_schedule=no_overlap,
    )
    with pytest.raises(FlagError) as exc:
        inp.slots_per_request()
    assert str(exc.value) == (
        "--mamba-radix-cache-strategy extra_buffer_lazy needs the overlap schedule: SGLang 0.5.13 asserts it "
        '("Lazy extra buffer requires overlap schedule"); use extra_buffer'
    )


def test_0_5_7_adds_two_slots_unless_extra_buffer_runs_with_spec_decoding() -> None:
    """0.5.7 init_memory_pool: 3 + 1 only for extra_buffer with spec decoding; no_buffer with spec
    decoding still adds 2 (5 slots), and 0.5.7 does not refuse that combination (0.5.10 does)."""
    qwen = replace(PRESET, family="qwen3_next")
    spec = dict(speculative_num_draft_tokens=2, max_running_requests=4)
    kw: dict[str, Any] = dict(geometry=qwen, pp_size=1, sglang_version="0.5.7", **spec)
    assert make(**kw, mamba_radix_cache_strategy="no_buffer").slots_per_request() == 5
    assert make(**kw, mamba_radix_cache_strategy="extra_buffer").slots_per_request() == 4


# ---- the cache-flag combinations SGLang 0.5.23 asserts against at startup ----
# arg_groups/mamba_hook.py: validate_mamba_no_buffer (page_size 1 and --disable-overlap-schedule, checked
# on the user's flags before the PP pass turns overlap off) and validate_mamba_extra_buffer
# (mamba_track_interval, default 256, >= speculative_num_draft_tokens and divisible by page_size). Both
# are skipped with --disable-radix-cache (overrides.py _mamba_radix_cache_resolution returns early).

REFUSED_CASES = [
    # id, overrides, the flag named first in the message, the rule quoted
    (
        "no_buffer page 16",
        {"mamba_radix_cache_strategy": "no_buffer", "page_size": 16, "disable_overlap_schedule": True},
        "--mamba-radix-cache-strategy no_buffer",
        "page_size=1",
    ),
    (
        "no_buffer page 2 P1",
        {
            "pp_size": 1,
            "mamba_radix_cache_strategy": "no_buffer",
            "page_size": 2,
            "disable_overlap_schedule": True,
        },
        "--mamba-radix-cache-strategy no_buffer",
        "page_size=1",
    ),
    # SGLang checks the page size first.
    (
        "no_buffer page 16 overlap on",
        {"mamba_radix_cache_strategy": "no_buffer", "page_size": 16},
        "--mamba-radix-cache-strategy no_buffer",
        "page_size=1",
    ),
    (
        "no_buffer overlap on P1",
        {"pp_size": 1, "mamba_radix_cache_strategy": "no_buffer"},
        "--mamba-radix-cache-strategy no_buffer",
        "add --disable-overlap-schedule",
    ),
    # Under PP SGLang turns overlap off only after this assert: still refused.
    (
        "no_buffer overlap on P8",
        {"mamba_radix_cache_strategy": "no_buffer"},
        "--mamba-radix-cache-strategy no_buffer",
        "even under pp > 1",
    ),
    (
        "no_buffer overlap on P2",
        {"pp_size": 2, "mamba_radix_cache_strategy": "no_buffer"},
        "--mamba-radix-cache-strategy no_buffer",
        "add --disable-overlap-schedule",
    ),
    (
        "extra_buffer page 3",
        {"mamba_radix_cache_strategy": "extra_buffer", "page_size": 3},
        "--page-size 3",
        "mamba_track_interval % page_size == 0",
    ),
    (
        "extra_buffer page 512",
        {"mamba_radix_cache_strategy": "extra_buffer", "page_size": 512},
        "--page-size 512",
        "mamba_track_interval % page_size == 0",
    ),
    (
        "extra_buffer_lazy page 48",
        {"pp_size": 1, "mamba_radix_cache_strategy": "extra_buffer_lazy", "page_size": 48},
        "--page-size 48",
        "extra_buffer_lazy",
    ),
    ("auto page 3 P8", {"page_size": 3}, "--page-size 3", "auto (resolved to extra_buffer)"),
    (
        "auto page 100 overlap off",
        {"page_size": 100, "disable_overlap_schedule": True},
        "--page-size 100",
        "auto (resolved to extra_buffer)",
    ),
    (
        "extra_buffer D 257",
        {
            "mamba_radix_cache_strategy": "extra_buffer",
            "max_running_requests": 8,
            "speculative_num_draft_tokens": 257,
        },
        "--speculative-num-draft-tokens 257",
        "mamba_track_interval >= speculative_num_draft_tokens",
    ),
    (
        "auto D 300",
        {"max_running_requests": 8, "speculative_num_draft_tokens": 300},
        "--speculative-num-draft-tokens 300",
        "auto (resolved to extra_buffer)",
    ),
    # SGLang checks the draft tokens before the page size.
    (
        "auto D 300 page 3",
        {"max_running_requests": 8, "speculative_num_draft_tokens": 300, "page_size": 3},
        "--speculative-num-draft-tokens 300",
        "at most 256 draft tokens",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "flag", "rule"), [c[1:] for c in REFUSED_CASES], ids=[c[0] for c in REFUSED_CASES]
)
def test_startup_refusals_are_one_line_flag_errors(overrides: dict[str, Any], flag: str, rule: str) -> None:
    """A combination SGLang refuses at startup must not get capacity numbers: sizing it anyway would
    hand the user a plan for a server that never starts. Shows as numbers instead of a FlagError, or
    a message that does not name the flag, the rule and SGLang."""
    inp = make(**overrides)
    with pytest.raises(FlagError) as exc:
        inp.slots_per_request()
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(flag) and rule in msg and "SGLang 0.5.23" in msg
    with pytest.raises(FlagError, match="SGLang 0.5.23"):
        derive_all(inp)


ACCEPTED_CASES = [
    # id, overrides, slots: the edges of the same rules, which SGLang starts.
    (
        "no_buffer page 1 overlap off P8",
        {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True},
        3,
    ),
    ("auto -> no_buffer", {"disable_overlap_schedule": True}, 3),
    (
        "no_buffer ignores the track interval",
        {
            "mamba_radix_cache_strategy": "no_buffer",
            "disable_overlap_schedule": True,
            "max_running_requests": 8,
            "speculative_num_draft_tokens": 300,
        },
        3,
    ),
    ("extra_buffer page 256", {"mamba_radix_cache_strategy": "extra_buffer", "page_size": 256}, 4),
    ("auto page 64", {"page_size": 64}, 4),
    (
        "extra_buffer D 256",
        {
            "mamba_radix_cache_strategy": "extra_buffer",
            "max_running_requests": 8,
            "speculative_num_draft_tokens": 256,
        },
        4,
    ),
    (
        "radix off: no_buffer page 16 overlap on",
        {"mamba_radix_cache_strategy": "no_buffer", "page_size": 16, "disable_radix_cache": True},
        1,
    ),
    (
        "radix off: extra_buffer page 3 D 300",
        {
            "mamba_radix_cache_strategy": "extra_buffer",
            "page_size": 3,
            "disable_radix_cache": True,
            "max_running_requests": 8,
            "speculative_num_draft_tokens": 300,
        },
        1,
    ),
]


@pytest.mark.parametrize(
    ("overrides", "slots"), [c[1:] for c in ACCEPTED_CASES], ids=[c[0] for c in ACCEPTED_CASES]
)
def test_combinations_sglang_starts_are_not_refused(overrides: dict[str, Any], slots: int) -> None:
    """The edges of the startup asserts (page 256, 256 draft tokens, no radix cache) are valid in SGLang;
    an off-by-one or a check that ignores --disable-radix-cache shows as a FlagError here."""
    assert make(**overrides).slots_per_request() == slots


# ---- every pool-sizing branch (_handle_max_mamba_cache) and the limits (resolve_max_num_reqs) ----

BRANCH_CASES = [
    # id, overrides, branch, K, max_running_requests, pp_max_micro_batch_size
    # Default flags at P=8: auto -> extra_buffer without overlap, 4 slots a request (radix cache on).
    ("C", {}, "C", 74, 74 // 4, 74 // 4 // 8),
    ("C r=0.9", {"mamba_full_memory_ratio": 0.9}, "C", 106, 106 // 4, 26 // 8),
    (
        "C no_buffer",
        {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True},
        "C",
        74,
        74 // 3,
        74 // 3 // 8,
    ),
    ("C user mrr", {"max_running_requests": 10}, "C", 74, 10, 1),
    ("C user mrr capped by K//ratio", {"max_running_requests": 100}, "C", 74, 74 // 4, 18 // 8),
    ("C user micro batch", {"pp_max_micro_batch_size": 5}, "C", 74, 74 // 4, 5),
    ("C radix off without mrr", {"disable_radix_cache": True}, "C", 74, 74, 74 // 8),
    ("C mrr without radix off", {"max_running_requests": 16}, "C", 74, 16, 16 // 8),
    ("C dp 2", {"dp_size": 2}, "C", 74, 74 // 4, 18 // 8),
    ("C dp 2 user mrr", {"dp_size": 2, "max_running_requests": 30}, "C", 74, 15, 1),
    ("A", {"max_mamba_cache_size": 40}, "A", 40, 40 // 4, 1),
    ("A dp 3", {"max_mamba_cache_size": 40, "dp_size": 3}, "A", 40 // 3, 40 // 3 // 4, 1),
    (
        "A before B",
        {"max_mamba_cache_size": 40, "disable_radix_cache": True, "max_running_requests": 20},
        "A",
        40,
        20,
        20 // 8,
    ),
    ("B", {"disable_radix_cache": True, "max_running_requests": 20}, "B", 20, 20, 20 // 8),
    ("B dp 3", {"disable_radix_cache": True, "max_running_requests": 20, "dp_size": 3}, "B", 6, 6, 1),
    ("B dp floor", {"disable_radix_cache": True, "max_running_requests": 3, "dp_size": 4}, "B", 1, 1, 1),
]


# Bytes left for the KV cache by K + 1 charged slots of SPR9 = 37,969,920 bytes, out of 8 GiB =
# 8,589,934,592 bytes, worked by hand: K = 74 -> 75 slots = 2,847,744,000 bytes -> 5,742,190,592 left.
KV_BYTES_LEFT = {
    106: 4_527_153_152,  # 107 slots = 4,062,781,440
    74: 5_742_190_592,
    40: 7_033_167_872,  # 41 slots = 1,556,766,720
    20: 7_792_566_272,  # 21 slots = 797,368,320
    13: 8_058_355_712,  # 14 slots = 531,578,880
    6: 8_324_145_152,  # 7 slots = 265,789,440
    1: 8_513_994_752,  # 2 slots = 75,939,840
}


@pytest.mark.parametrize(
    ("overrides", "branch", "K", "mrr", "micro"),
    [c[1:] for c in BRANCH_CASES],
    ids=[c[0] for c in BRANCH_CASES],
)
def test_pool_sizing_branches(overrides: dict[str, Any], branch: str, K: int, mrr: int, micro: int) -> None:
    """First matching branch of ``_handle_max_mamba_cache`` (A: --max-mamba-cache-size, B: radix off and
    --max-running-requests, C: auto-fit), then ``resolve_max_num_reqs``'s limits; the KV budget left is
    rest - (K+1)*per_slot."""
    stages = derive_all(make(**overrides))
    s = stages[0]
    assert (s.branch, s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size) == (
        branch,
        K,
        mrr,
        micro,
    )
    assert s.intermediate_state_bytes == 0
    # To the byte (a multiple of 2**-30 GiB below 8 is exact in a double): forgetting the padding slot,
    # charging own layers only, or rounding the GiB figure shows here.
    assert s.kv_budget_gib * GIB == KV_BYTES_LEFT[K]
    assert not divergent_values(stages)


SPEC_CASES = [
    # id, overrides, branch, K, slots in the intermediate reservation, max_running_requests
    # C, D=3, mrr 16, no_buffer (3 slots): K = int((B - spr*4) // (spr*2)) = 35; reservation
    # min(16, 35//3) + 1 = 12; max_running_requests min(16, 35//3) = 11.
    (
        "C",
        {
            "speculative_num_draft_tokens": 3,
            "max_running_requests": 16,
            "mamba_radix_cache_strategy": "no_buffer",
            "disable_overlap_schedule": True,
        },
        "C",
        35,
        12,
        11,
    ),
    # The same under the default (auto -> extra_buffer, 4 slots at P=8):
    # K = int((B - spr*4) // (spr*1.75)) = int(2,711,431,850.67 / 66,447,360) = 40;
    # reservation min(16, 40//4) + 1 = 11; max_running_requests min(16, 10) = 10.
    ("C auto", {"speculative_num_draft_tokens": 3, "max_running_requests": 16}, "C", 40, 11, 10),
    # C with page 16 (extra_buffer, 4 slots), D=2, mrr 100: K = int((B - spr*3) // (spr*1.5)) = 48.
    (
        "C page 16",
        {"speculative_num_draft_tokens": 2, "max_running_requests": 100, "page_size": 16},
        "C",
        48,
        48 // 4 + 1,
        48 // 4,
    ),
    # A (auto, 4 slots): K = 40; reservation min(8, 40//4) + 1 = 9.
    (
        "A",
        {"speculative_num_draft_tokens": 2, "max_running_requests": 8, "max_mamba_cache_size": 40},
        "A",
        40,
        9,
        8,
    ),
    # B: K = 20 and the reservation uses K + 1 = 21 slots.
    (
        "B",
        {"speculative_num_draft_tokens": 2, "max_running_requests": 20, "disable_radix_cache": True},
        "B",
        20,
        21,
        20,
    ),
]


# 8 GiB less (K + 1 + reserved slots x D) x SPR9 bytes, worked by hand per case (branch, K):
SPEC_KV_BYTES_LEFT = {
    ("C", 35): 5_856_100_352,  # 36 + 12 x 3 = 72 x SPR9 = 2,733,834,240
    ("C", 40): 5_780_160_512,  # 41 + 11 x 3 = 74 x SPR9
    ("C", 48): 5_742_190_592,  # 49 + 13 x 2 = 75 x SPR9
    ("A", 40): 6_349_709_312,  # 41 + 9 x 2 = 59 x SPR9
    ("B", 20): 6_197_829_632,  # 21 + 21 x 2 = 63 x SPR9
}


@pytest.mark.parametrize(
    ("overrides", "branch", "K", "reserved_slots", "mrr"),
    [c[1:] for c in SPEC_CASES],
    ids=[c[0] for c in SPEC_CASES],
)
def test_spec_decoding_branches(
    overrides: dict[str, Any], branch: str, K: int, reserved_slots: int, mrr: int
) -> None:
    """Spec decoding: C's K formula and the intermediate state (stage_per_req * slots * D) taken from
    rest in every branch; forgetting the reservation shows as a larger KV budget left."""
    s = derive_stage(make(**overrides), 0)
    D = overrides["speculative_num_draft_tokens"]
    assert (s.branch, s.max_mamba_cache_size, s.max_running_requests) == (branch, K, mrr)
    assert s.intermediate_state_bytes == SPR9 * reserved_slots * D
    # To the byte: the pool's K + 1 slots and the intermediate state both come off the 8 GiB.
    assert s.kv_budget_gib * GIB == SPEC_KV_BYTES_LEFT[branch, K]


def test_spec_decoding_branch_a_splits_over_attention_dp_at_one_stage() -> None:
    """Branch A with attention DP 2: K = 40 // 2 = 20 per DP worker, the reservation min(8 // 2, 20 // 3)
    + 1 = 5 slots (no_buffer, 3 a request), max_running_requests min(4, 6) = 4. At one stage: SGLang
    0.5.21+ refuse SGLANG_ENABLE_PP_SPEC with attention DP, and up to 0.5.20 any spec under PP (the case
    ran at P=8 before those refusals were modelled). kimi-k3 whole (per_req 291,102,720), 20 GiB: KV
    left 20 * 2**30 - (21 + 5 * 2) * 291,102,720 = 21,474,836,480 - 9,024,184,320 = 12,450,652,160."""
    s = derive_stage(
        make(
            speculative_num_draft_tokens=2,
            max_running_requests=8,
            max_mamba_cache_size=40,
            dp_size=2,
            pp_size=1,
            budget_gib=20.0,
            mamba_radix_cache_strategy="no_buffer",
            disable_overlap_schedule=True,
        ),
        0,
    )
    assert (s.branch, s.max_mamba_cache_size, s.max_running_requests) == ("A", 20, 4)
    assert s.intermediate_state_bytes == 291_102_720 * 5 * 2
    assert s.kv_budget_gib * GIB == 12_450_652_160
    with pytest.raises(FlagError, match="SGLANG_ENABLE_PP_SPEC is not compatible with attention DP"):
        make(speculative_num_draft_tokens=2, max_running_requests=8, max_mamba_cache_size=40, dp_size=2)


def test_spec_decoding_needs_max_running_requests() -> None:
    with pytest.raises(FlagError, match="--max-running-requests"):
        make(speculative_num_draft_tokens=2)


# ---- budget errors ----


def test_budget_too_small_for_one_state_slot() -> None:
    """K <= 0 is SGLang's "not enough memory for the state pool", with the numbers."""
    with pytest.raises(BudgetError, match="not enough memory for the state pool") as info:
        derive_all(make(budget_gib=0.01))
    assert "0.01" in str(info.value) and str(SPR9) in str(info.value)


def test_budget_too_small_for_one_running_request() -> None:
    """K = 2 slots at P=1 but a request needs 5 (extra_buffer with overlap): max_running_requests 0."""
    rest = 3 * 3.5 * PER_REQ / GIB  # B = 3.5 * per_req at r = 0.5 -> K = int(2.5) = 2
    inp = make(pp_size=1, budget_gib=rest)
    assert inp.slots_per_request() == 5
    with pytest.raises(BudgetError, match="one running request") as info:
        derive_stage(inp, 0)
    assert "K=2" in str(info.value)


def test_max_mamba_cache_size_below_dp_is_an_error() -> None:
    """Branch A's K = value // dp floors to 0 when dp exceeds it; the message names the flag, not budget."""
    with pytest.raises(FlagError, match="--max-mamba-cache-size 2"):
        derive_all(make(max_mamba_cache_size=2, dp_size=3))


def test_branch_a_pool_larger_than_the_budget_is_an_error() -> None:
    with pytest.raises(BudgetError, match="--budget-gib 8.0"):
        derive_all(make(max_mamba_cache_size=100_000))


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_budget_is_rejected(budget: float) -> None:
    with pytest.raises(BudgetError, match="--budget-gib"):
        make(budget_gib=budget)


# ---- token capacity and the context_len estimate (resolve_max_num_reqs) ----

TOY = ModelGeometry(
    name="toy",
    num_hidden_layers=4,
    linear_layer_ids=(0, 1, 2, 3),
    conv_shapes=((8, 3),),
    temporal_shape=(2, 4, 4),
    context_len=1_048_576,
    # Layer 3 also holds a KV cache (as every Falcon-H1 layer does): 1 head x (8 + 8) x 2 bytes = 32 bytes
    # a token, so about 2**25 tokens at 1 GiB: the pool is far from binding the estimate's 4096.
    attention=AttentionGeometry(full_attention_layer_ids=(3,), num_kv_heads=1, head_dim=8, v_head_dim=8),
    families=FAMILY_TABLE,  # the registry's facts, as load_geometry hands every geometry (a model spec too)
)  # 176 bytes a layer, 704 per request: at 1 GiB the state pool never binds


@pytest.mark.parametrize(
    ("T", "ctx", "user_mrr", "expected"),
    [
        (20_000, 4000, None, 2560),  # int(20000/4000*512) = 2560, inside the clamp, T//2 = 10000
        (14_000, 4096, None, 2048),  # 1750 clamps up to 2048
        (100_000, 1000, None, 4096),  # 51200 clamps down to 4096
        (6000, 1000, None, 3000),  # 3072, then T//2 = 3000 binds
        (3000, 100_000, None, 1500),  # 15 -> 2048, then T//2 = 1500
        (6000, 1000, 5000, 3000),  # user value capped by T//2
        (6000, 1000, 100, 100),  # user value below T//2
        (None, None, None, 4096),  # the derived pool (about 2**25 tokens) leaves the estimate's 4096
    ],
)
def test_token_capacity_and_context_len_estimate(
    T: int | None, ctx: int | None, user_mrr: int | None, expected: int
) -> None:
    """max_running_requests = min(estimate or user value, T // 2, K // ratio) with the estimate clamped
    to [2048, 4096]; the state pool of the toy model is far too large to bind."""
    inp = CapacityInputs(
        geometry=TOY,
        budget_gib=1.0,
        pp_size=1,
        token_capacity=T,
        context_len=ctx,
        max_running_requests=user_mrr,
    )
    s = derive_stage(inp, 0)
    assert s.max_mamba_cache_size // s.slots_per_request > 4096
    assert s.max_running_requests == expected


def test_token_capacity_too_small_for_one_request() -> None:
    inp = CapacityInputs(geometry=TOY, budget_gib=1.0, token_capacity=1, context_len=1024)
    with pytest.raises(BudgetError, match="--token-capacity"):
        derive_stage(inp, 0)


def test_token_capacity_needs_a_context_len() -> None:
    """A model spec without a context length: the request estimate cannot be computed, --token-capacity
    or not; --context-length supplies it."""
    with pytest.raises(FlagError, match="--context-len"):
        CapacityInputs(geometry=replace(TOY, context_len=None), budget_gib=1.0, token_capacity=100_000)
    ok = CapacityInputs(geometry=replace(TOY, context_len=None), budget_gib=1.0, context_len=4096)
    assert derive_stage(ok, 0).context_len == 4096


def test_context_len_defaults_to_the_config(fixtures_dir: Path) -> None:
    """Qwen3-Next's max_position_embeddings 262144 feeds the estimate when --context-len is unset:
    int(1,500,000 / 262144 * 512) = 2929; --context-len 200000 gives int(3840.0) = 3840. The fixed pool
    of 20,000 slots at 4 a request (auto under PP) leaves K // ratio = 5000 above both, so the
    estimate binds, not the state pool."""
    g = load_geometry(model_config=fixtures_dir / "qwen3_next_80b_a3b.json")
    kw: dict[str, Any] = dict(
        geometry=g, budget_gib=500.0, pp_size=4, max_mamba_cache_size=20_000, token_capacity=1_500_000
    )
    s = derive_stage(CapacityInputs(**kw), 0)
    assert s.slots_per_request == 4
    assert s.max_mamba_cache_size // s.slots_per_request == 5000
    assert s.max_running_requests == int(1_500_000 / 262144 * 512) == 2929
    assert derive_stage(CapacityInputs(**kw, context_len=200_000), 0).max_running_requests == 3840


# ---- the JSON model spec path, with a per-slot extra state ----


def test_model_spec_extra_per_slot_is_scaled_like_per_req(tmp_path: Path) -> None:
    """extra_per_slot_bytes is charged with the same scale as per_req (0.5.22+ ``_handle_max_mamba_cache``:
    ``int(extra_mamba_cache_bytes_per_req * pp_layer_scale)``): per_slot = 352 + 666."""
    spec = {
        "num_hidden_layers": 4,
        "linear_layer_ids": [0, 1, 2],
        "conv_shapes": [[8, 3]],
        "temporal_shape": [2, 4, 4],
        "extra_per_slot_bytes": 1000,
        "context_len": 4096,
        "attention": {"full_attention_layer_ids": [3], "num_key_value_heads": 1, "head_dim": 8},
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    g = load_geometry(model_config=path)
    stages = derive_all(CapacityInputs(geometry=g, budget_gib=0.001, pp_size=2, mamba_full_memory_ratio=1.0))
    # Stages [0, 2) and [2, 4) hold 2 and 1 linear layers: max-share scale 2/3.
    per_req = (8 * 3 * 2 + 2 * 4 * 4 * 4) * 3
    spr, extra = int(per_req * (2 / 3)), int(1000 * (2 / 3))
    assert (spr, extra) == (352, 666)
    budget = 0.001 * 1.0 / 2.0 * GIB
    K = int((budget - (spr + extra)) // (spr + extra))
    assert K == 526
    for s in stages:
        assert (s.stage_per_req_bytes, s.extra_per_slot_bytes, s.max_mamba_cache_size) == (spr, extra, K)
        assert s.state_charged_bytes == (K + 1) * (spr + extra)


# ---- what the report shows of the inputs and of each stage ----


def test_describe_is_the_inputs_as_given_and_as_resolved() -> None:
    """The report's inputs block: every flag as the user gave it (SGLang's names), the model by name (a
    ModelGeometry is not JSON), and what the release made of the flags left to it. Ranks' blocks are
    compared key by key, so a key dropped, renamed or holding another value is a false or hidden
    difference. 0.5.23 charges max-share by default; auto under PP is extra_buffer without overlap
    (section 5 of the spec); 0.5.16 charges the whole model; --policy wins over the release."""
    d = make(max_running_requests=10, page_size=16).describe()
    assert "geometry" not in d and d["model"] == PRESET.name
    assert (d["max_running_requests"], d["page_size"], d["pp_size"], d["budget_gib"]) == (10, 16, 8, 8.0)
    assert (d["policy"], d["policy_source"]) == ("max-share", "release")
    assert (d["mamba_radix_cache_strategy"], d["resolved_strategy"], d["overlap_schedule"]) == (
        "auto",
        "extra_buffer",
        False,
    )
    assert (d["sglang_version"], d["sglang_rules"]) == ("0.5.23", "0.5.23")
    assert make(pp_size=1).describe()["overlap_schedule"] is True
    old = make(sglang_version="0.5.16").describe()
    assert (old["policy"], old["policy_source"], old["sglang_version"]) == (
        "whole-model",
        "release",
        "0.5.16",
    )
    what_if = make(sglang_version="0.5.16", policy="own-share").describe()
    assert (what_if["policy"], what_if["policy_source"]) == ("own-share", "--policy")


def test_stage_report_charges_and_allocates_bytes() -> None:
    """Each stage's report carries what SGLang takes off the budget for the pool and what the pool
    really allocates. 0.5.23 charges K + 1 slots of the max-share charge (75 x 37,969,920 at K = 74)
    while the pool allocates K + 1 slots of the stage's own layers (9 or 8 x 4,218,880 bytes); 0.5.16
    charges K = 9 slots of per_req but still allocates the padding slot (memory_pool.py MambaPool)."""
    for s, n in zip(derive_all(make()), (9, 8, 8, 9, 9, 9, 9, 8), strict=True):
        d = s.as_dict()
        assert (d["max_mamba_cache_size"], d["pp_rank"]) == (74, s.pp_rank)
        assert (d["state_charged_bytes"], d["state_allocated_bytes"]) == (75 * SPR9, 75 * n * PER_LAYER)
    old = derive_stage(make(sglang_version="0.5.16"), 0).as_dict()
    assert (old["state_charged_bytes"], old["state_allocated_bytes"]) == (9 * PER_REQ, 10 * 9 * PER_LAYER)


def test_the_first_stage_short_of_memory_is_named() -> None:
    """Every stage is short at 0.01 GiB; the refusal a user acts on names the first one (stage 0), as
    rank 0's log would, not the last one derived."""
    with pytest.raises(BudgetError) as exc:
        derive_all(make(budget_gib=0.01))
    assert str(exc.value).endswith(
        "stage_per_req=37969920 bytes (stage 0); raise the budget or --mamba-full-memory-ratio"
    )


# ---- the inputs CapacityInputs refuses before any derivation ----


@pytest.mark.parametrize("budget", [True, "8", None])
def test_a_budget_that_is_not_a_number_is_a_budget_error(budget: object) -> None:
    """A budget read from a config file or handed over by code must be a number of GiB: True is not 1
    GiB, "8" is not 8 GiB. Refused as the bad budget it is, not a TypeError deep in the sizing."""
    with pytest.raises(BudgetError) as exc:
        make(budget_gib=budget)
    assert str(exc.value) == (
        f"--budget-gib {budget} must be a positive, finite number of GiB "
        "(the memory left for the KV and state pools)"
    )


@pytest.mark.parametrize("name", ["pp_size", "mamba_full_memory_ratio"])
def test_unresolved_inputs_are_a_bug_not_a_default(name: str) -> None:
    """pp_size and the ratio are resolved (world size, release default) before sizing; None reaching the
    core is a caller's bug and must not size with some default."""
    with pytest.raises(TypeError, match=f"CapacityInputs.{name} is resolved before sizing"):
        make(**{name: None})


@pytest.mark.parametrize("pp", [2, 8])
def test_any_pipeline_split_is_refused_where_sglang_refuses_it(pp: int) -> None:
    """Up to 0.5.7 no hybrid class starts under PP, at any pp size > 1; up to 0.5.20 spec decoding
    is refused under PP, at any pp size > 1 (check_server_args). Each refusal says what to do."""
    qwen = replace(PRESET, family="qwen3_next")
    with pytest.raises(FlagError) as old:
        make(geometry=qwen, pp_size=pp, sglang_version="0.5.4.post1", mamba_radix_cache_strategy="auto")
    assert str(old.value).startswith(f"--pp-size {pp}: SGLang 0.5.4.post1 starts no hybrid")
    assert "(models/qwen3_next.py and falcon_h1.py assert a single stage; nemotron_h.py" in str(old.value)
    assert str(old.value).endswith("use --pp-size 1, or SGLang 0.5.8 or later")
    spec = dict(speculative_num_draft_tokens=2, max_running_requests=8)
    with pytest.raises(FlagError) as refused:
        make(pp_size=pp, sglang_version="0.5.20", **spec)
    assert re.fullmatch(
        re.escape(
            f"speculative decoding with --pp-size {pp}: SGLang 0.5.20 refuses it at start-up (sglang/srt/"
        )
        + r"arg_groups/validation_hook\.py:\d+ check_server_args"
        + re.escape(
            ': "Pipeline parallelism is not compatible with overlap schedule, speculative decoding"); drop '
            "speculative decoding, use --pp-size 1, or SGLang 0.5.21 or later (EAGLE)"
        ),
        str(refused.value),
    ), str(refused.value)
    make(pp_size=pp, sglang_version="0.5.21", **spec)  # SGLANG_ENABLE_PP_SPEC=1 (make's nodes export it)
    starts = (
        f"^speculative decoding with --pp-size {pp} and SGLANG_ENABLE_PP_SPEC unset: SGLang 0.5.21 refuses "
    )
    with pytest.raises(FlagError, match=starts):
        make(pp_size=pp, sglang_version="0.5.21", pp_spec_env=False, **spec)


@pytest.mark.parametrize("version", ["0.5.2", "0.5.3.post2", "0.5.6.post2"])
def test_no_strategy_before_0_5_7_whatever_the_radix_rule(version: str) -> None:
    """No release before 0.5.7 has a strategy flag: the forced-off (0.5.2-0.5.3.post1) and fixed-ratio
    (0.5.3.post2-0.5.6.post2) releases refuse one alike, and accept the default."""
    qwen = replace(PRESET, family="qwen3_next")
    with pytest.raises(FlagError) as exc:
        make(geometry=qwen, pp_size=1, sglang_version=version, mamba_radix_cache_strategy="extra_buffer")
    assert str(exc.value).endswith(
        "has no mamba cache strategy (the flag arrived in 0.5.7 as --mamba-scheduler-strategy); "
        "leave it at auto"
    )
    make(geometry=qwen, pp_size=1, sglang_version=version, mamba_radix_cache_strategy="auto")


# ---- pool sizes of the releases before 0.5.9 (docs/sglang-releases.md) ----


def test_fixed_pool_of_512_slots_without_a_request_count() -> None:
    """0.5.2 ModelRunner.__init__: a hybrid GDN model's pool is --max-mamba-cache-size, else
    --max-running-requests, else 512 slots, whatever the budget. TOY's 704-byte requests fit 512 slots
    in 1 GiB; 1 slot a request (radix cache forced off), so 512 running requests (the estimate's 4096
    does not bind); with --max-mamba-cache-size 40 the pool is 40 (branch A), with
    --max-running-requests 16 it is 16 (branch B)."""
    toy = replace(TOY, family="qwen3_next")
    kw: dict[str, Any] = dict(geometry=toy, budget_gib=1.0, sglang_version="0.5.2")
    s = derive_stage(CapacityInputs(**kw), 0)
    assert (s.branch, s.max_mamba_cache_size, s.max_running_requests) == ("B", 512, 512)
    a = derive_stage(CapacityInputs(**kw, max_mamba_cache_size=40), 0)
    assert (a.branch, a.max_mamba_cache_size) == ("A", 40)
    b = derive_stage(CapacityInputs(**kw, max_running_requests=16), 0)
    assert (b.branch, b.max_mamba_cache_size, b.max_running_requests) == ("B", 16, 16)
    # Split over dp for hybrid GDN: 512 // 3 = 170 slots a worker.
    assert derive_stage(CapacityInputs(**kw, dp_size=3), 0).max_mamba_cache_size == 170


def test_ratio_pool_with_spec_decoding_and_the_radix_cache_on() -> None:
    """0.5.5 handle_max_mamba_cache, radix cache on, D = 2: K = int(B // per_req // (1 + D)) =
    int(9.0 // 3) = 3 (B = 8 * 0.5 / 1.5 GiB, 9.84 per_req), charged K * per_req * (1 + D) = 9 per_req;
    the intermediate state is K * per_req * D = 6 per_req. 3 slots a request (fixed ratio):
    tp_worker min(4, min(4, 3 // 3)) = 1 running request."""
    qwen = replace(PRESET, family="qwen3_next")
    s = derive_stage(
        make(
            geometry=qwen,
            pp_size=1,
            sglang_version="0.5.5",
            speculative_num_draft_tokens=2,
            max_running_requests=4,
        ),
        0,
    )
    assert (s.branch, s.max_mamba_cache_size, s.max_running_requests) == ("C", 3, 1)
    assert s.intermediate_state_bytes == 6 * PER_REQ
    assert s.kv_budget_gib == 8 - 9 * PER_REQ / GIB


def test_explicit_or_fit_pool_0_5_7() -> None:
    """0.5.7 handle_max_mamba_cache: an explicit --max-mamba-cache-size, or the radix cache off, sizes
    (mmcs or mrr or 512) // dp: 40 // 3 = 13 (branch A); radix off with --max-running-requests 16 over
    dp 3: 5 (branch B); radix off without either: 512 // 3 = 170 of TOY's 704-byte slots; radix on
    without a size auto-fits with no // dp: int(B // per_req) = 9. No spec decoding: nothing reserved."""
    qwen = replace(PRESET, family="qwen3_next")
    kw: dict[str, Any] = dict(geometry=qwen, pp_size=1, dp_size=3, sglang_version="0.5.7")
    a = derive_stage(make(**kw, max_mamba_cache_size=40), 0)
    assert (a.branch, a.max_mamba_cache_size) == ("A", 13)
    b = derive_stage(make(**kw, disable_radix_cache=True, max_running_requests=16), 0)
    assert (b.branch, b.max_mamba_cache_size) == ("B", 5)
    c = derive_stage(make(**kw), 0)
    assert (c.branch, c.max_mamba_cache_size, c.intermediate_state_bytes) == ("C", 9, 0)
    toy = dict(kw, geometry=replace(TOY, family="qwen3_next"), budget_gib=1.0, disable_radix_cache=True)
    assert derive_stage(make(**toy), 0).max_mamba_cache_size == 170


def test_an_explicit_pool_of_one_slot_per_dp_worker_starts() -> None:
    """--max-mamba-cache-size 3 over dp 3 is one slot a worker: SGLang starts it (the refusal's advice
    is "at least {dp}"), with one running request at 1 slot each (radix cache off)."""
    s = derive_stage(make(max_mamba_cache_size=3, dp_size=3, disable_radix_cache=True), 0)
    assert (s.branch, s.max_mamba_cache_size, s.max_running_requests) == ("A", 1, 1)


def test_a_family_without_an_extra_buffer_under_auto() -> None:
    """0.5.14-0.5.15.post1 leave KimiLinear out of the extra-buffer architectures
    (``_support_mamba_cache_extra_buffer``): auto resolves to no_buffer and turns overlap off itself (3
    slots, no refusal for the overlap flag); with a paged KV cache SGLang then refuses that no_buffer, and
    the line says it came from auto; an explicit extra_buffer is refused for the architecture."""
    kimi = replace(PRESET, family="kimi_linear")
    auto = make(geometry=kimi, sglang_version="0.5.14")
    assert (auto.slots_per_request(), auto.strategy_label) == (3, "strategy no_buffer (auto)")
    with pytest.raises(FlagError) as paged:
        make(geometry=kimi, sglang_version="0.5.14", page_size=16).slots_per_request()
    assert str(paged.value).startswith(
        "--mamba-radix-cache-strategy auto (no_buffer: no extra buffer for kimi_linear) needs --page-size 1, "
        "got 16: SGLang 0.5.14 refuses it at startup"
    )
    with pytest.raises(FlagError) as explicit:
        make(
            geometry=kimi, sglang_version="0.5.14", mamba_radix_cache_strategy="extra_buffer"
        ).slots_per_request()
    assert str(explicit.value) == (
        "--mamba-radix-cache-strategy extra_buffer for a kimi_linear model: SGLang 0.5.14 has no extra "
        "buffer for that architecture and refuses it at startup (sglang/srt/server_args.py:4365 "
        'ServerArgs._validate_mamba_extra_buffer: "extra_buffer is not supported for ..."); use no_buffer'
    )
    assert make(geometry=kimi, sglang_version="0.5.16").slots_per_request() == 4  # 0.5.16 gives it one


def test_stage_slices_and_linear_layer_counts_at_pp_8() -> None:
    """Spec section 2's example (L = 93, P = 8, the last 93 % 8 = 5 ranks one layer more) and section 3's
    linear layers per stage [9, 8, 8, 9, 9, 9, 9, 8] of 69: what each stage's report says it holds."""
    stages = derive_all(make())
    assert [(s.start_layer, s.end_layer) for s in stages] == [
        (0, 11),
        (11, 22),
        (22, 33),
        (33, 45),
        (45, 57),
        (57, 69),
        (69, 81),
        (81, 93),
    ]
    assert [s.stage_linear_layers for s in stages] == [9, 8, 8, 9, 9, 9, 9, 8]
    assert {(s.max_stage_linear_layers, s.total_linear_layers, s.per_req_bytes) for s in stages} == {
        (9, 69, PER_REQ)
    }
    assert {s.scale for s in stages} == {9 / 69}  # max-share: the busiest stage's share, a Python float


def test_a_partition_that_does_not_fit_is_refused_before_any_stage_derives() -> None:
    """SGLANG_PP_LAYER_PARTITION must hold P parts summing to L (spec section 2): refused when the inputs
    are built, so no rank reports numbers for a layout that cannot start."""
    with pytest.raises(LayoutError, match="SGLANG_PP_LAYER_PARTITION"):
        make(partition_env="46,47")


@pytest.mark.parametrize("rank", [8, -1])
def test_a_stage_outside_the_pipeline_is_a_layout_error(rank: int) -> None:
    """pp_rank 8 of 8 stages (or -1) is no stage: a LayoutError, never another stage's numbers (a
    negative index would silently read the last stage)."""
    with pytest.raises(LayoutError, match=rf"^pp_rank {rank} outside \[0, 8\)$"):
        derive_stage(make(), rank)


REFUSED_INPUTS = [
    # id, overrides, the one line a user reads
    (
        "extra state before 0.5.22",
        {"geometry": replace(PRESET, extra_per_slot_bytes=1000), "sglang_version": "0.5.21"},
        "kimi-k3: extra_per_slot_bytes=1000 but SGLang 0.5.21 charges no per-slot extra state "
        "(extra_mamba_cache_bytes_per_req arrived in 0.5.22); drop it from the model spec or derive for "
        "0.5.22 or later",
    ),
    (
        "spec decoding without a request count",
        {"speculative_num_draft_tokens": 2},
        "--speculative-num-draft-tokens needs --max-running-requests: SGLang sizes the spec-decoding "
        "intermediate state from it (or give --speculative-algorithm, and the release picks its own)",
    ),
    (
        "token capacity without a context length",
        {"geometry": replace(TOY, context_len=None), "pp_size": 1, "token_capacity": 100_000},
        "toy: the model spec gives no context length, which SGLang's running-request estimate divides by; "
        'add "context_len" to the spec or pass --context-len',
    ),
    (
        "lazy before 0.5.13",
        {
            "geometry": replace(PRESET, family="qwen3_next"),
            "sglang_version": "0.5.12",
            "mamba_radix_cache_strategy": "extra_buffer_lazy",
        },
        "--mamba-radix-cache-strategy extra_buffer_lazy: SGLang 0.5.12 has no such strategy (its "
        "--mamba-scheduler-strategy takes auto, no_buffer, extra_buffer; lazy arrived in 0.5.13)",
    ),
    (
        "every family question of 0.5.5",
        {"geometry": TOY, "pp_size": 1, "sglang_version": "0.5.5", "dp_size": 2},
        "toy: SGLang 0.5.5 decides whether it has a state pool at all and whether --dp-size splits the pool "
        "and whether the radix cache is forced off by the model_type, and the model spec names none; add "
        '"model_type" (e.g. "qwen3_next") to the spec or pass the HF config',
    ),
    (
        "no dp question at dp 1",
        {"geometry": TOY, "pp_size": 1, "sglang_version": "0.5.5"},
        "toy: SGLang 0.5.5 decides whether it has a state pool at all and whether the radix cache is forced "
        'off by the model_type, and the model spec names none; add "model_type" (e.g. "qwen3_next") to the '
        "spec or pass the HF config",
    ),
    (
        "a family without a pool",
        {"geometry": replace(PRESET, family="kimi_linear"), "pp_size": 1, "sglang_version": "0.5.3.post2"},
        "kimi-k3: SGLang 0.5.3.post2 sizes a mamba state pool only for model_type qwen3_next, nemotron_h, "
        "falcon_h1, not kimi_linear; use a later release",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "line"), [c[1:] for c in REFUSED_INPUTS], ids=[c[0] for c in REFUSED_INPUTS]
)
def test_inputs_no_release_can_size_are_one_line_each(overrides: dict[str, Any], line: str) -> None:
    """What the user reads when the inputs cannot be sized at all: one line naming the input, why
    (the release's rule) and what to give instead."""
    with pytest.raises(FlagError) as exc:
        make(**overrides)
    assert str(exc.value) == line


def test_one_request_per_dp_worker_starts_before_0_5_23() -> None:
    """--max-running-requests 4 over dp 4 is one request a worker: every release starts it (only 0 a
    worker is refused before 0.5.23's floor)."""
    assert {
        s.max_running_requests
        for s in derive_all(make(sglang_version="0.5.22", max_running_requests=4, dp_size=4))
    } == {1}


STARTUP_REFUSAL_LINES = [
    # id, overrides, the whole line: the flag, SGLang's own assert, the way out
    (
        "no_buffer paged",
        {"mamba_radix_cache_strategy": "no_buffer", "page_size": 16, "disable_overlap_schedule": True},
        "--mamba-radix-cache-strategy no_buffer needs --page-size 1, got 16: SGLang 0.5.23 refuses it at "
        'startup ("no_buffer only supports page_size=1"); use --page-size 1, or extra_buffer for a paged KV '
        "cache",
    ),
    (
        "no_buffer with overlap",
        {"mamba_radix_cache_strategy": "no_buffer"},
        "--mamba-radix-cache-strategy no_buffer needs --disable-overlap-schedule: SGLang 0.5.23 refuses "
        'no_buffer with the overlap schedule on ("no_buffer do not support overlap schedule"), even under '
        "pp > 1 where it turns overlap off later; add --disable-overlap-schedule",
    ),
    (
        "lazy with spec on 0.5.16",
        {
            "pp_size": 1,
            "sglang_version": "0.5.16",
            "mamba_radix_cache_strategy": "extra_buffer_lazy",
            "speculative_num_draft_tokens": 2,
            "max_running_requests": 8,
        },
        "--speculative-num-draft-tokens 2 with --mamba-radix-cache-strategy extra_buffer_lazy: SGLang 0.5.16 "
        'refuses it at startup ("extra_buffer_lazy unsupported with spec."); use extra_buffer, or SGLang '
        "0.5.17 or later",
    ),
    (
        "page size not dividing the track interval",
        {"page_size": 3},
        "--page-size 3 does not divide mamba_track_interval 256 (SGLang's default): SGLang 0.5.23 refuses it "
        "with --mamba-radix-cache-strategy auto (resolved to extra_buffer) at startup (asserts "
        "mamba_track_interval % page_size == 0); use a page size that divides 256 (1, 2, 4, ..., 256)",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "line"), [c[1:] for c in STARTUP_REFUSAL_LINES], ids=[c[0] for c in STARTUP_REFUSAL_LINES]
)
def test_startup_refusal_lines_say_the_way_out(overrides: dict[str, Any], line: str) -> None:
    """The whole line of each startup refusal: the flag as typed, SGLang's own assert text (what the
    user finds in SGLang's log) and the way out."""
    with pytest.raises(FlagError) as exc:
        make(**overrides).slots_per_request()
    # Each quotes the release's own check with its file:line (tests/test_arg_checks.py holds those places
    # to the release's source), then the words and the way out.
    site = r"sglang/srt/[\w/]+\.py:\d+ [\w.]+: "
    assert re.search(site, str(exc.value)), str(exc.value)
    assert re.sub(site, "", str(exc.value)) == line


@pytest.mark.parametrize(
    ("budget", "spec", "K"),
    [
        (0.01, {}, -1),
        (0.01, {"speculative_num_draft_tokens": 3, "max_running_requests": 16}, -3),
        (None, {}, 0),
    ],
)
def test_a_pool_of_no_slots_is_the_state_pools_refusal(
    budget: float | None, spec: dict[str, Any], K: int
) -> None:
    """K <= 0 is SGLang's "not enough memory for the state pool", with K as SGLang computes it (floor
    division, so negative below one slot): at 0.01 GiB B = 3,579,139.41 bytes, (B - 37,969,920) //
    37,969,920 = floor(-0.906) = -1; with D = 3 (4 slots) (B - 4 x 37,969,920) // (1.75 x 37,969,920) =
    floor(-2.23) = -3. At B = 1.5 slots exactly (rest = 4.5 x 37,969,920 bytes) K = 0: still the pool's
    refusal, not the running-request one."""
    rest = budget if budget is not None else 4.5 * SPR9 / GIB
    with pytest.raises(
        BudgetError, match=f"not enough memory for the state pool: --budget-gib {rest} gives K={K} "
    ):
        derive_stage(make(budget_gib=rest, **spec), 0)


def test_the_kv_refusal_names_the_pool_that_took_the_budget() -> None:
    """An explicit pool of 100,000 slots (+ 1 padding slot from 0.5.17) of 37,969,920 bytes is far
    more than 8 GiB: the line names the slots charged, the bytes each and the branch, and the way out."""
    with pytest.raises(BudgetError) as exc:
        derive_all(make(max_mamba_cache_size=100_000))
    msg = str(exc.value)
    assert msg.startswith("the state pool (100001 slots x 37969920 bytes, branch A) leaves -")
    assert msg.endswith(
        "for the KV cache on stage 0, and SGLang 0.5.23 needs more than 0; lower --max-mamba-cache-size or "
        "--max-running-requests, or raise the budget"
    )


def test_an_empty_stage_refusal_says_what_to_change() -> None:
    with pytest.raises(LayoutError) as exc:
        derive_all(make(policy="own-share", partition_env="0,12,12,12,12,12,12,21"))
    assert str(exc.value) == (
        "stage 0 holds no linear layers, so --policy own-share charges it 0 bytes per request and SGLang "
        "cannot auto-fit its pool (it asserts a positive charge); use max-share, another partition, or "
        "--max-mamba-cache-size"
    )


@pytest.mark.parametrize(("T", "hint"), [(None, False), (2, False), (1, True)])
def test_the_token_capacity_is_named_only_when_it_is_short(T: int | None, hint: bool) -> None:
    """K = 2 slots at P = 1 but a request needs 5: no running request fits. Raising --token-capacity is
    advice only where T // 2 is 0 (T = 1); at T = 2 one request's worth of tokens exists and only the
    budget helps."""
    rest = 3 * 3.5 * PER_REQ / GIB  # B = 3.5 * per_req at r = 0.5 -> K = int(2.5) = 2
    kw: dict[str, Any] = {} if T is None else {"token_capacity": T, "context_len": 1024}
    with pytest.raises(BudgetError) as exc:
        derive_stage(make(pp_size=1, budget_gib=rest, **kw), 0)
    assert str(exc.value) == (
        "budget too small for one running request on stage 0: K=2 state slots but each request needs 5; "
        "raise --budget-gib" + (" or --token-capacity" if hint else "")
    )


def test_spec_reservation_caps_requests_by_whole_pool_slots() -> None:
    """Branch A, D = 2, --max-running-requests 16, K = 42 at 4 slots a request: the reservation covers
    min(16, 42 // 4) + 1 = 11 requests (floor division: 10.5 requests is 10), 11 x 2 x 37,969,920 bytes;
    KV left: 8 GiB - (43 + 22) x 37,969,920 = 6,121,889,792 bytes; max_running_requests min(16, 10)."""
    s = derive_stage(
        make(speculative_num_draft_tokens=2, max_running_requests=16, max_mamba_cache_size=42), 0
    )
    assert (s.max_mamba_cache_size, s.max_running_requests) == (42, 10)
    assert s.intermediate_state_bytes == 22 * SPR9
    assert s.kv_budget_gib * GIB == 6_121_889_792


def test_spec_decoding_with_a_per_slot_extra_state() -> None:
    """0.5.23 auto-fit with D = 3, --max-running-requests 16 and an extra state of 69 MiB per request,
    scaled by 9/69 to 9,437,184 bytes a slot, at 8.0625 GiB (B = 2,885,681,152 bytes): K = (B - 4 x
    37,969,920 - 9,437,184) // (1.75 x 37,969,920 + 9,437,184) = floor(35.90) = 35 (the extra state once in
    the padding term, once per slot); reservation min(16, 35 // 4) + 1 = 9 requests x 3 drafts; KV left
    8.0625 GiB - 27 x 37,969,920 - 36 x 47,407,104 = 5,925,199,872 bytes."""
    g = replace(PRESET, extra_per_slot_bytes=69 * 2**20)
    s = derive_stage(
        make(geometry=g, budget_gib=8.0625, speculative_num_draft_tokens=3, max_running_requests=16), 0
    )
    assert (s.extra_per_slot_bytes, s.max_mamba_cache_size, s.max_running_requests) == (9 * 2**20, 35, 8)
    assert s.intermediate_state_bytes == 27 * SPR9
    assert s.kv_budget_gib * GIB == 5_925_199_872


@pytest.mark.parametrize("version", ["0.5.7", "0.5.8", "0.5.9", "0.5.10"])
def test_scheduler_era_extra_buffer_asserts_the_page_size(version: str) -> None:
    """0.5.7-0.5.13.post1 _handle_mamba_radix_cache: extra_buffer asserts mamba_track_interval (256) %
    page_size == 0, from the first release with the strategy on; page 16 starts (3 + 2 slots at P = 1)."""
    qwen = replace(PRESET, family="qwen3_next")
    kw: dict[str, Any] = dict(
        geometry=qwen, pp_size=1, sglang_version=version, mamba_radix_cache_strategy="extra_buffer"
    )
    with pytest.raises(
        FlagError, match=f"^--page-size 3 does not divide mamba_track_interval 256 .*SGLang {version}"
    ):
        make(**kw, page_size=3).slots_per_request()
    assert make(**kw, page_size=16).slots_per_request() == 5
