"""The pp x tp layout rule: tp is the inner dimension, as SGLang ranks it (pp_rank = rank // tp_size)."""

from __future__ import annotations

import pytest

from checker.core.errors import LayoutError
from checker.core.sizing.layout import layout


@pytest.mark.parametrize(
    ("world", "tp", "pp", "expected"),
    [
        (8, 1, None, [(8, r) for r in range(8)]),
        (8, 2, None, [(4, r // 2) for r in range(8)]),  # ranks 0-1 are stage 0, 2-3 stage 1, ...
        (16, 8, 2, [(2, 0)] * 8 + [(2, 1)] * 8),
        (1, 1, None, [(1, 0)]),
    ],
)
def test_tp_is_the_inner_dimension(world, tp, pp, expected):
    got = [layout(world, r, pp_size=pp, tp_size=tp) for r in range(world)]
    assert got == expected
    # Integers (8 // 2, not 8 / 2 = 4.0): the pp size sizes ranges, slices and wire rows.
    assert all(type(p) is int and type(k) is int for p, k in got)


@pytest.mark.parametrize(("world", "tp", "pp"), [(8, 2, 3), (4, 1, 8)])
def test_a_world_that_is_not_pp_x_tp_is_refused(world, tp, pp):
    with pytest.raises(LayoutError, match=f"world_size {world} is not pp_size x tp_size = {pp} x {tp};"):
        layout(world, 0, pp_size=pp, tp_size=tp)


def test_without_pp_size_a_world_that_is_no_multiple_of_tp_is_refused_without_inventing_a_pp_size():
    """No "pp_size x tp_size = ? x 4": the user gave no --pp-size, so the rule that failed is named."""
    with pytest.raises(LayoutError) as info:
        layout(6, 0, pp_size=None, tp_size=4)
    assert str(info.value).startswith("world_size 6 is not a multiple of the TP group, tp_size 4; ")
    assert "?" not in str(info.value)


@pytest.mark.parametrize(
    ("world", "tp", "dp", "pp", "expected"),
    [
        # SGLang's --tp-size 2 with 2-way attention DP: one TP group of 2 ranks, attention TP 1.
        (2, 1, 2, None, [(1, 0), (1, 0)]),
        (2, 1, 2, 1, [(1, 0), (1, 0)]),
        # pp 2 x --tp-size 4 with attention DP 2: ranks 0-3 stage 0, 4-7 stage 1.
        (8, 2, 2, 2, [(2, 0)] * 4 + [(2, 1)] * 4),
        (8, 2, 2, None, [(2, 0)] * 4 + [(2, 1)] * 4),
    ],
)
def test_attention_dp_is_inside_the_tp_group(world, tp, dp, pp, expected):
    """SGLang's world is pp x its --tp-size; the checker's --tp-size is the attention TP width (that
    --tp-size over the attention DP size), so the group is tp x dp."""
    assert [layout(world, r, pp_size=pp, tp_size=tp, dp_size=dp) for r in range(world)] == expected


@pytest.mark.parametrize(
    ("world", "tp", "dp", "pp", "message"),
    [
        (
            4,
            1,
            2,
            1,
            "world_size 4 is not pp_size x tp_size = 1 x 2 (attention TP 1 x attention DP 2); "
            "launch pp x tp ranks (e.g. --nproc-per-node 2) or fix --pp-size/--tp-size/--dp-size",
        ),
        (
            6,
            2,
            2,
            None,
            "world_size 6 is not a multiple of the TP group, tp_size 4 (attention TP 2 x "
            "attention DP 2); launch a multiple of 4 ranks (pp x tp, e.g. --nproc-per-node 4) or fix "
            "--tp-size/--dp-size",
        ),
    ],
)
def test_a_refusal_under_attention_dp_names_the_whole_group(world, tp, dp, pp, message):
    with pytest.raises(LayoutError) as info:
        layout(world, 0, pp_size=pp, tp_size=tp, dp_size=dp)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("world", "tp", "pp", "nproc"),
    [(8, 2, 3, 6), (4, 1, 8, 8), (6, 4, None, 4), (12, 5, 2, 10)],
)
def test_the_refusal_suggests_the_world_the_flags_ask_for(world, tp, pp, nproc):
    """The way out names pp x tp ranks (tp alone when --pp-size is not given)."""
    with pytest.raises(LayoutError, match=rf"--nproc-per-node {nproc}\)"):
        layout(world, 0, pp_size=pp, tp_size=tp)
