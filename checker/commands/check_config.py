"""``checker check``'s flags -> its typed config (:class:`checker.config.PreflightConfig`): every
refusal of a flag combination the preflight cannot run (one line naming the flag, exit 2), the weights
figures of ``--weights-from-log``, and what the check writes, checked against what it reads before
anything is written.
"""

from __future__ import annotations

import argparse
import os

from checker.commands.group_flags import group_options
from checker.commands.options import check_run_outputs
from checker.config import (
    MISSING_FRACTION,
    BudgetSource,
    EngineChoice,
    ModelChoice,
    OutputOptions,
    PreflightConfig,
    SizingFlags,
    WeightsFlags,
)
from checker.core.errors import FlagError
from checker.distributed.launch_env import RankEnv
from checker.launch.merge import given_flags, launch_text
from checker.loading import load_torch


def output_paths(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """What a check writes, in the order it writes it (rank 0's artefacts, then torchrun's error file)."""
    return [
        ("--report", args.report),
        ("--junit", args.junit),
        ("--plot", args.plot),
        ("GITHUB_STEP_SUMMARY", os.environ.get("GITHUB_STEP_SUMMARY")),
        ("TORCHELASTIC_ERROR_FILE", os.environ.get("TORCHELASTIC_ERROR_FILE")),
    ]


def config_from_args(args: argparse.Namespace, env: RankEnv) -> PreflightConfig:
    """The typed config; every refusal here is the user's (exit 2) and names the flag."""
    if not args.model and not args.model_config:
        raise FlagError(
            "give a model: --model NAME (a preset), --model-config PATH (a model directory or its "
            "config.json), or the deployment's launch command after -- (its --model-path)"
        )
    if args.budget_gib is None and not args.budget_from_device:
        raise FlagError(
            "give a budget source: --budget-gib GIB (memory left for the KV and state pools) "
            "or --budget-from-device (free device memory x --mem-fraction-static)"
        )
    if args.budget_gib is not None and args.budget_from_device:
        raise FlagError("--budget-gib and --budget-from-device are two budget sources; give one")
    total_from_device = False
    if args.budget_from_device and args.mem_fraction_static is None and args.device_total_gib is None:
        # The release's default needs the GPU's total memory: this rank's GPU, read at derive time
        load_torch()  # before the group: the rank's first import of torch
        import torch  # torch: loaded just above

        total_from_device = torch.cuda.is_available()
        if not total_from_device:
            raise FlagError(MISSING_FRACTION)
    if args.device_total_gib is not None and (not args.budget_from_device or args.mem_fraction_static):
        raise FlagError(
            "--device-total-gib gives the GPU's total memory for the release's default "
            "--mem-fraction-static: give it with --budget-from-device and without a fraction"
        )
    if args.device_free_gib and not args.budget_from_device:
        raise FlagError("--device-free-gib only applies with --budget-from-device")
    if args.weights_gib and not args.budget_from_device:
        raise FlagError("--weights-gib only applies with --budget-from-device")
    weights, weights_source = tuple(args.weights_gib or ()), None
    if args.weights_from_log:
        if not args.budget_from_device or args.weights_gib:
            raise FlagError(
                "--weights-from-log gives the weights figure of --budget-from-device: give it with "
                "--budget-from-device and without --weights-gib"
            )
        # start-up: the log reader and its format table load only for --weights-from-log
        from checker.postflight.harvest import logged_weights

        logged = logged_weights(args.weights_from_log)
        weights = logged.per_rank(env.world_size, group=args.tp_size * args.dp_size)
        weights_source = logged.source
    if env.world_size == 1 and not args.allow_single_rank:
        raise FlagError(
            "check is running as one rank, which compares nothing: launch it under torchrun with every "
            "rank of the deployment (torchrun --nproc-per-node N -m checker ...), or pass "
            "--allow-single-rank for a single-rank deployment"
        )
    check_run_outputs(args, output_paths(args))
    if args.plot and env.rank == 0:  # the rank that plots: refused before any verdict is printed
        from checker.outputs.plot import require_matplotlib  # the optional 'plot' extra

        require_matplotlib()
    model = ModelChoice.from_args(args)
    return PreflightConfig(
        model=model,
        sizing=SizingFlags.from_args(args),
        engine=EngineChoice.from_args(args),
        group=group_options(args),
        budget=BudgetSource(
            budget_gib=args.budget_gib,
            from_device=args.budget_from_device,
            mem_fraction_static=args.mem_fraction_static,
            device_total_gib=args.device_total_gib,
            total_from_device=total_from_device,
            device_free_gib=tuple(args.device_free_gib or ()),
            weights_gib=weights,
            weights_source=weights_source,
            weights=WeightsFlags.from_args(args, model),
            agree=not args.no_agree_budget,
        ),
        output=OutputOptions(
            report=args.report, junit=args.junit, format=args.format, quiet=args.quiet, plot=args.plot
        ),
        strict_inputs=args.strict_inputs,
        materialize=args.materialize,
        materialize_device=args.materialize_device,
        launch_command=launch_text(args),
        launch=getattr(args, "launch", None),
        given=given_flags(args),
    )
