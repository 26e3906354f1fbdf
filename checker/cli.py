"""Command line: ``build_parser()`` and ``main(argv) -> int``. Subcommands live in ``checker.commands``.

Bad input of any kind ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from checker import __version__
from checker.core.errors import CheckerInputError

# name -> module under checker.commands; the first is the default subcommand.
COMMANDS = ("check", "derive", "plan", "sweep")
DEFAULT_COMMAND = COMMANDS[0]
EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line naming the way out (--help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _command(name: str):
    return importlib.import_module(f"checker.commands.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="checker",
        description="Prove that every pipeline stage of an SGLang deployment derives the same "
        "state-pool size, max_running_requests and pp_max_micro_batch_size.",
        epilog=f"With no COMMAND, '{DEFAULT_COMMAND}' runs: torchrun --standalone --nproc-per-node 8 "
        "-m checker. Exit codes of check: 0 consistent, 1 divergent, 2 error, 3 infrastructure "
        "failure, 4 model drift.",
    )
    parser.add_argument("--version", action="version", version=f"checker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMANDS:
        mod = _command(name)
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
    return parser


def with_default_command(argv: Sequence[str]) -> list[str]:
    """``checker [check] ...``: insert the default subcommand when none is named."""
    argv = list(argv)
    if argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help", "--version")):
        return argv
    return [DEFAULT_COMMAND, *argv]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(with_default_command(argv))
    try:
        return _command(args.command).run(args)
    except CheckerInputError as exc:
        print(f"checker {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `checker derive | head`: the reader left; end quietly, as CLI tools do (Python docs' recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
