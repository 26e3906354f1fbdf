#!/usr/bin/env python3
"""Build ``checker/core/releases/kv_support.py``: where and how each modelled SGLang release sizes the KV
token pool of a hybrid model on one pipeline stage, and how it turns the pool into ``max_running_requests``.

    python3 scripts/build_kv_pool.py [--wheels DIR] [--src DIR]

For every release of ``checker.core.releases.releases.MODELLED_RELEASES`` it reads the release's code (the
unpacked sources under ``--src``/<version>/ when there, else the wheel; nothing is installed or imported) and
records, with the file:line it read each from:

* ``layers``: which full-attention layers the KV cell counts on a stage: ``model`` (every full-attention
  layer of the model on every stage: ``len(config.full_attention_layer_ids)``, up to 0.5.7) or ``stage``
  (those in the rank's ``[start_layer, end_layer)``, 0.5.8+), and where the runner reads that range
  (``getattr(self.model, "start_layer", 0)``: a class without the attribute counts the whole model);
* ``profile``: how the KV bytes become tokens: ``float-floor`` (``int(rest * 2**30 // cell)``) or
  ``int-floor`` (``int(rest * 2**30) // cell``);
* ``zero_cell``: a stage whose slice holds no attention layer: ``divide`` (``// 0``: ZeroDivisionError, the
  release does not start) or ``int64-max`` (the stage reports ``torch.iinfo(torch.int64).max`` and stays
  out of the MIN, 0.5.17+);
* ``order``: the steps after the profile: ``init-memory-pool`` (estimate from the raw profile, cap by
  --max-total-tokens, page-align, MIN over the world group: up to 0.5.9), ``resolve-token-capacity``
  (cap, align, MIN: 0.5.10) or ``configurator`` (align, cap, MIN, re-align when the MIN or the cap
  changed it: 0.5.11+, ``_apply_token_constraints``);
* where the MIN, the request estimate and the request resolution are;
* ``spec_headroom``: up to 0.5.6.post2 an EAGLE target grows its token count by ``max_num_reqs * steps *
  topk + max_num_reqs * draft_tokens + 100`` (``draft_runner_cache_size``);
* ``draft_cell``: how a draft's layers widen the cell (``none``; ``scale``: ``int(cell * (1 + d / n))``;
  ``add``: ``cell + int(cell * d / n)``) and ``draft_layers``, where ``d`` comes from (``draft-path``: only
  a --speculative-draft-model-path's config; ``target-config``: also the target's own
  ``num_nextn_predict_layers`` when no draft path is given, 0.5.20+);
* ``kv_dtypes``: the --kv-cache-dtype choices of the release's parser;
* ``context_refusal_at``: where ``ModelConfig`` refuses a --context-length above the config's without
  SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN (``raise ValueError``).

Per hybrid class (``STAGE_RANGE``): whether the top-level model object the runner holds has a
``start_layer`` (its own or a base's: an assignment, a property or a class attribute), read through
:mod:`checker.engines.model_code`. HAND_CHECKED pins what was confirmed by building classes from a
release's own code; a rebuild that disagrees stops. tests/test_kv_support.py checks the table against the
sources of any release found.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

import sglang_wheels as wheels  # noqa: E402
from build_pp_support import HYBRID_ARCHITECTURES, release_source  # noqa: E402

from checker.core.releases.releases import MODELLED_RELEASES  # noqa: E402
from checker.engines.model_code import MODELS, Source, stage_range_attribute  # noqa: E402

TARGET = REPO / "checker" / "core" / "releases" / "kv_support.py"
SRT = "sglang/srt/"
MR = SRT + "model_executor/model_runner.py"
MIXIN = SRT + "model_executor/model_runner_kv_cache_mixin.py"
POOL = SRT + "model_executor/pool_configurator.py"
KVC = SRT + "mem_cache/kv_cache_configurator.py"
TP_WORKER = SRT + "managers/tp_worker.py"
LAYER_SETUP = SRT + "model_executor/model_runner_components/layer_setup.py"
SPEC_AUX = SRT + "model_executor/model_runner_components/spec_aux_hidden_state.py"
SERVER_ARGS = SRT + "server_args.py"
FIELDS = SRT + "arg_groups/fields/model.py"
MODEL_CONFIG = SRT + "configs/model_config.py"

HAND_CHECKED = (
    (
        "NemotronHForCausalLM",
        "0.5.23",
        False,
        "models/nemotron_h.py: NemotronHForCausalLM keeps start_layer on self.model only (its load_weights "
        "reads self.model.start_layer at :1292); model_runner_components/layer_setup.py:235 "
        "getattr(model, 'start_layer', 0) gives 0 and every stage's KV cell counts all attention layers",
    ),
    (
        "KimiLinearForCausalLM",
        "0.5.23",
        True,
        "models/kimi_linear.py:778 self.start_layer = self.model.start_layer",
    ),
)


class Code:
    """One release's sources, parsed on demand."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._trees: dict[str, tuple[str, ast.Module] | None] = {}

    def tree(self, path: str) -> tuple[str, ast.Module] | None:
        if path not in self._trees:
            text = self.source(path)
            self._trees[path] = None if text is None else (text, ast.parse(text))
        return self._trees[path]

    def function(self, path: str, name: str, cls: str | None = None) -> tuple[str, int] | None:
        """(source text, first line) of ``cls.name`` (or a function ``name`` anywhere) in ``path``."""
        parsed = self.tree(path)
        if parsed is None:
            return None
        text, tree = parsed
        for node in ast.walk(tree):
            if cls is not None and isinstance(node, ast.ClassDef) and node.name == cls:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == name:
                        return ast.get_source_segment(text, item) or "", item.lineno
            if cls is None and isinstance(node, ast.FunctionDef) and node.name == name:
                return ast.get_source_segment(text, node) or "", node.lineno
        return None

    def first(self, candidates: list[tuple[str, str, str | None]]) -> tuple[str, str, int] | None:
        """The first of ``(path, function, class)`` the release has: (path, text, line)."""
        for path, name, cls in candidates:
            found = self.function(path, name, cls)
            if found is not None:
                return path, found[0], found[1]
        return None


def at(path: str, line: int) -> str:
    return f"{path.removeprefix(SRT)}:{line}"


def line_of(text: str, first: int, pattern: str) -> int | None:
    """The file line of the first line of ``text`` (starting at file line ``first``) matching ``pattern``."""
    for i, line in enumerate(text.splitlines()):
        if re.search(pattern, line):
            return first + i
    return None


def need(value: int | None, what: str, version: str) -> int:
    if value is None:
        raise SystemExit(f"{version}: {what} not found; read the release's code and update this generator")
    return value


def read_release(version: str, source: Source) -> dict[str, str]:
    code = Code(source)
    out: dict[str, str] = {}
    # -- the profile and the layers it counts ---------------------------------------------------------
    profile = code.first([(MR, "profile_max_num_token", None), (MIXIN, "profile_max_num_token", None)])
    pool_init = code.function(POOL, "__init__", "DefaultPoolConfigurator")
    counting = (profile[1], profile[2], profile[0]) if profile else None
    if pool_init is not None:
        counting = (pool_init[0], pool_init[1], POOL)
    if counting is None:
        raise SystemExit(f"{version}: no profile_max_num_token and no DefaultPoolConfigurator")
    text, first, path = counting
    stage = line_of(text, first, r"start_layer\s*<=\s*i\s*<")
    if stage is not None:
        out["layers"], out["layers_at"] = "stage", at(path, stage)
    else:
        whole = need(line_of(text, first, r"len\([\w.]*full_attention_layer_ids\)"), "layer count", version)
        out["layers"], out["layers_at"] = "model", at(path, whole)
    cell_text, cell_first, cell_path = text, first, path
    cell_fn = code.first(
        [(POOL, "_compute_cell_size", "DefaultPoolConfigurator"), (MIXIN, "get_cell_size_per_token", None)]
    )
    if cell_fn is not None:
        cell_path, cell_text, cell_first = cell_fn
    mha = line_of(cell_text, cell_first, r"get_num_kv_heads\(")
    out["cell_at"] = at(cell_path, need(mha, "the MHA cell", version))
    # -- bytes -> tokens --------------------------------------------------------------------------------
    if profile is not None and pool_init is None:
        p_path, p_text, p_first = profile
        floor = line_of(p_text, p_first, r"int\(rest_memory \* \(1 << 30\) // cell_size\)")
        if floor is not None:
            out["profile"], out["profile_at"] = "float-floor", at(p_path, floor)
        else:
            n = line_of(p_text, p_first, r"int\(rest_memory \* \(1 << 30\)\) // cell_size")
            out["profile"], out["profile_at"] = "int-floor", at(p_path, need(n, "the profile", version))
    else:
        avail = code.first(
            [(KVC, "_profile_available_bytes", None), (MIXIN, "_profile_available_bytes", None)]
        )
        assert avail is not None, version
        n = line_of(avail[1], avail[2], r"return int\(rest_memory \* \(1 << 30\)\)")
        out["profile"], out["profile_at"] = "int-floor", at(avail[0], need(n, "the byte budget", version))
    sizes = code.function(POOL, "calculate_pool_sizes", "DefaultPoolConfigurator")
    divide_text, divide_first, divide_path = (sizes[0], sizes[1], POOL) if sizes else (text, first, path)
    if pool_init is not None and "_zero_kv_max_tokens" in pool_init[0]:
        out["zero_cell"] = "int64-max"
        out["zero_cell_at"] = at(
            POOL, need(line_of(pool_init[0], pool_init[1], r"iinfo\(torch\.int64\)"), "", version)
        )
    else:
        out["zero_cell"] = "divide"
        if profile is not None and pool_init is None:
            divide_path, divide_text, divide_first = profile
        n = line_of(divide_text, divide_first, r"//\s*(self\._)?cell_size")
        out["zero_cell_at"] = at(divide_path, need(n, "the division by the cell", version))
    # -- cap, alignment, MIN ----------------------------------------------------------------------------
    constraints = code.first(
        [(KVC, "_apply_token_constraints", None), (MIXIN, "_apply_token_constraints", None)]
    )
    resolve = code.function(MIXIN, "_resolve_token_capacity")
    init_pool = code.first([(MIXIN, "init_memory_pool", None), (MR, "init_memory_pool", None)])
    if constraints is not None:
        out["order"] = "configurator"
        c_path, c_text, c_first = constraints
    elif resolve is not None:
        out["order"] = "resolve-token-capacity"
        c_path, c_text, c_first = MIXIN, resolve[0], resolve[1]
    else:
        out["order"] = "init-memory-pool"
        assert init_pool is not None, version
        c_path, c_text, c_first = init_pool
    out["min_at"] = at(c_path, need(line_of(c_text, c_first, r"ReduceOp\.MIN"), "the MIN", version))
    # -- the request estimate and the resolution ----------------------------------------------------------
    reqs = code.first([(KVC, "resolve_max_num_reqs", None), (MIXIN, "_resolve_max_num_reqs", None)])
    if reqs is not None:
        r_path, r_text, r_first = reqs
        out["estimate_at"] = at(r_path, need(line_of(r_text, r_first, r"context_len \* 512"), "", version))
        out["requests_at"] = at(r_path, r_first)
    else:
        assert init_pool is not None, version
        i_path, i_text, i_first = init_pool
        n = line_of(i_text, i_first, r"/ self\.model_config\.context_len \* 512")
        if n is None:  # the expression spans lines
            n = line_of(i_text, i_first, r"self\.max_total_num_tokens / self\.model_config\.context_len")
        out["estimate_at"] = at(i_path, need(n, "the estimate", version))
        for path in (MR, TP_WORKER):
            parsed = code.tree(path)
            if parsed is None:
                continue
            n = line_of(parsed[0], 1, r"self\.max_running_requests = min\(")
            if n is not None:
                out["requests_at"] = at(path, n)
                break
        need(1 if "requests_at" in out else None, "max_running_requests = min(", version)
    headroom = None
    if init_pool is not None:
        headroom = line_of(init_pool[1], init_pool[2], r"draft_runner_cache_size = \($")
    out["spec_headroom_at"] = at(init_pool[0], headroom) if init_pool and headroom else ""
    # -- the draft's share of the cell ----------------------------------------------------------------------
    out["draft_cell"], out["draft_cell_at"] = "none", ""
    if pool_init is not None and "eagle_draft_num_layers" in pool_init[0]:
        # The branch for a non-DSA model (DeepSeek's DSA adds an indexer share of its own).
        scale = line_of(pool_init[0], pool_init[1], r"\* \(1 \+ (int\()?\w+\)? / int\(num_layers\)\)")
        add = line_of(pool_init[0], pool_init[1], r"self\._cell_size \+= draft_kv_size( \* \w+)?$")
        if scale is not None:
            out["draft_cell"], out["draft_cell_at"] = "scale", at(POOL, scale)
        elif add is not None:
            out["draft_cell"], out["draft_cell_at"] = "add", at(POOL, add)
        else:
            raise SystemExit(f"{version}: DefaultPoolConfigurator reads eagle_draft_num_layers in a new way")
    out["draft_layers"], out["draft_layers_at"] = "none", ""
    if out["draft_cell"] != "none":
        for path in (SPEC_AUX, MR):
            parsed = code.tree(path)
            if parsed is None:
                continue
            n = line_of(parsed[0], 1, r"eagle_draft_num_layers = int\(num_nextn_predict_layers\)")
            if n is None:
                continue
            target = re.search(
                r"draft_model_config = (model_config|draft_mode_config if draft_path else model_config)$",
                parsed[0],
                re.M,
            )
            out["draft_layers"] = "target-config" if target else "draft-path"
            out["draft_layers_at"] = at(path, n)
            break
        need(1 if out["draft_layers"] != "none" else None, "where eagle_draft_num_layers is set", version)
    # -- the --kv-cache-dtype choices ---------------------------------------------------------------------
    out["kv_dtypes"], out["kv_dtypes_at"] = kv_dtype_choices(code, version)
    # -- where the runner reads the stage's layer range ---------------------------------------------------
    ranged = None
    for path in (LAYER_SETUP, MR):
        parsed = code.tree(path)
        if parsed is not None:
            n = line_of(
                parsed[0], 1, r"""start_layer\s*=\s*getattr\((self\.)?model,\s*["']start_layer["'],\s*0\)"""
            )
            if n is None:
                n = line_of(parsed[0], 1, r"""start_layer=getattr\(model, "start_layer", 0\)""")
            if n is not None:
                ranged = at(path, n)
                break
    out["stage_range_at"] = ranged or ""
    out["context_refusal_at"] = context_refusal(code, version)
    return out


def context_refusal(code: Code, version: str) -> str:
    """Where ModelConfig refuses a --context-length above the config's without
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: the ``raise ValueError(`` whose message says so."""
    parsed = code.tree(MODEL_CONFIG)
    if parsed is not None:
        lines = parsed[0].splitlines()
        for i, line in enumerate(lines):
            if "To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER" in line:
                for j in range(i, max(i - 4, -1), -1):
                    if "raise ValueError(" in lines[j]:
                        return at(MODEL_CONFIG, j + 1)
    raise SystemExit(f"{version}: the longer --context-length refusal not found in {MODEL_CONFIG}")


def kv_dtype_choices(code: Code, version: str) -> tuple[str, str]:
    """The --kv-cache-dtype choices: ``parser.add_argument("--kv-cache-dtype", choices=[...])`` (up to 0.5.13)
    or the ``kv_cache_dtype: A[str, Arg(choices=[...])]`` field (0.5.14+)."""
    for path in (SERVER_ARGS, FIELDS):
        parsed = code.tree(path)
        if parsed is None:
            continue
        text, tree = parsed
        for node in ast.walk(tree):
            found: ast.AST | None = None
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.target.id == "kv_cache_dtype":
                    found = node.annotation
            elif isinstance(node, ast.Call) and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and first.value == "--kv-cache-dtype":
                    found = node
            if found is None:
                continue
            for sub in ast.walk(found):
                if isinstance(sub, ast.keyword) and sub.arg == "choices" and isinstance(sub.value, ast.List):
                    values = [e.value for e in sub.value.elts if isinstance(e, ast.Constant)]
                    return " ".join(str(v) for v in values), at(path, sub.value.lineno)
    raise SystemExit(f"{version}: no --kv-cache-dtype choices found")


def stage_ranges(version: str, source: Source, where: Path) -> dict[str, tuple[bool, str]]:
    registered = wheels.registered_architectures(where)
    out: dict[str, tuple[bool, str]] = {}
    for arch in HYBRID_ARCHITECTURES:
        module = registered.get(arch)
        if module is None:
            continue
        found = stage_range_attribute(arch, f"{MODELS}{module}.py", source)
        if found is None:
            out[arch] = (False, f"models/{module}.py")
        else:
            out[arch] = (True, str(found))
    return out


HEADER = '''\
# ruff: noqa: E501  (generated: one line per release and class)
"""How each modelled SGLang release sizes the KV token pool of a hybrid model's pipeline stage
(GENERATED by ``scripts/build_kv_pool.py`` from each release's code; do not edit).

``KV_CODE[release]``: a :class:`KvCode` of the rules (``layers``, ``profile``, ``zero_cell``, ``order``,
``draft_cell``, ``draft_layers``, ``kv_dtypes``) and where each is read (``*_at``, paths under
``sglang/srt/``); the generator's docstring says what each value means. ``STAGE_RANGE[arch][release]`` =
(the top-level class has ``start_layer``: its stage counts its own layers, where): False means the runner's
``getattr(model, "start_layer", 0)`` gives 0 and every stage's KV cell counts every attention layer of the
model. :mod:`checker.core.sizing.kv_pool` applies them.
"""

from __future__ import annotations

from typing import NamedTuple


class KvCode(NamedTuple):
    layers: str
    layers_at: str
    cell_at: str
    profile: str
    profile_at: str
    zero_cell: str
    zero_cell_at: str
    order: str
    min_at: str
    estimate_at: str
    requests_at: str
    spec_headroom_at: str
    draft_cell: str
    draft_cell_at: str
    draft_layers: str
    draft_layers_at: str
    kv_dtypes: str
    kv_dtypes_at: str
    stage_range_at: str
    context_refusal_at: str


# fmt: off
'''

FIELDS_ORDER = (
    "layers",
    "layers_at",
    "cell_at",
    "profile",
    "profile_at",
    "zero_cell",
    "zero_cell_at",
    "order",
    "min_at",
    "estimate_at",
    "requests_at",
    "spec_headroom_at",
    "draft_cell",
    "draft_cell_at",
    "draft_layers",
    "draft_layers_at",
    "kv_dtypes",
    "kv_dtypes_at",
    "stage_range_at",
    "context_refusal_at",
)


def build(
    wheels_dir: Path, src_dir: Path, versions: tuple[str, ...] = MODELLED_RELEASES
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, tuple[bool, str]]]]:
    code: dict[str, dict[str, str]] = {}
    ranges: dict[str, dict[str, tuple[bool, str]]] = {a: {} for a in HYBRID_ARCHITECTURES}
    for v in versions:
        source, where = release_source(v, wheels_dir, src_dir)
        code[v] = read_release(v, source)
        for arch, entry in stage_ranges(v, source, where).items():
            ranges[arch][v] = entry
    return code, ranges


def render(code: dict[str, dict[str, str]], ranges: dict[str, dict[str, tuple[bool, str]]]) -> str:
    lines = [HEADER, "KV_CODE: dict[str, KvCode] = {"]
    for v, fields in code.items():
        args = ", ".join(f"{fields[k]!r}" for k in FIELDS_ORDER)
        lines.append(f"    {v!r}: KvCode({args}),")
    lines.append("}")
    lines.append("STAGE_RANGE: dict[str, dict[str, tuple[bool, str]]] = {")
    for arch, per in ranges.items():
        lines.append(f"    {arch!r}: {{")
        lines += [f"        {v!r}: {e!r}," for v, e in per.items()]
        lines.append("    },")
    lines.append("}")
    lines.append("# fmt: on")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    cache = Path.home() / ".cache" / "pp-checker"
    parser.add_argument("--wheels", type=Path, default=cache / "wheels")
    parser.add_argument("--src", type=Path, default=cache / "src", help="unpacked sources, <DIR>/<version>/")
    parser.add_argument("--check", action="store_true", help="exit 1 if the table on disk is stale")
    args = parser.parse_args(argv)
    code, ranges = build(args.wheels, args.src)
    wrong = [
        f"{arch} on {v}: the code reading says {ranges[arch].get(v, (None,))[0]}, the hand check {own}"
        for arch, v, own, _ in HAND_CHECKED
        if ranges[arch].get(v, (None,))[0] != own
    ]
    if wrong:
        raise SystemExit("disagrees with a hand-checked finding: " + "; ".join(wrong))
    text = render(code, ranges)
    if args.check:
        stale = TARGET.read_text() != text
        print(f"{TARGET.relative_to(REPO)} is {'STALE' if stale else 'up to date'}")
        return 1 if stale else 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(REPO)}: {len(code)} releases, {len(ranges)} classes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
