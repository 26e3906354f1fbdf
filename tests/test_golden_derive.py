"""What the families and releases derive stays what it was (issue 38: the redesign is byte-identical).

``tests/fixtures/golden/derive.json`` holds digests of 7,220 cases (scripts/build_golden_derive.py: the
explanation of every ordered release pair; every family's example configs and the kimi-k3 preset as each
model type, under every modelled release and eight flag sets, the stages' values or the refusal). The
quick suite recomputes a sample of releases, every geometry under each; the slow generated-file check
(tests/test_generated.py, ``golden_derive``) runs the generator over all of them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from checker.core.releases.releases import MODELLED_RELEASES, NEWEST_MODELLED

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import build_golden_derive as golden  # noqa: E402

SAMPLE = tuple(dict.fromkeys((*MODELLED_RELEASES[::6], NEWEST_MODELLED)))
"""Every sixth modelled release and the newest (the whole table is the slow check's)."""

REDO = (
    "python3 scripts/regenerate.py --only golden_derive (then say in the commit which cases moved, and why)"
)


@pytest.fixture(scope="module")
def recorded() -> dict[str, object]:
    data: dict[str, object] = json.loads((REPO / golden.OUTPUT).read_text())
    return data


@pytest.fixture
def at_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the example configs' paths, as the refusals name them


def test_the_golden_holds_every_release_geometry_and_flag_set(
    recorded: dict[str, object], at_repo: None
) -> None:
    geoms = golden.geometries()
    assert recorded["releases"] == list(MODELLED_RELEASES), REDO
    assert recorded["flag_sets"] == list(golden.FLAG_SETS), REDO
    assert set(recorded["explain"]) == set(MODELLED_RELEASES)  # type: ignore[call-overload]
    derive = recorded["derive"]
    assert isinstance(derive, dict) and set(derive) == set(geoms), REDO
    assert all(set(by) == set(MODELLED_RELEASES) for by in derive.values())
    assert recorded["cases"] == 7220 == len(MODELLED_RELEASES) * (len(MODELLED_RELEASES) + 8 * len(geoms))


def test_the_sampled_releases_explain_and_derive_as_recorded(
    recorded: dict[str, object], at_repo: None
) -> None:
    explain, derive = recorded["explain"], recorded["derive"]
    assert isinstance(explain, dict) and isinstance(derive, dict)
    moved = [
        f"explain {a} vs every release"
        for a in SAMPLE
        if golden.digest(golden.explain_cases(a)) != explain[a]
    ]
    moved += [
        f"{name} under {v}"
        for name, g in golden.geometries().items()
        for v in SAMPLE
        if golden.digest(golden.derive_cases(name, g, v)) != derive[name][v]
    ]
    assert not moved, f"{len(moved)} groups of cases moved ({'; '.join(moved[:8])}): if meant, {REDO}"


def test_a_changed_stage_moves_its_digest(recorded: dict[str, object], at_repo: None) -> None:
    """The guard can fail: one linear layer fewer in the preset derives other stages, another digest."""
    name, v = "preset as kimi_k3", NEWEST_MODELLED
    preset = golden.geometries()[name]
    fewer = replace(preset, linear_layer_ids=preset.linear_layer_ids[:-1])
    derive = recorded["derive"]
    assert isinstance(derive, dict)
    assert all(isinstance(stages, list) for _, stages in golden.derive_cases(name, fewer, v))  # derives
    assert golden.digest(golden.derive_cases(name, preset, v)) == derive[name][v]
    assert golden.digest(golden.derive_cases(name, fewer, v)) != derive[name][v]
