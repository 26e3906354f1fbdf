"""The budget the server gets, for ``derive --gpu-free-gib`` (one process, every rank's weights known):
free device memory before the weights, the busiest rank's weights and --mem-fraction-static, by the
release's own formula (:func:`checker.core.sizing.budget.sizing_budget`). check's own, per rank and agreed
over the group, is :func:`checker.preflight.derivation.device_budget`.
"""

from __future__ import annotations

import os
from dataclasses import replace

from checker.config import DeriveConfig
from checker.core.errors import FlagError
from checker.core.sizing.budget import sizing_budget
from checker.families.weights_source import busiest_rank


def server_budget(
    config: DeriveConfig,
    free_gib: float,
    weights_gib: float | None,
    fraction: float,
    *,
    fraction_source: str | None = None,
) -> DeriveConfig:
    """The config at the budget the server gets: ``sizing_budget`` of the release, with free-after taken
    as free-before less the busiest rank's weights (SGLang all-reduces free memory MIN over ranks)."""
    if weights_gib is not None:
        weights, source = weights_gib, "--weights-gib"
    else:
        figures = config.rank_weights(config.inputs(os.environ), os.environ)
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
    if fraction_source is not None:  # the release's own default, and where it comes from
        formula += f"; {fraction_source}"
    return replace(
        config,
        budget_gib=result.budget_gib,
        budget_given=True,
        budget_formula=formula,
        weights_gib=weights if weights_gib is not None else None,
    )
