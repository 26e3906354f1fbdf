"""A GPTQ checkpoint as SGLang 0.5.23 serves it on Hopper, and what its Marlin classes hold (torch-free).

**Which method.** ``quant_method: gptq`` in config.json's ``quantization_config``. On CUDA 0.5.23
registers no ``gptq`` method: GPTQ's own kernel is registered for CPU, NPU and XPU only
(``layers/quantization/__init__.py:105-136``). ``ModelConfig._verify_quantization``
(``configs/model_config.py:2085-2105``) asks every method's ``override_quantization_method``:
``GPTQMarlinConfig``'s (``layers/quantization/gptq/gptq.py:414-438``) answers ``gptq_marlin`` where
``is_gptq_marlin_compatible`` holds (:459-481: ``bits``, ``group_size``, ``sym`` and ``desc_act`` all
given, (bits, sym) of (4, True) or (8, True), ``check_marlin_supported``: a group of -1/32/64/128 on
SM80+, ``marlin_utils.py:104-139``), the checkpoint is not in Marlin format (``checkpoint_format:
marlin`` / ``is_marlin_format``, :44-48) and ``--quantization`` is unset, ``marlin`` or ``gptq_marlin``.
Else the method stays ``gptq``, which CUDA does not register: ``Unknown quantization method: gptq``
(model_config.py:2152-2154); ``--quantization moe_wna16`` picks ``MoeWNA16Config`` instead (not modelled).

**What a linear holds** (``GPTQMarlinLinearScheme.create_weights``, ``gptq/schemes/gptq_marlin.py:46-150``),
on the rank's partition (``in_p`` of the full input ``in``, ``out_p`` the rank's output rows), with
``pack = 32 // bits`` and ``g`` the group (the whole input where -1): ``qweight`` int32 ``[in_p / pack,
out_p]``, ``g_idx`` int32 ``[in_p]`` (always), ``scales`` in the model dtype ``[G, out_p]`` and ``qzeros``
int32 ``[G, out_p / pack]``, where ``G = in / g`` if ``marlin_repeat_scales_on_all_ranks`` (activation order,
or per channel on a row-parallel linear, marlin_utils.py:281-287) else ``in_p // g``. After loading
(``GPTQMarlinLinearKernel.process_weights_after_loading``, ``hardware_backend/gpu/quantization/
gptq_kernels.py:85-176``): the Marlin repack of ``qweight`` and the permuted ``scales`` are new tensors of the
same sizes (the old freed); a workspace of one int32 per SM is kept (:100, ``marlin_make_workspace``
:266-274); without activation order ``g_idx`` is replaced by an empty tensor (freed: ``dropped``), with it by
the sorted ``g_idx`` (same size) and ``g_idx_sort_indices`` int32 ``[in_p]`` (kept); ``qzeros`` is replaced by
an empty tensor (GPTQ has no runtime zero points, ``zero_points=False`` :69): freed.

**What a FusedMoE holds** (``GPTQMarlinMoEScheme.create_weights``, ``gptq/schemes/gptq_moe.py:180-321``;
``GPTQMarlinConfig.get_quant_method`` takes every FusedMoE, ``dynamic`` rules unread, gptq.py:446-447):
``w13_qweight`` int32 ``[E, H / pack, 2 I_p]``, ``w2_qweight`` ``[E, I_p / pack, H]``; ``w13_scales``
**float16** ``[E, H / g, 2 I_p]``, ``w2_scales`` float16 ``[E, G2, H]`` with ``G2 = I_p / g`` under
activation order and ``I_p * moe_tp / g`` without (:195-201, as the code has it); ``w13_qzeros``/``w2_qzeros``
in the model dtype ``[E, H / g, 2 I_p / pack]``/``[E, G2, H / pack]``; per channel one group; four int32
``g_idx`` tensors ``[E, H]``, ``[E, I_p]`` twice. After loading (gptq_kernels.py:225-304): the repacked
weights and permuted scales keep their sizes, the zeros are kept as loaded, and without activation order the
four ``g_idx`` tensors become empty (freed: ``dropped``). The Marlin MoE runner needs ``--moe-runner-backend
auto`` (an assertion, gptq_kernels.py:309).

**Per module** (``get_linear_quant_method``, ``quantization/utils.py:222-305``): ``dynamic`` rules, regexes
``re.match``-ed against SGLang's module name in config order, the first match deciding: ``-:`` keeps the
linear unquantized, ``+:`` (or none) overrides ``bits``/``group_size``/``desc_act``/``sym`` (a (bits, sym)
Marlin lacks: ``Unsupported quantization config``, utils.py:239-243; a group Marlin lacks:
``verify_marlin_supported`` at construction, marlin_utils.py:152-158). GPTQ reads no
``modules_to_not_convert``. ``lm_head: true`` (a quantized head) is refused as not modelled.

Refused in one line, as 0.5.23 refuses: every case above that leaves the method ``gptq``; a float32 model
(``get_supported_act_dtypes``, ``model_loader/loader.py:266-272``). Refused as not modelled: a quantized
head, ``--quantization moe_wna16``, a rank partition whose groups Marlin cannot take (SGLang builds
``in_p // g`` scale rows and only warns: ``check_marlin_supports_shape``'s answer is unread,
gptq_kernels.py:89-94).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from checker.core.errors import ConfigError, FlagError, LayoutError, shorten
from checker.core.weights.checkpoint_names import check_companions

if TYPE_CHECKING:
    from checker.core.weights.checkpoint import Checkpoint
    from checker.core.weights.weights import Builder

_WAY_OUT = "give the weights per GPU with --weights-gib"
MARLIN_GROUPS = (-1, 32, 64, 128)
"""``MARLIN_SUPPORTED_GROUP_SIZES`` (marlin_utils.py:44)."""
_MARLIN_TYPES = {(4, True), (8, True)}
"""``GPTQMarlinConfig.TYPE_MAP`` (gptq.py:298-301): uint4b8, uint8b128."""
_UNKNOWN = "'Unknown quantization method: gptq', configs/model_config.py:2152"


@dataclass(frozen=True)
class IntArgs:
    """One linear's GPTQ arguments after its ``dynamic`` overrides."""

    bits: int
    group: int
    desc_act: bool
    sym: bool

    @property
    def pack(self) -> int:
        return 32 // self.bits


@dataclass(frozen=True)
class GptqConfig:
    """``GPTQMarlinConfig`` as the checker reads it."""

    method: str
    base: IntArgs
    dynamic: tuple[tuple[str, Mapping[str, Any]], ...]
    source: str

    def describe(self) -> str:
        a = self.base
        group = "per channel" if a.group == -1 else f"group {a.group}"
        order = ", activation order" if a.desc_act else ""
        return f"gptq as {self.method}, INT{a.bits} {group}{order}"

    def linear(self, prefix: str) -> IntArgs | None:
        """``get_linear_quant_method`` (quantization/utils.py:275-305) with ``override_config`` (:222-251):
        None for a ``-:`` match, else the arguments the first matching rule leaves."""
        for pattern, values in self.dynamic:
            if pattern.startswith("-:"):
                if _rx(pattern[2:]).match(prefix):
                    return None
            elif _rx(pattern.removeprefix("+:")).match(prefix):
                return self._override(prefix, values)
        return self.base

    def _override(self, prefix: str, values: Mapping[str, Any]) -> IntArgs:
        a = self.base
        bits = values.get("bits", a.bits)
        group = values.get("group_size", a.group)
        desc_act = values.get("desc_act", a.desc_act)
        sym = values.get("sym", a.sym)
        # isinstance checks as override_config makes them (a bool passes as an int there)
        bits = bits if isinstance(bits, int) else a.bits
        group = group if isinstance(group, int) else a.group
        desc_act = desc_act if isinstance(desc_act, bool) else a.desc_act
        sym = sym if isinstance(sym, bool) else a.sym
        if (bits, sym) not in _MARLIN_TYPES:
            raise ConfigError(
                f"{self.source}: quantization_config dynamic gives {prefix} bits={bits}, sym={sym}; SGLang "
                "refuses it ('Unsupported quantization config', layers/quantization/utils.py:240)"
            )
        if group not in MARLIN_GROUPS:
            raise ConfigError(
                f"{self.source}: quantization_config dynamic gives {prefix} group_size={group}; SGLang's "
                f"Marlin takes {', '.join(map(str, MARLIN_GROUPS))} ('Marlin does not support group_size', "
                "marlin_utils.py:134, raised at construction)"
            )
        return IntArgs(bits, group, desc_act, sym)


_REGEX: dict[str, re.Pattern[str]] = {}


def _rx(text: str) -> re.Pattern[str]:
    rx = _REGEX.get(text)
    if rx is None:
        rx = _REGEX[text] = re.compile(text)
    return rx


def _marlin_ready(q: Mapping[str, Any]) -> str | None:
    """Why ``is_gptq_marlin_compatible`` (gptq.py:459-481) or the format check (:44-48) says no; None: yes."""
    keys = [k for k in ("bits", "group_size", "sym", "desc_act") if q.get(k) is None]
    if keys:
        return f"no {', '.join(keys)}"
    if q.get("checkpoint_format") == "marlin" or q.get("is_marlin_format"):
        return "a checkpoint already in Marlin format"
    bits, sym = q.get("bits"), q.get("sym")
    if (bits, sym) not in _MARLIN_TYPES:
        return f"bits={shorten(bits)} sym={shorten(sym)}: Marlin takes symmetric 4 or 8 bits"
    if q.get("group_size") not in MARLIN_GROUPS:
        return f"group_size={shorten(q.get('group_size'))}: Marlin takes {', '.join(map(str, MARLIN_GROUPS))}"
    return None


def read_gptq(q: Mapping[str, Any], flag: str | None, where: str, source: str) -> GptqConfig:
    """The method 0.5.23 serves a ``quant_method: gptq`` checkpoint with on CUDA, read as
    ``GPTQMarlinConfig.from_config`` (gptq.py:394-411) reads it; every other outcome one line."""
    why = _marlin_ready(q)
    if flag == "moe_wna16":
        raise FlagError(
            f"--quantization moe_wna16 over {where}'s gptq: SGLang serves it with MoeWNA16Config "
            f"(moe_wna16.py:163-166), which the checker does not model; drop the flag or {_WAY_OUT}"
        )
    if flag == "gptq" or (why is not None and flag in (None, "gptq")):
        because = (
            "--quantization gptq forces it (gptq.py:431-437)" if why is None else f"the config has {why}"
        )
        raise ConfigError(
            f"{source}: {where} quant_method gptq: SGLang 0.5.23 on CUDA serves GPTQ only as gptq_marlin "
            f"(its gptq method is registered for CPU, NPU and XPU only) and {because}: it refuses it "
            f"({_UNKNOWN})"
        )
    if flag not in (None, "marlin", "gptq_marlin") or why is not None:
        shown = shorten(flag)
        raise FlagError(
            f"--quantization {shown} contradicts {where}'s quant_method gptq"
            + (f" ({why}: not convertible to gptq_marlin)" if why is not None else "")
            + ": SGLang refuses it ('does not match the quantization method specified in the `quantization` "
            "argument', configs/model_config.py:2145)"
        )
    if q.get("lm_head"):
        raise FlagError(
            f"{source}: the model is quantized (gptq with a quantized LM head, lm_head: true); the checker "
            f"models GPTQ heads unquantized only: {_WAY_OUT}"
        )
    dynamic = q.get("dynamic") or {}
    if not isinstance(dynamic, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in dynamic.items()
    ):
        raise ConfigError(
            f"{source}: {where} dynamic={shorten(dynamic)} must map module regexes to JSON objects"
        )
    for pattern in dynamic:
        try:
            _rx(pattern[2:] if pattern.startswith(("-:", "+:")) else pattern)
        except re.error:
            raise ConfigError(
                f"{source}: {where} dynamic rule {shorten(pattern)} is not a regular expression Python "
                "compiles (SGLang's re.match fails on it)"
            ) from None
    bits, group, desc_act, sym = q["bits"], q["group_size"], q["desc_act"], q["sym"]
    if not isinstance(desc_act, bool):
        raise ConfigError(f"{source}: {where} desc_act={shorten(desc_act)} must be true or false")
    if group == -1:  # GPTQMarlinConfig.__init__: one group per channel has no order (gptq.py:314-316)
        desc_act = False
    base = IntArgs(bits, group, desc_act, sym)
    return GptqConfig("gptq_marlin", base, tuple(dynamic.items()), source)


def check_dtype(b: Builder, method: str) -> None:
    """``get_supported_act_dtypes`` (gptq.py:382-383: half, bfloat16) checked by the loader
    (model_loader/loader.py:266-272)."""
    if b.dtype not in ("bfloat16", "float16"):
        raise FlagError(
            f"the model dtype {b.dtype} under {method}: SGLang refuses it ('torch.{b.dtype} is not supported "
            f"for quantization method {method}', model_loader/loader.py:268): use --dtype bfloat16 or float16"
        )


def gptq_linear(
    b: Builder, cfg: GptqConfig, a: IntArgs, name: str, rows: int, inp: int, part: str, in_split: int
) -> None:
    """A linear under ``GPTQMarlinLinearScheme`` (module docstring), on this rank."""
    check_dtype(b, cfg.method)
    full = inp * in_split
    size = a.group if a.group != -1 else full
    repeat = a.desc_act or (a.group == -1 and in_split > 1)
    if not repeat and inp % size:
        raise LayoutError(
            f"{name}: its input partition {inp} is not whole GPTQ groups of {size}; SGLang builds "
            f"{inp // size} scale rows and Marlin cannot run the layer (check_marlin_supports_shape's answer "
            "is unread, gptq_kernels.py:89): use a TP size that keeps whole groups"
        )
    groups = full // size if repeat else inp // size
    b.add(f"{name}.qweight", (inp // a.pack, rows), part=part, dtype="int32")
    if a.desc_act:
        b.add(f"{name}.g_idx", (inp,), part=part, dtype="int32")
    else:
        b.dropped(f"{name}.g_idx", (inp,), "int32")
    b.add(f"{name}.scales", (groups, rows), part=part)
    b.dropped(f"{name}.qzeros", (groups, rows // a.pack), "int32")
    b.marlin_workspace(f"{name}.marlin_workspace", 1)
    if a.desc_act:
        b.copy(f"{name}.g_idx_sort_indices", (inp,), "int32")


def gptq_experts(b: Builder, cfg: GptqConfig, name: str, local: int, hidden: int, inter: int) -> None:
    """A FusedMoE under ``GPTQMarlinMoEScheme`` (module docstring), on this rank."""
    check_dtype(b, cfg.method)
    a = cfg.base
    moe_tp = b.p.moe_tp_size
    if a.group != -1:
        g13 = hidden // a.group
        g2 = (inter if a.desc_act else inter * moe_tp) // a.group
    else:
        g13 = g2 = 1
    pack = a.pack
    b.add(f"{name}.w13_qweight", (local, hidden // pack, 2 * inter), part="layers", dtype="int32")
    b.add(f"{name}.w2_qweight", (local, inter // pack, hidden), part="layers", dtype="int32")
    b.add(f"{name}.w13_scales", (local, g13, 2 * inter), part="layers", dtype="float16")
    b.add(f"{name}.w2_scales", (local, g2, hidden), part="layers", dtype="float16")
    b.add(f"{name}.w13_qzeros", (local, g13, 2 * inter // pack), part="layers")
    b.add(f"{name}.w2_qzeros", (local, g2, hidden // pack), part="layers")
    for tensor, width in (
        ("w13_g_idx", hidden),
        ("w2_g_idx", inter),
        ("w13_g_idx_sort_indices", hidden),
        ("w2_g_idx_sort_indices", inter),
    ):
        if a.desc_act:
            b.add(f"{name}.{tensor}", (local, width), part="layers", dtype="int32")
        else:
            b.dropped(f"{name}.{tensor}", (local, width), "int32")


def check_backend(backend: str, cfg: GptqConfig) -> None:
    """``GPTQMarlinMoEKernel.create_moe_runner`` asserts the auto runner (gptq_kernels.py:309)."""
    if backend != "auto":
        raise FlagError(
            f"--moe-runner-backend {shorten(backend)} under {cfg.method}: SGLang's Marlin MoE asserts the "
            "auto runner (an AssertionError, hardware_backend/gpu/quantization/gptq_kernels.py:309): drop "
            "the flag"
        )


# -- the shards ----------------------------------------------------------------------------------------

_EXPERT_INDEX = re.compile(r"\.experts\.\d+\.")
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj"}
"""A checkpoint shard's module as SGLang names the fused linear that loads it (the dynamic rules are
matched against that name); ``up_proj`` too where a ``gate_proj`` is beside it (Nemotron-H's MLP has an
``up_proj`` of its own)."""
_INT = ("I32",)
_HALF = ("F16", "BF16", "F32")


def check_gptq_shards(
    ckpt: Checkpoint,
    expected: Mapping[str, tuple[int, ...]],
    cfg: GptqConfig,
    prefixes: Sequence[tuple[str, str]],
    source: str,
) -> Checkpoint:
    """Every ``qweight`` of a GPTQ checkpoint held to config.json and the quantization_config: int32
    ``[in / pack, out]`` for the ``[out, in]`` weight config.json gives its module, ``qzeros`` int32
    ``[groups, out / pack]``, ``scales`` float ``[groups, out]`` (``groups`` = ``in / group``, one per
    channel), ``g_idx`` ``[in]`` (required under activation order); a group that does not divide the input
    is refused (SGLang sizes ``in // group`` scale rows). ``dynamic`` rules are matched against the module's
    name mapped as the class maps it (``prefixes``). Only headers are read. Returns the checkpoint with each
    quantized module's logical ``weight`` named, so the name checks that follow see the module as held."""
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
                "GPTQ packed weights are int32 (I32); the checkpoint and config.json disagree"
            )
        key = f"{module}.weight"
        expert = ".experts." in key
        norm = _EXPERT_INDEX.sub(".experts.E.", key) if expert else key
        plan = plans.get(norm) if expert else None
        if plan is None:
            plan = _plan(norm, module, tensor, expected, cfg, prefixes, tensors, source)
            if expert:  # every expert of a layer's projection has the one shape: planned once
                plans[norm] = plan
        if plan is None:
            continue
        out, inp, a, wanted = plan
        if a.desc_act or f"{module}.g_idx" in tensors:
            wanted = (*wanted, ("g_idx", (inp,), ("I32", "I64")))
        check_companions(
            ckpt,
            name,
            (out, inp),
            wanted,
            packed_as="a GPTQ packed weight",
            loads_with="quantization_config",
            scheme=f"GPTQ INT{a.bits}",
            group=a.group,
            source=source,
            why={"g_idx": " (desc_act: activation order)"},
        )
        aliases[key] = tensor._replace(shape=(out, inp))
    if not checked:
        raise ConfigError(
            f"{source} declares a GPTQ quantization but no shard holds a qweight tensor: the config and the "
            "shards are of different checkpoints (point --model-path at the directory whose config.json "
            "matches them)"
        )
    return dataclasses.replace(ckpt, tensors={**tensors, **aliases})


def _plan(
    norm: str,
    module: str,
    tensor: Any,
    expected: Mapping[str, tuple[int, ...]],
    cfg: GptqConfig,
    prefixes: Sequence[tuple[str, str]],
    tensors: Mapping[str, Any],
    source: str,
) -> tuple[int, int, IntArgs, tuple[tuple[str, tuple[int, ...], tuple[str, ...]], ...]] | None:
    """What a ``qweight``'s module must hold: config.json's ``[out, in]``, its arguments, the packed
    tensors' shapes and dtypes (``g_idx`` apart); None where config.json names no 2-D weight for it."""
    want = expected.get(norm)
    if want is None or len(want) != 2:
        return None
    name = f"{module}.qweight"
    mapped = module
    for old, new in prefixes:
        if mapped.startswith(old):
            mapped = new + mapped[len(old) :]
            break
    head, _, proj = mapped.rpartition(".")
    gated = proj == "up_proj" and f"{module.rpartition('.')[0]}.gate_proj.qweight" in tensors
    fused = f"{head}.{'gate_up_proj' if gated else _FUSED.get(proj, proj)}"
    a = cfg.linear(fused) if ".experts." not in module else cfg.base
    if a is None:
        raise ConfigError(
            f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is a GPTQ packed weight, but "
            f"{source}'s dynamic rules keep SGLang's {shorten(fused)} unquantized (a '-:' match): its "
            "load_weights finds no qweight parameter and the bf16 weight in no shard; the rules and "
            "the shards disagree"
        )
    out, inp = want
    if a.group != -1 and inp % a.group:
        raise ConfigError(
            f"{source}: GPTQ group_size {a.group} does not divide the input size {inp} of "
            f"{shorten(module)} (shard {shorten(tensor.shard)}): SGLang sizes its scales {inp} // "
            f"{a.group} groups and cannot load the checkpoint's; the config and the shards disagree"
        )
    groups = 1 if a.group == -1 else inp // a.group
    return (
        out,
        inp,
        a,
        (
            ("qweight", (inp // a.pack, out), _INT),
            ("scales", (groups, out), _HALF),
            ("qzeros", (groups, out // a.pack), _INT),
        ),
    )
