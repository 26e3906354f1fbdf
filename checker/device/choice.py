"""Which torch device a sweep derives on: the user's ``--device``, refused with one line if unusable.

(``--materialize-device``, which also spreads ranks over a node's GPUs, is
:func:`checker.device.materialize.resolve_device`.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from checker.core.errors import FlagError

if TYPE_CHECKING:  # torch is imported when a device is chosen, so --help and input errors cost none
    import torch


def sweep_device(name: str) -> torch.device:
    import torch  # torch: a second of CPU a process, paid only where a tensor is made (docs/performance.md)

    try:
        device = torch.device(name)
    except RuntimeError:
        raise FlagError(f"--device {name!r} is not a torch device; use cpu or cuda[:N]") from None
    if device.type not in ("cpu", "cuda"):
        # meta holds shapes, no values (the sweep reads its results back with .item()); mps and others
        # lack float64, which the derivation needs to match the scalar core.
        raise FlagError(
            f"--device {name}: the sweep derives on cpu or cuda[:N] only"
            + (" (a meta tensor holds no values to read back)" if device.type == "meta" else "")
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise FlagError(f"--device {name}: no CUDA device is available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise FlagError(
            f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible here; "
            f"use cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return device


def use_one_cpu_thread(device: torch.device) -> None:
    """A few elementwise ops per stage: intra-op threads only contend on a shared host (8 ranks on 2
    cores spin each other out), so on a CPU one thread is both the fastest and the polite choice."""
    import torch  # torch: a second of CPU a process, paid only where a tensor is made (docs/performance.md)

    if device.type == "cpu":
        torch.set_num_threads(1)
