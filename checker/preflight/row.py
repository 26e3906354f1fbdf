"""One rank's row, defined once (torch-free): who the rank is, its status, what it derived, from what.

Everything else follows from :class:`RankRow`: the wire slots (:mod:`checker.distributed.wire` encodes
its ``int`` fields in declaration order), the verdict's fields (:mod:`checker.preflight.verdict` reads them as
attributes) and the JSON report's per-rank keys (the fields marked ``report``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from checker.core.environ import SGLANG_ENV_VARS
from checker.core.server_args import SIZING_FLAG_NAMES
from checker.status import ROW_OK

MISSING = -1
"""A value a rank could not compute (its status says why), or a fact it does not have."""


def _int(*, report: bool = True, default: int = MISSING):
    return field(default=default, metadata={"report": report})


@dataclass(kw_only=True)
class RankRow:
    # who
    rank: int = _int()
    world_size: int = _int(report=False)
    node_rank: int = _int()
    local_rank: int = _int()
    pp_rank: int = _int()
    tp_rank: int = _int()
    pp_size: int = _int(report=False)
    tp_size: int = _int(report=False)
    status: int = _int(report=False, default=ROW_OK)
    """ROW_OK, an input error's code, or another row status of :mod:`checker.status`."""
    # what it derived (the three checked values first)
    max_mamba_cache_size: int = _int()
    max_running_requests: int = _int()
    pp_max_micro_batch_size: int = _int()
    start_layer: int = _int()
    end_layer: int = _int()
    stage_linear_layers: int = _int()
    max_stage_linear_layers: int = _int()
    stage_per_req_bytes: int = _int()
    slots_per_request: int = _int()
    state_allocated_bytes: int = _int()
    state_charged_bytes: int = _int()
    # from what
    budget_millionths_gib: int = _int(report=False)
    """The budget this rank derived with, in millionths of a GiB (reported as ``budget_gib``)."""
    device_free_bytes: int = _int()
    # --materialize
    predicted_bytes: int = _int()
    allocated_bytes: int = _int()
    materialize_status: int = _int(report=False)
    # text: fixed-width on the wire, digests decide equality of inputs
    host: str = ""
    error: str = ""
    inputs: Mapping[str, str | None] = field(default_factory=dict)
    input_digests: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == ROW_OK

    @property
    def budget_gib(self) -> float | None:
        b = self.budget_millionths_gib
        return None if b == MISSING else b / 1e6


INT_FIELDS = tuple(f.name for f in fields(RankRow) if f.type == "int")
REPORTED_INTS = tuple(f.name for f in fields(RankRow) if f.metadata.get("report"))

VERSION_INPUTS = ("checker_version", "torch_version", "sglang_installed")
"""``sglang_installed`` is the INSTALLED SGLang release, read from package metadata (NOT_INSTALLED if none);
the release a rank derives as is the separate input ``derived_as`` (checker.core.releases.ReleaseChoice)."""
NOT_INSTALLED = "not installed"
INPUT_NAMES = (
    *VERSION_INPUTS,
    "derived_as",
    "model",
    "budget_gib",
    "budget_source",
    *SIZING_FLAG_NAMES,
    *SGLANG_ENV_VARS,
    "launch_command",
)
"""Every input whose value can make ranks derive differently: one digest and one value text each."""


def model_label(geometry) -> str:
    """The ``model`` input: the model's name and a digest of its resolved shapes and dtypes, so two
    ranks that load different configs under one name still differ."""
    text = json.dumps(geometry.describe(), sort_keys=True)
    return f"{geometry.name} #{hashlib.blake2b(text.encode(), digest_size=4).hexdigest()}"


def input_text(value: object) -> str | None:
    """Canonical text of an input value: what the digest covers and the root cause quotes."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)
