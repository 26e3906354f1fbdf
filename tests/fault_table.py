"""The fault matrix's recorded times as lines and as docs/preflight.md's markdown table (not a test module).

Each row is what tests/test_faults.py records for one case (``fault_case``): the fault, seconds from the
fault to the report and to torchrun's end, the bound held, the case's own wall time, whether torchrun's
30 s grace for a frozen worker was counted rather than waited out, and how long the ranks took to leave
after the agent's SIGTERM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PHASES = ("start", "derive", "exchange", "verdict", "publish")
ACTIONS = ("kill", "exit", "stop", "hang")


def _order(row: Mapping[str, Any]) -> tuple[int, int, str]:
    last = str(row["fault"]).split(",")[-1].split(":")
    return (
        PHASES.index(last[1]),
        ACTIONS.index(last[2]) if last[2] in ACTIONS else len(ACTIONS),
        str(row["fault"]),
    )


def _s(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}"


def summary(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per case, then the matrix's total."""
    lines = []
    for row in sorted(rows, key=_order):
        grace = " (+30 s grace counted)" if row.get("grace_counted") else ""
        lines.append(
            f"{row['fault']:<32} report {_s(row['report_s'])} s, torchrun ends {_s(row['end_s'])} s{grace} "
            f"(bound {_s(row['bound_s'])} s), wall {_s(row['wall_s'])} s"
        )
    total = sum(float(r["wall_s"]) for r in rows)
    lines.append(f"{len(rows)} cases, {total:.0f} s of wall time in all")
    return lines


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """docs/preflight.md's fault table."""
    out = [
        "| fault (`RANK:PHASE:ACTION`) | fault to report | fault to torchrun's end | bound "
        "| SIGTERM to the last rank out | case's wall time |",
        "|---|---|---|---|---|---|",
    ]

    def sec(value: Any) -> str:
        return "-" if value is None else f"{_s(value)} s"

    for row in sorted(rows, key=_order):
        end = sec(row["end_s"]) + (" (30 s grace counted)" if row.get("grace_counted") else "")
        out.append(
            f"| `{row['fault']}` | {sec(row['report_s'])} | {end} | {sec(row['bound_s'])} | "
            f"{sec(row.get('sigterm_leave_s'))} | {sec(row['wall_s'])} |"
        )
    return "\n".join(out) + "\n"
