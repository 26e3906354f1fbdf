"""``checker derive``: every stage's derivation in one process, for capacity planning.

The config (:class:`checker.config.DeriveConfig`) -> the engines of --engine over every stage ->
:mod:`checker.outputs.derive`; with several --sglang-version releases, each release's stages and the
rule changes between them (:mod:`checker.commands.derive_releases`); with --gpu-free-gib, the budget the
server gets (:mod:`checker.preflight.server_budget`). What a user reads in ``--help`` is
:data:`DESCRIPTION` and :data:`EXAMPLES`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from checker.commands.derive_releases import run_releases
from checker.commands.flag_types import positive_gib, unit_fraction, weights_gib
from checker.commands.options import (
    DEFAULT_BUDGET_GIB,
    add_engine_args,
    add_flag_args,
    add_gpu_sm_count,
    add_layout_args,
    add_model_args,
    add_output_args,
    check_run_outputs,
)
from checker.config import DeriveConfig
from checker.core.errors import FlagError
from checker.core.sizing.sizing import CapacityInputs, StageCapacity, divergent_values
from checker.device.materialize import materialize_stage, resolve_device
from checker.launch.merge import launch_text
from checker.outputs.derive import Derivation, derivation_document
from checker.outputs.render import emit
from checker.preflight.resolve import derive_engines, derive_inputs, with_release
from checker.preflight.server_budget import budget_the_server_gets
from checker.status import CONSISTENT, DIVERGENT, ERROR, EXIT_CODES, MODEL_DRIFT

if TYPE_CHECKING:  # torch is imported when --materialize runs
    from checker.device.materialize import MaterializeResult

HELP = "derive every stage's pool size and limits in one process (no torch needed)"
USAGE = ("python -m checker derive",)
DESCRIPTION = """\
Every pipeline stage's derivation in one process, for capacity planning: the max_mamba_cache_size,
max_running_requests and pp_max_micro_batch_size each stage derives, as the SGLang release does. No
torch, GPU or process group is needed. <launch command> is the deployment's SGLang command line, as in
check (python -m sglang.launch_server ARGS, sglang serve ARGS, or bare ARGS): the model and sizing
flags are read from it. With --gpu-free-gib the budget is the one the server gets: free memory before
the weights, the weights of every rank (--weights-gib, else the model directory's safetensors checkpoint
as the release's class holds them) and --mem-fraction-static (the launch command's), by the release's
own formula. Several releases (--sglang-version A,B) show each one's values and the rule changes that
explain a difference. Exit 0 whatever the stages derive (check is the gate), 2 on bad
input, 4 on model drift with --engine both."""
EXAMPLES = (
    "python -m checker derive --model kimi-k3 --pp-size 8 --budget-gib 8",
    "python -m checker derive -- sglang serve --model-path examples/models/Falcon-H1-0.5B --tp-size 2",
    "python -m checker derive --model-config examples/models/Nemotron-H-8B-Base-8K --format json",
    "python -m checker derive --model kimi-k3 --budget-gib 8 --sglang-version 0.5.17,0.5.23",
    "python -m checker derive --model kimi-k3 --pp-size 4 --budget-gib 8 --plot stages.png",
    "# what --mem-fraction-static 0.85 gives on an 80 GiB GPU (weights: the checkpoint's, or as given):",
    "python -m checker derive --gpu-free-gib 79 --weights-gib 8 --mem-fraction-static 0.85",
    "python -m checker derive --model kimi-k3 --pp-size 8 --max-mamba-cache-size 4 --materialize",
    "# SGLang's own code beside the checker's (exit 4 when the two differ):",
    "python -m checker derive --model-path examples/models/Qwen3.5-397B-A17B --engine both",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_layout_args(parser, pp_default=8)
    add_flag_args(parser)
    add_engine_args(parser)
    add_output_args(parser)
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="write a PNG: one stacked bar per stage (weights, state pool, KV pool, the reserved "
        "remainder, the memory the MIN leaves idle), the stage that limits the KV pool marked "
        "(needs the 'plot' extra)",
    )
    parser.add_argument(
        "--materialize",
        action="store_true",
        help="allocate every stage's pool for real, one stage at a time (SGLang's shapes "
        "and dtypes), and compare with the prediction; exit 2 on a failure or mismatch",
    )
    b = parser.add_argument_group(
        "the budget the server gets (instead of --budget-gib)",
        "SGLang sizes from free device memory measured before and after loading the weights, and "
        "--mem-fraction-static: give the free memory, and the budget is the release's own formula.",
    )
    b.add_argument(
        "--gpu-free-gib",
        type=positive_gib,
        metavar="GIB",
        help="free device memory before the weights load (e.g. 79 on an idle 80 GiB GPU)",
    )
    b.add_argument(
        "--weights-gib",
        type=weights_gib,
        metavar="GIB",
        help="with --gpu-free-gib: the weights on the busiest rank (GiB); default: the model directory's "
        "safetensors checkpoint, each rank's as the release's class holds them",
    )
    add_gpu_sm_count(b)
    b.add_argument(
        "--mem-fraction-static",
        type=unit_fraction,
        metavar="F",
        help="with --gpu-free-gib: the server's --mem-fraction-static (read from the launch command); "
        "unset, the release's own default for --device-total-gib",
    )
    b.add_argument(
        "--device-total-gib",
        type=positive_gib,
        metavar="GIB",
        help="with --gpu-free-gib and no --mem-fraction-static: the GPU's total memory as SGLang reads it "
        "(nvidia-smi memory.total / 1024, e.g. 79.65 on an H100 80GB); the fraction is then the one the "
        "release picks for it and the launch command's serving flags",
    )
    parser.add_argument(
        "--materialize-device",
        metavar="DEVICE",
        default="cpu",
        help="where --materialize allocates: cpu (default), cuda or cuda:N",
    )


def config_from_args(args: argparse.Namespace) -> DeriveConfig:
    config = DeriveConfig.from_args(
        args,
        default_budget_gib=DEFAULT_BUDGET_GIB,
        launch_command=launch_text(args, compared=False),
        materialize=args.materialize,
        materialize_device=args.materialize_device,
        plot=args.plot,
    )
    if args.plot:  # refused before any output: a path that is an input, or no matplotlib
        if len(config.releases) > 1:
            raise FlagError("--plot draws one release's stages; give one --sglang-version")
        check_run_outputs(args, [("--plot", args.plot)])
        from checker.outputs.plot import require_matplotlib  # the optional 'plot' extra

        require_matplotlib()
    config = budget_the_server_gets(config, args)
    # one release: chosen here, after every flag check (A,B: each release's, as it is derived)
    return config if len(config.releases) > 1 else with_release(config)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if len(config.releases) > 1:
        return run_releases(config)
    return run_derive(config)


def run_derive(config: DeriveConfig) -> int:
    """Every stage with the engines of --engine; --materialize allocates each one after."""
    inputs = derive_inputs(config, os.environ)
    engines = derive_engines(config, inputs, os.environ)
    stages, drifts = engines.derive_all(inputs.pp_size)
    materialized, materialize_s = None, 0.0
    if stages is not None and config.materialize:
        t0 = time.monotonic()
        materialized = materialize_all(inputs, stages, config.materialize_device)
        materialize_s = time.monotonic() - t0
    failed = [m for m in materialized or [] if not m.ok]
    if failed:
        status, code = ERROR, EXIT_CODES[ERROR]
    elif drifts:  # with no stages: the builtin refused a stage SGLang derives, only the drift to show
        status, code = MODEL_DRIFT, EXIT_CODES[MODEL_DRIFT]
    else:  # a divergence is derive's answer, not its failure: exit 0 (check is the gate)
        status, code = (DIVERGENT if divergent_values(stages or []) else CONSISTENT), 0
    result = Derivation(
        config=config,
        inputs=inputs,
        stages=stages,
        drifts=drifts,
        engine=engines.mode,
        sglang_version=engines.sglang_version,
        who=engines.who(),
        status=status,
        exit_code=code,
        materialized=materialized,
        materialize_s=materialize_s,
    )
    emit(derivation_document(result), config.output)
    if config.plot and stages is not None:
        from checker.outputs.stage_plot import derive_plot  # matplotlib: only for --plot

        derive_plot(config, inputs, stages)
    for m in failed:
        print(f"checker: error: {m.error}", file=sys.stderr)
    return code


def materialize_all(
    inputs: CapacityInputs, stages: list[StageCapacity], device_name: str
) -> list[MaterializeResult]:
    """One stage at a time, each freed before the next: the peak is the largest stage, not the sum."""

    device = resolve_device(device_name)
    return [materialize_stage(inputs, s, device) for s in stages]
