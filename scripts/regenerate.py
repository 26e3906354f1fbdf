#!/usr/bin/env python3
"""Rebuild every generated file from every modelled SGLang release, or report which ones are stale.

    python3 scripts/regenerate.py                  # run every generator below, in order; write
    python3 scripts/regenerate.py --check          # in a scratch copy; write nothing; exit 1 if stale
    python3 scripts/regenerate.py --only pp_support --only log_formats [--check]
    python3 scripts/regenerate.py --list           # the registry: generator, outputs, what it reads

The releases are ``checker.core.releases.releases.MODELLED_RELEASES`` (the one release table); every generator
reads them itself. Each runs as its own process (``python3 SCRIPT [--wheels DIR] ARGS``, bounded by
``--timeout-s``), so it imports the tree it is run in: ``--check`` copies the repository's files (those
git tracks or would track) to a scratch folder, runs the generators there in order (a later one reads
what an earlier one wrote) and compares each output with the repository's, byte for byte.

What each generator reads (``needs``):

* ``wheels``: every modelled release's wheel, in ``--wheels`` (default ``~/.cache/pp-checker/wheels``,
  or ``$CHECKER_SGLANG_WHEELS``); a wheel not there is fetched (``pip download --no-deps``);
* ``environments``: the SGLang CPU environments of ``scripts/sglang_cpu_env.sh`` (``$SGLANG_CPU_HOME``);
* ``checker``: only this tree.

Adding a generator is one line in :data:`GENERATORS`: a script with ``main(argv) -> int`` that writes its
outputs under the repository it lives in (paths from ``Path(__file__)``, never the working directory)
and, when it ``needs`` wheels, takes ``--wheels DIR``. ``tests/test_generated.py`` holds the registry to
the tree (every file that says GENERATED is an output here) and each output to its generator.

Exit codes: 0 written, or (``--check``) every output is what its generator writes; 1 (``--check``) a
stale or missing output, each named; 2 bad usage, a generator that failed, or an input that is missing.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from checker.core.releases.releases import MODELLED_RELEASES, NEWEST_MODELLED  # noqa: E402

WHEELS, ENVIRONMENTS, CHECKER = "wheels", "environments", "checker"
WHEEL_DIR = Path(os.environ.get("CHECKER_SGLANG_WHEELS", Path.home() / ".cache" / "pp-checker" / "wheels"))
CPU_HOME = Path(os.environ.get("SGLANG_CPU_HOME", Path.home() / ".cache" / "pp-checker" / "sglang-cpu"))
SIZING_REFERENCE = f"scripts/sglang_sizing/{NEWEST_MODELLED}"
EXAMPLE_LOGS = ("node0.log", "node1.log", "other-node1.log", "preflight.json")
TIMEOUT_S = 3600.0
"""One generator (the launch flags run 38 releases' parsers; the weights build classes rank by rank)."""


@dataclass(frozen=True)
class Generator:
    name: str
    script: str
    """The generator, relative to the repository (run as ``python3 SCRIPT``)."""
    outputs: tuple[str, ...]
    """What it writes, relative to the repository."""
    needs: str
    """WHEELS, ENVIRONMENTS or CHECKER (see the module docstring)."""
    covers: str | None = None
    """Where the output lists the releases it was built from, ``module:NAME`` (a dict's keys, a tuple
    of releases, or a tuple of (first, last) runs) or ``file.json:key``; ``tests/test_generated.py``
    holds it to MODELLED_RELEASES without running anything."""
    sample: bool = False
    """The output covers some modelled releases by design (the newest among them), not all."""
    args: tuple[str, ...] = ()


# fmt: off
GENERATORS: tuple[Generator, ...] = (
    Generator("model_registry", "scripts/build_model_support.py",
              ("checker/core/releases/model_registry.py",),
              WHEELS, covers="checker.core.releases.model_registry:TRANSFORMERS_FALLBACK"),
    Generator("pp_support", "scripts/build_pp_support.py", ("checker/core/releases/pp_support.py",),
              WHEELS, covers="checker.core.releases.pp_support:MODEL_RUNNER_ASSERT"),
    Generator("log_formats", "scripts/build_log_formats.py", ("checker/postflight/log_formats.py",),
              WHEELS, covers="checker.postflight.log_formats:RELEASES"),
    Generator("arg_checks", "scripts/build_arg_checks.py",
              ("checker/core/releases/arg_checks.py", "docs/preflight.md"), WHEELS),
    Generator("kv_pool", "scripts/build_kv_pool.py", ("checker/core/releases/kv_support.py",), WHEELS,
              covers="checker.core.releases.kv_support:KV_CODE"),
    Generator("page_rules", "scripts/build_page_size.py", ("checker/core/releases/page_rules.py",), WHEELS,
              covers="checker.core.releases.page_rules:RULES"),
    Generator("mem_fraction", "scripts/build_mem_fraction.py",
              ("checker/core/releases/mem_fraction_table.py",), WHEELS,
              covers="checker.core.releases.mem_fraction_table:RULES"),
    Generator("config_rules", "scripts/build_config_rules.py", ("checker/core/releases/config_lines.py",),
              WHEELS),
    Generator("sizing_reference", "scripts/sglang_release_watch.py", (f"{SIZING_REFERENCE}.json",),
              WHEELS, args=("--record", "newest")),
    Generator("launch_flags", "scripts/build_launch_flags.py", ("checker/launch/flags.py",),
              ENVIRONMENTS, covers="checker.launch.flags:RELEASES"),
    Generator("weights", "scripts/build_weights_expected.py", ("tests/fixtures/weights/expected.json",),
              ENVIRONMENTS, covers="tests/fixtures/weights/expected.json:figures", sample=True),
    Generator("example_logs", "tests/postflight_logs.py", tuple(f"examples/logs/{f}" for f in EXAMPLE_LOGS),
              CHECKER),
    Generator("golden_derive", "scripts/build_golden_derive.py", ("tests/fixtures/golden/derive.json",),
              CHECKER, covers="tests/fixtures/golden/derive.json:releases"),
)
# fmt: on
"""In the order they run: example_logs renders lines with the log_formats table; golden_derive, last,
pins what the tables above make the families and releases derive."""


def by_name(names: list[str] | None) -> list[Generator]:
    if not names:
        return list(GENERATORS)
    known = {g.name: g for g in GENERATORS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"regenerate: no generator named {', '.join(unknown)} (known: {', '.join(known)})")
    return [g for g in GENERATORS if g.name in names]


def missing_inputs(gen: Generator, wheel_dir: Path = WHEEL_DIR) -> str | None:
    """Why ``gen`` cannot run here without the network (None: it can)."""
    if gen.needs == WHEELS:
        absent = [v for v in MODELLED_RELEASES if not any(wheel_dir.glob(f"sglang-{v}-*.whl"))]
        if absent:
            return (
                f"{len(absent)} of {len(MODELLED_RELEASES)} modelled releases' wheels are not in {wheel_dir}"
            )
    if gen.needs == ENVIRONMENTS and not (CPU_HOME / "venv" / "bin" / "python").exists():
        return f"no SGLang CPU environment under {CPU_HOME} (scripts/sglang_cpu_env.sh builds them)"
    return None


def command(gen: Generator, root: Path, wheel_dir: Path) -> list[str]:
    cmd = [sys.executable, str(root / gen.script)]
    if gen.needs == WHEELS:
        cmd += ["--wheels", str(wheel_dir)]
    return [*cmd, *gen.args]


def run(gen: Generator, root: Path, wheel_dir: Path, timeout_s: float) -> None:
    """Run ``gen`` on the tree at ``root``: it imports that tree's checker, and writes there."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]))
    try:
        proc = subprocess.run(
            command(gen, root, wheel_dir),
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(f"regenerate: {gen.script} ran past {timeout_s:g} s (--timeout-s)") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise SystemExit(f"regenerate: {gen.script} failed with exit {proc.returncode}:\n{tail}")


def scratch_copy(dest: Path, repo: Path = REPO) -> None:
    """The repository's files (tracked, or untracked and not ignored) under ``dest``."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
        files = [f for f in listed.split("\0") if f and (repo / f).is_file()]
    except (OSError, subprocess.SubprocessError):  # not a git checkout: everything but caches
        skip = {".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "mutants"}
        files = [
            str(p.relative_to(repo))
            for p in repo.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(repo).parts)
        ]
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / f, dest / f)


def stale(
    gens: list[Generator], wheel_dir: Path, timeout_s: float, *, repo: Path = REPO, verbose: bool = True
) -> list[str]:
    """Run ``gens`` in a scratch copy of ``repo``; one line per output that differs from ``repo``'s."""
    out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="regenerate-") as tmp:
        root = Path(tmp)
        scratch_copy(root, repo)
        for gen in gens:
            run(gen, root, wheel_dir, timeout_s)
            for rel in gen.outputs:
                new, old = root / rel, repo / rel
                if not new.exists():
                    out.append(f"{rel}: {gen.script} did not write it")
                elif not old.exists():
                    out.append(f"{rel}: missing (python3 scripts/regenerate.py --only {gen.name})")
                elif new.read_bytes() != old.read_bytes():
                    out.append(
                        f"{rel}: stale against {gen.script} (python3 scripts/regenerate.py --only {gen.name})"
                    )
                    if verbose:
                        diff = difflib.unified_diff(
                            old.read_text(errors="replace").splitlines(),
                            new.read_text(errors="replace").splitlines(),
                            f"{rel} (repository)",
                            f"{rel} ({gen.script})",
                            lineterm="",
                            n=1,
                        )
                        print("\n".join(list(diff)[:40]), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report stale outputs; write nothing")
    parser.add_argument("--only", action="append", metavar="NAME", help="this generator (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the registry and exit")
    parser.add_argument(
        "--wheels", type=Path, default=WHEEL_DIR, help="the wheel folder (default: %(default)s)"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=TIMEOUT_S, help="per generator (default: %(default)g)"
    )
    args = parser.parse_args(argv)
    gens = by_name(args.only)
    if args.list:
        for g in gens:
            print(f"{g.name:18} {g.script:36} needs {g.needs:13} -> {', '.join(g.outputs)}")
        return 0
    skipped = {
        g.name: why for g in gens if g.needs == ENVIRONMENTS and (why := missing_inputs(g, args.wheels))
    }
    if skipped and args.only:  # asked by name: say it cannot be done rather than skip it
        print("regenerate: cannot run " + "; ".join(f"{n}: {w}" for n, w in skipped.items()), file=sys.stderr)
        return 2
    for name, why in skipped.items():
        print(f"SKIPPED {name}: {why}")
    gens = [g for g in gens if g.name not in skipped]
    if args.check:
        lines = stale(gens, args.wheels, args.timeout_s)
        for line in lines:
            print(f"STALE {line}")
        names = ", ".join(g.name for g in gens)
        print(
            f"regenerate --check: {len(lines)} stale of {sum(len(g.outputs) for g in gens)} outputs ({names})"
        )
        return 1 if lines else 0
    for g in gens:
        print(f"== {g.name}: {' '.join(command(g, REPO, args.wheels)[1:])}", flush=True)
        run(g, REPO, args.wheels, args.timeout_s)
    print(f"regenerate: {len(gens)} generators ran; review `git diff` before committing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
