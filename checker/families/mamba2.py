"""The Mamba2 mixer's state shapes as Falcon-H1 and Granite-4.0-H configs give them (``mamba_*`` keys).
Shared by those families' geometry readers."""

from __future__ import annotations

from checker.core.errors import ConfigError, json_kind, shorten
from checker.core.sizing.geometry import MAX_DIM
from checker.core.sizing.models import (
    FIX,
    MAX_CONV_KERNEL,
    Keys,
    mamba2_shapes,
)


def mamba2_block(
    k: Keys, tp: int, intermediate: int, intermediate_name: str, *, auto_head_dim: bool = False
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    heads = k.integer("mamba_n_heads")
    # Falcon-H1's class takes mamba_d_head "auto" (its default): the intermediate size over the heads.
    auto = auto_head_dim and k.data.get("mamba_d_head", "auto") == "auto"
    return mamba2_shapes(
        tp_size=tp,
        intermediate_size=intermediate,
        n_groups=k.integer("mamba_n_groups"),
        num_heads=heads,
        head_dim=intermediate // heads if auto else k.integer("mamba_d_head"),
        state_size=k.integer("mamba_d_state"),
        conv_kernel=k.integer("mamba_d_conv", minimum=2, maximum=MAX_CONV_KERNEL),
        source=k.source,
        names={
            "intermediate_size": intermediate_name,
            "n_groups": "mamba_n_groups",
            "num_heads": "mamba_n_heads",
            "head_dim": "mamba_d_head",
            "state_size": "mamba_d_state",
        },
    )


def expand_times_hidden(k: Keys) -> int:
    expand = k.get("mamba_expand")
    hidden = k.integer("hidden_size")
    if isinstance(expand, bool) or not isinstance(expand, (int, float)):
        raise k.error("mamba_expand", expand, f"must be a number, not {json_kind(expand)}; {FIX}")
    if not expand > 0:  # also refuses NaN from a caller that skipped read_json
        raise k.error("mamba_expand", expand, f"must be a positive number; {FIX}")
    product = expand * hidden
    # Checked as a float first: int() of an infinite product would raise OverflowError.
    if not product <= MAX_DIM:
        raise ConfigError(
            f"{k.source}: mamba_expand * hidden_size = {shorten(expand)} * {hidden} is above {MAX_DIM:,}, "
            "far past any real model; check those keys in the model config"
        )
    return int(product)
