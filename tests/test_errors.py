"""How an error line quotes a value (``checker.core.errors.shorten``): short values whole, long ones cut
with their length said, integers too long to print described by their size. Every refusal quotes the value
the user gave through this, so a message is one readable line whatever was pasted."""

from __future__ import annotations

import pytest

from checker.core.errors import CheckerInputError, json_kind, printable, shorten


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2**128 - 1, "340282366920938463463374607431768211455"),  # 128 bits: printed whole
        (2**128, "<an integer of about 39 digits>"),  # 129 bits (39 digits): described
        (10**1000, "<an integer of about 1,001 digits>"),  # past Python's 4,300-digit str() limit too
        (10**5000, "<an integer of about 5,001 digits>"),
    ],
    ids=["128-bits", "129-bits", "1001-digits", "5001-digits"],
)
def test_huge_integers_are_described_by_their_size(value: int, shown: str) -> None:
    assert shorten(value) == shown


def test_a_value_at_the_limit_is_whole_and_one_past_is_cut() -> None:
    assert shorten([1, 2, 3], limit=9) == "[1, 2, 3]"
    assert shorten([1, 2, 3], limit=8) == "[1, 2..."  # 5 characters and "...": 8 in all
    # A string is cut in the middle at any limit, as at the default one: both ends stay readable.
    assert shorten("ab" * 40, limit=20) == "'ababab...bababab' (80 chars)"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ([0, 1, 2, 3], "[0, 1, 2, 3]"),  # nothing left out: no count
        (list(range(7)), "[0, 1, 2, 3, 4, 5, ...] (7 entries)"),
        (tuple(range(10)), "(0, 1, 2, 3, 4, 5, ...) (10 entries)"),
        ({"a": 1, "b": 2, "c": 3, "d": 4}, "{'a': 1, 'b': 2, 'c': 3, ...} (4 entries)"),
    ],
)
def test_a_collection_says_how_many_entries_only_when_some_are_left_out(value: object, shown: str) -> None:
    assert shorten(value) == shown


@pytest.mark.parametrize(
    ("value", "cut"),
    [
        ("a" * 56, False),  # quoted, 58 characters: the limit, shown whole
        ("a" * 57, True),  # quoted, 59
        ("a" * 58, True),
        ("\n" * 28, False),  # 28 escapes, quoted: 58 characters
        ("\n" * 29, True),  # 29 escapes: 60 characters quoted, though the string is only 29 long
        ("\x00" * 14, False),
        ("\x00" * 15, True),
    ],
)
def test_a_string_cut_short_always_says_its_length(value: str, cut: bool) -> None:
    """Whenever the quote leaves characters out ("..."), the line says how long the value was; a value
    shown whole carries no count. 57 and 58 characters, and short strings of escapes, are cut by their
    quoted length (quotes and backslashes count) past 58 characters."""
    shown = shorten(value)
    if cut:
        assert "..." in shown and shown.endswith(f" ({len(value):,} chars)"), shown
        assert len(shown.removesuffix(f" ({len(value):,} chars)")) <= 58
    else:
        assert shown == repr(value)


def test_a_longer_limit_quotes_more_of_a_string() -> None:
    """A caller that allows 120 characters (an installed package's unreadable metadata) gets them: 100
    characters whole, 200 cut to the limit with the length said."""
    assert shorten("x" * 100, 120) == repr("x" * 100)
    cut = shorten("x" * 200, 120)
    assert cut.endswith(" (200 chars)") and len(cut.removesuffix(" (200 chars)")) <= 120
    assert cut.count("x") > 100


def test_a_long_string_is_one_short_line_with_its_length() -> None:
    shown = shorten("a" * 50_000_000)
    assert shown.endswith(" (50,000,000 chars)") and len(shown) < 80


def test_printable_escapes_only_what_would_break_the_line() -> None:
    r"""A Windows-style path keeps its backslashes as typed; the newline after it is escaped as \n."""
    assert printable("C:\\models\\qwen\n") == "C:\\models\\qwen\\n"
    assert printable("dir\u202eevil") == "dir\\u202eevil"


def test_an_input_error_is_one_line() -> None:
    assert str(CheckerInputError("bad value\nin two lines")) == "bad value in two lines"


@pytest.mark.parametrize(
    ("value", "reads"),
    [
        (None, "null"),
        (True, "a boolean"),
        (5, "an integer"),
        ("x", "a string"),
        ([], "a list"),
        ({}, "an object"),
        (1.5, "a float"),
    ],
)
def test_a_json_value_is_named_by_its_kind_with_its_article(value: object, reads: str) -> None:
    """Every refusal of a config value of the wrong kind says what it found ("not an integer", never
    "a int"); True is a boolean, not an integer, although bool is an int in Python."""
    assert json_kind(value) == reads
