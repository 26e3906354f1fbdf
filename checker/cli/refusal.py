"""A command line or environment a rank cannot run: one line, exit 2, and the error in the report.

Alone (no torchrun, or a command without a process group): the line on stderr and, for ``check``, an
``error`` report when the command line names one.

Under torchrun (WORLD_SIZE > 1), ``check`` and ``sweep``: the rank joins the run protocol anyway
(:func:`checker.distributed.exchange.run` with ``refused``), with only the group flags it can read from
its command line. Its header says it failed and its message follows in the text gather, so rank 0 writes
one ``error`` report naming every failing rank with its message, whichever rank failed and whether or not
rank 0 did too, printed once. When the exchange cannot be reached (its flags are unreadable, or the
group cannot be formed), rank 0 writes an error report from its own message and the others print theirs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from checker import __version__
from checker.status import ERROR, EXIT_USAGE

if TYPE_CHECKING:  # imported when a refusal happens: the CLI's own import stays small
    from checker.config import GroupOptions
    from checker.distributed.launch_env import RankEnv

EXCHANGE_COMMANDS = ("check", "sweep")
"""Commands that run over a process group under torchrun (the run protocol)."""
REPORT_COMMANDS = ("check",)
"""Commands whose usage error, alone, still leaves the ``--report`` CI reads."""
REPORT_WAIT_S = 10.0
"""Alone under torchrun, how long another rank waits for rank 0's error report before leaving."""


def refuse(command: str, message: str, argv: Sequence[str]) -> int:
    """This rank cannot run ``command`` (``message`` says why): exit 2 on every rank, the error reported."""
    from checker.distributed.launch_env import RankEnv

    env = RankEnv.from_environ()
    if command in EXCHANGE_COMMANDS and env.world_size > 1:
        code = _join_exchange(command, message, argv, env)
        if code is not None:
            return code
    return _alone(command, message, argv)


def protocol_runs() -> int:
    """How many runs of the protocol this process has begun (without importing it)."""
    exchange = sys.modules.get("checker.distributed.exchange")
    return int(getattr(exchange, "runs_begun", 0))


def refuse_unexpected(command: str, exc: Exception, argv: Sequence[str], *, runs_before: int) -> int | None:
    """An exception no check caught, before this rank joined the run protocol (a metadata file it
    cannot decode, a launch command it cannot read, a bug): under torchrun the rank still joins as a
    failing rank, so the report names it rather than an infrastructure failure naming nobody. The
    traceback goes to this rank's stderr. None where that does not apply (the caller re-raises): no
    torchrun, another command, or the protocol had already begun (``runs_before`` :func:`protocol_runs`
    when the command started): a rank never runs it twice."""
    from checker.distributed.launch_env import RankEnv

    began = protocol_runs() > runs_before
    if command not in EXCHANGE_COMMANDS or RankEnv.from_environ().world_size <= 1 or began:
        return None
    import traceback

    traceback.print_exception(type(exc), exc, exc.__traceback__)
    return refuse(command, f"checker {command}: internal error: {type(exc).__name__}: {exc}", argv)


def _join_exchange(command: str, message: str, argv: Sequence[str], env: RankEnv) -> int | None:
    """Run the protocol as a rank that only reports; None when it cannot meet the others."""
    from checker.config import OutputOptions
    from checker.distributed.exchange import RankError, run
    from checker.distributed.session import Session

    group = _group_options(argv)
    if group is None:
        return None
    paths = usable_outputs(argv)
    output = OutputOptions(report=paths["--report"], junit=paths["--junit"])
    session = Session(env, group)
    refused = RankError(message=message)
    if command == "check":
        from checker.commands.check_job import CheckJob

        return run(session, CheckJob(config=None, env=env, session=session, output=output), refused=refused)
    from checker.commands.sweep_job import SweepJob

    return run(session, SweepJob(config=None, env=env, session=session, output=output), refused=refused)


def _group_options(argv: Sequence[str]) -> GroupOptions | None:
    """The group flags as far as they can be read, each checked as the parser would (one it cannot
    read takes its default); None when --init-method is given but unusable: there is no meeting
    the others then (and a FileStore on a missing directory would wait forever)."""
    from checker.cli.options import init_method, timeout_seconds
    from checker.config import GroupOptions

    default = GroupOptions()
    backend = flag_value(argv, "--backend")
    timeout = flag_value(argv, "--timeout-s")
    method = flag_value(argv, "--init-method")
    try:
        timeout_s = timeout_seconds(timeout) if timeout is not None else default.timeout_s
    except (argparse.ArgumentTypeError, ValueError):
        timeout_s = default.timeout_s
    try:
        method = init_method(method) if method is not None else None
    except argparse.ArgumentTypeError:
        return None
    return GroupOptions(
        backend=backend if backend in ("auto", "gloo", "nccl") else default.backend,
        timeout_s=timeout_s,
        init_method=method,
    )


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def usable_outputs(argv: Sequence[str], message: str = "") -> dict[str, str | None]:
    """--report and --junit from the command line (``argv``: the checker's words, then ``--`` and the
    launch command), each None where it could never be written or would replace what the run reads or
    the other output (checker.outputs.files.usable_outputs, the check every command runs): never
    written then, and said once unless ``message`` already says it."""
    from checker.cli.options import run_inputs
    from checker.launch.merge import split_launch_command
    from checker.outputs.files import usable_outputs as checked

    ours, launch = split_launch_command(argv)
    model = flag_value(ours, "--model-config") or flag_value(ours, "--model-path")
    inputs = run_inputs(model_config=model, launch=launch, init_method=flag_value(ours, "--init-method"))
    paths, problems = checked([(flag, flag_value(ours, flag)) for flag in ("--report", "--junit")], inputs)
    for problem in problems:
        if problem not in message:
            print(f"checker: warning: no error report: {problem}", file=sys.stderr)
    return paths


def _alone(command: str, message: str, argv: Sequence[str]) -> int:
    """Without the protocol: rank 0 (or the only process) prints and writes; another rank waits
    (bounded) for rank 0's report so torchrun's SIGTERM cannot take it, and prints its own line."""
    rank = _rank()
    report = flag_value(argv, "--report") if command in REPORT_COMMANDS else None
    if rank not in (None, 0):
        written = wait_for_file(report, seconds=REPORT_WAIT_S)
        if command in EXCHANGE_COMMANDS and not written:  # rank 0 may not have this rank's error
            print(f"[rank {rank}] {message}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun's SIGKILL still ends us after its grace
    print(message, file=sys.stderr, flush=True)
    if command in REPORT_COMMANDS:
        error_report(message, argv)
    return EXIT_USAGE


def _rank() -> int | None:
    """This process's rank under torchrun (None when not launched by it)."""
    value = os.environ.get("RANK")
    return int(value) if value is not None and value.isdigit() else None


def process_started_at() -> float:
    """When this process started (wall clock): a file older than that is an earlier run's.

    Linux: from /proc (10 ms resolution); elsewhere, when this module was imported."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        started_ticks = int(after_name[19])  # field 22, starttime, in clock ticks since boot
        return time.time() - (uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


def wait_for_file(path: str | None, *, seconds: float) -> bool:
    """Wait (bounded) for ``path`` to be written by this run: modified after this process started, so a
    report an earlier run left there is not taken for rank 0's."""
    if not path:
        return False
    since = process_started_at()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if os.stat(path).st_mtime >= since:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def error_report(message: str, argv: Sequence[str]) -> None:
    """A usage error still leaves the report CI reads, when the command line names one."""
    paths = usable_outputs(argv, message)
    if not any(paths.values()):
        return
    from checker.outputs import report
    from checker.preflight.verdict import Verdict

    world = os.environ.get("WORLD_SIZE", "1")
    verdict = Verdict(status=ERROR, world_size=int(world) if world.isdigit() else 1, errors=[message])
    for problem in report.write_all(
        verdict,
        report=paths["--report"],
        junit=paths["--junit"],
        summary="usage error",
        elapsed_s=0.0,
        extra={"checker_version": __version__},
        step_summary=False,
    ):
        print(f"checker: warning: {problem}", file=sys.stderr)
