"""Granite-4.0-H's release rules: its config checks (``layer_types`` as each release reads them), the
parameters its class builds per rank, its checkpoint names (fused 3-D expert tensors)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from checker.core.errors import shorten
from checker.core.releases.config_rules import Release
from checker.core.weights.checkpoint_names import Shape
from checker.core.weights.weights import (
    Builder,
    ConfigSection,
    FamilyWeights,
    WeightsLayout,
    plain_layers,
)
from checker.families.family import FamilyRules
from checker.families.granite import GRANITE_LAYER_NAMES
from checker.families.mamba2_rules import check_mamba_heads, is_number, mamba_mixer, mamba_tensors


def build(b: Builder, cfg: ConfigSection, t: ConfigSection, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 100352)
    types = t.array("layer_types") or []
    heads, kv = t.integer("num_attention_heads", 32), t.integer("num_key_value_heads", 8)
    hd = H // heads
    tied = t.boolean("tie_word_embeddings", False)
    E = t.integer("num_local_experts", 0, minimum=0)
    inter = t.integer("intermediate_size", 1024)
    shared = t.integer("shared_intermediate_size", 0, minimum=0)
    bias = t.boolean("attention_bias", False)
    if b.p.first:
        b.vocab("model.embed_tokens", V, H, "tp", part="embed")
    # lm_head is built on every stage and tied to the embedding's tensor when tie_word_embeddings
    # (granitemoehybrid.py: not stage-aware).
    if not tied:
        b.vocab("lm_head", V, H, "tp", part="head")
    for i in range(b.p.start_layer, b.p.end_layer):
        pre = f"model.layers.{i}"
        if GRANITE_LAYER_NAMES.get(types[i]) == "mamba":
            mamba_mixer(
                b,
                f"{pre}.mamba",
                hidden=H,
                intermediate=int(t.number("mamba_expand", 2) * H),
                heads=t.integer("mamba_n_heads", 128),
                n_groups=t.integer("mamba_n_groups", 1),
                state=t.integer("mamba_d_state", 256),
                conv_kernel=t.integer("mamba_d_conv", 4),
                conv_bias=t.boolean("mamba_conv_bias", True),
                proj_bias=t.boolean("mamba_proj_bias", False),
                rms_norm=True,
                layout=layout,
                release=release,
                module=f"{pre}.mixer",  # MambaMixer2(prefix=f"{prefix}.mixer"), granitemoehybrid.py:99
            )
        else:
            b.qkv(f"{pre}.self_attn.qkv_proj", H, hd, heads, kv, "tp", bias=bias)
            b.row(f"{pre}.self_attn.o_proj", H, H, "tp", bias=bias)
        if E > 0:
            # the router: ReplicatedLinear(quant_config=None), 0.5.23 models/granitemoe.py:127-133
            b.replicated(f"{pre}.block_sparse_moe.gate", E, H, quant=False)
            b.experts(f"{pre}.block_sparse_moe.experts", E, H, inter)
        if shared:
            # MergedColumnParallelLinear([S] * 2), granitemoe.py:177-183: two logical shards
            b.column(f"{pre}.shared_mlp.input_linear", 2 * shared, H, "tp", shards=[shared, shared])
            b.row(f"{pre}.shared_mlp.output_linear", H, shared, "tp")
        b.norm(f"{pre}.input_layernorm", H)
        b.norm(f"{pre}.post_attention_layernorm", H)
    if b.p.last:
        b.norm("model.norm", H, part="head")


def tensors(cfg: ConfigSection, t: ConfigSection) -> Iterator[tuple[str, Shape]]:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 100352)
    heads, kv = t.integer("num_attention_heads", 32), t.integer("num_key_value_heads", 8)
    hd = H // heads
    E, inter = t.integer("num_local_experts", 0, minimum=0), t.integer("intermediate_size", 1024)
    shared = t.integer("shared_intermediate_size", 0, minimum=0)
    yield "model.embed_tokens.weight", (V, H)
    yield "model.norm.weight", (H,)
    if not t.boolean("tie_word_embeddings", False):
        yield "lm_head.weight", (V, H)
    for i, kind in enumerate(t.array("layer_types") or []):
        pre = f"model.layers.{i}"
        yield f"{pre}.input_layernorm.weight", (H,)
        yield f"{pre}.post_attention_layernorm.weight", (H,)
        if GRANITE_LAYER_NAMES.get(kind) == "mamba":
            yield from mamba_tensors(
                f"{pre}.mamba",
                hidden=H,
                intermediate=int(t.number("mamba_expand", 2) * H),
                heads=t.integer("mamba_n_heads", 128),
                groups=t.integer("mamba_n_groups", 1),
                state=t.integer("mamba_d_state", 256),
                conv=t.integer("mamba_d_conv", 4),
                conv_bias=t.boolean("mamba_conv_bias", True),
                proj_bias=t.boolean("mamba_proj_bias", False),
                rms_norm=True,
            )
        else:
            yield f"{pre}.self_attn.q_proj.weight", (heads * hd, H)
            yield f"{pre}.self_attn.k_proj.weight", (kv * hd, H)
            yield f"{pre}.self_attn.v_proj.weight", (kv * hd, H)
            yield f"{pre}.self_attn.o_proj.weight", (H, H)
        if E:
            yield f"{pre}.block_sparse_moe.router.layer.weight", (E, H)
            yield f"{pre}.block_sparse_moe.input_linear.weight", (E, 2 * inter, H)
            yield f"{pre}.block_sparse_moe.output_linear.weight", (E, H, inter)
        if shared:
            yield f"{pre}.shared_mlp.input_linear.weight", (2 * shared, H)
            yield f"{pre}.shared_mlp.output_linear.weight", (H, shared)


GRANITE_LAYERS = ("mamba", "attention")


GRANITE_ALIASES = {"linear_attention": "mamba", "full_attention": "attention"}
"""transformers 5.15's names for granite's layer types, which 0.5.19+ maps back
(``_to_sglang_layer_types``)."""


def check_config(r: Release, data: Mapping[str, Any]) -> None:
    layers = data.get("num_hidden_layers", 40)
    types = data.get("layer_types")
    if isinstance(types, list):
        if r.has("granitemoehybrid.layer_types_aliases"):
            types = [GRANITE_ALIASES.get(t, t) if isinstance(t, str) else t for t in types]
        if r.has("granitemoehybrid.layer_types_length") and len(types) != layers:
            raise r.refuse(
                "granitemoehybrid.layer_types_length",
                "layer_types",
                data["layer_types"],
                f"has {len(types):,} entries but num_hidden_layers={shorten(layers)}",
            )
        bad = next((i for i, t in enumerate(types) if t not in GRANITE_LAYERS), None)
        if bad is not None and r.has("granitemoehybrid.layer_types_values"):
            taken = "'mamba' or 'attention'"
            if r.has("granitemoehybrid.layer_types_aliases"):
                taken += " (or 'linear_attention', 'full_attention')"
            raise r.refuse(
                "granitemoehybrid.layer_types_values",
                "layer_types",
                data["layer_types"],
                f"has {shorten(data['layer_types'][bad])} at layer {bad}; its config class takes only "
                f"{taken}",
            )
    expand, hidden = data.get("mamba_expand", 2), data.get("hidden_size", 2048)
    if not (is_number(expand) and is_number(hidden)):
        return
    check_mamba_heads(
        r,
        family="granitemoehybrid",
        intermediate=expand * hidden,
        intermediate_name="mamba_expand * hidden_size",
        heads=data.get("mamba_n_heads", 64),
        head_dim=data.get("mamba_d_head", 64),
    )


RULES = FamilyRules(
    check_config=check_config,
    weights=FamilyWeights(
        "Granite-4.0-H",
        ("granitemoehybrid",),
        None,
        plain_layers("num_hidden_layers", 40),
        build,
        tensors,
        quant_methods=("compressed-tensors", "gptq_marlin"),
    ),
)
