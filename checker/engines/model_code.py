"""What a model class's own source says about pipeline parallelism (stdlib only: ``ast``, no import of it).

Read from a release's sources without running them, by ``scripts/build_pp_support.py`` over every modelled
wheel (the table :mod:`checker.core.releases.pp_support`) and by the ``sglang`` engine over the installed
release (a release newer than the modelled ones is judged by its own code). What is read, per entry class:

* ``forward`` (the class's own, else the first base's, as attribute lookup finds it): whether it takes
  ``pp_proxy_tensors``. That is the model runner's whole test (0.5.23 ``model_executor/model_runner.py``
  508-516: ``support_pp = "pp_proxy_tensors" in inspect.signature(self.model.forward).parameters``, and
  under pp > 1 ``assert self.support_pp``).
* the constructor: every ``__init__`` the class runs (its bases through ``super().__init__``, the
  sglang classes it builds, the methods of ``self`` it calls), for an ``assert`` of a single stage
  (``assert self.pp_group.is_first_rank and self.pp_group.is_last_rank``) and for the call that builds
  the decoder layers: ``make_layers`` with ``pp_rank``/``pp_size`` or ``make_pp_layers`` build only the
  stage's own layers; ``make_layers`` without them, or ``make_layers_non_pp``, build every layer.
* the tied head: ``self.lm_head.weight = self.model.embed_tokens.weight`` (or ``self.lm_head =
  self.model.embed_tokens``) under no pipeline guard, while ``embed_tokens`` is built on the first stage
  only: every later stage fails in the constructor when the config ties the embeddings.
* ``load_weights``: whether it can skip a checkpoint tensor whose parameter this stage does not hold
  (``is_pp_missing_parameter``, the stage's layer range, a ``name in params_dict`` test, ``.get``); one
  that indexes ``params_dict[name]`` with none of them raises ``KeyError`` on every stage at pp > 1.

The reading is by names, as the code is written, not by running it; ``scripts/build_pp_support.py`` checks
its answers against classes built on the meta device where a CPU environment of the release exists.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from checker.engines.errors import SglangChanged

MODELS = "sglang/srt/models/"
Source = Callable[[str], "str | None"]
"""A release's source by its path in the wheel (``sglang/srt/models/qwen3_next.py``); None: absent."""

_OWN_STAGE_BUILDERS = frozenset({"make_pp_layers"})
_ALL_LAYER_BUILDERS = frozenset({"make_layers_non_pp"})


@dataclass(frozen=True)
class Where:
    """A place in a release's sources (path in the wheel, 1-based line)."""

    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path.removeprefix('sglang/srt/')}:{self.line}"


@dataclass(frozen=True)
class ClassReading:
    """What one entry class's code does under pipeline parallelism (see the module docstring)."""

    architecture: str
    path: str
    forward: Where | None
    """Where the ``forward`` the class uses is defined (None: no ``forward`` found in the classes read)."""
    takes_proxy: bool
    single_stage: Where | None
    """The constructor's assert of a single stage (None: none)."""
    layers: str
    """``stage`` (each stage builds its own slice), ``all`` (every stage builds every layer), or
    ``unknown``."""
    layers_at: Where | None
    runs_all_at: Where | None
    """Where the forward of the module that builds every layer loops over all of them (only with
    ``layers == "all"``: each stage then runs the whole model on what the previous stage sent)."""
    tied_head: Where | None
    """An unguarded tie of ``lm_head`` to a first-stage-only ``embed_tokens`` (None: none)."""
    unfiltered_load: Where | None
    """``load_weights`` indexing ``params_dict`` with no stage filter (None: it has one, or none found)."""


@dataclass
class _Module:
    path: str
    tree: ast.Module
    classes: dict[str, ast.ClassDef]
    imports: dict[str, tuple[str, str]]
    """Local name -> (module path, name there) for ``from ... import`` of sglang modules."""


def parse_source(path: str, text: str) -> ast.Module:
    """A release's source file as Python reads it: a UTF-8 byte-order mark is no code (0.5.3.post1 to
    0.5.12.post1 ship ``models/qwen2_classification.py`` with one, and import it). A file that does not
    parse is not skipped, since what it says is what the answer depends on: :class:`SglangChanged`."""
    try:
        return ast.parse(text.removeprefix("\ufeff"))
    except SyntaxError as exc:
        raise SglangChanged(
            f"the installed SGLang's {path} does not parse here (SyntaxError: {exc.msg}, line {exc.lineno}): "
            "the checker reads the model's own code to tell how it runs under pipeline parallelism; "
            "report the release and this line"
        ) from None


class _Reader:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.modules: dict[str, _Module | None] = {}

    def module(self, path: str) -> _Module | None:
        if path not in self.modules:
            text = self.source(path)
            mod = None
            if text is not None:
                tree = parse_source(path, text)
                mod = _Module(path, tree, _classes(tree), _imports(tree, path))
            self.modules[path] = mod
        return self.modules[path]

    def resolve(self, mod: _Module, name: str) -> tuple[_Module, ast.ClassDef] | None:
        """The class ``name`` means in ``mod`` (defined there or imported from another sglang module)."""
        if name in mod.classes:
            return mod, mod.classes[name]
        if name in mod.imports:
            path, real = mod.imports[name]
            other = self.module(path)
            if other is not None and other is not mod:
                return self.resolve(other, real)
        return None

    def imported_module(self, mod: _Module, name: str) -> _Module | None:
        """The sglang module ``name`` stands for in ``mod`` (``from sglang.srt.models import qwen3_5``)."""
        if name not in mod.imports:
            return None
        path, real = mod.imports[name]
        return self.module(path.removesuffix(".py") + "/" + real + ".py")

    def resolve_expr(self, mod: _Module, expr: ast.expr) -> tuple[_Module, ast.ClassDef] | None:
        """A class named by ``Name`` or ``module.Name``."""
        if isinstance(expr, ast.Name):
            return self.resolve(mod, expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            other = self.imported_module(mod, expr.value.id)
            if other is not None:
                return self.resolve(other, expr.attr)
        return None

    def mro(self, mod: _Module, cls: ast.ClassDef) -> list[tuple[_Module, ast.ClassDef]]:
        """The class and its sglang bases, depth first (the models use single inheritance)."""
        out: list[tuple[_Module, ast.ClassDef]] = []
        todo = [(mod, cls)]
        while todo:
            m, c = todo.pop(0)
            if any(c is seen for _, seen in out):
                continue
            out.append((m, c))
            for base in c.bases:
                name = base.id if isinstance(base, ast.Name) else None
                found = self.resolve(m, name) if name else None
                if found is not None:
                    todo.append(found)
        return out


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    out: dict[str, ast.ClassDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out.setdefault(node.name, node)
    return out


def _imports(tree: ast.Module, path: str) -> dict[str, tuple[str, str]]:
    package = path.rsplit("/", 1)[0]
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit("/", 1)[0]
            target = base + ("/" + node.module.replace(".", "/") if node.module else "")
        elif node.module and node.module.startswith("sglang."):
            target = node.module.replace(".", "/")
        else:
            continue
        for alias in node.names:
            out[alias.asname or alias.name] = (target + ".py", alias.name)
    return out


def _method(chain: list[tuple[_Module, ast.ClassDef]], name: str) -> tuple[_Module, ast.FunctionDef] | None:
    for mod, cls in chain:
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == name:
                return mod, item
    return None


def _class_attribute(chain: list[tuple[_Module, ast.ClassDef]], name: str) -> tuple[_Module, ast.expr] | None:
    """``name = <expr>`` in a class body (``body_cls = qwen3_5.Qwen3_5ForCausalLM``)."""
    for mod, cls in chain:
        for item in cls.body:
            if (
                isinstance(item, ast.Assign)
                and len(item.targets) == 1
                and isinstance(item.targets[0], ast.Name)
                and item.targets[0].id == name
            ):
                return mod, item.value
    return None


def _param_names(fn: ast.FunctionDef) -> set[str]:
    a = fn.args
    return {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}


def _defaults(fn: ast.FunctionDef) -> dict[str, ast.expr]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    out = {p.arg: d for p, d in zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)}
    out.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None})
    return out


def _mentions(node: ast.AST, names: tuple[str, ...]) -> bool:
    text = ast.unparse(node)
    return any(n in text for n in names)


def _is_single_stage_assert(node: ast.AST) -> bool:
    """``assert X.is_first_rank and X.is_last_rank`` (a bare conjunction: the class refuses pp > 1)."""
    if not isinstance(node, ast.Assert):
        return False
    test = node.test
    if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)):
        return False
    attrs = {v.attr for v in test.values if isinstance(v, ast.Attribute)}
    return {"is_first_rank", "is_last_rank"} <= attrs


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _builder_kind(call: ast.Call) -> str | None:
    name = _call_name(call)
    if name in _OWN_STAGE_BUILDERS:
        return "stage"
    if name in _ALL_LAYER_BUILDERS:
        return "all"
    if name == "make_layers":
        keywords = {k.arg for k in call.keywords}
        if {"pp_rank", "pp_size"} <= keywords or len(call.args) >= 4:
            return "stage"
        return "all"
    return None


def _pp_guarded(parents: list[ast.AST]) -> bool:
    """Inside an ``if`` (or conditional expression) whose test reads the pipeline group."""
    return any(
        isinstance(p, ast.If | ast.IfExp)
        and _mentions(
            p.test, ("pp_group", "is_first_rank", "is_last_rank", "world_size", "pp_size", "pp_rank")
        )
        for p in parents
    )


def _walk_with_parents(
    node: ast.AST, parents: list[ast.AST] | None = None
) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    parents = parents or []
    for child in ast.iter_child_nodes(node):
        yield child, parents
        if isinstance(child, ast.ClassDef):
            continue
        yield from _walk_with_parents(child, [*parents, child])


@dataclass
class _Constructor:
    """What the constructor chain holds, found while walking it."""

    single_stage: Where | None = None
    builders: list[tuple[str, Where, _Module, ast.FunctionDef]] = field(default_factory=list)
    embed_first_only: bool = False
    embed_unguarded: bool = False
    tied_head: Where | None = None


def _walk_constructor(reader: _Reader, entry: tuple[_Module, ast.ClassDef]) -> _Constructor:
    found = _Constructor()
    chain = reader.mro(*entry)
    # A parameter naming a class (Qwen3-VL's language_model_cls) is the most derived default given.
    class_params: dict[str, tuple[_Module, ast.ClassDef]] = {}
    for mod, cls in chain:
        init = _method([(mod, cls)], "__init__")
        if init is None:
            continue
        for name, default in _defaults(init[1]).items():
            if isinstance(default, ast.Name) and name not in class_params:
                target = reader.resolve(mod, default.id)
                if target is not None:
                    class_params[name] = target
    seen: set[int] = set()
    todo: list[tuple[_Module, ast.FunctionDef, list[tuple[_Module, ast.ClassDef]]]] = []
    for mod, cls in chain:
        init = _method([(mod, cls)], "__init__")
        if init is not None:
            todo.append((init[0], init[1], chain))
    while todo:
        mod, fn, owner_chain = todo.pop(0)
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for node, parents in _walk_with_parents(fn):
            if isinstance(node, ast.Assert) and _is_single_stage_assert(node) and found.single_stage is None:
                found.single_stage = Where(mod.path, node.lineno)
            if isinstance(node, ast.Assign):
                _read_assign(node, parents, mod, found)
            if not isinstance(node, ast.Call):
                continue
            kind = _builder_kind(node)
            if kind is not None:
                found.builders.append((kind, Where(mod.path, node.lineno), mod, fn))
                continue
            called = _call_name(node)
            target = None
            if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                if node.func.value.id == "self" and called:
                    m = _method(owner_chain, called)  # a method of the class being built
                    if m is not None:
                        todo.append((m[0], m[1], owner_chain))
                        continue
                    attr = _class_attribute(owner_chain, called)  # a class held as a class attribute
                    target = reader.resolve_expr(*attr) if attr is not None else None
                else:
                    target = reader.resolve_expr(mod, node.func)  # module.Class
            elif isinstance(node.func, ast.Name) and called is not None:
                target = reader.resolve(mod, called)
                if target is None and called in _param_names(fn):
                    target = class_params.get(called)
            if target is None:
                continue
            sub_chain = reader.mro(*target)
            for sub_mod, sub_cls in sub_chain:
                init = _method([(sub_mod, sub_cls)], "__init__")
                if init is not None:
                    todo.append((init[0], init[1], sub_chain))
    return found


def _read_assign(node: ast.Assign, parents: list[ast.AST], mod: _Module, found: _Constructor) -> None:
    target = ast.unparse(node.targets[0]) if len(node.targets) == 1 else ""
    value = ast.unparse(node.value)
    if target == "self.embed_tokens" and "PPMissingLayer" not in value:
        if _pp_guarded(parents):
            found.embed_first_only = True
        else:
            found.embed_unguarded = True
    if target in ("self.lm_head", "self.lm_head.weight") and "embed_tokens" in value:
        if not _pp_guarded(parents) and found.tied_head is None:
            found.tied_head = Where(mod.path, node.lineno)


def _is_dict(expr: ast.expr) -> bool:
    """``params_dict`` or ``params_dict.keys()``."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "keys":
        expr = expr.func.value
    return isinstance(expr, ast.Name) and expr.id == "params_dict"


def _tests_membership(test: ast.expr, key: str, op: type[ast.cmpop]) -> bool:
    """``test`` is ``key in params_dict`` (``op`` In) or ``key not in params_dict`` (NotIn), alone or as
    a conjunct (In: the body runs only when the name is held) / disjunct (NotIn: it skips when not)."""
    parts = [test]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And if op is ast.In else ast.Or):
        parts = list(test.values)
    return any(
        isinstance(p, ast.Compare)
        and len(p.ops) == 1
        and isinstance(p.ops[0], op)
        and ast.unparse(p.left) == key
        and _is_dict(p.comparators[0])
        for p in parts
    )


def _leaves(body: list[ast.stmt]) -> bool:
    """A block that leaves the loop iteration or the function (continue, return, raise)."""
    return bool(body) and isinstance(body[-1], ast.Continue | ast.Return | ast.Raise)


def _guarded(key: str, parents: list[ast.AST], node: ast.AST) -> bool:
    """Whether ``params_dict[key]`` at ``node`` runs only for a name the dict holds: inside ``if key in
    params_dict``, or after ``if key not in params_dict: continue`` in an enclosing block."""
    chain = [*parents, node]
    for depth, parent in enumerate(parents):
        child = chain[depth + 1]
        if isinstance(parent, ast.If) and child in parent.body:
            if _tests_membership(parent.test, key, ast.In):
                return True
        for block in ("body", "orelse"):
            stmts = getattr(parent, block, None)
            if not isinstance(stmts, list) or child not in stmts:
                continue
            for earlier in stmts[: stmts.index(child)]:
                if (
                    isinstance(earlier, ast.If)
                    and _tests_membership(earlier.test, key, ast.NotIn)
                    and _leaves(earlier.body)
                ):
                    return True
    return False


_STAGE_WORDS = frozenset({"start_layer", "end_layer", "is_pp_missing_parameter"})


def _names(node: ast.AST) -> set[str]:
    out = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    return out | {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _layer_filter(fn: ast.FunctionDef, chain: list[tuple[_Module, ast.ClassDef]]) -> bool:
    """An ``if`` that skips the name on the stage's layer range (``start_layer``/``end_layer``) or
    ``is_pp_missing_parameter``, directly or through a method of the class (Kimi-Linear 0.5.17+
    ``self._is_non_local_pp_weight(name)``): the stage filter SGLang's classes use."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.If) or not _leaves(node.body):
            continue
        words = _names(node.test)
        if words & _STAGE_WORDS:
            return True
        for call in ast.walk(node.test):
            f = call.func if isinstance(call, ast.Call) else None
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                method = _method(chain, f.attr)
                if method is not None and _names(method[1]) & _STAGE_WORDS:
                    return True
    return False


def _read_load_weights(reader: _Reader, chain: list[tuple[_Module, ast.ClassDef]]) -> Where | None:
    """Where ``load_weights`` indexes ``params_dict[name]`` with no stage filter: no skip on the stage's
    layer range or ``is_pp_missing_parameter``, and this index not behind a ``name in params_dict``
    test. A checkpoint name of another stage's layer then raises KeyError (None: every index is safe)."""
    found = _method(chain, "load_weights")
    if found is None:
        return None
    mod, fn = found
    if _layer_filter(fn, chain):
        return None
    for node, parents in _walk_with_parents(fn):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_dict(node.value):
            if not _guarded(ast.unparse(node.slice), parents, node):
                return Where(mod.path, node.lineno)
    return None


def _loop_over_all_layers(mod: _Module, init: ast.FunctionDef) -> Where | None:
    """The ``for`` over ``self.layers`` in the forward of the class whose ``__init__`` is ``init``, when
    that forward does not slice by the stage's ``start_layer``."""
    owner = next((c for c in mod.classes.values() if init in c.body), None)
    forward = _method([(mod, owner)], "forward") if owner is not None else None
    if forward is None or "start_layer" in ast.unparse(forward[1]):
        return None
    for node in ast.walk(forward[1]):
        if isinstance(node, ast.For) and "self.layers" in ast.unparse(node.iter):
            return Where(mod.path, node.lineno)
    return None


def read_class(architecture: str, path: str, source: Source) -> ClassReading | None:
    """Read ``architecture`` (an entry class of the module at ``path``); None when the class is not there."""
    reader = _Reader(source)
    mod = reader.module(path)
    if mod is None:
        return None
    entry = reader.resolve(mod, architecture)
    if entry is None:
        return None
    chain = reader.mro(*entry)
    forward = _method(chain, "forward")
    takes = forward is not None and "pp_proxy_tensors" in _param_names(forward[1])
    ctor = _walk_constructor(reader, entry)
    kinds = {b[0] for b in ctor.builders}
    layers = "unknown" if not kinds else ("all" if "all" in kinds else "stage")
    builder = next((b for b in ctor.builders if b[0] == layers), None)
    layers_at = builder[1] if builder else None
    runs_all = _loop_over_all_layers(builder[2], builder[3]) if builder and layers == "all" else None
    tied = ctor.tied_head if ctor.embed_first_only and not ctor.embed_unguarded else None
    return ClassReading(
        architecture=architecture,
        path=entry[0].path,
        forward=Where(forward[0].path, forward[1].lineno) if forward else None,
        takes_proxy=takes,
        single_stage=ctor.single_stage,
        layers=layers,
        layers_at=layers_at,
        runs_all_at=runs_all,
        tied_head=tied,
        unfiltered_load=_read_load_weights(reader, chain),
    )


MODEL_RUNNER = "sglang/srt/model_executor/model_runner.py"


def model_runner_assert(source: Source) -> Where | None:
    """Where the release's model runner asserts ``support_pp`` under pp > 1 (None: it does not; up to
    0.5.5 it computes ``support_pp`` and only uses it to pass ``pp_proxy_tensors`` along)."""
    text = source(MODEL_RUNNER)
    if text is None:
        return None
    for node in ast.walk(parse_source(MODEL_RUNNER, text)):
        if isinstance(node, ast.Assert) and "support_pp" in ast.unparse(node.test):
            return Where(MODEL_RUNNER, node.lineno)
    return None


def pipeline_status(reading: ClassReading, runner_assert: Where | None) -> tuple[str, str, str] | None:
    """(status, where, also) of one class in one release, in the order SGLang would stop it: the
    constructor's assert of one stage (``single-stage``), a ``forward`` without ``pp_proxy_tensors``
    (``no-pp``; ``also``: the model runner's assert), every layer built on every stage (``all-layers``;
    ``also``: the forward's loop over them all), ``load_weights`` without a stage filter
    (``unfiltered-load``; ``also``: a tied head), else ``stages``. None: no layer builder found (the code
    reading cannot settle it; scripts/build_pp_support.py asks for a hand-checked rule)."""
    if reading.single_stage is not None:
        return "single-stage", str(reading.single_stage), ""
    if not reading.takes_proxy:
        return "no-pp", str(reading.forward), str(runner_assert or "")
    if reading.layers == "all":
        return "all-layers", str(reading.layers_at), str(reading.runs_all_at or "")
    if reading.unfiltered_load is not None:
        return "unfiltered-load", str(reading.unfiltered_load), str(reading.tied_head or "")
    if reading.layers != "stage":
        return None
    return "stages", str(reading.layers_at), ""


def entry_module(architecture: str, package_root: Path) -> str | None:
    """The module of an installed release's ``sglang/srt/models`` whose ``EntryClass`` lists
    ``architecture`` (as ``models/registry.py`` ``import_model_classes`` finds it), without importing
    anything; ``package_root``: the folder holding ``sglang/``. Only files naming it are parsed."""
    folder = package_root / MODELS
    for path in sorted(folder.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if architecture not in text or "EntryClass" not in text:
            continue
        tree = parse_source(f"{MODELS}{path.name}", text)
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            if any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                value = node.value
                items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
                names = {i.id if isinstance(i, ast.Name) else getattr(i, "attr", None) for i in items}
                if architecture in names:
                    return f"{MODELS}{path.name}"
    return None


def stage_range_attribute(architecture: str, path: str, source: Source) -> Where | None:
    """Where ``architecture`` (the top-level object SGLang's model runner holds) gets a ``start_layer``:
    an assignment ``self.start_layer = ...`` in any of its methods, a ``start_layer`` method or property,
    or a class attribute, in the class or a base (None: it has none). The runner reads the stage's layer
    range as ``getattr(model, "start_layer", 0)`` (0.5.23 model_runner_components/layer_setup.py
    ``_resolve_pp_layer_range``): a class without one counts every layer of the model on every stage."""
    reader = _Reader(source)
    mod = reader.module(path)
    if mod is None:
        return None
    entry = reader.resolve(mod, architecture)
    if entry is None:
        return None
    for m, cls in reader.mro(*entry):
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == "start_layer":
                return Where(m.path, item.lineno)
            if isinstance(item, ast.Assign | ast.AnnAssign):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                if any(isinstance(t, ast.Name) and t.id == "start_layer" for t in targets):
                    return Where(m.path, item.lineno)
            if isinstance(item, ast.FunctionDef):
                for node in ast.walk(item):
                    if not isinstance(node, ast.Assign):
                        continue
                    for t in node.targets:
                        elts = t.elts if isinstance(t, ast.Tuple) else [t]
                        for e in elts:
                            if (
                                isinstance(e, ast.Attribute)
                                and e.attr == "start_layer"
                                and isinstance(e.value, ast.Name)
                                and e.value.id == "self"
                            ):
                                return Where(m.path, node.lineno)
    return None
