#!/usr/bin/env python3
"""The SGLang CPU environments, derived from the one release table (``checker.core.releases.releases``).

The releases are ``MODELLED_RELEASES``; the engine runs those from ``checker.engines.sglang``
``FIRST_SUPPORTED`` on. What this module adds is what an environment needs that the checker does not:
the transformers each release pins (its wheel's ``Requires-Dist``), the import path of the stubs, and
which release of each engine code group CI tests. ``scripts/sglang_cpu_env.sh`` and
``scripts/build_weights_expected.py`` ask it; ``tests/test_generated.py`` holds it to the release table
and to the wheels present.

    python3 scripts/sglang_envs.py releases all   # every release the engine runs, oldest first
    python3 scripts/sglang_envs.py releases ci    # one release of each engine code group (ENGINE_GROUPS)
    python3 scripts/sglang_envs.py pins X         # what `pip install --target` puts beside sglang==X
    python3 scripts/sglang_envs.py path X HOME    # PYTHONPATH of release X built under HOME
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from checker.core.releases.releases import release_key  # noqa: E402
from checker.engines.sglang import SUPPORTED_VERSIONS  # noqa: E402

STUBS = REPO / "scripts" / "sglang_stubs"


@dataclass(frozen=True)
class EngineGroup:
    """Consecutive releases whose code the engine drives the same way (its adapters in
    ``checker/engines/sglang.py``); CI builds and tests ``runs``, one of them."""

    first: str
    last: str
    runs: str
    code: str


ENGINE_GROUPS: tuple[EngineGroup, ...] = (
    EngineGroup("0.5.10", "0.5.12.post1", "0.5.10", "ModelRunner's KV-cache mixin, self.pp_size"),
    EngineGroup("0.5.13", "0.5.13.post1", "0.5.13", "joint spec solve, lazy strategy, self.ps.pp_size"),
    EngineGroup("0.5.14", "0.5.15.post1", "0.5.15", "the last mixin, both strategy names"),
    EngineGroup("0.5.16", "0.5.16", "0.5.16", "KVCacheConfigurator, budget pre-capture"),
    EngineGroup("0.5.17", "0.5.17", "0.5.17", "max-share charging, the padding slot"),
    EngineGroup("0.5.18", "0.5.21", "0.5.20", "resolve_once and the published context"),
    EngineGroup("0.5.22", "0.5.22", "0.5.22", "per-slot extra state, create_context"),
    EngineGroup("0.5.23", "0.5.23", "0.5.23", "the max(1, ...) floors"),
)
"""A release the table adds after the last group's ``last`` belongs to no group until it is given one
(``tests/test_generated.py`` says so): extend the newest group's ``last`` when the engine drives it
unchanged, or add a group that CI runs when its code differs (docs/sglang-releases.md)."""

TRANSFORMERS: tuple[tuple[str, str], ...] = (
    ("0.5.9", "4.57.1"),
    ("0.5.10", "5.3.0"),
    ("0.5.11", "5.6.0"),
    ("0.5.13", "5.8.1"),
    ("0.5.15", "5.12.1"),
    ("0.5.22", "5.19.0"),
)
"""(first release, the ``transformers==`` its wheel requires) until the next row; a later transformers
clashes with an earlier release's config registry ("'qwen3_asr' is already used by a Transformers
config"). ``tests/test_generated.py`` reads each present wheel's ``Requires-Dist``, so a release whose pin
changed fails there until a row says so."""

_HUB = {"5.19.0": "tokenizers==0.23.3 huggingface_hub==2.4.0"}
_HUB_BEFORE = "tokenizers==0.22.2 huggingface_hub==1.16.0"
"""The tokenizers and huggingface_hub that import beside each transformers (not pinned by the wheels)."""

KERNEL_STUB_BEFORE = "0.5.13"
"""Releases before this import ``sgl_kernel`` at module level on the way to ModelRunner and the models:
their path also gets the import-only ``scripts/sglang_stubs/kernel`` (ahead of the other stubs)."""


def engine_releases() -> tuple[str, ...]:
    """Every release the engine runs, oldest first (the environments ``SGLANG_RELEASES=all`` builds)."""
    return tuple(SUPPORTED_VERSIONS)


def ci_releases() -> tuple[str, ...]:
    """One release of each engine code group: what ``.ci/run`` builds and tests."""
    return tuple(g.runs for g in ENGINE_GROUPS)


def engine_group(release: str) -> EngineGroup | None:
    key = release_key(release)
    return next((g for g in ENGINE_GROUPS if release_key(g.first) <= key <= release_key(g.last)), None)


def transformers_pin(release: str) -> str | None:
    """The transformers ``release`` requires (None: before the table's first row)."""
    key = release_key(release)
    found = [pin for first, pin in TRANSFORMERS if release_key(first) <= key]
    return found[-1] if found else None


def pins(release: str) -> str:
    """What goes beside ``sglang==release`` in its ``pip install --no-deps --target`` folder."""
    pin = transformers_pin(release)
    if pin is None:
        raise SystemExit(f"sglang_envs: no transformers pin for {release} (TRANSFORMERS starts at 0.5.9)")
    return f"transformers=={pin} {_HUB.get(pin, _HUB_BEFORE)}"


def import_path(release: str, home: Path) -> str:
    """PYTHONPATH of a release built under ``home`` (the stubs first, then its own folder)."""
    path = [str(STUBS), str(home / "releases" / release)]
    if release_key(release) < release_key(KERNEL_STUB_BEFORE):
        path.insert(0, str(STUBS / "kernel"))
    return ":".join(path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: sglang_envs.py releases all|ci | pins RELEASE | path RELEASE HOME"
    if args[:1] == ["releases"] and args[1:] in (["all"], ["ci"]):
        print(" ".join(engine_releases() if args[1] == "all" else ci_releases()))
    elif args[:1] == ["pins"] and len(args) == 2:
        print(pins(args[1]))
    elif args[:1] == ["path"] and len(args) == 3:
        print(import_path(args[1], Path(args[2])))
    else:
        print(usage, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
