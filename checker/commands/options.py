"""The model and flag options every command shares (SGLang's flag names), and how they become inputs.

Kept free of torch so ``--help`` and bad-input errors cost no torch import.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence

from checker.core.budget import MAX_BUDGET_GIB
from checker.core.errors import SHOWN_CHARS, CheckerInputError, shorten
from checker.core.models import DEFAULT_MODEL, PRESETS
from checker.core.server_args import MEM_FRACTION_STATIC, SIZING_ARG, SIZING_ARGS, ServerArg
from checker.distributed.rendezvous import init_method_problem

DEFAULT_BUDGET_GIB = 8.0
"""derive, plan and sweep only: the upstream unit test's budget. check requires an explicit source."""
MAX_GIB = MAX_BUDGET_GIB
"""1 PiB: far above any device or host, low enough that bytes = GiB * 2**30 stay exact in an int64."""
MAX_TIMEOUT_S = 86_400.0


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # also past Python's 4,300-digit limit; shorten: the line stays one short line
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not an integer") from None


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, with a one-line reason otherwise."""

    def parse(text: str) -> int:
        value = integer(text)
        if value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise argparse.ArgumentTypeError(f"{value} must be {what}")
        return value

    return parse


positive_int = int_at_least(1)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{shorten(text)} must be a finite number")
    return value


def bounded_float(
    *, low: float, high: float, low_inclusive: bool = False, what: str = ""
) -> Callable[[str], float]:
    """An argparse type: a finite number in (low, high] (or [low, high]), with a one-line reason."""

    def parse(text: str) -> float:
        value = finite_float(text)
        too_low = value < low if low_inclusive else value <= low
        if too_low or value > high:
            lo = "[" if low_inclusive else "("
            raise argparse.ArgumentTypeError(f"{text} must be in {lo}{low:g}, {high:,.0f}]{what}")
        return value

    return parse


def row_type(row: ServerArg) -> Callable[[str], object]:
    """An argparse type for a sizing input: the text read as the row's kind, then checked by the row
    (:mod:`checker.core.server_args`), so the flag refuses exactly what the typed config refuses."""

    def parse(text: str) -> object:
        value: object = text
        if row.kind is int:
            value = integer(text)
        elif row.kind is float:
            value = finite_float(text)
        problem = row.refusal(value, shown=text if len(text) <= SHOWN_CHARS else shorten(text))
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    return parse


# The edge: a GiB value from the command line (--budget-gib, --device-free-gib, ...) is checked here,
# once, and keeps its name (budget_gib) down to the row. CapacityInputs (checker.core.sizing) is the one
# validating constructor every derivation builds; for a value that came through here its check cannot
# fire, it is there for callers that are not the parser (code, a plan's search, a config file).
positive_gib = bounded_float(low=0, high=MAX_GIB, what=" GiB")
unit_fraction = row_type(MEM_FRACTION_STATIC)
timeout_seconds = bounded_float(low=0, high=MAX_TIMEOUT_S, what=" seconds")


def gib_list(text: str) -> tuple[float, ...]:
    """GIB[,GIB...]: one or more positive GiB values."""
    values = tuple(positive_gib(part.strip()) for part in text.split(","))
    return values


def init_method(text: str) -> str:
    """--init-method: file:///path (a fresh file in an existing directory) or env://."""

    problem = init_method_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _preset_name(text: str) -> str:
    """--model NAME: an empty name is refused here, not read as "no model given" (which is the default
    preset: a typo'd CI variable, ``--model "$MODEL"``, would check kimi-k3 without a word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a preset name ({', '.join(PRESETS)}); "
            "pass --model-config PATH for anything else"
        )
    return text


def add_model_args(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    g = parser.add_argument_group("model" + (" (one is required)" if required else ""))
    # Not required by argparse even when the command needs it: a launch command after `--` can name
    # the model (--model-path), which argparse never sees. The command checks it (config_from_args).
    m = g.add_mutually_exclusive_group()
    default = "" if required else f"; default {DEFAULT_MODEL} when no config is given"
    m.add_argument(
        "--model", metavar="NAME", type=_preset_name, help=f"built-in preset ({', '.join(PRESETS)}){default}"
    )
    m.add_argument(
        "--model-config",
        "--model-path",
        dest="model_config",
        metavar="PATH",
        help="a model directory holding config.json (SGLang's --model-path), an HF config.json "
        "(Qwen3-Next, Qwen3.5, Kimi-Linear, Nemotron-H, Falcon-H1, Granite-4.0-H), or a JSON model spec "
        "(see docs/preflight.md)",
    )


def add_sizing_flag(group: argparse._ActionsContainer, name: str, **override: object) -> None:
    """One sizing input's flag where a command gives it its own meaning (plan's --policy): the row's
    type and choices, ``override``'s help or default."""
    _add_row(group, SIZING_ARG[name], **override)


def _add_row(group: argparse._ActionsContainer, row: ServerArg, **override: object) -> None:
    """One sizing input's flag, as its row defines it (``override``: the command's default and help)."""
    kwargs: dict[str, object] = {"default": row.default, "help": row.help}
    if row.kind is bool:
        kwargs["action"] = "store_true"
    elif row.choices is not None:
        kwargs["choices"] = row.choices
    else:
        kwargs.update(type=row_type(row), metavar=row.metavar)
    # argparse's keyword arguments, each typed apart in its stubs; assembled here per row kind
    group.add_argument(row.flag, **{**kwargs, **override})  # type: ignore[arg-type]


def add_layout_args(parser: argparse.ArgumentParser, *, pp_default: int | None) -> None:
    g = parser.add_argument_group("parallel layout")
    for row in SIZING_ARGS:
        if not row.layout:
            continue
        if row.name == "pp_size":
            default = f" (default {pp_default})" if pp_default else " (default: world_size // (tp x dp))"
            _add_row(g, row, default=pp_default, help=row.help + default)
        else:
            _add_row(g, row)


def add_flag_args(
    parser: argparse.ArgumentParser,
    *,
    with_budget: bool = True,
    with_policy: bool = True,
    budget_required_hint: bool = False,
) -> None:
    """Every sizing input of the table but the layout's; ``with_policy=False``: the command adds its own
    --policy (a sweep takes it repeatable, plan with its own meaning of unset)."""
    g = parser.add_argument_group("sizing flags (SGLang server-arg names)")
    if with_budget:
        default = (
            "this or --budget-from-device is required"
            if budget_required_hint
            else f"default {DEFAULT_BUDGET_GIB}, the upstream test's"
        )
        g.add_argument(
            "--budget-gib",
            type=positive_gib,
            default=None,
            metavar="GIB",
            help=f"total_rest_memory handed to pool sizing: GiB left for the KV and state pools ({default})",
        )
    for row in SIZING_ARGS:
        if not row.layout and (with_policy or row.name != "policy"):
            _add_row(g, row)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    # start-up: the engine registry (~3.5 ms with logging) loads only for the commands that take --engine
    from checker.engines import DEFAULT_ENGINE, ENGINES

    g = parser.add_argument_group("engine")
    g.add_argument(
        "--engine",
        choices=ENGINES,
        default=DEFAULT_ENGINE,
        help="who derives: builtin (the checker's model of SGLang, default), sglang (the installed "
        "SGLang's own sizing code, on CPU, no server), both (derive with each; any difference is a "
        "model drift finding, exit 4)",
    )
    g.add_argument(
        "--sglang-version",
        metavar="X.Y.Z",
        help="derive as this SGLang release (planning an upgrade, or ranks without SGLang installed); "
        "default: the installed release, else the newest modelled one (see docs/sglang-releases.md)",
    )
    g.add_argument(
        "--sglang-best-effort",
        action="store_true",
        help="derive a release newer than the newest modelled one with the newest model (and let "
        "--engine sglang/both try an unsupported installed SGLang)",
    )


def add_group_args(g: argparse._ActionsContainer) -> None:
    """Options of any command that runs over a process group (check, sweep)."""
    g.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: nccl with tensors on cuda:LOCAL_RANK when a GPU is present, else gloo",
    )
    g.add_argument(
        "--timeout-s",
        type=timeout_seconds,
        default=60.0,
        metavar="S",
        help="bound on init and on every collective; a lost rank ends the run after about "
        "this long with status infrastructure_failure (default 60)",
    )
    g.add_argument(
        "--init-method",
        type=init_method,
        metavar="URL",
        default=None,
        help="rendezvous without torchrun: file:///path/to/fresh/file (tests); default: "
        "torchrun's store from MASTER_ADDR/MASTER_PORT",
    )


def add_output_args(
    parser: argparse.ArgumentParser,
    *,
    report: str | None = None,
    junit: bool = False,
    quiet: str = "print only the one-line verdict",
) -> None:
    """--report (with ``report`` as its help), --junit, --format text|json and --quiet: every command's."""
    g = parser.add_argument_group("output")
    if report:
        g.add_argument("--report", metavar="PATH", help=report)
    if junit:
        g.add_argument("--junit", metavar="PATH", help="write JUnit XML here (rank 0)")
    g.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="what goes to stdout: text (default) or the JSON document (docs/json-output.md)",
    )
    g.add_argument("--quiet", "-q", action="store_true", help=quiet)


# ------------------------------------------------------------------------------------------------------
# Outputs against inputs: the one check every command that writes files runs before it writes any
# ------------------------------------------------------------------------------------------------------

LAUNCH_INPUT_FLAGS = (
    "--model-path",
    "--model",
    "--tokenizer-path",
    "--config",
    "--speculative-draft-model-path",
)
"""The launch command's flags that name what the server reads (``--model`` is ``--model-path``'s alias in
every release); an output must be none of them, and lie in none of their directories."""


def _word_value(words: Sequence[str], flag: str) -> str | None:
    """The last value of ``flag`` (``flag V`` or ``flag=V``) in ``words``, as argparse keeps the last."""
    value = None
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def _local(path: str, revision: str | None = None) -> str:
    """A hub id as the local snapshot the run reads (the model's own rule); itself where it is none."""
    # start-up: the hub cache rules (~2.5 ms) load only for a hub id or a model directory
    from checker.core.hub_cache import local_model_path

    try:
        return local_model_path(path, revision=revision)
    except CheckerInputError:
        return path  # not cached: the model's own read says so; nothing here to protect


READ_OPTIONS: dict[str, str] = {
    "model_config": "--model-config",
    "weights_from_log": "--weights-from-log",
    "init_method": "--init-method",
}
"""The checker's own options whose values name files the run reads (dest -> flag), in every command that
takes them: no output may replace one (:func:`run_inputs`). postflight's are its own (its --report and
logs). tests/test_output_paths.py walks every parser: an option that names a file and is in neither
this list nor the outputs fails it."""


def _hub_snapshot(value: str, *, revision: str | None, download_dir: str | None) -> str | None:
    """The snapshot under ``--download-dir`` SGLang reads a hub id's weights from
    (``snapshot_download(cache_dir=download_dir)``), where it is there; None otherwise."""
    if not download_dir or os.path.exists(value):
        return None
    # start-up: the hub cache rules (~2.5 ms) load only for a hub id under --download-dir
    from checker.core.hub_cache import is_hub_id, local_model_path

    if not is_hub_id(value):
        return None
    try:
        return local_model_path(value, revision=revision, cache_dir=download_dir)
    except CheckerInputError:
        return None  # not downloaded there yet: SGLang fetches it at start-up; nothing to protect


def run_inputs(*, launch: Sequence[str] | None, **given: object) -> list[tuple[str, str]]:
    """What a run reads, each with how it was named: the launch command's model (and tokenizer, draft
    model, ``--config`` file; a hub id's snapshot in the hub cache, and under ``--download-dir`` where
    the weights are read from), and the checker's own options of :data:`READ_OPTIONS` (``given``: dest
    -> the value as given, one path or a list; ``--model-config``'s model directory too). Read from the
    words as given, so a command line that failed to parse is checked too."""
    unknown = set(given) - set(READ_OPTIONS)
    if unknown:
        raise TypeError(f"run_inputs: not options that name a file the run reads: {sorted(unknown)}")
    out: list[tuple[str, str]] = []
    words = list(launch or ())
    revision = _word_value(words, "--revision")
    download_dir = _word_value(words, "--download-dir")
    named = [(flag, _word_value(words, flag)) for flag in LAUNCH_INPUT_FLAGS]
    if len(words) > 2 and words[1] == "serve" and not words[2].startswith("-"):
        named.append(("--model-path", words[2]))  # `sglang serve MODEL` (0.5.16+)
    for flag, value in named:
        if value:
            model = flag in ("--model-path", "--model")
            local = _local(value, revision if model else None)
            out.append((f"the launch command's {flag}", local))
            if model and os.path.basename(local) == "config.json" and os.path.isfile(local):
                out.append(
                    (f"the model directory of the launch command's {flag}", os.path.dirname(local) or ".")
                )
            snapshot = _hub_snapshot(value, revision=revision, download_dir=download_dir) if model else None
            if snapshot is not None:
                out.append((f"the launch command's {flag} under --download-dir {download_dir}", snapshot))
    for dest, flag in READ_OPTIONS.items():
        raw = given.get(dest)
        values = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, (list, tuple)) else []
        for value in values:
            if not isinstance(value, str) or not value or value == "-":
                continue
            if dest == "init_method":
                if value.startswith("file://"):
                    out.append((flag, value.removeprefix("file://")))
                continue
            if dest != "model_config":
                out.append((flag, value))
                continue
            local = _local(value)
            out.append((flag, local))
            if os.path.basename(local) == "config.json" and os.path.isfile(local):
                # A model's config.json: its directory is the model SGLang loads (weights, tokenizer).
                out.append((f"the model directory of {flag}", os.path.dirname(local) or "."))
    return out


def read_options(args: argparse.Namespace) -> dict[str, object]:
    """The values of :data:`READ_OPTIONS` a parsed command line holds (what :func:`run_inputs` takes)."""
    return {dest: getattr(args, dest, None) for dest in READ_OPTIONS}


def check_run_outputs(args: argparse.Namespace, outputs: Sequence[tuple[str, str | None]]) -> None:
    """Before anything is written: every output ``(flag, path)`` checked against the run's inputs and the
    other outputs (:func:`checker.files.check_outputs`); FlagError, one line naming both."""
    # start-up: the bounded writers (~6-9 ms) load only when outputs are checked, not for --help
    from checker.files import check_outputs

    launch = getattr(args, "launch", None)
    inputs = run_inputs(launch=launch.argv if launch is not None else None, **read_options(args))
    check_outputs(outputs, inputs)
