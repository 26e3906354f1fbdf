"""The budget the server gets, for ``derive --gpu-free-gib`` (one process, every rank's weights known):
free device memory before the weights, the busiest rank's weights and --mem-fraction-static, by the
release's own formula (:func:`checker.core.budget.sizing_budget`). check's own, per rank and agreed
over the group, is :func:`checker.preflight.derivation.device_budget`.
"""

from __future__ import annotations

import os
from dataclasses import replace

from checker.config import DeriveConfig
from checker.core.budget import sizing_budget
from checker.core.errors import FlagError
from checker.core.weights_source import busiest_rank
from checker.preflight.resolve import derive_inputs, derive_rank_weights


def server_budget(
    config: DeriveConfig, free_gib: float, weights_gib: float | None, fraction: float
) -> DeriveConfig:
    """The config at the budget the server gets: ``sizing_budget`` of the release, with free-after taken
    as free-before less the busiest rank's weights (SGLang all-reduces free memory MIN over ranks)."""
    if weights_gib is not None:
        weights, source = weights_gib, "--weights-gib"
    else:
        figures = derive_rank_weights(config, derive_inputs(config, os.environ), os.environ)
        busiest = busiest_rank(figures)
        if busiest is None:
            raise FlagError(
                f"--gpu-free-gib needs the weights: give --weights-gib, or the model's directory with its "
                f"safetensors checkpoint ({config.weights.no_checkpoint})"
            )
        busiest_gib = figures[busiest].gib
        assert busiest_gib is not None
        weights, source = busiest_gib, f"the checkpoint, busiest rank {busiest}"
    result = sizing_budget(
        config.release.modelled, free_before_gib=free_gib, weights_gib=weights, mem_fraction_static=fraction
    )
    formula = f"weights {weights:.2f} GiB ({source}); {result.formula}"
    return replace(config, budget_gib=result.budget_gib, budget_given=True, budget_formula=formula)
