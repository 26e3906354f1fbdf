"""Each rank's weights as its SGLang release's model class holds them (torch-free).

SGLang measures a rank's weights as the free memory lost around ``load_model`` (0.5.23
``model_executor/model_runner.py:1272,1363``): every parameter and buffer of the rank's model class. The
class decides the bytes, not the checkpoint: this module lists the parameters the release's class builds
for one rank from the model's ``config.json`` (what SGLang builds it from), each with its per-rank shape
and the dtype the class holds it in, and sums them. The rules, from the classes' code:

* **Stage.** A stage builds only its own layers (``make_layers`` / ``get_pp_indices`` with
  ``SGLANG_PP_LAYER_PARTITION``, the release's remainder rule; ``PPMissingLayer`` elsewhere), the first
  stage the embedding, the last the final norm and the head. A tied head is the embedding's own tensor
  at pp 1 and a separate copy at pp > 1 (every class here allocates ``lm_head`` on the last stage then).
* **Tensor parallelism per weight kind.** Column-parallel weights split their output rows, row-parallel
  ones their input columns, norms and routers are replicated; a vocabulary is padded to a multiple of 64
  (times the group when 64-padding does not divide) before it is split (``vocab_parallel_embedding.py``);
  KV heads are replicated when there are fewer of them than the group; a Mamba2 group count that the
  group does not divide is replicated (``extra_groups_for_head_shards``). Which group: attention weights
  the attention-TP group (the TP group divided by attention DP), MLPs the whole TP group, experts the MoE
  TP group (the TP group divided by ``--ep-size``), each family as its class says.
* **Experts.** Each EP rank holds ``num_experts / ep_size`` experts whose intermediate size is split by
  the MoE TP size; the router gate is replicated.
* **Held dtypes.** Parameters are built in the model dtype (``--dtype``, else the config's), except where
  the class says otherwise: linear-attention ``A_log`` (and Kimi's ``dt_bias`` and conv weights), Mamba
  ``A``, Falcon-H1's ``lm_head`` (``.number()``) in float32, some gated norms in the config's dtype.
* **Left out.** ``mtp.*`` tensors (the target model skips them), a vision tower under
  ``--language-model-only``.

What the logged figure adds to the parameters (buffers such as an fp32 RoPE cache, copies a class makes
after loading, what the allocator rounds up) is :data:`MARGIN_BYTES`, stated apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from checker.core.errors import ConfigError, FlagError, LayoutError, json_kind, shorten
from checker.core.releases.model_support import pipeline_status
from checker.core.sizing.models import FALCON_H1_D_SSM, GRANITE_LAYER_NAMES
from checker.core.sizing.partition import stage_bounds, stage_partition

GIB = 2**30
DTYPE_BYTES: Mapping[str, int] = {
    "int64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float64": 8,
    "float8_e4m3fn": 1,
}
_DTYPE_NAMES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "float64": "float64",
}
VOCAB_PADDING = 64
"""``DEFAULT_VOCAB_PADDING_SIZE`` (``layers/vocab_parallel_embedding.py``)."""

PARTS = ("embed", "layers", "head", "vision")
"""Where a rank's parameter bytes sit: the embedding (first stage), its layers, the final norm and the
head (last stage), a vision tower."""
EXTRA_PARTS = ("buffers", "copies")
"""What the class holds beside its parameters: registered buffers, tensors derived after loading."""


# ---- the layout --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WeightsLayout:
    """The launch flags a rank's weights depend on. ``tp_size`` is the attention-TP width (the
    checker's convention); SGLang's TP group is ``tp_size * dp_size``."""

    pp_size: int
    tp_size: int
    dp_size: int = 1
    """Attention DP size (``--dp-size`` with ``--enable-dp-attention``)."""
    ep_size: int = 1
    partition_env: str | None = None
    enable_dp_lm_head: bool = False
    language_model_only: bool = False
    dtype: str = "auto"
    disable_shared_experts_fusion: bool = False
    moe_runner_backend: str = "auto"
    """``--moe-runner-backend``: the expert weights are modelled as ``auto``/``triton`` hold them (other
    backends pad or re-lay them: refused for a model with experts)."""
    builds_all_layers: bool = False
    """The release builds every layer on every stage (Qwen3.5 on 0.5.9, Nemotron-H 0.5.3.post1-0.5.7):
    from ``checker.core`` startup rules once they land; until then the caller says."""

    def __post_init__(self) -> None:
        for name in ("pp_size", "tp_size", "dp_size", "ep_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LayoutError(f"--{name.replace('_', '-')} {shorten(v)} must be a positive integer")
        if self.tp_group % self.ep_size:
            raise LayoutError(
                f"--ep-size {self.ep_size} must divide the TP group ({self.tp_group}); SGLang splits the "
                "TP group into EP x MoE-TP ranks"
            )

    @property
    def tp_group(self) -> int:
        return self.tp_size * self.dp_size

    @property
    def world_size(self) -> int:
        return self.pp_size * self.tp_group


@dataclass(frozen=True)
class Place:
    """One rank's place, as SGLang derives it (0.5.23 ``runtime_context.derive_spawn_ranks``): the TP
    group is contiguous, PP strided by it; attention TP is the fastest-changing part of the TP group; the
    MoE ranks split it into EP x MoE-TP."""

    rank: int
    pp_rank: int
    pp_size: int
    tp_rank: int
    tp_size: int
    attn_tp_rank: int
    attn_tp_size: int
    attn_dp_size: int
    moe_ep_rank: int
    moe_ep_size: int
    moe_tp_rank: int
    moe_tp_size: int
    start_layer: int
    end_layer: int

    @property
    def first(self) -> bool:
        return self.pp_rank == 0

    @property
    def last(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def size(self, group: str) -> int:
        return {
            "tp": self.tp_size,
            "attn_tp": self.attn_tp_size,
            "moe_tp": self.moe_tp_size,
            "none": 1,
        }[group]

    def holds(self, layer: int) -> bool:
        return self.start_layer <= layer < self.end_layer


def release_partition(
    release: str | None, num_hidden_layers: int, pp_size: int, partition_env: str | None
) -> tuple[int, ...]:
    """Layers per stage as the release's ``get_pp_indices`` gives them. 0.5.2-0.5.5.post3 give the last
    stage the whole remainder (``distributed/utils.py``: ``if pp_rank == pp_size - 1: end_layer =
    num_hidden_layers``); 0.5.6 on spread it over the last ``L % P`` stages."""
    parts = stage_partition(num_hidden_layers, pp_size, partition_env)
    if partition_env is not None and pp_size > 1:
        return parts
    if release is not None and _before(release, "0.5.6"):
        base = num_hidden_layers // pp_size
        return tuple(
            base if k < pp_size - 1 else num_hidden_layers - base * (pp_size - 1) for k in range(pp_size)
        )
    return parts


def places(
    layout: WeightsLayout, num_hidden_layers: int, release: str | None, *, all_layers: bool = False
) -> list[Place]:
    """Every rank's place in the layout, in world-rank order; ``all_layers``: every stage builds every
    layer (the release's class ignores the stage)."""
    parts = release_partition(release, num_hidden_layers, layout.pp_size, layout.partition_env)
    bounds = stage_bounds(parts)
    group = layout.tp_group
    moe_tp = group // layout.ep_size
    out = []
    for rank in range(layout.world_size):
        pp_rank, tp_rank = divmod(rank, group)
        start, end = (0, num_hidden_layers) if layout.builds_all_layers or all_layers else bounds[pp_rank]
        out.append(
            Place(
                rank=rank,
                pp_rank=pp_rank,
                pp_size=layout.pp_size,
                tp_rank=tp_rank,
                tp_size=group,
                attn_tp_rank=tp_rank % layout.tp_size,
                attn_tp_size=layout.tp_size,
                attn_dp_size=layout.dp_size,
                moe_ep_rank=tp_rank // moe_tp,
                moe_ep_size=layout.ep_size,
                moe_tp_rank=tp_rank % moe_tp,
                moe_tp_size=moe_tp,
                start_layer=start,
                end_layer=end,
            )
        )
    return out


# ---- releases ----------------------------------------------------------------------------------------


def _version(release: str) -> tuple[int, ...]:
    nums = [int(x) for x in re.findall(r"\d+", release)]
    return tuple(nums + [0] * (5 - len(nums)))


def _before(release: str, other: str) -> bool:
    return _version(release) < _version(other)


# ---- parameters --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One parameter of a rank's model, as its class holds it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    part: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


def _div(n: int, k: int, what: str) -> int:
    if n % k:
        raise LayoutError(
            f"{what} = {n} is not divisible by the group it is split over ({k}); SGLang refuses this "
            "layout at startup: use a TP size that divides it"
        )
    return n // k


def vocab_rows(vocab: int, size: int) -> int:
    """Rows of a vocabulary-parallel embedding or head on one rank (``VocabParallelEmbedding``):
    padded to 64, or to 64 x size when that does not split evenly."""
    pad = VOCAB_PADDING

    def padded(n: int, to: int) -> int:
        return -(-n // to) * to

    if padded(vocab, pad) % size:
        pad *= size
    return padded(vocab, pad) // size


def kv_heads_per_rank(kv_heads: int, size: int) -> int:
    """KV heads one rank holds: a share, or one replicated head when there are fewer than ranks."""
    if kv_heads >= size:
        return _div(kv_heads, size, "num_key_value_heads")
    if size % kv_heads:
        raise LayoutError(
            f"num_key_value_heads = {kv_heads} must divide the attention TP size {size} (SGLang replicates "
            "KV heads only in whole copies)"
        )
    return 1


class _Builder:
    """Collects one rank's parameters."""

    def __init__(self, place: Place, dtype: str, release: str = "0.5.23") -> None:
        self.p = place
        self.dtype = dtype
        self.release = release
        self.params: list[Param] = []

    def add(self, name: str, shape: Sequence[int], *, part: str, dtype: str | None = None) -> None:
        self.params.append(Param(name, tuple(int(d) for d in shape), dtype or self.dtype, part))

    def buffer(self, name: str, shape: Sequence[int], dtype: str | None = None) -> None:
        """A buffer the class registers (a RoPE cache, a norm's derived weight): memory, not a parameter."""
        self.add(name, shape, part="buffers", dtype=dtype)

    def copy(self, name: str, shape: Sequence[int], dtype: str | None = None) -> None:
        """A tensor the class derives from loaded weights and keeps (``post_load_weights``)."""
        self.add(name, shape, part="copies", dtype=dtype)

    def params_named(self, name: str) -> Param:
        return next(prm for prm in reversed(self.params) if prm.name == name)

    def rope(self, max_position: int, rotary_dim: int) -> None:
        """``get_rope``'s ``cos_sin_cache`` [max_position, rotary_dim] float32 (``SGLANG_ROPE_CACHE_FP32``
        on CUDA); one per distinct setting, shared by every layer (``rotary_embedding/factory.py``)."""
        key = f"rope.{max_position}.{rotary_dim}"
        if any(prm.name == key for prm in self.params):
            return
        self.buffer(key, (max_position, rotary_dim), "float32")

    # column- and row-parallel linears: (out, in) weights
    def column(
        self,
        name: str,
        out: int,
        inp: int,
        group: str,
        *,
        part: str = "layers",
        bias: bool = False,
        dtype: str | None = None,
    ) -> None:
        rows = _div(out, self.p.size(group), f"{name} output size")
        self.add(f"{name}.weight", (rows, inp), part=part, dtype=dtype)
        if bias:
            self.add(f"{name}.bias", (rows,), part=part, dtype=dtype)

    def row(
        self, name: str, out: int, inp: int, group: str, *, part: str = "layers", bias: bool = False
    ) -> None:
        cols = _div(inp, self.p.size(group), f"{name} input size")
        self.add(f"{name}.weight", (out, cols), part=part)
        if bias:
            self.add(f"{name}.bias", (out,), part=part)

    def replicated(
        self,
        name: str,
        out: int,
        inp: int,
        *,
        part: str = "layers",
        bias: bool = False,
        dtype: str | None = None,
    ) -> None:
        self.add(f"{name}.weight", (out, inp), part=part, dtype=dtype)
        if bias:
            self.add(f"{name}.bias", (out,), part=part, dtype=dtype)

    def norm(
        self, name: str, dim: int, *, part: str = "layers", bias: bool = False, dtype: str | None = None
    ) -> None:
        self.add(f"{name}.weight", (dim,), part=part, dtype=dtype)
        if bias:
            self.add(f"{name}.bias", (dim,), part=part, dtype=dtype)

    def vocab(
        self, name: str, vocab: int, hidden: int, group: str, *, part: str, dtype: str | None = None
    ) -> None:
        self.add(f"{name}.weight", (vocab_rows(vocab, self.p.size(group)), hidden), part=part, dtype=dtype)

    def qkv(
        self,
        name: str,
        hidden: int,
        head_dim: int,
        heads: int,
        kv_heads: int,
        group: str,
        *,
        bias: bool = False,
        v_head_dim: int | None = None,
    ) -> None:
        size = self.p.size(group)
        q = _div(heads, size, "num_attention_heads") * head_dim
        kv = kv_heads_per_rank(kv_heads, size)
        out = q + kv * head_dim + kv * (v_head_dim or head_dim)
        self.add(f"{name}.weight", (out, hidden), part="layers")
        if bias:
            self.add(f"{name}.bias", (out,), part="layers")

    def experts(
        self,
        name: str,
        num_experts: int,
        hidden: int,
        intermediate: int,
        *,
        shared_slots: int = 0,
        gated: bool = True,
    ) -> None:
        """A FusedMoE's ``w13``/``w2``: the EP rank's share of the routed experts (plus fused shared-expert
        slots, held by every rank), intermediate split by the MoE TP size (``fused_moe_triton/layer.py``)."""
        local = _div(num_experts, self.p.moe_ep_size, "num_experts") + shared_slots
        inter = _div(intermediate, self.p.moe_tp_size, "moe_intermediate_size")
        self.add(f"{name}.w13_weight", (local, (2 if gated else 1) * inter, hidden), part="layers")
        self.add(f"{name}.w2_weight", (local, hidden, inter), part="layers")


# ---- the model's config -----------------------------------------------------------------------------


class _Config:
    """A config.json section with the defaults of SGLang's config class for keys a checkpoint may leave
    out. Every key read is type-checked: a wrong value is one ConfigError line naming the key."""

    def __init__(self, data: Mapping[str, Any], source: str, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix

    def _error(self, key: str, value: Any, rule: str) -> ConfigError:
        return ConfigError(
            f"{self.source}: {self.prefix}{key}={shorten(value)} {rule}; fix it in the model config"
        )

    def integer(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.data.get(key, default)
        if value is None:
            value = default
        if value is None:
            raise ConfigError(
                f"{self.source}: config key {self.prefix}{key!r} is missing; the weights need it"
            )
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(key, value, f"must be an integer, not {json_kind(value)}")
        if not minimum <= value <= 2**40:
            raise self._error(key, value, f"must be an integer >= {minimum}")
        return value

    def opt_int(self, key: str) -> int | None:
        if self.data.get(key) is None:
            return None
        return self.integer(key)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._error(key, value, f"must be true or false, not {json_kind(value)}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.data.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise self._error(key, value, "must be a positive number")
        return float(value)

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._error(key, value, f"must be a string, not {json_kind(value)}")
        return value

    def array(self, key: str) -> list[Any] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self._error(key, value, f"must be a list, not {json_kind(value)}")
        return value

    def section(self, key: str) -> _Config:
        value = self.data.get(key)
        if value is None:
            return _Config({}, self.source, f"{self.prefix}{key}.")
        if not isinstance(value, Mapping):
            raise self._error(key, value, f"must be a JSON object, not {json_kind(value)}")
        return _Config(value, self.source, f"{self.prefix}{key}.")


def config_dtype(cfg: _Config) -> str:
    """The config's dtype, as ``ModelConfig`` reads it (``dtype`` or ``torch_dtype``; float32 when unset)."""
    raw = cfg.data.get("dtype") or cfg.data.get("torch_dtype")
    if raw is None:
        return "float32"
    if not isinstance(raw, str) or raw.lower().removeprefix("torch.") not in _DTYPE_NAMES:
        raise ConfigError(f"{cfg.source}: {cfg.prefix}torch_dtype={shorten(raw)} is not a dtype SGLang loads")
    return _DTYPE_NAMES[raw.lower().removeprefix("torch.")]


def model_dtype(cfg: _Config, flag: str) -> str:
    """``ModelConfig.dtype`` (``configs/model_config.py`` ``_get_and_verify_dtype``): ``--dtype auto``
    keeps the config's dtype, except float32, which becomes float16 (bfloat16 for Gemma)."""
    conf = config_dtype(cfg)
    f = flag.lower()
    if f == "auto":
        return "float16" if conf == "float32" else conf
    if f not in _DTYPE_NAMES:
        raise FlagError(
            f"--dtype {shorten(flag)} is not one SGLang accepts (auto, bfloat16, float16, float32)"
        )
    return _DTYPE_NAMES[f]


# ---- families -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """How one model family's class builds a rank."""

    name: str
    model_types: tuple[str, ...]
    text_section: str | None
    num_layers: Callable[[_Config], int]
    build: Callable[[_Builder, _Config, _Config, WeightsLayout, str], None]
    """(builder, the whole config, the text config, the layout, the release)"""
    notes: tuple[str, ...] = field(default=())


def _embed_and_head(
    b: _Builder,
    vocab: int,
    hidden: int,
    *,
    tied: bool,
    embed_group: str,
    head_group: str,
    embed_name: str = "model.embed_tokens",
    head_dtype: str | None = None,
    first_only: bool = True,
) -> None:
    p = b.p
    if p.first or not first_only:
        b.vocab(embed_name, vocab, hidden, embed_group, part="embed", dtype=head_dtype if tied else None)
    if p.last:
        if tied and p.pp_size == 1:
            return  # the head is the embedding's own tensor
        b.vocab("lm_head", vocab, hidden, head_group, part="head", dtype=head_dtype)


def _dp_embed_group(layout: WeightsLayout, release: str, *, split_from: str) -> str:
    """The embedding's group under attention DP where a release moved from replicating it
    (``enable_tp=not is_dp_attention_enabled()``) to splitting it over attention TP
    (``use_attn_tp_group=is_dp_attention_enabled()``) at ``split_from``; the TP group without DP."""
    if layout.dp_size == 1:
        return "tp"
    return "none" if _before(release, split_from) else "attn_tp"


# -- Qwen3-Next and Qwen3.5 ------------------------------------------------------------------------------


def _qwen_layer_types(t: _Config) -> list[str]:
    """``layers_block_type``: layer i is full attention when ``(i + 1) % full_attention_interval == 0``
    (``configs/qwen3_next.py``); Qwen3.5 reads ``layer_types`` when given."""
    L = t.integer("num_hidden_layers", 48)
    types = t.array("layer_types")
    if types is not None and t.prefix:  # Qwen3.5: the text config's own list
        if len(types) != L or any(x not in ("linear_attention", "full_attention") for x in types):
            raise ConfigError(
                f"{t.source}: {t.prefix}layer_types must list linear_attention/full_attention for each of "
                f"the {L} layers; fix it in the model config"
            )
        return ["attention" if x == "full_attention" else "linear_attention" for x in types]
    interval = t.integer("full_attention_interval", 4)
    return ["attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(L)]


def _gated_delta_net(
    b: _Builder, t: _Config, i: int, *, norm_dtype: str, a_log_dtype: str = "float32"
) -> None:
    H = t.integer("hidden_size")
    nk, nv = t.integer("linear_num_key_heads", 16), t.integer("linear_num_value_heads", 32)
    dk, dv = t.integer("linear_key_head_dim", 128), t.integer("linear_value_head_dim", 128)
    K = t.integer("linear_conv_kernel_dim", 4)
    key_dim, value_dim = nk * dk, nv * dv
    g = "attn_tp"
    size = b.p.size(g)
    pre = f"model.layers.{i}.linear_attn"
    b.add(f"{pre}.dt_bias", (_div(nv, size, "linear_num_value_heads"),), part="layers")
    b.add(f"{pre}.A_log", (nv // size,), part="layers", dtype=a_log_dtype)
    b.add(f"{pre}.conv1d.weight", (_div(2 * key_dim + value_dim, size, "conv channels"), 1, K), part="layers")
    b.column(f"{pre}.in_proj_qkvz", 2 * key_dim + 2 * value_dim, H, g)
    b.column(f"{pre}.in_proj_ba", 2 * nv, H, g)
    b.norm(f"{pre}.norm", dv, dtype=norm_dtype)
    b.row(f"{pre}.out_proj", H, value_dim, g)


def _gemma_norm(b: _Builder, name: str, dim: int, *, part: str = "layers") -> None:
    """``GemmaRMSNorm``: its weight, and from 0.5.11 a ``gemma_weight`` buffer of the same shape (weight
    + 1, ``layers/layernorm.py``)."""
    b.norm(name, dim, part=part)
    if not _before(b.release, "0.5.11"):
        b.buffer(f"{name}.gemma_weight", (dim,))


def _rope_setting(t: _Config) -> tuple[int, float, Mapping[str, Any]]:
    rope = t.data.get("rope_parameters") or t.data.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        rope = {}
    factor = rope.get("partial_rotary_factor", t.data.get("partial_rotary_factor", 0.25))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        factor = 0.25
    return t.integer("max_position_embeddings", 32768), float(factor), rope


def release_has_axis_map(release: str) -> bool:
    """MRotaryEmbedding registers its ``axis_map`` for every mrope_section from 0.5.19
    (``rotary_embedding/mrope.py`` ``_build_axis_map``); before, only for GLM's interleaving."""
    return not _before(release, "0.5.19")


def _qwen_attention(b: _Builder, t: _Config, i: int, release: str) -> None:
    H = t.integer("hidden_size")
    heads, kv = t.integer("num_attention_heads", 16), t.integer("num_key_value_heads", 2)
    hd = t.integer("head_dim", 256)
    gate = t.boolean("attn_output_gate", True)
    pre = f"model.layers.{i}"
    b.qkv(f"{pre}.qkv_proj", H, hd, heads * (2 if gate else 1), kv, "attn_tp")
    b.row(f"{pre}.o_proj", H, heads * hd, "attn_tp")
    _gemma_norm(b, f"{pre}.q_norm", hd)
    _gemma_norm(b, f"{pre}.k_norm", hd)
    max_pos, factor, rope = _rope_setting(t)
    rotary = int(hd * factor)
    b.rope(max_pos, rotary)
    if "mrope_section" in rope and release_has_axis_map(release):
        if not any(prm.name == "rope.axis_map" for prm in b.params):
            b.buffer("rope.axis_map", (rotary // 2,), "int64")  # MRotaryEmbedding's lane -> axis map


def _qwen_moe(b: _Builder, t: _Config, i: int, layout: WeightsLayout, *, fuse_shared: bool) -> None:
    H = t.integer("hidden_size")
    E = t.integer("num_experts", 512)
    inter = t.integer("moe_intermediate_size", 512)
    shared = t.integer("shared_expert_intermediate_size", 512, minimum=0)
    if b.p.tp_size > E:
        raise LayoutError(f"the TP group ({b.p.tp_size}) is larger than num_experts={E}; SGLang refuses it")
    pre = f"model.layers.{i}.mlp"
    # Shared-expert fusion (models/qwen2_moe.py can_fuse_shared_expert): the shared expert becomes one
    # more expert slot that every EP rank holds, split by the MoE TP size instead of the TP group.
    fused = fuse_shared and not layout.disable_shared_experts_fusion and shared > 0 and shared == inter
    b.experts(f"{pre}.experts", E, H, inter, shared_slots=1 if fused else 0)
    b.replicated(f"{pre}.gate", E, H)
    if shared > 0 and not fused:
        b.column(f"{pre}.shared_expert.gate_up_proj", 2 * shared, H, "tp")
        b.row(f"{pre}.shared_expert.down_proj", H, shared, "tp")
    b.replicated(f"{pre}.shared_expert_gate", 1, H)


def _qwen3_next(b: _Builder, cfg: _Config, t: _Config, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 151936)
    types = _qwen_layer_types(t)
    # Under attention DP the embedding is replicated up to 0.5.8 (enable_tp=not is_dp_attention_enabled())
    # and split over the attention-TP group from 0.5.9 (use_attn_tp_group=is_dp_attention_enabled()).
    embed_g = _dp_embed_group(layout, release, split_from="0.5.9")
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    conf_dtype = config_dtype(t)
    # 0.5.2-0.5.5.post3 cast the head to float32 (qwen3_next.py ``self.lm_head = self.lm_head.float()``)
    head_dtype = "float32" if _before(release, "0.5.6") else None
    _embed_and_head(b, V, H, tied=False, embed_group=embed_g, head_group=head_g, head_dtype=head_dtype)
    for i in range(b.p.start_layer, b.p.end_layer):
        if types[i] == "attention":
            _qwen_attention(b, t, i, release)
        else:
            _gated_delta_net(b, t, i, norm_dtype=conf_dtype)
        # On CUDA the shared expert is fused into the experts from 0.5.14 (qwen3_next.py passes
        # enable_cuda_shared_expert_fusion=True; qwen2_moe.py fuses when _is_cuda and it is set).
        _qwen_moe(b, t, i, layout, fuse_shared=not _before(release, "0.5.14"))
        _gemma_norm(b, f"model.layers.{i}.input_layernorm", H)
        _gemma_norm(b, f"model.layers.{i}.post_attention_layernorm", H)
    if b.p.last:
        _gemma_norm(b, "model.norm", H, part="head")


def _qwen3_5_vision(b: _Builder, cfg: _Config, layout: WeightsLayout) -> None:
    """``Qwen3VLMoeVisionModel`` (``models/qwen3_vl.py``), built on every stage; only ``pos_embed`` is
    first-stage-only (``qwen3_vl.py:399-409``). Defaults are those of SGLang's ``Qwen3VLVisionConfig``."""
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
        b.column(f"{bp}.attn.qkv_proj", 3 * hid, hid, g, part="vision", bias=True)
        b.row(f"{bp}.attn.proj", hid, hid, g, part="vision", bias=True)
        b.column(f"{bp}.mlp.linear_fc1", inter, hid, g, part="vision", bias=True)
        b.row(f"{bp}.mlp.linear_fc2", hid, inter, g, part="vision", bias=True)
    ctx = hid * merge * merge
    for name, norm_dim in [("merger", hid)] + [
        (f"deepstack_merger_list.{k}", ctx) for k in range(len(deepstack))
    ]:
        b.norm(f"{pre}.{name}.norm", norm_dim, part="vision", bias=True)
        b.column(f"{pre}.{name}.linear_fc1", ctx, ctx, g, part="vision", bias=True)
        b.row(f"{pre}.{name}.linear_fc2", out, ctx, g, part="vision", bias=True)


def _qwen3_5(b: _Builder, cfg: _Config, t: _Config, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size"), t.integer("vocab_size", 248320)
    types = _qwen_layer_types(t)
    moe = (t.string("model_type") or cfg.string("model_type") or "").startswith("qwen3_5_moe")
    # replicated under attention DP in every release (qwen3_5.py: enable_tp=not is_dp_attention_enabled())
    embed_g = "none" if layout.dp_size > 1 else "tp"
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    # 0.5.9-0.5.10 read tie_word_embeddings from the text config (qwen3_vl.py ``self.config =
    # config.text_config``); 0.5.11+ copy the top-level config's onto it.
    tied = (t if _before(release, "0.5.11") else cfg).boolean("tie_word_embeddings", False)
    if not _language_model_only(cfg, layout, release):
        _qwen3_5_vision(b, cfg, layout)
    _embed_and_head(b, V, H, tied=tied, embed_group=embed_g, head_group=head_g)
    for i in range(b.p.start_layer, b.p.end_layer):
        if types[i] == "attention":
            _qwen_attention(b, t, i, release)
        else:
            # A_log in float32 from 0.5.10; 0.5.9's qwen3_5.py builds it in the model dtype
            a_log = b.dtype if _before(release, "0.5.10") else "float32"
            _gated_delta_net(b, t, i, norm_dtype=b.dtype, a_log_dtype=a_log)
        if moe:
            _qwen_moe(b, t, i, layout, fuse_shared=False)
        else:
            inter = t.integer("intermediate_size")
            b.column(f"model.layers.{i}.mlp.gate_up_proj", 2 * inter, H, "tp")
            b.row(f"model.layers.{i}.mlp.down_proj", H, inter, "tp")
        _gemma_norm(b, f"model.layers.{i}.input_layernorm", H)
        _gemma_norm(b, f"model.layers.{i}.post_attention_layernorm", H)
    if b.p.last:
        _gemma_norm(b, "model.norm", H, part="head")


def _language_model_only(cfg: _Config, layout: WeightsLayout, release: str) -> bool:
    """Whether the class leaves its vision tower out: 0.5.18+ read ``language_model_only`` from the
    model config (``configs/model_config.py`` ``is_lm_only``: the flag or the config.json key); the flag
    itself is refused for Qwen3.5 (its architectures are not in ``LANGUAGE_MODEL_ONLY_ARCHITECTURES``,
    0.5.23 ``arg_groups/model_hook.py:1103-1109``). Before 0.5.18 the tower is always built."""
    if layout.language_model_only:
        if _before(release, "0.5.18"):
            raise FlagError(
                f"--language-model-only does not exist in SGLang {release} (it arrived in 0.5.18); drop it"
            )
        raise FlagError(
            f"SGLang {release} refuses --language-model-only for Qwen3.5 (its architecture is not in "
            'LANGUAGE_MODEL_ONLY_ARCHITECTURES); drop it, or set "language_model_only": true in config.json, '
            "which the class reads"
        )
    return not _before(release, "0.5.18") and cfg.boolean("language_model_only", False)


def _qwen_num_layers(t: _Config) -> int:
    return t.integer("num_hidden_layers", 48)


# -- Kimi-Linear ------------------------------------------------------------------------------------------


def _kimi_linear(b: _Builder, cfg: _Config, t: _Config, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 163840)
    L = t.integer("num_hidden_layers", 32)
    lac = t.section("linear_attn_config")
    kda = lac.array("kda_layers") or []
    kda0 = {int(i) - 1 for i in kda}  # 1-based in the config
    nh, hd = lac.integer("num_heads"), lac.integer("head_dim")
    K = lac.integer("short_conv_kernel_size", 4)
    heads = t.integer("num_attention_heads", 32)
    nope, rope = t.integer("qk_nope_head_dim"), t.integer("qk_rope_head_dim")
    vdim, kv_lora = t.integer("v_head_dim"), t.integer("kv_lora_rank")
    q_lora = t.opt_int("q_lora_rank")
    E = t.opt_int("num_experts")
    moe_inter = t.opt_int("moe_intermediate_size")
    n_shared = t.integer("num_shared_experts", 0, minimum=0)
    first_dense = t.integer("first_k_dense_replace", 0, minimum=0)
    freq = t.integer("moe_layer_freq", 1)
    inter = t.integer("intermediate_size", 11008)
    _embed_and_head(b, V, H, tied=False, embed_group="tp", head_group="tp")
    proj = nh * hd
    for i in range(b.p.start_layer, b.p.end_layer):
        pre = f"model.layers.{i}.self_attn"
        if i in kda0:
            # KimiDeltaAttention, sharded over the whole TP group (shard_on_attn_tp=False): q, k, v and
            # beta column-parallel; f_a and g_a replicated; f_b, g_b column-parallel; dt_bias, A_log and
            # the conv weights held in float32.
            g = "tp"
            size = b.p.size(g)
            b.column(f"{pre}.q_proj", proj, H, g)
            b.column(f"{pre}.k_proj", proj, H, g)
            b.column(f"{pre}.v_proj", proj, H, g)
            b.column(f"{pre}.b_proj", nh, H, g)
            b.replicated(f"{pre}.f_a_proj", hd, H)
            b.replicated(f"{pre}.g_a_proj", hd, H)
            b.column(f"{pre}.f_b_proj", proj, hd, g)
            b.column(f"{pre}.g_b_proj", proj, hd, g)
            b.add(
                f"{pre}.dt_bias",
                (_div(proj, size, "linear_attn num_heads * head_dim"),),
                part="layers",
                dtype="float32",
            )
            b.add(f"{pre}.qkv_conv1d.weight", (3 * proj // size, 1, K), part="layers", dtype="float32")
            b.add(
                f"{pre}.A_log",
                (1, 1, _div(nh, size, "linear_attn num_heads"), 1),
                part="layers",
                dtype="float32",
            )
            b.norm(f"{pre}.o_norm", hd)
            b.row(f"{pre}.o_proj", H, proj, g)
        else:
            # DeepseekV2AttentionMLA over the attention-TP group; kv_a_proj_with_mqa replicated.
            g = "attn_tp"
            if q_lora is None:
                b.column(f"{pre}.q_proj", heads * (nope + rope), H, g)
            else:
                b.replicated(f"{pre}.q_a_proj", q_lora, H)
                b.norm(f"{pre}.q_a_layernorm", q_lora)
                b.column(f"{pre}.q_b_proj", heads * (nope + rope), q_lora, g)
            b.replicated(f"{pre}.kv_a_proj_with_mqa", kv_lora + rope, H)
            b.norm(f"{pre}.kv_a_layernorm", kv_lora)
            b.column(f"{pre}.kv_b_proj", heads * (nope + vdim), kv_lora, g)
            b.row(f"{pre}.o_proj", H, heads * vdim, g)
            # post_load_weights: w_kc and w_vc, contiguous copies of kv_b_proj's two halves.
            local = _div(heads, b.p.size(g), "num_attention_heads")
            b.copy(f"{pre}.w_kc", (local, kv_lora, nope))
            b.copy(f"{pre}.w_vc", (local, kv_lora, vdim))
        sparse = E is not None and i >= first_dense and i % freq == 0
        if sparse:
            assert E is not None and moe_inter is not None
            mp = f"model.layers.{i}.block_sparse_moe"
            b.replicated(f"{mp}.gate", E, H)
            b.add(f"{mp}.gate.e_score_correction_bias", (E,), part="layers")
            b.experts(f"{mp}.experts", E, H, moe_inter)
            if n_shared:
                si = moe_inter * n_shared
                b.column(f"{mp}.shared_experts.gate_up_proj", 2 * si, H, "tp")
                b.row(f"{mp}.shared_experts.down_proj", H, si, "tp")
        else:
            b.column(f"model.layers.{i}.mlp.gate_up_proj", 2 * inter, H, "tp")
            b.row(f"model.layers.{i}.mlp.down_proj", H, inter, "tp")
        b.norm(f"model.layers.{i}.input_layernorm", H)
        b.norm(f"model.layers.{i}.post_attention_layernorm", H)
    if b.p.last:
        b.norm("model.norm", H, part="head")
    del L


# -- Mamba2 mixers: Nemotron-H, Falcon-H1, Granite-4.0-H ------------------------------------------------


def _mamba_mixer(
    b: _Builder,
    pre: str,
    *,
    hidden: int,
    intermediate: int,
    heads: int,
    n_groups: int,
    state: int,
    conv_kernel: int,
    conv_bias: bool,
    proj_bias: bool,
    rms_norm: bool,
    layout: WeightsLayout,
    release: str,
    cache_tp_size: int | None = None,
) -> int:
    """``MambaMixer2`` (``layers/attention/mamba/mamba.py``): over the attention-TP group under DP
    attention from 0.5.14 (the whole TP group before), else the TP group; a group count the group does
    not divide is replicated to it (``extra_groups_for_head_shards``: n_groups=1 becomes tp groups)."""
    g = "attn_tp" if layout.dp_size > 1 and not _before(release, "0.5.14") else "tp"
    size = b.p.size(g)
    _div(heads, size, "mamba heads")
    if n_groups % size and n_groups != 1:
        raise LayoutError(
            f"mamba n_groups = {n_groups} is neither 1 nor divisible by the TP size {size}; SGLang refuses it"
        )
    groups = n_groups if n_groups % size == 0 else n_groups + (size - n_groups)
    # The channels come from the model config's mamba2_cache_params (0.5.3.post1+), whose extra groups
    # follow the attention-TP size; before 0.5.14 the mixer then splits them over the whole TP group
    # under attention DP (Falcon-H1 at tp 2 x dp 2 on 0.5.7: 2 groups' channels over 4 ranks).
    attn = cache_tp_size or b.p.attn_tp_size
    cache_groups = n_groups if n_groups % attn == 0 else n_groups + (attn - n_groups)
    conv_dim = intermediate + 2 * (cache_groups if not _before(release, "0.5.3.post1") else groups) * state
    b.add(f"{pre}.A", (heads // size,), part="layers", dtype="float32")
    b.add(f"{pre}.D", (heads // size,), part="layers")
    b.add(f"{pre}.dt_bias", (heads // size,), part="layers")
    b.add(
        f"{pre}.conv1d.weight", (_div(conv_dim, size, "mamba conv channels"), 1, conv_kernel), part="layers"
    )
    if conv_bias:
        b.add(f"{pre}.conv1d.bias", (conv_dim // size,), part="layers")
    in_proj = intermediate + conv_dim + heads
    b.column(f"{pre}.in_proj", in_proj, hidden, g, bias=proj_bias)
    b.row(f"{pre}.out_proj", hidden, intermediate, g, bias=proj_bias)
    if rms_norm:
        b.add(f"{pre}.norm.weight", (_div(intermediate, size, "mamba intermediate size"),), part="layers")
    return groups  # the group count the mixer holds (n_groups, or the replicated one)


def _nemotron_pattern(t: _Config) -> str:
    types = t.array("layers_block_type")
    if types is not None:
        code = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
        return "".join(code.get(x, "?") for x in types)
    return t.string("hybrid_override_pattern", "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-") or ""


def _nemotron_h(b: _Builder, cfg: _Config, t: _Config, layout: WeightsLayout, release: str) -> None:
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
    embed_g = "attn_tp" if layout.dp_size > 1 and not _before(release, "0.5.14") else "tp"
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    # 0.5.3.post1-0.5.7 build the whole model on every stage (no PPMissingLayer), the head tied to the
    # embedding's own tensor when tie_word_embeddings.
    whole = _before(release, "0.5.8")
    first, last = b.p.first or whole, b.p.last or whole
    if first:
        b.vocab("model.embed_tokens", V, H, embed_g, part="embed")
    if last and not (tied and (b.p.pp_size == 1 or whole)):
        b.vocab("lm_head", V, H, head_g, part="head")
    for i in range(b.p.start_layer, b.p.end_layer):
        c = pattern[i]
        pre = f"model.layers.{i}.mixer"
        if c == "M":
            _mamba_mixer(
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
            ag = "tp" if _before(release, "0.5.14") else "attn_tp"
            b.qkv(f"{pre}.qkv_proj", H, hd, heads, kv, ag)
            b.row(f"{pre}.o_proj", H, heads * hd, ag)
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


def _nemotron_num_layers(t: _Config) -> int:
    return len(_nemotron_pattern(t))


def _falcon_h1(b: _Builder, cfg: _Config, t: _Config, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 128000)
    heads, kv = t.integer("num_attention_heads", 32), t.integer("num_key_value_heads", 8)
    hd = t.opt_int("head_dim") or H // heads
    tied = t.boolean("tie_word_embeddings", False)
    embed_g = _dp_embed_group(layout, release, split_from="0.5.9")
    head_g = "attn_tp" if layout.enable_dp_lm_head else "tp"
    d_ssm = FALCON_H1_D_SSM if "mamba_d_ssm" not in t.data else t.opt_int("mamba_d_ssm")
    inter_m = d_ssm if d_ssm is not None else int(t.number("mamba_expand", 2) * H)
    # lm_head is cast to float32 (falcon_h1.py ``self.lm_head = self.lm_head.number()``): when tied, that
    # is the embedding itself.
    if b.p.first:
        b.vocab("model.embed_tokens", V, H, embed_g, part="embed", dtype="float32" if tied else None)
    if b.p.last and not tied:
        b.vocab("lm_head", V, H, head_g, part="head", dtype="float32")
    for i in range(b.p.start_layer, b.p.end_layer):
        pre = f"model.layers.{i}"
        b.qkv(f"{pre}.qkv_proj", H, hd, heads, kv, "attn_tp", bias=t.boolean("attention_bias", False))
        b.row(f"{pre}.o_proj", H, heads * hd, "attn_tp", bias=t.boolean("attention_bias", False))
        groups = _mamba_mixer(
            b,
            f"{pre}.mamba",
            hidden=H,
            intermediate=inter_m,
            heads=t.integer("mamba_n_heads", 128),
            n_groups=t.integer("mamba_n_groups", 1),
            state=t.integer("mamba_d_state", 256),
            conv_kernel=t.integer("mamba_d_conv", 4),
            conv_bias=t.boolean("mamba_conv_bias", True),
            proj_bias=t.boolean("mamba_proj_bias", False),
            rms_norm=t.boolean("mamba_rms_norm", False),
            layout=layout,
            release=release,
            # the config computed the cache params with the whole TP group up to 0.5.4.post3
            cache_tp_size=b.p.tp_size if _before(release, "0.5.5") else None,
        )
        inter = t.integer("intermediate_size", 14336)
        b.column(f"{pre}.feed_forward.gate_up_proj", 2 * inter, H, "tp")
        b.row(f"{pre}.feed_forward.down_proj", H, inter, "tp")
        b.norm(f"{pre}.input_layernorm", H)
        b.norm(f"{pre}.pre_ff_layernorm", H)
        b.norm(f"{pre}.q_norm", hd)
        b.norm(f"{pre}.k_norm", hd)
        # the muP multipliers of the mixer's input projection (falcon_h1.py _init_mup_vector), split by
        # the whole TP group even where the mixer splits by attention TP
        mup = 2 * inter_m + 2 * groups * t.integer("mamba_d_state", 256) + t.integer("mamba_n_heads", 128)
        b.buffer(f"{pre}.mup_vector", (1, mup // b.p.tp_size))
        b.rope(t.integer("max_position_embeddings", 8192), hd)
    if b.p.last:
        b.norm("model.final_layernorm", H, part="head")


def _granite_h(b: _Builder, cfg: _Config, t: _Config, layout: WeightsLayout, release: str) -> None:
    H, V = t.integer("hidden_size", 4096), t.integer("vocab_size", 100352)
    types = t.array("layer_types") or []
    heads, kv = t.integer("num_attention_heads", 32), t.integer("num_key_value_heads", 8)
    hd = H // heads
    tied = t.boolean("tie_word_embeddings", False)
    E = t.integer("num_local_experts", 0, minimum=0)
    inter = t.integer("intermediate_size", 1024)
    shared = t.integer("shared_intermediate_size", 0, minimum=0)
    bias = t.boolean("attention_bias", False)
    if b.p.first:
        b.vocab("model.embed_tokens", V, H, "tp", part="embed")
    # lm_head is built on every stage and tied to the embedding's tensor when tie_word_embeddings
    # (granitemoehybrid.py: not stage-aware).
    if not tied:
        b.vocab("lm_head", V, H, "tp", part="head")
    for i in range(b.p.start_layer, b.p.end_layer):
        pre = f"model.layers.{i}"
        if GRANITE_LAYER_NAMES.get(types[i]) == "mamba":
            _mamba_mixer(
                b,
                f"{pre}.mamba",
                hidden=H,
                intermediate=int(t.number("mamba_expand", 2) * H),
                heads=t.integer("mamba_n_heads", 128),
                n_groups=t.integer("mamba_n_groups", 1),
                state=t.integer("mamba_d_state", 256),
                conv_kernel=t.integer("mamba_d_conv", 4),
                conv_bias=t.boolean("mamba_conv_bias", True),
                proj_bias=t.boolean("mamba_proj_bias", False),
                rms_norm=True,
                layout=layout,
                release=release,
            )
        else:
            b.qkv(f"{pre}.self_attn.qkv_proj", H, hd, heads, kv, "tp", bias=bias)
            b.row(f"{pre}.self_attn.o_proj", H, H, "tp", bias=bias)
        if E > 0:
            b.replicated(f"{pre}.block_sparse_moe.gate", E, H)
            b.experts(f"{pre}.block_sparse_moe.experts", E, H, inter)
        if shared:
            b.column(f"{pre}.shared_mlp.input_linear", 2 * shared, H, "tp")
            b.row(f"{pre}.shared_mlp.output_linear", H, shared, "tp")
        b.norm(f"{pre}.input_layernorm", H)
        b.norm(f"{pre}.post_attention_layernorm", H)
    if b.p.last:
        b.norm("model.norm", H, part="head")


def _plain_layers(key: str, default: int) -> Callable[[_Config], int]:
    return lambda t: t.integer(key, default)


FAMILIES: tuple[Family, ...] = (
    Family(
        "Qwen3-Next",
        ("qwen3_next",),
        None,
        _qwen_num_layers,
        _qwen3_next,
    ),
    Family(
        "Qwen3.5",
        ("qwen3_5", "qwen3_5_moe"),
        "text_config",
        _qwen_num_layers,
        _qwen3_5,
    ),
    Family("Kimi-Linear", ("kimi_linear",), None, _plain_layers("num_hidden_layers", 32), _kimi_linear),
    Family(
        "Nemotron-H",
        ("nemotron_h",),
        None,
        _nemotron_num_layers,
        _nemotron_h,
    ),
    Family(
        "Falcon-H1",
        ("falcon_h1",),
        None,
        _plain_layers("num_hidden_layers", 36),
        _falcon_h1,
    ),
    Family("Granite-4.0-H", ("granitemoehybrid",), None, _plain_layers("num_hidden_layers", 40), _granite_h),
)
_BY_TYPE = {mt: f for f in FAMILIES for mt in f.model_types}


# ---- the answer -----------------------------------------------------------------------------------------

# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every request is rounded up to
# 512 bytes; requests up to 1 MiB are carved out of 2 MiB segments, requests under 10 MiB out of 20 MiB
# segments, larger ones get a segment of their own rounded up to 2 MiB. What SGLang measures is device
# memory (``torch.cuda.mem_get_info`` after ``empty_cache``): whole segments, not the tensors in them.
_MIN_BLOCK = 512
_SMALL_SIZE = 1 << 20
_SMALL_BUFFER = 2 << 20
_LARGE_BUFFER = 20 << 20
_MIN_LARGE_ALLOC = 10 << 20
_ROUND_LARGE = 2 << 20


def allocator_bytes(sizes: Sequence[int]) -> int:
    """Device memory the caching allocator reserves for ``sizes`` allocated in order and kept: a
    best-fit simulation of its two pools (blocks split while the rest is worth keeping: over 512 bytes
    in the small pool, over 1 MiB in the large one)."""
    free: dict[bool, list[int]] = {True: [], False: []}
    reserved = 0
    for size in sizes:
        size = max(_MIN_BLOCK, -(-size // _MIN_BLOCK) * _MIN_BLOCK)
        small = size <= _SMALL_SIZE
        pool = free[small]
        fits = [blk for blk in pool if blk >= size]
        if fits:
            blk = min(fits)
            pool.remove(blk)
        else:
            if small:
                blk = _SMALL_BUFFER
            elif size < _MIN_LARGE_ALLOC:
                blk = _LARGE_BUFFER
            else:
                blk = -(-size // _ROUND_LARGE) * _ROUND_LARGE
            reserved += blk
        rest = blk - size
        if rest >= (_MIN_BLOCK if small else _SMALL_SIZE + 1):
            pool.append(rest)
    return reserved


@dataclass(frozen=True)
class RankWeights:
    """One rank's weights: its parameters exactly (by part), and what the class and the allocator add."""

    place: Place
    param_bytes: int
    by_part: Mapping[str, int]
    buffer_bytes: int
    """Buffers the class registers (RoPE caches, a GemmaRMSNorm's derived weight, Falcon-H1's muP rows)."""
    copy_bytes: int
    """Tensors derived from the weights after loading and kept (Kimi-Linear's ``w_kc``/``w_vc``)."""
    rounding_bytes: int
    """What the caching allocator's segments add to all of them."""

    @property
    def margin_bytes(self) -> int:
        return self.buffer_bytes + self.copy_bytes + self.rounding_bytes

    @property
    def total_bytes(self) -> int:
        """The figure SGLang logs as the weights' ``mem usage``: parameters plus the margin."""
        return self.param_bytes + self.margin_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


@dataclass(frozen=True)
class ModelWeights:
    family: str
    architecture: str
    dtype: str
    num_hidden_layers: int
    release: str
    ranks: tuple[RankWeights, ...]


def family_of(config: Mapping[str, Any], source: str) -> tuple[Family, _Config, _Config]:
    cfg = _Config(config, source)
    mt = cfg.string("model_type")
    fam = _BY_TYPE.get(mt or "")
    if fam is None:
        known = ", ".join(f.name for f in FAMILIES)
        raise ConfigError(
            f"{source}: model_type={shorten(mt)} is not a family whose weights the checker models ({known}); "
            "give the weights per GPU with --weights-gib"
        )
    text = cfg.section(fam.text_section) if fam.text_section else cfg
    if fam.text_section and not text.data:
        text = cfg
    return fam, cfg, text


def rank_params(
    config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str = "config.json"
) -> list[tuple[Place, list[Param]]]:
    """Every rank's parameters, buffers and kept copies (name, per-rank shape, held dtype), in
    world-rank order and in the order the class builds them."""
    fam, cfg, text = family_of(config, source)
    # What the release's class does under PP is read from its own code (checker.core.releases.pp_support), the
    # table that refuses such a deployment before sizing (model_support.check_pipeline). Asked again
    # here for a direct caller, only where the class cannot be built at all: a class that builds but
    # fails later (load_weights with no stage filter) still holds what it built.
    architecture = str((cfg.array("architectures") or [""])[0])
    status = pipeline_status(release, architecture) if layout.pp_size > 1 else None
    unbuilt = {
        "single-stage": "its constructor asserts one stage",
        "no-pp": "its forward takes no pp_proxy_tensors",
    }
    if status is not None and status[0] in unbuilt:
        raise LayoutError(
            f"{architecture} cannot run under pipeline parallelism in SGLang {release} "
            f"({unbuilt[status[0]]}: sglang/srt/{status[1]}); use --pp-size 1 (the same GPUs as --tp-size)"
        )
    dtype = model_dtype(text, layout.dtype)
    experts = text.integer("num_experts", 0, minimum=0) or text.integer("num_local_experts", 0, minimum=0)
    if experts and layout.moe_runner_backend not in ("auto", "triton"):
        raise FlagError(
            f"--moe-runner-backend {shorten(layout.moe_runner_backend)}: the checker models the expert "
            "weights as the auto/triton runners hold them (others pad or re-lay them); give the weights "
            "per GPU with --weights-gib"
        )
    out = []
    all_layers = status is not None and status[0] == "all-layers"
    for place in places(layout, fam.num_layers(text), release, all_layers=all_layers):
        b = _Builder(place, dtype, release)
        fam.build(b, cfg, text, layout, release)
        out.append((place, b.params))
    return out


def model_weights(
    config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str = "config.json"
) -> ModelWeights:
    """Every rank's weights for ``layout`` as SGLang ``release``'s class holds them."""
    fam, cfg, text = family_of(config, source)
    ranks = []
    for place, params in rank_params(config, layout, release=release, source=source):
        by_part = dict.fromkeys(PARTS + EXTRA_PARTS, 0)
        for prm in params:
            by_part[prm.part] += prm.nbytes
        ranks.append(
            RankWeights(
                place=place,
                param_bytes=sum(by_part[k] for k in PARTS),
                by_part={k: by_part[k] for k in PARTS},
                buffer_bytes=by_part["buffers"],
                copy_bytes=by_part["copies"],
                rounding_bytes=allocator_bytes([prm.nbytes for prm in params]) - sum(by_part.values()),
            )
        )
    archs = cfg.array("architectures") or [""]
    return ModelWeights(
        family=fam.name,
        architecture=str(archs[0]),
        dtype=model_dtype(text, layout.dtype),
        num_hidden_layers=fam.num_layers(text),
        release=release,
        ranks=tuple(ranks),
    )
