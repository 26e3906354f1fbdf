"""Why two SGLang releases derive differently for THESE inputs (torch-free).

:func:`checker.core.releases.explain_release_difference` lists every rule that changed between two
releases; most do not matter for a given deployment (a per-slot extra state on a model that has none,
the decode-lock switch nobody set). The preflight's root cause and ``derive --sglang-version A,B`` name
only the changes that can explain a difference here.
"""

from __future__ import annotations

from dataclasses import fields

from checker.core.releases import ReleaseRules, explain_release_difference
from checker.core.sizing import CapacityInputs

# Rules whose effect depends on an input; every other rule (charging, the padding slot, rules added
# later) can change the auto-fit pool of any deployment and is always named.
_CONDITIONAL = {
    "floor_requests": lambda i, device: i.max_running_requests is not None,
    "extra_per_slot": lambda i, device: i.geometry.extra_per_slot_bytes > 0,
    "skip_decode_lock": lambda i, device: i.skip_decode_lock,
    "lazy_with_spec": lambda i, device: (
        i.mamba_radix_cache_strategy == "extra_buffer_lazy" and bool(i.speculative_num_draft_tokens)
    ),
    "budget_rule": lambda i, device: device,
    "pp_with_spec": lambda i, device: i.pp_size > 1 and bool(i.speculative_num_draft_tokens),
    "spec_reserve": lambda i, device: bool(i.speculative_num_draft_tokens),
    "has_lazy": lambda i, device: i.mamba_radix_cache_strategy == "extra_buffer_lazy",
}


def rules_that_matter(inputs: CapacityInputs, *, budget_from_device: bool = False) -> set[str]:
    names = {f.name for f in fields(ReleaseRules)}
    return {n for n in names if n not in _CONDITIONAL or _CONDITIONAL[n](inputs, budget_from_device)}


def explain(a: str, b: str, inputs: CapacityInputs, *, budget_from_device: bool = False) -> list[str]:
    """The changes between releases ``a`` and ``b`` that can make them derive differently here."""
    return explain_release_difference(
        a, b, only=rules_that_matter(inputs, budget_from_device=budget_from_device)
    )
