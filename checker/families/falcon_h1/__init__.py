"""Falcon-H1 (``model_type`` falcon_h1): attention and Mamba2 side by side on every layer (SGLang
``configs/falcon_h1.py``)."""

from __future__ import annotations

from typing import Any

from checker.core.releases.family_facts import MAMBA2, FamilyFacts
from checker.core.sizing.models import AttentionSpec, Keys
from checker.families.family import FamilyRules, HybridFamily
from checker.families.mamba2 import expand_times_hidden, mamba2_block

FALCON_H1_D_SSM = 1024
"""``mamba_d_ssm`` where a Falcon-H1 config leaves it out: FalconH1Config's default in every release (null
means ``mamba_expand * hidden_size``)."""


def geometry(k: Keys, tp: int) -> dict[str, Any]:
    L = k.layers()
    if "mamba_d_ssm" not in k.data:
        # FalconH1Config's default (configs/falcon_h1.py, every release): 1024, not expand * hidden
        intermediate, name = FALCON_H1_D_SSM, "mamba_d_ssm (its default)"
    elif k.data["mamba_d_ssm"] is not None:
        intermediate, name = k.integer("mamba_d_ssm"), "mamba_d_ssm"
    else:
        intermediate, name = expand_times_hidden(k), "int(mamba_expand * hidden_size)"
    conv, temporal = mamba2_block(k, tp, intermediate, name, auto_head_dim=True)
    # Every Falcon-H1 layer runs attention and Mamba2 side by side: all L layers hold state.
    return dict(
        num_hidden_layers=L, linear_layer_ids=tuple(range(L)), conv_shapes=conv, temporal_shape=temporal
    )


def _every_layer(_: Keys, fields: dict[str, Any]) -> tuple[int, ...]:
    # configs/falcon_h1.py full_attention_layer_ids: range(num_hidden_layers) (attention on every layer).
    return tuple(range(fields["num_hidden_layers"]))


def _rules() -> FamilyRules:
    # start-up: the release rules (config checks, weights, checkpoint names) load only for a model config
    # or a checkpoint; a rank that sizes a preset or a model spec never imports them
    from checker.families.falcon_h1.rules import RULES

    return RULES


FAMILY = HybridFamily(
    name="Falcon-H1",
    facts=FamilyFacts(
        model_types=("falcon_h1",),
        kind=MAMBA2,
        # 0.5.3 model_runner.py ``is_hybrid_gdn`` lists FalconH1ForCausalLM; ``mamba2_config`` from
        # 0.5.3.post1.
        pool=(("0.5.3", None),),
        # As Nemotron-H's: ``mamba2_config`` forces the radix cache off (0.5.3.post2-0.5.6.post2), and
        # server_args.py gives it no extra buffer in 0.5.9-0.5.12.post1.
        radix_off=(("0.5.3.post2", "0.5.6.post2"),),
        no_extra_buffer=(("0.5.9", "0.5.12.post1"),),
    ),
    read=geometry,
    # configs/falcon_h1.py FalconH1Config: num_key_value_heads=8, max_position_embeddings=8192.
    attention=AttentionSpec(_every_layer, 8192, kv_heads_default=8),
    load_rules=_rules,
    example_configs=("tests/fixtures/falcon_h1_0_5b.json",),
)
