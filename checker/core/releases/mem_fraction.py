"""The --mem-fraction-static each SGLang release picks when the launch command leaves it unset.

SGLang computes it at start-up from the GPU's total memory (``get_device_memory_capacity``: on CUDA,
``nvidia-smi --query-gpu=memory.total``, the smallest GPU in MiB; ``torch.cuda.mem_get_info()[1]`` only
where nvidia-smi gives no number, MIG) and the serving flags. The rule, per release, is read from the
release's code by ``scripts/build_mem_fraction.py`` into :mod:`checker.core.releases.mem_fraction_table`:

* 0.5.2 (``server_args.py __post_init__``): a reserve by GPU tier, ``(a + tp*pp / b)`` GiB;
* 0.5.3+ (``_handle_gpu_memory_settings``; 0.5.19+ ``arg_groups/memory_hook.py``): the tier picks the
  default ``--chunked-prefill-size`` and decode CUDA-graph max batch size (by tp below / from 4); then
  ``reserved = 512 + 1.5 * max(chunked_prefill_size, 2048) + 2 * max_bs + tp*pp/8 GiB`` (MiB), at least
  10 GiB on a GPU above 60 GiB, and ``round((total - reserved) / total, 3)``. 0.5.15+ skip the graph term
  under ``--disable-cuda-graph``; 0.5.22+ cap the default max bs at ``--max-running-requests``.

Assumed as on a CUDA GPU (the checker cannot see them from the launch command): the platform (no NPU,
XPU or AMD branch), no out-of-tree platform. Refused in one line, never guessed: a serving mode whose
reserve the checker does not model (speculative decoding, attention DP, PD disaggregation, DeepEP,
a prefill CUDA graph: pp 1 from 0.5.10 on, where SGLang enables it by model class, or one forced by
flag), a multimodal model (the VLM adjustment reads the vision tower as transformers loads it), and
post-capture sizing (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checker.core.errors import FlagError
from checker.core.releases.releases import release_key

MIB = 1 << 20
ADD_FLAG = "add --mem-fraction-static F as the server is started"


@dataclass(frozen=True)
class DefaultFraction:
    """The fraction a release picks, and where it comes from (for the report and derive's text)."""

    value: float
    release: str
    total_mib: float
    tp_size: int
    pp_size: int
    where: str
    """``file:line`` of the release's code computing it."""

    @property
    def source(self) -> str:
        gib = self.total_mib / 1024
        return (
            f"SGLang {self.release}'s default for a {gib:g} GiB GPU at tp {self.tp_size} pp {self.pp_size} "
            f"({self.where})"
        )

    @property
    def text(self) -> str:
        return f"--mem-fraction-static {self.value:g}, {self.source}"


@dataclass(frozen=True)
class _Flags:
    tp_size: int = 1
    pp_size: int = 1
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: tuple[int, ...] = ()
    disable_cuda_graph: bool = False
    max_running_requests: int | None = None


_INT_FLAGS = {
    "--tp-size": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--tp": "tp_size",
    "--pp-size": "pp_size",
    "--pipeline-parallel-size": "pp_size",
    "--pp": "pp_size",
    "--chunked-prefill-size": "chunked_prefill_size",
    "--max-prefill-tokens": "max_prefill_tokens",
    "--cuda-graph-max-bs": "cuda_graph_max_bs",
    "--max-running-requests": "max_running_requests",
}
# Flags whose reserve (or whose effect on the inputs above) the checker does not model: the flag, and
# the value that is harmless (None: any value given is refused).
_REFUSED: dict[str, tuple[str | None, str]] = {
    "--speculative-algorithm": (None, "speculative decoding"),
    "--disaggregation-mode": ("null", "PD disaggregation"),
    "--enable-dp-attention": (None, "attention DP"),
    "--attn-dp-size": ("1", "attention DP"),
    "--moe-a2a-backend": ("none", "the MoE all-to-all backend (DeepEP's buffers)"),
    "--enable-deepep-moe": (None, "DeepEP"),
    "--enable-piecewise-cuda-graph": (None, "a prefill (piecewise) CUDA graph"),
    "--enforce-piecewise-cuda-graph": (None, "a prefill (piecewise) CUDA graph"),
    "--cuda-graph-backend-prefill": (None, "a prefill CUDA graph backend"),
    "--cuda-graph-backend-decode": (None, "a decode CUDA graph backend"),
    "--enable-kv-cache-sharding": (None, "KV cache sharding (its fraction correction)"),
    "--cuda-graph-config": (None, "a CUDA graph config"),
}
_BOOL_FLAGS = {"--disable-cuda-graph"}


def _words(argv: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(flag, the words after it up to the next flag), for ``--flag v`` and ``--flag=v`` alike."""
    out: list[tuple[str, list[str]]] = []
    for word in argv:
        if word.startswith("--"):
            flag, eq, value = word.partition("=")
            out.append((flag.replace("_", "-"), [value] if eq else []))
        elif out:
            out[-1][1].append(word)
    return out


def _int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise FlagError(f"the launch command's {flag} {value!r} is not an integer") from None


def read_flags(argv: Sequence[str], release: str) -> _Flags:
    """The flags the rule reads from the launch command; one it does not model is refused."""
    values: dict[str, Any] = {}
    for flag, words in _words(argv):
        if flag in _INT_FLAGS and words:
            values[_INT_FLAGS[flag]] = _int(flag, words[0])
        elif flag == "--cuda-graph-bs" and words:
            values["cuda_graph_bs"] = tuple(_int(flag, w) for w in words)
        elif flag in _BOOL_FLAGS:
            values["disable_cuda_graph"] = not words or words[0].lower() in ("1", "true")
        elif flag in _REFUSED:
            harmless, what = _REFUSED[flag]
            if harmless is None or (words and words[0] != harmless):
                shown = f"{flag} {words[0]}" if words else flag
                raise FlagError(
                    f"SGLang {release}'s default --mem-fraction-static with {shown} is not modelled "
                    f"(its reserve for {what}); {ADD_FLAG}"
                )
    return _Flags(**values)


def _multimodal(config: Mapping[str, Any] | None) -> bool:
    return config is not None and any(k in config for k in ("vision_config", "audio_config"))


def default_fraction(
    release: str,
    total_mib: float,
    argv: Sequence[str],
    *,
    config: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    rules: Mapping[str, Mapping[str, Any]] | None = None,
) -> DefaultFraction:
    """The --mem-fraction-static SGLang ``release`` picks on a GPU of ``total_mib`` MiB for the launch
    command ``argv`` (config.json's ``config`` decides whether it is a VLM)."""
    if rules is None:
        # start-up: the generated table loads only where the fraction is unset
        from checker.core.releases.mem_fraction_table import RULES

        rules = RULES
    rule = rules.get(release)
    if rule is None:
        raise FlagError(f"SGLang {release}'s default --mem-fraction-static is not read; {ADD_FLAG}")
    if not total_mib > 0:
        raise FlagError(f"a GPU of {total_mib:g} MiB has no --mem-fraction-static")
    f = read_flags(argv, release)
    where = f"{rule['file']}:{rule['line']}"
    if _multimodal(config):
        raise FlagError(
            f"SGLang {release}'s default --mem-fraction-static for a multimodal model (its VLM adjustment, "
            f"{rule['file']}) is not modelled; {ADD_FLAG}"
        )
    if rule["post_capture"] and (env or {}).get("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "").lower() in (
        "1",
        "true",
        "yes",
        "on",
    ):
        raise FlagError(
            f"SGLang {release}'s default --mem-fraction-static under SGLANG_ENABLE_POST_CAPTURE_KV_SIZING "
            f"is not modelled; {ADD_FLAG}"
        )
    tp, pp = f.tp_size, f.pp_size
    if rule["rule"] == "tiered":  # 0.5.2
        a, b = next((t[1], t[2]) for t in rule["tiers"] if t[0] is None or total_mib < t[0] * 1024)
        reserved = (a + tp * pp / b) * 1024 if b else a * 1024
        value = round((total_mib - reserved) / total_mib, 3)
        return DefaultFraction(value, release, total_mib, tp, pp, where)
    if pp == 1 and _prefill_graph_by_class(release):
        raise FlagError(
            f"SGLang {release}'s default --mem-fraction-static at pp 1 reserves for a prefill CUDA graph "
            f"it enables by model class, which is not modelled; {ADD_FLAG}"
        )
    _, cps_default, bs_small, bs_large = next(
        t for t in rule["tiers"] if t[0] is None or total_mib < t[0] * 1024
    )
    cps = f.chunked_prefill_size if f.chunked_prefill_size is not None else cps_default
    max_bs = f.cuda_graph_max_bs
    if max_bs is None:
        max_bs = bs_small if tp < 4 else bs_large
        if rule["capped_by_running"] and f.max_running_requests is not None:
            max_bs = min(max_bs, f.max_running_requests)
    if f.cuda_graph_bs:
        max_bs = max(f.cuda_graph_bs)
    activation = max(cps, 2048) if cps > 0 else max(f.max_prefill_tokens, 2048)
    reserved = 512 + activation * 1.5
    if not (rule["graph_gated"] and f.disable_cuda_graph):
        reserved += max_bs * 2
    reserved += tp * pp / 8 * 1024
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return DefaultFraction(round((total_mib - reserved) / total_mib, 3), release, total_mib, tp, pp, where)


def _prefill_graph_by_class(release: str) -> bool:
    """0.5.10+ capture a prefill CUDA graph by default, off under pp > 1 (0.5.10-0.5.18
    ``_handle_piecewise_cuda_graph``: "5. Pipeline parallelism"; 0.5.19+ ``apply_cuda_graph_compatibility``)
    and for some model classes: at pp 1 the checker cannot say whether it reserves for one."""
    return release_key(release) >= release_key("0.5.10")
