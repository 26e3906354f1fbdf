#!/usr/bin/env python3
"""Build ``checker/core/releases/model_registry.py``: the architectures each modelled SGLang release can load.

    python3 scripts/build_model_support.py [--wheels DIR]   # DIR: where wheels are (or go; pip's cache)

For every release of ``checker.core.releases.releases.MODELLED_RELEASES`` it reads the wheel
(``pip download --no-deps sglang==X``; nothing is installed or imported) the way the release's own
registry does (``sglang/srt/models/registry.py`` ``import_model_classes``): each top-level module of
``sglang/srt/models`` that defines ``EntryClass`` registers that class (or each class of that list) under
its ``__name__``. It also records what the registry does with an architecture it has no class for
(the Transformers fallback, an external model package). The table stores, per architecture, the runs of
consecutive modelled releases that register it. Run it again after adding a release
(docs/sglang-releases.md "Adding a release"); tests/test_model_support.py checks the table against the
wheels of any release found in the wheel folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

import sglang_wheels as wheels  # noqa: E402

from checker.core.releases.releases import MODELLED_RELEASES  # noqa: E402

TARGET = REPO / "checker" / "core" / "releases" / "model_registry.py"
HEADER = '''\
# ruff: noqa: E501  (generated: one line per architecture)
"""The architectures each modelled SGLang release's model registry loads (GENERATED; do not edit).

Built by ``scripts/build_model_support.py`` from each release's wheel: every top-level module of
``sglang/srt/models`` with an ``EntryClass`` registers its class(es) under ``__name__``
(``models/registry.py`` ``import_model_classes``). ``REGISTERED[arch]`` lists the runs of consecutive
modelled releases (first, last) that register ``arch``; :mod:`checker.core.releases.model_support` reads it.
"""

from __future__ import annotations

# fmt: off
'''


def spans(present: list[bool]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    start = None
    for i, here in enumerate([*present, False]):
        if here and start is None:
            start = i
        elif not here and start is not None:
            out.append((MODELLED_RELEASES[start], MODELLED_RELEASES[i - 1]))
            start = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "pp-checker" / "wheels")
    args = parser.parse_args(argv)
    by_release: dict[str, dict[str, str]] = {}
    fallbacks: dict[str, dict[str, bool]] = {}
    for v in MODELLED_RELEASES:
        wheel = wheels.fetch_wheel(v, args.wheels)
        by_release[v] = wheels.registered_architectures(wheel)
        fallbacks[v] = wheels.registry_fallbacks(wheel)
        print(f"{v}: {len(by_release[v])} architectures", file=sys.stderr)
    archs = sorted({a for found in by_release.values() for a in found})
    lines = [HEADER, "REGISTERED: dict[str, tuple[tuple[str, str], ...]] = {"]
    for arch in archs:
        runs = spans([arch in by_release[v] for v in MODELLED_RELEASES])
        module = next(by_release[v][arch] for v in reversed(MODELLED_RELEASES) if arch in by_release[v])
        lines.append(f"    {arch!r}: {tuple(runs)!r},  # models/{module}.py")
    lines.append("}")
    for key, doc in (
        ("transformers_fallback", "registry.py appends TransformersForCausalLM for an unregistered arch"),
        ("external_package", "SGLANG_EXTERNAL_MODEL_PACKAGE registers a package of the user's"),
    ):
        runs = spans([fallbacks[v][key] for v in MODELLED_RELEASES])
        lines.append(f"{key.upper()}: tuple[tuple[str, str], ...] = {tuple(runs)!r}")
        lines.append(f'"""The releases whose {doc}."""')
    lines.append("# fmt: on")
    TARGET.write_text("\n".join(lines) + "\n")
    print(
        f"wrote {TARGET.relative_to(REPO)}: {len(archs)} architectures over {len(MODELLED_RELEASES)} releases"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
