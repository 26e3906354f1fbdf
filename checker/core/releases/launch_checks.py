"""The start-up checks SGLang makes from a launch command's flags beyond the sizing inputs (``--nnodes``,
``--enable-multi-layer-eagle``, ``--min-free-slots-delay``, the ReplaySSM rings, ...), per release and in its
order (torch-free).

Each check is one of :mod:`checker.core.releases.arg_checks` (generated from every release's code), handled as
modelled in :mod:`checker.core.releases.check_policy`; a refusal quotes the release's words and file:line
(:func:`checker.core.releases.startup.refuse`). Loaded only when a launch command is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.core.releases.releases import MODELLED_RELEASES, parse_version
from checker.core.releases.startup import check_mixed_chunk, check_pp_spec, refuse


def _at_least(release: str, first: str) -> bool:
    return parse_version(release) >= parse_version(first)


# The other checks a launch command's flags decide (ids of checker.core.releases.arg_checks).
NNODES_DIVIDES = "tp-size-must-be-divisible-by-number-of-nodes-f971ad"  # every release
DP_MULTI_NODE = "multi-node-data-parallel-is-not-supported-4ebc11"  # 0.5.2-0.5.21
DP_REPLICAS_MULTI_NODE = "multi-node-data-parallel-replicas-are-not-99088a"  # 0.5.22+
DP_REPLICAS_WITH_ATTN_DP = "dp-size-dp-size-with-attn-dp-size-attn-dp-4bb24a"  # 0.5.22+
ATTN_DP_POSITIVE = "attn-dp-size-must-be-positive-got-attn-dp-64c6e3"  # 0.5.22+
MIN_FREE_SLOTS_UNDER_PP = "min-free-slots-delay-is-not-supported-with-831ff7"  # 0.5.18+
CHUNK_DIVIDES_PAGE = "chunked-prefill-size-must-be-divisible-by-1800ce"  # every release
STANDALONE_NOT_DP_ATTENTION = "currently-standalone-speculative-decoding-768f82"  # every release
DP_LM_HEAD_NEEDS_DP_ATTENTION = "please-enable-dp-attention-when-setting-25d166"  # 0.5.2-0.5.21
DP_LM_HEAD_NEEDS_ATTN_DP = "enable-dp-lm-head-requires-attention-dp-attn-02bac5"  # 0.5.22+
# The ReplaySSM rings' checks (0.5.16: --enable-gdn-replayssm-spec; 0.5.17+ --enable-linear-replayssm-spec).
REPLAY_CHAIN = (
    "enable-gdn-replayssm-spec-requires-a-linear-71730c",
    "enable-linear-replayssm-spec-requires-a-2d827d",
)
REPLAY_SPEC_NOT_EXTRA_BUFFER = "enable-gdn-replayssm-spec-is-not-yet-b518a1"  # 0.5.16
REPLAY_SPEC_NOT_DISAGG = "enable-gdn-replayssm-spec-is-not-supported-ababfc"  # 0.5.16
REPLAY_SPEC_NOT_PREFILL = "enable-linear-replayssm-spec-is-not-2a086b"  # 0.5.17+
REPLAY_EXCLUSIVE = (
    "enable-gdn-replayssm-spec-and-enable-linear-a46440",
    "enable-linear-replayssm-spec-and-enable-af8c51",
)
REPLAY_RING_POWER_OF_TWO = "linear-replayssm-cache-len-must-be-a-power-664ead"  # 0.5.16
REPLAY_SPEC_FP32 = "enable-gdn-replayssm-spec-requires-mamba-ssm-683c80"  # 0.5.16
REPLAY_RING_TWICE_DRAFTS = "linear-replayssm-cache-len-must-be-2-the-3a4b5a"  # 0.5.16
DECODE_RING_NO_BUFFER = (
    "enable-linear-replayssm-requires-mamba-8c43a4",
    "enable-linear-replayssm-requires-mamba-radix-448541",
)
DECODE_RING_NOT_DISAGG = "enable-linear-replayssm-is-not-supported-7ddf3f"  # 0.5.15+
DECODE_RING_LENGTH = "linear-replayssm-cache-len-must-be-1-got-a37bc7"  # 0.5.15+


@dataclass(frozen=True, kw_only=True)
class LaunchFacts:
    """What a launch command gives SGLang's argument checks, by ServerArgs name, as typed (before the
    release's resolution rewrites any of it). Defaults are every release's own."""

    release: str
    pp_size: int = 1
    tp_size: int = 1
    """SGLang's --tp-size: the whole TP group of one stage (attention DP included)."""
    dp_size: int = 1
    nnodes: int = 1
    enable_dp_attention: bool = False
    attn_dp_size: int = 1
    """0.5.22+; ``--enable-dp-attention --dp-size N`` becomes ``--attn-dp-size N`` there."""
    speculative_algorithm: str | None = None
    """As typed (NEXTN is EAGLE, in any case)."""
    speculative: bool = False
    """Speculative decoding on: an algorithm, or the checker's own --speculative-num-draft-tokens."""
    draft_tokens: int | None = None
    """The draft tokens the release resolves (checker.core.releases.startup.resolve_speculative)."""
    speculative_eagle_topk: int | None = None
    enable_multi_layer_eagle: bool = False
    speculative_adaptive: bool = False
    disaggregation_mode: str = "null"
    min_free_slots_delay: object = None
    pp_spec_env: bool = False
    chunked_prefill_size: int | None = None
    page_size: int | None = None
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    mamba_radix_cache_strategy: str = "auto"
    enable_mixed_chunk: bool = False
    enable_dp_lm_head: bool = False
    ep_join_mode: str | None = None
    enable_linear_replayssm: bool = False
    enable_linear_replayssm_spec: bool = False
    linear_replayssm_cache_len: int | None = None
    mamba_ssm_dtype: str | None = None

    @property
    def algorithm(self) -> str | None:
        alg = (self.speculative_algorithm or "").strip().upper() or None
        return "EAGLE" if alg == "NEXTN" else alg

    @property
    def attention_layout(self) -> tuple[int, int, bool]:
        """(data-parallel replicas, attention-DP size, attention DP on) as the release resolves them:
        0.5.22+ ``handle_deprecated_dp_attention`` turns ``--enable-dp-attention --dp-size N`` into
        ``--attn-dp-size N`` (replicas 1); before, attention DP is the switch with --dp-size."""
        if not _at_least(self.release, "0.5.22"):
            dp = self.dp_size
            return dp, (dp if self.enable_dp_attention else 1), self.enable_dp_attention
        dp, attn = self.dp_size, self.attn_dp_size
        if self.enable_dp_attention and attn == 1:
            dp, attn = 1, self.dp_size
        return dp, attn, attn > 1

    def extra_buffer(self) -> bool | None:
        """Whether the mamba cache strategy resolves to an extra buffer (None: the release decides it by
        the model's architecture, which the launch command does not say: 0.5.15-0.5.15.post1 ``auto``)."""
        s = self.mamba_radix_cache_strategy
        if self.disable_radix_cache:
            return False
        if s != "auto":
            return s.startswith("extra_buffer")
        if not _at_least(self.release, "0.5.16"):
            return None if _at_least(self.release, "0.5.14") else False
        # auto: extra_buffer when the user's overlap schedule is on or the page size is above 1
        # (before the pipeline pass turns overlap off; checker.core.sizing.sizing resolved_strategy).
        return not self.disable_overlap_schedule or (self.page_size or 1) > 1


def check_launch(f: LaunchFacts) -> None:
    """The start-up checks ``f.release`` makes from a launch command's flags, in its order: the argument
    resolution's (attention DP, the ReplaySSM rings, the DP LM head), then ``check_server_args``' (the
    nodes, PP's, multi-node DP, chunked prefill). FlagError quoting the first that fails."""
    release = f.release
    if release not in MODELLED_RELEASES:
        return
    replicas, attn_dp, attention_dp = f.attention_layout
    # -- argument resolution --------------------------------------------------------------------------
    if _at_least(release, "0.5.22"):
        if f.attn_dp_size < 1:
            refuse(
                ATTN_DP_POSITIVE,
                release,
                gave=f"--attn-dp-size {f.attn_dp_size}",
                way_out="give a positive --attn-dp-size (1: no attention DP)",
                attn_dp_size=f.attn_dp_size,
            )
        if attn_dp > 1 and replicas > 1:
            refuse(
                DP_REPLICAS_WITH_ATTN_DP,
                release,
                gave=f"--dp-size {replicas} with --attn-dp-size {attn_dp}",
                way_out="give --attn-dp-size alone (replicas are separate deployments)",
                dp_size=replicas,
                attn_dp_size=attn_dp,
            )
    if f.algorithm == "STANDALONE" and attention_dp:
        refuse(
            STANDALONE_NOT_DP_ATTENTION,
            release,
            gave="--speculative-algorithm STANDALONE with attention DP",
            way_out="use EAGLE, or drop attention DP",
        )
    _check_rings(f)
    if f.enable_dp_lm_head and not attention_dp:
        refuse(
            DP_LM_HEAD_NEEDS_ATTN_DP if _at_least(release, "0.5.22") else DP_LM_HEAD_NEEDS_DP_ATTENTION,
            release,
            gave="--enable-dp-lm-head without attention DP",
            way_out="drop --enable-dp-lm-head, or enable attention DP",
        )
    # -- check_server_args ------------------------------------------------------------------------------
    if f.nnodes >= 1 and (f.tp_size * f.pp_size) % f.nnodes and f.ep_join_mode != "scale":
        refuse(
            NNODES_DIVIDES,
            release,
            gave=f"--tp-size {f.tp_size} --pp-size {f.pp_size} --nnodes {f.nnodes}",
            way_out=f"make --tp-size x --pp-size ({f.tp_size * f.pp_size} GPUs) a multiple of --nnodes "
            f"{f.nnodes}, or use --nnodes {_divisors(f.tp_size * f.pp_size)}",
        )
    if f.pp_size > 1:
        check_pp_spec(
            release,
            pp_size=f.pp_size,
            algorithm=f.algorithm,
            speculative=f.speculative,
            pp_spec_env=f.pp_spec_env,
            attention_dp=attention_dp,
            multi_layer_eagle=f.enable_multi_layer_eagle,
            disaggregation_mode=f.disaggregation_mode,
            adaptive=f.speculative_adaptive,
        )
        check_mixed_chunk(
            release, pp_size=f.pp_size, enable_mixed_chunk=f.enable_mixed_chunk, speculative=f.speculative
        )
        if f.min_free_slots_delay is not None:
            refuse(
                MIN_FREE_SLOTS_UNDER_PP,
                release,
                gave=f"--min-free-slots-delay {f.min_free_slots_delay} with --pp-size {f.pp_size}",
                way_out="drop --min-free-slots-delay, or use --pp-size 1",
            )
    if _at_least(release, "0.5.22"):
        if replicas > 1 and f.nnodes != 1:
            refuse(
                DP_REPLICAS_MULTI_NODE,
                release,
                gave=f"--dp-size {replicas} with --nnodes {f.nnodes}",
                way_out="use attention DP across nodes (--attn-dp-size), or keep each replica on one node "
                "(--nnodes 1)",
            )
    elif f.dp_size > 1 and f.nnodes != 1 and not f.enable_dp_attention:
        refuse(
            DP_MULTI_NODE,
            release,
            gave=f"--dp-size {f.dp_size} with --nnodes {f.nnodes} and no --enable-dp-attention",
            way_out="add --enable-dp-attention (attention DP across nodes), or keep each replica on one node "
            "(--nnodes 1)",
        )
    chunk, page = f.chunked_prefill_size, f.page_size
    if chunk is not None and chunk > 0 and page and f.disaggregation_mode != "decode" and chunk % page:
        refuse(
            CHUNK_DIVIDES_PAGE,
            release,
            gave=f"--chunked-prefill-size {chunk} with --page-size {page}",
            way_out=f"use a --chunked-prefill-size that is a multiple of {page}",
        )


def _check_rings(f: LaunchFacts) -> None:
    """The ReplaySSM rings' checks (``_handle_linear_attn_backend`` / ``attention_hook.py``
    ``handle_linear_attn_backend``) that the flags decide; the decode backend's are the GPU's."""
    release = f.release
    if f.enable_linear_replayssm:
        extra = f.extra_buffer()
        if extra:
            for check in DECODE_RING_NO_BUFFER:
                refuse(
                    check,
                    release,
                    gave="--enable-linear-replayssm with an extra-buffer mamba cache strategy",
                    way_out="use --mamba-radix-cache-strategy no_buffer --disable-overlap-schedule "
                    "(page size 1), "
                    "or drop --enable-linear-replayssm",
                    mamba_radix_cache_strategy=f.mamba_radix_cache_strategy,
                    mamba_scheduler_strategy=f.mamba_radix_cache_strategy,
                )
        if f.disaggregation_mode != "null":
            refuse(
                DECODE_RING_NOT_DISAGG,
                release,
                gave=f"--enable-linear-replayssm with --disaggregation-mode {f.disaggregation_mode}",
                way_out="drop --enable-linear-replayssm on a PD node",
                disaggregation_mode=f.disaggregation_mode,
            )
        length = f.linear_replayssm_cache_len
        if length is not None and length < 1:
            refuse(
                DECODE_RING_LENGTH,
                release,
                gave=f"--linear-replayssm-cache-len {length}",
                way_out="give a ring length of at least 1 (default 16)",
                linear_replayssm_cache_len=length,
            )
    if not f.enable_linear_replayssm_spec:
        return
    flag = "--enable-gdn-replayssm-spec" if release == "0.5.16" else "--enable-linear-replayssm-spec"
    topk = f.speculative_eagle_topk
    if topk not in (None, 1):
        for check in REPLAY_CHAIN:
            refuse(
                check,
                release,
                gave=f"{flag} with --speculative-eagle-topk {topk}",
                way_out=f"use --speculative-eagle-topk 1 (a linear draft chain), or drop {flag}",
                speculative_eagle_topk=topk,
            )
    if release == "0.5.16":
        if f.extra_buffer():
            refuse(
                REPLAY_SPEC_NOT_EXTRA_BUFFER,
                release,
                gave=f"{flag} with an extra-buffer mamba cache strategy",
                way_out="use --disable-radix-cache or --mamba-radix-cache-strategy no_buffer",
            )
        if f.disaggregation_mode != "null":
            refuse(
                REPLAY_SPEC_NOT_DISAGG,
                release,
                gave=f"{flag} with --disaggregation-mode {f.disaggregation_mode}",
                way_out=f"drop {flag} on a PD node",
                disaggregation_mode=f.disaggregation_mode,
            )
    elif f.disaggregation_mode == "prefill":
        refuse(
            REPLAY_SPEC_NOT_PREFILL,
            release,
            gave=f"{flag} with --disaggregation-mode prefill",
            way_out=f"drop {flag} on the prefill server",
        )
    if f.enable_linear_replayssm:
        for check in REPLAY_EXCLUSIVE:
            refuse(
                check,
                release,
                gave=f"{flag} with --enable-linear-replayssm",
                way_out="use one of the two rings",
            )
    if release == "0.5.16":
        length = f.linear_replayssm_cache_len if f.linear_replayssm_cache_len is not None else 16
        if length < 1 or length & (length - 1):
            refuse(
                REPLAY_RING_POWER_OF_TWO,
                release,
                gave=f"{flag} with --linear-replayssm-cache-len {length}",
                way_out="give a power of two",
                ring_len=length,
            )
        if f.mamba_ssm_dtype is not None and f.mamba_ssm_dtype != "float32":
            refuse(
                REPLAY_SPEC_FP32,
                release,
                gave=f"{flag} with --mamba-ssm-dtype {f.mamba_ssm_dtype}",
                way_out="use --mamba-ssm-dtype float32",
                mamba_ssm_dtype=f.mamba_ssm_dtype,
            )
        drafts = f.draft_tokens
        if drafts is not None and length < 2 * drafts:
            refuse(
                REPLAY_RING_TWICE_DRAFTS,
                release,
                gave=f"{flag} with --linear-replayssm-cache-len {length} and {drafts} draft tokens",
                way_out=f"give --linear-replayssm-cache-len {_next_power_of_two(2 * drafts)} or more",
                ring_len=length,
                max_drafts=drafts,
            )


def _divisors(n: int) -> str:
    """``1, 2 or 4``: the node counts that divide ``n`` GPUs (the first few)."""
    found = [d for d in range(1, min(n, 4096) + 1) if n % d == 0][:6]
    return ", ".join(map(str, found[:-1])) + f" or {found[-1]}" if len(found) > 1 else str(found[0])


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
