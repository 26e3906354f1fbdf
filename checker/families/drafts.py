"""A separate speculative draft (``--speculative-draft-model-path``, issue 39 item 3): the draft model's
own config.json decides its class (``architectures``, as the draft's ``ModelConfig`` rewrites it), and its
weights sit on the ranks that load the draft, beside the target's.

Where SGLang loads it (0.5.23): the scheduler of every rank, except under PP (0.5.21+ with
``SGLANG_ENABLE_PP_SPEC``) where only the last stage does (``managers/scheduler.py:1035-1051``
``maybe_init_draft_worker``); always built as one stage (``speculative/spec_utils.py:822-827``
``draft_pp_context``). Its TP layout is the class's ``draft_parallel_spec``
(``speculative/draft_parallel.py:35-71``): ``TARGET_LAYOUT`` for the NEXTN/MTP classes, ``SINGLE_GROUP``
for ``LlamaForCausalLMEagle3`` (``models/llama_eagle3.py:271``), which is the target's attention TP group
unless attention DP is on (then a group of its own: refused here).

The draft's shards, where its directory holds any, are held to its class as the target's are
(:func:`check_draft_checkpoint`); the target's own ``mtp.*`` tensors under EAGLE/NEXTN likewise
(:func:`check_mtp_shards`). Without shards the figure is config.json's (the class decides the bytes).

Modelled: ``LlamaForCausalLMEagle3`` (EAGLE3 drafts as SpecForge writes them) and a directory holding a
family's own config whose draft class the checker models (Qwen3-Next, Qwen3.5: their MTP layer). Anything
else is refused in one line naming the architecture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from checker.core.errors import ConfigError, FlagError, LayoutError, shorten
from checker.core.sizing.models import read_json, shown_path
from checker.core.weights.checkpoint import Checkpoint, has_safetensors, read_checkpoint
from checker.core.weights.checkpoint_names import Shape, check_unquantized
from checker.core.weights.quant import read_scheme
from checker.core.weights.weights import (
    FIRST_DRAFT_IN_BUDGET,
    Builder,
    ConfigSection,
    ModelWeights,
    Param,
    Place,
    WeightsLayout,
    allocator_bytes,
    before,
    draft_params,
    model_dtype,
    places,
    text_section,
)
from checker.families import family_for

EAGLE3 = "LlamaForCausalLMEagle3"
EAGLE2 = {
    "LlamaForCausalLMEagle": ("models/llama_eagle.py", "models/llama.py", 8192),
    "Qwen2ForCausalLMEagle": ("models/qwen2_eagle.py", "models/qwen2.py", 32768),
}
"""The EAGLE-2 draft classes (``--speculative-algorithm EAGLE`` with a separate draft whose config.json
names one), every modelled release (0.5.2-0.5.23): architecture -> (its module, the target class's module
whose decoder layer and ``set_embed_and_head`` it inherits, its ``max_position_embeddings`` default)."""

# The target architectures whose draft ModelConfig becomes the family's MTP class
# (0.5.23 configs/model_config.py:1134-1135 Qwen3-Next, :1159-1181 Qwen3.5), and those classes' own names.
MTP_REWRITES = {
    "qwen3_next": ("Qwen3NextForCausalLM", "Qwen3NextForCausalLMMTP"),
    "qwen3_5": (
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForCausalLMMTP",
    ),
    "qwen3_5_moe": (
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForCausalLMMTP",
    ),
}
"""model_type -> the architectures of its config that the draft's ModelConfig makes the family's MTP class."""


def read_draft_config(path: str) -> dict[str, Any]:
    """The separate draft's config.json; one line where the directory is no model directory."""
    config = Path(path) / "config.json"
    if not config.is_file():
        raise FlagError(
            f"--speculative-draft-model-path {shown_path(Path(path))}: not a model directory with a "
            "config.json (SGLang builds the draft from it); give the draft's local directory"
        )
    return dict(read_json(config))


def _refuse(path: str, arch: str, why: str) -> FlagError:
    return FlagError(
        f"--speculative-draft-model-path {shown_path(Path(path))}: {why} ({arch}); the checker models "
        f"{EAGLE3}, {' and '.join(EAGLE2)} (EAGLE-2) and the Qwen3-Next/Qwen3.5 MTP drafts: give the "
        "weights per GPU (target and draft) "
        "with --weights-gib"
    )


def separate_draft_params(
    config: Mapping[str, Any], layout: WeightsLayout, place: Place, *, release: str, source: str
) -> list[Param] | None:
    """The separate draft's parameters and buffers on ``place`` (None: this rank loads no draft)."""
    if not place.last:
        return None
    path = layout.draft_path or source
    archs = config.get("architectures")
    arch = str(archs[0]) if isinstance(archs, list) and archs else "no architectures"
    if read_scheme(config, source=source) is not None:
        raise _refuse(path, arch, "the draft checkpoint is quantized, which is not modelled")
    one = dataclasses.replace(place, pp_rank=0, pp_size=1, start_layer=0, end_layer=1)
    if arch == EAGLE3:
        if layout.dp_size > 1:
            raise _refuse(path, arch, "under attention DP an EAGLE3 draft runs on a TP group of its own")
        cfg = ConfigSection(config, source)
        b = Builder(one, model_dtype(cfg, layout.dtype), release, None)
        eagle3(b, cfg, release)
        return b.params
    if arch in EAGLE2:
        check_draft_release(config, release=release, source=source)
        if (layout.draft_algorithm or "EAGLE") == "EAGLE3":
            raise _refuse(path, arch, "an EAGLE-2 draft under --speculative-algorithm EAGLE3 is not modelled")
        if layout.dp_size > 1:
            raise _refuse(path, arch, "an EAGLE-2 draft under attention DP is not modelled")
        cfg = ConfigSection(config, source)
        b = Builder(one, model_dtype(cfg, layout.dtype), release, None)
        eagle2(b, cfg, release, arch)
        return shared_with_target(b.params, place, release)
    model_type = config.get("model_type")
    model_type = model_type if isinstance(model_type, str) else ""
    family = family_for(model_type)
    fam = family.rules().weights if family is not None else None
    if arch not in MTP_REWRITES.get(model_type, ()) or fam is None:
        raise _refuse(path, arch, "a draft architecture the checker does not model")
    cfg = ConfigSection(config, source)
    text = text_section(fam, cfg)
    return draft_params(fam, cfg, text, dataclasses.replace(layout, draft="nextn"), place, release)


def eagle3(b: Builder, cfg: ConfigSection, release: str) -> None:
    """``LlamaForCausalLMEagle3`` (0.5.23 ``models/llama_eagle3.py:271-322``, ``LlamaModel`` :125-206,
    its decoder layer :46-84): the embedding (vocab-parallel), ``fc`` (a plain ``nn.Linear`` from
    ``num_aux`` target hidden states, replicated; ``num_aux``: ``num_aux_hidden_states``, else the
    ``eagle_config``'s layer ids, else 3, from 0.5.13; 3 before), optional norms before it, the layers
    (layer 0's ``qkv_proj`` takes 2H: embedding and hidden state; every layer a ``hidden_norm``), the final
    norm, and a ``ParallelLMHead`` of ``draft_vocab_size`` (the target's vocabulary where it is null)
    unless tied. Each layer's RoPE cache (``cos_sin_cache``, float32)."""
    H = cfg.integer("hidden_size")
    V = cfg.integer("vocab_size")
    layers = cfg.integer("num_hidden_layers", 1)
    if layers != 1 and before(release, "0.5.13"):
        # 0.5.10 models/llama_eagle3.py:212-213
        raise ConfigError(
            f"{cfg.source}: SGLang {release} refuses it: EAGLE3 currently only supports 1 layer"
        )
    heads, kv = cfg.integer("num_attention_heads"), cfg.integer("num_key_value_heads", 0, minimum=0)
    kv = kv or heads
    hd = cfg.opt_int("head_dim") or H // heads
    inter = cfg.integer("intermediate_size")
    hidden_in = cfg.opt_int("target_hidden_size") or H
    eagle_cfg = cfg.data.get("eagle_config") or {}
    eagle_cfg = eagle_cfg if isinstance(eagle_cfg, Mapping) else {}
    aux = 3
    if not before(release, "0.5.13"):
        ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
        aux = cfg.opt_int("num_aux_hidden_states") or (len(ids) if isinstance(ids, list) and ids else 3)
    rope = cfg.data.get("rope_parameters") or cfg.data.get("rope_scaling")
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, Mapping) else "default"
    if kind not in ("default", "llama3"):
        raise ConfigError(
            f"{cfg.source}: the EAGLE3 draft's rope_scaling type {shorten(kind)} is not modelled (its RoPE "
            "cache size differs); give the weights per GPU (target and draft) with --weights-gib"
        )
    rotary = int(cfg.number("partial_rotary_factor", 1.0) * hd)
    tied = cfg.boolean("tie_word_embeddings", False)
    draft_vocab = cfg.opt_int("draft_vocab_size") or V
    b.vocab("model.embed_tokens", V, H, "tp", part="embed")
    b.replicated("model.fc", H, hidden_in * aux, bias=cfg.boolean("bias", False), quant=False)
    norm_before_fc = eagle_cfg.get("norm_before_fc", cfg.boolean("norm_before_fc", False))
    if not before(release, "0.5.17") and norm_before_fc:
        b.norm("model.input_norm", hidden_in * aux)
    if not before(release, "0.5.13") and (cfg.data.get("fc_norm") or cfg.boolean("use_aux_norm", False)):
        for k in range(aux):
            b.norm(f"model.fc_norm.{k}", hidden_in)
    if kv < b.p.size("tp") and b.p.size("tp") % kv:
        raise LayoutError(f"num_key_value_heads = {kv} must divide the TP size {b.p.size('tp')}")
    for i in range(layers):
        pre = f"model.layers.{i}"
        b.qkv(f"{pre}.self_attn.qkv_proj", 2 * H if i == 0 else H, hd, heads, kv, "tp")
        b.row(f"{pre}.self_attn.o_proj", H, heads * hd, "tp")
        b.rope(cfg.integer("max_position_embeddings", 8192), rotary)
        b.column(f"{pre}.mlp.gate_up_proj", 2 * inter, H, "tp", shards=[inter, inter])
        b.row(f"{pre}.mlp.down_proj", H, inter, "tp")
        for norm in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
            b.norm(f"{pre}.{norm}", H)
    b.norm("model.norm", H, part="head")
    if not tied:
        b.vocab("lm_head", draft_vocab, H, "tp", part="head")


def eagle2(b: Builder, cfg: ConfigSection, release: str, arch: str) -> None:
    """``LlamaForCausalLMEagle`` / ``Qwen2ForCausalLMEagle`` as built (0.5.23 ``models/llama_eagle.py:64-
    150``, ``models/qwen2_eagle.py:65-148``; the same parameters in every modelled release): the embedding
    (vocab-parallel), the target family's decoder layers (``qkv_proj`` with bias where ``attention_bias``
    or ``bias`` says, always for Qwen2; layer 0 without its ``input_layernorm``: deleted, 0.5.23
    :54-55, a lambda before), ``fc`` (a plain ``nn.Linear(2H, H)`` with its bias, replicated) and a
    ``ParallelLMHead`` of ``hot_vocab_size`` (else the vocabulary) unless tied (refused:
    :func:`check_draft_release`). Each layer's RoPE cache (``cos_sin_cache``, float32), shared."""
    _, _, max_pos = EAGLE2[arch]
    H = cfg.integer("hidden_size")
    V = cfg.integer("vocab_size")
    heads, kv = cfg.integer("num_attention_heads"), cfg.integer("num_key_value_heads", 0, minimum=0)
    kv = kv or heads
    hd = cfg.opt_int("head_dim") or H // heads
    inter = cfg.integer("intermediate_size")
    qwen = arch == "Qwen2ForCausalLMEagle"
    # llama.py:339-341 (attention_bias or bias); qwen2.py:194 (always)
    bias = qwen or cfg.boolean("attention_bias", False) or cfg.boolean("bias", False)
    rope = cfg.data.get("rope_parameters") or cfg.data.get("rope_scaling")
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, Mapping) else "default"
    if kind not in ("default", "llama3"):
        raise ConfigError(
            f"{cfg.source}: the EAGLE-2 draft's rope_scaling type {shorten(kind)} is not modelled (its RoPE "
            "cache size differs); give the weights per GPU (target and draft) with --weights-gib"
        )
    rotary = hd if qwen else int(cfg.number("partial_rotary_factor", 1.0) * hd)
    if kv < b.p.size("tp") and b.p.size("tp") % kv:
        raise LayoutError(f"num_key_value_heads = {kv} must divide the TP size {b.p.size('tp')}")
    b.vocab("model.embed_tokens", V, H, "tp", part="embed")
    for i in range(cfg.integer("num_hidden_layers", 1)):
        pre = f"model.layers.{i}"
        b.qkv(f"{pre}.self_attn.qkv_proj", H, hd, heads, kv, "tp", bias=bias)
        # Llama's o_proj takes the same bias (llama.py:214-220), Qwen2's none (qwen2.py:196-201)
        b.row(f"{pre}.self_attn.o_proj", H, heads * hd, "tp", bias=bias and not qwen)
        b.rope(cfg.integer("max_position_embeddings", max_pos), rotary)
        b.column(f"{pre}.mlp.gate_up_proj", 2 * inter, H, "tp", shards=[inter, inter])
        b.row(f"{pre}.mlp.down_proj", H, inter, "tp")
        if i > 0:
            b.norm(f"{pre}.input_layernorm", H)
        b.norm(f"{pre}.post_attention_layernorm", H)
    b.replicated("model.fc", H, 2 * H, bias=True, quant=False)
    b.vocab("lm_head", cfg.opt_int("hot_vocab_size") or V, H, "tp", part="head")


COPIES_FREED_AFTER_SIZING = FIRST_DRAFT_IN_BUDGET
"""From this release the draft's own embedding/head copies are freed after the pool is sized: the worker's
``init_lm_head`` (``set_embed_and_head`` / ``set_embed``) moved from ``EagleDraftWorker.__init__`` (0.5.4-
0.5.13.post1, e.g. 0.5.13 ``speculative/eagle_worker_v2.py:198``) into its ``alloc_memory_pool`` (0.5.14
:231, 0.5.19 :213, 0.5.23 :258; the multi-layer and standalone workers likewise), which the scheduler calls
after ``init_target_memory_pool`` has measured the free memory and sized the pool (0.5.14
``managers/scheduler.py:836-842``, 0.5.23 :1098-1111; ``mem_cache/kv_cache_configurator.py:2990-3060``
``get_available_gpu_memory``). So in every release that charges the draft (0.5.14+) the copies are in
the measured figure: the class as built, as upstream sgl-project/sglang#36452 reports for 0.5.19. Before
0.5.14 they are freed in the worker's constructor, but the draft is built after the pool anyway."""


def shared_with_target(params: list[Param], place: Place, release: str) -> list[Param]:
    """The EAGLE-2 draft as the pool is sized. Its worker's ``init_lm_head`` binds the target's embedding
    and head (0.5.23 ``speculative/eagle_worker_v2.py:336-380``, the non-EAGLE3 branch):
    ``set_embed_and_head`` deletes the draft's own two and empties the cache (``models/llama.py:895-905``,
    ``models/qwen2.py:770-777``); under PP (0.5.21+) the last stage has no target embedding and keeps its
    own, reloaded in place (``speculative/pp_draft_embedding.py:225-248``), only the head is the target's.
    Where that happens before the pool is sized (:data:`COPIES_FREED_AFTER_SIZING`: only before 0.5.14, whose
    draft is not charged) the freed ones are ``part`` "dropped"; from 0.5.14 it happens after, and the
    figure holds them: the class as built."""
    if not before(release, COPIES_FREED_AFTER_SIZING):
        return params
    freed = {"head"} if place.pp_size > 1 else {"embed", "head"}
    return [p._replace(part="dropped") if p.part in freed else p for p in params]


def separate_draft_rank_params(
    config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str = "config.json"
) -> list[tuple[Place, list[Param]]]:
    """The separate draft's parameters on every rank that loads it, in world-rank order (the target's
    layer count does not matter: the ranks that load it are the last stage's)."""
    out = []
    for place in places(layout, layout.pp_size, release):
        params = separate_draft_params(config, layout, place, release=release, source=source)
        if params is not None:
            out.append((place, params))
    return out


def with_separate_draft(
    target: ModelWeights, draft_config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str
) -> ModelWeights:
    """``target`` (sized without a draft) with the separate draft on the ranks that load it, charged
    where the release sizes the pool after loading it (checker.core.weights.weights.FIRST_DRAFT_IN_BUDGET)."""
    ranks = []
    for r in target.ranks:
        params = separate_draft_params(draft_config, layout, r.place, release=release, source=source)
        charged = params is not None and not before(release, FIRST_DRAFT_IN_BUDGET)
        extra = 0
        if charged and params is not None:  # less what its worker frees before the pool is sized (none)
            dropped = [i for i, p in enumerate(params) if p.part == "dropped"]
            extra = allocator_bytes([p.nbytes for p in params], dropped)
        ranks.append(dataclasses.replace(r, draft_bytes=extra))
    return dataclasses.replace(target, ranks=tuple(ranks))


# ---- the draft's shards, held to its class --------------------------------------------------------------

MTP_LOADER = {
    "qwen3_next": "models/qwen3_next.py:1173-1184",
    "qwen3_5": "models/qwen3_5_mtp.py:361-366",
    "qwen3_5_moe": "models/qwen3_5_mtp.py:361-366",
}
"""Where the MTP class's ``load_weights`` keeps only the names holding ``mtp`` (0.5.23; the same filter in
every modelled release): a checkpoint without them leaves every draft parameter as ``torch.empty`` made it,
and no loader checks that a parameter was filled (``model_loader/loader.py`` ``load_weights_only``)."""


def _expanded(tensors: Iterator[tuple[str, Shape]], text: ConfigSection) -> Iterator[tuple[str, Shape]]:
    experts = text.integer("num_experts", 0, minimum=0) or text.integer("n_routed_experts", 0, minimum=0)
    for name, shape in tensors:
        if ".experts.E." in name:
            for e in range(experts):
                yield name.replace(".experts.E.", f".experts.{e}."), shape
        else:
            yield name, shape


def mtp_tensors(config: Mapping[str, Any], source: str) -> list[tuple[str, Shape]] | None:
    """The checkpoint tensors the family's NEXTN/MTP class loads (experts expanded); None: not held."""
    model_type = config.get("model_type")
    family = family_for(model_type if isinstance(model_type, str) else "")
    rules = family.rules() if family is not None else None
    if rules is None or rules.weights is None or rules.draft_tensors is None:
        return None
    cfg = ConfigSection(config, source)
    text = text_section(rules.weights, cfg)
    return list(_expanded(rules.draft_tensors(cfg, text), text))


def _held_to(
    ckpt: Checkpoint,
    expected: list[tuple[str, Shape]],
    have: Mapping[str, str],
    cls: str,
    *,
    release: str,
    source: str,
    where: str,
) -> None:
    """Every tensor of ``expected`` in a shard (``have``: the class's name -> the checkpoint's), of the
    shape config.json gives: one ConfigError line naming the tensor (and its shard) otherwise."""
    for name, shape in expected:
        held = have.get(name)
        if held is None:
            raise ConfigError(
                f"tensor {shorten(name)} is in no shard of {shown_path(Path(ckpt.directory))}, and SGLang "
                f"{release}'s {cls} (the speculative draft) loads it ({where}): that parameter would stay "
                "uninitialised memory (no loader checks it) and the draft propose garbage; give the draft's "
                "whole checkpoint"
            )
        t = ckpt.tensors[held]
        if t.shape != shape:
            raise ConfigError(
                f"tensor {shorten(held)} in shard {shorten(t.shard)} has shape {list(t.shape)} but {source} "
                f"gives {list(shape)} for SGLang {release}'s {cls} (the speculative draft): its weight "
                "loader fails on it; the draft's checkpoint and config.json are of different models"
            )


def check_mtp_shards(ckpt: Checkpoint, config: Mapping[str, Any], *, release: str, source: str) -> None:
    """Hold ``ckpt``'s ``mtp.*`` tensors to the family's NEXTN/MTP class (the draft EAGLE/NEXTN loads from
    this checkpoint): none at all, a tensor the class loads that no shard holds, or a shape config.json
    contradicts is one ConfigError line. SGLang itself does not refuse the first two: it starts with the
    draft on uninitialised memory, which a green verdict would hide. A family whose draft tensors are not
    held: nothing."""
    expected = mtp_tensors(config, source)
    model_type = str(config.get("model_type"))
    if expected is None or model_type not in MTP_REWRITES:
        return
    cls, where = MTP_REWRITES[model_type][-1], MTP_LOADER[model_type]
    if not any("mtp" in name for name in ckpt.tensors):
        raise ConfigError(
            f"{shown_path(Path(ckpt.directory))}: its shards hold no mtp.* tensor, and SGLang {release}'s "
            f"{cls}, the draft that --speculative-algorithm EAGLE/NEXTN loads from this checkpoint, takes "
            f"only those (sglang/srt/{where}); nothing checks that its parameters were filled, so the "
            "server would start with the draft on uninitialised memory (every proposal rejected, its weights "
            "held for nothing): use the checkpoint with its MTP layer, or launch without speculative decoding"
        )
    _held_to(ckpt, expected, {n: n for n in ckpt.tensors}, cls, release=release, source=source, where=where)


EAGLE3_LEGACY = (
    ("midlayer", "layers.0"),
    ("aux_norm_low", "fc_norm.0"),
    ("aux_norm_mid", "fc_norm.1"),
    ("aux_norm_high", "fc_norm.2"),
)
"""``LlamaForCausalLMEagle3.load_weights``'s legacy names (0.5.23 ``models/llama_eagle3.py:336-341``;
0.5.10's class has ``midlayer`` itself)."""


def eagle3_tensors(config: Mapping[str, Any], release: str, source: str) -> list[tuple[str, Shape]]:
    """The checkpoint tensors ``LlamaForCausalLMEagle3`` loads, without the ``model.`` prefix its
    ``load_weights`` adds where a name misses (0.5.23 ``models/llama_eagle3.py:325-381``): ``fc``, the
    norms around it the release builds, the layers, the final norm, and ``lm_head`` where config.json gives
    ``draft_vocab_size`` and does not tie it (else the target's head is shared,
    ``speculative/eagle_worker_v2.py:353-363``). The embedding is always the target's (``set_embed``)."""
    (one,) = places(WeightsLayout(pp_size=1, tp_size=1), 1, release)
    b = Builder(one, "bfloat16", release, None)
    cfg = ConfigSection(config, source)
    eagle3(b, cfg, release)  # the release's own refusals first (several layers on 0.5.10)
    H = cfg.integer("hidden_size")
    heads = cfg.integer("num_attention_heads")
    kv = cfg.integer("num_key_value_heads", 0, minimum=0) or heads
    hd = cfg.opt_int("head_dim") or H // heads
    inter = cfg.integer("intermediate_size")
    out: list[tuple[str, Shape]] = []
    for p in b.params:
        if p.name in ("model.fc.weight", "model.input_norm.weight") or p.name.startswith("model.fc_norm."):
            out.append((p.name.removeprefix("model."), p.shape))
    for i in range(cfg.integer("num_hidden_layers", 1)):
        pre, width = f"layers.{i}", 2 * H if i == 0 else H
        out += [
            (f"{pre}.self_attn.q_proj.weight", (heads * hd, width)),
            (f"{pre}.self_attn.k_proj.weight", (kv * hd, width)),
            (f"{pre}.self_attn.v_proj.weight", (kv * hd, width)),
            (f"{pre}.self_attn.o_proj.weight", (H, heads * hd)),
            (f"{pre}.mlp.gate_proj.weight", (inter, H)),
            (f"{pre}.mlp.up_proj.weight", (inter, H)),
            (f"{pre}.mlp.down_proj.weight", (H, inter)),
        ]
        out += [
            (f"{pre}.{n}.weight", (H,))
            for n in ("input_layernorm", "post_attention_layernorm", "hidden_norm")
        ]
    out.append(("norm.weight", (H,)))
    draft_vocab = cfg.opt_int("draft_vocab_size")
    if draft_vocab and not cfg.boolean("tie_word_embeddings", False):
        out.append(("lm_head.weight", (draft_vocab, H)))
    return out


def eagle2_tensors(config: Mapping[str, Any], arch: str, source: str) -> list[tuple[str, Shape]]:
    """The checkpoint tensors an EAGLE-2 class loads into parameters it keeps: its ``load_weights`` puts
    ``model.`` before every name but ``lm_head`` (0.5.23 ``models/llama_eagle.py:144-148``,
    ``models/qwen2_eagle.py:141-145``), so the shards name them without it: ``fc`` (weight and bias) and
    each layer's projections (q/k/v stacked by the target's loader) and norms. The embedding and the head
    are the target's after ``set_embed_and_head`` (:func:`shared_with_target`): not required."""
    cfg = ConfigSection(config, source)
    H = cfg.integer("hidden_size")
    heads = cfg.integer("num_attention_heads")
    kv = cfg.integer("num_key_value_heads", 0, minimum=0) or heads
    hd = cfg.opt_int("head_dim") or H // heads
    inter = cfg.integer("intermediate_size")
    bias = (
        arch == "Qwen2ForCausalLMEagle" or cfg.boolean("attention_bias", False) or cfg.boolean("bias", False)
    )
    out: list[tuple[str, Shape]] = [("fc.weight", (H, 2 * H)), ("fc.bias", (H,))]
    for i in range(cfg.integer("num_hidden_layers", 1)):
        pre = f"layers.{i}"
        for proj, rows in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            out.append((f"{pre}.self_attn.{proj}.weight", (rows, H)))
            if bias:
                out.append((f"{pre}.self_attn.{proj}.bias", (rows,)))
        out += [
            (f"{pre}.self_attn.o_proj.weight", (H, heads * hd)),
            *([(f"{pre}.self_attn.o_proj.bias", (H,))] if bias and arch != "Qwen2ForCausalLMEagle" else []),
            (f"{pre}.mlp.gate_proj.weight", (inter, H)),
            (f"{pre}.mlp.up_proj.weight", (inter, H)),
            (f"{pre}.mlp.down_proj.weight", (H, inter)),
            (f"{pre}.post_attention_layernorm.weight", (H,)),
        ]
        if i > 0:
            out.append((f"{pre}.input_layernorm.weight", (H,)))
    return out


def check_draft_checkpoint(path: str, *, release: str) -> None:
    """A separate draft directory's shards held to the class its config.json names (one ConfigError line
    naming the tensor and the shard): quantized tensors under a config that declares none, a tensor the
    class loads that no shard holds, a shape config.json contradicts. Neither class's ``load_weights``
    raises on a name it has no parameter for (EAGLE3: ``if param_name in params_dict``,
    ``models/llama_eagle3.py:362-381``; the MTP classes skip every name without ``mtp``), so extra tensors
    pass. No shards: nothing to hold (the figure is config.json's)."""
    d = Path(path)
    if not has_safetensors(d):
        return
    config = read_draft_config(path)
    source = shown_path(d / "config.json")
    if read_scheme(config, source=source) is not None:
        return  # a quantized draft: refused in one line where it is sized
    ckpt = read_checkpoint(d)
    check_unquantized(ckpt, source)
    archs = config.get("architectures")
    arch = str(archs[0]) if isinstance(archs, list) and archs else ""
    if arch == EAGLE3:
        have: dict[str, str] = {}
        for name in ckpt.tensors:
            mapped = name
            for legacy, new in EAGLE3_LEGACY:
                mapped = mapped.replace(legacy, new)
            have.setdefault(mapped.removeprefix("model."), name)
        where = "models/llama_eagle3.py:325-381"
        _held_to(
            ckpt,
            eagle3_tensors(config, release, source),
            have,
            EAGLE3,
            release=release,
            source=source,
            where=where,
        )
    elif arch in EAGLE2:
        module = EAGLE2[arch][0]
        _held_to(
            ckpt,
            eagle2_tensors(config, arch, source),
            {n: n for n in ckpt.tensors},
            arch,
            release=release,
            source=source,
            where=f"{module} load_weights",
        )
    elif arch in MTP_REWRITES.get(str(config.get("model_type")), ()):
        check_mtp_shards(ckpt, config, release=release, source=source)


NO_NEXTN_CLASS: dict[str, tuple[str, str | None, str | None]] = {
    "KimiK3ForConditionalGeneration": ("Kimi-K3", "models/kimi_k3.py:3199-3205", None),
    "KimiLinearForCausalLM": ("Kimi-Linear", None, None),
    "FalconH1ForCausalLM": ("Falcon-H1", None, None),
    "GraniteMoeHybridForCausalLM": ("Granite-4.0-H", None, None),
    "NemotronHForCausalLM": ("Nemotron-H", None, "0.5.8"),
}
"""Architecture -> (family, where its target's load_weights drops the layers past ``num_hidden_layers``
or None, the first release with a NEXTN/MTP class for it or None) for the families a modelled release
(0.5.2-0.5.23) has no NEXTN/MTP class for. The draft's ModelConfig rewrites ``architectures[0]`` to a draft
class only for the architectures it lists (``is_draft_model and self.hf_config.architectures[0] ...``:
0.5.23 ``configs/model_config.py:1011-1211``, 0.5.13 :415-501, 0.5.8 :300-311, 0.5.2 the first 8 such
lines): none of Kimi-K3, Kimi-Linear, Falcon-H1 or Granite-4.0-H in any release, and no release ships a
``*MTP``/``*NextN``/``*Eagle`` class for the last three (``models/kimi_linear.py``, ``falcon_h1.py``,
``granitemoehybrid.py``). Nemotron-H is rewritten to ``NemotronHForCausalLMMTP`` from 0.5.8
(0.5.8 ``configs/model_config.py:310-311``, ``models/nemotron_h_mtp.py`` new there; 0.5.23 :1198-1203),
not before. Without a rewrite ``arg_groups/speculative_hook.py:1119-1135`` does not set the draft path,
and the draft worker builds the class from ``--model-path`` (``managers/tp_worker.py:466-480``;
``configs/model_config.py:956`` ``model_path or cfg.model_path``): the whole target a second time, not a
NEXTN layer. Keyed on the architecture, as SGLang decides it, so that a preset, a config-only directory,
a checkpoint and a figure given with --weights-gib are refused alike."""


def check_nextn_family(
    archs: tuple[str, ...] | list[str], config: Mapping[str, Any] | None, *, release: str, source: str
) -> None:
    """EAGLE/NEXTN with the draft in the target's own checkpoint (no ``--speculative-draft-model-path``,
    or the target's own directory) for an architecture ``release`` has no NEXTN/MTP class for (Kimi-K3,
    whatever ``num_nextn_predict_layers`` its text config declares; Kimi-Linear, Falcon-H1, Granite-4.0-H;
    Nemotron-H before 0.5.8): one FlagError line naming what SGLang would load instead. It depends on the
    architecture and the release only: not on whether a checkpoint was read, nor on where the weights
    figure comes from. ``config``: the HF config where known (its NEXTN layers named)."""
    arch = archs[0] if archs else ""
    entry = NO_NEXTN_CLASS.get(arch)
    if entry is None:
        return
    name, dropped, first = entry
    if first is not None and not before(release, first):
        return
    text = config.get("text_config") if config is not None else None
    text = text if isinstance(text, Mapping) else (config or {})
    nextn = text.get("num_nextn_predict_layers")
    declared = (
        f"its {nextn} NEXTN layer(s) in the checkpoint are dropped by the target ({dropped}); "
        if (dropped and isinstance(nextn, int) and not isinstance(nextn, bool) and nextn > 0)
        else ""
    )
    which = "no release has one" if first is None else f"the first release with one is {first}"
    raise FlagError(
        f"{source}: SGLang {release} has no NEXTN/MTP draft class for {name} ({which}): under "
        f"--speculative-algorithm EAGLE/NEXTN without a draft of its own (--speculative-draft-model-path "
        f"unset, or the target's directory) its draft worker "
        f"builds {arch} whole from --model-path (sglang/srt/managers/tp_worker.py:466-480), the target a "
        f"second time; {declared}give a draft with --speculative-draft-model-path, or launch without "
        "speculative decoding"
    )


def check_draft_release(config: Mapping[str, Any], *, release: str, source: str) -> None:
    """What ``release`` refuses of a separate draft's config.json whatever its shards or the weights
    figure's source (one ConfigError line): a tied EAGLE-2 draft (every release: ``set_embed_and_head``
    deletes the one shared weight twice, 0.5.23 ``models/llama.py:896-897``, ``models/qwen2.py:771-772``);
    an EAGLE3 draft of several layers before 0.5.13 (0.5.10 ``models/llama_eagle3.py:212-213``)."""
    archs = config.get("architectures")
    arch = str(archs[0]) if isinstance(archs, list) and archs else ""
    if arch in EAGLE2 and config.get("tie_word_embeddings") is True:
        module, target, _ = EAGLE2[arch]
        raise ConfigError(
            f"{source}: SGLang {release} fails on this tied {arch} draft at start: its lm_head is its "
            f"embedding ({module}), and the draft worker's set_embed_and_head deletes that one weight twice "
            f"(sglang/srt/{target} set_embed_and_head: AttributeError); use an untied draft"
        )
    if arch == EAGLE3:
        layers = config.get("num_hidden_layers", 1)
        if layers != 1 and before(release, "0.5.13"):
            raise ConfigError(
                f"{source}: SGLang {release} refuses it: EAGLE3 currently only supports 1 layer"
            )
