"""How ranks map onto the pipeline (torch-free): SGLang's pp x tp layout, tp the inner dimension."""

from __future__ import annotations

from checker.core.errors import LayoutError


def layout(world_size: int, rank: int, *, pp_size: int | None, tp_size: int) -> tuple[int, int]:
    """(pp_size, pp_rank): tp is the inner dimension, as SGLang ranks it (pp_rank = rank // tp_size)."""
    pp = pp_size or (world_size // tp_size if world_size % tp_size == 0 else 0)
    if world_size % tp_size or pp * tp_size != world_size:
        raise LayoutError(
            f"world_size {world_size} is not pp_size x tp_size = {pp_size or '?'} x {tp_size}; launch "
            f"pp x tp ranks (e.g. --nproc-per-node {tp_size * (pp_size or 1)}) or fix --pp-size/--tp-size"
        )
    return pp, rank // tp_size
