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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checker.core.errors import ConfigError, json_kind, printable, shorten
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
class Keys:
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

    def section(self, key: str) -> Keys:
        value = self.get(key)
        if not isinstance(value, Mapping):
            raise self.error(key, value, f"must be a JSON object, not {json_kind(value)}; {FIX}")
        return Keys(value, self.source, f"{self.prefix}{key}.")

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


def bounded(value: int, *, expr: str, limit: int, source: str, what: str) -> int:
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
    bounded(
        intermediate_size + 2 * n_groups * state_size,
        expr=f"{n['intermediate_size']} + 2 * {n['n_groups']} * {n['state_size']}",
        limit=MAX_DIM,
        source=source,
        what="conv_dim",
    )
    bounded(
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


# Config keys of a model with recurrent or linear-attention state (a family newer than the list above).
_STATE_KEY_WORDS = ("mamba", "ssm", "linear_attn", "linear_num", "linear_conv", "kda", "lightning")


def looks_hybrid(data: Mapping[str, Any]) -> bool:
    """Whether a config's keys speak of a recurrent state (then a model spec can describe it)."""
    return any(isinstance(key, str) and any(w in key.lower() for w in _STATE_KEY_WORDS) for key in data)


# ---- the attention side: what SGLang's ModelConfig and the family's config class read ----


@dataclass(frozen=True)
class AttentionSpec:
    """A family's attention facts where its SGLang config class (0.5.23 ``sglang/srt/configs/``) decides
    them: the full-attention layers, and the class defaults of keys a config may leave out."""

    full_ids: Callable[[Keys, dict[str, Any]], tuple[int, ...]]
    context_default: int
    """The config class's ``max_position_embeddings`` default (what ``get_context_length`` falls back to)."""
    kv_heads_default: int | None = None
    head_dim_default: int | None = None
    """None: ``hidden_size // num_attention_heads`` (``ModelConfig._derive_model_shapes``)."""
    mla: bool = False
    nextn_default: int | None = None
    """The config class's ``num_nextn_predict_layers`` default (None: the class has no such field)."""


def not_linear_layers(_: Keys, fields: dict[str, Any]) -> tuple[int, ...]:
    # Qwen3-Next / Qwen3.5 (``layers_block_type`` from the interval) and Kimi-Linear (every layer that is not
    # KDA): the layers that are not linear attention.
    linear = set(fields["linear_layer_ids"])
    return tuple(i for i in range(fields["num_hidden_layers"]) if i not in linear)


CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
"""SGLang's ``get_context_length`` (0.5.23 ``utils/hf_transformers/common.py:668-694``): the first key set."""


def context_length(k: Keys, *, default: int) -> int:
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


def _auto_dtype(cfg: Mapping[str, Any], k: Keys) -> str:
    """``--dtype auto`` as ``ModelConfig`` resolves it (``_get_and_verify_dtype``): the text config's
    ``dtype``/``torch_dtype`` (the top-level one when it has none), float32 or unset becoming float16."""
    raw = k.data.get("dtype") or k.data.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype")
    name = _DTYPE_NAMES.get(raw.removeprefix("torch.")) if isinstance(raw, str) else None
    if raw is not None and name is None:
        raise ConfigError(f"{k.source}: torch_dtype={shorten(raw)} is not a dtype SGLang loads; {FIX}")
    return "float16" if name in (None, "float32") else name


def attention_geometry(
    cfg: Mapping[str, Any], k: Keys, spec: AttentionSpec, fields: dict[str, Any]
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


def _spec_shape(k: Keys, value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{k.source}: {what}={shorten(value)} must be a list of positive integers")
    check_shape(value, what=what, source=k.source)
    return tuple(value)


def geometry_from_model_spec(spec: Mapping[str, Any], *, source: str) -> ModelGeometry:
    """The small JSON model spec: shapes are per-rank (already divided by attention TP)."""
    k = Keys(spec, source)
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


def _spec_attention(k: Keys) -> AttentionGeometry:
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


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
