"""A model family's facts live in checker/families/<name>/ (issue 38 item 1): checker/core names no family.

The scan reads checker/core's hand-written modules for the families' names (every model type of the
registry, and the stems issue 38 counted); the generated tables (scripts/regenerate.py GENERATORS) may
keep model types as data keys, since their generators write them from SGLang's code. What the
hand-written core still names is listed in :data:`ALLOWED`, per file, with the number of lines and why:
a new line naming a family fails here (put the fact behind the Family protocol, or pass it in as data),
and a line moved out fails too until its count is lowered (the list only shrinks).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from test_layers import REPO_ROOT

from checker.families import BY_MODEL_TYPE, FAMILIES

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import regenerate  # noqa: E402

STEMS = ("qwen3_next", "qwen3_5", "nemotron", "falcon", "granite", "kimi")
"""The names issue 38's grep counted (``grep -E "qwen3_next|qwen3_5|nemotron|falcon|granite|kimi"``)."""

ALLOWED: dict[str, tuple[int, str]] = {
    "checker/core/releases/releases.py": (
        3,
        "ReleaseRules.pp_hybrid's docstring: the SGLang model files whose asserts decide it (the facts "
        "themselves are generated: checker/core/releases/pp_support.py)",
    ),
    "checker/core/sizing/replay.py": (1, "a comment citing SGLang's models/qwen3_next.py GDN conv layout"),
    "checker/core/sizing/sizing.py": (
        4,
        "the SGLang model files a PP refusal names; examples in two messages (pinned by tests)",
    ),
    "checker/core/sizing/models.py": (1, "an example of a model type in a message (pinned by tests)"),
    "checker/core/sizing/geometry.py": (2, "ModelGeometry.family's docstring: examples of a model type"),
    "checker/core/releases/check_policy.py": (
        3,
        "keys: the start-up check ids scripts/build_arg_checks.py derives from SGLang's messages",
    ),
}
"""Hand-written checker/core files that still name a family: lines, and why."""


def family_pattern() -> re.Pattern[str]:
    names = {*STEMS, *BY_MODEL_TYPE, *(f.model_types[0] for f in FAMILIES)}
    return re.compile("|".join(sorted(map(re.escape, names), key=len, reverse=True)))


def family_lines(root: Path, generated: set[str]) -> dict[str, int]:
    """Per hand-written file under ``root/checker/core``, how many of its lines name a family."""
    pattern = family_pattern()
    found: dict[str, int] = {}
    for path in sorted((root / "checker" / "core").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in generated:
            continue
        n = sum(1 for line in path.read_text().splitlines() if pattern.search(line))
        if n:
            found[rel] = n
    return found


def _generated() -> set[str]:
    return {out for g in regenerate.GENERATORS for out in g.outputs}


def test_the_core_names_no_family_beyond_what_is_listed() -> None:
    found = family_lines(REPO_ROOT, _generated())
    assert found == {f: n for f, (n, _) in ALLOWED.items()}, (
        "lines of checker/core naming a family (want: ALLOWED, tests/test_family_names.py):\n"
        + "\n".join(f"{f}: {n}" for f, n in sorted(found.items()))
    )


def test_the_scan_finds_a_family_name_in_a_hand_written_file(tmp_path: Path) -> None:
    core = tmp_path / "checker" / "core"
    core.mkdir(parents=True)
    (core / "rules.py").write_text('A = 1\nB = "granitemoehybrid"\nC = ("qwen3_5_moe", "nemotron_h")\n')
    (core / "table.py").write_text('T = {"kimi_linear": 1}\n')
    assert family_lines(tmp_path, {"checker/core/table.py"}) == {"checker/core/rules.py": 2}
