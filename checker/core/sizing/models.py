"""Where a geometry comes from: the built-in preset, an HF ``config.json`` of a supported family, or a
small JSON model spec. Each path ends in a :class:`ModelGeometry` with per-rank shapes at ``tp_size``.

The family rules mirror SGLang 0.5.23's ``mamba2_cache_params`` of each model config class.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import select
import stat
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from checker.core.errors import ConfigError, LayoutError, json_kind, printable, shorten
from checker.core.sizing.attention import AttentionGeometry
from checker.core.sizing.geometry import (
    MAX_CONTEXT_LEN,
    MAX_CONV_STATES,
    MAX_DIM,
    MAX_EXTRA_PER_SLOT_BYTES,
    MAX_LAYERS,
    MAX_STATE_ELEMENTS,
    ModelGeometry,
    canonical_dtype,
    check_shape,
    exact_div,
)

DEFAULT_MODEL = "kimi-k3"
CONFIG_NAME = "config.json"
"""What a model directory passed as ``--model-config DIR`` must hold (SGLang's ``--model-path`` habit)."""

# ---- limits on the file itself, checked before and while parsing ----
# A model's config.json is a few KiB (the fixtures: 0.6-6 KiB); the largest real ones, with per-layer
# lists or quantization ignore-lists, stay well under 1 MiB. 4 MiB is read at most, so a weights file
# passed by mistake costs 4 MiB, not its size.
MAX_CONFIG_BYTES = 4 * 2**20
# Real configs nest 2-5 levels (quantization_config.config_groups.group_0.weights). Python's json raises
# RecursionError near 1,000 levels, at a depth that depends on the caller's stack: a fixed, lower limit
# gives one answer everywhere.
MAX_JSON_DEPTH = 64
# The longest integers in real configs are about 31 digits (HF's "very large" model_max_length 1e30);
# Python's int() refuses strings past 4,300 digits with a ValueError json does not turn into its own error.
MAX_INT_DIGITS = 40
MAX_NAME_CHARS = 200
READ_S = 5.0
"""How long a model config that is not a regular file (a FIFO, ``<(cat config.json)``, /dev/stdin) may take
to arrive: a FIFO nobody writes to is an error after this, not a hang."""
MAX_PATH_SHOWN = 200
# A short conv's window: 4 in every supported family. 1,024 keeps a conv state (conv_dim x (kernel - 1))
# inside MAX_STATE_ELEMENTS for any conv_dim the limits accept.
MAX_CONV_KERNEL = 1024

LAYERS_WHY = "(the largest real models have a few hundred layers)"
FIX = "fix it in the model config"


@dataclass(frozen=True)
class _Keys:
    """One JSON object of a config plus where it sits, so every message names the key as the user wrote it.

    ``prefix`` is the path of a nested object: "text_config." for Qwen3.5, "linear_attn_config." for Kimi.
    """

    data: Mapping[str, Any]
    source: str
    prefix: str = ""

    def name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def error(self, key: str, value: Any, rule: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.prefix}{key}={shorten(value)} {rule}")

    def get(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None:
            raise ConfigError(
                f"{self.source}: config key {self.name(key)!r} is missing; add it or use a model spec"
            )
        return value

    def integer(self, key: str, *, minimum: int = 1, maximum: int = MAX_DIM, why: str = "") -> int:
        """An integer key in ``[minimum, maximum]``; a bool, a float or a string is refused, not converted."""
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            hint = "; write it without quotes" if isinstance(value, str) else f"; {FIX}"
            raise self.error(key, value, f"must be an integer, not {json_kind(value)}{hint}")
        if not minimum <= value <= maximum:
            why = f" {why}" if why else ""
            raise self.error(key, value, f"must be an integer in [{minimum}, {maximum:,}]{why}; {FIX}")
        return value

    def layers(self, key: str = "num_hidden_layers") -> int:
        return self.integer(key, maximum=MAX_LAYERS, why=LAYERS_WHY)

    def section(self, key: str) -> _Keys:
        value = self.get(key)
        if not isinstance(value, Mapping):
            raise self.error(key, value, f"must be a JSON object, not {json_kind(value)}; {FIX}")
        return _Keys(value, self.source, f"{self.prefix}{key}.")

    def optional_dtype(self, key: str) -> str | None:
        """A dtype key SGLang reads from the config: absent/null, or a non-empty string (checked later)."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.error(
                key, value, "must be one of float32, bfloat16, float16 (or left out for the default); " + FIX
            )
        return value


def _kimi_k3(tp_size: int) -> ModelGeometry:
    # The upstream unit test's fixture ("Kimi-K3 shape"): 93 layers, every 4th is full attention and
    # the last two are too; conv [(4096, 3)] bf16 and temporal (64, 128, 128) fp32 per layer. Taken as
    # TP-1 shapes so --tp-size divides the 64 heads and 4096 conv channels like a config's.
    src = "preset kimi-k3"
    linear = tuple(i for i in range(93) if (i + 1) % 4 != 0 and i <= 90)
    return ModelGeometry(
        name="kimi-k3",
        family="kimi_k3",  # SGLang 0.5.23 models/kimi_k3.py; no older release has this family
        num_hidden_layers=93,
        linear_layer_ids=linear,
        conv_shapes=((exact_div(4096, tp_size, what="conv channels", source=src), 3),),
        temporal_shape=(exact_div(64, tp_size, what="num_heads", source=src), 128, 128),
        # SGLang names no published Kimi-K3 config.json. KimiK3Config (configs/kimi_k3.py) holds the hybrid
        # layers and the MLA attention in a KimiLinearConfig text config, whose full_attention_layer_ids are
        # the layers that are not KDA (configs/kimi_linear.py:169); the MLA cell is kv_lora_rank 512 +
        # qk_rope_head_dim 64 (kernels/ops/attention/verify_mla.py:32 "K3 MLA (kv_lora_rank 512 + qk_rope
        # 64)"); its context length is KimiLinearConfig's max_position_embeddings default, 4096
        # (configs/kimi_linear.py:64), and num_nextn_predict_layers its default 0. bf16 KV (2 bytes; the
        # float16 that "auto" would give a config without a dtype is as wide).
        context_len=4096,
        attention=AttentionGeometry(
            full_attention_layer_ids=tuple(i for i in range(93) if i not in set(linear)),
            num_kv_heads=1,
            head_dim=72,
            v_head_dim=72,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            dtype="bfloat16",
            architecture="KimiK3ForConditionalGeneration",
            num_nextn_predict_layers=0,
        ),
    )


PRESETS: dict[str, Callable[[int], ModelGeometry]] = {"kimi-k3": _kimi_k3}


def _bounded(value: int, *, expr: str, limit: int, source: str, what: str) -> int:
    """A size derived from several keys (a product or sum), refused past ``limit`` naming those keys."""
    if value > limit:
        raise ConfigError(
            f"{source}: {what} = {expr} = {value:,} is above {limit:,}, far past any real model; "
            f"check those keys in the model config"
        )
    return value


def mamba2_shapes(
    *,
    tp_size: int,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
    source: str,
    names: Mapping[str, str] | None = None,
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Per-rank (conv_shapes, temporal_shape) of SGLang's ``Mamba2StateShape.create``.

    ``names`` maps each argument to the config key (or expression) it came from, for messages.
    """
    n = {k: k for k in ("intermediate_size", "n_groups", "num_heads", "head_dim", "state_size")}
    n.update(names or {})
    # The model's own sizes (TP 1) are bounded, so the answer does not depend on the TP size asked for.
    _bounded(
        intermediate_size + 2 * n_groups * state_size,
        expr=f"{n['intermediate_size']} + 2 * {n['n_groups']} * {n['state_size']}",
        limit=MAX_DIM,
        source=source,
        what="conv_dim",
    )
    _bounded(
        num_heads * head_dim * state_size,
        expr=f"{n['num_heads']} * {n['head_dim']} * {n['state_size']}",
        limit=MAX_STATE_ELEMENTS,
        source=source,
        what="temporal state elements",
    )
    # Groups that TP cannot split are replicated: SGLang then counts tp groups.
    if n_groups % tp_size:
        n_groups = tp_size
    conv_dim = intermediate_size + 2 * n_groups * state_size
    conv = (exact_div(conv_dim, tp_size, what="conv_dim", source=source), conv_kernel - 1)
    heads = exact_div(num_heads, tp_size, what=n["num_heads"], source=source)
    return (conv,), (heads, head_dim, state_size)


def _qwen3_next(k: _Keys, tp: int) -> dict[str, Any]:
    L = k.layers()
    interval = k.integer("full_attention_interval", maximum=MAX_LAYERS)
    value_heads = k.integer("linear_num_value_heads")
    value_dim = k.integer("linear_value_head_dim")
    key_heads = k.integer("linear_num_key_heads")
    if value_heads % key_heads:
        # SGLang's gated delta net gives each key head num_v_heads // num_k_heads value heads
        # (models/qwen3_next.py fix_query_key_value_ordering): any other count cannot load.
        raise ConfigError(
            f"{k.source}: {k.name('linear_num_value_heads')}={value_heads} must be a multiple of "
            f"{k.name('linear_num_key_heads')}={key_heads} (SGLang splits the value heads evenly among the "
            f"key heads, and cannot load this model); {FIX}"
        )
    names = {
        "intermediate_size": f"{k.name('linear_num_value_heads')} * {k.name('linear_value_head_dim')}",
        "n_groups": k.name("linear_num_key_heads"),
        "num_heads": k.name("linear_num_value_heads"),
        "head_dim": k.name("linear_value_head_dim"),
        "state_size": k.name("linear_key_head_dim"),
    }
    conv, temporal = mamba2_shapes(
        tp_size=tp,
        intermediate_size=value_heads * value_dim,
        n_groups=key_heads,
        num_heads=value_heads,
        head_dim=value_dim,
        state_size=k.integer("linear_key_head_dim"),
        conv_kernel=k.integer("linear_conv_kernel_dim", minimum=2, maximum=MAX_CONV_KERNEL),
        source=k.source,
        names=names,
    )
    # SGLang derives the linear layers from the interval and ignores ``layer_types`` here.
    ids = tuple(i for i in range(L) if (i + 1) % interval != 0)
    return dict(
        num_hidden_layers=L,
        linear_layer_ids=ids,
        conv_shapes=conv,
        temporal_shape=temporal,
        config_ssm_dtype=k.optional_dtype("mamba_ssm_dtype"),
    )


def _kimi_linear(k: _Keys, tp: int) -> dict[str, Any]:
    L = k.layers()
    lac = k.section("linear_attn_config")
    kda = lac.get("kda_layers")
    if not isinstance(kda, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in kda):
        raise lac.error("kda_layers", kda, f"must be a list of 1-based layer ids; {FIX}")
    if len(kda) > L:
        raise lac.error(
            "kda_layers", kda, f"lists {len(kda):,} layers but num_hidden_layers={L}; list each layer once"
        )
    # Check the ids as the user wrote them (1-based): after the shift a 0 would be reported as -1.
    bad = sorted({i for i in kda if not 1 <= i <= L})
    if bad:
        raise ConfigError(
            f"{k.source}: {lac.name('kda_layers')} {shorten(bad)} out of range [1, {L}]; kda_layers are "
            f"1-based layer ids up to num_hidden_layers={L}"
        )
    dup = sorted(i for i, n in Counter(kda).items() if n > 1)
    if dup:
        raise ConfigError(
            f"{k.source}: {lac.name('kda_layers')} repeats {shorten(dup)}; list each layer once"
        )
    H = lac.integer("num_heads")
    d = lac.integer("head_dim")
    K = lac.integer("short_conv_kernel_size", minimum=2, maximum=MAX_CONV_KERNEL)
    heads, dim = lac.name("num_heads"), lac.name("head_dim")
    channels = _bounded(
        3 * H * d, expr=f"3 * {heads} * {dim}", limit=MAX_DIM, source=k.source, what="conv channels"
    )
    _bounded(
        H * d * d,
        expr=f"{heads} * {dim} * {dim}",
        limit=MAX_STATE_ELEMENTS,
        source=k.source,
        what="temporal state elements",
    )
    # KDA keeps the conv window axis first and packs q, k, v channels into one conv state.
    conv = ((K - 1, exact_div(channels, tp, what=f"3 * {heads} * {dim}", source=k.source)),)
    temporal = (exact_div(H, tp, what=heads, source=k.source), d, d)
    # kda_layers are 1-BASED in the config; the config's dtype key is ignored by SGLang here.
    return dict(
        num_hidden_layers=L,
        linear_layer_ids=tuple(sorted(i - 1 for i in kda)),
        conv_shapes=conv,
        temporal_shape=temporal,
    )


# A Nemotron-H layer as hybrid_override_pattern writes it, and as layers_block_type (0.5.10+) does.
NEMOTRON_LAYER_TYPES = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}


def _nemotron_pattern(k: _Keys) -> str:
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


def _nemotron_h(k: _Keys, tp: int) -> dict[str, Any]:
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


def _mamba2_block(
    k: _Keys, tp: int, intermediate: int, intermediate_name: str, *, auto_head_dim: bool = False
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    heads = k.integer("mamba_n_heads")
    # Falcon-H1's class takes mamba_d_head "auto" (its default): the intermediate size over the heads.
    auto = auto_head_dim and k.data.get("mamba_d_head", "auto") == "auto"
    return mamba2_shapes(
        tp_size=tp,
        intermediate_size=intermediate,
        n_groups=k.integer("mamba_n_groups"),
        num_heads=heads,
        head_dim=intermediate // heads if auto else k.integer("mamba_d_head"),
        state_size=k.integer("mamba_d_state"),
        conv_kernel=k.integer("mamba_d_conv", minimum=2, maximum=MAX_CONV_KERNEL),
        source=k.source,
        names={
            "intermediate_size": intermediate_name,
            "n_groups": "mamba_n_groups",
            "num_heads": "mamba_n_heads",
            "head_dim": "mamba_d_head",
            "state_size": "mamba_d_state",
        },
    )


def _expand_times_hidden(k: _Keys) -> int:
    expand = k.get("mamba_expand")
    hidden = k.integer("hidden_size")
    if isinstance(expand, bool) or not isinstance(expand, (int, float)):
        raise k.error("mamba_expand", expand, f"must be a number, not {json_kind(expand)}; {FIX}")
    if not expand > 0:  # also refuses NaN from a caller that skipped read_json
        raise k.error("mamba_expand", expand, f"must be a positive number; {FIX}")
    product = expand * hidden
    # Checked as a float first: int() of an infinite product would raise OverflowError.
    if not product <= MAX_DIM:
        raise ConfigError(
            f"{k.source}: mamba_expand * hidden_size = {shorten(expand)} * {hidden} is above {MAX_DIM:,}, "
            "far past any real model; check those keys in the model config"
        )
    return int(product)


FALCON_H1_D_SSM = 1024
"""``mamba_d_ssm`` where a Falcon-H1 config leaves it out: FalconH1Config's default in every release (null
means ``mamba_expand * hidden_size``)."""


def _falcon_h1(k: _Keys, tp: int) -> dict[str, Any]:
    L = k.layers()
    if "mamba_d_ssm" not in k.data:
        # FalconH1Config's default (configs/falcon_h1.py, every release): 1024, not expand * hidden
        intermediate, name = FALCON_H1_D_SSM, "mamba_d_ssm (its default)"
    elif k.data["mamba_d_ssm"] is not None:
        intermediate, name = k.integer("mamba_d_ssm"), "mamba_d_ssm"
    else:
        intermediate, name = _expand_times_hidden(k), "int(mamba_expand * hidden_size)"
    conv, temporal = _mamba2_block(k, tp, intermediate, name, auto_head_dim=True)
    # Every Falcon-H1 layer runs attention and Mamba2 side by side: all L layers hold state.
    return dict(
        num_hidden_layers=L, linear_layer_ids=tuple(range(L)), conv_shapes=conv, temporal_shape=temporal
    )


GRANITE_LAYER_NAMES = {
    "mamba": "mamba",
    "attention": "attention",
    "linear_attention": "mamba",
    "full_attention": "attention",
}
"""Granite-4.0-H's layer types: "linear_attention" / "full_attention" are transformers 5.15's names, which
0.5.19+ maps back (earlier releases refuse them: :mod:`checker.core.releases.config_rules`); every release
refuses any other."""


def _granite_h(k: _Keys, tp: int) -> dict[str, Any]:
    L = k.layers()
    types = k.get("layer_types")
    if not isinstance(types, list) or len(types) != L:
        got = f"{len(types):,} entries" if isinstance(types, list) else json_kind(types)
        raise ConfigError(
            f"{k.source}: layer_types must be a list of num_hidden_layers={L} entries, got {got}; {FIX}"
        )
    names = GRANITE_LAYER_NAMES
    bad = next((i for i, t in enumerate(types) if not isinstance(t, str) or t not in names), None)
    if bad is not None:
        raise ConfigError(
            f"{k.source}: layer_types has {shorten(types[bad])} at layer {bad}; a layer is 'mamba' or "
            f"'attention'; {FIX}"
        )
    intermediate = _expand_times_hidden(k)
    conv, temporal = _mamba2_block(k, tp, intermediate, "int(mamba_expand * hidden_size)")
    ids = tuple(i for i, t in enumerate(types) if names[t] == "mamba")
    return dict(num_hidden_layers=L, linear_layer_ids=ids, conv_shapes=conv, temporal_shape=temporal)


# Model types SGLang 0.5.23 gives a state pool (srt/configs/hybrid_arch.py mambaish_config) that the checker
# does not read: a config of one of these is a hybrid model to describe with a JSON model spec.
STATE_POOL_FAMILIES = frozenset(
    {
        "bailing_hybrid",
        "falcon_mamba",
        "glm5_next",
        "inkling_mm_model",
        "inkling_model",
        "intern_s2_preview",
        "jet_nemotron",
        "jet_vlm",
        "lfm2",
        "lfm2_moe",
        "lfm2_vl",
        "mamba",
        "mamba2",
        "minicpm_sala",
        "NemotronH_Nano_VL_V2",
        "zaya",
    }
)
# Config keys of a model with recurrent or linear-attention state (a family newer than the list above).
_STATE_KEY_WORDS = ("mamba", "ssm", "linear_attn", "linear_num", "linear_conv", "kda", "lightning")


def _looks_hybrid(data: Mapping[str, Any]) -> bool:
    """Whether a config's keys speak of a recurrent state (then a model spec can describe it)."""
    return any(isinstance(key, str) and any(w in key.lower() for w in _STATE_KEY_WORDS) for key in data)


FAMILIES: dict[str, Callable[[_Keys, int], dict[str, Any]]] = {
    "qwen3_next": _qwen3_next,
    "qwen3_5": _qwen3_next,
    "qwen3_5_moe": _qwen3_next,
    "kimi_linear": _kimi_linear,
    "kimi_k3": _kimi_linear,
    "nemotron_h": _nemotron_h,
    "falcon_h1": _falcon_h1,
    "granitemoehybrid": _granite_h,
}


def geometry_from_hf_config(cfg: Mapping[str, Any], *, tp_size: int, source: str) -> ModelGeometry:
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(
            f"{source}: model_type={shorten(model_type)} must be a string naming the model family "
            f"({', '.join(sorted(FAMILIES))}); {FIX}"
        )
    keys = _Keys(cfg, source)
    # Qwen3.5 nests the language model's keys in text_config.
    if model_type.startswith("qwen3_5") and cfg.get("text_config") is not None:
        text = keys.section("text_config")
        keys = _Keys({**text.data, "model_type": model_type}, source, text.prefix)
    # Kimi-K3 (0.5.23 configs/kimi_k3.py KimiK3Config): the hybrid layers and the MLA attention are a
    # KimiLinearConfig built from text_config (``KimiLinearConfig(**text_config)``), which
    # configs/hybrid_arch.py ``kimi_linear_config`` returns for the state pool and ModelConfig reads as
    # ``hf_text_config`` (the MLA branch for KimiK3ForConditionalGeneration, configs/model_config.py:1463).
    if model_type == "kimi_k3":
        text = keys.section("text_config")
        keys = _Keys({**text.data, "model_type": model_type}, source, text.prefix)
    if model_type not in FAMILIES:
        supported = ", ".join(sorted(FAMILIES))
        if model_type in STATE_POOL_FAMILIES or _looks_hybrid(keys.data):
            raise ConfigError(
                f"{source}: model_type={shorten(model_type)} is not a hybrid family the checker reads "
                f"({supported}); describe it with a JSON model spec instead (docs/preflight.md)"
            )
        raise ConfigError(
            f"{source}: model_type={shorten(model_type)} has no linear-attention (mamba) layers, so SGLang "
            "gives it no state pool and there is nothing for this check to compare (SGLang sizes only its "
            f"KV cache); the check applies to hybrid models ({supported})"
        )
    fields = FAMILIES[model_type](keys, tp_size)
    spec = _ATTENTION[model_type]
    context = context_length(keys, default=spec.context_default)
    attention = _attention(cfg, keys, spec, fields)
    return ModelGeometry(
        name=f"{source} ({model_type})",
        context_len=context,
        family=model_type,
        attention=attention,
        **fields,
    )


# ---- the attention side: what SGLang's ModelConfig and the family's config class read ----


@dataclass(frozen=True)
class _AttentionSpec:
    """A family's attention facts where its SGLang config class (0.5.23 ``sglang/srt/configs/``) decides
    them: the full-attention layers, and the class defaults of keys a config may leave out."""

    full_ids: Callable[[_Keys, dict[str, Any]], tuple[int, ...]]
    context_default: int
    """The config class's ``max_position_embeddings`` default (what ``get_context_length`` falls back to)."""
    kv_heads_default: int | None = None
    head_dim_default: int | None = None
    """None: ``hidden_size // num_attention_heads`` (``ModelConfig._derive_model_shapes``)."""
    mla: bool = False
    nextn_default: int | None = None
    """The config class's ``num_nextn_predict_layers`` default (None: the class has no such field)."""


def _complement(_: _Keys, fields: dict[str, Any]) -> tuple[int, ...]:
    # Qwen3-Next / Qwen3.5 (``layers_block_type`` from the interval) and Kimi-Linear (every layer that is not
    # KDA): the layers that are not linear attention.
    linear = set(fields["linear_layer_ids"])
    return tuple(i for i in range(fields["num_hidden_layers"]) if i not in linear)


def _nemotron_full(k: _Keys, _: dict[str, Any]) -> tuple[int, ...]:
    # configs/nemotron_h.py full_attention_layer_ids: the "*" of hybrid_override_pattern.
    return tuple(i for i, c in enumerate(k.get("hybrid_override_pattern")) if c == "*")


def _every_layer(_: _Keys, fields: dict[str, Any]) -> tuple[int, ...]:
    # configs/falcon_h1.py full_attention_layer_ids: range(num_hidden_layers) (attention on every layer).
    return tuple(range(fields["num_hidden_layers"]))


def _granite_full(k: _Keys, _: dict[str, Any]) -> tuple[int, ...]:
    # configs/granitemoehybrid.py attention_layer_ids: layer_types[i] == "attention" (0.5.19+ maps
    # transformers 5.15's "full_attention" back to it first: GRANITE_LAYER_NAMES).
    return tuple(i for i, t in enumerate(k.get("layer_types")) if GRANITE_LAYER_NAMES.get(t) == "attention")


_QWEN_ATTENTION = _AttentionSpec(_complement, 32768, kv_heads_default=2, head_dim_default=256)
_ATTENTION: dict[str, _AttentionSpec] = {
    # configs/qwen3_next.py Qwen3NextConfig (Qwen3_5TextConfig inherits it): num_key_value_heads=2,
    # head_dim=256, max_position_embeddings=32768.
    "qwen3_next": _QWEN_ATTENTION,
    "qwen3_5": _QWEN_ATTENTION,
    "qwen3_5_moe": _QWEN_ATTENTION,
    # configs/kimi_linear.py KimiLinearConfig: max_position_embeddings=4096, num_nextn_predict_layers=0;
    # ModelConfig treats KimiLinearForCausalLM as MLA (head_dim 72, kv_lora_rank + qk_rope_head_dim).
    "kimi_linear": _AttentionSpec(_complement, 4096, mla=True, nextn_default=0),
    # Kimi-K3: the same KimiLinearConfig, as text_config (configs/kimi_k3.py); ModelConfig's MLA branch
    # names KimiK3ForConditionalGeneration with KimiLinearForCausalLM (head_dim 72).
    "kimi_k3": _AttentionSpec(_complement, 4096, mla=True, nextn_default=0),
    # configs/nemotron_h.py NemotronHConfig: head_dim=128, num_key_value_heads=8,
    # max_position_embeddings=4096, num_nextn_predict_layers=0.
    "nemotron_h": _AttentionSpec(
        _nemotron_full, 4096, kv_heads_default=8, head_dim_default=128, nextn_default=0
    ),
    # configs/falcon_h1.py FalconH1Config: num_key_value_heads=8, max_position_embeddings=8192.
    "falcon_h1": _AttentionSpec(_every_layer, 8192, kv_heads_default=8),
    # configs/granitemoehybrid.py GraniteMoeHybridConfig: num_key_value_heads=8,
    # max_position_embeddings=131072.
    "granitemoehybrid": _AttentionSpec(_granite_full, 131072, kv_heads_default=8),
}
assert set(_ATTENTION) == set(FAMILIES), "every family the checker reads has its attention facts"

CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
"""SGLang's ``get_context_length`` (0.5.23 ``utils/hf_transformers/common.py:668-694``): the first key set."""


def context_length(k: _Keys, *, default: int) -> int:
    """The model's context length as SGLang derives it (``ModelConfig.context_len`` without
    --context-length): the first of :data:`CONTEXT_LENGTH_KEYS` the config sets (the config class's
    ``max_position_embeddings`` default otherwise), times ``rope_scaling.factor`` unless the scaling names
    ``original_max_position_embeddings`` or is llama3's."""
    factor: float = 1
    rope = k.data.get("rope_scaling")
    if isinstance(rope, Mapping) and rope:
        raw = rope.get("factor", 1)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= 2**20:
            raise k.error("rope_scaling", rope, f"has factor={shorten(raw)}, not a positive number; {FIX}")
        factor = raw
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if k.data.get(key) is not None:
            value = k.integer(key, maximum=MAX_CONTEXT_LEN, why="(real models reach about 10**7 tokens)")
            break
    else:
        value = default
    context = int(factor * value)
    if not 1 <= context <= MAX_CONTEXT_LEN:
        raise ConfigError(
            f"{k.source}: the context length rope_scaling.factor x {value} = {context:,} is outside "
            f"[1, {MAX_CONTEXT_LEN:,}]; {FIX}"
        )
    return context


_DTYPE_NAMES = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float": "float32",
    "half": "float16",
}


def _auto_dtype(cfg: Mapping[str, Any], k: _Keys) -> str:
    """``--dtype auto`` as ``ModelConfig`` resolves it (``_get_and_verify_dtype``): the text config's
    ``dtype``/``torch_dtype`` (the top-level one when it has none), float32 or unset becoming float16."""
    raw = k.data.get("dtype") or k.data.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype")
    name = _DTYPE_NAMES.get(raw.removeprefix("torch.")) if isinstance(raw, str) else None
    if raw is not None and name is None:
        raise ConfigError(f"{k.source}: torch_dtype={shorten(raw)} is not a dtype SGLang loads; {FIX}")
    return "float16" if name in (None, "float32") else name


def _attention(
    cfg: Mapping[str, Any], k: _Keys, spec: _AttentionSpec, fields: dict[str, Any]
) -> AttentionGeometry:
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    quant = cfg.get("quantization_config")
    algo = quant.get("kv_cache_quant_algo") if isinstance(quant, Mapping) else None
    nextn = spec.nextn_default
    if k.data.get("num_nextn_predict_layers") is not None:
        nextn = k.integer("num_nextn_predict_layers", minimum=0, maximum=1024)
    common: dict[str, Any] = dict(
        full_attention_layer_ids=spec.full_ids(k, fields),
        dtype=_auto_dtype(cfg, k),
        architecture=arch,
        num_nextn_predict_layers=nextn,
        fp8_kv_checkpoint=isinstance(algo, str) and algo.upper() == "FP8",
    )
    if spec.mla:
        rank = k.integer("kv_lora_rank", minimum=0)
        rope = k.integer("qk_rope_head_dim", minimum=0)
        return AttentionGeometry(
            num_kv_heads=1, head_dim=72, v_head_dim=72, kv_lora_rank=rank, qk_rope_head_dim=rope, **common
        )
    heads = spec.kv_heads_default
    if k.data.get("num_key_value_heads") is not None or heads is None:
        heads = k.integer("num_key_value_heads")
    if k.data.get("head_dim") is not None:
        head_dim = k.integer("head_dim")
    elif spec.head_dim_default is not None:
        head_dim = spec.head_dim_default
    else:
        head_dim = k.integer("hidden_size") // k.integer("num_attention_heads")
        if head_dim < 1:
            raise ConfigError(f"{k.source}: hidden_size // num_attention_heads is 0; {FIX}")
    v_head_dim = k.integer("v_head_dim") if k.data.get("v_head_dim") else head_dim
    return AttentionGeometry(num_kv_heads=heads, head_dim=head_dim, v_head_dim=v_head_dim, **common)


def _spec_shape(k: _Keys, value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{k.source}: {what}={shorten(value)} must be a list of positive integers")
    check_shape(value, what=what, source=k.source)
    return tuple(value)


def geometry_from_model_spec(spec: Mapping[str, Any], *, source: str) -> ModelGeometry:
    """The small JSON model spec: shapes are per-rank (already divided by attention TP)."""
    k = _Keys(spec, source)
    L = k.layers()
    ids = k.get("linear_layer_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise k.error("linear_layer_ids", ids, "must be a list of 0-based integers")
    if len(ids) > L:
        raise k.error(
            "linear_layer_ids", ids, f"lists {len(ids):,} layers but num_hidden_layers={L}; list each once"
        )
    convs = k.get("conv_shapes")
    if not isinstance(convs, list) or not convs:
        raise k.error("conv_shapes", convs, "must be a non-empty list of shapes")
    if len(convs) > MAX_CONV_STATES:
        raise k.error(
            "conv_shapes", convs, f"lists {len(convs):,} conv states; at most {MAX_CONV_STATES} (real: 1)"
        )
    dtypes = spec.get("dtypes")
    dtypes = {} if dtypes is None else dtypes
    if not isinstance(dtypes, Mapping):
        raise k.error("dtypes", dtypes, 'must be an object like {"conv": "bfloat16", "temporal": "float32"}')
    extra = 0
    if spec.get("extra_per_slot_bytes") is not None:
        extra = k.integer("extra_per_slot_bytes", minimum=0, maximum=MAX_EXTRA_PER_SLOT_BYTES)
    family = spec.get("model_type")
    if family is not None and (
        not isinstance(family, str) or not family.strip() or len(family) > MAX_NAME_CHARS
    ):
        raise k.error(
            "model_type", family, f"must be a family name like qwen3_next (at most {MAX_NAME_CHARS} chars)"
        )
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS):
        raise k.error("name", name, f"must be a non-empty string of at most {MAX_NAME_CHARS} characters")
    for key, text in (("model_type", family), ("name", name)):
        # Printed in every report and log line: a newline would forge a line, U+202E reorder one.
        if text is not None and not text.isprintable():
            raise k.error(
                key,
                text,
                "must be printable text: no control or format characters (a newline, NUL, a right-to-left "
                "override); rename it in the model spec",
            )

    def dtype(key: str, default: str) -> str:
        value = dtypes.get(key)
        if value is None:
            return default
        return canonical_dtype(value, source=f"{source}: dtypes.{key}", error=ConfigError)

    context = None
    if spec.get("context_len") is not None:
        context = k.integer(
            "context_len", maximum=MAX_CONTEXT_LEN, why="(real models reach about 10**7 tokens)"
        )
    return ModelGeometry(
        name=name or source,
        num_hidden_layers=L,
        context_len=context,
        attention=_spec_attention(k) if spec.get("attention") is not None else None,
        linear_layer_ids=tuple(sorted(ids)),
        conv_shapes=tuple(_spec_shape(k, s, f"conv_shapes[{i}]") for i, s in enumerate(convs)),
        temporal_shape=_spec_shape(k, k.get("temporal_shape"), "temporal_shape"),
        conv_dtype=dtype("conv", "bfloat16"),
        temporal_dtype=dtype("temporal", "float32"),
        extra_per_slot_bytes=extra,
        family=family,
    )


def _spec_attention(k: _Keys) -> AttentionGeometry:
    """A model spec's optional ``attention`` object: the model's own (TP 1) KV facts, as in config.json."""
    a = k.section("attention")
    ids = a.get("full_attention_layer_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise a.error("full_attention_layer_ids", ids, "must be a list of 0-based integers")
    mla = a.data.get("kv_lora_rank") is not None or a.data.get("qk_rope_head_dim") is not None
    head_dim = a.integer("head_dim") if not mla or a.data.get("head_dim") is not None else 72
    dtype = a.data.get("dtype", "bfloat16")
    return AttentionGeometry(
        full_attention_layer_ids=tuple(sorted(ids)),
        num_kv_heads=a.integer("num_key_value_heads") if not mla else 1,
        head_dim=head_dim,
        v_head_dim=a.integer("v_head_dim") if a.data.get("v_head_dim") is not None else head_dim,
        kv_lora_rank=a.integer("kv_lora_rank", minimum=0) if mla else None,
        qk_rope_head_dim=a.integer("qk_rope_head_dim", minimum=0) if mla else None,
        dtype=canonical_dtype(dtype, source=f"{k.source}: attention.dtype", error=ConfigError),
        num_nextn_predict_layers=(
            a.integer("num_nextn_predict_layers", minimum=0, maximum=1024)
            if a.data.get("num_nextn_predict_layers") is not None
            else None
        ),
    )


# ---- reading the file ----


class _Refused:
    """A JSON value the parser must not hand on (NaN, Infinity, a float or integer too large), kept as a
    placeholder until the walk below can say which key holds it."""

    __slots__ = ("text", "rule")

    def __init__(self, text: str, rule: str) -> None:
        self.text, self.rule = text, rule


def _parse_constant(text: str) -> _Refused:
    # Python's json accepts NaN, Infinity and -Infinity although JSON has no such values; a NaN head count
    # or expand factor would flow into the sizing as NaN.
    return _Refused(text, "is not a number JSON allows (NaN and Infinity are refused)")


def _parse_float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(text, "overflows a float (it reads as infinity)")


def _parse_int(text: str) -> int | _Refused:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return _Refused(text, f"has more than {MAX_INT_DIGITS} digits, far past any real config value")
    return int(text)


def _key_path(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    key = key if len(key) <= 60 else shorten(key)  # type: ignore[arg-type]
    return f"{path}.{key}" if path else str(key)


def _cut(text: str, limit: int = 80) -> str:
    """A key path or a raw JSON literal, as written, cut in the middle when long."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-limit // 4 :]} ({len(text):,} chars)"


def _tree_is_clean(data: Any) -> bool:
    """One breadth-first pass, no recursion and no paths (fast on a 4 MiB list): depth and values fine?"""
    level, depth = [data], 1
    while level:
        if depth > MAX_JSON_DEPTH:
            return False
        deeper = []
        for node in level:
            for value in node.values() if type(node) is dict else node:
                kind = type(value)
                if kind is list or kind is dict:
                    if value:
                        deeper.append(value)
                elif kind is _Refused:
                    return False
        level, depth = deeper, depth + 1
    return True


def _check_tree(data: Any, label: str) -> None:
    """Refuse JSON nested past MAX_JSON_DEPTH or holding a refused value, naming where it sits."""
    if _tree_is_clean(data):
        return
    # The slow pass, on the error path only: the same walk keeping each node's key path for the message.
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ConfigError(
                f"{label}: {_cut(path)} nests deeper than {MAX_JSON_DEPTH} levels; a model config nests "
                "a few (pass the model's config.json)"
            )
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(value, (dict, list)):
                if value:
                    stack.append((value, _key_path(path, key), depth + 1))
            elif isinstance(value, _Refused):
                where = _key_path(path, key)
                raise ConfigError(f"{label}: {_cut(where)}={_cut(value.text)} {value.rule}; {FIX}")
    raise AssertionError("_tree_is_clean and _check_tree disagree")  # our invariant, not user input


def shown_path(path: str | Path) -> str:
    """A path as a message line shows it: control characters escaped, a very long one cut."""
    return printable(_cut(str(path), MAX_PATH_SHOWN))


def path_stat(path: str | Path, label: str) -> os.stat_result | None:
    """``path``'s stat (None: nothing there), or one line for a path the system refuses outright (a name
    too long, a NUL byte, a loop of symlinks), instead of the OSError ``Path.is_dir`` raises."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:  # an embedded NUL byte
        raise ConfigError(f"{label}: a path cannot hold a NUL byte") from None
    except OSError as exc:
        raise ConfigError(f"{label}: {exc.strerror or exc}") from None


def resolve_config_path(path: str | Path) -> Path:
    """``--model-config PATH``: a config file, or a model directory holding ``config.json``."""
    if not str(path).strip():
        # Path("") is ".", which would quietly read ./config.json.
        raise ConfigError(f"--model-config {str(path)!r} is empty; pass a config.json or a model directory")
    p = Path(path)
    st = path_stat(p, f"--model-config {shown_path(path)}")
    if st is None or not stat.S_ISDIR(st.st_mode):
        return p
    config = p / CONFIG_NAME
    if path_stat(config, f"--model-config {shown_path(config)}") is None:
        raise ConfigError(
            f"--model-config {shown_path(path)} is a directory without {CONFIG_NAME}; pass the model "
            f"directory that holds {CONFIG_NAME} (as for SGLang's --model-path), or the config file itself"
        )
    return config


def _read_stream(p: Path, label: str) -> bytes:
    """A FIFO or character device (``<(cat config.json)``, /dev/stdin): read without blocking past
    READ_S, and at most MAX_CONFIG_BYTES + 1 bytes (/dev/zero never ends)."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    deadline = time.monotonic() + READ_S
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= MAX_CONFIG_BYTES:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise ConfigError(
                    f"{label}: nothing to read within {READ_S:g} s (a FIFO or device nobody writes to); "
                    "pass the model's config.json file"
                )
            try:
                chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_bytes(p: Path, label: str) -> bytes:
    st = path_stat(p, label)
    if st is None:
        raise ConfigError(f"{label}: no such file; pass the path to config.json or the model directory")
    mode = st.st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        what = "a socket" if stat.S_ISSOCK(mode) else "a block device" if stat.S_ISBLK(mode) else "not a file"
        raise ConfigError(f"{label} is {what}; pass the model's config.json or its directory")
    try:
        if stat.S_ISREG(mode):
            with open(p, "rb") as f:
                return f.read(MAX_CONFIG_BYTES + 1)
        return _read_stream(p, label)
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ConfigError(f"{label}: cannot read it ({reason})") from None


def read_json(path: str | Path) -> dict[str, Any]:
    """Read ``--model-config`` (file or model directory) as one JSON object, in bounded time and memory."""
    p = resolve_config_path(path)
    label = f"--model-config {shown_path(p)}"
    raw = _read_bytes(p, label)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{label}: larger than {MAX_CONFIG_BYTES // 2**20} MiB, and a model config.json is a few KiB; "
            "pass the model's config.json (not a weights, index or tokenizer file)"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{label}: not UTF-8 text (byte {exc.start}); pass the model's config.json"
        ) from None
    try:
        data = json.loads(
            text, parse_constant=_parse_constant, parse_float=_parse_float, parse_int=_parse_int
        )
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{label}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise ConfigError(
            f"{label}: nests deeper than {MAX_JSON_DEPTH} levels (the JSON parser gave up); a model config "
            "nests a few; pass the model's config.json"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{label}: expected a JSON object, got {json_kind(data)}")
    if raw.startswith(codecs.BOM_UTF8) and "linear_layer_ids" not in data:
        # SGLang loads config.json through transformers' PretrainedConfig._dict_from_json_file: open(...,
        # encoding="utf-8") and json.loads, which refuses a BOM ("not a valid JSON file"). A model spec is
        # the checker's own file: its BOM is harmless.
        raise ConfigError(
            f"{label}: starts with a UTF-8 byte-order mark, and SGLang cannot load such a config.json "
            '(transformers reads it with json.loads: "not a valid JSON file"); save it as UTF-8 without BOM'
        )
    _check_tree(data, label)
    return data


def load_geometry(
    *, model: str | None = None, model_config: str | Path | None = None, tp_size: int = 1
) -> ModelGeometry:
    """Resolve ``--model NAME`` or ``--model-config PATH`` (HF config, model spec, or a model directory
    holding config.json) at ``tp_size``."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise LayoutError(f"--tp-size {shorten(tp_size)} must be a positive integer")
    if model_config is not None:
        path = resolve_config_path(model_config)
        data = read_json(path)
        source = shown_path(path)  # the geometry's name: in every report and log line
        if "linear_layer_ids" in data:
            geometry = geometry_from_model_spec(data, source=source)
        elif "model_type" not in data:
            raise ConfigError(
                f"{source}: neither an HF config (no 'model_type') nor a model spec "
                "(no 'linear_layer_ids'); see docs/preflight.md 'JSON model spec'"
            )
        else:
            geometry = geometry_from_hf_config(data, tp_size=tp_size, source=source)
        # The file's content as JSON reads it: two copies that differ only in whitespace or key order
        # are one model to SGLang too.
        return replace(geometry, source_digest=_digest(json.dumps(data, sort_keys=True)))
    name = model or DEFAULT_MODEL
    if name not in PRESETS:
        raise ConfigError(
            f"--model {shorten(name)} is not a built-in preset ({', '.join(PRESETS)}); "
            "pass --model-config PATH for anything else"
        )
    own = json.dumps(PRESETS[name](1).describe(), sort_keys=True)  # the preset's definition, before TP
    return replace(PRESETS[name](tp_size), source_digest=_digest(own))


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
