"""``checker plan``: capacity planning from the same core every rank runs (no torch needed).

Two modes: the smallest budget for a running-request target (:func:`checker.core.planning.min_budget`,
and as a --mem-fraction-static with :func:`~checker.core.planning.min_mem_fraction`), or the layer
partition with the largest pool (:func:`~checker.core.planning.suggest_partition`). What a user reads
in ``--help`` is :data:`DESCRIPTION` and :data:`EXAMPLES`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from checker.commands.options import (
    DEFAULT_BUDGET_GIB,
    add_engine_args,
    add_flag_args,
    add_layout_args,
    add_model_args,
    add_output_args,
    add_sizing_flag,
    int_at_least,
    positive_gib,
    positive_int,
)
from checker.config import DeriveConfig, PlanConfig
from checker.core.errors import BudgetError, FlagError
from checker.core.partition import PARTITION_ENV
from checker.core.planning import MemFraction, MinBudget, min_budget, min_mem_fraction, suggest_partition
from checker.core.releases import release_model
from checker.core.sizing import POLICIES, CapacityInputs, StageCapacity
from checker.core.upgrade import UpgradeFacts, explain
from checker.engines.drift import Drift
from checker.engines.planning import engine_min_budget, min_budget_drift
from checker.launch.merge import launch_text
from checker.outputs.plan import (
    AssumedWeights,
    PartitionPlan,
    ReleaseTargets,
    TargetPlan,
    partition_doc,
    partition_text,
    releases_doc,
    releases_text,
    target_doc,
    target_text,
)
from checker.outputs.stdout import show

HELP = "the smallest budget for a running-request target, or a partition with a larger pool"
USAGE = ("python -m checker plan",)
DESCRIPTION = """\
Capacity planning from the same derivation every rank runs (no torch needed). Two questions, one per
mode. --target-max-running-requests N: the smallest budget (0.01 GiB steps) at which every stage
reaches N running requests under the release's own charging policy (--all-policies: all three, the
release's marked); with --gpu-free-gib, also the --mem-fraction-static to start the server with, for
the weights of the busiest rank (--weights-gib, else the model directory's safetensors checkpoint as the
release's class holds it per rank). --suggest-partition: the SGLANG_PP_LAYER_PARTITION
that leaves the busiest stage the fewest linear layers (a larger pool under max-share), to export
identically on every node; check verifies that they do.

<launch command> is the deployment's SGLang command line, as in check: the model and sizing flags are
read from it."""
EXAMPLES = (
    "python -m checker plan --model kimi-k3 --pp-size 8 --target-max-running-requests 48",
    "python -m checker plan --target-max-running-requests 48 --gpu-free-gib 139 --weights-gib 40",
    "python -m checker plan --target-max-running-requests 48 -- --model-path /models/Falcon-H1-0.5B",
    "python -m checker plan --model-path examples/models/Nemotron-H-8B-Base-8K --suggest-partition",
)
DEFAULT_SLACK = 1


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
        type=positive_gib,
        metavar="GIB",
        help="the weights' footprint on the busiest rank (GiB): the largest 'mem usage=X GB' of the "
        "server's 'Load weight end.' log lines. Default: the model directory's safetensors checkpoint, "
        "each rank's parameters as the release's class holds them plus the stated margin",
    )
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
        # start-up: the log reader and its format table (~15 ms) load only for --weights-from-log
        from checker.postflight.harvest import logged_weights

        logged = logged_weights(args.weights_from_log)
        weights, prefix = logged.busiest()
        source = f"the largest mem usage in {logged.source}, [{prefix or 'no prefix'}]"
    return PlanConfig(
        derive=derive,
        target_max_running_requests=args.target_max_running_requests,
        partition_slack=args.partition_slack,
        gpu_free_gib=args.gpu_free_gib,
        weights_gib=weights,
        weights_source=source,
        all_policies=args.all_policies,
    )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if len(config.derive.releases) > 1:
        return run_releases(config)
    if config.suggest_partition:
        return run_partition(config)
    return run_target(config)


def run_target(config: PlanConfig) -> int:
    """The smallest budget at which every stage reaches the target: under the release's own charging
    policy (--policy: that one; --all-policies: all three, the release's own first; SGLang ships
    max-share only, so with its engine the release's own)."""
    derive, target = config.derive, config.target_max_running_requests
    assert target is not None
    chosen = derive.sizing.policy
    own = release_model(derive.release.modelled).rules.policy
    if chosen:
        policies: tuple[str | None, ...] = (chosen,)
    elif derive.release.engine != "builtin":
        policies = (None,)
    elif config.all_policies:
        policies = (own, *(p for p in POLICIES if p != own))
    else:
        policies = (own,)
    results = [min_budget(derive.inputs(os.environ, policy=p), target, policy=p) for p in policies]
    results, drifts, sglang_version = _engine_min_budgets(derive, results)
    inputs = derive.inputs(os.environ, policy=policies[0])
    weights = assumed_weights(config, inputs)
    result = TargetPlan(
        config=config,
        inputs=inputs,
        results=results,
        fractions={r.policy: _fraction(config, inputs, r.budget_gib, weights) for r in results},
        drifts=drifts,
        sglang_version=sglang_version,
        own_policy=own,
        weights=weights,
    )
    show(config.derive.output, lambda: target_doc(result), lambda: target_text(result))
    return result.exit_code


def assumed_weights(config: PlanConfig, inputs: CapacityInputs) -> AssumedWeights | None:
    """The weights the fraction assumes (None without --gpu-free-gib): --weights-gib, else the busiest
    rank's figure from the checkpoint; neither is one line naming both ways out."""
    if config.gpu_free_gib is None:
        return None
    if config.weights_gib is not None:
        if config.weights_source:  # --weights-from-log
            return AssumedWeights(gib=config.weights_gib, source="log", note=config.weights_source)
        return AssumedWeights(gib=config.weights_gib, source="flag")
    ranks = config.derive.rank_weights(inputs, os.environ)
    known = [(r.gib, i, r) for i, r in enumerate(ranks) if r.gib is not None]
    if not known:
        raise FlagError(
            f"--gpu-free-gib needs the weights' footprint: give --weights-gib, or point the model at its "
            f"directory with the safetensors checkpoint ({config.derive.weights.no_checkpoint})"
        )
    gib, busiest, figure = max(known, key=lambda k: (k[0], -k[1]))
    return AssumedWeights(
        gib=gib, source="checkpoint", rank=busiest, figures=tuple(ranks), detail=figure.detail
    )


def _fraction(
    config: PlanConfig, inputs: CapacityInputs, budget_gib: float, weights: AssumedWeights | None
) -> MemFraction | None:
    """The --mem-fraction-static that reaches ``budget_gib`` (None without --gpu-free-gib)."""
    if config.gpu_free_gib is None or weights is None:
        return None
    return min_mem_fraction(
        inputs.release.version,
        free_before_gib=config.gpu_free_gib,
        weights_gib=weights.gib,
        budget_gib=budget_gib,
    )


def _engine_min_budgets(
    derive: DeriveConfig, results: list[MinBudget]
) -> tuple[list[MinBudget], list[Drift], str | None]:
    """--engine sglang: SGLang's own boundary replaces the builtin's; both: the differences."""
    mode = derive.release.engine  # --engine, or sglang for a release the checker does not model
    if mode == "builtin":
        return results, [], None

    out: list[MinBudget] = []
    drifts: list[Drift] = []
    version = None
    for r in results:
        inputs = derive.inputs(os.environ, policy=r.policy)
        engines = derive.engines(inputs, os.environ)
        version = engines.sglang_version
        if mode == "sglang":
            out.append(engine_min_budget(engines.primary, inputs.pp_size, r))
            continue
        out.append(r)
        if engines.shadow is None:
            drifts.append(Drift(-1, "outcome", "derives values", f"error ({engines.shadow_error})"))
        else:
            drifts += min_budget_drift(
                r, engine_min_budget(engines.shadow, inputs.pp_size, r), engines.shadow
            )
    return out, drifts, version


def run_partition(config: PlanConfig) -> int:
    """The layer partition that minimises the busiest stage's linear layers, against SGLang's default
    split (whatever SGLANG_PP_LAYER_PARTITION is set here), both derived at the budget."""
    derive = config.derive
    slack = DEFAULT_SLACK if config.partition_slack is None else config.partition_slack
    here = derive.inputs(os.environ)
    base = replace(here, partition_env=None)  # the comparison is against SGLang's default split
    g = base.geometry
    plan = suggest_partition(
        num_hidden_layers=g.num_hidden_layers,
        linear_layer_ids=g.linear_layer_ids,
        pp_size=base.pp_size,
        slack=slack,
    )
    drifts: list[Drift] = []
    suggested, error, version = _derive_or_error(derive, replace(base, partition_env=plan.env), drifts)
    if suggested is None and not drifts:
        raise BudgetError(f"the suggested partition {plan.env} does not boot: {error}")
    default, default_error, _ = _derive_or_error(derive, base, drifts)
    result = PartitionPlan(
        config=config,
        inputs=base,
        user_env=here.partition_env,
        slack=slack,
        partition=plan,
        suggested=suggested,
        default=default,
        default_error=default_error,
        drifts=drifts,
        sglang_version=version,
    )
    show(config.derive.output, lambda: partition_doc(result), lambda: partition_text(result))
    return result.exit_code


def _derive_or_error(
    derive: DeriveConfig, inputs: CapacityInputs, drifts: list[Drift]
) -> tuple[list[StageCapacity] | None, str | None, str | None]:
    """The chosen engine's stages (the builtin's under both; its drift findings join ``drifts``), the
    error when they do not boot, and the SGLang version that ran (None for builtin)."""
    engines = derive.engines(inputs, os.environ)
    try:
        stages, found = engines.derive_all(inputs.pp_size)
    except BudgetError as exc:
        return None, str(exc), engines.sglang_version
    drifts += found
    if stages is None:
        return (
            None,
            "the builtin model refuses a stage SGLang derives (see the drift findings)",
            engines.sglang_version,
        )
    return stages, None, engines.sglang_version


def run_releases(config: PlanConfig) -> int:
    """--sglang-version A,B: the smallest budget for the target under each release's own rules (its
    own charging policy unless --policy), side by side, and why they differ."""
    derive, target = config.derive, config.target_max_running_requests
    assert target is not None
    inputs: dict[str, CapacityInputs] = {}
    results: dict[str, MinBudget] = {}
    for version in derive.releases:
        inputs[version] = derive.as_release(version).inputs(os.environ)
        results[version] = min_budget(inputs[version], target, policy=derive.sizing.policy)
    explanations: list[str] = []
    for a, b in zip(derive.releases, derive.releases[1:], strict=False):
        if results[a].budget_gib != results[b].budget_gib:
            explanations += explain(a, b, UpgradeFacts.of(inputs[b]))
    result = ReleaseTargets(
        config=config,
        releases=derive.releases,
        inputs=inputs,
        results=results,
        fractions={
            v: _fraction(config, inputs[v], r.budget_gib, assumed_weights(config, inputs[v]))
            for v, r in results.items()
        },
        explanations=explanations,
    )
    show(config.derive.output, lambda: releases_doc(result), lambda: releases_text(result))
    return 0
