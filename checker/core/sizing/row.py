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

from checker.core.sizing.environ import SGLANG_ENV_VARS
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.server_args import SIZING_FLAG_NAMES
from checker.status import ROW_OK

MISSING = -1
"""A value a rank could not compute (its status says why), or a fact it does not have."""
BUDGET_MILLIONTHS = 1_000_000
"""``budget_millionths_gib`` per GiB."""


def _int(*, report: bool = True, default: int = MISSING) -> int:
    return field(default=default, metadata={"report": report})


@dataclass(kw_only=True)
class RankRow:
    # who
    rank: int = _int()
    world_size: int = _int(report=False)
    node_rank: int = _int()
    """torchrun's GROUP_RANK (its numbering of the agents; under c10d, the order they joined in)."""
    operator_node_rank: int = _int()
    """NODE_RANK as the operator exported it on the rank's node (MISSING: unset)."""
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
    num_layers: int = _int()
    """The model's layer count (num_hidden_layers) as this rank loaded it: the stages must tile exactly
    this many layers (:mod:`checker.preflight.pipeline`)."""
    stage_linear_layers: int = _int()
    max_stage_linear_layers: int = _int()
    stage_per_req_bytes: int = _int()
    slots_per_request: int = _int()
    state_allocated_bytes: int = _int()
    state_charged_bytes: int = _int()
    # the KV token pool (checker.core.sizing.kv_pool): the stage's own capacity, and after the MIN over the
    # world
    context_len: int = _int()
    kv_cell_bytes: int = _int()
    """KV bytes per token on this rank (0: its stage holds no attention layer)."""
    kv_available_bytes: int = _int()
    """The bytes the state pool left this rank for the KV pool."""
    kv_profiled_tokens: int = _int()
    """The tokens those bytes hold (or --token-capacity), before --max-total-tokens and alignment."""
    kv_estimate_tokens: int = _int(report=False)
    """What a release up to 0.5.9 estimates max_running_requests from (the stage's own profile)."""
    kv_own_tokens: int = _int()
    """The stage's own KV capacity: what this rank hands SGLang's MIN over the world group."""
    max_total_num_tokens: int = _int()
    """The KV pool after the MIN (SGLang's ``max_total_num_tokens``), resolved from every rank's row."""
    kv_idle_bytes: int = _int()
    """KV bytes this rank reserved for its own capacity that the MIN leaves unused."""
    kv_limiting: int = _int()
    """1 where this rank's own capacity is the MIN (it sets the pool for all), else 0."""
    # what the resolution after the MIN reads of this rank, beside the values above
    kv_release: int = _int(report=False)
    """The modelled release whose rules this rank applies (its index in MODELLED_RELEASES)."""
    page_size: int = _int()
    """The page size this rank's KV pool aligns to: --page-size as the release resolves it (an attention
    backend may force another; 0.5.11-0.5.13.post1 may reset it to 1)."""
    requests_per_worker: int = _int(report=False)
    """--max-running-requests // dp as this rank's release reads it (MISSING: unset)."""
    user_max_running_requests: int = _int(report=False)
    user_micro_batch_size: int = _int(report=False)
    """--pp-max-micro-batch-size (MISSING: unset)."""
    # from what
    budget_millionths_gib: int = _int(report=False)
    """``budget_gib`` on the wire: the budget this rank derived with, in millionths of a GiB (the one int
    form of the budget; :func:`budget_slots` writes it, :attr:`budget_gib` reads it back)."""
    device_free_bytes: int = _int()
    model_digest: int = _int(report=False)
    """The digest of the model's own definition (the hex after ``#`` in the ``model`` input, as an int):
    ranks that load one model under two paths agree here and differ only in the ``model`` input's text."""
    launch_digest: int = _int(report=False)
    """The first 64 bits of the SHA-256 of the whole launch command as given (``launch_command.text`` of
    the report; MISSING: none): the report groups ranks by the command they ran, every word of it."""
    weights_bytes: int = _int()
    """The weights figure this rank's budget takes off free memory (--budget-from-device): the
    checkpoint's parameters plus the stated margin, or --weights-gib; MISSING when there is none."""
    weights_source: int = _int(default=0)
    """Where ``weights_bytes`` came from (checker.families.weights_source.WeightsSource: 0 none, 1 flag,
    2 checkpoint, 3 log, 4 config.json alone)."""
    param_bytes: int = _int()
    """Of ``weights_bytes`` read from the checkpoint: the parameters exactly, as the release's class holds
    them on this rank (MISSING: the figure is not the checkpoint's, so it has no parts)."""
    buffer_bytes: int = _int()
    """Of the checkpoint's figure: the buffers the class registers (part of ``margin_bytes``)."""
    margin_bytes: int = _int()
    """Of the checkpoint's figure: everything beyond the parameters (buffers, kept copies, the allocator's
    rounding); ``param_bytes + margin_bytes + draft_bytes == weights_bytes``."""
    draft_bytes: int = _int()
    """Of the checkpoint's figure: the speculative draft this rank loads before the pool is sized
    (checker.core.weights.weights.draft_bytes; 0 without one)."""
    draft_source: int = _int(report=False, default=0)
    """Where the speculative draft's bytes came from (checker.families.weights_source.DraftSource: 0 the
    rank loads no draft, 1 target-mtp, 2 target-config, 3 checkpoint, 4 config, 5 weights-gib, 6 log,
    7 after-pool)."""
    mem_fraction_millionths: int = _int(report=False)
    """The --mem-fraction-static this rank's budget used, in millionths (MISSING: no device budget)."""
    mem_fraction_source: int = _int(report=False, default=0)
    """Where it came from: 0 none (no device budget), 1 given (the flag or the launch command), 2 the
    release's default for this rank's GPU total (:mod:`checker.core.releases.mem_fraction`)."""
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
        return None if b == MISSING else b / BUDGET_MILLIONTHS


INT_FIELDS = tuple(f.name for f in fields(RankRow) if f.type == "int")
REPORTED_INTS = tuple(f.name for f in fields(RankRow) if f.metadata.get("report"))

VERSION_INPUTS = ("checker_version", "torch_version", "sglang_installed")
"""``sglang_installed`` is the INSTALLED SGLang release, read from package metadata (NOT_INSTALLED if none);
the release a rank derives as is the separate input ``derived_as``
(checker.core.releases.releases.ReleaseChoice)."""
NOT_INSTALLED = "not installed"
INPUT_NAMES = (
    *VERSION_INPUTS,
    "derived_as",
    "model",
    "budget_gib",
    "budget_source",
    "attention_layout",
    *SIZING_FLAG_NAMES,
    *SGLANG_ENV_VARS,
    "launch_command",
)
"""Every input whose value can make ranks derive differently: one digest and one value text each."""


RESOLVED_INPUTS = ("sglang_installed", "derived_as", "model", "budget_gib", "budget_source")
"""Inputs a rank resolves while it derives (its release, its model's files, its budget): None where it
could not (its error says why), and such a rank is left out of the comparison of that input, since an
input it never read cannot differ from anyone's."""

FOLLOWS: dict[str, tuple[str, ...]] = {
    "derived_as": ("sglang_installed",),
    "budget_gib": ("budget_source",),
    "tp_size": ("attention_layout", "sglang_installed", "derived_as"),
    "dp_size": ("attention_layout", "sglang_installed", "derived_as"),
}
"""An input that follows from others: it differs whenever one of them does, so that one is the cause (the
installed release decides the release derived as; the budget source, e.g. --mem-fraction-static under
--budget-from-device, decides the budget; the attention flags as typed, read by the release's rules,
decide the attention TP and DP sizes a rank derives with)."""

ATTENTION_LAYOUT = "attention_layout"
"""The input naming the TP and attention-DP flags as they were typed: ``--tp-size 2 --enable-dp-attention
--dp-size 2`` in a launch command, ``--tp-size 1 --dp-size 2`` as the checker's own flags; None where none
was given. The ``tp_size`` and ``dp_size`` inputs are what a rank derives with (attention TP and DP), which
nobody types under a launch command, so a root cause names this one instead (FOLLOWS)."""


def model_digest(geometry: ModelGeometry) -> str:
    """The digest of the model's own definition (its config.json, or the preset): 8 hex digits."""
    digest = geometry.source_digest
    if not digest:  # a geometry built without load_geometry (another engine's rebuild): its shapes
        text = json.dumps(geometry.describe(), sort_keys=True)
        digest = hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
    return str(digest)


def model_label(geometry: ModelGeometry) -> str:
    """The ``model`` input: the model's name and a digest of the model's own definition (its config.json,
    or the preset), so two ranks that load different configs under one name still differ, and a rank
    that only sets a state dtype or another TP size does not differ in its model."""
    return f"{geometry.name} #{model_digest(geometry)}"


def launch_digest(text: str) -> int:
    """:attr:`RankRow.launch_digest` of a launch command's text (``shlex.join`` of its words): the
    first 16 hex digits of the SHA-256 the report gives (``launch_command.sha256``), as a signed int64."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


def input_text(value: object) -> str | None:
    """Canonical text of an input value: what the digest covers and the root cause quotes."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def budget_slots(budget_gib: float) -> tuple[str | None, int]:
    """The budget a rank derives with, under its one name, as its row carries it: the ``budget_gib``
    input's text (exact: ranks compare its digest, the report shows it) and its int form
    (:attr:`RankRow.budget_millionths_gib`), computed together so they cannot disagree."""
    return input_text(float(budget_gib)), round(budget_gib * BUDGET_MILLIONTHS)
