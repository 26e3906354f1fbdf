"""Hypothesis strategies shared by the property tests (importable: pyproject sets pythonpath=["tests"])."""

from __future__ import annotations

from hypothesis import strategies as st

from checker.core.geometry import ModelGeometry


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
    )
