"""Falcon-H1's release rules: its config checks, the parameters its class builds per rank (muP
buffers included), its checkpoint names; its ``load_weights`` raises on a name it has no parameter for."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from checker.core.releases.config_rules import Release
from checker.core.weights.checkpoint_names import Shape
from checker.core.weights.weights import (
    Builder,
    ConfigSection,
    FamilyWeights,
    WeightsLayout,
    before,
    dp_embed_group,
    plain_layers,
)
from checker.families.falcon_h1 import FALCON_H1_D_SSM
from checker.families.family import FamilyRules
from checker.families.mamba2_rules import check_mamba_heads, is_number, mamba_mixer, mamba_tensors


def build(b: Builder, cfg: ConfigSection, t: ConfigSection, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 128000)
    heads, kv = t.integer("num_attention_heads", 32), t.integer("num_key_value_heads", 8)
    hd = t.opt_int("head_dim") or H // heads
    tied = t.boolean("tie_word_embeddings", False)
    embed_g = dp_embed_group(layout, release, split_from="0.5.9")
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    d_ssm = FALCON_H1_D_SSM if "mamba_d_ssm" not in t.data else t.opt_int("mamba_d_ssm")
    inter_m = d_ssm if d_ssm is not None else int(t.number("mamba_expand", 2) * H)
    # lm_head is cast to float32 (falcon_h1.py ``self.lm_head = self.lm_head.number()``): when tied, that
    # is the embedding itself.
    if b.p.first:
        b.vocab("model.embed_tokens", V, H, embed_g, part="embed", dtype="float32" if tied else None)
    if b.p.last and not tied:
        b.vocab("lm_head", V, H, head_g, part="head", dtype="float32")
    for i in range(b.p.start_layer, b.p.end_layer):
        pre = f"model.layers.{i}"
        # quantized: the attention's linears are built without a prefix (falcon_h1.py:153-170, so no
        # exclude pattern names them), its RadixAttention without the quant config (no KV scales,
        # :172-179), the mixer without it (unquantized, :187-200), the MLP under ``mlp.`` (:212-213)
        bias = t.boolean("attention_bias", False)
        b.qkv(f"{pre}.qkv_proj", H, hd, heads, kv, "attn_tp", bias=bias, prefix="")
        b.row(f"{pre}.o_proj", H, heads * hd, "attn_tp", bias=bias, prefix="")
        groups = mamba_mixer(
            b,
            f"{pre}.mamba",
            hidden=H,
            intermediate=inter_m,
            heads=t.integer("mamba_n_heads", 128),
            n_groups=t.integer("mamba_n_groups", 1),
            state=t.integer("mamba_d_state", 256),
            conv_kernel=t.integer("mamba_d_conv", 4),
            conv_bias=t.boolean("mamba_conv_bias", True),
            proj_bias=t.boolean("mamba_proj_bias", False),
            rms_norm=t.boolean("mamba_rms_norm", False),
            layout=layout,
            release=release,
            # the config computed the cache params with the whole TP group up to 0.5.4.post3
            cache_tp_size=b.p.tp_size if before(release, "0.5.5") else None,
            quant=False,
        )
        inter = t.integer("intermediate_size", 14336)
        ff = f"{pre}.feed_forward"
        mlp = f"{pre}.mlp"
        gate_up = f"{mlp}.gate_up_proj"
        b.column(f"{ff}.gate_up_proj", 2 * inter, H, "tp", shards=[inter, inter], prefix=gate_up)
        b.row(f"{ff}.down_proj", H, inter, "tp", prefix=f"{mlp}.down_proj")
        b.norm(f"{pre}.input_layernorm", H)
        b.norm(f"{pre}.pre_ff_layernorm", H)
        b.norm(f"{pre}.q_norm", hd)
        b.norm(f"{pre}.k_norm", hd)
        # the muP multipliers of the mixer's input projection (falcon_h1.py _init_mup_vector), split by
        # the whole TP group even where the mixer splits by attention TP
        mup = 2 * inter_m + 2 * groups * t.integer("mamba_d_state", 256) + t.integer("mamba_n_heads", 128)
        b.buffer(f"{pre}.mup_vector", (1, mup // b.p.tp_size))
        b.rope(t.integer("max_position_embeddings", 8192), hd)
    if b.p.last:
        b.norm("model.final_layernorm", H, part="head")


def tensors(cfg: ConfigSection, t: ConfigSection) -> Iterator[tuple[str, Shape]]:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 128000)
    heads, kv = t.integer("num_attention_heads", 32), t.integer("num_key_value_heads", 8)
    hd = t.opt_int("head_dim") or H // heads
    inter = t.integer("intermediate_size", 14336)
    d_ssm = FALCON_H1_D_SSM if "mamba_d_ssm" not in t.data else t.opt_int("mamba_d_ssm")
    inter_m = d_ssm if d_ssm is not None else int(t.number("mamba_expand", 2) * H)
    yield "model.embed_tokens.weight", (V, H)
    yield "model.final_layernorm.weight", (H,)
    if not t.boolean("tie_word_embeddings", False):
        yield "lm_head.weight", (V, H)
    for i in range(t.integer("num_hidden_layers", 36)):
        pre = f"model.layers.{i}"
        yield f"{pre}.input_layernorm.weight", (H,)
        yield f"{pre}.pre_ff_layernorm.weight", (H,)
        yield f"{pre}.self_attn.q_proj.weight", (heads * hd, H)
        yield f"{pre}.self_attn.k_proj.weight", (kv * hd, H)
        yield f"{pre}.self_attn.v_proj.weight", (kv * hd, H)
        yield f"{pre}.self_attn.o_proj.weight", (H, heads * hd)
        yield from mamba_tensors(
            f"{pre}.mamba",
            hidden=H,
            intermediate=inter_m,
            heads=t.integer("mamba_n_heads", 128),
            groups=t.integer("mamba_n_groups", 1),
            state=t.integer("mamba_d_state", 256),
            conv=t.integer("mamba_d_conv", 4),
            conv_bias=t.boolean("mamba_conv_bias", True),
            proj_bias=t.boolean("mamba_proj_bias", False),
            rms_norm=t.boolean("mamba_rms_norm", False),
        )
        yield f"{pre}.feed_forward.gate_proj.weight", (inter, H)
        yield f"{pre}.feed_forward.up_proj.weight", (inter, H)
        yield f"{pre}.feed_forward.down_proj.weight", (H, inter)


def check_config(r: Release, data: Mapping[str, Any]) -> None:
    # mamba_d_ssm left out is the class's default, 1024; null means mamba_expand * hidden_size.
    d_ssm = data.get("mamba_d_ssm", 1024) if r.has("falcon_h1.d_ssm_default") else data.get("mamba_d_ssm")
    if d_ssm is None and r.has("falcon_h1.d_ssm_null_state"):
        # 0.5.3 sizes the state from mamba_d_ssm itself (hybrid_gdn_params), not from the intermediate
        # size its constructor worked out: a null one is None + int when the pool is sized.
        raise r.refuse(
            "falcon_h1.d_ssm_null_state",
            "mamba_d_ssm",
            None,
            "is added to 2 * n_groups * mamba_d_state when the state pool is sized (this release does not "
            "fall back to mamba_expand * hidden_size there); give it as an integer",
            "TypeError at start-up",
        )
    if d_ssm is None:
        expand, hidden = data.get("mamba_expand", 2), data.get("hidden_size", 4096)
        if not (is_number(expand) and is_number(hidden)):
            return
        intermediate, name = expand * hidden, "mamba_expand * hidden_size"
    else:
        intermediate, name = d_ssm, "mamba_d_ssm" if "mamba_d_ssm" in data else "mamba_d_ssm (its default)"
    check_mamba_heads(
        r,
        family="falcon_h1",
        intermediate=intermediate,
        intermediate_name=name,
        heads=data.get("mamba_n_heads", 128),
        head_dim=data.get("mamba_d_head", "auto"),
        auto=True,
    )


_STACKED = (("qkv_proj", "q_proj"), ("qkv_proj", "k_proj"), ("qkv_proj", "v_proj"))
_STACKED_MLP = (("gate_up_proj", "gate_proj"), ("gate_up_proj", "up_proj"))


def load_name(name: str) -> tuple[str, bool]:
    """The parameter Falcon-H1's ``load_weights`` looks a checkpoint name up as (0.5.23 falcon_h1.py:
    518-555), and whether a miss is skipped (a stacked shard's: ``if name not in params_dict:
    continue``) rather than a KeyError."""
    name = name.replace(".self_attn", "") if ".self_attn." in name else name
    name = name.replace("A_log", "A") if "A_log" in name else name
    for param, shard in _STACKED + _STACKED_MLP:
        if shard in name:
            return name.replace(shard, param), True
    return name, name.endswith(".bias")


# Falcon-H1's load_weights (models/falcon_h1.py, the same in every release) leaves two kinds of name to
# no parameter: the rotary cache, and a bias the class has none of. Every other name, a stacked
# projection's too (its name rewritten onto qkv_proj / gate_up_proj, then looked up), indexes
# params_dict: a tensor the class has no parameter for is a KeyError (found so by the release's own
# class, built on the meta device: tests/test_checkpoint_declarations.py, group sglang).
RULES = FamilyRules(
    check_config=check_config,
    weights=FamilyWeights(
        "Falcon-H1",
        ("falcon_h1",),
        None,
        plain_layers("num_hidden_layers", 36),
        build,
        tensors,
        unknown_tensor_rule="falcon_h1.load_unknown",
        quant_methods=("modelopt_fp8", "compressed-tensors", "gptq_marlin"),
        load_name=load_name,
    ),
)
