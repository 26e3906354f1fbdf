"""``plan --suggest-partition``'s KV objective: where moving attention layers raises the MIN of the KV pool
over the pipeline (and so ``max_total_num_tokens`` and, where the KV pool binds it, the request cap).

Each stage's own KV capacity is the bytes the state pool left over its cell, and the cell counts the
stage's own attention layers (where the release and class count the stage's own: checker.core.sizing.kv_pool);
under max-share every stage has the same KV bytes, so the MIN is set by the stage with the most attention
layers. The state objective (:func:`checker.core.sizing.planning.suggest_partition`) only counts linear
layers.

Candidates: for every bound ``M`` on a stage's linear layers from the state optimum up to a whole stage,
the partition (within the slack bounds) with the fewest attention layers on its busiest stage, closest to
SGLang's even split, lexicographically smallest on ties (the same DP as the state objective, with both
bounds). Each is derived at the budget by the sizing core. The state optimum's answer is kept unless the
KV pool binds max_running_requests there (the request cap comes from the KV pool, not the state pool's
``K // ratio`` or a user's --max-running-requests) and a candidate serves more requests, or as many with
a larger pool; otherwise a candidate that holds more tokens at no fewer requests is only named.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from checker.core.errors import BudgetError, LayoutError
from checker.core.sizing.partition import default_partition
from checker.core.sizing.planning import PartitionBounds
from checker.core.sizing.sizing import CapacityInputs, StageCapacity, derive_all, requests_per_worker

_INF = float("inf")


def _prefix(ids: set[int], layers: int) -> list[int]:
    prefix = [0]
    for i in range(layers):
        prefix.append(prefix[-1] + (1 if i in ids else 0))
    return prefix


def closest_partition(
    lin: list[int],
    attn: list[int],
    pp_size: int,
    bounds: PartitionBounds,
    default: tuple[int, ...],
    max_lin: int,
    max_attn: int,
) -> tuple[int, ...] | None:
    """The partition within ``bounds`` with at most ``max_lin`` linear and ``max_attn`` attention layers
    on every stage, the least ``sum |parts[k] - default[k]|``, then lexicographically smallest (None: no
    such partition). ``lin`` / ``attn`` are prefix counts over the layers."""
    L = len(lin) - 1

    def fits(i: int, size: int) -> bool:
        return lin[i + size] - lin[i] <= max_lin and attn[i + size] - attn[i] <= max_attn

    cost = [[_INF] * (L + 1) for _ in range(pp_size + 1)]
    cost[pp_size][L] = 0
    for k in range(pp_size - 1, -1, -1):
        for i in range(L + 1):
            best = _INF
            for size in range(bounds.lower, min(bounds.upper, L - i) + 1):
                rest = cost[k + 1][i + size]
                if rest != _INF and fits(i, size):
                    best = min(best, abs(size - default[k]) + rest)
            cost[k][i] = best
    if cost[0][0] == _INF:
        return None
    parts: list[int] = []
    i = 0
    for k in range(pp_size):
        for size in range(bounds.lower, min(bounds.upper, L - i) + 1):
            rest = cost[k + 1][i + size]
            if rest != _INF and fits(i, size) and abs(size - default[k]) + rest == cost[k][i]:
                parts.append(size)
                i += size
                break
    return tuple(parts)


def kv_candidates(
    inputs: CapacityInputs, bounds: PartitionBounds, least_linear: int
) -> list[tuple[int, ...]]:
    """For each bound on the busiest stage's linear layers from ``least_linear`` up, the closest partition
    with the fewest attention layers on its busiest stage (module docstring); no duplicates."""
    g = inputs.geometry
    if g.attention is None:
        return []
    L, P = g.num_hidden_layers, inputs.pp_size
    default = default_partition(L, P)
    lin = _prefix(set(g.linear_layer_ids), L)
    attn = _prefix(set(g.attention.full_attention_layer_ids), L)

    def fewest_attention(max_lin: int) -> int | None:
        lo, hi = 0, bounds.upper
        if closest_partition(lin, attn, P, bounds, default, max_lin, hi) is None:
            return None
        while lo < hi:  # the fewest attention layers on the busiest stage under this linear bound
            mid = (lo + hi) // 2
            if closest_partition(lin, attn, P, bounds, default, max_lin, mid) is None:
                lo = mid + 1
            else:
                hi = mid
        return hi

    overall = fewest_attention(bounds.upper)  # no bound on linear layers: the fewest there can be
    found: list[tuple[int, ...]] = []
    for max_lin in range(least_linear, bounds.upper + 1):
        fewest = fewest_attention(max_lin)
        if fewest is None:
            continue
        parts = closest_partition(lin, attn, P, bounds, default, max_lin, fewest)
        if parts is not None and parts not in found:
            found.append(parts)
        if fewest == overall:  # a looser linear bound gives no fewer attention layers
            break
    return found


@dataclass(frozen=True, kw_only=True)
class KvChoice:
    """What the KV objective says of the state optimum at the budget."""

    partition: tuple[int, ...]
    """The candidate that holds the most KV tokens at no fewer requests (the state optimum when none)."""
    stages: list[StageCapacity]
    tokens_before: int
    tokens_after: int
    requests_before: int
    requests_after: int
    kv_binds: bool
    """The KV pool sets max_running_requests at the state optimum."""
    adopted: bool
    """The suggestion is this candidate (the KV pool binds and it serves more)."""

    @property
    def env(self) -> str:
        return ",".join(map(str, self.partition))

    def line(self) -> str:
        gain = self.tokens_after - self.tokens_before
        pool = (
            f"max_total_num_tokens {self.tokens_before:,} -> {self.tokens_after:,} "
            f"({gain / self.tokens_before:+.1%}), max_running_requests {self.requests_before} -> "
            f"{self.requests_after}"
        )
        if self.adopted:
            return (
                f"the KV pool binds max_running_requests here, so the suggestion moves attention layers to "
                f"raise the MIN of the stages' KV pools: {pool}"
            )
        return (
            f"the state pool, not the KV pool, binds max_running_requests here, so the suggestion keeps the "
            f"fewest linear layers; {self.env} would move attention layers and raise the MIN of the KV "
            f"pools: {pool}"
        )


def _key(stages: list[StageCapacity]) -> tuple[int, int]:
    return min(s.max_running_requests for s in stages), min(s.max_total_num_tokens for s in stages)


def kv_binds(stages: list[StageCapacity], inputs: CapacityInputs) -> bool:
    """Whether the KV pool, not the state pool or a user's cap, sets max_running_requests."""
    n = min(s.max_running_requests for s in stages)
    states = min(s.max_mamba_cache_size // s.slots_per_request for s in stages)
    user = requests_per_worker(inputs)
    return n < states and (user is None or n < user)


def kv_choice(
    inputs: CapacityInputs,
    bounds: PartitionBounds,
    state_optimum: tuple[int, ...],
    least_linear: int,
) -> KvChoice | None:
    """The KV objective at ``inputs.budget_gib`` against the state optimum (None: no candidate holds
    more KV tokens at no fewer requests, or the state optimum does not boot)."""
    try:
        base = derive_all(replace(inputs, partition_env=",".join(map(str, state_optimum))))
    except (BudgetError, LayoutError):
        return None
    best, best_stages = state_optimum, base
    for parts in kv_candidates(inputs, bounds, least_linear):
        try:
            stages = derive_all(replace(inputs, partition_env=",".join(map(str, parts))))
        except (BudgetError, LayoutError):
            continue
        if _key(stages) > _key(best_stages):
            best, best_stages = parts, stages
    if best == state_optimum:
        return None
    (n0, t0), (n1, t1) = _key(base), _key(best_stages)
    binds = kv_binds(base, inputs)
    return KvChoice(
        partition=best,
        stages=best_stages,
        tokens_before=t0,
        tokens_after=t1,
        requests_before=n0,
        requests_after=n1,
        kv_binds=binds,
        adopted=binds,
    )
