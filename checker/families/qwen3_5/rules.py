"""Qwen3.5's release rules: Qwen3-Next's config checks; its own weights (a vision tower, the language
model under ``model.language_model.``) and checkpoint names."""

from __future__ import annotations

from collections.abc import Iterator

from checker.core.errors import FlagError
from checker.core.weights.checkpoint_names import Shape
from checker.core.weights.weights import (
    Builder,
    ConfigSection,
    FamilyWeights,
    WeightsLayout,
    before,
    embed_and_head,
)
from checker.families.family import FamilyRules
from checker.families.qwen3_next.rules import (
    check_config,
    gated_delta_net,
    gemma_norm,
    num_layers,
    qwen_attention,
    qwen_layer,
    qwen_layer_types,
    qwen_moe,
    qwen_types,
)


def _qwen3_5_vision(b: Builder, cfg: ConfigSection, layout: WeightsLayout) -> None:
    """``Qwen3VLMoeVisionModel`` (``models/qwen3_vl.py``), built on every stage; only ``pos_embed`` is
    first-stage-only (``qwen3_vl.py:399-409``). Defaults are those of SGLang's ``Qwen3VLVisionConfig``.
    Built with ``quant_config=None`` in every release (0.5.23 ``qwen3_vl.py:1332-1336``): unquantized
    under a quantized checkpoint."""
    v = cfg.section("vision_config")
    hid = v.integer("hidden_size", 1152)
    depth = v.integer("depth", 27)
    inter = v.integer("intermediate_size", 4304)
    out = v.integer("out_hidden_size", 3584)
    patch, tpatch = v.integer("patch_size", 16), v.integer("temporal_patch_size", 2)
    cin = v.integer("in_channels", 3)
    merge = v.integer("spatial_merge_size", 2)
    npos = v.integer("num_position_embeddings", 2304)
    deepstack = v.array("deepstack_visual_indexes")
    if deepstack is None:
        deepstack = [8, 16, 24]
    g = "attn_tp" if layout.dp_size > 1 else "tp"
    pre = "visual"
    heads = v.integer("num_heads", 16)
    b.buffer(f"{pre}.rotary_pos_emb.cos_sin_cache", (8192, hid // heads // 2), "float32")
    b.add(f"{pre}.patch_embed.proj.weight", (hid, cin, tpatch, patch, patch), part="vision")
    b.add(f"{pre}.patch_embed.proj.bias", (hid,), part="vision")
    if b.p.first:
        b.vocab(f"{pre}.pos_embed", npos, hid, g, part="vision")
    for k in range(depth):
        bp = f"{pre}.blocks.{k}"
        b.norm(f"{bp}.norm1", hid, part="vision", bias=True)
        b.norm(f"{bp}.norm2", hid, part="vision", bias=True)
        b.column(f"{bp}.attn.qkv_proj", 3 * hid, hid, g, part="vision", bias=True, quant=False)
        b.row(f"{bp}.attn.proj", hid, hid, g, part="vision", bias=True, quant=False)
        b.column(f"{bp}.mlp.linear_fc1", inter, hid, g, part="vision", bias=True, quant=False)
        b.row(f"{bp}.mlp.linear_fc2", hid, inter, g, part="vision", bias=True, quant=False)
    ctx = hid * merge * merge
    for name, norm_dim in [("merger", hid)] + [
        (f"deepstack_merger_list.{k}", ctx) for k in range(len(deepstack))
    ]:
        b.norm(f"{pre}.{name}.norm", norm_dim, part="vision", bias=True)
        b.column(f"{pre}.{name}.linear_fc1", ctx, ctx, g, part="vision", bias=True, quant=False)
        b.row(f"{pre}.{name}.linear_fc2", out, ctx, g, part="vision", bias=True, quant=False)


# Qwen3.5's quantized classes as held to the checker's rules (tests/fixtures/weights/expected.json): the
# releases before these build them otherwise (0.5.10's compressed-tensors figures are 1.5-3 MB a rank
# apart; up to 0.5.16 the class builds linear_attn and qkv_proj without an NVFP4 config, 0.5.16
# models/qwen3_5.py:613-617, :790-794, and more differs), so there they are refused, not sized.
_QUANT_FROM = {"compressed-tensors": "0.5.13", "modelopt_fp4": "0.5.17"}


def build(b: Builder, cfg: ConfigSection, t: ConfigSection, layout: WeightsLayout, release: str) -> None:
    method = b.quant.method if b.quant is not None else None
    if method in _QUANT_FROM and before(release, _QUANT_FROM[method]):
        raise FlagError(
            f"{cfg.source}: Qwen3.5 under {method} is modelled from SGLang {_QUANT_FROM[method]}, not "
            f"{release}'s class (it builds the layers' quantized modules otherwise): give the weights per "
            "GPU with --weights-gib"
        )
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 248320)
    types = qwen_layer_types(t)
    moe = (t.string("model_type") or cfg.string("model_type") or "").startswith("qwen3_5_moe")
    # replicated under attention DP in every release (qwen3_5.py: enable_tp=not is_dp_attention_enabled())
    embed_g = "none" if layout.dp_size > 1 else "tp"
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    # 0.5.9-0.5.10 read tie_word_embeddings from the text config (qwen3_vl.py ``self.config =
    # config.text_config``); 0.5.11+ copy the top-level config's onto it.
    tied = (t if before(release, "0.5.11") else cfg).boolean("tie_word_embeddings", False)
    if not _language_model_only(cfg, layout, release):
        _qwen3_5_vision(b, cfg, layout)
    embed_and_head(b, V, H, tied=tied, embed_group=embed_g, head_group=head_g)
    for i in range(b.p.start_layer, b.p.end_layer):
        if types[i] == "attention":
            # RadixAttention takes the quant config (its FP8 k_scale/v_scale) from 0.5.17 (qwen3_5.py:915)
            qwen_attention(b, t, i, release, kv_quant=not before(release, "0.5.17"), fp4_qkv=True)
        else:
            # A_log in float32 from 0.5.10; 0.5.9's qwen3_5.py builds it in the model dtype
            a_log = b.dtype if before(release, "0.5.10") else "float32"
            gated_delta_net(b, t, i, norm_dtype=b.dtype, a_log_dtype=a_log)
        if moe:
            qwen_moe(b, t, i, layout, fuse_shared=False)
        else:
            inter = t.integer("intermediate_size")
            # Qwen2MoeMLP's MergedColumnParallelLinear([I] * 2): two logical shards (a per-tensor scale each)
            b.column(f"model.layers.{i}.mlp.gate_up_proj", 2 * inter, H, "tp", shards=[inter, inter])
            b.row(f"model.layers.{i}.mlp.down_proj", H, inter, "tp")
        gemma_norm(b, f"model.layers.{i}.input_layernorm", H)
        gemma_norm(b, f"model.layers.{i}.post_attention_layernorm", H)
    if b.p.last:
        gemma_norm(b, "model.norm", H, part="head")


def draft(b: Builder, cfg: ConfigSection, t: ConfigSection, layout: WeightsLayout, release: str) -> None:
    """``Qwen3_5ForCausalLMMTP`` (0.5.23 ``models/qwen3_5_mtp.py:104-151``; the same modules 0.5.9-0.5.23):
    the text config only (no vision tower), ``fc`` (a plain ``nn.Linear(2H, H)``, replicated), two
    GemmaRMSNorms, and a ``Qwen3_5ForCausalLM`` of one full-attention layer (``num_hidden_layers = 1``,
    ``full_attention_interval = 1``: ``layers_block_type`` is computed from the interval,
    ``configs/qwen3_next.py:260-269``, whatever ``layer_types`` lists) with its own embedding and final norm,
    and a ``ParallelLMHead`` unless the *text* config ties it (``config.tie_word_embeddings`` on the text
    config, :139-141: the top level's flag, which the target copies onto it in ``qwen3_vl.py:1353-1354``, is
    not copied here). The config's ``mtp_num_hidden_layers`` is not read by any release: always one layer."""
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 248320)
    b.replicated("fc", H, 2 * H, quant=False)
    gemma_norm(b, "pre_fc_norm_embedding", H)
    gemma_norm(b, "pre_fc_norm_hidden", H)
    data = {k: v for k, v in t.data.items() if k != "layer_types"}
    mtp = ConfigSection({**data, "num_hidden_layers": 1, "full_attention_interval": 1}, t.source, t.prefix)
    moe = (t.string("model_type") or cfg.string("model_type") or "").startswith("qwen3_5_moe")
    embed_g = "none" if layout.dp_size > 1 else "tp"
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    embed_and_head(
        b, V, H, tied=t.boolean("tie_word_embeddings", False), embed_group=embed_g, head_group=head_g
    )
    qwen_attention(b, mtp, 0, release, kv_quant=not before(release, "0.5.17"))
    if moe:
        qwen_moe(b, mtp, 0, layout, fuse_shared=False)
    else:
        inter = t.integer("intermediate_size")
        b.column("model.layers.0.mlp.gate_up_proj", 2 * inter, H, "tp", shards=[inter, inter])
        b.row("model.layers.0.mlp.down_proj", H, inter, "tp")
    gemma_norm(b, "model.layers.0.input_layernorm", H)
    gemma_norm(b, "model.layers.0.post_attention_layernorm", H)
    gemma_norm(b, "model.norm", H, part="head")


def _language_model_only(cfg: ConfigSection, layout: WeightsLayout, release: str) -> bool:
    """Whether the class leaves its vision tower out: 0.5.18+ read ``language_model_only`` from the
    model config (``configs/model_config.py`` ``is_lm_only``: the flag or the config.json key); the flag
    itself is refused for Qwen3.5 (its architectures are not in ``LANGUAGE_MODEL_ONLY_ARCHITECTURES``,
    0.5.23 ``arg_groups/model_hook.py:1103-1109``). Before 0.5.18 the tower is always built."""
    if layout.language_model_only:
        if before(release, "0.5.18"):
            raise FlagError(
                f"--language-model-only does not exist in SGLang {release} (it arrived in 0.5.18); drop it"
            )
        raise FlagError(
            f"SGLang {release} refuses --language-model-only for Qwen3.5 (its architecture is not in "
            'LANGUAGE_MODEL_ONLY_ARCHITECTURES); drop it, or set "language_model_only": true in config.json, '
            "which the class reads"
        )
    return not before(release, "0.5.18") and cfg.boolean("language_model_only", False)


def mtp_tensors(cfg: ConfigSection, t: ConfigSection) -> Iterator[tuple[str, Shape]]:
    """The checkpoint tensors ``Qwen3_5ForCausalLMMTP`` loads: only names holding ``mtp`` (0.5.23
    ``models/qwen3_5_mtp.py:361-366``, ``mtp.`` -> ``model.``): ``fc``, the two pre-fc norms, one
    full-attention layer of the text config (MoE or dense as the target) and the final norm; the embedding
    and head are the target's, shared by the EAGLE worker."""
    H = t.integer("hidden_size")
    moe = (t.string("model_type") or cfg.string("model_type") or "").startswith("qwen3_5_moe")
    yield "mtp.fc.weight", (H, 2 * H)
    yield "mtp.pre_fc_norm_embedding.weight", (H,)
    yield "mtp.pre_fc_norm_hidden.weight", (H,)
    yield "mtp.norm.weight", (H,)
    yield from qwen_layer(t, "mtp.layers.0", True, moe, True)


def tensors(cfg: ConfigSection, t: ConfigSection) -> Iterator[tuple[str, Shape]]:
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 248320)
    moe = (t.string("model_type") or cfg.string("model_type") or "").startswith("qwen3_5_moe")
    lm = "model.language_model"
    yield f"{lm}.embed_tokens.weight", (V, H)
    yield f"{lm}.norm.weight", (H,)
    if not cfg.boolean("tie_word_embeddings", False):
        yield "lm_head.weight", (V, H)
    for i, attention in enumerate(qwen_types(t)):
        yield from qwen_layer(t, f"{lm}.layers.{i}", attention, moe, True)
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


RULES = FamilyRules(
    check_config=check_config,
    weights=FamilyWeights(
        "Qwen3.5",
        ("qwen3_5", "qwen3_5_moe"),
        "text_config",
        num_layers,
        build,
        tensors,
        quant_methods=(
            "fp8",
            "compressed-tensors",
            "gptq_marlin",
            "modelopt_fp4",
            "modelopt_fp8",
            "awq_marlin",
        ),
        # the class's modules sit under model.language_model. (the checker's model.)
        hf_prefixes=(("model.language_model.", "model."),),
        # models/qwen3_5.py:1710-1715
        packed_modules=(
            ("in_proj_qkvz", ("in_proj_qkv", "in_proj_z")),
            ("in_proj_ba", ("in_proj_b", "in_proj_a")),
        ),
        draft=draft,
        # Qwen3VLMoeVisionModel(quant_config=None), 0.5.23 models/qwen3_vl.py:1332-1339, every release
        unquantized=(("model.visual.", "Qwen3.5's vision tower"),),
    ),
    draft_tensors=mtp_tensors,
)
