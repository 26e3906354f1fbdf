"""The one error family the core raises for problems a user can fix (exit code 2 in every command)."""

from __future__ import annotations

import functools
import reprlib

SHOWN_CHARS = 60
"""How much of a value a message quotes: a 50 MB string must not become a 50 MB error line."""


@functools.cache
def _repr(limit: int) -> reprlib.Repr:
    """A reprlib that quotes at most ``limit`` characters of a string. It never walks past its bounds,
    so quoting a list of a million ids costs a few entries."""
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxstring = 2, 3, limit - 2
    r.maxlist = r.maxtuple = r.maxset = 6
    r.maxlong = r.maxother = limit
    return r


def shorten(value: object, limit: int = SHOWN_CHARS) -> str:
    """A bounded ``repr(value)`` for messages, saying how long the value was when it is cut."""
    if isinstance(value, int) and value.bit_length() > 128:
        # repr() of an int past 4300 digits raises ValueError (Python's int/str limit).
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits>"
    r = _repr(limit)
    text = r.repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    # reprlib cuts a string once its quoted repr, not the string, passes maxstring (57 characters do,
    # and so can 30 characters full of escapes): ask as it does, on a bounded slice.
    if isinstance(value, str) and len(repr(value[: r.maxstring])) > r.maxstring:
        return f"{text} ({len(value):,} chars)"
    if isinstance(value, (list, tuple, dict)) and len(value) > r.maxdict:
        return f"{text} ({len(value):,} entries)" if "..." in text else text
    return text


def json_kind(value: object) -> str:
    """How a JSON value's kind reads in a message: "a string", "an integer", "null"."""
    if value is None:
        return "null"
    names = {
        bool: "a boolean",
        int: "an integer",
        str: "a string",
        list: "a list",
        dict: "an object",
        float: "a float",
    }
    return names.get(type(value), f"a {type(value).__name__}")


def printable(text: str) -> str:
    """``text`` as a terminal or CI log line may show it: control and format characters (a newline, NUL,
    a right-to-left override U+202E) escaped as Python writes them, so a user-given name can neither break
    the line nor reorder what is printed after it. Printable text is returned unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


MAX_WORD_CHARS = 200
"""The longest run of text without a space a one-line message quotes whole (a path of a deep tree fits)."""


def cut_long_words(text: str, limit: int = MAX_WORD_CHARS) -> str:
    """``text`` with every run of non-space characters longer than ``limit`` cut in the middle, saying how
    long it was: a message that quotes what a user typed (an unknown flag of 120,000 characters, a
    choice argparse refused) stays one readable line. Text without such a run is returned unchanged."""
    words = text.split(" ")
    if all(len(w) <= limit for w in words):
        return text
    return " ".join(
        w if len(w) <= limit else f"{w[: limit // 2]}...{w[-(limit // 4) :]} ({len(w):,} chars)"
        for w in words
    )


class CheckerInputError(ValueError):
    """A user-fixable input problem. The message is one line: the value seen, the rule, the way out.

    ``code`` is a small stable integer so ranks can exchange *which* error they hit as an int64.
    """

    code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message.replace("\n", " "))


class ConfigError(CheckerInputError):
    """The model config or model spec cannot be read or is missing a key."""

    code = 2


class LayoutError(CheckerInputError):
    """The parallel layout does not fit the model (pp size, tp size, partition)."""

    code = 3


class BudgetError(CheckerInputError):
    """The budget is invalid or too small for the state pool or one running request."""

    code = 4


class FlagError(CheckerInputError):
    """A flag value or a combination of flags SGLang rejects."""

    code = 5
