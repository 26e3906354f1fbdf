"""Startup refusals of the scheduler-era releases (0.5.7 to 0.5.13.post1), each naming the release the
rank derives as: server_args.py ``_handle_mamba_radix_cache`` of those wheels (0.5.13: "extra_buffer_lazy
is not yet supported with speculative decoding"; 0.5.10+: spec decoding with no_buffer and the radix cache
on, "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from checker.core.errors import FlagError
from checker.core.sizing.sizing import CapacityInputs
from checker.families.geometry import load_geometry

QWEN = replace(load_geometry(model="kimi-k3"), family="qwen3_next")


def inputs(version: str, **kw: object) -> CapacityInputs:
    return CapacityInputs(geometry=QWEN, budget_gib=8.0, pp_size=1, sglang_version=version, **kw)  # type: ignore[arg-type]


def test_lazy_extra_buffer_with_spec_decoding_is_refused_by_0_5_13() -> None:
    """0.5.13 is the first release with extra_buffer_lazy, and it asserts against speculative decoding
    with it (the assert sits in the extra-buffer branch, after the strategy is known)."""
    inp = inputs(
        "0.5.13",
        mamba_radix_cache_strategy="extra_buffer_lazy",
        speculative_num_draft_tokens=2,
        max_running_requests=8,
    )
    with pytest.raises(
        FlagError, match=r"^--speculative-num-draft-tokens 2 with .*extra_buffer_lazy: SGLang 0\.5\.13"
    ):
        inp.slots_per_request()
    # Without spec decoding it starts: 3 + 1 slots (lazy, overlap on at pp 1).
    assert inputs("0.5.13", mamba_radix_cache_strategy="extra_buffer_lazy").slots_per_request() == 4


@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.13.post1"])
def test_no_buffer_with_spec_and_the_radix_cache_is_refused_naming_the_release(version: str) -> None:
    inp = inputs(
        version,
        mamba_radix_cache_strategy="no_buffer",
        speculative_num_draft_tokens=2,
        max_running_requests=8,
    )
    with pytest.raises(FlagError) as info:
        inp.slots_per_request()
    msg = str(info.value)
    assert f"SGLang {version} refuses it at startup" in msg
    assert msg.endswith("use extra_buffer or --disable-radix-cache")
