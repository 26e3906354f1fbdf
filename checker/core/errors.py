"""The one error family the core raises for problems a user can fix (exit code 2 in every command)."""

from __future__ import annotations

import reprlib

SHOWN_CHARS = 60
"""How much of a value a message quotes: a 50 MB string must not become a 50 MB error line."""

# reprlib never walks past these bounds, so quoting a list of a million ids costs a few entries.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxstring = 2, 3, SHOWN_CHARS - 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = 6
_REPR.maxlong = _REPR.maxother = SHOWN_CHARS


def shorten(value: object, limit: int = SHOWN_CHARS) -> str:
    """A bounded ``repr(value)`` for messages, saying how long the value was when it is cut."""
    if isinstance(value, int) and value.bit_length() > 128:
        # repr() of an int past 4300 digits raises ValueError (Python's int/str limit).
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits>"
    text = _REPR.repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    # reprlib cuts a string once its quoted repr, not the string, passes maxstring (57 characters do,
    # and so can 30 characters full of escapes): ask as it does, on a bounded slice.
    if isinstance(value, str) and len(repr(value[: _REPR.maxstring])) > _REPR.maxstring:
        return f"{text} ({len(value):,} chars)"
    if isinstance(value, (list, tuple, dict)) and len(value) > _REPR.maxdict:
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
