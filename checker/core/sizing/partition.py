"""Stage slices: which global layers pipeline rank k holds (SGLang's ``get_pp_indices``)."""

from __future__ import annotations

from checker.core.errors import LayoutError, shorten

PARTITION_ENV = "SGLANG_PP_LAYER_PARTITION"
# One entry is a layer count, at most num_hidden_layers (<= 10,000); 32 characters leave room for
# padding and "+" signs, and spare int() a string of thousands of digits (which it refuses past 4,300).
_MAX_ENTRY_CHARS = 32


def parse_partition(value: str, *, num_hidden_layers: int, pp_size: int) -> tuple[int, ...]:
    """Parse ``SGLANG_PP_LAYER_PARTITION``: exactly pp_size integers summing to L.

    Entries are read as SGLang reads them (``int(x) for x in value.split(",")`` in ``get_pp_indices``),
    so " 12" with padding is 12; an entry ``int()`` refuses, a negative one, or one above the model's
    layer count is refused here with the value quoted (shortened when long).
    """
    shown = f"{PARTITION_ENV}={shorten(value)}"
    way_out = f"give {pp_size} layer counts summing to {num_hidden_layers}, or unset it"
    if not value.strip():
        # Set-but-empty is NOT unset: SGLang reads it with os.getenv and int("") refuses it at boot.
        raise LayoutError(f"{shown} is set but empty, which SGLang refuses at startup; {way_out}")
    entries = value.split(",")
    if len(entries) != pp_size:
        raise LayoutError(
            f"{shown} has {len(entries):,} entries but --pp-size is {pp_size}; "
            "give one layer count per stage, or unset it"
        )
    parts = []
    for k, entry in enumerate(entries):
        if len(entry) > _MAX_ENTRY_CHARS:
            raise LayoutError(
                f"{shown}: entry {k} is {len(entry):,} characters long, too long for a layer count; {way_out}"
            )
        try:
            n = int(entry)
        except ValueError:
            raise LayoutError(
                f"{shown} is not a comma-separated list of integers (entry {k} is {shorten(entry)}); "
                f"{way_out}"
            ) from None
        if n < 0:
            raise LayoutError(f"{shown} has a negative layer count ({n}, entry {k}); counts must be >= 0")
        if n > num_hidden_layers:
            raise LayoutError(
                f"{shown} gives stage {k} {n} layers but the model has num_hidden_layers="
                f"{num_hidden_layers}; {way_out}"
            )
        parts.append(n)
    if sum(parts) != num_hidden_layers:
        raise LayoutError(
            f"{shown} sums to {sum(parts)} but the model has "
            f"num_hidden_layers={num_hidden_layers}; make the counts sum to {num_hidden_layers}"
        )
    return tuple(parts)


def default_partition(num_hidden_layers: int, pp_size: int) -> tuple[int, ...]:
    """The even split: ``L // P`` each, and the LAST ``L % P`` stages get one extra layer."""
    base, rem = divmod(num_hidden_layers, pp_size)
    return tuple(base + (1 if k >= pp_size - rem else 0) for k in range(pp_size))


def stage_partition(
    num_hidden_layers: int, pp_size: int, partition_env: str | None = None
) -> tuple[int, ...]:
    """Layer counts per stage, from the env value when set (ignored at pp_size 1, as SGLang does)."""
    if isinstance(pp_size, bool) or not isinstance(pp_size, int) or pp_size < 1:
        raise LayoutError(f"--pp-size {shorten(pp_size)} must be a positive integer")
    if num_hidden_layers < pp_size:
        raise LayoutError(
            f"--pp-size {pp_size} is above the model's num_hidden_layers={num_hidden_layers}; "
            f"use at most {num_hidden_layers} stages"
        )
    # Set-but-empty is NOT unset: SGLang reads it with os.getenv and int("") refuses it at boot.
    if partition_env is not None and pp_size > 1:
        if not isinstance(partition_env, str):
            raise LayoutError(f"{PARTITION_ENV}={shorten(partition_env)} must be a string of layer counts")
        return parse_partition(partition_env, num_hidden_layers=num_hidden_layers, pp_size=pp_size)
    return default_partition(num_hidden_layers, pp_size)


def stage_bounds(parts: tuple[int, ...]) -> list[tuple[int, int]]:
    """``[start_layer, end_layer)`` of every stage from its layer counts."""
    bounds, start = [], 0
    for n in parts:
        bounds.append((start, start + n))
        start += n
    return bounds
