"""One home per model family, and the one registry the rest of the checker asks (``model_type`` ->
:class:`~checker.families.family.Family`).

Each family is a package here: ``__init__`` holds what a rank reads at start-up (its model types, the
geometry reader, its attention facts, presets and example configs), ``rules`` what each release's code
does with its config (config checks, weights per rank, checkpoint names), loaded on first use. Adding a
family is one package and one line in :data:`FAMILIES` (docs/adding-a-family.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from checker.core.releases.family_facts import FamilyTable
from checker.core.sizing.geometry import ModelGeometry
from checker.families import falcon_h1, granite, kimi_k3, kimi_linear, nemotron_h, qwen3_5, qwen3_next
from checker.families.family import Family

FAMILIES: tuple[Family, ...] = (
    qwen3_next.FAMILY,
    qwen3_5.FAMILY,
    kimi_linear.FAMILY,
    kimi_k3.FAMILY,
    nemotron_h.FAMILY,
    falcon_h1.FAMILY,
    granite.FAMILY,
)
"""In the order messages list them."""

BY_MODEL_TYPE: Mapping[str, Family] = {mt: f for f in FAMILIES for mt in f.model_types}
assert len(BY_MODEL_TYPE) == sum(len(f.model_types) for f in FAMILIES), "a model type has one family"

FAMILY_TABLE = FamilyTable.of_families([f.facts for f in FAMILIES])
"""Every family's facts as the releases' sizing reads them, handed to every geometry read here
(``ModelGeometry.families``)."""

PRESETS: Mapping[str, Callable[[int], ModelGeometry]] = {
    name: preset for f in FAMILIES for name, preset in f.presets.items()
}

(DEFAULT_MODEL,) = (f.default_preset for f in FAMILIES if f.default_preset is not None)
"""The preset ``--model`` stands for when no model is named (one family's :attr:`Family.default_preset`)."""
assert DEFAULT_MODEL in PRESETS, "the default preset is one of the presets"


def family_for(model_type: object) -> Family | None:
    """The family claiming ``model_type`` (None: no family the checker reads)."""
    return BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
