"""How long reading a launch command takes against its length: linear, where argparse alone is quadratic.

    python bench/launch_parse_bench.py            # 1,000 .. 20,000 repetitions of `--host x`

For each n it times, best of three (the parser built outside the clock), the checker's parse of
``--model-path m`` followed by n repetitions of a unit (the table parser of the newest release; the
command-length limit of checker/launch/command.py is lifted for the measurement), and the bare argparse
parse of the same words that the checker used before (once; skipped above 4,000: 28 s at 20,000). The
checker's parse is two argparse parses (given vs defaulted), the bare one is one. Doubling n should
double the first column (linear) and quadruple the second (quadratic).
"""

from __future__ import annotations

import argparse
import time

from checker.launch import command
from checker.launch.command import _parse, table_parser
from checker.launch.flags import RELEASES

UNITS = {
    "--host x": ["--host", "x"],
    "--hos x (abbreviation)": ["--hos", "x"],
    "--enable-metrics": ["--enable-metrics"],
}
SIZES = (1_000, 2_000, 4_000, 10_000, 20_000)
BARE_UP_TO = 4_000


def best_of(fn, words: list[str], release: str, repeat: int) -> float:
    """The best time of ``fn(parser, words)``, each on a fresh parser built outside the clock."""
    best = float("inf")
    for _ in range(repeat):
        parser = table_parser(release)
        t0 = time.perf_counter()
        fn(parser, words)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    release = list(RELEASES)[-1]
    command.MAX_LAUNCH_WORDS = 10**9  # measure the parse itself, not the refusal
    print(f"SGLang {release}'s flag table; seconds, best of 3")
    print(f"{'unit':26} {'n':>7} {'checker':>9} {'bare argparse':>14}")
    for name, unit in UNITS.items():
        for n in SIZES:
            words = ["--model-path", "m", *unit * n]
            ours = best_of(_parse, words, release, 3)
            bare = best_of(argparse.ArgumentParser.parse_args, words, release, 1) if n <= BARE_UP_TO else None
            theirs = f"{bare:14.3f}" if bare is not None else f"{'-':>14}"
            print(f"{name:26} {n:>7,} {ours:9.3f} {theirs}")


if __name__ == "__main__":
    main()
