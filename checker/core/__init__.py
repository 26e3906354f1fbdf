"""The pure, torch-free capacity core: each modelled SGLang release's state-pool sizing under pipeline
parallelism (:mod:`checker.core.releases.releases`, docs/sglang-releases.md).

Every rank of the preflight runs exactly this code on its own inputs; nothing here may import torch
(``tests/test_core_imports.py`` proves it).
"""

from checker.core.errors import CheckerInputError
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.sizing import POLICIES, CapacityInputs, StageCapacity, derive_all, derive_stage

__all__ = [
    "POLICIES",
    "CapacityInputs",
    "CheckerInputError",
    "ModelGeometry",
    "StageCapacity",
    "derive_all",
    "derive_stage",
]
