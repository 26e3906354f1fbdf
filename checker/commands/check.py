"""``checker check`` (the default): the preflight, one verdict on every rank.

flags -> config (:mod:`checker.commands.check_config`) -> the run protocol
(:mod:`checker.distributed.exchange`) with check's job (:mod:`checker.commands.check_job`), by the one
lifecycle of :mod:`checker.commands.lifecycle`: each rank derives its stage's capacity locally (no
collective, as SGLang does), then every rank joins two fixed-size int64 all-gathers and decides the same
verdict: exit 0 consistent, 1 divergent, 2 error, 3 infrastructure failure, 4 model drift. torchrun
turns any non-zero exit into 1: read ``status`` from --report. What a user reads in ``--help`` is
:data:`DESCRIPTION` and :data:`EXAMPLES`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from checker.commands import lifecycle
from checker.commands.check_config import config_from_args
from checker.commands.flag_types import gib_list, positive_gib, unit_fraction, weights_gib_list
from checker.commands.group_flags import add_group_args
from checker.commands.lifecycle import GroupCommand, GroupFlags
from checker.commands.options import (
    add_engine_args,
    add_flag_args,
    add_gpu_sm_count,
    add_layout_args,
    add_model_args,
    add_output_args,
)
from checker.config import OutputOptions, PreflightConfig

if TYPE_CHECKING:
    from checker.commands.check_job import CheckJob

HELP = "the preflight under torchrun: every rank derives locally, all ranks agree or the job fails"
USAGE = ("torchrun [torchrun options] -m checker [check]",)
DESCRIPTION = """\
The preflight, run under torchrun before the server starts, in the deployment's environment: every rank
derives its pipeline stage's max_mamba_cache_size, max_running_requests and pp_max_micro_batch_size
as its installed SGLang release does, then all ranks compare their inputs and results and agree on one
verdict.

<launch command> is the deployment's own SGLang command line, exactly as the server is started
(python -m sglang.launch_server ARGS, sglang serve ARGS, or bare ARGS): the model path, layout and
sizing flags are read from it by the release's own parser. The checker's options go before --; a
budget source is required (--budget-gib, or --budget-from-device: the weights per rank come from the
model directory's safetensors checkpoint, or --weights-gib). Without a launch
command, the model and sizing options below describe the deployment.

Exit codes: 0 consistent, 1 divergent, 2 error, 3 infrastructure failure, 4 model drift. torchrun turns
any non-zero exit into 1: read the status from --report (launchers/read-verdict.sh). Several nodes:
launchers/torchrun.sh (docs/launchers.md)."""
EXAMPLES = (
    "torchrun --standalone --nproc-per-node 8 -m checker --model kimi-k3 --budget-gib 8",
    "# the launch command kept in one CI variable, which the step that starts the server uses too:",
    "torchrun --nproc-per-node 8 -m checker --budget-from-device --weights-gib 12 -- $SGLANG_LAUNCH",
)
"""Shown one a line under "examples:" in --help (each fits its width; a line starting "#" says what the
next one does). Tested: every command runs as printed (tests/test_examples.py)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser, required=True)
    add_layout_args(parser, pp_default=None)
    add_flag_args(parser, budget_required_hint=True)
    add_engine_args(parser)
    g = parser.add_argument_group("preflight")
    add_group_args(g)
    g.add_argument(
        "--budget-from-device",
        action="store_true",
        help="budget = free device memory x --mem-fraction-static, all-reduced MIN as SGLang "
        "does (this or --budget-gib is required)",
    )
    g.add_argument(
        "--mem-fraction-static",
        type=unit_fraction,
        default=None,
        metavar="F",
        help="with --budget-from-device: the server's --mem-fraction-static, in (0, 1] (read from the "
        "launch command). Unset, the rank's SGLang release's own default, computed from the GPU's total "
        "memory (read on a GPU rank as SGLang reads it, nvidia-smi's memory.total; else "
        "--device-total-gib) and the launch command's serving flags; a serving mode whose default the "
        "checker does not model is refused, never assumed",
    )
    g.add_argument(
        "--device-total-gib",
        type=positive_gib,
        metavar="GIB",
        help="with --budget-from-device and no --mem-fraction-static: the GPU's total memory as SGLang "
        "reads it (nvidia-smi memory.total / 1024, e.g. 79.65 on an H100 80GB), where the rank cannot "
        "read it (CPU ranks)",
    )
    g.add_argument(
        "--device-free-gib",
        type=gib_list,
        metavar="GIB[,GIB...]",
        help="free device memory to assume instead of measuring it (CPU runs, tests): one "
        "value, or one per rank",
    )
    g.add_argument(
        "--weights-gib",
        type=weights_gib_list,
        metavar="GIB[,GIB...]",
        help="with --budget-from-device: the model weights' footprint per rank (one value, or one per "
        "rank); SGLang sizes from free memory measured before and after loading them, as your release "
        "does. Default: each rank's figure from the model directory's safetensors checkpoint (its "
        "headers: the parameters the release's class holds on that rank, plus the stated margin), or its "
        "config.json alone where no shards are there; 0: explicitly none",
    )
    add_gpu_sm_count(g)
    g.add_argument(
        "--weights-from-log",
        action="append",
        metavar="LOG",
        help="with --budget-from-device: each rank's weights figure from an earlier start's server log "
        "(its 'Load weight end. ... mem usage=' lines, every rank of this layout; repeat for each "
        "node's log) instead of --weights-gib",
    )
    g.add_argument(
        "--no-agree-budget",
        action="store_true",
        help="skip the MIN all-reduce: shows the divergence a missing agreement would cause",
    )
    g.add_argument(
        "--strict-inputs",
        action="store_true",
        help="fail (exit 1) when inputs differ across ranks even if every derived value agrees",
    )
    g.add_argument(
        "--allow-single-rank",
        action="store_true",
        help="accept a world of one rank (a single-GPU deployment); without it one rank is an "
        "error, since a preflight of one rank compares nothing",
    )
    g.add_argument(
        "--materialize",
        action="store_true",
        help="allocate this rank's stage pool for real (SGLang's shapes and dtypes), measure "
        "it against the prediction, free it; a failure or mismatch is an error",
    )
    g.add_argument(
        "--materialize-device",
        metavar="DEVICE",
        default="auto",
        help="where --materialize allocates: auto (the exchange's device: cuda:LOCAL_RANK "
        "under nccl, else cpu), cpu, cuda (GPU LOCAL_RANK mod the GPU count: gloo ranks "
        "may share one GPU) or cuda:N",
    )
    add_output_args(
        parser,
        report="write the JSON report here (rank 0)",
        junit=True,
        plot="write a PNG here (rank 0): one stacked bar per stage (weights, state pool, KV pool, the "
        "reserved remainder, the memory the MIN leaves idle), the stage that limits the KV pool marked; "
        "the step summary names it (needs the 'plot' extra)",
    )


def _job(config: PreflightConfig | None, output: OutputOptions) -> CheckJob:
    # start-up: the job, the derivation, verdict and report load on a rank that runs
    from checker.commands.check_job import CheckJob

    return CheckJob(config=config, output=output)


GROUP_COMMAND: GroupCommand[PreflightConfig] = GroupCommand(
    config=config_from_args,
    flags=lambda config: GroupFlags(group=config.group, output=config.output),
    job=_job,
)
"""check's part in the lifecycle: it always runs the protocol (a world of one too, which then only
reports its error or, with --allow-single-rank, its verdict)."""


def run(args: argparse.Namespace) -> int:
    return lifecycle.run("check", args)
