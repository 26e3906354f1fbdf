"""The small pieces every JUnit and markdown writer shares (the preflight's report and the post-flight's):
a JUnit message cut to what CI systems show, and a GitHub step-summary table whose cells cannot break the
table."""

from __future__ import annotations

from collections.abc import Sequence

JUNIT_PART_CHARS = 1000
"""The longest JUnit message or body part written: GitLab and Jenkins show the first lines only, and a
16,384-rank divergence would otherwise put megabytes into one attribute."""


def cut(text: str, limit: int = JUNIT_PART_CHARS) -> str:
    """``text``, or its first ``limit`` characters ending in "..."."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def md_cell(text: object) -> str:
    """A table cell: pipes and backslashes escaped, no line breaks."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A markdown table's lines."""
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
