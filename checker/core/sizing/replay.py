"""The ReplaySSM spec-verify ring (``--enable-linear-replayssm-spec``): what each release charges for it in
the state-pool sizing, and how large it is (torch-free).

With the flag on a GDN (Qwen3-Next, Qwen3.5) or KDA (Kimi-Linear, Kimi-K3) model, the state pool sizing
(``mem_cache/kv_cache_configurator.py`` ``_handle_max_mamba_cache``, 0.5.23:3269-3297) does two things:

* it reserves no speculative intermediate state (``reserves_spec_state = has_spec_dec and not
  replayssm_active``): the auto-fit branch sizes K as without speculative decoding, and the explicit
  branches (A, B) take no intermediate reservation off the budget;
* it charges the ring instead, ``replayssm_ring_bytes_per_req(record_len)`` scaled by the stage's share
  like the state itself (``int(ring * pp_layer_scale)``):

  - 0.5.17-0.5.19 (:data:`PER_SLOT`): on every slot, for GDN and KDA alike (``per_slot = per_req + ring``,
    the state charged ``(K + 1) * (stage_per_req + ring)``); GDN's window is the draft maximum
    (``max_speculative_num_draft_tokens``: the draft tokens), KDA's ``--linear-replayssm-cache-len``;
  - 0.5.20+ (:data:`FIXED_GDN`): KDA still on every slot; GDN once per request, ``ring * (max_running_requests
    // attn_dp + 1)`` (0.5.23: ``max(1, ...) + 1``) off the budget before K is solved, both windows
    ``--linear-replayssm-cache-len`` long.

The flag is read whether or not speculative decoding is on (``replayssm_active`` asks the flag and the
model only). 0.5.16 has the flag as ``--enable-gdn-replayssm-spec`` and builds the ring beside the pool
without charging it; the sizing there reads neither it nor the window (:data:`UNCHARGED`). Mamba2 models
(Nemotron-H, Falcon-H1, Granite-4.0-H) have no ring: the flag changes nothing in their sizing.

Ring bytes per layer, ``configs/mamba_utils.py`` ``replayssm_ring_bytes_per_req`` (hv, v, k: the temporal
state's per-rank shape; h_k the key heads per rank; c the conv dtype's bytes; L the window):

* 0.5.17-0.5.19: ``hv*L*v*c + h_k*L*k*c + hv*L*4 + hv*L*g*4`` with g = 1 (GDN) or k (KDA), KDA adding
  ``hv*L*v*c + h_k*L*k*c``;
* 0.5.20+: GDN ``hv*L*v*c + h_k*L*k*c + hv*L*4``, and the same again without the fp32 gate when the conv
  dtype is not fp32 (the low parts); KDA as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.core.errors import FlagError
from checker.core.releases.family_facts import GDN, KDA
from checker.core.releases.releases import parse_version
from checker.core.sizing.geometry import DTYPE_ITEMSIZE, ModelGeometry

UNCHARGED = "uncharged"
PER_SLOT = "per-slot"
FIXED_GDN = "fixed-gdn"
DEFAULT_CACHE_LEN = 16
"""``--linear-replayssm-cache-len``'s default in every release that has it (0.5.15-0.5.23)."""
FIRST_FLAG = "0.5.16"
"""The first release with the spec-verify ring's flag (0.5.16: ``--enable-gdn-replayssm-spec``)."""


def ring_rule(release: str) -> str:
    """How ``release``'s pool sizing charges the ring (module docstring)."""
    key = parse_version(release)
    if key < parse_version("0.5.17"):
        return UNCHARGED
    if key < parse_version("0.5.20"):
        return PER_SLOT
    return FIXED_GDN


def ring_kind(geometry: ModelGeometry) -> str | None:
    """``gdn``, ``kda``, or None for a model whose sizing has no ring (Mamba2 families, no family): the
    kind of state its family's config class is (``FamilyFacts.kind``: the ``configs/hybrid_arch.py`` config
    property that answers for it, ``hybrid_gdn_config`` or the KDA one)."""
    facts = geometry.families.of(geometry.family)
    return facts.kind if facts is not None and facts.kind in (GDN, KDA) else None


@dataclass(frozen=True, kw_only=True)
class RingCharge:
    """What the ring adds to one stage's pool sizing: bytes on every slot, and bytes once."""

    per_slot_bytes: int = 0
    """Charged with every slot, like the state (K + 1 of them from 0.5.17)."""
    fixed_bytes: int = 0
    """Taken off the mamba budget before K is solved, and charged with the state (GDN, 0.5.20+)."""
    active: bool = False
    """Whether the release's sizing sees the ring (then it reserves no speculative intermediate state)."""


def _key_heads(geometry: ModelGeometry, kind: str) -> int:
    hv, v_dim, k_dim = geometry.temporal_shape[:3]
    if kind == "kda":
        return hv  # KimiLinearStateShape: num_k_heads defaults to num_heads, split like them
    # GDN: conv_dim / tp = hv * v + 2 * (key heads per rank) * k (models/qwen3_next.py's conv state)
    conv = geometry.conv_shapes[0][0]
    both = conv - hv * v_dim
    if both <= 0 or both % (2 * k_dim):
        raise FlagError(
            f"{geometry.name}: the conv state ({conv}) does not split into value and key heads "
            f"(value heads {hv} x {v_dim}, key dim {k_dim}); the ReplaySSM ring of this geometry is not "
            "modelled"
        )
    return both // (2 * k_dim)


def ring_bytes_per_layer(geometry: ModelGeometry, release: str, record_len: int) -> int:
    """``replayssm_ring_bytes_per_req`` of one layer (module docstring)."""
    kind = ring_kind(geometry)
    assert kind is not None
    if len(geometry.temporal_shape) != 3:
        raise FlagError(
            f"{geometry.name}: a temporal state of shape {geometry.temporal_shape} is not (heads, v, k); the "
            "ReplaySSM ring of this geometry is not modelled"
        )
    hv, v, k = geometry.temporal_shape
    hk = _key_heads(geometry, kind)
    c = DTYPE_ITEMSIZE[geometry.conv_dtype]
    L = record_len
    fp32 = 4
    if kind == "kda" or ring_rule(release) == PER_SLOT:
        gate = k if kind == "kda" else 1
        per_layer = hv * L * v * c + hk * L * k * c + hv * L * fp32 + hv * L * gate * fp32
        if kind == "kda":
            per_layer += hv * L * v * c + hk * L * k * c
        return per_layer
    per_layer = hv * L * v * c + hk * L * k * c + hv * L * fp32
    if geometry.conv_dtype != "float32":
        per_layer += hv * L * v * c + hk * L * k * c  # the low parts of the bf16 d / k rings
    return per_layer


def ring_charge(
    geometry: ModelGeometry,
    release: str,
    *,
    enabled: bool,
    cache_len: int | None,
    draft_tokens: int | None,
    requests_per_worker: int | None,
    scale: float,
    floor_requests: bool,
) -> RingCharge:
    """The ring one stage's sizing charges on ``release`` (module docstring). ``scale``: the stage's share
    (``pp_layer_scale``); ``requests_per_worker``: ``--max-running-requests // attn_dp`` before any floor
    (None: unset); ``floor_requests``: 0.5.23's ``max(1, ...)``."""
    rule = ring_rule(release)
    kind = ring_kind(geometry)
    if not enabled or rule == UNCHARGED or kind is None:
        return RingCharge()
    window = cache_len if cache_len is not None else DEFAULT_CACHE_LEN
    if rule == PER_SLOT and kind == "gdn" and draft_tokens:
        window = draft_tokens  # max_speculative_num_draft_tokens (no adaptive speculation: see startup)
    per_req = ring_bytes_per_layer(geometry, release, window) * geometry.num_linear_layers
    per_req = int(per_req * scale)
    if rule == FIXED_GDN and kind == "gdn":
        if requests_per_worker is None:
            raise FlagError(
                f"--enable-linear-replayssm-spec on a GDN model without --max-running-requests: SGLang "
                f"{release}'s pool sizing charges the ring per running request (kv_cache_configurator.py "
                "_handle_max_mamba_cache: max_running_requests // attn_dp_size, with max_running_requests "
                "still unset) and fails at start-up; give --max-running-requests (speculative decoding "
                "sets 48 itself)"
            )
        slots = (max(1, requests_per_worker) if floor_requests else requests_per_worker) + 1
        return RingCharge(fixed_bytes=per_req * slots, active=True)
    return RingCharge(per_slot_bytes=per_req, active=True)
