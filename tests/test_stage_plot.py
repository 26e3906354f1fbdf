"""``derive --plot`` and ``check --plot``: one stacked bar per stage (weights, state pool, KV pool, the
reserved remainder, the memory the MIN leaves idle), the stage that limits the KV pool marked.

The bars are read back from the figure object (every rectangle's gid names its stage and segment), never
from pixels, and held to the derived per-stage figures; check's picture is drawn from real gloo ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from harness import run_world
from rank_rows import world

from checker.core.sizing.geometry import resolve_dtypes
from checker.core.sizing.row import BUDGET_MILLIONTHS
from checker.core.sizing.sizing import CapacityInputs, derive_all
from checker.families.geometry import load_geometry

pytest.importorskip("matplotlib")

from checker.outputs import stage_plot  # noqa: E402  (after the skip: it draws with matplotlib)
from checker.outputs.stage_plot import SEGMENTS, row_bars, stage_bars  # noqa: E402

GIB = 2**30
KIMI_LINEAR = Path(__file__).resolve().parent / "fixtures" / "kimi_linear_48b_a3b.json"
# Issue 36's worked case: stage 1's own capacity (7,359,546 tokens) is the MIN; stage 0 leaves the rest idle.
WORKED = ["--model-config", str(KIMI_LINEAR), "--tp-size", "4", "--pp-size", "2", "--budget-gib", "60"]
WORKED += ["--disable-radix-cache", "--sglang-version", "0.5.23"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def drawn(fig: Any) -> dict[str, float]:
    """Every bar rectangle's height by its gid ("stage <k>|<segment>"), and the limiting marks (1.0)."""
    found: dict[str, float] = {}
    for ax in fig.axes:
        for patch in ax.patches:
            if patch.get_gid():
                found[patch.get_gid()] = patch.get_height()
        for text in ax.texts:
            if text.get_gid():
                found[text.get_gid()] = 1.0
    return found


def test_derive_plot_bars_are_the_derived_figures(cli, tmp_path, monkeypatch):
    """The PNG is written; each stage's bar holds its derived KV pool after the MIN, the idle bytes the MIN
    leaves, the state pool and the remainder, adding up to the budget; stage 1 is marked as the limit."""
    figures: list[Any] = []
    real = stage_plot.stage_figure
    monkeypatch.setattr(
        stage_plot, "stage_figure", lambda *a, **k: figures.append(real(*a, **k)) or figures[-1]
    )
    out = tmp_path / "stages.png"
    res = cli(["derive", *WORKED, "--format", "json", "--plot", str(out)])
    assert res.rc == 0, res.err
    assert out.read_bytes()[:8] == PNG_MAGIC
    import json

    ranks = json.loads(res.out)["ranks"]
    (fig,) = figures
    bars = drawn(fig)
    assert bars.keys() == {f"stage {k}|{s}" for k in (0, 1) for s in SEGMENTS} | {"stage 1|limiting"}
    for k, r in enumerate(ranks):
        kv = r["max_total_num_tokens"] * r["kv_cell_bytes"]
        assert bars[f"stage {k}|KV pool"] == pytest.approx(kv / GIB, rel=1e-12)
        assert bars[f"stage {k}|idle (MIN)"] == pytest.approx(r["kv_idle_bytes"] / GIB, rel=1e-12)
        assert bars[f"stage {k}|weights"] == 0.0  # a config.json without its checkpoint: not known
        pools = sum(bars[f"stage {k}|{s}"] for s in SEGMENTS[1:])
        assert pools == pytest.approx(60.0, rel=1e-9)  # state + KV + remainder + idle = the budget
    assert ranks[0]["kv_idle_bytes"] == (9_812_728 - 7_359_546) * ranks[0]["kv_cell_bytes"] > 0
    assert bars["stage 1|idle (MIN)"] == 0.0


def _worked_stages() -> tuple[CapacityInputs, list[Any]]:
    g = resolve_dtypes(load_geometry(model_config=str(KIMI_LINEAR), tp_size=4), env={})
    inputs = CapacityInputs(
        geometry=g, budget_gib=60.0, tp_size=4, pp_size=2, disable_radix_cache=True, sglang_version="0.5.23"
    )
    return inputs, derive_all(inputs)


def test_checks_rows_draw_the_same_bars_as_derive():
    """check draws from the gathered rows: a stage's ranks carry the figures derive computes, so the bars
    are the same (the weights figure each rank used included)."""
    inputs, stages = _worked_stages()
    rows = []
    for row, s in zip(world(2), stages, strict=True):
        rows.append(
            replace(
                row,
                pp_rank=s.pp_rank,
                budget_millionths_gib=int(inputs.budget_gib * BUDGET_MILLIONTHS),
                kv_available_bytes=s.kv_available_bytes,
                kv_cell_bytes=s.kv_cell_bytes,
                kv_own_tokens=s.kv_own_tokens,
                max_total_num_tokens=s.max_total_num_tokens,
                kv_idle_bytes=s.kv_idle_bytes,
                kv_limiting=int(s.kv_limiting),
                weights_bytes=int(7.5 * GIB),
            )
        )
    assert row_bars(rows) == stage_bars(stages, 60.0, [7.5, 7.5])
    assert [b.limiting for b in row_bars(rows)] == [False, True]


def test_check_plot_on_real_ranks_names_the_png_in_the_step_summary(tmp_path):
    """Two gloo ranks: rank 0 writes the PNG, the step summary names it, the verdict is unchanged."""
    png, summary = tmp_path / "stages.png", tmp_path / "summary.md"
    argv = ["check", "--model", "kimi-k3", "--budget-gib", "8", "--timeout-s", "60", "--plot", str(png)]
    res = run_world(argv, world_size=2, tmp_path=tmp_path, env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert res.codes == [0, 0], [r.stderr[-400:] for r in res.ranks]
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert f"`{png}`" in summary.read_text()
    assert res.report()["status"] == "consistent"


BLOCKED = "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = ['checker', *sys.argv[1:]]; "
BLOCKED += "runpy.run_module('checker', run_name='__main__', alter_sys=True)"


@pytest.mark.parametrize("command", ["derive", "check"])
def test_missing_matplotlib_is_refused_in_one_line_before_any_output(tmp_path, command):
    """Without matplotlib: one line naming the 'plot' extra, exit 2, nothing on stdout, no file."""
    out = tmp_path / "stages.png"
    argv = [command, "--model", "kimi-k3", "--budget-gib", "8", "--plot", str(out)]
    argv += ["--allow-single-rank"] if command == "check" else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "GITHUB_STEP_SUMMARY"):
        env.pop(key, None)
    p = subprocess.run(
        [sys.executable, "-c", BLOCKED, *argv], capture_output=True, text=True, timeout=120, env=env
    )
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    (line,) = p.stderr.strip().splitlines()
    assert "--plot needs matplotlib (the 'plot' extra)" in line
    assert not out.exists()


def test_a_plot_path_that_is_an_input_is_refused(cli, tmp_path):
    """--plot never replaces what the run reads: the model's config.json given as the PNG path."""
    config = tmp_path / "config.json"
    config.write_bytes(KIMI_LINEAR.read_bytes())
    before = config.read_bytes()
    res = cli(["derive", "--model-config", str(config), "--tp-size", "4", "--plot", str(config)])
    assert res.rc == 2 and res.out == ""
    (line,) = res.err.splitlines()
    assert "--plot" in line and "config.json" in line
    assert config.read_bytes() == before
