"""The lines atop derive's, plan's and sweep's text output: the model and the layout it was derived for.

One function for every command: each names the parts it shows (derive the state bytes per layer, the
policy and the budget; sweep the KV token capacity; plan neither), so the common lines read the same.
"""

from __future__ import annotations

from checker.core.sizing.sizing import CapacityInputs
from checker.outputs.tables import fmt_bytes, fmt_int


def kv_line(inputs: CapacityInputs) -> str:
    """The KV cache's facts: what one token costs per layer and what caps the pool."""
    a = inputs.geometry.attention
    parts = []
    if a is not None:
        kind = (
            f"MLA {a.kv_lora_rank} + {a.qk_rope_head_dim}"
            if a.mla
            else f"{a.kv_heads_per_rank(inputs.tp_size)} KV heads x ({a.head_dim} + {a.v_head_dim})"
        )
        parts.append(
            f"{len(a.full_attention_layer_ids)} attention layers, {kind}, "
            f"--kv-cache-dtype {inputs.kv_cache_dtype}"
        )
    parts.append(f"context_len {fmt_int(inputs.resolved_context_len or 0)}")
    page = inputs.page_resolution
    if page.changed_by is not None:
        parts.append(page.phrase)
    elif inputs.page_size > 1:
        parts.append(f"page size {inputs.page_size}")
    if inputs.max_total_tokens is not None:
        parts.append(f"--max-total-tokens {fmt_int(inputs.max_total_tokens)}")
    if inputs.token_capacity is not None:
        parts.append(f"--token-capacity {fmt_int(inputs.token_capacity)} per stage")
    return "KV cache: " + "; ".join(parts)


def header(
    inputs: CapacityInputs,
    *,
    state: bool = False,
    policy: bool = False,
    budget: bool = False,
    token_capacity: bool = False,
    partition: bool = False,
) -> str:
    """``model ...`` and ``layout ...`` lines, with: ``state`` the state bytes per layer and their dtypes,
    ``policy`` the charging policy in force, ``budget`` the budget, ``token_capacity`` the KV token
    capacity, ``partition`` a SGLANG_PP_LAYER_PARTITION line when one is set under pp > 1."""
    g = inputs.geometry
    model = f"model {g.name}: {g.num_hidden_layers} layers, {g.num_linear_layers} linear; "
    if state:
        model += (
            f"state per layer {fmt_int(g.bytes_per_layer)} B (conv {g.conv_dtype}, temporal "
            f"{g.temporal_dtype}); "
        )
    model += f"per_req {fmt_bytes(g.per_req_bytes)}"
    layout = f"layout pp {inputs.pp_size} x tp {inputs.tp_size} (dp {inputs.dp_size}); "
    if policy:
        layout += f"policy {inputs.resolved_policy}; "
    if budget:
        layout += f"budget {inputs.budget_gib:g} GiB, "
    layout += (
        f"r {inputs.mamba_full_memory_ratio:g}; {inputs.strategy_label}, "
        f"{inputs.slots_per_request()} slots per request"
    )
    if token_capacity and inputs.token_capacity is not None:
        layout += f"; KV token capacity {inputs.token_capacity:,} (--token-capacity)"
    lines = [model, layout]
    kv = kv_line(inputs)
    if state and kv:
        lines.append(kv)
    if (
        inputs.spec_note
    ):  # what the release picked itself from --speculative-algorithm (checker.core.releases.startup)
        lines.append(inputs.spec_note)
    if partition and inputs.partition_env and inputs.pp_size > 1:
        lines.append(f"SGLANG_PP_LAYER_PARTITION={inputs.partition_env}")
    return "\n".join(lines)
