"""A compressed-tensors checkpoint as SGLang 0.5.23 reads it, and what its FP8 W8A8 schemes hold (torch-free).

Read from config.json's ``quantization_config`` (``quant_method: compressed-tensors``) or its
``compression_config`` (the same document, ``configs/model_config.py:1744``), as
``CompressedTensorsConfig.from_config`` reads it (``layers/quantization/compressed_tensors/
compressed_tensors.py``, 0.5.23 line numbers below): ``config_groups`` (each a ``targets`` list, ``weights``
and ``input_activations`` arguments, an optional ``format``), the top-level ``format``, ``ignore`` and
``kv_cache_scheme`` (:282-340, :342-395). Per module SGLang picks a scheme:

* **Ignored** (``should_ignore_layer``, ``compressed_tensors/utils.py:24-76``): an ``ignore`` entry equal to
  the module name or a dotted suffix of it, or a ``re:`` regex matching from its start; a fused module
  (the class's ``packed_modules_mapping``: ``qkv_proj``, ``gate_up_proj``) by its checkpoint shards, all
  or none; a FusedMoE by its expert 0's ``gate_proj``/``up_proj``/``down_proj`` (:880-897). Ignored: the
  unquantized method, the module held as the bf16 class holds it.
* **Target** (``find_matched_target``, utils.py:103-148): the first target equal to (or a ``re:`` match of)
  the module name, else the first contained in the module's class name (``Linear`` matches every linear
  class, ``FusedMoE`` is added for every MoE where ``Linear`` is a target, :257-270), else the fused
  shards' common target; none: SGLang's ``Unable to find matching target`` (refused).
* **FP8 W8A8** (``_is_fp8_w8a8`` :527-560, on a GPU of capability >= 89: Hopper): float 8-bit weights,
  symmetric and static, strategy ``tensor``/``channel``/``block``, activations float 8-bit either dynamic or
  static symmetric per-tensor; a linear takes ``CompressedTensorsW8A8Fp8``
  (``schemes/compressed_tensors_w8a8_fp8.py``), an MoE ``CompressedTensorsW8A8Fp8MoE``
  (``schemes/compressed_tensors_w8a8_fp8_moe.py``).

What a linear holds (w8a8_fp8.py:64-145): the weight ``[out, in]`` in ``float8_e4m3fn``; ``weight_scale``
float32 ``[shards]`` per tensor, ``[out, 1]`` per channel, ``[ceil(out/bn), ceil(in/bk)]`` per block; a
static ``input_scale`` ``[shards]``. After loading (:147-237): per tensor the weight is requantized in
place to the largest shard scale and ``weight_scale`` becomes that 0-d maximum (a new 4-byte tensor), the
weight a transposed view (no bytes); per channel a view and the same scale; per block nothing on Hopper
(the UE8M0 requantization, :212, ``fp8_utils.py:2147-2176``, is DeepGEMM's Blackwell path and works
in place); a static
``input_scale`` becomes its 0-d maximum. An MoE (w8a8_fp8_moe.py:84-237): ``w13``/``w2`` in float8,
``w13_weight_scale``/``w2_weight_scale`` ``[E, 2]``/``[E]`` per tensor, ``[E, 2I, 1]``/``[E, H, 1]`` per
channel, the block grids ``[E, 2*ceil(I/bn), ceil(H/bk)]``/``[E, ceil(H/bn), ceil(I/bk)]``, static input
scales ``[E]`` each; after loading per tensor ``w13_weight_scale`` becomes ``[E]`` (:293-313), static input
scales their 0-d maxima (:240-262). A RadixAttention holds ``k_scale``/``v_scale`` only where
``kv_cache_scheme`` is static symmetric per-tensor FP8 (:212-225, :1267-1285).

Refused in one line: what 0.5.23 refuses (a scheme its MoE method rejects: per-tensor weights with
per-token activations or per-channel weights with per-tensor ones, an assertion at :65; static
per-token activations, :75; a module no target matches; shards ignored unevenly; a block that does
not divide a partition, :110-121 and ``fp8_utils.py:2852-2893``; a block-quantized head, :1138) and
what the checker does not model (every other scheme, named: W8A16 FP8, INT W8A8, W4A8, NVFP4, MXFP4; a
quantized LM head; sparsity).

* **INT weight-only** (``_is_wNa16_group_channel`` :633-651, ``format: pack-quantized``, 4 or 8 bits):
  ``CompressedTensorsWNA16`` per linear, ``CompressedTensorsWNA16MoE`` (Marlin, the ``auto`` runner on
  Hopper, :934-966) per MoE; what they hold: checker.core.weights.weights ``wna16_linear`` and
  ``wna16_experts``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checker.core.errors import ConfigError, FlagError, LayoutError, shorten
from checker.core.releases.releases import release_key

_ACT_FORMATS = (
    "naive-quantized",
    "int-quantized",
    "float-quantized",
    "nvfp4-pack-quantized",
    "pack-quantized",
)
"""``is_activation_quantization_format`` (compressed_tensors/utils.py:13-21)."""

_WAY_OUT = "give the weights per GPU with --weights-gib"
_MODELLED = "compressed-tensors FP8 W8A8 and INT weight-only (WNA16) only"

LINEAR_CLASSES = (
    "QKVParallelLinear",
    "MergedColumnParallelLinear",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "ReplicatedLinear",
)


@dataclass(frozen=True)
class Args:
    """One ``QuantizationArgs`` (the fields the scheme choice reads)."""

    num_bits: int
    type: str
    strategy: str
    dynamic: bool
    symmetric: bool
    group_size: int | None
    block: tuple[int, int] | None
    actorder: str | None


@dataclass(frozen=True)
class Scheme:
    """What one module holds: ``kind`` ``w8a8_fp8`` (strategy ``tensor``/``channel``/``block``) or
    ``wna16`` (integer weight-only, pack-quantized: ``bits``, ``group`` -1 per channel, ``symmetric``
    False with zero points, ``actorder`` as the config gives it)."""

    kind: str
    strategy: str
    static_input: bool
    block: tuple[int, int] | None = None
    bits: int = 8
    group: int = -1
    symmetric: bool = True
    actorder: str | None = None

    @property
    def pack(self) -> int:
        """Values per int32 (``pack_factor = 32 // num_bits``, compressed_tensors_wNa16.py:73)."""
        return 32 // self.bits

    @property
    def g_idx(self) -> bool:
        """``actorder == ActivationOrdering.GROUP`` (its alias ``dynamic`` included): the linear's
        ``weight_g_idx`` (compressed_tensors_wNa16.py:77), the MoE's sorted ``g_idx`` kept
        (compressed_tensors_wNa16_moe.py:318)."""
        return self.actorder in ("group", "dynamic")


def _wna16(w: Args) -> Scheme:
    group = -1 if w.strategy == "channel" or w.group_size is None else w.group_size
    return Scheme("wna16", w.strategy, False, None, w.num_bits, group, w.symmetric, w.actorder)


@dataclass(frozen=True)
class Group:
    weights: Args
    inputs: Args | None
    compression_format: str | None
    """compressed-tensors' ``format`` (CompressionFormat: pack-quantized, float-quantized, ...)."""


@dataclass(frozen=True)
class CompressedConfig:
    """``CompressedTensorsConfig`` as the checker reads it: targets in config order, the ignore list."""

    targets: tuple[tuple[str, Group], ...]
    ignore: tuple[str, ...]
    compression_format: str | None
    """The top-level ``format``, for groups that name none."""
    kv: bool
    source: str
    fused: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def mapped(
        self, prefixes: Sequence[tuple[str, str]], fused: Sequence[tuple[str, tuple[str, ...]]]
    ) -> CompressedConfig:
        """``apply_weight_name_mapper`` (:169-180): the ignore list and the target names under the class's
        ``hf_to_sglang_mapper`` prefixes; ``fused``: the class's ``packed_modules_mapping``."""

        def apply(name: str) -> str:
            for old, new in prefixes:
                if name.startswith(old):
                    return new + name[len(old) :]
            return name

        targets = tuple(dict((apply(t), g) for t, g in self.targets).items())
        return CompressedConfig(
            targets,
            tuple(apply(n) for n in self.ignore),
            self.compression_format,
            self.kv,
            self.source,
            tuple(fused),
        )

    # -- which modules are ignored, and which target they take ---------------------------------------

    def ignored(self, name: str) -> bool:
        """``should_ignore_layer`` (utils.py:24-77)."""
        proj = name.split(".")[-1]
        fused = dict(self.fused)
        if proj in fused and name not in self.ignore:
            seen = {_listed(name.replace(proj, shard), self.ignore) for shard in fused[proj]}
            if len(seen) > 1:
                raise ConfigError(
                    f"{self.source}: compressed-tensors ignore names some but not all of {name}'s shards "
                    f"({', '.join(fused[proj])}); SGLang refuses it ('Found different quantization schemes', "
                    "compressed_tensors/utils.py:63)"
                )
            return seen.pop()
        return _listed(name, self.ignore)

    def _target(self, name: str, cls: str) -> str | None:
        """``find_matched_target`` (utils.py:101-146): by name, by class name, by fused shards."""
        keys = [t for t, _ in self.targets]
        for t in keys:
            if _equal_or_regex(name, t):
                return t
        for t in keys:
            if _equal_or_regex(cls, t, contains=True):
                return t
        fused = next((k for k, _ in self.fused if name.endswith(k)), None)
        if fused is not None:
            found = []
            for shard in dict(self.fused)[fused]:
                unfused = name.replace(fused, shard)
                found.append(next((t for t in keys if _equal_or_regex(unfused, t)), None))
            if all(found):
                return found[0]
        return None

    def _group(self, name: str, cls: str) -> Group | None:
        """The module's group; None where the config has no targets at all (``get_scheme_dict``
        :1171-1182: the unquantized method)."""
        if not self.targets:
            return None
        target = self._target(name, cls)
        if target is None:
            raise ConfigError(
                f"{self.source}: no compressed-tensors target matches {name}; SGLang refuses it ('Unable to "
                "find matching target ... in the compressed-tensors config', compressed_tensors/utils.py:145)"
            )
        return dict(self.targets)[target]

    # -- the scheme of a linear and of an MoE ------------------------------------------------------------

    def linear(self, name: str, cls: str) -> Scheme | None:
        """``get_linear_scheme`` (:1007-1093); None: the unquantized method."""
        if self.ignored(name):
            return None
        group = self._group(name, cls)
        return None if group is None else self._linear_scheme(group, name)

    def head(self, name: str) -> Scheme | None:
        """``get_lm_head_scheme`` (:1095-1150): quantized only where a target names the head."""
        if not self.targets or self.ignored(name):
            return None
        target = next((t for t, _ in self.targets if _listed(name, (t,)) or _equal_or_regex(name, t)), None)
        if target is None:
            return None
        group = dict(self.targets)[target]
        if group.weights.block is not None:
            raise ConfigError(
                f"{self.source}: compressed-tensors quantizes {name} block-wise; SGLang refuses it "
                "('Block-quantized lm_head is not supported', compressed_tensors.py:1138)"
            )
        self._linear_scheme(group, name)
        raise FlagError(
            f"{self.source}: compressed-tensors quantizes the LM head ({name}); the checker models "
            f"compressed-tensors heads unquantized only: {_WAY_OUT}"
        )

    def _linear_scheme(self, group: Group, name: str) -> Scheme:
        """``_get_scheme_from_parts`` (:721-862) on Hopper."""
        w, a = group.weights, group.inputs
        fmt = group.compression_format if group.compression_format is not None else self.compression_format
        if _is_wna16(w, a):
            if fmt == "pack-quantized" and w.num_bits in (4, 8):
                if w.strategy == "group" and w.group_size in (None, -1):  # :79-82
                    raise ConfigError(
                        f"{self.source}: compressed-tensors {name}: group strategy without a group size; "
                        "SGLang refuses it ('Marlin kernels require group quantization or channelwise "
                        "quantization', compressed_tensors_wNa16.py:80)"
                    )
                return _wna16(w)
            raise ConfigError(
                f"{self.source}: compressed-tensors {name}: integer weight-only {w.strategy} quantization in "
                f"format {shorten(fmt)}: SGLang refuses it ('CompressedTensorsW4A16Sparse24 is not supported "
                "now', compressed_tensors.py:750)"
            )
        if fmt in _ACT_FORMATS:
            if w.type == "float" and w.num_bits == 4:
                self._unmodelled("float4 (NVFP4/MXFP4)")
            if _is_fp8_w8a8(w, a):
                assert a is not None
                block = w.block if w.strategy == "block" else None
                return Scheme("w8a8_fp8", w.strategy, not a.dynamic, block)
            if _is_fp8_w8a16(w):
                self._unmodelled("FP8 weight-only (CompressedTensorsW8A16Fp8)")
            if w.type == "int" and a is not None and w.num_bits == a.num_bits == 8:
                self._unmodelled("INT8 W8A8 (CompressedTensorsW8A8Int8)")
        acts = (
            "no activation quantization"
            if a is None
            else f"{a.type} {a.num_bits}-bit {a.strategy} activations"
        )
        raise ConfigError(
            f"{self.source}: compressed-tensors {name}: weights {w.type} {w.num_bits}-bit {w.strategy} with "
            f"{acts} in format {shorten(fmt)}: SGLang refuses it ('No compressed-tensors compatible scheme "
            "was "
            "found', compressed_tensors.py:862)"
        )

    def moe(self, name: str) -> Scheme | None:
        """``get_moe_scheme`` (:864-1005) and ``CompressedTensorsW8A8Fp8MoE.__init__``
        (w8a8_fp8_moe.py:51-80); None: the unquantized MoE method."""
        schemes = []
        for proj in ("gate_proj", "up_proj", "down_proj"):
            expert = f"{name}.0.{proj}"
            schemes.append(None if self.ignored(expert) else self._group(expert, "FusedMoE"))
        if any(s != schemes[0] for s in schemes):
            raise ConfigError(
                f"{self.source}: compressed-tensors gives {name}'s gate_proj, up_proj and down_proj "
                "different schemes; SGLang refuses it ('All MoE projections need to have same quantization "
                "scheme', "
                "compressed_tensors.py:894)"
            )
        group = schemes[0]
        if group is None:
            return None
        w, a = group.weights, group.inputs
        if _is_wna16(w, a):
            # CompressedTensorsWNA16MoE (Marlin, the auto runner on Hopper, :934-966): the config's
            # top-level format, not the group's (compressed_tensors_wNa16_moe.py:84-94)
            if not (self.compression_format == "pack-quantized" and w.num_bits in (4, 8)):
                raise ConfigError(
                    f"{self.source}: compressed-tensors {name}: INT{w.num_bits} weight-only experts under "
                    f"the top-level format {shorten(self.compression_format)}; SGLang refuses it ('For "
                    "Fused MoE layers, only pack-quantized is supported for the following bits: [4, 8]', "
                    "compressed_tensors_wNa16_moe.py:89)"
                )
            return _wna16(w)
        if w.type == "float" and w.num_bits == 4:
            self._unmodelled("float4 (NVFP4/MXFP4) experts")
        if not _is_fp8_w8a8(w, a):
            acts = "no activation quantization" if a is None else f"{a.type} {a.num_bits}-bit activations"
            raise ConfigError(
                f"{self.source}: compressed-tensors {name}: weights {w.type} {w.num_bits}-bit {w.strategy} "
                f"with {acts}: SGLang 0.5.23 has no Hopper MoE scheme for it ('Unsupported FusedMoe scheme', "
                "compressed_tensors.py:1004)"
            )
        assert a is not None
        per_tensor = w.strategy == "tensor" and a.strategy == "tensor"
        per_channel = w.strategy == "channel" and a.strategy == "token"
        if not (per_tensor or per_channel or w.strategy == "block"):
            raise ConfigError(
                f"{self.source}: compressed-tensors {name}: {w.strategy} FP8 weights with {a.strategy} "
                "activations; SGLang 0.5.23's FP8 MoE method takes per-tensor weights with per-tensor "
                "activations, per-channel with per-token, or blocks (an assertion, "
                "compressed_tensors_w8a8_fp8_moe.py:65)"
            )
        if per_channel and not a.dynamic:
            raise ConfigError(
                f"{self.source}: compressed-tensors {name}: per-channel FP8 weights with static per-token "
                "activations; SGLang refuses it ('For FP8 Fused MoE layer, we require either per tensor or "
                "channelwise, dynamic per token quantization', compressed_tensors_w8a8_fp8_moe.py:75)"
            )
        return Scheme("w8a8_fp8", w.strategy, not a.dynamic, w.block if w.strategy == "block" else None)

    def _unmodelled(self, what: str) -> None:
        raise FlagError(
            f"{self.source}: the model is quantized (compressed-tensors {what}); the checker models "
            f"{_MODELLED}: {_WAY_OUT}"
        )

    def refuse_unresolved(self) -> None:
        """Each config group that is neither weight-only nor FP8 W8A8 (INT8 W8A8, FP8 weight-only,
        float4, ...) resolved as a linear resolves it (the MoE path refuses them too): refused naming its
        scheme before any shard is read, not taken by a shard check for the FP8 scheme that is modelled."""
        for target, group in self.targets:
            if not (_is_wna16(group.weights, group.inputs) or _is_fp8_w8a8(group.weights, group.inputs)):
                self._linear_scheme(group, target)

    def strategies(self) -> set[str]:
        return {g.weights.strategy for _, g in self.targets}

    def weight_only(self) -> bool:
        """Every config group integer weight-only (WNA16): the shards hold ``weight_packed``."""
        return bool(self.targets) and all(_is_wna16(g.weights, g.inputs) for _, g in self.targets)


def _listed(name: str, targets: Sequence[str]) -> bool:
    """``check_equal_or_regex_match`` (utils.py:79-100): equal, a dotted suffix, or a ``re:`` match."""
    for t in targets:
        if t.startswith("re:"):
            if _regex(t).match(name):
                return True
        elif t == name or name.endswith("." + t):
            return True
    return False


def _equal_or_regex(value: str, target: str, *, contains: bool = False) -> bool:
    """``_is_equal_or_regex_match`` (utils.py:171-189)."""
    if target.startswith("re:"):
        return _regex(target).match(value) is not None
    if contains:
        return target.lower() in value.lower()
    return target == value


_REGEX: dict[str, re.Pattern[str]] = {}


def _regex(target: str) -> re.Pattern[str]:
    rx = _REGEX.get(target)
    if rx is None:
        rx = _REGEX[target] = re.compile(target[3:])
    return rx


def _is_wna16(w: Args, a: Args | None) -> bool:
    """``_is_wNa16_group_channel`` (:633-651)."""
    return a is None and w.strategy in ("channel", "group") and not w.dynamic and w.type == "int"


def _is_fp8_w8a8(w: Args, a: Args | None) -> bool:
    """``_is_fp8_w8a8`` (:527-560)."""
    if a is None or not (w.type == a.type == "float"):
        return False
    if not (w.symmetric and not w.dynamic and w.strategy in ("tensor", "channel", "block")):
        return False
    return a.dynamic or (a.symmetric and a.strategy == "tensor")


def _is_fp8_w8a16(w: Args) -> bool:
    return w.type == "float" and w.symmetric and not w.dynamic and w.strategy in ("tensor", "channel")


# -- reading the config ----------------------------------------------------------------------------------

_STRATEGIES = ("tensor", "channel", "group", "block", "token", "tensor_group", "attn_head")
_TYPES = ("int", "float")


def _args(raw: Any, where: str, source: str) -> Args:
    """``QuantizationArgs.model_validate`` of the fields the scheme choice reads (a field it would refuse:
    one line, as SGLang's pydantic validation fails)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: compressed-tensors {where}={shorten(raw)} must be a JSON object")

    def bad(key: str, rule: str) -> ConfigError:
        return ConfigError(
            f"{source}: compressed-tensors {where}.{key}={shorten(raw.get(key))} {rule}; SGLang's "
            "QuantizationArgs refuses it"
        )

    bits = raw.get("num_bits", 8)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 64:
        raise bad("num_bits", "must be a positive integer")
    typ = raw.get("type", "int")
    if typ not in _TYPES:
        raise bad("type", "must be int or float")
    group = raw.get("group_size")
    if group is not None and (
        isinstance(group, bool) or not isinstance(group, int) or group < -1 or group == 0
    ):
        raise bad("group_size", "must be a positive integer (or -1)")
    block = raw.get("block_structure")
    if block is not None and (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in block)
    ):
        raise bad("block_structure", "must be two positive sizes [block_n, block_k]")
    strategy = raw.get("strategy")
    if strategy is None:  # QuantizationArgs.validate_model_after: group if a group size, else tensor
        strategy = "group" if group not in (None, -1) else ("block" if block else "tensor")
    if strategy not in _STRATEGIES:
        raise bad("strategy", f"must be one of {', '.join(_STRATEGIES)}")
    if strategy == "group" and group in (None, -1):
        raise bad("group_size", "must be set for the group strategy")
    if strategy == "block" and block is None:
        raise bad("block_structure", "must be set for the block strategy")
    dynamic = raw.get("dynamic", False)
    symmetric = raw.get("symmetric", True)
    if not isinstance(dynamic, bool) and dynamic != "local":
        raise bad("dynamic", "must be true or false")
    if not isinstance(symmetric, bool):
        raise bad("symmetric", "must be true or false")
    actorder = raw.get("actorder")
    if actorder is True:  # validate_actorder: True is GROUP (compressed-tensors 0.18.0, 0.5.23's pin)
        actorder = "group"
    if isinstance(actorder, str):
        actorder = actorder.lower()
        if actorder not in ("group", "weight", "static", "dynamic"):
            raise bad("actorder", "must be group, weight, static or dynamic")
    return Args(
        num_bits=bits,
        type=typ,
        strategy=strategy,
        dynamic=bool(dynamic),
        symmetric=symmetric,
        group_size=group,
        block=(block[0], block[1]) if block else None,
        actorder=actorder if isinstance(actorder, str) else None,
    )


def read_compressed(q: Mapping[str, Any], where: str, source: str) -> CompressedConfig:
    """``CompressedTensorsConfig.from_config`` (:282-340) and ``_quantization_scheme_map_from_config``
    (:342-395)."""
    fmt = q.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise ConfigError(f"{source}: {where} format={shorten(fmt)} must be a string")
    ignore = q.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise ConfigError(f"{source}: {where} ignore={shorten(ignore)} must be a list of module names")
    if q.get("sparsity_config"):
        raise FlagError(
            f"{source}: the model is quantized (compressed-tensors with a sparsity_config); the checker "
            f"models dense {_MODELLED}: {_WAY_OUT}"
        )
    if "linear_fp8_config" in q:
        raise FlagError(
            f"{source}: the model is quantized (compressed-tensors with a linear_fp8_config: FP8 linears "
            f"beside other experts); the checker models {_MODELLED}: {_WAY_OUT}"
        )
    groups = q.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise ConfigError(f"{source}: {where} config_groups={shorten(groups)} must be a JSON object")
    targets: dict[str, Group] = {}
    for gname, g in groups.items():
        at = f"config_groups.{shorten(gname, 40)}"
        if not isinstance(g, Mapping):
            raise ConfigError(f"{source}: {where} {at}={shorten(g)} must be a JSON object")
        ts = g.get("targets")
        if not isinstance(ts, list) or not all(isinstance(t, str) for t in ts):
            raise ConfigError(f"{source}: {where} {at}.targets={shorten(ts)} must be a list of names")
        gfmt = g.get("format")
        if gfmt is not None and not isinstance(gfmt, str):
            raise ConfigError(f"{source}: {where} {at}.format={shorten(gfmt)} must be a string")
        if g.get("weights") is None:
            raise FlagError(
                f"{source}: the model is quantized (compressed-tensors {at} without weights: activations "
                f"only); the checker models {_MODELLED}: {_WAY_OUT}"
            )
        weights = _args(g.get("weights"), f"{at}.weights", source)
        inputs = None
        if (gfmt if gfmt is not None else fmt) in _ACT_FORMATS and g.get("input_activations"):
            inputs = _args(g.get("input_activations"), f"{at}.input_activations", source)
        for t in ts:
            targets[t] = Group(weights, inputs, gfmt)
    if "Linear" in targets and "FusedMoE" not in targets:  # _add_fused_moe_to_target_scheme_map
        targets["FusedMoE"] = targets["Linear"]
    for t in targets:
        if t.startswith("re:"):
            try:
                _regex(t)
            except re.error:
                raise ConfigError(
                    f"{source}: {where} target {shorten(t)} is not a regular expression Python compiles"
                ) from None
    for name in ignore:
        if name.startswith("re:"):
            try:
                _regex(name)
            except re.error:
                raise ConfigError(
                    f"{source}: {where} ignore {shorten(name)} is not a regular expression Python compiles"
                ) from None
    kv_raw = q.get("kv_cache_scheme")
    kv = (
        isinstance(kv_raw, Mapping)
        and kv_raw.get("type") == "float"
        and kv_raw.get("num_bits") == 8
        and kv_raw.get("strategy") == "tensor"
        and bool(kv_raw.get("symmetric", True))
        and not kv_raw.get("dynamic", False)
    )
    return CompressedConfig(tuple(targets.items()), tuple(ignore), fmt, kv, source)


ZERO_POINT_LINEAR_FROM = "0.5.13"
"""The first release whose linears take asymmetric (zero-point) INT weight-only schemes: 0.5.13 dropped
the symmetric test of ``_is_wNa16_group_channel`` (compressed_tensors.py:494-507); up to 0.5.12 it asks
for symmetric weights (0.5.10 :492-503) and a linear with zero points has no scheme (:629)."""

ZERO_POINT_MOE_FROM = "0.5.14"
"""The first release whose WNA16 MoE takes zero points: 0.5.13 picks it and asserts symmetric weights
(compressed_tensors_wNa16_moe.py:72); 0.5.10-0.5.12 pick no WNA16 MoE scheme and fall through to
``_is_dynamic_token_w8a8`` on absent input arguments (0.5.10 compressed_tensors.py:700 -> :387,
AttributeError). 0.5.15 checked."""

KV_SCALES_FROM = "0.5.19"
"""The first release whose attention layers take the ``kv_cache_scheme`` (``CompressedTensorsKVCacheMethod``,
0.5.19 compressed_tensors.py:207): before it a RadixAttention gets no quant method, no k/v scales
(0.5.17 checked)."""

PINNED_FROM = "0.5.20"
"""The first release that pins compressed-tensors (``compressed-tensors==0.18.0`` in the wheel's
METADATA); up to 0.5.17 it is unpinned, and the release pip installs today (0.20) refuses
``actorder: group`` in the config itself ("actorder='group' has been removed", a pydantic error)."""


def _before(release: str, first: str) -> bool:
    return release_key(release) < release_key(first)


def check_release(cfg: CompressedConfig, release: str) -> None:
    """What ``release`` refuses of the whole config (read before any module is built): one line."""
    if _before(release, PINNED_FROM) and any(
        g.weights.actorder in ("group", "dynamic") for _, g in cfg.targets
    ):
        raise ConfigError(
            f"{cfg.source}: compressed-tensors actorder 'group' on SGLang {release}, which does not pin "
            "compressed-tensors: the release pip installs with it (0.20) refuses the config ('actorder="
            f"'group' has been removed'); SGLang {PINNED_FROM}+ pins 0.18.0, which takes it"
        )


def check_release_scheme(cfg: CompressedConfig, sch: Scheme, name: str, release: str, *, moe: bool) -> None:
    """What ``release`` refuses of one module's scheme, at the module where the release's build stops."""
    if sch.kind != "wna16" or sch.symmetric:
        return
    if moe and _before(release, ZERO_POINT_LINEAR_FROM):
        raise ConfigError(
            f"{cfg.source}: compressed-tensors {name}: INT{sch.bits} weight-only experts with zero points; "
            f"SGLang {release} has no MoE scheme for asymmetric weights (its scheme choice fails with "
            "\"'NoneType' object has no attribute 'num_bits'\", 0.5.10 compressed_tensors.py:387); "
            f"{ZERO_POINT_MOE_FROM}+ takes them"
        )
    if moe and _before(release, ZERO_POINT_MOE_FROM):
        raise ConfigError(
            f"{cfg.source}: compressed-tensors {name}: INT{sch.bits} weight-only experts with zero points; "
            f"SGLang {release} refuses them ('Only symmetric quantization is supported for MoE', "
            f"compressed_tensors_wNa16_moe.py:72); {ZERO_POINT_MOE_FROM}+ takes them"
        )
    if not moe and _before(release, ZERO_POINT_LINEAR_FROM):
        raise ConfigError(
            f"{cfg.source}: compressed-tensors {name}: INT{sch.bits} weight-only with zero points; SGLang "
            f"{release} refuses it ('No compressed-tensors compatible scheme was found', 0.5.10 "
            f"compressed_tensors.py:629: its WNA16 test asks for symmetric weights, :496); "
            f"{ZERO_POINT_LINEAR_FROM}+ takes it"
        )


def check_block(
    cfg: CompressedConfig,
    name: str,
    block: tuple[int, int],
    shards: Sequence[int],
    inp: int,
    *,
    out_split: int,
    in_split: int,
) -> None:
    """``validate_fp8_block_shape`` (fp8_utils.py:2852-2893): a row-split input partition divisible by
    bk; a column-split output partition (every shard) or a merged one (every shard but the last)
    divisible by bn."""
    bn, bk = block
    if in_split > 1 and inp % bk:
        raise LayoutError(
            f"{name}: its input partition {inp} is not divisible by the compressed-tensors FP8 block_k {bk}; "
            "SGLang refuses this layout ('Weight input_size_per_partition ... is not divisible by weight "
            "quantization block_k', fp8_utils.py:2873): use a TP size that keeps whole blocks"
        )
    sizes: Sequence[int] = ()
    if out_split > 1:
        sizes = shards
    elif len(shards) > 1:
        sizes = shards[:-1]
    for size in sizes:
        if size % bn:
            raise LayoutError(
                f"{name}: its output partition {size} is not divisible by the compressed-tensors FP8 block_n "
                f"{bn}; SGLang refuses this layout ('Weight output_partition_size ... is not divisible by "
                "weight quantization block_n', fp8_utils.py:2889): use a TP size that keeps whole blocks"
            )
