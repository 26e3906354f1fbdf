"""Hypothesis strategies shared by the property tests (importable: pyproject sets pythonpath=["tests"])."""

from __future__ import annotations

from hypothesis import strategies as st

from checker.core.sizing.attention import AttentionGeometry
from checker.core.sizing.geometry import ModelGeometry
from checker.families import FAMILY_TABLE


@st.composite
def attentions(
    draw: st.DrawFn, *, num_layers: int, linear: frozenset[int] = frozenset()
) -> AttentionGeometry:
    """The KV facts of a model of ``num_layers`` layers: MHA (1-64 KV heads) or MLA, some full-attention
    layers (the non-linear ones, plus any of the linear ones: Falcon-H1 has both on every layer)."""
    others = [i for i in range(num_layers) if i not in linear]
    extra = draw(st.sets(st.sampled_from(sorted(linear)), max_size=4)) if linear else set()
    ids = tuple(sorted({*others, *extra}))
    if draw(st.booleans()):
        return AttentionGeometry(
            full_attention_layer_ids=ids,
            num_kv_heads=1,
            head_dim=72,
            v_head_dim=72,
            kv_lora_rank=draw(st.sampled_from([256, 512])),
            qk_rope_head_dim=64,
            dtype=draw(st.sampled_from(["bfloat16", "float32"])),
        )
    head_dim = draw(st.sampled_from([64, 128, 256]))
    return AttentionGeometry(
        full_attention_layer_ids=ids,
        num_kv_heads=draw(st.integers(1, 64)),
        head_dim=head_dim,
        v_head_dim=head_dim,
        dtype=draw(st.sampled_from(["bfloat16", "float16"])),
    )


@st.composite
def geometries(
    draw: st.DrawFn,
    *,
    max_layers: int = 48,
    max_conv_channels: int = 4096,
    max_heads: int = 64,
    extras: tuple[int, ...] = (0, 0, 4096),
) -> ModelGeometry:
    """Any hybrid geometry: layer count, linear ids, one or two conv states, a temporal state, dtypes."""
    L = draw(st.integers(1, max_layers))
    ids = draw(st.sets(st.integers(0, L - 1), min_size=1, max_size=L))
    conv = draw(
        st.lists(st.tuples(st.integers(1, max_conv_channels), st.integers(1, 4)), min_size=1, max_size=2)
    )
    temporal = draw(st.tuples(st.integers(1, max_heads), st.integers(1, 128), st.integers(1, 128)))
    return ModelGeometry(
        name="hypothesis",
        num_hidden_layers=L,
        linear_layer_ids=tuple(sorted(ids)),
        conv_shapes=tuple(conv),
        temporal_shape=temporal,
        conv_dtype=draw(st.sampled_from(["bfloat16", "float32"])),
        temporal_dtype=draw(st.sampled_from(["bfloat16", "float32"])),
        extra_per_slot_bytes=draw(st.sampled_from(extras)),
        context_len=draw(st.sampled_from([4096, 32768, 262144, 1048576])),
        attention=draw(attentions(num_layers=L, linear=frozenset(ids))),
        families=FAMILY_TABLE,  # as load_geometry hands every geometry: a drawn family is asked its facts
    )
