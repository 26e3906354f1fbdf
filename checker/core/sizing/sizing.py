"""SGLang's state-pool sizing for one pipeline stage, per release.

``CapacityInputs.sglang_version`` picks the release (None: the newest modelled one); its rules
(``checker.core.releases.releases.ReleaseRules``: charging, padding slot, floors, per-slot extra state, slots
per request, startup refusals) decide every formula below. docs/sglang-releases.md traces each rule to the
released code (0.5.23: sglang/srt/mem_cache/kv_cache_configurator.py ``KVCacheConfigurator``
``_handle_max_mamba_cache``, ``_calculate_mamba_ratio`` and ``resolve_max_num_reqs``).

The derivation is split in two so sweeps can vectorise the budget-dependent half:

* :func:`plan_stage` - everything that does not depend on the budget: the stage's slice, the charging
  policy's ``scale``, ``stage_per_req`` bytes and the slots each running request needs.
* :func:`size_pool` - the pool size K for one budget, then max_running_requests and
  pp_max_micro_batch_size.

Float arithmetic follows SGLang operation by operation (IEEE double, ``//`` on floats, ``int()``), so
the numbers agree to the slot, not just approximately.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import TypeVar

from checker.core.errors import BudgetError, CheckerInputError, ConfigError, FlagError, LayoutError
from checker.core.releases.releases import (
    GROUPS,
    MODELLED_RELEASES,
    ReleaseModel,
    ReleaseRules,
    parse_version,
    release_key,
    release_model,
)
from checker.core.releases.startup import check_pp_spec, refuse
from checker.core.sizing.environ import LONGER_CONTEXT_ENV
from checker.core.sizing.formulas import SCALAR, handle_max_mamba_cache, profile_tokens
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.kv_pool import (
    ESTIMATE_MAX,
    KvOwn,
    KvStage,
    code_of,
    counts_own_stage,
    draft_layers_of,
    estimate,
    kv_dtype_bytes,
    own_kv,
    refuse_zero_cell,
    resolve_one,
)
from checker.core.sizing.page_size import PageResolution, resolve_page_size
from checker.core.sizing.partition import stage_bounds, stage_partition
from checker.core.sizing.replay import FIRST_FLAG as FIRST_REPLAY_FLAG
from checker.core.sizing.replay import RingCharge, ring_charge, ring_rule
from checker.core.sizing.server_args import (
    POLICIES as POLICIES,  # re-exported: the policies' home is the table
)
from checker.core.sizing.server_args import STRATEGIES as STRATEGIES
from checker.core.sizing.server_args import SizingFlags

_T = TypeVar("_T")
GIB = 2**30
# The three values every stage must agree on; the preflight's verdict is about these.
CHECKED_VALUES = ("max_mamba_cache_size", "max_running_requests", "pp_max_micro_batch_size")
BOOT_FAILURE = -1
"""Sentinel in all three values of a stage that cannot boot at a budget (never a real value: each is
>= 1); the sweeps' stacks carry it (checker.core.sizing.sweep, checker.device.sweep)."""
# SGLang (0.5.17+) reads SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK as an EnvBool (srt/environ.py): lower-cased, NOT
# stripped; "yes"/"y" count as true; anything unrecognised warns and falls back to false.
_TRUE = ("true", "1", "yes", "y")
# SGLang's --mamba-track-interval default, 256 in every modelled release (server_args.py up to 0.5.18,
# arg_groups/fields/exec_.py in 0.5.23). The checker has no flag for
# it: the extra-buffer startup asserts (arg_groups/mamba_hook.py validate_mamba_extra_buffer) are checked
# against this default.
MAMBA_TRACK_INTERVAL = 256
FLA_CHUNK_SIZE = 64
"""The FLA kernels' chunk (0.5.7 ``layers/attention/fla/chunk_delta_h.py`` ``CHUNK_SIZE``)."""
GDN_PAGE_DIVIDES_CHUNK = "page-size-for-hybrid-gdn-model-must-be-4dc4ef"
"""0.5.7's check of a Qwen3-Next page size under the extra buffer (checker.core.releases.arg_checks)."""
# The mamba cache strategy's checks, each release's spelling of it (ids of checker.core.releases.arg_checks;
# the refusal names the first one the release has, with its file:line).
NO_EXTRA_BUFFER_FOR_ARCH = (
    "mamba-extra-buffer-is-not-supported-for-0a9c36",  # 0.5.7-0.5.13.post1
    "extra-buffer-is-not-supported-for-model-arch-ab505b",  # 0.5.14-0.5.20
    "extra-buffer-is-not-supported-for-hf-config-4b2eea",  # 0.5.21+
)
EXTRA_BUFFER_WITHOUT_RADIX = (
    "mamba-extra-buffer-is-not-compatible-with-ee9f0d",  # 0.5.10-0.5.12.post1
    "mamba-extra-buffer-is-not-compatible-with-0a7d6b",  # 0.5.13-0.5.13.post1
)
SPEC_WITH_NO_BUFFER_RADIX = ("speculative-decoding-for-model-arch-is-not-e0000f",)  # 0.5.10-0.5.13.post1
NO_BUFFER_PAGE = ("no-buffer-only-supports-page-size-1-5689ff",)  # 0.5.14+
NO_BUFFER_OVERLAP = ("no-buffer-do-not-support-overlap-schedule-f4c8d0",)  # 0.5.14+
LAZY_WITH_SPEC = (
    "extra-buffer-lazy-is-not-yet-supported-with-093a15",  # 0.5.13-0.5.13.post1
    "extra-buffer-lazy-unsupported-with-spec-6f8fab",  # 0.5.14-0.5.16
)
TRACK_INTERVAL_DRAFTS = (
    "mamba-track-interval-mamba-track-interval-88b463",  # 0.5.7-0.5.13.post1
    "assert-not-disable-radix-cache-and-enable-f6ab94",  # 0.5.14
    "assert-not-not-uses-mamba-radix-cache-and-d9c777",  # 0.5.15+
)
TRACK_INTERVAL_PAGE = (
    "mamba-track-interval-mamba-track-interval-13969a",  # 0.5.7-0.5.13.post1
    "assert-not-disable-radix-cache-and-enable-6c68e6",  # 0.5.14
    "assert-not-not-uses-mamba-radix-cache-and-c44867",  # 0.5.15+
)


_FIRST_PP_HYBRID = next(g.group.split("-")[0] for g in GROUPS if g.pp_hybrid)
"""The first release that starts any hybrid class under PP (from :mod:`checker.core.releases.pp_support`)."""


def env_flag(value: str | None) -> bool:
    return value is not None and value.lower() in _TRUE


@dataclass(frozen=True, kw_only=True)
class CapacityInputs(SizingFlags):
    """Everything one rank's derivation reads: the sizing flags (:class:`SizingFlags`, the table of
    :mod:`checker.core.sizing.server_args`, checked by it), resolved, and what the rank knows: the model, the
    budget, the release to derive as and the environment. SGLang server-arg names throughout."""

    geometry: ModelGeometry
    """Model layout with state dtypes already resolved (see ``geometry.resolve_dtypes``)."""
    budget_gib: float
    """``total_rest_memory``: GiB left for the KV pool and the state pool together."""
    pp_size: int = 1
    """Resolved: the flag, else world_size // tp_group_size (never None here)."""
    mamba_full_memory_ratio: float = 0.9
    """Resolved: the flag, else the release's default (never None here)."""
    sglang_version: str | None = None
    """The SGLang release whose rules the derivation follows; None: the newest modelled release."""
    sglang_best_effort: bool = False
    """Derive a release newer than the newest modelled one with the newest modelled rules."""
    partition_env: str | None = None
    """The value of SGLANG_PP_LAYER_PARTITION on this rank (None when unset)."""
    skip_decode_lock: bool = False
    """SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK set truthy."""
    pp_spec_env: bool = False
    """SGLANG_ENABLE_PP_SPEC set truthy (0.5.21+: speculative decoding under PP starts only with it)."""
    spec_note: str = ""
    """What the release resolved of the speculative setup itself (checker.core.releases.startup), for
    reports."""
    allow_longer_context: bool = False
    """SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN set truthy: --context-length may exceed the model's."""
    speculative_draft_model_path: bool = False
    """A --speculative-draft-model-path was given (its checkpoint's layers widen the KV cell)."""

    def __post_init__(self) -> None:
        super().__post_init__()  # every flag as its row says (type, range, choices)
        for name in ("pp_size", "mamba_full_memory_ratio"):
            if getattr(self, name) is None:
                raise TypeError(f"CapacityInputs.{name} is resolved before sizing; got None")
        # The one validating constructor of a derivation's inputs: the command line's values arrive checked
        # (checker.commands.flag_types.positive_gib), so this fires only for code that builds one itself.
        b = self.budget_gib
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            raise BudgetError(
                f"--budget-gib {b} must be a positive, finite number of GiB "
                "(the memory left for the KV and state pools)"
            )
        rules = self.release.rules  # refuses an unknown or unmodelled release
        if self.geometry.extra_per_slot_bytes and not rules.extra_per_slot:
            raise FlagError(
                f"{self.geometry.name}: extra_per_slot_bytes={self.geometry.extra_per_slot_bytes} but "
                f"{self.release.label} charges no per-slot extra state (extra_mamba_cache_bytes_per_req "
                "arrived in 0.5.22); drop it from the model spec or derive for 0.5.22 or later"
            )
        if self.speculative_algorithm is not None and self.speculative_num_draft_tokens is None:
            raise TypeError(
                "CapacityInputs.speculative_algorithm is resolved before sizing "
                "(checker.core.releases.startup.resolve_speculative): its draft tokens are None"
            )
        if self.speculative_num_draft_tokens and self.max_running_requests is None:
            raise FlagError(
                "--speculative-num-draft-tokens needs --max-running-requests: SGLang sizes the "
                "spec-decoding intermediate state from it (or give --speculative-algorithm, and the "
                "release picks its own)"
            )
        sg = self.release.label
        if self.pp_size > 1 and not rules.pp_hybrid:
            # A class the config names is refused per class before this (model_support.check_pipeline);
            # this is what a JSON model spec, which names none, is held to (checker.core.releases.pp_support).
            raise FlagError(
                f"--pp-size {self.pp_size}: {sg} starts no hybrid (mamba / linear-attention) model class "
                "under pipeline parallelism (models/qwen3_next.py and falcon_h1.py assert a single stage; "
                "nemotron_h.py builds and runs every layer on every stage; kimi_linear.py loads no other "
                f"stage's weights safely); use --pp-size 1, or SGLang {_FIRST_PP_HYBRID} or later"
            )
        # The start-up refusals of the flags under PP (checker.core.releases.startup), as the modelled release
        # whose rules apply makes them.
        check_pp_spec(
            self.release.version,
            pp_size=self.pp_size,
            algorithm=self.speculative_algorithm,
            speculative=bool(self.speculative_num_draft_tokens),
            pp_spec_env=self.pp_spec_env,
            attention_dp=self.dp_size > 1,
        )
        self._refuse_family(rules, sg)
        self._refuse_replay(sg)
        if rules.radix_rule in ("forced-off", "fixed-ratio") and self.mamba_radix_cache_strategy != "auto":
            raise FlagError(
                f"--mamba-radix-cache-strategy {self.mamba_radix_cache_strategy}: {sg} has no mamba cache "
                "strategy (the flag arrived in 0.5.7 as --mamba-scheduler-strategy); leave it at auto"
            )
        if self.mamba_radix_cache_strategy == "extra_buffer_lazy" and not rules.has_lazy:
            raise FlagError(
                f"--mamba-radix-cache-strategy extra_buffer_lazy: {sg} has no such strategy (its "
                "--mamba-scheduler-strategy takes auto, no_buffer, extra_buffer; lazy arrived in 0.5.13)"
            )
        # Fail early on the layout: pp size vs layers, partition env.
        stage_partition(self.geometry.num_hidden_layers, self.pp_size, self.partition_env)
        self._check_kv_inputs()

    def _check_kv_inputs(self) -> None:
        """The KV pool's inputs, refused as the release refuses them at start-up (one line each)."""
        sg = self.release.label
        g = self.geometry
        own = g.context_len
        if (
            self.context_len is not None
            and own is not None
            and self.context_len > own
            and not self.allow_longer_context
        ):
            # configs/model_config.py ModelConfig (``_derive_context_length`` from 0.5.10), every modelled
            # release; where, per release: kv_support.KvCode.context_refusal_at.
            at = code_of(self.release.version).context_refusal_at
            raise FlagError(
                f"--context-len {self.context_len} (a launch command's --context-length) is above the "
                f"model's own context length {own}: {sg} refuses it at start-up (ValueError: "
                f'"User-specified context_length ({self.context_len}) is greater than the derived '
                f"context_length ({own}). ... To allow overriding this maximum, set the env var "
                f'{LONGER_CONTEXT_ENV}=1"; sglang/srt/{at}); lower it, or set {LONGER_CONTEXT_ENV}=1'
            )
        if self.resolved_context_len is None:
            raise FlagError(
                f"{g.name}: the model spec gives no context length, which SGLang's running-request "
                'estimate divides by; add "context_len" to the spec or pass --context-len'
            )
        if self.max_total_tokens is not None and self.max_total_tokens <= 0:
            raise FlagError(
                f"--max-total-tokens {self.max_total_tokens}: {sg} caps every KV pool at it and refuses to "
                'start with a pool of 0 tokens or fewer ("Not enough memory. Please try to increase '
                '--mem-fraction-static."); give a positive number of tokens, or leave it out'
            )
        if g.attention is None:
            if self.token_capacity is None:
                raise ConfigError(
                    f"{g.name}: the model spec gives no attention facts, so the checker cannot size its KV "
                    'token pool, which caps max_running_requests; add an "attention" object to the spec '
                    "(docs/preflight.md#json-model-spec) or pass --token-capacity"
                )
        else:
            kv_dtype_bytes(self.release.version, self.kv_cache_dtype, g.attention)
            draft_layers_of(
                self.release.version,
                g.attention,
                speculative=bool(self.speculative_num_draft_tokens),
                draft_path=self.speculative_draft_model_path,
            )

    def _refuse_family(self, rules: ReleaseRules, sg: str) -> None:
        """Old releases size the pool per model family (docs/sglang-releases.md): refuse a geometry that
        does not say its family where the answer depends on it, or a family the release has no pool for."""
        fam, table, v = self.geometry.family, self.geometry.families, self.release.version
        needs = []
        if rules.pool_by_family:
            needs.append("whether it has a state pool at all")
        if rules.dp_split_by_family and self.dp_size > 1:
            needs.append("whether --dp-size splits the pool")
        if table.listed("radix_off", v) and not self.disable_radix_cache:
            needs.append("whether the radix cache is forced off")
        if fam is None and needs:
            raise FlagError(
                f"{self.geometry.name}: {sg} decides {' and '.join(needs)} by the model_type, and the "
                'model spec names none; add "model_type" (e.g. "qwen3_next") to the spec or pass the HF '
                "config"
            )
        if rules.pool_by_family and not table.at("pool", v, fam):
            raise FlagError(
                f"{self.geometry.name}: {sg} sizes a mamba state pool only for model_type "
                f"{', '.join(table.listed('pool', v))}, not {fam}; use a later release"
            )

    def _refuse_replay(self, sg: str) -> None:
        """The ReplaySSM ring's flags where the release has none, or a model whose kind (GDN, KDA,
        Mamba2) the sizing cannot tell (checker.core.sizing.replay)."""
        version = parse_version(self.release.version)
        if self.enable_linear_replayssm_spec and version < parse_version(FIRST_REPLAY_FLAG):
            raise FlagError(
                f"--enable-linear-replayssm-spec: {sg} has no ReplaySSM spec-verify ring (the flag arrived "
                f"in {FIRST_REPLAY_FLAG} as --enable-gdn-replayssm-spec); drop it, or derive for "
                f"{FIRST_REPLAY_FLAG} or "
                "later"
            )
        if self.linear_replayssm_cache_len is not None and version < parse_version("0.5.15"):
            raise FlagError(
                f"--linear-replayssm-cache-len: {sg} has no ReplaySSM ring (the flag arrived in 0.5.15); "
                "drop it"
            )
        if (
            self.enable_linear_replayssm_spec
            and self.geometry.family is None
            and ring_rule(self.release.version) != "uncharged"
        ):
            raise FlagError(
                f"--enable-linear-replayssm-spec with {self.geometry.name}: {sg} charges the ring by the "
                "model's kind (GDN per request, KDA per slot, Mamba2 none), and the model spec names no "
                'model_type; add "model_type" (e.g. "qwen3_5") to the spec or pass the HF config'
            )

    def ring(self, scale: float) -> RingCharge:
        """The ReplaySSM ring this release's sizing charges a stage of share ``scale``
        (:mod:`checker.core.sizing.replay`)."""
        user = self.max_running_requests
        return ring_charge(
            self.geometry,
            self.release.version,
            enabled=self.enable_linear_replayssm_spec,
            cache_len=self.linear_replayssm_cache_len,
            draft_tokens=self.speculative_num_draft_tokens,
            requests_per_worker=None if user is None else user // self.dp_size,
            scale=scale,
            floor_requests=self.release.rules.floor_requests,
        )

    def _at(self, checks: tuple[str, ...]) -> str:
        """``sglang/srt/<file>:<line> <function>: `` of the first of ``checks`` the release has (its own
        check, for the refusal's line), or "" where it has none of them."""
        if self.release.version not in MODELLED_RELEASES:
            return ""
        # start-up: the table of every release's checks loads only for a refusal
        from checker.core.releases.arg_quote import SRT, check_site

        site = next((s for c in checks if (s := check_site(c, self.release.version))), None)
        return f"{SRT}{site}: " if site else ""

    @property
    def radix_cache_disabled(self) -> bool:
        """--disable-radix-cache, or the release forcing it off for this model family (0.5.2-0.5.3.post1:
        every pool model; NemotronH / FalconH1 / KimiLinear in later old releases)."""
        rules = self.release.rules
        if self.disable_radix_cache or rules.radix_rule == "forced-off":
            return True
        return self.geometry.families.at("radix_off", self.release.version, self.geometry.family)

    def splits_over_dp(self) -> bool:
        """Whether the release divides K by dp for this family (0.5.3.post1-0.5.6.post2: hybrid GDN only)."""
        g = self.geometry
        return not self.release.rules.dp_split_by_family or g.families.at(
            "dp_split", self.release.version, g.family
        )

    @cached_property
    def release(self) -> ReleaseModel:
        """The release whose rules apply (see ``checker.core.releases.releases.release_model``)."""
        return release_model(self.sglang_version, best_effort=self.sglang_best_effort)

    @property
    def resolved_policy(self) -> str:
        """The charging policy in force: ``--policy`` when given, else the release's own."""
        return self.policy if self.policy is not None else self.release.rules.policy

    @property
    def resolved_context_len(self) -> int | None:
        return self.context_len or self.geometry.context_len

    @property
    def overlap_schedule(self) -> bool:
        """SGLang forces the overlap schedule off under PP."""
        return not self.disable_overlap_schedule and self.pp_size == 1

    @property
    def kv_page_size(self) -> int:
        """The page size the KV pool aligns to (:attr:`page_resolution`)."""
        return self.page_resolution.page_size

    @cached_property
    def page_resolution(self) -> PageResolution:
        """The page size the release uses, in its order: SGLang 0.5.11-0.5.13.post1 (server_args.py
        ``_handle_mamba_radix_cache``, 0.5.13 :2721-2728) do not refuse no_buffer with the radix cache on
        and a page size > 1: they warn and set ``page_size = 1``; then (every release, after the model's
        adjustments: 0.5.13 server_args.py:970/977) an attention backend that supports only some page sizes
        changes it (:mod:`checker.core.sizing.page_size`)."""
        v = self.release.version
        page = self.page_size
        if (
            not self.radix_cache_disabled
            and self.page_size != 1
            and release_key("0.5.11") <= release_key(v) <= release_key("0.5.13.post1")
            and self.resolved_strategy == "no_buffer"
        ):
            page = 1
        resolved = resolve_page_size(v, page, self.attention_backends)
        return PageResolution(resolved.page_size, self.page_size, resolved.changed_by, resolved.site)

    @property
    def attention_backends(self) -> dict[str, str | None]:
        return {
            "attention_backend": self.attention_backend,
            "decode_attention_backend": self.decode_attention_backend,
            "prefill_attention_backend": self.prefill_attention_backend,
            "speculative_draft_attention_backend": self.speculative_draft_attention_backend,
        }

    @property
    def resolved_strategy(self) -> str:
        """``auto``: extra_buffer when the overlap schedule is wanted or page_size > 1, else no_buffer.

        Every modelled release (0.5.14 to 0.5.23) resolves ``auto`` (0.5.14: server_args.py
        ``_handle_mamba_radix_cache``; 0.5.15+: arg_groups/overrides.py ``_mamba_radix_cache_resolution``)
        from the user's --disable-overlap-schedule BEFORE the pipeline-parallel pass turns overlap
        off (arg_groups/pipeline.py runs ``_pipeline_parallel_overlap_disable`` later). So under PP
        with default flags auto means extra_buffer WITHOUT overlap: 4 slots. A pp-8 deployment whose
        pool went from 26 to 210 slots went from 6 to 52 running requests: 26 // 4 and 210 // 4 (3 slots
        would give 8 and 70). Reading auto as no_buffer under PP, because PP turns overlap off, does not
        match the released code; we follow the code.
        """
        s = self.mamba_radix_cache_strategy
        if s != "auto":
            return s
        if self.release.rules.radix_rule.startswith("scheduler"):
            # 0.5.7-0.5.13.post1 server_args.py __post_init__: auto always becomes no_buffer.
            return "no_buffer"
        if not self.extra_buffer_supported:  # the release gives this family no extra buffer
            return "no_buffer"
        wants_overlap = not self.disable_overlap_schedule
        return "extra_buffer" if wants_overlap or self.page_size > 1 else "no_buffer"

    @property
    def extra_buffer_supported(self) -> bool:
        """Whether the release gives this model family the extra_buffer strategy
        (``FamilyFacts.no_extra_buffer``; a geometry without a family is given it)."""
        g = self.geometry
        return not g.families.at("no_extra_buffer", self.release.version, g.family)

    def _refuse_unsupported_extra_buffer(self, strategy: str) -> None:
        if strategy.startswith("extra_buffer") and not self.extra_buffer_supported:
            raise FlagError(
                f"--mamba-radix-cache-strategy {strategy} for a {self.geometry.family} model: "
                f"{self.release.label} has no extra buffer for that architecture and refuses it at startup "
                f'({self._at(NO_EXTRA_BUFFER_FOR_ARCH)}"extra_buffer is not supported for ..."); use '
                "no_buffer"
            )

    @property
    def strategy_label(self) -> str:
        """How the cache strategy reads in a header: "strategy extra_buffer (auto)" and the like."""
        if self.radix_cache_disabled:
            return "radix cache disabled"
        auto = " (auto)" if self.mamba_radix_cache_strategy == "auto" else ""
        return f"strategy {self.resolved_strategy}{auto}"

    @property
    def effective_overlap_schedule(self) -> bool:
        # auto -> no_buffer turns the overlap schedule off.
        if self.mamba_radix_cache_strategy == "auto" and self.resolved_strategy == "no_buffer":
            return False
        return self.overlap_schedule

    def slots_per_request(self) -> int:
        """SGLang's "mamba ratio": state slots one running request holds."""
        radix = self.release.rules.radix_rule
        if (
            radix == "scheduler"
            and self.disable_radix_cache
            and self.mamba_radix_cache_strategy.startswith("extra_buffer")
        ):
            raise FlagError(
                f"--mamba-radix-cache-strategy {self.mamba_radix_cache_strategy} with --disable-radix-cache: "
                f"{self.release.label} refuses it at startup ({self._at(EXTRA_BUFFER_WITHOUT_RADIX)}"
                '"mamba extra_buffer is not compatible with --disable-radix-cache"); use no_buffer'
            )
        if self.radix_cache_disabled:
            return 1  # 0.5.2-0.5.3.post1: ModelRunner.__init__ disables the radix cache for hybrid GDN
        if radix == "fixed-ratio":
            return 3  # model_runner.py MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, no strategies yet
        strategy = self.resolved_strategy
        D = self.speculative_num_draft_tokens
        self._refuse_unsupported_extra_buffer(strategy)
        if radix in ("scheduler-v1", "scheduler-spec", "scheduler"):
            self._refuse_scheduler_asserts(strategy)
        if radix == "scheduler-v1":
            # 0.5.7 init_memory_pool: additional 1 (NO_OVERLAP) only for extra_buffer with spec decoding,
            # else 2 (OVERLAP), no_buffer included.
            return 3 + (1 if strategy == "extra_buffer" and D else 2)
        if radix == "scheduler-spec":
            # 0.5.8-0.5.9 init_memory_pool: extra_buffer adds 1 with spec decoding, 2 without.
            return 3 + ((1 if D else 2) if strategy == "extra_buffer" else 0)
        if radix == "scheduler":
            # 0.5.10-0.5.13.post1 _calculate_mamba_ratio: extra_buffer adds 2 with overlap (lazy 1), else
            # 1; no_buffer turns overlap off in server_args.py and adds 0.
            if strategy == "no_buffer":
                return 3
            if strategy == "extra_buffer_lazy" and not self.effective_overlap_schedule:
                raise FlagError(
                    f"--mamba-radix-cache-strategy extra_buffer_lazy needs the overlap schedule: "
                    f'{self.release.label} asserts it ("Lazy extra buffer requires overlap schedule"); '
                    "use extra_buffer"
                )
            if strategy == "extra_buffer_lazy":
                return 4
            return 3 + (2 if self.effective_overlap_schedule else 1)
        self._refuse_startup_asserts(strategy)
        # SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK exists from 0.5.17 (kv_cache_configurator.py
        # _calculate_mamba_ratio); earlier releases ignore it.
        skip = self.skip_decode_lock and self.release.rules.skip_decode_lock
        base = 2 if skip else 3
        if strategy == "extra_buffer":
            return base + (2 if self.effective_overlap_schedule else 1)
        if strategy == "extra_buffer_lazy":
            if not self.effective_overlap_schedule:
                why = "pp size > 1 forces it off" if self.pp_size > 1 else "it is disabled"
                raise FlagError(
                    "--mamba-radix-cache-strategy extra_buffer_lazy needs the overlap schedule, but "
                    f"{why}; use extra_buffer or no_buffer"
                )
            return base + 1
        return base + (1 if skip else 0)  # no_buffer stays at 3 slots

    def _refuse_scheduler_asserts(self, strategy: str) -> None:
        """0.5.7-0.5.13.post1 server_args.py ``_handle_mamba_radix_cache``: no_buffer turns the overlap
        schedule off (no refusal, so its page-size and overlap asserts of 0.5.14+ do not apply); from 0.5.10
        no_buffer with spec decoding and the radix cache on, and extra_buffer with --disable-radix-cache,
        raise ValueError; extra_buffer asserts mamba_track_interval >= D and interval % page_size == 0."""
        sg = self.release.label
        late = self.release.rules.radix_rule == "scheduler"  # 0.5.10+
        if strategy == "no_buffer":
            if late and self.speculative_num_draft_tokens:
                raise FlagError(
                    f"--speculative-num-draft-tokens with the no_buffer strategy and the radix cache on: "
                    f"{sg} refuses it at startup ({self._at(SPEC_WITH_NO_BUFFER_RADIX)}"
                    '"Speculative decoding ... is not compatible with radix cache when using '
                    '--mamba-scheduler-strategy no_buffer"); use extra_buffer or '
                    "--disable-radix-cache"
                )
            return
        self._refuse_startup_asserts(strategy)

    def _refuse_startup_asserts(self, strategy: str) -> None:
        """The flag combinations SGLang asserts against at startup, as one-line FlagErrors.

        arg_groups/mamba_hook.py runs ``validate_mamba_no_buffer`` / ``validate_mamba_extra_buffer`` on
        the user's flags BEFORE the pipeline-parallel pass turns overlap off, so an explicit no_buffer
        without --disable-overlap-schedule is refused under pp > 1 too. ``auto`` resolves to no_buffer
        with overlap disabled and page size 1, or for a family the release gives no extra buffer (then
        it turns overlap off itself, and a page size > 1 is refused as for an explicit no_buffer).
        The caller skips all of this under --disable-radix-cache, as SGLang's resolution does
        (overrides.py ``_mamba_radix_cache_resolution`` returns before any strategy is validated).
        """
        s = self.mamba_radix_cache_strategy
        sg = self.release.label
        if strategy == "no_buffer":
            if self.page_size != 1:
                # auto resolves to no_buffer with a page size > 1 only where the release gives the
                # family no extra buffer; SGLang then validates that no_buffer the same way.
                named = (
                    "no_buffer"
                    if s != "auto"
                    else f"auto (no_buffer: no extra buffer for {self.geometry.family})"
                )
                raise FlagError(
                    f"--mamba-radix-cache-strategy {named} needs --page-size 1, got {self.page_size}: "
                    f'{sg} refuses it at startup ({self._at(NO_BUFFER_PAGE)}"no_buffer only supports '
                    'page_size=1"); use '
                    "--page-size 1, or extra_buffer for a paged KV cache"
                )
            if not self.disable_overlap_schedule and s != "auto":  # auto -> no_buffer turns it off itself
                raise FlagError(
                    f"--mamba-radix-cache-strategy no_buffer needs --disable-overlap-schedule: {sg} "
                    f"refuses no_buffer with the overlap schedule on ({self._at(NO_BUFFER_OVERLAP)}"
                    '"no_buffer do not support overlap schedule"), even under pp > 1 where it turns overlap '
                    "off later; add "
                    "--disable-overlap-schedule"
                )
            return
        # extra_buffer, extra_buffer_lazy, or auto resolved to extra_buffer.
        named = f"--mamba-radix-cache-strategy {s}" + (" (resolved to extra_buffer)" if s == "auto" else "")
        d = self.speculative_num_draft_tokens
        if d is not None and strategy == "extra_buffer_lazy" and not self.release.rules.lazy_with_spec:
            # server_args.py _validate_mamba_extra_buffer up to 0.5.16, checked before the interval.
            raise FlagError(
                f"--speculative-num-draft-tokens {d} with {named}: {sg} refuses it at startup "
                f'({self._at(LAZY_WITH_SPEC)}"extra_buffer_lazy unsupported with spec."); use extra_buffer, '
                "or "
                "SGLang 0.5.17 or later"
            )
        if d is not None and d > MAMBA_TRACK_INTERVAL:
            raise FlagError(
                f"--speculative-num-draft-tokens {d} is above mamba_track_interval {MAMBA_TRACK_INTERVAL} "
                f"(SGLang's default): {sg} refuses it with {named} at startup "
                f"({self._at(TRACK_INTERVAL_DRAFTS)}"
                f"asserts mamba_track_interval >= speculative_num_draft_tokens); use at most "
                f"{MAMBA_TRACK_INTERVAL} draft tokens"
            )
        if MAMBA_TRACK_INTERVAL % self.page_size:
            raise FlagError(
                f"--page-size {self.page_size} does not divide mamba_track_interval {MAMBA_TRACK_INTERVAL} "
                f"(SGLang's default): {sg} refuses it with {named} at startup "
                f"({self._at(TRACK_INTERVAL_PAGE)}"
                "asserts mamba_track_interval % page_size == 0); use a page size that divides "
                f"{MAMBA_TRACK_INTERVAL} (1, 2, 4, ..., {MAMBA_TRACK_INTERVAL})"
            )
        g = self.geometry
        if (
            g.families.at("page_divides_chunk", self.release.version, g.family)
            and FLA_CHUNK_SIZE % self.page_size
        ):
            # The family's fact (FamilyFacts.page_divides_chunk): 0.5.7 server_args.py
            # _handle_model_specific_adjustments asserts ``FLA_CHUNK_SIZE % page_size == 0`` with an extra
            # buffer (later releases only ask the two to nest).
            refuse(
                GDN_PAGE_DIVIDES_CHUNK,
                self.release.version,
                gave=f"--page-size {self.page_size} with {named} on a Qwen3-Next model",
                way_out=f"use a page size that divides {FLA_CHUNK_SIZE} (1, 2, 4, ..., {FLA_CHUNK_SIZE})",
                FLA_CHUNK_SIZE=FLA_CHUNK_SIZE,
                page_size=self.page_size,
            )

    def describe(self) -> dict[str, object]:
        d = {k: v for k, v in asdict(self).items() if k != "geometry"}
        d["model"] = self.geometry.name
        d["resolved_strategy"] = self.resolved_strategy if not self.radix_cache_disabled else None
        d["overlap_schedule"] = self.effective_overlap_schedule
        d["policy"] = self.resolved_policy
        d["policy_source"] = "--policy" if self.policy is not None else "release"
        d["sglang_version"] = self.release.requested or self.release.version
        d["sglang_rules"] = self.release.rules.group
        return d


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """The budget-independent half of one stage's derivation."""

    pp_rank: int
    start_layer: int
    end_layer: int
    stage_linear_layers: int
    max_stage_linear_layers: int
    total_linear_layers: int
    scale: float
    per_req_bytes: int
    stage_per_req_bytes: int
    extra_per_slot_bytes: int
    slots_per_request: int
    own_state_bytes_per_slot: int
    """What this stage really allocates per slot: its own linear layers only."""
    padding_slot_charged: bool
    """Whether the release charges the pool's padding slot (0.5.17+): K + 1 slots instead of K."""
    replayssm_fixed_bytes: int = 0
    """The ReplaySSM ring charged once per running request (GDN, 0.5.20+): off the mamba budget before K
    is solved, and with the state. A ring charged per slot is in ``extra_per_slot_bytes``."""
    replayssm_active: bool = False
    """The release's sizing sees the ReplaySSM ring: it reserves no speculative intermediate state."""


@dataclass(frozen=True, kw_only=True)
class StageCapacity(StagePlan):
    """One stage's full derivation at one budget."""

    branch: str
    """Which pool-sizing branch decided K: A (max_mamba_cache_size), B (no radix + mrr), C (auto-fit)."""
    max_mamba_cache_size: int
    intermediate_state_bytes: int
    kv_budget_gib: float
    max_running_requests: int
    pp_max_micro_batch_size: int
    context_len: int = 0
    """The context length the request estimate divides by (``ModelConfig.context_len``)."""
    kv_attention_layers: int = 0
    """Full-attention layers this stage's KV cell counts (checker.core.sizing.kv_pool)."""
    kv_cell_bytes: int = 0
    """KV bytes per token on one rank of the stage (0: no attention layer here)."""
    kv_available_bytes: int = 0
    """The bytes the state pool left for the KV pool (``int(kv_budget_gib * 2**30)``)."""
    kv_profiled_tokens: int = 0
    """The tokens those bytes hold (or --token-capacity), before --max-total-tokens and alignment."""
    kv_estimate_tokens: int = 0
    """What up to 0.5.9 estimates max_running_requests from: the stage's own profile."""
    kv_own_tokens: int = 0
    """The stage's own KV capacity: what it hands the MIN over the world group."""
    max_total_num_tokens: int = 0
    """The KV pool after the MIN (what SGLang logs as max_total_num_tokens)."""
    kv_idle_bytes: int = 0
    """KV bytes this stage reserved for its own capacity that the MIN leaves unused."""
    kv_limiting: bool = False
    """This stage's own capacity sets the pool for every stage (pp > 1)."""

    @property
    def charged_slots(self) -> int:
        """Slots the sizing takes off the budget: K + 1 from 0.5.17 (the padding slot), K before."""
        return self.max_mamba_cache_size + (1 if self.padding_slot_charged else 0)

    @property
    def state_charged_bytes(self) -> int:
        slots = self.charged_slots * (self.stage_per_req_bytes + self.extra_per_slot_bytes)
        return slots + self.replayssm_fixed_bytes

    @property
    def state_allocated_bytes(self) -> int:
        # The pool allocates its padding slot in every release (memory_pool.py MambaPool); only the
        # charge missed it before 0.5.17.
        return (self.max_mamba_cache_size + 1) * (self.own_state_bytes_per_slot + self.extra_per_slot_bytes)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["state_charged_bytes"] = self.state_charged_bytes
        d["state_allocated_bytes"] = self.state_allocated_bytes
        return d


def policy_scale(policy: str, *, own: int, largest: int, total: int) -> float:
    """The share of ``per_req`` a stage is charged (a Python float, as in SGLang)."""
    if policy == "whole-model":
        return 1.0
    if policy == "own-share":
        return own / total
    return largest / total  # max-share: the busiest stage's share, identical on every rank


def plan_stage(inputs: CapacityInputs, pp_rank: int) -> StagePlan:
    g = inputs.geometry
    if not 0 <= pp_rank < inputs.pp_size:
        raise LayoutError(f"pp_rank {pp_rank} outside [0, {inputs.pp_size})")
    bounds = stage_bounds(stage_partition(g.num_hidden_layers, inputs.pp_size, inputs.partition_env))
    counts = [g.linear_layers_in(s, e) for s, e in bounds]
    start, end = bounds[pp_rank]
    scale = policy_scale(
        inputs.resolved_policy, own=counts[pp_rank], largest=max(counts), total=g.num_linear_layers
    )
    # The flags' refusals first: SGLang checks its server arguments on every rank before any rank
    # loads a model, so a stage that would divide by a 0-byte KV cell never gets that far.
    ring = inputs.ring(scale)
    slots = inputs.slots_per_request()
    a = g.attention
    if a is not None and inputs.token_capacity is None:
        # The layers the stage's KV cell counts: its own, or the whole model's where the class has no
        # stage range. None (a model without attention layers too) is a 0-byte cell: a refusal no budget
        # fixes, so it is made before any pool is sized (raising the budget would only reveal it).
        version = inputs.release.version
        own = counts_own_stage(version, a)
        if (a.layers_in(start, end) if own else len(a.full_attention_layer_ids)) == 0:
            refuse_zero_cell(version, pp_rank=pp_rank, start_layer=start, end_layer=end)
    return StagePlan(
        pp_rank=pp_rank,
        start_layer=start,
        end_layer=end,
        stage_linear_layers=counts[pp_rank],
        max_stage_linear_layers=max(counts),
        total_linear_layers=g.num_linear_layers,
        scale=scale,
        per_req_bytes=g.per_req_bytes,
        stage_per_req_bytes=int(g.per_req_bytes * scale),
        # 0.5.22+: ``extra_per_slot = replayssm_ring_per_slot + int(extra_mamba_cache_bytes_per_req * scale)``
        extra_per_slot_bytes=ring.per_slot_bytes + int(g.extra_per_slot_bytes * scale),
        slots_per_request=slots,
        own_state_bytes_per_slot=counts[pp_rank] * g.bytes_per_layer,
        padding_slot_charged=inputs.release.rules.padding_slot,
        replayssm_fixed_bytes=ring.fixed_bytes,
        replayssm_active=ring.active,
    )


def requests_per_worker(inputs: CapacityInputs) -> int | None:
    """``--max-running-requests // dp`` as the release reads it: floored at 1 from 0.5.23
    (kv_cache_configurator.py ``resolve_max_num_reqs``, ``_handle_max_mamba_cache``), a plain ``//``
    before. None when the flag is unset. Refused when it reaches 0: no budget can start that server."""
    user = inputs.max_running_requests
    if user is None:
        return None
    per_worker = user // inputs.dp_size
    if inputs.release.rules.floor_requests:
        return max(1, per_worker)
    if per_worker <= 0:
        raise FlagError(
            f"--max-running-requests {user} split over --dp-size {inputs.dp_size} gives 0 running "
            f"requests per dp worker; {inputs.release.label} refuses to start (it floors this at 1 only "
            f"from 0.5.23); set it to at least {inputs.dp_size}"
        )
    return per_worker


def kv_token_bound(inputs: CapacityInputs) -> int | None:
    """The most tokens the KV pool can hold after the MIN whatever the budget: --token-capacity (a fixed
    profile) and --max-total-tokens, page-aligned; None when only the budget bounds it."""
    bounds = [b for b in (inputs.token_capacity, inputs.max_total_tokens) if b is not None]
    if not bounds:
        return None
    return min(bounds) // inputs.kv_page_size * inputs.kv_page_size


def request_cap_terms(inputs: CapacityInputs) -> tuple[int, int | None]:
    """Two budget-independent upper bounds on max_running_requests per dp worker before ``K // ratio``:
    ``user // dp`` (as the release floors it) or the estimate ``clamp(int(T / context_len * 512), 2048,
    4096)`` at its largest (4096, or at the KV pool's bound), and ``T // 2`` at the pool's bound (None when
    the budget alone bounds the pool, or the release does not cap that way). The pool itself grows with
    the budget (checker.core.sizing.kv_pool), so these are what no budget lifts."""
    T = kv_token_bound(inputs)
    user = requests_per_worker(inputs)
    context = inputs.resolved_context_len
    assert context is not None  # CapacityInputs refuses a model without one
    rule = inputs.release.rules.request_cap
    # Up to 0.5.9 the estimate reads the stage's own profile, which only --token-capacity fixes.
    estimate_at = inputs.token_capacity if rule == "tp-worker" else T
    ceiling = ESTIMATE_MAX if estimate_at is None else estimate(estimate_at, context)
    if user is not None and rule != "half-tokens":
        # Up to 0.5.9 (tp_worker.py, model_runner.py) a user value is capped by nothing but K // ratio:
        # min(mrr // dp, mrr, K // ratio); 0.5.10-0.5.13 (_resolve_max_num_reqs) by the estimate.
        return (user if rule == "tp-worker" else min(user, ceiling)), None
    first = user if user is not None else ceiling
    return first, (T // 2 if T is not None else None)


def size_pool(plan: StagePlan, inputs: CapacityInputs, budget_gib: float | None = None) -> StageCapacity:
    """Pool size K, then max_running_requests and pp_max_micro_batch_size, with the release's rules
    (pool: ``_handle_max_mamba_cache`` / ``handle_max_mamba_cache``; requests: ``resolve_max_num_reqs``;
    micro-batch: ``max(max_running_requests // pp_size, 1)`` in managers/scheduler.py
    ``Scheduler.__init__``; see docs/sglang-releases.md). Float operations in SGLang's order."""
    given = inputs.budget_gib if budget_gib is None else budget_gib
    pad = 1 if inputs.release.rules.padding_slot else 0
    ratio = plan.slots_per_request
    per_slot = plan.stage_per_req_bytes + plan.extra_per_slot_bytes
    user = requests_per_worker(inputs)  # refuses 0 per worker before 0.5.23
    pool = handle_max_mamba_cache(SCALAR, inputs, plan, given, user=user)
    branch, K, kv_budget_gib = pool.branch, pool.K, pool.kv_gib
    if K <= 0:
        raise BudgetError(
            f"not enough memory for the state pool: --budget-gib {given} gives K={K} slots at "
            f"stage_per_req={plan.stage_per_req_bytes} bytes (stage {plan.pp_rank}); raise the budget or "
            "--mamba-full-memory-ratio"
        )
    if kv_budget_gib <= 0:
        # kv_cache_configurator.py _profile_available_bytes (0.5.14+: model_runner_kv_cache_mixin.py):
        # ``if rest_memory <= 0: raise ValueError("... leave no GPU memory for the KV cache ...")``.
        raise BudgetError(
            f"the state pool ({K + pad} slots x {per_slot} bytes, branch {branch}) leaves "
            f"{kv_budget_gib:.6g} GiB of --budget-gib {given} for the KV cache on stage {plan.pp_rank}, "
            f"and {inputs.release.label} needs more than 0; lower --max-mamba-cache-size or "
            "--max-running-requests, or raise the budget"
        )
    intermediate = pool.intermediate_bytes

    own = stage_kv(plan, inputs, kv_budget_gib, K=K, ratio=ratio)
    alone = StageCapacity(
        **asdict(plan),
        branch=branch,
        max_mamba_cache_size=K,
        intermediate_state_bytes=intermediate,
        kv_budget_gib=kv_budget_gib,
        max_running_requests=0,
        pp_max_micro_batch_size=0,
        context_len=inputs.resolved_context_len,  # type: ignore[arg-type]  # checked in CapacityInputs
        kv_attention_layers=own.attention_layers,
        kv_cell_bytes=own.cell_bytes,
        kv_available_bytes=own.available_bytes,
        kv_profiled_tokens=own.profiled_tokens,
        kv_estimate_tokens=own.estimate_tokens,
        kv_own_tokens=own.own_tokens,
    )
    # As if this stage were the whole pipeline (exact at pp 1); resolve_stages applies the MIN.
    return with_pool(alone, inputs, alone.kv_own_tokens)


def stage_kv(plan: StagePlan, inputs: CapacityInputs, kv_budget_gib: float, *, K: int, ratio: int) -> KvOwn:
    """This stage's own KV pool (checker.core.sizing.kv_pool.own_kv) from the bytes the state pool left."""
    g = inputs.geometry
    version = inputs.release.version
    context = inputs.resolved_context_len
    assert context is not None  # CapacityInputs refuses a model without one
    if g.attention is None:  # a model spec without attention facts: --token-capacity stands for the pool
        code = code_of(version)
        t = profile_tokens(
            SCALAR,
            kv_gib=kv_budget_gib,
            cell=0,
            profile=code.profile,
            order=code.order,
            no_cell_tokens=0,
            token_capacity=inputs.token_capacity,
            max_total_tokens=inputs.max_total_tokens,
            page_size=inputs.kv_page_size,
            context_len=context,
        )
        return KvOwn(
            attention_layers=0,
            cell_bytes=0,
            available_bytes=int(kv_budget_gib * GIB),
            profiled_tokens=t.profiled,
            estimate_tokens=t.estimate_from,
            own_tokens=t.own,
        )
    D = inputs.speculative_num_draft_tokens or 0
    return own_kv(
        version,
        g.attention,
        pp_rank=plan.pp_rank,
        pp_size=inputs.pp_size,
        start_layer=plan.start_layer,
        end_layer=plan.end_layer,
        attn_tp=inputs.tp_size,
        kv_cache_dtype=inputs.kv_cache_dtype,
        kv_budget_gib=kv_budget_gib,
        page_size=inputs.kv_page_size,
        max_total_tokens=inputs.max_total_tokens,
        token_capacity=inputs.token_capacity,
        context_len=context,
        draft_layers=draft_layers_of(
            version, g.attention, speculative=bool(D), draft_path=inputs.speculative_draft_model_path
        ),
        headroom_per_request=spec_headroom(inputs) if D and code_of(version).spec_headroom_at else 0,
        max_running_requests=inputs.max_running_requests,
        max_mamba_cache_size=K,
        slots_per_request=ratio,
    )


def spec_headroom(inputs: CapacityInputs) -> int:
    """Tokens per request an EAGLE target adds to its pool up to 0.5.6.post2: ``steps * topk +
    draft_tokens``. The checker's own --speculative-num-draft-tokens D without an algorithm reads as EAGLE
    with top-k 1, whose draft tokens are steps + 1 (SGLang's rule): D - 1 steps."""
    D = inputs.speculative_num_draft_tokens or 0
    steps, topk = inputs.speculative_num_steps, inputs.speculative_eagle_topk
    if inputs.speculative_algorithm is None or steps is None or topk is None:
        steps, topk = D - 1, 1
    return steps * topk + D


def kv_stage(stage: StageCapacity, inputs: CapacityInputs) -> KvStage:
    """What the resolution after the MIN reads of one stage derived from ``inputs``."""
    return KvStage(
        release=inputs.release.version,
        pp_rank=stage.pp_rank,
        pp_size=inputs.pp_size,
        page_size=inputs.kv_page_size,
        own_tokens=stage.kv_own_tokens,
        profiled_tokens=stage.kv_profiled_tokens,
        estimate_tokens=stage.kv_estimate_tokens,
        cell_bytes=stage.kv_cell_bytes,
        context_len=stage.context_len,
        requests_per_worker=requests_per_worker(inputs),
        user_max_running_requests=inputs.max_running_requests,
        max_mamba_cache_size=stage.max_mamba_cache_size,
        slots_per_request=stage.slots_per_request,
        user_micro=inputs.pp_max_micro_batch_size,
        token_capacity=inputs.token_capacity,
    )


def with_pool(stage: StageCapacity, inputs: CapacityInputs, minimum: int) -> StageCapacity:
    """``stage`` with its pool after a MIN of ``minimum`` over the world's own capacities, and the request
    cap and micro-batch size that gives (checker.core.sizing.kv_pool.resolve_one)."""
    r = resolve_one(kv_stage(stage, inputs), minimum)
    return replace(
        stage,
        max_total_num_tokens=r.max_total_num_tokens,
        max_running_requests=r.max_running_requests,
        pp_max_micro_batch_size=r.pp_max_micro_batch_size,
        kv_idle_bytes=r.idle_bytes,
        kv_limiting=r.limiting,
    )


def resolve_stages(stages: list[StageCapacity], inputs: CapacityInputs) -> list[StageCapacity]:
    """Every stage after SGLang's MIN of their own KV capacities over the world group (each stage's ranks
    hand it the same own capacity, so the MIN over stages is the MIN over ranks)."""
    if not stages:
        return []
    minimum = min(s.kv_own_tokens for s in stages)
    return [with_pool(s, inputs, minimum) for s in stages]


def derive_stage(inputs: CapacityInputs, pp_rank: int, budget_gib: float | None = None) -> StageCapacity:
    """What pipeline stage ``pp_rank`` derives, its KV pool after the MIN over every stage sized from the
    same inputs (a stage that cannot size its own pool is left out of the MIN: its own ranks report why)."""
    own = size_pool(plan_stage(inputs, pp_rank), inputs, budget_gib)
    others = []
    for k in range(inputs.pp_size):
        if k == pp_rank:
            continue
        try:
            others.append(size_pool(plan_stage(inputs, k), inputs, budget_gib).kv_own_tokens)
        except CheckerInputError:
            continue
    return with_pool(own, inputs, min([own.kv_own_tokens, *others]))


def derive_each_stage(derive: Callable[[int], _T], pp_size: int) -> list[_T]:
    """``derive(k)`` for every stage k, or the refusal a user must act on first.

    Each SGLang rank sizes its pool alone and fails alone, so there is no upstream order across
    stages. Within a stage the order is SGLang's (``_handle_max_mamba_cache``: the auto-fit branch's
    ``assert stage_per_req > 0``, then ``max_mamba_cache_size <= 0``, then ``_profile_available_bytes``'s
    ``rest_memory <= 0``), which :func:`size_pool` keeps. Across stages a refusal no budget fixes (a
    :class:`LayoutError` or :class:`FlagError` on any stage) is raised before a :class:`BudgetError`
    on an earlier stage: raising the budget, as the memory error advises, would only reveal it. A sweep
    (``checker.device.sweep``) refuses the same inputs the same way, at every budget.
    """
    results: list[_T] = []
    short: BudgetError | None = None
    for k in range(pp_size):
        try:
            results.append(derive(k))
        except BudgetError as exc:
            short = short or exc
    if short is not None:
        raise short
    return results


def derive_all(inputs: CapacityInputs, budget_gib: float | None = None) -> list[StageCapacity]:
    """Every stage's derivation at ``inputs.budget_gib`` after the MIN over stages (see
    :func:`derive_each_stage` for which refusal is raised when several stages refuse)."""
    own = derive_each_stage(lambda k: size_pool(plan_stage(inputs, k), inputs, budget_gib), inputs.pp_size)
    minimum = min(s.kv_own_tokens for s in own)
    return derive_each_stage(lambda k: with_pool(own[k], inputs, minimum), inputs.pp_size)


def divergent_values(stages: list[StageCapacity], names: tuple[str, ...] = CHECKED_VALUES) -> list[str]:
    """Names of the checked values that differ across stages."""
    return [n for n in names if len({getattr(s, n) for s in stages}) > 1]
