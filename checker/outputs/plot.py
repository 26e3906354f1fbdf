"""The sweep plot: every checked value per stage against budget, one row per policy, every event marked.

Each policy gets a row of three panels, one per checked value (max_mamba_cache_size,
max_running_requests, pp_max_micro_batch_size), and a headline that says in words whether its stages
diverge. Stages that derive the same values at every budget share one line. Shaded bands mark the
budgets where a value differs across stages, where no stage can boot, and where some stages boot and
others do not; a band is never narrower than :data:`MIN_MARK_FRACTION` of the budget axis, so a single
budget out of hundreds still shows.

The figure is laid out for GitHub's 800 px README column: 8 inches wide with fonts and lines sized for
100 px per inch there, saved at :data:`SAVE_DPI` so it stays sharp on denser screens.

matplotlib is an optional extra (the ``plot`` extra; :func:`install_hint` says how to get it from where
the checker runs), imported only when a plot is asked for, so the checker itself needs nothing but torch.
"""

from __future__ import annotations

import importlib.metadata
import io
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from checker.core.errors import FlagError
from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs
from checker.core.sizing.sweep import BudgetGrid, PolicySummary, SweepSummary, budget_runs
from checker.files import write_file

if TYPE_CHECKING:  # matplotlib (and numpy, its dependency) are imported only when a plot is drawn
    import numpy as np
    import numpy.typing as npt
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure, SubFigure

FIG_WIDTH_IN = 8.0
"""GitHub shows a README image at most about 800 px wide: 8 inches at 100 px per inch."""
SAVE_DPI = 160
"""1280 px wide: sharp at 800 px on denser screens, and about 230 kB for the README's three policies."""
MIN_MARK_FRACTION = 0.025
"""Narrowest band drawn, as a fraction of the budget axis: about 5 px of a 200 px panel at 800 px."""

DIFFERS, NO_BOOT, PARTIAL_BOOT = "differs", "no boot", "partial boot"


class _BandStyle(TypedDict, total=False):
    """A band's keyword arguments to ``axvspan`` (a legend's ``Patch`` takes them less ``zorder``)."""

    facecolor: str
    edgecolor: str
    alpha: float
    hatch: str
    lw: float
    zorder: float


_MARK_STYLE: dict[str, _BandStyle] = {
    DIFFERS: {"facecolor": "#f4a3a8", "edgecolor": "none", "alpha": 0.75, "zorder": 0.5},
    NO_BOOT: {"facecolor": "#9e9e9e", "edgecolor": "#252525", "hatch": "///", "lw": 0, "zorder": 0.6},
    PARTIAL_BOOT: {"facecolor": "#fdb863", "edgecolor": "#b35806", "hatch": "xx", "lw": 0, "zorder": 0.7},
}
_MARK_LEGEND = {
    DIFFERS: "value differs across stages",
    NO_BOOT: "no stage boots",
    PARTIAL_BOOT: "some stages boot, others do not",
}
# Line colours with no red in them (red is the "differs" band); linestyles cycle too, so two groups
# that coincide over a stretch of budgets still show as two lines.
_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")
_STYLES = ("-", (0, (4, 2)), (0, (1, 1.5)), "-.")
_RED = "#b2182b"


@dataclass(frozen=True)
class Mark:
    """One band drawn in a policy's panels."""

    kind: str
    """:data:`DIFFERS`, :data:`NO_BOOT` or :data:`PARTIAL_BOOT`."""
    value: str | None
    """The checked value a DIFFERS band is drawn for; None for boot bands (drawn in every panel)."""
    budgets_gib: tuple[float, ...]
    """The flagged budgets this band covers (neighbouring runs merge once their bands would touch)."""
    x0: float
    x1: float
    """The band's extent in GiB: the budgets' grid cells, widened to the minimum width."""


DIST_NAME = "pp-capacity-checker"
"""The project's distribution name (pyproject.toml). It is not published on PyPI, so a hint never says
``pip install 'pp-capacity-checker[plot]'``: that only works where the name resolves."""
TITLE_MODEL_CHARS = 72
"""The longest model name a plot title shows: with the layout after it, one line of the 8 in figure at
9.5 pt (about 110 characters; tested)."""


def install_hint(*, source_root: Path | None = None, cwd: Path | None = None) -> str:
    """How to install the 'plot' extra from where the user stands: from a clone (the package next to the
    project's pyproject.toml), the clone with its extra (``'.[plot]'`` from its root); from an installed
    distribution, the extra's own requirements (matplotlib), which need no package index to know the
    checker's name."""
    root = Path(__file__).resolve().parents[2] if source_root is None else source_root
    pyproject = root / "pyproject.toml"
    try:
        clone = f'name = "{DIST_NAME}"' in pyproject.read_text(errors="replace")
    except OSError:
        clone = False
    if clone:
        here = (cwd or Path.cwd()).resolve()
        target = "." if here == root.resolve() else str(root)
        return f"pip install {shlex.quote(target + '[plot]')}"
    try:
        requires = importlib.metadata.requires(DIST_NAME) or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    extra = [r.split(";")[0].strip() for r in requires if re.search(r"""extra\s*==\s*['"]plot['"]""", r)]
    return "pip install " + " ".join(shlex.quote(r) for r in extra or ["matplotlib"])


def _matplotlib() -> tuple[type[Figure], type[FigureCanvasAgg]]:
    try:
        # The Agg canvas directly, never pyplot: no window, no global backend state on headless nodes.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise FlagError(f"--plot needs matplotlib (the 'plot' extra): {install_hint()}") from None
    return Figure, FigureCanvasAgg


def require_matplotlib() -> None:
    """Refuse --plot before the sweep runs (FlagError, one line) where matplotlib cannot be imported: a
    refusal after the findings printed would contradict the verdict line above it."""
    _matplotlib()


def title_model(name: str, limit: int = TITLE_MODEL_CHARS) -> str:
    """A model's name as a title shows it. A path keeps its last components, the ones that say which
    model (``.../org/Qwen3-Next-80B-A3B (qwen3_next)``), without ``config.json``; it is only ever cut
    on the left, at a ``/``, so the end the user recognises stays whole."""
    m = re.fullmatch(r"(?P<path>.*?)(?P<notes>(?: \([^()]*\))*)", name)
    path, notes = (m["path"], m["notes"]) if m else (name, "")
    notes = re.sub(r" \([\d,]+ chars\)", "", notes)  # the length of a path cut earlier: not shown
    if "/" not in path:
        return name if len(name) <= limit else f"...{name[-(limit - 3) :]}"
    parts = [p for p in path.split("/") if p]
    if len(parts) > 1 and parts[-1] == "config.json":
        parts.pop()
    shown = parts[-1]
    for part in reversed(parts[:-1]):
        if len(f".../{part}/{shown}{notes}") > limit:
            break
        shown = f"{part}/{shown}"
    if len(shown + notes) > limit:
        shown = "..." + shown[-max(limit - len(notes) - 3, 8) :]
    elif shown != "/".join(parts):
        shown = f".../{shown}"
    elif path.startswith("/"):
        shown = "/" + shown
    return shown + notes


def plot_title(inputs: CapacityInputs, grid: BudgetGrid) -> str:
    """The figure's title, two lines: the model and layout, then what the sweep assumed."""
    strategy = "no radix cache" if inputs.disable_radix_cache else inputs.resolved_strategy
    return (
        f"{title_model(inputs.geometry.name)}, pp {inputs.pp_size} x tp {inputs.tp_size}\n"
        f"r = {inputs.mamba_full_memory_ratio:g}, {strategy} ({inputs.slots_per_request()} slots/request), "
        f"budgets {grid.spec} ({len(grid):,})"
    )


def plot_sweep(
    path: str | Path,
    *,
    budgets: Sequence[float],
    values: Mapping[str, npt.ArrayLike],
    analysis: SweepSummary,
    title: str,
) -> None:
    """Write the sweep plot as a PNG to ``path``.

    ``values[policy][pp_rank][i]`` is that stage's triple at ``budgets[i]`` in
    :data:`~checker.core.sizing.sizing.CHECKED_VALUES` order: a sweep stack's ``stack[:, p, :, :]``, as nested
    lists or any array numpy reads (``stack[:, p].cpu().numpy()`` spares a million-budget sweep 24
    million Python ints). A value <= 0 (the sweep's BOOT_FAILURE) means the stage cannot boot there and
    leaves a gap in its line. ``budgets`` is the grid, ascending; ``analysis`` is the sweep's
    ``analyse`` dict, whose findings become the bands and headlines. Raises :class:`FlagError` without
    matplotlib or when ``path`` cannot be written.
    """
    fig = sweep_figure(budgets=budgets, values=values, analysis=analysis, title=title)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi="figure")
    # Written as every output is (checker/files.py): atomic for a file, in place for a device
    # or FIFO, bounded.
    problem = write_file(str(path), png.getvalue(), what="--plot")
    if problem:
        raise FlagError(problem)


def sweep_figure(
    *,
    budgets: Sequence[float],
    values: Mapping[str, npt.ArrayLike],
    analysis: SweepSummary,
    title: str,
) -> Figure:
    """The figure :func:`plot_sweep` saves, at :data:`SAVE_DPI`. Every band is a patch whose gid is
    ``"<policy>|<kind>|<value or ''>|<first budget>"``, so a test can find what was drawn."""
    Figure, FigureCanvasAgg = _matplotlib()
    from matplotlib.layout_engine import ConstrainedLayoutEngine  # optional dependency: the plot extra

    policies = list(values)
    layout = ConstrainedLayoutEngine(h_pad=0.06, hspace=0.04, w_pad=0.04, wspace=0.04)
    fig = Figure(figsize=(FIG_WIDTH_IN, 0.75 + 2.75 * len(policies)), dpi=SAVE_DPI, layout=layout)
    FigureCanvasAgg(fig)
    rows = fig.subfigures(len(policies), 1, squeeze=False)[:, 0]
    edges = _cell_edges(budgets)
    lo, hi = edges[0], edges[-1]
    for row, policy in zip(rows, policies, strict=True):
        info = analysis["policies"][policy]
        marks = _draw_row(row, policy, budgets, values[policy], info)
        lo, hi = min([lo, *(m.x0 for m in marks)]), max([hi, *(m.x1 for m in marks)])
    for ax in fig.axes:
        ax.set_xlim(lo, hi)  # every band whole, even one widened past the grid's ends
    fig.supxlabel("budget: total_rest_memory (GiB)", fontsize=10)
    fig.suptitle(title, fontsize=9.5)
    return fig


def _draw_row(
    row: SubFigure, policy: str, budgets: Sequence[float], stages: npt.ArrayLike, info: PolicySummary
) -> list[Mark]:
    """One policy: a panel per checked value, its bands, and a legend headed by the verdict in words."""
    import numpy as np  # a matplotlib dependency

    # optional dependency: matplotlib (the plot extra), checked by _matplotlib() first
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    x = np.asarray(budgets, dtype=np.float64)
    data = np.asarray(stages, dtype=np.float64)
    if data.ndim != 3 or data.shape[1:] != (len(x), len(CHECKED_VALUES)):
        raise ValueError(
            f"values[{policy!r}] has shape {data.shape}, not (stages, {len(x)} budgets, 3 values)"
        )
    data[data <= 0] = np.nan  # cannot boot: a gap in the line, not a point at -1
    marks = event_marks(budgets, info)
    axes = row.subplots(1, len(CHECKED_VALUES), sharex=True)
    handles: list[Artist] = []
    for c, ranks in enumerate(_stage_groups(data)):
        colour, ls = _COLOURS[c % len(_COLOURS)], _STYLES[c % len(_STYLES)]
        label = f"all {len(data)} stages" if len(ranks) == len(data) else _ranks_label(ranks)
        for v, ax in enumerate(axes):
            ax.plot(
                x,
                data[ranks[0], :, v],
                lw=2.0,
                marker="o" if len(x) <= 40 else None,
                ms=4,
                color=colour,
                ls=ls,
            )
        handles.append(Line2D([], [], lw=2.0, label=label, color=colour, ls=ls))
    for v, (name, ax) in enumerate(zip(CHECKED_VALUES, axes, strict=True)):
        for m in marks:
            if m.value in (None, name):
                gid = f"{policy}|{m.kind}|{m.value or ''}|{m.budgets_gib[0]!r}"
                ax.axvspan(m.x0, m.x1, gid=gid, **_MARK_STYLE[m.kind])
        differs = bool(info["divergent"][name])
        colour = _RED if differs else "black"
        ax.set_title(name, fontsize=10, loc="left", pad=16, color=colour, weight="bold" if differs else None)
        ax.text(
            0,
            1.02,
            panel_note(info, name, len(x)),
            transform=ax.transAxes,
            fontsize=9,
            va="bottom",
            color=_RED if differs else "0.35",
        )
        ax.set_ylim(bottom=0, top=max(1.0, np.nanmax(data[:, :, v], initial=0) * 1.1))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.tick_params(labelsize=9, length=3)
        ax.grid(alpha=0.3, lw=0.6)
        ax.set_axisbelow(True)
    kinds = [k for k in (DIFFERS, PARTIAL_BOOT, NO_BOOT) if any(m.kind == k for m in marks)]
    handles += [Patch(label=_MARK_LEGEND[k], **_legend_style(k)) for k in kinds]
    headline, diverges = headline_for(policy, info, budgets)
    legend = row.legend(
        handles=handles,
        loc="outside upper left",
        ncols=min(len(handles), 4),
        fontsize=9,
        frameon=False,
        title=headline,
        alignment="left",
        handlelength=2.4,
        title_fontproperties={"size": 10.5, "weight": "bold"},
        columnspacing=1.2,
        borderaxespad=0.1,
    )
    legend.get_title().set_color(_RED if diverges else "black")
    return marks


def panel_note(info: PolicySummary, name: str, n: int) -> str:
    """The line under a panel's title: how many budgets that value differs at, in words."""
    count = info["divergent"][name]
    if count:
        # No unit: "budgets" is in the row's headline, and a million-budget count must fit the column.
        return f"differs at {count:,} of {n:,}"
    return "no stage boots" if info["boot_failures"] == n else "same on every stage"


def headline_for(policy: str, info: PolicySummary, budgets: Sequence[float]) -> tuple[str, bool]:
    """The words over a policy's row, and whether it diverges.

    ``info`` is one policy of the ``analyse`` dict. A policy with no divergence says so outright ("all
    stages agree at every budget"), naming the budgets where nothing boots, if any.
    """
    n = len(budgets)
    failed = info["boot_failure_budgets"]
    if len(failed) == n:
        return f"{policy}: no stage boots at any budget ({_budget_list(failed, budgets)})", False
    if info["consistent"]:
        text = f"{policy}: all stages agree at every budget"
        if failed:
            text += f"; none boots at {_budget_list(failed, budgets)}"
        return text, False
    union = len(set().union(*info["divergent_budgets"].values()))
    return f"{policy}: stages DIVERGE at {union:,} of {_budgets(n)}", True


def _budgets(n: int) -> str:
    return f"{n:,} budget" + ("s" if n != 1 else "")


def _budget_list(flagged: Sequence[float], budgets: Sequence[float]) -> str:
    """'4 GiB', '4-4.25 GiB' for one stretch of the grid; a count for more (the bands show where)."""
    runs = _runs(flagged, budgets)
    if len(runs) > 1:
        return f"{len(flagged):,} budgets"
    a, b, _, _ = runs[0]
    return (f"{a:g}" if a == b else f"{a:g}-{b:g}") + " GiB"


def event_marks(budgets: Sequence[float], info: PolicySummary) -> list[Mark]:
    """Every band one policy's panels get, from its ``analyse`` entry ``info``.

    Flagged budgets become runs of grid cells (a cell reaches halfway to each neighbour), each widened
    about its centre to at least :data:`MIN_MARK_FRACTION` of the budget axis; bands of one kind that
    then touch merge, which bounds how many are drawn on a sweep of a million budgets. ``budgets`` is
    the sweep's grid, ascending (as ``parse_budgets`` makes it).
    """
    import numpy as np  # a matplotlib dependency; vectorised for grids of up to a million budgets

    edges = np.asarray(_cell_edges(budgets))
    min_width = MIN_MARK_FRACTION * float(edges[-1] - edges[0])
    groups: list[tuple[str, str | None, Sequence[float]]] = [
        (DIFFERS, name, info["divergent_budgets"][name]) for name in CHECKED_VALUES
    ]
    groups.append((NO_BOOT, None, info["boot_failure_budgets"]))
    groups.append((PARTIAL_BOOT, None, info["partial_boot_budgets"]))
    marks: list[Mark] = []
    for kind, value, flagged in groups:
        runs = _runs(flagged, budgets)
        if not runs:
            continue
        _, _, first, last = (np.asarray(col) for col in zip(*runs, strict=True))
        x0, x1 = edges[first], edges[last + 1]
        mid, narrow = (x0 + x1) / 2, (x1 - x0) < min_width
        x0 = np.where(narrow, mid - min_width / 2, x0)
        x1 = np.where(narrow, mid + min_width / 2, x1)
        # A band starts where a run begins past the right end of every band before it.
        reach = np.maximum.accumulate(x1)
        starts = np.flatnonzero(np.r_[True, x0[1:] > reach[:-1]])
        stops = np.r_[starts[1:], len(x0)] - 1
        flagged_sorted = np.sort(np.asarray(flagged, dtype=np.float64))
        lo = np.searchsorted(flagged_sorted, np.asarray(budgets)[first[starts]])
        hi = np.searchsorted(flagged_sorted, np.asarray(budgets)[last[stops]], side="right")
        for a, b, i, j in zip(starts, stops, lo, hi, strict=True):
            covered = tuple(flagged_sorted[i:j].tolist())
            marks.append(
                Mark(kind=kind, value=value, budgets_gib=covered, x0=float(x0[a]), x1=float(reach[b]))
            )
    return marks


def _runs(flagged: Sequence[float], budgets: Sequence[float]) -> list[tuple[float, float, int, int]]:
    """Flagged budgets as runs of neighbouring grid points: (first GiB, last GiB, first index, last index)."""
    import numpy as np  # a matplotlib dependency

    grid = np.asarray(budgets, dtype=np.float64)
    marked = np.sort(np.asarray(flagged, dtype=np.float64))
    if not marked.size:
        return []
    index = np.searchsorted(grid, marked)
    if (index >= len(grid)).any() or (grid[np.minimum(index, len(grid) - 1)] != marked).any():
        raise ValueError("the analysis flags a budget that is not on the sweep's grid")
    breaks = np.flatnonzero(np.diff(index) != 1)
    first = index[np.r_[0, breaks + 1]]
    last = index[np.r_[breaks, len(index) - 1]]
    return list(zip(grid[first].tolist(), grid[last].tolist(), first.tolist(), last.tolist(), strict=True))


def _cell_edges(budgets: Sequence[float]) -> list[float]:
    """Boundaries halfway between neighbouring budgets; the outer cells mirror their inner half."""
    import numpy as np  # a matplotlib dependency

    b = np.asarray(budgets, dtype=np.float64)
    if len(b) == 1:
        half = max(abs(float(b[0])) * 0.05, 1e-9)
        return [float(b[0]) - half, float(b[0]) + half]
    mids = (b[:-1] + b[1:]) / 2
    return [float(2 * b[0] - mids[0]), *mids.tolist(), float(2 * b[-1] - mids[-1])]


def _stage_groups(data: npt.NDArray[np.float64]) -> list[list[int]]:
    """Stages with identical triples at every budget, largest pool first: eight overlapping lines would
    hide each other, and which stages agree is the point of the plot."""
    groups: dict[bytes, list[int]] = {}
    for k, series in enumerate(data):
        groups.setdefault(series.tobytes(), []).append(k)

    def size(ranks: list[int]) -> float:
        col = data[ranks[0], :, 0]
        finite = col[col == col]  # NaN != NaN: skip the budgets where it cannot boot
        return float(finite.mean()) if finite.size else 0.0

    return sorted(groups.values(), key=lambda r: (-size(r), r[0]))


def _ranks_label(ranks: Sequence[int]) -> str:
    runs = budget_runs(list(ranks), list(range(max(ranks) + 1)))
    parts = [f"{a}" if a == b else (f"{a}, {b}" if b == a + 1 else f"{a}-{b}") for a, b in runs]
    return ("pp_rank " if len(ranks) == 1 else "pp_ranks ") + ", ".join(parts)


def _legend_style(kind: str) -> _BandStyle:
    style = _MARK_STYLE[kind].copy()
    style.pop("zorder")
    return style
