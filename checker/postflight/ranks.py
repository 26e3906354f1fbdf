"""Each rank's values as its lines logged them: one :class:`RankRead` per prefix.

Of several sightings of one message (a server restarted within one log, or logs of two starts given
together) the latest start wins: the latest timestamp, then the later in the input. A speculative
draft model logs its own ``Load weight end.`` line with its own ``type=``, kept apart
(``draft_weights``): a class the registry holds under a draft's name (``...MTP``, ``...NextN``, the EAGLE
heads) is never the target, whatever the order its lines came in; of the others, the target is the type
the rank logged first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from checker.core.releases.model_registry import REGISTERED
from checker.postflight.formats import MAMBA, POST_CAPTURE, SUMMARY, WEIGHTS, WEIGHTS_BEGIN, prefix_releases
from checker.postflight.log_formats import RELEASES
from checker.postflight.reader import LogReading, RankKey, Sighting, Where


@dataclass(frozen=True)
class Logged:
    """One value as logged: the number, where its line is (None: no line had it), and why not."""

    value: float | int | None = None
    where: Where | None = None
    note: str = ""
    """Why there is no value: ``cut`` (the line ends before it), ``not logged`` (the release's line has no
    such field), ``no line``."""


NOT_READ = Logged(note="no line")


@dataclass
class RankRead:
    key: RankKey
    prefix: str
    """The prefix as the rank's lines wrote it (``PP1 TP3``; '' for a server of one process)."""
    weights_gib: Logged = NOT_READ
    """``Load weight end. ... mem usage=X GB.``: SGLang's "GB" is GiB (bytes / 2**30)."""
    weights_type: str | None = None
    weights_overlap: bool = False
    """``--startup-weight-load-mode overlap`` (0.5.18+): its ``Load weight end.`` line has no mem usage."""
    draft_weights: list[tuple[str, Logged]] = field(default_factory=list)
    free_before_gib: Logged = NOT_READ
    """``Load weight begin. avail mem=X GB``: free memory before the weights, on this GPU."""
    max_mamba_cache_size: Logged = NOT_READ
    state_gib: Logged = NOT_READ
    """conv_state + ssm_state sizes of ``Mamba Cache is allocated.`` (each rounded to 0.01 GB)."""
    max_running_requests: Logged = NOT_READ
    """From the stage's TP 0 only (the only rank that logs it)."""
    capped_from: Logged = NOT_READ
    """``Post-capture KV sizing: max_running_requests A -> B`` (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING):
    A, the value before the cap; the summary line logs B."""
    max_total_num_tokens: Logged = NOT_READ
    context_len: Logged = NOT_READ
    releases: tuple[str, ...] = ()
    """The releases whose forms read every complete line of this rank (empty: none known reads them all)."""
    starts: int = 1
    notes: list[str] = field(default_factory=list)


def _latest(sightings: list[Sighting]) -> Sighting:
    return max(sightings, key=lambda s: (s.stamp, s.order))


def _number(s: Sighting, name: str, kind: type[int] | type[float]) -> Logged:
    text = s.values.get(name)
    if text is None:
        return Logged(where=s.first, note="cut" if not s.complete else "not logged")
    try:
        return Logged(kind(text), s.first)
    except ValueError:  # an untyped field (``{size}``) that is no number: not SGLang's line
        return Logged(where=s.first, note=f"not a number: {text[:40]!r}")


def _weights(read: RankRead, sightings: list[Sighting]) -> None:
    overlap = [s for s in sightings if "mem_usage" not in s.form_fields]
    normal = [s for s in sightings if s not in overlap]
    if not normal:
        read.weights_overlap = bool(overlap)
        read.weights_gib = Logged(
            where=overlap[0].first if overlap else None,
            note="not logged (--startup-weight-load-mode overlap)" if overlap else "no line",
        )
        return
    drafts = [s for s in normal if is_draft_class(s.values.get("type"))]
    targets = [s for s in normal if s not in drafts]
    if not targets:  # only the draft worker's line: the target's weights are not in the log
        first = min(drafts, key=lambda s: s.order)
        read.weights_gib = Logged(
            where=first.first, note=f"only the draft model's line ({first.values.get('type')})"
        )
    target = min(targets, key=lambda s: (s.stamp, s.order)).values.get("type") if targets else None
    mine = [s for s in targets if s.values.get("type") == target]
    for draft_type in sorted({s.values.get("type") or "" for s in normal} - {target or ""}):
        s = _latest([x for x in normal if x.values.get("type") == draft_type])
        read.draft_weights.append((draft_type, _number(s, "mem_usage", float)))
    if not mine:
        return
    latest = _latest(mine)
    read.weights_type = target
    read.weights_gib = _number(latest, "mem_usage", float)
    read.starts = max(read.starts, len(mine))


def is_draft_class(name: str | None) -> bool:
    """Whether ``name`` (a ``Load weight end.`` line's ``type=``) is a speculative draft model's class: one
    SGLang's registry holds under a draft's name (the ``...MTP`` / ``...NextN`` classes ModelConfig gives
    a draft, ``is_draft_model``; the EAGLE heads; the draft models), never the target's."""
    return name is not None and name in REGISTERED and _DRAFT.search(name) is not None


_DRAFT = re.compile(r"(MTP|NextN|Eagle3?|DraftModel)$|^(Eagle3|DFlash)")


def _state(s: Sighting) -> Logged:
    try:
        conv, ssm = float(s.values["conv_state_size"]), float(s.values["ssm_state_size"])
    except (KeyError, ValueError):
        return Logged(where=s.first, note="cut" if not s.complete else "not logged")
    return Logged(round(conv + ssm, 2), s.first)


def rank_read(key: RankKey, by_kind: dict[str, list[Sighting]]) -> RankRead:
    every = [s for group in by_kind.values() for s in group]
    first = min(every, key=lambda s: s.order)
    read = RankRead(key=key, prefix=" ".join(f"{t}{getattr(key, t.lower())}" for t in first.tokens))
    if WEIGHTS in by_kind:
        _weights(read, by_kind[WEIGHTS])
    if WEIGHTS_BEGIN in by_kind:
        read.free_before_gib = _number(_latest(by_kind[WEIGHTS_BEGIN]), "avail_mem", float)
    # Lines of one kind that say different things: several starts (identical lines were counted once).
    read.starts = max([read.starts, *(len(v) for k, v in by_kind.items() if k != WEIGHTS)])
    if MAMBA in by_kind:
        s = _latest(by_kind[MAMBA])
        read.max_mamba_cache_size = _number(s, "max_mamba_cache_size", int)
        if read.max_mamba_cache_size.note == "not logged":
            read.max_mamba_cache_size = Logged(
                where=s.first, note=f"not logged by SGLang {span(s.releases)}" if s.releases else "not logged"
            )
        read.state_gib = _state(s)
    if SUMMARY in by_kind:
        s = _latest(by_kind[SUMMARY])
        read.max_running_requests = _number(s, "max_running_requests", int)
        read.max_total_num_tokens = _number(s, "max_total_num_tokens", int)
        read.context_len = _number(s, "context_len", int)
    if POST_CAPTURE in by_kind:
        read.capped_from = _number(_latest(by_kind[POST_CAPTURE]), "max_running_requests", int)
    # Every complete line's form, and the order of its prefix's tokens, narrow the releases down.
    releases = set(RELEASES)
    for s in every:
        if s.complete and s.releases:
            releases &= set(s.releases)
        releases &= set(prefix_releases(s.tokens))
    read.releases = tuple(r for r in RELEASES if r in releases)
    return read


def span(releases: tuple[str, ...]) -> str:
    """('0.5.2', ..., '0.5.8.post1') -> '0.5.2-0.5.8.post1' (the releases are consecutive runs of the
    modelled ones; a gap is shown as two runs)."""
    if not releases:
        return "none"
    idx = sorted(RELEASES.index(r) for r in releases)
    runs: list[tuple[int, int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return ", ".join(RELEASES[a] if a == b else f"{RELEASES[a]}-{RELEASES[b]}" for a, b in runs)


def ranks_read(reading: LogReading) -> list[RankRead]:
    """Every rank the logs name, in prefix order (DP, PP, TP)."""
    return [rank_read(key, reading.sightings[key]) for key in sorted(reading.sightings)]
