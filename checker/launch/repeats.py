"""Reading a launch command in time linear in its length (torch-free).

argparse's ``_parse_known_args`` finds the next option by scanning the index of every option in the
command (CPython's "consume Positionals and Optionals alternately" loop: a list comprehension over
``option_string_indices`` per option), so a command of n options costs O(n^2): 10,000 repetitions of
``--host x`` took 8.9 s, 20,000 took 28 s. And it resolves an abbreviation (``--hos``) by testing every
option string of the parser, about a thousand for a recent SGLang. A real launch command names each flag
once; a generated one may repeat some (a CI template appending overrides), and the last occurrence is
what the server uses.

:class:`OptionIndex` resolves a word to its flag the way argparse does (exact, ``--flag=value``, a unique
abbreviation), by dictionary and binary search. :func:`collapse_repeats` drops every occurrence of a plain
``store`` flag but its last, leaving exactly what argparse would make of the whole command:

* only flags whose action is argparse's own store / store_true / store_false / store_const (a release's
  custom action may count or act on every occurrence) and that take one value or none;
* only a unit argparse itself reads as one: the flag and, for a flag with a value, the next word when
  argparse reads it as a value (:meth:`OptionIndex.is_value`), or ``--flag=value``;
* only a unit followed by the end or by another flag, so the words around it are read exactly as before
  (a value-taking flag before it still meets a flag next);
* only a value the flag's own type and choices accept: a bad one stays, for argparse's own message.

What it leaves (custom actions, values that look like flags) is bounded by the launch command's length
limit (:data:`checker.launch.command.MAX_LAUNCH_WORDS`).
"""

from __future__ import annotations

import argparse
import bisect
from collections.abc import Sequence

from checker.argspec import OptionSpec, ParserSpec, read_parser

# nargs that take every following word, flags included: a word after such a flag may not move.
_READS_ALL = (argparse.REMAINDER, argparse.PARSER)


class OptionIndex:
    """A parser's option strings, for resolving words as argparse does without its linear scans."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.spec: ParserSpec = read_parser(parser)
        self.actions = self.spec.by_string
        self.long = sorted(o for o in self.actions if o.startswith("--"))
        # The reading below is argparse's for a parser of flags only; anything else is left to argparse.
        self.simple = (
            self.spec.prefix_chars == "-"
            and not self.spec.fromfile_prefix_chars
            and all(o.strings and o.nargs not in _READS_ALL for o in self.spec.options)
        )

    def prefixed(self, prefix: str) -> list[str]:
        """Up to two long option strings starting with ``prefix`` (two: ambiguous)."""
        i = bisect.bisect_left(self.long, prefix)
        return [o for o in self.long[i : i + 2] if o.startswith(prefix)]

    def resolve(self, word: str) -> tuple[OptionSpec | None, str | None]:
        """(the option ``word`` names, the value it carries after ``=``), as argparse's
        ``_parse_optional`` reads it; (None, None) for a word that is not one flag (a value, an unknown
        or ambiguous flag)."""
        if word in self.actions:
            return self.actions[word], None
        if not word.startswith("--") or len(word) < 3:
            return None, None
        name, eq, value = word.partition("=")
        if eq and name in self.actions:
            return self.actions[name], value
        if self.spec.allow_abbrev:
            matches = self.prefixed(name)
            if len(matches) == 1:
                return self.actions[matches[0]], value if eq else None
        return None, None

    def is_value(self, word: str) -> bool:
        """Whether argparse reads ``word`` as a value, never as a flag: it does not start with ``-``, or
        is a negative number in a parser without negative-number flags (argparse's own rule)."""
        if not word.startswith("-"):
            return True
        negative = self.spec.negative_number
        return bool(negative is not None and negative.match(word))

    def unknown(self, word: str) -> bool:
        """Whether argparse would reject ``word`` as an unrecognized flag: it starts with ``--``, names
        no flag, is no abbreviation of one (not even an ambiguous one), and holds no space."""
        if not word.startswith("--") or word == "--" or " " in word:
            return False
        name = word.split("=", 1)[0]
        if name in self.actions:
            return False
        if self.spec.allow_abbrev:
            return not self.prefixed(name)
        return True


def collapse_repeats(index: OptionIndex, args: Sequence[str]) -> list[str]:
    """``args`` without the earlier occurrences of repeated last-wins flags (see the module docstring)."""
    args = list(args)
    if not index.simple:
        return args
    # (action, start, end, value) per collapsible unit, in order.
    units: list[tuple[OptionSpec, int, int, str | None]] = []
    i, n = 0, len(args)
    while i < n:
        if args[i] == "--":
            break  # everything after it is a positional: argparse refuses it, as given
        action, value = index.resolve(args[i])
        if action is None or not action.last_wins or action.nargs not in (None, 0):
            i += 1
        elif value is not None:  # --flag=value
            if action.nargs is None:
                units.append((action, i, i + 1, value))
            i += 1
        elif action.nargs == 0:
            units.append((action, i, i + 1, None))
            i += 1
        elif i + 1 < n and index.is_value(args[i + 1]):
            units.append((action, i, i + 2, args[i + 1]))
            i += 2
        else:
            i += 1
    last = {id(action): start for action, start, _, _ in units}
    drop = bytearray(n)
    for action, start, end, value in units:
        if last[id(action)] == start:
            continue
        if end < n and index.resolve(args[end])[0] is None:
            continue  # the next word would be read differently without this unit before it
        if value is not None and not index.spec.accepts(action, value):
            continue  # argparse says why, in its own words
        drop[start:end] = b"\x01" * (end - start)
    return [w for w, d in zip(args, drop, strict=True) if not d]
