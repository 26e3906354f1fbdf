"""Naming ranks and their odd ones out in words (torch-free): ``ranks 0-3, 5 have``, the majority value
and the outliers from it. Every layer's messages use them (the session's, the verdict's, the post-flight's,
the reports'), so they live at the bottom."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


def majority(values: Sequence[object]) -> object | None:
    """The value more entries share than any other; None when all agree or the top count is tied
    (an even split such as 2-2 has no majority, so nothing in it is an outlier)."""
    counts = Counter(values).most_common()
    if len(counts) <= 1 or counts[0][1] == counts[1][1]:
        return None
    return counts[0][0]


def is_split(values: Sequence[object]) -> bool:
    """Values differ, and no value is held by more entries than every other (e.g. 2-2, 1-1)."""
    return len(set(values)) > 1 and majority(values) is None


def outliers(values: Sequence[object]) -> set[int]:
    """Indices whose value differs from the majority; none when all agree or there is no majority."""
    top = majority(values)
    if top is None:
        return set()
    return {i for i, v in enumerate(values) if v != top}


def rank_ranges(ranks: Iterable[int], *, noun: str = "rank") -> str:
    """[0, 1, 2, 3, 5] -> 'ranks 0-3, 5'; [4] -> 'rank 4' (``noun="node"``: 'nodes 0-3, 5')."""
    rs = sorted(set(ranks))
    if not rs:
        return f"no {noun}s"
    parts, start, prev = [], rs[0], rs[0]
    for r in rs[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if r is not None:
            start = prev = r
    return (f"{noun}s " if len(rs) > 1 else f"{noun} ") + ", ".join(parts)


def ranks_do(ranks: Iterable[int], one: str, many: str, *, noun: str = "rank") -> str:
    """The ranks and a verb that agrees with them: ``([3], "has", "have")`` -> 'rank 3 has',
    ``([2, 3], ...)`` -> 'ranks 2-3 have'."""
    rs = set(ranks)
    return f"{rank_ranges(rs, noun=noun)} {one if len(rs) == 1 else many}"
