"""The sweep plot: state-pool size per stage against budget, one panel per policy, divergence marked.

matplotlib is an optional extra (``pip install 'pp-capacity-checker[plot]'``), imported only when a plot
is asked for, so the checker itself needs nothing but torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from checker.core.errors import FlagError
from checker.core.sizing import CHECKED_VALUES
from checker.core.sweep import BOOT_FAILURE

# Short names for the rug rows that say which value diverges where.
_SHORT = {
    "max_mamba_cache_size": "pool size K",
    "max_running_requests": "running requests",
    "pp_max_micro_batch_size": "micro-batch",
}
_RUG_COLOURS = {
    "max_mamba_cache_size": "#7b3294",
    "max_running_requests": "#e66101",
    "pp_max_micro_batch_size": "#d7191c",
}


def _matplotlib():
    try:
        # The Agg canvas directly, never pyplot: no window, no global backend state on headless nodes.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise FlagError(
            "--plot needs matplotlib, an optional extra: pip install 'pp-capacity-checker[plot]'"
        ) from None
    return Figure, FigureCanvasAgg


def plot_sweep(
    path: str | Path,
    *,
    budgets: Sequence[float],
    pool_sizes: Mapping[str, Sequence[Sequence[int]]],
    analysis: Mapping[str, object],
    title: str,
) -> None:
    """Write a PNG to ``path``.

    ``pool_sizes[policy][pp_rank][i]`` is that stage's max_mamba_cache_size at ``budgets[i]``
    (:data:`BOOT_FAILURE` where it cannot boot, drawn as a gap); ``analysis`` is the sweep's
    ``analyse`` dict, whose divergent and boot-failure budgets are marked in a strip under each panel.
    """
    Figure, FigureCanvasAgg = _matplotlib()
    import numpy as np  # a matplotlib dependency

    policies = list(pool_sizes)
    x = np.asarray(budgets, dtype=np.float64)
    n = len(x)
    found = analysis["policies"]  # type: ignore[index]
    fig = Figure(figsize=(10, 0.9 + 3.3 * len(policies)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2 * len(policies), 1, height_ratios=[3.2, 1.0] * len(policies))
    main_axes = []
    for j, policy in enumerate(policies):
        info = found[policy]  # type: ignore[index]
        ax = fig.add_subplot(grid[2 * j], sharex=main_axes[0] if main_axes else None)
        strip = fig.add_subplot(grid[2 * j + 1], sharex=ax)
        main_axes.append(ax)
        sizes = np.asarray(pool_sizes[policy], dtype=np.float64)
        sizes[sizes == BOOT_FAILURE] = np.nan
        # Stages that derive the very same series share one line, labelled with their ranks: eight
        # overlapping lines would hide each other, and "which stages agree" is the point.
        groups: dict[bytes, list[int]] = {}
        for k, row in enumerate(sizes):
            groups.setdefault(row.tobytes(), []).append(k)
        for c, ranks in enumerate(sorted(groups.values(), key=lambda r: -np.nanmean(sizes[r[0]]))):
            label = "all stages" if len(ranks) == len(sizes) else f"pp_rank {_ranks(ranks)}"
            ax.plot(x, sizes[ranks[0]], lw=1.6, color=f"C{c % 10}", label=label,
                    marker="." if n <= 60 else None)
        verdict = "consistent" if info["consistent"] else "DIVERGES"
        ax.set_title(f"{policy}: {verdict}", loc="left", fontsize=11, fontweight="bold",
                     color="black" if info["consistent"] else "#b2182b")
        ax.set_ylabel("max_mamba_cache_size\n(state slots)", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8, frameon=False)
        ax.tick_params(labelbottom=False)
        _strip(strip, x, info, n, np)
    strip.set_xlabel("budget: total_rest_memory (GiB)")
    fig.suptitle(title, fontsize=10)
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise FlagError(f"--plot {path}: cannot write it ({exc.strerror or exc})") from None


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))


def _strip(ax, x, info: Mapping, n: int, np) -> None:  # noqa: ANN001 - matplotlib/numpy objects
    """One row per checked value, filled where it diverges; a last row for budgets nobody boots."""
    rows = [*CHECKED_VALUES, "boot failure"]
    for r, name in enumerate(rows):
        y = len(rows) - 1 - r
        if name == "boot failure":
            marked, colour, count = info["boot_failure_budgets"], "0.45", info["boot_failures"]
        else:
            marked, colour = info["divergent_budgets"][name], _RUG_COLOURS[name]
            count = info["divergent"][name]
        mask = np.isin(x, np.asarray(marked, dtype=np.float64))
        if mask.any():
            ax.fill_between(x, y - 0.38, y + 0.38, where=mask, step="mid", color=colour, lw=0)
        ax.text(1.005, y, f"{count:,}/{n:,}", transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [_SHORT.get(v, v) + (" diverges" if v in _SHORT else "")
                                     for v in reversed(rows)], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", alpha=0.3)
