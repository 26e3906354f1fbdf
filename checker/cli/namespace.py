"""The checker's own parsed flags, as the CLI layer holds them: the one place an ``argparse.Namespace`` is
changed after parsing (argparse's insides, for what a word set, are read in :mod:`checker.argspec`).

Below this layer nothing changes a Namespace: the launch merge is a function of the flags and the launch
command (:func:`checker.launch.merge.merge_launch`), applied here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from checker.argspec import read_parser
from checker.core.releases.releases import installed_sglang_version
from checker.launch.merge import LaunchInputs, merge_launch


def given_dests(parser: argparse.ArgumentParser, words: Sequence[str]) -> set[str]:
    """The dests of the checker flags the user gave, in any spelling argparse accepts (``--tp 2``,
    ``--tp-size=2``, an alias): :meth:`checker.argspec.ParserSpec.given`."""
    return read_parser(parser).given(words)


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
