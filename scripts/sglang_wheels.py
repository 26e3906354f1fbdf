"""Reading SGLang's released wheels without installing or importing them (stdlib only).

The tools that keep the checker's release tables honest share this module:

* ``scripts/sglang_release_watch.py`` - lists the published releases, downloads any newer than the newest
  modelled one and compares its sizing functions with the newest modelled release's;
* ``scripts/build_model_support.py`` - builds ``checker/core/releases/model_support.py``, the architectures
each
  modelled release's model registry loads.

Every network step goes through pip (``pip index versions``, ``pip download --no-deps``), so pip's
configuration (index, proxy, cache) applies and a download is cached once. Every step is bounded.
"""

from __future__ import annotations

import ast
import hashlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PIP_TIMEOUT_S = 300
"""One pip call (an index listing, one wheel download: the wheels are 2-40 MB)."""

# The sizing code, by what it sizes: (qualified name, what it decides). A release's wheel has some of
# them (the names moved between releases: docs/sglang-releases.md "Where each group's code lives");
# each one found is compared by its normalised source.
SIZING_FUNCTIONS: tuple[tuple[str, str], ...] = (
    ("KVCacheConfigurator._handle_max_mamba_cache", "the state pool (max_mamba_cache_size)"),
    ("ModelRunnerKVCacheMixin.handle_max_mamba_cache", "the state pool (max_mamba_cache_size)"),
    ("KVCacheConfigurator._calculate_mamba_ratio", "slots per request"),
    ("ModelRunnerKVCacheMixin._calculate_mamba_ratio", "slots per request"),
    ("get_mamba_tracking_slots", "slots per request (tracking slots)"),
    ("KVCacheConfigurator.resolve_max_num_reqs", "the request limit (max_running_requests)"),
    ("ModelRunnerKVCacheMixin._resolve_max_num_reqs", "the request limit (max_running_requests)"),
    ("KVCacheConfigurator._profile_available_bytes", "the budget (total_rest_memory)"),
    ("ModelRunnerKVCacheMixin._profile_available_bytes", "the budget (total_rest_memory)"),
    ("BaseLinearStateParams.mamba_cache_per_req", "the state bytes per request"),
    ("get_pp_indices", "the stage slices (SGLANG_PP_LAYER_PARTITION)"),
    ("_pp_local_per_request_bytes", "a stage's own state bytes"),
    ("Scheduler[pp_max_micro_batch_size]", "the micro-batch size (pp_max_micro_batch_size)"),
)
_MICRO_BATCH = "Scheduler[pp_max_micro_batch_size]"
"""Inline in a Scheduler method (``__init__`` up to 0.5.22, ``init_model_worker`` in 0.5.23): the ``if``
statements that default ``pp_max_micro_batch_size``, wherever in the class they sit."""
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")


class IndexUnreachable(RuntimeError):
    """pip could not list or download from the package index (offline CI, a proxy down)."""


def release_key(version: str) -> tuple[int, int, int, int]:
    """Final and post releases in order; anything else (a pre-release) sorts first and is skipped."""
    m = _VERSION.match(version)
    if m is None:
        return (-1, -1, -1, -1)
    return tuple(int(x or 0) for x in m.groups())  # type: ignore[return-value]


def _pip(*args: str, timeout_s: float = PIP_TIMEOUT_S) -> str:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise IndexUnreachable(f"pip {args[0]} took more than {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-2:])
        raise IndexUnreachable(f"pip {' '.join(args[:2])} failed: {tail}")
    return proc.stdout


def published_releases(package: str = "sglang") -> list[str]:
    """Every final and post release on the index, oldest first (``pip index versions``)."""
    out = _pip("index", "versions", package)
    m = re.search(r"Available versions:\s*(.+)", out)
    if m is None:
        raise IndexUnreachable(f"pip index versions {package}: no 'Available versions' line in its output")
    versions = [v.strip() for v in m.group(1).split(",") if v.strip()]
    return sorted((v for v in versions if _VERSION.match(v)), key=release_key)


def fetch_wheel(version: str, dest: Path, package: str = "sglang") -> Path:
    """``pip download --no-deps package==version`` into ``dest`` (pip's cache makes a repeat free)."""
    dest.mkdir(parents=True, exist_ok=True)
    found = list(dest.glob(f"{package}-{version}-*.whl"))
    if not found:
        _pip(
            "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(dest), f"{package}=={version}"
        )
        found = list(dest.glob(f"{package}-{version}-*.whl"))
    if not found:
        raise IndexUnreachable(f"pip download {package}=={version} left no wheel in {dest}")
    return found[0]


def wheel_version(wheel: Path) -> str:
    """The version a wheel's dist-info says (what ``importlib.metadata`` will report once installed)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode("utf-8", "replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise ValueError(f"{wheel}: no Version in its METADATA")


def python_sources(wheel: Path, under: str = "sglang/srt/") -> Iterator[tuple[str, str]]:
    """(path, text) of every .py file under ``under`` in the wheel (a folder of sources works too)."""
    if wheel.is_dir():
        for path in sorted(wheel.rglob("*.py")):
            rel = path.relative_to(wheel).as_posix()
            if rel.startswith(under):
                yield rel, path.read_text(encoding="utf-8", errors="replace")
        return
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            if name.startswith(under) and name.endswith(".py"):
                yield name, z.read(name).decode("utf-8", "replace")


# ------------------------------------------------------------------------------------------------------
# Sizing functions, normalised
# ------------------------------------------------------------------------------------------------------


def _strip_docstrings(node: ast.AST) -> None:
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            n.body = body[1:] or [ast.Pass()]


def normalise(node: ast.AST) -> str:
    """A function's source without comments, docstrings, formatting or type annotations: two releases
    whose normalised sources are equal compute the same way (a changed name or constant shows)."""
    node = ast.parse(ast.unparse(node))  # a copy
    _strip_docstrings(node)
    for n in ast.walk(node):
        if isinstance(n, ast.arg):
            n.annotation = None
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            n.returns = None
    return ast.unparse(node)


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every module-level function and every method one class deep."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def _micro_batch_statements(method: ast.AST) -> list[str]:
    """The ``if`` statements of a Scheduler method that default ``pp_max_micro_batch_size``."""
    return [
        normalise(stmt)
        for stmt in ast.walk(method)
        if isinstance(stmt, ast.If)
        and "pp_max_micro_batch_size" in ast.unparse(stmt.test)
        and "max_running_requests" in ast.unparse(stmt)
    ]


@dataclass(frozen=True)
class SizingSource:
    qualname: str
    path: str
    source: str
    """Normalised (see :func:`normalise`)."""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:12]


def sizing_functions(wheel: Path) -> dict[str, SizingSource]:
    """The :data:`SIZING_FUNCTIONS` this release has, by qualified name, normalised."""
    wanted = {name for name, _ in SIZING_FUNCTIONS}
    out: dict[str, SizingSource] = {}
    for path, text in python_sources(wheel):
        if not any(name.split("[")[0].split(".")[-1] in text for name in wanted):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        micro: list[str] = []
        for qualname, node in _functions(tree):
            if qualname.startswith("Scheduler.") and path.endswith("managers/scheduler.py"):
                micro += _micro_batch_statements(node)
            elif qualname in wanted and qualname not in out:
                out[qualname] = SizingSource(qualname, path, normalise(node))
        if micro:
            out[_MICRO_BATCH] = SizingSource(_MICRO_BATCH, path, "\n".join(micro))
    return out


# ------------------------------------------------------------------------------------------------------
# The model registry: which architectures a release loads
# ------------------------------------------------------------------------------------------------------


def _entry_names(value: ast.expr, aliases: dict[str, str]) -> list[str]:
    items: Iterable[ast.expr] = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
    names = []
    for item in items:
        if isinstance(item, ast.Name):
            names.append(aliases.get(item.id, item.id))
        elif isinstance(item, ast.Attribute):
            names.append(item.attr)
    return names


def registered_architectures(wheel: Path) -> dict[str, str]:
    """architecture -> the module of ``sglang/srt/models`` that registers it, as the release's registry
    (``models/registry.py`` ``import_model_classes``) does: every top-level module of the package (not
    its sub-packages), its ``EntryClass`` (a class or a list of classes), each class by ``__name__``."""
    out: dict[str, str] = {}
    for path, text in python_sources(wheel, "sglang/srt/models/"):
        rel = path.removeprefix("sglang/srt/models/")
        if "/" in rel or rel == "__init__.py" or "EntryClass" not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        aliases = {
            a.asname: a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for a in node.names
            if a.asname
        }
        statements = list(tree.body)
        while statements:  # module level, including the branches of a top-level if/try
            node = statements.pop(0)
            if isinstance(node, ast.If | ast.Try):
                statements += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                continue
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in targets):
                for arch in _entry_names(node.value, aliases):
                    out.setdefault(arch, rel.removesuffix(".py"))
    return out


def registry_fallbacks(wheel: Path) -> dict[str, bool]:
    """What the release's registry does for an architecture it has no class for (models/registry.py):
    ``transformers_fallback`` (``_normalize_archs`` appends TransformersForCausalLM), and
    ``external_package`` (SGLANG_EXTERNAL_MODEL_PACKAGE registers a package of the user's)."""
    text = dict(python_sources(wheel, "sglang/srt/models/registry.py")).get(
        "sglang/srt/models/registry.py", ""
    )
    return {
        "transformers_fallback": "TransformersForCausalLM" in text,
        "external_package": "SGLANG_EXTERNAL_MODEL_PACKAGE" in text,
    }
