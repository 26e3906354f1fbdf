"""Nemotron-H's release rules: its config checks (the layer pattern as each release reads it), the
parameters its class builds per rank, its checkpoint names (``backbone.`` prefix)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from checker.core.errors import ConfigError, json_kind, shorten
from checker.core.releases.config_rules import Release
from checker.core.weights.checkpoint_names import Shape
from checker.core.weights.weights import (
    Builder,
    ConfigSection,
    FamilyWeights,
    WeightsLayout,
    before,
)
from checker.families.family import FamilyRules
from checker.families.mamba2_rules import mamba_mixer, mamba_tensors


def _nemotron_pattern(t: ConfigSection) -> str:
    types = t.array("layers_block_type")
    if types is not None:
        code = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
        return "".join(code.get(x, "?") for x in types)
    return t.string("hybrid_override_pattern", "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-") or ""


def build(b: Builder, cfg: ConfigSection, t: ConfigSection, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 131072)
    pattern = _nemotron_pattern(t)
    heads, kv = t.integer("num_attention_heads", 32), t.integer("num_key_value_heads", 8)
    hd = t.opt_int("head_dim") or H // heads
    m_heads = t.integer("mamba_num_heads", 128)
    m_hd = t.integer("mamba_head_dim", 64)
    groups = t.integer("mamba_n_groups", 8) if "mamba_n_groups" in t.data else t.integer("n_groups", 8)
    state = t.integer("ssm_state_size", 128)
    conv = t.integer("mamba_d_conv", 4) if "mamba_d_conv" in t.data else t.integer("conv_kernel", 4)
    inter_cfg = t.data.get("intermediate_size", 21504)
    tied = t.boolean("tie_word_embeddings", False)
    # split over the whole TP group up to 0.5.13, over the attention-TP group under DP from 0.5.14
    embed_g = "attn_tp" if layout.dp_size > 1 and not before(release, "0.5.14") else "tp"
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    # 0.5.3.post1-0.5.7 build the whole model on every stage (no PPMissingLayer), the head tied to the
    # embedding's own tensor when tie_word_embeddings.
    whole = before(release, "0.5.8")
    first, last = b.p.first or whole, b.p.last or whole
    if first:
        b.vocab("model.embed_tokens", V, H, embed_g, part="embed")
    if last and not (tied and (b.p.pp_size == 1 or whole)):
        b.vocab("lm_head", V, H, head_g, part="head")
    for i in range(b.p.start_layer, b.p.end_layer):
        c = pattern[i]
        pre = f"model.layers.{i}.mixer"
        if c == "M":
            mamba_mixer(
                b,
                pre,
                hidden=H,
                intermediate=m_heads * m_hd,
                heads=m_heads,
                n_groups=groups,
                state=state,
                conv_kernel=conv,
                conv_bias=t.boolean("use_conv_bias", True),
                proj_bias=t.boolean("use_bias", False),
                rms_norm=True,
                layout=layout,
                release=release,
            )
        elif c == "*":
            # over the attention-TP group from 0.5.14; the whole TP group before, even under DP
            ag = "tp" if before(release, "0.5.14") else "attn_tp"
            b.qkv(f"{pre}.qkv_proj", H, hd, heads, kv, ag)
            b.row(f"{pre}.o_proj", H, heads * hd, ag)
            b.kv_scales(f"{pre}.attn")
        elif c == "-":
            if isinstance(inter_cfg, list):
                k = pattern[: i + 1].count("-") - 1
                inter = inter_cfg[0] if len(inter_cfg) == 1 else inter_cfg[k]
            else:
                inter = t.integer("intermediate_size", 21504)
            bias = t.boolean("mlp_bias", False)
            b.column(f"{pre}.up_proj", inter, H, "tp", bias=bias)
            b.row(f"{pre}.down_proj", H, inter, "tp", bias=bias)
        else:
            raise ConfigError(
                f"{t.source}: layer {i} of hybrid_override_pattern is {c!r}; the weights are modelled for "
                "Mamba (M), attention (*) and MLP (-) layers (a Nemotron-H MoE checkpoint is not modelled)"
            )
        b.norm(f"model.layers.{i}.norm", H)
    if last:
        b.norm("model.norm_f", H, part="head")


def num_layers(t: ConfigSection) -> int:
    return len(_nemotron_pattern(t))


def tensors(cfg: ConfigSection, t: ConfigSection) -> Iterator[tuple[str, Shape]]:
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
            yield from mamba_tensors(
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


NEMOTRON_LAYERS = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
"""``hybrid_override_pattern``'s characters and the ``layers_block_type`` each stands for (0.5.10+
``configs/nemotron_h.py`` ``_pattern_to_list``)."""


NEMOTRON_REGEX = {
    "nemotron_h.pattern_range": r"^[*-M]+$",
    "nemotron_h.pattern_regex": r"^[*\-ME]+$",
}
"""The regular expression each release's NemotronHConfig asserts, as written (``[*-M]`` is the range
from ``*`` to ``M``, digits and capitals included); ``re.match`` with ``$``, which also matches before
a final newline, as SGLang calls it."""


NEMOTRON_DEFAULT_LAYERS = 52
"""``num_hidden_layers`` where a config leaves it out, up to 0.5.9 (NemotronHConfig's default)."""


_PATTERN_OF = {v: k for k, v in NEMOTRON_LAYERS.items()}


def check_config(r: Release, data: Mapping[str, Any]) -> None:
    pattern = data.get("hybrid_override_pattern")
    blocks = data.get("layers_block_type")
    if r.has("nemotron_h.pattern_chars"):  # 0.5.10+: layers_block_type first, the pattern its fallback
        if blocks is not None:
            _block_types(r, "layers_block_type", blocks, "nemotron_h.layers_block_type")
            if isinstance(pattern, str) and pattern != "".join(_PATTERN_OF.get(b, "?") for b in blocks):
                raise r.refuse(
                    "nemotron_h.layers_block_type",
                    "hybrid_override_pattern",
                    pattern,
                    "says another layer layout than layers_block_type, which the release reads instead (the "
                    "pattern is only its fallback); keep one of them, or make them agree",
                    "the layers of layers_block_type built",
                )
        elif isinstance(pattern, str):
            _pattern_chars(r, "hybrid_override_pattern", pattern, "nemotron_h.pattern_chars")
        _nemotron_mtp(r, data)
        return
    if not isinstance(pattern, str):
        if blocks is not None and pattern is None:
            raise r.refuse(
                "nemotron_h.pattern_length",
                "layers_block_type",
                blocks,
                "is not read by this release (layers_block_type arrived in 0.5.10): it builds its default "
                f"{NEMOTRON_DEFAULT_LAYERS}-layer hybrid_override_pattern instead; give "
                "hybrid_override_pattern",
                "the default layers built",
            )
        return  # the geometry reader refuses a pattern that is not a string
    layers = data.get("num_hidden_layers", NEMOTRON_DEFAULT_LAYERS)
    if r.has("nemotron_h.pattern_length") and len(pattern) != layers:
        given = "" if "num_hidden_layers" in data else " (its default: the config leaves it out)"
        raise r.refuse(
            "nemotron_h.pattern_length",
            "hybrid_override_pattern",
            pattern,
            f"has {len(pattern):,} characters but num_hidden_layers={shorten(layers)}{given}; its config "
            "class asserts they are equal",
            "AssertionError at load",
        )
    for rule, regex in NEMOTRON_REGEX.items():
        if r.has(rule) and not re.match(regex, pattern):
            at = next((i for i, c in enumerate(pattern) if not re.fullmatch(regex, c)), None)
            what = "is empty" if at is None else f"has {pattern[at]!r} at layer {at}"
            raise r.refuse(
                rule,
                "hybrid_override_pattern",
                pattern,
                f"{what}; its config class asserts re.match(r{regex!r}, ...)",
                "AssertionError at load",
            )
    builds = {"M", "*", "-"} | ({"E"} if r.has("nemotron_h.moe_layer") else set())
    bad = next((i for i, c in enumerate(pattern) if c not in builds), None)
    if bad is not None and r.has("nemotron_h.layer_class"):
        raise r.refuse(
            "nemotron_h.layer_class",
            "hybrid_override_pattern",
            pattern,
            f"has {pattern[bad]!r} at layer {bad}: the config class lets it through, and the model builds "
            f"no layer for it ({''.join(sorted(builds))!r} only): the stage holding layer {bad} fails",
            "KeyError building the model",
        )


def _pattern_chars(r: Release, key: str, pattern: str, rule: str) -> None:
    bad = next((i for i, c in enumerate(pattern) if c not in NEMOTRON_LAYERS), None)
    if bad is not None:
        chars = "nemotron_h.pattern_chars"  # _pattern_to_list: where every pattern's characters are read
        raise r.refuse(
            rule,
            key,
            pattern,
            f"has {pattern[bad]!r} at layer {bad}; its config class takes only 'M', '*', '-' or 'E'",
            raised=None if rule == chars else chars,
        )


def _block_types(r: Release, key: str, blocks: object, rule: str) -> None:
    if not isinstance(blocks, list):
        raise r.refuse(
            "nemotron_h.block_type_list",
            key,
            blocks,
            f"must be a list of strings, not {json_kind(blocks)}",
        )
    bad = next((i for i, b in enumerate(blocks) if not isinstance(b, str) or b not in _PATTERN_OF), None)
    if bad is not None:
        raise r.refuse(
            rule,
            key,
            blocks,
            f"has {shorten(blocks[bad])} at layer {bad}; its config class takes only 'mamba', 'attention', "
            "'mlp' or 'moe'",
        )


def _nemotron_mtp(r: Release, data: Mapping[str, Any]) -> None:
    """The MTP layers' layout, checked as 0.5.10+ checks it (a pattern is converted, and the list checked,
    only where the class would)."""
    default = ["attention", "moe"]
    mtp = data.get("mtp_layers_block_type", default)
    if "mtp_hybrid_override_pattern" in data and (mtp is None or mtp == default):
        pattern = data["mtp_hybrid_override_pattern"]
        if isinstance(pattern, str):
            _pattern_chars(r, "mtp_hybrid_override_pattern", pattern, "nemotron_h.mtp_pattern")
            mtp = [NEMOTRON_LAYERS[c] for c in pattern]
    layers = data.get("num_nextn_predict_layers", 0)
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0:
        if mtp is None:
            raise r.refuse(
                "nemotron_h.mtp_block_types",
                "mtp_layers_block_type",
                mtp,
                f"is required with num_nextn_predict_layers={layers}",
            )
        _block_types(r, "mtp_layers_block_type", mtp, "nemotron_h.mtp_block_types")


RULES = FamilyRules(
    check_config=check_config,
    weights=FamilyWeights(
        "Nemotron-H",
        ("nemotron_h",),
        None,
        num_layers,
        build,
        tensors,
        quant_methods=(
            "fp8",
            "modelopt_fp8",
            "modelopt_fp4",
            "compressed-tensors",
            "gptq_marlin",
            "awq_marlin",
        ),
        hf_prefixes=(("backbone.", "model."),),  # NemotronHForCausalLM.hf_to_sglang_mapper
    ),
)
