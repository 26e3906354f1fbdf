#!/usr/bin/env python3
"""Build ``checker/core/releases/arg_checks.py``: every start-up check of each modelled SGLang release's
server-argument handling that involves what the checker reads, and every server argument the release's
pool sizing reads.

    python3 scripts/build_arg_checks.py [--wheels DIR] [--src DIR] [--check]

For every release of ``checker.core.releases.releases.MODELLED_RELEASES`` it reads the release's code (the
unpacked sources under ``--src``/<version>/ when there, else the wheel, ``pip download --no-deps sglang==X``;
nothing is installed or imported) with ``ast``:

* **the argument checks**: every ``assert`` and ``raise`` in ``server_args.py`` (``ServerArgs.__post_init__``
  and its ``_handle_*`` / ``_validate_*`` helpers, ``check_server_args``) and, from 0.5.13, in every module
  of ``arg_groups/`` (the hooks: ``validation_hook.py``, ``speculative_hook.py``, ``mamba_hook.py``, ...). A
  check is kept when what it tests involves a flag the checker reads (:data:`CHECKER_READS`: the sizing
  inputs, the model and weights flags), the parallel layout (pp / tp / dp / nnodes / attention DP),
  speculative decoding, or the mamba / radix / replay-SSM flags. "What it tests" is the assert's
  condition, the ``if`` tests the statement sits under (an ``else`` branch as ``not``), and, for a helper
  called from one place, the tests around that call; an early return before it in its function counts
  where it reads the layout or those flags.
* **the sizing reads**: every server argument read in the modules that size the pools (0.5.23:
  ``mem_cache/kv_cache_configurator.py`` and ``model_executor/pool_configurator.py``, through
  ``server_args.X`` and the ``get_exec()`` / ``get_schedule()`` / ``get_spec()`` / ``get_memory()`` /
  ``get_parallel()`` views; older releases: ``model_executor/model_runner*.py``).

A check's identity is its message (SGLang's own words, f-string fields as ``{field}``), or its condition when
it has none; the same check in several releases is one entry with the file:line of each. What the checker
does with each one (refused as SGLang refuses it, or listed as not modelled with the reason) is
hand-written in ``checker/core/releases/check_policy.py`` (the checks) and
``checker/core/releases/arg_policy.py`` (the
reads); ``tests/test_arg_checks.py`` fails when a check or a sizing read has no entry there, and when the
sources or wheels found here read differently from the table (re-run this).
``--check``: build in memory and exit 1 if the table on disk differs (what a CI step runs).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

import sglang_wheels as wheels  # noqa: E402

from checker.core.releases.releases import MODELLED_RELEASES  # noqa: E402

TARGET = REPO / "checker" / "core" / "releases" / "arg_checks.py"
SRT = "sglang/srt/"
Source = Callable[[str], "str | None"]

# ------------------------------------------------------------------------------------------------------
# What counts as involving the checker's inputs
# ------------------------------------------------------------------------------------------------------

CHECKER_READS = frozenset(
    {
        # the sizing inputs (checker/launch/command.py SIZING_DESTS, by their ServerArgs field names)
        "model_path",
        "tp_size",
        "tensor_parallel_size",
        "pp_size",
        "pipeline_parallel_size",
        "dp_size",
        "data_parallel_size",
        "enable_dp_attention",
        "attn_dp_size",
        "attn_cp_size",
        "page_size",
        "disable_radix_cache",
        "disable_overlap_schedule",
        "mem_fraction_static",
        "max_running_requests",
        "max_mamba_cache_size",
        "mamba_full_memory_ratio",
        "mamba_ssm_dtype",
        "enable_mixed_chunk",
        "context_length",
        "pp_max_micro_batch_size",
        "chunked_prefill_size",
        "max_prefill_tokens",
        "max_total_tokens",
        "kv_cache_dtype",
        # the layout SGLang derives from
        "nnodes",
        "node_rank",
        # the weights flags (checker/launch/command.py WEIGHTS_DESTS) and where the model is
        "ep_size",
        "dtype",
        "quantization",
        "enable_dp_lm_head",
        "language_model_only",
        "disable_shared_experts_fusion",
        "moe_runner_backend",
        "revision",
        "download_dir",
        # the environment the derivation reads
        "SGLANG_ENABLE_PP_SPEC",
        "SGLANG_PP_LAYER_PARTITION",
        "SGLANG_MAMBA_CONV_DTYPE",
        "SGLANG_MAMBA_SSM_DTYPE",
        "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK",
    }
)
LAYOUT = frozenset(
    {"tp_size", "pp_size", "dp_size", "nnodes", "attn_dp_size", "enable_dp_attention", "attn_cp_size"}
)
_RELEVANT = re.compile(r"^(speculative_|spec_)|mamba|radix|replayssm|eagle|^max_draft|draft_model")
"""Speculative decoding and the mamba / radix / replay-SSM flags, whatever a release calls them."""
_PREFIXES = re.compile(
    r"\b(?:self\.server_args|self\.args|server_args|self|cfg|view|resolved|config_view|args|sa|sargs)\."
)
"""How the argument handling names the arguments object (stripped: ``self.pp_size`` and ``cfg.pp_size``
are one field)."""
_ENV = re.compile(r"\bSGLANG_[A-Z0-9_]+\b")


def involves(tested: frozenset[str], returns: frozenset[str] = frozenset()) -> bool:
    """Whether a check involves what the checker reads (module docstring): its own tests read one of the
    checker's inputs, or an early return before it reads the layout or speculative / mamba / radix flags
    (``if pp_size == 1: return``; an early return on the model path or the device does not make every
    check after it about the model)."""
    return any(n in CHECKER_READS or _RELEVANT.search(n) for n in tested) or any(
        n in LAYOUT or _RELEVANT.search(n) for n in returns
    )


# ------------------------------------------------------------------------------------------------------
# Reading one module
# ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """One assert or raise of one release, as its code reads."""

    path: str
    """Under sglang/srt/."""
    line: int
    function: str
    kind: str
    """``assert``, or the exception raised (``ValueError``, ``RuntimeError``, ...)."""
    message: str
    """SGLang's own words; f-string fields as ``{field}``; "" when it gives none."""
    condition: str
    """What must hold for it not to fire, and the tests it sits under (`` and ``-joined)."""
    names: frozenset[str]
    """What its condition and the tests it sits under read (fields, SGLANG_ variables)."""
    returns: frozenset[str] = frozenset()
    """What only the early returns before it read."""

    @property
    def key(self) -> str:
        return self.message or f"{self.kind}: {self.condition}"


def _text(node: ast.AST) -> str:
    return _PREFIXES.sub("", ast.unparse(node))


def _message(node: ast.expr | None) -> str:
    """The words of an assert's message or an exception's first argument, f-string fields as ``{expr}``."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                out.append("{" + _text(part.value) + "}")
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _message(node.left) + _message(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _message(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _message(node.func.value)
    return "{" + _text(node) + "}"


def _names(node: ast.AST) -> set[str]:
    """Field names read (``x.field``, ``getattr(x, "field")``) and SGLANG_ environment variables named."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            if _ENV.fullmatch(n.value):
                out.add(n.value)
            elif isinstance(n.value, str) and n.value.isidentifier():
                out.add(n.value)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr"):
            if len(n.args) > 1 and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
                out.add(n.args[1].value)
    return out


def _returns(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise)


class _Module:
    """One module's functions with, for every statement, the tests it sits under."""

    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.tree = tree
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node

    def functions(self) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        def walk(
            body: Sequence[ast.stmt], prefix: str
        ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
            for node in body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield prefix + node.name, node
                    yield from walk(node.body, prefix + node.name + ".")
                elif isinstance(node, ast.ClassDef):
                    yield from walk(node.body, prefix + node.name + ".")
                elif isinstance(node, ast.If | ast.Try):
                    yield from walk(
                        [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])], prefix
                    )

        yield from walk(self.tree.body, "")

    def guards(self, node: ast.AST, stop: ast.AST) -> list[tuple[ast.expr, bool]]:
        """The tests under which ``node`` runs inside ``stop`` (a function), each with whether it is an early
        return: enclosing ``if`` tests (``not`` in an ``else``), and the early returns before it in every
        enclosing block."""
        out: list[tuple[ast.expr, bool]] = []
        child = node
        parent = self.parent.get(child)
        while parent is not None and child is not stop:
            if isinstance(parent, ast.If | ast.While):
                if child in parent.orelse:
                    out.append((ast.UnaryOp(op=ast.Not(), operand=parent.test), False))
                elif child is not parent.test:
                    out.append((parent.test, False))
            elif isinstance(parent, ast.IfExp) and child is not parent.test:
                test = parent.test if child is parent.body else ast.UnaryOp(op=ast.Not(), operand=parent.test)
                out.append((test, False))
            for block in ("body", "orelse", "finalbody"):
                stmts = getattr(parent, block, None)
                if isinstance(stmts, list) and child in stmts:
                    for before in stmts[: stmts.index(child)]:
                        if isinstance(before, ast.If) and _returns(before.body) and not before.orelse:
                            out.append((ast.UnaryOp(op=ast.Not(), operand=before.test), True))
            child, parent = parent, self.parent.get(parent)
        return list(reversed(out))


def _checks(mod: _Module) -> Iterator[tuple[str, ast.AST, ast.FunctionDef | ast.AsyncFunctionDef]]:
    seen: set[int] = set()
    for qualname, fn in mod.functions():
        for node in ast.walk(fn):
            if isinstance(node, ast.Assert | ast.Raise) and id(node) not in seen:
                # the innermost function owns it (a nested function is walked on its own)
                owner = mod.parent.get(node)
                while owner is not None and not isinstance(owner, ast.FunctionDef | ast.AsyncFunctionDef):
                    owner = mod.parent.get(owner)
                if owner is fn:
                    seen.add(id(node))
                    yield qualname, node, fn


def _calls(mod: _Module) -> Iterator[tuple[str, list[tuple[ast.expr, bool]]]]:
    """(callee name, the tests around the call) for every call by bare or attribute name."""
    for _qualname, fn in mod.functions():
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name:
                    yield name, mod.guards(node, fn)


def read_modules(modules: list[_Module]) -> list[Found]:
    """Every assert and raise of ``modules`` (one release's argument handling), with its tests."""
    callers: dict[str, list[list[tuple[ast.expr, bool]]]] = {}
    for mod in modules:
        for name, guards in _calls(mod):
            callers.setdefault(name, []).append(guards)
    out: list[Found] = []
    for mod in modules:
        for qualname, node, fn in _checks(mod):
            sites = callers.get(fn.name, [])
            outer = sites[0] if len(sites) == 1 else []  # a helper called from one place: its call's tests
            if isinstance(node, ast.Assert):
                kind, message, own = "assert", _message(node.msg), [(node.test, False)]
            else:
                exc = node.exc
                if exc is None:
                    continue  # a bare re-raise: the check is where the exception started
                if isinstance(exc, ast.Call):
                    kind = _text(exc.func)
                    message = _message(exc.args[0]) if exc.args else ""
                else:
                    kind, message = _text(exc), ""
                own = []
            tests = [*outer, *mod.guards(node, fn), *own]
            # A message names the check; without one the whole condition does (early returns included).
            shown = tests if not message else [(t, early) for t, early in tests if not early]
            condition = " and ".join(_text(t) for t, _ in shown)
            tested: set[str] = set()
            passed: set[str] = set()
            for t, early in tests:
                (passed if early else tested).update(_names(t))
            out.append(
                Found(
                    path=mod.path.removeprefix(SRT),
                    line=node.lineno,
                    function=qualname,
                    kind=kind,
                    message=" ".join(message.split()),
                    condition=" ".join(condition.split()),
                    names=frozenset(tested),
                    returns=frozenset(passed - tested),
                )
            )
    return out


def validation_paths(paths: Sequence[str]) -> list[str]:
    """The release's argument-handling modules among ``paths`` (every .py under sglang/srt/)."""
    return sorted(
        p
        for p in paths
        if p == SRT + "server_args.py" or (p.startswith(SRT + "arg_groups/") and p.endswith(".py"))
    )


# ------------------------------------------------------------------------------------------------------
# The server arguments a release's pool sizing reads
# ------------------------------------------------------------------------------------------------------

SIZING_MODULES = (
    SRT + "mem_cache/kv_cache_configurator.py",  # 0.5.16+
    SRT + "model_executor/pool_configurator.py",  # 0.5.13+
    SRT + "model_executor/model_runner_kv_cache_mixin.py",  # 0.5.7-0.5.15.post1
)
"""Read whole: every function in them sizes or builds the pools."""
RUNNER = SRT + "model_executor/model_runner.py"
RUNNER_SIZING = frozenset({"init_memory_pool", "profile_max_num_token", "handle_max_mamba_cache"})
"""The model runner's sizing functions up to 0.5.6.post2 (and the ``__init__`` statements that set
``max_mamba_cache_size``, 0.5.2-0.5.3.post1)."""
_VIEWS = re.compile(r"^get_[a-z]+$")
"""0.5.17+: ``get_exec()``, ``get_schedule()``, ``get_spec()``, ... serve the resolved arguments."""


def server_arg_fields(files: dict[str, str]) -> dict[str, str]:
    """field -> its default's source, for every server argument of the release: ``ServerArgs``' fields
    (server_args.py) and, from 0.5.20, the namespaces of ``arg_groups/fields/``."""
    out: dict[str, str] = {}
    for path, text in files.items():
        if path != SRT + "server_args.py" and not path.startswith(SRT + "arg_groups/fields/"):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for cls in tree.body:
            if not isinstance(cls, ast.ClassDef):
                continue
            if path.endswith("server_args.py") and cls.name != "ServerArgs":
                continue
            for item in cls.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id
                    if name.startswith("_"):
                        continue
                    value = item.value
                    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
                        value = next((k.value for k in value.keywords if k.arg == "default"), None)
                    out.setdefault(name, "" if value is None else ast.unparse(value))
    return out


def _root(node: ast.expr) -> tuple[ast.expr, list[str]]:
    """An attribute chain's root and its attributes, outermost last (``get_exec().mamba.x`` ->
    (``get_exec()``, [mamba, x]))."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return node, list(reversed(attrs))


def _is_args(root: ast.expr, chain: list[str], views: set[str], arg_names: set[str]) -> list[str] | None:
    """The attributes after the arguments object when ``root.chain`` reads the server arguments."""
    if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and _VIEWS.match(root.func.id):
        return chain
    if isinstance(root, ast.Name):
        if root.id in arg_names or root.id in views:
            return chain
        if root.id == "self":
            if chain[:1] == ["server_args"]:
                return chain[1:]
            return chain
    return None


def _reads(fn: ast.AST, fields: dict[str, str]) -> Iterator[tuple[str, int]]:
    views: set[str] = set()
    arg_names = {"server_args", "sa"}
    for node in ast.walk(fn):  # names bound to a view or to the arguments: ``spec = get_spec()``
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            root, chain = _root(node.value)
            if _is_args(root, chain, views, arg_names) is not None and not (
                isinstance(root, ast.Name) and root.id == "self" and chain[:1] != ["server_args"]
            ):
                views.add(node.targets[0].id)
    for node in ast.walk(fn):
        if not isinstance(node, ast.Attribute):
            continue
        parent_chain = _root(node)
        root, chain = parent_chain
        after = _is_args(root, chain, views, arg_names)
        if not after:
            continue
        field_name = next((a for a in after if a in fields), None)
        if field_name is not None and field_name == after[-1]:
            yield field_name, node.lineno


def _cited_before(a: Read, b: Read) -> bool:
    """Which read the table cites: one in the state pool's or the budget's sizing first, then the first
    in the file."""

    def key(r: Read) -> tuple[int, str, int]:
        name = r.function.rsplit(".", 1)[-1].lower()
        core = "mamba" in name or name in (
            "_profile_available_bytes",
            "resolve_max_num_reqs",
            "profile_max_num_token",
        )
        return (0 if core else 1, r.path, r.line)

    return key(a) < key(b)


@dataclass(frozen=True)
class Read:
    """One server argument one release's pool sizing reads, where it first does."""

    field: str
    path: str
    line: int
    function: str
    default: str


def read_sizing(files: dict[str, str]) -> list[Read]:
    fields = server_arg_fields(files)
    found: dict[str, Read] = {}
    for path in sorted(files):
        whole = path in SIZING_MODULES
        if not whole and path != RUNNER:
            continue
        try:
            mod = _Module(path, ast.parse(files[path]))
        except SyntaxError:
            continue
        for qualname, fn in mod.functions():
            name = qualname.rsplit(".", 1)[-1]
            if whole or name in RUNNER_SIZING:
                bodies: list[ast.AST] = [fn]
            elif qualname == "ModelRunner.__init__":
                bodies = [
                    s
                    for s in ast.walk(fn)
                    if isinstance(s, ast.If) and "max_mamba_cache_size" in ast.unparse(s)
                ]
            else:
                continue
            for body in bodies:
                for field_name, line in _reads(body, fields):
                    read = Read(field_name, path.removeprefix(SRT), line, qualname, fields[field_name])
                    if field_name not in found or _cited_before(read, found[field_name]):
                        found[field_name] = read
    return sorted(found.values(), key=lambda r: r.field)


# ------------------------------------------------------------------------------------------------------
# One release
# ------------------------------------------------------------------------------------------------------


def release_files(version: str, wheels_dir: Path, src_dir: Path) -> dict[str, str]:
    """path -> text of every .py file under sglang/srt/ of ``version`` (its unpacked sources, else its
    wheel)."""
    root = src_dir / version
    if (root / "sglang").is_dir():
        return dict(wheels.python_sources(root))
    return dict(wheels.python_sources(wheels.fetch_wheel(version, wheels_dir)))


def read_release_checks(files: dict[str, str]) -> list[Found]:
    modules = []
    for path in validation_paths(list(files)):
        try:
            modules.append(_Module(path, ast.parse(files[path])))
        except SyntaxError:
            continue
    return [f for f in read_modules(modules) if involves(f.names, f.returns)]


def rule_id(key: str) -> str:
    """A check's name in the table and in ``checker/core/releases/check_policy.py``: its first words, and a
    digest of
    its whole identity (two checks that start alike stay apart)."""
    words = re.findall(r"[a-z0-9]+", key.lower())
    slug = ""
    for w in words:
        if len(slug) + len(w) + 1 > 44:
            break
        slug = f"{slug}-{w}" if slug else w
    return f"{slug or 'check'}-{hashlib.sha1(key.encode()).hexdigest()[:6]}"


def _runs(by_release: dict[str, str], releases: Sequence[str]) -> str:
    """Where each release has it, grouped by file and function: ``server_args.py check_server_args
    0.5.2:2262 0.5.3-0.5.3.post1:2301 | arg_groups/validation_hook.py check_server_args 0.5.19:199``;
    consecutive releases at the same line are one run. ``by_release``: ``path:line function`` (several
    joined by `` & ``)."""
    groups: dict[str, list[tuple[str, str, str]]] = {}
    previous: dict[str, str] = {}
    for v in releases:
        if v not in by_release:
            previous.clear()
            continue
        seen: dict[str, str] = {}
        for site in by_release[v].split(" & "):
            loc, function = site.split(" ", 1)
            path, line = loc.rsplit(":", 1)
            group = f"{path} {function}"
            runs = groups.setdefault(group, [])
            if seen.get(group):  # a second site in the same function: its own run
                runs.append((v, v, line))
                continue
            seen[group] = line
            if runs and previous.get(group) == runs[-1][1] and runs[-1][2] == line:
                runs[-1] = (runs[-1][0], v, line)
            else:
                runs.append((v, v, line))
        previous = {g: v for g in seen}
    return " | ".join(
        f"{group} " + " ".join(f"{a if a == b else f'{a}-{b}'}:{line}" for a, b, line in runs)
        for group, runs in groups.items()
    )


@dataclass
class Table:
    """What every release's code says: the checks by id, the sizing reads by field."""

    checks: dict[str, dict[str, object]] = field(default_factory=dict)
    reads: dict[str, dict[str, object]] = field(default_factory=dict)

    def add_release(self, version: str, checks: list[Found], reads: list[Read]) -> None:
        sites: dict[str, list[Found]] = {}
        for f in checks:
            sites.setdefault(f.key, []).append(f)
        for key, found in sites.items():
            entry = self.checks.setdefault(rule_id(key), {"key": key, "where": {}})
            newest = found[-1]
            entry.update(message=newest.message, kind=newest.kind, condition=newest.condition)
            entry["where"][version] = " & ".join(f"{f.path}:{f.line} {f.function}" for f in found)  # type: ignore[index]
        for r in reads:
            entry = self.reads.setdefault(r.field, {"where": {}})
            entry["default"] = r.default
            entry["where"][version] = f"{r.path}:{r.line} {r.function}"  # type: ignore[index]

    def render(self, releases: Sequence[str]) -> str:
        lines = [HEADER, "CHECKS: dict[str, tuple[str, str, str, str]] = {"]
        order = sorted(self.checks, key=lambda i: (_first(self.checks[i]["where"], releases), i))  # type: ignore[arg-type]
        for i in order:
            e = self.checks[i]
            where = _runs(e["where"], releases)  # type: ignore[arg-type]
            lines.append(f"    {i!r}: ({e['message']!r}, {e['kind']!r}, {e['condition']!r}, {where!r}),")
        lines.append("}")
        lines.append("SIZING_READS: dict[str, tuple[str, str]] = {")
        for name in sorted(self.reads):
            e = self.reads[name]
            where = _runs(e["where"], releases)  # type: ignore[arg-type]
            lines.append(f"    {name!r}: ({e['default']!r}, {where!r}),")
        lines.append("}")
        lines.append("# fmt: on")
        return "\n".join(lines) + "\n"


def _first(where: dict[str, str], releases: Sequence[str]) -> int:
    return min(releases.index(v) for v in where)


HEADER = '''\
# ruff: noqa: E501  (generated: one line per check)
"""Each modelled SGLang release's start-up checks of its server arguments that involve what the checker reads,
and the server arguments its pool sizing reads (GENERATED by ``scripts/build_arg_checks.py`` from each
release's code; do not edit).

``CHECKS[id] = (message, kind, condition, where)``: SGLang's own words (f-string fields as ``{field}``),
``assert`` or the exception raised, what must hold (with the tests it sits under, in the newest release
that has it) and, per run of releases, ``path:line function`` under ``sglang/srt/`` (``0.5.2-0.5.8 a | 0.5.9
b``; `` & `` where a release has it twice). ``SIZING_READS[field] = (default, where)``: the argument's
default (newest release) and where each release's pool sizing first reads it. How the checker handles each
one: ``checker/core/releases/check_policy.py`` and ``checker/core/releases/arg_policy.py``.
"""

from __future__ import annotations

# fmt: off
'''


def build(releases: Sequence[str], wheels_dir: Path, src_dir: Path, *, log: bool = True) -> Table:
    table = Table()
    for v in releases:
        files = release_files(v, wheels_dir, src_dir)
        checks, reads = read_release_checks(files), read_sizing(files)
        table.add_release(v, checks, reads)
        if log:
            print(f"{v}: {len(checks)} checks, {len(reads)} sizing reads", file=sys.stderr)
    return table


# ------------------------------------------------------------------------------------------------------
# docs/preflight.md: the checks not modelled, by reason
# ------------------------------------------------------------------------------------------------------

DOCS = REPO / "docs" / "preflight.md"
BEGIN = "<!-- BEGIN not-modelled checks: generated by scripts/build_arg_checks.py --docs; do not edit -->"
END = "<!-- END not-modelled checks -->"


def _span(where: str) -> str:
    """``0.5.2-0.5.23``: the first and last release of a table entry's location text."""
    runs = [run.rpartition(":")[0] for group in where.split(" | ") for run in group.split(" ")[2:]]
    releases = {r for run in runs for r in run.split("-") if r and r[0].isdigit()}
    order = sorted(releases, key=MODELLED_RELEASES.index)
    return order[0] if order[0] == order[-1] else f"{order[0]}-{order[-1]}"


def _newest_site(where: str) -> str:
    path, function = where.split(" | ")[-1].split(" ")[:2]
    return f"`{path}` `{function.rsplit('.', 1)[-1]}`"


def render_docs() -> str:
    """The generated part of docs/preflight.md "Start-up refusals": every check not modelled, grouped by
    reason
    (checker/core/releases/check_policy.py), each with the releases that have it and where the newest does."""
    from checker.core.releases.arg_checks import CHECKS
    from checker.core.releases.arg_policy import NOT_MODELLED, REASONS
    from checker.core.releases.check_policy import CHECKS as HANDLED

    lines = [BEGIN]
    for reason, text in REASONS.items():
        ids = [i for i, h in HANDLED.items() if h.how == NOT_MODELLED and h.why == reason]
        if not ids:
            continue
        lines += ["", f"<details><summary><b>{reason}</b> ({len(ids)}): {text}</summary>", ""]
        entries = []
        for i in ids:
            message, kind, condition, where = CHECKS[i]
            words = message or f"{kind}: {condition}"
            words = words if len(words) <= 160 else words[:157] + "..."
            words = words.replace("`", "'").replace("|", "/").replace("<", "&lt;")
            span = _span(where)
            first = MODELLED_RELEASES.index(span.split("-")[0])
            entries.append((first, words, f"- {span}: {words} ({_newest_site(where)})"))
        lines += [e for *_, e in sorted(entries)]
        lines += ["", "</details>"]
    lines.append(END)
    return "\n".join(lines)


def docs_with_list(text: str) -> str:
    """docs/preflight.md's text with its generated list replaced by :func:`render_docs`'s."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOCS.relative_to(REPO)} has no {BEGIN!r} ... {END!r} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + render_docs() + tail


def default_src() -> Path:
    """Where unpacked sources are looked for: $CHECKER_SGLANG_SRC, else ~/.cache/pp-checker/src (the
    folder the other tests read too; a release not there is read from its wheel)."""
    given = os.environ.get("CHECKER_SGLANG_SRC")
    return Path(given) if given else Path.home() / ".cache" / "pp-checker" / "src"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "pp-checker" / "wheels")
    parser.add_argument(
        "--src",
        type=Path,
        default=default_src(),
        help="unpacked sources, <DIR>/<version>/sglang (else the wheels)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the table or the docs' list is not what they should be",
    )
    parser.add_argument("--docs", action="store_true", help="only rewrite docs/preflight.md's list")
    args = parser.parse_args(argv)
    if args.docs:
        DOCS.write_text(docs_with_list(DOCS.read_text()))
        print(f"wrote the checks not modelled into {DOCS.relative_to(REPO)}")
        return 0
    text = build(MODELLED_RELEASES, args.wheels, args.src).render(MODELLED_RELEASES)
    if args.check:
        stale = [TARGET] if TARGET.read_text() != text else []
        if not stale and DOCS.read_text() != docs_with_list(DOCS.read_text()):
            stale.append(DOCS)
        for path in stale:
            print(
                f"{path.relative_to(REPO)} is stale: run python3 scripts/build_arg_checks.py", file=sys.stderr
            )
        if not stale:
            print(f"{TARGET.relative_to(REPO)} and {DOCS.relative_to(REPO)} are what the code says")
        return 1 if stale else 0
    TARGET.write_text(text)
    DOCS.write_text(docs_with_list(DOCS.read_text()))
    print(
        f"wrote {TARGET.relative_to(REPO)} ({len(MODELLED_RELEASES)} releases) and its list in "
        f"{DOCS.relative_to(REPO)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
