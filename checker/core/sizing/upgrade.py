"""Why two SGLang releases derive differently for THESE inputs (torch-free).

:func:`checker.core.releases.releases.explain_release_difference` lists every rule that changed between two
releases; most do not matter for a given deployment (a per-slot extra state on a model that has none,
the decode-lock switch nobody set). The preflight's root cause (from the inputs the ranks exchanged) and
``derive``/``plan --sglang-version A,B`` (from the derivation's inputs) name only the changes that can
explain a difference here; both describe the deployment as :class:`UpgradeFacts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from checker.core.releases.releases import RULE_NAMES, explain_release_difference
from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs, StageCapacity

if TYPE_CHECKING:
    from checker.core.releases.family_facts import FamilyTable


@dataclass(frozen=True, kw_only=True)
class UpgradeFacts:
    """What about a deployment decides which release rules can change its values."""

    max_running_requests: bool = False
    """--max-running-requests given."""
    extra_per_slot: bool = False
    """The model carries a per-slot extra state."""
    skip_decode_lock: bool = False
    """SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK set truthy."""
    strategy: str = "auto"
    speculative: bool = False
    pp_size: int = 1
    budget_from_device: bool = False

    @classmethod
    def of(cls, inputs: CapacityInputs, *, budget_from_device: bool = False) -> UpgradeFacts:
        return cls(
            max_running_requests=inputs.max_running_requests is not None,
            extra_per_slot=inputs.geometry.extra_per_slot_bytes > 0,
            skip_decode_lock=inputs.skip_decode_lock,
            strategy=inputs.mamba_radix_cache_strategy,
            speculative=bool(inputs.speculative_num_draft_tokens),
            pp_size=inputs.pp_size,
            budget_from_device=budget_from_device,
        )


# Rules whose effect depends on the deployment; every other rule (charging, the padding slot, rules
# added later) can change the auto-fit pool of any deployment and is always named.
_CONDITIONAL = {
    "floor_requests": lambda f: f.max_running_requests,
    "extra_per_slot": lambda f: f.extra_per_slot,
    "skip_decode_lock": lambda f: f.skip_decode_lock,
    "lazy_with_spec": lambda f: f.strategy == "extra_buffer_lazy" and f.speculative,
    "budget_rule": lambda f: f.budget_from_device,
    "pp_with_spec": lambda f: f.pp_size > 1 and f.speculative,
    "spec_reserve": lambda f: f.speculative,
    "has_lazy": lambda f: f.strategy == "extra_buffer_lazy",
    "no_extra_buffer_families": lambda f: f.strategy != "no_buffer",
}


def rules_that_matter(facts: UpgradeFacts) -> set[str]:
    return {n for n in RULE_NAMES if n not in _CONDITIONAL or _CONDITIONAL[n](facts)}


def explain(a: str, b: str, facts: UpgradeFacts, families: FamilyTable) -> list[str]:
    """The changes between releases ``a`` and ``b`` that can make them derive differently here
    (``families``: every family's facts, ``checker.families.FAMILY_TABLE``)."""
    return explain_release_difference(a, b, families=families, only=rules_that_matter(facts))


def release_differences(by_release: dict[str, list[StageCapacity]]) -> list[dict[str, object]]:
    """Each checked value on each stage that differs between releases (every stage under each release,
    in release order): ``{"value", "pp_rank", "by_release": {release: value}}``."""
    versions = list(by_release)
    out = []
    for name in CHECKED_VALUES:
        for k in range(len(next(iter(by_release.values()), []))):
            values = {v: getattr(by_release[v][k], name) for v in versions}
            if len(set(values.values())) > 1:
                out.append({"value": name, "pp_rank": k, "by_release": values})
    return out
