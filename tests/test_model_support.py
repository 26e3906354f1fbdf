"""A release that cannot load the model gets an error naming where the architecture arrived, not a pool.

SGLang loads a model through its registry: the ``EntryClass`` of each module of ``sglang/srt/models``.
``checker/core/releases/model_registry.py`` records, per architecture, the modelled releases that register it
(built from the wheels by scripts/build_model_support.py). What a user relies on: ``derive`` on a
release without the model's class exits 2 in one line naming the release where it arrived, and a
release that has it derives as before; the table says what the wheels say (the ``slow`` test reads
every wheel it finds in the wheel folder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from checker.core.errors import FlagError
from checker.core.releases.model_registry import REGISTERED
from checker.core.releases.model_support import arrived_in, check_architectures, registers
from checker.core.releases.releases import MODELLED_RELEASES

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
WHEELS = Path(os.environ.get("CHECKER_SGLANG_WHEELS", Path.home() / ".cache" / "pp-checker" / "wheels"))


@pytest.mark.parametrize(
    ("argv", "release", "arch", "first", "ok"),
    [
        (["--model", "kimi-k3"], "0.5.16", "KimiK3ForConditionalGeneration", "0.5.17", "0.5.17"),
        # No model named: derive uses the default preset, and checks it the same (was accepted on 0.5.16).
        ([], "0.5.16", "KimiK3ForConditionalGeneration", "0.5.17", "0.5.17"),
        (
            ["--model-config", str(FIXTURES / "granite_4_0_h_small.json")],
            "0.5.8.post1",
            "GraniteMoeHybrid",
            "0.5.9",
            "0.5.9",
        ),
        (
            ["--model-config", str(FIXTURES / "qwen3_5_397b_a17b.json")],
            "0.5.8",
            "Qwen3_5Moe",
            "0.5.9",
            "0.5.9",
        ),
        (
            ["--model-config", str(FIXTURES / "falcon_h1_0_5b.json")],
            "0.5.2",
            "FalconH1ForCausalLM",
            "0.5.3",
            "0.5.3.post2",
        ),
    ],
    ids=["kimi-k3", "default-model", "granite-4.0-h", "qwen3.5", "falcon-h1"],
)
def test_derive_on_a_release_without_the_models_class_names_where_it_arrived(
    cli, argv: list[str], release: str, arch: str, first: str, ok: str
) -> None:
    """``ok``: the first release that also sizes a pool for it (FalconH1 loads from 0.5.3, gets a pool
    from 0.5.3.post2: FamilyFacts.pool)."""
    r = cli(["derive", *argv, "--pp-size", "1", "--disable-radix-cache", "--sglang-version", release])
    assert r.rc == 2 and r.out == "", r.out[-300:]
    (line,) = r.err.strip().splitlines()
    assert f"SGLang {release} cannot load" in line and arch in line and f"arrived in SGLang {first}" in line
    res = cli(["derive", *argv, "--pp-size", "1", "--budget-gib", "40", "--sglang-version", ok])
    assert res.rc == 0, res.err


def test_an_external_model_package_is_not_second_guessed(cli) -> None:
    """SGLANG_EXTERNAL_MODEL_PACKAGE registers classes of the user's (0.5.6+): the checker cannot see
    them, so it does not refuse the model."""
    argv = [
        "derive",
        "--model",
        "kimi-k3",
        "--pp-size",
        "4",
        "--sglang-version",
        "0.5.16",
        "--format",
        "json",
    ]
    r = cli(argv, env={"SGLANG_EXTERNAL_MODEL_PACKAGE": "my_models"})
    assert r.rc == 0, r.err
    assert json.loads(r.out)["inputs"]["derived_as"] == "SGLang 0.5.16 (--sglang-version)"


def test_a_model_spec_names_no_architecture_and_is_not_checked(cli) -> None:
    spec = str(FIXTURES / "kimi_k3_shape_spec.json")
    assert cli(["derive", "--model-config", spec, "--pp-size", "4", "--sglang-version", "0.5.16"]).rc == 0


def test_the_table_answers_per_release() -> None:
    assert arrived_in("KimiK3ForConditionalGeneration") == "0.5.17"
    assert not registers("0.5.16", "KimiK3ForConditionalGeneration")
    assert all(registers(v, "Qwen3NextForCausalLM") for v in MODELLED_RELEASES)
    check_architectures("0.5.2", ["NoSuchArch", "Qwen3NextForCausalLM"], model="m", env={})  # any one
    with pytest.raises(FlagError, match="no release from 0.5.2 to 0.5.23 registers it"):
        check_architectures("0.5.23", ["NoSuchArch"], model="m", env={})
    assert all(
        a in MODELLED_RELEASES and b in MODELLED_RELEASES for spans in REGISTERED.values() for a, b in spans
    )


@pytest.mark.slow
def test_the_table_is_what_each_wheel_registers() -> None:
    """Every modelled release whose wheel is in the wheel folder (scripts/build_model_support.py puts them
    there): the table's answer is exactly that wheel's registry, architecture by architecture."""
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    import sglang_wheels

    found = {v: next(iter(sorted(WHEELS.glob(f"sglang-{v}-*.whl"))), None) for v in MODELLED_RELEASES}
    found = {v: w for v, w in found.items() if w is not None}
    if not found:
        pytest.skip(f"no SGLang wheel in {WHEELS}: run scripts/build_model_support.py to fetch them")
    for v in (min(found, key=MODELLED_RELEASES.index), max(found, key=MODELLED_RELEASES.index)):
        wheel_archs = set(sglang_wheels.registered_architectures(found[v]))
        table_archs = {a for a in REGISTERED if registers(v, a)}
        assert table_archs == wheel_archs, (v, sorted(table_archs ^ wheel_archs)[:10])
