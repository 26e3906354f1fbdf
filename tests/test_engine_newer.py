"""Release day: an installed SGLang newer than the newest modelled one is derived by its own code.

Run against each release of the SGLang CPU environment (``scripts/sglang_cpu_env.sh``). The newer
release is the installed one under a higher version number: a folder that links every entry of the
installed release's ``--target`` folder except its ``sglang-X.dist-info``, which is copied with
``Version: 0.9.0`` in its METADATA. Its code is then a real release's, and what the checker derives for
it must be exactly what that release's model derives; the reports must say who derived it. A changed
release is a release whose sizing reads an input the checker does not know: the installed class's
sizing method is wrapped to read one, and the run must fail in one line naming it (exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parent.parent
STUBS = REPO / "scripts" / "sglang_stubs"
# A class that starts under PP (Qwen3-Next's constructor asserts a single stage: tested below).
QWEN = str(REPO / "tests" / "fixtures" / "qwen3_5_397b_a17b.json")
QWEN3_NEXT = str(REPO / "tests" / "fixtures" / "qwen3_next_80b_a3b.json")
NEWER = "0.9.0"
TIMEOUT_S = 300  # a cold SGLang import under a loaded 2-core machine takes up to a minute


def renamed_release(installed: str, root: Path, version: str = NEWER) -> Path:
    """The installed release's folder seen as SGLang ``version`` (metadata only: the code is the same)."""
    import sglang

    target = Path(sglang.__file__).resolve().parent.parent
    info = target / f"sglang-{installed}.dist-info"
    assert info.is_dir(), f"{info}: the installed release's dist-info (scripts/sglang_cpu_env.sh layout)"
    site = root / f"site-{version}"
    site.mkdir(parents=True)
    for entry in target.iterdir():
        if entry.name != info.name and not entry.name.startswith("."):
            (site / entry.name).symlink_to(entry)
    copy = site / f"sglang-{version}.dist-info"
    shutil.copytree(info, copy)
    meta = copy / "METADATA"
    meta.write_text(
        "".join(
            f"Version: {version}\n" if line.startswith("Version:") else line
            for line in meta.read_text().splitlines(keepends=True)
        )
    )
    return site


def _env(site: Path | None) -> dict[str, str]:
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if site is not None:  # the renamed release ahead of the real one
        inherited = [str(STUBS), str(site), *(p for p in inherited if p != str(STUBS))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["PYTHONPATH"] = os.pathsep.join([*inherited, str(REPO)])
    return env


def _checker(args: list[str], site: Path | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "checker", *args],
        cwd=REPO,
        env=_env(site),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _values(doc: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    names = ("max_mamba_cache_size", "max_running_requests", "pp_max_micro_batch_size", "stage_per_req_bytes")
    return [tuple(r[n] for n in names) for r in doc["ranks"]]


def test_a_newer_release_is_derived_by_its_own_code(sglang_engine, tmp_path: Path) -> None:
    """derive on "0.9.0" (the installed release's code): no refusal, no --sglang-best-effort; the
    launch command is read by the release's own parser (there is no table of 0.9.0's flags); the JSON
    names the installed release and who derived; the values are the real release's model's."""
    site = renamed_release(sglang_engine.version, tmp_path)
    launch = ["--", "python", "-m", "sglang.launch_server", "--model-path", QWEN, "--pp-size", "4"]
    proc = _checker(["derive", "--budget-gib", "16", "--format", "json", *launch], site)
    assert proc.returncode == 0, proc.stderr[-800:]
    doc = json.loads(proc.stdout)
    assert doc["engine"] == "sglang" and doc["drift"] == []
    assert doc["inputs"]["sglang_installed"] == NEWER
    assert (
        doc["inputs"]["derived_as"]
        == f"SGLang {NEWER}, newer than modelled: derived by its own code (installed)"
    )
    assert f"SGLang {NEWER}'s own ServerArgs parser" in doc["inputs"]["launch_command"]
    model = _checker(
        [
            "derive",
            "--model-config",
            QWEN,
            "--pp-size",
            "4",
            "--budget-gib",
            "16",
            "--format",
            "json",
            "--sglang-version",
            sglang_engine.version,
        ],
        None,
    )
    assert model.returncode == 0, model.stderr[-800:]
    assert _values(doc) == _values(json.loads(model.stdout))


def test_mixed_nodes_are_compared_as_usual(sglang_engine, tmp_path: Path) -> None:
    """Rank 0 on the newer release (its own code), rank 1 on the modelled one (the builtin model): the
    same code underneath, so the values agree; the inputs that differ name the installed release per
    rank, and rank 0's header says its release was derived by its own code."""
    from harness import run_world

    site = renamed_release(sglang_engine.version, tmp_path)
    argv = ["check", "--model-config", QWEN, "--budget-gib", "8", "--timeout-s", "240"]
    res = run_world(
        argv,
        world_size=2,
        tmp_path=tmp_path,
        rank_env={0: {"PYTHONPATH": _env(site)["PYTHONPATH"]}},
        kill_after_s=TIMEOUT_S,
    )
    rep = res.report()
    assert res.codes == [0, 0], (rep.get("errors"), [r.stdout[-600:] for r in res.ranks])
    assert rep["status"] == "consistent"
    assert [r["inputs"]["sglang_installed"] for r in rep["ranks"]] == [NEWER, sglang_engine.version]
    # derived_as follows from the installed release here: it is not a difference of its own.
    assert rep["differing_inputs"][:1] == ["sglang_installed"], rep["differing_inputs"]
    assert "derived_as" not in rep["differing_inputs"], rep["differing_inputs"]
    cause = rep["root_causes"][0]
    assert cause.startswith("sglang_installed: ") and f"runs SGLang {NEWER}" in cause, cause
    assert f"runs SGLang {sglang_engine.version}" in cause
    assert f"SGLang {NEWER}, newer than modelled: derived by its own code" in res.ranks[0].stdout


def test_a_release_reading_an_unknown_input_fails_naming_it(sglang_engine, cli, monkeypatch) -> None:
    """A release whose pool sizing reads something new (here: the installed method, wrapped to read
    ``self.unknown_pool_input`` the way a release adding an optional input would, with a default):
    exit 2, one line naming the class and the attribute, not a number computed from a default."""
    api = sglang_engine.api
    real = getattr(api.host_cls, api.pool_method)

    def changed(self: Any, total_rest_memory: float) -> Any:
        extra = getattr(self, "unknown_pool_input", 0)
        return real(self, total_rest_memory - extra)

    monkeypatch.setattr(api.host_cls, api.pool_method, changed)
    r = cli(["derive", "--model-config", QWEN, "--pp-size", "2", "--engine", "sglang"])
    assert r.rc == 2, r.err[-600:]
    (line,) = r.err.strip().splitlines()
    assert f"{api.host_cls.__name__}.unknown_pool_input" in line and "does not know" in line
    assert "Traceback" not in r.err


def test_a_newer_release_is_judged_under_pp_by_its_own_class(sglang_engine, tmp_path: Path) -> None:
    """Qwen3-Next at --pp-size 2 on "0.9.0" (the installed release's code under a higher number): the
    checker has no table for it, so the installed class's own code decides (its constructor's assert of
    a single stage, read from the installed file): exit 2, one line naming the class, the release and
    the same file:line the table holds for the real release; at --pp-size 1 --tp-size 2 it derives."""
    from checker.core.releases.model_support import pipeline_status

    site = renamed_release(sglang_engine.version, tmp_path)
    refused = _checker(["derive", "--model-config", QWEN3_NEXT, "--pp-size", "2", "--budget-gib", "16"], site)
    assert refused.returncode == 2, refused.stderr[-800:]
    (line,) = refused.stderr.strip().splitlines()
    status, where, _ = pipeline_status(sglang_engine.version, "Qwen3NextForCausalLM")
    assert status == "single-stage"
    assert f"SGLang {NEWER} cannot start Qwen3NextForCausalLM at --pp-size 2" in line, line
    assert f"its constructor asserts a single pipeline stage (sglang/srt/{where})" in line, line
    assert line.endswith("use --pp-size 1 --tp-size 2 (the same GPUs as tensor parallelism)"), line
    ok = _checker(
        ["derive", "--model-config", QWEN3_NEXT, "--pp-size", "1", "--tp-size", "2", "--budget-gib", "16"],
        site,
    )
    assert ok.returncode == 0, ok.stderr[-800:]
