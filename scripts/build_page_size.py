#!/usr/bin/env python3
"""Build ``checker/core/releases/page_rules.py``: the page size each explicitly given attention backend makes
each modelled SGLang release use, and the backends each release's parser accepts.

    python3 scripts/build_page_size.py [--wheels DIR] [--src DIR] [--check]

For every release of ``checker.core.releases.releases.MODELLED_RELEASES`` it reads the release's code (the
unpacked sources under ``--src``/<version>/, else its wheel; nothing is imported) with ``ast``:

* **the page rules**: every ``if`` whose test is only ``X.<flag> == "<backend>"`` comparisons joined by
  ``or`` (``<flag>`` one of :data:`FLAGS`), sitting directly in its function (no other guard around it),
  whose body sets the page size to a constant (``self.page_size = N``, ``server_args.page_size = N`` or a
  local ``page_size = N``), either at once or under ``if page_size not in [..]`` / ``if page_size != N``.
  Each becomes (backend, the flags it reads, the sizes kept (empty: none), the size set, file:line), in
  the order the release's source has them (one function in every release: ``_handle_attention_backend_
  compatibility`` up to 0.5.14, ``_mla_backend_page_constraints`` from 0.5.15). A rule guarded by anything
  else (the GPU, the model's architecture, MLA, an environment variable) is not read: see docs/preflight.md.
* **the aliases**: a ``aliases = {"old": "new", ...}`` dict literal in ``_handle_deprecated_args`` (0.5.23:
  ``tokenspeed_mla`` is ``cutedsl_mla``), applied before the rules as the release does.
* **the choices**: the ``choices=`` list of ``--attention-backend`` and ``--speculative-draft-attention-
  backend`` in the release's parser (a module-level list literal, extended by ``X.extend([...])`` /
  ``X += [...]`` at module level), with the file:line of the list.

``tests/test_page_size.py`` holds the table to the sources found here (re-run this when they differ) and the
resolution to SGLang's own ``ServerArgs`` where a CPU environment runs it.
``--check``: build in memory and exit 1 if the table on disk differs.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from build_arg_checks import default_src, release_files  # noqa: E402

from checker.core.releases.releases import MODELLED_RELEASES  # noqa: E402

TARGET = REPO / "checker" / "core" / "releases" / "page_rules.py"
SRT = "sglang/srt/"
FLAGS = (
    "attention_backend",
    "decode_attention_backend",
    "prefill_attention_backend",
    "speculative_draft_attention_backend",
)
_SHORT = {"attention_backend": "a", "decode_attention_backend": "d", "prefill_attention_backend": "p"}
_SHORT["speculative_draft_attention_backend"] = "s"


@dataclass(frozen=True)
class Rule:
    backend: str
    flags: str  # letters of _SHORT
    keeps: tuple[int, ...]
    sets: int
    site: str  # path:line (under sglang/srt/) of the assignment

    def row(self) -> tuple[str, str, tuple[int, ...], int]:
        return (self.backend, self.flags, self.keeps, self.sets)


def _backend_test(test: ast.expr) -> list[tuple[str, str]] | None:
    """[(flag, backend)] when ``test`` is only ``X.flag == "backend"`` joined by ``or``, else None."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    out = []
    for p in parts:
        if not (
            isinstance(p, ast.Compare)
            and len(p.ops) == 1
            and isinstance(p.ops[0], ast.Eq)
            and isinstance(p.left, ast.Attribute)
            and p.left.attr in FLAGS
            and isinstance(p.comparators[0], ast.Constant)
            and isinstance(p.comparators[0].value, str)
        ):
            return None
        out.append((p.left.attr, p.comparators[0].value))
    return out


def _is_page(target: ast.expr) -> bool:
    return (isinstance(target, ast.Name) and target.id == "page_size") or (
        isinstance(target, ast.Attribute) and target.attr == "page_size"
    )


def _page_set(stmt: ast.stmt) -> ast.Assign | None:
    if (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and _is_page(stmt.targets[0])
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, int)
    ):
        return stmt
    return None


def _keeps(test: ast.expr) -> tuple[int, ...] | None:
    """The sizes ``if page_size not in [..]`` / ``if page_size != N`` keeps."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and _is_page(test.left)):
        return None
    right = test.comparators[0]
    if isinstance(test.ops[0], ast.NotIn) and isinstance(right, (ast.List, ast.Tuple)):
        vals = [e.value for e in right.elts if isinstance(e, ast.Constant)]
        return tuple(int(v) for v in vals) if len(vals) == len(right.elts) else None
    if isinstance(test.ops[0], ast.NotEq) and isinstance(right, ast.Constant):
        return (int(right.value),) if isinstance(right.value, int) else None
    return None


def _rules_in(body: list[ast.stmt], path: str) -> list[Rule]:
    rules = []
    for stmt in body:
        if not isinstance(stmt, ast.If) or stmt.orelse:
            continue
        tested = _backend_test(stmt.test)
        if tested is None:
            continue
        found: list[tuple[tuple[int, ...], ast.Assign]] = []
        for inner in stmt.body:
            if (a := _page_set(inner)) is not None:
                found.append(((), a))
            elif isinstance(inner, ast.If) and not inner.orelse and (k := _keeps(inner.test)) is not None:
                found.extend((k, a) for s in inner.body if (a := _page_set(s)) is not None)
        for keeps, assign in found:
            for backend in dict.fromkeys(b for _, b in tested):
                flags = "".join(_SHORT[f] for f, b in tested if b == backend)
                value = assign.value
                assert isinstance(value, ast.Constant)
                rules.append(Rule(backend, flags, keeps, int(value.value), f"{path}:{assign.lineno}"))
    return rules


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    out: list[ast.FunctionDef] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out.append(node)
        elif isinstance(node, ast.ClassDef):
            out.extend(n for n in node.body if isinstance(n, ast.FunctionDef))
    return out


def _list_literal(tree: ast.Module, name: str) -> tuple[list[str], int] | None:
    values: list[str] | None = None
    line = 0
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target, value = node.target.id, node.value
        if target == name and isinstance(value, ast.List):
            values = [e.value for e in value.elts if isinstance(e, ast.Constant)]
            line = node.lineno
        elif (
            values is not None
            and isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and isinstance(node.value, ast.List)
        ):
            values += [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
        elif (
            values is not None
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "extend"
            and isinstance(node.value.func.value, ast.Name)
            and node.value.func.value.id == name
            and node.value.args
            and isinstance(node.value.args[0], ast.List)
        ):
            values += [e.value for e in node.value.args[0].elts if isinstance(e, ast.Constant)]
    return (values, line) if values is not None else None


def _choices_name(tree: ast.Module, option: str) -> str | None:
    """The name of the list given as ``choices=`` to ``option``: in ``parser.add_argument(option, ...)``
    (up to 0.5.13.post1) or a dataclass field's ``Arg(..., choices=...)`` annotation (0.5.14+)."""
    field = option[2:].replace("-", "_")
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == field:
            for call in ast.walk(node.annotation):
                if isinstance(call, ast.Call):
                    for kw in call.keywords:
                        if kw.arg == "choices" and isinstance(kw.value, ast.Name):
                            return kw.value.id
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and any(isinstance(a, ast.Constant) and a.value == option for a in node.args)
        ):
            for kw in node.keywords:
                if kw.arg == "choices" and isinstance(kw.value, ast.Name):
                    return kw.value.id
    return None


def _aliases(tree: ast.Module) -> dict[str, str]:
    for fn in _functions(tree):
        if "deprecated_args" not in fn.name:
            continue
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "aliases"
                and isinstance(node.value, ast.Dict)
            ):
                return {
                    k.value: v.value
                    for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                }
    return {}


@dataclass
class ReleaseRead:
    rules: list[Rule]
    aliases: dict[str, str]
    attention: tuple[list[str], str]
    draft: tuple[list[str], str] | None


def read_release(files: dict[str, str]) -> ReleaseRead:
    trees = {}
    for path, text in files.items():
        if path == SRT + "server_args.py" or path.startswith(SRT + "arg_groups/"):
            try:
                trees[path[len(SRT) :]] = ast.parse(text)
            except SyntaxError:
                continue
    rules: list[Rule] = []
    aliases: dict[str, str] = {}
    for path, tree in trees.items():
        for fn in _functions(tree):
            rules.extend(_rules_in(fn.body, path))
        aliases.update(_aliases(tree))

    def choices(option: str) -> tuple[list[str], str] | None:
        name = next((n for t in trees.values() if (n := _choices_name(t, option))), None)
        if name is None:
            return None
        for path, tree in trees.items():
            if (found := _list_literal(tree, name)) is not None:
                return found[0], f"{path}:{found[1]} {name}"
        return None

    attention = choices("--attention-backend")
    if attention is None:
        raise SystemExit("no --attention-backend choices found")
    return ReleaseRead(rules, aliases, attention, choices("--speculative-draft-attention-backend"))


HEADER = '''\
# ruff: noqa: E501  (generated: one line per release)
"""The page size an explicitly given attention backend makes each modelled SGLang release use, and the
backends its parser accepts (GENERATED by ``scripts/build_page_size.py`` from each release's code; do not
edit). :mod:`checker.core.sizing.page_size` applies them.

``RULES[release]``: (backend, flags, keeps, sets) in the release's order, flags being the letters of the
flags the rule reads (a: --attention-backend, d: --decode-attention-backend, p: --prefill-attention-backend,
s: --speculative-draft-attention-backend): where one of those flags names ``backend`` and the page size is
not in ``keeps`` (empty: always), the page size becomes ``sets``; each rule sees what the earlier ones left.
``RULE_SITES[release]``: the file:line (under ``sglang/srt/``) of each rule's assignment.
``ALIASES[release]``: a deprecated backend name the release renames first. ``CHOICES[release]``: (the
choices of --attention-backend / --prefill- / --decode-attention-backend, where; the choices of
--speculative-draft-attention-backend or None where the parser takes any text, where).
"""

from __future__ import annotations
'''


def render(reads: dict[str, ReleaseRead]) -> str:
    lines = [HEADER, "# fmt: off"]
    lines.append("RULES: dict[str, tuple[tuple[str, str, tuple[int, ...], int], ...]] = {")
    lines += [f"    {v!r}: {tuple(r.row() for r in rd.rules)!r}," for v, rd in reads.items()]
    lines.append("}")
    lines.append("RULE_SITES: dict[str, tuple[str, ...]] = {")
    lines += [f"    {v!r}: {tuple(r.site for r in rd.rules)!r}," for v, rd in reads.items()]
    lines.append("}")
    lines.append("ALIASES: dict[str, dict[str, str]] = {")
    lines += [f"    {v!r}: {rd.aliases!r}," for v, rd in reads.items() if rd.aliases]
    lines.append("}")
    lines.append("CHOICES: dict[str, tuple[str, str, str | None, str]] = {")
    for v, rd in reads.items():
        draft = (" ".join(rd.draft[0]), rd.draft[1]) if rd.draft else (None, "")
        lines.append(f"    {v!r}: {(' '.join(rd.attention[0]), rd.attention[1], *draft)!r},")
    lines.append("}")
    lines.append("# fmt: on")
    return "\n".join(lines) + "\n"


def build(wheels_dir: Path, src_dir: Path) -> str:
    return render({v: read_release(release_files(v, wheels_dir, src_dir)) for v in MODELLED_RELEASES})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "pp-checker" / "wheels")
    parser.add_argument("--src", type=Path, default=default_src())
    parser.add_argument("--check", action="store_true", help="exit 1 if the table on disk is stale")
    args = parser.parse_args(argv)
    text = build(args.wheels, args.src)
    if args.check:
        if TARGET.read_text() != text:
            stale = f"{TARGET.relative_to(REPO)} is stale: run python3 scripts/build_page_size.py"
            print(stale, file=sys.stderr)
            return 1
        print(f"{TARGET.relative_to(REPO)} is what the code says")
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(REPO)} ({len(MODELLED_RELEASES)} releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
