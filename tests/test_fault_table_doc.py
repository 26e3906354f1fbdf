"""docs/preflight.md's fault table is the fault matrix's result: one row per case tests/test_faults.py
runs, each within that case's bound (the table is written by ``CHECKER_FAULT_TABLE=PATH pytest -m faults``,
tests/fault_table.py)."""

from __future__ import annotations

import re
from pathlib import Path

from test_faults import CASES

DOC = Path(__file__).resolve().parents[1] / "docs" / "preflight.md"


def _rows() -> dict[str, list[str]]:
    text = DOC.read_text()
    begin, end = text.index("<!-- BEGIN fault matrix"), text.index("<!-- END fault matrix -->")
    rows = {}
    for line in text[begin:end].splitlines():
        m = re.match(r"\| `([^`]+)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_the_documented_fault_table_is_the_matrix_each_case_within_its_bound() -> None:
    rows = _rows()
    assert sorted(rows) == sorted(c.fault for c in CASES), "rerun the faults step with CHECKER_FAULT_TABLE"
    for case in CASES:
        report, end, bound = rows[case.fault][:3]
        assert float(bound.split()[0]) == case.bound_s, case.fault
        row = rows[case.fault]
        assert float(report.split()[0]) <= float(end.split()[0]) <= case.bound_s, (case.fault, row)
