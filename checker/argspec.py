"""An argparse parser as plain data: the one module that reads argparse's insides.

What a parser knows of its options lives in argparse's private members (``_actions``,
``_option_string_actions``, the classes ``_StoreTrueAction``, ...). The checker needs it for two
parsers: its own (which words set which flag, "did you mean", the flags a refused command line still
gives) in cli/, and SGLang's launch parser (its flag table, repeated flags collapsed, the --config
merger's switches) in launch/. :func:`read_parser` reads a parser once into a :class:`ParserSpec`; the
rest of the package reads that, and asks it the two things only argparse itself can answer (does a
value pass a flag's type and choices; which flags did these words set).

It stands at the bottom of the layers (tests/test_layers.py), torch-free and importing no checker
module, so that launch/ (below cli/) and cli/ use the same one; tests/test_config_as_data.py allows
argparse's private names here and nowhere else.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

_KINDS: dict[type[argparse.Action], str] = {
    argparse._StoreAction: "store",
    argparse._StoreConstAction: "store_const",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
    argparse._SubParsersAction: "parsers",
    argparse._ExtendAction: "extend",
    argparse.BooleanOptionalAction: "boolean_optional",
}
"""argparse's own action classes by the name ``add_argument(action=...)`` gives them."""


def _kind(action: argparse.Action) -> tuple[str, bool]:
    """(the argparse action ``action`` is or derives from, "custom" for none; whether it is exactly
    that class): a release's subclass may act on every occurrence where argparse's own does not."""
    cls = type(action)
    if cls not in _KIND_OF:
        base = next((c for c in cls.__mro__ if c in _KINDS), None)
        _KIND_OF[cls] = ("custom", False) if base is None else (_KINDS[base], base is cls)
    return _KIND_OF[cls]


_KIND_OF: dict[type, tuple[str, bool]] = {}
""":func:`_kind` per action class, once."""


class OptionSpec(NamedTuple):
    """One argument of a parser (an option, or a positional with no option strings), as plain data: one
    object per argument of one :class:`ParserSpec` (a tuple: reading a parser of 500 arguments costs a
    fraction of a millisecond, a frozen dataclass twice that)."""

    position: int
    """Its place among the parser's arguments."""
    strings: tuple[str, ...]
    """Its option strings (``("--tp-size", "--tp")``); empty for a positional."""
    dest: str
    nargs: int | str | None
    kind: str
    """``store``, ``store_true``, ``append``, ``help``, ``parsers``, ... (see :data:`_KINDS`), or
    ``custom`` for a class of the parser's own."""
    exact: bool
    """It is argparse's own class for its kind, not a subclass (which may act differently)."""
    type: Any
    choices: Any
    default: Any
    const: Any
    required: bool

    @property
    def boolean(self) -> bool:
        """A switch: ``store_true`` or ``store_false`` (or a subclass)."""
        return self.kind in ("store_true", "store_false")

    @property
    def appends(self) -> bool:
        """Each occurrence adds to a list: ``append`` (``extend`` derives from it)."""
        return self.kind in ("append", "extend")

    @property
    def last_wins(self) -> bool:
        """argparse's own store, store_true, store_false or store_const: a later occurrence replaces an
        earlier one, and nothing else happens."""
        return self.exact and self.kind in ("store", "store_const", "store_true", "store_false")


@dataclass(frozen=True, eq=False)
class ParserSpec:
    """What a parser knows of its arguments, read once by :func:`read_parser`."""

    options: tuple[OptionSpec, ...]
    """Every argument, in the order added (positionals too)."""
    by_string: Mapping[str, OptionSpec]
    """Each option string (every alias) -> its argument."""
    prefix_chars: str
    fromfile_prefix_chars: str | None
    allow_abbrev: bool
    negative_number: re.Pattern[str] | None
    """The pattern of a negative number when the parser reads one as a value (it has no option that
    looks like one: argparse's own rule); None when such a word is always an option."""
    subparsers: Mapping[str, argparse.ArgumentParser]
    """The subcommands' parsers by name (empty for a parser without subcommands)."""
    parser: argparse.ArgumentParser

    def accepts(self, option: OptionSpec, value: str) -> bool:
        """Whether argparse takes ``value`` for ``option`` (its type conversion and choices)."""
        try:
            self.parser._get_values(self.parser._actions[option.position], [value])
        except Exception:
            return False
        return True

    def given(self, words: Sequence[str]) -> set[str]:
        """The dests that ``words`` set, in any spelling argparse accepts (``--tp 2``, ``--tp-size=2``, an
        alias): ``words`` parsed again with every default suppressed, so a dest is present exactly when a
        word set it (argparse cannot tell "given" from "defaulted" otherwise). The parser is left as it
        was; argparse's refusal of ``words`` propagates."""
        parser = self.parser
        saved = [(a, a.default, a.required) for a in parser._actions]
        saved_defaults = dict(parser._defaults)
        try:
            for action in parser._actions:
                action.default, action.required = argparse.SUPPRESS, False
            parser._defaults.clear()
            return set(vars(parser.parse_args(list(words))))
        finally:
            for action, default, required in saved:
                action.default, action.required = default, required
            parser._defaults.update(saved_defaults)


def read_parser(parser: argparse.ArgumentParser) -> ParserSpec:
    """``parser`` as a :class:`ParserSpec` (read now: an argument added later is not in it)."""
    options: list[OptionSpec] = []
    of_action: dict[int, OptionSpec] = {}
    subparsers: dict[str, argparse.ArgumentParser] = {}
    for i, a in enumerate(parser._actions):
        kind, exact = _kind(a)
        option = OptionSpec(
            position=i,
            strings=tuple(a.option_strings),
            dest=a.dest,
            nargs=a.nargs,
            kind=kind,
            exact=exact,
            type=a.type,
            choices=a.choices,
            default=a.default,
            const=a.const,
            required=bool(a.required),
        )
        options.append(option)
        of_action[id(a)] = option
        if kind == "parsers" and not subparsers:
            subparsers = dict(a.choices or {})
    negative = getattr(parser, "_negative_number_matcher", None)
    reads_negative = getattr(parser, "_has_negative_number_optionals", True) == []
    return ParserSpec(
        options=tuple(options),
        by_string={s: of_action[id(a)] for s, a in parser._option_string_actions.items()},
        prefix_chars=parser.prefix_chars,
        fromfile_prefix_chars=parser.fromfile_prefix_chars,
        allow_abbrev=parser.allow_abbrev,
        negative_number=negative if negative is not None and reads_negative else None,
        subparsers=subparsers,
        parser=parser,
    )
