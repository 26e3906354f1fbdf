"""``checker plan --suggest-partition``: the layer partition that leaves the busiest stage the fewest
linear layers (:func:`checker.core.sizing.planning.suggest_partition`), derived by the engines of --engine
beside SGLang's default split at the budget, and rendered by :mod:`checker.outputs.plan`.
"""

from __future__ import annotations

import os
from dataclasses import replace

from checker.config import DeriveConfig, PlanConfig
from checker.core.errors import BudgetError
from checker.core.sizing.kv_partition import kv_choice
from checker.core.sizing.planning import stage_linear_counts, suggest_partition
from checker.core.sizing.sizing import CapacityInputs, StageCapacity
from checker.engines.drift import Drift
from checker.outputs.plan import PartitionPlan, partition_document
from checker.outputs.render import emit
from checker.preflight.resolve import derive_engines, derive_inputs

DEFAULT_SLACK = 1
"""Each stage holds floor(L/P) - 1 to ceil(L/P) + 1 layers unless --partition-slack says otherwise."""


def run_partition(config: PlanConfig) -> int:
    """The layer partition that minimises the busiest stage's linear layers, against SGLang's default
    split (whatever SGLANG_PP_LAYER_PARTITION is set here), both derived at the budget."""
    derive = config.derive
    slack = DEFAULT_SLACK if config.partition_slack is None else config.partition_slack
    here = derive_inputs(derive, os.environ)
    base = replace(here, partition_env=None)  # the comparison is against SGLang's default split
    g = base.geometry
    plan = suggest_partition(
        num_hidden_layers=g.num_hidden_layers,
        linear_layer_ids=g.linear_layer_ids,
        pp_size=base.pp_size,
        slack=slack,
    )
    # The KV objective (checker.core.sizing.kv_partition): where the KV pool binds the request cap at the
    # budget, a partition that moves attention layers and serves more replaces the state optimum.
    kv = kv_choice(base, plan.bounds, plan.partition, plan.largest_stage_linear_layers)
    if kv is not None and kv.adopted:
        counts = stage_linear_counts(g.linear_layer_ids, kv.partition)
        plan = replace(
            plan, partition=kv.partition, largest_stage_linear_layers=max(counts), stage_linear_layers=counts
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
        kv=kv,
    )
    emit(partition_document(result), config.derive.output)
    return result.exit_code


def _derive_or_error(
    derive: DeriveConfig, inputs: CapacityInputs, drifts: list[Drift]
) -> tuple[list[StageCapacity] | None, str | None, str | None]:
    """The chosen engine's stages (the builtin's under both; its drift findings join ``drifts``), the
    error when they do not boot, and the SGLang version that ran (None for builtin)."""
    engines = derive_engines(derive, inputs, os.environ)
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
