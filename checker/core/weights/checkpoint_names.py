"""What a checkpoint's names are checked against, torch-free: each family's names and shapes live with
the family (``checker/families/<name>/rules.py``, ``tensors``); :mod:`checker.families.rules` asks them.

The names are the ones each family's SGLang ``load_weights`` maps (``stacked_params_mapping``,
``make_expert_params_mapping``). A tensor a family does not name is not checked (quantization scales,
``mtp.*``). Here: the shape type, and the refusal of quantized tensors under a config that declares none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from checker.core.errors import ConfigError, shorten
from checker.core.weights.checkpoint import Checkpoint

Shape = tuple[int, ...]


_FLOAT8 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2")
"""Safetensors dtypes that only a quantized checkpoint stores its weights or scales in."""


def check_declared_dtypes(ckpt: Checkpoint, source: str) -> None:
    """Refuse a checkpoint holding float8 (or narrower float) tensors under a config.json that declares no
    quantization: read as bf16 its figure would be wrong, and SGLang would cast the values without their
    scales."""
    for name, tensor in ckpt.tensors.items():
        if tensor.dtype in _FLOAT8:
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is {tensor.dtype}, but {source} "
                "declares no quantization: the checkpoint is quantized and the checker derives the weights "
                "of unquantized (bf16/fp16/fp32) checkpoints only: give the weights per GPU with "
                "--weights-gib (the largest 'mem usage' of an earlier server start's 'Load weight end' lines)"
            )


_PACKED = (".qweight", ".qzeros", ".weight_packed", ".weight_scale", ".weight_scale_inv", ".input_scale")
"""Names only a quantized checkpoint holds (AWQ/GPTQ packed weights and zeros, compressed-tensors packs,
FP8 scales)."""


def check_unquantized(ckpt: Checkpoint, source: str) -> None:
    """Under a config.json that declares no quantization: refuse float8 (or narrower) tensors, integer
    packed weights and quantization scales, before any figure (read as bf16 the figure would be wrong)."""
    check_declared_dtypes(ckpt, source)
    for name, tensor in ckpt.tensors.items():
        packed = name.endswith(_PACKED) or (name.endswith(".weight") and tensor.dtype in ("I32", "U32", "I8"))
        if packed:
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} ({tensor.dtype}) is a quantized "
                f"weight or scale, but {source} declares no quantization: the config and the shards are of "
                "different checkpoints (point --model-path at the directory whose config.json matches them)"
            )


_QUANT_SUFFIXES = (*_PACKED, ".scales", ".g_idx", ".weight_scale_2", ".weight_zero_point", ".weight_shape")


def check_unquantized_modules(
    ckpt: Checkpoint, prefixes: tuple[str, ...], what: str, source: str, method: str
) -> None:
    """Under a quantized config: a module the class builds with ``quant_config=None`` whatever the
    method (``prefixes``, checkpoint names; Qwen3.5's vision tower) must be stored unquantized. SGLang
    holds it in the model dtype: a packed weight or a scale of it is no parameter (its weight stays
    uninitialized), a float8 weight is cast without its scale, an NVFP4 one fails the shape check."""
    for name, tensor in ckpt.tensors.items():
        if not name.startswith(prefixes):
            continue
        narrow = name.endswith(".weight") and (tensor.dtype in _FLOAT8 or tensor.dtype in ("I32", "U8", "I8"))
        if narrow or name.endswith(_QUANT_SUFFIXES):
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} ({tensor.dtype}) quantizes {what}, "
                f"which SGLang builds unquantized under {method} (quant_config=None, 0.5.23 "
                "models/qwen3_vl.py:1332-1339), in the model dtype, loading none of its packed weights or "
                "scales: the tower would serve weights the checkpoint does not give it; the checkpoint must "
                f"keep it unquantized (in {source}'s ignore list)"
            )


_SCALE_DTYPES = ("F32", "BF16", "F16")


def check_fp8(ckpt: Checkpoint, block: tuple[int, int] | None, source: str) -> int:
    """Under an FP8 ``quantization_config``: every float8 weight has its scale, of the shape the block
    size gives (``weight_scale_inv`` [ceil(out/bn), ceil(in/bk)]; per-tensor a scalar ``weight_scale``),
    and the checkpoint holds float8 weights at all. Returns how many quantized weights were checked."""
    want_name = "weight_scale_inv" if block is not None else "weight_scale"
    checked = 0
    for name, tensor in ckpt.tensors.items():
        if not name.endswith(".weight") or tensor.dtype not in ("F8_E4M3", "F8_E5M2"):
            continue
        checked += 1
        module = name[: -len(".weight")]
        scale = ckpt.tensors.get(f"{module}.{want_name}")
        if scale is None:
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is {tensor.dtype} but no shard "
                f"holds its {module}.{want_name}, which {source}'s "
                f"FP8 quantization_config ({'block-wise' if block else 'per-tensor'}) loads it with: the "
                "checkpoint is incomplete or of another quantization; re-download it"
            )
        if block is not None:
            if len(tensor.shape) != 2:
                continue
            out, inp = tensor.shape
            shape: tuple[int, ...] = (-(-out // block[0]), -(-inp // block[1]))
            ok = scale.shape == shape
        else:
            shape = ()
            ok = scale.shape in ((), (1,))
        if not ok or scale.dtype not in _SCALE_DTYPES:
            raise ConfigError(
                f"tensor {shorten(f'{module}.{want_name}')} in shard {shorten(scale.shard)} is {scale.dtype} "
                f"{list(scale.shape)}, but the {list(tensor.shape)} weight it scales takes a float "
                f"{list(shape)} under {source}'s quantization_config"
                + (f" (blocks of {block[0]}x{block[1]})" if block else "")
                + "; the checkpoint and config.json disagree"
            )
    if not checked:
        raise ConfigError(
            f"{source} declares an FP8 quantization (its quantization_config, or a hf_quant_config.json "
            "beside it) but no shard holds a float8 weight: the config "
            "and the shards are of different checkpoints (point --model-path at the directory whose "
            "config.json matches them)"
        )
    return checked


def check_compressed(
    ckpt: Checkpoint,
    strategies: set[str],
    block: tuple[int, int] | None,
    static: bool,
    source: str,
) -> int:
    """Under a compressed-tensors FP8 W8A8 ``quantization_config``: every float8 weight has its
    ``weight_scale`` of a shape its config's strategies give (per tensor ``[]``/``[1]``, per channel
    ``[out, 1]``, per block ``[ceil(out/bn), ceil(in/bk)]``), a static scheme its ``input_scale``
    (``[]``/``[1]``), and the checkpoint holds float8 weights at all. Returns how many were checked."""
    checked = 0
    for name, tensor in ckpt.tensors.items():
        if not name.endswith(".weight") or tensor.dtype not in ("F8_E4M3", "F8_E5M2"):
            continue
        checked += 1
        module = name[: -len(".weight")]
        wanted = []
        if "tensor" in strategies:
            wanted += [(), (1,)]
        if len(tensor.shape) == 2:
            out, inp = tensor.shape
            if "channel" in strategies:
                wanted.append((out, 1))
            if block is not None:
                wanted.append((-(-out // block[0]), -(-inp // block[1])))
        for scale_name, need in (("weight_scale", wanted), ("input_scale", [(), (1,)] if static else [])):
            scale = ckpt.tensors.get(f"{module}.{scale_name}")
            if scale is None:
                if not need:
                    continue
                raise ConfigError(
                    f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is {tensor.dtype} but no shard "
                    f"holds its {module}.{scale_name}, which {source}'s compressed-tensors FP8 "
                    "quantization_config loads it with: the checkpoint is incomplete or of another "
                    "quantization; re-download it"
                )
            if need and (scale.shape not in need or scale.dtype not in _SCALE_DTYPES):
                shown = " or ".join(str(list(s)) for s in need)
                raise ConfigError(
                    f"tensor {shorten(f'{module}.{scale_name}')} in shard {shorten(scale.shard)} is "
                    f"{scale.dtype} {list(scale.shape)}, but the {list(tensor.shape)} weight it scales "
                    f"takes a float {shown} under {source}'s compressed-tensors quantization_config "
                    f"({'/'.join(sorted(strategies))}); the checkpoint and config.json disagree"
                )
    if not checked:
        raise ConfigError(
            f"{source} declares a compressed-tensors FP8 quantization but no shard holds a float8 weight: "
            "the config and the shards are of different checkpoints (point --model-path at the directory "
            "whose "
            "config.json matches them)"
        )
    return checked


_EXPERT_INDEX = re.compile(r"\.experts\.\d+\.")

Companion = tuple[str, Shape, tuple[str, ...]]
"""A tensor a packed weight loads with: (suffix after the module's name, shape, dtypes taken)."""


def check_companions(
    ckpt: Checkpoint,
    name: str,
    weight: tuple[int, int],
    wanted: Iterable[Companion],
    *,
    packed_as: str,
    loads_with: str,
    scheme: str,
    group: int,
    source: str,
    why: Mapping[str, str] | None = None,
) -> None:
    """The scales, zero points and ``g_idx`` a packed weight ``name`` of the ``[out, in]`` ``weight`` loads
    with (AWQ, GPTQ, compressed-tensors WNA16): each present, of its shape and dtype; else one line naming
    the tensor and its shard. ``packed_as``: what ``name`` is ("a GPTQ packed weight"); ``loads_with``: the
    config that names the companions; ``scheme``: the method and bits ("GPTQ INT4"); ``why``: a reason a
    suffix is wanted ("g_idx": "(desc_act: ...)")."""
    tensor = ckpt.tensors[name]
    module = name.rpartition(".")[0]
    out, inp = weight
    for suffix, shape, dtypes in wanted:
        t = ckpt.tensors.get(f"{module}.{suffix}")
        if t is None:
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is {packed_as} but no shard holds "
                f"its {shorten(f'{module}.{suffix}')}, which {source}'s {loads_with}"
                f"{(why or {}).get(suffix, '')} loads it with: the checkpoint is incomplete; re-download it"
            )
        if t.shape != shape or t.dtype not in dtypes:
            raise ConfigError(
                f"tensor {shorten(f'{module}.{suffix}')} in shard {shorten(t.shard)} is {t.dtype} "
                f"{list(t.shape)}, but the [{out}, {inp}] weight it belongs to takes {dtypes[0]} "
                f"{list(shape)} under {source}'s {scheme} "
                f"{'per-channel' if group == -1 else f'group-{group}'} quantization_config; the "
                "checkpoint and config.json disagree"
            )


def check_packed(
    ckpt: Checkpoint,
    expected: Mapping[str, Shape],
    args: tuple[int, int, bool, bool] | None,
    source: str,
) -> int:
    """Under a compressed-tensors INT weight-only (pack-quantized) ``quantization_config``: every
    ``weight_packed`` is int32 of ``[out, ceil(in / pack)]`` for the ``[out, in]`` weight config.json gives
    it, with its ``weight_scale`` ``[out, ceil(in / group)]`` (per channel ``[out, 1]``), asymmetric its
    ``weight_zero_point`` int32 ``[ceil(out / pack), groups]``, activation order ``group`` its
    ``weight_g_idx`` ``[in]``; a group size that does not divide the input is refused (SGLang sizes the
    scales ``in // group``, the checkpoint holds ``ceil``); and the checkpoint holds packed weights at all.
    ``args``: (bits, group or -1, symmetric, g_idx) where every config group agrees, else None (then only
    the dtype and the scale's presence are checked). Returns how many packed weights were checked."""
    checked = 0
    for name, tensor in ckpt.tensors.items():
        if not name.endswith(".weight_packed"):
            continue
        checked += 1
        module = name[: -len(".weight_packed")]
        if tensor.dtype != "I32":
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is {tensor.dtype}, but {source}'s "
                "compressed-tensors pack-quantized weights are int32 (I32); the checkpoint and config.json "
                "disagree"
            )
        scale = ckpt.tensors.get(f"{module}.weight_scale")
        if scale is None or scale.dtype not in _SCALE_DTYPES:
            held = (
                "no shard holds" if scale is None else f"shard {shorten(scale.shard)} holds a {scale.dtype}"
            )
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is a packed weight but {held} "
                f"{module}.weight_scale, which {source}'s compressed-tensors weight-only quantization_config "
                "loads it with: the checkpoint is incomplete or of another quantization; re-download it"
            )
        key = f"{module}.weight"
        want = expected.get(_EXPERT_INDEX.sub(".experts.E.", key) if ".experts." in key else key)
        if args is None or want is None or len(want) != 2:
            continue
        bits, group, symmetric, g_idx = args
        pack = 32 // bits
        out, inp = want
        if group != -1 and inp % group:
            raise ConfigError(
                f"{source}: compressed-tensors group_size {group} does not divide the input size {inp} of "
                f"{shorten(module)} (shard {shorten(tensor.shard)}): SGLang sizes its scales "
                f"{inp} // {group} groups and cannot load the checkpoint's; the config and the shards "
                "disagree"
            )
        groups = 1 if group == -1 else inp // group
        wanted: list[Companion] = [
            ("weight_packed", (out, -(-inp // pack)), ("I32",)),
            ("weight_scale", (out, groups), _SCALE_DTYPES),
        ]
        if not symmetric:
            wanted.append(("weight_zero_point", (-(-out // pack), groups), ("I32",)))
        if g_idx:
            wanted.append(("weight_g_idx", (inp,), ("I32", "I64")))
        check_companions(
            ckpt,
            name,
            want,
            wanted,
            packed_as="a packed weight",
            loads_with="compressed-tensors weight-only quantization_config",
            scheme=f"compressed-tensors INT{bits}",
            group=group,
            source=source,
        )
    if not checked:
        raise ConfigError(
            f"{source} declares a compressed-tensors INT weight-only (pack-quantized) quantization but no "
            "shard holds a weight_packed tensor: the config and the shards are of different checkpoints "
            "(point --model-path at the directory whose config.json matches them)"
        )
    return checked
