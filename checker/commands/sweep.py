"""``checker sweep``: where in budget space each charging policy makes the stages disagree.

One process derives every stage (:func:`run_single_process`, vectorised by :mod:`checker.device.sweep`,
bit-identical to the scalar core); under torchrun each rank derives only its own stage and the run
protocol gathers them (:mod:`checker.commands.sweep_job`): some rank's error or a lost rank is a line on
rank 0 and a --report, and every rank leaves with the same exit code (3 for a lost rank). What a user
reads in ``--help`` is :data:`DESCRIPTION` and :data:`EXAMPLES`.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from checker.commands import lifecycle
from checker.commands.group_flags import add_group_args, group_options
from checker.commands.lifecycle import GroupCommand, GroupFlags
from checker.commands.options import (
    add_flag_args,
    add_layout_args,
    add_model_args,
    add_output_args,
    check_run_outputs,
)
from checker.config import ModelChoice, OutputOptions, SizingFlags, SweepConfig
from checker.core.sizing.sizing import POLICIES
from checker.core.sizing.sweep import UPSTREAM_GRID
from checker.distributed.launch_env import RankEnv

if TYPE_CHECKING:
    from checker.commands.sweep_job import SweepJob

DEFAULT_PP_SIZE = 8
"""Without torchrun a sweep derives every stage of a pp 8 deployment unless --pp-size says otherwise."""
HELP = "sweep budgets: where each policy makes pipeline stages diverge (text, JSON report, plot)"
USAGE = ("python -m checker sweep", "torchrun [torchrun options] -m checker sweep")
DESCRIPTION = """\
Where in budget space each charging policy makes the pipeline stages disagree. Every stage derives its
max_mamba_cache_size, max_running_requests and pp_max_micro_batch_size at every budget of the grid,
exactly as check derives them; then, per policy and value, the budgets where the stages diverge are
counted. A budget at which no stage can boot is a boot failure, not a divergence; one at which some
stages boot and others do not is divergent. Under torchrun each rank derives its own stage and rank 0
reports. <launch command> is the deployment's SGLang command line, as in check.

Exit codes: 0 when every --require-consistent policy (default max-share) never diverges, 1 when one
does, 2 on bad input, 3 when a rank is lost under torchrun."""
EXAMPLES = (
    "python -m checker sweep --budgets 4:40:0.25 --mamba-full-memory-ratio 0.5",
    "python -m checker sweep --budgets 4:40:0.25 --report sweep.json --plot sweep.png",
    "python -m checker sweep --policy own-share --model-path examples/models/Kimi-Linear-48B-A3B",
    "python -m checker sweep -- --model-path examples/models/Kimi-Linear-48B-A3B --pp-size 4",
    "torchrun --standalone --nproc-per-node 4 -m checker sweep --budgets 4:40:0.25",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budgets",
        default=UPSTREAM_GRID,
        metavar="START:STOP:STEP|A,B,...",
        help="budgets in GiB (total_rest_memory): a range with STOP included, or a comma list "
        f"(default {UPSTREAM_GRID}, the upstream sweep's 145 budgets)",
    )
    parser.add_argument(
        "--require-consistent",
        action="append",
        choices=POLICIES,
        metavar="POLICY",
        help="exit 1 if this policy diverges at any budget; repeatable (default max-share)",
    )
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help="write a PNG: pool size per stage against budget, divergence marked (needs the 'plot' extra)",
    )
    parser.add_argument("--device", default="cpu", help="torch device for the derivation (default cpu)")
    parser.add_argument("--no-progress", action="store_true", help="never report progress on stderr")
    add_output_args(
        parser,
        report="write the findings and every assumption as JSON",
        quiet="print only what diverges (one line per policy and value) and the required-consistent "
        "line; never progress",
    )
    add_model_args(parser)
    add_layout_args(parser, pp_default=None)
    add_flag_args(parser, with_budget=False, with_policy=False)
    add_group_args(parser.add_argument_group("under torchrun (each rank derives its own stage)"))
    parser.add_argument(
        "--policy",
        action="append",
        choices=POLICIES,
        help="charging policy to sweep; repeatable (default: all three)",
    )


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    torchrun_error_file = ("TORCHELASTIC_ERROR_FILE", os.environ.get("TORCHELASTIC_ERROR_FILE"))
    check_run_outputs(args, [("--report", args.report), ("--plot", args.plot), torchrun_error_file])
    return SweepConfig(
        model=ModelChoice.from_args(args),
        sizing=SizingFlags.from_args(args, policy=None),  # --policy here is the list swept: `policies`
        group=group_options(args),
        output=OutputOptions(report=args.report, format=args.format, quiet=args.quiet),
        budgets=args.budgets,
        policies=tuple(dict.fromkeys(args.policy or POLICIES)),
        require_consistent=tuple(args.require_consistent) if args.require_consistent else None,
        plot=args.plot,
        device=args.device,
        progress=not (args.no_progress or args.quiet),
    )


def _config(args: argparse.Namespace, env: RankEnv) -> SweepConfig:
    config = config_from_args(args)
    if config.plot and env.rank == 0:  # the rank that plots: refused before any finding is printed
        # optional dependency: matplotlib, asked for only by --plot (and the plot module with it)
        from checker.outputs.plot import require_matplotlib

        require_matplotlib()
    return config


def _job(config: SweepConfig | None, output: OutputOptions) -> SweepJob:
    # start-up: the sweep job and its report load on a rank that runs
    from checker.commands.sweep_job import SweepJob

    return SweepJob(config=config, output=output)


def run(args: argparse.Namespace) -> int:
    """Under torchrun (or with --init-method) each rank derives its own stage and the run protocol
    gathers them; otherwise this process derives every stage."""
    return lifecycle.run("sweep", args)


def run_single_process(config: SweepConfig) -> int:
    # start-up: the sweep's plan and reports load only when it runs
    from checker.commands.sweep_plan import SweepFindings, SweepPlan, present_and_exit

    plan = SweepPlan.build(config, config.sizing.pp_size or DEFAULT_PP_SIZE)  # before torch is imported
    # torch: device.sweep imports it, after the plan is checked; the rest with it
    from checker.device.choice import sweep_device, use_one_cpu_thread
    from checker.device.sweep import stack_stages
    from checker.outputs.progress import Progress, progress_wanted

    device = sweep_device(config.device)
    use_one_cpu_thread(device)
    pp_size, grid = plan.inputs.pp_size, plan.grid
    progress = Progress(
        pp_size,
        f"{len(grid):,} budgets x {pp_size} stages x {len(plan.policies)} policies",
        enabled=progress_wanted(config.progress, len(grid)),
    )
    try:
        stack = stack_stages(plan.inputs_by_policy, grid.budgets, device, progress.step)
    finally:
        progress.close()
    return present_and_exit(config, SweepFindings.analyse(stack, plan, device=str(device)))


GROUP_COMMAND: GroupCommand[SweepConfig] = GroupCommand(
    config=_config,
    flags=lambda config: GroupFlags(group=config.group, output=config.output),
    job=_job,
    alone=run_single_process,
)
"""sweep's part in the lifecycle: alone (one process, no --init-method) it derives every stage itself."""
