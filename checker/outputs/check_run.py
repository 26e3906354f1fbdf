"""What check's report says of its run beside the verdict: the summary line atop the text report and
the weights figures the budget used (the JSON report's ``weights_gib``, which the post-flight holds each
rank's logged ``mem usage`` to).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from checker.config import PreflightConfig
from checker.core.sizing.row import RankRow
from checker.families.weights_source import WeightsSource


def summary_line(config: PreflightConfig, row: RankRow, *, world_size: int, backend: str) -> str:
    """The first line of check's text report: the world and its layout, the backend, the model, the
    budget, the release (and policy) derived as."""
    c = config
    # Only what is known: a rank that failed before laying out the world or resolving its budget,
    # model or release says what it was given instead (never a "?" for a value the user passed).
    w, tp, dp = world_size, c.sizing.tp_size, c.sizing.dp_size
    # The TP group, SGLang's --tp-size: attention TP x attention DP (the checker's --tp-size is the
    # attention TP width).
    group = f"tp {tp}" if dp == 1 else f"tp {c.sizing.tp_group_size} (attention TP {tp} x DP {dp})"
    given = f"--tp-size {tp}" if dp == 1 else group
    if row.pp_size > 0:
        layout = f"world {w} = pp {row.pp_size} x {group}"
    elif c.sizing.pp_size:
        layout = f"world {w}, --pp-size {c.sizing.pp_size} x {given} given"
    else:
        layout = f"world {w}, {given}"
    if row.budget_gib is not None:
        budget = f"budget {row.budget_gib:.6g} GiB ({c.budget.label})"
    elif c.budget.budget_gib is not None:
        budget = f"budget {c.budget.budget_gib:g} GiB ({c.budget.label})"
    else:
        budget = f"budget from {c.budget.label}"
    model = row.inputs.get("model") or c.model.label
    parts = [f"{layout}, {backend}", f"{model}, {budget}"]
    release = row.inputs.get("derived_as")
    if release:
        parts.append(release + (f", policy {c.sizing.policy}" if c.sizing.policy else ""))
    elif c.sizing.policy:
        parts.append(f"policy {c.sizing.policy}")
    return "; ".join(parts)


def weights_doc(config: PreflightConfig | None, rows: Sequence[RankRow] = ()) -> dict[str, object]:
    """The weights figures the budget used, whole (the ranks' ``budget_source`` text is cut at the wire's
    width): what the post-flight holds each rank's logged ``mem usage`` to. Empty without a device
    budget. Figures from the checkpoint are each rank's own, from the rows (rank order)."""
    if config is None or not config.budget.from_device:
        return {}
    b = config.budget
    derived = (int(WeightsSource.CHECKPOINT), int(WeightsSource.CONFIG))
    if not b.weights_gib and rows and all(r.weights_source in derived for r in rows):
        figures = [r.weights_bytes / 2**30 for r in sorted(rows, key=lambda r: r.rank)]
        return {
            "weights_gib": [round(f, 6) for f in figures],
            "weights_source": f"{WeightsSource(rows[0].weights_source).words}: each rank's parameters as its "
            "release's class holds them, plus the stated margin",
        }
    return {
        "weights_gib": list(b.weights_gib) or [0.0],
        "weights_source": b.weights_source or ("--weights-gib" if b.weights_gib else "none (0 GiB)"),
    }


def run_timings(run: Mapping[str, float], derived: Mapping[str, float], total_s: float) -> dict[str, float]:
    """The report's timings in the order the run took them: start-up (the run's ``init_s``), the
    derivation's, the exchange's (the run's others), all."""
    started = {k: v for k, v in run.items() if k == "init_s"}
    return {**started, **derived, **run, "total_s": total_s}


def torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "?"))
