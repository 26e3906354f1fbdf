"""Issue 36's worked case, derived by the builtin model of SGLang 0.5.23 (no SGLang needed).

Kimi-Linear-48B-A3B (tests/fixtures/kimi_linear_48b_a3b.json: 27 layers, 7 of them MLA full attention,
context 1,048,576), ``--tp-size 4``, a 60 GiB budget. SGLang 0.5.23's own code gives (issue 36, and
tests/test_engine_sglang.py::test_kimi_linear_worked_case_per_release drives the installed release's
``KVCacheConfigurator`` / pool configurator on the same inputs):

* ``--disable-radix-cache`` at pp 2: stage 0 alone holds 9,812,728 tokens, stage 1 7,359,546; the MIN over
  the world group leaves every stage 7,359,546, so ``int(7,359,546 / 1,048,576 x 512) = 3593`` requests
  and a micro-batch of 3593 // 2 = 1796;
* the same at pp 1: 2053 requests;
* the radix cache on with ``--mamba-full-memory-ratio 3`` at pp 4: 3413 requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checker.core.sizing.geometry import resolve_dtypes
from checker.core.sizing.sizing import CapacityInputs, derive_all
from checker.families.geometry import load_geometry

KIMI_LINEAR = Path(__file__).resolve().parent / "fixtures" / "kimi_linear_48b_a3b.json"


def _derive(**flags: Any) -> list[Any]:
    g = resolve_dtypes(load_geometry(model_config=str(KIMI_LINEAR), tp_size=4), env={})
    base: dict[str, Any] = {"budget_gib": 60.0, "tp_size": 4, "sglang_version": "0.5.23"} | flags
    return derive_all(CapacityInputs(geometry=g, **base))


def test_kimi_linear_pp2_without_radix_cache_is_bound_by_the_min_over_stages() -> None:
    s0, s1 = _derive(pp_size=2, disable_radix_cache=True)
    assert (s0.kv_own_tokens, s1.kv_own_tokens) == (9_812_728, 7_359_546)
    assert {s.max_total_num_tokens for s in (s0, s1)} == {7_359_546}
    assert {s.max_running_requests for s in (s0, s1)} == {3593}
    assert {s.pp_max_micro_batch_size for s in (s0, s1)} == {1796}
    assert (s0.kv_limiting, s1.kv_limiting) == (False, True)
    # what stage 0 reserved beyond the MIN: (own - T) x its 3-layer MLA cell
    assert s0.kv_idle_bytes == (9_812_728 - 7_359_546) * s0.kv_cell_bytes and s1.kv_idle_bytes == 0
    assert s0.context_len == 1_048_576


def test_kimi_linear_pp1_without_radix_cache() -> None:
    (s,) = _derive(pp_size=1, disable_radix_cache=True)
    assert s.max_running_requests == 2053 == int(s.max_total_num_tokens / 1_048_576 * 512)
    assert s.kv_limiting is False and s.kv_idle_bytes == 0


def test_kimi_linear_pp4_radix_cache_ratio_3() -> None:
    stages = _derive(pp_size=4, mamba_full_memory_ratio=3.0)
    assert {s.max_running_requests for s in stages} == {3413}
    assert len({s.max_total_num_tokens for s in stages}) == 1
