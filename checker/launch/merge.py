"""The deployment's launch command and the checker's own flags: one set of sizing inputs (torch-free).

``checker [OPTIONS] -- python -m sglang.launch_server ARGS``: the sizing inputs come from the launch
command as the release parses it (:mod:`checker.launch.command`). A sizing input given in both places
must agree, or the run stops with one line naming both; a translation that silently checks something
other than what runs is the drift this tool exists to catch.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from checker.core.errors import FlagError
from checker.core.releases import installed_sglang_version

# The checker's flag for each launch-command value (checker names, as LaunchCommand.values has them).
CHECKER_FLAG = {
    "model_config": "--model-config",
    "pp_size": "--pp-size",
    "tp_size": "--tp-size",
    "dp_size": "--dp-size",
    "page_size": "--page-size",
    "disable_radix_cache": "--disable-radix-cache",
    "disable_overlap_schedule": "--disable-overlap-schedule",
    "mamba_radix_cache_strategy": "--mamba-radix-cache-strategy",
    "mem_fraction_static": "--mem-fraction-static",
    "max_running_requests": "--max-running-requests",
    "max_mamba_cache_size": "--max-mamba-cache-size",
    "mamba_full_memory_ratio": "--mamba-full-memory-ratio",
    "mamba_ssm_dtype": "--mamba-ssm-dtype",
    "speculative_num_draft_tokens": "--speculative-num-draft-tokens",
    "context_len": "--context-len",
    "pp_max_micro_batch_size": "--pp-max-micro-batch-size",
}
# How the launch command spells the same input (for the conflict message).
SGLANG_FLAG = {"model_config": "--model-path", "context_len": "--context-length"}


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
    """The dests of the checker flags the user typed (argparse cannot tell "given" from "defaulted")."""
    options = {o: a.dest for a in parser._actions for o in a.option_strings}
    out = set()
    for word in words:
        if not word.startswith("--"):
            continue
        flag = word.split("=", 1)[0]
        matches = [o for o in options if o == flag] or [o for o in options if o.startswith(flag)]
        if len(matches) == 1:
            out.add(options[matches[0]])
    return out


def _config_file(path: object) -> str:
    p = str(path)
    return os.path.realpath(os.path.join(p, "config.json") if os.path.isdir(p) else p)


def _same(a: object, b: object, key: str = "") -> bool:
    if key == "model_config":
        return _config_file(a) == _config_file(b)
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=0, abs_tol=1e-12)  # type: ignore[arg-type]
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
    for key, value in cmd.values.items():
        if key not in CHECKER_FLAG or not hasattr(args, key):
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


def _explicit(cmd, key: str) -> bool:
    """Whether the command gave ``key`` (a LaunchCommand's checker name, or ``sglang.X``)."""
    if key.startswith("sglang."):
        return key.removeprefix("sglang.") in cmd.sglang_explicit
    return key in cmd.explicit


def launch_text(args: argparse.Namespace) -> str | None:
    """The ``launch_command`` input: the explicit sizing flags, then which parser read them."""
    launch = getattr(args, "launch", None)
    return launch.input if launch else None
