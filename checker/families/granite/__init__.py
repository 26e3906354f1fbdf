"""Granite-4.0-H (``model_type`` granitemoehybrid): Mamba2 and attention layers as ``layer_types`` lists
them (SGLang ``configs/granitemoehybrid.py``)."""

from __future__ import annotations

from typing import Any

from checker.core.errors import ConfigError, json_kind, shorten
from checker.core.releases.family_facts import MAMBA2, FamilyFacts
from checker.core.sizing.models import FIX, AttentionSpec, Keys
from checker.families.family import FamilyRules, HybridFamily
from checker.families.mamba2 import expand_times_hidden, mamba2_block

GRANITE_LAYER_NAMES = {
    "mamba": "mamba",
    "attention": "attention",
    "linear_attention": "mamba",
    "full_attention": "attention",
}
"""Granite-4.0-H's layer types: "linear_attention" / "full_attention" are transformers 5.15's names, which
0.5.19+ maps back (earlier releases refuse them: :mod:`checker.core.releases.config_rules`); every release
refuses any other."""


def geometry(k: Keys, tp: int) -> dict[str, Any]:
    L = k.layers()
    types = k.get("layer_types")
    if not isinstance(types, list) or len(types) != L:
        got = f"{len(types):,} entries" if isinstance(types, list) else json_kind(types)
        raise ConfigError(
            f"{k.source}: layer_types must be a list of num_hidden_layers={L} entries, got {got}; {FIX}"
        )
    names = GRANITE_LAYER_NAMES
    bad = next((i for i, t in enumerate(types) if not isinstance(t, str) or t not in names), None)
    if bad is not None:
        raise ConfigError(
            f"{k.source}: layer_types has {shorten(types[bad])} at layer {bad}; a layer is 'mamba' or "
            f"'attention'; {FIX}"
        )
    intermediate = expand_times_hidden(k)
    conv, temporal = mamba2_block(k, tp, intermediate, "int(mamba_expand * hidden_size)")
    ids = tuple(i for i, t in enumerate(types) if names[t] == "mamba")
    return dict(num_hidden_layers=L, linear_layer_ids=ids, conv_shapes=conv, temporal_shape=temporal)


def _granite_full(k: Keys, _: dict[str, Any]) -> tuple[int, ...]:
    # configs/granitemoehybrid.py attention_layer_ids: layer_types[i] == "attention" (0.5.19+ maps
    # transformers 5.15's "full_attention" back to it first: GRANITE_LAYER_NAMES).
    return tuple(i for i, t in enumerate(k.get("layer_types")) if GRANITE_LAYER_NAMES.get(t) == "attention")


def _rules() -> FamilyRules:
    # start-up: the release rules (config checks, weights, checkpoint names) load only for a model config
    # or a checkpoint; a rank that sizes a preset or a model spec never imports them
    from checker.families.granite.rules import RULES

    return RULES


FAMILY = HybridFamily(
    name="Granite-4.0-H",
    facts=FamilyFacts(
        model_types=("granitemoehybrid",),
        kind=MAMBA2,
        # 0.5.9-0.5.12.post1 server_args.py ``_handle_mamba_radix_cache(...,
        # support_mamba_cache_extra_buffer=False)`` for GraniteMoeHybridForCausalLM.
        no_extra_buffer=(("0.5.9", "0.5.12.post1"),),
    ),
    read=geometry,
    # configs/granitemoehybrid.py GraniteMoeHybridConfig: num_key_value_heads=8,
    # max_position_embeddings=131072.
    attention=AttentionSpec(_granite_full, 131072, kv_heads_default=8),
    load_rules=_rules,
    example_configs=("tests/fixtures/granite_4_0_h_small.json",),
)
