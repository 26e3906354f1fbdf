"""An AWQ checkpoint as SGLang serves it on Hopper, and what their Marlin classes hold
(torch-free; file:line from 0.5.23, the same rules in every CPU-env release: quant.py CHECKED_RELEASES).

**Which method.** ``quant_method: awq`` in config.json's ``quantization_config``. ``ModelConfig.
_verify_quantization`` (``configs/model_config.py:2085-2105``) asks every method's
``override_quantization_method``: ``AWQMarlinConfig``'s (``layers/quantization/awq/awq.py:332-354``) answers
``awq_marlin`` where ``is_awq_marlin_compatible`` holds (:401-424: CUDA, ``bits``, ``group_size`` and
``zero_point`` all given, ``check_marlin_supported`` with a zero point: uint4 only, a group of -1/32/64/128,
SM80+, ``marlin_utils.py:68-139``) and ``--quantization`` is unset, ``marlin`` or ``awq_marlin``. Else the
method stays ``awq`` (``AWQConfig``, :65-177): 4 bits only (a ValueError at construction, :84-88), float16
only on CUDA (``get_supported_act_dtypes`` :105-106, checked by ``model_loader/loader.py:266-272``), its
FusedMoE unquantized (``get_quant_method`` returns None for it off NPU, :155-160): refused, the bf16 cases as
the release refuses them, the float16 ones as not modelled. ``--quantization moe_wna16`` picks
``MoeWNA16Config`` (``moe_wna16.py:164-166``, not modelled); any other flag is the release's "does not match".

**Per module** (``AWQMarlinConfig.get_quant_method``, :356-393): a linear whose SGLang prefix contains any
``modules_to_not_convert`` entry as a substring (``is_layer_skipped_awq``, :61-62; no name mapping: AWQ
has no ``apply_weight_name_mapper``) stays unquantized, and so does a FusedMoE (None: its unquantized
method). A linear whose full size Marlin cannot take (``check_marlin_supports_layer`` :211-224 reads
``output_size``/``input_size``: the partitions are not yet set when ``LinearBase.__init__`` asks, linear.py:
276; output % 64, input % 128, input % group) falls back to ``AWQConfig``'s ``AWQLinearScheme`` (the same
three tensors, ``awq_linear.py:30-93``, no repack and no workspace; its own ValueErrors where the input
partition is not whole groups or the output partition not whole int32s). A FusedMoE Marlin cannot take
(``check_moe_marlin_supports_layer`` :227-263: hidden % 128, ``I_p % max(64, group)``, a Marlin group,
SiLU) falls back to MoeWNA16, not modelled: refused in one line. ``lm_head: true`` (a quantized head) is
refused as not modelled.

**What a linear holds** (``AWQMarlinLinearScheme.create_weights``, ``awq/schemes/awq_marlin.py:31-101``), on
the rank's partition (``in_p``, ``out_p``), ``g`` the group (the whole input where -1):
``verify_marlin_supports_shape`` (marlin_utils.py:161-193) first, a ValueError where ``out_p % 64``,
``in_p % 128`` or (``g < in``) ``in_p % g``; then ``qweight`` int32 ``[in_p, out_p / 8]``, ``qzeros`` int32
``[in_p // g, out_p / 8]``, ``scales`` in the model dtype ``[in_p // g, out_p]``. After loading
(``AWQMarlinLinearKernel.process_weights_after_loading``, ``hardware_backend/gpu/quantization/
awq_kernels.py:109-142``): the Marlin repack of ``qweight`` (``[in_p / 16, 2 out_p]``, the same bytes), the
permuted scales and the Marlin zero points (the same shapes) replace the loaded ones; a workspace of one
int32 per SM is kept (``marlin_make_workspace`` :115, marlin_utils.py:266-274); ``g_idx`` and
``g_idx_sort_indices`` are empty tensors.

**What a FusedMoE holds** (``AWQMoEScheme.create_weights``, ``awq/schemes/awq_moe.py:147-233``):
``w13_qweight`` int32 ``[E, H, 2 I_p / 8]``, ``w2_qweight`` ``[E, I_p, H / 8]``; ``w13_scales`` in the model
dtype ``[E, H / g, 2 I_p]``, ``w2_scales`` ``[E, I_p / g, H]``; ``w13_qzeros`` int32
``[E, H / g, 2 I_p / 8]``, ``w2_qzeros`` ``[E, I_p / g, H / 8]``; per channel (-1) the group count is
negative: a RuntimeError at construction, refused. After loading
(``AWQMoEKernel.process_weights_after_loading``, awq_kernels.py:170-231)
every tensor is replaced by its Marlin form of the same size, two empty ``g_idx_sort_indices`` ``[E, 0]``
are added; no workspace. The Marlin MoE runner needs ``--moe-runner-backend auto`` (an assertion,
awq_moe.py:241).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from checker.core.errors import ConfigError, FlagError, LayoutError, shorten
from checker.core.weights.checkpoint_names import check_companions
from checker.core.weights.gptq import MARLIN_GROUPS

if TYPE_CHECKING:
    from checker.core.weights.checkpoint import Checkpoint
    from checker.core.weights.weights import Builder

_WAY_OUT = "give the weights per GPU with --weights-gib"
PACK = 8
"""Eight 4-bit values to an int32 (``pack_factor``, awq.py:266)."""
_MISMATCH = (
    "('does not match the quantization method specified in the `quantization` argument', "
    "configs/model_config.py:2145)"
)


@dataclass(frozen=True)
class AwqConfig:
    """``AWQMarlinConfig`` as the checker reads it."""

    method: str
    group: int
    not_convert: tuple[str, ...]
    source: str

    def describe(self) -> str:
        group = "per channel" if self.group == -1 else f"group {self.group}"
        return f"awq as {self.method}, INT4 {group} with zero points"

    def skips(self, prefix: str) -> bool:
        """``is_layer_skipped_awq`` (awq.py:61-62): any entry a substring of SGLang's prefix."""
        return any(name in prefix for name in self.not_convert)

    def marlin_layer(self, rows: int, inp: int) -> bool:
        """``check_marlin_supports_layer`` (marlin_utils.py:211-224) on the linear's full sizes."""
        size = inp if self.group == -1 else self.group
        return rows % 64 == 0 and inp % 128 == 0 and not (size < inp and inp % size)


def _marlin_ready(q: Mapping[str, Any]) -> str | None:
    """Why ``is_awq_marlin_compatible`` (awq.py:401-424) says no; None: yes."""
    keys = [k for k in ("bits", "group_size", "zero_point") if q.get(k) is None]
    if keys:
        return f"no {', '.join(keys)}"
    if q.get("bits") != 4 or q.get("zero_point") is not True:
        return (
            f"bits={shorten(q.get('bits'))} zero_point={shorten(q.get('zero_point'))}: Marlin takes AWQ as 4 "
            "bits with zero points (uint4, marlin_utils.py:91-93)"
        )
    if q.get("group_size") not in MARLIN_GROUPS:
        return f"group_size={shorten(q.get('group_size'))}: Marlin takes {', '.join(map(str, MARLIN_GROUPS))}"
    return None


def read_awq(q: Mapping[str, Any], flag: str | None, dtype: str | None, where: str, source: str) -> AwqConfig:
    """The method 0.5.23 serves a ``quant_method: awq`` checkpoint with on CUDA, read as
    ``AWQMarlinConfig.from_config`` (awq.py:314-330) reads it; every other outcome one line. ``dtype``:
    the model dtype where known (the plain ``awq`` method takes float16 only)."""
    why = _marlin_ready(q)
    if flag == "moe_wna16":
        raise FlagError(
            f"--quantization moe_wna16 over {where}'s awq: SGLang serves it with MoeWNA16Config "
            f"(moe_wna16.py:164-166), which the checker does not model; drop the flag or {_WAY_OUT}"
        )
    if flag in ("marlin", "awq_marlin") and why is not None:
        raise FlagError(
            f"--quantization {flag} contradicts {where}'s quant_method awq ({why}: not convertible to "
            f"awq_marlin): SGLang refuses it {_MISMATCH}"
        )
    if flag not in (None, "awq", "marlin", "awq_marlin"):
        raise FlagError(
            f"--quantization {shorten(flag)} contradicts {where}'s quant_method awq: SGLang refuses it "
            f"{_MISMATCH}"
        )
    if flag == "awq" or why is not None:
        because = "--quantization awq forces it (awq.py:347-353)" if why is None else f"the config has {why}"
        bits = q.get("w_bit", q.get("bits"))
        if bits is not None and bits != 4:
            raise ConfigError(
                f"{source}: {where} quant_method awq with bits={shorten(bits)}: SGLang serves it "
                f"with its plain awq method ({because}), which refuses it ('Currently, only 4-bit weight "
                "quantization is supported for AWQ', layers/quantization/awq/awq.py:85)"
            )
        if dtype is not None and dtype != "float16":
            raise FlagError(
                f"{source}: {where} quant_method awq: SGLang serves it with its plain awq "
                f"method ({because}), which takes float16 only: it refuses the model dtype {dtype} "
                f"('torch.{dtype} is not supported for quantization method awq', model_loader/loader.py:268)"
            )
        raise FlagError(
            f"{source}: {where} quant_method awq: SGLang serves it with its plain awq method "
            f"({because}), which the checker does not model (it models awq_marlin); {_WAY_OUT}"
        )
    if q.get("lm_head"):
        raise FlagError(
            f"{source}: the model is quantized (awq with a quantized LM head, lm_head: true); the checker "
            f"models AWQ heads unquantized only: {_WAY_OUT}"
        )
    raw = q.get("modules_to_not_convert") or []
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ConfigError(
            f"{source}: {where} modules_to_not_convert={shorten(raw)} must be a list of module names"
        )
    return AwqConfig("awq_marlin", q["group_size"], tuple(raw), source)


def awq_linear(
    b: Builder, cfg: AwqConfig, name: str, rows: int, inp: int, part: str, out_split: int, in_split: int
) -> None:
    """A linear under ``AWQMarlinLinearScheme`` (module docstring), or its unoptimized fallback, on this
    rank; ``rows``/``inp`` the rank's partition, ``out_split``/``in_split`` how the full sizes divide."""
    from checker.core.weights.gptq import check_dtype  # start-up: a weights module loads this one

    check_dtype(b, cfg.method)
    full_in = inp * in_split
    marlin = cfg.marlin_layer(rows * out_split, full_in)
    size = full_in if cfg.group == -1 else cfg.group
    if marlin:
        if rows % 64 or inp % 128 or (size < full_in and inp % size):
            raise LayoutError(
                f"{name}: its partition [out {rows}, in {inp}] is not what SGLang's AWQ Marlin takes (output "
                f"a multiple of 64, input of 128 and of the group {size}); it refuses this layout ('Weight "
                "output_size_per_partition/input_size_per_partition ... is not divisible', "
                "layers/quantization/marlin_utils.py:161-193, at construction): use a smaller TP size"
            )
    elif inp % size or rows % PACK:
        raise LayoutError(
            f"{name}: SGLang's AWQ Marlin cannot take it and its plain AWQ fallback refuses the partition "
            f"[out {rows}, in {inp}] (group {size}, eight 4-bit values to an int32: 'The input/output size "
            "is not aligned with the quantized weight shape', awq/schemes/awq_linear.py:39-51): use a "
            "smaller TP size"
        )
    if cfg.group == -1 and in_split > 1:
        raise LayoutError(
            f"{name}: AWQ per channel on a row-split linear: SGLang builds {inp // size} scale rows for it "
            "(input_size_per_partition // input_size, awq_marlin.py:69), which the checker does not model: "
            "use --tp-size 1 or give the weights per GPU with --weights-gib"
        )
    groups = inp // size
    b.add(f"{name}.qweight", (inp, rows // PACK), part=part, dtype="int32")
    b.add(f"{name}.qzeros", (groups, rows // PACK), part=part, dtype="int32")
    b.add(f"{name}.scales", (groups, rows), part=part)
    if marlin:
        b.marlin_workspace(f"{name}.marlin_workspace", 1)


def awq_experts(b: Builder, cfg: AwqConfig, name: str, local: int, hidden: int, inter: int) -> None:
    """A FusedMoE under ``AWQMoEScheme`` (module docstring), on this rank."""
    from checker.core.weights.gptq import check_dtype  # start-up: as above

    check_dtype(b, cfg.method)
    if cfg.group == -1:
        raise ConfigError(
            f"{cfg.source}: AWQ per channel (group_size -1) on {name}: SGLang's AWQMoEScheme sizes its "
            "scales hidden_size // group_size groups, a negative dimension (a RuntimeError at construction, "
            "awq/schemes/awq_moe.py:189-200)"
        )
    g = cfg.group
    if hidden % 128 or inter % max(64, g):
        raise LayoutError(
            f"{name}: hidden {hidden} and expert intermediate partition {inter} are not what SGLang's AWQ "
            f"Marlin MoE takes (hidden a multiple of 128, the partition of {max(64, g)}): it falls back to "
            "MoeWNA16 (awq.py:383-390, marlin_utils.py:227-263), which the checker does not model: use a "
            "smaller MoE TP size (or EP) or give the weights per GPU with --weights-gib"
        )
    b.add(f"{name}.w13_qweight", (local, hidden, 2 * inter // PACK), part="layers", dtype="int32")
    b.add(f"{name}.w2_qweight", (local, inter, hidden // PACK), part="layers", dtype="int32")
    b.add(f"{name}.w13_scales", (local, hidden // g, 2 * inter), part="layers")
    b.add(f"{name}.w2_scales", (local, inter // g, hidden), part="layers")
    b.add(f"{name}.w13_qzeros", (local, hidden // g, 2 * inter // PACK), part="layers", dtype="int32")
    b.add(f"{name}.w2_qzeros", (local, inter // g, hidden // PACK), part="layers", dtype="int32")


def check_backend(backend: str, cfg: AwqConfig) -> None:
    """``AWQMoEScheme.create_moe_runner`` asserts the auto runner (awq_moe.py:241)."""
    if backend != "auto":
        raise FlagError(
            f"--moe-runner-backend {shorten(backend)} under {cfg.method}: SGLang's AWQ Marlin MoE asserts "
            "the auto runner (an AssertionError, awq/schemes/awq_moe.py:241): drop the flag"
        )


# -- the shards ----------------------------------------------------------------------------------------

_EXPERT_INDEX = re.compile(r"\.experts\.\d+\.")
_FUSED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
}
"""The checkpoint projections every family's class fuses; a family's own (FamilyWeights.packed_modules:
split linear-attention projections) are passed in."""
Packed = Sequence[tuple[str, tuple[str, ...]]]
_INT = ("I32",)
_HALF = ("F16", "BF16", "F32")


def check_awq_shards(
    ckpt: Checkpoint,
    expected: Mapping[str, tuple[int, ...]],
    cfg: AwqConfig,
    prefixes: Sequence[tuple[str, str]],
    source: str,
    packed: Packed = (),
) -> Checkpoint:
    """Every ``qweight`` of an AWQ checkpoint held to config.json and the quantization_config: int32
    ``[in, out / 8]`` for the ``[out, in]`` weight config.json gives its module, ``qzeros`` int32
    ``[groups, out / 8]``, ``scales`` float ``[groups, out]`` (``groups`` = ``in / group``, one per channel);
    a group that does not divide the input is refused; a module ``modules_to_not_convert`` keeps unquantized
    (matched against the fused SGLang name, as the class matches it) must not be packed. Only headers are
    read. Returns the checkpoint with each quantized module's logical ``weight`` named."""
    checked = 0
    aliases: dict[str, Any] = {}
    plans: dict[str, Any] = {}
    tensors = ckpt.tensors
    for name, tensor in tensors.items():
        if not name.endswith(".qweight"):
            continue
        checked += 1
        module = name[: -len(".qweight")]
        if tensor.dtype not in _INT:
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is {tensor.dtype}, but {source}'s "
                "AWQ packed weights are int32 (I32); the checkpoint and config.json disagree"
            )
        key = f"{module}.weight"
        expert = ".experts." in key
        norm = _EXPERT_INDEX.sub(".experts.E.", key) if expert else key
        plan = plans.get(norm) if expert else None
        if plan is None:
            plan = _plan(norm, module, tensor, expected, cfg, prefixes, tensors, source, packed)
            if expert:
                plans[norm] = plan
        if plan is None:
            continue
        out, inp, wanted = plan
        check_companions(
            ckpt,
            name,
            (out, inp),
            wanted,
            packed_as="an AWQ packed weight",
            loads_with="quantization_config",
            scheme="AWQ INT4",
            group=cfg.group,
            source=source,
        )
        aliases[key] = tensor._replace(shape=(out, inp))
    if not checked:
        raise ConfigError(
            f"{source} declares an AWQ quantization but no shard holds a qweight tensor: the config and the "
            "shards are of different checkpoints (point --model-path at the directory whose config.json "
            "matches them)"
        )
    return dataclasses.replace(ckpt, tensors={**tensors, **aliases})


def sglang_name(
    module: str, prefixes: Sequence[tuple[str, str]], tensors: Mapping[str, Any], packed: Packed = ()
) -> str:
    """A checkpoint module as SGLang names the (fused) linear that loads it; ``up_proj`` is fused only
    where a ``gate_proj`` is beside it (Nemotron-H's MLP has an ``up_proj`` of its own); ``packed``: the
    family's own fused modules and the checkpoint names they load."""
    mapped = module
    for old, new in prefixes:
        if mapped.startswith(old):
            mapped = new + mapped[len(old) :]
            break
    head, _, proj = mapped.rpartition(".")
    gated = proj == "up_proj" and f"{module.rpartition('.')[0]}.gate_proj.qweight" in tensors
    fused = {split: name for name, splits in packed for split in splits} | _FUSED
    return f"{head}.{'gate_up_proj' if gated else fused.get(proj, proj)}"


def _plan(
    norm: str,
    module: str,
    tensor: Any,
    expected: Mapping[str, tuple[int, ...]],
    cfg: AwqConfig,
    prefixes: Sequence[tuple[str, str]],
    tensors: Mapping[str, Any],
    source: str,
    packed: Packed,
) -> tuple[int, int, tuple[tuple[str, tuple[int, ...], tuple[str, ...]], ...]] | None:
    """What a ``qweight``'s module must hold; None where config.json names no 2-D weight for it."""
    want = expected.get(norm)
    if want is None or len(want) != 2:
        return None
    name = f"{module}.qweight"
    fused = sglang_name(module, prefixes, tensors, packed)
    skipped = cfg.skips(fused.rpartition(".experts.")[0] + ".experts" if ".experts." in fused else fused)
    if skipped:
        raise ConfigError(
            f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is an AWQ packed weight, but "
            f"{source}'s modules_to_not_convert keeps SGLang's {shorten(fused)} unquantized: its "
            "load_weights finds no qweight parameter and the bf16 weight in no shard; the config and the "
            "shards disagree"
        )
    out, inp = want
    if cfg.group != -1 and inp % cfg.group:
        raise ConfigError(
            f"{source}: AWQ group_size {cfg.group} does not divide the input size {inp} of {shorten(module)} "
            f"(shard {shorten(tensor.shard)}): SGLang sizes its scales {inp} // {cfg.group} groups and "
            "cannot load the checkpoint's; the config and the shards disagree"
        )
    if out % PACK:
        raise ConfigError(
            f"{source}: the output size {out} of {shorten(module)} (shard {shorten(tensor.shard)}) is not "
            "whole int32s of eight 4-bit values; the config and the shards disagree"
        )
    groups = 1 if cfg.group == -1 else inp // cfg.group
    return (
        out,
        inp,
        (
            ("qweight", (inp, out // PACK), _INT),
            ("scales", (groups, out), _HALF),
            ("qzeros", (groups, out // PACK), _INT),
        ),
    )
