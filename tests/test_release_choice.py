"""The release a rank derives as: one choice (``checker.core.releases.releases.choose_release``), two names.

What a user relies on: the report says which SGLang is installed (``sglang_installed``) and, apart from
it, which release the values follow and who derived them (``derived_as``); a release number the checker
cannot read is one line and exit 2 naming where it came from (the flag, or the installed metadata),
never a traceback and never quietly another release; an installed release the checker does not model
(newer, a pre-release, a dev or local build) is derived by its own code, not refused and not modelled
as something it is not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import netns
import pytest

from checker.core.errors import FlagError
from checker.core.releases.releases import (
    FIRST_MODELLED,
    NEWEST_MODELLED,
    choose_release,
    installed_sglang_version,
    read_installed,
)

REPO = Path(__file__).resolve().parent.parent


# ---- the choice, as a table ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "installed", "engine", "derived_as", "source", "who", "own_code"),
    [
        (None, None, "builtin", NEWEST_MODELLED, "newest modelled; SGLang not installed", "builtin", False),
        (None, "0.5.16", "builtin", "0.5.16", "installed", "builtin", False),
        (None, "0.5.15.post1", "both", "0.5.15.post1", "installed", "both", False),
        ("0.5.16", "0.5.23", "builtin", "0.5.16", "--sglang-version", "builtin", False),
        ("0.5.16", None, "builtin", "0.5.16", "--sglang-version", "builtin", False),
        # An installed release the checker does not model: its own code, whatever the default engine.
        (None, "0.5.24", "builtin", "0.5.24", "installed", "sglang", True),
        (None, "0.5.24", "both", "0.5.24", "installed", "both", True),
        (None, "0.6.0rc2", "builtin", "0.6.0rc2", "installed", "sglang", True),
        (None, "0.5.23rc1", "builtin", "0.5.23rc1", "installed", "sglang", True),
        (None, "0.5.23+cu130", "sglang", "0.5.23+cu130", "installed", "sglang", True),
        ("0.5.24", "0.5.24", "builtin", "0.5.24", "--sglang-version", "sglang", True),
    ],
)
def test_one_choice_names_the_installed_and_the_derived_as_release(
    requested, installed, engine, derived_as, source, who, own_code
) -> None:
    c = choose_release(requested, installed, engine=engine)
    assert (c.installed, c.derived_as, c.source, c.engine, c.own_code) == (
        installed,
        derived_as,
        source,
        who,
        own_code,
    )
    assert c.label.startswith(f"SGLang {derived_as}") and c.label.endswith(f"({source})")
    # The checker's own pieces (input checks, budget formula, the builtin under both) use a modelled
    # release: the release itself, or the newest one standing in for one it does not model.
    assert c.modelled == (NEWEST_MODELLED if own_code else derived_as)
    if own_code:
        assert "derived by its own code" in c.label


def test_a_newer_installed_release_is_labelled_as_the_issue_asks() -> None:
    assert (
        choose_release(None, "0.5.24").label
        == "SGLang 0.5.24, newer than modelled: derived by its own code (installed)"
    )
    pre = choose_release(None, "0.5.23rc1").label
    assert "pre-release" in pre and "--sglang-version" not in pre


def test_best_effort_keeps_the_newest_model_for_a_newer_release() -> None:
    """--engine builtin --sglang-best-effort: the explicit way to model a newer release with the newest
    rules (the label says so); it does not apply to a release the checker merely does not model."""
    c = choose_release(None, "0.5.24", best_effort=True)
    assert (c.engine, c.own_code, c.best_effort, c.modelled) == ("builtin", False, True, NEWEST_MODELLED)
    assert f"modelled as {NEWEST_MODELLED}" in c.label
    assert choose_release(None, "0.5.23rc1", best_effort=True).own_code  # not newer: its own code


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("9" * 5000, "(5,000 chars) is not a release number"),
        ("0." + "5" * 4400 + ".23", "is not a release number"),
        ("０.５.２３", "is not a release number"),  # full-width digits: int() would read them
        ("0.5.23rc1", "is not a release number"),
        ("0.5.x", "is not a release number"),
    ],
)
def test_a_sglang_version_that_is_no_release_number_is_one_line(value: str, why: str) -> None:
    with pytest.raises(FlagError) as info:
        choose_release(value, None)
    msg = str(info.value)
    assert "--sglang-version" in msg and why in msg and "\n" not in msg and len(msg) < 300


def test_an_installed_version_that_is_no_release_number_names_the_metadata_not_a_flag() -> None:
    for text in ("garbage", "１.5.23", "0.5"):
        with pytest.raises(FlagError) as info:
            choose_release(None, text)
        msg = str(info.value)
        assert "installed SGLang reports version" in msg and "METADATA" in msg
        assert not msg.startswith("--sglang-version")


def test_installed_releases_older_than_the_first_modelled_have_no_pool() -> None:
    with pytest.raises(FlagError, match=f"older than the first modelled release {FIRST_MODELLED}"):
        choose_release(None, "0.5.1.post3")
    assert read_installed("0.5.2rc1").key < read_installed("0.5.2").key < read_installed("0.5.2.post1").key
    assert read_installed("0.5.24.dev1").key < read_installed("0.5.24a1").key < read_installed("0.5.24").key


def test_engine_sglang_with_another_sglang_version_is_refused() -> None:
    """--engine sglang runs the INSTALLED code: asking it to be another release would label one
    release's numbers with another's name."""
    with pytest.raises(FlagError, match="names another release"):
        choose_release("0.5.16", "0.5.23", engine="sglang")
    assert choose_release("0.5.23", "0.5.23", engine="both").engine == "both"


def test_commands_that_only_model_refuse_an_unmodelled_install() -> None:
    with pytest.raises(FlagError, match="derive and check run that release's own code"):
        choose_release(None, "0.5.24", own_code=False)


def test_unreadable_installed_metadata_is_one_line(tmp_path: Path) -> None:
    """A damaged dist-info (not UTF-8) on one node must be that node's error, not a traceback."""
    info = tmp_path / "sglang-0.5.16.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.\xff\xfe16\n")
    with pytest.raises(FlagError) as exc:
        installed_sglang_version([str(tmp_path)])
    assert "cannot be read" in str(exc.value) or "not a release number" in str(exc.value)


# ---- through the command line ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "9" * 5000, "０.５.２３"])
def test_derive_refuses_a_bad_sglang_version_in_one_line(cli, value: str) -> None:
    r = cli(["derive", "--sglang-version", value])
    assert r.rc == 2 and r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err and "--sglang-version" in lines[0], r.err[-300:]


def test_derive_json_names_both_releases(cli) -> None:
    r = cli(["derive", "--pp-size", "4", "--sglang-version", "0.5.17", "--format", "json"])
    assert r.rc == 0, r.err
    inputs = json.loads(r.out)["inputs"]
    assert inputs["derived_as"] == "SGLang 0.5.17 (--sglang-version)"
    assert inputs["sglang_installed"] == (installed_sglang_version() or "not installed")
    assert "sglang_version" not in inputs


def _run(args: list[str], site: Path, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": netns.python_path(site), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "checker", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_an_installed_pre_release_is_derived_by_its_own_code_not_misread_as_a_flag(tmp_path: Path) -> None:
    """0.5.23rc1 installed (metadata only here, so its code cannot import): the checker reads it as the
    pre-release pip means, tries its own code, and says so in one line; it never claims the user gave
    --sglang-version 0.5.23rc1."""
    site = netns.release_site(tmp_path, "0.5.23rc1")
    proc = _run(["derive", "--model-config", str(REPO / "tests/fixtures/qwen3_next_80b_a3b.json")], site)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "0.5.23rc1" in line and "does not import" in line and "--sglang-version '0.5.23rc1'" not in line
    assert "--engine sglang/both" not in line  # the user asked for no engine: the release did


@pytest.mark.slow
def test_check_turns_a_bad_sglang_version_into_an_error_report(tmp_path: Path) -> None:
    from harness import run_world

    argv = ["check", "--model", "kimi-k3", "--budget-gib", "8", "--allow-single-rank", "--timeout-s", "60"]
    res = run_world([*argv, "--sglang-version", "9" * 5000], world_size=1, tmp_path=tmp_path)
    assert res.codes == [2], res.ranks[0].stderr[-400:]
    rep = res.report()
    assert rep["status"] == "error" and "is not a release number" in rep["errors"][0]
    assert "Traceback" not in res.ranks[0].stderr
