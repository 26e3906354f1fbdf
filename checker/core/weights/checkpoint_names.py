"""What a supported family's Hugging Face checkpoint holds, by name and shape, from its config.json
(torch-free).

Two uses: a checkpoint whose tensor contradicts the config (a shard of another model, a config edited
by hand) is refused before any figure is derived from the config (:func:`check_shapes`); and the tests
and the bench build sparse checkpoints of the real shapes from it (:func:`expected_tensors`). The names
are the ones each family's SGLang ``load_weights`` maps (``stacked_params_mapping``,
``make_expert_params_mapping``): per-expert tensors for Qwen and Kimi, fused 3-D expert tensors for
Granite-4.0-H, Nemotron-H's ``backbone.`` prefix, Qwen3.5's ``model.language_model.`` and
``model.visual.``. A tensor the table does not name is not checked (quantization scales, ``mtp.*``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from checker.core.errors import ConfigError, shorten
from checker.core.sizing.models import FALCON_H1_D_SSM, GRANITE_LAYER_NAMES
from checker.core.weights.checkpoint import Checkpoint
from checker.core.weights.weights import _Config, _nemotron_pattern, _qwen_layer_types, family_of

Shape = tuple[int, ...]
_EXPERT = re.compile(r"\.experts\.\d+\.")


def _qwen_layer(
    t: _Config, pre: str, attention: bool, moe: bool, qwen3_5: bool
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


def _qwen_types(t: _Config) -> list[bool]:
    return [x == "attention" for x in _qwen_layer_types(t)]


def _qwen3_next(cfg: _Config, t: _Config) -> Iterator[tuple[str, Shape]]:
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 151936)
    yield "model.embed_tokens.weight", (V, H)
    yield "model.norm.weight", (H,)
    yield "lm_head.weight", (V, H)
    for i, attention in enumerate(_qwen_types(t)):
        yield from _qwen_layer(t, f"model.layers.{i}", attention, True, False)


def _qwen3_5(cfg: _Config, t: _Config) -> Iterator[tuple[str, Shape]]:
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 248320)
    moe = (t.string("model_type") or cfg.string("model_type") or "").startswith("qwen3_5_moe")
    lm = "model.language_model"
    yield f"{lm}.embed_tokens.weight", (V, H)
    yield f"{lm}.norm.weight", (H,)
    if not cfg.boolean("tie_word_embeddings", False):
        yield "lm_head.weight", (V, H)
    for i, attention in enumerate(_qwen_types(t)):
        yield from _qwen_layer(t, f"{lm}.layers.{i}", attention, moe, True)
    v = cfg.section("vision_config")
    hid, depth = v.integer("hidden_size", 1152), v.integer("depth", 27)
    inter = v.integer("intermediate_size", 4304)
    out, merge = v.integer("out_hidden_size", 3584), v.integer("spatial_merge_size", 2)
    patch, tpatch = v.integer("patch_size", 16), v.integer("temporal_patch_size", 2)
    cin = v.integer("in_channels", 3)
    vis = "model.visual"
    yield f"{vis}.patch_embed.proj.weight", (hid, cin, tpatch, patch, patch)
    yield f"{vis}.patch_embed.proj.bias", (hid,)
    yield f"{vis}.pos_embed.weight", (v.integer("num_position_embeddings", 2304), hid)
    for k in range(depth):
        bp = f"{vis}.blocks.{k}"
        for n in ("norm1", "norm2"):
            yield f"{bp}.{n}.weight", (hid,)
            yield f"{bp}.{n}.bias", (hid,)
        yield f"{bp}.attn.qkv.weight", (3 * hid, hid)
        yield f"{bp}.attn.qkv.bias", (3 * hid,)
        yield f"{bp}.attn.proj.weight", (hid, hid)
        yield f"{bp}.attn.proj.bias", (hid,)
        yield f"{bp}.mlp.linear_fc1.weight", (inter, hid)
        yield f"{bp}.mlp.linear_fc1.bias", (inter,)
        yield f"{bp}.mlp.linear_fc2.weight", (hid, inter)
        yield f"{bp}.mlp.linear_fc2.bias", (hid,)
    ctx = hid * merge * merge
    deepstack = v.array("deepstack_visual_indexes") or []
    for name, norm_dim in [("merger", hid)] + [
        (f"deepstack_merger_list.{k}", ctx) for k in range(len(deepstack))
    ]:
        yield f"{vis}.{name}.norm.weight", (norm_dim,)
        yield f"{vis}.{name}.norm.bias", (norm_dim,)
        yield f"{vis}.{name}.linear_fc1.weight", (ctx, ctx)
        yield f"{vis}.{name}.linear_fc1.bias", (ctx,)
        yield f"{vis}.{name}.linear_fc2.weight", (out, ctx)
        yield f"{vis}.{name}.linear_fc2.bias", (out,)


def _kimi_linear(cfg: _Config, t: _Config) -> Iterator[tuple[str, Shape]]:
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


def _mamba(
    pre: str,
    *,
    hidden: int,
    intermediate: int,
    heads: int,
    groups: int,
    state: int,
    conv: int,
    conv_bias: bool,
    proj_bias: bool,
    rms_norm: bool,
) -> Iterator[tuple[str, Shape]]:
    conv_dim = intermediate + 2 * groups * state
    yield f"{pre}.A_log", (heads,)
    yield f"{pre}.D", (heads,)
    yield f"{pre}.dt_bias", (heads,)
    yield f"{pre}.conv1d.weight", (conv_dim, 1, conv)
    if conv_bias:
        yield f"{pre}.conv1d.bias", (conv_dim,)
    yield f"{pre}.in_proj.weight", (intermediate + conv_dim + heads, hidden)
    if proj_bias:
        yield f"{pre}.in_proj.bias", (intermediate + conv_dim + heads,)
    yield f"{pre}.out_proj.weight", (hidden, intermediate)
    if rms_norm:
        yield f"{pre}.norm.weight", (intermediate,)


def _nemotron_h(cfg: _Config, t: _Config) -> Iterator[tuple[str, Shape]]:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 131072)
    heads, kv = t.integer("num_attention_heads", 32), t.integer("num_key_value_heads", 8)
    hd = t.opt_int("head_dim") or H // heads
    yield "backbone.embeddings.weight", (V, H)
    yield "backbone.norm_f.weight", (H,)
    if not t.boolean("tie_word_embeddings", False):
        yield "lm_head.weight", (V, H)
    groups = t.integer("mamba_n_groups", 8) if "mamba_n_groups" in t.data else t.integer("n_groups", 8)
    for i, c in enumerate(_nemotron_pattern(t)):
        pre = f"backbone.layers.{i}"
        yield f"{pre}.norm.weight", (H,)
        m = f"{pre}.mixer"
        if c == "M":
            mh, mhd = t.integer("mamba_num_heads", 128), t.integer("mamba_head_dim", 64)
            yield from _mamba(
                m,
                hidden=H,
                intermediate=mh * mhd,
                heads=mh,
                groups=groups,
                state=t.integer("ssm_state_size", 128),
                conv=t.integer("mamba_d_conv" if "mamba_d_conv" in t.data else "conv_kernel", 4),
                conv_bias=t.boolean("use_conv_bias", True),
                proj_bias=t.boolean("use_bias", False),
                rms_norm=True,
            )
        elif c == "*":
            yield f"{m}.q_proj.weight", (heads * hd, H)
            yield f"{m}.k_proj.weight", (kv * hd, H)
            yield f"{m}.v_proj.weight", (kv * hd, H)
            yield f"{m}.o_proj.weight", (H, heads * hd)
        elif c == "-":
            inter = t.data.get("intermediate_size", 21504)
            if isinstance(inter, int) and not isinstance(inter, bool):
                yield f"{m}.up_proj.weight", (inter, H)
                yield f"{m}.down_proj.weight", (H, inter)


def _falcon_h1(cfg: _Config, t: _Config) -> Iterator[tuple[str, Shape]]:
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
        yield from _mamba(
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


def _granite_h(cfg: _Config, t: _Config) -> Iterator[tuple[str, Shape]]:
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
            yield from _mamba(
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


_SCHEMAS = {
    "Qwen3-Next": _qwen3_next,
    "Qwen3.5": _qwen3_5,
    "Kimi-Linear": _kimi_linear,
    "Nemotron-H": _nemotron_h,
    "Falcon-H1": _falcon_h1,
    "Granite-4.0-H": _granite_h,
}


def expected_shapes(config: Mapping[str, Any], source: str = "config.json") -> dict[str, Shape]:
    """Tensor name -> shape of the family's checkpoint; a per-expert name has ``experts.E.`` in place
    of the expert index (every expert has the same shape)."""
    fam, cfg, text = family_of(config, source)
    return dict(_SCHEMAS[fam.name](cfg, text))


def expected_tensors(config: Mapping[str, Any], source: str = "config.json") -> Iterator[tuple[str, Shape]]:
    """Every tensor of the family's checkpoint (per-expert names expanded), for building test shards."""
    fam, cfg, text = family_of(config, source)
    for name, shape in _SCHEMAS[fam.name](cfg, text):
        if ".experts.E." in name:
            layer_cfg = text
            count = layer_cfg.integer("num_experts", 0, minimum=0) or layer_cfg.integer(
                "n_routed_experts", 0, minimum=0
            )
            for e in range(count):
                yield name.replace(".experts.E.", f".experts.{e}."), shape
        else:
            yield name, shape


def check_shapes(ckpt: Checkpoint, config: Mapping[str, Any], source: str = "config.json") -> int:
    """Refuse a checkpoint whose tensor contradicts config.json (one ConfigError line naming the tensor,
    both shapes and the shard); returns how many tensors were checked."""
    expected = expected_shapes(config, source)
    checked = 0
    for name, tensor in ckpt.tensors.items():
        key = _EXPERT.sub(".experts.E.", name) if ".experts." in name else name
        want = expected.get(key)
        if want is None:
            continue
        checked += 1
        if tensor.shape != want:
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} has shape {list(tensor.shape)} but "
                f"{source} gives {list(want)}; the checkpoint and config.json are of different models (point "
                "--model-path at the directory that holds both)"
            )
    return checked


# Falcon-H1's load_weights (models/falcon_h1.py, the same in every release) leaves two kinds of name to
# no parameter: the rotary cache, and a bias the class has none of. Every other name, a stacked
# projection's too (its name rewritten onto qkv_proj / gate_up_proj, then looked up), indexes
# params_dict: a tensor the class has no parameter for is a KeyError (found so by the release's own
# class, built on the meta device: tests/test_checkpoint_declarations.py, group sglang).


def check_loadable(ckpt: Checkpoint, config: Mapping[str, Any], *, release: str, source: str) -> None:
    """Refuse (one ConfigError line naming the tensor and its shard) a checkpoint tensor the release's
    class has no parameter for, where its ``load_weights`` raises on one: Falcon-H1's. The other families'
    classes skip a name they have no parameter for (``if name not in params_dict: continue``) on the
    paths a checkpoint of theirs takes, or refuse it by stage (:mod:`checker.core.releases.pp_support`)."""
    # start-up: the config rules' table loads only when a checkpoint is read
    from checker.core.releases.config_rules import where

    fam, _, _ = family_of(config, source)
    at = where("falcon_h1.load_unknown", release)
    if fam.name != "Falcon-H1" or at is None:
        return
    expected = expected_shapes(config, source)
    for name, tensor in ckpt.tensors.items():
        if name in expected or "rotary_emb.inv_freq" in name or name.endswith(".bias"):
            continue
        raise ConfigError(
            f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is no parameter of SGLang {release}'s "
            f"Falcon-H1 class under {source}, and its load_weights indexes every such name (KeyError, "
            f"sglang/srt/{at}): the checkpoint holds more than config.json describes (another model's "
            "layers, or quantization scales without a quantization config); point --model-path at the "
            "directory whose config.json matches its shards"
        )


_FLOAT8 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2")
"""Safetensors dtypes that only a quantized checkpoint stores its weights or scales in."""


def check_declared_dtypes(ckpt: Checkpoint, source: str) -> None:
    """Refuse a checkpoint holding float8 (or narrower float) tensors under a config.json that declares no
    quantization: read as bf16 its figure would be wrong, and SGLang would cast the values without their
    scales."""
    for name, tensor in ckpt.tensors.items():
        if tensor.dtype in _FLOAT8:
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is {tensor.dtype}, but {source} "
                "declares no quantization: the checkpoint is quantized and the checker derives the weights "
                "of unquantized (bf16/fp16/fp32) checkpoints only: give the weights per GPU with "
                "--weights-gib (the largest 'mem usage' of an earlier server start's 'Load weight end' lines)"
            )
