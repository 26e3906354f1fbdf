"""``--materialize``: allocate one stage's state pool for real, measure it, free it.

The derivation says how many bytes a stage's pool takes; the strongest evidence that it is right is
to allocate that pool on the stage's own device with SGLang's shapes and dtypes and see it fit in
exactly those bytes, before the server starts. What is allocated mirrors SGLang 0.5.23's ``MambaPool``
(srt/mem_cache/memory_pool.py, the non-envelope layout):

* K + 1 slots (K = max_mamba_cache_size; slot K is the padding slot) for each of the stage's OWN
  linear layers: every conv shape in the conv dtype and the temporal shape in the temporal dtype.
  SGLang allocates ``(num_layers, K + 1, *shape)`` per state; we allocate one ``(K + 1, *shape)``
  tensor per layer and state (same bytes, no single giant tensor, and a deadline check between them).
* with spec decoding (D draft tokens), the verify scratch, sized by ``spec_state_size`` =
  max_running_requests (kv_cache_configurator ``_build_hybrid_req_pool``): per layer
  ``intermediate_ssm (S + 1, D, *temporal)`` and, per conv shape, the dense
  ``intermediate_conv_window (S + 1, D, *conv)``.
* a configured per-slot extra state (``extra_per_slot_bytes``, shape unknown to us): ``(K + 1, bytes)``
  of uint8, the bytes ``state_allocated_bytes`` counts; with ``--enable-linear-replayssm-spec`` a KDA
  model's ReplaySSM ring rides there (charged per slot, checker.core.sizing.replay), a GDN model's is one
  ``(bytes,)`` uint8 buffer of the ring charged per request, and no verify scratch is allocated
  (SGLang allocates no ``intermediate_ssm`` under the ring). The ring's bytes are the charged ones (the
  busiest stage's share, as ``extra_per_slot_bytes`` is).

What SGLang allocates differs from what it RESERVES for the spec scratch in two ways, both reported
rather than hidden (docs/materialize.md):
1. the reservation is ``stage_per_req * slots * D`` (the core's ``intermediate_state_bytes``), charged
   with the policy's scale like the pool, while the tensors cover only the stage's own layers; at
   pp 1 the two coincide, at pp > 1 a stage with fewer linear layers than the busiest allocates less.
   The prediction here is the allocation: ``own_state_bytes_per_slot * (max_running_requests + 1) * D``.
2. on CUDA with a linear draft chain and a non-KDA model, SGLang deduplicates the conv windows to
   ``D + K - 2`` columns instead of ``D * (K - 1)``; we allocate the dense layout (SGLang's on CPU, for
   KDA, and for tree verify), an upper bound of the deduplicated one.

Measured: on CUDA the allocator's ``requested_bytes`` delta (exact request sizes; ``memory_allocated``
rounds each block to 512 bytes), on CPU the sum of ``untyped_storage().nbytes()``. An allocation failure
(out of memory) and a prediction that differs from the measurement are findings, never exceptions.

Test hook: ``CHECKER_MATERIALIZE_LIMIT_BYTES=N`` (set on one rank) makes any allocation that would take
this stage's pool above N bytes fail with ``torch.OutOfMemoryError``, as a full device would. Unset
in production.
"""

from __future__ import annotations

import gc
import math
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, TypedDict

from checker.core.errors import FlagError
from checker.core.sizing.geometry import DTYPE_ITEMSIZE
from checker.core.sizing.sizing import CapacityInputs, StageCapacity

if TYPE_CHECKING:
    import torch

LIMIT_ENV = "CHECKER_MATERIALIZE_LIMIT_BYTES"
HOST_RAM_FRACTION = 0.5
"""On CPU, refuse a pool above this share of MemAvailable (split over the ranks sharing the host)."""
MATERIALIZE_OK, MATERIALIZE_MISMATCH, MATERIALIZE_FAILED = 0, 1, 2
"""``materialize_status`` on the wire (the row's own status is checker.status.ROW_MATERIALIZE)."""
MATERIALIZE_STATUS_NAMES = ("ok", "mismatch", "failed")
_ITEMSIZE = {**DTYPE_ITEMSIZE, "uint8": 1}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the pool: what it is for, its shape and dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]


@dataclass(frozen=True, kw_only=True)
class MaterializeResult:
    predicted_bytes: int
    """What the derivation says the stage allocates (pool + spec scratch)."""
    allocated_bytes: int
    """Measured; on a failure, what had been allocated when it failed."""
    ok: bool
    error: str = ""
    """One line with the numbers; empty when ok."""
    status: int = MATERIALIZE_OK
    device: str = "cpu"
    num_tensors: int = 0
    elapsed_s: float = 0.0
    reserved_intermediate_bytes: int = 0
    """What SGLang takes from the budget for the spec scratch (the core's intermediate_state_bytes)."""


def spec_draft_tokens(inputs: CapacityInputs, stage: StageCapacity | None = None) -> int:
    """The draft tokens the verify scratch is allocated for: none under the ReplaySSM ring."""
    if stage is not None and stage.replayssm_active:
        return 0
    return inputs.speculative_num_draft_tokens or 0


def predicted_bytes(inputs: CapacityInputs, stage: StageCapacity) -> int:
    """The derivation's figure for what the stage allocates, from the core's numbers (not from shapes)."""
    d = spec_draft_tokens(inputs, stage)
    scratch = stage.own_state_bytes_per_slot * (stage.max_running_requests + 1) * d if d else 0
    return stage.state_allocated_bytes + scratch + stage.replayssm_fixed_bytes


def pool_tensors(inputs: CapacityInputs, stage: StageCapacity) -> list[TensorSpec]:
    """Every tensor SGLang's pool holds on this stage, one per layer and state (see module docstring)."""
    g = inputs.geometry
    slots = stage.max_mamba_cache_size + 1
    own = [i for i in g.linear_layer_ids if stage.start_layer <= i < stage.end_layer]
    out: list[TensorSpec] = []
    for layer in own:
        for j, conv in enumerate(g.conv_shapes):
            out.append(TensorSpec(f"layer {layer} conv[{j}]", (slots, *conv), g.conv_dtype))
        out.append(TensorSpec(f"layer {layer} temporal", (slots, *g.temporal_shape), g.temporal_dtype))
    if stage.extra_per_slot_bytes:
        out.append(TensorSpec("extra per-slot state", (slots, stage.extra_per_slot_bytes), "uint8"))
    if stage.replayssm_fixed_bytes:
        out.append(TensorSpec("ReplaySSM ring (per request)", (stage.replayssm_fixed_bytes,), "uint8"))
    d = spec_draft_tokens(inputs, stage)
    if d:
        spec_slots = stage.max_running_requests + 1  # spec_state_size + 1
        for layer in own:
            out.append(
                TensorSpec(
                    f"layer {layer} intermediate_ssm", (spec_slots, d, *g.temporal_shape), g.temporal_dtype
                )
            )
            for j, conv in enumerate(g.conv_shapes):
                out.append(
                    TensorSpec(
                        f"layer {layer} intermediate_conv_window[{j}]", (spec_slots, d, *conv), g.conv_dtype
                    )
                )
    return out


def resolve_device(name: str, *, local_rank: int = 0, default: str = "cpu") -> torch.device:
    """``auto`` -> ``default``; ``cuda`` -> this node's GPU ``local_rank`` mod the GPU count.

    The modulo lets several ranks share one GPU (a single-GPU host running a small world).
    """
    import torch  # torch: a second of CPU a process, paid only where a tensor is made (docs/performance.md)

    text = (default if name == "auto" else name).strip()
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise FlagError(
            f"--materialize-device {name!r} is not a device; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise FlagError(f"--materialize-device {name!r}: only cpu and cuda are supported")
    if not torch.cuda.is_available():
        raise FlagError(f"--materialize-device {name}: no CUDA device is visible here; use cpu")
    count = torch.cuda.device_count()
    index = local_rank % count if device.index is None else device.index
    if index >= count:
        raise FlagError(f"--materialize-device {name}: only {count} CUDA device(s) visible")
    return torch.device("cuda", index)


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _limit_bytes() -> int | None:
    text = os.environ.get(LIMIT_ENV)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise FlagError(f"{LIMIT_ENV}={text!r} is not an integer number of bytes") from None


class _Measured(TypedDict):
    """The fields of a :class:`MaterializeResult` known before allocating, whatever the outcome."""

    predicted_bytes: int
    device: str
    num_tensors: int
    reserved_intermediate_bytes: int


def _gib(n: int) -> str:
    return f"{n:,} B ({n / 2**30:.3f} GiB)"


class _Meter:
    """Bytes allocated on one device: allocator statistics on CUDA, storage sizes on CPU."""

    def __init__(self, torch_mod: ModuleType, device: torch.device) -> None:
        self.torch, self.device = torch_mod, device  # torch_mod: the torch module, imported by the caller
        self.cuda = device.type == "cuda"
        self.tensor_bytes = 0
        if self.cuda:
            torch_mod.cuda.synchronize(device)
            self.base_allocated: int = torch_mod.cuda.memory_allocated(device)
            self.base_requested = self._requested()

    def _requested(self) -> int | None:
        stats = self.torch.cuda.memory_stats(self.device)
        value = stats.get("requested_bytes.all.current")
        return None if value is None else int(value)

    def add(self, t: torch.Tensor) -> None:
        self.tensor_bytes += t.untyped_storage().nbytes()

    def measured(self) -> int:
        if not self.cuda:
            return self.tensor_bytes
        self.torch.cuda.synchronize(self.device)
        now = self._requested()
        if now is not None and self.base_requested is not None:
            return now - self.base_requested
        allocated: int = self.torch.cuda.memory_allocated(self.device)
        return allocated - self.base_allocated

    def left_over(self) -> int:
        """After freeing: bytes the pool still holds (0 when everything went back)."""
        if not self.cuda:
            return 0
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.empty_cache()
        allocated: int = self.torch.cuda.memory_allocated(self.device)
        return allocated - self.base_allocated


def materialize_stage(
    inputs: CapacityInputs,
    stage: StageCapacity,
    device: str | torch.device = "cpu",
    *,
    host_share: int = 1,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> MaterializeResult:
    """Allocate ``stage``'s pool on ``device``, measure it, free it. Never raises for OOM or mismatch.

    ``host_share``: ranks materialising on this host at the same time (the CPU guard splits the host's
    available memory between them). ``deadline``: a ``clock()`` time by which allocation must be done;
    checked between tensors, so a slow allocation ends as a failure instead of outliving --timeout-s.
    """
    import torch  # torch: a second of CPU a process, paid only where a tensor is made (docs/performance.md)

    t0 = clock()
    device = torch.device(device)
    predicted = predicted_bytes(inputs, stage)
    specs = pool_tensors(inputs, stage)
    where = f"stage {stage.pp_rank} on {device}"
    base = _Measured(
        predicted_bytes=predicted,
        device=str(device),
        num_tensors=len(specs),
        reserved_intermediate_bytes=stage.intermediate_state_bytes,
    )

    def failed(msg: str, allocated: int) -> MaterializeResult:
        return MaterializeResult(
            allocated_bytes=allocated,
            ok=False,
            error=msg,
            status=MATERIALIZE_FAILED,
            elapsed_s=clock() - t0,
            **base,
        )

    try:
        limit = _limit_bytes()
    except FlagError as exc:
        return failed(str(exc), 0)
    if device.type == "cpu":
        avail = _host_available_bytes()
        if avail is not None:
            cap = int(avail * HOST_RAM_FRACTION / max(1, host_share))
            if predicted > cap:
                return failed(
                    f"materialize refused on {where}: the pool needs {_gib(predicted)}, above "
                    f"{HOST_RAM_FRACTION:.0%} of MemAvailable {avail / 2**30:.1f} GiB split over "
                    f"{host_share} rank(s) on this host; lower --budget-gib (or --max-mamba-cache-size) "
                    "or materialise on a GPU",
                    0,
                )
    oom_type = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    tensors: list[torch.Tensor] = []
    refs: list[weakref.ref[torch.Tensor]] = []
    t: torch.Tensor | None = None
    meter = _Meter(torch, device)
    error = ""
    allocated = 0
    try:
        for spec in specs:
            if deadline is not None and clock() > deadline:
                raise TimeoutError(
                    f"did not finish within the time left (--timeout-s) after {len(tensors)} of "
                    f"{len(specs)} tensors"
                )
            if limit is not None and meter.tensor_bytes + spec.nbytes > limit:
                raise oom_type(
                    f"allocating {spec.name} ({spec.nbytes:,} B) would exceed {LIMIT_ENV}={limit:,} "
                    "(injected out-of-memory)"
                )
            t = torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype), device=device)
            tensors.append(t)
            refs.append(weakref.ref(t))
            meter.add(t)
        allocated = meter.measured()
    except (RuntimeError, TimeoutError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        allocated = meter.measured()
        kind = "out of memory" if isinstance(exc, oom_type) else type(exc).__name__
        error = (
            f"materialize failed on {where} ({kind}) after {allocated:,} of {_gib(predicted)} "
            f"predicted, {len(tensors)}/{len(specs)} tensors: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
    finally:
        del tensors
        t = None  # the loop variable holds the last tensor
        del t
        gc.collect()
    alive = sum(r() is not None for r in refs)
    left = meter.left_over()
    if alive or left:
        leak = (
            f"materialize leak on {where}: {alive} tensor(s) still referenced, {left:,} B still "
            "allocated after freeing"
        )
        return failed(f"{error}; {leak}" if error else leak, allocated)
    if error:
        return failed(error, allocated)
    if allocated != predicted:
        diff = allocated - predicted
        return MaterializeResult(
            allocated_bytes=allocated,
            ok=False,
            status=MATERIALIZE_MISMATCH,
            elapsed_s=clock() - t0,
            error=(
                f"materialize mismatch on {where}: predicted {predicted:,} B, allocated "
                f"{allocated:,} B ({diff:+,} B)"
            ),
            **base,
        )
    return MaterializeResult(allocated_bytes=allocated, ok=True, elapsed_s=clock() - t0, **base)
