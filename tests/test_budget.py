"""The memory handed to the state-pool sizing (``total_rest_memory``), per release group.

Expected values are worked by hand from each release's ``_profile_available_bytes`` and
``get_available_gpu_memory`` (utils/common.py), or computed by torch itself (the float32 tensor SGLang
all-reduces), never by the code under test.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from checker.core.errors import BudgetError, FlagError
from checker.core.sizing.budget import (
    MISSING,
    agreed_budget_gib,
    agreed_free_gib,
    float32,
    pre_capture_activation_reserve_mb,
    sizing_budget,
)

GIB = 2**30


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**50))
def test_float32_round_trip_matches_torch(free_bytes: int) -> None:
    """SGLang: ``torch.tensor(free_gpu_memory, dtype=torch.float32)`` then ``.item()``."""
    assert float32(float(free_bytes)) == torch.tensor(free_bytes, dtype=torch.float32).item()


def test_agreed_free_memory_worked_examples() -> None:
    """float32 keeps 24 significant bits: at 2**36 bytes the spacing is 8192 bytes.
    85,899,345,921 -> 85,899,345,920 (80 GiB exactly); 81,000,000,000 -> 9,887,695 * 8192 =
    80,999,997,440 -> 75.43712615966797 GiB. The MIN over both is the second."""
    assert agreed_free_gib([85_899_345_921]) == 80.0
    assert agreed_free_gib([85_899_345_921, 81_000_000_000]) == 80_999_997_440 / GIB == 75.43712615966797
    with pytest.raises(BudgetError):
        agreed_free_gib([])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 2**42), min_size=1, max_size=8), st.floats(0.05, 1.0))
def test_agreed_budget_is_the_min_all_reduce_of_float32(free: list[int], fraction: float) -> None:
    """The check command's budget: torch's MIN over float32 tensors, in GiB, times the fraction."""
    t = torch.tensor(free, dtype=torch.float64).to(torch.float32).min().item() / GIB
    want = torch.tensor(t, dtype=torch.float32).item() * fraction
    assert agreed_budget_gib(free, free[0], fraction=fraction, agree=True) == want
    # A rank that reported nothing is left out; without agreement a rank keeps its own figure.
    assert agreed_budget_gib([*free, MISSING], free[0], fraction=fraction, agree=True) == want
    own = torch.tensor(free[-1], dtype=torch.float32).item() / GIB * fraction
    assert agreed_budget_gib(free, free[-1], fraction=fraction, agree=False) == own


def test_slack_budget_0_5_15() -> None:
    """0.5.14-0.5.15.post1: rest = available - pre * (1 - mfs). 80 GiB free, 20 GiB of weights, mfs 0.9:
    80 * (1 - 0.9) = 80 * 0.09999999999999998 = 7.999999999999998; 60 - 7.999999999999998 = 52.0."""
    b = sizing_budget("0.5.15", free_before_gib=80.0, weights_gib=20.0, mem_fraction_static=0.9)
    assert b.budget_gib == 52.0
    assert "free_after 60 - free_before 80 * (1 - 0.9)" in b.formula and "\n" not in b.formula
    with pytest.raises(FlagError, match="0.5.16"):
        sizing_budget(
            "0.5.15",
            free_before_gib=80.0,
            weights_gib=20.0,
            mem_fraction_static=0.9,
            pre_capture_reserve_mb=10240,
        )


def test_pre_capture_reserve_from_0_5_16() -> None:
    """0.5.16+: the slack is max(pre * (1 - mfs), reserve / 1024) when the KV pool is sized after graph
    capture: max(7.999999999999998, 10240 / 1024 = 10) = 10 -> 60 - 10 = 50."""
    b = sizing_budget(
        "0.5.16",
        free_before_gib=80.0,
        weights_gib=20.0,
        mem_fraction_static=0.9,
        pre_capture_reserve_mb=10240,
    )
    assert b.budget_gib == 50.0
    # A reserve below the static slack changes nothing: max(7.999..., 4) -> 52.
    assert (
        sizing_budget(
            "0.5.17",
            free_before_gib=80.0,
            weights_gib=20.0,
            mem_fraction_static=0.9,
            pre_capture_reserve_mb=4096,
        ).budget_gib
        == 52.0
    )
    with pytest.raises(FlagError, match="0.5.18"):
        sizing_budget(
            "0.5.17", free_before_gib=80.0, weights_gib=20.0, mem_fraction_static=0.9, mm_reservation_gb=1.5
        )


def test_multimodal_reservation_from_0_5_18() -> None:
    """0.5.18+: rest = available - slack - mm_reservation_gb: 60 - 10 - 1.5 = 48.5."""
    b = sizing_budget(
        "0.5.23",
        free_before_gib=80.0,
        weights_gib=20.0,
        mem_fraction_static=0.9,
        pre_capture_reserve_mb=10240,
        mm_reservation_gb=1.5,
    )
    assert b.budget_gib == 48.5 and "multimodal reservation 1.5" in b.formula


def test_weights_filling_the_static_budget_do_not_start() -> None:
    """ "Loaded weights leave no GPU memory for the KV cache": 80 GiB free, 73 GiB of weights, mfs 0.9:
    7 - 7.999999999999998 < 0. 72 GiB leaves 8 - 7.999999999999998 = 1.8e-15 GiB, which SGLang accepts."""
    with pytest.raises(BudgetError, match="leave no memory"):
        sizing_budget(None, free_before_gib=80.0, weights_gib=73.0, mem_fraction_static=0.9)
    assert sizing_budget(None, free_before_gib=80.0, weights_gib=72.0, mem_fraction_static=0.9).budget_gib > 0


@pytest.mark.parametrize(
    "bad",
    [
        {"mem_fraction_static": 0.0},
        {"mem_fraction_static": 1.5},
        {"weights_gib": -1.0},
        {"weights_gib": float("nan")},
    ],
)
def test_bad_inputs_are_flag_errors(bad: dict) -> None:
    kw = dict(free_before_gib=80.0, weights_gib=20.0, mem_fraction_static=0.9) | bad
    with pytest.raises(FlagError):
        sizing_budget(None, **kw)


def test_pre_capture_activation_reserve_worked() -> None:
    """runtime_context.py pre_capture_activation_reserve_mb: 512 + tokens * 1.5 + tp * pp / 8 * 1024,
    at least 10 GiB on a device above 60 GiB. chunked prefill 8192, tp 8, pp 1, H200 (141 GiB):
    512 + 12288 + 1024 = 13824. 2048 tokens, tp 1, pp 1, 40 GiB device: 512 + 3072 + 128 = 3712; the
    same on an 80 GiB device is raised to 10240. Chunked prefill off: max(max_prefill_tokens, 2048)."""
    assert (
        pre_capture_activation_reserve_mb(
            gpu_mem_mb=141 * 1024, tp_size=8, pp_size=1, chunked_prefill_size=8192
        )
        == 13824
    )
    assert (
        pre_capture_activation_reserve_mb(
            gpu_mem_mb=40 * 1024, tp_size=1, pp_size=1, chunked_prefill_size=2048
        )
        == 3712
    )
    assert (
        pre_capture_activation_reserve_mb(
            gpu_mem_mb=80 * 1024, tp_size=1, pp_size=1, chunked_prefill_size=2048
        )
        == 10240
    )
    assert (
        pre_capture_activation_reserve_mb(
            gpu_mem_mb=None, tp_size=1, pp_size=1, chunked_prefill_size=-1, max_prefill_tokens=4096
        )
        == 512 + 6144 + 128
    )


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"weights_gib": -1.0}, "--weights-gib -1.0 must be a finite number of GiB >= 0"),
        ({"weights_gib": True}, "--weights-gib True must be a finite number of GiB >= 0"),
        ({"free_before_gib": float("inf")}, "free memory inf must be a finite number of GiB >= 0"),
        ({"mem_fraction_static": True}, "--mem-fraction-static True must be in (0, 1]"),
        ({"mem_fraction_static": 1.0 + 2**-52}, "--mem-fraction-static 1.0000000000000002 must be in (0, 1]"),
    ],
)
def test_bad_budget_inputs_name_the_value_and_the_rule(kw: dict, message: str) -> None:
    """The refusal quotes which input, the value given and the rule; True is not a number of GiB."""
    args = dict(free_before_gib=80.0, weights_gib=20.0, mem_fraction_static=0.9) | kw
    with pytest.raises(FlagError) as info:
        sizing_budget(None, **args)
    assert str(info.value) == message


def test_budget_inputs_at_their_edges_are_accepted() -> None:
    """No weights (0 GiB, e.g. a draft-free dry run) and --mem-fraction-static 1 are inputs SGLang
    takes: 80 GiB free, nothing loaded, all of it static: 80 - 80 * 0 = 80 GiB."""
    assert (
        sizing_budget(None, free_before_gib=80.0, weights_gib=0.0, mem_fraction_static=1.0).budget_gib == 80.0
    )
    assert (
        sizing_budget(None, free_before_gib=8.0, weights_gib=0.5, mem_fraction_static=0.5).budget_gib == 3.5
    )


def test_exactly_nothing_left_does_not_start() -> None:
    """8 GiB free, 4 GiB of weights, --mem-fraction-static 0.5: 4 - 8 * 0.5 = 0 exactly, and SGLang's
    ``if rest_memory <= 0`` refuses it (0 is not a KV budget); a hair more weights the same."""
    with pytest.raises(BudgetError, match=r"= 0 GiB; SGLang refuses to start"):
        sizing_budget(None, free_before_gib=8.0, weights_gib=4.0, mem_fraction_static=0.5)


def test_the_release_a_refusal_names_is_the_one_derived_for() -> None:
    """A pre-capture reserve on 0.5.15, or a multimodal reservation on 0.5.17, is refused naming that
    release (not the newest), which is what the user must change."""
    with pytest.raises(FlagError, match=r"^SGLang 0\.5\.15 has no pre-capture reserve"):
        sizing_budget(
            "0.5.15",
            free_before_gib=80.0,
            weights_gib=20.0,
            mem_fraction_static=0.9,
            pre_capture_reserve_mb=1,
        )
    with pytest.raises(FlagError, match=r"^SGLang 0\.5\.17 takes no multimodal reservation") as info:
        sizing_budget(
            "0.5.17", free_before_gib=80.0, weights_gib=20.0, mem_fraction_static=0.9, mm_reservation_gb=1.5
        )
    assert str(info.value).endswith("(it arrived in 0.5.18); drop it")
    with pytest.raises(FlagError) as info:
        sizing_budget(
            "0.5.15",
            free_before_gib=80.0,
            weights_gib=20.0,
            mem_fraction_static=0.9,
            pre_capture_reserve_mb=1,
        )
    assert str(info.value).endswith("(it arrived in 0.5.16); drop it")


def test_a_budget_sglang_refuses_quotes_sglangs_words_and_the_way_out() -> None:
    """The user greps the server's log for SGLang's own message, then needs to know what to change."""
    with pytest.raises(BudgetError) as info:
        sizing_budget(None, free_before_gib=80.0, weights_gib=79.0, mem_fraction_static=0.9)
    msg = str(info.value)
    assert '"Loaded weights leave no GPU memory for the KV cache"' in msg
    assert msg.endswith("raise --mem-fraction-static or lower the weights")
    with pytest.raises(BudgetError, match=r"^no free-memory figure to agree on \(every rank missing\)$"):
        agreed_free_gib([])


# Worked by hand from SGLang's runtime_context.py pre_capture_activation_reserve_mb (the docstring's
# formula): tokens = decode server ? max(running * (draft tokens or 1), 2048) : chunked prefill > 0 ?
# max(chunked, 2048) : max(max_prefill_tokens (16384 by default), 2048); 512 + tokens * 1.5 +
# tp * pp / 8 * 1024 MB, at least 10240 MB on a device of more than 60 GiB.
RESERVE_CASES = [
    # a decode server: its running requests times the draft tokens, at least 2048 tokens
    (dict(decode_running_requests=1024, speculative_num_draft_tokens=4), 512 + 4096 * 1.5 + 128),
    (dict(decode_running_requests=1500), 512 + 2048 * 1.5 + 128),
    (dict(decode_running_requests=100, speculative_num_draft_tokens=4), 512 + 2048 * 1.5 + 128),
    (dict(decode_running_requests=3000), 512 + 3000 * 1.5 + 128),
    # chunked prefill off (-1 or 0): max_prefill_tokens, at least 2048
    (dict(chunked_prefill_size=-1), 512 + 16384 * 1.5 + 128),
    (dict(chunked_prefill_size=0, max_prefill_tokens=4096), 512 + 4096 * 1.5 + 128),
    (dict(chunked_prefill_size=-1, max_prefill_tokens=1024), 512 + 2048 * 1.5 + 128),
    # a chunk of one token is still chunked prefill
    (dict(chunked_prefill_size=1), 512 + 2048 * 1.5 + 128),
    # tp 2 x pp 4: 2 * 4 / 8 * 1024
    (dict(tp_size=2, pp_size=4), 512 + 2048 * 1.5 + 1024),
    # exactly 60 GiB is not "more than 60 GiB"; 10 MB more is
    (dict(gpu_mem_mb=60 * 1024), 512 + 2048 * 1.5 + 128),
    (dict(gpu_mem_mb=60 * 1024 + 10), 10240),
]


@pytest.mark.parametrize(("kw", "reserve"), RESERVE_CASES)
def test_pre_capture_activation_reserve_by_case(kw: dict, reserve: float) -> None:
    args = dict(gpu_mem_mb=None, tp_size=1, pp_size=1, chunked_prefill_size=2048) | kw
    assert pre_capture_activation_reserve_mb(**args) == reserve


def test_the_formula_line_shows_every_term() -> None:
    """The one-line formula a report prints carries every term taken off, with the numbers."""
    b = sizing_budget(
        "0.5.23",
        free_before_gib=80.0,
        weights_gib=20.0,
        mem_fraction_static=0.9,
        pre_capture_reserve_mb=10240,
        mm_reservation_gb=1.5,
    )
    assert b.formula == (
        "total_rest_memory = free_after 60 - max(free_before 80 * (1 - 0.9), pre-capture reserve 10240 MB "
        "/ 1024) - multimodal reservation 1.5 = 48.5 GiB (0.5.23)"
    )
