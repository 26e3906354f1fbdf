#!/usr/bin/env python3
"""The golden of what the families and releases derive: tests/fixtures/golden/derive.json (GENERATED).

Issue 38's redesign keeps behaviour byte-identical; this file pins it. The cases are the snapshot the
family move was held to (7,220 of them):

* ``explain``: :func:`checker.core.releases.releases.explain_release_difference` for every ordered pair
  of modelled releases (one digest per first release, over every second);
* ``derive``: :func:`checker.core.sizing.sizing.derive_all` at a 40 GiB budget for every example config
  of every family, and the kimi-k3 preset read as each family's model type (and as none or an unknown
  one), under every modelled release and each of :data:`FLAG_SETS`: the stages' values, or the refusal
  line (one digest per geometry and release, over the flag sets).

A digest is the first 8 bytes of BLAKE2b over the cases' JSON; the file holds digests, not values, so it
stays small (tests/test_golden_derive.py recomputes a sample in the quick suite; the slow generated-file
check of tests/test_generated.py runs this script and compares the whole file). A change that is meant:
``python3 scripts/regenerate.py --only golden_derive``, and say in the commit which cases moved and why
(``--cases FILE`` writes every case's value, to diff against the same run before the change).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from checker.core.errors import CheckerInputError  # noqa: E402
from checker.core.releases.releases import MODELLED_RELEASES, explain_release_difference  # noqa: E402
from checker.core.sizing.geometry import ModelGeometry  # noqa: E402
from checker.core.sizing.sizing import CapacityInputs, derive_all  # noqa: E402
from checker.families import FAMILIES, FAMILY_TABLE  # noqa: E402
from checker.families.geometry import load_geometry  # noqa: E402

OUTPUT = "tests/fixtures/golden/derive.json"
BUDGET_GIB = 40.0
PRESET_AS: tuple[str | None, ...] = (None, "foo", "qwen3_next", "qwen3_5", "qwen3_5_moe", "kimi_linear")
PRESET_AS += ("kimi_k3", "nemotron_h", "falcon_h1", "granitemoehybrid")
"""The kimi-k3 preset read as these model types: every family's rule keyed by model type, and none."""

FLAG_SETS: dict[str, dict[str, object]] = {
    "plain": {},
    "dp2": {"dp_size": 2, "max_running_requests": 64},
    "radixoff": {"disable_radix_cache": True, "max_running_requests": 64},
    "xbuf": {"mamba_radix_cache_strategy": "extra_buffer"},
    "page64": {"page_size": 64, "mamba_radix_cache_strategy": "extra_buffer"},
    "page128": {"page_size": 128},
    "page128x": {"page_size": 128, "mamba_radix_cache_strategy": "extra_buffer"},
    "ring": {
        "enable_linear_replayssm_spec": True,
        "speculative_algorithm": "EAGLE",
        "speculative_num_draft_tokens": 4,
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "max_running_requests": 32,
    },
}
"""The flags under which the families' rules differ: attention DP, the radix cache off, the
extra_buffer strategy and its page sizes, the ReplaySSM ring under EAGLE."""


def geometries() -> dict[str, ModelGeometry]:
    """Every family's example configs (paths relative to the repository: run from its root) and the
    preset as each model type of :data:`PRESET_AS`."""
    out = {c: load_geometry(model_config=c) for f in FAMILIES for c in f.example_configs}
    preset = load_geometry(model="kimi-k3")
    out.update({f"preset as {mt}": replace(preset, family=mt) for mt in PRESET_AS})
    return out


def explain_cases(first: str) -> Iterator[tuple[str, object]]:
    for second in MODELLED_RELEASES:
        yield f"explain {first} {second}", explain_release_difference(first, second, families=FAMILY_TABLE)


def derive_cases(name: str, geometry: ModelGeometry, release: str) -> Iterator[tuple[str, object]]:
    for flags, given in FLAG_SETS.items():
        try:
            inputs = CapacityInputs(geometry=geometry, budget_gib=BUDGET_GIB, sglang_version=release, **given)  # type: ignore[arg-type]
            value: object = [repr(s) for s in derive_all(inputs)]
        except CheckerInputError as exc:  # the refusal is the behaviour pinned
            value = f"{type(exc).__name__}: {exc}"
        yield f"{name} | {release} | {flags}", value


def digest(cases: Iterator[tuple[str, object]]) -> str:
    text = json.dumps(dict(cases), sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def golden() -> dict[str, object]:
    geoms = geometries()
    return {
        "releases": list(MODELLED_RELEASES),
        "flag_sets": list(FLAG_SETS),
        "cases": len(MODELLED_RELEASES) ** 2 + len(geoms) * len(MODELLED_RELEASES) * len(FLAG_SETS),
        "explain": {a: digest(explain_cases(a)) for a in MODELLED_RELEASES},
        "derive": {
            name: {v: digest(derive_cases(name, g, v)) for v in MODELLED_RELEASES}
            for name, g in geoms.items()
        },
    }


def every_case() -> dict[str, object]:
    """Every case's value (``--cases``): what the digests are taken over."""
    out: dict[str, object] = {}
    for a in MODELLED_RELEASES:
        out.update(explain_cases(a))
    for name, g in geometries().items():
        for v in MODELLED_RELEASES:
            out.update(derive_cases(name, g, v))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", metavar="FILE", help="also write every case's value to FILE (JSON)")
    args = parser.parse_args(argv)
    cases = None if args.cases is None else Path(args.cases).resolve()
    os.chdir(REPO)  # the example configs' paths, as their messages name them, are the repository's
    text = json.dumps(golden(), indent=1, sort_keys=True) + "\n"
    (REPO / OUTPUT).write_text(text)
    if cases is not None:
        cases.write_text(json.dumps(every_case(), indent=0, sort_keys=True))
    print(f"{OUTPUT}: {json.loads(text)['cases']} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
