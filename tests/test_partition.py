"""Stage slices (sglang/srt/distributed/utils.py ``get_pp_indices``): which global layers pipeline rank k
holds.

A wrong slice shifts a stage's linear-layer count, and with it the share max-share and own-share charge.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from checker.core.errors import LayoutError
from checker.core.sizing.partition import default_partition, stage_bounds, stage_partition
from checker.families.geometry import load_geometry


def test_spec_example_l93_p8_gives_the_last_five_ranks_the_extra_layer() -> None:
    """L=93, P=8 (the kimi-k3 preset's slices, docs/how-it-computes.md "The upstream claim, measured":
    Layout); ``get_pp_indices`` gives the LAST 93 % 8 = 5 ranks the extra layer, so the extra layers going
    to the FIRST ranks would show as 12-layer slices at the front."""
    assert stage_bounds(stage_partition(93, 8)) == [
        (0, 11),
        (11, 22),
        (22, 33),
        (33, 45),
        (45, 57),
        (57, 69),
        (69, 81),
        (81, 93),
    ]


def _compositions(L: int, P: int) -> Iterator[tuple[int, ...]]:
    """Every way to cut L layers into P contiguous, non-empty slices (slice sizes in stage order)."""
    for cuts in itertools.combinations(range(1, L), P - 1):
        edges = (0, *cuts, L)
        yield tuple(b - a for a, b in zip(edges, edges[1:], strict=False))


@pytest.mark.parametrize("L", range(1, 15))
def test_default_rule_is_the_one_even_split_with_the_extra_layers_last(L: int) -> None:
    """Brute force over every way to cut L <= 14 layers into P slices: exactly one split is as even as
    possible (sizes differ by at most 1) with the larger slices on the LAST ranks (sizes never shrink
    towards the end), and the default rule gives that one. Extra layers on the first ranks, uneven
    slices, or slices that overlap or leave a gap show as another split."""
    for P in range(1, L + 1):
        even_extra_last = [
            sizes
            for sizes in _compositions(L, P)
            if max(sizes) - min(sizes) <= 1 and list(sizes) == sorted(sizes)
        ]
        assert len(even_extra_last) == 1, (L, P, even_extra_last)
        assert default_partition(L, P) == even_extra_last[0]
        bounds = stage_bounds(stage_partition(L, P))
        assert bounds[0][0] == 0 and bounds[-1][1] == L
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # contiguous
        assert tuple(e - s for s, e in bounds) == even_extra_last[0]


@pytest.mark.parametrize(
    ("L", "P", "bounds"),
    [
        # Worked by hand: base L // P, the last L % P ranks one more.
        (48, 4, [(0, 12), (12, 24), (24, 36), (36, 48)]),
        (52, 3, [(0, 17), (17, 34), (34, 52)]),  # two of 17, then 18
        (27, 5, [(0, 5), (5, 10), (10, 15), (15, 21), (21, 27)]),  # 5 x 3, then two of 6
        (64, 6, [(0, 10), (10, 20), (20, 31), (31, 42), (42, 53), (53, 64)]),  # 10 x 2, then four of 11
        (11, 4, [(0, 2), (2, 5), (5, 8), (8, 11)]),  # 2, then three of 3
        (7, 7, [(k, k + 1) for k in range(7)]),
        (10, 1, [(0, 10)]),
    ],
)
def test_default_rule_on_larger_models(L: int, P: int, bounds: list[tuple[int, int]]) -> None:
    assert stage_bounds(stage_partition(L, P)) == bounds


def test_partition_env_sets_the_slices() -> None:
    """SGLANG_PP_LAYER_PARTITION decides the slices when set: rank k holds [sum(parts[:k]), +parts[k])."""
    parts = stage_partition(93, 8, "12,12,12,12,12,12,12,9")
    assert parts == (12, 12, 12, 12, 12, 12, 12, 9)
    assert stage_bounds(parts) == [
        (0, 12),
        (12, 24),
        (24, 36),
        (36, 48),
        (48, 60),
        (60, 72),
        (72, 84),
        (84, 93),
    ]


def test_partition_env_is_ignored_at_pp_size_1() -> None:
    """SGLang ignores the env at P == 1; honouring it would reject a valid single-stage launch."""
    assert stage_partition(93, 1, "40,53") == (93,)
    assert stage_partition(93, 1, "nonsense") == (93,)


def test_linear_layers_per_stage_of_the_preset() -> None:
    """The kimi-k3 preset (docs/how-it-computes.md, "The upstream claim, measured": Model, Layout) holds
    [9, 8, 8, 9, 9, 9, 9, 8] linear layers per stage at P=8; the max-share scale 9/69 rests on this."""
    g = load_geometry(model="kimi-k3")
    ids = {i for i in range(93) if (i + 1) % 4 != 0 and i <= 90}
    assert set(g.linear_layer_ids) == ids and len(ids) == 69
    counts = [g.linear_layers_in(s, e) for s, e in stage_bounds(stage_partition(93, 8))]
    assert counts == [9, 8, 8, 9, 9, 9, 9, 8]
    # Written out for the last stage [81, 93): 81 82 84 85 86 88 89 90 (83, 87 attention; 91, 92 too).
    assert sum(1 for i in range(81, 93) if i in ids) == 8


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("1,2", "'1,2'"),  # wrong length
        ("12,12,12,12,12,12,12,12", "sums to 96"),  # wrong sum
        ("a,b,c,d,e,f,g,h", "'a,b,c,d,e,f,g,h'"),  # not integers
        ("11.5,11,11,12,12,12,12,12", "11.5"),  # not integers
        ("11,11,,12,12,12,12,23", "11,11,,12"),  # empty entry
        ("-1,12,12,12,12,12,12,22", "negative"),  # negative count
    ],
)
def test_bad_partition_env_is_a_layout_error_naming_the_value(value: str, needle: str) -> None:
    """A partition SGLang would reject must be rejected here too, with the value in the message."""
    with pytest.raises(LayoutError, match="SGLANG_PP_LAYER_PARTITION") as info:
        stage_partition(93, 8, value)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("99999999999999999999,1,1,1,1,1,1,1", "99999999999999999999 layers"),  # huge entry
        ("9" * 5000 + ",1,1,1,1,1,1,1", "5,000 characters"),  # past int()'s 4,300-digit limit
        ("-5,14,14,14,14,14,14,14", "negative layer count (-5"),  # sums to 93: only the sign is wrong
        ("1e1,12,12,12,12,12,12,11", "'1e1'"),  # not an integer literal
        ("0x0c,12,12,12,12,12,12,9", "'0x0c'"),
        ("\t,12,12,12,12,12,12,9", "entry 0"),  # whitespace-only entry
        ("12 12,12,12,12,12,12,12,9", "'12 12'"),  # space inside an entry
        ("", "set but empty"),
        ("   ", "set but empty"),
        (",".join(["1"] * 100_000), "100,000 entries"),  # a huge value: counted, quoted shortened
    ],
)
def test_hostile_partition_values_are_one_short_layout_error(value: str, needle: str) -> None:
    """Every malformed SGLANG_PP_LAYER_PARTITION ends in one LayoutError quoting the value (shortened),
    never a ValueError from int() or a message as long as the value."""
    with pytest.raises(LayoutError) as info:
        stage_partition(93, 8, value)
    msg = str(info.value)
    assert needle in msg and msg.startswith("SGLANG_PP_LAYER_PARTITION=")
    assert "\n" not in msg and len(msg) < 400, msg


@pytest.mark.parametrize(
    "value", [" 12, 12,12,12,12,12,12, 9 ", "12,12,12,12,12,12,12,9\n", "+12,12,12,12,12,12,12,9"]
)
def test_partition_entries_are_read_as_sglang_reads_them(value: str) -> None:
    """SGLang's get_pp_indices reads ``int(x) for x in value.split(",")``, and int() strips padding and takes
    a sign: refusing these would call a deployment broken that SGLang boots."""
    assert stage_partition(93, 8, value) == (12, 12, 12, 12, 12, 12, 12, 9)


@pytest.mark.parametrize("pp_size", [0, -1, 94])
def test_pp_size_outside_1_to_L_is_a_layout_error(pp_size: int) -> None:
    """L < P (and P < 1) has no valid slicing; the message names the pp size."""
    with pytest.raises(LayoutError, match=f"--pp-size {pp_size}"):
        stage_partition(93, pp_size)


@pytest.mark.parametrize(
    ("pp_size", "value", "parts"),
    [
        (2, "3,1", (3, 1)),  # honoured from pp 2 on, not only above it
        (2, "4,0", (4, 0)),  # one stage may hold every layer: an entry equal to L is allowed
        (2, "0,4", (0, 4)),
        (3, "1,0,3", (1, 0, 3)),
    ],
)
def test_partition_env_at_its_edges_is_honoured(pp_size: int, value: str, parts: tuple[int, ...]) -> None:
    """SGLang's get_pp_indices applies the env at any pp size above 1 and takes any counts from 0 to L
    that sum to L; refusing "4,0" or ignoring the env at pp 2 would call a deployment broken that boots,
    or derive slices it does not use."""
    assert stage_partition(4, pp_size, value) == parts


def test_partition_entry_length_bound_is_32_characters() -> None:
    """An entry is refused for its length only past 32 characters (padding and a sign included), so a
    padded count SGLang's int() reads is still accepted at exactly 32."""
    at_bound = " " * 30 + "12"
    assert stage_partition(24, 2, f"{at_bound},12") == (12, 12)
    with pytest.raises(LayoutError, match="entry 0 is 33 characters long"):
        stage_partition(24, 2, f" {at_bound},12")


@pytest.mark.parametrize("pp_size", [True, 2.0, "2"])
def test_pp_size_must_be_an_int(pp_size: object) -> None:
    """True is not a pp size of 1, nor 2.0 or "2" one of 2: a caller passing them gets the rule."""
    with pytest.raises(LayoutError, match="must be a positive integer"):
        stage_partition(93, pp_size)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "way_out"),
    [
        ("", "give 2 layer counts summing to 24, or unset it"),
        ("x,24", "give 2 layer counts summing to 24, or unset it"),
        ("25,0", "give 2 layer counts summing to 24, or unset it"),
        ("1,2,21", "give one layer count per stage, or unset it"),
    ],
)
def test_partition_refusals_say_the_way_out(value: str, way_out: str) -> None:
    """Each refusal ends in what to do instead (the rule with the model's numbers filled in)."""
    with pytest.raises(LayoutError) as info:
        stage_partition(24, 2, value)
    assert str(info.value).endswith(way_out), str(info.value)


def test_a_partition_that_is_not_text_is_refused_naming_it() -> None:
    with pytest.raises(LayoutError, match=r"SGLANG_PP_LAYER_PARTITION=\[12, 12\] must be a string"):
        stage_partition(24, 2, [12, 12])  # type: ignore[arg-type]
