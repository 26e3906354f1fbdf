"""Where a geometry comes from: the built-in preset, an HF ``config.json`` of a supported family, or a
small JSON model spec. Each path ends in a :class:`ModelGeometry` with per-rank shapes at ``tp_size``.

The family rules mirror SGLang 0.5.23's ``mamba2_cache_params`` of each model config class.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from checker.core.errors import ConfigError, LayoutError
from checker.core.geometry import ModelGeometry, canonical_dtype, exact_div

DEFAULT_MODEL = "kimi-k3"


def _kimi_k3(tp_size: int) -> ModelGeometry:
    # The upstream unit test's fixture ("Kimi-K3 shape"): 93 layers, every 4th is full attention and
    # the last two are too; conv [(4096, 3)] bf16 and temporal (64, 128, 128) fp32 per layer. Taken as
    # TP-1 shapes so --tp-size divides the 64 heads and 4096 conv channels like a config's.
    src = "preset kimi-k3"
    return ModelGeometry(
        name="kimi-k3",
        num_hidden_layers=93,
        linear_layer_ids=tuple(i for i in range(93) if (i + 1) % 4 != 0 and i <= 90),
        conv_shapes=((exact_div(4096, tp_size, what="conv channels", source=src), 3),),
        temporal_shape=(exact_div(64, tp_size, what="num_heads", source=src), 128, 128),
    )


PRESETS: dict[str, Callable[[int], ModelGeometry]] = {"kimi-k3": _kimi_k3}


def _get(cfg: Mapping[str, Any], key: str, source: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"{source}: config key {key!r} is missing; add it or use a model spec")
    return cfg[key]


def _int(cfg: Mapping[str, Any], key: str, source: str, *, minimum: int = 1) -> int:
    value = _get(cfg, key, source)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{source}: {key}={value!r} must be an integer >= {minimum}")
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
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Per-rank (conv_shapes, temporal_shape) of SGLang's ``Mamba2StateShape.create``."""
    # Groups that TP cannot split are replicated: SGLang then counts tp groups.
    if n_groups % tp_size:
        n_groups = tp_size
    conv_dim = intermediate_size + 2 * n_groups * state_size
    conv = (exact_div(conv_dim, tp_size, what="conv_dim", source=source), conv_kernel - 1)
    heads = exact_div(num_heads, tp_size, what="num_heads", source=source)
    return (conv,), (heads, head_dim, state_size)


def _qwen3_next(cfg: Mapping[str, Any], tp: int, src: str) -> dict[str, Any]:
    L = _int(cfg, "num_hidden_layers", src)
    interval = _int(cfg, "full_attention_interval", src)
    value_heads = _int(cfg, "linear_num_value_heads", src)
    value_dim = _int(cfg, "linear_value_head_dim", src)
    conv, temporal = mamba2_shapes(
        tp_size=tp,
        intermediate_size=value_heads * value_dim,
        n_groups=_int(cfg, "linear_num_key_heads", src),
        num_heads=value_heads,
        head_dim=value_dim,
        state_size=_int(cfg, "linear_key_head_dim", src),
        conv_kernel=_int(cfg, "linear_conv_kernel_dim", src, minimum=2),
        source=src,
    )
    # SGLang derives the linear layers from the interval and ignores ``layer_types`` here.
    ids = tuple(i for i in range(L) if (i + 1) % interval != 0)
    return dict(num_hidden_layers=L, linear_layer_ids=ids, conv_shapes=conv, temporal_shape=temporal,
                config_ssm_dtype=cfg.get("mamba_ssm_dtype"))


def _kimi_linear(cfg: Mapping[str, Any], tp: int, src: str) -> dict[str, Any]:
    L = _int(cfg, "num_hidden_layers", src)
    lac = _get(cfg, "linear_attn_config", src)
    if not isinstance(lac, Mapping):
        raise ConfigError(f"{src}: linear_attn_config must be an object")
    sub = f"{src} linear_attn_config"
    kda = _get(lac, "kda_layers", sub)
    if not isinstance(kda, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in kda):
        raise ConfigError(f"{sub}: kda_layers={kda!r} must be a list of 1-based layer ids")
    # Check the ids as the user wrote them (1-based): after the shift a 0 would be reported as -1.
    bad = sorted({i for i in kda if not 1 <= i <= L})
    if bad:
        raise ConfigError(
            f"{sub}: kda_layers {bad} out of range [1, {L}]; kda_layers are 1-based layer ids "
            f"up to num_hidden_layers={L}"
        )
    dup = sorted({i for i in kda if kda.count(i) > 1})
    if dup:
        raise ConfigError(f"{sub}: kda_layers repeats {dup}; list each layer once")
    H = _int(lac, "num_heads", sub)
    d = _int(lac, "head_dim", sub)
    K = _int(lac, "short_conv_kernel_size", sub, minimum=2)
    # KDA keeps the conv window axis first and packs q, k, v channels into one conv state.
    conv = ((K - 1, exact_div(3 * H * d, tp, what="3 * num_heads * head_dim", source=sub)),)
    temporal = (exact_div(H, tp, what="num_heads", source=sub), d, d)
    # kda_layers are 1-BASED in the config; the config's dtype key is ignored by SGLang here.
    return dict(num_hidden_layers=L, linear_layer_ids=tuple(sorted(i - 1 for i in kda)),
                conv_shapes=conv, temporal_shape=temporal)


def _nemotron_h(cfg: Mapping[str, Any], tp: int, src: str) -> dict[str, Any]:
    pattern = _get(cfg, "hybrid_override_pattern", src)
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{src}: hybrid_override_pattern={pattern!r} must be a non-empty string")
    heads = _int(cfg, "mamba_num_heads", src)
    head_dim = _int(cfg, "mamba_head_dim", src)
    conv, temporal = mamba2_shapes(
        tp_size=tp,
        intermediate_size=heads * head_dim,
        n_groups=_int(cfg, "n_groups", src),
        num_heads=heads,
        head_dim=head_dim,
        state_size=_int(cfg, "ssm_state_size", src),
        conv_kernel=_int(cfg, "conv_kernel", src, minimum=2),
        source=src,
    )
    ids = tuple(i for i, c in enumerate(pattern) if c == "M")
    return dict(num_hidden_layers=len(pattern), linear_layer_ids=ids, conv_shapes=conv,
                temporal_shape=temporal)


def _mamba2_block(cfg: Mapping[str, Any], tp: int, src: str, intermediate: int) -> tuple:
    return mamba2_shapes(
        tp_size=tp,
        intermediate_size=intermediate,
        n_groups=_int(cfg, "mamba_n_groups", src),
        num_heads=_int(cfg, "mamba_n_heads", src),
        head_dim=_int(cfg, "mamba_d_head", src),
        state_size=_int(cfg, "mamba_d_state", src),
        conv_kernel=_int(cfg, "mamba_d_conv", src, minimum=2),
        source=src,
    )


def _expand_times_hidden(cfg: Mapping[str, Any], src: str) -> int:
    expand = _get(cfg, "mamba_expand", src)
    hidden = _int(cfg, "hidden_size", src)
    if isinstance(expand, bool) or not isinstance(expand, (int, float)) or expand <= 0:
        raise ConfigError(f"{src}: mamba_expand={expand!r} must be a positive number")
    return int(expand * hidden)


def _falcon_h1(cfg: Mapping[str, Any], tp: int, src: str) -> dict[str, Any]:
    L = _int(cfg, "num_hidden_layers", src)
    d_ssm = cfg.get("mamba_d_ssm")
    intermediate = d_ssm if d_ssm is not None else _expand_times_hidden(cfg, src)
    if isinstance(intermediate, bool) or not isinstance(intermediate, int) or intermediate <= 0:
        raise ConfigError(f"{src}: mamba_d_ssm={d_ssm!r} must be a positive integer or null")
    conv, temporal = _mamba2_block(cfg, tp, src, intermediate)
    # Every Falcon-H1 layer runs attention and Mamba2 side by side: all L layers hold state.
    return dict(num_hidden_layers=L, linear_layer_ids=tuple(range(L)), conv_shapes=conv,
                temporal_shape=temporal)


def _granite_h(cfg: Mapping[str, Any], tp: int, src: str) -> dict[str, Any]:
    L = _int(cfg, "num_hidden_layers", src)
    types = _get(cfg, "layer_types", src)
    if not isinstance(types, list) or len(types) != L:
        raise ConfigError(
            f"{src}: layer_types must be a list of num_hidden_layers={L} entries, "
            f"got {len(types) if isinstance(types, list) else type(types).__name__}"
        )
    conv, temporal = _mamba2_block(cfg, tp, src, _expand_times_hidden(cfg, src))
    ids = tuple(i for i, t in enumerate(types) if t == "mamba")
    return dict(num_hidden_layers=L, linear_layer_ids=ids, conv_shapes=conv, temporal_shape=temporal)


FAMILIES: dict[str, Callable[[Mapping[str, Any], int, str], dict[str, Any]]] = {
    "qwen3_next": _qwen3_next,
    "qwen3_5": _qwen3_next,
    "qwen3_5_moe": _qwen3_next,
    "kimi_linear": _kimi_linear,
    "nemotron_h": _nemotron_h,
    "falcon_h1": _falcon_h1,
    "granitemoehybrid": _granite_h,
}


def geometry_from_hf_config(cfg: Mapping[str, Any], *, tp_size: int, source: str) -> ModelGeometry:
    model_type = cfg.get("model_type")
    # Qwen3.5 nests the language model's keys in text_config.
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and str(model_type).startswith("qwen3_5"):
        cfg = {**text, "model_type": model_type}
    if model_type not in FAMILIES:
        raise ConfigError(
            f"{source}: model_type={model_type!r} is not a supported hybrid family "
            f"({', '.join(sorted(FAMILIES))}); describe it with a JSON model spec instead"
        )
    fields = FAMILIES[model_type](cfg, tp_size, source)
    context = cfg.get("max_position_embeddings")
    return ModelGeometry(
        name=f"{source} ({model_type})",
        context_len=context if isinstance(context, int) and context > 0 else None,
        **fields,
    )


def _shape(value: Any, what: str, source: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(
        isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value
    ):
        raise ConfigError(f"{source}: {what}={value!r} must be a list of positive integers")
    return tuple(value)


def geometry_from_model_spec(spec: Mapping[str, Any], *, source: str) -> ModelGeometry:
    """The small JSON model spec: shapes are per-rank (already divided by attention TP)."""
    L = _int(spec, "num_hidden_layers", source)
    ids = _get(spec, "linear_layer_ids", source)
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"{source}: linear_layer_ids={ids!r} must be a list of 0-based integers")
    convs = _get(spec, "conv_shapes", source)
    if not isinstance(convs, list) or not convs:
        raise ConfigError(f"{source}: conv_shapes={convs!r} must be a non-empty list of shapes")
    dtypes = spec.get("dtypes") or {}
    if not isinstance(dtypes, Mapping):
        raise ConfigError(f"{source}: dtypes must be an object like {{\"conv\": \"bfloat16\"}}")
    extra = spec.get("extra_per_slot_bytes", 0)
    if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
        raise ConfigError(f"{source}: extra_per_slot_bytes={extra!r} must be an integer >= 0")
    return ModelGeometry(
        name=str(spec.get("name") or source),
        num_hidden_layers=L,
        linear_layer_ids=tuple(sorted(ids)),
        conv_shapes=tuple(_shape(s, "conv_shapes[]", source) for s in convs),
        temporal_shape=_shape(_get(spec, "temporal_shape", source), "temporal_shape", source),
        conv_dtype=canonical_dtype(dtypes.get("conv", "bfloat16"), source=f"{source} dtypes.conv"),
        temporal_dtype=canonical_dtype(
            dtypes.get("temporal", "float32"), source=f"{source} dtypes.temporal"
        ),
        extra_per_slot_bytes=extra,
    )


def read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"--model-config {path}: no such file; pass the path to config.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ConfigError(f"--model-config {path}: cannot read it ({reason})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--model-config {path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"--model-config {path}: expected a JSON object, got {type(data).__name__}")
    return data


def load_geometry(
    *, model: str | None = None, model_config: str | Path | None = None, tp_size: int = 1
) -> ModelGeometry:
    """Resolve ``--model NAME`` or ``--model-config PATH`` (HF config or model spec) at ``tp_size``."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise LayoutError(f"--tp-size {tp_size} must be a positive integer")
    if model_config is not None:
        data = read_json(model_config)
        source = str(model_config)
        if "linear_layer_ids" in data:
            return geometry_from_model_spec(data, source=source)
        if "model_type" not in data:
            raise ConfigError(
                f"{source}: neither an HF config (no 'model_type') nor a model spec "
                "(no 'linear_layer_ids'); see README 'Model spec'"
            )
        return geometry_from_hf_config(data, tp_size=tp_size, source=source)
    name = model or DEFAULT_MODEL
    if name not in PRESETS:
        raise ConfigError(
            f"--model {name!r} is not a built-in preset ({', '.join(PRESETS)}); "
            "pass --model-config PATH for anything else"
        )
    return PRESETS[name](tp_size)
