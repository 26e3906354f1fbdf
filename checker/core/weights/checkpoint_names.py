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
