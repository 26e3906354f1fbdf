"""The post-flight as a person reads it (text), as CI reads it (JSON, JUnit XML, GitHub step summary).

The same shape as the preflight's (:mod:`checker.outputs.report`): the root cause first, then one line
per value that differs from the prediction (rank, prefix, host, predicted, logged, the log line), then
every rank, then errors and warnings, then ``verdict: STATUS (exit N)``. docs/postflight.schema.json
describes the JSON; docs/postflight.md shows each rendering.
"""

from __future__ import annotations

from collections.abc import Sequence

from checker import __version__
from checker.outputs.markup import cut, md_cell, md_table
from checker.outputs.render import Document
from checker.outputs.tables import format_table
from checker.postflight.compare import (
    DIVERGES,
    MISSING,
    SKIPPED,
    VALUES,
    Check,
    Postflight,
    inferred_rank,
    tp_group,
    who_of,
)
from checker.postflight.log_formats import RELEASES
from checker.postflight.ranks import RankRead, span
from checker.postflight.reader import LogReading
from checker.status import CONSISTENT, DIVERGENT, ERROR, HEADLINE

SHOWN_CHECKS = 50
"""Differing values listed in the text and the step summary; the JSON has them all."""


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _releases(reads: Sequence[RankRead]) -> str:
    common: set[str] | None = None
    for r in reads:
        common = set(r.releases) if common is None else common & set(r.releases)
    return span(tuple(sorted(common or set(), key=_order)))


def _order(release: str) -> int:
    return RELEASES.index(release)


def summary(result: Postflight, reading: LogReading) -> str:
    logs = len(reading.logs)
    read = f"{len(result.reads)} rank(s) read from {logs} log{'s' if logs != 1 else ''}"
    releases = _releases(result.reads)
    forms = f", in the form SGLang {releases} writes" if releases != "none" else ""
    p = result.prediction
    if p is None:
        return f"{read}{forms}; no --report: the ranks held to each other"
    layout = f"pp {p.pp_size or '?'} x tp {p.group}" + (
        f" (attention DP {p.dp_size})" if p.dp_size > 1 else ""
    )
    return f"{read}{forms}; held to {p.path} ({p.world_size} ranks, {layout}, preflight {p.status})"


# -- JSON ----------------------------------------------------------------------------------------------


def _check_doc(c: Check) -> dict[str, object]:
    return {
        "value": c.value,
        "rank": c.rank,
        "replica": c.replica,
        "prefix": c.prefix,
        "host": c.host,
        "predicted": c.predicted,
        "logged": c.logged,
        "status": c.status,
        "where": c.where,
        "detail": c.detail or None,
        "cause": c.cause or None,
    }


def _rank_doc(read: RankRead, rank: int | None, mine: Sequence[Check]) -> dict[str, object]:
    host = next((c.host for c in mine if c.host), None)
    return {
        "rank": rank,
        "prefix": read.prefix,
        "host": host,
        "dp": read.key.dp,
        "pp": read.key.pp,
        "tp": read.key.tp,
        "releases": span(read.releases),
        "values": {
            c.value: {
                k: v
                for k, v in _check_doc(c).items()
                if k not in ("value", "rank", "prefix", "host", "replica")
            }
            for c in mine
        },
        "weights_type": read.weights_type,
        "weights_overlap": read.weights_overlap,
        "draft_weights": [
            {"type": t, "gib": w.value, "where": str(w.where) if w.where else None}
            for t, w in read.draft_weights
        ],
        "free_before_gib": read.free_before_gib.value,
        "max_total_num_tokens": read.max_total_num_tokens.value,
        "starts": read.starts,
    }


def _rank_docs(result: Postflight) -> list[dict[str, object]]:
    """One entry per rank read, with the checks of it (indexed once: thousands of ranks stay linear)."""
    rank_of = {id(r): key[1] for key, r in result.matched.items()}
    group = tp_group(result.reads)
    checks: dict[tuple[str, int | None], list[Check]] = {}
    for c in result.checks:
        checks.setdefault((c.prefix, c.rank), []).append(c)
    out = []
    for read in result.reads:
        rank = rank_of.get(id(read))
        if rank is None and result.prediction is None:
            rank = inferred_rank(read, group)
        out.append(_rank_doc(read, rank, checks.get((read.prefix, rank), [])))
    return out


def to_json(result: Postflight, reading: LogReading, *, report: str | None) -> dict[str, object]:
    p = result.prediction
    if p is not None:
        layout: dict[str, int | None] = {
            "world_size": p.world_size,
            "pp_size": p.pp_size,
            "tp_size": p.tp_size,
        }
    else:
        pp = max((r.key.pp for r in result.reads), default=-1) + 1
        tp = max((r.key.tp for r in result.reads), default=-1) + 1
        layout = {"world_size": pp * tp or None, "pp_size": pp or None, "tp_size": tp or None}
    return {
        "command": "postflight",
        "checker_version": __version__,
        "status": result.status,
        "exit_code": result.exit_code,
        "layout": layout,
        "inputs": {
            "report": report,
            "logs": [s.path for s in reading.logs],
            "weights_margin_gib": result.weights_margin_gib,
            "preflight_status": p.status if p else None,
            "weights_source": p.weights_source if p else None,
        },
        "logs": [
            {
                "path": s.path,
                "bytes": s.bytes,
                "lines": s.lines,
                "read": s.read,
                "cut": s.cut,
                "unknown_format": s.unknown_format,
                "skipped_runs": s.skipped_runs,
                "compressed": s.compressed,
            }
            for s in reading.logs
        ],
        "ranks": _rank_docs(result),
        "checks": [_check_doc(c) for c in result.checks],
        "divergent": result.divergent,
        "missing_ranks": result.missing,
        "extra_ranks": result.extra,
        "root_causes": result.root_causes,
        "errors": result.errors,
        "warnings": result.warnings,
    }


def error_doc(message: str, *, report: str | None, logs: Sequence[str]) -> dict[str, object]:
    """The document of a post-flight that could not read its inputs (status error, exit 2)."""
    return {
        "command": "postflight",
        "checker_version": __version__,
        "status": ERROR,
        "exit_code": 2,
        "layout": {"world_size": None, "pp_size": None, "tp_size": None},
        "inputs": {
            "report": report,
            "logs": list(logs),
            "weights_margin_gib": None,
            "preflight_status": None,
            "weights_source": None,
        },
        "logs": [],
        "ranks": [],
        "checks": [],
        "divergent": [],
        "missing_ranks": [],
        "extra_ranks": [],
        "root_causes": [],
        "errors": [message],
        "warnings": [],
    }


# -- text ----------------------------------------------------------------------------------------------

DIFF_HEADERS = ["rank", "prefix", "host", "value", "predicted", "logged", "line"]


def _diff_rows(checks: Sequence[Check]) -> list[list[str]]:
    rows = []
    for c in checks[:SHOWN_CHECKS]:
        rank = f"{c.rank}" + (f" (DP{c.replica})" if c.replica is not None else "")
        rows.append(
            [rank, c.prefix or "-", c.host or "-", c.value, _fmt(c.predicted), _fmt(c.logged), c.where or "-"]
        )
    return rows


def _differing(result: Postflight) -> list[Check]:
    """The values that differ, rank by rank, each rank's in the order of VALUES."""
    off = [c for c in result.checks if c.status == DIVERGES]
    return sorted(
        off, key=lambda c: (c.replica or 0, c.rank if c.rank is not None else -1, VALUES.index(c.value))
    )


def _cell(c: Check | None, *, predicted: bool) -> str:
    if c is None:
        return ""
    if c.status == MISSING:
        return "?"
    if c.status == SKIPPED:
        return _fmt(c.logged) if c.logged is not None else "n/a"
    shown = _fmt(c.logged) if c.logged is not None else "state ok" if c.status != DIVERGES else "state *"
    if c.status == DIVERGES and predicted and c.logged is not None:
        return f"{shown} (predicted {_fmt(c.predicted)}) *"
    return f"{shown} *" if c.status == DIVERGES else shown


def rank_rows(result: Postflight) -> tuple[list[str], list[list[str]]]:
    headers = ["rank", "prefix", "host", *VALUES, "line"]
    by: dict[tuple[int | None, int | None, str], dict[str, Check]] = {}
    for c in result.checks:
        by.setdefault((c.replica, c.rank, c.prefix), {})[c.value] = c
    rows = []
    for (replica, rank, prefix), cs in sorted(by.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] or 0)):
        first = next(iter(cs.values()))
        where = next((c.where for c in cs.values() if c.where), None)
        rows.append(
            [
                "-"
                if rank is None
                else f"{rank}" + (f" (DP{replica})" if replica is not None and result.prediction else ""),
                prefix or "-",
                first.host or "-",
                *(_cell(cs.get(v), predicted=result.prediction is not None) for v in VALUES),
                where or "-",
            ]
        )
    return headers, rows


def to_text(result: Postflight, reading: LogReading) -> str:
    out = [f"checker postflight: {HEADLINE[result.status]} - {summary(result, reading)}"]
    if result.root_causes:
        out += ["", "root cause:"] + [f"  {c}" for c in result.root_causes]
    differing = _differing(result)
    if differing and result.prediction is not None:
        more = (
            f" (first {SHOWN_CHECKS} of {len(differing)}; --format json lists all)"
            if len(differing) > SHOWN_CHECKS
            else ""
        )
        out += [
            "",
            f"values that differ from the prediction{more}:",
            format_table(DIFF_HEADERS, _diff_rows(differing)),
        ]
    elif differing:
        out += ["", "values that differ across ranks: " + ", ".join(result.divergent)]
    if result.checks:
        legend = (
            " (logged; * differs from the prediction; ? not in the logs; max_running_requests from each "
            "stage's TP 0)"
            if result.prediction is not None
            else " (as logged; * differs from the other ranks; pp_max_micro_batch_size recomputed; "
            "? not logged)"
        )
        headers, rows = rank_rows(result)
        out += ["", f"every rank{legend}:", format_table(headers, rows)]
    for line in result.missing:
        out.append(f"missing: {line}")
    for line in result.extra:
        out.append(f"not predicted: {line}")
    out += [""] + [f"error: {e}" for e in result.errors]
    out += [f"warning: {w}" for w in result.warnings]
    out.append(f"verdict: {result.status} (exit {result.exit_code})")
    return "\n".join(line for i, line in enumerate(out) if line or (i and out[i - 1]))


def one_line(result: Postflight) -> str:
    if result.status == DIVERGENT:
        parts = [
            f"{who_of(c)} {c.value} predicted {_fmt(c.predicted)}, logged {_fmt(c.logged)}"
            for c in result.checks
            if c.status == DIVERGES
        ][:5]
        parts += result.extra[:2]
        cause = f" (root cause: {' | '.join(result.root_causes)})" if result.root_causes else ""
        return f"checker postflight divergent: {'; '.join(parts)}{cause}"
    said = result.errors or result.missing or result.warnings
    return f"checker postflight {result.status}" + (": " + "; ".join(said[:3]) if said else "")


# -- JUnit ---------------------------------------------------------------------------------------------


def to_junit(result: Postflight, *, elapsed_s: float) -> str:
    """One case per value held, plus ``ranks`` (a rank the prediction or the logs lack)."""
    from xml.etree import ElementTree as ET  # start-up: only with --junit, as in outputs/report.py

    suite = ET.Element("testsuite", name="pp-capacity-postflight", time=f"{elapsed_s:.3f}")
    for value in VALUES:
        case = ET.SubElement(suite, "testcase", classname="checker.postflight", name=value)
        off = [c for c in result.checks if c.value == value and c.status == DIVERGES]
        if off:
            lines = [
                f"{who_of(c)}: predicted {_fmt(c.predicted)}, logged {_fmt(c.logged)} ({c.where})"
                + (f"; cause: {c.cause}" if c.cause else "")
                for c in off
            ]
            el = ET.SubElement(
                case,
                "failure",
                type="divergent",
                message=cut(f"{value} differs from the preflight's prediction: " + "; ".join(lines)),
            )
            el.text = "\n".join(lines)
        elif result.status == ERROR and not result.checks:
            el = ET.SubElement(case, "error", type="error", message=cut("; ".join(result.errors)))
            el.text = "\n".join(result.errors)
        elif not any(c.value == value and c.status not in (MISSING, SKIPPED) for c in result.checks):
            ET.SubElement(case, "skipped", message="not held: the logs or the prediction have no such value")
    case = ET.SubElement(suite, "testcase", classname="checker.postflight", name="ranks")
    if result.extra:
        el = ET.SubElement(case, "failure", type="divergent", message=cut("; ".join(result.extra)))
        el.text = "\n".join(result.extra)
    elif result.missing or (result.errors and result.checks):
        problems = [*result.missing, *result.errors]
        el = ET.SubElement(case, "error", type="error", message=cut("; ".join(problems)))
        el.text = "\n".join(problems)
    suite.set("tests", str(len(VALUES) + 1))
    suite.set("failures", str(len(suite.findall(".//failure"))))
    suite.set("errors", str(len(suite.findall(".//error"))))
    suite.set("skipped", str(len(suite.findall(".//skipped"))))
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


# -- GitHub step summary -------------------------------------------------------------------------------


def to_markdown(result: Postflight, reading: LogReading) -> str:
    lines = [f"### PP capacity post-flight: {HEADLINE[result.status]}", ""]
    if result.root_causes:
        lines += ["**Root cause:**", ""] + [f"- {md_cell(c)}" for c in result.root_causes] + [""]
    lines += [md_cell(summary(result, reading)), ""]
    differing = _differing(result)
    if differing and result.prediction is not None:
        lines += ["**Values that differ from the prediction:**", ""]
        lines += md_table(DIFF_HEADERS, _diff_rows(differing)) + [""]
    if result.checks:
        headers, rows = rank_rows(result)
        lines += ["Every rank (logged; * differs):", ""] + md_table(headers, rows) + [""]
    lines += [f"- missing: {md_cell(m)}" for m in result.missing]
    lines += [f"- not predicted: {md_cell(m)}" for m in result.extra]
    lines += [f"- error: {md_cell(e)}" for e in result.errors]
    lines += [f"- warning: {md_cell(w)}" for w in result.warnings]
    lines.append(f"\nverdict: `{result.status}` (exit {result.exit_code})\n")
    return "\n".join(lines)


def error_markdown(message: str) -> str:
    head = f"### PP capacity post-flight: {HEADLINE[ERROR]}"
    return f"{head}\n\n- error: {md_cell(message)}\n\nverdict: `error` (exit 2)\n"


def error_junit(message: str) -> str:
    from xml.etree import ElementTree as ET  # start-up: only with --junit, as in to_junit

    suite = ET.Element(
        "testsuite",
        name="pp-capacity-postflight",
        tests=str(len(VALUES) + 1),
        failures="0",
        errors=str(len(VALUES) + 1),
    )
    for value in (*VALUES, "ranks"):
        case = ET.SubElement(suite, "testcase", classname="checker.postflight", name=value)
        el = ET.SubElement(case, "error", type="error", message=cut(message))
        el.text = message
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


# -- the document --------------------------------------------------------------------------------------


def document(result: Postflight, reading: LogReading, *, report: str | None, elapsed_s: float) -> Document:
    """The post-flight for every renderer; the step summary only where it held logs to ``report``."""
    return Document(
        lambda: to_json(result, reading, report=report),
        lambda: [to_text(result, reading)],
        lambda: one_line(result),
        junit=lambda: to_junit(result, elapsed_s=elapsed_s),
        markdown=(lambda: to_markdown(result, reading)) if report else None,
    )


def error_document(message: str, *, report: str | None, logs: Sequence[str]) -> Document:
    """Unreadable input: the error in the JSON, JUnit and the step summary; nothing in the text (the one
    line goes to stderr)."""
    return Document(
        lambda: error_doc(message, report=report, logs=logs),
        junit=lambda: error_junit(message),
        markdown=lambda: error_markdown(message),
    )


__all__ = [
    "CONSISTENT",
    "document",
    "error_document",
    "to_json",
    "to_text",
    "to_junit",
    "to_markdown",
    "one_line",
]
