"""How ranks map onto the pipeline (torch-free): SGLang's pp x tp layout, tp the inner dimension.

SGLang's world is pp x the whole TP group (its launch command's ``--tp-size``). With attention DP the
group is attention TP x attention DP: the checker's ``--tp-size`` is the attention TP width (a launch
command's ``--tp-size`` divided by its attention DP size) and ``--dp-size`` the attention DP size.
"""

from __future__ import annotations

from checker.core.errors import LayoutError


def layout(
    world_size: int, rank: int, *, pp_size: int | None, tp_size: int, dp_size: int = 1
) -> tuple[int, int]:
    """(pp_size, pp_rank): the TP group (``tp_size`` x ``dp_size``) is the inner dimension, as SGLang
    ranks it (pp_rank = rank // the group's size)."""
    group = tp_size * dp_size
    shown = f"{group}" if dp_size == 1 else f"{group} (attention TP {tp_size} x attention DP {dp_size})"
    dp_flag = "/--dp-size" if dp_size > 1 else ""
    if pp_size is None:
        if world_size % group:
            raise LayoutError(
                f"world_size {world_size} is not a multiple of the TP group, tp_size {shown}; "
                f"launch a multiple of {group} ranks (pp x tp, e.g. --nproc-per-node {group}) "
                f"or fix --tp-size{dp_flag}"
            )
        return world_size // group, rank // group
    if pp_size * group != world_size:
        raise LayoutError(
            f"world_size {world_size} is not pp_size x tp_size = {pp_size} x {shown}; launch pp x tp ranks "
            f"(e.g. --nproc-per-node {group * pp_size}) or fix --pp-size/--tp-size{dp_flag}"
        )
    return pp_size, rank // group
