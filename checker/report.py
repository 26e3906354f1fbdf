"""The verdict as a person reads it (text), as CI reads it (JSON, JUnit XML, GitHub step summary)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from xml.etree import ElementTree as ET

from checker.core.sizing import CHECKED_VALUES
from checker.dist.wire import MISSING, STATUS_DRIFT, RankRow
from checker.tables import fmt_int, format_table, mark, outliers
from checker.verdict import Verdict, rank_ranges

HEADLINE = {
    "consistent": "CONSISTENT",
    "divergent": "DIVERGENT",
    "error": "ERROR",
    "infrastructure_failure": "INFRASTRUCTURE FAILURE",
    "model_drift": "MODEL DRIFT",
}


def _v(value: int) -> str:
    return "-" if value == MISSING else fmt_int(value)


def rank_dict(row: RankRow) -> dict[str, object]:
    d: dict[str, object] = {
        "rank": row.rank,
        "host": row.host,
        "node_rank": row.node_rank,
        "local_rank": row.local_rank,
        "pp_rank": row.pp_rank,
        "tp_rank": row.tp_rank,
        "status": "ok" if row.status == 0 else "model_drift" if row.status == STATUS_DRIFT else "error",
        "error": row.error or None,
    }
    for name in (
        *CHECKED_VALUES,
        "start_layer",
        "end_layer",
        "stage_linear_layers",
        "stage_per_req_bytes",
        "slots_per_request",
        "state_allocated_bytes",
        "state_charged_bytes",
        "device_free_bytes",
    ):
        value = getattr(row, name)
        d[name] = None if value == MISSING else value
    if row.budget_millionths_gib != MISSING:
        d["budget_gib"] = row.budget_millionths_gib / 1e6
    if row.materialize_status != MISSING:
        d["predicted_bytes"] = row.predicted_bytes
        d["allocated_bytes"] = None if row.allocated_bytes == MISSING else row.allocated_bytes
    return d


def to_json(verdict: Verdict, *, extra: Mapping[str, object]) -> dict[str, object]:
    first = verdict.rows[0] if verdict.rows else None
    return {
        "status": verdict.status,
        "exit_code": verdict.exit_code,
        "world_size": verdict.world_size,
        **extra,
        "inputs": dict(first.inputs) if first else {},
        "ranks": [rank_dict(r) for r in verdict.rows],
        "divergent": verdict.divergent,
        "divergent_groups": {
            name: [g.__dict__ for g in groups] for name, groups in verdict.divergent_groups.items()
        },
        "differing_inputs": verdict.differing_inputs,
        "root_causes": verdict.root_causes,
        "errors": verdict.errors,
        "warnings": verdict.warnings,
        "missing_ranks": verdict.missing_ranks,
        "infrastructure_detail": verdict.infrastructure_detail or None,
    }


def rank_table(rows: list[RankRow], divergent: list[str]) -> str:
    materialized = any(r.materialize_status != MISSING for r in rows)
    odd = {
        n: outliers([getattr(r, n) for r in rows]) if n in divergent else set() for n in CHECKED_VALUES
    }
    headers = ["rank", "host", "pp_rank", "layers", "linear", *CHECKED_VALUES, "state alloc/charged"]
    if materialized:
        headers += ["predicted_bytes", "allocated_bytes"]
    body = []
    for i, r in enumerate(rows):
        eff = (
            f"{r.state_allocated_bytes / r.state_charged_bytes:.0%}"
            if r.state_charged_bytes > 0
            else "-"
        )
        cells = [
            r.rank,
            r.host,
            r.pp_rank,
            f"[{r.start_layer}, {r.end_layer})" if r.start_layer != MISSING else "-",
            _v(r.stage_linear_layers),
            *(mark(_v(getattr(r, n)), i in odd[n]) for n in CHECKED_VALUES),
            eff,
        ]
        if materialized:
            cells += [_v(r.predicted_bytes), _v(r.allocated_bytes)]
        body.append(cells)
    return format_table(headers, body)


def to_text(verdict: Verdict, *, summary: str, elapsed_s: float) -> str:
    out = [f"checker: {HEADLINE[verdict.status]} - {summary} (checked in {elapsed_s:.1f} s)"]
    if verdict.rows and verdict.status != "infrastructure_failure":
        out += ["", rank_table(verdict.rows, verdict.divergent)]
    for name, groups in verdict.divergent_groups.items():
        out += ["", f"{name} differs across ranks (outliers marked *):"]
        out.append(
            format_table(
                ["value", "ranks", "hosts", "pp_ranks"],
                [
                    [
                        mark(fmt_int(g.value), g.outlier),
                        rank_ranges(g.ranks).split(" ", 1)[1],
                        ", ".join(g.hosts),
                        rank_ranges(g.pp_ranks).split(" ", 1)[1],
                    ]
                    for g in groups
                ],
            )
        )
    if verdict.root_causes:
        out += ["", "inputs that differ (root cause):"] + [f"  {c}" for c in verdict.root_causes]
    if verdict.errors:
        out += [""] + [f"error: {e}" for e in verdict.errors]
    if verdict.status == "infrastructure_failure":
        missing = rank_ranges(verdict.missing_ranks) if verdict.missing_ranks else "none identified"
        out += [
            "",
            f"infrastructure failure: {verdict.infrastructure_detail}",
            f"missing or unresponsive: {missing}",
            "next step: check that every node started its torchrun agent, that the nodes reach each "
            "other on the rendezvous and GLOO_SOCKET_IFNAME interfaces, and raise --timeout-s for slow "
            "starts",
        ]
    out += [f"warning: {w}" for w in verdict.warnings]
    out.append(f"verdict: {verdict.status} (exit {verdict.exit_code})")
    return "\n".join(out)


def one_line(verdict: Verdict) -> str:
    """The verdict in one line, for torchrun's root cause and CI logs."""
    if verdict.status == "divergent" and verdict.divergent:
        parts = [
            f"{n}: " + "; ".join(f"{rank_ranges(g.ranks)} -> {g.value}" for g in verdict.divergent_groups[n])
            for n in verdict.divergent
        ]
        cause = f" (inputs differ: {', '.join(verdict.differing_inputs)})" if verdict.differing_inputs else ""
        return f"checker verdict divergent: {' | '.join(parts)}{cause}"
    if verdict.status == "infrastructure_failure":
        missing = rank_ranges(verdict.missing_ranks) if verdict.missing_ranks else "none identified"
        return f"checker verdict infrastructure_failure: {verdict.infrastructure_detail}; missing: {missing}"
    return f"checker verdict {verdict.status}: " + "; ".join(verdict.errors or verdict.warnings)


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write via a temp file and rename, so a reader (or a SIGTERM mid-write) never sees half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, p)


def to_junit(verdict: Verdict, *, elapsed_s: float) -> str:
    suite = ET.Element("testsuite", name="pp-capacity-check", time=f"{elapsed_s:.3f}")
    cases = []
    for name in CHECKED_VALUES:
        case = ET.SubElement(suite, "testcase", classname="checker.consistency", name=name)
        cases.append(case)
        if verdict.status in ("error", "infrastructure_failure", "model_drift"):
            msg = "; ".join(verdict.errors) or verdict.infrastructure_detail
            ET.SubElement(case, "error", message=f"{verdict.status}: {msg}"[:1000])
        elif name in verdict.divergent:
            groups = verdict.divergent_groups[name]
            text = "; ".join(f"{rank_ranges(g.ranks)} -> {g.value}" for g in groups)
            ET.SubElement(case, "failure", message=f"{name} differs across ranks: {text}"[:1000])
    case = ET.SubElement(suite, "testcase", classname="checker.consistency", name="inputs")
    if verdict.differing_inputs:
        tag = "failure" if any("--strict-inputs" in e for e in verdict.errors) else "system-out"
        el = ET.SubElement(case, tag)
        body = "\n".join(verdict.root_causes)
        if tag == "failure":
            el.set("message", "inputs differ across ranks")
        el.text = body
    suite.set("tests", str(len(CHECKED_VALUES) + 1))
    suite.set("failures", str(len(suite.findall(".//failure"))))
    suite.set("errors", str(len(suite.findall(".//error"))))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def to_markdown(verdict: Verdict, *, summary: str) -> str:
    lines = [f"### PP capacity preflight: {HEADLINE[verdict.status]}", "", summary, ""]
    if verdict.rows and verdict.status != "infrastructure_failure":
        lines += ["| rank | host | pp_rank | " + " | ".join(CHECKED_VALUES) + " |"]
        lines += ["|" + "---|" * (3 + len(CHECKED_VALUES))]
        for r in verdict.rows:
            lines.append(
                f"| {r.rank} | {r.host} | {r.pp_rank} | "
                + " | ".join(
                    ("**" + _v(getattr(r, n)) + "**") if n in verdict.divergent else _v(getattr(r, n))
                    for n in CHECKED_VALUES
                )
                + " |"
            )
        lines.append("")
    for item in verdict.root_causes:
        lines.append(f"- root cause: {item}")
    for item in verdict.errors:
        lines.append(f"- error: {item}")
    if verdict.status == "infrastructure_failure":
        lines.append(f"- {verdict.infrastructure_detail}; missing: {verdict.missing_ranks or 'unknown'}")
    for item in verdict.warnings:
        lines.append(f"- warning: {item}")
    lines.append(f"\nverdict: `{verdict.status}` (exit {verdict.exit_code})\n")
    return "\n".join(lines)


def write_all(
    verdict: Verdict,
    *,
    report: str | None,
    junit: str | None,
    summary: str,
    elapsed_s: float,
    extra: Mapping[str, object],
) -> list[str]:
    """Write every requested artefact; return problems (never raise: the verdict must still print)."""
    problems = []
    if report:
        try:
            write_atomic(report, json.dumps(to_json(verdict, extra=extra), indent=2) + "\n")
        except OSError as exc:
            problems.append(f"cannot write --report {report}: {exc.strerror or exc}")
    if junit:
        try:
            write_atomic(junit, to_junit(verdict, elapsed_s=elapsed_s))
        except OSError as exc:
            problems.append(f"cannot write --junit {junit}: {exc.strerror or exc}")
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        try:
            with open(step, "a") as f:
                f.write(to_markdown(verdict, summary=summary))
        except OSError as exc:
            problems.append(f"cannot append to GITHUB_STEP_SUMMARY {step}: {exc.strerror or exc}")
    return problems
