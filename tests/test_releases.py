"""Each modelled SGLang release derives as its own released code does (docs/sglang-releases.md).

Expected numbers are worked by hand from the released wheels' code, on the upstream unit test's fixture
(kimi-k3 preset): 4,218,880 state bytes per linear layer, 69 linear layers, per_req 291,102,720; at P=8
the stages hold [9, 8, 8, 9, 9, 9, 9, 8] linear layers, so max-share charges int(per_req * 9/69) =
37,969,920 bytes.
At 8 GiB and r = 0.5 the auto-fit budget is B = 8 * 0.5 / 1.5 * 2**30 = 2,863,311,530.67 bytes.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from strategies import geometries

from checker.core.errors import BudgetError, CheckerInputError, FlagError, LayoutError
from checker.core.releases.releases import (
    FIRST_MODELLED,
    GROUPS,
    MODELLED_RELEASES,
    NEWEST_MODELLED,
    explain_release_difference,
    installed_sglang_version,
    release_model,
)
from checker.core.sizing.attention import AttentionGeometry
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.sizing import POLICIES, CapacityInputs, derive_all, derive_stage
from checker.core.sizing.sweep import BOOT_FAILURE
from checker.device.sweep import derive_sweep
from checker.families import FAMILY_TABLE
from checker.families.geometry import load_geometry

GIB = 2**30
PER_REQ = 291_102_720
SPR9 = 37_969_920
PRESET = load_geometry(model="kimi-k3")
# The preset's shapes as a Qwen3-Next (GDN) model: old releases size the pool per model family.
QWEN = replace(PRESET, family="qwen3_next")
WHOLE_MODEL_RELEASES = ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16")
MAX_SHARE_RELEASES = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")


def make(version: str | None, **kw: Any) -> CapacityInputs:
    """The upstream test's setting (8 GiB, r 0.5, P 8) with the 3-slot strategy SGLang starts with, on
    nodes that export SGLANG_ENABLE_PP_SPEC=1 (0.5.21+ start EAGLE under PP only with it; it sizes
    nothing)."""
    base: dict[str, Any] = dict(
        geometry=PRESET,
        budget_gib=8.0,
        pp_size=8,
        mamba_full_memory_ratio=0.5,
        mamba_radix_cache_strategy="no_buffer",
        disable_overlap_schedule=True,
        sglang_version=version,
        pp_spec_env=True,
    )
    base.update(kw)
    return CapacityInputs(**base)


def values(stages: list) -> set[tuple[int, int, int]]:
    return {(s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size) for s in stages}


# ---- which releases, and how a version is read ----


def test_modelled_releases_are_in_release_order_each_once() -> None:
    """The list is ordered as the releases were published (PEP 440 order, .postN after its release),
    without a repeat, from FIRST_MODELLED to NEWEST_MODELLED: everything that indexes it ("from 0.5.13 on")
    relies on that order."""
    from packaging.version import Version

    versions = [Version(v) for v in MODELLED_RELEASES]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert (MODELLED_RELEASES[0], MODELLED_RELEASES[-1]) == (FIRST_MODELLED, NEWEST_MODELLED)


def test_modelled_releases_are_the_wheels_in_the_wheel_folder() -> None:
    """Every release between the first and the newest modelled one whose wheel was fetched
    (scripts/sglang_wheels.py puts each published release's wheel there) is modelled, and every modelled
    release has its wheel: a release missing from the list, or one listed that was never published,
    fails here."""
    folder = Path(os.environ.get("CHECKER_SGLANG_WHEELS", Path.home() / ".cache" / "pp-checker" / "wheels"))
    from packaging.version import Version

    fetched = {w.name.split("-")[1] for w in folder.glob("sglang-*.whl")}
    if not fetched:
        pytest.skip(f"no SGLang wheel in {folder}: run scripts/build_model_support.py to fetch them")
    in_range = {v for v in fetched if Version(FIRST_MODELLED) <= Version(v) <= Version(NEWEST_MODELLED)}
    assert in_range == set(MODELLED_RELEASES), sorted(in_range ^ set(MODELLED_RELEASES))


def test_the_tables_generated_from_the_wheels_cover_every_modelled_release() -> None:
    """scripts/build_pp_support.py read each release's own code into checker/core/releases/pp_support.py: the
    releases it covers are the modelled ones, in order (a release added to the list without regenerating
    the table, or one dropped from it, shows here)."""
    from checker.core.releases.pp_support import MODEL_RUNNER_ASSERT

    assert tuple(MODEL_RUNNER_ASSERT) == MODELLED_RELEASES


@pytest.mark.parametrize("version", MODELLED_RELEASES)
def test_each_modelled_release_has_its_own_model_and_derives(version: str) -> None:
    """Each release names itself and derives the fixture as a model every release sizes (qwen3_next), at
    pp 1 (releases before 0.5.8 refuse pipeline parallelism) with the strategy flag left at auto (it
    arrived in 0.5.7), on a budget that holds 0.5.2-0.5.3.post1's fixed 512-slot pool: no release is listed
    without a model behind it."""
    model = release_model(version)
    assert model.version == version and not model.best_effort
    (stage,) = derive_all(
        make(version, pp_size=1, geometry=QWEN, mamba_radix_cache_strategy="auto", budget_gib=400.0)
    )
    assert stage.max_running_requests > 0 and stage.max_mamba_cache_size > 0


@pytest.mark.parametrize(
    ("asked", "version"),
    [
        (None, "0.5.23"),
        ("0.5.16", "0.5.16"),
        ("0.5.15.post1", "0.5.15.post1"),
        ("0.5.15post1", "0.5.15.post1"),
        (" 0.5.17 ", "0.5.17"),
    ],
)
def test_release_model_reads_a_version(asked: str | None, version: str) -> None:
    m = release_model(asked)
    assert m.version == version and not m.best_effort


def test_newer_release_is_refused_unless_best_effort() -> None:
    """0.5.24 is not modelled: refused, naming the newest modelled release; best effort derives with
    0.5.23's rules and says so."""
    with pytest.raises(FlagError, match="newest modelled release 0.5.23") as exc:
        release_model("0.5.24")
    assert "\n" not in str(exc.value)
    m = release_model("0.5.24", best_effort=True)
    assert (m.version, m.requested, m.best_effort) == ("0.5.23", "0.5.24", True)
    assert "0.5.24" in m.label and "0.5.23" in m.label
    inp = make("0.6.0", sglang_best_effort=True)
    assert values(derive_all(inp)) == {(74, 24, 3)}
    assert inp.describe()["sglang_version"] == "0.6.0"
    with pytest.raises(FlagError):
        make("0.6.0")


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("0.5.1.post3", "no mamba state pool"),  # the last release before the pool
        ("0.5.1", "no mamba state pool"),
        ("0.5.14.post1", "not a published release"),  # never released
        ("0.5.x", "not a release number"),
        ("0.5.23rc1", "not a release number"),
    ],
)
def test_older_unknown_or_malformed_versions_are_refused(version: str, why: str) -> None:
    with pytest.raises(FlagError, match=why) as exc:
        release_model(version)
    assert "\n" not in str(exc.value)
    with pytest.raises(CheckerInputError):
        make(version)


def test_installed_version_is_read_from_metadata_without_importing(tmp_path: Path) -> None:
    """A dist-info directory is all it reads: no sglang package exists here, nothing gets imported."""
    assert installed_sglang_version([str(tmp_path)]) is None
    info = tmp_path / "sglang-0.5.16.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.16\n")
    other = tmp_path / "sglang_router-0.3.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-router\nVersion: 0.3.0\n")
    assert installed_sglang_version([str(tmp_path)]) == "0.5.16"
    assert "sglang" not in sys.modules


def test_explain_release_difference() -> None:
    """0.5.16 -> 0.5.17 changed the charge and the padding slot (among others); one group, no lines."""
    lines = explain_release_difference("0.5.17", "0.5.16", families=FAMILY_TABLE)
    assert any(
        "0.5.16 charges each stage for the whole model's state; 0.5.17 and later charge the largest" in x
        for x in lines
    )
    assert any("padding slot" in x for x in lines)
    assert explain_release_difference("0.5.18", "0.5.20", families=FAMILY_TABLE) == []
    assert explain_release_difference("0.5.20", "0.5.21", families=FAMILY_TABLE) == [
        "0.5.20 refuses speculative decoding under pipeline parallelism; 0.5.21 accepts EAGLE with "
        "SGLANG_ENABLE_PP_SPEC=1"
    ]
    assert explain_release_difference("0.5.15", "0.5.15.post1", families=FAMILY_TABLE) == []
    floors = explain_release_difference("0.5.22", "0.5.23", families=FAMILY_TABLE)
    assert len(floors) == 1 and "0.5.23 floors" in floors[0]


# ---- worked numbers per group ----


@pytest.mark.parametrize("version", WHOLE_MODEL_RELEASES)
def test_whole_model_group_worked_example(version: str) -> None:
    """0.5.14-0.5.16 (handle_max_mamba_cache / _handle_max_mamba_cache): every stage charged per_req,
    K = int(B // per_req) = int(2,863,311,530.67 / 291,102,720) = int(9.84) = 9 (no padding slot);
    no_buffer: 3 slots -> max_running_requests 9 // 3 = 3; micro batch max(3 // 8, 1) = 1. KV left:
    8 - 9 * 291,102,720 / 2**30 = 8 - 2.4399948 = 5.560005187988281 (728761/131072 exactly)."""
    stages = derive_all(make(version))
    assert values(stages) == {(9, 3, 1)}
    assert {s.stage_per_req_bytes for s in stages} == {PER_REQ}
    assert {s.kv_budget_gib for s in stages} == {728761 / 131072}
    assert {s.state_charged_bytes for s in stages} == {9 * PER_REQ}
    assert make(version).describe()["policy"] == "whole-model"


@pytest.mark.parametrize("version", MAX_SHARE_RELEASES)
def test_max_share_group_worked_example(version: str) -> None:
    """0.5.17+: pp_layer_scale = 9/69 -> 37,969,920 bytes; K = int((B - 37,969,920) // 37,969,920) =
    int(74.41) = 74; 74 // 3 = 24 running requests; 24 // 8 = 3 per micro batch. KV left: 8 - 75 *
    37,969,920 / 2**30 = 5.347831726074219."""
    stages = derive_all(make(version))
    assert values(stages) == {(74, 24, 3)}
    assert {s.kv_budget_gib for s in stages} == {8 - 75 * SPR9 / GIB}
    assert {s.state_charged_bytes for s in stages} == {75 * SPR9}
    assert make(version).describe()["policy"] == "max-share"


def test_policy_what_if_on_an_old_release() -> None:
    """--policy max-share on 0.5.16 keeps 0.5.16's no-padding auto-fit: K = int(B // 37,969,920) =
    int(75.41) = 75, not 74; 75 // 3 = 25, 25 // 8 = 3. whole-model on 0.5.23 with padding:
    int((B - per_req) // per_req) = int(8.84) = 8, 8 // 3 = 2, micro 1."""
    assert values(derive_all(make("0.5.16", policy="max-share"))) == {(75, 25, 3)}
    assert values(derive_all(make("0.5.23", policy="whole-model"))) == {(8, 2, 1)}


def test_spec_decoding_before_and_after_the_padding_slot() -> None:
    """D = 3, --max-running-requests 16, no_buffer (3 slots).
    0.5.16: K = int(B // (per_req * (1 + 3/3))) = int(2,863,311,530.67 / 582,205,440) = 4; reservation
    min(16, 4 // 3) = 1 request: 291,102,720 * 1 * 3 = 873,308,160 bytes; max_running_requests
    min(16, 1) = 1.
    0.5.17: K = int((B - 37,969,920 * 4) // (37,969,920 * 2)) = int(35.70) = 35; reservation
    (min(16, 35 // 3) + 1) * 3 = 36 request-drafts: 37,969,920 * 12 * 3 = 1,366,917,120 bytes; 11 running."""
    kw = dict(speculative_num_draft_tokens=3, max_running_requests=16)
    # 0.5.16 and 0.5.17 refuse spec decoding under PP (server_args.py check_server_args); whole-model
    # charging makes 0.5.16's numbers the same at P = 1. 0.5.21 accepts EAGLE under PP with 0.5.17's rules.
    for refusing in ("0.5.16", "0.5.17", "0.5.20"):
        with pytest.raises(FlagError, match="Pipeline parallelism is not compatible"):
            make(refusing, **kw)
    old = derive_stage(make("0.5.16", **kw, pp_size=1), 0)
    assert (old.max_mamba_cache_size, old.max_running_requests, old.intermediate_state_bytes) == (
        4,
        1,
        873_308_160,
    )
    assert old.kv_budget_gib == (8.0 - 873_308_160 / GIB) - 4 * PER_REQ / GIB
    new = derive_stage(make("0.5.21", **kw), 0)
    assert (new.max_mamba_cache_size, new.max_running_requests, new.intermediate_state_bytes) == (
        35,
        11,
        1_366_917_120,
    )


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16", "0.5.17", "0.5.22"])
def test_requests_per_worker_reaching_zero_is_refused_before_0_5_23(version: str) -> None:
    """--max-running-requests 3 over dp 4: 3 // 4 = 0. Before 0.5.23 the no-radix pool is K = 0
    (handle: "Not enough GPU memory ... max_mamba_cache_size=0") and the resolver gives 0 requests; no
    budget helps, so it is a flag error. 0.5.23 floors it at 1 (K = 1, one request)."""
    kw = dict(disable_radix_cache=True, max_running_requests=3, dp_size=4)
    with pytest.raises(FlagError, match="--max-running-requests 3 split over --dp-size 4"):
        derive_all(make(version, **kw))
    with pytest.raises(FlagError, match="--max-running-requests 3"):
        derive_all(make(version, max_running_requests=3, dp_size=4))  # radix on: the resolver
    assert values(derive_all(make("0.5.23", **kw))) == {(1, 1, 1)}


def test_per_slot_extra_state_arrived_in_0_5_22() -> None:
    """extra_mamba_cache_bytes_per_req is charged from 0.5.22; a model spec carrying one is refused for
    earlier releases (they have no such state)."""
    g = replace(TOY, extra_per_slot_bytes=1000)
    for v in ("0.5.16", "0.5.21"):
        with pytest.raises(FlagError, match="extra_per_slot_bytes=1000"):
            CapacityInputs(geometry=g, budget_gib=1.0, sglang_version=v)
    s = derive_stage(CapacityInputs(geometry=g, budget_gib=1.0, sglang_version="0.5.22"), 0)
    assert s.extra_per_slot_bytes == 1000


def test_skip_decode_lock_is_read_from_0_5_17() -> None:
    """Default flags at P=8 (auto -> extra_buffer without overlap): 3 + 1 = 4 slots; with
    SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK 0.5.17+ drop the base to 2 (3 slots), 0.5.16 does not read it."""
    kw = dict(mamba_radix_cache_strategy="auto", disable_overlap_schedule=False, skip_decode_lock=True)
    assert make("0.5.16", **kw).slots_per_request() == 4
    assert make("0.5.17", **kw).slots_per_request() == 3


def test_extra_buffer_lazy_with_spec_is_refused_before_0_5_17() -> None:
    """server_args.py _validate_mamba_extra_buffer up to 0.5.16: "extra_buffer_lazy unsupported with
    spec."; 0.5.17 dropped the assert. Lazy needs the overlap schedule, so P = 1 here: 3 + 1 = 4 slots."""
    kw = dict(
        pp_size=1,
        mamba_radix_cache_strategy="extra_buffer_lazy",
        disable_overlap_schedule=False,
        speculative_num_draft_tokens=2,
        max_running_requests=8,
    )
    with pytest.raises(FlagError, match="extra_buffer_lazy unsupported with spec"):
        make("0.5.16", **kw).slots_per_request()
    assert make("0.5.17", **kw).slots_per_request() == 4


# ---- the two fixes against 0.5.23 ----

TOY = ModelGeometry(
    name="toy",
    num_hidden_layers=4,
    linear_layer_ids=(0, 1, 2, 3),
    conv_shapes=((8, 3),),
    temporal_shape=(2, 4, 4),
    context_len=1_048_576,
    # A KV cache on layer 3 of 1 head x (8 + 8) x 2 bytes: about 2**25 tokens at 1 GiB, never binding.
    attention=AttentionGeometry(full_attention_layer_ids=(3,), num_kv_heads=1, head_dim=8, v_head_dim=8),
    families=FAMILY_TABLE,  # the registry's facts, as load_geometry hands every geometry (a model spec too)
)  # 176 bytes a layer, 704 per request


@pytest.mark.parametrize(("version", "K"), [("0.5.23", 1023), ("0.5.17", 1023), ("0.5.16", 1024)])
def test_state_pool_leaving_exactly_zero_for_kv_does_not_start(version: str, K: int) -> None:
    """_profile_available_bytes raises on ``rest_memory <= 0``. A fixed pool charging 1024 slots of 704
    bytes takes 720,896 bytes = 720896 / 2**30 GiB (exact in binary) - K + 1 slots from 0.5.17, K before.
    At exactly that budget 0 GiB is left: refused, by the scalar core and the sweep alike. One ulp more
    and it starts (auto with --disable-overlap-schedule at P=1 is no_buffer: 3 slots a request)."""
    budget = 1024 * 704 / GIB
    kw = dict(
        geometry=TOY,
        pp_size=1,
        max_mamba_cache_size=K,
        disable_overlap_schedule=True,
        sglang_version=version,
        # The KV pool a budget one ulp above the state pool leaves holds no token: fixed here, as the
        # test is about the state pool's own refusal.
        token_capacity=1_000_000,
    )
    with pytest.raises(BudgetError, match="leaves 0 GiB"):
        derive_stage(CapacityInputs(budget_gib=budget, **kw), 0)
    row = derive_sweep(CapacityInputs(budget_gib=1.0, **kw), 0, [budget])
    assert row.tolist() == [[BOOT_FAILURE] * 3]
    above = float.__add__(budget, budget * 2**-52)
    s = derive_stage(CapacityInputs(budget_gib=above, **kw), 0)
    assert s.max_mamba_cache_size == K and s.kv_budget_gib > 0


EMPTY_FIRST = "0,12,12,12,12,12,12,21"  # stage 0 holds no layers at all


@pytest.mark.parametrize(
    "extra",
    [
        {"max_mamba_cache_size": 40},
        {"disable_radix_cache": True, "max_running_requests": 20},
    ],
)
def test_own_share_empty_stage_with_an_explicit_pool_size_starts(extra: dict[str, Any]) -> None:
    """Only the auto-fit branch asserts ``stage_per_req > 0`` (_handle_max_mamba_cache); with an
    explicit pool size (branch A or B) a stage charged 0 bytes starts with that pool. K = 40 (A) or 20
    (B) on every stage; the empty stage keeps its whole budget for KV (8 GiB)."""
    stages = derive_all(make("0.5.23", policy="own-share", partition_env=EMPTY_FIRST, **extra))
    assert stages[0].stage_per_req_bytes == 0
    assert stages[0].kv_budget_gib == 8.0
    assert {s.max_mamba_cache_size for s in stages} == {extra.get("max_mamba_cache_size", 20)}
    with pytest.raises(LayoutError, match="stage 0 holds no linear layers"):
        derive_all(make("0.5.23", policy="own-share", partition_env=EMPTY_FIRST))


# ---- the vectorised sweep is the scalar core, release by release ----


_GROUP_RELEASES = {g.group: [v for v in MODELLED_RELEASES if release_model(v).rules is g] for g in GROUPS}


@st.composite
def sweep_cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[float], list[str]]:
    """Inputs of one sweep (everything but the budget), its budgets, and one release of every group (a
    group's releases share every rule), drawn so that the examples together cover every release."""
    g = draw(geometries(extras=(0, 0, 4096)))
    g = replace(g, family=draw(st.sampled_from(["qwen3_next", "nemotron_h", "kimi_linear", None])))
    L = g.num_hidden_layers
    P = draw(st.integers(1, min(4, L)))
    partition = None
    if P > 1 and draw(st.booleans()):
        # Any split of the layers, empty stages included: own-share charges an empty stage 0 bytes.
        # A cut at L empties the last stage, after stages that hold layers (the case of issue 18, which
        # plain draws found once in dozens of runs): biased towards it.
        cut = st.one_of(st.just(L), st.integers(0, L))
        cuts = sorted(draw(st.lists(cut, min_size=P - 1, max_size=P - 1)))
        partition = ",".join(str(b - a) for a, b in zip([0, *cuts], [*cuts, L], strict=True))
    D = draw(st.sampled_from([None, None, 1, 3]))
    T = draw(st.sampled_from([None, None, 1, 64, 100_000]))
    kw: dict[str, Any] = dict(
        geometry=g,
        pp_size=P,
        partition_env=partition,
        policy=draw(st.sampled_from([None, "max-share", "own-share", "whole-model"])),
        mamba_full_memory_ratio=draw(st.sampled_from([0.5, 0.9, 2.0])),
        disable_overlap_schedule=draw(st.booleans()),
        dp_size=draw(st.sampled_from([1, 2, 3])),
        speculative_num_draft_tokens=D,
        max_running_requests=draw(st.sampled_from([1, 2, 16])) if D else draw(st.sampled_from([None, 1, 16])),
        disable_radix_cache=draw(st.booleans()),
        max_mamba_cache_size=draw(st.sampled_from([None, None, 1, 7, 64])),
        mamba_radix_cache_strategy=draw(st.sampled_from(["auto", "no_buffer", "extra_buffer"])),
        page_size=draw(st.sampled_from([1, 1, 16])),
        skip_decode_lock=draw(st.booleans()),
        pp_max_micro_batch_size=draw(st.sampled_from([None, None, 2])),
        token_capacity=T,
        context_len=4096 if T else None,
    )
    # Budgets too small for any pool beside ones that fit, so one sweep holds boot failures and values.
    budget = st.one_of(st.sampled_from([1e-6, 0.01, 8.0]), st.floats(1e-6, 64.0, allow_nan=False))
    budgets = draw(st.lists(budget, min_size=1, max_size=8))
    versions = [draw(st.sampled_from(_GROUP_RELEASES[grp.group])) for grp in GROUPS]
    return kw, budgets, versions


# The case of issue 18: on 0.5.21+ at pp 2 with own-share, stage 1 holds no linear layer (an auto-fit
# branch SGLang asserts against at every budget) while stage 0 simply lacks memory at 1e-6 GiB. The
# sweep refused with LayoutError, derive_all with stage 0's BudgetError.
_ISSUE_18_CASE = (
    dict(
        geometry=replace(
            PRESET,
            num_hidden_layers=2,
            linear_layer_ids=(0,),
            attention=replace(PRESET.attention, full_attention_layer_ids=(1,)),
        ),
        pp_size=2,
        policy="own-share",
        speculative_num_draft_tokens=3,
        max_running_requests=1,
    ),
    [1e-6, 8.0],
    ["0.5.21", "0.5.22", "0.5.23"],
)


def _scalar_outcome(kw: dict[str, Any], version: str, budget: float, k: int) -> list[int] | Exception:
    """Stage k's checked values at one budget from the scalar core, or the input error it raises."""
    try:
        s = derive_stage(CapacityInputs(**kw, budget_gib=budget, sglang_version=version), k)
    except CheckerInputError as exc:
        return exc
    return [s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size]


def assert_sweep_agrees_with_derive(kw: dict[str, Any], budgets: list[float], versions: list[str]) -> None:
    """The vectorised sweep and the scalar core agree on ``kw`` at ``budgets`` for every release given:
    per stage, the sweep's row at a budget is the scalar core's triple, or BOOT_FAILURE exactly where it
    raises BudgetError; an error the sweep raises is one no budget fixes, so the scalar core raises the
    same class with the same words at every budget; derive_all (the derive command) raises what the
    sweep raises, else BudgetError exactly at the budgets where some stage cannot boot."""
    P = kw["pp_size"]
    for version in versions:
        try:
            inputs = CapacityInputs(**kw, budget_gib=1.0, sglang_version=version)
        except CheckerInputError as exc:
            # Refused before any budget is read: the derivation refuses alike at every budget.
            for b in budgets:
                with pytest.raises(type(exc)):
                    CapacityInputs(**kw, budget_gib=b, sglang_version=version)
            continue
        sweep_error: CheckerInputError | None = None
        rows = []
        for k in range(P):  # stage order, as the single-process sweep runs them
            try:
                rows.append(derive_sweep(inputs, k, budgets).tolist())
            except CheckerInputError as exc:
                sweep_error = exc
                break
        assert not isinstance(sweep_error, BudgetError), (version, sweep_error)  # not per budget
        for i, b in enumerate(budgets):
            if sweep_error is not None:
                k = len(rows)  # the stage that refused
                got = _scalar_outcome(kw, version, b, k)
                assert type(got) is type(sweep_error) and str(got) == str(sweep_error), (version, k, b)
            else:
                for k in range(P):
                    got = _scalar_outcome(kw, version, b, k)
                    want = [BOOT_FAILURE] * 3 if isinstance(got, BudgetError) else got
                    assert rows[k][i] == want, (version, k, b)
            try:
                stages = derive_all(CapacityInputs(**kw, budget_gib=b, sglang_version=version))
            except CheckerInputError as exc:
                if sweep_error is not None:
                    assert type(exc) is type(sweep_error) and str(exc) == str(sweep_error), (version, b)
                else:
                    assert isinstance(exc, BudgetError), (version, b, exc)
                    assert any(r[i][0] == BOOT_FAILURE for r in rows), (version, b)
                continue
            assert sweep_error is None, (version, b, sweep_error)
            got_rows = [
                [s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size] for s in stages
            ]
            assert got_rows == [r[i] for r in rows], (version, b)


# No shrinking: a failure prints the drawn case whole (it replays from .hypothesis), and shrinking
# one of these (16 releases, every stage, every budget per call) took 100 s in the quick suite.
@settings(max_examples=40, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@example(case=_ISSUE_18_CASE)
@given(case=sweep_cases())
def test_sweep_and_derive_raise_the_same_error_or_give_identical_values(
    case: tuple[dict[str, Any], list[float], list[str]],
) -> None:
    """For any inputs the sweep and derive raise the same error class with the same words, or give
    identical values (:func:`assert_sweep_agrees_with_derive`). Breaks as a sweep that refuses inputs
    derive sizes (or the reverse), values that differ at some budget, or a derive that blames the budget
    for a layout no budget fixes."""
    assert_sweep_agrees_with_derive(*case)
    assert torch.get_default_dtype() == torch.float32  # the sweep never changed the global default


_ALL_GROUPS = [group[-1] for group in _GROUP_RELEASES.values()]
# Two stages: layer 0 is the only linear layer, so a stage without it is charged 0 bytes by own-share.
_ONE_LINEAR = replace(
    PRESET,
    num_hidden_layers=4,
    linear_layer_ids=(0,),
    family="kimi_linear",
    attention=replace(PRESET.attention, full_attention_layer_ids=(1, 2, 3)),
)


@pytest.mark.parametrize("partition", ["1,3", "0,4", "4,0"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"max_mamba_cache_size": 7},
        {"disable_radix_cache": True, "max_running_requests": 3},
        {"speculative_num_draft_tokens": 3, "max_running_requests": 1},
        {"max_running_requests": 1, "dp_size": 2},
    ],
    ids=["auto-fit", "explicit-pool", "no-radix", "spec", "dp"],
)
def test_every_release_refuses_a_layout_no_budget_fixes_before_blaming_the_budget(
    partition: str, policy: str, flags: dict[str, Any]
) -> None:
    """Each stage alone refuses what SGLang's rank refuses, in its order (the auto-fit assert, then
    K <= 0, then the KV budget); across stages derive names the refusal no budget fixes, whichever
    stage holds it, and the sweep the same, at a budget too small for any stage (1e-6 GiB) and at one
    that fits. The grid puts the stage own-share charges 0 bytes first, last, or nowhere, on one
    release of every group."""
    kw = dict(geometry=_ONE_LINEAR, pp_size=2, partition_env=partition, policy=policy, **flags)
    assert_sweep_agrees_with_derive(kw, [1e-6, 8.0], _ALL_GROUPS)


# ---- 0.5.2 to 0.5.6.post2 and 0.5.13 (docs/sglang-releases.md) ----


def test_fixed_pool_0_5_2_to_0_5_3_post1() -> None:
    """model_runner.py ModelRunner.__init__ (0.5.2): a hybrid GDN model disables the radix cache and sets
    max_mamba_cache_size = --max-running-requests (16) // 1 = 16 whatever the budget; init_memory_pool:
    max_num_reqs = min(16, 16) = 16; tp_worker.py: max_running_requests = min(16 // 1, 16) = 16; micro
    max(16 // 1, 1) = 16. profile_max_num_token: 8 - 16 * 291,102,720 / 2**30 = 8 - 4,657,643,520 / 2**30.
    Without --max-running-requests the pool is 512 slots: 512 * 291,102,720 bytes = 138.8 GiB > 8."""
    for v in ("0.5.2", "0.5.3", "0.5.3.post1"):
        s = derive_stage(
            make(v, geometry=QWEN, pp_size=1, max_running_requests=16, mamba_radix_cache_strategy="auto"), 0
        )
        assert (s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size) == (16, 16, 16)
        assert s.slots_per_request == 1 and s.kv_budget_gib == 8 - 4_657_643_520 / GIB
        with pytest.raises(BudgetError):
            derive_stage(make(v, geometry=QWEN, pp_size=1, mamba_radix_cache_strategy="auto"), 0)


@pytest.mark.parametrize("version", ["0.5.3.post2", "0.5.4", "0.5.4.post2", "0.5.6.post2"])
def test_ratio_pool_0_5_3_post2_to_0_5_6_post2(version: str) -> None:
    """model_runner.py handle_max_mamba_cache, radix cache on: int(B * 2**30 // 291,102,720 // 1) with
    B = 8 * 0.5 / 1.5 GiB: int(9.84) = 9; init_memory_pool: min(4096, 9 // 3) = 3
    (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO); micro 3 at pp 1. With D = 2 and mrr 4, radix off:
    K = 4, charged 4 * 291,102,720 * (1 + 2) bytes = 3.25 GiB, of which 4 * 2 * 291,102,720 is the
    intermediate state; tp_worker: min(4 // 1, min(4, 4 // 1)) = 4 requests."""
    auto = dict(geometry=QWEN, pp_size=1, mamba_radix_cache_strategy="auto")
    assert values(derive_all(make(version, **auto))) == {(9, 3, 3)}
    s = derive_stage(
        make(
            version, **auto, disable_radix_cache=True, max_running_requests=4, speculative_num_draft_tokens=2
        ),
        0,
    )
    assert (s.max_mamba_cache_size, s.max_running_requests, s.intermediate_state_bytes) == (4, 4, 8 * PER_REQ)
    assert s.kv_budget_gib == 8 - 12 * PER_REQ / GIB


def test_pp_refused_until_a_hybrid_model_supports_it() -> None:
    """Up to 0.5.7 no hybrid class starts under PP (qwen3_next.py asserts a single stage; kimi_linear.py,
    0.5.4.post2, splits its layers but its load_weights KeyErrors on another stage's until 0.5.17);
    nemotron_h.py does from 0.5.8 (checker/core/releases/pp_support.py). A JSON model spec is held to that.
    Kimi-Linear on 0.5.4.post2 at one stage: server_args.py forces KimiLinear's radix cache off, so
    handle_max_mamba_cache sizes K = --max-running-requests 16 (no // dp: not GDN), charged 16 * per_req;
    1 slot a request: tp_worker.py min(16 // 1, min(16, 16 // 1)) = 16, micro 16 // 1 = 16. Spec decoding
    under PP is refused up to 0.5.20 (check_server_args / validation_hook.py)."""
    with pytest.raises(FlagError, match="--pp-size 8: SGLang 0.5.4.post1 starts no hybrid"):
        make("0.5.4.post1", geometry=QWEN, mamba_radix_cache_strategy="auto")
    kimi = replace(PRESET, family="kimi_linear")
    auto = dict(mamba_radix_cache_strategy="auto", max_running_requests=16)
    with pytest.raises(FlagError, match="--pp-size 8: SGLang 0.5.7 starts no hybrid"):
        make("0.5.7", geometry=kimi, max_running_requests=16)
    assert values(derive_all(make("0.5.4.post2", geometry=kimi, pp_size=1, **auto))) == {(16, 16, 16)}
    derive_all(make("0.5.8", max_running_requests=16))  # 0.5.8: Nemotron-H starts under PP
    for v in ("0.5.13", "0.5.14", "0.5.18", "0.5.19", "0.5.20"):
        with pytest.raises(FlagError, match="Pipeline parallelism is not compatible"):
            make(v, speculative_num_draft_tokens=2, max_running_requests=8)
    make("0.5.21", speculative_num_draft_tokens=2, max_running_requests=8)  # EAGLE with SGLANG_ENABLE_PP_SPEC
    with pytest.raises(FlagError, match="only supported on prefill nodes.*export SGLANG_ENABLE_PP_SPEC=1"):
        make("0.5.21", speculative_num_draft_tokens=2, max_running_requests=8, pp_spec_env=False)


def test_no_strategy_flag_before_0_5_7() -> None:
    with pytest.raises(FlagError, match="0.5.6.post2 has no mamba cache strategy"):
        make("0.5.6.post2", geometry=QWEN, pp_size=1)  # no_buffer


def test_0_5_13_caps_a_user_request_count_by_the_estimate() -> None:
    """_resolve_max_num_reqs (0.5.13): min(5000 // 1, estimate 4096) = 4096, then min(4096, 30000 // 3);
    0.5.14 caps by T // 2 instead (none here): min(5000, 10000) = 5000. TOY pool: 30000 * 704 bytes."""
    kw = dict(
        geometry=replace(TOY, family="qwen3_next"),
        budget_gib=1.0,
        max_mamba_cache_size=30000,
        max_running_requests=5000,
        mamba_radix_cache_strategy="no_buffer",
        disable_overlap_schedule=True,
    )
    assert derive_stage(CapacityInputs(**kw, sglang_version="0.5.13"), 0).max_running_requests == 4096
    assert derive_stage(CapacityInputs(**kw, sglang_version="0.5.14"), 0).max_running_requests == 5000
    assert values(derive_all(make("0.5.13"))) == {(9, 3, 1)}


# ---- 0.5.7 to 0.5.12.post1, and the model family (docs/sglang-releases.md) ----
# The preset's shapes as Qwen3-Next at P = 8: every stage is charged per_req = 291,102,720 (whole model);
# B = 8 * 0.5 / 1.5 * 2**30 = 2,863,311,530.67 bytes.


@pytest.mark.parametrize(
    ("version", "want"),
    [
        ("0.5.7", (9, 1, 1)),
        ("0.5.8", (9, 3, 1)),
        ("0.5.8.post1", (9, 3, 1)),
        ("0.5.9", (9, 3, 1)),
        ("0.5.10", (9, 3, 1)),
        ("0.5.12.post1", (9, 3, 1)),
        ("0.5.13", (9, 3, 1)),
    ],
)
def test_no_buffer_slot_ratio_0_5_7_to_0_5_13(version: str, want: tuple[int, int, int]) -> None:
    """model_runner_kv_cache_mixin.py handle_max_mamba_cache, radix cache on, no --max-mamba-cache-size:
    K = int(B // per_req) = int(9.84) = 9 in every release here. 0.5.7 init_memory_pool adds
    MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP (2) unless extra_buffer runs with spec decoding, so no_buffer
    holds 3 + 2 = 5 slots: min(4096, 9 // 5) = 1 request; 0.5.8 adds it only under extra_buffer: 9 // 3
    = 3. Micro batch max(n // 8, 1) = 1. KV left 8 - 9 * per_req / 2**30 (no padding slot). 0.5.7 at one
    stage (micro batch 1 // 1 = 1): no hybrid class starts under PP there
    (checker/core/releases/pp_support.py),
    and whole-model charging makes K the same at any pp size."""
    pp = {"pp_size": 1} if version == "0.5.7" else {}
    stages = derive_all(make(version, geometry=QWEN, **pp))
    assert values(stages) == {want}
    assert {s.kv_budget_gib for s in stages} == {728761 / 131072}


def test_auto_is_no_buffer_until_0_5_14() -> None:
    """server_args.py __post_init__ (0.5.7-0.5.13.post1): ``if self.mamba_scheduler_strategy == "auto":
    self.mamba_scheduler_strategy = "no_buffer"``, whatever the overlap schedule: 3 slots, 9 // 3 = 3
    requests. 0.5.14 (_handle_mamba_radix_cache) picks extra_buffer when overlap is wanted: 3 + 1 (overlap
    forced off under PP) = 4 slots, 9 // 4 = 2."""
    auto = dict(geometry=QWEN, mamba_radix_cache_strategy="auto", disable_overlap_schedule=False)
    for v in ("0.5.8", "0.5.10", "0.5.13"):
        assert values(derive_all(make(v, **auto))) == {(9, 3, 1)}
        assert make(v, **auto).resolved_strategy == "no_buffer"
    assert values(derive_all(make("0.5.14", **auto))) == {(9, 2, 1)}


def test_extra_buffer_slots_0_5_7_to_0_5_13() -> None:
    """extra_buffer at P = 1, K = 9. 0.5.7 and 0.5.8-0.5.9 add 2 slots without spec decoding, whatever the
    overlap schedule: 9 // 5 = 1. 0.5.10+ (_calculate_mamba_ratio) add 2 with overlap, 1 without:
    9 // 5 = 1 and 9 // 4 = 2."""
    xb = dict(geometry=QWEN, pp_size=1, mamba_radix_cache_strategy="extra_buffer")
    for v in ("0.5.7", "0.5.8", "0.5.9"):
        for no_overlap in (False, True):
            s = derive_stage(make(v, **xb, disable_overlap_schedule=no_overlap), 0)
            assert (s.slots_per_request, s.max_running_requests) == (5, 1)
    for v in ("0.5.10", "0.5.13"):
        assert derive_stage(make(v, **xb, disable_overlap_schedule=False), 0).max_running_requests == 1
        assert derive_stage(make(v, **xb, disable_overlap_schedule=True), 0).max_running_requests == 2


@pytest.mark.parametrize(("version", "want"), [("0.5.7", (7, 1)), ("0.5.8", (8, 2)), ("0.5.9", (8, 2))])
def test_spec_reservation_before_the_pool_0_5_7_to_0_5_9(version: str, want: tuple[int, int]) -> None:
    """extra_buffer, D = 2, --max-running-requests 4, dp 2, P = 1. 0.5.7 handle_max_mamba_cache takes
    per_req * 4 * 2 = 2,328,821,760 bytes (mrr NOT divided by dp) off first: (8 * 2**30 - 2,328,821,760) / 3
    = 2,087,037,610.67 bytes for the pool, K = int(7.17) = 7 (no // dp on the auto-fit); 3 + 1 slots
    (extra_buffer with spec): tp worker min(4 // 2, min(4, 7 // 4)) = 1. 0.5.8 takes per_req * (4 // 2) * 2
    = 1,164,410,880 bytes: 7,425,523,712 / 3 = 2,475,174,570.67, K = int(8.50) = 8, min(2, 8 // 4) = 2."""
    kw = dict(
        geometry=QWEN,
        pp_size=1,
        dp_size=2,
        mamba_radix_cache_strategy="extra_buffer",
        speculative_num_draft_tokens=2,
        max_running_requests=4,
    )
    s = derive_stage(make(version, **kw), 0)
    assert (s.max_mamba_cache_size, s.max_running_requests) == want
    reserved = 8 if version == "0.5.7" else 4
    assert s.intermediate_state_bytes == reserved * PER_REQ
    assert s.kv_budget_gib == (8 - reserved * PER_REQ / GIB) - want[0] * PER_REQ / GIB


def test_radix_off_without_a_request_count_0_5_8_vs_0_5_9() -> None:
    """--disable-radix-cache without --max-running-requests: 0.5.8 handle_max_mamba_cache sets 512 slots
    (512 * per_req = 138.8 GiB, more than 8: no KV left, refused); 0.5.9 branches A/B need an explicit
    size, so it auto-fits: K = 9, 1 slot a request, min(4096, 9 // 1) = 9 requests, micro 9 // 8 = 1."""
    with pytest.raises(BudgetError):
        derive_all(make("0.5.8", geometry=QWEN, disable_radix_cache=True))
    assert values(derive_all(make("0.5.9", geometry=QWEN, disable_radix_cache=True))) == {(9, 9, 1)}


def test_request_cap_tp_worker_until_0_5_9_estimate_from_0_5_10() -> None:
    """TOY (704 bytes a request), --max-mamba-cache-size 30000, --max-running-requests 5000, no_buffer:
    0.5.9 model_runner.py caps a user value by nothing but the pool: min(5000 // 1, min(5000, 30000 // 3))
    = 5000; 0.5.10 _resolve_max_num_reqs: min(5000 // 1, estimate 4096) = 4096."""
    kw = dict(
        geometry=replace(TOY, family="qwen3_next"),
        budget_gib=1.0,
        max_mamba_cache_size=30000,
        max_running_requests=5000,
        mamba_radix_cache_strategy="no_buffer",
    )
    assert derive_stage(CapacityInputs(**kw, sglang_version="0.5.9"), 0).max_running_requests == 5000
    assert derive_stage(CapacityInputs(**kw, sglang_version="0.5.10"), 0).max_running_requests == 4096


def test_scheduler_strategy_refusals() -> None:
    """0.5.7-0.5.12.post1 have no extra_buffer_lazy (MAMBA_SCHEDULER_STRATEGY_CHOICES); from 0.5.10
    server_args.py refuses no_buffer with spec decoding and the radix cache on, and extra_buffer with
    --disable-radix-cache. no_buffer with the overlap schedule on is not refused: SGLang turns it off."""
    with pytest.raises(FlagError, match="has no such strategy"):
        make("0.5.12", geometry=QWEN, mamba_radix_cache_strategy="extra_buffer_lazy")
    spec = dict(geometry=QWEN, pp_size=1, speculative_num_draft_tokens=2, max_running_requests=4)
    with pytest.raises(FlagError, match="not compatible with radix cache"):
        derive_stage(make("0.5.10", **spec), 0)
    derive_stage(make("0.5.9", **spec), 0)
    with pytest.raises(FlagError, match="not compatible with --disable-radix-cache"):
        derive_stage(
            make(
                "0.5.11", geometry=QWEN, mamba_radix_cache_strategy="extra_buffer", disable_radix_cache=True
            ),
            0,
        )
    assert (
        derive_stage(make("0.5.10", geometry=QWEN, disable_overlap_schedule=False), 0).slots_per_request == 3
    )


def test_model_family_rules_of_old_releases() -> None:
    """0.5.5 handle_max_mamba_cache divides K by dp only for hybrid GDN (``if self.hybrid_gdn_config``):
    Qwen3-Next at dp 2, P = 1: int(B // per_req) // 2 = 9 // 2 = 4. ModelRunner.__init__ forces the radix
    cache off for NemotronH (mamba2_config): K = --max-running-requests 16, not split, 1 slot a request;
    tp_worker.py min(16 // 2, min(16, 16 // 1)) = 8. 0.5.2 has a pool for Qwen3-Next only; KimiLinear's
    radix cache is forced off up to 0.5.13.post1 (server_args.py), so 0.5.10 sizes branch B: 16 // 1."""
    kw = dict(pp_size=1, dp_size=2, mamba_radix_cache_strategy="auto")
    assert derive_stage(make("0.5.5", geometry=QWEN, **kw), 0).max_mamba_cache_size == 4
    nem = derive_stage(
        make("0.5.5", geometry=replace(PRESET, family="nemotron_h"), **kw, max_running_requests=16), 0
    )
    assert (nem.max_mamba_cache_size, nem.slots_per_request, nem.max_running_requests) == (16, 1, 8)
    with pytest.raises(FlagError, match="only for model_type qwen3_next, not nemotron_h"):
        make(
            "0.5.2",
            geometry=replace(PRESET, family="nemotron_h"),
            pp_size=1,
            mamba_radix_cache_strategy="auto",
        )
    kimi = derive_stage(
        make("0.5.10", geometry=replace(PRESET, family="kimi_linear"), max_running_requests=16), 0
    )
    assert (kimi.branch, kimi.max_mamba_cache_size, kimi.max_running_requests) == ("B", 16, 16)
    assert make("0.5.14", geometry=replace(PRESET, family="kimi_linear")).slots_per_request() == 3


def test_a_model_spec_without_a_family_is_refused_where_it_matters() -> None:
    """TOY names no model_type: 0.5.5 decides whether it has a pool at all by family; 0.5.10 whether its
    radix cache is forced off (KimiLinear), which --disable-radix-cache makes moot; 0.5.14 does not ask."""
    for v in ("0.5.5", "0.5.10"):
        with pytest.raises(FlagError, match='add "model_type"'):
            CapacityInputs(geometry=TOY, budget_gib=1.0, sglang_version=v)
    CapacityInputs(geometry=TOY, budget_gib=1.0, sglang_version="0.5.10", disable_radix_cache=True)
    CapacityInputs(geometry=TOY, budget_gib=1.0, sglang_version="0.5.14")


def test_default_full_memory_ratio_per_release() -> None:
    """server_args.py ServerArgs.mamba_full_memory_ratio: 0.2 in 0.5.3.post2 (the release that adds the
    flag), 0.9 from 0.5.3.post3 on (checked in 0.5.3.post3, 0.5.7, 0.5.12)."""
    versions = ("0.5.3.post2", "0.5.3.post3", "0.5.7", "0.5.12")
    got = {v: release_model(v).rules.default_full_memory_ratio for v in versions}
    assert got == {"0.5.3.post2": 0.2, "0.5.3.post3": 0.9, "0.5.7": 0.9, "0.5.12": 0.9}
