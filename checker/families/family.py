"""The one protocol a model family implements, and the one shape every family module fills in.

The rest of the checker asks a family (found by ``model_type`` in :mod:`checker.families`) only what
:class:`Family` declares; nothing outside ``checker/families/`` names a family's model type (the tables
generated from SGLang's code excepted). ``docs/adding-a-family.md`` is the recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from checker.core.releases.family_facts import FamilyFacts
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.models import AttentionSpec, Keys

if TYPE_CHECKING:
    from checker.core.releases.config_rules import Release
    from checker.core.weights.weights import ConfigSection, FamilyWeights


@dataclass(frozen=True)
class FamilyRules:
    """What each release's code does with a family's config.json: the configs its config class refuses
    (``check_config``) and, where the checker models them, the parameters its model class builds per rank
    and the checkpoint names its ``load_weights`` takes (``weights``; None: not modelled)."""

    check_config: Callable[[Release, Mapping[str, Any]], None]
    weights: FamilyWeights | None = None
    draft_tensors: Callable[[ConfigSection, ConfigSection], Iterator[tuple[str, tuple[int, ...]]]] | None = (
        None
    )
    """(the whole config, the text config) -> the checkpoint tensors the family's NEXTN/MTP draft class
    loads (``mtp.*``; per-expert names with ``experts.E.``), held by checker.families.drafts; None: the
    draft's shards are not held."""


class Family(Protocol):
    """A model family as the checker reads it."""

    @property
    def name(self) -> str:
        """As messages name it ("Qwen3-Next")."""
        ...

    @property
    def model_types(self) -> tuple[str, ...]:
        """The HF ``model_type`` values it claims."""
        ...

    @property
    def facts(self) -> FamilyFacts:
        """What each release's sizing does with it where SGLang tells families apart (its kind of state,
        the releases that give it a pool, split it over dp, force the radix cache off, ...)."""
        ...

    @property
    def text_config(self) -> str | None:
        """Where the language model's keys sit: None (the top level), "optional" (``text_config`` when
        given) or "required" (``text_config`` always)."""
        ...

    @property
    def attention(self) -> AttentionSpec:
        """Its config class's attention facts (full-attention layers, class defaults)."""
        ...

    @property
    def presets(self) -> Mapping[str, Callable[[int], ModelGeometry]]:
        """Built-in ``--model NAME`` geometries at a TP size."""
        ...

    @property
    def example_configs(self) -> tuple[str, ...]:
        """Example config.json files, relative to the repository (the tests' fixtures)."""
        ...

    @property
    def default_preset(self) -> str | None:
        """The preset of :attr:`presets` that ``--model`` stands for when no model is named (one family
        has it: checker.families.DEFAULT_MODEL); None for the others."""
        ...

    def geometry(self, keys: Keys, tp_size: int) -> dict[str, Any]:
        """config.json (its text config) -> the state-pool fields of a ModelGeometry at ``tp_size``."""
        ...

    def rules(self) -> FamilyRules:
        """Its release rules, loaded on first use (only a model config or a checkpoint needs them)."""
        ...


@dataclass(frozen=True)
class HybridFamily:
    """The :class:`Family` every family module builds: its facts and functions as fields."""

    name: str
    facts: FamilyFacts
    read: Callable[[Keys, int], dict[str, Any]]
    attention: AttentionSpec
    load_rules: Callable[[], FamilyRules]
    text_config: str | None = None
    presets: Mapping[str, Callable[[int], ModelGeometry]] = field(default_factory=dict)
    example_configs: tuple[str, ...] = ()
    default_preset: str | None = None

    @property
    def model_types(self) -> tuple[str, ...]:
        return self.facts.model_types

    def geometry(self, keys: Keys, tp_size: int) -> dict[str, Any]:
        return self.read(keys, tp_size)

    def rules(self) -> FamilyRules:
        return self.load_rules()
