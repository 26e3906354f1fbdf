"""Plain-text tables a person reads at a glance, with outliers marked (which entries are outliers:
:mod:`checker.core.ranks`)."""

from __future__ import annotations

from collections.abc import Sequence


def fmt_int(value: int) -> str:
    return f"{value:,}"


def fmt_bytes(value: int) -> str:
    return f"{value:,} ({value / 2**20:,.1f} MiB)"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    # Every row has one cell per header: a longer row would otherwise lose its extra cells silently.
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def mark(value: str, is_outlier: bool) -> str:
    return f"{value} *" if is_outlier else value
