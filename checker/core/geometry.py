"""Model geometry: which layers are linear-attention ("mamba") layers and the bytes of one request's state.

Shapes here are per-rank shapes: already divided by the attention tensor-parallel size, as SGLang's
``mamba2_cache_params`` hands them to the pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from checker.core.errors import ConfigError, FlagError

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


def canonical_dtype(name: object, *, source: str) -> str:
    """Map a dtype spelling to its canonical torch name, or raise naming where it came from."""
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in _DTYPE_ALIASES:
        raise FlagError(
            f"{source}={name!r} is not a state dtype; use one of float32, bfloat16, float16"
        )
    return _DTYPE_ALIASES[key]


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

    def __post_init__(self) -> None:
        if self.num_hidden_layers <= 0:
            raise ConfigError(
                f"num_hidden_layers={self.num_hidden_layers} must be positive; check the model config"
            )
        ids = self.linear_layer_ids
        if not ids:
            raise ConfigError(
                f"{self.name}: the model has no linear-attention layers, so there is no state pool to "
                "check; this tool is for hybrid models (Qwen3-Next, Kimi-Linear, Nemotron-H, ...)"
            )
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ConfigError(f"{self.name}: linear_layer_ids repeats {dup}; list each layer once")
        bad = [i for i in ids if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ConfigError(
                f"{self.name}: linear_layer_ids {bad} out of range [0, {self.num_hidden_layers}); "
                "ids are 0-based and must be below num_hidden_layers"
            )
        for shape in (*self.conv_shapes, self.temporal_shape):
            if not shape or any(d <= 0 for d in shape):
                raise ConfigError(
                    f"{self.name}: state shape {list(shape)} must be non-empty with positive dims"
                )

    def with_dtypes(self, *, conv_dtype: str, temporal_dtype: str) -> ModelGeometry:
        from dataclasses import replace

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
        """``per_req`` of spec section 3: one request's state over the WHOLE model's linear layers."""
        return self.bytes_per_layer * self.num_linear_layers

    def linear_layers_in(self, start_layer: int, end_layer: int) -> int:
        return sum(1 for i in self.linear_layer_ids if start_layer <= i < end_layer)

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
        }


def exact_div(value: int, tp_size: int, *, what: str, source: str) -> int:
    """Divide a head or channel count by TP, as SGLang does, refusing a remainder."""
    if value % tp_size:
        raise ConfigError(
            f"{source}: {what}={value} is not divisible by --tp-size {tp_size}; "
            "choose a TP size that divides it"
        )
    return value // tp_size


def sglang_dtype_name(value: str, *, source: str, ignored_as: str) -> str:
    """A dtype from an env var or a config, spelt exactly as SGLang 0.5.23 matches it.

    SGLang looks these up in {float32, bfloat16, float16} exactly (case-sensitive, no aliases) and
    IGNORES anything else (``configs/mamba_utils.py mamba2_state_dtype``), so "bf16" there means the
    fallback dtype, not bfloat16. Deriving with the fallback would hide the user's intent, and deriving
    with bfloat16 would overstate the pool about 2x: refuse it instead.
    """
    if value in DTYPE_ITEMSIZE:
        return value
    raise FlagError(
        f"{source}={value!r} is not a dtype name SGLang accepts (exactly float32, bfloat16 or float16); "
        f"SGLang ignores it and uses {ignored_as}: spell it exactly"
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
    """
    conv = env.get("SGLANG_MAMBA_CONV_DTYPE")
    conv_dtype = (
        sglang_dtype_name(conv, source="SGLANG_MAMBA_CONV_DTYPE", ignored_as="bfloat16")
        if conv
        else geometry.conv_dtype
    )
    if mamba_ssm_dtype:
        # Our flag takes short spellings: SGLang's own --mamba-ssm-dtype has argparse choices, so no
        # deployment runs a misspelt one. The env vars and the config have no such guard (below).
        temporal = canonical_dtype(mamba_ssm_dtype, source="--mamba-ssm-dtype")
    elif env.get("SGLANG_MAMBA_SSM_DTYPE"):
        temporal = sglang_dtype_name(
            env["SGLANG_MAMBA_SSM_DTYPE"], source="SGLANG_MAMBA_SSM_DTYPE",
            ignored_as="the config's or float32",
        )
    elif geometry.config_ssm_dtype:
        temporal = sglang_dtype_name(
            geometry.config_ssm_dtype, source="config mamba_ssm_dtype", ignored_as="float32"
        )
    else:
        temporal = geometry.temporal_dtype
    return geometry.with_dtypes(conv_dtype=conv_dtype, temporal_dtype=temporal)
