"""What a checkpoint's names are checked against, torch-free: each family's names and shapes live with
the family (``checker/families/<name>/rules.py``, ``tensors``); :mod:`checker.families.rules` asks them.

The names are the ones each family's SGLang ``load_weights`` maps (``stacked_params_mapping``,
``make_expert_params_mapping``). A tensor a family does not name is not checked (quantization scales,
``mtp.*``). Here: the shape type, and the refusal of quantized tensors under a config that declares none.
"""

from __future__ import annotations

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
