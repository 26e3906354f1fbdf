"""In-process tests of the release, planning and model-support rules (mutation round 2, issue 18 item 8).

Most CLI tests of these rules run the checker in a subprocess, which a mutation tool cannot see into;
these call the core functions in-process. Every expected value says where it comes from: pip's own
reading of a version (``packaging.version``, which pytest depends on), a release's code
(docs/sglang-releases.md, the wheels' model registries in checker/core/releases/model_registry.py), the spec's
formulas (/work/shared/spec/capacity.md), or a property (a round trip, agreement with ``derive_all``).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from checker.core.errors import BudgetError, FlagError, LayoutError
from checker.core.releases.model_support import check_architectures, registers
from checker.core.releases.releases import (
    MAX_VERSION_CHARS,
    MODELLED_RELEASES,
    NEWEST_MODELLED,
    choose_release,
    installed_sglang_version,
    read_installed,
    release_key,
    release_model,
)
from checker.core.sizing.attention import AttentionGeometry
from checker.core.sizing.budget import sizing_budget
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.planning import (
    meets,
    min_budget,
    min_mem_fraction,
    partition_bounds,
    suggest_partition,
)
from checker.core.sizing.sizing import CapacityInputs, derive_all
from checker.families.geometry import load_geometry, model_architectures

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KIMI = load_geometry(model="kimi-k3")
QWEN = replace(KIMI, family="qwen3_next")  # the preset's shapes as a Qwen3-Next: old releases ask the family


# ---- how a release number is read ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["0.5.15post1", "0.5.15.post1", " 0.5.23\n", "0.05.023", "0.5.3.post2", "0.5.2"]
)
def test_a_release_number_is_the_release_pip_means(text: str) -> None:
    """--sglang-version takes the spellings PEP 440 allows for a final or post release and means the
    release pip means (``packaging.version.Version``'s normal form): the derivation follows that release."""
    want = str(Version(text))
    assert release_model(text).version == want
    assert choose_release(text, None).derived_as == want


def test_a_release_number_that_cannot_be_read_names_the_flag_first() -> None:
    with pytest.raises(FlagError) as info:
        release_model("0.5.x")
    assert str(info.value).startswith(
        f"--sglang-version '0.5.x' is not a release number like {NEWEST_MODELLED}"
    )


def test_a_release_number_that_is_no_string_is_refused_in_one_line() -> None:
    """CapacityInputs(sglang_version=...) from Python: a number is refused like any bad value."""
    with pytest.raises(FlagError, match="--sglang-version 523 is not a release number"):
        release_model(523)  # type: ignore[arg-type]


def test_an_installed_spelling_is_derived_as_the_release_pip_means() -> None:
    """pip may report an installed post release spelled any PEP 440 way (and "v" or capitals): the rank
    derives as that modelled release, from the installed metadata, and keeps the text it read."""
    for text in ("0.5.15-post1", "0.5.15post1", "V0.5.15.POST1", "0.5.15.post.1"):
        c = choose_release(None, f" {text} ")
        assert (c.derived_as, c.source, c.own_code) == (str(Version(text)), "installed", False)
        assert c.installed == f" {text} "


def _suffixed(base: str) -> list[str]:
    out = []
    for pre in ("", "a1", "a2", "b1", "rc1", "rc2"):
        for post in ("", ".post0", ".post1", ".post2"):
            for dev in ("", ".dev0", ".dev1"):
                out.append(base + pre + post + dev)
    return out


def test_installed_releases_are_ordered_as_pip_orders_them() -> None:
    """Newer / older than the modelled releases is decided on this order: dev < a < b < rc < final <
    post, with dev releases of each before it (PEP 440). Every combination on two bases, sorted both ways."""
    versions = _suffixed("0.5.23") + _suffixed("0.5.24")
    assert sorted(versions, key=release_key) == sorted(versions, key=Version)
    keys = [release_key(v) for v in versions]
    assert len(set(keys)) == len(versions)  # two different releases never compare equal


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("0.5.24rc1", "pre-release"),
        ("0.5.24rc1.dev2", "pre-release"),
        ("0.5.24.dev3", "dev release"),
        ("0.5.24.post1.dev1", "dev release"),
        ("0.5.23+cu130", "local build"),
        ("0.5.24.post1", "release"),
    ],
)
def test_an_installed_version_says_what_kind_of_build_it_is(text: str, kind: str) -> None:
    """Only a final or post release has a model (``final``); the kind names what pip installed."""
    got = read_installed(text)
    assert got.kind == kind
    v = Version(text)
    assert got.final == (str(v) if not (v.is_prerelease or v.local) else None)


def test_a_long_local_build_label_is_read_up_to_the_documented_length() -> None:
    """A local build label can be long ("+cu130.torch2.9..."): the version is read while it fits
    MAX_VERSION_CHARS and refused in one line, cut, past it."""
    head = "0.5.23+"
    fits = head + "a" * (MAX_VERSION_CHARS - len(head))
    assert read_installed(fits).kind == "local build"
    with pytest.raises(FlagError) as info:
        read_installed(fits + "a")
    assert "not a release number" in str(info.value) and fits not in str(info.value)


# ---- which release a rank derives as --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("installed", "relation"),
    [
        ("0.5.24", "newer than modelled"),
        ("0.6.0rc2", "a pre-release newer than modelled"),
        ("0.5.24.dev1", "a dev release newer than modelled"),
        ("0.5.23rc1", "a pre-release the checker does not model"),
        ("0.5.23+cu130", "a local build the checker does not model"),
        ("0.5.2+cu121", "a local build the checker does not model"),
        # Never published (0.5.14 had no post release): not modelled, and not newer either.
        ("0.5.14.post1", "not a release the checker models"),
    ],
)
def test_an_unmodelled_install_is_derived_by_its_own_code_and_says_why(installed: str, relation: str) -> None:
    """docs/sglang-releases.md: an installed release the checker does not model (newer, a pre-release, a
    dev release, a local build) is derived by its own code; the label says how it relates to the modelled
    ones (the phrases of ``ReleaseChoice.why_unmodelled``). A local build of 0.5.23 or 0.5.2 sorts WITH
    that release (PEP 440 orders by the public part): neither newer than modelled nor older than the first
    modelled (so not refused as pool-less)."""
    c = choose_release(None, installed)
    assert (c.own_code, c.engine, c.derived_as, c.installed, c.modelled) == (
        True,
        "sglang",
        installed,
        installed,
        NEWEST_MODELLED,
    )
    assert c.label == f"SGLang {installed}, {relation}: derived by its own code (installed)"


def test_the_engine_asked_for_is_kept_for_an_unmodelled_install() -> None:
    """--engine both on an unmodelled release: its own code, compared with the newest model."""
    c = choose_release(None, "0.5.24", engine="both")
    assert (c.engine, c.own_code) == ("both", True)
    assert f"compared with {NEWEST_MODELLED}'s model" in c.label


def test_best_effort_models_only_a_newer_final_release_and_only_with_the_builtin() -> None:
    """--engine builtin --sglang-best-effort models a NEWER final/post release with the newest rules;
    a newer pre-release, or the same flag under --engine both, still runs the release's own code."""
    c = choose_release(None, "0.5.24.post1", best_effort=True)
    assert (c.best_effort, c.own_code, c.derived_as, c.engine) == (True, False, "0.5.24.post1", "builtin")
    assert c.installed == "0.5.24.post1"  # the report still names what is installed
    assert (
        c.label
        == f"SGLang 0.5.24.post1 (modelled as {NEWEST_MODELLED}, the newest modelled release) (installed)"
    )
    assert choose_release(None, "0.6.0rc1", best_effort=True).own_code
    assert choose_release(None, "0.5.24", engine="both", best_effort=True).own_code


def test_sglang_version_of_a_newer_release_with_best_effort() -> None:
    """--sglang-version 0.5.24 --sglang-best-effort: derived as 0.5.24 with the newest rules, whether or
    not 0.5.24 is installed; without best effort and installed, its own code; not installed: refused."""
    for installed in (None, "0.5.24"):
        c = choose_release("0.5.24", installed, best_effort=True)
        assert (c.derived_as, c.best_effort, c.own_code, c.source) == (
            "0.5.24",
            True,
            False,
            "--sglang-version",
        )
        assert c.modelled == NEWEST_MODELLED and c.installed == installed
    own = choose_release("0.5.24", "0.5.24")
    assert (own.own_code, own.source, own.modelled) == (True, "--sglang-version", NEWEST_MODELLED)
    with pytest.raises(FlagError, match="pass --sglang-version 0.5.23 or --sglang-best-effort"):
        choose_release("0.5.24", None)


def test_engine_sglang_needs_the_installed_release_itself() -> None:
    """--engine sglang runs the installed code: a pre-release installed is not the final release asked
    for; the same release asked for under --engine both is accepted (the engine stays both)."""
    with pytest.raises(FlagError, match="runs the installed SGLang 0.5.23rc1's own code"):
        choose_release("0.5.23", "0.5.23rc1", engine="sglang")
    c = choose_release("0.5.16", "0.5.16", engine="sglang")
    assert (c.derived_as, c.engine, c.own_code) == ("0.5.16", "sglang", False)
    with pytest.raises(FlagError, match="--engine 'turbo' is not one of builtin, sglang, both"):
        choose_release(None, None, engine="turbo")


def test_a_release_older_than_the_first_is_refused_naming_the_range() -> None:
    """0.5.1.post3 and a pre-release of 0.5.2 precede the first state pool (0.5.2)."""
    for installed in ("0.5.1.post3", "0.5.2rc1"):
        with pytest.raises(FlagError) as info:
            choose_release(None, installed)
        assert str(info.value) == (
            f"the installed SGLang {installed} is older than the first modelled release 0.5.2: it has no "
            "mamba state pool at all; modelled releases: 0.5.2 to 0.5.23"
        )
    with pytest.raises(FlagError, match=r"older than the first modelled release 0\.5\.2: it has no mamba"):
        release_model("0.5.1")


def test_an_empty_sglang_version_says_what_to_give_or_to_leave_it_out() -> None:
    with pytest.raises(FlagError) as info:
        choose_release(" ", "0.5.16")
    assert str(info.value) == (
        f"--sglang-version is empty; give a release like {NEWEST_MODELLED}, or leave the flag out to derive "
        "as the installed release"
    )


def test_a_modelled_install_is_its_own_model_with_every_engine() -> None:
    for engine in ("builtin", "sglang", "both"):
        c = choose_release(None, "0.5.17", engine=engine)
        assert (c.derived_as, c.engine, c.own_code, c.best_effort) == ("0.5.17", engine, False, False)
        assert c.label == "SGLang 0.5.17 (installed)"


def test_the_sweep_refuses_an_unmodelled_install_naming_what_it_is() -> None:
    with pytest.raises(FlagError) as info:
        choose_release(None, "0.5.23rc1", own_code=False)
    assert "0.5.23rc1 is a pre-release the checker does not model" in str(info.value)
    assert str(info.value).endswith("derive and check run that release's own code")


def test_an_engine_asked_for_without_sglang_installed_is_kept_for_the_engine_to_refuse() -> None:
    """Nothing installed: the newest model, but --engine sglang/both is not quietly turned into the
    builtin (the engine step then says SGLang is not installed)."""
    for engine in ("sglang", "both"):
        c = choose_release(None, None, engine=engine)
        assert (c.derived_as, c.source, c.engine) == (
            NEWEST_MODELLED,
            "newest modelled; SGLang not installed",
            engine,
        )


# ---- the installed package's metadata --------------------------------------------------------------------


def _dist(site: Path, name: str, version: str | None, folder: str) -> None:
    info = site / folder
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}"] + (
        [f"Version: {version}"] if version is not None else []
    )
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_the_installed_version_is_found_by_its_normalised_name(tmp_path: Path) -> None:
    """pip normalises distribution names (PEP 503: case, runs of - _ .): "SGLang" is sglang; other
    packages (sglang-router, a name that merely starts with sglang) are not."""
    _dist(tmp_path, "sglang_router", "0.3.0", "sglang_router-0.3.0.dist-info")
    _dist(tmp_path, "sglangx", "9.9.9", "sglangx-9.9.9.dist-info")
    assert installed_sglang_version([str(tmp_path)]) is None
    _dist(tmp_path, "SGLang", "0.5.16", "SGLang-0.5.16.dist-info")
    assert installed_sglang_version([str(tmp_path)]) == "0.5.16"


@pytest.mark.parametrize(("version", "shown"), [(None, "(None)"), ("  ", "('')")])
def test_an_installed_package_without_a_version_is_one_line(
    tmp_path: Path, version: str | None, shown: str
) -> None:
    """A one-line error (errors.py): what was read, the rule, the way out."""
    _dist(tmp_path, "sglang", version, "sglang-0.dist-info")
    with pytest.raises(FlagError) as info:
        installed_sglang_version([str(tmp_path)])
    msg = str(info.value)
    assert msg.startswith(f"the installed SGLang's package metadata has no version {shown}")
    assert msg.endswith("reinstall it, or pass --sglang-version X to derive as a release")
    assert "\n" not in msg


def test_damaged_metadata_under_a_path_names_the_path_and_the_error(tmp_path: Path) -> None:
    """Another environment's site-packages with a METADATA that is not UTF-8: one line naming where and
    what failed, not a traceback."""
    info = tmp_path / "sglang-0.5.16.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: sgl\xffang\nVersion: 0.5.16\n")
    with pytest.raises(FlagError) as exc:
        installed_sglang_version([str(tmp_path), "/nonexistent"])
    assert str(exc.value).startswith(
        f"an SGLang package metadata under {tmp_path}, /nonexistent cannot be read (UnicodeDecodeError: "
    )
    # The decoder's own words (quoted cut, errors.shorten): what it could not decode, and why.
    assert "codec can't decode" in str(exc.value) and "invalid start byte" in str(exc.value)


def test_an_installed_version_that_is_no_release_number_shows_it_and_the_way_out() -> None:
    with pytest.raises(FlagError) as info:
        read_installed("garbage")
    msg = str(info.value)
    assert msg.startswith("the installed SGLang reports version 'garbage' (its dist-info METADATA)")
    assert msg.endswith(f"pass --sglang-version {NEWEST_MODELLED} to derive as a modelled one")


# ---- the smallest budget for a running-request target ---------------------------------------------------


def _inputs(**kw: Any) -> CapacityInputs:
    """The upstream unit test's setting (spec section 9: kimi-k3, r 0.5, P 8, 3 slots per request), on
    nodes exporting SGLANG_ENABLE_PP_SPEC=1 (SGLang 0.5.21+ start speculative decoding under PP only then)."""
    base: dict[str, Any] = dict(
        geometry=KIMI,
        budget_gib=8.0,
        pp_size=8,
        mamba_full_memory_ratio=0.5,
        mamba_radix_cache_strategy="no_buffer",
        disable_overlap_schedule=True,
        pp_spec_env=True,
    )
    base.update(kw)
    return CapacityInputs(**base)


def _at(inputs: CapacityInputs, h: int) -> list[Any] | str:
    """What derive prints at the budget a user types as the decimal h / 100 GiB: the stages, or the error."""
    try:
        return derive_all(replace(inputs, budget_gib=float(f"{h // 100}.{h % 100:02d}")))
    except BudgetError as exc:
        return str(exc)


@pytest.mark.parametrize(
    ("kw", "target", "policy"),
    [
        ({}, 24, "max-share"),  # auto-fit, branch C
        ({"policy": "whole-model"}, 6, "whole-model"),
        ({"sglang_version": "0.5.16"}, 6, "whole-model"),  # the release's own policy when none is given
        ({"dp_size": 2, "max_running_requests": 40}, 12, "max-share"),
        ({"max_running_requests": 16, "speculative_num_draft_tokens": 2}, 16, "max-share"),
        ({"max_mamba_cache_size": 120}, 40, "max-share"),  # branch A: a fixed pool must fit
        ({"disable_radix_cache": True, "max_running_requests": 30}, 30, "max-share"),  # branch B
        ({"sglang_version": "0.5.8", "max_running_requests": 20}, 5, "whole-model"),
    ],
)
def test_min_budget_is_where_derive_first_reaches_the_target(
    kw: dict[str, Any], target: int, policy: str
) -> None:
    """The answer is a boundary of what ``derive`` itself prints: at the budget every stage reaches the
    target, 0.01 GiB less some stage misses it or does not boot, and the stages (and the refusal below)
    are exactly derive's there. The policy is the one asked for, else the release's own (whole-model up
    to 0.5.16, max-share from 0.5.17)."""
    inputs = _inputs(**kw)
    got = min_budget(inputs, target)
    h = got.budget_hundredths
    assert got.policy == policy and got.target == target
    at = _at(inputs, h)
    assert not isinstance(at, str) and all(s.max_running_requests >= target for s in at)
    assert got.stages == at
    below = _at(inputs, h - 1)
    if isinstance(below, str):
        assert got.below is None and got.below_error == below
    else:
        assert any(s.max_running_requests < target for s in below)
        assert got.below == below and got.below_error is None


def test_a_target_met_at_the_smallest_budget_has_nothing_below() -> None:
    """A tiny model meets one running request at 0.01 GiB; 0 GiB is not a budget (what the report says)."""
    g = ModelGeometry(
        name="tiny",
        num_hidden_layers=2,
        linear_layer_ids=(0,),
        conv_shapes=((4, 1),),
        temporal_shape=(1, 4, 4),
        context_len=4096,
        # 32 KV bytes a token on layer 1: about 170,000 tokens at 0.01 GiB, far above one request's need.
        attention=AttentionGeometry(full_attention_layer_ids=(1,), num_kv_heads=1, head_dim=8, v_head_dim=8),
    )
    got = min_budget(CapacityInputs(geometry=g, budget_gib=1.0), 1)
    assert (got.budget_hundredths, got.below, got.below_error) == (1, None, "0 GiB is not a budget")


def test_a_target_met_at_0_02_gib_derives_at_0_01_gib_below() -> None:
    """One linear layer of 3,000,008 state bytes, radix cache off (1 slot a request, auto-fit C): at 0.01
    GiB B = 0.01 * 0.9 / 1.9 * 2**30 = 5,086,191 bytes leaves no slot beside the padding one (refused);
    at 0.02 GiB B = 10,172,382 gives K = int((B - 3,000,008) // 3,000,008) = 2 (spec section 6C)."""
    g = ModelGeometry(
        name="one-layer",
        num_hidden_layers=1,
        linear_layer_ids=(0,),
        conv_shapes=((4, 1),),
        temporal_shape=(1, 1000, 750),
        context_len=4096,
        # The layer holds a KV cache too (as a Falcon-H1 layer does), 32 bytes a token: never binding here.
        attention=AttentionGeometry(full_attention_layer_ids=(0,), num_kv_heads=1, head_dim=8, v_head_dim=8),
    )
    inputs = CapacityInputs(geometry=g, budget_gib=1.0, disable_radix_cache=True)
    got = min_budget(inputs, 1)
    assert [s.max_mamba_cache_size for s in got.stages] == [2] and got.budget_hundredths == 2
    below = _at(inputs, 1)
    assert isinstance(below, str) and (got.below, got.below_error) == (None, below)


@pytest.mark.parametrize("target", [0, -3, True, 2.0, "3"])
def test_a_target_that_is_no_positive_integer_is_refused(target: Any) -> None:
    with pytest.raises(
        BudgetError, match=f"--target-max-running-requests {target} must be a positive integer"
    ):
        min_budget(_inputs(), target)


@pytest.mark.parametrize(
    ("kw", "cap", "reason"),
    [
        # spec section 7: max(1, max_running_requests // dp) per dp worker.
        ({"max_running_requests": 100, "dp_size": 2}, 50, "--max-running-requests 100 (// --dp-size 2)"),
        ({"max_running_requests": 40}, 40, "--max-running-requests 40"),
        # estimate = clamp(int(T / context_len * 512), 2048, 4096): 8000 / 2000 * 512 = 2048 < T // 2.
        (
            {"token_capacity": 8000, "context_len": 2000},
            2048,
            "SGLang's running-request estimate clamp(int(T / context_len * 512), 2048, 4096) = 2048 from "
            "a KV pool of at most 8,000 tokens (--token-capacity 8000) and context length 2000 (set "
            "--max-running-requests to allow more)",
        ),
        # T // 2 = 500 below the estimate (1000 / 100 * 512 -> 4096).
        (
            {"token_capacity": 1000, "context_len": 100},
            500,
            "a KV pool of at most 1,000 tokens (--token-capacity 1000), which allows at most T // 2 = 500",
        ),
        # --max-total-tokens caps every stage's pool whatever the budget: T // 2 = 500 again.
        (
            {"max_total_tokens": 1000},
            500,
            "a KV pool of at most 1,000 tokens (--max-total-tokens 1000), which allows at most T // 2 = 500",
        ),
        # A tie (estimate 2048 = T // 2) names the later term.
        (
            {"token_capacity": 4096, "context_len": 1024},
            2048,
            "a KV pool of at most 4,096 tokens (--token-capacity 4096), which allows at most T // 2 = 2048",
        ),
        # spec 6A: K = max_mamba_cache_size // dp = 50 slots at 3 slots per request: 16 requests.
        (
            {"max_mamba_cache_size": 100, "dp_size": 2},
            16,
            "--max-mamba-cache-size 100 (branch A: a fixed pool of 50 slots at 3 slots per request)",
        ),
        # 0.5.8 (explicit-or-fit) honours --max-mamba-cache-size too: (mmcs or mrr or 512) // dp.
        (
            {"max_mamba_cache_size": 100, "sglang_version": "0.5.8"},
            33,
            "--max-mamba-cache-size 100 (branch A: a fixed pool of 100 slots at 3 slots per request)",
        ),
        (
            {"disable_radix_cache": True, "max_running_requests": 30},
            30,
            "--max-running-requests 30 with --disable-radix-cache "
            "(branch B: the pool is sized from it, not the budget)",
        ),
    ],
)
def test_a_cap_no_budget_lifts_is_named_with_its_value(kw: dict[str, Any], cap: int, reason: str) -> None:
    """One over the cap is refused naming the cap's value and the input that sets it; the cap itself is
    reachable (so the named cap is the one that binds)."""
    inputs = _inputs(**kw)
    with pytest.raises(BudgetError) as info:
        min_budget(inputs, cap + 1)
    msg = str(info.value)
    assert msg.startswith(
        f"no budget reaches --target-max-running-requests {cap + 1}: "
        f"max_running_requests is capped at {cap} by "
    )
    assert msg.endswith(f" by {reason}; lower the target or lift that cap")
    assert min_budget(inputs, cap).stages


def test_default_estimate_tops_out_at_4096() -> None:
    """Without --token-capacity or --max-total-tokens the KV pool grows with the budget: the estimate's
    ceiling, 4096, is the cap no budget lifts."""
    with pytest.raises(BudgetError) as info:
        min_budget(_inputs(), 4097)
    assert (
        "capped at 4096 by SGLang's default running-request estimate, which tops out at 4096 "
        "(set --max-running-requests to allow more); lower the target" in str(info.value)
    )


def test_a_release_that_ignores_max_mamba_cache_size_grows_the_pool_with_the_budget() -> None:
    """0.5.3.post2-0.5.6.post2 (``ratio``): with the radix cache on an explicit --max-mamba-cache-size is
    ignored and the pool auto-fits, so a target above mmcs // 3 is reachable by a larger budget."""
    inputs = CapacityInputs(
        geometry=QWEN, budget_gib=8.0, pp_size=1, sglang_version="0.5.6.post2", max_mamba_cache_size=30
    )
    got = min_budget(inputs, 40)
    assert min(s.max_running_requests for s in got.stages) >= 40


def test_a_target_no_searched_budget_reaches_says_so() -> None:
    """0.5.2 (``fixed``): K = --max-mamba-cache-size whatever the budget, 1 slot a request: 31 requests
    are out of reach however far the search goes (far beyond any device)."""
    inputs = CapacityInputs(geometry=QWEN, budget_gib=8.0, sglang_version="0.5.2", max_mamba_cache_size=30)
    assert min_budget(inputs, 30).stages
    with pytest.raises(BudgetError) as info:
        min_budget(inputs, 31)
    msg = str(info.value)
    m = re.match(
        r"no budget up to (\S+) GiB reaches --target-max-running-requests 31 under --policy whole-model", msg
    )
    assert m is not None and float(m.group(1).replace(",", "")) > 1e9, msg
    # The way out names why: the budget does not size this pool, the flag does.
    assert msg.endswith(
        ": max_running_requests is 30 there and at half of it alike; SGLang 0.5.2 sizes the state pool "
        "from --max-mamba-cache-size or --max-running-requests (512 when neither is given) here, not from "
        "the budget; raise that flag or lower the target"
    ), msg


# ---- the --mem-fraction-static that reaches a budget ----------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize(
    ("free", "weights", "f"), [(80.0, 20.0, 0.85), (80.0, 20.0, 0.9), (100.0, 0.0, 0.001), (40.0, 39.0, 1.0)]
)
def test_the_fraction_that_gives_a_budget_is_found_again(
    version: str, free: float, weights: float, f: float
) -> None:
    """Round trip through the release's own budget formula: the budget --mem-fraction-static f leaves is
    reached first at f itself (the formula grows with f), and the formula printed is the one at f."""
    budget = sizing_budget(version, free_before_gib=free, weights_gib=weights, mem_fraction_static=f)
    got = min_mem_fraction(version, free_before_gib=free, weights_gib=weights, budget_gib=budget.budget_gib)
    assert (got.value, got.formula, got.budget_gib) == (f, budget.formula, budget.budget_gib)


def test_no_fraction_reaches_a_budget_beyond_what_1_0_leaves() -> None:
    top = sizing_budget("0.5.23", free_before_gib=80.0, weights_gib=20.0, mem_fraction_static=1.0).budget_gib
    got = min_mem_fraction("0.5.23", free_before_gib=80.0, weights_gib=20.0, budget_gib=top + 0.01)
    assert got.value is None and got.budget_gib == top + 0.01
    assert got.formula == f"even 1.0 leaves {top:.2f} GiB (60.00 GiB free after the weights)"
    none = min_mem_fraction("0.5.23", free_before_gib=10.0, weights_gib=12.0, budget_gib=1.0)
    assert (
        none.value is None and none.formula == "even 1.0 leaves 0.00 GiB (-2.00 GiB free after the weights)"
    )


# ---- partition bounds -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slack", "lower", "upper"),
    # L = 10, P = 3: SGLang's even split is [3, 3, 4] (the last stages get the extra layers).
    [(0, 3, 4), (1, 2, 5), (2, 1, 6), (3, 1, 7), (6, 1, 10), (9, 1, 10)],
)
def test_partition_bounds_surround_the_even_split(slack: int, lower: int, upper: int) -> None:
    """floor(L/P) - slack to ceil(L/P) + slack, never an empty stage, never more than L layers."""
    b = partition_bounds(10, 3, slack)
    assert (b.lower, b.upper) == (lower, upper)


@pytest.mark.parametrize("slack", [-1, True, 1.0])
def test_partition_slack_must_be_a_non_negative_integer(slack: Any) -> None:
    with pytest.raises(LayoutError, match=f"--partition-slack {slack} must be an integer >= 0"):
        partition_bounds(10, 3, slack)


# ---- can the release load the model ---------------------------------------------------------------------


def test_the_architectures_sglang_looks_up() -> None:
    """A preset's (the default preset when none is named), an HF config's list (strings only); none for a
    JSON model spec or a config whose ``architectures`` is not a list."""
    assert model_architectures(model=None, model_config=None) == ("KimiK3ForConditionalGeneration",)
    assert model_architectures(model="kimi-k3", model_config=None) == ("KimiK3ForConditionalGeneration",)
    qwen = FIXTURES / "qwen3_next_80b_a3b.json"
    assert model_architectures(model=None, model_config=str(qwen)) == tuple(
        json.loads(qwen.read_text())["architectures"]
    )
    assert model_architectures(model=None, model_config=str(FIXTURES / "kimi_k3_shape_spec.json")) == ()


def test_a_config_architectures_entry_that_is_no_name_is_skipped(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "qwen3_next_80b_a3b.json").read_text())
    data["architectures"] = [7, "Qwen3NextForCausalLM"]
    (tmp_path / "a.json").write_text(json.dumps(data))
    assert model_architectures(model=None, model_config=str(tmp_path / "a.json")) == ("Qwen3NextForCausalLM",)
    data["architectures"] = "Qwen3NextForCausalLM"
    (tmp_path / "b.json").write_text(json.dumps(data))
    assert model_architectures(model=None, model_config=str(tmp_path / "b.json")) == ()


def test_an_architecture_a_later_release_dropped_names_the_releases_that_had_it() -> None:
    """VILA is registered by 0.5.2 to 0.5.4 only (model_registry.py, read from the wheels)."""
    check_architectures("0.5.4", ["VILAForConditionalGeneration"], model="vila", env={})
    with pytest.raises(FlagError) as info:
        check_architectures("0.5.23", ["VILAForConditionalGeneration"], model="vila", env={})
    msg = str(info.value)
    assert msg.startswith(
        "SGLang 0.5.23 cannot load vila: its model registry (sglang/srt/models) has no class"
    )
    assert "VILAForConditionalGeneration; SGLang 0.5.2 to 0.5.4 register it." in msg
    # An upgrade does not bring a dropped class back (the message said "upgrade it" before).
    assert msg.endswith("cannot serve the model as the deployment does: run a release that registers it")


def test_a_model_spec_is_not_checked_even_if_it_lists_architectures(tmp_path: Path) -> None:
    """A JSON model spec (``linear_layer_ids``) describes shapes, not a model class SGLang would load."""
    spec = json.loads((FIXTURES / "kimi_k3_shape_spec.json").read_text())
    spec["architectures"] = ["NoSuchArch"]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert model_architectures(model=None, model_config=str(tmp_path / "spec.json")) == ()


def test_the_first_architecture_that_is_a_name_is_the_one_named() -> None:
    """The registry takes the first of the config's architectures it has; when it has none, the message
    names the first real name, and an arrival later than the release asks for an upgrade."""
    with pytest.raises(FlagError, match="deployment does: upgrade it$"):
        check_architectures("0.5.16", ["KimiK3ForConditionalGeneration"], model="m", env={})
    with pytest.raises(
        FlagError, match="has no class for KimiK3ForConditionalGeneration; it arrived in SGLang 0.5.17"
    ):
        check_architectures("0.5.16", ["", "KimiK3ForConditionalGeneration", "NoSuchArch"], model="m", env={})


def test_an_external_package_counts_only_where_sglang_reads_it() -> None:
    """SGLANG_EXTERNAL_MODEL_PACKAGE exists from 0.5.6 (model_registry.EXTERNAL_PACKAGE): before it, the
    variable does nothing and the registry alone decides; from it, the check is skipped."""
    env = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "my_models"}
    check_architectures("0.5.6", ["KimiK3ForConditionalGeneration"], model="m", env=env)
    with pytest.raises(FlagError, match="it arrived in SGLang 0.5.17"):
        check_architectures("0.5.5.post3", ["KimiK3ForConditionalGeneration"], model="m", env=env)
    with pytest.raises(FlagError):
        check_architectures(
            "0.5.6", ["KimiK3ForConditionalGeneration"], model="m", env={"SGLANG_EXTERNAL_MODEL_PACKAGE": ""}
        )


def test_a_release_the_table_does_not_cover_is_not_checked() -> None:
    """An unmodelled release derives by its own code, which loads (or refuses) the model itself."""
    assert "0.5.24" not in MODELLED_RELEASES
    check_architectures("0.5.24", ["NoSuchArch"], model="m", env={})


def test_zero_gib_is_never_a_budget() -> None:
    """``meets`` is shared with the installed-SGLang search, which walks budgets down: 0 GiB (and below)
    is not a budget whatever the derivation would say, so the derivation is not even asked."""

    def derive_at(h: int) -> list[Any]:
        raise AssertionError(f"derived at {h}")

    assert not meets(derive_at, 0, 1)
    assert not meets(derive_at, -5, 1)


def test_an_explicit_policy_overrides_the_inputs_one() -> None:
    """plan --policy P: the search derives under P, whatever the inputs carried."""
    inputs = _inputs(policy="max-share")
    got = min_budget(inputs, 6, policy="whole-model")
    assert got.policy == "whole-model"
    assert got.stages == derive_all(replace(inputs, policy="whole-model", budget_gib=got.budget_gib))


def test_a_span_of_the_registry_includes_both_ends() -> None:
    """model_registry.py spans are inclusive: VILA from 0.5.2 to 0.5.4, Kimi-K3 from 0.5.17 on, an
    external package read from 0.5.6 to 0.5.23."""
    assert registers("0.5.2", "VILAForConditionalGeneration") and registers(
        "0.5.4", "VILAForConditionalGeneration"
    )
    assert not registers("0.5.4.post1", "VILAForConditionalGeneration")
    assert registers("0.5.17", "KimiK3ForConditionalGeneration") and registers(
        "0.5.23", "KimiK3ForConditionalGeneration"
    )
    env = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "my_models"}
    check_architectures("0.5.23", ["NoSuchArch"], model="m", env=env)


@pytest.mark.parametrize("radix_off", [False, True])
def test_the_estimate_is_named_where_the_release_caps_the_users_count_by_it(radix_off: bool) -> None:
    """0.5.10-0.5.13.post1 (``_resolve_max_num_reqs``: ``min(mrr // dp, estimate)``, see
    docs/sglang-releases.md) cap even a user's --max-running-requests by the estimate, here
    8000 / 2000 * 512 = 2048: the bound that binds is the estimate, not the flag (nor branch B's pool of
    3000 slots), and the message says so (it named --max-running-requests 3000 as the cap before)."""
    inputs = _inputs(
        sglang_version="0.5.13",
        max_running_requests=3000,
        token_capacity=8000,
        context_len=2000,
        disable_radix_cache=radix_off,
    )
    with pytest.raises(BudgetError) as info:
        min_budget(inputs, 2049)
    msg = str(info.value)
    assert "capped at 2048 by SGLang's running-request estimate" in msg
    assert "(SGLang 0.5.13 caps --max-running-requests 3000 by it)" in msg and "branch B" not in msg
    assert min_budget(inputs, 2048).stages


def test_a_stage_below_the_lower_bound_is_never_used_even_where_it_would_help() -> None:
    """L 9, P 3, slack 1: stages of 2 to 4 layers. Linear layers 3, 4 and 5 could each get a stage only
    with a 1-layer middle stage (4, 1, 4), which the bounds forbid; so the least busiest count is 2, and of
    the partitions reaching it, 2 from the even split (3, 3, 3), the smallest is (2, 3, 4): layers
    [0, 2) hold none, [2, 5) hold 3 and 4, [5, 9) hold 5. Worked by hand from the documented objective."""
    got = suggest_partition(num_hidden_layers=9, linear_layer_ids=(3, 4, 5), pp_size=3, slack=1)
    assert (got.partition, got.largest_stage_linear_layers, got.stage_linear_layers) == (
        (2, 3, 4),
        2,
        [0, 2, 1],
    )
    assert (got.default_partition, got.default_largest_stage_linear_layers) == ((3, 3, 3), 3)
    assert got.default_stage_linear_layers == [0, 3, 0]
    assert (got.bounds.lower, got.bounds.upper, got.env) == (2, 4, "2,3,4")
