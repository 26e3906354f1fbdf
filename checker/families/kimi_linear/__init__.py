"""Kimi-Linear (``model_type`` kimi_linear): KDA layers listed in ``linear_attn_config.kda_layers``, MLA
attention on the others (SGLang ``configs/kimi_linear.py``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from checker.core.errors import ConfigError, shorten
from checker.core.releases.family_facts import KDA, FamilyFacts
from checker.core.sizing.geometry import MAX_DIM, MAX_STATE_ELEMENTS, exact_div
from checker.core.sizing.models import FIX, MAX_CONV_KERNEL, AttentionSpec, Keys, bounded, not_linear_layers
from checker.families.family import FamilyRules, HybridFamily


def geometry(k: Keys, tp: int) -> dict[str, Any]:
    L = k.layers()
    lac = k.section("linear_attn_config")
    kda = lac.get("kda_layers")
    if not isinstance(kda, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in kda):
        raise lac.error("kda_layers", kda, f"must be a list of 1-based layer ids; {FIX}")
    if len(kda) > L:
        raise lac.error(
            "kda_layers", kda, f"lists {len(kda):,} layers but num_hidden_layers={L}; list each layer once"
        )
    # Check the ids as the user wrote them (1-based): after the shift a 0 would be reported as -1.
    bad = sorted({i for i in kda if not 1 <= i <= L})
    if bad:
        raise ConfigError(
            f"{k.source}: {lac.name('kda_layers')} {shorten(bad)} out of range [1, {L}]; kda_layers are "
            f"1-based layer ids up to num_hidden_layers={L}"
        )
    dup = sorted(i for i, n in Counter(kda).items() if n > 1)
    if dup:
        raise ConfigError(
            f"{k.source}: {lac.name('kda_layers')} repeats {shorten(dup)}; list each layer once"
        )
    H = lac.integer("num_heads")
    d = lac.integer("head_dim")
    K = lac.integer("short_conv_kernel_size", minimum=2, maximum=MAX_CONV_KERNEL)
    heads, dim = lac.name("num_heads"), lac.name("head_dim")
    channels = bounded(
        3 * H * d, expr=f"3 * {heads} * {dim}", limit=MAX_DIM, source=k.source, what="conv channels"
    )
    bounded(
        H * d * d,
        expr=f"{heads} * {dim} * {dim}",
        limit=MAX_STATE_ELEMENTS,
        source=k.source,
        what="temporal state elements",
    )
    # KDA keeps the conv window axis first and packs q, k, v channels into one conv state.
    conv = ((K - 1, exact_div(channels, tp, what=f"3 * {heads} * {dim}", source=k.source)),)
    temporal = (exact_div(H, tp, what=heads, source=k.source), d, d)
    # kda_layers are 1-BASED in the config; the config's dtype key is ignored by SGLang here.
    return dict(
        num_hidden_layers=L,
        linear_layer_ids=tuple(sorted(i - 1 for i in kda)),
        conv_shapes=conv,
        temporal_shape=temporal,
    )


def _rules() -> FamilyRules:
    # start-up: the release rules (config checks, weights, checkpoint names) load only for a model config
    # or a checkpoint; a rank that sizes a preset or a model spec never imports them
    from checker.families.kimi_linear.rules import RULES

    return RULES


# configs/kimi_linear.py KimiLinearConfig: max_position_embeddings=4096, num_nextn_predict_layers=0;
# ModelConfig treats KimiLinearForCausalLM as MLA (head_dim 72, kv_lora_rank + qk_rope_head_dim).
KIMI_ATTENTION = AttentionSpec(not_linear_layers, 4096, mla=True, nextn_default=0)

FAMILY = HybridFamily(
    name="Kimi-Linear",
    facts=FamilyFacts(
        model_types=("kimi_linear",),
        kind=KDA,
        # 0.5.4.post2 model_runner.py ``kimi_linear_config`` joins ``mambaish_config``.
        pool=(("0.5.4.post2", None),),
        # server_args.py _handle_model_specific_adjustments "Disabling Radix Cache for {model_arch}"
        # (0.5.4.post2-0.5.13.post1; from 0.5.9 via ``support_mamba_cache=False``).
        radix_off=(("0.5.4.post2", "0.5.13.post1"),),
        # 0.5.14 server_args.py ``_support_mamba_cache_extra_buffer`` and 0.5.15.post1
        # arg_groups/overrides.py ``_MAMBA_EXTRA_BUFFER_ARCHS`` miss KimiLinearForCausalLM.
        no_extra_buffer=(("0.5.14", "0.5.15.post1"),),
    ),
    read=geometry,
    attention=KIMI_ATTENTION,
    load_rules=_rules,
    example_configs=("tests/fixtures/kimi_linear_48b_a3b.json",),
)
