"""Command line: ``build_parser()`` and ``main(argv) -> int``. Subcommands live in ``checker.commands``.

Bad input of any kind ends in one line on stderr and exit code 2, never a traceback. A rank of ``check``
or ``sweep`` whose command line (or launch command) fails runs the same lifecycle as every other rank,
as a rank that only reports (:func:`checker.commands.lifecycle.refuse`, with the flags
:func:`checker.cli.refusal.group_flags` reads): under torchrun rank 0's ``error`` report names it (CI
reads the report, not torchrun's code), and the line is printed once.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
import textwrap
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol, cast

from checker import __version__
from checker.argspec import read_parser
from checker.cli.namespace import apply_launch_command, given_dests
from checker.commands.lifecycle import COMMANDS as GROUP_COMMANDS
from checker.commands.lifecycle import GroupFlags
from checker.commands.lifecycle import refuse as refuse_rank
from checker.core.errors import CheckerInputError, cut_long_words, printable
from checker.launch.merge import CHECKER_FLAG, SGLANG_FLAG, split_launch_command
from checker.launch.repeats import OptionIndex, collapse_repeats
from checker.status import ERROR, EXIT_CODES, EXIT_INTERRUPTED, EXIT_USAGE

# name -> module under checker.commands; the first is the default subcommand.
COMMANDS = ("check", "derive", "plan", "sweep", "postflight")
DEFAULT_COMMAND = COMMANDS[0]
HELP_WIDTH = 100
"""Descriptions and option help wrap at the same width whatever the terminal."""
LAUNCH_FORM = "[checker options] -- <launch command>"
"""How every command takes the deployment's launch command (checker.launch.merge); the usage line shows it."""

LAUNCH_COMMANDS = ("check", "derive", "plan", "sweep")
"""The commands that derive, from a launch command after ``--`` (postflight reads logs instead)."""
# (variable, what it is, the commands that read it): each command's --help lists its own.
_DERIVING = LAUNCH_COMMANDS
_GROUP = ("check", "sweep")
ENVIRONMENT = (
    ("SGLANG_PP_LAYER_PARTITION", "the layer partition, as SGLang reads it", _DERIVING),
    ("SGLANG_MAMBA_CONV_DTYPE", "conv state dtype (default bfloat16)", _DERIVING),
    ("SGLANG_MAMBA_SSM_DTYPE", "temporal state dtype (--mamba-ssm-dtype wins)", _DERIVING),
    ("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK", "SGLang's decode-lock switch", _DERIVING),
    ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "lets --context-len exceed the model's own", _DERIVING),
    (
        "SGLANG_ENABLE_PP_SPEC",
        "0.5.21+: spec decoding under PP needs it (not compared)",
        _DERIVING,
    ),
    ("RANK, WORLD_SIZE, MASTER_ADDR, ...", "set by torchrun", _GROUP),
    ("CHECKER_HOSTNAME", "the host name a rank reports (default: the machine's)", _GROUP),
    ("GITHUB_STEP_SUMMARY", "rank 0 appends a markdown verdict there", ("check", "postflight")),
)
_COMPARED = "check compares every rank's SGLANG_* values: a difference is named as a root cause."


def environment_help(command: str | None) -> str:
    """The environment variables ``command`` reads (None: every command's), a table then one note."""
    rows = [(name, what) for name, what, commands in ENVIRONMENT if command is None or command in commands]
    width = max(len(name) for name, _ in rows) + 2
    table = "\n".join(f"  {name:<{width}}{what}" for name, what in rows)
    note = f"\n\n{_COMPARED}" if command in (None, "check") else ""
    return f"environment variables read:\n{table}{note}"


def usage(forms: Sequence[str]) -> str:
    """Each way to start the command, with and without a launch command (argparse adds "usage: ")."""
    lines = [f"{form} {LAUNCH_FORM}" for form in forms] + [f"{form} [checker options]" for form in forms]
    return "\n       ".join(lines)


def examples_help(examples: Sequence[str]) -> str:
    """One example a line, indented so the formatter keeps each line as written."""
    return "examples:\n" + "\n".join(f"  {line}" for line in examples)


class UsageError(Exception):
    """A command-line error: one line, exit 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line naming the way out, with "did you mean"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # argparse.ArgumentParser's own arguments
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # "argument --budget-gib: 0 must be ..." -> "--budget-gib 0 must be ...": the flag as typed.
        message = re.sub(r"^argument (--[\w-]+)(?:/[^:]*)?: (?=[^ ]+ must )", r"\1 ", message)
        message = re.sub(r"^argument (--[\w-]+)(?:/[^:]*)?: ", r"\1: ", message)
        # Words the user typed are echoed: cut like every other long value, and escaped, so a terminal
        # escape or a newline in one is shown, never acted on by the terminal or the CI log.
        line = f"{self.prog}: error: {message}{_suggestion(self, message)} (see {self.prog} --help)"
        raise UsageError(printable(cut_long_words(line)))


class _Formatter(argparse.HelpFormatter):
    """One width for everything: prose paragraphs are re-wrapped to it, indented lines (examples,
    tables) are kept as written."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=HELP_WIDTH, max_help_position=34)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in textwrap.dedent(text).strip("\n").split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith((" ", "\t")) for line in lines):  # a list under its heading
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(
                    textwrap.fill(" ".join(lines), width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n\n".join(out)


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """'did you mean' for an unknown flag or subcommand."""
    m = re.search(r"unrecognized arguments: (\S+)", message) or re.search(
        r"invalid choice: '([^']+)'", message
    )
    if not m:
        return ""
    word = m.group(1).split("=", 1)[0]
    launch_flag = _launch_flag_hint(parser, word)
    if launch_flag:
        return launch_flag
    choices: list[str] = []
    todo = [parser]
    while todo:  # the top-level parser reports the subcommands' unknown flags too
        p = read_parser(todo.pop())
        for option in p.options:
            choices += [o for o in option.strings if o.startswith("--")]
            if option.kind == "parsers":
                choices += list(option.choices)
                todo += list(option.choices.values())
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


# SGLang launch flags whose meaning the checker's own flags give under another name.
_CHECKER_COUNTERPART = {"--attn-dp-size": ("--dp-size", "the attention DP size")}


def _launch_flag_hint(parser: argparse.ArgumentParser, word: str) -> str:
    """For a flag of SGLang's launch command given among the checker's own (``--attn-dp-size``): where it
    goes (after ``--``, in the launch command), and the checker's own flag for it where there is one. A
    close checker flag ("did you mean --tp-size?") would check another setting than the one meant."""
    if not word.startswith("--"):
        return ""
    # start-up: the per-release flag tables load only for a mistyped flag
    from checker.launch.flags import ACTIONS

    if not any(word in row[0].split() for row in ACTIONS):
        return ""
    prog = parser.prog if parser.prog.startswith("checker ") else "checker check"
    ours = {v: CHECKER_FLAG[k] for k, v in SGLANG_FLAG.items() if v}
    counterpart = _CHECKER_COUNTERPART.get(word) or ((ours[word], "") if word in ours else None)
    also = ""
    if counterpart is not None:
        flag, what = counterpart
        also = f", or use the checker's own {flag}" + (f" ({what})" if what else "")
    return (
        f"; {word} is a flag of SGLang's launch command, not of the checker: give it in the launch command "
        f"after -- ({prog} [checker options] -- python -m sglang.launch_server ... {word} ...){also}"
    )


class CommandModule(Protocol):
    """What each ``checker.commands.<name>`` module provides: its help, its options, its entry point."""

    HELP: str
    USAGE: Sequence[str]
    DESCRIPTION: str
    EXAMPLES: Sequence[str]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _command(name: str) -> CommandModule:
    # imported by name, so a rank imports only the command it runs (build_parser)
    return cast(CommandModule, importlib.import_module(f"checker.commands.{name}"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``only``: just that command's subparser (what ``main`` builds for a
    named command: each rank of a preflight then imports only the modules its command uses, not
    those of plan, derive and sweep, which cost it a tenth of a second of CPU on a shared node)."""
    parser = OneLineParser(
        prog="checker",
        usage=usage(("torchrun [torchrun options] -m checker [COMMAND]", "python -m checker COMMAND")),
        description="Prove that every pipeline stage of an SGLang deployment derives the same "
        "state-pool size, max_running_requests and pp_max_micro_batch_size. With no COMMAND, "
        f"'{DEFAULT_COMMAND}' runs. <launch command> is the deployment's own SGLang command line "
        "(python -m sglang.launch_server ARGS, sglang serve ARGS, or bare ARGS); every command reads the "
        "model and sizing flags from it. Each command's --help shows its options and examples.",
        epilog=None
        if only
        else "Exit codes of check: 0 consistent, 1 divergent, 2 error, 3 infrastructure failure, 4 model "
        "drift.\n\n" + examples_help(_command(DEFAULT_COMMAND).EXAMPLES) + "\n\n" + environment_help(None),
    )
    parser.add_argument("--version", action="version", version=f"checker {__version__}")
    sub = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        parser_class=OneLineParser,
        prog=parser.prog,  # not the usage
    )
    for name in (only,) if only else COMMANDS:
        # The help a user reads (DESCRIPTION, EXAMPLES), not the module docstring an engineer reads.
        mod = _command(name)
        p = sub.add_parser(
            name,
            help=mod.HELP,
            usage=usage(mod.USAGE) if name in LAUNCH_COMMANDS else "\n       ".join(mod.USAGE),
            description=mod.DESCRIPTION,
            epilog=examples_help(mod.EXAMPLES) + "\n\n" + environment_help(name),
        )
        mod.add_arguments(p)
    return parser


def with_default_command(argv: Sequence[str]) -> list[str]:
    """``checker [check] ...``: insert the default subcommand when none is named.

    A first word that looks like a mistyped subcommand (``drive``) is left alone, so argparse can say
    "did you mean derive" instead of checking the wrong thing.
    """
    argv = list(argv)
    if argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help", "--version")):
        return argv
    if argv and not argv[0].startswith("-") and difflib.get_close_matches(argv[0], COMMANDS, n=1, cutoff=0.6):
        return argv
    return [DEFAULT_COMMAND, *argv]


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """``--budgets -1,2`` -> ``--budgets=-1,2``: argparse reads a value that starts with '-' and is not
    a plain negative number as a flag, and answers "expected one argument" about the wrong thing."""
    out: list[str] = []
    for word in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"^-[\d.]", word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def _refuse_unknown_flags(parser: argparse.ArgumentParser, words: Sequence[str]) -> None:
    """An unknown flag is named before anything else: argparse would first complain that a required
    flag is missing when the user only mistyped it (``--modle``)."""
    sub = read_parser(parser).subparsers.get(words[0]) if words else None
    if sub is None:
        return
    index = OptionIndex(sub)  # by binary search: a command line of thousands of words stays linear
    unknown = []
    for word in words[1:]:
        if word == "--":
            break
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag not in index.actions and not index.prefixed(flag):
            unknown.append(word)
    if unknown:
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return read_parser(parser).subparsers[name]


def quiet_torch_import() -> None:
    """A CPU torch without numpy warns "Failed to initialize NumPy" at import, once per rank: noise in
    every log line count, and nothing the checker uses (its rows are plain int64 tensors)."""
    warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy")


def refuse(command: str, message: str, flags: Callable[[], GroupFlags]) -> int:
    """This rank cannot run ``command``: one line, exit 2; a command that runs over a process group runs
    its lifecycle anyway, as a rank that only reports (``flags``: what it could read of its command line)."""
    if command in GROUP_COMMANDS:
        return refuse_rank(command, message, flags())
    print(message, file=sys.stderr, flush=True)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    quiet_torch_import()
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, launch = split_launch_command(argv)
    words = join_negative_values(with_default_command(ours))
    command = words[0] if words and words[0] in COMMANDS else DEFAULT_COMMAND
    # A named command (the first word, or the default inserted): only its own parser; the top-level
    # help and a mistyped command need every command's.
    parser = build_parser(only=words[0] if words and words[0] in COMMANDS else None)
    try:
        _refuse_unknown_flags(parser, words)
        if words and words[0] in COMMANDS:
            # A flag repeated (a CI template appending overrides) is read once, its last value: argparse
            # alone takes time quadratic in the number of options (20,000 repeats: 10.9 s).
            words = [words[0], *collapse_repeats(OptionIndex(_subparser(parser, words[0])), words[1:])]
        args = parser.parse_args(words)
    except UsageError as exc:
        # start-up: it would load on every command, needed only when the command line fails
        from checker.cli.refusal import group_flags

        return refuse(command, str(exc), lambda: group_flags(_subparser(parser, command), words[1:], launch))
    args.launch = None
    try:
        # The flags typed (a default is never reported as given: checker.launch.merge.GivenFlags).
        args.given = given_dests(_subparser(parser, args.command), words[1:])
        if launch is not None and args.command not in LAUNCH_COMMANDS:
            args.launch = launch  # the command refuses it (postflight reads logs)
        elif launch is not None:
            args, args.launch = apply_launch_command(args, launch, given=args.given)
    except CheckerInputError as exc:
        message = f"checker {args.command}: error: {exc}"
        return refuse(args.command, message, lambda: GroupFlags.from_args(args, launch=launch))
    except Exception as exc:  # a launch command this rank cannot read (a bug, a broken install)
        if args.command not in GROUP_COMMANDS:
            raise
        # start-up: traceback is off the CLI's import path (-X importtime); only an internal error loads it
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
        message = f"checker {args.command}: internal error: {type(exc).__name__}: {exc}"
        return refuse(args.command, message, lambda: GroupFlags.from_args(args, launch=launch))
    try:
        return _command(args.command).run(args)
    except CheckerInputError as exc:  # a command without a process group (derive, plan, sweep alone)
        print(f"checker {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"checker {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `checker derive | head`: the reader left. End quietly, as CLI tools do (Python docs' recipe),
        # under the one policy for an output not delivered (checker.status.exit_after_outputs): the
        # run's own code is gone with the exception, so error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CODES[ERROR]
