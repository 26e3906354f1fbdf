"""``checker plan --target-max-running-requests N``: the smallest budget at which every stage reaches
the target (:func:`checker.core.sizing.planning.min_budget`), per charging policy or per release
(``--sglang-version
A,B``), by the engines of --engine; with --gpu-free-gib also as the --mem-fraction-static that reaches it
(:func:`~checker.core.sizing.planning.min_mem_fraction`) for the busiest rank's weights. Rendered by
:mod:`checker.outputs.plan`.
"""

from __future__ import annotations

import os

from checker.config import DeriveConfig, PlanConfig
from checker.core.errors import FlagError
from checker.core.releases.releases import release_model
from checker.core.sizing.planning import MemFraction, MinBudget, min_budget, min_mem_fraction
from checker.core.sizing.sizing import POLICIES, CapacityInputs
from checker.core.sizing.upgrade import UpgradeFacts, explain
from checker.engines.drift import Drift
from checker.engines.planning import engine_min_budget, min_budget_drift
from checker.families.weights_source import busiest_rank
from checker.outputs.plan import (
    AssumedWeights,
    ReleaseTargets,
    TargetPlan,
    releases_document,
    target_document,
)
from checker.outputs.render import emit
from checker.preflight.resolve import as_release, chosen, derive_engines, derive_inputs, derive_rank_weights


def run_target(config: PlanConfig) -> int:
    """The smallest budget at which every stage reaches the target: under the release's own charging
    policy (--policy: that one; --all-policies: all three, the release's own first; SGLang ships
    max-share only, so with its engine the release's own)."""
    derive, target = config.derive, config.target_max_running_requests
    assert target is not None
    given, release = derive.sizing.policy, chosen(derive)
    own = release_model(release.modelled).rules.policy
    if given:
        policies: tuple[str | None, ...] = (given,)
    elif release.engine != "builtin":
        policies = (None,)
    elif config.all_policies:
        policies = (own, *(p for p in POLICIES if p != own))
    else:
        policies = (own,)
    results = [min_budget(derive_inputs(derive, os.environ, policy=p), target, policy=p) for p in policies]
    results, drifts, sglang_version = _engine_min_budgets(derive, results)
    inputs = derive_inputs(derive, os.environ, policy=policies[0])
    weights = assumed_weights(config, derive, inputs)
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
    emit(target_document(result), config.derive.output)
    return result.exit_code


def assumed_weights(
    config: PlanConfig, derive: DeriveConfig, inputs: CapacityInputs
) -> AssumedWeights | None:
    """The weights the fraction assumes (None without --gpu-free-gib): --weights-gib, else the busiest
    rank's figure from the checkpoint as ``derive``'s release holds it (one release's config); neither
    is one line naming both ways out."""
    if config.gpu_free_gib is None:
        return None
    if config.weights_gib is not None:
        # the draft's rules hold whatever the figure's source (checker.families.weights_source); each
        # rank's figure is the flag's, its draft (where it loads one) inside it
        flags = tuple(derive_rank_weights(derive, inputs, os.environ, flag_gib=(config.weights_gib,)))
        if config.weights_source:  # --weights-from-log
            return AssumedWeights(gib=config.weights_gib, source="log", note=config.weights_source)
        return AssumedWeights(gib=config.weights_gib, source="flag", figures=flags)
    ranks = derive_rank_weights(derive, inputs, os.environ)
    busiest = busiest_rank(ranks)
    if busiest is None:
        raise FlagError(
            f"--gpu-free-gib needs the weights' footprint: give --weights-gib, or point the model at its "
            f"directory with the safetensors checkpoint ({config.derive.weights.no_checkpoint})"
        )
    figure = ranks[busiest]
    assert figure.gib is not None
    return AssumedWeights(
        gib=figure.gib, source=figure.source.label, rank=busiest, figures=tuple(ranks), detail=figure.detail
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
    mode = chosen(derive).engine  # --engine, or sglang for a release the checker does not model
    if mode == "builtin":
        return results, [], None

    out: list[MinBudget] = []
    drifts: list[Drift] = []
    version = None
    for r in results:
        inputs = derive_inputs(derive, os.environ, policy=r.policy)
        engines = derive_engines(derive, inputs, os.environ)
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


def run_releases(config: PlanConfig) -> int:
    """--sglang-version A,B: the smallest budget for the target under each release's own rules (its
    own charging policy unless --policy), side by side, and why they differ."""
    derive, target = config.derive, config.target_max_running_requests
    assert target is not None
    configs: dict[str, DeriveConfig] = {}
    inputs: dict[str, CapacityInputs] = {}
    results: dict[str, MinBudget] = {}
    for version in derive.releases:
        configs[version] = as_release(derive, version)
        inputs[version] = derive_inputs(configs[version], os.environ)
        results[version] = min_budget(inputs[version], target, policy=derive.sizing.policy)
    explanations: list[str] = []
    for a, b in zip(derive.releases, derive.releases[1:], strict=False):
        if results[a].budget_gib != results[b].budget_gib:
            explanations += explain(a, b, UpgradeFacts.of(inputs[b]), inputs[b].geometry.families)
    result = ReleaseTargets(
        config=config,
        first=configs[derive.releases[0]],
        releases=derive.releases,
        inputs=inputs,
        results=results,
        fractions={
            v: _fraction(config, inputs[v], r.budget_gib, assumed_weights(config, configs[v], inputs[v]))
            for v, r in results.items()
        },
        explanations=explanations,
    )
    emit(releases_document(result), config.derive.output)
    return 0
