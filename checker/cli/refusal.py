"""A command line its parser refused: the flags a rank still needs to take part in the run.

A rank of ``check`` or ``sweep`` whose command line fails still joins the others
(:func:`checker.commands.lifecycle.refuse`): it needs the flags that say how to meet them (``--backend``,
``--timeout-s``, ``--init-method``) and where the verdict is published (``--report``, ``--junit``,
``--format``, ``--quiet``). :func:`group_flags` reads them as the command's own parser does: the same
option strings, so the same abbreviations (``--timeout 5 --back gloo --rep r.json``) and ``--flag=value``
forms, and each of these flags through its own type and choices; every other flag takes its values as
text without a check, and what the parser does not know is left over (``parse_known_args``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from checker.argspec import OptionSpec, read_parser
from checker.commands.lifecycle import GroupFlags
from checker.config import OutputOptions
from checker.distributed.launch_env import GroupOptions
from checker.launch.inputs import READ_OPTIONS, run_inputs

GROUP_DESTS = ("backend", "timeout_s", "init_method")
OUTPUT_DESTS = ("report", "junit", "format", "quiet")
INPUT_DESTS = tuple(READ_OPTIONS)
UNREADABLE_BACKEND = "(unreadable)"
"""The backend of a command line that cannot even be split into flags: this rank cannot know which
backend its peers use, so it takes part through the store only (its refusal names it)."""


class _Unreadable(Exception):
    """The command line cannot be split into flags even leniently (an ambiguous abbreviation, a flag
    missing its value)."""


class _Lenient(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Unreadable(message)


def group_flags(
    parser: argparse.ArgumentParser, words: Sequence[str], launch: Sequence[str] | None = None
) -> GroupFlags:
    """The group and output flags of ``words`` (a command's flags, without the command's name), read
    with ``parser``'s options, and what the run reads (``--model-config``, ``--init-method`` and the
    launch command's model: no output may replace one). A value the flag itself refuses takes the
    flag's default (the refusal says why), except ``--backend``, kept as typed: a guess (auto is NCCL on
    a GPU node, gloo on its peers) could mismatch the others' group, so an unknown backend makes this
    rank take part through the store only. Nothing readable at all: every default, and the backend
    unknown."""
    lenient = _Lenient(add_help=False, allow_abbrev=parser.allow_abbrev, prefix_chars=parser.prefix_chars)
    wanted: dict[str, OptionSpec] = {}
    for i, action in enumerate(read_parser(parser).options):
        if not action.strings:
            continue  # a positional is left over with the rest
        dest = action.dest if action.dest in (*GROUP_DESTS, *OUTPUT_DESTS, *INPUT_DESTS) else f"other_{i}"
        if dest == action.dest:
            wanted[dest] = action
        if action.nargs == 0:
            lenient.add_argument(*action.strings, dest=dest, action="store_true", default=None)
        elif action.appends:  # --weights-from-log A --weights-from-log B
            lenient.add_argument(*action.strings, dest=dest, action="append", default=None)
        else:
            lenient.add_argument(*action.strings, dest=dest, nargs=action.nargs, default=None)
    try:
        parsed, _ = lenient.parse_known_args(list(words))
    except _Unreadable:
        inputs = run_inputs(launch=launch)
        return GroupFlags(group=GroupOptions(backend=UNREADABLE_BACKEND), inputs=tuple(inputs))
    got = {dest: _value(action, getattr(parsed, dest)) for dest, action in wanted.items()}
    defaults = GroupOptions()
    # What the run reads, as given (a --model-config or --init-method its flag refused is still a path
    # no output may replace).
    inputs = run_inputs(launch=launch, **{dest: getattr(parsed, dest, None) for dest in INPUT_DESTS})
    return GroupFlags(
        group=GroupOptions(
            backend=getattr(parsed, "backend", None) or defaults.backend,
            timeout_s=got.get("timeout_s", defaults.timeout_s),
            init_method=got.get("init_method"),
        ),
        output=OutputOptions(
            report=got.get("report"),
            junit=got.get("junit"),
            format=got.get("format") or "text",
            quiet=bool(got.get("quiet")),
        ),
        inputs=tuple(inputs),
    )


def _value(action: OptionSpec, raw: Any) -> Any:
    """``raw`` (text, or True for a switch given) as ``action`` would store it; its default when not
    given or when the flag refuses it."""
    if raw is None:
        return action.default
    if action.nargs == 0:
        return action.const if action.const is not None else True
    try:
        value = action.type(raw) if callable(action.type) else raw
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return action.default
    if action.choices is not None and value not in action.choices:
        return action.default
    return value
