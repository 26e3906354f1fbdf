"""Every import inside a function of ``checker/`` says why it waits (issue 38 item 7).

tests/test_layers.py holds function-level imports of checker modules to a comment; this holds every other
one to the same rule (the standard library, torch, an optional dependency): an import waits only to defer
torch, an optional dependency or a start-up cost the CLI's import path does without, and says which on its
line or the line above it (or above its block of imports). One that costs nothing where it runs belongs
at the top of its module. Read with :mod:`ast` (nothing is imported): milliseconds.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layers import REPO_ROOT, _commented

NOT_YET: frozenset[tuple[str, str]] = frozenset(
    {
        # Modules other work is rewriting (issue 38 items 3 and 6): their reasons come with it.
    }
)
"""(file, imported module) pairs still without their comment; remove a pair once it has one."""


def unexplained(root: Path) -> list[str]:
    """``file:line module`` for each import inside a function under ``root/checker`` with no comment."""
    found: list[str] = []
    for path in sorted((root / "checker").rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        rel = str(path.relative_to(root))
        for fn in ast.walk(ast.parse(text, filename=str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not _commented(lines, node.lineno):
                    names = (
                        [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
                    )
                    found.extend(f"{rel}:{node.lineno} {name}" for name in names)
    return sorted(set(found), key=lambda s: (s.split(":")[0], int(s.split(":")[1].split()[0])))


def test_every_function_level_import_says_why() -> None:
    found = [line for line in unexplained(REPO_ROOT) if (line.split(":")[0], line.split()[1]) not in NOT_YET]
    assert not found, (
        "imports inside a function without a comment saying why they wait (torch, an optional dependency "
        "or a start-up cost); hoist the ones that cost nothing:\n" + "\n".join(found)
    )


def test_an_unexplained_import_is_named(tmp_path: Path) -> None:
    """The same walk on a small tree: a commented import passes, a bare one (nested too) is named."""
    (tmp_path / "checker").mkdir()
    (tmp_path / "checker" / "x.py").write_text(
        "def f():\n"
        "    import torch  # torch: ~1 s, only where a tensor is made\n"
        "    # optional dependency: the plot extra\n"
        "    import matplotlib\n"
        "    import numpy\n"
        "    def g():\n"
        "        from xml.etree import ElementTree\n"
        "        return ElementTree\n"
        "    return torch, matplotlib, numpy, g\n"
        "\n"
        "\n"
        "def h():\n"
        "    import shlex\n"
        "    return shlex\n"
    )
    assert unexplained(tmp_path) == ["checker/x.py:7 xml.etree", "checker/x.py:13 shlex"]
