"""Property tests (hypothesis) for the two claims the checker rests on (the charging policies of
docs/how-it-computes.md, "What is modelled"; max-share is ``pp_layer_scale`` in
sglang/srt/mem_cache/kv_cache_configurator.py ``KVCacheConfigurator._handle_max_mamba_cache``).

* max-share: every stage derives the same K, max_running_requests and pp_max_micro_batch_size for any
  geometry, partition and budget, because its scale comes from the partition rule alone.
* own-share equals max-share whenever every stage holds the same number of linear layers.
A counterexample is printed by hypothesis as the geometry, layout and budget that break it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import geometries

from checker.core.errors import BudgetError, CheckerInputError, FlagError, LayoutError
from checker.core.releases.releases import MODELLED_RELEASES, release_model
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.kv_pool import code_of, counts_own_stage
from checker.core.sizing.sizing import (
    CHECKED_VALUES,
    CapacityInputs,
    StageCapacity,
    derive_all,
    derive_stage,
    divergent_values,
    stage_bounds,
    stage_partition,
)

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def partition_env(draw: st.DrawFn, L: int, P: int) -> str | None:
    """None (the default rule) or P non-negative counts summing to L (SGLANG_PP_LAYER_PARTITION)."""
    if P == 1 or draw(st.booleans()):
        return None
    cuts = sorted(draw(st.lists(st.integers(0, L), min_size=P - 1, max_size=P - 1)))
    edges = [0, *cuts, L]
    return ",".join(str(b - a) for a, b in zip(edges, edges[1:], strict=False))


def _flags(draw: st.DrawFn) -> dict[str, Any]:
    return dict(
        sglang_version=draw(st.sampled_from(MODELLED_RELEASES)),
        budget_gib=draw(st.floats(0.05, 200.0, allow_nan=False, allow_infinity=False)),
        mamba_full_memory_ratio=draw(st.sampled_from([0.5, 0.9, 2.0])),
        mamba_radix_cache_strategy=draw(st.sampled_from(["auto", "no_buffer", "extra_buffer"])),
        page_size=draw(st.sampled_from([1, 16])),
        disable_radix_cache=draw(st.booleans()),
        disable_overlap_schedule=draw(st.booleans()),
        dp_size=draw(st.sampled_from([1, 2])),
    )


def _derive(inputs: CapacityInputs) -> list[dict[str, int]] | str:
    """Every stage's checked values, or the error every stage hits (a budget too small everywhere, or
    flags SGLang refuses)."""
    try:
        stages = derive_all(inputs)
    except (BudgetError, FlagError) as exc:
        return type(exc).__name__
    return [{n: getattr(s, n) for n in CHECKED_VALUES} for s in stages]


@SETTINGS
@given(data=st.data())
def test_max_share_agrees_across_stages(data: st.DataObject) -> None:
    """Any release, geometry, pp size, partition and budget: no checked value differs across stages under
    max-share, whole-model or the release's own policy (whole-model up to 0.5.16, max-share after). Flags
    SGLang refuses must be refused by every stage alike (one stage deriving values would pass a preflight
    for a server that never starts)."""
    g = data.draw(geometries())
    # Old releases size the pool per model family (docs/sglang-releases.md): draw one, or none.
    g = replace(g, family=data.draw(st.sampled_from([None, "qwen3_next", "nemotron_h", "kimi_linear"])))
    P = data.draw(st.integers(1, min(8, g.num_hidden_layers)))
    flags = _flags(data.draw)
    kw: dict[str, Any] = dict(
        geometry=g,
        pp_size=P,
        partition_env=data.draw(partition_env(g.num_hidden_layers, P)),
        policy=data.draw(st.sampled_from([None, "max-share", "whole-model"])),
        **flags,
    )
    try:
        inputs = CapacityInputs(**kw)
    except FlagError as exc:
        # Refused before any stage derives (no per-slot extra state before 0.5.22, no hybrid model under
        # PP up to 0.5.4.post1, no strategy flag before 0.5.7): one refusal from the flags alone, so every
        # rank refuses alike. Each must be one of those, for a release the rule applies to.
        rules = release_model(flags["sglang_version"]).rules
        msg = str(exc)
        assert (
            ("extra_per_slot_bytes" in msg and g.extra_per_slot_bytes and not rules.extra_per_slot)
            or ("--pp-size" in msg and P > 1 and not rules.pp_hybrid)
            or ("has no mamba cache strategy" in msg and rules.radix_rule in ("forced-off", "fixed-ratio"))
            or ("by the model_type" in msg and g.family is None)
            or ("sizes a mamba state pool only for" in msg and rules.pool_by_family)
            or ("has no such strategy" in msg and not rules.has_lazy)
            or ("Pipeline parallelism is not compatible" in msg and P > 1 and not rules.pp_with_spec)
        ), msg
        return
    # Each stage is derived on its own, as each rank would. Whether a combination is refused at all is
    # held against SGLang's code case by case (tests/test_sizing.py, tests/test_releases.py); here, that
    # every rank answers alike: a refusal from the flags is the same refusal, word for word, on every
    # stage, and a budget too small for one stage is too small for all (every stage is charged alike).
    outcomes: list[StageCapacity | CheckerInputError] = []
    for k in range(P):
        try:
            outcomes.append(derive_stage(inputs, k))
        except CheckerInputError as exc:
            outcomes.append(exc)
    # The one refusal that is a stage's own: its KV cell counts no full-attention layer, and up to 0.5.16
    # the release divides by that 0-byte cell on that stage alone (the others size their pools; the
    # stage is out of the MIN). It must be exactly such a stage, on such a release.
    version = flags["sglang_version"]
    own_refusals = [
        k
        for k, o in enumerate(outcomes)
        if isinstance(o, LayoutError) and "holds no full-attention" in str(o)
    ]
    for k in own_refusals:
        a = g.attention
        assert a is not None and code_of(version).zero_cell == "divide", outcomes[k]
        start, end = stage_bounds(stage_partition(g.num_hidden_layers, P, inputs.partition_env))[k]
        counted = a.layers_in(start, end) if counts_own_stage(version, a) else len(a.full_attention_layer_ids)
        assert counted == 0, outcomes[k]
    outcomes = [o for k, o in enumerate(outcomes) if k not in own_refusals]
    if not outcomes:  # no stage holds a full-attention layer: every one is refused alike
        return
    errors = [o for o in outcomes if isinstance(o, CheckerInputError)]
    if errors:
        assert len(errors) == len(outcomes), outcomes  # some stages derive values where another refuses
        assert len({type(e) for e in errors}) == 1, errors
        assert isinstance(errors[0], (BudgetError, FlagError)), errors[0]  # max-share: no 0-byte stage
        if isinstance(errors[0], FlagError):
            assert len({str(e) for e in errors}) == 1, errors
    else:
        stages = [o for o in outcomes if isinstance(o, StageCapacity)]
        assert divergent_values(stages) == []
        assert len({s.stage_per_req_bytes for s in stages}) == 1


@st.composite
def balanced_layouts(draw: st.DrawFn) -> tuple[ModelGeometry, int, str | None]:
    """A geometry and layout where every stage holds the same number n of linear layers."""
    P = draw(st.integers(1, 8))
    n = draw(st.integers(1, 6))
    blocks, ids, start = [], [], 0
    for _ in range(P):
        size = n + draw(st.integers(0, 4))  # the stage's layers: n linear ones plus some attention
        chosen = draw(st.permutations(range(size)))[:n]
        ids.extend(start + i for i in chosen)
        blocks.append(size)
        start += size
    g = ModelGeometry(
        name="balanced",
        num_hidden_layers=start,
        linear_layer_ids=tuple(sorted(ids)),
        conv_shapes=((draw(st.integers(1, 8192)), 3),),
        temporal_shape=(draw(st.integers(1, 64)), 128, 128),
    )
    return g, P, ",".join(map(str, blocks)) if P > 1 else None


@SETTINGS
@given(layout=balanced_layouts(), data=st.data())
def test_own_share_equals_max_share_when_stages_are_balanced(
    layout: tuple[ModelGeometry, int, str | None], data: st.DataObject
) -> None:
    """Equal linear-layer counts make own/total == max/total: the two policies must derive the same."""
    g, P, env = layout
    flags = _flags(data.draw)

    def both(policy: str) -> list[dict[str, int]] | str:
        try:
            inputs = CapacityInputs(geometry=g, pp_size=P, partition_env=env, policy=policy, **flags)
        except FlagError as exc:
            return str(exc)  # a refusal from the flags alone must not depend on the policy
        return _derive(inputs)

    own, mx = both("own-share"), both("max-share")
    assert own == mx
