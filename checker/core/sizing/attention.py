"""The attention side of a hybrid model: what its KV cache holds per token (torch-free).

A stage's KV cell (bytes per token) is what SGLang's ``DefaultPoolConfigurator._compute_cell_size``
(0.5.23 ``model_executor/pool_configurator.py``; ``get_cell_size_per_token`` / ``profile_max_num_token``
before 0.5.11) charges: MLA models ``(kv_lora_rank + qk_rope_head_dim) x layers x elem``, the others
``max(1, kv_heads // attn_tp) x (head_dim + v_head_dim) x layers x elem``, over the full-attention layers
the stage counts (:mod:`checker.core.sizing.kv_pool` decides which). The facts here are the model's own (TP
1), as SGLang's ``ModelConfig`` and the family's config class read them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from checker.core.errors import ConfigError, shorten

MAX_HEADS = 2**16
"""KV heads, head dims and latent ranks of real models are at most a few thousand."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class AttentionGeometry:
    """The KV facts of one model at TP 1."""

    full_attention_layer_ids: tuple[int, ...]
    """0-based global ids of the layers with a KV cache, as the family's SGLang config class defines them
    (``full_attention_layer_ids``: Qwen3-Next / Qwen3.5 every ``full_attention_interval``-th layer,
    Kimi-Linear every layer that is not KDA, Nemotron-H the ``*`` of the pattern, Falcon-H1 every layer,
    Granite-4.0-H ``layer_types == "attention"``)."""
    num_kv_heads: int
    """The model's KV heads (``num_key_value_heads``); a rank holds ``max(1, kv_heads // attn_tp)``."""
    head_dim: int
    v_head_dim: int
    kv_lora_rank: int | None = None
    """MLA (Kimi-Linear, Kimi-K3): the latent KV width; with ``qk_rope_head_dim`` the whole cell."""
    qk_rope_head_dim: int | None = None
    dtype: str = "bfloat16"
    """The dtype ``--kv-cache-dtype auto`` resolves to: SGLang's ``ModelConfig.dtype`` under ``--dtype auto``
    (the config's ``dtype``/``torch_dtype``; float32 or unset becomes float16)."""
    architecture: str | None = None
    """The class SGLang loads (``architectures[0]``): whether its top-level object has ``start_layer``
    decides whether a stage counts its own layers (:data:`checker.core.releases.kv_support.STAGE_RANGE`)."""
    num_nextn_predict_layers: int | None = None
    """``ModelConfig.num_nextn_predict_layers`` of the target (None: the config class has none): the
    draft's layers of a path-less MTP/NEXTN draft from 0.5.20."""
    fp8_kv_checkpoint: bool = False
    """The checkpoint's ``quantization_config.kv_cache_quant_algo`` is FP8: ``auto`` stores the KV in FP8."""

    def __post_init__(self) -> None:
        for name in ("num_kv_heads", "head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not _is_int(value) or not 1 <= value <= MAX_HEADS:
                raise ConfigError(
                    f"attention {name}={shorten(value)} must be an integer in [1, {MAX_HEADS:,}]"
                )
        for name in ("kv_lora_rank", "qk_rope_head_dim"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_HEADS):
                raise ConfigError(
                    f"attention {name}={shorten(value)} must be an integer in [0, {MAX_HEADS:,}]"
                )
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ConfigError(
                "attention: kv_lora_rank and qk_rope_head_dim come together (an MLA model's KV cell is "
                "their sum); give both or neither"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"attention dtype={shorten(self.dtype)} is not one of {', '.join(DTYPE_BYTES)}")
        ids = self.full_attention_layer_ids
        if not all(_is_int(i) and i >= 0 for i in ids) or len(set(ids)) != len(ids):
            raise ConfigError(
                f"full_attention_layer_ids={shorten(list(ids))} must be distinct 0-based layer ids"
            )
        n = self.num_nextn_predict_layers
        if n is not None and (not _is_int(n) or not 0 <= n <= 1024):
            raise ConfigError(f"num_nextn_predict_layers={shorten(n)} must be an integer in [0, 1,024]")

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    def layers_in(self, start_layer: int, end_layer: int) -> int:
        """Full-attention layers in ``[start_layer, end_layer)``."""
        ids = sorted(self.full_attention_layer_ids)
        return bisect.bisect_left(ids, end_layer) - bisect.bisect_left(ids, start_layer)

    def kv_heads_per_rank(self, attn_tp: int) -> int:
        """``ModelConfig.get_num_kv_heads``: heads a TP cannot split are replicated, one per rank at least."""
        return max(1, self.num_kv_heads // attn_tp)

    def cell_bytes(self, layers: int, attn_tp: int, elem_bytes: int) -> int:
        """KV bytes per token of ``layers`` attention layers on one attention-TP rank."""
        if self.mla:
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            return (self.kv_lora_rank + self.qk_rope_head_dim) * layers * elem_bytes
        return self.kv_heads_per_rank(attn_tp) * (self.head_dim + self.v_head_dim) * layers * elem_bytes

    def describe(self) -> dict[str, object]:
        return {
            "full_attention_layer_ids": list(self.full_attention_layer_ids),
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "v_head_dim": self.v_head_dim,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "dtype": self.dtype,
            "architecture": self.architecture,
        }
