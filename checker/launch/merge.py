"""The deployment's launch command and the checker's own flags: one set of sizing inputs (torch-free).

``checker [OPTIONS] -- python -m sglang.launch_server ARGS``: the sizing inputs come from the launch
command as the release parses it (:mod:`checker.launch.command`). A sizing input given in both places
must agree, or the run stops with one line naming both; a translation that silently checks something
other than what runs is the drift this tool exists to catch.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from checker.core.errors import FlagError
from checker.core.releases import installed_sglang_version
from checker.core.server_args import LAUNCH_ARGS

# The launch command's inputs by the checker's name (LaunchCommand.values' keys): the rows of the table of
# sizing inputs with an SGLang spelling, plus the model and --mem-fraction-static.
CHECKER_FLAG = {name: row.flag for name, row in LAUNCH_ARGS.items()}
# How the launch command spells an input where its flag differs from the checker's (for the messages).
SGLANG_FLAG = {name: row.sglang_flag for name, row in LAUNCH_ARGS.items() if row.sglang_flag != row.flag}


@dataclass(frozen=True, kw_only=True)
class LaunchInputs:
    """What the report records of the launch command: how it was read and its sizing inputs."""

    parser: str
    release: str
    text: str
    """The explicit sizing inputs, canonical (``k=v`` sorted): digested across ranks."""
    argv: tuple[str, ...] = ()
    """The whole launch command as given (the words after ``--``): the report keeps it."""
    form: str = ""

    @property
    def input(self) -> str:
        """The ``launch_command`` input every rank sends: the sizing inputs, then which parser read them."""
        return f"{self.text} (read by {self.parser})"


def split_launch_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """``[checker args] -- [launch command]`` -> the two halves (None: no ``--``)."""
    words = list(argv)
    if "--" not in words:
        return words, None
    i = words.index("--")
    return words[:i], words[i + 1 :]


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


def _config_file(path: object) -> str:
    p = str(path)
    return os.path.realpath(os.path.join(p, "config.json") if os.path.isdir(p) else p)


def _same(a: object, b: object, key: str = "") -> bool:
    """Whether the checker's value and the launch command's are one input: the same config.json, or the
    same number. Exactly the same: both sides are read from text by float()/int(), so "0.9" and "0.90"
    agree, and any other difference is a difference in what the server runs."""
    if key == "model_config":
        return _config_file(a) == _config_file(b)
    if isinstance(a, float) or isinstance(b, float):
        try:
            return float(a) == float(b)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
    return a == b


def apply_launch_command(
    args: argparse.Namespace, launch: Sequence[str], *, given: set[str]
) -> tuple[argparse.Namespace, LaunchInputs]:
    """Fill ``args`` with the launch command's sizing inputs; refuse one given in both places unless
    the two agree. Returns the namespace and what the report records."""
    if not launch:
        raise FlagError(
            "nothing after --: give the deployment's launch command, e.g. -- python -m "
            "sglang.launch_server --model-path /models/M --pp-size 8 ..."
        )
    release = getattr(args, "sglang_version", None)
    if release and "," in release:
        raise FlagError("--sglang-version A,B compares releases; with a launch command give one release")
    from checker.launch.command import parse_launch_command  # its flag tables load only when needed

    installed = installed_sglang_version()
    cmd = parse_launch_command(
        launch, release=release, prefer_installed=release is None or release == installed
    )
    _refuse_unread_config(cmd, launch)
    values = _checked_values(cmd)
    for key, value in values.items():
        if not hasattr(args, key):
            continue  # an input this command does not use (e.g. --mem-fraction-static for derive)
        if key == "model_config" and getattr(args, "model", None):
            raise FlagError(
                f"--model {args.model} and --model-path {value} in the launch command name two models; "
                "drop --model"
            )
        if key in given:
            ours = getattr(args, key)
            if not _same(ours, value, key):
                theirs = SGLANG_FLAG.get(key, CHECKER_FLAG[key])
                raise FlagError(
                    f"{CHECKER_FLAG[key]} {ours} and {theirs} {value} in the launch command disagree; give "
                    "it in one place (the launch command is what the server runs)"
                )
            continue
        setattr(args, key, value)
    # The model is an input of its own (with a digest of its shapes): the flags go first, as the root
    # cause quotes the start of this text.
    items = sorted(cmd.sizing_text().items(), key=lambda kv: (kv[0] == "model_config", kv[0]))
    text = " ".join(f"{k}={v}" for k, v in items if _explicit(cmd, k))
    return args, LaunchInputs(
        parser=cmd.parser, release=cmd.release, text=text, argv=tuple(launch), form=cmd.form
    )


def _checked_values(cmd) -> dict[str, object]:  # noqa: ANN001 - a LaunchCommand
    """The launch command's inputs, each checked by its row of the table as the checker's own flag is
    (exit 2 naming the launch command's flag) and read as SGLang reads it (0 is unset where SGLang says
    so). What the command typed is checked too where the checker's value is derived from it: --tp-size 4
    with attention DP 2 is an attention TP of 2, and --tp-size 0 is no TP size at all."""
    out: dict[str, object] = {}
    for key, value in cmd.values.items():
        row = LAUNCH_ARGS.get(key)
        if row is None:
            continue
        typed = cmd.sglang_values.get(row.sglang)
        if typed is not None and row.sglang in cmd.sglang_explicit:
            row.launch_value(typed)
        out[key] = row.launch_value(value)
    return out


def _refuse_unread_config(cmd, launch: Sequence[str]) -> None:  # noqa: ANN001 - a LaunchCommand
    """SGLang reads a config file only for the exact word ``--config`` (server_args.py
    ``prepare_server_args``: ``if "--config" in argv``, in every release that has the flag); argparse
    still accepts ``--conf FILE`` or ``--config=FILE`` and stores a path nothing reads. The server would
    start without the file, so the check would check something other than what the user meant."""
    if "config" not in cmd.sglang_explicit:
        return
    path = cmd.sglang_values.get("config")
    spelling = next(
        (w.split("=", 1)[0] for w in launch if w.startswith("--") and "--config".startswith(w.split("=")[0])),
        "--config",
    )
    raise FlagError(
        f"{spelling} {path} in the launch command: SGLang {cmd.release} reads a config file only when it "
        f"is spelled exactly `--config {path}` (as its own word, not abbreviated, not with =); as given, "
        "the server would start without it"
    )


def _explicit(cmd, key: str) -> bool:
    """Whether the command gave ``key`` (a LaunchCommand's checker name, or ``sglang.X``)."""
    if key.startswith("sglang."):
        return key.removeprefix("sglang.") in cmd.sglang_explicit
    return key in cmd.explicit


def launch_text(args: argparse.Namespace) -> str | None:
    """The ``launch_command`` input: the explicit sizing flags, then which parser read them."""
    launch = getattr(args, "launch", None)
    return launch.input if launch else None
