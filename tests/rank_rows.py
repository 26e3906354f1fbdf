"""Rank rows built by hand for the verdict's in-process tests (importable: pyproject sets
pythonpath=["tests"]): what rank 0 holds after the all-gather, without deriving or a process group."""

from __future__ import annotations

from collections.abc import Callable

from checker.core.sizing.row import INPUT_NAMES, RankRow
from checker.distributed.wire import digest


def world(
    n: int,
    *,
    per_node: int = 1,
    inputs_of: Callable[[int], dict[str, str | None]] = lambda r: {},
    k_of: Callable[[int], int] = lambda r: 74,
) -> list[RankRow]:
    """``n`` ranks, ``per_node`` to a host (``node-<node_rank>``), each with its own inputs and pool size."""
    rows = []
    for r in range(n):
        inputs: dict[str, str | None] = {name: None for name in INPUT_NAMES}
        inputs.update({"sglang_installed": "0.5.23", "model": "kimi-k3 #56a8a0b3"} | inputs_of(r))
        k = k_of(r)
        rows.append(
            RankRow(
                rank=r,
                world_size=n,
                node_rank=r // per_node,
                local_rank=r % per_node,
                pp_rank=r,
                tp_rank=0,
                pp_size=n,
                tp_size=1,
                max_mamba_cache_size=k,
                max_running_requests=k // 4,
                pp_max_micro_batch_size=max(k // 4 // n, 1),
                start_layer=r,
                end_layer=r + 1,
                stage_linear_layers=1,
                max_stage_linear_layers=1,
                state_allocated_bytes=1,
                state_charged_bytes=1,
                host=f"node-{r // per_node}",
                inputs=inputs,
                input_digests={name: digest(v) for name, v in inputs.items()},
            )
        )
    return rows
