"""Which SGLang releases the builtin model covers, and the sizing rules of each (torch-free).

Every rule below was read from the released wheels (``pip download --no-deps sglang==X``); the file and
function per release, the diffs between releases and how the groups were found are in
``docs/sglang-releases.md``. A group is a run of consecutive releases whose state-pool sizing, running
request cap, slots per request, startup refusals and budget formula read the same; a release belongs
to exactly one group.

The checker never imports SGLang to learn its version: :func:`installed_sglang_version` reads the
package metadata only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

from checker.core.errors import CheckerInputError, FlagError, shorten
from checker.core.releases.pp_support import PIPELINE

FIRST_WITH_STATE_POOL = "0.5.2"
"""The first release that sizes a mamba state pool at all (``max_mamba_cache_size``: the user's
--max-running-requests or 512, model_runner.py ``ModelRunner.__init__``)."""
UNMODELLED_RELEASES: tuple[str, ...] = ()
"""Published releases with a state pool whose rules the builtin model does not implement: none since
0.5.7 to 0.5.12.post1 were modelled (docs/sglang-releases.md). Kept so callers can still ask."""

CHARGING = ("whole-model", "max-share")
POOL_RULES = ("fixed", "ratio", "explicit-or-fit", "branches")
SPEC_RESERVES = ("none", "auto-fit-raw", "up-front", "joint")
REQUEST_CAPS = ("tp-worker", "estimate", "half-tokens")
RADIX_RULES = ("forced-off", "fixed-ratio", "scheduler-v1", "scheduler-spec", "scheduler", "strategies")
BUDGET_RULES = ("slack", "slack+pre-capture", "slack+pre-capture+mm")


@dataclass(frozen=True, kw_only=True)
class ReleaseRules:
    """The rules one group of releases sizes the state pool with. Field docs name what changed."""

    group: str
    """The group's release range, e.g. "0.5.17-0.5.21"."""
    sizing_function: str
    """Where the group's pool sizing lives (file and function, as in the wheel)."""
    charging: str
    """``whole-model``: every stage charged ``mamba_cache_per_req`` for all linear layers (up to 0.5.16);
    ``max-share``: ``int(per_req * max_stage_mamba_layers / total)`` (``pp_layer_scale``, 0.5.17+)."""
    padding_slot: bool
    """0.5.17+: the pool's padding slot is charged: auto-fit K = int((B - per_slot) // per_slot), the
    state charged is (K + 1) slots, the spec reservation covers (capped + 1) requests. Before: K =
    int(B // per_req), K slots charged, capped requests reserved."""
    floor_requests: bool
    """0.5.23: ``max(1, max_running_requests // dp)`` in ``resolve_max_num_reqs``, the no-radix branch
    and the spec-decoding cap. Before: a plain ``//`` that can reach 0 (and then refuses to start)."""
    extra_per_slot: bool
    """0.5.22+: ``extra_mamba_cache_bytes_per_req`` (scaled like per_req) is charged per slot. Before,
    no per-slot extra state exists outside the ReplaySSM ring, whose charge (per slot or per request, by
    release and model kind) is :mod:`checker.core.sizing.replay`'s."""
    skip_decode_lock: bool
    """0.5.17+: SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK lowers the base slots per request from 3 to 2."""
    lazy_with_spec: bool
    """0.5.17+: extra_buffer_lazy is accepted with speculative decoding; before it is refused at
    startup ("extra_buffer_lazy unsupported with spec.")."""
    budget_rule: str
    """How ``total_rest_memory`` is computed before it reaches the sizing (``checker.core.sizing.budget``):
    ``slack`` (0.5.14-0.5.15.post1), ``slack+pre-capture`` (0.5.16-0.5.17: the slack is raised to the
    pre-capture activation reserve when the KV pool is sized after graph capture),
    ``slack+pre-capture+mm`` (0.5.18+: a multimodal runtime reservation is also taken off)."""
    pool_rule: str = "branches"
    """How K is chosen. ``fixed`` (0.5.2-0.5.3.post1, model_runner.py ``ModelRunner.__init__``): K =
    (--max-mamba-cache-size or --max-running-requests or 512) // dp whatever the budget, K * per_req taken
    off, no spec-decoding charge. ``ratio`` (0.5.3.post2-0.5.6.post2, model_runner.py
    ``handle_max_mamba_cache``): radix cache off -> the same fixed K; on -> auto-fit
    ``int(B // per_req // (1 + D)) // dp`` (an explicit --max-mamba-cache-size is ignored), K * per_req *
    (1 + D) taken off. ``explicit-or-fit`` (0.5.7-0.5.8.post1, model_runner_kv_cache_mixin.py
    ``handle_max_mamba_cache``): radix cache off or --max-mamba-cache-size set -> (mmcs or mrr or 512) //
    dp; else auto-fit ``int(B // per_req)`` with no // dp. ``branches`` (0.5.9+): A (mmcs // dp), B (radix
    off and mrr: mrr // dp), C (auto-fit); radix off without mrr falls to C."""
    spec_reserve: str = "joint"
    """How the spec-decoding intermediate state is charged in ``handle_max_mamba_cache``. ``none``: not
    separately (up to 0.5.6.post2 the ``ratio`` pool folds it into (1 + D) per slot; ``fixed`` has none).
    ``auto-fit-raw`` (0.5.7): ``per_req * --max-running-requests * D`` (not divided by dp) off the budget,
    in the auto-fit branch only. ``up-front`` (0.5.8-0.5.12.post1): ``per_req * (mrr // dp) * D`` off the
    budget before any branch. ``joint`` (0.5.13+): branch-specific, auto-fit solved jointly."""
    request_cap: str = "half-tokens"
    """How max_running_requests is capped before ``K // ratio``. ``tp-worker`` (up to 0.5.6.post2:
    managers/tp_worker.py ``TpModelWorker.__init__`` over model_runner.py ``init_memory_pool``):
    ``min(mrr // dp if mrr else T // 2, min(mrr or estimate, K // ratio))`` - a user value is not capped
    by T // 2. ``estimate`` (0.5.13: ``_resolve_max_num_reqs``): ``min(mrr // dp, estimate)``, else
    ``min(estimate, T // 2)``. ``half-tokens`` (0.5.14+): ``min(mrr // dp or estimate, T // 2)``."""
    radix_rule: str = "strategies"
    """``forced-off`` (0.5.2-0.5.3.post1: every model the release gives a pool disables the radix cache in
    ``ModelRunner.__init__``, 1 slot a request); ``fixed-ratio`` (0.5.3.post2-0.5.6.post2: no strategy
    flag, ``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`` = 3 slots with the radix cache, 1 without);
    ``scheduler-v1`` (0.5.7: model_runner_kv_cache_mixin.py ``init_memory_pool``: radix on -> 3 +
    (1 if extra_buffer with spec decoding else 2), no_buffer included); ``scheduler-spec`` (0.5.8-0.5.9:
    3 + (extra_buffer: 1 with spec decoding, else 2; no_buffer 0)); ``scheduler`` (0.5.10-0.5.13.post1:
    ``_calculate_mamba_ratio``, 3 + (extra_buffer: 2 with overlap, else 1; 0.5.13 lazy: 1)); all three
    resolve ``auto`` to no_buffer (server_args.py ``__post_init__``: ``if self.mamba_scheduler_strategy ==
    "auto": ... = "no_buffer"``) and turn overlap off for no_buffer instead of refusing it. ``strategies``
    (0.5.14+: auto by overlap / page size, ``_calculate_mamba_ratio``, no_buffer asserts)."""
    has_lazy: bool = True
    """Whether extra_buffer_lazy exists (server_args.py strategy choices): from 0.5.13."""
    pool_by_family: bool = False
    """Whether the release gives a state pool only to the families its model runner lists (each
    family's ``FamilyFacts.pool``, :mod:`checker.core.releases.family_facts`): 0.5.2-0.5.6.post2
    (model_runner.py ``is_hybrid_gdn``'s architectures in 0.5.2-0.5.3, then ``mambaish_config``'s config
    classes); from 0.5.7 every hybrid family the checker reads."""
    dp_split_by_family: bool = False
    """Whether the release divides the pool by dp only for the families it lists (``FamilyFacts.dp_split``):
    0.5.3.post1-0.5.6.post2 (0.5.3.post1 ``ModelRunner.__init__`` :369-377, then ``handle_max_mamba_cache``:
    ``if self.hybrid_gdn_config is not None: ... // dp``); 0.5.2-0.5.3 and 0.5.7+ split every pool they
    size. Which families a release forces the radix cache off for, or gives no extra_buffer strategy, are
    the families' facts alone (``FamilyFacts.radix_off`` / ``no_extra_buffer``)."""
    pp_hybrid: bool = True
    """Whether any hybrid class the checker reads starts under pipeline parallelism: False up to 0.5.7
    (models/qwen3_next.py and falcon_h1.py assert ``pp_group.is_first_rank and is_last_rank``;
    nemotron_h.py builds and runs every layer on every stage; kimi_linear.py, from 0.5.4.post2, splits its
    layers but its load_weights has no stage filter until 0.5.17), True from 0.5.8 (nemotron_h.py splits
    them). Not typed here: each group's value is read from the table of
    :mod:`checker.core.releases.pp_support` (``_pp_hybrid``), which
    :func:`checker.core.releases.model_support.check_pipeline`
    applies per class; this coarse answer is what a JSON model spec, which names no class, is held to."""
    pp_with_spec: bool = True
    """False up to 0.5.20: server_args.py ``check_server_args`` (0.5.2-0.5.18) and
    arg_groups/validation_hook.py (0.5.19; 0.5.20 on every non-NPU platform) assert ``disable_overlap_schedule
    and speculative_algorithm is None`` under pp > 1 ("Pipeline parallelism is not compatible with overlap
    schedule, speculative decoding"). 0.5.21+ (validation_hook.py ``check_pipeline_parallel_compat``) accept
    EAGLE (non-multi-layer) under PP with SGLANG_ENABLE_PP_SPEC set, or on a prefill node. The refusal
    itself is :func:`checker.core.releases.startup.check_pp_spec` (which reads the release's own ranges)."""
    default_full_memory_ratio: float = 0.9
    """SGLang's --mamba-full-memory-ratio default (server_args.py ``ServerArgs``): 0.2 in 0.5.3.post2."""

    @property
    def policy(self) -> str:
        """The charging policy this release uses (what ``--policy`` defaults to)."""
        return self.charging


# Any: the fields differ in type; ReleaseRules checks each one where the groups are built.
_OLD: dict[str, Any] = dict(
    charging="whole-model",
    padding_slot=False,
    floor_requests=False,
    extra_per_slot=False,
    skip_decode_lock=False,
    budget_rule="slack",
    pp_with_spec=False,
    lazy_with_spec=False,
)
_PRE_SCHEDULER: dict[str, Any] = dict(_OLD, spec_reserve="none", has_lazy=False, request_cap="tp-worker")
_MR = "sglang/srt/model_executor/model_runner.py "
_MIXIN = "sglang/srt/model_executor/model_runner_kv_cache_mixin.py "
_CONFIGURATOR = "sglang/srt/mem_cache/kv_cache_configurator.py KVCacheConfigurator._handle_max_mamba_cache"

_GROUPS: tuple[tuple[tuple[str, ...], ReleaseRules], ...] = (
    (
        ("0.5.2",),
        ReleaseRules(
            group="0.5.2",
            sizing_function=_MR + "ModelRunner.__init__ (hybrid GDN block), profile_max_num_token",
            pool_rule="fixed",
            radix_rule="forced-off",
            pool_by_family=True,
            **_PRE_SCHEDULER,
        ),
    ),
    (
        # model_runner.py:1300-1306 ``is_hybrid_gdn``: architectures[0] in Qwen3NextForCausalLM(MTP),
        # FalconH1ForCausalLM; the block at :357-374 (radix off, the fixed pool, // dp) is the same for both.
        ("0.5.3",),
        ReleaseRules(
            group="0.5.3",
            sizing_function=_MR + "ModelRunner.__init__ (hybrid GDN block), profile_max_num_token",
            pool_rule="fixed",
            radix_rule="forced-off",
            pool_by_family=True,
            **_PRE_SCHEDULER,
        ),
    ),
    (
        # model_runner.py:1314-1330 ``mambaish_config`` = ``mamba2_config`` (FalconH1Config |
        # NemotronHConfig) or ``hybrid_gdn_config`` (Qwen3NextConfig); :358-368 radix off and the fixed pool
        # for all three, :369-377 ``// dp`` for hybrid GDN only.
        ("0.5.3.post1",),
        ReleaseRules(
            group="0.5.3.post1",
            sizing_function=_MR + "ModelRunner.__init__ (mambaish block), profile_max_num_token",
            pool_rule="fixed",
            radix_rule="forced-off",
            pool_by_family=True,
            dp_split_by_family=True,
            **_PRE_SCHEDULER,
        ),
    ),
    (
        ("0.5.3.post2",),
        ReleaseRules(
            group="0.5.3.post2",
            sizing_function=_MR + "ModelRunner.handle_max_mamba_cache",
            pool_rule="ratio",
            radix_rule="fixed-ratio",
            default_full_memory_ratio=0.2,
            pool_by_family=True,
            dp_split_by_family=True,
            **_PRE_SCHEDULER,
        ),
    ),
    (
        ("0.5.3.post3", "0.5.4", "0.5.4.post1"),
        ReleaseRules(
            group="0.5.3.post3-0.5.4.post1",
            sizing_function=_MR + "ModelRunner.handle_max_mamba_cache",
            pool_rule="ratio",
            radix_rule="fixed-ratio",
            pool_by_family=True,
            dp_split_by_family=True,
            **_PRE_SCHEDULER,
        ),
    ),
    (
        (
            "0.5.4.post2",
            "0.5.4.post3",
            "0.5.5",
            "0.5.5.post1",
            "0.5.5.post2",
            "0.5.5.post3",
            "0.5.6",
            "0.5.6.post1",
            "0.5.6.post2",
        ),
        ReleaseRules(
            group="0.5.4.post2-0.5.6.post2",
            sizing_function=_MR + "ModelRunner.handle_max_mamba_cache",
            pool_rule="ratio",
            radix_rule="fixed-ratio",
            pool_by_family=True,
            dp_split_by_family=True,
            **_PRE_SCHEDULER,
        ),
    ),
    (
        ("0.5.7",),
        ReleaseRules(
            group="0.5.7",
            sizing_function=_MIXIN + "ModelRunnerKVCacheMixin.handle_max_mamba_cache",
            pool_rule="explicit-or-fit",
            spec_reserve="auto-fit-raw",
            request_cap="tp-worker",
            radix_rule="scheduler-v1",
            has_lazy=False,
            **_OLD,
        ),
    ),
    (
        ("0.5.8", "0.5.8.post1"),
        ReleaseRules(
            group="0.5.8-0.5.8.post1",
            sizing_function=_MIXIN + "ModelRunnerKVCacheMixin.handle_max_mamba_cache",
            pool_rule="explicit-or-fit",
            spec_reserve="up-front",
            request_cap="tp-worker",
            radix_rule="scheduler-spec",
            has_lazy=False,
            **_OLD,
        ),
    ),
    (
        ("0.5.9",),
        ReleaseRules(
            group="0.5.9",
            sizing_function=_MIXIN + "ModelRunnerKVCacheMixin.handle_max_mamba_cache",
            pool_rule="branches",
            spec_reserve="up-front",
            request_cap="tp-worker",
            radix_rule="scheduler-spec",
            has_lazy=False,
            **_OLD,
        ),
    ),
    (
        ("0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1"),
        ReleaseRules(
            group="0.5.10-0.5.12.post1",
            sizing_function=_MIXIN + "ModelRunnerKVCacheMixin.handle_max_mamba_cache",
            pool_rule="branches",
            spec_reserve="up-front",
            request_cap="estimate",
            radix_rule="scheduler",
            has_lazy=False,
            **_OLD,
        ),
    ),
    (
        ("0.5.13", "0.5.13.post1"),
        ReleaseRules(
            group="0.5.13-0.5.13.post1",
            sizing_function=_MIXIN + "ModelRunnerKVCacheMixin.handle_max_mamba_cache",
            request_cap="estimate",
            radix_rule="scheduler",
            **_OLD,
        ),
    ),
    (
        ("0.5.14", "0.5.15", "0.5.15.post1"),
        ReleaseRules(
            group="0.5.14-0.5.15.post1",
            sizing_function=_MIXIN + "ModelRunnerKVCacheMixin.handle_max_mamba_cache",
            **_OLD,
        ),
    ),
    (
        ("0.5.16",),
        ReleaseRules(
            group="0.5.16",
            sizing_function=_CONFIGURATOR,
            **{**_OLD, "budget_rule": "slack+pre-capture"},
        ),
    ),
    (
        ("0.5.17",),
        ReleaseRules(
            group="0.5.17",
            sizing_function=_CONFIGURATOR,
            charging="max-share",
            padding_slot=True,
            floor_requests=False,
            extra_per_slot=False,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture",
            pp_with_spec=False,
        ),
    ),
    (
        ("0.5.18", "0.5.19", "0.5.20"),
        ReleaseRules(
            group="0.5.18-0.5.20",
            sizing_function=_CONFIGURATOR,
            charging="max-share",
            padding_slot=True,
            floor_requests=False,
            extra_per_slot=False,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture+mm",
            pp_with_spec=False,
        ),
    ),
    (
        ("0.5.21",),
        ReleaseRules(
            group="0.5.21",
            sizing_function=_CONFIGURATOR,
            charging="max-share",
            padding_slot=True,
            floor_requests=False,
            extra_per_slot=False,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture+mm",
        ),
    ),
    (
        ("0.5.22",),
        ReleaseRules(
            group="0.5.22",
            sizing_function=_CONFIGURATOR,
            charging="max-share",
            padding_slot=True,
            floor_requests=False,
            extra_per_slot=True,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture+mm",
        ),
    ),
    (
        ("0.5.23",),
        ReleaseRules(
            group="0.5.23",
            sizing_function=_CONFIGURATOR,
            charging="max-share",
            padding_slot=True,
            floor_requests=True,
            extra_per_slot=True,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture+mm",
        ),
    ),
)


def _pp_hybrid(versions: tuple[str, ...]) -> bool:
    """Whether the group's releases start any hybrid class under PP
    (:mod:`checker.core.releases.pp_support`, built
    from each release's code): one answer for the whole group, or the grouping is wrong."""
    answers = {any(table.get(v, ("",))[0] == "stages" for table in PIPELINE.values()) for v in versions}
    assert len(answers) == 1, f"{versions}: the releases of one group differ in starting a class under PP"
    return answers.pop()


_GROUPS = tuple((versions, replace(rules, pp_hybrid=_pp_hybrid(versions))) for versions, rules in _GROUPS)
_RULES_BY_RELEASE: dict[str, ReleaseRules] = {v: rules for versions, rules in _GROUPS for v in versions}
GROUPS: tuple[ReleaseRules, ...] = tuple(rules for _, rules in _GROUPS)

MODELLED_RELEASES: tuple[str, ...] = tuple(v for versions, _ in _GROUPS for v in versions)
"""Every release the builtin model covers, oldest first (post releases included: PyPI ships them as
separate wheels, and a deployment pins one): THE release table, read from the groups above, so a release
is added in one place, its group. Everything else that lists releases derives from it (the engine's
SUPPORTED_VERSIONS, scripts/sglang_envs.py's environments, every generated table:
``python3 scripts/regenerate.py``)."""
FIRST_MODELLED = MODELLED_RELEASES[0]
NEWEST_MODELLED = MODELLED_RELEASES[-1]


@dataclass(frozen=True, kw_only=True)
class ReleaseModel:
    """The release a derivation follows and that release's rules."""

    version: str
    """The modelled release whose rules apply (the newest modelled one under best effort)."""
    rules: ReleaseRules
    requested: str | None = None
    """The version asked for, when it differs from ``version`` (a newer, unmodelled release)."""
    best_effort: bool = False
    """True when ``requested`` is newer than every modelled release and its newest rules stand in."""

    @property
    def label(self) -> str:
        if self.best_effort:
            return f"SGLang {self.requested} (modelled as {self.version}, the newest modelled release)"
        return f"SGLang {self.version}"


# A release number as the checker reads one from --sglang-version: a final or a post release. ASCII digits
# only, at most six per part: Python's ``int()`` also reads full-width digits ("０.５.２３") and refuses a
# number of thousands of digits with a traceback.
_VERSION = re.compile(r"^([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})(?:\.?post([0-9]{1,6}))?$", re.ASCII)
# What pip may report as an INSTALLED release (the PEP 440 forms SGLang's wheels and source builds take):
# a final or post release, a pre-release (a, b, rc), a dev release, a local build label ("+cu130").
_INSTALLED = re.compile(
    r"^v?([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})"
    r"(?:[-_.]?(a|b|rc)[-_.]?([0-9]{1,6}))?(?:[-_.]?post[-_.]?([0-9]{1,6}))?"
    r"(?:[-_.]?dev[-_.]?([0-9]{1,6}))?(?:\+([a-z0-9]+(?:[-_.][a-z0-9]+)*))?$",
    re.ASCII | re.IGNORECASE,
)
MAX_VERSION_CHARS = 64
"""A release number is short; a longer value is quoted cut (``shorten``), never echoed whole."""


def parse_version(version: str, *, source: str = "--sglang-version") -> tuple[int, int, int, int]:
    """``"0.5.15.post1"`` -> (0, 5, 15, 1); anything that is not a final or post release -> FlagError
    naming ``source`` (the flag the value came from, or where an installed version was read)."""
    text = version.strip() if isinstance(version, str) else None
    m = _VERSION.match(text) if text is not None and len(text) <= MAX_VERSION_CHARS else None
    if m is None:
        raise FlagError(
            f"{source} {shorten(version)} is not a release number like {NEWEST_MODELLED} or 0.5.15.post1; "
            f"modelled releases: {FIRST_MODELLED} to {NEWEST_MODELLED}"
        )
    major, minor, patch, post = m.groups()
    return int(major), int(minor), int(patch), int(post or 0)


def _canonical(version: str, *, source: str = "--sglang-version") -> str:
    major, minor, patch, post = parse_version(version, source=source)
    return f"{major}.{minor}.{patch}" + (f".post{post}" if post else "")


@dataclass(frozen=True)
class InstalledRelease:
    """An installed version string read as PEP 440 orders it (the subset pip reports for SGLang)."""

    text: str
    key: tuple[int, ...]
    """Orders releases: X.Y.Z.devN < X.Y.ZaN < X.Y.ZbN < X.Y.ZrcN < X.Y.Z < X.Y.Z.postN."""
    final: str | None
    """The canonical final/post release number when it is one (what the model tables are keyed by)."""
    kind: str
    """``release`` (final or post), ``pre-release``, ``dev release`` or ``local build``."""


def read_installed(version: str) -> InstalledRelease:
    """An installed SGLang's version, or FlagError saying it is not a release number pip would write."""
    m = _INSTALLED.match(version.strip()) if len(version) <= MAX_VERSION_CHARS else None
    if m is None:
        raise FlagError(
            f"the installed SGLang reports version {shorten(version)} (its dist-info METADATA), which is not "
            f"a release number; reinstall a published release, or pass --sglang-version {NEWEST_MODELLED} "
            "to derive as a modelled one"
        )
    major, minor, patch, pre, pre_n, post, dev, local = m.groups()
    pre_key = (-1, 0) if pre is None and dev is not None and post is None else (3, 0)
    if pre is not None:
        pre_key = ({"a": 0, "b": 1, "rc": 2}[pre.lower()], int(pre_n))
    key = (
        int(major),
        int(minor),
        int(patch),
        *pre_key,
        -1 if post is None else int(post),
        1 << 30 if dev is None else int(dev),
    )
    base = f"{int(major)}.{int(minor)}.{int(patch)}" + (f".post{int(post)}" if post is not None else "")
    if pre is None and dev is None and local is None:
        return InstalledRelease(text=version.strip(), key=key, final=base, kind="release")
    kind = "pre-release" if pre is not None else "dev release" if dev is not None else "local build"
    return InstalledRelease(text=version.strip(), key=key, final=None, kind=kind)


def release_key(version: str) -> tuple[int, ...]:
    """The PEP 440 order of a release number (final, post, pre, dev, local): newest compares greatest."""
    return read_installed(version).key


def release_model(version: str | None, *, best_effort: bool = False) -> ReleaseModel:
    """The rules the derivation follows for SGLang ``version`` (None: the newest modelled release).

    A release newer than the newest modelled one is refused (its rules may have changed) unless
    ``best_effort``, which derives with the newest modelled rules and says so. A release older than the
    first modelled one, or one that was never published between them, is refused.
    """
    if version is None:
        return ReleaseModel(version=NEWEST_MODELLED, rules=_RULES_BY_RELEASE[NEWEST_MODELLED])
    canon = _canonical(version)
    if canon in _RULES_BY_RELEASE:
        return ReleaseModel(version=canon, rules=_RULES_BY_RELEASE[canon])
    key = parse_version(canon)
    if key > parse_version(NEWEST_MODELLED):
        if best_effort:
            return ReleaseModel(
                version=NEWEST_MODELLED,
                rules=_RULES_BY_RELEASE[NEWEST_MODELLED],
                requested=canon,
                best_effort=True,
            )
        raise FlagError(
            f"SGLang {canon} is newer than the newest modelled release {NEWEST_MODELLED}: its sizing may "
            f"have changed; pass --sglang-version {NEWEST_MODELLED} or --sglang-best-effort to derive with "
            f"{NEWEST_MODELLED}'s rules"
        )
    if key < parse_version(FIRST_MODELLED):
        raise FlagError(
            f"SGLang {canon} is older than the first modelled release {FIRST_MODELLED}: it has no mamba "
            f"state pool at all; modelled releases: {FIRST_MODELLED} to {NEWEST_MODELLED}"
        )
    raise FlagError(
        f"SGLang {canon} is not a published release the checker knows; modelled releases: "
        f"{', '.join(MODELLED_RELEASES)}"
    )


# Where the release a rank derives as came from (the text in brackets after it in every report).
FROM_FLAG = "--sglang-version"
FROM_INSTALLED = "installed"
FROM_DEFAULT = "newest modelled; SGLang not installed"
ENGINES = ("builtin", "sglang", "both")


@dataclass(frozen=True, kw_only=True)
class ReleaseChoice:
    """Which SGLang release one rank derives as, and who derives it: the answer of :func:`choose_release`,
    made once per rank. Two names, never one: ``installed`` (what the package metadata says is
    installed here) and ``derived_as`` (whose sizing the values follow)."""

    installed: str | None
    """The installed SGLang's version as its metadata writes it; None: not installed."""
    derived_as: str
    """The release whose sizing this rank derives: a modelled release, or (``own_code``) the installed
    one that the checker does not model."""
    source: str
    """:data:`FROM_FLAG`, :data:`FROM_INSTALLED` or :data:`FROM_DEFAULT`."""
    engine: str = "builtin"
    """Who derives (``builtin``, ``sglang``, ``both``): ``sglang`` for a release the checker does not model,
    whatever the default engine, since only its own code knows its sizing."""
    own_code: bool = False
    """The installed release is not modelled (newer than the newest modelled, a pre-release, a dev or local
    build): its own code derives, through the engine's strict stand-ins."""
    best_effort: bool = False
    """--sglang-best-effort with ``--engine builtin``: a release newer than the newest modelled derived with
    the newest modelled rules (the label says so)."""
    why_unmodelled: str = ""
    """How an ``own_code`` release relates to the modelled ones: "newer than modelled", "a pre-release the
    checker does not model", ..."""

    @property
    def modelled(self) -> str:
        """The modelled release whose rules the checker's own pieces apply (the builtin engine, the input
        checks, the budget formula): ``derived_as`` itself, or the newest modelled one standing in."""
        return NEWEST_MODELLED if self.own_code or self.best_effort else self.derived_as

    @property
    def label(self) -> str:
        """``derived_as`` as every report prints it, with where it came from."""
        if self.own_code:
            text = f"SGLang {self.derived_as}, {self.why_unmodelled}: derived by its own code"
            if self.engine == "both":
                text += f", compared with {NEWEST_MODELLED}'s model"
        elif self.best_effort:
            text = f"SGLang {self.derived_as} (modelled as {NEWEST_MODELLED}, the newest modelled release)"
        else:
            text = f"SGLang {self.derived_as}"
        return f"{text} ({self.source})"


def choose_release(
    requested: str | None,
    installed: str | None,
    *,
    engine: str = "builtin",
    best_effort: bool = False,
    own_code: bool = True,
) -> ReleaseChoice:
    """THE choice of the release a rank derives as (every command and every report asks this, once).

    ``requested``: --sglang-version (one release); ``installed``: the installed SGLang's version (None:
    not installed); ``engine``: --engine; ``own_code``: whether the caller can run an installed release's
    own code (False for the builtin-only sweep).

    * --sglang-version X: X's model (a modelled release; newer ones only with --sglang-best-effort). With
      ``--engine sglang|both`` X must be the installed release: the engine runs the installed code.
    * else the installed release: its model where the checker has one; otherwise (newer than modelled, a
      pre-release, a dev or local build) its own code by default, unless ``--engine builtin
      --sglang-best-effort`` asks for the newest modelled rules instead;
    * nothing installed: the newest modelled release.
    """
    if engine not in ENGINES:
        raise FlagError(f"--engine {shorten(engine)} is not one of {', '.join(ENGINES)}")
    if requested is not None:
        if not requested.strip():
            raise FlagError(
                f"--sglang-version is empty; give a release like {NEWEST_MODELLED}, or leave the flag out to "
                "derive as the installed release"
            )
        canon = _canonical(requested)
        here = read_installed(installed) if installed is not None else None
        if here is not None and engine != "builtin" and here.final != canon:
            raise FlagError(
                f"--engine {engine} runs the installed SGLang {here.text}'s own code, but --sglang-version "
                f"{canon} names another release; drop --sglang-version, or use --engine builtin to "
                f"derive as {canon}"
            )
        if here is not None and here.final == canon and canon not in _RULES_BY_RELEASE and not best_effort:
            return _own(here, FROM_FLAG, engine)  # the installed release itself, which is not modelled
        model = release_model(canon, best_effort=best_effort)  # refuses unknown, older, newer releases
        return ReleaseChoice(
            installed=installed,
            derived_as=canon,
            source=FROM_FLAG,
            engine=engine,
            best_effort=model.best_effort,
        )
    if installed is None:
        return ReleaseChoice(installed=None, derived_as=NEWEST_MODELLED, source=FROM_DEFAULT, engine=engine)
    here = read_installed(installed)
    if here.final in _RULES_BY_RELEASE:
        return ReleaseChoice(installed=installed, derived_as=here.final, source=FROM_INSTALLED, engine=engine)
    if here.key < read_installed(FIRST_MODELLED).key:
        raise FlagError(
            f"the installed SGLang {here.text} is older than the first modelled release {FIRST_MODELLED}: it "
            f"has no mamba state pool at all; modelled releases: {FIRST_MODELLED} to {NEWEST_MODELLED}"
        )
    newer = here.key > read_installed(NEWEST_MODELLED).key
    if engine == "builtin" and best_effort and newer and here.final is not None:
        return ReleaseChoice(
            installed=installed, derived_as=here.final, source=FROM_INSTALLED, best_effort=True
        )
    if not own_code:
        raise FlagError(
            f"the installed SGLang {here.text} is {_unmodelled(here)}, and this command derives with the "
            "checker's model only; derive and check run that release's own code"
        )
    return _own(here, FROM_INSTALLED, engine)


def _unmodelled(here: InstalledRelease) -> str:
    if here.key > read_installed(NEWEST_MODELLED).key:
        return "newer than modelled" if here.final is not None else f"a {here.kind} newer than modelled"
    if here.final is None:
        return f"a {here.kind} the checker does not model"
    return "not a release the checker models"


def _own(here: InstalledRelease, source: str, engine: str) -> ReleaseChoice:
    """An installed release the checker has no model of: its own code derives (``both``: also compared
    with the newest model, which stands in as the builtin)."""
    return ReleaseChoice(
        installed=here.text,
        derived_as=here.text,
        source=source,
        engine="sglang" if engine == "builtin" else engine,
        own_code=True,
        why_unmodelled=_unmodelled(here),
    )


@functools.lru_cache(maxsize=1)
def _installed_on_sys_path() -> str | None:
    """Read once per process: a metadata scan walks every sys.path entry, and a rank asks several times."""
    # start-up: importlib.metadata is off the CLI's import path (docs/performance.md)
    from importlib import metadata

    try:
        return _checked(metadata.version("sglang"))
    except metadata.PackageNotFoundError:
        return None
    except CheckerInputError:
        raise
    except Exception as exc:  # a damaged dist-info (non-UTF-8 METADATA, unreadable file): one line
        raise FlagError(
            f"the installed SGLang's package metadata cannot be read ({type(exc).__name__}: "
            f"{shorten(str(exc), 120)}); reinstall it, or pass --sglang-version X to derive as a release"
        ) from None


def _checked(version: object) -> str:
    if not isinstance(version, str) or not version.strip():
        raise FlagError(
            f"the installed SGLang's package metadata has no version ({shorten(version)}); reinstall it, or "
            "pass --sglang-version X to derive as a release"
        )
    return version


def installed_sglang_version(paths: Sequence[str] | None = None) -> str | None:
    """The installed SGLang's version from its package metadata, without importing it (None: not
    installed). ``paths``: where to look instead of ``sys.path`` (another environment's site-packages).
    Metadata that cannot be read is a FlagError (one line), not a traceback."""
    # start-up: importlib.metadata, as in _installed_on_sys_path
    from importlib import metadata

    if paths is None:
        return _installed_on_sys_path()
    try:
        for dist in metadata.distributions(path=list(paths)):
            name = dist.metadata["Name"] if dist.metadata else None
            if name is not None and re.sub(r"[-_.]+", "-", name).lower() == "sglang":
                return _checked(dist.version)
    except CheckerInputError:
        raise
    except Exception as exc:
        raise FlagError(
            f"an SGLang package metadata under {', '.join(paths)} cannot be read ({type(exc).__name__}: "
            f"{shorten(str(exc), 120)})"
        ) from None
    return None


_EXPLAIN: dict[str, str] = {
    "charging": "{old} charges each stage for the whole model's state; {new} and later charge the largest "
    "stage's share (max_stage_mamba_layers / total), so pools are about P times larger under PP",
    "padding_slot": "{new} and later reserve the pool's padding slot: auto-fit K = (B - per_slot) // "
    "per_slot instead of B // per_req, (K + 1) slots charged, and the spec-decoding reservation covers one "
    "more request",
    "floor_requests": "{new} floors --max-running-requests // dp at 1 (resolver, no-radix pool, spec "
    "reservation); {old} lets it reach 0 and refuses to start",
    "extra_per_slot": "{new} and later charge a per-slot extra state (extra_mamba_cache_bytes_per_req); "
    "{old} has none",
    "skip_decode_lock": "{new} and later read SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK (base 2 slots per request "
    "instead of 3); {old} ignores it",
    "lazy_with_spec": "{new} and later accept extra_buffer_lazy with speculative decoding; {old} refuses it",
    "pool_rule": "{old} and {new} choose the pool size K differently ({a} vs {b})",
    "request_cap": "{old} and {new} cap max_running_requests differently ({a} vs {b})",
    "radix_rule": "{old} and {new} count slots per request differently ({a} vs {b})",
    "pp_hybrid": "{old} starts no hybrid model class under pipeline parallelism; {new} and later do",
    "pp_with_spec": "{old} refuses speculative decoding under pipeline parallelism; {new} accepts EAGLE with "
    "SGLANG_ENABLE_PP_SPEC=1",
    "spec_reserve": "{old} and {new} charge the spec-decoding state differently ({a} vs {b})",
    "has_lazy": "{new} and later accept the extra_buffer_lazy strategy; {old} has none",
    "pool_families": "{old} and {new} give a state pool to different model families ({a} vs {b})",
    "dp_split_families": "{old} and {new} split the pool over dp for different model families ({a} vs {b})",
    "radix_off_families": "{old} and {new} force the radix cache off for different model families "
    "({a} vs {b})",
    "no_extra_buffer_families": "{old} and {new} give the extra_buffer strategy to different model families "
    "(not to {a} vs not to {b})",
    "default_full_memory_ratio": "{old} and {new} default --mamba-full-memory-ratio differently ({a} vs {b})",
    "budget_rule": "{old} and {new} compute the memory handed to sizing differently ({a} vs {b}); the same "
    "device gives different budgets",
}


class FamilyLists(Protocol):
    """Which model families a release's code does a per-family rule for: every family's facts
    (:class:`checker.core.releases.family_facts.FamilyTable`, ``checker.families.FAMILY_TABLE``)."""

    def listed(self, rule: str, version: str) -> tuple[str, ...]: ...


FAMILY_RULES = ("pool_families", "dp_split_families", "radix_off_families", "no_extra_buffer_families")
"""The rules a release applies per model family: answered from the release's flags and the families' facts
(:func:`rule_value`), in place of ``pool_by_family`` / ``dp_split_by_family`` among the rule names."""
RULE_NAMES: tuple[str, ...] = tuple(
    name
    for f in fields(ReleaseRules)
    for name in {"pool_by_family": FAMILY_RULES[:1], "dp_split_by_family": FAMILY_RULES[1:]}.get(
        f.name, (f.name,)
    )
)
"""The rules :func:`explain_release_difference` compares, in the order it says them."""


def rule_value(version: str, name: str, families: FamilyLists) -> object:
    """Rule ``name`` (a :data:`RULE_NAMES` entry) of modelled release ``version``: a ReleaseRules field, or
    for a :data:`FAMILY_RULES` name the model types it applies to (None: every family)."""
    rules = _RULES_BY_RELEASE[version]
    if name == "pool_families":
        return families.listed("pool", version) if rules.pool_by_family else None
    if name == "dp_split_families":
        return families.listed("dp_split", version) if rules.dp_split_by_family else None
    if name in FAMILY_RULES:
        return families.listed(name.removesuffix("_families"), version)
    return getattr(rules, name)


def explain_release_difference(
    a: str, b: str, *, families: FamilyLists, only: Collection[str] | None = None
) -> list[str]:
    """One line per rule that differs between releases ``a`` and ``b`` (in either order): what can make
    the two derive different values from the same flags. Empty when both are in one group.

    ``families``: every family's facts (``checker.families.FAMILY_TABLE``), for the rules a release
    applies per family. ``only``: the rule names (:data:`RULE_NAMES`) that matter for the inputs at hand;
    see :func:`rules_that_matter`."""
    ra, rb = release_model(a), release_model(b)
    old, new = (ra, rb) if parse_version(ra.version) <= parse_version(rb.version) else (rb, ra)
    lines = []
    for name in RULE_NAMES:
        if name in ("group", "sizing_function"):
            continue
        was, now = rule_value(old.version, name, families), rule_value(new.version, name, families)
        if was == now or (only is not None and name not in only):
            continue
        # Name the first release with the newer rule: the first of new's rule value after old.
        first_new = next(
            v
            for v in MODELLED_RELEASES
            if parse_version(v) > parse_version(old.version) and rule_value(v, name, families) == now
        )
        lines.append(_EXPLAIN[name].format(old=old.version, new=first_new, a=was, b=now))
    if old.rules.sizing_function != new.rules.sizing_function and not lines:
        lines.append(f"{old.version} and {new.version} size the pool in different files with the same rules")
    return lines
