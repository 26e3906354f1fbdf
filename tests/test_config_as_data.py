"""Configuration as data (issue 38 item 4): one module knows argparse's insides (checker/argspec.py, read
by cli/ and launch/ alike), the CLI layer alone changes a parsed Namespace; the launch merge is a
function of its inputs.

Read with :mod:`ast` where the rule is about the code (nothing is imported: milliseconds), and run on
a real command line where it is about behaviour.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest
from test_layers import REPO_ROOT

FIXTURES = Path(__file__).resolve().parent / "fixtures"

ARGPARSE_PRIVATE = frozenset(
    {
        "_actions",
        "_option_string_actions",
        "_defaults",
        "_action_groups",
        "_mutually_exclusive_groups",
        "_registries",
        "_parse_known_args",
        "_parse_optional",
        "_get_optional_actions",
        "_get_positional_actions",
        "_get_values",
        "_match_argument",
    }
)
"""Private members of argparse's parsers and actions (``argparse._X`` itself is caught by its module)."""

ARGPARSE_READER = "checker/argspec.py"
"""The one module that reads argparse's insides: it turns a parser into plain data once. It stands at the
bottom of the layers, below launch/ (which reads SGLang's launch parser: its flag table, repeats collapsed,
the --config merger's switches) as well as cli/ (the checker's own parser), so both use it; a helper in
cli/ could not serve launch/ without an import up a layer (tests/test_layers.py)."""

NOT_YET: dict[str, str] = {}
"""Files other than :data:`ARGPARSE_READER` that still read argparse's insides, with why; remove one once
it does not. Empty: cli/ and launch/ read parsers through checker.argspec."""


def argparse_internals(root: Path) -> list[str]:
    """``file:line name`` for each use of argparse's private names under ``root/checker`` outside
    :data:`ARGPARSE_READER`."""
    found: list[str] = []
    for path in sorted((root / "checker").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == ARGPARSE_READER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            via_module = isinstance(node.value, ast.Name) and node.value.id == "argparse"
            if via_module or node.attr in ARGPARSE_PRIVATE:
                found.append(f"{rel}:{node.lineno} {node.attr}")
    return found


def test_argparse_internals_are_read_in_one_module_only() -> None:
    found = [f for f in argparse_internals(REPO_ROOT) if f.split(":")[0] not in NOT_YET]
    assert found == [], (
        f"argparse internals outside {ARGPARSE_READER} (read the parser through it):\n" + "\n".join(found)
    )


def test_the_files_not_yet_moved_still_need_their_place_in_the_list() -> None:
    """An entry of NOT_YET whose file no longer reads argparse's insides is stale: the list only shrinks."""
    users = {f.split(":")[0] for f in argparse_internals(REPO_ROOT)}
    assert set(NOT_YET) <= users, f"remove from NOT_YET: {sorted(set(NOT_YET) - users)}"


def test_the_scan_finds_each_kind_of_use(tmp_path: Path) -> None:
    (tmp_path / "checker" / "cli").mkdir(parents=True)
    (tmp_path / "checker" / "launch").mkdir()
    (tmp_path / "checker" / "argspec.py").write_text("import argparse\nx = argparse._StoreAction\n")
    (tmp_path / "checker" / "cli" / "main.py").write_text("def f(p):\n    return p._actions\n")
    (tmp_path / "checker" / "launch" / "bad.py").write_text(
        "import argparse\n"
        "def f(p):\n"
        "    a = isinstance(p, argparse._StoreTrueAction)\n"
        "    return p._option_string_actions, p._actions, p.public, p._own_thing\n"
    )
    assert argparse_internals(tmp_path) == [
        "checker/cli/main.py:2 _actions",
        "checker/launch/bad.py:3 _StoreTrueAction",
        "checker/launch/bad.py:4 _option_string_actions",
        "checker/launch/bad.py:4 _actions",
    ]


def test_no_namespace_is_changed_below_the_cli_layer() -> None:
    """``setattr(args, ...)`` or ``args.x = ...`` on a parsed Namespace: only in checker/cli/."""
    found: list[str] = []
    for path in sorted((REPO_ROOT / "checker").rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if rel.startswith("checker/cli/"):
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            namespaces = {
                a.arg
                for a in [*fn.args.args, *fn.args.kwonlyargs]
                if a.annotation is not None and "Namespace" in ast.unparse(a.annotation)
            }
            for node in ast.walk(fn):
                target = None
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args:
                    target = node.args[0]
                elif isinstance(node, ast.Assign | ast.AugAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    target = next((t.value for t in targets if isinstance(t, ast.Attribute)), None)
                if isinstance(target, ast.Name) and target.id in namespaces:
                    found.append(f"{rel}:{node.lineno} {fn.name}")
    assert found == [], "a Namespace changed outside checker/cli/:\n" + "\n".join(found)


def test_the_launch_merge_leaves_its_inputs_as_they_were(tmp_path: Path) -> None:
    """The checker's flags and the launch command in, a frozen merge out: the flags' values (a real check
    command line's) and the launch command's words are what they were, and only ``applied`` puts the
    launch command's values in place (in a copy)."""
    from checker.cli.main import _subparser, build_parser
    from checker.cli.namespace import given_dests
    from checker.launch.merge import LaunchMerge, merge_launch

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((FIXTURES / "qwen3_5_397b_a17b.json").read_text())
    words = ["--budget-gib", "8", "--sglang-version", "0.5.23", "--max-running-requests", "16"]
    parser = build_parser()
    flags = dict(vars(parser.parse_args(["check", *words])))
    given = frozenset(given_dests(_subparser(parser, "check"), words))
    launch = ["python", "-m", "sglang.launch_server", "--model-path", str(model), "--pp-size", "2"]
    launch += ["--max-running-requests", "16", "--page-size", "4"]
    flags_before, launch_before = copy.deepcopy(flags), list(launch)

    merged = merge_launch(flags, launch, given=given, env={}, installed=None)

    assert isinstance(merged, LaunchMerge)
    assert flags == flags_before and launch == launch_before
    # what the launch command gives, and its parser's defaults of what it does not (never a flag given)
    assert {k: merged.values[k] for k in ("model_config", "pp_size", "page_size")} == {
        "model_config": str(model),
        "pp_size": 2,
        "page_size": 4,
    }
    assert "max_running_requests" not in merged.values and merged.values["dp_size"] == 1
    applied = merged.applied(flags)
    assert (applied["pp_size"], applied["page_size"], applied["max_running_requests"]) == (2, 4, 16)
    assert flags == flags_before  # applied is a copy
    with pytest.raises(dataclasses.FrozenInstanceError):
        merged.values = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        merged.values["pp_size"] = 8  # type: ignore[index]
    assert merged.launch.argv == tuple(launch)
