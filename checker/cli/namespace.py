"""The checker's own parsed flags, as the CLI layer holds them: the one place an ``argparse.Namespace`` is
changed after parsing, and argparse's internals are read for the checker's parser (what a word set).

Below this layer nothing changes a Namespace: the launch merge is a function of the flags and the launch
command (:func:`checker.launch.merge.merge_launch`), applied here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from checker.core.releases.releases import installed_sglang_version
from checker.launch.merge import LaunchInputs, merge_launch


def given_dests(parser: argparse.ArgumentParser, words: Sequence[str]) -> set[str]:
    """The dests of the checker flags the user gave, in any spelling argparse accepts (``--tp 2``,
    ``--tp-size=2``, an alias): ``words`` parsed again with every default suppressed, so a dest is
    present exactly when a word set it (argparse cannot tell "given" from "defaulted" otherwise)."""
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


def apply_launch_command(
    args: argparse.Namespace, launch: Sequence[str], *, given: set[str]
) -> tuple[argparse.Namespace, LaunchInputs]:
    """``args`` with the launch command's sizing inputs in place (:func:`merge_launch`: one given in both
    places must agree), and what the report records of the launch command."""
    merged = merge_launch(
        vars(args),
        launch,
        given=frozenset(given),
        env=os.environ,
        installed=installed_sglang_version(),
    )
    for key, value in merged.values.items():
        setattr(args, key, value)
    return args, merged.launch
