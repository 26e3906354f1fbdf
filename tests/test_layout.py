"""The pp x tp layout rule: tp is the inner dimension, as SGLang ranks it (pp_rank = rank // tp_size)."""

from __future__ import annotations

import pytest

from checker.core.errors import LayoutError
from checker.core.layout import layout


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


@pytest.mark.parametrize(("world", "tp", "pp"), [(6, 4, None), (8, 2, 3), (4, 1, 8)])
def test_a_world_that_is_not_pp_x_tp_is_refused(world, tp, pp):
    with pytest.raises(LayoutError, match=f"world_size {world} is not pp_size x tp_size") as info:
        layout(world, 0, pp_size=pp, tp_size=tp)
    # --pp-size not given: the message says so rather than inventing one.
    assert f"= {pp or '?'} x {tp};" in str(info.value)


@pytest.mark.parametrize(
    ("world", "tp", "pp", "nproc"),
    [(8, 2, 3, 6), (4, 1, 8, 8), (6, 4, None, 4), (12, 5, 2, 10)],
)
def test_the_refusal_suggests_the_world_the_flags_ask_for(world, tp, pp, nproc):
    """The way out names pp x tp ranks (tp alone when --pp-size is not given)."""
    with pytest.raises(LayoutError, match=rf"--nproc-per-node {nproc}\)"):
        layout(world, 0, pp_size=pp, tp_size=tp)
