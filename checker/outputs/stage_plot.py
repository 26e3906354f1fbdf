"""The stage picture of ``derive --plot`` and ``check --plot``: one stacked bar per pipeline stage, in GiB
per rank of that stage, with the stage whose own KV capacity sets the pool for all marked.

Each bar, bottom to top (:data:`SEGMENTS`):

* **weights**: the rank's weights figure (the checkpoint's, --weights-gib, or the log's; 0 where none is
  known, which the legend says);
* **state pool**: what the state pool took of the budget: ``budget - kv_available`` (the mamba slots,
  their per-slot extra and the speculative intermediate state, as the release charges them);
* **KV pool**: ``max_total_num_tokens x cell``: the KV tokens every stage holds after the MIN;
* **reserved remainder**: KV bytes the stage had but its own capacity does not use (the floor to whole
  tokens and pages, a --max-total-tokens cap; a stage with no attention layer: all of it);
* **idle (MIN)**: ``(own - max_total_num_tokens) x cell``: what the stage reserved for its own capacity
  that the MIN over the pipeline leaves unused.

The state pool, KV pool, remainder and idle add up to the stage's budget (total_rest_memory). The figures
come from the derived stages (derive) or the gathered rows (check), never from pixels:
:func:`stage_bars` and :func:`row_bars` return them, and every drawn rectangle's gid is
``"stage <k>|<segment>"`` so a test reads the figure back. matplotlib is the optional ``plot`` extra
(:func:`checker.outputs.plot.require_matplotlib`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from checker.core.errors import FlagError
from checker.files import write_file
from checker.outputs.plot import FIG_WIDTH_IN, SAVE_DPI, _matplotlib, title_model
from checker.preflight.resolve import derive_rank_weights

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from checker.config import DeriveConfig
    from checker.core.sizing.row import RankRow
    from checker.core.sizing.sizing import CapacityInputs, StageCapacity

GIB = 2**30
SEGMENTS = ("weights", "state pool", "KV pool", "reserved remainder", "idle (MIN)")
_COLOURS = ("#8c8c8c", "#9467bd", "#1f77b4", "#c6dbef", "#f4a3a8")
_HATCH = ("", "", "", "", "///")


@dataclass(frozen=True, kw_only=True)
class StageBar:
    """One stage's bar, GiB per rank of the stage (:data:`SEGMENTS` order)."""

    pp_rank: int
    weights_gib: float
    state_gib: float
    kv_gib: float
    remainder_gib: float
    idle_gib: float
    limiting: bool
    max_total_num_tokens: int
    kv_own_tokens: int

    @property
    def segments(self) -> tuple[float, ...]:
        return (self.weights_gib, self.state_gib, self.kv_gib, self.remainder_gib, self.idle_gib)


def _bar(
    *,
    pp_rank: int,
    weights_bytes: float,
    budget_gib: float,
    kv_available: int,
    cell: int,
    own: int,
    total: int,
    idle: int,
    limiting: bool,
) -> StageBar:
    used = total * cell
    remainder = max(kv_available - own * cell, 0) if cell else kv_available
    return StageBar(
        pp_rank=pp_rank,
        weights_gib=weights_bytes / GIB,
        state_gib=max(budget_gib - kv_available / GIB, 0.0),
        kv_gib=used / GIB,
        remainder_gib=remainder / GIB,
        idle_gib=idle / GIB,
        limiting=limiting,
        max_total_num_tokens=total,
        kv_own_tokens=own,
    )


def stage_bars(
    stages: Sequence[StageCapacity], budget_gib: float, weights_gib: Sequence[float | None] = ()
) -> list[StageBar]:
    """derive's bars: ``weights_gib[k]`` is stage k's weights per rank (None or missing: not known, 0)."""
    return [
        _bar(
            pp_rank=s.pp_rank,
            weights_bytes=(weights_gib[k] or 0.0) * GIB if k < len(weights_gib) else 0.0,
            budget_gib=budget_gib,
            kv_available=s.kv_available_bytes,
            cell=s.kv_cell_bytes,
            own=s.kv_own_tokens,
            total=s.max_total_num_tokens,
            idle=s.kv_idle_bytes,
            limiting=s.kv_limiting,
        )
        for k, s in enumerate(stages)
    ]


def row_bars(rows: Sequence[RankRow]) -> list[StageBar]:
    """check's bars from the gathered rows: each stage's first rank that derived (the ranks of a stage
    that disagree are the verdict's to name; the picture shows the stage as its first rank sized it)."""
    first: dict[int, RankRow] = {}
    for r in sorted(rows, key=lambda r: r.rank):
        derived = r.budget_gib is not None and r.max_total_num_tokens >= 0 and r.kv_available_bytes >= 0
        if derived and r.pp_rank >= 0 and r.pp_rank not in first:
            first[r.pp_rank] = r
    return [
        _bar(
            pp_rank=k,
            weights_bytes=max(r.weights_bytes, 0),
            budget_gib=float(r.budget_gib or 0.0),
            kv_available=r.kv_available_bytes,
            cell=r.kv_cell_bytes,
            own=r.kv_own_tokens,
            total=r.max_total_num_tokens,
            idle=r.kv_idle_bytes,
            limiting=bool(r.kv_limiting),
        )
        for k, r in sorted(first.items())
    ]


def stage_figure(bars: Sequence[StageBar], title: str, *, weights_known: bool = True) -> Figure:
    """The figure :func:`plot_stages` saves (rectangles' gids: ``"stage <k>|<segment>"``; the limiting
    stage's mark: ``"stage <k>|limiting"``)."""
    Figure, FigureCanvasAgg = _matplotlib()
    fig = Figure(figsize=(FIG_WIDTH_IN, 4.5), dpi=SAVE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = list(range(len(bars)))
    bottoms = [0.0] * len(bars)
    for i, name in enumerate(SEGMENTS):
        heights = [b.segments[i] for b in bars]
        label = name if name != "weights" or weights_known else "weights (not known: 0)"
        drawn = ax.bar(x, heights, bottom=bottoms, color=_COLOURS[i], hatch=_HATCH[i], label=label, width=0.6)
        for b, patch in zip(bars, drawn.patches, strict=True):
            patch.set_gid(f"stage {b.pp_rank}|{name}")
        bottoms = [lo + h for lo, h in zip(bottoms, heights, strict=True)]
    top = max(bottoms, default=0.0) or 1.0
    for xi, b, height in zip(x, bars, bottoms, strict=True):
        if b.limiting:
            text = ax.annotate(
                "limits the KV pool",
                (xi, height),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                color="#b2182b",
                fontweight="bold",
            )
            text.set_gid(f"stage {b.pp_rank}|limiting")
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(x, [f"stage {b.pp_rank}" + (" (limits)" if b.limiting else "") for b in bars])
    ax.set_ylabel("GiB per rank")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=9.5)
    return fig


def plot_stages(
    path: str | Path, bars: Sequence[StageBar], title: str, *, weights_known: bool = True
) -> None:
    """Write the stage picture as a PNG to ``path`` (FlagError, one line, without matplotlib or where
    ``path`` cannot be written)."""
    fig = stage_figure(bars, title, weights_known=weights_known)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi="figure")
    problem = write_file(str(path), png.getvalue(), what="--plot")
    if problem:
        raise FlagError(problem)


def derive_plot(config: DeriveConfig, inputs: CapacityInputs, stages: Sequence[StageCapacity]) -> None:
    """``derive --plot``: the stages' bars with each stage's weights where known (--weights-gib of
    --gpu-free-gib for every stage, else the checkpoint's busiest rank of the stage, else none)."""
    assert config.plot is not None
    weights: list[float | None] = [config.weights_gib] * len(stages)
    if config.weights_gib is None:
        figures = derive_rank_weights(config, inputs, os.environ, required=False)
        group = max(len(figures) // max(len(stages), 1), 1)
        for k in range(len(stages)):
            known = [f.gib for f in figures[k * group : (k + 1) * group] if f.gib is not None]
            weights[k] = max(known) if known else None
    bars = stage_bars(stages, float(inputs.budget_gib), weights)
    title = stage_title(inputs.geometry.name, inputs.pp_size, inputs.tp_size, bars)
    plot_stages(config.plot, bars, title, weights_known=all(w is not None for w in weights))


def check_plot(path: str, rows: Sequence[RankRow]) -> str | None:
    """``check --plot`` on the publishing rank: the gathered rows' bars; the problem line, or None."""
    bars = row_bars(rows)
    if not bars:
        return f"--plot {path}: no rank derived its stage, so there is nothing to draw"
    r0 = min(rows, key=lambda r: r.rank)
    title = stage_title(r0.inputs.get("model") or "model", r0.pp_size, r0.tp_size, bars)
    try:
        plot_stages(path, bars, title, weights_known=all(r.weights_bytes > 0 for r in rows))
    except FlagError as exc:
        return str(exc)
    return None


def stage_title(model: str, pp_size: int, tp_size: int, bars: Sequence[StageBar]) -> str:
    """Model and layout, then the pool every stage holds and who sets it."""
    limiting = [str(b.pp_rank) for b in bars if b.limiting]
    tokens = bars[0].max_total_num_tokens if bars else 0
    who = f", set by stage {', '.join(limiting)}" if limiting else ""
    return (
        f"{title_model(model)}, pp {pp_size} x tp {tp_size}\n"
        f"KV pool after the MIN: {tokens:,} tokens per stage{who}"
    )
