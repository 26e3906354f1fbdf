"""Qwen3-Next (``model_type`` qwen3_next): gated delta net layers, every
``full_attention_interval``-th layer full attention (SGLang ``configs/qwen3_next.py``)."""

from __future__ import annotations

from typing import Any

from checker.core.errors import ConfigError
from checker.core.releases.family_facts import GDN, FamilyFacts
from checker.core.sizing.geometry import MAX_LAYERS
from checker.core.sizing.models import (
    FIX,
    MAX_CONV_KERNEL,
    AttentionSpec,
    Keys,
    mamba2_shapes,
    not_linear_layers,
)
from checker.families.family import FamilyRules, HybridFamily


def geometry(k: Keys, tp: int) -> dict[str, Any]:
    L = k.layers()
    interval = k.integer("full_attention_interval", maximum=MAX_LAYERS)
    value_heads = k.integer("linear_num_value_heads")
    value_dim = k.integer("linear_value_head_dim")
    key_heads = k.integer("linear_num_key_heads")
    if value_heads % key_heads:
        # SGLang's gated delta net gives each key head num_v_heads // num_k_heads value heads
        # (models/qwen3_next.py fix_query_key_value_ordering): any other count cannot load.
        raise ConfigError(
            f"{k.source}: {k.name('linear_num_value_heads')}={value_heads} must be a multiple of "
            f"{k.name('linear_num_key_heads')}={key_heads} (SGLang splits the value heads evenly among the "
            f"key heads, and cannot load this model); {FIX}"
        )
    names = {
        "intermediate_size": f"{k.name('linear_num_value_heads')} * {k.name('linear_value_head_dim')}",
        "n_groups": k.name("linear_num_key_heads"),
        "num_heads": k.name("linear_num_value_heads"),
        "head_dim": k.name("linear_value_head_dim"),
        "state_size": k.name("linear_key_head_dim"),
    }
    conv, temporal = mamba2_shapes(
        tp_size=tp,
        intermediate_size=value_heads * value_dim,
        n_groups=key_heads,
        num_heads=value_heads,
        head_dim=value_dim,
        state_size=k.integer("linear_key_head_dim"),
        conv_kernel=k.integer("linear_conv_kernel_dim", minimum=2, maximum=MAX_CONV_KERNEL),
        source=k.source,
        names=names,
    )
    # SGLang derives the linear layers from the interval and ignores ``layer_types`` here.
    ids = tuple(i for i in range(L) if (i + 1) % interval != 0)
    return dict(
        num_hidden_layers=L,
        linear_layer_ids=ids,
        conv_shapes=conv,
        temporal_shape=temporal,
        config_ssm_dtype=k.optional_dtype("mamba_ssm_dtype"),
    )


QWEN_ATTENTION = AttentionSpec(not_linear_layers, 32768, kv_heads_default=2, head_dim_default=256)


def _rules() -> FamilyRules:
    # start-up: the release rules (config checks, weights, checkpoint names) load only for a model config
    # or a checkpoint; a rank that sizes a preset or a model spec never imports them
    from checker.families.qwen3_next.rules import RULES

    return RULES


FAMILY = HybridFamily(
    name="Qwen3-Next",
    facts=FamilyFacts(
        model_types=("qwen3_next",),
        kind=GDN,
        # SGLang 0.5.2 model_runner.py ``is_hybrid_gdn`` (Qwen3NextForCausalLM), then ``hybrid_gdn_config``
        # (Qwen3NextConfig): a pool from 0.5.2, split over dp wherever a release asks.
        pool=(("0.5.2", None),),
        dp_split=(("0.5.2", None),),
        # 0.5.7 server_args.py _handle_model_specific_adjustments: ``assert FLA_CHUNK_SIZE % page_size == 0``
        # with an extra buffer.
        page_divides_chunk=(("0.5.7", "0.5.7"),),
    ),
    read=geometry,
    # configs/qwen3_next.py Qwen3NextConfig (Qwen3_5TextConfig inherits it): num_key_value_heads=2,
    # head_dim=256, max_position_embeddings=32768.
    attention=QWEN_ATTENTION,
    load_rules=_rules,
    example_configs=("tests/fixtures/qwen3_next_80b_a3b.json",),
)
