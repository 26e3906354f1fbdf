"""Kimi-K3 (``model_type`` kimi_k3, SGLang 0.5.23 ``configs/kimi_k3.py``): a KimiLinearConfig as
``text_config``, read as Kimi-Linear's; the built-in ``kimi-k3`` preset."""

from __future__ import annotations

from checker.core.releases.family_facts import KDA, FamilyFacts
from checker.core.sizing.attention import AttentionGeometry
from checker.core.sizing.geometry import ModelGeometry, exact_div
from checker.families import kimi_linear
from checker.families.family import FamilyRules, HybridFamily


def _kimi_k3(tp_size: int) -> ModelGeometry:
    # The upstream unit test's fixture ("Kimi-K3 shape"): 93 layers, every 4th is full attention and
    # the last two are too; conv [(4096, 3)] bf16 and temporal (64, 128, 128) fp32 per layer. Taken as
    # TP-1 shapes so --tp-size divides the 64 heads and 4096 conv channels like a config's.
    src = "preset kimi-k3"
    linear = tuple(i for i in range(93) if (i + 1) % 4 != 0 and i <= 90)
    return ModelGeometry(
        name="kimi-k3",
        family="kimi_k3",  # SGLang 0.5.23 models/kimi_k3.py; no older release has this family
        num_hidden_layers=93,
        linear_layer_ids=linear,
        conv_shapes=((exact_div(4096, tp_size, what="conv channels", source=src), 3),),
        temporal_shape=(exact_div(64, tp_size, what="num_heads", source=src), 128, 128),
        # SGLang names no published Kimi-K3 config.json. KimiK3Config (configs/kimi_k3.py) holds the hybrid
        # layers and the MLA attention in a KimiLinearConfig text config, whose full_attention_layer_ids are
        # the layers that are not KDA (configs/kimi_linear.py:169); the MLA cell is kv_lora_rank 512 +
        # qk_rope_head_dim 64 (kernels/ops/attention/verify_mla.py:32 "K3 MLA (kv_lora_rank 512 + qk_rope
        # 64)"); its context length is KimiLinearConfig's max_position_embeddings default, 4096
        # (configs/kimi_linear.py:64), and num_nextn_predict_layers its default 0. bf16 KV (2 bytes; the
        # float16 that "auto" would give a config without a dtype is as wide).
        context_len=4096,
        attention=AttentionGeometry(
            full_attention_layer_ids=tuple(i for i in range(93) if i not in set(linear)),
            num_kv_heads=1,
            head_dim=72,
            v_head_dim=72,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            dtype="bfloat16",
            architecture="KimiK3ForConditionalGeneration",
            num_nextn_predict_layers=0,
        ),
    )


def _rules() -> FamilyRules:
    # start-up: the release rules (config checks, weights, checkpoint names) load only for a model config
    # or a checkpoint; a rank that sizes a preset or a model spec never imports them
    from checker.families.kimi_k3.rules import RULES

    return RULES


FAMILY = HybridFamily(
    name="Kimi-K3",
    facts=FamilyFacts(
        model_types=("kimi_k3",),
        kind=KDA,
        # ``kimi_linear_config`` (``hybrid_kda_config`` from 0.5.21): KimiK3's text config.
    ),
    # Kimi-K3 (0.5.23 configs/kimi_k3.py KimiK3Config): the hybrid layers and the MLA attention are a
    # KimiLinearConfig built from text_config (``KimiLinearConfig(**text_config)``), which
    # configs/hybrid_arch.py ``kimi_linear_config`` returns for the state pool and ModelConfig reads as
    # ``hf_text_config`` (the MLA branch for KimiK3ForConditionalGeneration, configs/model_config.py:1463).
    read=kimi_linear.geometry,
    # Kimi-K3: the same KimiLinearConfig, as text_config (configs/kimi_k3.py); ModelConfig's MLA branch
    # names KimiK3ForConditionalGeneration with KimiLinearForCausalLM (head_dim 72).
    attention=kimi_linear.KIMI_ATTENTION,
    load_rules=_rules,
    text_config="required",
    presets={"kimi-k3": _kimi_k3},
    default_preset="kimi-k3",  # --model's default when no config is given
    example_configs=("tests/fixtures/kimi_k3_config.json",),
)
