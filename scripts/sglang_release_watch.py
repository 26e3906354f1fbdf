#!/usr/bin/env python3
"""Release watch: has SGLang published a release newer than the newest the checker models, and did its
sizing code change?

    python3 scripts/sglang_release_watch.py                  # ask the index (pip), report, exit 0/1/3
    python3 scripts/sglang_release_watch.py --wheel W.whl    # compare one wheel you have (no index)
    python3 scripts/sglang_release_watch.py --record newest  # after modelling a release: its sources
                                                             # become the reference (scripts/sglang_sizing/;
                                                             # scripts/regenerate.py runs it)

For each published release newer than ``checker.core.releases.releases.NEWEST_MODELLED`` it downloads the
wheel (``pip download --no-deps``, cached by pip), extracts the functions that size the state pool, the
request limit and the micro-batch size (``scripts/sglang_wheels.py`` SIZING_FUNCTIONS), normalises them
(no comments, docstrings, formatting or annotations) and compares them with the newest modelled
release's, stored in ``scripts/sglang_sizing/<release>.json``. It prints which functions changed (a
unified diff of each), which are new or gone, and the steps to add the release
(docs/sglang-releases.md "Adding a release").

Exit codes: 0 nothing newer is published; 1 a newer release exists (its report printed); 3 the package
index could not be reached (nothing was compared). ``.ci/run`` runs it as a report-only step: any exit
code is a warning there, never a failure.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

import sglang_wheels as wheels  # noqa: E402

from checker.core.releases.releases import NEWEST_MODELLED  # noqa: E402

REFERENCE_DIR = HERE / "sglang_sizing"
EXIT_NONE, EXIT_NEWER, EXIT_UNREACHABLE = 0, 1, 3
NEXT_STEPS = """\
next steps (docs/sglang-releases.md, "Adding a release"):
  1. until it is modelled, ranks on {v} derive with its own code (the engine) by default; run
     SGLANG_RELEASES={v} scripts/sglang_cpu_env.sh to see that the engine still drives it
     (a StandInRead line names any input the changed code reads that the checker does not know);
  2. read the diffs above; where a number can change, add the rule to checker/core/sizing/sizing.py /
     budget.py with a test of the new rule, and {v} to its group in checker/core/releases/releases.py _GROUPS
     (the newest group when nothing changed): the one release table;
  3. python3 scripts/regenerate.py (every generated table from every modelled release, this
     reference included), review git diff, then pytest tests/test_generated.py;
  4. SGLANG_RELEASES={v} scripts/sglang_cpu_env.sh: --engine both must report no drift."""


def load_reference(release: str) -> dict[str, str]:
    path = REFERENCE_DIR / f"{release}.json"
    if not path.is_file():
        raise SystemExit(
            f"sglang_release_watch: no reference for {release} ({path}); record it with --record {release}"
        )
    data = json.loads(path.read_text())
    return {name: entry["source"] for name, entry in data["functions"].items()}


def compare(reference: dict[str, str], found: dict[str, wheels.SizingSource]) -> dict[str, list[str]]:
    """changed / new / gone / same: qualified names, by how the new release's source compares."""
    out: dict[str, list[str]] = {"changed": [], "new": [], "gone": [], "same": []}
    for name in sorted(set(reference) | set(found)):
        if name not in found:
            out["gone"].append(name)
        elif name not in reference:
            out["new"].append(name)
        elif found[name].source != reference[name]:
            out["changed"].append(name)
        else:
            out["same"].append(name)
    return out


def report(release: str, reference: dict[str, str], found: dict[str, wheels.SizingSource]) -> bool:
    """Print what changed in ``release`` against the reference; True when any sizing source differs."""
    what = dict(wheels.SIZING_FUNCTIONS)
    result = compare(reference, found)
    print(f"SGLang {release} (newest modelled: {NEWEST_MODELLED})")
    for name in result["same"]:
        print(f"  same     {name}  ({what.get(name, '')})")
    for name in result["changed"]:
        print(f"  CHANGED  {name}  ({what.get(name, '')}; {found[name].path})")
    for name in result["new"]:
        print(f"  NEW      {name}  ({what.get(name, '')}; {found[name].path})")
    for name in result["gone"]:
        print(f"  GONE     {name}  ({what.get(name, '')}: not in {release}'s wheel; moved or renamed?)")
    for name in result["changed"]:
        diff = difflib.unified_diff(
            reference[name].splitlines(),
            found[name].source.splitlines(),
            f"{NEWEST_MODELLED}/{name}",
            f"{release}/{name}",
            lineterm="",
        )
        print("\n".join(f"    {line}" for line in diff))
    changed = bool(result["changed"] or result["new"] or result["gone"])
    verdict = (
        "its sizing code changed: read the diffs before modelling it"
        if changed
        else "no sizing function changed (normalised); model it as part of the newest group after "
        "checking the flags and the model registry"
    )
    print(f"  => {verdict}")
    print(NEXT_STEPS.format(v=release))
    return changed


def record(release: str, wheel: Path | None, wheel_dir: Path) -> int:
    """Store ``release``'s normalised sizing sources as THE reference (the newest modelled release's;
    a reference of an older release is removed: the watch compares with the newest only)."""
    wheel = wheel or wheels.fetch_wheel(release, wheel_dir)
    found = wheels.sizing_functions(wheel)
    REFERENCE_DIR.mkdir(exist_ok=True)
    path = REFERENCE_DIR / f"{release}.json"
    doc = {
        "release": release,
        "how": "scripts/sglang_release_watch.py --record (normalised sources, scripts/sglang_wheels.py)",
        "functions": {
            name: {"path": s.path, "digest": s.digest, "source": s.source}
            for name, s in sorted(found.items())
        },
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for older in REFERENCE_DIR.glob("*.json"):
        if wheels.release_key(older.stem) < wheels.release_key(release):
            older.unlink()
    print(f"recorded {len(found)} sizing functions of SGLang {release} in {path.relative_to(REPO)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--wheel", type=Path, help="compare this wheel (or unpacked folder) instead of asking"
    )
    parser.add_argument(
        "--record",
        metavar="RELEASE",
        help="store RELEASE's sizing sources as the reference (`newest`: the newest modelled release)",
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        default=Path.home() / ".cache" / "pp-checker" / "wheels",
        help="where --record finds (or fetches) the wheel",
    )
    parser.add_argument("--reference", default=NEWEST_MODELLED, help="the modelled release to compare with")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sglang-watch-") as tmp:
        workdir = Path(tmp)
        try:
            if args.record:
                release = NEWEST_MODELLED if args.record == "newest" else args.record
                return record(release, args.wheel, args.wheels)
            reference = load_reference(args.reference)
            if args.wheel is not None:
                release = wheels.wheel_version(args.wheel) if args.wheel.is_file() else args.wheel.name
                report(release, reference, wheels.sizing_functions(args.wheel))
                return EXIT_NEWER
            published = wheels.published_releases()
        except wheels.IndexUnreachable as exc:
            print(f"sglang_release_watch: the package index could not be reached ({exc}); nothing compared")
            return EXIT_UNREACHABLE
        newer = [v for v in published if wheels.release_key(v) > wheels.release_key(NEWEST_MODELLED)]
        if not newer:
            print(
                f"no SGLang release newer than {NEWEST_MODELLED} is published ({published[-1]} is the newest)"
            )
            return EXIT_NONE
        print(f"published, newer than the newest modelled {NEWEST_MODELLED}: {', '.join(newer)}")
        for release in newer:
            try:
                found = wheels.sizing_functions(wheels.fetch_wheel(release, workdir))
            except wheels.IndexUnreachable as exc:
                print(f"SGLang {release}: could not download its wheel ({exc})")
                continue
            report(release, reference, found)
        return EXIT_NEWER


if __name__ == "__main__":
    sys.exit(main())
