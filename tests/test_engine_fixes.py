"""Two builtin fixes held against the INSTALLED SGLang's own code (0.5.16 .. 0.5.23), same inputs.

(a) A state pool that leaves exactly 0 GiB for the KV cache. SGLang's refusal is not in the pool sizing
    the engine runs but in its caller, ``KVCacheConfigurator._profile_available_bytes``
    (sglang/srt/mem_cache/kv_cache_configurator.py): ``rest_memory = self._handle_max_mamba_cache(...)``
    then ``if rest_memory <= 0: raise ValueError("... leave no GPU memory for the KV cache ...")``. That
    function of the release is called here with a stand-in ``self`` holding what it reads, the device
    probe (``get_available_gpu_memory``) answering a chosen free-memory figure. The budget that leaves
    exactly 0 is measured from SGLang's own ``_handle_max_mamba_cache`` (what it takes off the budget for
    an explicit pool size), so no charging formula is written here.
(b) A stage whose per-request charge is 0 (own-share on a stage holding no linear layers). SGLang has no
    own-share policy, so the rule is tested on ``_handle_max_mamba_cache`` itself: the real configurator
    with its model's linear-state params replaced by the same params holding no layers (SGLang's own
    ``mamba_cache_per_req`` property then gives 0). Only the auto-fit branch asserts a positive charge;
    the explicit branches (--max-mamba-cache-size; radix cache off with --max-running-requests) size the
    pool. The builtin's own-share on a stage that SGLang's ``get_pp_indices`` gives no linear layers
    must do the same on each branch.

Run against a release (scripts/sglang_cpu_env.sh builds them):
PYTHONPATH=scripts/sglang_stubs:$HOME/.cache/pp-checker/sglang-cpu/releases/X \
    $HOME/.cache/pp-checker/sglang-cpu/venv/bin/python -m pytest -m sglang tests/test_engine_fixes.py -n 0
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import BudgetError, LayoutError
from checker.core.releases.releases import parse_version
from checker.core.sizing.geometry import resolve_dtypes
from checker.core.sizing.sizing import CapacityInputs, derive_stage
from checker.families.geometry import load_geometry

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parent.parent
# A model laid out as Qwen3-Next (48 layers, every 4th full attention: layers 3, 7, ...; 36 linear-
# attention layers): Nemotron-H's config, a text-only class that starts under PP in every release the
# engine runs (Qwen3-Next's asserts a single stage, checker/core/releases/pp_support.py; Qwen3.5's is
# multimodal, and 0.5.18+ take a multimodal reservation off the budget _profile_available_bytes measures).
MODEL = REPO / "tests" / "fixtures" / "nemotron_h_48l.json"
GIB = 1 << 30
ONE_BYTE_GIB = 1 / GIB
# The runtime slack _profile_available_bytes keeps back, pre_model_load_memory * (1 - mem_fraction_static):
# pre_model_load_memory is chosen so that it is exactly this many GB, and the free memory is the budget
# plus it, so SGLang's rest (free - slack) is the budget under test to the last bit.
SLACK_GB = 4.0
# Far above any budget below: with it the KV pool never caps max_running_requests.
UNBOUNDED_TOKENS = 1 << 60


@pytest.fixture(scope="module")
def kv_module(sglang_engine) -> types.ModuleType:
    if sglang_engine.api.host != "configurator":
        pytest.skip(
            f"SGLang {sglang_engine.version} has no KVCacheConfigurator._profile_available_bytes (0.5.16+); "
            "its refusal lives in ModelRunner's profile_max_num_token, not driven here"
        )
    return importlib.import_module("sglang.srt.mem_cache.kv_cache_configurator")


def _inputs(engine: Any, budget_gib: float, **flags: Any) -> CapacityInputs:
    flags = {"pp_size": 4} | flags
    g = resolve_dtypes(load_geometry(model_config=MODEL, tp_size=flags.get("tp_size", 1)), env={})
    return CapacityInputs(geometry=g, budget_gib=budget_gib, sglang_version=engine.version, **flags)


def _prepare(engine: Any, **flags: Any) -> Any:
    """SGLang's resolution of these flags (its ServerArgs, published config, real configurator)."""
    from checker.engines import ModelSource

    return engine.prepare(_inputs(engine, 1.0, **flags), ModelSource(model_config=str(MODEL)), {})


def _pool(prepared: Any, rest_gib: float) -> tuple[int, float, int]:
    """The release's ``_handle_max_mamba_cache(rest)`` on the prepared configurator (0.5.10-0.5.15: the
    model runner's ``handle_max_mamba_cache``): (K it wrote, the GiB it returns for the KV cache, the
    request cap with an unbounded KV pool). K is put back afterwards, so the next call starts from the
    user's flags again."""
    c, api = prepared.host, prepared.api
    with prepared._scope(), prepared._pool_size_slot() as (read_k, _):
        left = getattr(c, api.pool_method)(rest_gib)
        return int(read_k()), float(left), int(getattr(c, api.requests_method)(UNBOUNDED_TOKENS))


def _charged_bytes(prepared: Any) -> int:
    """Bytes SGLang's ``_handle_max_mamba_cache`` takes off the budget for the pool (an explicit size:
    independent of the budget). Measured at 1024 GiB, where budget - charge is exact in a double."""
    _, left, _ = _pool(prepared, 1024.0)
    charged = (1024.0 - left) * GIB
    assert charged == int(charged) > 0
    return int(charged)


def _pre_model_load_gb(mem_fraction_static: float) -> float:
    """A pre_model_load_memory (GB) whose slack ``pre * (1 - mem_fraction_static)`` is SLACK_GB exactly
    in a double (searched among the neighbours of SLACK_GB / (1 - mem_fraction_static))."""
    f = 1 - mem_fraction_static
    lo = hi = SLACK_GB / f
    for _ in range(64):
        for pre in (lo, hi):
            if pre * f == SLACK_GB:
                return pre
        lo, hi = math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)
    raise AssertionError(f"no pre_model_load_memory gives a slack of exactly {SLACK_GB} GB")


def _mem_fraction_static(prepared: Any) -> float:
    rt = prepared.api.runtime
    if hasattr(rt, "get_schedule"):  # 0.5.17+: the published schedule bag
        return float(rt.get_schedule().mem_fraction_static)
    return float(prepared.server_args.mem_fraction_static)  # 0.5.16


@contextlib.contextmanager
def _device(kv: types.ModuleType, monkeypatch: pytest.MonkeyPatch, free_gb: float) -> Iterator[None]:
    """The device probes ``_profile_available_bytes`` makes, answered: free memory ``free_gb``, one rank.

    Older releases ask ``get_world_group()`` (0.5.16, 0.5.20), newer ones ``get_parallel().world_group``
    (0.5.23; set through its own ``override`` hook, which its error names for this); the function's code
    says which."""
    code = kv.KVCacheConfigurator._profile_available_bytes.__code__
    world = types.SimpleNamespace(world_size=1, cpu_group=None)
    monkeypatch.setattr(kv, "get_available_gpu_memory", lambda *a, **k: free_gb)
    if "get_world_group" in code.co_names:
        monkeypatch.setattr(kv, "get_world_group", lambda: world)
        yield
        return
    with kv.get_parallel().override(world_group=world):
        yield


def _profile(
    prepared: Any, kv: types.ModuleType, monkeypatch: pytest.MonkeyPatch, rest_gib: float
) -> tuple[float, int]:
    """Run the release's ``KVCacheConfigurator._profile_available_bytes`` so that the rest it hands
    ``_handle_max_mamba_cache`` is exactly ``rest_gib``. Returns (that rest, the bytes it returns);
    SGLang's refusal propagates.

    ``self`` is a stand-in holding what the function reads (device, gpu id, model config, mamba config,
    no post-capture KV, 0.5.16's server_args); ``_handle_max_mamba_cache`` is the real configurator's,
    recording its argument. The device reports ``rest_gib + SLACK_GB`` free (no multimodal reservation).
    """
    c = prepared.host
    seen: list[float] = []

    def handle(total_rest_memory: float) -> float:
        seen.append(total_rest_memory)
        return c._handle_max_mamba_cache(total_rest_memory)

    stand_in = types.SimpleNamespace(
        device="cuda",
        gpu_id=0,
        model_config=c.model_config,
        mambaish_config=c.mambaish_config,
        post_capture_kv_active=False,
        _handle_max_mamba_cache=handle,
    )
    if "server_args" in prepared.api.configurator_fields:  # 0.5.16-0.5.17 read flags from it
        stand_in.server_args = prepared.server_args
    profile = kv.KVCacheConfigurator._profile_available_bytes
    with prepared._scope(), prepared._pool_size_slot():
        pre = _pre_model_load_gb(_mem_fraction_static(prepared))
        # free - slack - 0.0 with slack exactly SLACK_GB and rest a multiple of 2**-30: exact.
        with _device(kv, monkeypatch, rest_gib + SLACK_GB):
            got = int(profile(stand_in, pre))
    assert seen == [rest_gib], seen  # SGLang sized the pool from exactly the budget under test
    return seen[0], got


# ---- (a) the state pool leaves exactly 0 for the KV cache --------------------------------------------

EXACT_FIT = {  # explicit pool sizes: the charge does not depend on the budget, so one budget leaves 0
    "max-mamba-cache-size": {"max_mamba_cache_size": 30},
    "max-mamba-cache-size-dp2": {"max_mamba_cache_size": 301, "dp_size": 2},
    "radix-off-max-running-requests": {"disable_radix_cache": True, "max_running_requests": 40},
}


@pytest.mark.parametrize("case", list(EXACT_FIT), ids=list(EXACT_FIT))
def test_exactly_zero_left_for_the_kv_cache_is_refused_like_sglang(
    sglang_engine, kv_module, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Budget = exactly what the release's pool takes: SGLang's ``_profile_available_bytes`` refuses
    (``rest_memory <= 0``), and so does the builtin (it used to refuse only below 0) and the engine's
    reproduction of that check. One byte more: SGLang returns 1 byte for the KV cache, and the builtin
    derives the same K with 1 byte left, on every stage."""
    flags = EXACT_FIT[case]
    prepared = _prepare(sglang_engine, **flags)
    charged = _charged_bytes(prepared)
    zero = charged / GIB  # exact: an integer over a power of two

    with pytest.raises(ValueError, match="leave no GPU memory for the KV cache"):
        _profile(prepared, kv_module, monkeypatch, zero)
    _, left = _profile(prepared, kv_module, monkeypatch, zero + ONE_BYTE_GIB)
    assert left == 1

    for stage in range(4):
        with pytest.raises(BudgetError, match="for the KV cache"):
            derive_stage(_inputs(sglang_engine, zero, **flags), stage)
        with pytest.raises(BudgetError):
            prepared.derive(stage, zero)
        # One byte more: the state pool sizes, and the 1 byte left holds no KV token, which SGLang refuses
        # at start-up ("Not enough memory"): both engines say so (before the KV pool was modelled, this
        # byte was read as a server that starts).
        with pytest.raises(BudgetError, match="KV pool of 0 tokens"):
            derive_stage(_inputs(sglang_engine, zero + ONE_BYTE_GIB, **flags), stage)
        with pytest.raises(BudgetError):
            prepared.derive(stage, zero + ONE_BYTE_GIB)


# ---- (b) a per-request charge of 0: only the auto-fit branch refuses ---------------------------------

BRANCHES = {  # branch letter -> flags: A --max-mamba-cache-size, B radix off + mrr, C auto-fit
    "A": {"max_mamba_cache_size": 30},
    "A-dp2": {"max_mamba_cache_size": 301, "dp_size": 2},
    "B": {"disable_radix_cache": True, "max_running_requests": 40},
    "C": {},
    "C-radix-off": {"disable_radix_cache": True},
}
# (K, max_running_requests) of the explicit branches, worked by hand at pp 4 with 0.5.16's and later
# releases' default strategy (auto -> extra_buffer without overlap under PP: 4 slots a request; 1 with the
# radix cache off; 0.5.10-0.5.15 resolve auto differently, so there the builtin model is the reference):
# A 30 // 1 = 30 slots, 30 // 4 = 7 requests; A-dp2 301 // 2 = 150, 150 // 4 = 37; B K = 40 from
# --max-running-requests 40, min(40, 40 // 1) = 40. The unbounded KV pool caps nothing.
EXPLICIT_POOL = {"A": (30, 7), "A-dp2": (150, 37), "B": (40, 40)}
# Stages SGLang's get_pp_indices gives no linear layer: an empty stage, and layer 3 (full attention) alone.
PARTITIONS = {"empty-stage-0": ("0,16,16,16", 0), "attention-only-stage-1": ("3,1,22,22", 1)}
BUDGET_GIB = 8.0


@contextlib.contextmanager
def _zero_charge(prepared: Any) -> Iterator[None]:
    """The real configurator (or model runner), its model's linear-state params holding no layers
    (SGLang's ``mamba_cache_per_req`` of them is 0, so is every stage's share)."""
    c = prepared.host
    real = c.mambaish_config
    params = dataclasses.replace(prepared.params, layers=[])  # the params SGLang built for this model
    assert params.mamba_cache_per_req == 0
    c.mambaish_config = types.SimpleNamespace(mamba2_cache_params=params)
    try:
        yield
    finally:
        c.mambaish_config = real


@pytest.mark.parametrize("branch", list(BRANCHES), ids=list(BRANCHES))
def test_zero_charge_only_auto_fit_asserts_in_sglang(sglang_engine, branch: str) -> None:
    """SGLang's ``_handle_max_mamba_cache`` with a 0-byte per-request charge: the explicit branches size
    the pool (K from the flag, nothing taken off the budget), only auto-fit hits its assert."""
    flags = BRANCHES[branch]
    prepared = _prepare(sglang_engine, **flags)
    with _zero_charge(prepared):
        if branch.startswith("C"):
            with pytest.raises(AssertionError):
                _pool(prepared, BUDGET_GIB)
            return
        k, left, n = _pool(prepared, BUDGET_GIB)
    # The explicit branches never read the charge: the builtin model of this release with the model's real
    # charge (and a budget that holds it) derives the same K and request cap.
    real = derive_stage(_inputs(sglang_engine, 1024.0, **flags), 0)
    assert (k, n) == (real.max_mamba_cache_size, real.max_running_requests)
    if parse_version(sglang_engine.version) >= (0, 5, 16, 0):
        assert (k, n) == EXPLICIT_POOL[branch]
    assert left == BUDGET_GIB  # nothing charged: the whole budget stays for the KV cache


@pytest.mark.parametrize("branch", list(BRANCHES), ids=list(BRANCHES))
@pytest.mark.parametrize("partition", list(PARTITIONS), ids=list(PARTITIONS))
def test_own_share_on_a_stage_without_linear_layers_matches_sglang(
    sglang_engine, partition: str, branch: str
) -> None:
    """--policy own-share charges a stage with no linear layers 0 bytes per request. On each branch the
    builtin does what SGLang's code does with a 0 charge: A and B derive SGLang's K, max_running_requests
    and the whole budget left for the KV cache; C refuses (the builtin's one line names the stage)."""
    env, stage = PARTITIONS[partition]
    flags = BRANCHES[branch] | {"partition_env": env}
    prepared = _prepare(sglang_engine, **flags)
    # SGLang's slice and layer ids (at a budget every release's max-share charge fits in).
    assert prepared.derive(stage, 1024.0).stage_linear_layers == 0
    with _zero_charge(prepared):
        try:
            sglang: tuple[int, float, int] | None = _pool(prepared, BUDGET_GIB)
        except AssertionError:
            sglang = None
    inputs = _inputs(sglang_engine, BUDGET_GIB, policy="own-share", **flags)
    if sglang is None:
        assert branch.startswith("C")
        with pytest.raises(LayoutError, match=f"stage {stage} holds no linear layers"):
            derive_stage(inputs, stage)
        return
    b = derive_stage(inputs, stage)
    assert b.stage_per_req_bytes == 0 and b.branch == branch[0]
    assert (b.max_mamba_cache_size, b.kv_budget_gib, b.max_running_requests) == sglang
