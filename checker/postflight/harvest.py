"""``--weights-from-log``: each rank's weights figure harvested from an earlier start's own log.

SGLang logs, per rank, ``Load weight end. ... mem usage=X GB.``: the free memory the weights took on
that GPU (GiB), the very figure its budget is computed from. ``check`` and ``plan`` take it from the
log instead of a copy by hand (``--weights-gib``): ``check`` one figure per rank of its layout (rank
``r`` is SGLang's process ``PP(r // group) TP(r % group)``, ``group`` = tp x attention dp; DP replicas
give the largest of theirs), ``plan`` the busiest rank's. A log that lacks a rank of the layout, or has
ranks beyond it (another layout's start), is refused in one line: a figure for the wrong rank would give
a budget the server never has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from checker.core.errors import FlagError, printable
from checker.postflight.ranks import RankRead, ranks_read
from checker.postflight.reader import LogReadError, findings, read_logs

FLAG = "--weights-from-log"


@dataclass(frozen=True)
class LoggedWeights:
    logs: tuple[str, ...]
    by_process: dict[tuple[int, int], tuple[float, str]]
    """(pp, tp) -> (the largest mem usage any replica of it logged, its prefix)."""

    @property
    def source(self) -> str:
        """How the figure is labelled where the budget is shown: its source, the logs."""
        return f"{FLAG} {', '.join(printable(p) for p in self.logs)}"

    def busiest(self) -> tuple[float, str]:
        """The largest figure and the prefix of the rank that logged it (plan's --weights-gib)."""
        return max(self.by_process.values())

    def per_rank(self, world_size: int, *, group: int) -> tuple[float, ...]:
        """One figure per rank of a world of ``world_size`` ranks, TP groups of ``group`` ranks."""
        if world_size % group:
            return ()  # the layout's own refusal says it better
        pp_size = world_size // group
        wanted = [(r // group, r % group) for r in range(world_size)]
        extra = sorted(k for k in self.by_process if k[0] >= pp_size or k[1] >= group)
        if extra:
            pp, tp = extra[0]
            raise FlagError(
                f"{self.source}: the log has rank PP{pp} TP{tp} beyond this layout (pp {pp_size} x tp "
                f"{group}): it is another layout's start; give a log of a start with this layout, or "
                "--weights-gib"
            )
        missing = [k for k in wanted if k not in self.by_process]
        if missing:
            shown = ", ".join(f"PP{pp} TP{tp}" for pp, tp in missing[:4])
            more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            raise FlagError(
                f"{self.source}: no 'Load weight end. ... mem usage=' line of {shown}{more} (layout pp "
                f"{pp_size} x tp {group}); give every node's log of a start with this layout, or "
                "--weights-gib"
            )
        return tuple(self.by_process[k][0] for k in wanted)


def logged_weights(paths: Sequence[str]) -> LoggedWeights:
    """Every rank's weights figure in ``paths`` (one-line FlagError when there is none to take)."""

    shown = f"{FLAG} {', '.join(printable(p) for p in paths)}"
    if "-" in paths:
        raise FlagError(f"{shown}: give the log as a file (standard input is not read here)")
    try:
        reading = read_logs(paths)
        findings(reading)  # a log in another format: its one line
    except LogReadError as exc:
        raise FlagError(f"{FLAG}: {exc}") from None
    by_process: dict[tuple[int, int], tuple[float, str]] = {}
    overlap: list[RankRead] = []
    for read in ranks_read(reading):
        w = read.weights_gib.value
        if w is None:
            if read.weights_overlap:
                overlap.append(read)
            continue
        key = (read.key.pp, read.key.tp)
        by_process[key] = max(by_process.get(key, (float(w), read.prefix)), (float(w), read.prefix))
    if not by_process:
        why = (
            " (it loaded with --startup-weight-load-mode overlap, which logs no mem usage)" if overlap else ""
        )
        raise FlagError(f"{shown}: no 'Load weight end. ... mem usage=X GB.' line{why}; give --weights-gib")
    return LoggedWeights(logs=tuple(paths), by_process=by_process)
