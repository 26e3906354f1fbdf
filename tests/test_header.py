"""The header atop derive, plan and sweep (checker/outputs/header.py): the model and layout lines say what
the values below were derived for, and each command's extra parts appear only where it asks for them.

A part dropped or shown with another input's value would have the reader size a different deployment.
"""

from __future__ import annotations

from checker.config import ModelChoice, SizingFlags
from checker.outputs.header import header
from checker.preflight.resolve import capacity_inputs


def _inputs(env: dict[str, str] | None = None, **flags: object):
    sizing = SizingFlags(**flags)  # type: ignore[arg-type]
    return capacity_inputs(ModelChoice(model="kimi-k3"), sizing, budget_gib=6.5, env=env or {})


def test_the_common_lines_state_the_layout_and_strategy():
    inputs = _inputs(pp_size=3, tp_size=2, dp_size=2, mamba_full_memory_ratio=0.5, policy="own-share")
    model, layout = header(inputs).splitlines()
    assert model.startswith("model kimi-k3: 93 layers, 69 linear; per_req ")
    assert layout == "layout pp 3 x tp 2 (dp 2); r 0.5; strategy extra_buffer (auto), 4 slots per request"


def test_each_part_appears_only_where_asked():
    env = {"SGLANG_PP_LAYER_PARTITION": "30,31,32"}
    inputs = _inputs(env, pp_size=3, policy="own-share", token_capacity=100_000, context_len=2048)
    full = header(inputs, state=True, policy=True, budget=True, token_capacity=True, partition=True)
    model, layout, kv, partition = full.splitlines()
    assert "state per layer " in model and "(conv bfloat16, temporal float32)" in model
    assert layout.startswith("layout pp 3 x tp 1 (dp 1); policy own-share; budget 6.5 GiB, r 0.9; ")
    assert layout.endswith("; KV token capacity 100,000 (--token-capacity)")
    # The preset's MLA attention: 24 full-attention layers, kv_lora_rank 512 + qk_rope_head_dim 64.
    assert kv == (
        "KV cache: 24 attention layers, MLA 512 + 64, --kv-cache-dtype auto; context_len 2,048; "
        "--token-capacity 100,000 per stage"
    )
    assert partition == "SGLANG_PP_LAYER_PARTITION=30,31,32"
    plain = header(inputs)
    for part in (
        "state per layer",
        "policy",
        "budget",
        "KV token capacity",
        "KV cache",
        "SGLANG_PP_LAYER_PARTITION",
    ):
        assert part not in plain
    # Without --token-capacity the pool is derived: nothing to say on the layout line.
    assert "KV token capacity" not in header(_inputs(), token_capacity=True)


def test_a_partition_is_shown_only_where_it_applies():
    """SGLang ignores SGLANG_PP_LAYER_PARTITION at pp 1: the header must not claim it is in force."""
    inputs = _inputs({"SGLANG_PP_LAYER_PARTITION": "93"}, pp_size=1)
    assert "SGLANG_PP_LAYER_PARTITION" not in header(inputs, partition=True)
