"""Every generated file, its generator (scripts/regenerate.py GENERATORS), and the one release table.

The releases are ``checker.core.releases.releases.MODELLED_RELEASES``. A release added there and not
regenerated,
a generated file nobody registered, or a table its generator would now write differently, fails here:

* quick: the registry matches the tree (every file that says GENERATED is an output; every output and
  generator exists), every release-keyed table covers the modelled releases, the CPU environments'
  view (scripts/sglang_envs.py) follows the table and the wheels' own pins, and ``--check`` catches an
  output edited by hand;
* slow: each generator reading the wheels or only this tree is run again in a scratch copy and its
  outputs compared byte for byte (skipped, with the reason, where a modelled release's wheel is not in
  the wheel folder: nothing here downloads). The generators that need the SGLang CPU environments are
  held per release by the engine group instead (``-m sglang``: the launch flags by
  test_launch_command.py, the weights figures by test_weights.py's live classes).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from checker.core.releases.releases import MODELLED_RELEASES, NEWEST_MODELLED, release_key, release_model
from checker.engines.sglang import SUPPORTED_VERSIONS

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import regenerate  # noqa: E402
import sglang_envs  # noqa: E402

GENERATED_HOMES = ("checker", "tests/fixtures", "examples")
"""Where generated files live (the generators themselves, under scripts/, name the marker too)."""


def _outputs() -> dict[str, regenerate.Generator]:
    return {out: g for g in regenerate.GENERATORS for out in g.outputs}


def _covered(gen: regenerate.Generator) -> set[str]:
    """The modelled releases ``gen``'s output says it was built from (see Generator.covers)."""
    assert gen.covers is not None
    where, _, name = gen.covers.partition(":")
    value: Any
    if where.endswith(".json"):
        value = json.loads((REPO / where).read_text())[name]
    else:
        value = getattr(importlib.import_module(where), name)
    items = list(value)
    if items and all(isinstance(i, tuple) and len(i) == 2 for i in items):  # runs (first, last)
        return {
            v
            for first, last in items
            for v in MODELLED_RELEASES
            if release_key(first) <= release_key(v) <= release_key(last)
        }
    return {str(v) for v in items}


# ---- the registry and the tree ------------------------------------------------------------------------


def test_every_file_that_says_generated_is_registered_with_its_generator() -> None:
    """A table someone generated but nobody registered would go stale unseen: each file that calls
    itself GENERATED in its first lines is an output of exactly one registered generator."""
    marked = {
        str(p.relative_to(REPO))
        for home in GENERATED_HOMES
        for p in (REPO / home).rglob("*.py")
        if "GENERATED" in p.read_text(errors="replace")[:600]
    }
    assert marked, "no generated file found: the marker changed?"
    assert marked <= set(_outputs()), sorted(marked - set(_outputs()))


def test_every_registered_generator_and_output_exists() -> None:
    names = [g.name for g in regenerate.GENERATORS]
    assert len(names) == len(set(names)), names
    assert len(_outputs()) == sum(len(g.outputs) for g in regenerate.GENERATORS), "an output registered twice"
    for g in regenerate.GENERATORS:
        script = REPO / g.script
        assert script.is_file(), g.script
        assert "def main(" in script.read_text(), (
            f"{g.script}: a generator is a script with main(argv) -> int"
        )
        assert g.needs in (regenerate.WHEELS, regenerate.ENVIRONMENTS, regenerate.CHECKER), g
        for out in g.outputs:
            assert (REPO / out).is_file(), f"{out}: registered for {g.script} but not in the tree"


@pytest.mark.parametrize("gen", [g for g in regenerate.GENERATORS if g.covers], ids=lambda g: g.name)
def test_each_generated_table_covers_the_modelled_releases(gen: regenerate.Generator) -> None:
    """A release added to the table (its group in checker/core/releases/releases.py) shows here until
    ``python3 scripts/regenerate.py`` has run; a sampled table (the weights figures) names only modelled
    releases and the newest of them."""
    covered = _covered(gen)
    hint = f"run python3 scripts/regenerate.py --only {gen.name}"
    if gen.sample:
        assert covered <= set(MODELLED_RELEASES), (sorted(covered - set(MODELLED_RELEASES)), hint)
        assert NEWEST_MODELLED in covered, hint
    else:
        assert covered == set(MODELLED_RELEASES), (sorted(set(MODELLED_RELEASES) ^ covered), hint)


def test_check_names_an_output_edited_by_hand(tmp_path: Path) -> None:
    """The guard can fail: a generated file changed by hand in a copy of the tree is named stale, with
    the command that rebuilds it, and the others are not."""
    copy = tmp_path / "repo"
    regenerate.scratch_copy(copy)
    (gen,) = regenerate.by_name(["example_logs"])
    log = copy / "examples" / "logs" / "node0.log"
    assert regenerate.stale([gen], regenerate.WHEEL_DIR, 120, repo=copy, verbose=False) == []
    log.write_text(log.read_text().replace("Load weight end.", "Load weights end.", 1))
    assert regenerate.stale([gen], regenerate.WHEEL_DIR, 120, repo=copy, verbose=False) == [
        "examples/logs/node0.log: stale against tests/postflight_logs.py "
        "(python3 scripts/regenerate.py --only example_logs)"
    ]


def test_check_of_an_unknown_generator_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        regenerate.main(["--check", "--only", "flag_table"])
    assert "no generator named flag_table (known: model_registry, " in str(exc.value.code)


# ---- the SGLang CPU environments follow the release table ---------------------------------------------


def test_the_environments_are_the_releases_the_engine_runs() -> None:
    assert sglang_envs.engine_releases() == tuple(SUPPORTED_VERSIONS)
    assert set(sglang_envs.ci_releases()) <= set(SUPPORTED_VERSIONS)
    assert sglang_envs.ci_releases()[-1] == NEWEST_MODELLED, "CI runs the newer-release tests on the newest"


def test_every_release_the_engine_runs_is_in_one_engine_group_that_ci_runs() -> None:
    """The engine groups are consecutive and cover every release the engine runs, each with the release
    CI tests inside it: a release added to the table without a group fails here (extend the newest
    group, or add one: scripts/sglang_envs.py ENGINE_GROUPS)."""
    for v in SUPPORTED_VERSIONS:
        group = sglang_envs.engine_group(v)
        assert group is not None, f"{v}: in no engine group (scripts/sglang_envs.py ENGINE_GROUPS)"
    for g in sglang_envs.ENGINE_GROUPS:
        assert release_key(g.first) <= release_key(g.runs) <= release_key(g.last), g
        assert g.runs in SUPPORTED_VERSIONS, g
    firsts = [SUPPORTED_VERSIONS.index(g.first) for g in sglang_envs.ENGINE_GROUPS]
    lasts = [SUPPORTED_VERSIONS.index(g.last) for g in sglang_envs.ENGINE_GROUPS]
    assert firsts[0] == 0 and lasts[-1] == len(SUPPORTED_VERSIONS) - 1
    assert [f - 1 for f in firsts[1:]] == lasts[:-1], "the engine groups leave a gap or overlap"


ENGINE_BLIND = {"group", "pp_with_spec"}
"""Rules the engine's code path does not exercise: the group's name, and whether the release starts
EAGLE under PP (a start-up refusal, check_server_args, which the engine does not run)."""


def test_the_release_ci_runs_stands_for_its_engine_group_s_sizing_rules() -> None:
    """Each release of an engine group sizes by the rules of the release CI tests for it, but for what
    the engine does not run (0.5.21 starts EAGLE under PP, 0.5.20 refuses it): any other difference is
    a sizing group the engine group would leave untested."""
    for g in sglang_envs.ENGINE_GROUPS:
        tested = release_model(g.runs).rules
        for v in SUPPORTED_VERSIONS:
            if sglang_envs.engine_group(v) != g:
                continue
            rules = release_model(v).rules
            differ = {
                f.name for f in dataclasses.fields(rules) if getattr(rules, f.name) != getattr(tested, f.name)
            }
            assert differ <= ENGINE_BLIND, (g.runs, v, sorted(differ - ENGINE_BLIND))


def test_each_release_pins_the_transformers_its_wheel_requires() -> None:
    """The pins the environments install are each wheel's own Requires-Dist (a release that moved to
    another transformers fails here until scripts/sglang_envs.py TRANSFORMERS says so)."""
    checked = 0
    for v in MODELLED_RELEASES:
        pin = sglang_envs.transformers_pin(v)
        wheel = next(iter(sorted(regenerate.WHEEL_DIR.glob(f"sglang-{v}-*.whl"))), None)
        if pin is None or wheel is None:
            continue
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(f"sglang-{v}.dist-info/METADATA").decode()
        required = [
            ln.split("==", 1)[1].split(";")[0].strip()
            for ln in meta.splitlines()
            if ln.startswith("Requires-Dist: transformers==")
        ]
        assert required == [pin], (v, required, pin)
        checked += 1
    if not checked:
        pytest.skip(f"no wheel of a release from 0.5.9 on in {regenerate.WHEEL_DIR}")


def test_a_release_s_import_path_has_the_kernel_stub_where_it_imports_sgl_kernel() -> None:
    home = Path("/h")
    assert sglang_envs.import_path("0.5.12.post1", home).split(":")[0].endswith("sglang_stubs/kernel")
    assert sglang_envs.import_path("0.5.13", home).split(":") == [
        str(sglang_envs.STUBS),
        "/h/releases/0.5.13",
    ]


# ---- each output is what its generator writes (slow: the generators read 38 wheels) --------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "gen", [g for g in regenerate.GENERATORS if g.needs != regenerate.ENVIRONMENTS], ids=lambda g: g.name
)
def test_each_output_is_what_its_generator_writes(gen: regenerate.Generator) -> None:
    """The generator run again, on every modelled release's wheel, in a scratch copy of this tree: its
    outputs are byte for byte the ones checked in (the diff is printed when not)."""
    why = regenerate.missing_inputs(gen)
    if why:
        pytest.skip(f"{gen.name}: {why} (nothing here downloads; python3 scripts/regenerate.py fetches them)")
    assert regenerate.stale([gen], regenerate.WHEEL_DIR, 1800) == []
