"""The verdict as a person reads it (text), as CI reads it (JSON, JUnit XML, GitHub step summary).

Every rendering leads with the root cause (the ways the stages are not one pipeline of one model, then
the inputs that differ across ranks, or, when every input agrees, the stages' own layer slices), then
one grouped view of the values that differ: per value, one
line per group of ranks that derived the same number. ``share`` names each group ``majority``,
``outlier`` or ``split`` (no value is held by more ranks than every other, e.g. 2-2: nothing is an
outlier). docs/report.schema.json describes the JSON report; docs/example-divergent.md shows each
rendering of one divergent run.
"""

from __future__ import annotations

import hashlib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from checker.config import SizingFlags
from checker.core.errors import FlagError
from checker.core.ranks import outliers, rank_ranges
from checker.core.sizing.kv_pool import release_at
from checker.core.sizing.page_size import FLAG_OF, resolve_page_size
from checker.core.sizing.row import MISSING, REPORTED_INTS, RankRow
from checker.core.sizing.sizing import CHECKED_VALUES
from checker.distributed.wire import VALUE_BYTES, digest, sent_text
from checker.families.weights_source import DraftSource, WeightsSource, draft_words
from checker.outputs.markup import cut, md_cell, md_table
from checker.outputs.render import Document
from checker.outputs.tables import fmt_int, format_table, mark
from checker.preflight.derivation import FRACTION_MILLIONTHS, FRACTION_SOURCES
from checker.preflight.pipeline import agreed_num_layers
from checker.preflight.verdict import COMPARED_VALUES, STAGE_VALUES, ValueGroup, Verdict
from checker.status import DIVERGENT, ERROR, HEADLINE, INFRASTRUCTURE_FAILURE, MODEL_DRIFT, row_status_name

if TYPE_CHECKING:
    from checker.launch.merge import LaunchInputs

SHOW_HOSTS = 3
SHOW_SLICES = 3


def _v(value: int) -> str:
    return "-" if value == MISSING else fmt_int(value)


def _ranks(ranks: Sequence[int]) -> str:
    """[0, 1, 3] -> '0-1, 3' (rank_ranges without its 'ranks ' prefix)."""
    return rank_ranges(ranks).split(" ", 1)[1]


def _slices(layers: Sequence[Sequence[int]]) -> str:
    shown = [f"[{s}, {e})" for s, e in layers if s != MISSING]
    if len(shown) > SHOW_SLICES:
        return ", ".join(shown[: SHOW_SLICES - 1]) + f", ... ({len(shown)} slices)"
    return ", ".join(shown) or "-"


def _hosts(hosts: Sequence[str]) -> str:
    if len(hosts) > SHOW_HOSTS:
        return ", ".join(hosts[: SHOW_HOSTS - 1]) + f", ... ({len(hosts)} hosts)"
    return ", ".join(hosts)


# -- typed inputs --------------------------------------------------------------------------------------


def _flag_types() -> dict[str, type]:
    """Each SizingFlags field's value type (``int | None`` -> int), from the dataclass itself."""
    hints = typing.get_type_hints(SizingFlags)
    out: dict[str, type] = {}
    for f in fields(SizingFlags):
        args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
        out[f.name] = args[0]
    return out


INPUT_TYPES: dict[str, type] = {**_flag_types(), "budget_gib": float}
"""Inputs that are not text; every other input (versions, model, env vars) is a string or null."""


def typed_input(name: str, text: str | None) -> object:
    """An input's wire text as the JSON report gives it: numbers as numbers, booleans as booleans."""
    kind = INPUT_TYPES.get(name, str)
    if text is None or kind is str:
        return text
    if kind is bool:
        return {"true": True, "false": False}.get(text, text)
    try:
        return kind(text)
    except ValueError:  # not the canonical text of its type: show it as sent
        return text


def _row_inputs(row: RankRow) -> dict[str, object]:
    return {name: typed_input(name, sent_text(row, name)) for name in row.inputs}


# -- JSON ----------------------------------------------------------------------------------------------


_SOURCES = {int(s) for s in WeightsSource}
_DRAFTS = {int(s) for s in DraftSource}


def _known(value: int) -> int | None:
    return None if value in (MISSING, 0) else value


def rank_dict(row: RankRow) -> dict[str, object]:
    d: dict[str, object] = {
        "rank": row.rank,
        "host": row.host,
        "status": row_status_name(row.status),
        "error": row.error or None,
        "pp_size": _known(row.pp_size),
        "tp_size": _known(row.tp_size),
    }
    for name in REPORTED_INTS:
        value = getattr(row, name)
        d[name] = None if value == MISSING else value
        if name == "draft_bytes":  # where the draft's bytes came from, beside them
            d["draft_source"] = DraftSource(row.draft_source).label if row.draft_source in _DRAFTS else None
    d["kv_limiting"] = None if row.kv_limiting == MISSING else bool(row.kv_limiting)
    d["budget_gib"] = row.budget_gib
    d["weights_source"] = WeightsSource(row.weights_source).label if row.weights_source in _SOURCES else None
    fraction = row.mem_fraction_millionths
    d["mem_fraction_static"] = None if fraction == MISSING else fraction / FRACTION_MILLIONTHS
    d["mem_fraction_source"] = FRACTION_SOURCES.get(row.mem_fraction_source)
    if row.materialize_status == MISSING:
        for name in ("predicted_bytes", "allocated_bytes"):
            d.pop(name)
    d["inputs"] = _row_inputs(row)
    return d


def inputs_view(verdict: Verdict, *, whole: Mapping[str, str | None] | None = None) -> dict[str, object]:
    """Every input once: its value where all ranks agree; ``{"by_rank": [...]}`` (one value per entry
    of ``ranks``, in the same order) where they differ. ``whole``: inputs this rank has whole (its own
    launch command), shown instead of the wire's cut text where every rank sent that same value."""
    out: dict[str, object] = {}
    if not verdict.rows:
        return out
    first = verdict.rows[0]
    for name in first.inputs:
        known = (whole or {}).get(name)
        if name in verdict.differing_inputs:
            out[name] = {"by_rank": [typed_input(name, sent_text(r, name)) for r in verdict.rows]}
        elif known is not None and digest(known) == first.input_digests.get(name):
            out[name] = typed_input(name, known)
        else:
            out[name] = typed_input(name, sent_text(first, name))
    return out


def _hex(value: int) -> str:
    """A wire digest (signed int64) as 16 hex digits."""
    return f"{value & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def launch_command_doc(launch: LaunchInputs | None) -> dict[str, object] | None:
    """This rank's launch command, whole, for the report's ``launch_command`` (rank 0 publishes it; the
    rows carry only the sizing inputs, cut to the wire's width). ``sha256`` is of ``text`` (UTF-8), so an
    audit can match it against the command CI ran: ``printf %s "$CMD" | sha256sum``."""
    if launch is None:
        return None
    import shlex  # start-up: only for a launch command (docs/performance.md, the rank's path)

    text = shlex.join(launch.argv)
    return {
        "argv": list(launch.argv),
        "text": text,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "form": launch.form or None,
        "parser": launch.parser,
        "release": launch.release,
        "input": launch.input,
        "input_digest": _hex(digest(launch.input)),
    }


_NO_LAUNCH = dict.fromkeys(("argv", "text", "sha256", "form", "parser", "release", "input", "input_digest"))


def launch_command_json(
    own: Mapping[str, object] | None, rows: Sequence[RankRow]
) -> dict[str, object] | None:
    """The report's ``launch_command``: rank 0's command whole (``own``, from :func:`launch_command_doc`)
    and one group per command the ranks ran, by the whole command (every word: ``sha256_prefix``, the
    first 16 hex digits of its ``sha256``) and by how it was read (``input_digest``, the ``launch_command``
    input's digest; null: no command), the largest group first. Null when no rank had a launch command."""
    groups: dict[tuple[int, int | None], list[RankRow]] = {}
    for row in rows:
        if "launch_command" in row.input_digests:
            groups.setdefault((row.launch_digest, row.input_digests["launch_command"]), []).append(row)
    if own is None and all(r.inputs.get("launch_command") is None for r in rows):
        return None
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0].rank))

    def sent(row: RankRow) -> str | None:
        return None if row.inputs.get("launch_command") is None else _hex(row.input_digests["launch_command"])

    def whole(row: RankRow) -> str | None:
        return None if row.launch_digest == MISSING else _hex(row.launch_digest)

    groups_doc = [
        {"ranks": [r.rank for r in g], "sha256_prefix": whole(g[0]), "input_digest": sent(g[0])}
        for g in ordered
    ]
    return {**(own or _NO_LAUNCH), "groups": groups_doc}


def layout(verdict: Verdict) -> dict[str, int | None]:
    """The layout the ranks derived with (null where they do not agree or none could derive it)."""

    def agreed(name: str) -> int | None:
        values = {getattr(r, name) for r in verdict.rows} - {MISSING, 0}
        return values.pop() if len(values) == 1 else None

    return {"world_size": verdict.world_size, "pp_size": agreed("pp_size"), "tp_size": agreed("tp_size")}


def to_json(verdict: Verdict, *, extra: Mapping[str, object]) -> dict[str, object]:
    """``extra``: what the publishing rank adds (versions, timings, its own ``launch_command`` from
    :func:`launch_command_doc`, and ``own_inputs``: its inputs whole, before the wire cut them, shown in
    ``inputs`` where every rank sent the same value: a long model path is kept whole)."""
    extra = dict(extra)
    own = extra.pop("launch_command", None)
    own_inputs = extra.pop("own_inputs", None)
    assert own is None or isinstance(own, Mapping), own  # launch_command_doc's dict
    assert own_inputs is None or isinstance(own_inputs, Mapping), own_inputs  # RankRow.inputs
    whole: dict[str, str | None] = dict(own_inputs or {})
    if own:
        whole["launch_command"] = own["input"]
    return {
        "command": "check",
        "status": verdict.status,
        "exit_code": verdict.exit_code,
        "world_size": verdict.world_size,
        **extra,
        "launch_command": launch_command_json(own, verdict.rows),
        "layout": layout(verdict),
        "inputs": inputs_view(verdict, whole=whole),
        "ranks": [rank_dict(r) for r in verdict.rows],
        "divergent": verdict.divergent,
        "divergent_groups": {
            name: [{**g.__dict__, "layers": [list(s) for s in g.layers]} for g in groups]
            for name, groups in verdict.divergent_groups.items()
        },
        "differing_inputs": verdict.differing_inputs,
        "pipeline": pipeline_json(verdict),
        "root_causes": verdict.root_causes,
        "errors": verdict.errors,
        "warnings": verdict.warnings,
        "missing_ranks": verdict.missing_ranks,
        "infrastructure_detail": verdict.infrastructure_detail or None,
    }


def pipeline_json(verdict: Verdict) -> dict[str, object]:
    """Whether the ranks are one pipeline of one model: the layer count they agree on (null: they do not,
    or none loaded the model) and one entry per fault (checker.preflight.pipeline), empty when the stages
    tile the model."""
    return {
        "num_layers": agreed_num_layers(verdict.rows),
        "faults": [
            {
                "kind": f.kind,
                "ranks": f.ranks,
                "layers": None if f.layers is None else list(f.layers),
                "inputs": f.inputs,
                "text": f.text,
            }
            for f in verdict.pipeline
        ],
    }


# -- what every rendering says first ----------------------------------------------------------------------


def _diverged(verdict: Verdict) -> bool:
    """Whether the ranks diverge in what they run: a value, or the pipeline itself."""
    return bool(verdict.divergent or verdict.pipeline)


def root_cause_lines(verdict: Verdict) -> list[str]:
    """The inputs that differ; or, for a divergence on identical inputs, what the stages differ in."""
    if verdict.root_causes:
        return list(verdict.root_causes)
    if verdict.status != DIVERGENT or not verdict.divergent or not verdict.rows:
        return []
    policy = verdict.rows[0].inputs.get("policy") or "max-share"
    linear = sorted({r.stage_linear_layers for r in verdict.rows})
    return [
        f"every input agrees across ranks: the values follow the stage. Under --policy {policy} the "
        f"stages, which hold {', '.join(map(str, linear))} linear layers, derive different values "
        "(see the layers of each group)"
    ]


def cut_note(verdict: Verdict) -> str | None:
    """Says that a differing input's text is shortened in the lines above, and where it is whole."""
    cut = [
        name
        for name in verdict.differing_inputs
        if any(sent_text(r, name) != r.inputs.get(name) for r in verdict.rows)
    ]
    if not cut:
        return None
    where = (
        "; the JSON report (--report) keeps rank 0's whole launch command" if "launch_command" in cut else ""
    )
    return (
        f"{', '.join(cut)}: each rank sends the first {VALUE_BYTES} bytes, shown ending in '...'; the "
        f"digest of the whole value decides{where}"
    )


def group_text(g: ValueGroup) -> str:
    return f"{rank_ranges(g.ranks)} -> {g.value} ({g.share})"


def groups_text(name: str, groups: Sequence[ValueGroup]) -> str:
    return f"{name}: " + "; ".join(group_text(g) for g in groups)


def differing_rows(verdict: Verdict) -> list[list[str]]:
    """One row per group of ranks per differing value: the grouped view every rendering shows."""
    rows = []
    for name in verdict.divergent:
        for j, g in enumerate(verdict.divergent_groups[name]):
            rows.append(
                [
                    name if j == 0 else "",
                    fmt_int(g.value),
                    g.share,
                    _ranks(g.ranks),
                    _ranks(g.pp_ranks),
                    _slices(g.layers),
                    ", ".join(map(str, g.linear_layers)),
                    _hosts(g.hosts),
                ]
            )
    return rows


JUNIT_VALUES = (*COMPARED_VALUES, *STAGE_VALUES)
"""One JUnit case per value the verdict compares."""
DIFFERING_HEADERS = ["value", "derived", "share", "ranks", "pp_ranks", "layers", "linear", "hosts"]


# -- text ----------------------------------------------------------------------------------------------


def weights_cell(row: RankRow) -> str:
    """A rank's weights figure and its source ("15.11 GiB (checkpoint)"), with the speculative draft's
    part where the rank loads one and where it came from ("18.62 GiB (checkpoint, draft 3.51 GiB from
    target-mtp)"), "-" where it has none."""
    if row.weights_bytes == MISSING:
        return "-"
    source = WeightsSource(row.weights_source).label if row.weights_source in _SOURCES else "?"
    if source == "config":  # the figure from config.json alone, said where a CI log shows it
        source = "config.json, no shards"
    kind = DraftSource(row.draft_source) if row.draft_source in _DRAFTS else DraftSource.NONE
    draft = draft_words(kind, None if row.draft_bytes == MISSING else row.draft_bytes)
    return f"{row.weights_bytes / 2**30:.2f} GiB ({source}{', ' + draft if draft else ''})"


def _with_weights(rows: Sequence[RankRow]) -> bool:
    """Whether the ranks took weights off free memory (--budget-from-device with a figure)."""
    return any(r.weights_bytes != MISSING for r in rows)


TABLE_VALUES = (*CHECKED_VALUES, "kv_own_tokens", "max_total_num_tokens")
"""The values of every rank's table row: the three, the stage's own KV capacity and the pool after the MIN."""


def kv_idle_cell(row: RankRow) -> str:
    if row.kv_idle_bytes in (MISSING, 0):
        return "-" if row.kv_idle_bytes == MISSING else "0"
    return f"{row.kv_idle_bytes / 2**30:.2f}"


def rank_table(rows: list[RankRow], divergent: list[str]) -> str:
    materialized = any(r.materialize_status != MISSING for r in rows)
    weights = _with_weights(rows)
    odd = {n: outliers([getattr(r, n) for r in rows]) if n in divergent else set() for n in TABLE_VALUES}
    headers = [
        "rank",
        "host",
        "pp_rank",
        "layers",
        "linear",
        *TABLE_VALUES,
        "kv_idle_gib",
        "state alloc/charged",
    ]
    if weights:
        headers.append("weights")
    if materialized:
        headers += ["predicted_bytes", "allocated_bytes"]
    body = []
    for i, r in enumerate(rows):
        eff = f"{r.state_allocated_bytes / r.state_charged_bytes:.0%}" if r.state_charged_bytes > 0 else "-"
        cells = [
            r.rank,
            r.host,
            _v(r.pp_rank),
            f"[{r.start_layer}, {r.end_layer})" if r.start_layer != MISSING else "-",
            _v(r.stage_linear_layers),
            *(mark(_v(getattr(r, n)), i in odd[n]) for n in TABLE_VALUES),
            kv_idle_cell(r),
            eff,
        ]
        if weights:
            cells.append(weights_cell(r))
        if materialized:
            cells += [_v(r.predicted_bytes), _v(r.allocated_bytes)]
        body.append(cells)
    return format_table(headers, body)


def to_text(verdict: Verdict, *, summary: str, elapsed_s: float) -> str:
    """``elapsed_s``: seconds from the checker's start on this rank to the verdict."""
    out = [
        f"checker: {HEADLINE[verdict.status]} - {summary} "
        f"(verdict {elapsed_s:.1f} s after the checker started on this rank)"
    ]
    causes = root_cause_lines(verdict)
    if causes:
        title = "root cause" if _diverged(verdict) else "inputs that differ across ranks"
        out += ["", f"{title}:"] + [f"  {c}" for c in causes]
        note = cut_note(verdict)
        out += [f"  ({note})"] if note else []
    if verdict.divergent:
        out += [
            "",
            "values that differ across ranks (one line per group of ranks; share: majority, "
            "outlier, or split when no value has a majority):",
            format_table(DIFFERING_HEADERS, differing_rows(verdict)),
        ]
    if verdict.rows and verdict.status != INFRASTRUCTURE_FAILURE:
        legend = (
            " (* differs from the majority)"
            if any(g.outlier for gs in verdict.divergent_groups.values() for g in gs)
            else ""
        )
        out += ["", f"every rank{legend}:", rank_table(verdict.rows, verdict.divergent)]
        pool = kv_pool_line(verdict.rows)
        out += ["", pool] if pool else []
    if verdict.errors:
        out += [""] + [f"error: {e}" for e in verdict.errors]
    if verdict.status == INFRASTRUCTURE_FAILURE:
        missing = rank_ranges(verdict.missing_ranks) if verdict.missing_ranks else "none identified"
        out += [
            "",
            f"infrastructure failure: {verdict.infrastructure_detail}",
            f"missing or unresponsive: {missing}",
            "next step: check that every node started its torchrun agent, that the nodes reach each "
            "other on the rendezvous and GLOO_SOCKET_IFNAME interfaces, and raise --timeout-s for slow "
            "starts",
        ]
    out += [""] + [f"warning: {w}" for w in verdict.warnings]
    out.append(f"verdict: {verdict.status} (exit {verdict.exit_code})")
    return "\n".join(out)


def page_phrase(row: RankRow) -> str:
    """The page size ``row``'s pool aligns to, as derive's header says it: "page size 64 (was 16:
    --attention-backend flashmla forces it)" where a backend changed it (the row's release's rules applied
    to its own inputs, :mod:`checker.core.sizing.page_size`), "page size 1 (was 16: SGLang 0.5.13 resets
    it)" where the release reset it first (0.5.11-0.5.13.post1's no_buffer radix cache), "page size 16"
    where the page given stands, "" for page 1 as given or a rank that derived none."""
    if row.page_size == MISSING or row.kv_release == MISSING:
        return ""
    given = typed_input("page_size", sent_text(row, "page_size"))
    given = given if isinstance(given, int) else 1
    if row.page_size == given:
        return f"page size {given}" if given > 1 else ""
    release = release_at(row.kv_release)
    backends = {name: sent_text(row, name) for name in FLAG_OF.values()}
    for start in (given, 1):  # 0.5.11-0.5.13.post1 reset the page to 1 before the backends' rules
        try:
            r = resolve_page_size(release, start, backends)
        except FlagError:  # the rank refused it itself: its own error says so
            return ""
        if r.page_size == row.page_size and r.changed_by is not None:
            reset = f"SGLang {release} resets it to 1, then " if start != given else ""
            return f"page size {row.page_size} (was {given}: {reset}{r.changed_by} forces it)"
    return f"page size {row.page_size} (was {given}: SGLang {release} resets it)"


def page_line(rows: Sequence[RankRow]) -> str:
    """:func:`page_phrase` once where every rank says the same, else per group of ranks ("" where none
    says anything)."""
    said: dict[str, list[int]] = {}
    for r in rows:
        said.setdefault(page_phrase(r), []).append(r.rank)
    if len(said) == 1:
        return next(iter(said))
    return "; ".join(f"{rank_ranges(ranks)}: {p or 'page size as given'}" for p, ranks in said.items())


def kv_pool_line(rows: Sequence[RankRow]) -> str | None:
    """The KV pool under the MIN, in one line: the page size it aligns to where a backend changed it
    (or it is not 1), which stage sets it and what the others leave idle."""
    sized = [r for r in rows if r.max_total_num_tokens != MISSING and r.kv_own_tokens != MISSING]
    if not sized:
        return None
    T = {r.max_total_num_tokens for r in sized}
    contexts = {r.context_len for r in sized}
    pool = f"KV pool: max_total_num_tokens {', '.join(fmt_int(t) for t in sorted(T))}"
    pool += f", context_len {', '.join(fmt_int(c) for c in sorted(contexts))}"
    page = f"; {said}" if (said := page_line(sized)) else ""
    if max(r.pp_size for r in sized) <= 1:
        return pool + page
    limiting = sorted({r.pp_rank for r in sized if r.kv_limiting == 1})
    idle: dict[int, int] = {}
    for r in sized:
        idle[r.pp_rank] = max(idle.get(r.pp_rank, 0), r.kv_idle_bytes)
    named = "stage " if len(limiting) == 1 else "stages "
    pool += f" after the MIN over stages; set by {named}{_ranks(limiting)} (the smallest own capacity)"
    left = [f"stage {k} {b / 2**30:.2f} GiB" for k, b in sorted(idle.items()) if b > 0]
    if left:
        pool += f"; idle per rank because of the MIN: {', '.join(left)}"
    return pool + page


def one_line(verdict: Verdict) -> str:
    """The verdict in one line, for torchrun's root cause and CI logs."""
    if verdict.status == DIVERGENT and _diverged(verdict):
        parts = [groups_text(n, verdict.divergent_groups[n]) for n in verdict.divergent]
        if verdict.pipeline and not parts:
            parts = ["the stages are not one pipeline of one model"]
        causes = root_cause_lines(verdict)
        cause = f" (root cause: {' | '.join(causes)})" if causes else ""
        return f"checker verdict divergent: {' | '.join(parts)}{cause}"
    if verdict.status == INFRASTRUCTURE_FAILURE:
        missing = rank_ranges(verdict.missing_ranks) if verdict.missing_ranks else "none identified"
        return f"checker verdict infrastructure_failure: {verdict.infrastructure_detail}; missing: {missing}"
    said = verdict.errors or verdict.warnings
    return f"checker verdict {verdict.status}" + (": " + "; ".join(said) if said else "")


# -- JUnit ---------------------------------------------------------------------------------------------


def _group_detail(name: str, groups: Sequence[ValueGroup]) -> list[str]:
    return [
        f"  {name} = {g.value} ({g.share}): {rank_ranges(g.ranks)}, pp_ranks {_ranks(g.pp_ranks)}, "
        f"layers {_slices(g.layers)}, linear {', '.join(map(str, g.linear_layers))}, "
        f"hosts {_hosts(g.hosts)}"
        for g in groups
    ]


def to_junit(verdict: Verdict, *, elapsed_s: float) -> str:
    """One case per checked value, ``pipeline`` (the stages tile one model) and ``inputs``. A failing
    case's message carries the per-group values and the root cause (GitLab and Jenkins show only the
    failing case's message); its text the details."""
    from xml.etree import ElementTree as ET  # only with --junit: every rank imports this module

    suite = ET.Element("testsuite", name="pp-capacity-check", time=f"{elapsed_s:.3f}")
    causes = root_cause_lines(verdict)
    cause_text = "root cause: " + " | ".join(causes) if causes else ""
    for name in JUNIT_VALUES:
        case = ET.SubElement(suite, "testcase", classname="checker.consistency", name=name)
        if verdict.status in (ERROR, INFRASTRUCTURE_FAILURE, MODEL_DRIFT):
            msg = "; ".join(verdict.errors) or verdict.infrastructure_detail
            if verdict.missing_ranks:
                msg += f"; missing: {rank_ranges(verdict.missing_ranks)}"
            el = ET.SubElement(case, "error", message=cut(f"{verdict.status}: {msg}"), type=verdict.status)
            el.text = "\n".join(verdict.errors or [msg])
        elif name in verdict.divergent:
            groups = verdict.divergent_groups[name]
            message = cut(f"{name} differs across ranks: " + "; ".join(group_text(g) for g in groups))
            if cause_text:
                message += ". " + cut(cause_text)
            el = ET.SubElement(case, "failure", message=message, type="divergent")
            el.text = "\n".join(
                [
                    f"{name} per group of ranks:",
                    *_group_detail(name, groups),
                    *(["root cause:", *(f"  {c}" for c in causes)] if causes else []),
                    *([f"({note})"] if (note := cut_note(verdict)) else []),
                ]
            )
    case = ET.SubElement(suite, "testcase", classname="checker.consistency", name="pipeline")
    if verdict.pipeline:
        el = ET.SubElement(
            case,
            "failure",
            type="divergent",
            message=cut(
                "the stages are not one pipeline of one model: "
                + " | ".join(f.text for f in verdict.pipeline)
            ),
        )
        el.text = "\n".join(["root cause:", *(f"  {c}" for c in causes)])
    case = ET.SubElement(suite, "testcase", classname="checker.consistency", name="inputs")
    if verdict.differing_inputs:
        strict = any("--strict-inputs" in e for e in verdict.errors)
        body = "\n".join([*verdict.input_causes, *([f"({note})"] if (note := cut_note(verdict)) else [])])
        if strict:
            el = ET.SubElement(
                case,
                "failure",
                type="divergent",
                message=cut(
                    "inputs differ across ranks (--strict-inputs): " + " | ".join(verdict.input_causes)
                ),
            )
        else:
            el = ET.SubElement(case, "system-out")
        el.text = body
    pool = kv_pool_line(verdict.rows) if verdict.status != INFRASTRUCTURE_FAILURE else None
    if pool:  # the pool every rank sized and the page it aligns to, passing or not
        ET.SubElement(suite, "system-out").text = pool
    suite.set("tests", str(len(JUNIT_VALUES) + 2))
    suite.set("failures", str(len(suite.findall(".//failure"))))
    suite.set("errors", str(len(suite.findall(".//error"))))
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


# -- GitHub step summary -------------------------------------------------------------------------------


def to_markdown(verdict: Verdict, *, summary: str, plot: str | None = None) -> str:
    lines = [f"### PP capacity preflight: {HEADLINE[verdict.status]}", ""]
    causes = root_cause_lines(verdict)
    if causes:
        lines += [f"**{'Root cause' if _diverged(verdict) else 'Inputs that differ across ranks'}:**", ""]
        lines += [f"- {md_cell(c)}" for c in causes] + [""]
        note = cut_note(verdict)
        lines += [f"({md_cell(note)})", ""] if note else []
    lines += [md_cell(summary), ""]
    if verdict.divergent:
        lines += [
            "**Values that differ across ranks** (one row per group of ranks; share: majority, "
            "outlier, or split when no value has a majority):",
            "",
        ]
        lines += md_table(DIFFERING_HEADERS, differing_rows(verdict)) + [""]
    if verdict.rows and verdict.status != INFRASTRUCTURE_FAILURE:
        odd = {
            n: outliers([getattr(r, n) for r in verdict.rows]) if n in verdict.divergent else set()
            for n in TABLE_VALUES
        }
        if any(odd.values()):
            lines += ["Every rank (**bold**: differs from the majority):", ""]
        else:
            lines += ["Every rank:", ""]
        body = []
        weights = _with_weights(verdict.rows)
        for i, r in enumerate(verdict.rows):
            cells = [f"**{_v(getattr(r, n))}**" if i in odd[n] else _v(getattr(r, n)) for n in TABLE_VALUES]
            layers = f"[{r.start_layer}, {r.end_layer})" if r.start_layer != MISSING else "-"
            extra = [weights_cell(r)] if weights else []
            body.append([r.rank, r.host, _v(r.pp_rank), layers, _v(r.stage_linear_layers), *cells, *extra])
        headers = ["rank", "host", "pp_rank", "layers", "linear", *TABLE_VALUES] + (
            ["weights"] if weights else []
        )
        lines += md_table(headers, body) + [""]
        pool = kv_pool_line(verdict.rows)
        lines += [md_cell(pool), ""] if pool else []
    if plot:
        lines += [
            "Stage picture (--plot, written by rank 0; upload it as an artifact to view it): "
            f"`{md_cell(plot)}`",
            "",
        ]
    for item in verdict.errors:
        lines.append(f"- error: {md_cell(item)}")
    if verdict.status == INFRASTRUCTURE_FAILURE:
        missing = rank_ranges(verdict.missing_ranks) if verdict.missing_ranks else "none identified"
        lines.append(
            f"- infrastructure failure: {md_cell(verdict.infrastructure_detail)}; missing: {missing}"
        )
    for item in verdict.warnings:
        lines.append(f"- warning: {md_cell(item)}")
    lines.append(f"\nverdict: `{verdict.status}` (exit {verdict.exit_code})\n")
    return "\n".join(lines)


# -- writing -------------------------------------------------------------------------------------------


def document(
    verdict: Verdict,
    *,
    summary: str,
    elapsed_s: float,
    extra: Mapping[str, object],
    plot: str | None = None,
    text: bool = True,
) -> Document:
    """check's result, built once for every renderer: the JSON report, the text, the one line, JUnit and
    the step summary. ``plot``: the stage picture written before them (the step summary names it);
    ``text`` False: the ranks' own errors went to stderr, so only the JSON is printed on stdout."""
    return Document(
        lambda: to_json(verdict, extra=extra),
        (lambda: [to_text(verdict, summary=summary, elapsed_s=elapsed_s)]) if text else None,
        (lambda: one_line(verdict)) if text else None,
        junit=lambda: to_junit(verdict, elapsed_s=elapsed_s),
        markdown=lambda: to_markdown(verdict, summary=summary, plot=plot),
    )
