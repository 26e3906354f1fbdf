#!/usr/bin/env python3
"""Build ``checker/postflight/log_formats.py``: how each modelled SGLang release writes the log lines
the post-flight reads, from the release's own format strings.

    python3 scripts/build_log_formats.py [--wheels DIR] [--src DIR]

For every release of ``checker.core.releases.releases.MODELLED_RELEASES`` it reads the wheel
(``pip download --no-deps sglang==X``, or the unpacked tree ``--src DIR/<X>/sglang``; nothing is
installed or imported) with ``ast``:

* the line format: ``configure_logger`` (``srt/utils.py``, later ``srt/utils/common.py``): the
  ``format = f"[%(asctime)s{maybe_ms}{prefix}] %(message)s"`` assignment, the ``datefmt`` given to
  ``logging.basicConfig``, the environment variable that adds milliseconds (``maybe_ms``) and the one
  that replaces the whole configuration (``SGLANG_LOGGING_CONFIG_PATH``);
* the rank prefix: the module-level function of ``managers/scheduler.py`` that builds it
  (``run_scheduler_process`` up to 0.5.x, then ``configure_scheduler_process``): each
  ``if COND: prefix += f" TOKEN{rank}"`` in order, with the size or rank its condition tests;
* the messages: every ``logger.<level>(...)`` call in ``sglang/srt`` whose message starts with one of
  :data:`ANCHORS`, as segments (literal text, and fields named by the text before them).

The table stores each distinct form with the runs of consecutive modelled releases that write it (as
``checker/core/releases/model_registry.py`` does). Run it again after adding a release;
tests/test_postflight_formats.py checks the table against the unpacked trees it finds.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

import sglang_wheels as wheels  # noqa: E402

from checker.core.releases.releases import MODELLED_RELEASES  # noqa: E402

TARGET = REPO / "checker" / "postflight" / "log_formats.py"

ANCHORS: dict[str, str] = {
    "weights": "Load weight end.",
    "weights_begin": "Load weight begin.",
    "mamba": "Mamba Cache is allocated.",
    "summary": "max_total_num_tokens=",
    "post_capture": "Post-capture KV sizing: max_running_requests",
}
"""Message kind -> the text its message starts with (what the post-flight looks for)."""

LOGGER_METHODS = {"info", "warning", "debug", "error"}
# A %-format field: %d, %s, %.2f, %.3f, ...
_PERCENT = re.compile(r"%(\.\d+)?([dsf])")
_NAME = re.compile(r"([A-Za-z_]\w*(?: [a-z]\w*)?)$")

Segment = str | tuple[str, str, bool]
"""A literal, or a field: (name, format spec as SGLang wrote it, optional: may render as '')."""


def _field_name(before: str, index: int) -> str:
    """A field is named by the key in front of it (``mem usage=`` -> ``mem_usage``,
    ``max_mamba_cache_size: `` -> ``max_mamba_cache_size``); a field with no key is ``_<index>``."""
    m = _NAME.search(before.rstrip().rstrip("=:").rstrip())
    if m is None or not before.rstrip().endswith(("=", ":")) and not before.endswith(" "):
        return f"_{index}"
    return m.group(1).replace(" ", "_")


def _optional(node: ast.expr) -> bool:
    """``{x + ', ' if x else ''}``: a field that renders as nothing in some starts."""
    return isinstance(node, ast.IfExp) and any(
        isinstance(b, ast.Constant) and b.value == "" for b in (node.body, node.orelse)
    )


def _parts(node: ast.expr) -> list[object] | None:
    """A message expression as literal strings and FormattedValue nodes (None: not a string)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out: list[object] = []
        for v in node.values:
            out += [v.value] if isinstance(v, ast.Constant) else [v]
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _parts(node.left), _parts(node.right)
        return None if left is None or right is None else left + right
    return None


def segments(node: ast.expr, percent: bool) -> list[Segment] | None:
    """The message as segments; ``percent``: a %-format string with its arguments after it."""
    parts = _parts(node)
    if parts is None:
        return None
    out: list[Segment] = []
    text = ""
    for part in parts:
        if isinstance(part, str):
            if percent:
                pos = 0
                for m in _PERCENT.finditer(part):
                    text += part[pos : m.start()]
                    out += [text, (_field_name(text, len(out)), m.group(0), False)]
                    text, pos = "", m.end()
                text += part[pos:]
            else:
                text += part
            continue
        assert isinstance(part, ast.FormattedValue)
        spec = ""
        if part.format_spec is not None:
            spec = "".join(
                v.value
                for v in part.format_spec.values
                if isinstance(v, ast.Constant)  # type: ignore[attr-defined]
            )
        name = _field_name(text, len(out))
        if _optional(part.value) and isinstance(part.value.test, ast.Name):  # type: ignore[attr-defined]
            name = part.value.test.id  # type: ignore[attr-defined]  # {quant_str + ', ' if quant_str else ''}
        out += [text, (name, spec, _optional(part.value))]
        text = ""
    out.append(text)
    # Two fields with no text between them could not be told apart in a log line.
    assert all(isinstance(s, str) and s for s in out[2:-1:2]), out
    return out


def messages(tree: ast.Module) -> Iterator[tuple[str, int, list[Segment]]]:
    """(kind, line, segments) of every logger call whose message starts with an anchor."""
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LOGGER_METHODS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "logger"
            and node.args
        ):
            continue
        segs = segments(node.args[0], percent=len(node.args) > 1)
        if not segs:
            continue
        head = segs[0] if isinstance(segs[0], str) else ""
        for kind, anchor in ANCHORS.items():
            if head.startswith(anchor):
                yield kind, node.lineno, segs


def _sources(tree_or_wheel: Path, wanted: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    for path, text in wheels.python_sources(tree_or_wheel, "sglang/srt/"):
        if any(w in text for w in wanted):
            yield path, text


def logging_format(path: str, tree: ast.Module) -> dict[str, object] | None:
    """``configure_logger``: the line format, its datefmt, the ms switch, the override variable."""
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "configure_logger"), None)
    if fn is None:
        return None
    line = datefmt = ms_env = None
    config_env = "SGLANG_LOGGING_CONFIG_PATH" if "SGLANG_LOGGING_CONFIG_PATH" in ast.unparse(fn) else None
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "format":
                line = "".join(
                    v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                    for v in node.value.values  # type: ignore[attr-defined]
                )
            elif name == "maybe_ms":
                m = re.search(r"\b(SGLANG_\w+)", ast.unparse(node.value))
                ms_env = m.group(1) if m else None
        if isinstance(node, ast.keyword) and node.arg == "datefmt" and isinstance(node.value, ast.Constant):
            datefmt = node.value.value
    return {"line": line, "datefmt": datefmt, "ms_env": ms_env, "config_env": config_env, "path": path}


_TOKEN = re.compile(r"^ ([A-Z_]+)\{")


def prefix_rule(path: str, tree: ast.Module) -> dict[str, object] | None:
    """The scheduler's log prefix: ((TOKEN, what its condition tests, the test), ...) in order."""
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or "prefix" not in ast.unparse(fn):
            continue
        tokens = []
        for node in ast.walk(fn):
            if not isinstance(node, ast.If) or len(node.body) != 1:
                continue
            stmt = node.body[0]
            if (
                isinstance(stmt, ast.AugAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == "prefix"
                and isinstance(stmt.value, ast.JoinedStr)
            ):
                head = stmt.value.values[0]
                assert isinstance(head, ast.Constant)
                m = _TOKEN.match(head.value + "{")
                assert m, ast.unparse(stmt)
                test = ast.unparse(node.test)
                # server_args.tp_size > 1, parallel.tp_size > 1, configured_tp_size() > 1 -> tp_size;
                # dp_rank / shown_dp (0.5.16+: a display rank, the same number) -> dp_rank.
                subject = re.sub(r"^.*\.|^configured_|^shown_|\(\)$", "", test.split(" ")[0])
                subject = "dp_rank" if m.group(1) == "DP" else subject
                tokens.append((m.group(1), subject, test.split(" ", 1)[1]))
        if tokens:
            return {"function": fn.name, "tokens": tuple(tokens), "path": path, "line": fn.lineno}
    return None


def read_release(source: Path) -> dict[str, object]:
    """Everything the table holds for one release, from its wheel or unpacked tree. A file is parsed only
    when it can hold what is looked for: the logging setup, the scheduler, or an anchor at the start of
    a string literal (``"Load weight end.``), not inside another message."""
    found: dict[str, object] = {"messages": {}}
    quoted = tuple('"' + a for a in ANCHORS.values())
    for path, text in _sources(source, ("def configure_logger", 'prefix += f" ', *quoted)):
        tree: ast.Module | None = None
        if "def configure_logger" in text and path.endswith(("srt/utils.py", "srt/utils/common.py")):
            tree = ast.parse(text)
            found["logging"] = logging_format(path, tree)
        if path.endswith("managers/scheduler.py"):
            tree = tree or ast.parse(text)
            found["prefix"] = prefix_rule(path, tree)
        if any(q in text for q in quoted):
            for kind, line, segs in messages(tree or ast.parse(text)):
                found["messages"].setdefault(kind, {}).setdefault(  # type: ignore[union-attr]
                    repr(segs), (segs, f"{path.removeprefix('sglang/srt/')}:{line}")
                )
    return found


# ------------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------------

HEADER = '''\
# ruff: noqa: E501  (generated: one line per form)
"""How each modelled SGLang release writes the lines the post-flight reads (GENERATED; do not edit).

Built by ``scripts/build_log_formats.py`` from each release's wheel, with ``ast``: the line format of
``configure_logger`` (``srt/utils.py``, later ``srt/utils/common.py``), the rank prefix the scheduler
process builds (``managers/scheduler.py``), and every logger message that starts with one of the
anchors below, as segments: a literal, or a field ``(name, format spec as written, optional)``. Each
form lists the runs of consecutive modelled releases (first, last) that write it, and where the newest
of them writes it. :mod:`checker.postflight.formats` reads this table.
"""

from __future__ import annotations

# fmt: off
'''


def spans(present: list[bool]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    start = None
    for i, here in enumerate([*present, False]):
        if here and start is None:
            start = i
        elif not here and start is not None:
            out.append((MODELLED_RELEASES[start], MODELLED_RELEASES[i - 1]))
            start = None
    return tuple(out)


def _forms(by_release: dict[str, object]) -> list[tuple[object, tuple[tuple[str, str], ...], str]]:
    """(form, spans, where the newest release writing it has it), oldest form first."""
    keys: dict[str, tuple[object, str]] = {}
    present: dict[str, list[bool]] = {}
    for i, v in enumerate(MODELLED_RELEASES):
        for key, (form, where) in by_release[v].items():  # type: ignore[attr-defined]
            keys[key] = (form, where)
            present.setdefault(key, [False] * len(MODELLED_RELEASES))[i] = True
    return [(keys[k][0], spans(present[k]), keys[k][1]) for k in keys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "pp-checker" / "wheels")
    parser.add_argument(
        "--src",
        type=Path,
        default=None,
        help="read unpacked trees DIR/<release>/sglang instead of the wheels (faster)",
    )
    args = parser.parse_args(argv)
    read: dict[str, dict[str, object]] = {}
    for v in MODELLED_RELEASES:
        source = args.src / v if args.src else wheels.fetch_wheel(v, args.wheels)
        read[v] = read_release(source)
        kinds = sorted(read[v]["messages"])  # type: ignore[call-overload]
        print(f"{v}: {', '.join(kinds)}", file=sys.stderr)
        missing = {"logging", "prefix"} - set(read[v]) or {"weights", "summary"} - set(kinds)
        if missing:
            raise SystemExit(f"SGLang {v}: found no {', '.join(sorted(missing))}: the script needs updating")
    lines = [HEADER]
    lines.append(f"RELEASES: tuple[str, ...] = {MODELLED_RELEASES!r}")
    lines.append('"""The releases read, oldest first."""\n')
    lines.append(f"ANCHORS: dict[str, str] = {ANCHORS!r}")
    lines.append('"""Message kind -> the text its message starts with."""\n')

    def logging_key(v: str) -> dict[str, tuple[object, str]]:
        lg = dict(read[v]["logging"])  # type: ignore[call-overload]
        path = str(lg.pop("path")).removeprefix("sglang/srt/")
        form = (lg["line"], lg["datefmt"], lg["ms_env"], lg["config_env"])
        return {repr(form): (form, path)}

    lines.append("Spans = tuple[tuple[str, str], ...]")
    lines.append(
        "LINE_FORMATS: tuple[tuple[tuple[str, str | None, str | None, str | None], Spans, str], ...] = ("
    )
    lines.append(
        "    # ((line format, datefmt, env var adding .%(msecs)03d, env var replacing the config), releases,"
    )
    lines.append("    # where)")
    for form, runs, where in _forms({v: logging_key(v) for v in MODELLED_RELEASES}):
        lines.append(f"    ({form!r}, {runs!r}, {where!r}),")
    lines.append(")\n")

    def prefix_key(v: str) -> dict[str, tuple[object, str]]:
        p = read[v]["prefix"]
        form = p["tokens"]  # type: ignore[index]
        where = f"{str(p['path']).removeprefix('sglang/srt/')}:{p['line']} {p['function']}"  # type: ignore[index]
        return {repr(form): (form, where)}

    lines.append("PREFIXES: tuple[tuple[tuple[tuple[str, str, str], ...], Spans, str], ...] = (")
    lines.append(
        "    # ((token, the size or rank its condition tests, the condition), ...) in the order written"
    )
    for form, runs, where in _forms({v: prefix_key(v) for v in MODELLED_RELEASES}):
        lines.append(f"    ({form!r}, {runs!r}, {where!r}),")
    lines.append(")\n")

    lines.append("MESSAGES: dict[str, tuple[tuple[tuple[object, ...], Spans, str], ...]] = {")
    for kind in ANCHORS:
        by_release = {v: read[v]["messages"].get(kind, {}) for v in MODELLED_RELEASES}  # type: ignore[attr-defined]
        lines.append(f"    {kind!r}: (")
        for form, runs, where in _forms(by_release):
            lines.append(f"        ({tuple(form)!r}, {runs!r}, {where!r}),")  # type: ignore[arg-type]
        lines.append("    ),")
    lines.append("}")
    lines.append("# fmt: on")
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text("\n".join(lines) + "\n")
    print(f"wrote {TARGET.relative_to(REPO)} from {len(MODELLED_RELEASES)} releases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
