"""A release's own start-up check, quoted: where it lives and its words, from the generated table
(:mod:`checker.core.releases.arg_checks`), for the one line a refusal prints (torch-free).

The table (400 kB) is read only when a refusal is made or a test asks: a launch command that starts
costs nothing here.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping

from checker.core.releases.releases import MODELLED_RELEASES

SRT = "sglang/srt/"


@functools.cache
def _checks() -> Mapping[str, tuple[str, str, str, str]]:
    # start-up: the generated table of every release's checks (~400 kB) loads only for a refusal
    from checker.core.releases.arg_checks import CHECKS

    return CHECKS


@functools.cache
def _reads() -> Mapping[str, tuple[str, str]]:
    # start-up: as above, for the sizing reads
    from checker.core.releases.arg_checks import SIZING_READS

    return SIZING_READS


def _index(release: str) -> int | None:
    return MODELLED_RELEASES.index(release) if release in MODELLED_RELEASES else None


def _in_run(run: str, at: int) -> bool:
    first, _, last = run.partition("-")
    if not last or not last[0].isdigit():  # "0.5.2" alone, not a range
        first, last = run, run
    lo, hi = _index(first), _index(last)
    return lo is not None and hi is not None and lo <= at <= hi


def sites(where: str, release: str) -> list[str]:
    """``path:line function`` of every place ``where`` (a table entry's location text) puts ``release``."""
    at = _index(release)
    if at is None:
        return []
    out: list[str] = []
    for group in where.split(" | "):
        path, function, *runs = group.split(" ")
        for run in runs:
            releases, _, line = run.rpartition(":")
            if _in_run(releases, at):
                out.append(f"{path}:{line} {function}")
    return out


def check_site(check: str, release: str) -> str | None:
    """Where ``release`` has start-up check ``check`` (its first place), or None when it has not."""
    found = sites(_checks()[check][3], release)
    return found[0] if found else None


def check_message(check: str, fields: Mapping[str, object] | None = None) -> str:
    """The check's own words, its f-string fields filled from ``fields`` where given."""
    text = _checks()[check][0]
    values = dict(fields or {})

    def fill(m: re.Match[str]) -> str:
        value = _evaluate(m.group(1), values)
        return m.group(0) if value is None else str(value)

    return re.sub(r"\{([^{}]+)\}", fill, text)


def _evaluate(expr: str, values: Mapping[str, object]) -> object | None:
    """A message field's value: a name given in ``values``, or integer arithmetic on such names
    (``{2 * max_drafts}``); None for anything else (the field stays as SGLang wrote it)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> object:
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.FloorDiv):
            left, right = walk(node.left), walk(node.right)
            if isinstance(left, int) and isinstance(right, int):
                op = node.op
                if isinstance(op, ast.Add):
                    return left + right
                if isinstance(op, ast.Sub):
                    return left - right
                if isinstance(op, ast.Mult):
                    return left * right
                return left // right if right else None
        return None

    return walk(tree.body)


def quote(check: str, release: str, fields: Mapping[str, object] | None = None) -> str | None:
    """``sglang/srt/arg_groups/validation_hook.py:179 check_server_args: "tp_size must be divisible by
    number of nodes"``, or None when ``release`` does not have the check."""
    site = check_site(check, release)
    if site is None:
        return None
    return f'{SRT}{site}: "{check_message(check, fields)}"'


def sizing_read_site(field: str, release: str) -> str | None:
    """Where ``release``'s pool sizing first reads server argument ``field``, or None when it does not."""
    entry = _reads().get(field)
    found = sites(entry[1], release) if entry is not None else []
    return f"{SRT}{found[0]}" if found else None


def sizing_default(field: str) -> str | None:
    """The argument's default as the newest release that reads it writes it (Python source)."""
    entry = _reads().get(field)
    return entry[0] if entry is not None else None
