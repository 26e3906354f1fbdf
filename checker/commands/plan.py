"""``checker plan``: capacity planning from the same core every rank runs (no torch needed).

Two modes: the smallest budget for a running-request target (:func:`checker.core.sizing.planning.min_budget`,
and as a --mem-fraction-static with :func:`~checker.core.sizing.planning.min_mem_fraction`), or the layer
partition with the largest pool (:func:`~checker.core.sizing.planning.suggest_partition`). What a user reads
in ``--help`` is :data:`DESCRIPTION` and :data:`EXAMPLES`.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from checker.commands.flag_types import int_at_least, positive_gib, positive_int, weights_gib
from checker.commands.options import (
    DEFAULT_BUDGET_GIB,
    add_engine_args,
    add_flag_args,
    add_gpu_sm_count,
    add_layout_args,
    add_model_args,
    add_output_args,
    add_sizing_flag,
)
from checker.commands.plan_budget import run_releases, run_target
from checker.commands.plan_partition import DEFAULT_SLACK, run_partition
from checker.commands.plan_tokens import run_tokens
from checker.config import IN_TOKENS_ONE_RELEASE, DeriveConfig, PlanConfig
from checker.core.errors import FlagError
from checker.core.sizing.partition import PARTITION_ENV
from checker.launch.merge import launch_text
from checker.preflight.resolve import chosen, with_release

HELP = "the smallest budget for a request or KV-token target, or a partition with a larger pool"
USAGE = ("python -m checker plan",)
DESCRIPTION = """\
Capacity planning from the same derivation every rank runs (no torch needed). Two questions, one per
mode. --target-max-running-requests N: the smallest budget (0.01 GiB steps) at which every stage
reaches N running requests under the release's own charging policy (--all-policies: all three, the
release's marked); with --gpu-free-gib, also the --mem-fraction-static to start the server with, for
the weights of the busiest rank (--weights-gib, else the model directory's safetensors checkpoint as the
release's class holds it per rank). --target-tokens N and --target-requests R answer the same in tokens:
every stage holds N tokens of KV after the MIN over the pipeline, or serves R requests of the context
length (the KV pool holds R x C tokens and the release's own clamping gives R running requests).
--suggest-partition: the SGLANG_PP_LAYER_PARTITION
that leaves the busiest stage the fewest linear layers (a larger pool under max-share), to export
identically on every node; check verifies that they do.

<launch command> is the deployment's SGLang command line, as in check: the model and sizing flags are
read from it."""
EXAMPLES = (
    "python -m checker plan --model kimi-k3 --pp-size 8 --target-max-running-requests 48",
    "python -m checker plan --target-max-running-requests 48 --gpu-free-gib 139 --weights-gib 40",
    "python -m checker plan --target-max-running-requests 48 -- --model-path /models/Falcon-H1-0.5B",
    "python -m checker plan --model kimi-k3 --target-tokens 1000000 --gpu-free-gib 139 --weights-gib 40",
    "python -m checker plan --model kimi-k3 --pp-size 8 --target-requests 64 --context-len 4096",
    "python -m checker plan --model-path examples/models/Nemotron-H-8B-Base-8K --suggest-partition",
)

non_negative_int = int_at_least(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_layout_args(parser, pp_default=8)
    add_flag_args(parser, with_policy=False)
    g = parser.add_argument_group("planning")
    # Unset means "all three" for the budget search and max-share for the partition comparison.
    add_sizing_flag(
        g,
        "policy",
        help="search the budget under this policy (default: the release's own); the policy the "
        "partition comparison derives with (default max-share)",
    )
    g.add_argument(
        "--all-policies",
        action="store_true",
        help="search the budget under all three charging policies (the release's own is marked); "
        "default: the release's own only",
    )
    mode = g.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--target-max-running-requests",
        type=positive_int,
        metavar="N",
        help="find, per policy, the smallest --budget-gib (0.01 GiB steps) at which every stage derives "
        "max_running_requests >= N (per dp worker)",
    )
    mode.add_argument(
        "--target-tokens",
        type=positive_int,
        metavar="N",
        help="find the smallest --budget-gib at which every stage holds N tokens of KV after the MIN "
        "over the pipeline (max_total_num_tokens >= N)",
    )
    mode.add_argument(
        "--target-requests",
        type=positive_int,
        metavar="R",
        help="find the smallest --budget-gib at which every stage serves R requests of context C "
        "(--context-len, a launch command's --context-length, else the config's): the KV pool holds "
        "R x C tokens and max_running_requests >= R, as the release clamps it",
    )
    mode.add_argument(
        "--suggest-partition",
        action="store_true",
        help=f"find the {PARTITION_ENV} that minimises the busiest stage's linear layers and compare "
        "it with the default split at --budget-gib",
    )
    g.add_argument(
        "--partition-slack",
        type=non_negative_int,
        default=None,
        metavar="S",
        help=f"each stage holds floor(L/P) - S to ceil(L/P) + S layers, at least 1 (default {DEFAULT_SLACK})",
    )
    d = parser.add_argument_group(
        "the budget as --mem-fraction-static (with --target-max-running-requests)",
        "SGLang does not take a budget: it derives total_rest_memory from free device memory measured "
        "before and after loading the weights and --mem-fraction-static. Give both figures to get the "
        "--mem-fraction-static the target needs, computed as the release does.",
    )
    d.add_argument(
        "--gpu-free-gib",
        type=positive_gib,
        metavar="GIB",
        help="free device memory before the weights load (e.g. 139 on an idle H200)",
    )
    d.add_argument(
        "--weights-gib",
        type=weights_gib,
        metavar="GIB",
        help="the weights' footprint on the busiest rank (GiB): the largest 'mem usage=X GB' of the "
        "server's 'Load weight end.' log lines. Default: the model directory's safetensors checkpoint, "
        "each rank's parameters as the release's class holds them plus the stated margin",
    )
    add_gpu_sm_count(d)
    d.add_argument(
        "--weights-from-log",
        action="append",
        metavar="LOG",
        help="take --weights-gib from an earlier start's server log: the largest 'mem usage=' of its "
        "ranks (repeat for each node's log)",
    )
    add_engine_args(parser)
    add_output_args(parser, quiet="leave out the model and layout header")


def config_from_args(args: argparse.Namespace) -> PlanConfig:
    """The typed config (it refuses flags that do not go together: PlanConfig.__post_init__)."""
    derive = DeriveConfig.from_args(
        args, default_budget_gib=DEFAULT_BUDGET_GIB, launch_command=launch_text(args, compared=False)
    )
    weights, source = args.weights_gib, None
    if args.weights_from_log:
        if args.weights_gib is not None:
            raise FlagError("--weights-from-log and --weights-gib are two weights figures; give one")
        # start-up: the log reader and its format table load only for --weights-from-log
        from checker.postflight.harvest import logged_weights

        logged = logged_weights(args.weights_from_log)
        weights, prefix = logged.busiest()
        source = f"the largest mem usage in {logged.source}, [{prefix or 'no prefix'}]"
    config = PlanConfig(
        derive=derive,
        target_max_running_requests=args.target_max_running_requests,
        partition_slack=args.partition_slack,
        gpu_free_gib=args.gpu_free_gib,
        weights_gib=weights,
        weights_source=source,
        all_policies=args.all_policies,
        target_tokens=args.target_tokens,
        target_requests=args.target_requests,
    )
    if len(derive.releases) > 1:
        return config  # each release's own, as it is derived (plan_budget.run_releases)
    # one release: chosen here, after every flag check, and then what it decides
    config = replace(config, derive=with_release(derive))
    if config.in_tokens and chosen(config.derive).engine != "builtin":
        raise FlagError(IN_TOKENS_ONE_RELEASE)
    return config


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if len(config.derive.releases) > 1:
        return run_releases(config)
    if config.in_tokens:
        return run_tokens(config)
    if config.suggest_partition:
        return run_partition(config)
    return run_target(config)
