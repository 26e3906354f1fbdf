"""The budget the server gets, for ``derive --gpu-free-gib`` (one process, every rank's weights known):
free device memory before the weights, the busiest rank's weights and --mem-fraction-static, by the
release's own formula (:func:`checker.core.sizing.budget.sizing_budget`). check's own, per rank and agreed
over the group, is :func:`checker.preflight.derivation.device_budget`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from checker.config import DeriveConfig
from checker.core.errors import FlagError
from checker.core.sizing.budget import sizing_budget
from checker.families.weights_source import DraftSource, busiest_rank
from checker.preflight.resolve import chosen, derive_inputs, derive_rank_weights, with_release


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
    config = with_release(config)
    if weights_gib is not None:
        weights, source = weights_gib, "--weights-gib"
        # every rank's figure is the flag's, after the draft's rules (they hold whatever the source)
        inputs = derive_inputs(config, os.environ)
        figures = derive_rank_weights(config, inputs, os.environ, flag_gib=(weights_gib,))
        if any(f.draft_source != DraftSource.NONE for f in figures):
            source += ", the speculative draft inside it"
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
        weights, source = busiest_gib, f"{figures[busiest].source.words}, busiest rank {busiest}"
        detail, draft = figures[busiest].detail, figures[busiest].draft_source
        if detail is not None and detail.draft_bytes:  # the speculative draft, its own part, and its source
            source += (
                f", of which the speculative draft {detail.draft_bytes / 2**30:.2f} GiB from {draft.label}"
            )
        elif draft == DraftSource.AFTER_POOL:
            source += ", the speculative draft loaded after the pool is sized"
        if detail is not None and detail.note:  # an assumption the figure rests on (the Marlin SMs)
            source += f", {detail.note}"
    result = sizing_budget(
        chosen(config).modelled, free_before_gib=free_gib, weights_gib=weights, mem_fraction_static=fraction
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
        weights_figures=tuple(figures),
        mem_fraction_static=fraction,
        mem_fraction_source="given" if fraction_source is None else "release default",
    )


def budget_the_server_gets(config: DeriveConfig, args: argparse.Namespace) -> DeriveConfig:
    """derive's flags of the budget the server gets (--gpu-free-gib, --weights-gib, --mem-fraction-static,
    --device-total-gib): the config at that budget, or ``config`` as it is without --gpu-free-gib."""
    if args.gpu_free_gib is None:
        for flag, value in (
            ("--weights-gib", args.weights_gib),
            ("--mem-fraction-static", args.mem_fraction_static),
            ("--device-total-gib", args.device_total_gib),
        ):
            if value is not None and not (flag == "--mem-fraction-static" and getattr(args, "launch", None)):
                raise FlagError(f"{flag} applies with --gpu-free-gib (the budget the server gets); add it")
        return config
    if config.budget_given:
        raise FlagError("--budget-gib and --gpu-free-gib are two budget sources; give one")
    if len(config.releases) > 1:  # before the fraction: its default is one release's rule
        raise FlagError(
            "--gpu-free-gib computes one release's budget; give one --sglang-version "
            "(or compare releases at a fixed --budget-gib)"
        )
    fraction, source = args.mem_fraction_static, None
    if fraction is None:
        if args.device_total_gib is None:
            raise FlagError(
                "--gpu-free-gib needs the server's --mem-fraction-static (in the launch command, or as a "
                "flag), or --device-total-gib G (the GPU's total memory) for the release's own default: "
                "SGLang picks one from the GPU's total memory when it is unset"
            )
        # start-up: the rule and its table load only when the fraction is the release's default
        from checker.preflight.default_fraction import release_default_fraction

        config = with_release(config)  # the chosen release's own default
        picked = release_default_fraction(config, args, args.device_total_gib * 1024, os.environ)
        fraction, source = picked.value, picked.text
    return server_budget(config, args.gpu_free_gib, args.weights_gib, fraction, fraction_source=source)
