"""The argparse types of the checker's flags: a flag's text to its value, or one line saying why not.

Each refusal is an ``argparse.ArgumentTypeError`` the parser turns into one line and exit 2 (the flag as
typed, then the reason). Free of torch, like every flag module: ``--help`` and bad input cost no torch
import.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from checker.core.errors import SHOWN_CHARS, shorten
from checker.core.sizing.budget import MAX_BUDGET_GIB
from checker.core.sizing.server_args import MEM_FRACTION_STATIC, ServerArg
from checker.distributed.rendezvous import init_method_problem

MAX_GIB = MAX_BUDGET_GIB
"""1 PiB: far above any device or host, low enough that bytes = GiB * 2**30 stay exact in an int64."""
MAX_TIMEOUT_S = 86_400.0


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # also past Python's 4,300-digit limit; shorten: the line stays one short line
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not an integer") from None


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, with a one-line reason otherwise."""

    def parse(text: str) -> int:
        value = integer(text)
        if value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise argparse.ArgumentTypeError(f"{value} must be {what}")
        return value

    return parse


positive_int = int_at_least(1)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{shorten(text)} must be a finite number")
    return value


def bounded_float(
    *, low: float, high: float, low_inclusive: bool = False, what: str = ""
) -> Callable[[str], float]:
    """An argparse type: a finite number in (low, high] (or [low, high]), with a one-line reason."""

    def parse(text: str) -> float:
        value = finite_float(text)
        too_low = value < low if low_inclusive else value <= low
        if too_low or value > high:
            lo = "[" if low_inclusive else "("
            raise argparse.ArgumentTypeError(f"{text} must be in {lo}{low:g}, {high:,.0f}]{what}")
        return value

    return parse


def row_type(row: ServerArg) -> Callable[[str], object]:
    """An argparse type for a sizing input: the text read as the row's kind, then checked by the row
    (:mod:`checker.core.sizing.server_args`), so the flag refuses exactly what the typed config refuses."""

    def parse(text: str) -> object:
        value: object = text
        if row.kind is int:
            value = integer(text)
        elif row.kind is float:
            value = finite_float(text)
        problem = row.refusal(value, shown=text if len(text) <= SHOWN_CHARS else shorten(text))
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    return parse


# The edge: a GiB value from the command line (--budget-gib, --device-free-gib, ...) is checked here,
# once, and keeps its name (budget_gib) down to the row. CapacityInputs (checker.core.sizing.sizing) is the
# one validating constructor every derivation builds; for a value that came through here its check cannot
# fire, it is there for callers that are not the parser (code, a plan's search, a config file).
positive_gib = bounded_float(low=0, high=MAX_GIB, what=" GiB")
weights_gib = bounded_float(low=0, high=MAX_GIB, low_inclusive=True, what=" GiB")
"""--weights-gib: 0 is the explicit "no weights" (the figure is otherwise the model directory's)."""
unit_fraction = row_type(MEM_FRACTION_STATIC)
timeout_seconds = bounded_float(low=0, high=MAX_TIMEOUT_S, what=" seconds")


def gib_list(text: str) -> tuple[float, ...]:
    """GIB[,GIB...]: one or more positive GiB values."""
    values = tuple(positive_gib(part.strip()) for part in text.split(","))
    return values


def weights_gib_list(text: str) -> tuple[float, ...]:
    """--weights-gib GIB[,GIB...]: GiB values >= 0 (0: explicitly no weights)."""
    return tuple(weights_gib(part.strip()) for part in text.split(","))


def init_method(text: str) -> str:
    """--init-method: file:///path (a fresh file in an existing directory) or env://."""

    problem = init_method_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text
