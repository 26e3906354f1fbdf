"""Sparse safetensors checkpoints for the tests and the bench: real headers, no data.

Each shard is a valid safetensors file (the 8-byte length, the JSON header, the data region at its full
size), but the data region is a hole (``ftruncate``), so a 160 GB logical checkpoint takes a few KB of
disk. The checker reads only the headers, so it cannot tell.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from math import prod
from pathlib import Path
from typing import Any

from checker.core.weights.checkpoint import DTYPE_BITS, INDEX_NAME
from checker.families.drafts import mtp_tensors as draft_mtp_tensors
from checker.families.rules import expected_tensors

Spec = tuple[str, tuple[int, ...], str]
F32_SUFFIXES = ("A_log", ".e_score_correction_bias")


def header_bytes(tensors: Iterable[Spec]) -> tuple[bytes, int]:
    """A shard's header (8-byte length + JSON) and the size of its data region."""
    # Written as text, entry by entry, in the compact form safetensors writes (json.dumps of a dict of
    # 100,000 entries was most of the time tests spent making checkpoints); names go through json.dumps.
    parts = ['{"__metadata__":{"format":"pt"}']
    offset = 0
    dumps = json.dumps
    for name, shape, dtype in tensors:
        n = (prod(shape) * DTYPE_BITS[dtype] + 7) // 8
        dims = ",".join(map(str, shape))
        parts.append(
            f',{dumps(name)}:{{"dtype":"{dtype}","shape":[{dims}],"data_offsets":[{offset},{offset + n}]}}'
        )
        offset += n
    parts.append("}")
    raw = "".join(parts).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    return len(raw).to_bytes(8, "little") + raw, offset


def write_shard(path: Path, tensors: Iterable[Spec], *, data_bytes: int | None = None) -> int:
    """Write one sparse shard; ``data_bytes`` overrides the data region's size (a truncated file)."""
    head, data = header_bytes(tensors)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + (data if data_bytes is None else data_bytes))
    return len(head) + data


def write_checkpoint(
    directory: Path, tensors: Iterable[Spec], *, shards: int = 4, index: bool = True
) -> dict[str, str]:
    """Split ``tensors`` over ``shards`` sparse shards (the HF naming), with an index when asked.
    Returns the index's weight map."""
    directory.mkdir(parents=True, exist_ok=True)
    items = list(tensors)
    per = -(-len(items) // shards) if items else 1
    weight_map: dict[str, str] = {}
    for k in range(shards):
        chunk = items[k * per : (k + 1) * per]
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        write_shard(directory / name, chunk)
        weight_map.update({t[0]: name for t in chunk})
    if index:
        (directory / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def model_tensors(config: Mapping[str, Any], dtype: str = "BF16") -> list[Spec]:
    """The checkpoint of ``config``'s family, real shapes, ``dtype`` (A_log and router biases F32)."""
    return [
        (name, shape, "F32" if name.endswith(F32_SUFFIXES) else dtype)
        for name, shape in expected_tensors(config)
    ]


def mtp_tensors(config: Mapping[str, Any], dtype: str = "BF16") -> list[Spec]:
    """The ``mtp.*`` tensors a real checkpoint of ``config``'s family carries for its NEXTN/MTP draft."""
    return [(name, shape, dtype) for name, shape in draft_mtp_tensors(config, "config.json") or []]


def model_dir(
    directory: Path, config_path: str | Path, *, shards: int = 4, extra: Iterable[Spec] = ()
) -> Path:
    """A model directory: config.json (copied) and a sparse checkpoint of its real shapes."""
    directory.mkdir(parents=True, exist_ok=True)
    text = Path(config_path).read_text()
    (directory / "config.json").write_text(text)
    write_checkpoint(directory, model_tensors(json.loads(text)) + list(extra), shards=shards)
    return directory


def disk_bytes(directory: Path) -> int:
    """Blocks actually allocated under ``directory`` (st_blocks is in 512-byte units)."""
    return sum(os.stat(p).st_blocks * 512 for p in directory.iterdir())


def fp8_tensors(config: Mapping[str, Any]) -> list[Spec]:
    """The FP8 checkpoint of ``config`` as its ``quantization_config`` says it is stored: every 2-D linear
    weight the ignore list leaves in F8_E4M3 with its float32 scale (``weight_scale_inv`` of
    [ceil(out/bn), ceil(in/bk)] block-wise, a scalar ``weight_scale`` per-tensor), the rest BF16."""
    from checker.core.weights.quant import _path_matches_any

    q = config["quantization_config"]
    ignored = tuple(q.get("modules_to_not_convert") or q.get("ignored_layers") or [])
    block = q.get("weight_block_size")
    out: list[Spec] = []
    for name, shape, dtype in model_tensors(config):
        module = name.removesuffix(".weight")
        quantized = (
            name.endswith(".weight")
            and len(shape) == 2
            and not any(k in name for k in ("embed", "lm_head"))
            and not _path_matches_any(ignored, module)
        )
        if not quantized:
            out.append((name, shape, dtype))
            continue
        out.append((name, shape, "F8_E4M3"))
        if block:
            scale = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
            out.append((f"{module}.weight_scale_inv", scale, "F32"))
        else:
            out.append((f"{module}.weight_scale", (), "F32"))
            if q.get("activation_scheme") == "static":
                out.append((f"{module}.input_scale", (), "F32"))
    return out


def modelopt_tensors(config: Mapping[str, Any], quantized: Callable[[str], bool]) -> list[Spec]:
    """A ModelOpt FP8 export of ``config``: every 2-D ``.weight`` whose module ``quantized`` names in
    F8_E4M3 with its scalar float32 ``weight_scale`` and ``input_scale`` (ModelOpt's per-tensor scales),
    the rest as :func:`model_tensors` has them."""
    out: list[Spec] = []
    for name, shape, dtype in model_tensors(config):
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and len(shape) == 2 and quantized(module)):
            out.append((name, shape, dtype))
            continue
        out += [(name, shape, "F8_E4M3"), (f"{module}.weight_scale", (), "F32")]
        out.append((f"{module}.input_scale", (), "F32"))
    return out


def nvfp4_tensors(config: Mapping[str, Any], quantized: Callable[[str], bool]) -> list[Spec]:
    """A ModelOpt NVFP4 export of ``config``: every 2-D ``.weight`` whose module ``quantized`` names packed
    two e2m1 values a byte (U8 ``[out, in/2]``) with its F8_E4M3 ``weight_scale`` ``[out, in/16]`` and
    scalar float32 ``weight_scale_2`` and ``input_scale``, the rest as :func:`model_tensors` has them."""
    out: list[Spec] = []
    for name, shape, dtype in model_tensors(config):
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and len(shape) == 2 and quantized(module)):
            out.append((name, shape, dtype))
            continue
        o, i = shape
        out += [(name, (o, i // 2), "U8"), (f"{module}.weight_scale", (o, i // 16), "F8_E4M3")]
        out += [(f"{module}.weight_scale_2", (), "F32"), (f"{module}.input_scale", (), "F32")]
    return out


def compressed_tensors(config: Mapping[str, Any]) -> list[Spec]:
    """A compressed-tensors FP8 W8A8 export of ``config`` (llm-compressor's layout, its first config
    group): every 2-D linear weight outside ``ignore`` (names, dotted suffixes, ``re:`` regexes, matched
    on the checkpoint's names) in F8_E4M3 with its float32 ``weight_scale`` (``[]`` per tensor,
    ``[out, 1]`` per channel, the block grid per block) and, static, a scalar ``input_scale``."""
    from checker.core.weights.compressed import _listed

    q = config["quantization_config"]
    group = next(iter(q["config_groups"].values()))
    w, a = group["weights"], group.get("input_activations")
    ignore = tuple(q.get("ignore") or ())
    out: list[Spec] = []
    for name, shape, dtype in model_tensors(config):
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and len(shape) == 2) or "embed" in name or _listed(module, ignore):
            out.append((name, shape, dtype))
            continue
        out.append((name, shape, "F8_E4M3"))
        if w["strategy"] == "channel":
            scale: tuple[int, ...] = (shape[0], 1)
        elif w["strategy"] == "block":
            bn, bk = w["block_structure"]
            scale = (-(-shape[0] // bn), -(-shape[1] // bk))
        else:
            scale = ()
        out.append((f"{module}.weight_scale", scale, "F32"))
        if a and not a.get("dynamic"):
            out.append((f"{module}.input_scale", (), "F32"))
    return out


def packed_tensors(config: Mapping[str, Any]) -> list[Spec]:
    """A compressed-tensors INT weight-only (pack-quantized) export of ``config`` (llm-compressor's
    layout, its first config group): every 2-D linear weight outside ``ignore`` as an int32
    ``weight_packed`` [out, ceil(in / pack)], a BF16 ``weight_scale`` [out, in / group] ([out, 1] per
    channel), an int64 ``weight_shape`` [2], asymmetric an int32 ``weight_zero_point``
    [ceil(out / pack), groups], activation order ``group`` an int32 ``weight_g_idx`` [in]."""
    from checker.core.weights.compressed import _listed

    q = config["quantization_config"]
    w = next(iter(q["config_groups"].values()))["weights"]
    pack = 32 // w["num_bits"]
    ignore = tuple(q.get("ignore") or ())
    out: list[Spec] = []
    for name, shape, dtype in model_tensors(config):
        module = name.removesuffix(".weight")
        quantized = name.endswith(".weight") and len(shape) == 2 and "embed" not in name
        if not quantized or _listed(module, ignore):
            out.append((name, shape, dtype))
            continue
        rows, cols = shape
        groups = 1 if w["strategy"] == "channel" else -(-cols // w["group_size"])
        out += [
            (f"{module}.weight_packed", (rows, -(-cols // pack)), "I32"),
            (f"{module}.weight_scale", (rows, groups), "BF16"),
            (f"{module}.weight_shape", (2,), "I64"),
        ]
        if not w.get("symmetric", True):
            out.append((f"{module}.weight_zero_point", (-(-rows // pack), groups), "I32"))
        if w.get("actorder") in ("group", "dynamic"):
            out.append((f"{module}.weight_g_idx", (cols,), "I32"))
    return out


def gptq_tensors(config: Mapping[str, Any], *, prefixes: tuple[tuple[str, str], ...] = ()) -> list[Spec]:
    """A GPTQ export of ``config`` (GPTQModel's layout): every 2-D linear weight SGLang quantizes (not the
    embedding, the head, Qwen's routers or shared-expert gates, nor a module a ``-:`` dynamic rule matches
    under its SGLang name: ``prefixes`` the class's HF mapping, fused shards by their fused name) as an int32
    ``qweight`` [in / pack, out], int32 ``qzeros`` [groups, out / pack], F16 ``scales`` [groups, out] and an
    int32 ``g_idx`` [in], with the bits and group a ``+:`` rule gives it."""
    from checker.core.weights.gptq import read_gptq

    gq = read_gptq(config["quantization_config"], None, "quantization_config", "config.json")
    fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj"}
    out: list[Spec] = []
    names = {n for n, _, _ in model_tensors(config)}
    for name, shape, dtype in model_tensors(config):
        module = name.removesuffix(".weight")
        skip = ("embed", "lm_head", "mlp.gate.", "shared_expert_gate")
        if not (name.endswith(".weight") and len(shape) == 2) or any(k in name for k in skip):
            out.append((name, shape, dtype))
            continue
        mapped = module
        for old, new in prefixes:
            if mapped.startswith(old):
                mapped = new + mapped[len(old) :]
        head, _, proj = mapped.rpartition(".")
        gated = proj == "up_proj" and f"{module.rpartition('.')[0]}.gate_proj.weight" in names
        args = gq.linear(f"{head}.{'gate_up_proj' if gated else fused.get(proj, proj)}")
        if ".experts." in module:
            args = gq.base
        if args is None:
            out.append((name, shape, dtype))
            continue
        rows, cols = shape
        pack = 32 // args.bits
        groups = 1 if args.group == -1 else -(-cols // args.group)
        out += [
            (f"{module}.qweight", (cols // pack, rows), "I32"),
            (f"{module}.qzeros", (groups, rows // pack), "I32"),
            (f"{module}.scales", (groups, rows), "F16"),
            (f"{module}.g_idx", (cols,), "I32"),
        ]
    return out


def awq_tensors(
    config: Mapping[str, Any],
    *,
    prefixes: tuple[tuple[str, str], ...] = (),
    packed: tuple[tuple[str, tuple[str, ...]], ...] = (),
) -> list[Spec]:
    """An AWQ export of ``config`` (AutoAWQ's GEMM layout): every 2-D linear weight SGLang quantizes (not the
    embedding, the head, Qwen's routers or shared-expert gates, nor a module whose SGLang name contains a
    ``modules_to_not_convert`` entry) as an int32 ``qweight`` [in, out / 8], int32 ``qzeros``
    [groups, out / 8] and F16 ``scales`` [groups, out]."""
    from checker.core.weights.awq import read_awq, sglang_name

    aw = read_awq(config["quantization_config"], None, None, "quantization_config", "config.json")
    out: list[Spec] = []
    qweights = {
        n.removesuffix(".weight") + ".qweight": None
        for n, s, _ in model_tensors(config)
        if n.endswith(".weight")
    }
    for name, shape, dtype in model_tensors(config):
        module = name.removesuffix(".weight")
        skip = ("embed", "lm_head", "mlp.gate.", "shared_expert_gate")
        if not (name.endswith(".weight") and len(shape) == 2) or any(k in name for k in skip):
            out.append((name, shape, dtype))
            continue
        fused = sglang_name(module, prefixes, qweights, packed)
        if aw.skips(fused.rpartition(".experts.")[0] + ".experts" if ".experts." in fused else fused):
            out.append((name, shape, dtype))
            continue
        rows, cols = shape
        groups = 1 if aw.group == -1 else -(-cols // aw.group)
        out += [
            (f"{module}.qweight", (cols, rows // 8), "I32"),
            (f"{module}.qzeros", (groups, rows // 8), "I32"),
            (f"{module}.scales", (groups, rows), "F16"),
        ]
    return out
