"""What ``checker plan --target-tokens N`` / ``--target-requests R`` shows (text and JSON): per policy,
the smallest budget that meets the target, every stage's KV pool there and 0.01 GiB below, the stage whose
own capacity sets the pool (the MIN), and with --gpu-free-gib the --mem-fraction-static that reaches it."""

from __future__ import annotations

from dataclasses import dataclass

from checker.config import PlanConfig
from checker.core.sizing.partition import PARTITION_ENV
from checker.core.sizing.planning import MemFraction
from checker.core.sizing.sizing import CapacityInputs, StageCapacity
from checker.core.sizing.token_plan import TokenBudget, TokenTarget
from checker.outputs.header import header
from checker.outputs.jsondoc import json_layout, stage_dict, status_doc
from checker.outputs.plan import AssumedWeights, _inputs_doc, fraction_doc, fraction_text
from checker.outputs.render import Document
from checker.outputs.tables import fmt_int, format_table
from checker.status import CONSISTENT


@dataclass(frozen=True, kw_only=True)
class TokenPlan:
    config: PlanConfig
    inputs: CapacityInputs
    target: TokenTarget
    results: list[TokenBudget]
    fractions: dict[str, MemFraction | None]
    own_policy: str
    weights: AssumedWeights | None
    search_s: float


def _there(target: TokenTarget, stages: list[StageCapacity] | None) -> str:
    """What the budget 0.01 GiB below gives, and which half of the target it misses."""
    if stages is None:
        return "does not boot"
    T = min(s.max_total_num_tokens for s in stages)
    n = min(s.max_running_requests for s in stages)
    short = []
    if T < target.tokens_needed:
        short.append("tokens")
    if target.requests is not None and n < target.requests:
        short.append("requests")
    return f"{fmt_int(T)} tokens, {n} requests (short of {' and '.join(short)})"


def token_text(p: TokenPlan, *, head: bool = True) -> list[str]:
    """``head`` False (``--quiet``): without the inputs' header."""
    c, inputs = p.config, p.inputs
    lines = [header(inputs)] if head else []
    if inputs.partition_env and inputs.pp_size > 1:
        lines.append(f"{PARTITION_ENV}={inputs.partition_env}")
    lines += [f"target: {p.target.label}", ""]
    rows = [
        [
            r.policy + (" (own)" if r.policy == p.own_policy and len(p.results) > 1 else ""),
            f"{r.budget_gib:.2f}",
            fmt_int(min(s.max_total_num_tokens for s in r.stages)),
            fmt_int(min(s.max_running_requests for s in r.stages)),
            ", ".join(map(str, r.limiting)) or "-",
            f"{r.below_budget_gib:.2f}",
            _there(p.target, r.below),
        ]
        for r in p.results
    ]
    headers = ["policy", "min_budget_gib", "max_total_num_tokens", "max_running_requests", "limiting stage"]
    lines.append(format_table([*headers, "0.01 GiB less", "there"], rows))
    for r in p.results:
        idle = [f"stage {s.pp_rank} {s.kv_idle_bytes / 2**30:.2f}" for s in r.stages if s.kv_idle_bytes]
        if idle:
            lines.append(
                f"{r.policy}: GiB idle per rank at that budget because of the MIN: {', '.join(idle)}"
            )
    if any(f is not None for f in p.fractions.values()):
        assert p.weights is not None
        lines += [
            "",
            f"as --mem-fraction-static, with {c.gpu_free_gib:g} GiB free before {p.weights.gib:g} GiB",
        ]
        lines += [f"  {policy}: {fraction_text(f)}" for policy, f in p.fractions.items() if f is not None]
    lines.append(f"searched in {p.search_s * 1000:.0f} ms ({sum(r.evaluations for r in p.results)} budgets)")
    return lines


def token_doc(p: TokenPlan) -> dict[str, object]:
    inputs, tp = p.inputs, p.inputs.tp_group_size
    described = _inputs_doc(p.config.derive, inputs, budget_source=None)
    del described["resolved_policy"]
    return {
        "command": "plan",
        **status_doc(CONSISTENT, 0),
        "layout": json_layout(inputs),
        "inputs": described,
        "geometry": inputs.geometry.describe(),
        "target_tokens": p.target.tokens,
        "target_requests": p.target.requests,
        "target_context_len": p.target.context,
        "min_budget_gib": {r.policy: r.budget_gib for r in p.results},
        "mem_fraction_static": {k: fraction_doc(f) for k, f in p.fractions.items() if f is not None},
        "own_policy": p.own_policy,
        "weights": None if p.weights is None else p.weights.doc(),
        "policies": {
            r.policy: {
                "min_budget_gib": r.budget_gib,
                "limiting_stages": r.limiting,
                "ranks": [stage_dict(s, tp) for s in r.stages],
                "below": {
                    "budget_gib": r.below_budget_gib,
                    "ranks": None if r.below is None else [stage_dict(s, tp) for s in r.below],
                    "error": r.below_error,
                },
            }
            for r in p.results
        },
        "timings": {"search_s": p.search_s},
    }


def token_document(p: TokenPlan) -> Document:
    """``plan --target-tokens``'s result; ``--quiet``: the text without its header."""
    return Document(lambda: token_doc(p), lambda: token_text(p), lambda: "\n".join(token_text(p, head=False)))
