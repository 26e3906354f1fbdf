"""What ``checker plan`` shows, in text and JSON: the smallest budget per policy for a running-request
target (:class:`TargetPlan`), the same under each release of ``--sglang-version A,B``
(:class:`ReleaseTargets`), or a layer partition against the default split (:class:`PartitionPlan`).

The JSON uses check's report's names (docs/json-output.md, docs/report.schema.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from checker.config import DeriveConfig, PlanConfig
from checker.core.sizing.partition import PARTITION_ENV
from checker.core.sizing.planning import MemFraction, MinBudget, SuggestedPartition
from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs, StageCapacity
from checker.engines.drift import Drift, drift_lines
from checker.families.weights_source import DraftSource
from checker.outputs.header import header
from checker.outputs.jsondoc import json_inputs, json_layout, stage_dict, status_doc, weights_per_rank_doc
from checker.outputs.render import Document
from checker.outputs.tables import fmt_int, format_table
from checker.preflight.resolve import chosen
from checker.status import CONSISTENT, DIVERGENT, EXIT_CODES, MODEL_DRIFT

if TYPE_CHECKING:
    from checker.core.sizing.kv_partition import KvChoice
    from checker.core.weights.weights import RankWeights
    from checker.families.weights_source import RankWeightsFigure


@dataclass(frozen=True, kw_only=True)
class _EngineFindings:
    drifts: list[Drift]
    """--engine both: where SGLang's own answer differs from the builtin model's."""
    sglang_version: str | None
    """The SGLang whose own code ran (None for builtin)."""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[MODEL_DRIFT] if self.drifts else 0

    @property
    def status(self) -> str:
        return MODEL_DRIFT if self.drifts else CONSISTENT


@dataclass(frozen=True, kw_only=True)
class AssumedWeights:
    """The weights a --mem-fraction-static assumes on the busiest rank, and where they came from."""

    gib: float
    source: str
    """``flag`` (--weights-gib), ``log`` (--weights-from-log), ``checkpoint`` or ``config`` (config.json
    alone, no shards)."""
    note: str | None = None
    """--weights-from-log: which log line the figure is (the largest mem usage, and its prefix)."""
    rank: int | None = None
    """The busiest rank (checkpoint): the one whose figure the fraction uses."""
    figures: tuple[RankWeightsFigure, ...] = ()
    """Every rank's figure (checkpoint)."""
    detail: RankWeights | None = None
    """The busiest rank's parts."""

    def line(self) -> str:
        inside = any(f.draft_source != DraftSource.NONE for f in self.figures)
        inside_words = ", the speculative draft inside it" if inside else ""
        if self.source == "flag":
            return f"weights {self.gib:.2f} GiB on the busiest rank (--weights-gib{inside_words})"
        if self.source == "log":
            return f"weights {self.gib:.2f} GiB on the busiest rank ({self.note}, --weights-from-log)"
        d = self.detail
        parts = ""
        if d is not None:
            p = d.by_part
            named = [(k, p[k]) for k in ("embed", "layers", "head", "vision") if p[k]]
            parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in named)
            params, margin = d.param_bytes / 2**30, d.margin_bytes / 2**30
            parts = f": parameters {params:.2f} GiB ({parts}) + margin {margin:.2f}"
            if d.draft_bytes:  # the speculative draft the rank loads before the pool is sized
                draft = (
                    self.figures[self.rank].draft_source if self.rank is not None and self.figures else None
                )
                where = f" from {draft.label}" if draft is not None and draft.label else ""
                parts += f" + speculative draft {d.draft_bytes / 2**30:.2f}{where}"
            if d.note:  # an assumption the figure rests on (the Marlin SMs)
                parts += f"; {d.note}"
        return (
            f"weights {self.gib:.2f} GiB on the busiest rank, rank {self.rank} (from "
            f"{'config.json, no shards' if self.source == 'config' else 'the checkpoint'}{parts}; "
            "--weights-gib overrides)"
        )

    def doc(self) -> dict[str, object]:
        return {
            "gib": self.gib,
            "source": self.source,
            "busiest_rank": self.rank,
            "per_rank_gib": [f.gib for f in self.figures] if self.figures else None,
            "per_rank": weights_per_rank_doc(self.figures) if self.figures else None,
        }


@dataclass(frozen=True, kw_only=True)
class TargetPlan(_EngineFindings):
    """The smallest budget for the target, per policy."""

    config: PlanConfig
    inputs: CapacityInputs
    """Derived with the first policy searched: the header's and the JSON inputs'."""
    results: list[MinBudget]
    fractions: dict[str, MemFraction | None]
    """By policy: the --mem-fraction-static reaching its budget (None without --gpu-free-gib)."""
    own_policy: str = "max-share"
    """The charging policy the release derives with (its own; marked among several)."""
    weights: AssumedWeights | None = None


@dataclass(frozen=True, kw_only=True)
class PartitionPlan(_EngineFindings):
    """The partition with the fewest linear layers on the busiest stage, against the default split."""

    config: PlanConfig
    inputs: CapacityInputs
    """With the default split (the partition set here, if any, is ``user_env``)."""
    user_env: str | None
    slack: int
    partition: SuggestedPartition
    suggested: list[StageCapacity] | None
    default: list[StageCapacity] | None
    default_error: str | None
    """Why the default split does not boot (None when it does)."""
    kv: KvChoice | None = None
    """The KV objective's finding at the budget (checker.core.sizing.kv_partition; None: nothing to add)."""


@dataclass(frozen=True, kw_only=True)
class ReleaseTargets:
    """The smallest budget for the target under each release of ``--sglang-version A,B``."""

    config: PlanConfig
    first: DeriveConfig
    """The first release's config (its release chosen): what the document's inputs describe."""
    releases: tuple[str, ...]
    inputs: dict[str, CapacityInputs]
    results: dict[str, MinBudget]
    fractions: dict[str, MemFraction | None]
    explanations: list[str]

    @property
    def differ(self) -> bool:
        return len({r.budget_gib for r in self.results.values()}) > 1


def _span(stages: list[StageCapacity], name: str) -> str:
    """One value when every stage agrees, else ``lo..hi *`` (own-share's stages differ)."""
    values = [getattr(s, name) for s in stages]
    lo, hi = min(values), max(values)
    return fmt_int(lo) if lo == hi else f"{fmt_int(lo)}..{fmt_int(hi)} *"


def fraction_text(f: MemFraction) -> str:
    if f.value is None:
        return f"no --mem-fraction-static reaches {f.budget_gib:.2f} GiB: {f.formula}"
    return f"--mem-fraction-static {f.value:.3f} ({f.formula})"


def fraction_doc(f: MemFraction | None) -> dict[str, object] | None:
    return None if f is None else {"value": f.value, "budget_gib": f.budget_gib, "formula": f.formula}


def engine_lines(config: PlanConfig, findings: _EngineFindings) -> list[str]:
    mode, version = chosen(config.derive).engine, findings.sglang_version
    if mode == "sglang":
        return ["", f"engine: SGLang {version}'s own sizing code derived every value above"]
    if mode == "both" and not findings.drifts:
        return ["", f"engines agree: the builtin model and SGLang {version} give the same answers"]
    if findings.drifts:
        return ["", *drift_lines(findings.drifts, sglang_version=version)]
    return []


def _engine_doc(config: PlanConfig, findings: _EngineFindings) -> dict[str, object]:
    """Who derived (the installed SGLang's version is ``inputs.sglang_installed``) and what drifted."""
    return {"engine": chosen(config.derive).engine, "drift": [vars(d) for d in findings.drifts]}


def _inputs_doc(
    d: DeriveConfig,
    inputs: CapacityInputs,
    *,
    budget_source: str | None,
    budget_gib: float | None = None,
    resolved: bool = True,
) -> dict[str, object]:
    return json_inputs(
        inputs,
        d.sizing,
        d.release,
        budget_source=budget_source,
        budget_gib=budget_gib,
        resolved=resolved,
        launch_command=d.launch_command,
    )


# -- the smallest budget for a target ------------------------------------------------------------------


def _below_text(result: MinBudget) -> str:
    if result.below is None:
        return "does not boot"
    worst = min(result.below, key=lambda s: s.max_running_requests)
    return f"{worst.max_running_requests} (stage {worst.pp_rank})"


def target_text(p: TargetPlan, *, head: bool = True) -> list[str]:
    """``head`` False (``--quiet``): without the inputs' header."""
    c, inputs, target = p.config, p.inputs, p.config.target_max_running_requests
    lines = [header(inputs)] if head else []
    if inputs.partition_env and inputs.pp_size > 1:
        lines.append(f"{PARTITION_ENV}={inputs.partition_env}")
    lines += [f"target: every stage derives max_running_requests >= {target}", ""]

    def name(policy: str) -> str:
        own = policy == p.own_policy and len(p.results) > 1
        return f"{policy} (SGLang {inputs.release.version}'s own)" if own else policy

    rows = [
        [
            name(r.policy),
            f"{r.budget_gib:.2f}",
            *(_span(r.stages, n) for n in CHECKED_VALUES),
            f"{r.below_budget_gib:.2f}",
            _below_text(r),
        ]
        for r in p.results
    ]
    headers = ["policy", "min_budget_gib", *CHECKED_VALUES, "0.01 GiB less", "max_running_requests there"]
    lines.append(format_table(headers, rows))
    if any(len({getattr(s, n) for s in r.stages}) > 1 for r in p.results for n in CHECKED_VALUES):
        lines += ["", "* differs across stages (own-share): the lowest stage is the one the target binds"]
    if len(p.results) == 1 and p.results[0].policy == p.own_policy and not c.derive.sizing.policy:
        lines += [
            "",
            f"policy: {p.own_policy}, SGLang {inputs.release.version}'s own (--all-policies: all three)",
        ]
    if any(f is not None for f in p.fractions.values()):
        assert p.weights is not None
        w = p.weights
        note = f" ({w.note})" if w.note else ""
        lines += [
            "",
            f"as --mem-fraction-static, with {c.gpu_free_gib:g} GiB free before {w.gib:g} GiB of "
            f"weights{note} ({inputs.release.label}):",
        ]
        if w.source in ("checkpoint", "config"):
            lines.append(f"  {w.line()}")
        lines += [
            f"  {name(policy)}: {fraction_text(f)}" for policy, f in p.fractions.items() if f is not None
        ]
    return lines + engine_lines(c, p)


def target_doc(p: TargetPlan) -> dict[str, object]:
    inputs, tp = p.inputs, p.inputs.tp_group_size
    described = _inputs_doc(p.config.derive, inputs, budget_source=None)
    del described["resolved_policy"]  # one per policy: the keys of `policies`
    return {
        "command": "plan",
        **status_doc(p.status, p.exit_code),
        "layout": json_layout(inputs),
        "inputs": described,  # budget_gib null: searched; policy as given (null: all three)
        "geometry": inputs.geometry.describe(),
        "target_max_running_requests": p.config.target_max_running_requests,
        "min_budget_gib": {r.policy: r.budget_gib for r in p.results},
        "mem_fraction_static": {k: fraction_doc(f) for k, f in p.fractions.items() if f is not None},
        "own_policy": p.own_policy,
        "weights": None if p.weights is None else p.weights.doc(),
        **_engine_doc(p.config, p),
        "policies": {
            r.policy: {
                "min_budget_gib": r.budget_gib,
                "ranks": [stage_dict(s, tp) for s in r.stages],
                "below": {
                    "budget_gib": r.below_budget_gib,
                    "ranks": None if r.below is None else [stage_dict(s, tp) for s in r.below],
                    "error": r.below_error,
                },
            }
            for r in p.results
        },
    }


# -- the same under each release -----------------------------------------------------------------------


def releases_text(p: ReleaseTargets, *, head: bool = True) -> list[str]:
    target = p.config.target_max_running_requests
    lines = [header(p.inputs[p.releases[-1]])] if head else []
    lines += [f"target: every stage derives max_running_requests >= {target}, under each release", ""]
    rows = []
    for v, r in p.results.items():
        f = p.fractions[v]
        fraction = "-" if f is None else (f"{f.value:.3f}" if f.value else "unreachable")
        spans = [_span(r.stages, n) for n in CHECKED_VALUES]
        rows.append([v, r.policy, f"{r.budget_gib:.2f}", *spans, fraction])
    lines.append(
        format_table(["release", "policy", "min_budget_gib", *CHECKED_VALUES, "mem_fraction_static"], rows)
    )
    if not p.differ:
        return [*lines, "", "every release needs the same budget for this target"]
    lines += [
        "",
        "the releases need different budgets for the same target: size the deployment for the larger "
        "one while both run, and do not mix them in one deployment",
    ]
    return lines + [f"  why: {line}" for line in p.explanations]


def releases_doc(p: ReleaseTargets) -> dict[str, object]:
    first = p.inputs[p.releases[0]]
    return {
        "command": "plan",
        **status_doc(DIVERGENT if p.differ else CONSISTENT, 0),
        "layout": json_layout(first),
        "inputs": _inputs_doc(p.first, first, budget_source=None, resolved=False),
        "geometry": first.geometry.describe(),
        "target_max_running_requests": p.config.target_max_running_requests,
        "releases": list(p.releases),
        "by_release": {
            v: {
                "derived_as": p.inputs[v].release.label,
                "resolved_policy": r.policy,
                "min_budget_gib": r.budget_gib,
                "ranks": [stage_dict(s, first.tp_group_size) for s in r.stages],
                "mem_fraction_static": fraction_doc(p.fractions[v]),
            }
            for v, r in p.results.items()
        },
        "explanations": p.explanations,
    }


# -- a partition against the default split -------------------------------------------------------------


def partition_text(p: PartitionPlan, *, head: bool = True) -> list[str]:
    base, plan, policy = p.inputs, p.partition, p.inputs.resolved_policy
    lines = [header(base)] if head else []
    lines.append(
        f"policy {policy}; budget {base.budget_gib:g} GiB; each stage holds {plan.bounds.lower} to "
        f"{plan.bounds.upper} layers (slack {p.slack})"
    )
    if p.user_env and base.pp_size > 1:
        lines.append(f"(ignoring the {PARTITION_ENV}={p.user_env} set here: compared with the default split)")
    lines.append("")

    def row(
        name: str, parts: tuple[int, ...], counts: list[int], stages: list[StageCapacity] | None
    ) -> list[str]:
        values = [_span(stages, n) for n in CHECKED_VALUES] if stages else ["does not boot", "", ""]
        return [name, ",".join(map(str, parts)), ",".join(map(str, counts)), str(max(counts)), *values]

    rows = [
        row("default split", plan.default_partition, plan.default_stage_linear_layers, p.default),
        row("suggested", plan.partition, plan.stage_linear_layers, p.suggested),
    ]
    lines += [
        format_table(["", "layers per stage", "linear per stage", "largest", *CHECKED_VALUES], rows),
        "",
    ]
    kv = [p.kv.line()] if p.kv is not None else []
    if plan.partition == plan.default_partition:
        lines.append(
            f"no change needed: the default split already has the fewest linear layers on its busiest "
            f"stage ({plan.largest_stage_linear_layers}); leave {PARTITION_ENV} unset on every node"
        )
        return lines + kv + engine_lines(p.config, p)
    lines += kv
    if p.default is None:
        lines.append(f"the default split does not boot at this budget: {p.default_error}")
    elif (
        p.suggested is not None
        and plan.largest_stage_linear_layers != plan.default_largest_stage_linear_layers
    ):
        # The smallest stage pool is what binds (all stages agree under max-share).
        before = min(s.max_mamba_cache_size for s in p.default)
        after = min(s.max_mamba_cache_size for s in p.suggested)
        lines.append(
            f"busiest stage {plan.default_largest_stage_linear_layers} -> "
            f"{plan.largest_stage_linear_layers} linear layers: max_mamba_cache_size {before} -> {after} "
            f"({(after - before) / before:+.1%}) under {policy}"
        )
    if p.suggested is not None:
        lines += [
            "",
            "to use it, every node must set, identically (the preflight checks that they do):",
            f"  export {PARTITION_ENV}={plan.env}",
        ]
    return lines + engine_lines(p.config, p)


def _split_doc(
    parts: tuple[int, ...],
    counts: list[int],
    stages: list[StageCapacity] | None,
    error: str | None,
    *,
    env: str | None,
    group_size: int,
) -> dict[str, object]:
    return {
        PARTITION_ENV: env,
        "layers_per_stage": list(parts),
        "stage_linear_layers": counts,
        "max_stage_linear_layers": max(counts),
        "ranks": None if stages is None else [stage_dict(s, group_size) for s in stages],
        "error": error,
    }


def partition_doc(p: PartitionPlan) -> dict[str, object]:
    base, plan, tp = p.inputs, p.partition, p.inputs.tp_group_size
    described = _inputs_doc(
        p.config.derive, base, budget_gib=float(base.budget_gib), budget_source=p.config.derive.budget_source
    )
    described[PARTITION_ENV] = p.user_env  # as set here; the comparison is with the default split
    return {
        "command": "plan",
        **status_doc(p.status, p.exit_code),
        "layout": json_layout(base),
        "inputs": described,
        "geometry": base.geometry.describe(),
        PARTITION_ENV: plan.env,
        "partition_slack": p.slack,
        "layers_per_stage_bounds": [plan.bounds.lower, plan.bounds.upper],
        "suggested": _split_doc(
            plan.partition, plan.stage_linear_layers, p.suggested, None, env=plan.env, group_size=tp
        ),
        "default": _split_doc(
            plan.default_partition,
            plan.default_stage_linear_layers,
            p.default,
            p.default_error,
            env=None,
            group_size=tp,
        ),
        "kv_objective": None
        if p.kv is None
        else {
            PARTITION_ENV: p.kv.env,
            "adopted": p.kv.adopted,
            "kv_binds_requests": p.kv.kv_binds,
            "max_total_num_tokens": [p.kv.tokens_before, p.kv.tokens_after],
            "max_running_requests": [p.kv.requests_before, p.kv.requests_after],
        },
        **_engine_doc(p.config, p),
    }


def target_document(p: TargetPlan) -> Document:
    """``plan --target-max-running-requests``'s result; ``--quiet``: the text without its header."""
    return Document(
        lambda: target_doc(p), lambda: target_text(p), lambda: "\n".join(target_text(p, head=False))
    )


def releases_document(p: ReleaseTargets) -> Document:
    return Document(
        lambda: releases_doc(p), lambda: releases_text(p), lambda: "\n".join(releases_text(p, head=False))
    )


def partition_document(p: PartitionPlan) -> Document:
    return Document(
        lambda: partition_doc(p), lambda: partition_text(p), lambda: "\n".join(partition_text(p, head=False))
    )
