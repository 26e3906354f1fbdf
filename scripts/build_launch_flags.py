#!/usr/bin/env python3
"""Build ``checker/launch/flags.py``: every option string of each modelled SGLang release's server parser.

    python3 scripts/build_launch_flags.py [--wheels DIR] [--src DIR] [--jobs N]

For every release of ``checker.core.releases.releases.MODELLED_RELEASES`` it runs
``scripts/dump_release_flags.py``
(the release's own ``ServerArgs.add_cli_args`` on a bare ``argparse`` parser, dumped as JSON) in the
venv of ``scripts/sglang_cpu_env.sh`` (``$SGLANG_CPU_HOME``, which must exist: build it first), on this
path:

* a release with its own CPU environment (``$SGLANG_CPU_HOME/releases/X``): that folder, as the engine
  group runs it (``scripts/sglang_envs.py`` ``import_path``);
* any other: its sources first (``--src DIR/X/sglang`` when there, else its wheel unpacked to a scratch
  folder, fetched into ``--wheels`` as ``pip download --no-deps`` does), then the import-time packages of
  a built release: the one with the same transformers pin (``scripts/sglang_envs.py`` TRANSFORMERS), else
  0.5.16's. Releases up to 0.5.7 import ``fastapi.responses`` in server_args.py, which argparse never
  uses: ``STUB_FORCE=fastapi`` makes it an import-only stub.

``ACTIONS`` holds each distinct row once (a flag that sizes nothing keeps only its option strings and
nargs; one the sizing reads, ``checker.launch.command.SIZING_DESTS``, also its dest, type name, default,
choices, required and const); ``RELEASES`` lists, per release and in its parser's order, which rows it has.
``tests/test_launch_command.py`` (``-m sglang``) holds the table to each installed release's parser.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

import sglang_envs as envs  # noqa: E402
import sglang_wheels as wheels  # noqa: E402

from checker.core.releases.releases import FIRST_MODELLED, MODELLED_RELEASES, NEWEST_MODELLED, release_key  # noqa: E402
from checker.launch.command import SIZING_DESTS  # noqa: E402

TARGET = REPO / "checker" / "launch" / "flags.py"
DUMP = HERE / "dump_release_flags.py"
HOME = Path(os.environ.get("SGLANG_CPU_HOME", Path.home() / ".cache" / "pp-checker" / "sglang-cpu"))
DUMP_TIMEOUT_S = 900
"""One release's parser (its server_args imports torch, transformers and much of SGLang)."""
FALLBACK_DEPS = "0.5.16"
LAST_WITH_FASTAPI_IMPORT = "0.5.7"

Row = tuple[Any, ...]


def _built(release: str) -> bool:
    return (HOME / "releases" / release / ".complete").exists()


def environment(release: str, sources: Path | None) -> tuple[str, dict[str, str]]:
    """(PYTHONPATH, extra environment) to dump ``release``'s parser; ``sources``: its unpacked tree
    (the folder holding ``sglang/``), needed when the release has no environment of its own."""
    extra: dict[str, str] = {}
    if release_key(release) <= release_key(LAST_WITH_FASTAPI_IMPORT):
        extra["STUB_FORCE"] = "fastapi"
    if _built(release):
        return envs.import_path(release, HOME), extra
    assert sources is not None
    pin = envs.transformers_pin(release)
    deps = next((v for v in envs.engine_releases() if _built(v) and envs.transformers_pin(v) == pin), None)
    deps = deps or FALLBACK_DEPS
    if not _built(deps):
        raise SystemExit(
            f"build_launch_flags: no CPU environment for {deps} under {HOME} (scripts/sglang_cpu_env.sh)"
        )
    path = envs.import_path(release, HOME).split(":")
    path[-1:] = [str(sources), str(HOME / "releases" / deps)]
    return ":".join(path), extra


def dump(release: str, wheel_dir: Path, src: Path | None) -> dict[str, Any]:
    """One release's parser, as ``dump_release_flags.py`` prints it."""
    with tempfile.TemporaryDirectory(prefix=f"launch-flags-{release}-") as tmp:
        sources: Path | None = None
        if not _built(release):
            if src is not None and (src / release / "sglang").is_dir():
                sources = src / release
            else:
                sources = Path(tmp)
                with zipfile.ZipFile(wheels.fetch_wheel(release, wheel_dir)) as z:
                    z.extractall(tmp, [n for n in z.namelist() if n.startswith("sglang/")])
        path, extra = environment(release, sources)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "STUB_"))}
        env.update(extra, PYTHONPATH=path)
        proc = subprocess.run(
            [str(HOME / "venv" / "bin" / "python"), str(DUMP)],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=DUMP_TIMEOUT_S,
        )
    if proc.returncode != 0:
        raise SystemExit(f"build_launch_flags: SGLang {release}'s parser did not dump: {proc.stderr[-1500:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def row(r: dict[str, Any]) -> Row:
    opts = " ".join(r["opts"])
    if r["dest"] not in SIZING_DESTS:
        return (opts, r["nargs"])
    t = r["type"]
    t = None if t is None else t.rsplit(".", 1)[-1]
    choices = None if r["choices"] is None else tuple(r["choices"])
    return (opts, r["nargs"], r["dest"], t, r["default"], choices, r["required"], r["const"])


def ranges(ids: list[int]) -> str:
    out = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


SPAN = f"{FIRST_MODELLED} to {NEWEST_MODELLED}"
HEADER = f'''\
# ruff: noqa: E501  (generated: one line per release)
"""Every option string of each SGLang release's server parser, {SPAN} (GENERATED; do not edit).

Dumped from each release's own ``ServerArgs.add_cli_args`` (``sglang/srt/server_args.py``) by
``scripts/build_launch_flags.py``; see ``checker/launch/command.py`` for the row format.
``ACTIONS`` holds each distinct row once; ``RELEASES`` lists, per release and in the release's own
order, which rows its parser has (index ranges).
"""

from __future__ import annotations

# A row: (option strings, nargs) for a flag sizing only names; a flag sizing reads also has dest, type
# name, default, choices, required and const (checker.launch.command.parser_rows).
OptionRow = tuple[str, int | str | None]
SizingRow = tuple[str, int | str | None, str, str | None, object, tuple[object, ...] | None, bool, object]
FlagRow = OptionRow | SizingRow

# fmt: off
'''
FOOTER = '''
def release_rows(version: str) -> list[FlagRow]:
    """The rows of release ``version``'s parser, in its order (KeyError: not tabled)."""
    rows: list[FlagRow] = []
    for part in RELEASES[version].split(","):
        first, _, last = part.partition("-")
        rows.extend(ACTIONS[int(first) : int(last or first) + 1])
    return rows
'''


def table(dumps: dict[str, dict[str, Any]]) -> str:
    actions: list[Row] = []
    index: dict[Row, int] = {}
    per: dict[str, list[int]] = {}
    for v in MODELLED_RELEASES:
        ids = []
        for r in dumps[v]["rows"]:
            key = row(r)
            if key not in index:
                index[key] = len(actions)
                actions.append(key)
            ids.append(index[key])
        per[v] = ids
    lines = [HEADER + "ACTIONS: tuple[FlagRow, ...] = ("]
    lines += [f"    {a!r}," for a in actions]
    lines.append(")")
    lines.append("RELEASES: dict[str, str] = {")
    lines += [f'    "{v}": "{ranges(per[v])}",' for v in MODELLED_RELEASES]
    lines.append("}")
    lines.append("# fmt: on")
    lines.append("")
    lines.append(FOOTER)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "pp-checker" / "wheels")
    parser.add_argument("--src", type=Path, help="unpacked sources DIR/<release>/sglang, read before a wheel")
    parser.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parsers dumped at once"
    )
    args = parser.parse_args(argv)
    if not (HOME / "venv" / "bin" / "python").exists():
        print(
            f"build_launch_flags: no SGLang CPU venv under {HOME}: run scripts/sglang_cpu_env.sh",
            file=sys.stderr,
        )
        return 2
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        found = pool.map(lambda v: (v, dump(v, args.wheels, args.src)), MODELLED_RELEASES)
        dumps = {}
        for v, doc in found:
            dumps[v] = doc
            print(f"{v}: {len(doc['rows'])} options", file=sys.stderr, flush=True)
    TARGET.write_text(table(dumps))
    print(f"wrote {TARGET.relative_to(REPO)}: {len(MODELLED_RELEASES)} releases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
