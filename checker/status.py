"""Every status the checker reports and every exit code it returns, defined once (torch-free).

Two vocabularies, kept apart on purpose:

* the **verdict** of a whole run (``consistent`` ... ``model_drift``), its exit code, and the headline a
  person reads. ``launchers/read-verdict.sh`` maps the same names to the same codes; a test holds it
  to :data:`EXIT_CODES`.
* the **row status** one rank sends in its int64 row: ``ROW_OK``, an input error's
  :attr:`checker.core.errors.CheckerInputError.code` (1-5), or one of the codes below.
"""

from __future__ import annotations

CONSISTENT = "consistent"
DIVERGENT = "divergent"
ERROR = "error"
INFRASTRUCTURE_FAILURE = "infrastructure_failure"
MODEL_DRIFT = "model_drift"

EXIT_CODES: dict[str, int] = {
    CONSISTENT: 0,
    DIVERGENT: 1,
    ERROR: 2,  # bad input on some rank (also every usage error), SGLang missing or refusing the inputs
    INFRASTRUCTURE_FAILURE: 3,  # a rank died, hung or never arrived
    MODEL_DRIFT: 4,  # the builtin model and the installed SGLang derive different values
}
STATUSES = tuple(EXIT_CODES)
EXIT_USAGE = EXIT_CODES[ERROR]
EXIT_INTERRUPTED = 130
"""Ctrl-C in a single-process command, as shells report SIGINT."""
EXIT_BACKSTOP = EXIT_CODES[INFRASTRUCTURE_FAILURE]
"""A rank ended by its GIL-free backstop (:mod:`checker.distributed.backstop`): no verdict was reached, as
for a rank its watchdog ended. Where the backstop's timer cannot be made (no POSIX ``timer_create``),
CPython's faulthandler ends the rank instead, and it always exits 1."""


def exit_after_outputs(code: int, *, undelivered: bool) -> int:
    """The one policy for an output that could not be delivered (``--report``, ``--junit``, ``--plot``,
    the step summary, or stdout whose reader left), the same in every command: a run that would have
    passed exits ``error`` (2), so CI never reads a pass from a report that is not there; a failing
    verdict keeps its own code (1 divergent stays 1). The verdict still prints and every other output is
    still written; one line names what could not be."""
    return (code or EXIT_CODES[ERROR]) if undelivered else code


def undelivered_note(code: int) -> str:
    """What to add to the line naming an output not delivered when that changes the exit code: the
    verdict printed above it says "(exit 0)", and the run leaves with another code."""
    failed = exit_after_outputs(code, undelivered=True)
    return (
        f" (the verdict above stands, but the run exits {failed}: an output not delivered)"
        if failed != code
        else ""
    )


HEADLINE: dict[str, str] = {
    CONSISTENT: "CONSISTENT",
    DIVERGENT: "DIVERGENT",
    ERROR: "ERROR",
    INFRASTRUCTURE_FAILURE: "INFRASTRUCTURE FAILURE",
    MODEL_DRIFT: "MODEL DRIFT",
}

# Row statuses (one int64 slot of a rank's row). 1..5 are CheckerInputError codes (core/errors.py).
ROW_OK = 0
ROW_MATERIALIZE = 6
"""``--materialize`` found a failed allocation or a size that differs from the prediction."""
ROW_DRIFT = 98
"""``--engine both``: the builtin model and the installed SGLang derived different values on this rank."""
ROW_INTERNAL = 99
"""An unexpected exception on a rank (a bug, or a broken environment), still reported by every rank."""


def row_status_name(code: int) -> str:
    """A row status as the JSON report names it."""
    if code == ROW_OK:
        return "ok"
    if code == ROW_DRIFT:
        return MODEL_DRIFT
    return ERROR
