"""The model and flag options every command shares (SGLang's flag names), and the check of a run's
outputs against what it reads. The flags' types are :mod:`checker.commands.flag_types`; what a run
reads, :mod:`checker.launch.inputs`.

Kept free of torch so ``--help`` and bad-input errors cost no torch import.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, Protocol

from checker.commands.flag_types import positive_gib, positive_int, row_type
from checker.core.sizing.server_args import SIZING_ARG, SIZING_ARGS, ServerArg
from checker.families import DEFAULT_MODEL, PRESETS
from checker.launch.inputs import READ_OPTIONS, run_inputs


class FlagGroup(Protocol):
    """Where a flag is added: a parser or one of its groups (argparse keeps their common base private)."""

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action: ...


DEFAULT_BUDGET_GIB = 8.0
"""derive, plan and sweep only: the upstream unit test's budget. check requires an explicit source."""


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


def add_sizing_flag(group: FlagGroup, name: str, **override: object) -> None:
    """A sizing input's flag given a command's own meaning (plan's --policy): ``override``'s help, default."""
    _add_row(group, SIZING_ARG[name], **override)


def _add_row(group: FlagGroup, row: ServerArg, **override: object) -> None:
    """One sizing input's flag, as its row defines it (``override``: the command's default and help)."""
    kwargs: dict[str, object] = {"default": row.default, "help": row.help}
    if row.kind is bool:
        kwargs["action"] = "store_true"
    elif row.choices is not None:
        kwargs["choices"] = row.choices
    else:
        kwargs.update(type=row_type(row), metavar=row.metavar)
    group.add_argument(row.flag, **{**kwargs, **override})


def add_gpu_sm_count(group: Any) -> None:
    """``--gpu-sm-count``: the SMs each Marlin workspace (GPTQ, AWQ, NVFP4 on Hopper, compressed-tensors
    WNA16) is sized for where the GPU cannot be read (checker.core.weights.weights.MARLIN_SMS)."""
    group.add_argument(
        "--gpu-sm-count",
        type=positive_int,
        metavar="N",
        help="the GPU's streaming multiprocessors, which size each Marlin workspace of a GPTQ/AWQ/NVFP4/"
        "WNA16 checkpoint (one int32 per SM a layer); default: a GPU rank's own, else 132 (H100 SXM, "
        "H200; an H100 PCIe has 114), said in the weights line",
    )


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
    # start-up: the engine registry loads only for the commands that take --engine (bench/startup_bench.py)
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


def add_output_args(
    parser: argparse.ArgumentParser,
    *,
    report: str | None = None,
    junit: bool = False,
    quiet: str = "print only the one-line verdict",
    plot: str | None = None,
) -> None:
    """--report (with ``report`` as its help), --junit, --format text|json and --quiet: every command's;
    --plot (with ``plot`` as its help) where given."""
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
    if plot:
        g.add_argument("--plot", metavar="FILE.png", help=plot)


def read_options(args: argparse.Namespace) -> dict[str, object]:
    """The values of :data:`READ_OPTIONS` a parsed command line holds (what :func:`run_inputs` takes)."""
    return {dest: getattr(args, dest, None) for dest in READ_OPTIONS}


def check_run_outputs(args: argparse.Namespace, outputs: Sequence[tuple[str, str | None]]) -> None:
    """Before anything is written: every output ``(flag, path)`` checked against the run's inputs
    (:func:`run_inputs`) and the other outputs (:func:`checker.files.check_outputs`); FlagError if not."""
    # start-up: the bounded writers load only to check outputs, not for --help (bench/startup_bench.py)
    from checker.files import check_outputs

    launch = getattr(args, "launch", None)
    inputs = run_inputs(launch=launch.argv if launch is not None else None, **read_options(args))
    check_outputs(outputs, inputs)
