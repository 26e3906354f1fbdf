"""``checker postflight``: the started server's own log held to the preflight's prediction, rank by rank.

The logs (one per node, or one combined; ``-``: standard input) -> :mod:`checker.postflight.reader`
(streamed) -> each rank's values (:mod:`checker.postflight.ranks`) -> held to ``--report``'s prediction
(:mod:`checker.postflight.compare`) -> :mod:`checker.outputs.postflight`. Without ``--report`` it prints
what it read, per rank. What a user reads in ``--help`` is :data:`DESCRIPTION` and :data:`EXAMPLES`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from checker.commands.flag_types import bounded_float
from checker.core.errors import CheckerInputError, FlagError
from checker.postflight.compare import WEIGHTS_MARGIN_GIB, across, hold
from checker.postflight.prediction import read_prediction
from checker.postflight.ranks import ranks_read
from checker.postflight.reader import findings, read_logs
from checker.status import exit_after_outputs, undelivered_note

HELP = "hold the started server's log to the preflight's prediction, rank by rank (no torch needed)"
USAGE = ("python -m checker postflight [--report PREFLIGHT.json] LOG [LOG ...]",)
"""Each form, whole: the command takes logs, not a launch command."""
DESCRIPTION = """\
After the server has started, read its own log (every node's, one file each or concatenated; - reads
standard input; gzip is read as is) and hold what every rank logged to what the preflight predicted for
it (--report, the preflight's JSON report): max_mamba_cache_size on every rank, max_running_requests on
each stage's TP 0, pp_max_micro_batch_size recomputed from it as the release does, and the weights' mem
usage against the weights figure the preflight's budget used. A divergence names the rank, its host,
the value predicted and logged, and the most likely cause. Exit 0 consistent, 1 divergent, 2 error
(unreadable input, or a rank the logs lack). Without --report: what every rank logged, with its prefix
and line, and whether the ranks agree (exit 0; 2 when nothing could be read)."""
EXAMPLES = (
    "python -m checker postflight --report examples/logs/preflight.json examples/logs/node?.log",
    "# node 1 started with smaller pools: exit 1, naming ranks 2-3, both values and the likely cause",
    "cd examples/logs && python -m checker postflight --report preflight.json node0.log other-node1.log",
    "python -m checker postflight examples/logs/node0.log --format json  # what each rank logged",
)
READ_OPTIONS: dict[str, str] = {"report": "--report", "logs": "LOG"}
"""postflight's options whose values name files it reads (dest -> how a message names it): no output
replaces one (checker.launch.inputs.READ_OPTIONS is the deriving commands')."""
MARGIN_GIB = bounded_float(low=0, high=1024, low_inclusive=True, what=" GiB")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="a server log (- for standard input)")
    g = parser.add_argument_group("prediction")
    g.add_argument(
        "--report",
        metavar="PREFLIGHT.json",
        help="the preflight's JSON report (checker check --report): what to hold the log to",
    )
    g.add_argument(
        "--weights-margin-gib",
        type=MARGIN_GIB,
        default=WEIGHTS_MARGIN_GIB,
        metavar="GIB",
        help="how far a rank's logged weights may be from the preflight's figure "
        f"(default {WEIGHTS_MARGIN_GIB:g})",
    )
    o = parser.add_argument_group("output")
    o.add_argument(
        "--postflight-report",
        metavar="PATH",
        help="write the post-flight's JSON report here (docs/postflight.schema.json)",
    )
    o.add_argument("--junit", metavar="PATH", help="write JUnit XML here: one case per value held")
    o.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="what goes to stdout: text (default) or the JSON report",
    )
    o.add_argument("--quiet", "-q", action="store_true", help="print only the one-line verdict")


def _check_outputs(args: argparse.Namespace) -> None:
    """Before anything is written: no output may be an input (the preflight report, a log) or another
    output's file (:func:`checker.files.check_outputs`, the one check every command uses)."""
    # start-up: the bounded writers load only when the run writes, not for --help
    from checker.files import check_outputs

    outputs = [
        ("--postflight-report", args.postflight_report),
        ("--junit", args.junit),
        ("GITHUB_STEP_SUMMARY", os.environ.get("GITHUB_STEP_SUMMARY")),
    ]
    inputs: list[tuple[str, str | None]] = []
    for dest, label in READ_OPTIONS.items():
        value = getattr(args, dest)
        inputs += [(label, p) for p in (value if isinstance(value, list) else [value]) if p != "-"]
    check_outputs(outputs, inputs)


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.launch is not None:
        raise FlagError("postflight takes the server's logs, not a launch command after --; drop the --")
    _check_outputs(args)
    try:
        return _run(args, t0)
    except CheckerInputError as exc:
        return _error(args, str(exc))
    except BrokenPipeError:
        raise  # `| head`: the reader left (checker.cli.main ends quietly)
    except OSError as exc:  # a log that cannot be read (LogReadError and its kin): one line
        return _error(args, str(exc))


def _run(args: argparse.Namespace, t0: float) -> int:
    # start-up: the report writer and the bounded writers load only when it writes
    from checker.outputs import postflight as out
    from checker.outputs.render import emit, write_artifacts

    if args.logs.count("-") > 1:
        raise FlagError("- (standard input) is given twice; give it once")
    prediction = read_prediction(args.report) if args.report else None
    reading = read_logs(args.logs, stdin=sys.stdin.buffer if "-" in args.logs and sys.stdin else None)
    errors, warnings = findings(reading)
    reads = ranks_read(reading)
    if prediction is None:
        result = across(reads, log_errors=errors, log_warnings=warnings)
    else:
        result = hold(
            prediction,
            reads,
            weights_margin_gib=args.weights_margin_gib,
            log_errors=errors,
            log_warnings=warnings,
        )
    doc = out.document(result, reading, report=args.report, elapsed_s=time.monotonic() - t0)
    problems = write_artifacts(
        doc, report=args.postflight_report, report_flag="--postflight-report", junit=args.junit
    )
    emit(doc, args)
    for p in problems:  # the one policy for an output that cannot be written (checker.status)
        print(f"checker postflight: error: {p}{undelivered_note(result.exit_code)}", file=sys.stderr)
    return exit_after_outputs(result.exit_code, undelivered=bool(problems))


def _error(args: argparse.Namespace, message: str) -> int:
    """Unreadable input: one line on stderr, exit 2, and the error in every artefact asked for."""
    # start-up: the report writer and the bounded writers load only when logs were read
    from checker.outputs import postflight as out
    from checker.outputs.render import emit, write_artifacts

    line = f"checker postflight: error: {message}"
    doc = out.error_document(message, report=args.report, logs=args.logs)
    write_artifacts(doc, report=args.postflight_report, report_flag="--postflight-report", junit=args.junit)
    emit(doc, args)
    print(line, file=sys.stderr)
    return 2
