"""What each release's sizing does with one model family where SGLang tells families apart (torch-free).

SGLang's code names model families (a config class, an architecture) where its pool sizing differs by
family: which families an old release gives a state pool at all, whose pool it divides over attention dp,
for which it forces the radix cache off or refuses the extra_buffer strategy, and which kind of state
(hybrid GDN, Mamba2, KDA) a family's config class is. Each of those is the family's fact, across
releases: a family declares its :class:`FamilyFacts` in its own package (``checker/families/<name>/``),
the registry hands them, as one :class:`FamilyTable`, to every geometry it reads
(``ModelGeometry.families``), and the sizing asks the table by the geometry's model type. The release
table (:mod:`checker.core.releases.releases`) says only whether a release asks the family at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from checker.core.releases.releases import release_key

GDN = "gdn"
MAMBA2 = "mamba2"
KDA = "kda"
KINDS = (GDN, MAMBA2, KDA)
"""The kinds of state a family's config class is, in the order model_runner.py defines their config
properties (``hybrid_gdn_config``, ``mamba2_config``, then the KDA one; 0.5.4.post2): the order the release
messages list families in."""

Span = tuple[str, str | None]
"""The first and the last release (inclusive; None: every later release too)."""

RULES = ("pool", "dp_split", "radix_off", "no_extra_buffer", "page_divides_chunk")
"""The :class:`FamilyFacts` fields that hold release spans."""


@dataclass(frozen=True, kw_only=True)
class FamilyFacts:
    """One family's facts as each release's sizing reads them. Each span field lists the releases whose
    code does that for the family; where a release does not tell families apart (``ReleaseRules.
    pool_by_family``, ``dp_split_by_family``) the span is not asked."""

    model_types: tuple[str, ...]
    """The HF ``model_type`` values the facts are of (the family's)."""
    kind: str
    """:data:`GDN`, :data:`MAMBA2` or :data:`KDA`: the SGLang config property its class answers to (the
    ReplaySSM ring's shape, :mod:`checker.core.sizing.replay`; Mamba2 has no ring)."""
    pool: tuple[Span, ...] = ()
    """Releases that list it among the families given a state pool (model_runner.py)."""
    dp_split: tuple[Span, ...] = ()
    """Releases that list it among the families whose pool is divided by dp."""
    radix_off: tuple[Span, ...] = ()
    """Releases that force the radix cache off for it."""
    no_extra_buffer: tuple[Span, ...] = ()
    """Releases that give its architecture no extra_buffer strategy (``auto`` stays no_buffer, an explicit
    extra_buffer is refused at start-up)."""
    page_divides_chunk: tuple[Span, ...] = ()
    """Releases that assert ``FLA_CHUNK_SIZE % page_size == 0`` for it when it runs with an extra buffer."""

    def __post_init__(self) -> None:
        assert self.kind in KINDS, f"{self.model_types}: kind {self.kind!r} is not one of {KINDS}"

    def at(self, rule: str, version: str) -> bool:
        """Whether ``version``'s code does ``rule`` (a :data:`RULES` name) for this family."""
        key = release_key(version)
        spans: tuple[Span, ...] = getattr(self, rule)
        return any(
            release_key(first) <= key and (last is None or key <= release_key(last)) for first, last in spans
        )


@dataclass(frozen=True)
class FamilyTable:
    """Every family's facts, in the order messages list them (by :data:`KINDS`, then the registry's)."""

    facts: tuple[FamilyFacts, ...] = ()

    @classmethod
    def of_families(cls, facts: Sequence[FamilyFacts]) -> FamilyTable:
        return cls(tuple(sorted(facts, key=lambda f: KINDS.index(f.kind))))

    def of(self, model_type: str | None) -> FamilyFacts | None:
        """The facts of the family claiming ``model_type`` (None: none, or a model type no family claims)."""
        return next((f for f in self.facts if model_type in f.model_types), None)

    def at(self, rule: str, version: str, model_type: str | None) -> bool:
        """Whether ``version``'s code does ``rule`` for ``model_type``'s family (False: no family's)."""
        facts = self.of(model_type)
        return facts is not None and facts.at(rule, version)

    def listed(self, rule: str, version: str) -> tuple[str, ...]:
        """The model types ``version``'s code does ``rule`` for, in the table's order."""
        return tuple(mt for f in self.facts if f.at(rule, version) for mt in f.model_types)
