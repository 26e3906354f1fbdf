"""The package's layers point one way (docs/development.md, "Layout"; issue 28 item 3).

A room is a top-level subpackage or module of ``checker/`` (``checker/commands``, ``checker/config.py``).
:data:`LAYERS` lists the rooms top to bottom, once: a module may import checker modules of its own room
or of a lower layer, never of a higher one and never of another room in its own layer (a sideways
import is allowed only where :data:`SIDEWAYS` declares it). Every import counts: module-level,
function-level and ``if TYPE_CHECKING:`` alike, since a reader follows all of them. A function-level
import of a checker module is allowed only to defer torch, an optional dependency or a measured
start-up cost, and says which in a comment on its own line or the line above.

The graph is read with :mod:`ast` from the source files (nothing is imported), so the test costs
milliseconds, and :func:`violations` runs on any tree: a small package with one back edge, written to
``tmp_path``, shows it fails on one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),  # python -m checker
    ("cli",),  # the parser and entry point: reads the command registry, runs one command
    ("commands",),  # one module per subcommand, its flags and its job; builds the config once
    ("outputs",),  # what a person or CI reads: renders preflight verdicts and postflight findings
    ("preflight", "postflight"),  # a rank's row and the verdict; the server's logs held to the report
    ("config",),  # the typed, frozen configuration a command builds from its flags
    ("launch",),  # the deployment's SGLang launch command (config holds its parsed flags)
    ("engines", "device"),  # derivations by installed SGLang; on a torch device
    ("distributed",),  # torchrun environment, wire, process group, the run protocol
    ("files",),  # bounded, non-destructive writes and output-path checks (every writer, the session too)
    ("families",),  # one package per model family and the registry the rest asks (model_type -> Family)
    ("core",),  # pure, torch-free capacity math and the rank row it derives
    ("status", "bounded", "argspec", "loading", "__init__"),  # leaves: exit codes, the bounded call,
    # argparse's parsers as plain data (read once, the one reader of argparse's insides), torch loaded
    # without the collector walking it, the version
)
"""Top to bottom. ``__init__`` is ``checker/__init__.py`` (``from checker import __version__``)."""

SIDEWAYS: frozenset[tuple[str, str]] = frozenset()
"""Declared imports between two rooms of one layer, (from, to): none today."""


@dataclass(frozen=True)
class Import:
    path: str
    """The importing file, relative to the tree's root (``checker/x/y.py``)."""
    line: int
    target: str
    """The imported checker module (``checker.z`` or ``checker.z.w``)."""
    in_function: bool
    commented: bool
    """A comment on the import's first line, or on the line above it or above its block of imports."""


def room(module: str) -> str:
    """``checker.commands.check`` -> ``commands``; ``checker`` (the package's own ``__init__``) ->
    ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: resolved against the importing module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    if base == "checker":  # ``from checker import commands`` names a submodule (or __version__)
        return [f"checker.{a.name}" if a.name != "__version__" else "checker" for a in node.names]
    return [base]


def _commented(lines: Sequence[str], lineno: int) -> bool:
    """A comment on the import's line, or on the line above it or above the block of imports it opens
    with (one comment may say why ``from a import x`` and ``from b import y`` both wait)."""
    if "#" in lines[lineno - 1]:
        return True
    above = lineno - 2
    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def _file_imports(root: Path, path: Path) -> Iterator[Import]:
    module = _module_name(root, path)
    text = path.read_text()
    lines = text.splitlines()
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    todo: list[tuple[ast.AST, bool]] = [(ast.parse(text, filename=str(path)), False)]
    while todo:
        node, in_function = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, module, path.name == "__init__.py"):
                    if target == "checker" or target.startswith("checker."):
                        rel = str(path.relative_to(root))
                        yield Import(rel, child.lineno, target, in_function, _commented(lines, child.lineno))
            todo.append((child, in_function or isinstance(child, functions)))


def imports(root: Path) -> Iterator[Import]:
    """Every import of a checker module by a checker module under ``root``, with where it sits."""
    for path in sorted((root / "checker").rglob("*.py")):
        yield from sorted(_file_imports(root, path), key=lambda i: (i.line, i.target))


def violations(root: Path, layers: Sequence[Sequence[str]] = LAYERS, sideways=SIDEWAYS) -> list[str]:
    """One line per import that goes up a layer or sideways, per room no layer names, and per
    function-level import of a checker module without a comment saying why it is deferred."""
    level = {name: i for i, rooms in enumerate(layers) for name in rooms}
    found: list[str] = []
    rooms_here = {room(_module_name(root, p)) for p in (root / "checker").rglob("*.py")}
    for name in sorted(rooms_here - set(level)):
        found.append(f"checker/{name}: a room no layer names (place it in LAYERS)")
    for imp in imports(root):
        src, dst = room(_module_name(root, root / imp.path)), room(imp.target)
        if src == dst or src not in level or dst not in level:
            pass
        elif level[dst] < level[src] or (level[dst] == level[src] and (src, dst) not in sideways):
            way = "up" if level[dst] < level[src] else "sideways"
            found.append(f"{imp.path}:{imp.line} imports {imp.target} ({way}: layer {src} -> layer {dst})")
        if imp.in_function and not imp.commented:
            found.append(
                f"{imp.path}:{imp.line} imports {imp.target} inside a function without a comment "
                "(only to defer torch, an optional dependency or a measured start-up cost: say which)"
            )
    return found


def test_the_package_layers_point_one_way() -> None:
    found = violations(REPO_ROOT)
    assert not found, "imports against the layer order (tests/test_layers.py LAYERS):\n" + "\n".join(found)


def test_every_room_is_in_one_layer() -> None:
    named = [name for rooms in LAYERS for name in rooms]
    assert len(named) == len(set(named))
    on_disk = {room(_module_name(REPO_ROOT, p)) for p in (REPO_ROOT / "checker").rglob("*.py")}
    assert on_disk == set(named), f"rooms on disk {sorted(on_disk)}, in LAYERS {sorted(named)}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


_SMALL = (("cli",), ("commands",), ("distributed", "outputs"), ("core",), ("__init__",))


def test_a_back_edge_fails(tmp_path: Path) -> None:
    """The same check on a small tree: a clean one passes, then one import up a layer is named."""
    root = _tree(
        tmp_path,
        {
            "checker/__init__.py": "__version__ = '0'\n",
            "checker/cli/__init__.py": "",
            "checker/cli/main.py": "from checker.commands import run\nfrom checker import __version__\n",
            "checker/commands/__init__.py": "from checker.distributed.wire import pack\n\nrun = pack\n",
            "checker/distributed/__init__.py": "",
            "checker/distributed/wire.py": "from checker.core.row import Row\n\npack = Row\n",
            "checker/outputs/__init__.py": "",
            "checker/core/__init__.py": "",
            "checker/core/row.py": "class Row:\n    pass\n",
        },
    )
    assert violations(root, _SMALL) == []
    (root / "checker/core/row.py").write_text(
        "from checker.distributed import wire\n\n\nclass Row:\n    pass\n"
    )
    assert violations(root, _SMALL) == [
        "checker/core/row.py:1 imports checker.distributed (up: layer core -> layer distributed)"
    ]


def test_a_sideways_edge_and_a_relative_one_fail_unless_declared(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "checker/__init__.py": "",
            "checker/outputs/__init__.py": "",
            "checker/outputs/report.py": "from checker.distributed import wire\n",
            "checker/distributed/__init__.py": "",
            "checker/distributed/wire.py": "",
            "checker/core/__init__.py": "",
            "checker/core/row.py": "from ..commands import job\n",
            "checker/commands/__init__.py": "",
            "checker/commands/job.py": "",
        },
    )
    layers = (("commands",), ("distributed", "outputs"), ("core",), ("__init__",))
    assert violations(root, layers) == [
        "checker/core/row.py:1 imports checker.commands (up: layer core -> layer commands)",
        "checker/outputs/report.py:1 imports checker.distributed "
        "(sideways: layer outputs -> layer distributed)",
    ]
    assert violations(root, layers, frozenset({("outputs", "distributed")})) == [
        "checker/core/row.py:1 imports checker.commands (up: layer core -> layer commands)"
    ]


def test_a_function_level_import_needs_its_reason(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "checker/__init__.py": "",
            "checker/commands/__init__.py": "",
            "checker/commands/sweep.py": (
                "def run():\n"
                "    from checker.device import sweep\n"
                "    # torch: the device sweep imports it\n"
                "    from checker.device import choice\n"
                "    from checker.device import materialize  # torch\n"
                "    return sweep, choice, materialize\n"
            ),
            "checker/device/__init__.py": "",
            "checker/device/sweep.py": "",
            "checker/device/choice.py": "",
            "checker/device/materialize.py": "",
        },
    )
    assert violations(root, (("commands",), ("device",), ("__init__",))) == [
        "checker/commands/sweep.py:2 imports checker.device inside a function without a comment "
        "(only to defer torch, an optional dependency or a measured start-up cost: say which)"
    ]


def test_an_unplaced_room_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"checker/__init__.py": "", "checker/extra.py": ""})
    assert violations(root, (("__init__",),)) == ["checker/extra: a room no layer names (place it in LAYERS)"]
