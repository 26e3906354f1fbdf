"""The memory SGLang hands its state-pool sizing (``total_rest_memory``), per release group; torch-free.

Every modelled release computes it in ``_profile_available_bytes`` (0.5.14-0.5.15.post1:
model_runner_kv_cache_mixin.py ``ModelRunnerKVCacheMixin``; 0.5.16+: mem_cache/kv_cache_configurator.py
``KVCacheConfigurator``) from two measurements of free device memory, each taken by
``get_available_gpu_memory`` (utils/common.py), which all-reduces the free BYTES as a float32 tensor
with MIN over the world group and returns ``value / 2**30``:

* ``pre_model_load_memory``: free memory before the weights load (distributed/bootstrap.py in 0.5.23,
  ``ModelRunner.init_torch_distributed`` before);
* ``available_gpu_memory``: free memory after the weights load.

Then ``slack = pre * (1 - mem_fraction_static)`` and ``rest = available - slack``, with two later
terms: from 0.5.16 the slack is raised to the pre-capture activation reserve when the KV pool is sized
after CUDA-graph capture (``post_capture_kv_active``), and from 0.5.18 a multimodal runtime reservation
(``mm_runtime_reservation_gb``) is also taken off. The checker loads no weights: the user gives their
footprint, and free-after is free-before minus it on every rank.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from checker.core.errors import BudgetError, FlagError
from checker.core.releases.releases import release_model

GIB = 2**30
MAX_BUDGET_GIB = 1 << 20
"""1 PiB: far above any device; keeps bytes = GiB * 2**30 exact in float64 and int64 (every budget
flag and ``--budgets`` is refused above it)."""
MISSING = -1
"""A rank that reported no free-memory figure (the wire format's placeholder)."""


def float32(x: float) -> float:
    """``x`` rounded to the nearest IEEE float32 and back, as ``torch.tensor(x, dtype=torch.float32)
    .item()`` does (round to nearest, ties to even)."""
    (rounded,) = struct.unpack("<f", struct.pack("<f", x))
    return float(rounded)


def agreed_free_gib(free_bytes: Sequence[int]) -> float:
    """What ``get_available_gpu_memory(distributed=True)`` returns on every rank: the MIN over ranks of
    the free bytes as float32, divided by 2**30. (float32 rounding is monotone, so the MIN of the rounded
    values is the rounded MIN.)"""
    if not free_bytes:
        raise BudgetError("no free-memory figure to agree on (every rank missing)")
    return float32(float(min(free_bytes))) / GIB


def agreed_budget_gib(free_bytes: list[int], own: int, *, fraction: float, agree: bool) -> float:
    """The check command's ``--budget-from-device`` budget: free memory (MIN over the ranks that
    reported, float32, as SGLang agrees it; or this rank's own figure with ``agree=False``) times
    --mem-fraction-static. Moved unchanged from checker/commands/check.py; it is
    :func:`sizing_budget` with no weights loaded, before the weights are counted."""
    known = [b for b in free_bytes if b != MISSING]
    chosen = (min(known) if agree and known else own) / GIB
    return float32(chosen) * fraction


def pre_capture_activation_reserve_mb(
    *,
    gpu_mem_mb: float | None,
    tp_size: int,
    pp_size: int,
    chunked_prefill_size: int,
    max_prefill_tokens: int = 16384,
    decode_running_requests: int | None = None,
    speculative_num_draft_tokens: int | None = None,
) -> float:
    """The activation reserve (MB) the slack is raised to when the KV pool is sized after graph
    capture: 0.5.16 server_args.py ``ServerArgs.mamba_pre_capture_reserve_mb``, 0.5.17
    ``pre_capture_activation_reserve_mb``, 0.5.18+ runtime_context.py ``pre_capture_activation_reserve_mb``
    (the same formula). ``decode_running_requests``: set only for a PD-disaggregation decode server
    (its --max-running-requests, or the decode CUDA-graph max batch size, or 1)."""
    if decode_running_requests is not None:
        activation_tokens = max(decode_running_requests * (speculative_num_draft_tokens or 1), 2048)
    elif chunked_prefill_size > 0:
        activation_tokens = max(chunked_prefill_size, 2048)
    else:
        activation_tokens = max(max_prefill_tokens, 2048)
    reserved = 512 + activation_tokens * 1.5 + tp_size * pp_size / 8 * 1024
    if gpu_mem_mb is not None and gpu_mem_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved


@dataclass(frozen=True, kw_only=True)
class SizingBudget:
    budget_gib: float
    """``total_rest_memory`` in GiB, as the release hands it to the pool sizing."""
    formula: str
    """One line: the release group's formula with the numbers put in."""


def sizing_budget(
    sglang_version: str | None,
    *,
    free_before_gib: float,
    weights_gib: float,
    mem_fraction_static: float,
    pre_capture_reserve_mb: float | None = None,
    mm_reservation_gb: float = 0.0,
) -> SizingBudget:
    """``total_rest_memory`` for one release group, from what the checker can know.

    ``free_before_gib``: the agreed free memory before weights (:func:`agreed_free_gib`, or a figure the
    user gives). ``weights_gib``: the weights' footprint on the busiest rank (the checker loads none);
    free-after is ``float32((free_before - weights) in bytes) / 2**30``, as SGLang measures it again.
    ``pre_capture_reserve_mb``: only when the KV pool is sized after graph capture (0.5.16+; see
    :func:`pre_capture_activation_reserve_mb`), else None. ``mm_reservation_gb``: a multimodal model's
    runtime reservation (0.5.18+: SGLANG_VLM_CACHE_SIZE_MB, plus SGLANG_MM_FEATURE_CACHE_MB with a CUDA
    IPC/VMM feature transport, over 1024). Refused where SGLang refuses: the result 0 GiB or below
    ("Loaded weights leave no GPU memory for the KV cache").
    """
    rules = release_model(sglang_version).rules
    for name, v in (("free memory", free_before_gib), ("--weights-gib", weights_gib)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise FlagError(f"{name} {v} must be a finite number of GiB >= 0")
    f = mem_fraction_static
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
        raise FlagError(f"--mem-fraction-static {f} must be in (0, 1]")
    pre = free_before_gib
    available = float32(round((free_before_gib - weights_gib) * GIB)) / GIB
    slack = pre * (1 - f)
    formula = f"free_after {available:.6g} - free_before {pre:.6g} * (1 - {f:g})"
    if pre_capture_reserve_mb is not None:
        if rules.budget_rule == "slack":
            raise FlagError(
                f"SGLang {release_model(sglang_version).version} has no pre-capture reserve (it arrived in "
                "0.5.16); drop it"
            )
        slack = max(slack, pre_capture_reserve_mb / 1024)
        formula = (
            f"free_after {available:.6g} - max(free_before {pre:.6g} * (1 - {f:g}), "
            f"pre-capture reserve {pre_capture_reserve_mb:g} MB / 1024)"
        )
    budget_gib = available - slack
    if mm_reservation_gb:
        if rules.budget_rule != "slack+pre-capture+mm":
            raise FlagError(
                f"SGLang {release_model(sglang_version).version} takes no multimodal reservation off the "
                "budget (it arrived in 0.5.18); drop it"
            )
        budget_gib = available - slack - mm_reservation_gb
        formula += f" - multimodal reservation {mm_reservation_gb:g}"
    if budget_gib <= 0:
        raise BudgetError(
            f"the weights leave no memory for the KV and state pools: {formula} = {budget_gib:.6g} GiB; "
            'SGLang refuses to start ("Loaded weights leave no GPU memory for the KV cache"); raise '
            "--mem-fraction-static or lower the weights"
        )
    return SizingBudget(
        budget_gib=budget_gib, formula=f"total_rest_memory = {formula} = {budget_gib:.6g} GiB ({rules.group})"
    )
