"""checker.argspec: a parser read once as plain data, the one reader of argparse's insides (cli/ for the
checker's parser, launch/ for SGLang's). Real argparse parsers, no fakes."""

from __future__ import annotations

import argparse

import pytest

from checker.argspec import read_parser


class _Loud(argparse._StoreAction):  # a release's own action may act on every occurrence
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--dtype", choices=["auto", "fp8"], default="auto")
    p.add_argument("--fast", action="store_true")
    p.add_argument("--slow", action="store_false")
    p.add_argument("--log", action="append")
    p.add_argument("--loud", action=_Loud)
    p.add_argument("--mode", action="store_const", const="x")
    p.set_defaults(extra=7)
    return p


def test_each_option_reads_as_data_with_its_kind_and_aliases() -> None:
    spec = read_parser(_parser())
    kinds = {o.dest: (o.kind, o.exact, o.last_wins, o.boolean, o.appends) for o in spec.options}
    assert kinds == {
        "help": ("help", True, False, False, False),
        "tp_size": ("store", True, True, False, False),
        "dtype": ("store", True, True, False, False),
        "fast": ("store_true", True, True, True, False),
        "slow": ("store_false", True, True, True, False),
        "log": ("append", True, False, False, True),
        "loud": ("store", False, False, False, False),  # a subclass: its kind, never last-wins
        "mode": ("store_const", True, True, False, False),
    }
    assert spec.by_string["--tp"] is spec.by_string["--tp-size"]
    tp = spec.by_string["--tp"]
    assert (tp.strings, tp.type, tp.default, tp.nargs) == (("--tp-size", "--tp"), int, 1, None)
    assert spec.by_string["--dtype"].choices == ["auto", "fp8"]
    assert spec.subparsers == {}


def test_accepts_is_argparses_own_type_and_choices() -> None:
    spec = read_parser(_parser())
    assert spec.accepts(spec.by_string["--tp"], "4")
    assert not spec.accepts(spec.by_string["--tp"], "four")
    assert spec.accepts(spec.by_string["--dtype"], "fp8")
    assert not spec.accepts(spec.by_string["--dtype"], "fp4")


def test_given_is_what_the_words_set_and_leaves_the_parser_as_it_was() -> None:
    parser = _parser()
    spec = read_parser(parser)
    before = vars(parser.parse_args([]))
    assert spec.given(["--tp", "2", "--fast", "--dtype=auto"]) == {"tp_size", "fast", "dtype"}
    assert spec.given([]) == set()  # set_defaults' extra is a default, not given
    assert vars(parser.parse_args([])) == before
    with pytest.raises(SystemExit):
        spec.given(["--tp", "x"])
    assert vars(parser.parse_args([])) == before  # restored after a refusal too


def test_negative_numbers_and_subcommands() -> None:
    plain = read_parser(_parser())
    assert plain.negative_number is not None and plain.negative_number.match("-1.5")
    odd = argparse.ArgumentParser()
    odd.add_argument("-1", dest="one", action="store_true")  # now "-1" is a flag, never a value
    assert read_parser(odd).negative_number is None

    top = argparse.ArgumentParser()
    sub = top.add_subparsers(dest="command")
    check = sub.add_parser("check")
    assert read_parser(top).subparsers == {"check": check}
