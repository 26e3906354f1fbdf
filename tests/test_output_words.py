"""Every line the user reads is true as written: no ``?`` standing in for a value, no doubled word, no
flag that neither the checker nor the launch command's parser defines.

A set of scenarios (each one-cause difference of tests/test_one_cause.py, scanned there with
:func:`problems`, plus the error shapes here: a layout
that does not fit the world, a bad partition on some ranks or on all, a budget from the device, ranks
that do not agree on it) is derived in-process through the real per-rank derivation; every rendering a
run writes (the summary line, text, markdown, JSON, JUnit, the one-line status) is scanned.
"""

from __future__ import annotations

import functools
import json
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from unittest import mock

import pytest
from test_one_cause import BASE, KIMI, Case, Node, _env, _rank_row

from checker.outputs.report import one_line, to_json, to_junit, to_markdown, to_text
from checker.preflight.verdict import decide

PARTITION = "SGLANG_PP_LAYER_PARTITION"
FRACTION = ("--mem-fraction-static", "0.9")
DEVICE = (*KIMI, "--pp-size", "4", "--budget-from-device", *FRACTION, "--device-free-gib", "10")

EXTRA: dict[str, Case] = {
    "pp x tp is not the world": Case("", Node(argv=(*KIMI, "--budget-gib", "8", "--pp-size", "3")), Node()),
    "bad partition on ranks 2-3": Case("", Node(), Node(env=((PARTITION, "1,2,3"),))),
    "bad partition everywhere": Case(
        "", Node(env=((PARTITION, "1,2,3"),)), Node(env=((PARTITION, "1,2,3"),))
    ),
    "budget from the device": Case("", Node(argv=DEVICE), Node(argv=DEVICE)),
    "budget not agreed": Case(
        "",
        Node(argv=(*DEVICE, "--no-agree-budget")),
        Node(argv=(*DEVICE[:-1], "12", "--no-agree-budget")),
    ),
    "too small a budget on ranks 2-3": Case(
        "", Node(), Node(argv=(*KIMI, "--budget-gib", "0.05", "--pp-size", "4"))
    ),
    "a release the checker models on ranks 2-3 only": Case(
        "", Node(), Node(argv=(*BASE, "--sglang-version", "0.5.16"))
    ),
}  # fmt: skip


@functools.cache
def _known_flags() -> frozenset[str]:
    """Every option string of the checker's parsers, of every tabled release's server parser and of
    torchrun (the messages say how to launch the ranks)."""
    import argparse

    from torch.distributed.run import get_args_parser

    from checker.cli.main import build_parser
    from checker.launch.flags import ACTIONS

    flags: set[str] = set()
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for a in sub._actions:
                    flags.update(a.option_strings)
        flags.update(action.option_strings)
    for row in ACTIONS:
        flags.update(row[0].split())
    for a in get_args_parser()._actions:
        flags.update(a.option_strings)
    return frozenset(flags)


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
LONE_QUESTION = re.compile(r"(?:^|[\s(=,;])\?(?:$|[\s),;])")
DOUBLED = re.compile(r"\b([A-Za-z]+) \1\b", re.IGNORECASE)


def _strings(doc: object) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from _strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _strings(v)


def _junit_strings(xml: str) -> Iterator[str]:
    for el in ET.fromstring(xml).iter():
        yield from el.attrib.values()
        if el.text:
            yield el.text


def rendered(case: Case, rows: list, v) -> dict[str, list[str]]:  # noqa: ANN001 - a Verdict
    """Every line each rendering of the verdict ``v`` on ``rows`` (``case``'s) shows, by rendering."""
    from checker.cli.main import _subparser, build_parser, join_negative_values, with_default_command
    from checker.cli.namespace import apply_launch_command, given_dests
    from checker.commands.check_config import config_from_args
    from checker.outputs.check_run import summary_line

    words = join_negative_values(with_default_command(list(case.same.argv)))
    parser = build_parser()
    args = parser.parse_args(words)
    args.launch = None
    if case.same.launch is not None:
        given = given_dests(_subparser(parser, "check"), words[1:])
        # read in the node's environment, as the node reads it (SGLANG_ENABLE_PP_SPEC decides start-up)
        with mock.patch.dict(os.environ, dict(case.same.env)):
            args, args.launch = apply_launch_command(args, list(case.same.launch), given=given)
    config = config_from_args(args, _env(0))
    # The summary line as rank 0 writes it.
    summary = summary_line(config, rows[0], world_size=_env(0).world_size, backend="gloo")
    doc = to_json(v, extra={})
    return {
        "text": to_text(v, summary=summary, elapsed_s=1.0).splitlines(),
        "markdown": to_markdown(v, summary=summary).splitlines(),
        "one line": [one_line(v)],
        "json": [line for s in _strings(json.loads(json.dumps(doc))) for line in s.splitlines()],
        "junit": [line for s in _junit_strings(to_junit(v, elapsed_s=1.0)) for line in s.splitlines()],
    }


def problems(lines_by_rendering: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(rendering, what, line) for every lone ``?``, doubled word and unknown flag."""
    known = _known_flags()
    bad = []
    for where, lines in lines_by_rendering.items():
        for line in lines:
            if LONE_QUESTION.search(line):
                bad.append((where, "placeholder ?", line))
            for m in DOUBLED.finditer(line):
                bad.append((where, f"doubled {m.group(0)!r}", line))
            for flag in FLAG.findall(line):
                if flag not in known:
                    bad.append((where, f"no such flag {flag}", line))
    return bad


@pytest.mark.parametrize("scenario", list(EXTRA))
def test_no_placeholder_doubled_word_or_unknown_flag(scenario: str, tmp_path, monkeypatch) -> None:
    """The error shapes here; every one-cause scenario is scanned by tests/test_one_cause.py's test."""
    case = EXTRA[scenario]
    rows = [_rank_row(case.same if r < 2 else case.odd, r, tmp_path, monkeypatch) for r in range(4)]
    bad = problems(rendered(case, rows, decide(rows, world_size=4)))
    assert not bad, "\n".join(map(str, bad))


def test_the_scanner_sees_each_defect() -> None:
    """The three patterns catch the defects this file guards against (as they once read)."""
    assert LONE_QUESTION.search("world 3 = pp ? x tp 1, gloo; kimi-k3, budget ? GiB (--budget-gib)")
    assert DOUBLED.search("SGLang newest modelled (newest modelled; SGLang not installed)") is None
    assert DOUBLED.search("the the model")
    assert "--derived-as" not in _known_flags() and FLAG.findall("ranks 2-3 have --derived-as=x") == [
        "--derived-as"
    ]
