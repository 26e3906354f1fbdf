"""Nemotron-H (``model_type`` nemotron_h): Mamba2, attention, MLP and MoE layers as
``hybrid_override_pattern`` (or ``layers_block_type``) spells them (SGLang ``configs/nemotron_h.py``)."""

from __future__ import annotations

from typing import Any

from checker.core.errors import shorten
from checker.core.releases.family_facts import MAMBA2, FamilyFacts
from checker.core.sizing.geometry import MAX_LAYERS
from checker.core.sizing.models import FIX, LAYERS_WHY, MAX_CONV_KERNEL, AttentionSpec, Keys, mamba2_shapes
from checker.families.family import FamilyRules, HybridFamily

# A Nemotron-H layer as hybrid_override_pattern writes it, and as layers_block_type (0.5.10+) does.
NEMOTRON_LAYER_TYPES = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}


def _nemotron_pattern(k: Keys) -> str:
    """The layer pattern: ``hybrid_override_pattern``, else ``layers_block_type`` written as one (the
    field 0.5.10+ reads first; where both are given and differ, the release's own rules refuse it)."""
    if k.data.get("hybrid_override_pattern") is None and isinstance(k.data.get("layers_block_type"), list):
        of = {v: c for c, v in NEMOTRON_LAYER_TYPES.items()}
        blocks = k.data["layers_block_type"]
        bad = next((i for i, b in enumerate(blocks) if not isinstance(b, str) or b not in of), None)
        if bad is not None:
            raise k.error(
                "layers_block_type",
                blocks,
                f"has {shorten(blocks[bad])} at layer {bad}; a layer is one of {', '.join(of)}; {FIX}",
            )
        return "".join(of[b] for b in blocks)
    pattern = k.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise k.error("hybrid_override_pattern", pattern, f"must be a non-empty string; {FIX}")
    # Every release refuses any other character, at load or building the model
    # (checker.core.releases.config_rules
    # says where for each release); counting it as an attention layer would size a model nobody runs.
    bad = next((i for i, c in enumerate(pattern) if c not in NEMOTRON_LAYER_TYPES), None)
    if bad is not None:
        raise k.error(
            "hybrid_override_pattern",
            pattern,
            f"has {pattern[bad]!r} at layer {bad}; a layer is one of 'M', '*', '-' or 'E' and SGLang refuses "
            f"anything else; {FIX}",
        )
    return pattern


def geometry(k: Keys, tp: int) -> dict[str, Any]:
    pattern = _nemotron_pattern(k)
    if len(pattern) > MAX_LAYERS:
        raise k.error(
            "hybrid_override_pattern",
            pattern,
            f"has one character per layer, and {len(pattern):,} layers is above {MAX_LAYERS:,} "
            f"{LAYERS_WHY}; {FIX}",
        )
    heads = k.integer("mamba_num_heads")
    head_dim = k.integer("mamba_head_dim")
    conv, temporal = mamba2_shapes(
        tp_size=tp,
        intermediate_size=heads * head_dim,
        n_groups=k.integer("n_groups"),
        num_heads=heads,
        head_dim=head_dim,
        state_size=k.integer("ssm_state_size"),
        conv_kernel=k.integer("conv_kernel", minimum=2, maximum=MAX_CONV_KERNEL),
        source=k.source,
        names={
            "intermediate_size": "mamba_num_heads * mamba_head_dim",
            "num_heads": "mamba_num_heads",
            "head_dim": "mamba_head_dim",
            "state_size": "ssm_state_size",
        },
    )
    ids = tuple(i for i, c in enumerate(pattern) if c == "M")
    return dict(
        num_hidden_layers=len(pattern), linear_layer_ids=ids, conv_shapes=conv, temporal_shape=temporal
    )


def _nemotron_full(k: Keys, _: dict[str, Any]) -> tuple[int, ...]:
    # configs/nemotron_h.py full_attention_layer_ids: the "*" of hybrid_override_pattern.
    return tuple(i for i, c in enumerate(k.get("hybrid_override_pattern")) if c == "*")


def _rules() -> FamilyRules:
    # start-up: the release rules (config checks, weights, checkpoint names) load only for a model config
    # or a checkpoint; a rank that sizes a preset or a model spec never imports them
    from checker.families.nemotron_h.rules import RULES

    return RULES


FAMILY = HybridFamily(
    name="Nemotron-H",
    facts=FamilyFacts(
        model_types=("nemotron_h",),
        kind=MAMBA2,
        # 0.5.3.post1 model_runner.py ``mamba2_config`` (FalconH1Config | NemotronHConfig).
        pool=(("0.5.3.post1", None),),
        # 0.5.3.post2-0.5.6.post2 model_runner.py ``ModelRunner.__init__``: ``if config := self.mamba2_config:
        # ... disable_radix_cache = True``.
        radix_off=(("0.5.3.post2", "0.5.6.post2"),),
        # 0.5.9-0.5.12.post1 server_args.py ``_handle_mamba_radix_cache(...,
        # support_mamba_cache_extra_buffer=False)`` (arg_groups/nemotron_h_hook.py from 0.5.12).
        no_extra_buffer=(("0.5.9", "0.5.12.post1"),),
    ),
    read=geometry,
    # configs/nemotron_h.py NemotronHConfig: head_dim=128, num_key_value_heads=8,
    # max_position_embeddings=4096, num_nextn_predict_layers=0.
    attention=AttentionSpec(_nemotron_full, 4096, kv_heads_default=8, head_dim_default=128, nextn_default=0),
    load_rules=_rules,
    example_configs=("tests/fixtures/nemotron_h_8b.json", "tests/fixtures/nemotron_h_48l.json"),
)
