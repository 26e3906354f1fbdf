"""Shared fixtures: the sample HF configs and the two ways tests drive the CLI (in-process, subprocess)."""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import settings

from checker.core.sizing.environ import SGLANG_ENV_VARS as SGLANG_ENV

# pytest keeps each test module's assertion-rewritten bytecode in __pycache__ unless
# sys.dont_write_bytecode (PYTHONDONTWRITEBYTECODE) is set; rewriting the suite costs each worker about
# 4.4 s of CPU. That setting is for the processes the tests start, which still have it from the
# environment; the workers (which import the test modules after this conftest) keep the cache.
sys.dont_write_bytecode = False

# Property tests draw the same examples on every run (derived from each test's name), so CI on a clean
# clone passes or fails on the code, not on the draw; HYPOTHESIS_PROFILE=explore draws new ones (run it
# when changing the core: it is how the 0-byte KV cell cases were found).
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# SGLANG_ENV: the env vars that change a derivation; a developer's shell must not leak them into a test.
SUBPROCESS_TIMEOUT_S = 60


class CliResult(NamedTuple):
    rc: int
    out: str
    err: str


@pytest.fixture
def fixtures_dir() -> Path:
    """tests/fixtures: HF config.json samples of the six supported model families."""
    return FIXTURES


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run ``checker.cli.main(argv)`` in-process with a clean SGLANG_* env plus ``env``.

    argparse usage errors leave through SystemExit; the real entry point turns that into the exit
    code too, so the exit code is taken from it.
    """
    from checker.cli.main import main

    def run(argv: list[str], env: Mapping[str, str] | None = None) -> CliResult:
        for key in SGLANG_ENV:
            monkeypatch.delenv(key, raising=False)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return CliResult(rc, captured.out, captured.err)

    return run


@pytest.fixture
def run_checker() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m checker ARGS`` in a subprocess (bounded by a timeout) from the repo root."""

    def run(args: list[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if k not in SGLANG_ENV}
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "checker", *args],
            cwd=REPO_ROOT,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
        )

    return run


@pytest.fixture(scope="module")
def sglang_engine():
    """The installed SGLang's engine for the ``sglang`` tests: skipped where SGLang does not import; a
    failure instead under CHECKER_REQUIRE_SGLANG=X (scripts/sglang_cpu_env.sh sets it) when SGLang is
    missing or another release, so a broken environment cannot pass as an all-skipped group."""
    from checker.engines.sglang import SglangEngine, SglangUnavailable, installed_version

    required = os.environ.get("CHECKER_REQUIRE_SGLANG")
    try:
        engine = SglangEngine()
    except SglangUnavailable as exc:
        if required:
            pytest.fail(f"CHECKER_REQUIRE_SGLANG={required}: {exc}")
        reason = "not installed" if installed_version() is None else str(exc)
        pytest.skip(f"sglang not importable here ({reason}); build it with scripts/sglang_cpu_env.sh")
    if required:
        assert engine.version == required
    return engine


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package's bytecode once, before any worker starts (the controller's configure): the
    suite starts ``python -m checker`` ranks by the dozen, and each would otherwise compile every module
    it imports from source (+0.45 s of CPU a process where PYTHONDONTWRITEBYTECODE is set or the
    checkout is fresh), which an installed checker never pays. Writes only ``__pycache__`` files."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "checker"), quiet=1, workers=0)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault matrix's times (tests/test_faults.py records each case as ``fault_case``), listed after
    the run; ``CHECKER_FAULT_TABLE=PATH`` also writes them as docs/preflight.md's markdown table."""
    rows = [
        dict(value)
        for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
        if report.when == "call"
        for name, value in report.user_properties
        if name == "fault_case"
    ]
    if not rows:
        return
    from fault_table import markdown, summary

    terminalreporter.write_sep("-", "fault matrix")
    for line in summary(rows):
        terminalreporter.write_line(line)
    path = os.environ.get("CHECKER_FAULT_TABLE")
    if path:
        Path(path).write_text(markdown(rows))
