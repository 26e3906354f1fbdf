"""The page size an SGLang release uses once the attention backends given have had their say (torch-free).

A backend that supports only some page sizes does not make the release refuse the launch: the release warns
and changes ``page_size`` (0.5.23 ``arg_groups/overrides.py`` ``_mla_backend_page_constraints``: flashmla ->
64; trtllm_mla / cutedsl_mla -> 64 unless 32 or 64; trtllm_mha -> 64 unless 16, 32, 64 or 128; hpc_ops ->
64), before the KV pool aligns to it. The rules, each release's own with file:line, are generated into
:mod:`checker.core.releases.page_rules` (``scripts/build_page_size.py``); a backend the release's parser does
not take is its argparse refusal. Rules the release guards with what the checker does not know (the GPU,
MLA, an environment variable) are not applied: docs/preflight.md lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from checker.core.errors import FlagError
from checker.core.releases.page_rules import ALIASES, CHOICES, RULE_SITES, RULES

FLAG_OF = {
    "a": "attention_backend",
    "d": "decode_attention_backend",
    "p": "prefill_attention_backend",
    "s": "speculative_draft_attention_backend",
}
SRT = "sglang/srt/"


@dataclass(frozen=True)
class PageResolution:
    page_size: int
    """What the KV pool aligns to and the later checks read."""
    given: int
    changed_by: str | None = None
    """``--<flag> <backend>`` of the last rule that changed the page size (None: unchanged)."""
    site: str = ""
    """Its file:line under sglang/srt/."""

    @property
    def phrase(self) -> str:
        """One short phrase for the outputs ("" when the backend changed nothing)."""
        if self.changed_by is None:
            return ""
        return f"page size {self.page_size} (was {self.given}: {self.changed_by} forces it)"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_choices(release: str, backends: Mapping[str, str | None]) -> None:
    """The release's argparse refusal of a backend its parser does not take, one line."""
    if release not in CHOICES:
        return
    attention, where, draft, draft_where = CHOICES[release]
    for name, value in backends.items():
        if value is None:
            continue
        if name == "speculative_draft_attention_backend":
            if draft is None:
                continue  # the release's parser takes any text here
            allowed, at = draft.split(), draft_where
        else:
            allowed, at = attention.split(), where
        if value not in allowed:
            listed = ", ".join(repr(c) for c in allowed)
            raise FlagError(
                f"{_flag(name)} {value}: SGLang {release} refuses it at start-up (argument {_flag(name)}: "
                f"invalid choice: {value!r} (choose from {listed}); {SRT}{at})"
            )


def resolve_page_size(release: str, page_size: int, backends: Mapping[str, str | None]) -> PageResolution:
    """The page size ``release`` uses with ``page_size`` typed and ``backends`` given (by ServerArgs name),
    its rules applied in its order, each seeing what the earlier left."""
    check_choices(release, backends)
    aliases = ALIASES.get(release, {})
    named = {k: aliases.get(v, v) for k, v in backends.items() if v is not None}
    page, by, site = page_size, None, ""
    rules = zip(RULES.get(release, ()), RULE_SITES.get(release, ()), strict=True)
    for (backend, flags, keeps, sets), at in rules:
        hit = next((FLAG_OF[f] for f in flags if named.get(FLAG_OF[f]) == backend), None)
        if hit is None or page in keeps:
            continue
        if sets != page:
            by, site = f"{_flag(hit)} {backends[hit]}", at
        page = sets
    if page == page_size:
        return PageResolution(page, page_size)
    return PageResolution(page, page_size, by, site)
