"""A checkpoint's quantization as SGLang reads it, and what its FP8 method holds per rank (torch-free).

Modelled: SGLang's ``fp8`` method (``layers/quantization/fp8.py``, 0.5.23 line numbers below) on an FP8
checkpoint, block-wise (``weight_block_size`` [bn, bk], scales ``weight_scale_inv``) and per-tensor (one
``weight_scale`` per logical shard; ``input_scale`` too under ``activation_scheme: static``), with the
layers ``ignored_layers`` / ``modules_to_not_convert`` keep unquantized, on a Hopper GPU (H100/H200):

* a quantized linear holds its weight in ``float8_e4m3fn`` (``create_fp8_weight_``, :656-665) and, block-
  wise, a float32 ``weight_scale_inv`` of ``[ceil(out/bn), ceil(in/bk)]`` over the rank's own partition
  (:675-689); per-tensor, a float32 ``weight_scale`` per logical shard (:691-696), which after loading is
  expanded to one scale per output channel, ``[out, 1]`` (``process_weights_after_loading`` :1211-1216,
  ``convert_to_channelwise`` in ``quantization/utils.py:141``, since the CUTLASS kernel of SM90 takes
  per-channel scales), and a static ``input_scale`` reduced to its maximum (:1269-1271); the per-shard
  scales as built are freed for their replacements (``dropped``: not held twice);
* a FusedMoE holds ``w13``/``w2`` in float8 and, block-wise, ``w13_weight_scale_inv`` of
  ``[E, 2 * ceil(I/bn), ceil(H/bk)]`` and ``w2_weight_scale_inv`` of ``[E, ceil(H/bn), ceil(I/bk)]``
  (``create_fp8_moe_weight_`` :1721-1746); per-tensor ``w13_weight_scale`` ``[E, 2]`` and
  ``w2_weight_scale`` ``[E]`` (:1750-1761), static input scales ``[E]`` each (:1806-1819), after loading
  replaced by ``w13_weight_scale`` ``[E]`` and 0-d input scales (:2666-2671, :2725), the built ones freed;
* every RadixAttention gets ``Fp8KVCacheMethod`` (:470-471): two float32 scalars ``k_scale``/``v_scale``;
* embeddings, heads, norms and the linears a class builds with ``quant_config=None`` stay as they were.

Modelled too: ModelOpt FP8 (``modelopt_fp8``, ``layers/quantization/modelopt_quant.py`` of 0.5.23;
0.5.10-0.5.22 as CHECKED_RELEASES says), read
from a ``hf_quant_config.json`` beside config.json (``{"quantization": {"quant_algo": "FP8",
"exclude_modules", "kv_cache_quant_algo"}}``) or config.json's flat ``quantization_config``
(``quant_method: modelopt``, ``quant_algo: FP8``, ``ignore``, ``kv_cache_scheme``), both turned into
``modelopt_fp8`` by ``_parse_modelopt_quant_config`` (``configs/model_config.py:1851-1869``) and read by
``ModelOptFp8Config.from_config`` (modelopt_quant.py:466-522):

* a quantized linear (and an LM head built with the quant config: ``ParallelLMHead`` takes the linear
  method, :341) holds its weight in ``float8_e4m3fn`` and two float32 per-shard scales, ``weight_scale``
  and ``input_scale`` ``[shards]`` (:560-609); after loading (:617-651, on SM90 with CUDA 12 and
  FlashInfer, as SGLang's CUDA install has it) the weight is requantized in place to the largest shard
  scale, ``weight_scale`` becomes that one 0-d scale where the FlashInfer per-tensor GEMM takes the
  layer (``_can_use_flashinfer_bmm``: both weight dimensions divisible by 16, :611-615) and one scale per
  output channel ``[out, 1]`` otherwise (``convert_to_channelwise``), ``input_scale`` its 0-d maximum;
* a FusedMoE (``ModelOptFp8MoEMethod`` :1109-1192) holds ``w13``/``w2`` in float8, ``w13_weight_scale``
  ``[E, 2]``, ``w2_weight_scale`` ``[E]`` and two input scales ``[E]``; after loading ``w13_weight_scale``
  becomes ``[E]`` and the input scales 0-d (:1194-1253);
* a RadixAttention built with the quant config gets ``k_scale``/``v_scale`` only where the config
  declares an FP8 KV cache (``kv_cache_quant_algo``, or ``kv_cache_scheme`` float 8 bits, :345-346);
* the layers ``exclude_modules``/``ignore`` name stay unquantized: ``is_layer_skipped`` with the fused
  mapping, or ``is_layer_excluded``'s glob match of the whole prefix or any dotted part (:377-424), after
  the class's ``hf_to_sglang_mapper`` (:364-375).

Modelled too: compressed-tensors FP8 W8A8 and INT weight-only pack-quantized (W4A16/W8A16; ``quant_method:
compressed-tensors`` in ``quantization_config`` or ``compression_config``), read as
:mod:`checker.core.weights.compressed` says and held as SGLang 0.5.23's ``CompressedTensorsW8A8Fp8``(``MoE``)
and ``CompressedTensorsWNA16``/``CompressedTensorsWNA16MoE`` (Marlin) hold them
(checker.core.weights.weights ``wna16_linear``/``wna16_experts``); GPTQ (``quant_method: gptq``), which
0.5.23 serves on CUDA only as ``gptq_marlin``, as :mod:`checker.core.weights.gptq` says; AWQ (``quant_method:
awq``), served on Hopper as ``awq_marlin``, as :mod:`checker.core.weights.awq` says.

Block-wise FP8 on Hopper keeps its scales as loaded (the UE8M0 requantization of
``requant_block_scale_ue8m0_for_deepgemm`` :819-826 is Blackwell's DeepGEMM path, and the bf16 weight
cache of :857-902 needs a [32, 32] UE8M0 checkpoint). Refused in one line: every other method (named), an
FP8 quantization asked for on an unquantized checkpoint (``--quantization fp8``: online quantization), and
what the release itself refuses (an unknown method, a flag that contradicts the config, a malformed
``weight_block_size``, a block that does not divide a partition).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checker.core.errors import ConfigError, FlagError, LayoutError, printable, shorten
from checker.core.releases.releases import release_key
from checker.core.weights.awq import AwqConfig, read_awq
from checker.core.weights.compressed import CompressedConfig, read_compressed
from checker.core.weights.gptq import GptqConfig, read_gptq
from checker.core.weights.modelopt import SHARED_EXPERT_VETO_FROM, Fp4Config, read_fp4

HF_QUANT_CONFIG = "hf_quant_config.json"

SGLANG_METHODS = (
    "fp8 mxfp8 minimax_m3_nvfp4 blockwise_int8 modelopt modelopt_fp8 modelopt_fp4 nvfp4_online "
    "modelopt_mixed w8a8_int8 w8a8_fp8 awq awq_marlin bitsandbytes gguf gptq_marlin moe_wna16 "
    "compressed-tensors compressed_tensors w4afp8 petit_nvfp4 quark quark_mxfp4 auto-round auto-round-int8 "
    "modelslim quark_int4fp8_moe humming mxfp_w4a8 mxfp4"
).split()
"""0.5.23's ``QUANTIZATION_METHODS`` on CUDA (``layers/quantization/__init__.py:63-159``); a method outside
it is the release's ``Unknown quantization method`` (``configs/model_config.py:2152``). ``gptq`` is
registered for CPU, NPU and XPU only (:105-136): on CUDA a GPTQ checkpoint runs as ``gptq_marlin`` or not at
all (checker.core.weights.gptq)."""

MODELLED = ("fp8", "modelopt_fp8", "modelopt_fp4", "compressed-tensors", "gptq_marlin", "awq_marlin")
"""The methods whose per-rank weights the checker derives."""

_CPU_ENVS = ("0.5.10", "0.5.13", "0.5.15", "0.5.16", "0.5.17", "0.5.20", "0.5.22", "0.5.23")
"""The releases with a CPU environment whose quantized classes build on the meta device."""

CHECKED_RELEASES: Mapping[str, tuple[str, ...]] = {
    "fp8": _CPU_ENVS,
    "modelopt_fp8": _CPU_ENVS,
    "modelopt_fp4": _CPU_ENVS,
    "compressed-tensors": _CPU_ENVS,
    "gptq_marlin": _CPU_ENVS,
    "awq_marlin": _CPU_ENVS,
}
"""The releases whose quantized classes the method's rules are held to, per method: each one's own
``Fp8LinearMethod``/``Fp8MoEMethod``/``Fp8KVCacheMethod`` built on the meta device
(tests/fixtures/weights/expected.json, ``*/fp8-*``). ``fp8.py`` grew from 1809 to 3514 lines over them
(the UE8M0 requantization of 0.5.16, the DeepGEMM MXFP8 input of 0.5.23), none of it a parameter a
Hopper GPU holds differently: the figures of all eight equal the one set of rules. ModelOpt FP8's classes
are held on the same eight (``*/modelopt-fp8*``): its rules change at 0.5.15 (a quantized
``ParallelLMHead``) and at 0.5.18 (the 0-d FlashInfer weight scale on SM90). AWQ's (``*/awq-*``: Qwen3-Next,
Nemotron-H, Qwen3.5 MoE and dense) are held on the same eight with no per-release rule: 0.5.10's one
``layers/quantization/awq.py`` (``is_awq_marlin_compatible`` :339, ``AWQMoEMethod`` :842) became 0.5.13's
``awq/`` package with the same tensors; the one difference by release, Nemotron-H's mixer split over the
whole TP group under attention DP before 0.5.14, is the family's rule. A release between them that no CPU
environment checks is refused, not assumed."""


def check_release(method: str, release: str, described: str, source: str) -> None:
    """A quantized model on a release whose classes for ``method`` were not checked: one line."""
    checked = CHECKED_RELEASES.get(method, ())
    if release not in checked:
        raise FlagError(
            f"{source}: the model is quantized ({described}); the checker models {method} weights as "
            f"SGLang {', '.join(checked)} hold them, not {release}'s: give the weights per GPU with "
            "--weights-gib"
        )


FUSED_SHARDS: Mapping[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""``_FALLBACK_FUSED_SHARDS`` (``quantization/utils.py``), which is also every modelled family's own
``packed_modules_mapping``: a fused linear is skipped when its shards are."""

NESTED_KEY = "_nested"
"""Where the flattened ``hf_quant_config.json`` keeps the whole document (NVFP4 reads its group size from
it as ``common_group_size`` does)."""

HF_QUANT_KEY = "_hf_quant_config.json"
"""Where the model directory's reader puts the parsed ``hf_quant_config.json`` into the config mapping it
hands on (the file is beside config.json, the rules see only the mapping)."""

_WAY_OUT = (
    "give the weights per GPU with --weights-gib (the largest 'mem usage' of an earlier server start's "
    "'Load weight end' lines)"
)


@dataclass(frozen=True)
class QuantScheme:
    """A checkpoint's FP8 quantization as ``Fp8Config.from_config`` reads it."""

    method: str
    block: tuple[int, int] | None
    """``weight_block_size`` [bn, bk]; None: per-tensor."""
    static: bool
    """``activation_scheme: static``: per-tensor input scales are held too."""
    ignored: tuple[str, ...]
    """``ignored_layers`` / ``modules_to_not_convert``, each with and without its ``model.`` prefix."""
    source: str
    packed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The class's own ``packed_modules_mapping`` beyond the fallback (``get_quant_config`` hands it to
    the quant config, model_loader/weight_utils.py:299), as Qwen3.5's ``in_proj_qkvz``/``in_proj_ba``."""
    kv: bool = True
    """A RadixAttention built with the quant config holds ``k_scale``/``v_scale`` (fp8: always; ModelOpt:
    where the config declares an FP8 KV cache)."""
    globs: tuple[str, ...] = ()
    """ModelOpt's ``exclude_modules`` as ``is_layer_excluded`` matches them (glob: prefix or any part)."""
    ct: CompressedConfig | None = None
    """compressed-tensors: its targets and ignore list, the scheme per module
    (checker.core.weights.compressed)."""
    gq: GptqConfig | None = None
    """GPTQ served as gptq_marlin: its arguments and dynamic rules (checker.core.weights.gptq)."""
    fp4: Fp4Config | None = None
    """ModelOpt NVFP4: its group size (checker.core.weights.modelopt)."""
    aw: AwqConfig | None = None
    """AWQ served as awq_marlin: its group and modules_to_not_convert (checker.core.weights.awq)."""

    @property
    def modelopt(self) -> bool:
        """A ModelOpt config (FP8 or NVFP4): ``is_layer_excluded`` globs, a quantized ``ParallelLMHead``."""
        return self.method in ("modelopt_fp8", "modelopt_fp4")

    def can_fuse_shared_expert(self, release: str) -> bool:
        """``ModelOptFp4Config.can_fuse_shared_expert`` (modelopt_quant.py:1552-1559): a shared expert
        kept unquantized by ``exclude_modules`` cannot share the FP4 experts' buffers, from 0.5.21
        (modelopt.SHARED_EXPERT_VETO_FROM; 0.5.15-0.5.20 fuse it as an NVFP4 slot); the other methods
        modelled do not veto the fusion (models/qwen2_moe.py:160-166)."""
        if self.fp4 is None or release_key(release) < release_key(SHARED_EXPERT_VETO_FROM):
            return True
        return not any("shared_expert" in n and "shared_expert_gate" not in n for n in self.fp4.exclude)

    def describe(self) -> str:
        if self.gq is not None:
            return self.gq.describe()
        if self.aw is not None:
            return self.aw.describe()
        if self.ct is not None:
            kinds = "/".join(sorted(self.ct.strategies()))
            return f"{self.method} ({kinds + ' weights' if kinds else 'no config groups'})"
        if self.fp4 is not None:
            return f"{self.method} (ModelOpt NVFP4, group {self.fp4.group}, Marlin on Hopper)"
        if self.modelopt:
            return f"{self.method} (ModelOpt FP8, per-tensor{', FP8 KV cache' if self.kv else ''})"
        if self.block:
            return f"{self.method} block {self.block[0]}x{self.block[1]}"
        return f"{self.method} per-tensor ({'static' if self.static else 'dynamic'} activations)"

    def mapped(
        self,
        prefixes: Sequence[tuple[str, str]],
        packed: Sequence[tuple[str, tuple[str, ...]]] = (),
    ) -> QuantScheme:
        """The ignore list under the class's ``hf_to_sglang_mapper`` prefixes (``apply_weight_name_mapper``,
        fp8.py:481, called by ``model_loader/loader.py:280``), as Nemotron-H maps ``backbone.``, and under
        the checker's names for the class's modules (Qwen3.5's ``model.language_model.`` is the
        checker's ``model.``); ``packed``: the class's own fused-module mapping."""

        def apply(names: tuple[str, ...]) -> tuple[str, ...]:
            out = []
            for name in names:
                for old, new in prefixes:
                    if name.startswith(old):
                        name = new + name[len(old) :]
                        break
                out.append(name)
                if self.modelopt and name.startswith("language_model."):  # modelopt_quant.py:370-371
                    out.append(name.removeprefix("language_model."))
            return tuple(dict.fromkeys(out))

        ct = self.ct.mapped(prefixes, (*FUSED_SHARDS.items(), *packed)) if self.ct is not None else None
        return dataclasses.replace(
            self, ignored=apply(self.ignored), globs=apply(self.globs), packed=tuple(packed), ct=ct
        )

    def skips(self, prefix: str) -> bool:
        """``is_layer_skipped`` (``quantization/utils.py:70-127``) with the fallback fused mapping; under
        ModelOpt also ``is_layer_excluded`` (modelopt_quant.py:377-424)."""
        if self.globs and _excluded(self.globs, prefix):
            return True
        proj = prefix.split(".")[-1]
        fused = dict(self.packed) if proj in dict(self.packed) else FUSED_SHARDS
        if proj in fused:
            seen = {_path_matches_any(self.ignored, prefix.replace(proj, shard)) for shard in fused[proj]}
            if len(seen) > 1:
                raise ConfigError(
                    f"{self.source}: quantization_config ignores some but not all shards of {prefix}; SGLang "
                    "refuses it ('Detected some but not all shards of ... are quantized', "
                    "quantization/utils.py:101)"
                )
            return seen.pop()
        skipped = _path_matches_any(self.ignored, prefix)
        if "experts" in prefix:
            skipped = skipped or any(prefix in ign for ign in self.ignored if "experts" in ign)
        return skipped


_FUSED_PATTERNS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")


def _excluded(patterns: Sequence[str], prefix: str) -> bool:
    """``ModelOptQuantConfig.is_layer_excluded``: a glob (``*`` any text, ``.`` literal) matching the
    whole prefix (or it without ``language_model.``) or any one of its dotted parts, or a fused MLA part
    named inside the prefix's last part."""
    prefixes = [prefix]
    if prefix.startswith("language_model."):
        prefixes.append(prefix.removeprefix("language_model."))
    for pattern in patterns:
        rx = re.compile(pattern.replace(".", r"\.").replace("*", r".*"))
        for pfx in prefixes:
            if rx.fullmatch(pfx) or any(rx.fullmatch(part) for part in pfx.split(".")):
                return True
        tail = pattern.rsplit(".", maxsplit=1)[-1]
        if tail in _FUSED_PATTERNS and any(tail in pfx.rsplit(".", maxsplit=1)[-1] for pfx in prefixes):
            return True
    return False


@functools.lru_cache(maxsize=64)
def _ignored_set(ignored: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """The ignored names, and their first dotted parts (a run can match only where one starts)."""
    names = frozenset(i.rstrip(".") for i in ignored)
    return names, frozenset(n.split(".", 1)[0] for n in names)


def _path_matches_any(ignored: tuple[str, ...], prefix: str) -> bool:
    """``_module_path_match`` (quantization/utils.py) of any ignored name, a whole dotted-path component
    match, as set lookups: an ignored name matches exactly when it is a contiguous run of the prefix's
    dotted parts. Scanned name by name per module, a 512-expert model's ignore list was 0.4 s of a 0.47 s
    Qwen3.5 FP8 figure."""
    names, firsts = _ignored_set(ignored)
    parts = prefix.rstrip(".").split(".")
    return any(
        ".".join(parts[a:b]) in names
        for a in range(len(parts))
        if parts[a] in firsts
        for b in range(a + 1, len(parts) + 1)
    )


def _declared(config: Mapping[str, Any], directory: Path | None) -> tuple[Mapping[str, Any] | None, str]:
    """The quantization config SGLang reads (``_parse_quant_hf_config``, model_config.py:1727-1821):
    config.json's ``quantization_config`` (or its text_config's), its ``compression_config``, a
    ``hf_quant_config.json`` beside it."""
    q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), Mapping):
        q = config["text_config"].get("quantization_config")
    if q is not None:
        if not isinstance(q, Mapping):
            raise ConfigError(f"config.json: quantization_config={shorten(q)} must be a JSON object")
        return q, "config.json's quantization_config"
    c = config.get("compression_config")
    if c is not None:  # the whole document, as quantization_config (model_config.py:1743-1745)
        if not isinstance(c, Mapping):
            raise ConfigError(f"config.json: compression_config={shorten(c)} must be a JSON object")
        return c, "config.json's compression_config"
    if isinstance(config.get(HF_QUANT_KEY), Mapping):
        return _modelopt_file(config[HF_QUANT_KEY]), HF_QUANT_CONFIG
    if directory is not None and (directory / HF_QUANT_CONFIG).is_file():
        try:
            doc = json.loads((directory / HF_QUANT_CONFIG).read_text()[: 4 << 20])
        except (OSError, ValueError, RecursionError):
            doc = None
        return _modelopt_file(doc if isinstance(doc, Mapping) else {}), HF_QUANT_CONFIG
    return None, ""


def unwrap_modelopt(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """``unwrap_modelopt_quantization_config`` (model_config.py:116-121): ``quantization``, nested or flat."""
    q = doc.get("quantization", doc)
    if not isinstance(q, Mapping):
        return {}
    nested = q.get("quantization")
    return nested if isinstance(nested, Mapping) else q


def _modelopt_file(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """``hf_quant_config.json`` as the quantization config SGLang reads from it: its section's
    ``quant_algo``, ``exclude_modules`` and ``kv_cache_quant_algo`` (modelopt_quant.py:491-500)."""
    q = unwrap_modelopt(doc)
    return {
        "quant_method": "modelopt",
        "quant_algo": q.get("quant_algo"),
        "ignore": q.get("exclude_modules"),
        "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
        NESTED_KEY: doc,
    }


def read_scheme(
    config: Mapping[str, Any], *, flag: str | None = None, directory: Path | None = None, source: str
) -> QuantScheme | None:
    """The checkpoint's FP8 scheme, None for an unquantized one; every other case one line."""
    q, where = _declared(config, directory)
    flag = flag.lower() if isinstance(flag, str) and flag else None
    if q is None:
        if flag is None:
            return None
        if flag not in SGLANG_METHODS:
            raise FlagError(
                f"--quantization {shorten(flag)}: SGLang refuses it (Unknown quantization method)"
            )
        raise FlagError(
            f"--quantization {flag} on an unquantized checkpoint ({source}): SGLang quantizes the weights "
            f"while loading, which the checker does not model; {_WAY_OUT}"
        )
    method = q.get("quant_method")
    if "quant_method" not in q or method == "modelopt":  # model_config.py:1731-1741
        return _modelopt(q, flag, where, source)
    if not isinstance(method, str) or not method:
        method = flag or ""
    if not method.startswith("modelopt "):
        method = method.lower()
    if method == "compressed-tensors":
        return _compressed(q, flag, where, source)
    if method == "gptq":
        gq = read_gptq(q, flag, where, source)
        return QuantScheme(gq.method, None, False, (), source, kv=False, gq=gq)
    if method == "awq":
        aw = read_awq(q, flag, _config_dtype(config), where, source)
        return QuantScheme(aw.method, None, False, (), source, kv=False, aw=aw)
    if method == "mxfp4" and flag in (None, "mxfp4"):
        raise ConfigError(
            f"{source}: {where} quant_method mxfp4: SGLang 0.5.23 on CUDA quantizes only FusedMoE layers "
            "with it and gives no method to a linear built with the quant config (Mxfp4Config."
            "get_quant_method, layers/quantization/mxfp4.py:356-381; from_config reads no ignore list, "
            ":319-335), so the class of every family the checker models fails at construction ('assert "
            "self.quant_method is not None', layers/linear.py:482); the checker models no mxfp4 weights: "
            "give the weights per GPU with "
            "--weights-gib"
        )
    if method.startswith("modelopt "):
        raise FlagError(
            f"{source}: the model is quantized ({method}, {where}); the checker derives quantized weights "
            f"for {', '.join(MODELLED)} only; {_WAY_OUT}"
        )
    if method not in SGLANG_METHODS:
        raise ConfigError(
            f"{source}: {where} quant_method={shorten(q.get('quant_method'))}: SGLang refuses it ('Unknown "
            "quantization method', configs/model_config.py:2152); fix the model config"
        )
    if flag is not None and flag != method:
        raise FlagError(
            f"--quantization {flag} contradicts {where}'s quant_method {method}: SGLang refuses it ('does "
            "not match the quantization method specified in the `quantization` argument', "
            "configs/model_config.py:2143)"
        )
    if method not in MODELLED:
        raise FlagError(
            f"{source}: the model is quantized ({method}); the checker derives quantized weights for "
            f"{', '.join(MODELLED)} only; {_WAY_OUT}"
        )
    return _fp8(q, source)


def _config_dtype(config: Mapping[str, Any]) -> str | None:
    """config.json's model dtype where it names one (the plain awq method takes float16 only)."""
    for section in (config, config.get("text_config")):
        if isinstance(section, Mapping):
            value = section.get("torch_dtype", section.get("dtype"))
            if isinstance(value, str):
                return value.removeprefix("torch.")
    return None


_CT_FLAGS = ("w8a8_fp8", "w8a8_int8", "auto-round-int8")
"""Flags SGLang accepts for a compressed-tensors checkpoint and serves with their own method
(``compatible_quantization_methods``, configs/model_config.py:2052-2054)."""


def _compressed(q: Mapping[str, Any], flag: str | None, where: str, source: str) -> QuantScheme:
    """A compressed-tensors quantization (checker.core.weights.compressed), under the flag SGLang takes."""
    if flag is not None and flag != "compressed-tensors":
        if flag not in SGLANG_METHODS:
            raise FlagError(
                f"--quantization {shorten(flag)}: SGLang refuses it (Unknown quantization method)"
            )
        if flag in _CT_FLAGS:
            raise FlagError(
                f"--quantization {flag} over {where}'s compressed-tensors: SGLang serves it with its {flag} "
                f"method, which the checker does not model; drop the flag or {_WAY_OUT}"
            )
        raise FlagError(
            f"--quantization {flag} contradicts {where}'s quant_method compressed-tensors: SGLang refuses it "
            "('does not match the quantization method specified in the `quantization` argument', "
            "configs/model_config.py:2143)"
        )
    ct = read_compressed(q, where, source)
    return QuantScheme("compressed-tensors", None, False, (), source, kv=ct.kv, ct=ct)


_MODELOPT_METHODS = {"MIXED_PRECISION": "modelopt_mixed or w4afp8", "MXFP8": "mxfp8"}


def _modelopt(q: Mapping[str, Any], flag: str | None, where: str, source: str) -> QuantScheme:
    """A ModelOpt quantization (``_parse_modelopt_quant_config``, model_config.py:1836-1897): FP8 is
    ``modelopt_fp8``, read by ``ModelOptFp8Config.from_config`` (modelopt_quant.py:466-522); the other
    algorithms are refused naming the method SGLang picks."""
    algo = q.get("quant_algo")
    shown = printable(algo)[:80] if isinstance(algo, str) else shorten(algo)
    if isinstance(algo, str) and "FP4" in algo:  # model_config.py:1867-1868
        return _modelopt_fp4(q, flag, where, source)
    if algo != "FP8":
        named = _MODELOPT_METHODS.get(algo, "") if isinstance(algo, str) else ""
        as_ = f" (SGLang's {named})" if named else ""
        raise FlagError(
            f"{source}: the model is quantized (modelopt {shown}, {where}){as_}; the checker derives "
            f"quantized weights for {', '.join(MODELLED)} only; {_WAY_OUT}"
        )
    if flag is not None and flag not in ("modelopt", "modelopt_fp8"):
        if flag not in SGLANG_METHODS:
            raise FlagError(
                f"--quantization {shorten(flag)}: SGLang refuses it (Unknown quantization method)"
            )
        raise FlagError(
            f"--quantization {flag} contradicts {where}'s ModelOpt FP8 (modelopt_fp8): SGLang refuses it "
            "('does not match the quantization method specified in the `quantization` argument', "
            "configs/model_config.py:2143)"
        )
    raw = q.get("ignore") or []
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ConfigError(
            f"{source}: {where} exclude_modules/ignore={shorten(raw)} must be a list of module names"
        )
    scheme = q.get("kv_cache_scheme")
    if isinstance(scheme, Mapping):  # modelopt_quant.py:484-491
        kv = scheme.get("type") == "float" and scheme.get("num_bits") == 8
    else:
        kv = bool(q.get("kv_cache_quant_algo"))
    names = tuple(raw)
    return QuantScheme("modelopt_fp8", None, True, names, source, kv=kv, globs=names)


def _modelopt_fp4(q: Mapping[str, Any], flag: str | None, where: str, source: str) -> QuantScheme:
    """ModelOpt NVFP4 (``modelopt_fp4``, checker.core.weights.modelopt): the flags SGLang takes for it,
    the config ``ModelOptFp4Config.from_config`` builds; a requantizing flag refused."""
    if flag is not None and flag not in ("modelopt", "modelopt_fp4"):
        if flag not in SGLANG_METHODS:
            raise FlagError(
                f"--quantization {shorten(flag)}: SGLang refuses it (Unknown quantization method)"
            )
        if flag in ("nvfp4_online", "quark_mxfp4"):
            raise FlagError(
                f"--quantization {flag} over {where}'s ModelOpt NVFP4: SGLang requantizes the checkpoint "
                f"while loading, which the checker does not model; drop the flag or {_WAY_OUT}"
            )
        raise FlagError(
            f"--quantization {flag} contradicts {where}'s ModelOpt NVFP4 (modelopt_fp4): SGLang refuses it "
            "('does not match the quantization method specified in the `quantization` argument', "
            "configs/model_config.py:2143)"
        )
    nested = q.get(NESTED_KEY)
    fp4 = read_fp4(q, nested if isinstance(nested, Mapping) else None, where, source)
    names = fp4.exclude
    # kv_cache_quant_algo is 'auto' where none is declared (modelopt_quant.py:1640, :1660): truthy
    return QuantScheme("modelopt_fp4", None, False, names, source, kv=True, globs=names, fp4=fp4)


def _fp8(q: Mapping[str, Any], source: str) -> QuantScheme:
    """``Fp8Config.from_config`` and ``__init__`` (fp8.py:284-386), their refusals included."""
    act = q.get("activation_scheme")
    if act is None:
        raise ConfigError(
            f"{source}: quantization_config has no activation_scheme; SGLang's Fp8Config requires it "
            "('Cannot find any of [activation_scheme]', fp8.py:350)"
        )
    if act not in ("static", "dynamic"):
        raise ConfigError(
            f"{source}: quantization_config activation_scheme={shorten(act)}: SGLang refuses it "
            "('Unsupported activation scheme', fp8.py:285)"
        )
    raw_ignored = q.get("ignored_layers") or q.get("modules_to_not_convert") or []
    if not isinstance(raw_ignored, list) or not all(isinstance(x, str) for x in raw_ignored):
        raise ConfigError(
            f"{source}: quantization_config modules_to_not_convert={shorten(raw_ignored)} must be a list of "
            "module names"
        )
    ignored: list[str] = []
    for name in raw_ignored:
        base = name.removeprefix("model.")
        ignored += [base, f"model.{base}"]
    raw_block = q.get("weight_block_size")
    block: tuple[int, int] | None = None
    if raw_block is not None:
        if (
            not isinstance(raw_block, list)
            or len(raw_block) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in raw_block)
        ):
            raise ConfigError(
                f"{source}: quantization_config weight_block_size={shorten(raw_block)}: SGLang takes two "
                "positive block sizes [block_n, block_k] ('must have 2 dimensions', fp8.py:307)"
            )
        if act != "dynamic":
            raise ConfigError(
                f"{source}: quantization_config weight_block_size with activation_scheme static: SGLang "
                "refuses it ('block-wise quantization only supports dynamic activation scheme', fp8.py:312)"
            )
        block = (raw_block[0], raw_block[1])
    return QuantScheme("fp8", block, act == "static", tuple(ignored), source)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_block(
    scheme: QuantScheme, prefix: str, shards: Sequence[int], inp: int, *, out_split: int, in_split: int
) -> None:
    """``validate_block_quant_shapes`` (fp8.py:570-611): a row-split input partition divisible by bk, a
    column-split or merged output partition divisible by bn."""
    if scheme.block is None:
        return
    bn, bk = scheme.block
    if in_split > 1 and inp % bk:
        raise LayoutError(
            f"{prefix}: its input partition {inp} is not divisible by the FP8 block_k {bk}; SGLang refuses "
            "this layout ('Weight input_size_per_partition ... is not divisible by weight quantization "
            "block_k', fp8.py:597): use a TP size that keeps whole blocks"
        )
    if out_split > 1 or len(shards) > 1:
        for size in shards:
            if size % bn:
                raise LayoutError(
                    f"{prefix}: its output partition {size} is not divisible by the FP8 block_n {bn}; SGLang "
                    "refuses this ('Weight output_partition_size ... is not divisible by weight quantization "
                    "block_n', fp8.py:606): use a TP size that keeps whole blocks, or list the layer in "
                    "modules_to_not_convert as the checkpoint does"
                )
