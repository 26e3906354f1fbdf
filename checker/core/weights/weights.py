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

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from checker.core.errors import ConfigError, FlagError, LayoutError, json_kind, shorten
from checker.core.releases.model_support import pipeline_status
from checker.core.sizing.partition import stage_bounds, stage_partition
from checker.core.weights.awq import awq_experts, awq_linear
from checker.core.weights.awq import check_backend as check_awq_backend
from checker.core.weights.compressed import KV_SCALES_FROM as ct_kv_from
from checker.core.weights.compressed import CompressedConfig, Scheme
from checker.core.weights.compressed import check_block as ct_check_block
from checker.core.weights.compressed import check_release as ct_check_release
from checker.core.weights.compressed import check_release_scheme as ct_check_release_scheme
from checker.core.weights.gptq import check_backend, gptq_experts, gptq_linear
from checker.core.weights.modelopt import check_release as fp4_check_release
from checker.core.weights.modelopt import fp4_experts, fp4_linear
from checker.core.weights.quant import QuantScheme, ceil_div, check_block, check_release, read_scheme

GIB = 2**30
DTYPE_BYTES: Mapping[str, int] = {
    "int64": 8,
    "int32": 4,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float64": 8,
    "float8_e4m3fn": 1,
    "uint8": 1,
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
EXTRA_PARTS = ("buffers", "copies", "dropped")
"""What the class holds beside its parameters: registered buffers, tensors derived after loading; and
``dropped``: parameters the class builds and loads that its quant method frees after loading (a WNA16
MoE's unused ``g_idx``): not held, but their allocator segment stays reserved unless it empties."""

MARLIN_SMS = 132
"""Streaming multiprocessors the Marlin workspaces are sized for where the rank's GPU is not known (an
H100 SXM's, an H200's: ``marlin_make_workspace``, marlin_utils.py:266-274, one int32 per SM and block,
``sms = torch.cuda.get_device_properties(device).multi_processor_count``); an H100 PCIe has 114.
``WeightsLayout.gpu_sm_count`` (a GPU rank's own count, or ``--gpu-sm-count``) replaces it."""


def marlin_assumption(sms: int) -> str:
    """The words a weights line carries where a Marlin workspace was sized for an assumed SM count."""
    return f"Marlin workspace for {sms} SMs (H100; --gpu-sm-count)"


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
    quantization: str | None = None
    """``--quantization``: must agree with the checkpoint's own (checker.core.weights.quant)."""
    draft: str | None = None
    """The speculative draft a last-stage rank loads beside the target: ``"nextn"``, the NEXTN/MTP layer
    held in the target checkpoint (``--speculative-algorithm EAGLE``/``NEXTN`` with no separate
    ``--speculative-draft-model-path``); ``"separate"``: a draft from :attr:`draft_path` (its own config.json
    decides the class: checker.families.drafts; :func:`draft_bytes` refuses it); None: no draft."""
    draft_path: str | None = None
    draft_algorithm: str | None = None
    """``--speculative-algorithm`` as given (upper case) where a draft is loaded: EAGLE/NEXTN share the
    target's embedding and head with the draft, EAGLE3 its embedding only (checker.families.drafts)."""
    builds_all_layers: bool = False
    gpu_sm_count: int | None = None
    """The GPU's streaming multiprocessors, which size each Marlin workspace (GPTQ, AWQ, NVFP4 on
    Hopper, compressed-tensors WNA16): a GPU rank's own, or ``--gpu-sm-count``; None: :data:`MARLIN_SMS`
    assumed, and said (``RankWeights.note``)."""
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
    if release is not None and before(release, "0.5.6"):
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


@functools.cache  # a handful of release strings, asked about once per module a class builds
def _version(release: str) -> tuple[int, ...]:
    nums = [int(x) for x in re.findall(r"\d+", release)]
    return tuple(nums + [0] * (5 - len(nums)))


def before(release: str, other: str) -> bool:
    return _version(release) < _version(other)


# ---- parameters --------------------------------------------------------------------------------------


class Param(NamedTuple):
    """One parameter of a rank's model, as its class holds it. A named tuple, not a frozen dataclass: a
    rank builds tens of thousands, and a frozen dataclass's ``__init__`` cost a third of building them."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    part: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


def divide(n: int, k: int, what: str) -> int:
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
        return divide(kv_heads, size, "num_key_value_heads")
    if size % kv_heads:
        raise LayoutError(
            f"num_key_value_heads = {kv_heads} must divide the attention TP size {size} (SGLang replicates "
            "KV heads only in whole copies)"
        )
    return 1


class Builder:
    """Collects one rank's parameters; ``quant``: the checkpoint's FP8 scheme, which the linears, the
    experts and the attention layers of a class built with a quant config hold as
    :mod:`checker.core.weights.quant` says."""

    def __init__(
        self, place: Place, dtype: str, release: str = "0.5.23", quant: QuantScheme | None = None
    ) -> None:
        self.p = place
        self.dtype = dtype
        self.release = release
        self.quant = quant
        self.params: list[Param] = []
        self.sms = MARLIN_SMS
        """The SM count a Marlin workspace is sized for (rank_params_of sets the layout's)."""
        self.marlin = False
        """A Marlin workspace was sized (the SM count matters to this rank's figure)."""

    def add(self, name: str, shape: Sequence[int], *, part: str, dtype: str | None = None) -> None:
        self.params.append(Param(name, tuple(map(int, shape)), dtype or self.dtype, part))

    def buffer(self, name: str, shape: Sequence[int], dtype: str | None = None) -> None:
        """A buffer the class registers (a RoPE cache, a norm's derived weight): memory, not a parameter."""
        self.add(name, shape, part="buffers", dtype=dtype)

    def copy(self, name: str, shape: Sequence[int], dtype: str | None = None) -> None:
        """A tensor the class derives from loaded weights and keeps (``post_load_weights``)."""
        self.add(name, shape, part="copies", dtype=dtype)

    def dropped(self, name: str, shape: Sequence[int], dtype: str | None = None) -> None:
        """A parameter the class builds and loads and its quant method frees after loading."""
        self.add(name, shape, part="dropped", dtype=dtype)

    def marlin_workspace(self, name: str, per_sm: int) -> None:
        """``marlin_make_workspace``'s int32 buffer, ``per_sm`` per SM of the rank's GPU, kept."""
        self.marlin = True
        self.copy(name, (per_sm * self.sms,), "int32")

    def rope(self, max_position: int, rotary_dim: int) -> None:
        """``get_rope``'s ``cos_sin_cache`` [max_position, rotary_dim] float32 (``SGLANG_ROPE_CACHE_FP32``
        on CUDA); one per distinct setting, shared by every layer (``rotary_embedding/factory.py``)."""
        key = f"rope.{max_position}.{rotary_dim}"
        if any(prm.name == key for prm in self.params):
            return
        self.buffer(key, (max_position, rotary_dim), "float32")

    def kv_scales(self, prefix: str) -> None:
        """A RadixAttention under a quant config: ``Fp8KVCacheMethod``'s float32 ``k_scale``/``v_scale``."""
        if self.quant is not None and self.quant.kv:
            if self.quant.ct is not None and before(self.release, ct_kv_from):
                return  # no CompressedTensorsKVCacheMethod before 0.5.19 (compressed.py KV_SCALES_FROM)
            self.add(f"{prefix}.k_scale", (), part="layers", dtype="float32")
            self.add(f"{prefix}.v_scale", (), part="layers", dtype="float32")

    def linear(
        self,
        name: str,
        shards: Sequence[int],
        inp: int,
        *,
        part: str = "layers",
        bias: bool = False,
        dtype: str | None = None,
        quant: bool = True,
        prefix: str | None = None,
        out_split: int = 1,
        in_split: int = 1,
        weight_dtype: str | None = None,
        cls: str = "Linear",
    ) -> None:
        """A linear's per-rank weight (``shards``: its logical output partitions on this rank), quantized
        where the scheme takes it (``quant``: the class passes its quant config; ``prefix``: the module
        name SGLang matches the ignore list against, when it is not ``name``; ``weight_dtype``: what a
        quantized weight is cast to after it is built, as Falcon-H1's ``lm_head.float()``)."""
        rows = sum(shards)
        s = self.quant
        if s is not None and s.gq is not None:
            # prefix "": a module built without one (Falcon-H1's qkv/o), which no rule names
            args = s.gq.linear(name if prefix is None else prefix) if quant else None
            if args is None:
                self.add(f"{name}.weight", (rows, inp), part=part, dtype=dtype)
            else:
                gptq_linear(self, s.gq, args, name, rows, inp, part, in_split)
        elif s is not None and s.aw is not None:
            if not quant or s.aw.skips(prefix or name):
                self.add(f"{name}.weight", (rows, inp), part=part, dtype=dtype)
            else:
                awq_linear(self, s.aw, name, rows, inp, part, out_split, in_split)
        elif s is not None and s.ct is not None:
            ct = s.ct.linear(name if prefix is None else prefix, cls) if quant else None
            if ct is None:
                self.add(f"{name}.weight", (rows, inp), part=part, dtype=dtype)
            else:
                ct_check_release_scheme(s.ct, ct, prefix or name, self.release, moe=False)
                compressed_linear(self, s.ct, ct, name, shards, inp, part, out_split, in_split)
        elif s is None or not quant or s.skips(name if prefix is None else prefix):
            self.add(f"{name}.weight", (rows, inp), part=part, dtype=dtype)
        elif s.fp4 is not None:  # ModelOpt NVFP4 (checker.core.weights.modelopt)
            fp4_linear(self, s.fp4, name, shards, inp, part=part, bias=bias)
            return
        else:
            check_block(s, prefix or name, shards, inp, out_split=out_split, in_split=in_split)
            self.add(f"{name}.weight", (rows, inp), part=part, dtype=weight_dtype or "float8_e4m3fn")
            if s.modelopt:
                # built per shard and replaced after loading (``layer.weight_scale = Parameter(...)``,
                # modelopt_quant.py:626-627): freed, not held beside their replacements
                self.dropped(f"{name}.weight_scale", (len(shards),), "float32")
                self.dropped(f"{name}.input_scale", (len(shards),), "float32")
                # after loading (modelopt_quant.py:617-633): the largest shard scale, 0-d where the
                # FlashInfer per-tensor GEMM takes the layer (both dimensions divisible by 16; on SM90
                # from 0.5.18, flashinfer_per_tensor_fp8_supported: SM100/SM120 only up to 0.5.17), else
                # one per output channel; the input scale's 0-d maximum
                bmm = rows % 16 == 0 and inp % 16 == 0 and not before(self.release, "0.5.18")
                self.copy(f"{name}.weight_scale.max", () if bmm else (rows, 1), "float32")
                self.copy(f"{name}.input_scale.max", (), "float32")
            elif s.block is not None:
                bn, bk = s.block
                scale = (ceil_div(rows, bn), ceil_div(inp, bk))
                self.add(f"{name}.weight_scale_inv", scale, part=part, dtype="float32")
            else:
                # built per logical shard and replaced after loading (fp8.py:1257 ``layer.weight_scale =
                # Parameter(convert_to_channelwise(...))``, :1269-1271 ``layer.input_scale =
                # Parameter(layer.input_scale.max())``; the same on every checked release): freed, not
                # held beside their replacements, one scale per output channel (the SM90 CUTLASS kernel's
                # layout, :1205-1216) and a static input scale's 0-d maximum
                self.dropped(f"{name}.weight_scale", (len(shards),), "float32")
                if s.static:
                    self.dropped(f"{name}.input_scale", (len(shards),), "float32")
                self.copy(f"{name}.weight_scale.channelwise", (rows, 1), "float32")
                if s.static:
                    self.copy(f"{name}.input_scale.max", (), "float32")
        if bias:
            self.add(f"{name}.bias", (rows,), part=part, dtype=dtype)

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
        shards: Sequence[int] | None = None,
        quant: bool = True,
        prefix: str | None = None,
    ) -> None:
        """``shards``: a merged linear's logical output sizes (summing to ``out``)."""
        size = self.p.size(group)
        rows = divide(out, size, f"{name} output size")
        parts = [divide(x, size, f"{name} output size") for x in shards] if shards else [rows]
        cls = "MergedColumnParallelLinear" if shards else "ColumnParallelLinear"
        self.linear(
            name,
            parts,
            inp,
            part=part,
            bias=bias,
            dtype=dtype,
            quant=quant,
            prefix=prefix,
            out_split=size,
            cls=cls,
        )

    def row(
        self,
        name: str,
        out: int,
        inp: int,
        group: str,
        *,
        part: str = "layers",
        bias: bool = False,
        quant: bool = True,
        prefix: str | None = None,
    ) -> None:
        size = self.p.size(group)
        cols = divide(inp, size, f"{name} input size")
        self.linear(
            name,
            [out],
            cols,
            part=part,
            bias=bias,
            quant=quant,
            prefix=prefix,
            in_split=size,
            cls="RowParallelLinear",
        )

    def replicated(
        self,
        name: str,
        out: int,
        inp: int,
        *,
        part: str = "layers",
        bias: bool = False,
        dtype: str | None = None,
        quant: bool = True,
        prefix: str | None = None,
    ) -> None:
        self.linear(
            name,
            [out],
            inp,
            part=part,
            bias=bias,
            dtype=dtype,
            quant=quant,
            prefix=prefix,
            cls="ReplicatedLinear",
        )

    def norm(
        self, name: str, dim: int, *, part: str = "layers", bias: bool = False, dtype: str | None = None
    ) -> None:
        self.add(f"{name}.weight", (dim,), part=part, dtype=dtype)
        if bias:
            self.add(f"{name}.bias", (dim,), part=part, dtype=dtype)

    def vocab(
        self, name: str, vocab: int, hidden: int, group: str, *, part: str, dtype: str | None = None
    ) -> None:
        rows = vocab_rows(vocab, self.p.size(group))
        s = self.quant
        if name == "lm_head" and s is not None and s.ct is not None:
            s.ct.head(name)  # a quantized head: refused (compressed.py)
        head = name == "lm_head" and s is not None and s.modelopt and not before(self.release, "0.5.15")
        if head and s is not None and not s.skips(name):
            # ParallelLMHead built with the quant config takes ModelOpt's linear method from 0.5.15
            # (modelopt_quant.py:341; 0.5.10-0.5.14 take LinearBase only, :305): its weight fp8 with its
            # scales (a later .float() casts it)
            self.linear(name, [rows], hidden, part=part, weight_dtype=dtype)
            return
        self.add(f"{name}.weight", (rows, hidden), part=part, dtype=dtype)

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
        prefix: str | None = None,
        quant: bool = True,
    ) -> None:
        size = self.p.size(group)
        q = divide(heads, size, "num_attention_heads") * head_dim
        kv = kv_heads_per_rank(kv_heads, size)
        shards = [q, kv * head_dim, kv * (v_head_dim or head_dim)]
        self.linear(
            name,
            shards,
            hidden,
            bias=bias,
            prefix=prefix,
            out_split=size,
            cls="QKVParallelLinear",
            quant=quant,
        )

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
        slots, held by every rank), intermediate split by the MoE TP size (``fused_moe_triton/layer.py``);
        under FP8 their scales (``Fp8MoEMethod``, checker.core.weights.quant)."""
        local = divide(num_experts, self.p.moe_ep_size, "num_experts") + shared_slots
        inter = divide(intermediate, self.p.moe_tp_size, "moe_intermediate_size")
        shards = 2 if gated else 1
        s = self.quant
        if s is not None and s.gq is not None:
            gptq_experts(self, s.gq, name, local, hidden, inter)
            return
        if s is not None and s.aw is not None and not s.aw.skips(name):
            awq_experts(self, s.aw, name, local, hidden, inter)
            return
        if s is not None and s.ct is not None:
            ct = s.ct.moe(name)
            if ct is not None:
                ct_check_release_scheme(s.ct, ct, name, self.release, moe=True)
            compressed_experts(self, ct, name, local, hidden, inter, shards)
            return
        if s is not None and s.fp4 is not None and not s.skips(name):
            total = num_experts + shared_slots  # the layer's num_experts: its input scales are global
            fp4_experts(self, s.fp4, name, local, total, hidden, inter, gated)
            return
        fp8 = s is not None and s.aw is None and not s.skips(name)
        dtype = "float8_e4m3fn" if fp8 else None
        self.add(f"{name}.w13_weight", (local, shards * inter, hidden), part="layers", dtype=dtype)
        self.add(f"{name}.w2_weight", (local, hidden, inter), part="layers", dtype=dtype)
        if s is None or not fp8:
            return
        if s.modelopt:  # ModelOptFp8MoEMethod (modelopt_quant.py:1155-1192, after loading :1207-1253)
            # w13's per-shard scales and both input scales are replaced after loading (:1239, :1250-1256):
            # freed; w2's weight scale is kept as it was (:1246)
            self.dropped(f"{name}.w13_weight_scale", (local, shards), "float32")
            self.add(f"{name}.w2_weight_scale", (local,), part="layers", dtype="float32")
            self.dropped(f"{name}.w13_input_scale", (local,), "float32")
            self.dropped(f"{name}.w2_input_scale", (local,), "float32")
            self.copy(f"{name}.w13_weight_scale.max", (local,), "float32")
            self.copy(f"{name}.w13_input_scale.max", (), "float32")
            self.copy(f"{name}.w2_input_scale.max", (), "float32")
            return
        if s.block is not None:
            bn, bk = s.block
            if inter % bn or (self.p.moe_tp_size > 1 and inter % bk):
                raise LayoutError(
                    f"{name}: its intermediate partition {inter} is not divisible by the FP8 block "
                    f"{bn}x{bk}; SGLang refuses this layout ('The output_size of gate's and up's weight ... "
                    "is not divisible by weight quantization block_n', fp8.py:1586): use a TP size or "
                    "--ep-size that keeps whole blocks"
                )
            w13 = (local, shards * ceil_div(inter, bn), ceil_div(hidden, bk))
            self.add(f"{name}.w13_weight_scale_inv", w13, part="layers", dtype="float32")
            w2 = (local, ceil_div(hidden, bn), ceil_div(inter, bk))
            self.add(f"{name}.w2_weight_scale_inv", w2, part="layers", dtype="float32")
            return
        # Fp8MoEMethod per-tensor (fp8.py:1750-1761, :1806-1819; after loading :2649-2725): w13's scale
        # per shard becomes one per expert (``max(dim=1)``, :2709, :2725-2727) and the static input scales
        # their 0-d maxima (:2666-2671): the built ones freed, w2's weight scale kept as it was. Before
        # 0.5.19 w13's scale is built [E, 2] whatever the gating (0.5.17 fp8.py:1298-1300); every modelled
        # family's experts are gated.
        self.dropped(f"{name}.w13_weight_scale", (local, shards), "float32")
        self.add(f"{name}.w2_weight_scale", (local,), part="layers", dtype="float32")
        if s.static:
            self.dropped(f"{name}.w13_input_scale", (local,), "float32")
            self.dropped(f"{name}.w2_input_scale", (local,), "float32")
        self.copy(f"{name}.w13_weight_scale.max", (local,), "float32")
        if s.static:
            self.copy(f"{name}.w13_input_scale.max", (), "float32")
            self.copy(f"{name}.w2_input_scale.max", (), "float32")


def compressed_linear(
    b: Builder,
    cfg: CompressedConfig,
    sch: Scheme,
    name: str,
    shards: Sequence[int],
    inp: int,
    part: str,
    out_split: int,
    in_split: int,
) -> None:
    """A linear under compressed-tensors FP8 W8A8 (``CompressedTensorsW8A8Fp8.create_weights``,
    compressed_tensors_w8a8_fp8.py:64-145; after loading :147-237, checker.core.weights.compressed)."""
    if sch.kind == "wna16":
        wna16_linear(b, cfg, sch, name, sum(shards), inp, part, in_split)
        return
    rows = sum(shards)
    b.add(f"{name}.weight", (rows, inp), part=part, dtype="float8_e4m3fn")
    if sch.strategy == "channel":
        b.add(f"{name}.weight_scale", (rows, 1), part=part, dtype="float32")
    elif sch.strategy == "tensor":
        b.add(f"{name}.weight_scale", (len(shards),), part=part, dtype="float32")
    else:
        assert sch.block is not None
        ct_check_block(cfg, name, sch.block, shards, inp, out_split=out_split, in_split=in_split)
        bn, bk = sch.block
        b.add(f"{name}.weight_scale", (ceil_div(rows, bn), ceil_div(inp, bk)), part=part, dtype="float32")
    if sch.static_input:
        b.add(f"{name}.input_scale", (len(shards),), part=part, dtype="float32")
    # after loading: per tensor the largest weight scale (0-d), a static input scale's 0-d maximum
    if sch.strategy == "tensor":
        b.copy(f"{name}.weight_scale.max", (), "float32")
    if sch.static_input:
        b.copy(f"{name}.input_scale.max", (), "float32")


def compressed_experts(
    b: Builder, sch: Scheme | None, name: str, local: int, hidden: int, inter: int, shards: int
) -> None:
    """A FusedMoE under compressed-tensors (``CompressedTensorsW8A8Fp8MoE.create_weights``,
    compressed_tensors_w8a8_fp8_moe.py:84-237; after loading :239-313); ``sch`` None: the unquantized
    method, as without a quant config."""
    if sch is None:
        b.add(f"{name}.w13_weight", (local, shards * inter, hidden), part="layers")
        b.add(f"{name}.w2_weight", (local, hidden, inter), part="layers")
        return
    if sch.kind == "wna16":
        wna16_experts(b, sch, name, local, hidden, inter)
        return
    if sch.block is not None:
        bn, bk = sch.block
        if inter % bn or (b.p.moe_tp_size > 1 and inter % bk):
            raise LayoutError(
                f"{name}: its intermediate partition {inter} is not divisible by the compressed-tensors FP8 "
                f"block {bn}x{bk}; SGLang refuses this layout ('The output_size of gate's and up's weight "
                "... is not divisible by weight quantization block_n', "
                "compressed_tensors_w8a8_fp8_moe.py:112): use a TP size or --ep-size that keeps whole blocks"
            )
    # w13 is 2 x I whether or not the experts are gated (get_moe_weight_sizes(is_concat=True), :121-126)
    shards = 2
    b.add(f"{name}.w13_weight", (local, shards * inter, hidden), part="layers", dtype="float8_e4m3fn")
    b.add(f"{name}.w2_weight", (local, hidden, inter), part="layers", dtype="float8_e4m3fn")
    if sch.strategy == "tensor":
        b.add(f"{name}.w13_weight_scale", (local, 2), part="layers", dtype="float32")
        b.add(f"{name}.w2_weight_scale", (local,), part="layers", dtype="float32")
    elif sch.strategy == "channel":
        b.add(f"{name}.w13_weight_scale", (local, shards * inter, 1), part="layers", dtype="float32")
        b.add(f"{name}.w2_weight_scale", (local, hidden, 1), part="layers", dtype="float32")
    else:
        assert sch.block is not None
        bn, bk = sch.block
        w13 = (local, 2 * ceil_div(inter, bn), ceil_div(hidden, bk))
        b.add(f"{name}.w13_weight_scale", w13, part="layers", dtype="float32")
        w2 = (local, ceil_div(hidden, bn), ceil_div(inter, bk))
        b.add(f"{name}.w2_weight_scale", w2, part="layers", dtype="float32")
    if sch.static_input:
        b.add(f"{name}.w13_input_scale", (local,), part="layers", dtype="float32")
        b.add(f"{name}.w2_input_scale", (local,), part="layers", dtype="float32")
        b.copy(f"{name}.w13_input_scale.max", (), "float32")
        b.copy(f"{name}.w2_input_scale.max", (), "float32")
    if sch.strategy == "tensor":
        b.copy(f"{name}.w13_weight_scale.max", (local,), "float32")


def wna16_linear(
    b: Builder, cfg: CompressedConfig, sch: Scheme, name: str, rows: int, inp: int, part: str, in_split: int
) -> None:
    """A linear under compressed-tensors WNA16 (``CompressedTensorsWNA16.create_weights``,
    compressed_tensors_wNa16.py:98-206): ``weight_packed`` int32 [out, in / pack]; ``weight_scale`` in the
    model dtype [out, groups], the groups of the rank's input partition, or of the whole input where
    ``marlin_repeat_scales_on_all_ranks`` repeats them (activation order, or per channel on a row-split
    linear, marlin_utils.py:281-287); ``weight_shape`` int64 [2]; asymmetric, ``weight_zero_point``
    int32 [out / pack, groups]; with activation order ``group``, ``weight_g_idx`` int32 [in]. After
    loading (:210-302) the Marlin repack of the weight, the scales and the zero points keeps their sizes
    (a new tensor each, the old freed); the scheme keeps a Marlin workspace (one int32 per SM, :232) and,
    with ``g_idx``, its sort indices (int32 [in], :271-275)."""
    full = inp * in_split
    row_parallel = full != inp
    size = sch.group if sch.group != -1 else full
    repeat = sch.g_idx or (sch.group == -1 and row_parallel)
    groups = full // size
    if not repeat:
        if inp % size:
            raise LayoutError(
                f"{name}: its input partition {inp} is not divisible by the compressed-tensors group size "
                f"{size}; SGLang refuses this layout (an assertion, compressed_tensors_wNa16.py:128): use a "
                "TP size that keeps whole groups"
            )
        groups = inp // size
    b.add(f"{name}.weight_packed", (rows, inp // sch.pack), part=part, dtype="int32")
    b.add(f"{name}.weight_scale", (rows, groups), part=part)
    b.add(f"{name}.weight_shape", (2,), part=part, dtype="int64")
    if not sch.symmetric:
        b.add(f"{name}.weight_zero_point", (rows // sch.pack, groups), part=part, dtype="int32")
    if sch.g_idx:
        b.add(f"{name}.weight_g_idx", (inp,), part=part, dtype="int32")
    b.marlin_workspace(f"{name}.marlin_workspace", 1)
    if sch.g_idx:
        b.copy(f"{name}.g_idx_sort_indices", (inp,), "int32")


def wna16_experts(b: Builder, sch: Scheme, name: str, local: int, hidden: int, inter: int) -> None:
    """A FusedMoE under compressed-tensors WNA16 with the Marlin runner (``CompressedTensorsWNA16MoE``,
    compressed_tensors_wNa16_moe.py:100-280): ``w13_weight_packed`` int32 [E, H / pack, 2I],
    ``w2_weight_packed`` [E, I / pack, H]; scales in the model dtype [E, H / g, 2I] and [E, I' / g, H]
    (I' the whole intermediate size where an activation order other than ``static`` is set, :145-154,
    one group per channel); ``w2_weight_shape``/``w13_weight_shape`` [E, 2] in the default (model)
    dtype; asymmetric, zero points int32 [E, H / g, 2I / pack] and [E, I' / g, H / pack]; four int32
    ``g_idx`` tensors ([E, H], [E, I], twice). After loading (:282-404): the Marlin repack resizes the
    weights, scales and zero points in place (the same sizes); without activation order ``group`` the
    four ``g_idx`` tensors are replaced by empty ones (freed: ``dropped``); a workspace of four int32 per
    SM (:403)."""
    pack = sch.pack
    full_w2 = sch.actorder is not None and sch.actorder != "static" and sch.group != -1
    w2_size = inter * (b.p.moe_tp_size if full_w2 else 1)
    if sch.group == -1:
        g13 = g2 = 1
    else:
        g13, g2 = hidden // sch.group, w2_size // sch.group
    b.add(f"{name}.w13_weight_packed", (local, hidden // pack, 2 * inter), part="layers", dtype="int32")
    b.add(f"{name}.w2_weight_packed", (local, inter // pack, hidden), part="layers", dtype="int32")
    b.add(f"{name}.w13_weight_scale", (local, g13, 2 * inter), part="layers")
    b.add(f"{name}.w2_weight_scale", (local, g2, hidden), part="layers")
    b.add(f"{name}.w2_weight_shape", (local, 2), part="layers")
    b.add(f"{name}.w13_weight_shape", (local, 2), part="layers")
    if not sch.symmetric:
        b.add(f"{name}.w13_weight_zero_point", (local, g13, 2 * inter // pack), part="layers", dtype="int32")
        b.add(f"{name}.w2_weight_zero_point", (local, g2, hidden // pack), part="layers", dtype="int32")
    for tensor, width in (
        ("w13_weight_g_idx", hidden),
        ("w2_weight_g_idx", inter),
        ("w13_g_idx_sort_indices", hidden),
        ("w2_g_idx_sort_indices", inter),
    ):
        if sch.g_idx:
            b.add(f"{name}.{tensor}", (local, width), part="layers", dtype="int32")
        else:
            b.dropped(f"{name}.{tensor}", (local, width), "int32")
    b.marlin_workspace(f"{name}.marlin_workspace", 4)


# ---- the model's config -----------------------------------------------------------------------------


class ConfigSection:
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

    def section(self, key: str) -> ConfigSection:
        value = self.data.get(key)
        if value is None:
            return ConfigSection({}, self.source, f"{self.prefix}{key}.")
        if not isinstance(value, Mapping):
            raise self._error(key, value, f"must be a JSON object, not {json_kind(value)}")
        return ConfigSection(value, self.source, f"{self.prefix}{key}.")


def config_dtype(cfg: ConfigSection) -> str:
    """The config's dtype, as ``ModelConfig`` reads it (``dtype`` or ``torch_dtype``; float32 when unset)."""
    raw = cfg.data.get("dtype") or cfg.data.get("torch_dtype")
    if raw is None:
        return "float32"
    if not isinstance(raw, str) or raw.lower().removeprefix("torch.") not in _DTYPE_NAMES:
        raise ConfigError(f"{cfg.source}: {cfg.prefix}torch_dtype={shorten(raw)} is not a dtype SGLang loads")
    return _DTYPE_NAMES[raw.lower().removeprefix("torch.")]


def model_dtype(cfg: ConfigSection, flag: str) -> str:
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
class FamilyWeights:
    """How one model family's class builds a rank."""

    name: str
    model_types: tuple[str, ...]
    text_section: str | None
    num_layers: Callable[[ConfigSection], int]
    build: Callable[[Builder, ConfigSection, ConfigSection, WeightsLayout, str], None]
    """(builder, the whole config, the text config, the layout, the release)"""
    tensors: Callable[[ConfigSection, ConfigSection], Iterator[tuple[str, tuple[int, ...]]]]
    """(the whole config, the text config) -> the checkpoint's tensor names and shapes, a per-expert name
    with ``experts.E.`` in place of the expert index (checker.families.rules.check_shapes)."""
    unknown_tensor_rule: str | None = None
    """The config rule (checker.core.releases.config_rules.where) under which the release's
    ``load_weights`` raises on a tensor the class has no parameter for; None: it skips one."""
    notes: tuple[str, ...] = field(default=())
    quant_methods: tuple[str, ...] = ()
    """The quantization methods (checker.core.weights.quant) whose per-rank weights are modelled for
    this family's class, each held to SGLang's own quantized classes (tests/fixtures/weights)."""
    hf_prefixes: tuple[tuple[str, str], ...] = ()
    """The class's ``hf_to_sglang_mapper`` prefixes, applied to a quantization's ignore list."""
    packed_modules: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The class's ``packed_modules_mapping`` entries beyond ``qkv_proj``/``gate_up_proj``."""
    unquantized: tuple[tuple[str, str], ...] = ()
    """(checkpoint-name prefix, what it is): modules the class builds with ``quant_config=None`` under every
    method (Qwen3.5's vision tower), which a quantized checkpoint must store unquantized."""
    draft: Callable[[Builder, ConfigSection, ConfigSection, WeightsLayout, str], None] | None = None
    """How the family's NEXTN/MTP draft class (built from the target's config, one stage) builds a rank;
    None: no draft class is modelled (:func:`draft_bytes`)."""
    load_name: Callable[[str], tuple[str, bool]] | None = None
    """Where ``unknown_tensor_rule`` is set: the parameter name ``load_weights`` looks a checkpoint name up
    as, and whether a miss is skipped; a quantized checkpoint's scales are held to the class by it."""


def text_section(fam: FamilyWeights, cfg: ConfigSection) -> ConfigSection:
    """The config section the family's language model reads (the whole config when it has none)."""
    text = cfg.section(fam.text_section) if fam.text_section else cfg
    if fam.text_section and not text.data:
        text = cfg
    return text


def embed_and_head(
    b: Builder,
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


def dp_embed_group(layout: WeightsLayout, release: str, *, split_from: str) -> str:
    """The embedding's group under attention DP where a release moved from replicating it
    (``enable_tp=not is_dp_attention_enabled()``) to splitting it over attention TP
    (``use_attn_tp_group=is_dp_attention_enabled()``) at ``split_from``; the TP group without DP."""
    if layout.dp_size == 1:
        return "tp"
    return "none" if before(release, split_from) else "attn_tp"


# -- Qwen3-Next and Qwen3.5 ------------------------------------------------------------------------------


def release_has_axis_map(release: str) -> bool:
    """MRotaryEmbedding registers its ``axis_map`` for every mrope_section from 0.5.19
    (``rotary_embedding/mrope.py`` ``_build_axis_map``); before, only for GLM's interleaving."""
    return not before(release, "0.5.19")


# -- Kimi-Linear ------------------------------------------------------------------------------------------


# -- Mamba2 mixers: Nemotron-H, Falcon-H1, Granite-4.0-H ------------------------------------------------


def plain_layers(key: str, default: int) -> Callable[[ConfigSection], int]:
    return lambda t: t.integer(key, default)


# ---- the speculative draft -----------------------------------------------------------------------------

FIRST_DRAFT_IN_BUDGET = "0.5.14"
"""From 0.5.14 the scheduler loads the draft worker before any KV pool is sized (0.5.23
``managers/scheduler.py:1128-1135`` ``init_model_worker``: ``init_tp_model_worker``,
``maybe_init_draft_worker``, then ``init_memory_pools``), so the free memory the pool is sized from
(``mem_cache/kv_cache_configurator.py:2990-3060`` ``_profile_available_bytes``: "Loaded weights (target +
draft)") has the draft's weights taken off. Up to 0.5.13.post1 the target's ``TpModelWorker`` sizes its
pool in its own constructor, before the draft worker exists: the draft comes out of the slack."""


def draft_params(
    fam: FamilyWeights,
    cfg: ConfigSection,
    text: ConfigSection,
    layout: WeightsLayout,
    place: Place,
    release: str,
) -> list[Param] | None:
    """The draft class's parameters on ``place`` (None: the rank loads no draft). Under PP only the last
    stage loads it (0.5.23 ``managers/scheduler.py:1042-1051``), built as one stage (``draft_pp_context``:
    its own embedding, layer, norm and head) with the target's TP layout (EAGLE/NEXTN:
    ``speculative/draft_parallel.py`` ``DraftTPExecution.TARGET_LAYOUT``)."""
    if layout.draft is None or fam.draft is None or not place.last:
        return None
    one = dataclasses.replace(place, pp_rank=0, pp_size=1, start_layer=0, end_layer=1)
    b = Builder(one, model_dtype(text, layout.dtype), release, None)
    fam.draft(b, cfg, text, layout, release)
    return b.params


def draft_bytes(
    fam: FamilyWeights,
    cfg: ConfigSection,
    text: ConfigSection,
    layout: WeightsLayout,
    place: Place,
    *,
    release: str,
    source: str,
) -> int:
    """What the draft adds to ``place``'s figure where ``release`` sizes the pool after loading it."""
    if layout.draft is None:
        return 0
    if layout.draft != "nextn":
        raise FlagError(
            f"--speculative-draft-model-path {shorten(layout.draft_path)}: the weights of a separate draft "
            "model are not modelled; give the weights per GPU (target and draft) with --weights-gib"
        )
    if fam.draft is None:
        raise FlagError(
            f"{source}: the checker models no NEXTN/MTP draft class for {fam.name}; give the weights per "
            "GPU (target and draft) with --weights-gib"
        )
    params = draft_params(fam, cfg, text, layout, place, release)
    if params is None or before(release, FIRST_DRAFT_IN_BUDGET):
        return 0
    return allocator_bytes([prm.nbytes for prm in params])


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


def allocator_bytes(sizes: Sequence[int], freed: Sequence[int] = ()) -> int:
    """Device memory the caching allocator reserves for ``sizes`` allocated in order and kept: a
    best-fit simulation of its two pools (blocks split while the rest is worth keeping: over 512 bytes
    in the small pool, over 1 MiB in the large one). ``freed``: indices of ``sizes`` freed after all of
    them are allocated; ``empty_cache`` then returns only the segments none of whose blocks is held."""
    free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # (block size, segment)
    segments: list[int] = []
    users: list[int] = []
    home: list[int] = []
    for size in sizes:
        size = max(_MIN_BLOCK, -(-size // _MIN_BLOCK) * _MIN_BLOCK)
        small = size <= _SMALL_SIZE
        pool = free[small]
        fits = [blk for blk in pool if blk[0] >= size]
        if fits:
            blk, seg = min(fits)
            pool.remove((blk, seg))
        else:
            if small:
                blk = _SMALL_BUFFER
            elif size < _MIN_LARGE_ALLOC:
                blk = _LARGE_BUFFER
            else:
                blk = -(-size // _ROUND_LARGE) * _ROUND_LARGE
            seg = len(segments)
            segments.append(blk)
            users.append(0)
        users[seg] += 1
        home.append(seg)
        rest = blk - size
        if rest >= (_MIN_BLOCK if small else _SMALL_SIZE + 1):
            pool.append((rest, seg))
    for i in freed:
        users[home[i]] -= 1
    return sum(blk for blk, n in zip(segments, users, strict=True) if n > 0)


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
    draft_bytes: int = 0
    """The speculative draft model this rank loads before the KV pool is sized (its parameters, buffers
    and segments; :func:`draft_bytes`): 0 where it loads none or the release loads it after."""
    note: str = ""
    """An assumption the figure rests on, in words for its source line: a Marlin workspace sized for
    :data:`MARLIN_SMS` where the GPU's SM count is not known (:func:`marlin_assumption`)."""

    @property
    def margin_bytes(self) -> int:
        return self.buffer_bytes + self.copy_bytes + self.rounding_bytes

    @property
    def target_bytes(self) -> int:
        """The figure SGLang logs as the target's weights' ``mem usage``: parameters plus the margin."""
        return self.param_bytes + self.margin_bytes

    @property
    def total_bytes(self) -> int:
        """What the budget takes off free memory: the target's weights and the draft's."""
        return self.target_bytes + self.draft_bytes

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


QUANT_FAMILIES = {
    "fp8": ("Qwen3-Next", "Qwen3.5", "Nemotron-H"),
    "modelopt_fp8": ("Nemotron-H", "Falcon-H1", "Qwen3.5"),
    "modelopt_fp4": ("Nemotron-H", "Qwen3-Next", "Qwen3.5"),
    "compressed-tensors": ("Qwen3-Next", "Nemotron-H", "Qwen3.5", "Falcon-H1", "Granite-4.0-H"),
    "gptq_marlin": ("Qwen3-Next", "Nemotron-H", "Qwen3.5", "Falcon-H1", "Granite-4.0-H"),
    "awq_marlin": ("Qwen3-Next", "Nemotron-H", "Qwen3.5"),
}
"""The families whose class is modelled under each method (FamilyWeights.quant_methods), for messages."""


def check_quant_family(fam: FamilyWeights, quant: QuantScheme | None, source: str) -> None:
    """A quantization whose method is not modelled for ``fam``'s class: one line (before any shard)."""
    if quant is not None and quant.method not in fam.quant_methods:
        raise FlagError(
            f"{source}: the model is quantized ({quant.describe()}); the checker models that method for "
            f"{', '.join(QUANT_FAMILIES.get(quant.method, ())) or 'no family'} only, not {fam.name}: give "
            "the weights per GPU with --weights-gib"
        )


def rank_params_of(
    fam: FamilyWeights, config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str
) -> list[tuple[Place, list[Param]]]:
    """Every rank's parameters, buffers and kept copies (name, per-rank shape, held dtype), in
    world-rank order and in the order ``fam``'s class builds them (checker.families.rules.rank_params
    finds ``fam``)."""
    cfg = ConfigSection(config, source)
    text = text_section(fam, cfg)
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
    quant = read_scheme(config, flag=layout.quantization, source=source)
    if quant is not None:
        quant = quant.mapped(fam.hf_prefixes, fam.packed_modules)
        check_release(quant.method, release, quant.describe(), source)
        if quant.ct is not None:
            ct_check_release(quant.ct, release)
        if quant.fp4 is not None:
            fp4_check_release(quant.fp4, release, source)
    check_quant_family(fam, quant, source)
    if quant is not None and layout.draft is not None:
        raise FlagError(
            f"{source}: the model is quantized ({quant.describe()}) and a NEXTN/MTP draft loads beside it; "
            "the checker models the draft's weights unquantized only: give the weights per GPU with "
            "--weights-gib"
        )
    experts = text.integer("num_experts", 0, minimum=0) or text.integer("num_local_experts", 0, minimum=0)
    if experts and quant is not None and quant.gq is not None:
        check_backend(layout.moe_runner_backend, quant.gq)
    if experts and quant is not None and quant.aw is not None:
        check_awq_backend(layout.moe_runner_backend, quant.aw)
    if experts and layout.moe_runner_backend not in ("auto", "triton"):
        raise FlagError(
            f"--moe-runner-backend {shorten(layout.moe_runner_backend)}: the checker models the expert "
            "weights as the auto/triton runners hold them (others pad or re-lay them); give the weights "
            "per GPU with --weights-gib"
        )
    out = []
    all_layers = status is not None and status[0] == "all-layers"
    for place in places(layout, fam.num_layers(text), release, all_layers=all_layers):
        b = Builder(place, dtype, release, quant)
        b.sms = layout.gpu_sm_count or MARLIN_SMS
        fam.build(b, cfg, text, layout, release)
        out.append((place, b.params))
    return out


def _is_workspace(prm: Param) -> bool:
    """A Marlin workspace (:meth:`Builder.marlin_workspace`): its size is the GPU's SM count's."""
    return prm.part == "copies" and prm.name.endswith("workspace")


def model_weights_of(
    fam: FamilyWeights, config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str
) -> ModelWeights:
    """Every rank's weights for ``layout`` as SGLang ``release``'s class of ``fam`` holds them
    (checker.families.rules.model_weights finds ``fam``)."""
    cfg = ConfigSection(config, source)
    text = text_section(fam, cfg)
    ranks = []
    for place, params in rank_params_of(fam, config, layout, release=release, source=source):
        by_part = dict.fromkeys(PARTS + EXTRA_PARTS, 0)
        for prm in params:
            by_part[prm.part] += prm.nbytes
        dropped = [i for i, prm in enumerate(params) if prm.part == "dropped"]
        held = sum(by_part.values()) - by_part["dropped"]
        ranks.append(
            RankWeights(
                place=place,
                param_bytes=sum(by_part[k] for k in PARTS),
                by_part={k: by_part[k] for k in PARTS},
                buffer_bytes=by_part["buffers"],
                copy_bytes=by_part["copies"],
                rounding_bytes=allocator_bytes([prm.nbytes for prm in params], dropped) - held,
                draft_bytes=draft_bytes(fam, cfg, text, layout, place, release=release, source=source),
                note=marlin_assumption(MARLIN_SMS)
                if layout.gpu_sm_count is None and any(_is_workspace(prm) for prm in params)
                else "",
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
