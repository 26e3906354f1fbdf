"""The sweep plot: every event drawn, all three checked values per stage, a verdict in words, legible at
the 800 px GitHub shows a README image at.

Sweeps come from the real derivation (``checker.device.sweep``); what the plot should show comes from the
scalar core (``checker.core.sizing.sweep.scalar_sweep``), stage by stage, budget by budget.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from checker.core.errors import FlagError
from checker.core.sizing.sizing import CHECKED_VALUES, POLICIES, CapacityInputs
from checker.core.sizing.sweep import BOOT_FAILURE, MAX_BUDGETS, parse_budgets, scalar_sweep
from checker.device.sweep import analyse, local_sweep
from checker.families.geometry import load_geometry
from checker.outputs.plot import (
    DIFFERS,
    FIG_WIDTH_IN,
    MIN_MARK_FRACTION,
    NO_BOOT,
    PARTIAL_BOOT,
    SAVE_DPI,
    event_marks,
    headline_for,
    install_hint,
    panel_note,
    plot_sweep,
    plot_title,
    sweep_figure,
    title_model,
)

GITHUB_WIDTH_PX = 800
PP = 8


class Sweep:
    """kimi-k3 at pp 8, r 0.5 (the README's sweep) over ``spec``: what plot_sweep is given."""

    def __init__(self, spec: str, policies: tuple[str, ...] = POLICIES) -> None:
        g = load_geometry(model="kimi-k3")
        self.budgets = parse_budgets(spec).budgets
        self.inputs = {
            p: CapacityInputs(
                geometry=g, budget_gib=self.budgets[0], pp_size=PP, policy=p, mamba_full_memory_ratio=0.5
            )
            for p in policies
        }
        stack = torch.stack([local_sweep(self.inputs, k, self.budgets) for k in range(PP)])
        self.values = {p: stack[:, i].tolist() for i, p in enumerate(policies)}
        self.analysis = analyse(stack, self.budgets, list(policies))
        self.title = f"kimi-k3, pp {PP}, r = 0.5, budgets {spec}"

    def figure(self):  # noqa: ANN201 - a matplotlib Figure
        return sweep_figure(
            budgets=self.budgets, values=self.values, analysis=self.analysis, title=self.title
        )

    def oracle(self, policy: str) -> dict[str, object]:
        """What the scalar core says, budget by budget: which budgets no stage boots at, which some
        stages boot at and others not, and per checked value which budgets the stages disagree at."""
        per_stage = [scalar_sweep(self.inputs[policy], k, self.budgets) for k in range(PP)]
        none, partial, differs = [], [], {name: [] for name in CHECKED_VALUES}
        for i, b in enumerate(self.budgets):
            triples = [s[i] for s in per_stage]
            booted = [t[0] != BOOT_FAILURE for t in triples]
            if not any(booted):
                none.append(b)
                continue
            if not all(booted):
                partial.append(b)
            for v, name in enumerate(CHECKED_VALUES):
                if len({t[v] for t in triples}) > 1:
                    differs[name].append(b)
        return {"none": none, "partial": partial, "differs": differs, "per_stage": per_stage}


@pytest.fixture(scope="module")
def readme_sweep() -> Sweep:
    return Sweep("4:40:0.25")


@pytest.fixture(scope="module")
def tiny_budget_sweep() -> Sweep:
    """0.4 to 0.6 GiB: under own-share some stages boot where others cannot."""
    return Sweep("0.4:0.6:0.01")


@pytest.fixture(scope="module")
def long_sweep() -> Sweep:
    """72,001 budgets: own-share's micro-batch flips between agreeing and differing many times, and
    the counts and budget ranges written in the figure are at their longest."""
    return Sweep("4:40:0.0005")


def downscaled(path: Path) -> Image.Image:
    """The PNG as GitHub shows it in a README: scaled to 800 px wide."""
    with Image.open(path) as img:
        w, h = img.size
        return img.convert("RGB").resize((GITHUB_WIDTH_PX, round(h * GITHUB_WIDTH_PX / w)), Image.LANCZOS)


def gid_patches(fig, prefix: str) -> list:  # noqa: ANN001
    return fig.findobj(match=lambda a: (a.get_gid() or "").startswith(prefix))


def dark_fraction(img: Image.Image, box: tuple[int, int, int, int]) -> float:
    """Share of pixels in ``box`` (left, top, right, bottom) that are not near-white background."""
    pixels = np.asarray(img.crop(box), dtype=np.int64)
    return float((pixels.sum(axis=2) < 3 * 215).mean())


# --- every event drawn -----------------------------------------------------------------------------


@pytest.mark.slow
def test_single_budget_boot_failure_is_a_band_visible_at_800px(readme_sweep: Sweep, tmp_path: Path) -> None:
    """Under whole-model no stage boots at 4 GiB, the grid's first budget and the only such one (the
    scalar core refuses every stage there). The old plot counted it but drew nothing; here it must be a
    band in all three whole-model panels, at least 4 px wide and visibly filled once the PNG is scaled to
    800 px, while the max-share panels at the same place stay background."""
    oracle = readme_sweep.oracle("whole-model")
    assert oracle["none"] == [4.0] and oracle["partial"] == []  # the case the test is about

    marks = event_marks(readme_sweep.budgets, readme_sweep.analysis["policies"]["whole-model"])
    boot = [m for m in marks if m.kind == NO_BOOT]
    assert [m.budgets_gib for m in boot] == [(4.0,)]
    assert boot[0].x0 < 4.0 < boot[0].x1
    assert boot[0].x1 - boot[0].x0 >= MIN_MARK_FRACTION * (40.125 - 3.875) * 0.999

    fig = readme_sweep.figure()
    path = tmp_path / "sweep.png"
    fig.savefig(path, dpi="figure")
    bands = gid_patches(fig, "whole-model|no boot|")
    assert len(bands) == 3  # one per checked value's panel
    with Image.open(path) as img:
        width, height = img.size
    img = downscaled(path)
    scale = GITHUB_WIDTH_PX / width
    for band in bands:
        box = band.get_window_extent()  # pixels of the saved PNG, origin bottom left
        ax_box = band.axes.get_window_extent()
        left, right = box.x0 * scale, box.x1 * scale
        assert right - left >= 4, f"{right - left:.1f} px wide at 800 px"
        # The upper half of the panel, where no line runs at 4 GiB: the band alone fills it.
        top, bottom = (height - ax_box.y1) * scale + 3, (height - (ax_box.y0 + ax_box.y1) / 2) * scale
        inside = (round(left) + 1, round(top), round(right) - 1, round(bottom))
        assert dark_fraction(img, inside) > 0.8
        # The max-share panel right above, same budgets: no band, so background.
        above = (
            inside[0],
            inside[1] - round(ax_box.height * scale * 1.45),
            inside[2],
            inside[3] - round(ax_box.height * scale * 1.45),
        )
    assert dark_fraction(img, above) < 0.3


def test_partial_boot_and_no_boot_are_drawn_where_the_scalar_core_says(tiny_budget_sweep: Sweep) -> None:
    """From 0.4 to 0.6 GiB under own-share, stages with the larger share fail before the others: the
    budgets where only some boot get a partial-boot band in every panel, the budgets where none boots a
    no-boot band, and every budget where a value differs sits inside a band for that value. A band
    dropped, misplaced or drawn in the wrong panel shows as a budget outside every band."""
    s = tiny_budget_sweep
    oracle = s.oracle("own-share")
    assert oracle["partial"] and oracle["none"]  # the sweep really has both events
    marks = event_marks(s.budgets, s.analysis["policies"]["own-share"])

    def covered(kind: str, value: str | None) -> set[float]:
        return {b for m in marks if m.kind == kind and m.value == value for b in m.budgets_gib}

    def inside(kind: str, value: str | None, b: float) -> bool:
        return any(m.x0 <= b <= m.x1 for m in marks if m.kind == kind and m.value == value)

    assert covered(PARTIAL_BOOT, None) == set(oracle["partial"])
    assert covered(NO_BOOT, None) == set(oracle["none"])
    for name in CHECKED_VALUES:
        assert covered(DIFFERS, name) == set(oracle["differs"][name])
        assert set(oracle["partial"]) <= set(oracle["differs"][name])  # a partial boot differs in all
    for b in s.budgets:
        assert inside(PARTIAL_BOOT, None, b) == (b in oracle["partial"])

    fig = s.figure()
    for name in CHECKED_VALUES:
        panels = {p.axes for p in gid_patches(fig, "own-share|partial boot|")}
        assert {ax.get_title(loc="left") for ax in panels} == set(CHECKED_VALUES)
        assert gid_patches(fig, f"own-share|differs|{name}|")


@pytest.mark.slow
def test_bands_merge_but_never_drop_a_budget_on_a_long_sweep(long_sweep: Sweep) -> None:
    """Over 72,001 budgets, bands that would touch merge, so a long sweep draws a bounded number of
    patches, yet every budget where own-share's micro-batch differs (per the sweep's own analysis) still
    lies inside one."""
    s = long_sweep
    info = s.analysis["policies"]["own-share"]
    flagged = info["divergent_budgets"]["pp_max_micro_batch_size"]
    assert 0 < len(flagged) < len(s.budgets)
    bands = [m for m in event_marks(s.budgets, info) if m.value == "pp_max_micro_batch_size"]
    assert len(bands) <= 1 / MIN_MARK_FRACTION + 1
    assert sum(len(m.budgets_gib) for m in bands) == len(flagged)
    starts = [m.x0 for m in bands]
    j = 0
    for b in flagged:  # both ascending: walk the bands once
        while not bands[j].x0 <= b <= bands[j].x1:
            j += 1
            assert j < len(bands), f"{b} GiB differs but no band covers it"
    assert starts == sorted(starts)


# --- three values per stage, verdicts in words --------------------------------------------------------


@pytest.mark.slow
def test_each_policy_row_plots_all_three_values_for_every_stage(readme_sweep: Sweep) -> None:
    """Each policy has one panel per checked value; the lines drawn there are the scalar core's values
    for every stage (stages with identical values share a line, labelled with their ranks). A panel that
    plots the pool size twice, or a stage missing from every label, shows here."""
    fig = readme_sweep.figure()
    fig.canvas.draw()
    for policy in POLICIES:
        per_stage = readme_sweep.oracle(policy)["per_stage"]
        legend = next(
            sf.legends[0] for sf in fig.subfigs if sf.legends[0].get_title().get_text().startswith(policy)
        )
        labels = [t.get_text() for t in legend.get_texts()]
        line_labels = [lab for lab in labels if lab.startswith("pp_rank") or lab == f"all {PP} stages"]
        named: list[int] = []
        for lab in line_labels:
            named += list(range(PP)) if lab == f"all {PP} stages" else _ranks(lab)
        assert sorted(named) == list(range(PP)), labels
        axes = [ax for ax in fig.axes if ax.get_figure() is legend.figure]
        assert [ax.get_title(loc="left") for ax in axes] == list(CHECKED_VALUES)
        for v, ax in enumerate(axes):
            drawn = {tuple(line.get_ydata()) for line in ax.get_lines()}
            want = {
                tuple(float("nan") if t[v] == BOOT_FAILURE else float(t[v]) for t in stage)
                for stage in per_stage
            }
            assert _nan_eq(drawn, want), (policy, CHECKED_VALUES[v])


def _ranks(label: str) -> list[int]:
    """'pp_ranks 0, 3-6' -> [0, 3, 4, 5, 6]."""
    out: list[int] = []
    for part in label.split(" ", 1)[1].split(", "):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def _nan_eq(a: set[tuple], b: set[tuple]) -> bool:
    key = lambda t: tuple("nan" if x != x else x for x in t)  # noqa: E731 - NaN != NaN in a set
    return {key(t) for t in a} == {key(t) for t in b}


def test_verdicts_are_written_in_the_figure(readme_sweep: Sweep) -> None:
    """max-share never diverges on this sweep (every stage derives the same triple, per the scalar
    core), so its row says so in words; own-share's says DIVERGE with the count, and each panel says at
    how many budgets its value differs; whole-model names the budget where nothing boots."""
    texts = {t.get_text() for t in readme_sweep.figure().findobj(lambda a: hasattr(a, "get_text"))}
    n = len(readme_sweep.budgets)
    oracle = {p: readme_sweep.oracle(p) for p in POLICIES}
    assert not any(oracle["max-share"]["differs"].values())
    assert "max-share: all stages agree at every budget" in texts
    own = oracle["own-share"]["differs"]
    union = len(set().union(*own.values()))
    assert f"own-share: stages DIVERGE at {union} of {n} budgets" in texts
    for name in CHECKED_VALUES:
        assert f"differs at {len(own[name])} of {n}" in texts
    assert "whole-model: all stages agree at every budget; none boots at 4 GiB" in texts


def test_headline_when_no_budget_boots() -> None:
    """A sweep where nothing boots anywhere is not 'all stages agree': it says no stage boots."""
    s = Sweep("0.1,0.2", policies=("whole-model",))
    assert s.oracle("whole-model")["none"] == [0.1, 0.2]
    text, diverges = headline_for("whole-model", s.analysis["policies"]["whole-model"], s.budgets)
    assert text == "whole-model: no stage boots at any budget (0.1-0.2 GiB)" and not diverges


# --- legible at 800 px -------------------------------------------------------------------------------


# What the sweep's marks look like on screen: the first group's line (#1f77b4) and the "differs" band
# (#f4a3a8 at alpha 0.75 over the white axes: (247, 186, 190)).
LINE_RGB = (31, 119, 180)
DIFFERS_BAND_RGB = (247, 186, 190)


def pixels_near(img: Image.Image, rgb: tuple[int, int, int], tol: int = 3) -> int:
    """How many pixels are within ``tol`` of ``rgb`` in every channel."""
    pixels = np.asarray(img.convert("RGB"), dtype=np.int64)
    return int((np.abs(pixels - np.array(rgb)).max(axis=2) <= tol).sum())


@pytest.mark.slow
def test_png_reads_back_at_the_promised_size(readme_sweep: Sweep, tmp_path: Path) -> None:
    """Read back from disk: a PNG PIL decodes, FIG_WIDTH_IN at SAVE_DPI wide, small enough to commit
    next to the README, and showing the sweep: its lines, and the "differs" band own-share earns. The
    same plot of max-share alone, which never diverges, has lines and no band pixel: a blank canvas, a
    figure without its lines, or a band drawn where the stages agree fails here."""
    path, agreeing = tmp_path / "sweep.png", tmp_path / "max-share.png"
    plot_sweep(
        path,
        budgets=readme_sweep.budgets,
        values=readme_sweep.values,
        analysis=readme_sweep.analysis,
        title=readme_sweep.title,
    )
    max_share = Sweep("4:40:0.25", policies=("max-share",))
    plot_sweep(
        agreeing,
        budgets=max_share.budgets,
        values=max_share.values,
        analysis=max_share.analysis,
        title=max_share.title,
    )
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        w, h = img.size
        assert pixels_near(img, LINE_RGB) > 2_000
        assert pixels_near(img, DIFFERS_BAND_RGB) > 20_000
    with Image.open(agreeing) as img:
        assert pixels_near(img, LINE_RGB) > 1_000
        assert pixels_near(img, DIFFERS_BAND_RGB) == 0
    assert w == FIG_WIDTH_IN * SAVE_DPI and h <= 2000
    assert path.stat().st_size < 300_000


@pytest.mark.parametrize(
    "which", ["readme_sweep", "tiny_budget_sweep", pytest.param("long_sweep", marks=pytest.mark.slow)]
)
def test_legible_at_800px_and_nothing_cut_off(which: str, request: pytest.FixtureRequest) -> None:
    """The figure is 8 inches wide, so at GitHub's 800 px every point is 100/72 px: text of 9 pt or
    more is at least 12 px there, lines of 1.5 pt 2 px. No text runs off the figure: a headline or a
    count too long for the width (72,001 budgets write the longest) would be cut."""
    fig = request.getfixturevalue(which).figure()
    fig.canvas.draw()
    px_per_pt = GITHUB_WIDTH_PX / (FIG_WIDTH_IN * 72)
    fig_box = fig.bbox
    # Tick labels outside an axis' limits exist but are not drawn.
    hidden = {
        id(label)
        for ax in fig.axes
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim()))
        for tick in axis.get_major_ticks()
        if not lo <= tick.get_loc() <= hi
        for label in (tick.label1, tick.label2)
    }
    for text in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text")):
        if not text.get_text() or not text.get_visible() or id(text) in hidden:
            continue
        assert text.get_fontsize() * px_per_pt >= 12, (text.get_text(), text.get_fontsize())
        box = text.get_window_extent()
        assert fig_box.x0 <= box.x0 and box.x1 <= fig_box.x1 + 0.5, f"{text.get_text()!r} is cut off"
    for ax in fig.axes:
        for line in ax.get_lines():
            assert line.get_linewidth() * px_per_pt >= 2
    # The longest count any sweep writes under a panel title (MAX_BUDGETS budgets) fits its column too.
    worst = panel_note(
        {"divergent": {"max_mamba_cache_size": MAX_BUDGETS - 1}, "boot_failures": 0},
        "max_mamba_cache_size",
        MAX_BUDGETS,
    )
    assert worst.startswith(f"differs at {MAX_BUDGETS - 1:,}")
    # And the longest headline: the longest policy name, nothing booting over one stretch of 6-digit budgets.
    worst_budgets = [10.1234, 10.5678, 11.0]
    headline, _ = headline_for(
        "whole-model",
        {"consistent": True, "boot_failure_budgets": worst_budgets[:2], "boot_failures": 2},
        worst_budgets,
    )
    assert headline.endswith("none boots at 10.1234-10.5678 GiB")
    for sub in fig.subfigs:
        title = sub.legends[0].get_title()
        title.set_text(headline)
        assert title.get_window_extent().x1 <= fig_box.x1, f"{headline!r} is cut off"
    for ax in fig.axes:
        (note,) = ax.texts
        note.set_text(worst)
        right = note.get_window_extent().x1
        neighbours = [o.get_window_extent().x0 for o in fig.axes if o.get_window_extent().x0 > right - 1]
        assert right <= min([fig_box.x1, *neighbours]), f"{worst!r} runs {right - fig_box.x1:.0f} px off"


# --- errors --------------------------------------------------------------------------------------------


def test_missing_matplotlib_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """matplotlib is the optional 'plot' extra: without it, one FlagError naming the extra and how to
    install it from here (the tests run from a clone)."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import raise ImportError
    with pytest.raises(
        FlagError, match=rf"needs matplotlib \(the 'plot' extra\): {re.escape(install_hint())}$"
    ):
        plot_sweep(
            tmp_path / "x.png",
            budgets=[1.0],
            values={"max-share": [[[1, 1, 1]]]},
            analysis={"policies": {}},
            title="t",
        )
    assert not (tmp_path / "x.png").exists()


REPO_ROOT = Path(__file__).resolve().parents[1]


def test_install_hint_works_from_where_the_user_stands(tmp_path: Path) -> None:
    """From a clone: the clone's own extra ('.[plot]' at its root, its path elsewhere). From an installed
    distribution: the extra's requirements. Never 'pp-capacity-checker[plot]': the name is not published."""
    assert install_hint(cwd=REPO_ROOT) == "pip install '.[plot]'"
    assert install_hint(cwd=tmp_path) == f"pip install {shlex.quote(f'{REPO_ROOT}[plot]')}"
    installed = install_hint(source_root=tmp_path)  # no pyproject.toml next to the package
    assert installed.startswith("pip install 'matplotlib") or installed == "pip install matplotlib"
    for hint in (install_hint(cwd=REPO_ROOT), installed):
        assert "pp-capacity-checker[" not in hint


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("kimi-k3", "kimi-k3"),
        ("/models/Qwen3-Next-80B-A3B/config.json (qwen3_next)", "/models/Qwen3-Next-80B-A3B (qwen3_next)"),
        (
            "/mnt/shared/team-inference/checkpoints/mirrored/nvidia/Nemotron-H-8B-Base-8K/config.json "
            "(nemotron_h)",
            ".../nvidia/Nemotron-H-8B-Base-8K (nemotron_h)",
        ),
        # A path the config loader already cut in its middle (saying how long it was): its end is kept.
        (
            "/tmp/a/an-o...r-48B-A3B-Instruct-revision-2026-11-30/config.json (222 chars) (kimi_linear)",
            "...3B-Instruct-revision-2026-11-30 (kimi_linear)",
        ),
    ],
)
def test_title_keeps_a_model_paths_last_components(name: str, shown: str) -> None:
    """Whole components from the end while they fit (48 characters here), cut only on the left."""
    assert title_model(name, limit=48) == shown
    assert len(shown) <= 48


def test_title_of_a_long_model_path_fits_the_figure(readme_sweep: Sweep) -> None:
    """A real model path made the title run off both edges of the figure: the title keeps the path's
    end, cut only on the left, and every line of it fits the figure."""
    deep = "/" + "/".join(["a-directory-name-long-enough-to-matter"] * 6)
    name = f"{deep}/Qwen3-Next-80B-A3B-Instruct-FP8-dynamic-revision-2026-11-30/config.json (qwen3_next)"
    inputs = CapacityInputs(
        geometry=load_geometry(model="kimi-k3"), budget_gib=8.0, pp_size=PP, mamba_full_memory_ratio=0.5
    )
    object.__setattr__(inputs.geometry, "name", name)  # a frozen geometry with a long path's name
    title = plot_title(inputs, parse_budgets("4:40:0.25"))
    assert "Qwen3-Next-80B-A3B-Instruct-FP8-dynamic-revision-2026-11-30 (qwen3_next)" in title
    fig = sweep_figure(
        budgets=readme_sweep.budgets, values=readme_sweep.values, analysis=readme_sweep.analysis, title=title
    )
    fig.canvas.draw()
    box, fig_box = fig._suptitle.get_window_extent(), fig.bbox
    assert fig_box.x0 <= box.x0 and box.x1 <= fig_box.x1, f"{title!r} is cut off"


def test_unwritable_path_is_a_flag_error(readme_sweep: Sweep, tmp_path: Path) -> None:
    """A --plot path that cannot be written (here under a regular file) is a one-line FlagError naming
    --plot, not a traceback. (A missing folder is made, as for --report: the plot is written as every
    output is, checker/files.py.)"""
    (tmp_path / "file.txt").write_text("")
    with pytest.raises(FlagError, match=r"cannot write --plot .*file.txt/dir.png"):
        plot_sweep(
            tmp_path / "file.txt" / "dir.png",
            budgets=readme_sweep.budgets,
            values=readme_sweep.values,
            analysis=readme_sweep.analysis,
            title="t",
        )


def test_values_in_the_wrong_layout_are_refused(readme_sweep: Sweep) -> None:
    """values[policy] is [stage][budget][3]; a stack passed as [budget][stage][3] (same element count)
    must not be silently reshaped into nonsense lines."""
    swapped = {p: torch.tensor(v).transpose(0, 1).tolist() for p, v in readme_sweep.values.items()}
    with pytest.raises(ValueError, match=r"not \(stages, 145 budgets, 3 values\)"):
        sweep_figure(budgets=readme_sweep.budgets, values=swapped, analysis=readme_sweep.analysis, title="t")
