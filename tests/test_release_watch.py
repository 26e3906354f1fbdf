"""The release watch (scripts/sglang_release_watch.py) notices a changed release, and never fails CI.

A maintainer relies on it to say, on the day SGLang publishes a release, whether the functions that size
the state pool, the request limit and the micro-batch size changed against the newest modelled release.
Here the "new release" is a wheel built in tmp_path from the stored reference sources
(scripts/sglang_sizing/<newest modelled>.json): unchanged, the watch must say nothing changed; with one
constant changed, it must name that function and show the changed line; with the index unreachable it
must exit 3 (the CI step turns that into a warning) in bounded time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

from checker.core.releases.releases import NEWEST_MODELLED

REPO = Path(__file__).resolve().parent.parent
WATCH = REPO / "scripts" / "sglang_release_watch.py"
REFERENCE = REPO / "scripts" / "sglang_sizing" / f"{NEWEST_MODELLED}.json"
TIMEOUT_S = 120


def _wheel(tmp_path: Path, version: str, change: tuple[str, str, str] | None = None) -> Path:
    """A wheel whose sizing functions are the reference's (``change``: (function, old, new) text)."""
    ref = json.loads(REFERENCE.read_text())["functions"]
    files: dict[str, list[str]] = {}
    for name, entry in ref.items():
        source = entry["source"]
        if change is not None and name == change[0]:
            assert change[1] in source, (name, change[1])
            source = source.replace(change[1], change[2], 1)
        if name.startswith("Scheduler["):  # inline statements of a Scheduler method
            body = textwrap.indent(source, "        ")
            files.setdefault(entry["path"], []).append(f"class Scheduler:\n    def __init__(self):\n{body}\n")
        elif "." in name:
            cls = name.split(".")[0]
            files.setdefault(entry["path"], []).append(f"class {cls}:\n{textwrap.indent(source, '    ')}\n")
        else:
            files.setdefault(entry["path"], []).append(source + "\n")
    path = tmp_path / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, parts in files.items():
            z.writestr(name, "\n".join(parts))
        z.writestr(
            f"sglang-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n",
        )
    return path


def _watch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WATCH), *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_the_reference_covers_pool_requests_and_micro_batch() -> None:
    names = set(json.loads(REFERENCE.read_text())["functions"])
    assert {
        "KVCacheConfigurator._handle_max_mamba_cache",
        "KVCacheConfigurator.resolve_max_num_reqs",
        "KVCacheConfigurator._calculate_mamba_ratio",
        "Scheduler[pp_max_micro_batch_size]",
    } <= names


def test_an_unchanged_release_is_reported_as_unchanged(tmp_path: Path) -> None:
    proc = _watch("--wheel", str(_wheel(tmp_path, "0.5.24")))
    assert proc.returncode == 1, proc.stderr
    assert "SGLang 0.5.24" in proc.stdout and "no sizing function changed" in proc.stdout
    assert "CHANGED" not in proc.stdout and "Adding a release" in proc.stdout


def test_a_changed_sizing_function_is_named_with_its_diff(tmp_path: Path) -> None:
    change = ("KVCacheConfigurator.resolve_max_num_reqs", "// 2", "// 3")
    proc = _watch("--wheel", str(_wheel(tmp_path, "0.5.24", change)))
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "CHANGED  KVCacheConfigurator.resolve_max_num_reqs" in out
    assert "+" in out and "// 3" in out and "its sizing code changed" in out
    assert out.count("CHANGED") == 1


def test_an_unreachable_index_is_exit_3_not_a_failure(tmp_path: Path) -> None:
    env = {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_TIMEOUT": "2",
        "PIP_RETRIES": "0",
    }
    proc = _watch(env=env)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "could not be reached" in proc.stdout
