"""``checker derive --sglang-version A,B``: every stage under each release, side by side, and the rule
changes that explain a difference (:mod:`checker.core.sizing.upgrade`), rendered by
:mod:`checker.outputs.derive` (:class:`~checker.outputs.derive.ReleaseComparison`).
"""

from __future__ import annotations

import os

from checker.config import DeriveConfig
from checker.core.errors import BudgetError, FlagError
from checker.core.sizing.sizing import CapacityInputs, StageCapacity
from checker.core.sizing.upgrade import UpgradeFacts, explain, release_differences
from checker.outputs.derive import ReleaseComparison, comparison_document
from checker.outputs.render import emit
from checker.preflight.resolve import as_release, derive_engines, derive_inputs
from checker.status import CONSISTENT, DIVERGENT


def run_releases(config: DeriveConfig) -> int:
    """--sglang-version A,B: every stage under each release, side by side, and what differs: planning a
    rolling upgrade. A cluster half on A and half on B disagrees on every value that differs here (the
    preflight then names the releases per node); the explanation says which change in SGLang's code
    causes it."""
    releases = config.releases
    if config.engine.engine != "builtin" or config.materialize:
        raise FlagError(
            "--sglang-version A,B compares the builtin models of two releases; drop --engine "
            "and --materialize (or give one release)"
        )
    if len(set(releases)) != len(releases):
        raise FlagError(f"--sglang-version {','.join(releases)} names a release twice")
    inputs: dict[str, CapacityInputs] = {}
    stages: dict[str, list[StageCapacity]] = {}
    errors: dict[str, str] = {}
    configs: dict[str, DeriveConfig] = {}
    for version in releases:
        one = configs[version] = as_release(config, version)
        inputs[version] = derive_inputs(one, os.environ)
        engines = derive_engines(one, inputs[version], os.environ)
        try:
            derived: list[StageCapacity] = []
            for k in range(inputs[version].pp_size):
                stage, _ = engines.derive(k)
                assert stage is not None  # one engine, no comparison (--engine refused above): it raises
                derived.append(stage)
            stages[version] = derived
        except BudgetError as exc:  # does not boot under this release: part of the answer
            errors[version] = str(exc)
    differences = release_differences(stages)
    explanations = []
    for a, b in zip(releases, releases[1:], strict=False):
        if differences or a in errors or b in errors:
            explanations += explain(a, b, UpgradeFacts.of(inputs[b]), inputs[b].geometry.families)
    result = ReleaseComparison(
        config=config,
        first=configs[releases[0]],
        releases=releases,
        inputs=inputs,
        stages=stages,
        errors=errors,
        differences=differences,
        explanations=explanations,
    )
    status = DIVERGENT if differences or errors else CONSISTENT
    emit(comparison_document(result, status=status), config.output)
    return 0
