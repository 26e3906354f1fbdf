"""Qwen3-Next's release rules: its config checks, the parameters its class builds per rank, its
checkpoint names. Qwen3.5 shares the layer helpers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from checker.core.errors import ConfigError, LayoutError
from checker.core.releases.config_rules import Release
from checker.core.weights.checkpoint_names import Shape
from checker.core.weights.weights import (
    Builder,
    ConfigSection,
    FamilyWeights,
    WeightsLayout,
    before,
    config_dtype,
    divide,
    dp_embed_group,
    embed_and_head,
    release_has_axis_map,
)
from checker.families.family import FamilyRules


def qwen_layer_types(t: ConfigSection) -> list[str]:
    """``layers_block_type``: layer i is full attention when ``(i + 1) % full_attention_interval == 0``
    (``configs/qwen3_next.py``); Qwen3.5 reads ``layer_types`` when given."""
    L = t.integer("num_hidden_layers", 48)
    types = t.array("layer_types")
    if types is not None and t.prefix:  # Qwen3.5: the text config's own list
        if len(types) != L or any(x not in ("linear_attention", "full_attention") for x in types):
            raise ConfigError(
                f"{t.source}: {t.prefix}layer_types must list linear_attention/full_attention for each of "
                f"the {L} layers; fix it in the model config"
            )
        return ["attention" if x == "full_attention" else "linear_attention" for x in types]
    interval = t.integer("full_attention_interval", 4)
    return ["attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(L)]


def gated_delta_net(
    b: Builder, t: ConfigSection, i: int, *, norm_dtype: str, a_log_dtype: str = "float32"
) -> None:
    H = t.integer("hidden_size")
    nk, nv = t.integer("linear_num_key_heads", 16), t.integer("linear_num_value_heads", 32)
    dk, dv = t.integer("linear_key_head_dim", 128), t.integer("linear_value_head_dim", 128)
    K = t.integer("linear_conv_kernel_dim", 4)
    key_dim, value_dim = nk * dk, nv * dv
    g = "attn_tp"
    size = b.p.size(g)
    pre = f"model.layers.{i}.linear_attn"
    b.add(f"{pre}.dt_bias", (divide(nv, size, "linear_num_value_heads"),), part="layers")
    b.add(f"{pre}.A_log", (nv // size,), part="layers", dtype=a_log_dtype)
    b.add(
        f"{pre}.conv1d.weight", (divide(2 * key_dim + value_dim, size, "conv channels"), 1, K), part="layers"
    )
    b.column(
        f"{pre}.in_proj_qkvz",
        2 * key_dim + 2 * value_dim,
        H,
        g,
        shards=[key_dim, key_dim, value_dim, value_dim],
    )
    b.column(f"{pre}.in_proj_ba", 2 * nv, H, g, shards=[nv, nv])
    b.norm(f"{pre}.norm", dv, dtype=norm_dtype)
    b.row(f"{pre}.out_proj", H, value_dim, g)


def packed_in_proj(b: Builder, i: int) -> None:
    """Qwen3-Next's class wraps the loader of ``in_proj_qkvz``/``in_proj_ba`` through their ``weight``
    (``_make_packed_weight_loader``: ``module.weight.weight_loader``, 0.5.23 models/qwen3_next.py:311); a
    compressed-tensors WNA16 linear holds ``weight_packed`` and no ``weight``: SGLang's AttributeError at
    construction; a GPTQ or AWQ linear holds ``qweight``: the same."""
    gq = b.quant.gq if b.quant is not None else None
    for proj in ("in_proj_qkvz", "in_proj_ba"):
        name = f"model.layers.{i}.linear_attn.{proj}"
        if gq is not None and gq.linear(name) is not None:
            raise ConfigError(
                f"{gq.source}: GPTQ quantizes {name} (no negative dynamic rule matches it); SGLang's "
                "Qwen3-Next class cannot build it ('MergedColumnParallelLinear' object has no attribute "
                "'weight', models/qwen3_next.py:311): keep the linear_attn projections bf16 with a '-:' "
                "dynamic rule, as the checkpoint must"
            )
    aw = b.quant.aw if b.quant is not None else None
    for proj in ("in_proj_qkvz", "in_proj_ba"):
        name = f"model.layers.{i}.linear_attn.{proj}"
        if aw is not None and not aw.skips(name):
            raise ConfigError(
                f"{aw.source}: AWQ quantizes {name} (no modules_to_not_convert entry is part of its name); "
                "SGLang's Qwen3-Next class cannot build it ('MergedColumnParallelLinear' object has no "
                "attribute 'weight', models/qwen3_next.py:311): list the linear_attn projections in "
                "modules_to_not_convert, as the checkpoint must"
            )
    ct = b.quant.ct if b.quant is not None else None
    if ct is None:
        return
    for proj in ("in_proj_qkvz", "in_proj_ba"):
        name = f"model.layers.{i}.linear_attn.{proj}"
        sch = ct.linear(name, "MergedColumnParallelLinear")
        if sch is not None and sch.kind == "wna16":
            raise ConfigError(
                f"{ct.source}: compressed-tensors quantizes {name} weight-only (INT{sch.bits} "
                "pack-quantized); SGLang's Qwen3-Next class cannot build it ('MergedColumnParallelLinear' "
                "object has no attribute 'weight', models/qwen3_next.py:311): list the linear_attn "
                "projections in the ignore list, as the checkpoint must"
            )


def gemma_norm(b: Builder, name: str, dim: int, *, part: str = "layers") -> None:
    """``GemmaRMSNorm``: its weight, and from 0.5.11 a ``gemma_weight`` buffer of the same shape (weight
    + 1, ``layers/layernorm.py``)."""
    b.norm(name, dim, part=part)
    if not before(b.release, "0.5.11"):
        b.buffer(f"{name}.gemma_weight", (dim,))


def _rope_setting(t: ConfigSection) -> tuple[int, float, Mapping[str, Any]]:
    rope = t.data.get("rope_parameters") or t.data.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        rope = {}
    factor = rope.get("partial_rotary_factor", t.data.get("partial_rotary_factor", 0.25))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        factor = 0.25
    return t.integer("max_position_embeddings", 32768), float(factor), rope


def qwen_attention(
    b: Builder, t: ConfigSection, i: int, release: str, *, kv_quant: bool = True, fp4_qkv: bool = False
) -> None:
    """``kv_quant``: the class passes its quant config to RadixAttention (its KV scales). Qwen3-Next
    builds ``qkv_proj`` without it under ModelOpt NVFP4 (0.5.23 models/qwen3_next.py:665-675);
    ``fp4_qkv``: Qwen3.5's class passes it there too (0.5.23 models/qwen3_5.py:1331-1341)."""
    H = t.integer("hidden_size")
    heads, kv = t.integer("num_attention_heads", 16), t.integer("num_key_value_heads", 2)
    hd = t.integer("head_dim", 256)
    gate = t.boolean("attn_output_gate", True)
    pre = f"model.layers.{i}"
    b.qkv(
        f"{pre}.qkv_proj",
        H,
        hd,
        heads * (2 if gate else 1),
        kv,
        "attn_tp",
        prefix=f"{pre}.self_attn.qkv_proj",
        quant=fp4_qkv or b.quant is None or b.quant.fp4 is None,
    )
    b.row(f"{pre}.o_proj", H, heads * hd, "attn_tp", prefix=f"{pre}.self_attn.o_proj")
    if kv_quant:
        b.kv_scales(f"{pre}.attn")
    gemma_norm(b, f"{pre}.q_norm", hd)
    gemma_norm(b, f"{pre}.k_norm", hd)
    max_pos, factor, rope = _rope_setting(t)
    rotary = int(hd * factor)
    b.rope(max_pos, rotary)
    if "mrope_section" in rope and release_has_axis_map(release):
        if not any(prm.name == "rope.axis_map" for prm in b.params):
            b.buffer("rope.axis_map", (rotary // 2,), "int64")  # MRotaryEmbedding's lane -> axis map


def qwen_moe(b: Builder, t: ConfigSection, i: int, layout: WeightsLayout, *, fuse_shared: bool) -> None:
    H = t.integer("hidden_size")
    E = t.integer("num_experts", 512)
    inter = t.integer("moe_intermediate_size", 512)
    shared = t.integer("shared_expert_intermediate_size", 512, minimum=0)
    if b.p.tp_size > E:
        raise LayoutError(f"the TP group ({b.p.tp_size}) is larger than num_experts={E}; SGLang refuses it")
    pre = f"model.layers.{i}.mlp"
    # Shared-expert fusion (models/qwen2_moe.py can_fuse_shared_expert): the shared expert becomes one
    # more expert slot that every EP rank holds, split by the MoE TP size instead of the TP group.
    fused = fuse_shared and not layout.disable_shared_experts_fusion and shared > 0 and shared == inter
    fused = fused and (b.quant is None or b.quant.can_fuse_shared_expert(b.release))
    b.experts(f"{pre}.experts", E, H, inter, shared_slots=1 if fused else 0)
    b.replicated(f"{pre}.gate", E, H, quant=False)  # quant_config=None (models/qwen2_moe.py:352)
    if shared > 0 and not fused:
        # MergedColumnParallelLinear([I] * 2) (qwen2_moe.py Qwen2MoeMLP): two logical shards, two
        # per-tensor FP8 scales
        b.column(f"{pre}.shared_expert.gate_up_proj", 2 * shared, H, "tp", shards=[shared, shared])
        b.row(f"{pre}.shared_expert.down_proj", H, shared, "tp")
    b.replicated(f"{pre}.shared_expert_gate", 1, H, quant=False)  # quant_config=None (qwen2_moe.py:390)


def build(b: Builder, cfg: ConfigSection, t: ConfigSection, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 151936)
    types = qwen_layer_types(t)
    # Under attention DP the embedding is replicated up to 0.5.8 (enable_tp=not is_dp_attention_enabled())
    # and split over the attention-TP group from 0.5.9 (use_attn_tp_group=is_dp_attention_enabled()).
    embed_g = dp_embed_group(layout, release, split_from="0.5.9")
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    conf_dtype = config_dtype(t)
    # 0.5.2-0.5.5.post3 cast the head to float32 (qwen3_next.py ``self.lm_head = self.lm_head.float()``)
    head_dtype = "float32" if before(release, "0.5.6") else None
    embed_and_head(b, V, H, tied=False, embed_group=embed_g, head_group=head_g, head_dtype=head_dtype)
    for i in range(b.p.start_layer, b.p.end_layer):
        if types[i] == "attention":
            qwen_attention(b, t, i, release)
        else:
            packed_in_proj(b, i)
            gated_delta_net(b, t, i, norm_dtype=conf_dtype)
        # On CUDA the shared expert is fused into the experts from 0.5.14 (qwen3_next.py passes
        # enable_cuda_shared_expert_fusion=True; qwen2_moe.py fuses when _is_cuda and it is set).
        qwen_moe(b, t, i, layout, fuse_shared=not before(release, "0.5.14"))
        gemma_norm(b, f"model.layers.{i}.input_layernorm", H)
        gemma_norm(b, f"model.layers.{i}.post_attention_layernorm", H)
    if b.p.last:
        gemma_norm(b, "model.norm", H, part="head")


def draft(b: Builder, cfg: ConfigSection, t: ConfigSection, layout: WeightsLayout, release: str) -> None:
    """``Qwen3NextForCausalLMMTP`` (0.5.23 ``models/qwen3_next_mtp.py:40-95``): ``fc`` (a plain
    ``nn.Linear(2H, H)``, replicated), two GemmaRMSNorms, and a ``Qwen3NextModel`` of the target's config
    with one layer, full attention (``num_hidden_layers = 1``, ``full_attention_interval = 1``), its own
    embedding, final norm and ``ParallelLMHead``: the target's class on one stage."""
    H = t.integer("hidden_size")
    b.replicated("fc", H, 2 * H, quant=False)
    gemma_norm(b, "pre_fc_norm_embedding", H)
    gemma_norm(b, "pre_fc_norm_hidden", H)
    mtp = ConfigSection({**t.data, "num_hidden_layers": 1, "full_attention_interval": 1}, t.source, t.prefix)
    build(b, cfg, mtp, layout, release)


def num_layers(t: ConfigSection) -> int:
    return t.integer("num_hidden_layers", 48)


def qwen_layer(
    t: ConfigSection, pre: str, attention: bool, moe: bool, qwen3_5: bool
) -> Iterator[tuple[str, Shape]]:
    H = t.integer("hidden_size")
    yield f"{pre}.input_layernorm.weight", (H,)
    yield f"{pre}.post_attention_layernorm.weight", (H,)
    if attention:
        heads, kv, hd = (
            t.integer("num_attention_heads", 16),
            t.integer("num_key_value_heads", 2),
            t.integer("head_dim", 256),
        )
        gate = 2 if t.boolean("attn_output_gate", True) else 1
        a = f"{pre}.self_attn"
        yield f"{a}.q_proj.weight", (gate * heads * hd, H)
        yield f"{a}.k_proj.weight", (kv * hd, H)
        yield f"{a}.v_proj.weight", (kv * hd, H)
        yield f"{a}.o_proj.weight", (H, heads * hd)
        yield f"{a}.q_norm.weight", (hd,)
        yield f"{a}.k_norm.weight", (hd,)
    else:
        nk, nv = t.integer("linear_num_key_heads", 16), t.integer("linear_num_value_heads", 32)
        dk, dv = t.integer("linear_key_head_dim", 128), t.integer("linear_value_head_dim", 128)
        K = t.integer("linear_conv_kernel_dim", 4)
        a = f"{pre}.linear_attn"
        if qwen3_5:
            yield f"{a}.in_proj_qkv.weight", (2 * nk * dk + nv * dv, H)
            yield f"{a}.in_proj_z.weight", (nv * dv, H)
            yield f"{a}.in_proj_b.weight", (nv, H)
            yield f"{a}.in_proj_a.weight", (nv, H)
        else:
            yield f"{a}.in_proj_qkvz.weight", (2 * nk * dk + 2 * nv * dv, H)
            yield f"{a}.in_proj_ba.weight", (2 * nv, H)
        yield f"{a}.conv1d.weight", (2 * nk * dk + nv * dv, 1, K)
        yield f"{a}.dt_bias", (nv,)
        yield f"{a}.A_log", (nv,)
        yield f"{a}.norm.weight", (dv,)
        yield f"{a}.out_proj.weight", (H, nv * dv)
    m = f"{pre}.mlp"
    if moe:
        E, inter = t.integer("num_experts", 512), t.integer("moe_intermediate_size", 512)
        shared = t.integer("shared_expert_intermediate_size", 512, minimum=0)
        yield f"{m}.gate.weight", (E, H)
        yield f"{m}.experts.E.gate_proj.weight", (inter, H)
        yield f"{m}.experts.E.up_proj.weight", (inter, H)
        yield f"{m}.experts.E.down_proj.weight", (H, inter)
        if shared:
            yield f"{m}.shared_expert.gate_proj.weight", (shared, H)
            yield f"{m}.shared_expert.up_proj.weight", (shared, H)
            yield f"{m}.shared_expert.down_proj.weight", (H, shared)
        yield f"{m}.shared_expert_gate.weight", (1, H)
    else:
        inter = t.integer("intermediate_size")
        yield f"{m}.gate_proj.weight", (inter, H)
        yield f"{m}.up_proj.weight", (inter, H)
        yield f"{m}.down_proj.weight", (H, inter)


def qwen_types(t: ConfigSection) -> list[bool]:
    return [x == "attention" for x in qwen_layer_types(t)]


def tensors(cfg: ConfigSection, t: ConfigSection) -> Iterator[tuple[str, Shape]]:
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 151936)
    yield "model.embed_tokens.weight", (V, H)
    yield "model.norm.weight", (H,)
    yield "lm_head.weight", (V, H)
    for i, attention in enumerate(qwen_types(t)):
        yield from qwen_layer(t, f"model.layers.{i}", attention, True, False)


def mtp_tensors(cfg: ConfigSection, t: ConfigSection) -> Iterator[tuple[str, Shape]]:
    """The checkpoint tensors ``Qwen3NextForCausalLMMTP`` loads: only names holding ``mtp`` (0.5.23
    ``models/qwen3_next.py:1173-1184``; the same filter 0.5.10-0.5.22), ``mtp.fc`` and the two pre-fc norms
    as its own, the rest ``mtp.`` -> ``model.``: one full-attention MoE layer and the final norm. Its
    embedding and head are not read from ``mtp.*`` (the EAGLE worker shares the target's,
    ``speculative/eagle_worker_v2.py:371-378``)."""
    H = t.integer("hidden_size")
    yield "mtp.fc.weight", (H, 2 * H)
    yield "mtp.pre_fc_norm_embedding.weight", (H,)
    yield "mtp.pre_fc_norm_hidden.weight", (H,)
    yield "mtp.norm.weight", (H,)
    yield from qwen_layer(t, "mtp.layers.0", True, True, False)


def check_config(r: Release, data: Mapping[str, Any]) -> None:
    model_type = data.get("model_type")
    keys: Mapping[str, Any] = data
    if isinstance(model_type, str) and model_type.startswith("qwen3_5"):
        text = data.get("text_config")
        if text is None:
            if r.has("qwen3_5.text_config"):
                raise r.refuse(
                    "qwen3_5.text_config",
                    "text_config",
                    text,
                    "is missing: Qwen3_5Config then builds its default text config, which has no "
                    "full_attention_interval, and reads none of the top-level keys; nest the language "
                    "model's keys in text_config",
                    "AttributeError building the model",
                    raised="qwen3_next.full_attention_interval",
                )
            return
        if not isinstance(text, Mapping):
            return  # the geometry reader refuses a text_config that is no object
        keys, r = text, Release(r.release, r.source, "text_config.")
    rule = "qwen3_next.full_attention_interval"
    if not r.has(rule):
        return
    interval = keys.get("full_attention_interval")
    if interval is None:
        raise r.refuse(
            rule,
            "full_attention_interval",
            interval,
            "is missing, and the config class reads it for every layer's type: it has no default",
            "AttributeError building the model",
        )
    if isinstance(interval, (int, float)) and not isinstance(interval, bool) and interval == 0:
        raise r.refuse(
            rule,
            "full_attention_interval",
            interval,
            "divides the layer index",
            "ZeroDivisionError building the model",
        )
    if not isinstance(interval, (int, float)):
        raise r.refuse(
            rule,
            "full_attention_interval",
            interval,
            "divides the layer index",
            "TypeError building the model",
        )


RULES = FamilyRules(
    check_config=check_config,
    weights=FamilyWeights(
        "Qwen3-Next",
        ("qwen3_next",),
        None,
        num_layers,
        build,
        tensors,
        quant_methods=("fp8", "compressed-tensors", "modelopt_fp4", "gptq_marlin", "awq_marlin"),
        draft=draft,
    ),
    draft_tensors=mtp_tensors,
)
