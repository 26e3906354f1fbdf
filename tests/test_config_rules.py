"""Green means SGLang loads this config.json: what a release's config class refuses is refused here.

SGLang reads a model's config.json through its own config class (``configs/<family>.py``) and builds the
model class from its layer types; each checks fields in its own way, and the checks changed between
releases (Nemotron-H's layer pattern was a regular expression up to 0.5.9, a set of characters from
0.5.10). A config a release refuses stops the server, so the checker refuses it too: one line naming
the release, the field as written and the release's ``file:line`` (checker/core/releases/config_rules.py, the
lines from checker/core/releases/config_lines.py, generated from every release's code). What a user relies on:
the issue's Nemotron-H patterns (a lower-case ``m``, a space, a trailing newline, terminal escapes) are
refused, never counted as attention layers; every case of tests/config_cases.py is refused on the
releases whose code refuses it and derives on the others; the table is what the code says (``slow``,
where the sources are); and the installed release's own config class refuses exactly these
(``sglang``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

import pytest
from config_cases import CASES, FIXTURES, NEMOTRON_PATTERN, Case

from checker.core.errors import ConfigError, printable
from checker.core.releases.config_lines import WHERE
from checker.core.releases.config_rules import where
from checker.core.releases.model_support import registers
from checker.core.releases.releases import MODELLED_RELEASES
from checker.families.geometry import geometry_from_hf_config
from checker.families.rules import check_config

REPO = Path(__file__).resolve().parent.parent
SRC = Path(os.environ.get("CHECKER_SGLANG_SRC", Path.home() / ".cache" / "pp-checker" / "src"))
WHEELS = Path(os.environ.get("CHECKER_SGLANG_WHEELS", Path.home() / ".cache" / "pp-checker" / "wheels"))
ARCH = {
    "nemotron_h_8b": "NemotronHForCausalLM",
    "falcon_h1_0_5b": "FalconH1ForCausalLM",
    "granite_4_0_h_small": "GraniteMoeHybridForCausalLM",
    "kimi_linear_48b_a3b": "KimiLinearForCausalLM",
    "kimi_k3_config": "KimiK3ForConditionalGeneration",
    "qwen3_next_80b_a3b": "Qwen3NextForCausalLM",
    "qwen3_5_397b_a17b": "Qwen3_5MoeForConditionalGeneration",
}


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


# -- the cases, through the commands ------------------------------------------------------------


PATTERNS = {
    "lower-m": NEMOTRON_PATTERN[:5] + "m" + NEMOTRON_PATTERN[6:],
    "space": NEMOTRON_PATTERN[:5] + " " + NEMOTRON_PATTERN[6:],
    "newline": NEMOTRON_PATTERN + "\n",
    "escapes": NEMOTRON_PATTERN[:3] + "\x1b[2J" + NEMOTRON_PATTERN[7:],
}
# Read from each release's code: 0.5.23 raises ValueError in _pattern_to_list; 0.5.9's assert
# re.match(r"^[*\-ME]+$", ...) lets a final newline through ($ matches before it) and its model then has
# no layer class for it.
WHERE_READ = {
    ("0.5.23", "lower-m"): "configs/nemotron_h.py:500",
    ("0.5.23", "newline"): "configs/nemotron_h.py:500",
    ("0.5.9", "lower-m"): "configs/nemotron_h.py:227",
    ("0.5.9", "space"): "configs/nemotron_h.py:227",
    ("0.5.9", "escapes"): "configs/nemotron_h.py:227",
    ("0.5.9", "newline"): "models/nemotron_h.py:573",
}


def _nemotron(tmp_path: Path, shape: str) -> Path:
    data = json.loads((FIXTURES / "nemotron_h_8b.json").read_text())
    data["hybrid_override_pattern"] = PATTERNS[shape]
    data["num_hidden_layers"] = len(PATTERNS[shape])
    return _write(tmp_path, data)


def _says(line: str, release: str, path: Path, shape: str) -> None:
    assert f"SGLang {release} cannot load {path}: hybrid_override_pattern=" in line, line
    assert f"sglang/srt/{WHERE_READ[(release, shape)]}); fix it in the model config" in line, line
    for raw in ("\x1b", "\r", "\n"):
        assert raw not in line


@pytest.mark.parametrize(("release", "shape"), sorted(WHERE_READ))
@pytest.mark.parametrize(
    "command",
    [["derive", "--budget-gib", "8"], ["plan", "--target-max-running-requests", "8"]],
    ids=["derive", "plan"],
)
def test_a_nemotron_pattern_sglang_refuses_is_refused_naming_the_field_and_line(
    cli, tmp_path, release, shape, command
):
    """A lower-case m, a space, a trailing newline or terminal escapes in hybrid_override_pattern: the
    checker counted the stray characters as attention layers and was green ("52 layers, 23 linear";
    with escapes "27 layers, 1 linear"), while 0.5.23's config class raises at load and 0.5.9 fails
    building the model. Now one line, exit 2, naming the release, the field and where in SGLang."""
    path = _nemotron(tmp_path, shape)
    res = cli([*command, "--model-config", str(path), "--pp-size", "1", "--sglang-version", release])
    assert res.rc == 2 and res.out == "", res
    (line,) = res.err.strip().splitlines()
    _says(line, release, path, shape)


def test_check_refuses_it_on_every_rank_as_an_error(cli, tmp_path):
    path = _nemotron(tmp_path, "lower-m")
    argv = ["--budget-gib", "8", "--allow-single-rank", "--pp-size", "1", "--sglang-version", "0.5.23"]
    res = cli(["check", *argv, "--model-config", str(path), "-q"])
    assert res.rc == 2 and "consistent" not in res.out, res
    (line,) = res.out.strip().splitlines()
    assert line.startswith("checker verdict error: rank 0 ("), line
    _says(line, "0.5.23", path, "lower-m")


def test_without_a_release_no_stray_character_is_counted_as_a_layer():
    """The geometry reader, whatever the release (a newer one derived best-effort): every release refuses
    a character outside M * - E, so no count is made of them."""
    data = json.loads((FIXTURES / "nemotron_h_8b.json").read_text())
    for pattern in PATTERNS.values():
        with pytest.raises(ConfigError, match="hybrid_override_pattern=.* has .* at layer"):
            geometry_from_hf_config({**data, "hybrid_override_pattern": pattern}, tp_size=1, source="c")


# -- every case, on the releases that change -------------------------------------------------------------


def _releases(case: Case) -> list[str]:
    """The releases that register the family: the first, the last, and each side of every boundary."""
    arch = ARCH[case.fixture]
    loads = [v for v in MODELLED_RELEASES if registers(v, arch)]
    wanted = {loads[0], loads[-1]}
    for first, last, _ in case.refused:
        i, j = MODELLED_RELEASES.index(first), MODELLED_RELEASES.index(last)
        wanted |= {first, last}
        wanted |= {MODELLED_RELEASES[k] for k in (i - 1, j + 1) if 0 <= k < len(MODELLED_RELEASES)}
    return [v for v in MODELLED_RELEASES if v in wanted and v in loads]


MATRIX = [(case, v) for case in CASES for v in _releases(case)]


@pytest.mark.parametrize(("case", "release"), MATRIX, ids=[f"{c.name}-{v}" for c, v in MATRIX])
def test_each_case_is_refused_exactly_where_the_release_refuses_it(case, release):
    rule = case.rule_of(release, MODELLED_RELEASES)
    data = case.config()
    if rule is None:
        check_config(release, data, source="c.json")
        return
    with pytest.raises(ConfigError) as exc:
        check_config(release, data, source="c.json")
    line = str(exc.value)
    assert line.startswith(f"SGLang {release} cannot load c.json: {case.key}="), line
    assert f"sglang/srt/{where(rule, release)})" in line and where(rule, release) is not None, (line, rule)
    assert line == printable(line) and "\n" not in line


@pytest.mark.parametrize("fixture", sorted(ARCH))
def test_each_familys_real_config_loads_on_every_release_that_registers_it(fixture):
    data = json.loads((FIXTURES / f"{fixture}.json").read_text())
    for release in MODELLED_RELEASES:
        if registers(release, ARCH[fixture]):
            check_config(release, data, source="c.json")


def test_a_release_that_loads_a_case_derives_it_as_it_reads_it(cli, tmp_path):
    """granite's "linear_attention" / "full_attention" (transformers 5.15's names): 0.5.9-0.5.18 refuse
    them, 0.5.19+ map them back, so there they are the same model as "mamba" / "attention"."""
    (case,) = [c for c in CASES if c.name == "granite-new-names"]
    renamed = _write(tmp_path, case.config())
    argv = ["derive", "--budget-gib", "8", "--pp-size", "1", "--format", "json", "--sglang-version"]
    new = cli([*argv, "0.5.19", "--model-config", str(renamed)])
    old = cli([*argv, "0.5.19", "--model-config", str(FIXTURES / "granite_4_0_h_small.json")])
    assert new.rc == old.rc == 0, new.err
    assert json.loads(new.out)["ranks"] == json.loads(old.out)["ranks"]
    refused = cli([*argv, "0.5.18", "--model-config", str(renamed)])
    assert refused.rc == 2 and "granitemoehybrid.py:" in refused.err, refused.err


def test_falcon_h1_without_mamba_d_ssm_is_sized_with_the_class_default(tmp_path):
    """FalconH1Config's mamba_d_ssm defaults to 1024 in every release (null means expand * hidden): a
    config that leaves it out was sized with expand * hidden_size (2048 for the 0.5B)."""
    data = json.loads((FIXTURES / "falcon_h1_0_5b.json").read_text())
    del data["mamba_d_ssm"]
    data.update(mamba_n_heads=16, mamba_d_head="auto")
    g = geometry_from_hf_config(data, tp_size=1, source="c")
    groups, state = data["mamba_n_groups"], data["mamba_d_state"]
    assert g.conv_shapes == ((1024 + 2 * groups * state, data["mamba_d_conv"] - 1),)
    assert g.temporal_shape == (16, 1024 // 16, state)


# -- the table is what each release's code says ---------------------------------------------------------


def test_every_release_that_loads_a_family_has_its_checks():
    """A check found in a family's first release and gone in a later one is an anchor that moved (a
    rewording), not a check SGLang dropped, unless a successor rule takes over there."""
    successors = {
        "nemotron_h.pattern_range": "nemotron_h.pattern_regex",
        "nemotron_h.pattern_regex": "nemotron_h.pattern_chars",
        "nemotron_h.pattern_length": "nemotron_h.pattern_chars",
    }
    # Checks a later release fixed rather than moved: 0.5.3.post1's mamba2_cache_params sizes Falcon-H1's
    # state from mamba_intermediate (configs/falcon_h1.py:307), where 0.5.3's hybrid_gdn_params read
    # mamba_d_ssm itself (:333).
    fixed = {"falcon_h1.d_ssm_null_state": "0.5.3"}
    for rule, spans in WHERE.items():
        last = MODELLED_RELEASES.index(spans[-1][1])
        covered = {v for first, end, _ in spans for v in MODELLED_RELEASES[
            MODELLED_RELEASES.index(first) : MODELLED_RELEASES.index(end) + 1]}  # fmt: skip
        start = MODELLED_RELEASES.index(spans[0][0])
        gaps = [v for v in MODELLED_RELEASES[start : last + 1] if v not in covered]
        assert not gaps, (rule, gaps)
        if rule in fixed:
            assert spans[-1][1] == fixed[rule], (rule, spans)
        elif last < len(MODELLED_RELEASES) - 1:
            assert rule in successors, f"{rule} ends at {MODELLED_RELEASES[last]}: a moved anchor?"
            assert where(successors[rule], MODELLED_RELEASES[last + 1]) is not None


@pytest.mark.slow
def test_the_table_is_what_each_releases_code_says():
    """Every modelled release whose sources or wheel are here, read again by
    scripts/build_config_rules.py's own reading: every rule's file:line equals the table's."""
    sys.path.insert(0, str(REPO / "scripts"))
    import build_config_rules

    src = next((p for p in (SRC, Path("/work/sglang-src")) if p.is_dir()), SRC)
    here = [
        v for v in MODELLED_RELEASES if (src / v / "sglang").is_dir() or any(WHEELS.glob(f"sglang-{v}-*.whl"))
    ]
    if not here:
        pytest.skip(
            f"no SGLang sources in {SRC} nor wheels in {WHEELS}: scripts/build_config_rules.py fetches them"
        )
    for v in here:
        found = build_config_rules.read_release(v, WHEELS, src)
        table = {rule: where(rule, v) for rule in WHERE if where(rule, v) is not None}
        assert found == table, (
            v,
            {
                k: (found.get(k), table.get(k))
                for k in set(found) | set(table)
                if found.get(k) != table.get(k)
            },
        )


# -- the installed release's own config class ------------------------------------------------------------


def _sglang_loads(data: dict, family: str) -> BaseException | None:
    """What the installed SGLang does with ``data``: its get_config (its config class registered over
    transformers'), then the layer types a model class reads (Qwen3-Next's ``layers_block_type``)."""
    try:
        from sglang.srt.utils.hf_transformers_utils import get_config
    except ImportError:
        from sglang.srt.utils.hf_transformers.config import get_config
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps(data))
        try:
            config = get_config(tmp, trust_remote_code=False)
            text = getattr(config, "text_config", config) if family.startswith("qwen3_5") else config
            if hasattr(type(text), "layers_block_type"):
                text.layers_block_type  # noqa: B018  (the property raises what building the model would)
        except Exception as exc:  # noqa: BLE001  (any refusal counts; which one is compared below)
            return exc
    return None


@pytest.mark.sglang
@pytest.mark.parametrize("case", [c for c in CASES if not c.sglang_accepts], ids=lambda c: c.name)
def test_the_installed_releases_own_config_class_refuses_exactly_these(sglang_engine, case):
    """The installed release loads each case with its own code (its config class, on top of the
    transformers it pins, which may refuse first): it refuses exactly where the checker does, and
    where the refusal comes from SGLang's own config class, at the line the checker names."""
    release = sglang_engine.version
    if not registers(release, ARCH[case.fixture]):
        pytest.skip(f"SGLang {release} does not register {ARCH[case.fixture]}")
    error = _sglang_loads(case.config(), case.fixture)
    rule = case.rule_of(release, MODELLED_RELEASES)
    if rule is None or rule.endswith(".layer_class"):  # a model-build refusal: not at load
        assert error is None, (release, case.name, repr(error)[:300])
        return
    assert error is not None, f"SGLang {release} loads {case.name}; the checker refuses it ({rule})"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "sglang/srt/configs/" in f.filename]
    if frames:
        seen = f"configs/{frames[-1].filename.rsplit('/configs/', 1)[1]}:{frames[-1].lineno}"
        with pytest.raises(ConfigError) as exc:
            check_config(release, case.config(), source="c.json")
        assert seen in str(exc.value), (seen, str(exc.value))
