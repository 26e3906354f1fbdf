"""What ``checker derive`` shows: every stage's values (text table or JSON), and for ``--sglang-version
A,B`` the stages under each release side by side.

The JSON uses check's report's names (docs/json-output.md, docs/report.schema.json); a command builds a
:class:`Derivation` or a :class:`ReleaseComparison` and hands it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from checker.config import DeriveConfig
from checker.core.ranks import outliers
from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs, StageCapacity, divergent_values
from checker.engines.drift import Drift, drift_lines
from checker.outputs.header import header
from checker.outputs.jsondoc import json_inputs, json_layout, stage_dict, status_doc, weights_per_rank_doc
from checker.outputs.render import Document
from checker.outputs.tables import fmt_bytes, fmt_int, format_table, mark

if TYPE_CHECKING:
    from checker.device.materialize import MaterializeResult


@dataclass(frozen=True, kw_only=True)
class Derivation:
    """One derive run: what was derived (None: the builtin refused a stage SGLang derives), with what,
    and how it ended."""

    config: DeriveConfig
    inputs: CapacityInputs
    stages: list[StageCapacity] | None
    drifts: list[Drift]
    engine: str
    """builtin, sglang or both (``--engine``)."""
    sglang_version: str | None
    """The SGLang whose own code ran (None for builtin)."""
    who: str = ""
    """Whose code derived, for the engine line (``EngineSet.who()``: says when a release is newer than
    modelled and derived by its own code)."""
    status: str
    exit_code: int
    materialized: list[MaterializeResult] | None = None
    """--materialize: each stage's allocation, in stage order (``device.materialize``'s results)."""
    materialize_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ReleaseComparison:
    """``--sglang-version A,B``: every stage under each release, and why the releases differ."""

    config: DeriveConfig
    first: DeriveConfig
    """The first release's config (its release chosen): what the document's inputs describe."""
    releases: tuple[str, ...]
    inputs: dict[str, CapacityInputs]
    stages: dict[str, list[StageCapacity]]
    """By release; a release whose stages do not boot is in ``errors`` instead."""
    errors: dict[str, str]
    differences: list[dict[str, object]]
    explanations: list[str]


# -- one derivation ------------------------------------------------------------------------------------


def stage_table(stages: list[StageCapacity], materialized: list[MaterializeResult] | None = None) -> str:
    marks = {n: outliers([getattr(s, n) for s in stages]) for n in CHECKED_VALUES}
    rows = [
        [
            s.pp_rank,
            f"[{s.start_layer}, {s.end_layer})",
            s.stage_linear_layers,
            s.kv_attention_layers,
            fmt_int(s.stage_per_req_bytes),
            *(mark(fmt_int(getattr(s, n)), i in marks[n]) for n in CHECKED_VALUES),
            f"{s.kv_budget_gib:.2f}",
            fmt_int(s.kv_own_tokens) + (" <" if s.kv_limiting else ""),
            fmt_int(s.max_total_num_tokens),
            f"{s.kv_idle_bytes / 2**30:.2f}",
            *(
                [fmt_int(materialized[i].predicted_bytes), fmt_int(materialized[i].allocated_bytes)]
                if materialized
                else []
            ),
        ]
        for i, s in enumerate(stages)
    ]
    headers = [
        "pp_rank",
        "layers",
        "linear",
        "attn",
        "stage_per_req_bytes",
        *CHECKED_VALUES,
        "kv_gib_left",
        "kv_own_tokens",
        "max_total_num_tokens",
        "kv_idle_gib",
    ]
    if materialized:
        headers += ["predicted_bytes", "allocated_bytes"]
    return format_table(headers, rows)


def kv_note(stages: list[StageCapacity]) -> str | None:
    """Which stage's own KV capacity sets the pool (``<`` in the table), under pp > 1."""
    limiting = [s.pp_rank for s in stages if s.kv_limiting]
    if len(stages) <= 1 or not limiting:
        return None
    idle = [f"stage {s.pp_rank} {s.kv_idle_bytes / 2**30:.2f} GiB" for s in stages if s.kv_idle_bytes]
    line = (
        f"KV pool: every stage holds max_total_num_tokens {fmt_int(stages[0].max_total_num_tokens)}, the MIN "
        f"of their own capacities, set by stage{'s' if len(limiting) > 1 else ''} "
        f"{', '.join(map(str, limiting))} (<)"
    )
    return line + (f"; idle per rank because of the MIN: {', '.join(idle)}" if idle else "")


def agreement_line(stages: list[StageCapacity]) -> str:
    """derive's one-line answer: every stage agrees (and on what), or which values differ."""
    bad = divergent_values(stages)
    if not bad:
        s = stages[0]
        return (
            f"all {len(stages)} stages agree: max_mamba_cache_size {s.max_mamba_cache_size}, "
            f"max_running_requests {s.max_running_requests}, pp_max_micro_batch_size "
            f"{s.pp_max_micro_batch_size}, max_total_num_tokens {s.max_total_num_tokens}"
        )
    return (
        f"DIVERGENT: {', '.join(bad)} differ across stages (outliers marked *); "
        "stages that disagree disagree on which sequences are in flight"
    )


def engine_lines(d: Derivation) -> list[str]:
    if d.engine == "builtin":
        return []
    if d.engine == "sglang":
        return [f"engine: {d.who} (on CPU, no server)"]
    if not d.drifts:
        return [
            f"engines agree: the builtin model and SGLang {d.sglang_version} derive the same "
            "values on every stage"
        ]
    return ["", *drift_lines(d.drifts, sglang_version=d.sglang_version)]


def derivation_text(d: Derivation) -> list[str]:
    """The lines derive prints."""
    if d.stages is None:  # only the drift to show
        return [header(d.inputs, state=True, policy=True, budget=True, partition=True), ""] + drift_lines(
            d.drifts, sglang_version=d.sglang_version
        )
    lines = [header(d.inputs, state=True, policy=True, budget=True, partition=True)]
    if d.config.budget_formula is not None:
        lines.append(f"budget: {d.config.budget_formula}")
    lines += [
        "",
        stage_table(d.stages, d.materialized),
        "",
    ]
    note = kv_note(d.stages)
    lines += [note] if note else []
    lines.append(agreement_line(d.stages))
    if d.materialized is not None and all(m.ok for m in d.materialized):
        total = sum(m.allocated_bytes for m in d.materialized)
        lines.append(
            f"materialized every stage on {d.materialized[0].device}, one at a time: allocated == "
            f"predicted ({fmt_bytes(total)} in all, {d.materialize_s:.1f} s), all freed"
        )
    return lines + engine_lines(d)


def _inputs_doc(config: DeriveConfig, inputs: CapacityInputs, *, resolved: bool = True) -> dict[str, object]:
    return json_inputs(
        inputs,
        config.sizing,
        config.release,
        budget_gib=float(inputs.budget_gib),
        budget_source=config.budget_source,
        launch_command=config.launch_command,
        resolved=resolved,
    )


def _weights_doc(c: DeriveConfig) -> dict[str, object] | None:
    """--gpu-free-gib: the weights and the --mem-fraction-static the budget used (null without it)."""
    if c.mem_fraction_static is None:
        return None
    return {
        "per_rank": weights_per_rank_doc(c.weights_figures),
        "mem_fraction_static": c.mem_fraction_static,
        "mem_fraction_source": c.mem_fraction_source,
    }


def derivation_doc(d: Derivation) -> dict[str, object]:
    """derive's JSON document (check's report's names)."""
    m = d.materialized
    doc: dict[str, object] = {
        "command": "derive",
        **status_doc(d.status, d.exit_code),
        "layout": json_layout(d.inputs),
        "inputs": _inputs_doc(d.config, d.inputs),
        "geometry": d.inputs.geometry.describe(),
        "ranks": None
        if d.stages is None
        else [stage_dict(s, d.inputs.tp_group_size, m[i] if m else None) for i, s in enumerate(d.stages)],
        "divergent": [] if d.stages is None else divergent_values(d.stages),
        # Who derived (the installed SGLang's version is inputs.sglang_installed) and what drifted.
        "engine": d.engine,
        "drift": [vars(x) for x in d.drifts],
        "weights": _weights_doc(d.config),
    }
    if m is not None:
        doc["materialize"] = {
            "device": m[0].device,
            "ok": all(x.ok for x in m),
            "timings": {"materialize_s": d.materialize_s},
        }
    return doc


# -- releases side by side -----------------------------------------------------------------------------

_SHORT = {
    "max_mamba_cache_size": "pool",
    "max_running_requests": "requests",
    "pp_max_micro_batch_size": "micro-batch",
}


def release_table(c: ReleaseComparison) -> str:
    stages = next(iter(c.stages.values()), [])
    headers = ["pp_rank", "layers", *(f"{_SHORT[n]} {v}" for n in CHECKED_VALUES for v in c.releases)]
    rows = []
    for k, s in enumerate(stages):
        cells: list[object] = [k, f"[{s.start_layer}, {s.end_layer})"]
        for n in CHECKED_VALUES:
            values = [getattr(c.stages[v][k], n) if v in c.stages else None for v in c.releases]
            differ = len(set(values)) > 1
            cells += [mark("-" if x is None else fmt_int(x), differ) for x in values]
        rows.append(cells)
    return format_table(headers, rows)


def comparison_text(c: ReleaseComparison, *, tables: bool = True) -> list[str]:
    """The lines ``derive --sglang-version A,B`` prints (``tables`` False, ``--quiet``: the answer)."""
    lines: list[str] = []
    both = " and ".join(c.releases)
    if tables:
        # No policy on the header: each release derives with its own unless --policy.
        lines += [header(c.inputs[c.releases[-1]], state=True, budget=True, partition=True), ""]
        lines += [release_table(c), ""]
    if not c.differences and not c.errors:
        return [*lines, f"SGLang {both} derive the same values on every stage: ranks on either release agree"]
    names = sorted({str(d["value"]) for d in c.differences})
    lines.append(
        f"SGLang {both} derive different {', '.join(names) or 'outcomes'}: a cluster "
        "running both during a rolling upgrade disagrees on which sequences are in flight"
    )
    lines += [f"  SGLang {version}: does not boot: {err}" for version, err in c.errors.items()]
    return lines + [f"  why: {line}" for line in c.explanations]


def comparison_doc(c: ReleaseComparison, *, status: str) -> dict[str, object]:
    first = c.inputs[c.releases[0]]
    described = _inputs_doc(c.first, first, resolved=False)
    described["derived_as"] = None  # one per release: by_release.<release>.derived_as
    return {
        "command": "derive",
        **status_doc(status, 0),
        "layout": json_layout(first),
        "inputs": described,
        "geometry": first.geometry.describe(),
        "releases": list(c.releases),
        "by_release": {
            v: {
                "derived_as": f"{c.inputs[v].release.label} (--sglang-version)",
                "resolved_policy": c.inputs[v].resolved_policy,
                "ranks": [stage_dict(s, first.tp_group_size) for s in c.stages[v]] if v in c.stages else None,
                "error": c.errors.get(v),
            }
            for v in c.releases
        },
        "differences": c.differences,
        "explanations": c.explanations,
    }


def derivation_document(d: Derivation) -> Document:
    """derive's result for every renderer; ``--quiet``: the one-line answer (the drift, where there are
    no stages)."""
    stages = d.stages
    return Document(
        lambda: derivation_doc(d),
        lambda: derivation_text(d),
        (lambda: "\n".join(derivation_text(d))) if stages is None else (lambda: agreement_line(stages)),
    )


def comparison_document(c: ReleaseComparison, *, status: str) -> Document:
    """``derive --sglang-version A,B``'s result; ``--quiet``: the answer without the tables."""
    return Document(
        lambda: comparison_doc(c, status=status),
        lambda: comparison_text(c),
        lambda: "\n".join(comparison_text(c, tables=False)),
    )
