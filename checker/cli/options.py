"""The model and flag options every command shares (SGLang's flag names), and how they become inputs.

Kept free of torch so ``--help`` and bad-input errors cost no torch import.
"""

from __future__ import annotations

import argparse
import math

from checker.core.models import DEFAULT_MODEL, PRESETS
from checker.core.sizing import POLICIES, STRATEGIES
from checker.core.sweep import MAX_BUDGET_GIB

DEFAULT_BUDGET_GIB = 8.0
"""derive, plan and sweep only: the upstream unit test's budget. check requires an explicit source."""
MAX_GIB = MAX_BUDGET_GIB
"""1 PiB: far above any device or host, low enough that bytes = GiB * 2**30 stay exact in an int64."""
MAX_TIMEOUT_S = 86_400.0
MAX_MEMORY_RATIO = 1000.0
"""--mamba-full-memory-ratio above this leaves the KV pool under 0.1% of the budget: not a setting."""


def int_at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``, with a one-line reason otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise argparse.ArgumentTypeError(f"{value} must be {what}")
        return value

    return parse


positive_int = int_at_least(1)
MAX_PARALLEL = 1024
"""--pp/--tp/--dp sizes above this are no deployment (and a single-process derive walks every stage)."""


def parallel_size(text: str) -> int:
    value = positive_int(text)
    if value > MAX_PARALLEL:
        raise argparse.ArgumentTypeError(f"{value} must be at most {MAX_PARALLEL:,}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def bounded_float(*, low: float, high: float, low_inclusive: bool = False, what: str = ""):
    """An argparse type: a finite number in (low, high] (or [low, high]), with a one-line reason."""

    def parse(text: str) -> float:
        value = finite_float(text)
        too_low = value < low if low_inclusive else value <= low
        if too_low or value > high:
            lo = "[" if low_inclusive else "("
            raise argparse.ArgumentTypeError(f"{text} must be in {lo}{low:g}, {high:,.0f}]{what}")
        return value

    return parse


positive_gib = bounded_float(low=0, high=MAX_GIB, what=" GiB")
unit_fraction = bounded_float(low=0, high=1.0, what=" (a fraction of free memory)")
timeout_seconds = bounded_float(low=0, high=MAX_TIMEOUT_S, what=" seconds")
memory_ratio = bounded_float(low=0, high=MAX_MEMORY_RATIO)


def gib_list(text: str) -> tuple[float, ...]:
    """GIB[,GIB...]: one or more positive GiB values."""
    values = tuple(positive_gib(part.strip()) for part in text.split(","))
    return values


def dtype_name(text: str) -> str:
    """--mamba-ssm-dtype: a dtype SGLang knows, checked where it is typed (empty is not unset)."""
    from checker.core.errors import CheckerInputError
    from checker.core.geometry import canonical_dtype

    try:
        canonical_dtype(text, source="value")
    except CheckerInputError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("value=", "", 1)) from None
    return text


def init_method(text: str) -> str:
    """--init-method: file:///path (a fresh file in an existing directory) or env://."""
    from checker.distributed.rendezvous import init_method_problem

    problem = init_method_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def add_model_args(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    g = parser.add_argument_group("model" + (" (one is required)" if required else ""))
    # Not required by argparse even when the command needs it: a launch command after `--` can name
    # the model (--model-path), which argparse never sees. The command checks it (config_from_args).
    m = g.add_mutually_exclusive_group()
    default = "" if required else f"; default {DEFAULT_MODEL} when no config is given"
    m.add_argument("--model", metavar="NAME", help=f"built-in preset ({', '.join(PRESETS)}){default}")
    m.add_argument(
        "--model-config",
        "--model-path",
        dest="model_config",
        metavar="PATH",
        help="a model directory holding config.json (SGLang's --model-path), an HF config.json "
        "(Qwen3-Next, Qwen3.5, Kimi-Linear, Nemotron-H, Falcon-H1, Granite-4.0-H), or a JSON model spec "
        "(see docs/preflight.md)",
    )


def add_layout_args(parser: argparse.ArgumentParser, *, pp_default: int | None) -> None:
    g = parser.add_argument_group("parallel layout")
    g.add_argument(
        "--pp-size",
        type=parallel_size,
        default=pp_default,
        help="pipeline-parallel size P"
        + (f" (default {pp_default})" if pp_default else " (default: world_size // tp_size)"),
    )
    g.add_argument("--tp-size", type=parallel_size, default=1, help="attention TP size (default 1)")
    g.add_argument("--dp-size", type=parallel_size, default=1, help="attention DP size (default 1)")


def add_flag_args(
    parser: argparse.ArgumentParser,
    *,
    with_budget: bool = True,
    with_policy: bool = True,
    budget_required_hint: bool = False,
) -> None:
    """``with_policy=False``: the command adds its own --policy (a sweep takes it repeatable)."""
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
    if with_policy:
        g.add_argument(
            "--policy",
            choices=POLICIES,
            default=None,
            help="how a stage is charged for state (default: the release's own: whole-model up to "
            "SGLang 0.5.16, max-share from 0.5.17); own-share is the rejected alternative, for what-ifs",
        )
    g.add_argument(
        "--mamba-full-memory-ratio",
        type=memory_ratio,
        default=None,
        metavar="R",
        help="r: the state pool's share is r/(1+r) of the budget (default: the release's, 0.9)",
    )
    g.add_argument(
        "--mamba-radix-cache-strategy",
        choices=STRATEGIES,
        default="auto",
        help="default auto: extra_buffer unless --disable-overlap-schedule with page_size 1 "
        "(then no_buffer); under pp > 1 extra_buffer runs without overlap: 4 slots. "
        "An explicit no_buffer needs --disable-overlap-schedule and page_size 1, as in SGLang",
    )
    g.add_argument(
        "--page-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="KV cache page size in tokens (default 1)",
    )
    g.add_argument(
        "--disable-radix-cache", action="store_true", help="no prefix cache: 1 state slot per request"
    )
    g.add_argument(
        "--disable-overlap-schedule", action="store_true", help="(forced on by SGLang whenever pp size > 1)"
    )
    g.add_argument(
        "--max-running-requests",
        type=positive_int,
        metavar="N",
        help="cap on running requests (SGLang's flag); with --disable-radix-cache it sizes the pool",
    )
    g.add_argument(
        "--max-mamba-cache-size",
        type=positive_int,
        metavar="K",
        help="an explicit state pool size K (skips the auto-fit)",
    )
    g.add_argument(
        "--pp-max-micro-batch-size",
        type=positive_int,
        metavar="N",
        help="cap on the micro-batch size under pp (default: max_running_requests // pp_size)",
    )
    g.add_argument(
        "--speculative-num-draft-tokens",
        type=positive_int,
        metavar="D",
        help="spec decoding draft tokens (needs --max-running-requests)",
    )
    g.add_argument(
        "--mamba-ssm-dtype",
        type=dtype_name,
        metavar="DTYPE",
        help="temporal state dtype (float32, bfloat16, float16); sets SGLANG_MAMBA_SSM_DTYPE",
    )
    g.add_argument(
        "--token-capacity",
        type=positive_int,
        metavar="T",
        help="KV token capacity; unset means it does not bind",
    )
    g.add_argument(
        "--context-len",
        type=positive_int,
        metavar="N",
        help="context length for the running-request estimate (default: the config's)",
    )


def add_engine_args(parser: argparse.ArgumentParser) -> None:
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
