"""Every command's output goes through one seam (issue 38 item 5): ``checker/outputs/render.py`` alone
chooses a format. Elsewhere in ``checker/`` no code compares with a format's name (``== "json"``), reads
``.format`` / ``.quiet`` to pick what to print, or encodes a reader's JSON (``json.dump(s)`` with
``indent``). Read with :mod:`ast` (nothing is imported): milliseconds.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layers import REPO_ROOT

from checker.outputs.render import RENDERERS, Document, render, stdout_format

SEAM = "checker/outputs/render.py"
FORMAT_NAMES = frozenset(RENDERERS) | {"json", "text"}
CHOICE_ATTRS = frozenset({"format", "quiet"})


def _names_a_format(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and node.value in FORMAT_NAMES:
        return True
    return isinstance(node, ast.Attribute) and node.attr in CHOICE_ATTRS


def format_branches(root: Path) -> list[str]:
    """``file:line what`` for each format choice under ``root/checker`` outside the seam."""
    found: list[str] = []
    for path in sorted((root / "checker").rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel == SEAM:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Compare) and any(
                _names_a_format(n) for n in (node.left, *node.comparators)
            ):
                found.append(f"{rel}:{node.lineno} compares with a format")
            elif isinstance(node, (ast.If, ast.IfExp)) and _names_a_format(node.test):
                found.append(f"{rel}:{node.lineno} branches on {ast.unparse(node.test)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("dump", "dumps")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "json"
                and any(k.arg == "indent" for k in node.keywords)
            ):
                found.append(f"{rel}:{node.lineno} encodes a reader's JSON")
    return sorted(found, key=lambda s: (s.split(":")[0], int(s.split(":")[1].split()[0])))


def test_no_format_branch_outside_the_seam() -> None:
    found = format_branches(REPO_ROOT)
    assert not found, (
        "a format is chosen outside checker/outputs/render.py; build the command's Document and let "
        "emit / write_artifacts render it:\n" + "\n".join(found)
    )


def test_a_format_branch_is_named(tmp_path: Path) -> None:
    """The same walk on a small tree: each kind of branch is named, the seam itself is not."""
    (tmp_path / "checker" / "outputs").mkdir(parents=True)
    (tmp_path / "checker" / "outputs" / "render.py").write_text('if fmt == "json":\n    pass\n')
    (tmp_path / "checker" / "x.py").write_text(
        "import json\n"
        "def f(out, doc):\n"
        '    if out.format == "json":\n'
        "        print(json.dumps(doc, indent=2))\n"
        "    elif out.quiet:\n"
        "        pass\n"
        "    return json.dumps(doc, sort_keys=True)\n"  # a digest, not a rendering: allowed
    )
    assert format_branches(tmp_path) == [
        "checker/x.py:3 compares with a format",
        "checker/x.py:4 encodes a reader's JSON",
        "checker/x.py:5 branches on out.quiet",
    ]


def test_each_view_is_built_once_and_only_when_asked() -> None:
    """A document's views are lazy (a view may compute what another never needs) and built once (the
    report file and stdout share one JSON)."""
    calls: list[str] = []

    def data() -> dict[str, object]:
        calls.append("data")
        return {"status": "consistent", "n": 1}

    def lines() -> list[str]:
        calls.append("lines")
        return ["a", "b"]

    doc = Document(data, lines)
    assert render(doc, "json") == '{\n  "status": "consistent",\n  "n": 1\n}'
    assert render(doc, "json") == render(doc, "json")
    assert calls == ["data"]
    assert render(doc, "text") == "a\nb"
    assert render(doc, "quiet") == "a\nb"  # no one-line view: the text
    assert render(doc, "junit") is None
    assert calls == ["data", "lines"]


class _Out:
    def __init__(self, format: str, quiet: bool) -> None:
        self.format, self.quiet = format, quiet


def test_json_wins_over_quiet() -> None:
    assert stdout_format(_Out("json", True)) == "json"
    assert stdout_format(_Out("text", True)) == "quiet"
    assert stdout_format(_Out("text", False)) == "text"
