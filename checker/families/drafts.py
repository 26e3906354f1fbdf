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

Modelled: ``LlamaForCausalLMEagle3`` (EAGLE3 drafts as SpecForge writes them) and a directory holding a
family's own config whose draft class the checker models (Qwen3-Next, Qwen3.5: their MTP layer). Anything
else is refused in one line naming the architecture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checker.core.errors import ConfigError, FlagError, LayoutError, shorten
from checker.core.sizing.models import read_json, shown_path
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
        f"{EAGLE3} and the Qwen3-Next/Qwen3.5 MTP drafts: give the weights per GPU (target and draft) "
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
        extra = allocator_bytes([p.nbytes for p in params]) if charged and params is not None else 0
        ranks.append(dataclasses.replace(r, draft_bytes=extra))
    return dataclasses.replace(target, ranks=tuple(ranks))
