"""Stage slices: which global layers pipeline rank k holds (SGLang's ``get_pp_indices``)."""

from __future__ import annotations

from checker.core.errors import LayoutError

PARTITION_ENV = "SGLANG_PP_LAYER_PARTITION"


def parse_partition(value: str, *, num_hidden_layers: int, pp_size: int) -> tuple[int, ...]:
    """Parse ``SGLANG_PP_LAYER_PARTITION``: exactly pp_size integers summing to L."""
    try:
        parts = tuple(int(p) for p in value.split(","))
    except ValueError:
        raise LayoutError(
            f"{PARTITION_ENV}={value!r} is not a comma-separated list of integers; "
            f"give {pp_size} layer counts summing to {num_hidden_layers}, or unset it"
        ) from None
    if len(parts) != pp_size:
        raise LayoutError(
            f"{PARTITION_ENV}={value!r} has {len(parts)} entries but --pp-size is {pp_size}; "
            f"give one layer count per stage, or unset it"
        )
    if any(p < 0 for p in parts):
        raise LayoutError(f"{PARTITION_ENV}={value!r} has a negative layer count; counts must be >= 0")
    if sum(parts) != num_hidden_layers:
        raise LayoutError(
            f"{PARTITION_ENV}={value!r} sums to {sum(parts)} but the model has "
            f"num_hidden_layers={num_hidden_layers}; make the counts sum to {num_hidden_layers}"
        )
    return parts


def default_partition(num_hidden_layers: int, pp_size: int) -> tuple[int, ...]:
    """The even split: ``L // P`` each, and the LAST ``L % P`` stages get one extra layer."""
    base, rem = divmod(num_hidden_layers, pp_size)
    return tuple(base + (1 if k >= pp_size - rem else 0) for k in range(pp_size))


def stage_partition(
    num_hidden_layers: int, pp_size: int, partition_env: str | None = None
) -> tuple[int, ...]:
    """Layer counts per stage, from the env value when set (ignored at pp_size 1, as SGLang does)."""
    if isinstance(pp_size, bool) or not isinstance(pp_size, int) or pp_size < 1:
        raise LayoutError(f"--pp-size {pp_size} must be a positive integer")
    if num_hidden_layers < pp_size:
        raise LayoutError(
            f"--pp-size {pp_size} is above the model's num_hidden_layers={num_hidden_layers}; "
            f"use at most {num_hidden_layers} stages"
        )
    # Set-but-empty is NOT unset: SGLang reads it with os.getenv and int("") refuses it at boot.
    if partition_env is not None and pp_size > 1:
        return parse_partition(partition_env, num_hidden_layers=num_hidden_layers, pp_size=pp_size)
    return default_partition(num_hidden_layers, pp_size)


def stage_bounds(parts: tuple[int, ...]) -> list[tuple[int, int]]:
    """``[start_layer, end_layer)`` of every stage from its layer counts."""
    bounds, start = [], 0
    for n in parts:
        bounds.append((start, start + n))
        start += n
    return bounds
