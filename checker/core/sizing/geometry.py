"""Model geometry: which layers are linear-attention ("mamba") layers and the bytes of one request's state.

Shapes here are per-rank shapes: already divided by the attention tensor-parallel size, as SGLang's
``mamba2_cache_params`` hands them to the pool.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from checker.core.errors import CheckerInputError, ConfigError, FlagError, json_kind, shorten
from checker.core.releases.family_facts import FamilyTable
from checker.core.sizing.attention import AttentionGeometry

# ---- limits: sizes no real model reaches, refused up front so any input costs bounded time and memory ----
# The largest hybrid models have 100-200 decoder layers (Nemotron-H-56B: 118) and the deepest dense ones
# about 126 (Llama-3.1-405B). Everything downstream walks the layers (ids, stage slices), so 10,000 keeps
# that work in milliseconds while leaving 50x headroom. (10**9 layers took minutes and 6.7 GB per rank.)
MAX_LAYERS = 10_000
# One head count, head dim, state size, channel count or kernel width from a config, and one dim of a
# per-rank state shape. The widest real ones are about 2 * 10**4 (Nemotron-H-56B's conv_dim 18,432 at TP 1,
# hidden sizes up to 16,384); 2**20 is 50x that.
MAX_DIM = 2**20
# Elements of ONE per-rank state of one layer. Real temporal states hold 2**20 (Qwen3-Next's
# 32 x 128 x 128 fp32 is 8 MiB); 2**32 elements is 16 GiB per layer per request.
MAX_STATE_ELEMENTS = 2**32
MAX_CONV_STATES = 16
"""Conv states per layer: SGLang's Mamba2 and KDA shapes hold one; a spec may list a few."""
MAX_SHAPE_RANK = 8
"""Dims of one state shape: real ones have 2 (conv) or 3 (temporal)."""
MAX_EXTRA_PER_SLOT_BYTES = 2**40
# Context lengths top out near 10**7 tokens (Llama-4-Scout: 10M); 2**30 is 100x that.
MAX_CONTEXT_LEN = 2**30
# Together these keep per_req_bytes below 2**52 (17 states x 2**32 elements x 4 bytes x 10,000 layers),
# so every byte count is an exact float64 (SGLang sizes the pool in float arithmetic) and fits int64 (the
# exchanged rank rows).

# Names SGLang accepts for the state dtypes (SGLANG_MAMBA_CONV_DTYPE, SGLANG_MAMBA_SSM_DTYPE,
# --mamba-ssm-dtype) plus the short spellings people type; value = canonical torch name.
_DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}
DTYPE_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_CONV_DTYPE = "bfloat16"
DEFAULT_TEMPORAL_DTYPE = "float32"


def canonical_dtype(name: object, *, source: str, error: type[CheckerInputError] = FlagError) -> str:
    """Map a dtype spelling to its canonical torch name, or raise naming where it came from.

    An empty string is an error, not "unset": the caller decides what unset means before calling.
    """
    if not isinstance(name, str):
        raise error(
            f"{source}={shorten(name)} is {json_kind(name)}, not a dtype name; "
            "use one of float32, bfloat16, float16"
        )
    if not name.strip():
        raise error(
            f"{source}={name!r} is empty; use one of float32, bfloat16, float16, "
            "or leave it out for the default"
        )
    key = name.strip().lower().removeprefix("torch.")
    if key not in _DTYPE_ALIASES:
        raise error(f"{source}={shorten(name)} is not a state dtype; use one of float32, bfloat16, float16")
    return _DTYPE_ALIASES[key]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class ModelGeometry:
    """The layer layout and per-rank state shapes of one hybrid model at one TP size."""

    name: str
    """Where the geometry came from (preset name or config path), for reports."""
    num_hidden_layers: int
    """L: every decoder layer, attention and linear alike."""
    linear_layer_ids: tuple[int, ...]
    """0-based global ids of the linear-attention layers, sorted."""
    conv_shapes: tuple[tuple[int, ...], ...]
    """Per-rank conv-state shapes of one layer (one entry per conv state)."""
    temporal_shape: tuple[int, ...]
    """Per-rank temporal (SSM / recurrent) state shape of one layer."""
    conv_dtype: str = DEFAULT_CONV_DTYPE
    temporal_dtype: str = DEFAULT_TEMPORAL_DTYPE
    extra_per_slot_bytes: int = 0
    """Per-slot extra state size when a model configures one; charged with the same scale."""
    context_len: int | None = None
    """The model's own context length (max_position_embeddings) when the config says it."""
    config_ssm_dtype: str | None = field(default=None, compare=False)
    """The config's ``mamba_ssm_dtype`` for families whose SGLang code honours it."""
    source_digest: str = field(default="", compare=False)
    """A digest of the model's own definition (its config.json's content, or the preset's TP-1 shapes), set
    by :func:`checker.core.sizing.models.load_geometry`: what ranks compare as the ``model`` input. It leaves
    out the TP size and the resolved dtypes, which are inputs of their own (--tp-size, SGLANG_MAMBA_*_DTYPE,
    --mamba-ssm-dtype), so a rank that sets one of them differs in that input, not in the model."""
    attention: AttentionGeometry | None = None
    """The KV cache's facts 
    (:class:`checker.core.sizing.attention.AttentionGeometry`); None for a model spec that
    gives none, whose KV pool the checker cannot size (it then needs ``--token-capacity``)."""
    family: str | None = None
    """The model family as SGLang tells it apart: the HF config's ``model_type`` ("qwen3_next",
    "nemotron_h", ...), the preset's, or a model spec's optional ``model_type``; None when unknown."""
    families: FamilyTable = field(default=FamilyTable(), compare=False)
    """Every family's facts as the releases' sizing reads them
    (:mod:`checker.core.releases.family_facts`), set by the registry that read the geometry
    (``checker.families``); the sizing asks them by ``family``. A geometry built without them is of no
    family a release tells apart."""

    def __post_init__(self) -> None:
        L = self.num_hidden_layers
        if not _is_int(L) or not 1 <= L <= MAX_LAYERS:
            raise ConfigError(
                f"{self.name}: num_hidden_layers={shorten(L)} must be an integer in [1, {MAX_LAYERS:,}] "
                "(the largest real models have a few hundred layers); check the model config"
            )
        ids = self.linear_layer_ids
        if not ids:
            raise ConfigError(
                f"{self.name}: the model has no linear-attention layers, so there is no state pool to "
                "check; this tool is for hybrid models (Qwen3-Next, Kimi-Linear, Nemotron-H, ...)"
            )
        if not all(_is_int(i) for i in ids):
            raise ConfigError(f"{self.name}: linear_layer_ids={shorten(ids)} must all be integers")
        bad = sorted({i for i in ids if not 0 <= i < L})
        if bad:
            raise ConfigError(
                f"{self.name}: linear_layer_ids {shorten(bad)} out of range [0, {L}); "
                "ids are 0-based and must be below num_hidden_layers"
            )
        if len(ids) > L or len(set(ids)) != len(ids):
            dup = sorted(i for i, n in Counter(ids).items() if n > 1)
            raise ConfigError(f"{self.name}: linear_layer_ids repeats {shorten(dup)}; list each layer once")
        if len(self.conv_shapes) > MAX_CONV_STATES:
            raise ConfigError(
                f"{self.name}: {len(self.conv_shapes):,} conv states per layer, above {MAX_CONV_STATES} "
                "(real models have one); check the model spec's conv_shapes"
            )
        for shape in (*self.conv_shapes, self.temporal_shape):
            check_shape(shape, what="state shape", source=self.name)
        for dtype in (self.conv_dtype, self.temporal_dtype):
            if not isinstance(dtype, str) or dtype not in DTYPE_ITEMSIZE:
                raise ConfigError(
                    f"{self.name}: state dtype {shorten(dtype)} is not one of {', '.join(DTYPE_ITEMSIZE)}"
                )
        x = self.extra_per_slot_bytes
        if not _is_int(x) or not 0 <= x <= MAX_EXTRA_PER_SLOT_BYTES:
            raise ConfigError(
                f"{self.name}: extra_per_slot_bytes={shorten(x)} must be an integer in "
                f"[0, {MAX_EXTRA_PER_SLOT_BYTES:,}] (1 TiB per slot)"
            )
        f = self.family
        if f is not None and (not isinstance(f, str) or not f.strip() or len(f) > 200):
            raise ConfigError(f"{self.name}: model_type={shorten(f)} must be a non-empty string")
        a = self.attention
        if a is not None:
            past = sorted(i for i in a.full_attention_layer_ids if i >= L)
            if past:
                raise ConfigError(
                    f"{self.name}: full-attention layer ids {shorten(past)} out of range [0, {L}); ids are "
                    "0-based and must be below num_hidden_layers"
                )
        c = self.context_len
        if c is not None and (not _is_int(c) or not 1 <= c <= MAX_CONTEXT_LEN):
            raise ConfigError(
                f"{self.name}: max_position_embeddings={shorten(c)} must be an integer in "
                f"[1, {MAX_CONTEXT_LEN:,}]; check the model config"
            )

    def with_dtypes(self, *, conv_dtype: str, temporal_dtype: str) -> ModelGeometry:
        return replace(self, conv_dtype=conv_dtype, temporal_dtype=temporal_dtype)

    @property
    def num_linear_layers(self) -> int:
        return len(self.linear_layer_ids)

    @property
    def bytes_per_layer(self) -> int:
        """State bytes one request holds in one linear layer: every conv state plus the temporal one."""
        conv = sum(math.prod(s) for s in self.conv_shapes) * DTYPE_ITEMSIZE[self.conv_dtype]
        return conv + math.prod(self.temporal_shape) * DTYPE_ITEMSIZE[self.temporal_dtype]

    @property
    def per_req_bytes(self) -> int:
        """SGLang's ``mamba_cache_per_req`` (sglang/srt/configs/mamba_utils.py
        ``BaseLinearStateParams``): one request's state over the WHOLE model's linear layers."""
        return self.bytes_per_layer * self.num_linear_layers

    @cached_property
    def _sorted_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self.linear_layer_ids))

    def linear_layers_in(self, start_layer: int, end_layer: int) -> int:
        """Linear layers in ``[start_layer, end_layer)``; a bisection, as every stage asks for every stage."""
        ids = self._sorted_ids
        return max(0, bisect.bisect_left(ids, end_layer) - bisect.bisect_left(ids, start_layer))

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "num_hidden_layers": self.num_hidden_layers,
            "num_linear_layers": self.num_linear_layers,
            "linear_layer_ids": list(self.linear_layer_ids),
            "conv_shapes": [list(s) for s in self.conv_shapes],
            "temporal_shape": list(self.temporal_shape),
            "conv_dtype": self.conv_dtype,
            "temporal_dtype": self.temporal_dtype,
            "extra_per_slot_bytes": self.extra_per_slot_bytes,
            "bytes_per_layer": self.bytes_per_layer,
            "per_req_bytes": self.per_req_bytes,
            "context_len": self.context_len,
            "attention": None if self.attention is None else self.attention.describe(),
        }


def check_shape(shape: object, *, what: str, source: str) -> None:
    """A state shape: 1-8 positive integer dims, each at most MAX_DIM, at most MAX_STATE_ELEMENTS in all."""
    if (
        not isinstance(shape, (tuple, list))
        or not 1 <= len(shape) <= MAX_SHAPE_RANK
        or not all(_is_int(d) and d > 0 for d in shape)
    ):
        raise ConfigError(
            f"{source}: {what} {shorten(shape)} must be 1-{MAX_SHAPE_RANK} positive integer dims; "
            "check the model spec or config"
        )
    if max(shape) > MAX_DIM or math.prod(shape) > MAX_STATE_ELEMENTS:
        raise ConfigError(
            f"{source}: {what} {list(shape)} holds {math.prod(shape):,} elements per layer; the limit is "
            f"{MAX_DIM:,} per dim and {MAX_STATE_ELEMENTS:,} in all (real models hold about 10**6); "
            "check the model spec or config"
        )


def exact_div(value: int, tp_size: int, *, what: str, source: str) -> int:
    """Divide a head or channel count by TP, as SGLang does, refusing a remainder."""
    if value % tp_size:
        raise ConfigError(
            f"{source}: {what}={value} is not divisible by --tp-size {tp_size}; "
            "choose a TP size that divides it"
        )
    return value // tp_size


def sglang_dtype_name(
    value: str, *, source: str, ignored_as: str, error: type[CheckerInputError] = FlagError
) -> str:
    """A dtype from an env var or a config, spelt exactly as SGLang 0.5.23 matches it.

    SGLang looks these up in {float32, bfloat16, float16} exactly (case-sensitive, no aliases) and
    IGNORES anything else (``configs/mamba_utils.py mamba2_state_dtype``), so "bf16" there means the
    fallback dtype, not bfloat16. Deriving with the fallback would hide the user's intent, and deriving
    with bfloat16 would overstate the pool about 2x: refuse it instead.
    """
    if isinstance(value, str) and value in DTYPE_ITEMSIZE:
        return value
    raise error(
        f"{source}={shorten(value)} is not a dtype name SGLang accepts (exactly float32, bfloat16 or "
        f"float16); SGLang ignores it and uses {ignored_as}: spell it exactly"
    )


def resolve_dtypes(
    geometry: ModelGeometry,
    *,
    env: Mapping[str, str],
    mamba_ssm_dtype: str | None = None,
) -> ModelGeometry:
    """Apply SGLang's dtype precedence: --mamba-ssm-dtype > SGLANG_MAMBA_SSM_DTYPE > config > default.

    ``--mamba-ssm-dtype`` is how the server sets SGLANG_MAMBA_SSM_DTYPE, so the flag wins over the env.
    The conv dtype comes only from SGLANG_MAMBA_CONV_DTYPE (default bfloat16).

    An env var set to "" counts as unset, as in SGLang (``mamba2_state_dtype`` finds "" in no dtype map
    and keeps its fallback). The flag and the config have no such reading: "" there is an error.
    """
    conv = env.get("SGLANG_MAMBA_CONV_DTYPE")
    conv_dtype = (
        sglang_dtype_name(conv, source="SGLANG_MAMBA_CONV_DTYPE", ignored_as="bfloat16")
        if conv
        else geometry.conv_dtype
    )
    if mamba_ssm_dtype is not None:
        # Our flag takes short spellings: SGLang's own --mamba-ssm-dtype has argparse choices, so no
        # deployment runs a misspelt one. The env vars and the config have no such guard (below).
        temporal = canonical_dtype(mamba_ssm_dtype, source="--mamba-ssm-dtype")
    elif env.get("SGLANG_MAMBA_SSM_DTYPE"):
        temporal = sglang_dtype_name(
            env["SGLANG_MAMBA_SSM_DTYPE"],
            source="SGLANG_MAMBA_SSM_DTYPE",
            ignored_as="the config's or float32",
        )
    elif geometry.config_ssm_dtype is not None:
        temporal = sglang_dtype_name(
            geometry.config_ssm_dtype,
            source=f"{geometry.name}: mamba_ssm_dtype",
            ignored_as="float32",
            error=ConfigError,
        )
    else:
        temporal = geometry.temporal_dtype
    return geometry.with_dtypes(conv_dtype=conv_dtype, temporal_dtype=temporal)
