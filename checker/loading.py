"""Loading torch without the cyclic garbage collector walking it.

Importing torch leaves about a million container objects alive for the life of the process. CPython's
collector counts allocations, and each full collection walks every tracked object: on the development
machine a rank's collections during and after that import took 280-510 ms of the ~2 s a rank lives
(gc.callbacks, 2 ranks under torchrun), the largest single one 150-210 ms, landing wherever the
allocation count ran out (it was timed as rank 0's derivation). The objects torch loads are garbage
only at exit, so a full collection can never free them: :func:`load_torch` imports torch with the
collector off, then freezes everything loaded so far (``gc.freeze``: the permanent generation, which no
collection walks) and turns the collector back on for what the run itself allocates.
bench/preflight_bench.py measures the effect against a bare torchrun job, which pays the collections.
"""

from __future__ import annotations

import gc
import sys


def load_torch() -> None:
    """Import torch and torch.distributed (once per process) with the collector off, then freeze them."""
    if "torch.distributed" in sys.modules:
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        import torch.distributed  # noqa: F401 (torch: the import this module exists to make cheap)
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
