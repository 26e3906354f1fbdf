"""``checker plan --target-tokens N`` / ``--target-requests R``: the smallest budget at which every stage
holds N tokens of KV after the MIN, or serves R requests of the context length
(:func:`checker.core.sizing.token_plan.min_budget_tokens`), per charging policy as
``--target-max-running-requests`` is; with --gpu-free-gib also as the --mem-fraction-static that reaches
it. Rendered by :mod:`checker.outputs.plan_tokens`.
"""

from __future__ import annotations

import os
import time

from checker.commands.plan_budget import _fraction, assumed_weights
from checker.config import PlanConfig
from checker.core.releases.releases import release_model
from checker.core.sizing.sizing import POLICIES
from checker.core.sizing.token_plan import TokenTarget, min_budget_tokens
from checker.outputs.plan_tokens import TokenPlan, token_document
from checker.outputs.render import emit
from checker.preflight.resolve import chosen, derive_inputs


def run_tokens(config: PlanConfig) -> int:
    derive = config.derive
    given = derive.sizing.policy
    own = release_model(chosen(derive).modelled).rules.policy
    if given:
        policies: tuple[str, ...] = (given,)
    elif config.all_policies:
        policies = (own, *(p for p in POLICIES if p != own))
    else:
        policies = (own,)
    inputs = derive_inputs(derive, os.environ, policy=policies[0])
    target = TokenTarget(
        tokens=config.target_tokens,
        requests=config.target_requests,
        context=inputs.resolved_context_len if config.target_requests is not None else None,
    )
    t0 = time.perf_counter()
    results = [
        min_budget_tokens(derive_inputs(derive, os.environ, policy=p), target, policy=p) for p in policies
    ]
    search_s = time.perf_counter() - t0
    weights = assumed_weights(config, derive, inputs)
    result = TokenPlan(
        config=config,
        inputs=inputs,
        target=target,
        results=results,
        fractions={r.policy: _fraction(config, inputs, r.budget_gib, weights) for r in results},
        own_policy=own,
        weights=weights,
        search_s=search_s,
    )
    emit(token_document(result), derive.output)
    return 0
