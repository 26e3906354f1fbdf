"""Kimi-Linear's release rules: its config checks, the parameters its class builds per rank, its
checkpoint names."""

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
    divide,
    embed_and_head,
    plain_layers,
)
from checker.families.family import FamilyRules


def build(b: Builder, cfg: ConfigSection, t: ConfigSection, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 163840)
    L = t.integer("num_hidden_layers", 32)
    lac = t.section("linear_attn_config")
    kda = lac.array("kda_layers") or []
    kda0 = {int(i) - 1 for i in kda}  # 1-based in the config
    nh, hd = lac.integer("num_heads"), lac.integer("head_dim")
    K = lac.integer("short_conv_kernel_size", 4)
    heads = t.integer("num_attention_heads", 32)
    nope, rope = t.integer("qk_nope_head_dim"), t.integer("qk_rope_head_dim")
    vdim, kv_lora = t.integer("v_head_dim"), t.integer("kv_lora_rank")
    q_lora = t.opt_int("q_lora_rank")
    E = t.opt_int("num_experts")
    moe_inter = t.opt_int("moe_intermediate_size")
    n_shared = t.integer("num_shared_experts", 0, minimum=0)
    first_dense = t.integer("first_k_dense_replace", 0, minimum=0)
    freq = t.integer("moe_layer_freq", 1)
    inter = t.integer("intermediate_size", 11008)
    embed_and_head(b, V, H, tied=False, embed_group="tp", head_group="tp")
    proj = nh * hd
    for i in range(b.p.start_layer, b.p.end_layer):
        pre = f"model.layers.{i}.self_attn"
        if i in kda0:
            # KimiDeltaAttention, sharded over the whole TP group (shard_on_attn_tp=False): q, k, v and
            # beta column-parallel; f_a and g_a replicated; f_b, g_b column-parallel; dt_bias, A_log and
            # the conv weights held in float32.
            g = "tp"
            size = b.p.size(g)
            b.column(f"{pre}.q_proj", proj, H, g)
            b.column(f"{pre}.k_proj", proj, H, g)
            b.column(f"{pre}.v_proj", proj, H, g)
            b.column(f"{pre}.b_proj", nh, H, g)
            b.replicated(f"{pre}.f_a_proj", hd, H)
            b.replicated(f"{pre}.g_a_proj", hd, H)
            b.column(f"{pre}.f_b_proj", proj, hd, g)
            b.column(f"{pre}.g_b_proj", proj, hd, g)
            b.add(
                f"{pre}.dt_bias",
                (divide(proj, size, "linear_attn num_heads * head_dim"),),
                part="layers",
                dtype="float32",
            )
            b.add(f"{pre}.qkv_conv1d.weight", (3 * proj // size, 1, K), part="layers", dtype="float32")
            b.add(
                f"{pre}.A_log",
                (1, 1, divide(nh, size, "linear_attn num_heads"), 1),
                part="layers",
                dtype="float32",
            )
            b.norm(f"{pre}.o_norm", hd)
            b.row(f"{pre}.o_proj", H, proj, g)
        else:
            # DeepseekV2AttentionMLA over the attention-TP group; kv_a_proj_with_mqa replicated.
            g = "attn_tp"
            if q_lora is None:
                b.column(f"{pre}.q_proj", heads * (nope + rope), H, g)
            else:
                b.replicated(f"{pre}.q_a_proj", q_lora, H)
                b.norm(f"{pre}.q_a_layernorm", q_lora)
                b.column(f"{pre}.q_b_proj", heads * (nope + rope), q_lora, g)
            b.replicated(f"{pre}.kv_a_proj_with_mqa", kv_lora + rope, H)
            b.norm(f"{pre}.kv_a_layernorm", kv_lora)
            b.column(f"{pre}.kv_b_proj", heads * (nope + vdim), kv_lora, g)
            b.row(f"{pre}.o_proj", H, heads * vdim, g)
            # post_load_weights: w_kc and w_vc, contiguous copies of kv_b_proj's two halves.
            local = divide(heads, b.p.size(g), "num_attention_heads")
            b.copy(f"{pre}.w_kc", (local, kv_lora, nope))
            b.copy(f"{pre}.w_vc", (local, kv_lora, vdim))
        sparse = E is not None and i >= first_dense and i % freq == 0
        if sparse:
            assert E is not None and moe_inter is not None
            mp = f"model.layers.{i}.block_sparse_moe"
            b.replicated(f"{mp}.gate", E, H)
            b.add(f"{mp}.gate.e_score_correction_bias", (E,), part="layers")
            b.experts(f"{mp}.experts", E, H, moe_inter)
            if n_shared:
                si = moe_inter * n_shared
                b.column(f"{mp}.shared_experts.gate_up_proj", 2 * si, H, "tp")
                b.row(f"{mp}.shared_experts.down_proj", H, si, "tp")
        else:
            b.column(f"model.layers.{i}.mlp.gate_up_proj", 2 * inter, H, "tp")
            b.row(f"model.layers.{i}.mlp.down_proj", H, inter, "tp")
        b.norm(f"model.layers.{i}.input_layernorm", H)
        b.norm(f"model.layers.{i}.post_attention_layernorm", H)
    if b.p.last:
        b.norm("model.norm", H, part="head")
    del L


def tensors(cfg: ConfigSection, t: ConfigSection) -> Iterator[tuple[str, Shape]]:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 163840)
    L = t.integer("num_hidden_layers", 32)
    lac = t.section("linear_attn_config")
    kda = {int(i) - 1 for i in (lac.array("kda_layers") or [])}
    nh, hd, K = lac.integer("num_heads"), lac.integer("head_dim"), lac.integer("short_conv_kernel_size", 4)
    proj = nh * hd
    heads = t.integer("num_attention_heads", 32)
    nope, rope, vdim = t.integer("qk_nope_head_dim"), t.integer("qk_rope_head_dim"), t.integer("v_head_dim")
    kv_lora, q_lora = t.integer("kv_lora_rank"), t.opt_int("q_lora_rank")
    E, moe_inter = t.opt_int("num_experts"), t.opt_int("moe_intermediate_size")
    shared = t.integer("num_shared_experts", 0, minimum=0)
    first_dense, freq = t.integer("first_k_dense_replace", 0, minimum=0), t.integer("moe_layer_freq", 1)
    inter = t.integer("intermediate_size", 11008)
    yield "model.embed_tokens.weight", (V, H)
    yield "model.norm.weight", (H,)
    yield "lm_head.weight", (V, H)
    for i in range(L):
        pre = f"model.layers.{i}"
        yield f"{pre}.input_layernorm.weight", (H,)
        yield f"{pre}.post_attention_layernorm.weight", (H,)
        a = f"{pre}.self_attn"
        if i in kda:
            for n in ("q", "k", "v"):
                yield f"{a}.{n}_proj.weight", (proj, H)
                yield f"{a}.{n}_conv1d.weight", (proj, 1, K)
            yield f"{a}.b_proj.weight", (nh, H)
            yield f"{a}.f_a_proj.weight", (hd, H)
            yield f"{a}.g_a_proj.weight", (hd, H)
            yield f"{a}.f_b_proj.weight", (proj, hd)
            yield f"{a}.g_b_proj.weight", (proj, hd)
            yield f"{a}.A_log", (1, 1, nh, 1)
            yield f"{a}.dt_bias", (proj,)
            yield f"{a}.o_norm.weight", (hd,)
            yield f"{a}.o_proj.weight", (H, proj)
        else:
            if q_lora is None:
                yield f"{a}.q_proj.weight", (heads * (nope + rope), H)
            else:
                yield f"{a}.q_a_proj.weight", (q_lora, H)
                yield f"{a}.q_a_layernorm.weight", (q_lora,)
                yield f"{a}.q_b_proj.weight", (heads * (nope + rope), q_lora)
            yield f"{a}.kv_a_proj_with_mqa.weight", (kv_lora + rope, H)
            yield f"{a}.kv_a_layernorm.weight", (kv_lora,)
            yield f"{a}.kv_b_proj.weight", (heads * (nope + vdim), kv_lora)
            yield f"{a}.o_proj.weight", (H, heads * vdim)
        if E is not None and moe_inter is not None and i >= first_dense and i % freq == 0:
            m = f"{pre}.block_sparse_moe"
            yield f"{m}.gate.weight", (E, H)
            yield f"{m}.gate.e_score_correction_bias", (E,)
            yield f"{m}.experts.E.w1.weight", (moe_inter, H)
            yield f"{m}.experts.E.w3.weight", (moe_inter, H)
            yield f"{m}.experts.E.w2.weight", (H, moe_inter)
            if shared:
                si = moe_inter * shared
                yield f"{m}.shared_experts.gate_proj.weight", (si, H)
                yield f"{m}.shared_experts.up_proj.weight", (si, H)
                yield f"{m}.shared_experts.down_proj.weight", (H, si)
        else:
            yield f"{pre}.mlp.gate_proj.weight", (inter, H)
            yield f"{pre}.mlp.up_proj.weight", (inter, H)
            yield f"{pre}.mlp.down_proj.weight", (H, inter)


def check_config(r: Release, data: Mapping[str, Any]) -> None:
    rule = "kimi_linear.router_activation"
    act = data.get("moe_router_activation_func", "sigmoid")
    if r.has(rule) and act not in ("softmax", "sigmoid"):
        raise r.refuse(
            rule,
            "moe_router_activation_func",
            act,
            "is neither 'softmax' nor 'sigmoid', which the config class asserts",
            "AssertionError at load",
        )
    lac = data.get("linear_attn_config")
    if not isinstance(lac, Mapping):
        return  # None: not a linear-attention model; another type: the geometry reader refuses it
    r = Release(r.release, r.source, f"{r.prefix}linear_attn_config.")
    for key, rule in (
        ("kda_layers", "kimi_linear.kda_layers"),
        ("full_attn_layers", "kimi_linear.full_attn_layers"),
    ):
        if r.has(rule) and lac.get(key) is None:
            kind = "linear" if key == "kda_layers" else "full"
            raise r.refuse(
                rule,
                key,
                lac.get(key),
                f"is {'missing' if key not in lac else 'null'}, and the config class asserts it is given; "
                f"list the {kind} attention layers (1-based)",
                f"{'KeyError' if key not in lac else 'AssertionError'} at load",
            )


RULES = FamilyRules(
    check_config=check_config,
    weights=FamilyWeights(
        "Kimi-Linear", ("kimi_linear",), None, plain_layers("num_hidden_layers", 32), build, tensors
    ),
)
