"""ModelOpt NVFP4 (``modelopt_fp4``) as SGLang 0.5.23 reads and holds it on a Hopper rank (torch-free).

Read (``ModelOptFp4Config.from_config``, ``layers/quantization/modelopt_quant.py:1595-1702``) from
config.json's flat ``quantization_config`` (``quant_method: modelopt``, ``quant_algo: NVFP4``,
``group_size`` else 16, ``ignore``/``modules_to_not_convert``/``exclude_modules``) or the nested
``hf_quant_config.json`` beside it (``{"quantization": {"quant_algo", "exclude_modules", ...}}`` whose
``group_size`` ``common_group_size`` finds, :1562-1592: none or two different ones is the release's
ValueError). The KV-cache algorithm is ``auto`` where none is declared (:1619-1640, :1658-1660), a truthy
string: every RadixAttention built with the quant config holds ``k_scale``/``v_scale`` (:345-346).

Built on the rank (every layer of the class's own prefix outside ``exclude_modules``, as ModelOpt FP8):

* a linear (``ModelOptFp4LinearMethod.create_weights`` :1796-1884): ``weight`` uint8 ``[N, K/2]`` (two
  e2m1 values a byte), ``weight_scale`` float8_e4m3fn ``[N, K/group]``, float32 ``input_scale`` and
  ``weight_scale_2`` ``[shards]``; an input partition K not a multiple of 16 is the release's ValueError
  (:1822-1825);
* a FusedMoE (``ModelOptNvFp4FusedMoEMethod.create_weights`` :2467-2648): ``w13_weight`` uint8
  ``[E, 2I, H/2]``, ``w2_weight`` ``[E, H, I/2]``, their float8 block scales ``[E, 2I, H/g]`` and
  ``[E, H, I/g]``, each with a swizzled copy built beside it as a parameter
  (``w13_blockscale_swizzled``: ``swizzle_blockscale`` pads rows to 128 and columns to 4,
  ``quantization/utils.py:574-603``), float32 ``w13_weight_scale_2`` ``[E, 2]`` and ``w2_weight_scale_2``
  ``[E]``, and input scales over the layer's *global* experts (``num_experts``, fused shared-expert
  slots included): ``w13_input_scale`` ``[E_all, 2]``, ``w2_input_scale`` ``[E_all]``.

A Hopper GPU (SM90) runs both through Marlin: the FP4 GEMM backend ``auto`` is ``marlin`` on SM80-SM99
(``fp4_utils.py:149-162``) and the MoE method's auto runner falls back to Marlin there (:2377-2387); the
native FP4 GEMMs need SM100+ (:1931-1935). After loading (on Hopper, worked from the code; the CPU build
stops before it):

* a linear (:1886-1929, ``prepare_nvfp4_layer_for_marlin`` ``marlin_utils_fp4.py:140-222``) keeps
  ``input_scale`` and ``weight_scale_2`` and adds 0-d float32 ``alpha``, ``input_scale_inv``,
  ``input_global_scale``, a ``weight_global_scale`` ``[1]`` in the model dtype and a Marlin workspace
  (one int32 per SM); the weight and its scale are repacked to the same sizes, padded first to the
  smaller of ``N%64/K%128`` and ``N%128/K%64`` where the partition is not whole tiles (the padded copies
  replace the built ones);
* a FusedMoE (:2735-2760, ``prepare_moe_nvfp4_layer_for_marlin`` ``marlin_utils_fp4.py:468-570``)
  repacks its weights and scales to the same sizes, replaces ``w13_weight_scale_2``/``w2_weight_scale_2``
  by ``[E]`` in the model dtype (the float32 ones freed), keeps the swizzled scales and the input scales,
  and adds a workspace of four int32 per SM.

Refused in one line: a group size other than 16 (Marlin's ValueError after loading,
modelopt_quant.py:1914-1917, marlin_utils_fp4.py:476-477), an fp32 model dtype (Marlin needs fp16/bf16,
marlin_utils_fp4.py:150-152), ``NVFP4_AWQ`` and ``W4A16_NVFP4`` (their classes are not modelled), an
``exclude_modules``/``ignore`` of null (the release's ValueError, :1683-1691), an algorithm the release
does not take (:1669-1675). Blackwell ranks hold other layouts (FlashInfer/CUTLASS swizzles, the
TRT-LLM padding): not modelled, as every quantized method here is sized for Hopper.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from checker.core.errors import ConfigError, FlagError, LayoutError, shorten
from checker.core.releases.releases import release_key

if TYPE_CHECKING:
    from checker.core.weights.weights import Builder

FP4_ALGOS = ("FP8", "NVFP4", "NVFP4_AWQ", "W4A16_NVFP4")
"""What ``ModelOptFp4Config.from_config`` takes (modelopt_quant.py:1669)."""

FP4_SOURCE = "modelopt_quant.py:1595-1702"


@dataclass(frozen=True)
class Fp4Config:
    """``ModelOptFp4Config`` as ``from_config`` builds it."""

    algo: str
    group: int
    exclude: tuple[str, ...]
    group_defaulted: bool = False
    """A flat config that names no group size (0.5.17+ read it as 16)."""


def common_group_size(doc: Mapping[str, Any]) -> set[int]:
    """``ModelOptFp4Config.common_group_size`` (modelopt_quant.py:1562-1592): the group sizes a nested
    document names, at its top, in its ``quantization`` section and in its ``config_groups``."""

    def integer(v: Any) -> bool:
        return isinstance(v, int)

    sizes: set[int] = set()
    if integer(doc.get("group_size")):
        sizes.add(doc["group_size"])
    q = doc.get("quantization")
    if isinstance(q, Mapping) and integer(q.get("group_size")):
        sizes.add(q["group_size"])
    groups = doc.get("config_groups") or {}
    for g in groups.values() if isinstance(groups, Mapping) else ():
        if isinstance(g, Mapping):
            if integer(g.get("group_size")):
                sizes.add(g["group_size"])
            for sub in g.values():
                if isinstance(sub, Mapping) and integer(sub.get("group_size")):
                    sizes.add(sub["group_size"])
    return sizes


def read_fp4(q: Mapping[str, Any], nested: Mapping[str, Any] | None, where: str, source: str) -> Fp4Config:
    """The NVFP4 config SGLang builds from ``q`` (flat) or ``nested`` (the whole hf_quant_config.json),
    its refusals and the checker's one line each."""
    algo = q.get("quant_algo")
    if algo not in FP4_ALGOS:
        raise ConfigError(
            f"{source}: {where} quant_algo={shorten(algo)}: SGLang's modelopt_fp4 refuses it ('ModelOpt "
            f"currently only supports: FP8, NVFP4, NVFP4_AWQ, W4A16_NVFP4', {FP4_SOURCE})"
        )
    if nested is None:
        group: Any = q.get("group_size")
        if group is None:
            groups = q.get("config_groups") or {}
            first: Any = next(iter(groups.values()), {}) if isinstance(groups, Mapping) else {}
            weights = first.get("weights", {}) if isinstance(first, Mapping) else {}
            group = weights.get("group_size") if isinstance(weights, Mapping) else None
        defaulted = group is None and "NVFP4" in algo
        if defaulted:
            group = 16
        exclude = q.get("ignore", q.get("modules_to_not_convert", q.get("exclude_modules", [])))
    else:
        sizes = common_group_size(nested)
        if len(sizes) != 1:
            # common_group_size's ValueError is caught and re-raised (modelopt_quant.py:1655-1668)
            raise ConfigError(
                f"{source}: {where} declares NVFP4 with {'no' if not sizes else 'more than one'} group_size "
                f"({'none' if not sizes else ', '.join(map(str, sorted(sizes)))}): SGLang refuses it "
                "('Cannot find 'quant_algo' in the model's quantization config', "
                f"modelopt_quant.py:1588-1591, :1666); fix {where}"
            )
        group = next(iter(sizes))
        defaulted = False
        section = nested.get("quantization")
        exclude = section.get("exclude_modules", []) if isinstance(section, Mapping) else []
    if group is None or exclude is None:
        raise ConfigError(
            f"{source}: {where} declares {algo} without a group_size or with exclude_modules null: SGLang "
            "refuses it ('NVFP4 quantization requires group_size and exclude_modules', "
            "modelopt_quant.py:1683-1691)"
        )
    if algo in ("NVFP4_AWQ", "W4A16_NVFP4"):
        cls = "ModelOptFp4LinearMethod with pre_quant_scale" if algo == "NVFP4_AWQ" else "ModelOptNvFp4A16"
        raise FlagError(
            f"{source}: the model is quantized (modelopt {algo}, {where}; SGLang's modelopt_fp4 with "
            f"{cls}); the checker models ModelOpt NVFP4 weights only: give the weights per GPU with "
            "--weights-gib"
        )
    if algo != "NVFP4":  # FP8 under modelopt_fp4: only a flag forcing it gets here
        raise FlagError(
            f"{source}: --quantization modelopt_fp4 over {where}'s ModelOpt FP8: SGLang quantizes the "
            "experts while loading (online NVFP4), which the checker does not model; drop the flag or give "
            "the weights per GPU with --weights-gib"
        )
    if not isinstance(group, int) or isinstance(group, bool) or group <= 0:
        raise ConfigError(f"{source}: {where} group_size={shorten(group)} must be a positive integer")
    if group != 16:
        raise ConfigError(
            f"{source}: {where} declares NVFP4 group_size {group}; SGLang on a Hopper GPU serves NVFP4 with "
            "Marlin, which refuses it after loading ('NVFP4 Marlin requires group_size=16', "
            "modelopt_quant.py:1914-1917, marlin_utils_fp4.py:476-477)"
        )
    if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
        raise ConfigError(
            f"{source}: {where} exclude_modules/ignore={shorten(exclude)} must be a list of names"
        )
    return Fp4Config(algo, group, tuple(exclude), defaulted)


HOPPER_FROM = "0.5.13"
"""The first release that serves NVFP4 on Hopper: ``ModelOptFp4Config.get_min_capability`` is 80 from
0.5.13 (Marlin); 100 up to 0.5.12 (0.5.10 modelopt_quant.py:1144), which the loader refuses on SM90
('... is not supported for the current GPU', 0.5.10 model_loader/loader.py:238)."""

GROUP_DEFAULT_FROM = "0.5.17"
"""The first release that reads a flat NVFP4 config without ``group_size`` as 16 (0.5.17
modelopt_quant.py:1336-1337); up to 0.5.16 it is the ValueError 'NVFP4 quantization requires group_size
and exclude_modules' (0.5.16 modelopt_quant.py:1324)."""

SHARED_EXPERT_VETO_FROM = "0.5.21"
"""The first release where an excluded shared expert vetoes its fusion into the NVFP4 experts
(``ModelOptFp4Config.can_fuse_shared_expert``, 0.5.21 modelopt_quant.py:1527); 0.5.15-0.5.20 fuse it
anyway, as one more NVFP4 expert slot (held so by 0.5.15, 0.5.16, 0.5.17 and 0.5.20's classes)."""


def check_release(cfg: Fp4Config, release: str, source: str) -> None:
    """What ``release`` refuses of a ModelOpt NVFP4 config on a Hopper GPU, in the release's order (the
    config is read, then the loader checks the GPU): one line."""
    if cfg.group_defaulted and release_key(release) < release_key(GROUP_DEFAULT_FROM):
        raise ConfigError(
            f"{source}: NVFP4 quantization_config without a group_size on SGLang {release}: it refuses it "
            "('NVFP4 quantization requires group_size and exclude_modules specified in the quantization "
            f"config', 0.5.16 modelopt_quant.py:1324); {GROUP_DEFAULT_FROM}+ reads it as 16"
        )
    if release_key(release) < release_key(HOPPER_FROM):
        raise FlagError(
            f"{source}: ModelOpt NVFP4 on SGLang {release}: it serves modelopt_fp4 on Blackwell only "
            "('The quantization method modelopt_fp4 is not supported for the current GPU. Minimum "
            f"capability: 100. Current capability: 90', model_loader/loader.py:238); {HOPPER_FROM}+ runs it "
            "on Hopper with Marlin"
        )


def marlin_padded(n: int, k: int) -> tuple[int, int]:
    """``prepare_nvfp4_layer_for_marlin``'s padded (N, K) (marlin_utils_fp4.py:156-164): the smaller of
    N to 64 with K to 128 and N to 128 with K to 64."""
    return min(
        ((n + 63) // 64 * 64, (k + 127) // 128 * 128),
        ((n + 127) // 128 * 128, (k + 63) // 64 * 64),
        key=lambda nk: (nk[0] * nk[1], nk[0] + nk[1]),
    )


def _check_dtype(b: Builder, name: str) -> None:
    if b.dtype not in ("bfloat16", "float16"):
        raise FlagError(
            f"{name}: the model dtype is {b.dtype}; SGLang's NVFP4 Marlin path (Hopper) needs fp16 or bf16 "
            "activations ('NVFP4 Marlin requires FP16 or BF16 activation dtype', "
            "marlin_utils_fp4.py:150-152): use --dtype bfloat16"
        )


def fp4_linear(
    b: Builder, cfg: Fp4Config, name: str, shards: Sequence[int], inp: int, *, part: str, bias: bool
) -> None:
    """A linear under ``ModelOptFp4LinearMethod`` as built, and what a Hopper rank holds after loading."""
    _check_dtype(b, name)
    if inp % 16:
        raise LayoutError(
            f"{name}: its input partition {inp} is not a multiple of 16; SGLang's NVFP4 linear refuses it "
            "('Unsupported model when in features size is not multiple of 16', modelopt_quant.py:1822-1825): "
            "use a TP size that keeps it whole"
        )
    n = sum(shards)
    pn, pk = marlin_padded(n, inp)
    padded = (pn, pk) != (n, inp)
    built = "dropped" if padded else part
    b.add(f"{name}.weight", (n, inp // 2), part=built, dtype="uint8")
    b.add(f"{name}.input_scale", (len(shards),), part=part, dtype="float32")
    b.add(f"{name}.weight_scale_2", (len(shards),), part=part, dtype="float32")
    b.add(f"{name}.weight_scale", (n, inp // cfg.group), part=built, dtype="float8_e4m3fn")
    if bias:
        b.add(f"{name}.bias", (n,), part="dropped" if padded else part)
    # after loading: the padded weight and scale replace the built ones (repacked to the same sizes)
    if padded:
        b.copy(f"{name}.weight.marlin", (pn, pk // 2), "uint8")
        b.copy(f"{name}.weight_scale.marlin", (pn, pk // cfg.group), "float8_e4m3fn")
        if bias:
            b.copy(f"{name}.bias.marlin", (pn,))
    for scalar in ("alpha", "input_scale_inv", "input_global_scale"):
        b.copy(f"{name}.{scalar}", (), "float32")
    b.copy(f"{name}.weight_global_scale", (1,))
    b.marlin_workspace(f"{name}.workspace", 1)


def fp4_experts(
    b: Builder, cfg: Fp4Config, name: str, local: int, all_experts: int, hidden: int, inter: int, gated: bool
) -> None:
    """A FusedMoE under ``ModelOptNvFp4FusedMoEMethod`` (Marlin on Hopper) as built and after loading."""
    _check_dtype(b, name)
    if not gated:
        raise FlagError(
            f"{name}: ungated NVFP4 experts (Marlin pads their intermediate size) are not modelled; give the "
            "weights per GPU with --weights-gib"
        )
    g = cfg.group

    def swizzled(rows: int, cols: int) -> tuple[int, int, int]:
        return (local, -(-rows // 128) * 128, -(-cols // 4) * 4)

    b.add(f"{name}.w13_weight", (local, 2 * inter, hidden // 2), part="layers", dtype="uint8")
    b.add(f"{name}.w2_weight", (local, hidden, inter // 2), part="layers", dtype="uint8")
    b.add(f"{name}.w13_weight_scale", (local, 2 * inter, hidden // g), part="layers", dtype="float8_e4m3fn")
    b.add(
        f"{name}.w13_blockscale_swizzled",
        swizzled(2 * inter, hidden // g),
        part="layers",
        dtype="float8_e4m3fn",
    )
    b.add(f"{name}.w2_weight_scale", (local, hidden, inter // g), part="layers", dtype="float8_e4m3fn")
    b.add(
        f"{name}.w2_blockscale_swizzled", swizzled(hidden, inter // g), part="layers", dtype="float8_e4m3fn"
    )
    # the per-expert global scales, float32 as built, freed after loading for [E] in the model dtype
    b.dropped(f"{name}.w13_weight_scale_2", (local, 2), "float32")
    b.dropped(f"{name}.w2_weight_scale_2", (local,), "float32")
    b.add(f"{name}.w13_input_scale", (all_experts, 2), part="layers", dtype="float32")
    b.add(f"{name}.w2_input_scale", (all_experts,), part="layers", dtype="float32")
    b.copy(f"{name}.w13_weight_scale_2.marlin", (local,))
    b.copy(f"{name}.w2_weight_scale_2.marlin", (local,))
    b.marlin_workspace(f"{name}.workspace", 4)


# ---- the checkpoint's headers ----------------------------------------------------------------------------

_SCALAR = ((), (1,))
_EXPERT = re.compile(r"\.experts\.\d+\.")


def check_fp4_shards(
    tensors: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], group: int, source: str
) -> tuple[int, dict[str, tuple[int, ...]]]:
    """Under a ModelOpt NVFP4 config: every packed weight (a ``.weight`` beside a ``weight_scale_2``) is
    uint8 ``[out, in/2]`` for the ``[out, in]`` config.json gives it, with its float8 ``weight_scale``
    ``[out, in/group]`` (the group dividing ``in``) and float32 scalar ``weight_scale_2`` and
    ``input_scale``; and the checkpoint holds packed weights at all. ``tensors``: name -> (dtype, shape,
    shard). Returns how many were checked and the logical ``[out, in]`` shape of each packed weight (what
    the config-shape check then holds them to)."""
    expert = _EXPERT
    logical: dict[str, tuple[int, ...]] = {}
    modules = [n[: -len(".weight_scale_2")] for n in tensors if n.endswith(".weight_scale_2")]
    modules += [n[: -len(".weight")] for n, t in tensors.items() if n.endswith(".weight") and t.dtype == "U8"]
    for module in dict.fromkeys(modules):
        w = tensors.get(f"{module}.weight")
        if w is None:
            continue
        if w.dtype != "U8":
            raise ConfigError(
                f"tensor {shorten(module + '.weight')} in shard {shorten(w.shard)} is {w.dtype}, but "
                f"{source}'s ModelOpt NVFP4 weights are packed two e2m1 values a byte (U8), with its "
                "weight_scale_2 beside it; the checkpoint and the config disagree"
            )
        key = f"{module}.weight"
        want = expected.get(expert.sub(".experts.E.", key) if ".experts." in key else key)
        if want is None or len(want) != 2 or len(w.shape) != 2:
            continue
        out, inp = want
        if inp % group:
            raise ConfigError(
                f"{source}: the NVFP4 group size {group} does not divide the input size {inp} of "
                f"{shorten(module)} (shard {shorten(w.shard)}): SGLang sizes its scales {inp} // {group} "
                "groups and cannot load the checkpoint's; the config and the shards disagree"
            )
        wanted = [
            ("weight", (out, inp // 2), ("U8",)),
            ("weight_scale", (out, inp // group), ("F8_E4M3",)),
            ("weight_scale_2", _SCALAR, ("F32",)),
            ("input_scale", _SCALAR, ("F32",)),
        ]
        for suffix, shape, dtypes in wanted:
            s = tensors.get(f"{module}.{suffix}")
            if s is None:
                raise ConfigError(
                    f"tensor {shorten(key)} in shard {shorten(w.shard)} is an NVFP4 packed weight but no "
                    f"shard holds its {module}.{suffix}, which {source}'s ModelOpt NVFP4 config loads it "
                    "with: the checkpoint is incomplete or of another quantization; re-download it"
                )
            ok = s.shape in shape if shape is _SCALAR else s.shape == shape
            if not ok or s.dtype not in dtypes:
                shown = "[] or [1]" if shape is _SCALAR else str(list(shape))
                raise ConfigError(
                    f"tensor {shorten(f'{module}.{suffix}')} in shard {shorten(s.shard)} is {s.dtype} "
                    f"{list(s.shape)}, but the [{out}, {inp}] weight it belongs to takes {dtypes[0]} {shown} "
                    f"under {source}'s ModelOpt NVFP4 (group {group}); the checkpoint and the config disagree"
                )
        logical[key] = (out, inp)
    if not modules:
        raise ConfigError(
            f"{source} declares a ModelOpt NVFP4 quantization but no shard holds a packed weight with its "
            "weight_scale_2: the config and the shards are of different checkpoints (point --model-path at "
            "the directory whose config.json matches them)"
        )
    return len(logical), logical
