"""One lifecycle for every rank of a command that runs over a process group (``check``, ``sweep``):

    environment -> config -> Session -> run(session, job, refused=...)

written once, here, for a rank whose command line parsed and for one that was refused alike. A rank is
refused when its command line, its launch command or its config cannot be read: it runs the same
protocol (:func:`checker.distributed.exchange.run`) with ``refused`` and the group and output flags it
could read, so its error reaches the report, named with its rank and host, and every rank leaves with
the same exit code. Nothing else decides how a refused rank ends: no second writer, no waiting on a
file's modification time.

A command takes part by registering in :data:`COMMANDS` and defining ``GROUP_COMMAND``
(:class:`GroupCommand`): how it builds its config, which flags say where to meet and where to publish,
its job, and (sweep) how it runs in one process when there is no group to run over.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from checker.commands.group_flags import group_options
from checker.commands.options import read_options
from checker.config import OutputOptions
from checker.core.errors import CheckerInputError
from checker.distributed.launch_env import GroupOptions, RankEnv
from checker.launch.inputs import run_inputs
from checker.status import EXIT_USAGE

if TYPE_CHECKING:
    from checker.distributed.exchange import Job

C = TypeVar("C")

COMMANDS: dict[str, str] = {"check": "checker.commands.check", "sweep": "checker.commands.sweep"}
"""The commands whose ranks run over a process group under torchrun, and the module holding each one's
``GROUP_COMMAND`` (imported when the command runs: the CLI's own import stays small)."""


@dataclass(frozen=True, kw_only=True)
class GroupFlags:
    """What a rank needs to take part in a run whatever else failed: how to meet the others (``group``)
    and where the verdict is published (``output``)."""

    group: GroupOptions = field(default_factory=GroupOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    inputs: tuple[tuple[str, str], ...] = ()
    """What the run reads, each with how it was named (checker.launch.inputs.run_inputs): no output of a
    refused rank may replace one either."""

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, launch: Sequence[str] | None = None) -> GroupFlags:
        """From a command line that parsed (its launch command or the command's config failed later).
        ``launch``: the launch command's words, when ``args`` does not hold it read."""

        read = getattr(args, "launch", None)
        words = read.argv if read is not None and hasattr(read, "argv") else launch
        inputs = run_inputs(launch=words, **read_options(args))
        return cls(
            group=group_options(args),
            output=OutputOptions(
                report=getattr(args, "report", None),
                junit=getattr(args, "junit", None),
                format=args.format,
                quiet=args.quiet,
            ),
            inputs=tuple(inputs),
        )


@dataclass(frozen=True, kw_only=True)
class GroupCommand(Generic[C]):
    """A command's part in the lifecycle."""

    config: Callable[[argparse.Namespace, RankEnv], C]
    """The typed config from the parsed flags; the user's errors raise :class:`CheckerInputError`."""
    flags: Callable[[C], GroupFlags]
    job: Callable[[C | None, OutputOptions], Job[Any, Any]]
    """The command's job (pure: the protocol hands it a context at each step); ``config`` is None on a
    refused rank (its job only ever reports)."""
    alone: Callable[[C], int] | None = None
    """The whole command in this process where a world of one has no group to run over (sweep), or
    None: the command always runs the protocol (check: a world of one still publishes a verdict)."""


def group_command(name: str) -> GroupCommand[Any]:
    module = importlib.import_module(COMMANDS[name])
    command: GroupCommand[Any] = module.GROUP_COMMAND
    return command


def run(name: str, args: argparse.Namespace) -> int:
    """Command ``name`` with its command line parsed: its config, then the run. A config that cannot be
    built refuses this rank (it still joins the others)."""
    command, env = group_command(name), RankEnv.from_environ()
    try:
        config = command.config(args, env)
    except CheckerInputError as exc:
        return refuse(name, f"checker {name}: error: {exc}", GroupFlags.from_args(args))
    except Exception as exc:  # this rank's environment is broken (or a bug): under torchrun, still report
        # start-up: traceback is off the CLI's import path (-X importtime); only an internal error loads it
        import traceback

        # start-up: the run protocol loads only on a rank that joins the exchange
        from checker.distributed.exchange import internal_error

        traceback.print_exception(type(exc), exc, exc.__traceback__)
        return refuse(name, f"checker {name}: {internal_error(exc)}", GroupFlags.from_args(args))
    flags = command.flags(config)
    if command.alone is not None and _alone(env, flags.group):
        return command.alone(config)
    return _start(command, env, flags, config=config)


def refuse(name: str, message: str, flags: GroupFlags) -> int:
    """This rank cannot run command ``name`` (``message`` says why, one line): exit 2 on every rank,
    the error in the report. ``flags``: what this rank could read of its command line."""
    command, env = group_command(name), RankEnv.from_environ()
    if command.alone is not None and _alone(env, flags.group):  # one process, nothing to join
        print(message, file=sys.stderr, flush=True)
        return EXIT_USAGE
    output = usable_outputs(flags, message)
    return _start(command, env, replace(flags, output=output), refused=message)


def _alone(env: RankEnv, group: GroupOptions) -> bool:
    """No process group to run over: a world of one with no --init-method."""
    return env.world_size <= 1 and not group.init_method


def _start(
    command: GroupCommand[Any],
    env: RankEnv,
    flags: GroupFlags,
    *,
    config: Any = None,
    refused: str | None = None,
) -> int:
    """env -> Session -> run(session, job, refused=...): the one sequence every rank runs."""
    # start-up: the run protocol and the session load only on a rank that runs
    from checker.distributed.exchange import RankError
    from checker.distributed.exchange import run as run_protocol
    from checker.distributed.session import Session

    session = Session(env, flags.group)
    job = command.job(config, flags.output)
    return run_protocol(session, job, refused=RankError(message=refused) if refused is not None else None)


def usable_outputs(flags: GroupFlags, message: str) -> OutputOptions:
    """A refused rank's outputs, through the check every output passes before anything is written
    (:func:`checker.files.usable_outputs`: a path that can never be written, one that is an input
    of the run or lies in its model directory, one another output names): each that fails it is left
    out, and said once unless the refusal already says it."""
    # start-up: the bounded writers load only for a refused rank
    from checker.files import usable_outputs as checked

    output = flags.output
    error_file = "TORCHELASTIC_ERROR_FILE"
    outputs = [("--report", output.report), ("--junit", output.junit)]
    outputs.append((error_file, os.environ.get(error_file)))
    paths, problems = checked(outputs, flags.inputs)
    for problem in problems:
        if problem not in message:
            print(f"checker: warning: no error report: {problem}", file=sys.stderr, flush=True)
    if os.environ.get(error_file) and paths[error_file] is None:
        # torchrun's error file names an input or the report: the report wins, the line stays unwritten.
        del os.environ[error_file]
    return replace(output, report=paths["--report"], junit=paths["--junit"])
