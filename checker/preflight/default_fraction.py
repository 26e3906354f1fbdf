"""The --mem-fraction-static a rank's SGLang release picks when the launch command leaves it unset: the GPU's
total memory read as SGLang reads it (or ``--device-total-gib``), the launch command's serving flags, and
the release's rule (:mod:`checker.core.releases.mem_fraction`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from typing import Any

from checker.core.releases.mem_fraction import MIB, DefaultFraction, default_fraction

NVIDIA_SMI_TIMEOUT_S = 10.0


def sglang_device_total_mib(device: Any) -> float:
    """The GPU's total memory in MiB as SGLang's ``get_nvgpu_memory_capacity`` reads it (every modelled
    release, ``utils``): ``nvidia-smi --query-gpu=memory.total`` (the smallest GPU listed), and
    ``torch.cuda.mem_get_info()[1] // MiB`` where nvidia-smi gives no number (MIG, no nvidia-smi)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        )
        values = [float(v) for v in out.stdout.strip().split("\n") if re.match(r"^\d+(\.\d+)?$", v.strip())]
        if out.returncode == 0 and values:
            return min(values)
    except (OSError, subprocess.TimeoutExpired):
        pass  # no nvidia-smi (a MIG slice, a container without it): SGLang's own fallback below
    import torch  # torch: only a GPU rank reaches here, and it has imported torch already

    return float(torch.cuda.mem_get_info(device)[1] // MIB)


def _config_json(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def launch_words(launch: Any, tp_group_size: int, pp_size: int | None) -> list[str]:
    """The launch command's words, or (none given) the layout's own flags as a launch command would."""
    argv = list(getattr(launch, "argv", ()) or ())
    if argv:
        return argv
    return ["--tp-size", str(tp_group_size), "--pp-size", str(pp_size or 1)]


def release_default_fraction(
    config: Any, args: Any, total_mib: float, env: Mapping[str, str], *, release: str | None = None
) -> DefaultFraction:
    """The fraction ``release`` (default: the config's own) picks on a GPU of ``total_mib``."""
    sizing = config.sizing
    launch = getattr(args, "launch", None) or getattr(config, "launch", None)
    words = launch_words(launch, sizing.tp_group_size, sizing.pp_size)
    return default_fraction(
        release or config.release.modelled,
        total_mib,
        words,
        config=_config_json(config.model.model_config),
        env=env,
    )
