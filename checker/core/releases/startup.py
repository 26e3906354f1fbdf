"""What SGLang resolves from the speculative-decoding flags, and what it refuses at start-up from the
launch flags and the layout, per release (torch-free).

Every refusal here is one of the release's own argument checks, listed per release with file:line in the
generated :mod:`checker.core.releases.arg_checks` (``scripts/build_arg_checks.py``) and classified in
:mod:`checker.core.releases.arg_policy`: the line it prints quotes the release's words and where they are
(:func:`checker.core.releases.arg_quote.quote`), and a release without the check is never refused by it.
:func:`check_launch` makes the ones a launch command's flags decide, in SGLang's order (argument
resolution, then ``check_server_args``).

Each rule below was read from every modelled release's argument handling (``server_args.py``
``ServerArgs.__post_init__`` / ``_handle_speculative_decoding`` up to 0.5.13.post1,
``arg_groups/speculative_hook.py`` ``handle_speculative_decoding`` / ``_handle_eagle_family`` from 0.5.14)
and start-up validation (``server_args.py`` ``check_server_args`` up to 0.5.18,
``arg_groups/validation_hook.py`` from 0.5.19); tests/test_startup.py checks the tables against the
sources of every release it finds. Which start-up refusals are checked and which are not, with why:
docs/preflight.md "Start-up refusals".

**Speculative decoding is on when ``--speculative-algorithm`` is set** (``SpeculativeAlgorithm.
from_string``; the pool sizing asks ``spec_algorithm.is_none()``). For the EAGLE family (EAGLE, EAGLE3,
STANDALONE, and NEXTN, an alias of EAGLE in every release) the release then resolves, before any sizing:
``--max-running-requests`` unset becomes 48; ``--speculative-num-steps`` unset picks steps, top-k and
draft tokens together (``auto_choose_speculative_params``: for a model not in its lists, every hybrid
class the checker reads, (5, 4, 8) up to 0.5.7 and (3, 1, 4) from 0.5.8; STANDALONE (3, 1, 4)), and it
asserts top-k and draft tokens are unset then; with top-k 1 the draft tokens become steps + 1. The
checker's own ``--speculative-num-draft-tokens D`` without an algorithm keeps its meaning: speculative
decoding with D draft tokens (an EAGLE-family stand-in), which needs ``--max-running-requests``.
"""

from __future__ import annotations

from dataclasses import dataclass

from checker.core.errors import FlagError
from checker.core.releases.releases import MODELLED_RELEASES, parse_version, release_model


def refuse(check: str, release: str, *, gave: str, way_out: str, **fields: object) -> None:
    """FlagError, one line: what the user gave, SGLang ``release``'s own check ``check`` (an id of
    :mod:`checker.core.releases.arg_checks`) quoted with its file:line, and the way out; nothing when
    ``release``
    does not have that check (a release the checker does not model is judged by its own code)."""
    if release not in MODELLED_RELEASES:
        return
    # start-up: the table of checks loads only when a check fails
    from checker.core.releases.arg_quote import quote

    quoted = quote(check, release, fields)
    if quoted is None:
        return
    raise FlagError(f"{gave}: SGLang {release} refuses it at start-up ({quoted}); {way_out}")


EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
"""The algorithms whose setup the checker resolves (NEXTN is EAGLE by then)."""
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48
"""``max_running_requests`` an EAGLE-family setup gets when unset (every modelled release)."""
_AUTO_PARAMS = (("0.5.2", (5, 4, 8)), ("0.5.8", (3, 1, 4)))
"""(first release, (steps, top-k, draft tokens)) of ``auto_choose_speculative_params``' last branch:
every model not in its lists (no hybrid class the checker reads is in them)."""
_AUTO_STANDALONE = (3, 1, 4)
FIRST_PP_SPEC = next(v for v in MODELLED_RELEASES if release_model(v).rules.pp_with_spec)
"""The first release that accepts any speculative decoding under pp > 1 (EAGLE only): 0.5.21, from
``ReleaseRules.pp_with_spec``."""
LAST_MIXED_CHUNK_CHECK = "0.5.10.post1"
"""The last release whose ``check_server_args`` names mixed chunked prefill among what PP refuses."""
FIRST_ZERO_MICRO_BATCH_CHECK = "0.5.11"
"""From here ``check_server_args`` asserts ``pp_max_micro_batch_size is None or >= 1`` (before, 0 read
as unset by the scheduler's ``if not pp_max_micro_batch_size``)."""


def _key(release: str) -> tuple[int, int, int, int]:
    return parse_version(release)


def _at_least(release: str, first: str) -> bool:
    return _key(release) >= _key(first)


@dataclass(frozen=True)
class SpecSetup:
    """The speculative setup one release runs from the flags: what the sizing reads."""

    algorithm: str | None
    """After SGLang's alias (NEXTN -> EAGLE), upper case; None: no algorithm was given."""
    draft_tokens: int | None
    """None: speculative decoding is off."""
    max_running_requests: int | None
    note: str = ""
    """What the release resolved itself, for the reports ("" when nothing)."""


def resolve_speculative(
    release: str,
    *,
    algorithm: str | None,
    steps: int | None,
    topk: int | None,
    draft_tokens: int | None,
    max_running_requests: int | None,
) -> SpecSetup:
    """The speculative setup modelled ``release`` resolves from the flags (see the module docstring);
    FlagError for a setup it refuses or an algorithm whose resolution the checker does not model."""
    if algorithm is None:
        if steps is not None or topk is not None:
            raise FlagError(
                "--speculative-num-steps / --speculative-eagle-topk without --speculative-algorithm: SGLang "
                "runs no speculative decoding then; add --speculative-algorithm (e.g. EAGLE) or drop them"
            )
        return SpecSetup(None, draft_tokens, max_running_requests)
    alg = algorithm.strip().upper()
    if alg == "NEXTN":  # every modelled release: "NEXTN shares the same implementation of EAGLE"
        alg = "EAGLE"
    if alg not in EAGLE_FAMILY:
        raise FlagError(
            f"--speculative-algorithm {algorithm}: the checker resolves the EAGLE family's setup only "
            f"(EAGLE, EAGLE3, NEXTN, STANDALONE); how SGLang {release} sizes {alg} is not modelled"
        )
    notes = []
    mrr = max_running_requests
    if mrr is None:
        mrr = SPEC_DEFAULT_MAX_RUNNING_REQUESTS
        notes.append(f"--max-running-requests {mrr}")
    if steps is None:
        if topk is not None or draft_tokens is not None:
            raise FlagError(
                f"--speculative-eagle-topk / --speculative-num-draft-tokens without --speculative-num-steps: "
                f"SGLang {release} refuses it at start-up (it picks all three itself, asserting the other "
                "two unset); give --speculative-num-steps too, or none of them"
            )
        auto = _AUTO_STANDALONE if alg == "STANDALONE" else auto_params(release)
        steps, topk, draft_tokens = auto
        notes.append(f"steps {steps}, top-k {topk}, draft tokens {draft_tokens}")
    elif topk is None:
        raise FlagError(
            f"--speculative-num-steps {steps} without --speculative-eagle-topk: SGLang {release} compares "
            "the top-k with 1 and fails at start-up; give --speculative-eagle-topk (and the draft tokens)"
        )
    if topk == 1 and draft_tokens != steps + 1:
        draft_tokens = steps + 1  # "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1"
        notes.append(f"draft tokens {draft_tokens} (steps + 1 with top-k 1)")
    if draft_tokens is None:
        raise FlagError(
            f"--speculative-eagle-topk {topk} without --speculative-num-draft-tokens: SGLang {release} "
            "sizes the speculative state from the draft tokens and has none; give "
            "--speculative-num-draft-tokens"
        )
    note = f"SGLang {release} resolves {alg}: {', '.join(notes)}" if notes else ""
    return SpecSetup(alg, draft_tokens, mrr, note)


def auto_params(release: str) -> tuple[int, int, int]:
    """``auto_choose_speculative_params``' (steps, top-k, draft tokens) for a hybrid model on ``release``."""
    return next(p for first, p in reversed(_AUTO_PARAMS) if _at_least(release, first))


# The checks of speculative decoding under PP, by release (ids of checker.core.releases.arg_checks).
PP_REFUSES_SPEC_MIXED = "pipeline-parallelism-is-not-compatible-with-5a84b7"  # 0.5.2-0.5.10.post1
PP_REFUSES_SPEC = "pipeline-parallelism-is-not-compatible-with-f3d63d"  # 0.5.11-0.5.20 (not NPU)
PP_EAGLE_ONLY = "pipeline-parallelism-currently-only-supports-2364c4"  # 0.5.21+ (0.5.20 NPU)
PP_SPEC_PREFILL_ONLY = "pp-speculative-decoding-mtp-is-only-c33382"  # 0.5.21+, no SGLANG_ENABLE_PP_SPEC
PP_SPEC_NOT_DISAGG = "sglang-enable-pp-spec-is-not-compatible-with-2f6cf0"  # 0.5.21+
PP_SPEC_NOT_ADAPTIVE = "sglang-enable-pp-spec-is-not-compatible-with-3f332d"  # 0.5.21+
PP_SPEC_NOT_DP_ATTENTION = "sglang-enable-pp-spec-is-not-compatible-with-9b4341"  # 0.5.21
PP_SPEC_NOT_ATTN_DP = "sglang-enable-pp-spec-is-not-compatible-with-95e70d"  # 0.5.22+
PP_DSPARK_PREFILL = "pipeline-parallel-dspark-requires-8c2684"  # 0.5.21+
PP_DSPARK_NOT_PP_SPEC = "sglang-enable-pp-spec-does-not-support-702160"  # 0.5.21+


def check_pp_spec(
    release: str,
    *,
    pp_size: int,
    algorithm: str | None,
    speculative: bool,
    pp_spec_env: bool,
    attention_dp: bool,
    multi_layer_eagle: bool = False,
    disaggregation_mode: str = "null",
    adaptive: bool = False,
) -> None:
    """FlagError where ``release`` refuses speculative decoding under ``pp_size`` > 1 at start-up.
    ``algorithm``: after :func:`resolve_speculative` (None with ``speculative``: the checker's own
    --speculative-num-draft-tokens stand-in, read as EAGLE); ``pp_spec_env``: SGLANG_ENABLE_PP_SPEC set
    truthy; ``attention_dp``: attention DP > 1; the rest are launch-command flags (their defaults: not
    given).

    * 0.5.2-0.5.20: any algorithm (``check_server_args``: ``assert disable_overlap_schedule and
      speculative_algorithm is None``; 0.5.20 lets EAGLE through on NPU only, not modelled).
    * 0.5.21+ (``validation_hook.py`` ``check_pipeline_parallel_compat``): DSPARK only on a prefill node
      and without SGLANG_ENABLE_PP_SPEC; otherwise EAGLE only, not multi-layer; with SGLANG_ENABLE_PP_SPEC
      not on a PD node, not adaptive, not with attention DP; without it only on a prefill node
      (``--disaggregation-mode prefill``, whose pools the checker does not model).
    """
    if pp_size <= 1 or not speculative or release not in MODELLED_RELEASES:
        return
    pp = f"--pp-size {pp_size}"
    if not release_model(release).rules.pp_with_spec:
        refuse(
            PP_REFUSES_SPEC if _at_least(release, "0.5.11") else PP_REFUSES_SPEC_MIXED,
            release,
            gave=f"speculative decoding with {pp}",
            way_out=f"drop speculative decoding, use --pp-size 1, or SGLang {FIRST_PP_SPEC} or later (EAGLE)",
        )
        return
    alg = algorithm or "EAGLE"
    if alg == "DSPARK":
        if disaggregation_mode != "prefill":
            refuse(
                PP_DSPARK_PREFILL,
                release,
                gave=f"--speculative-algorithm DSPARK with {pp}",
                way_out="run DSPARK under PP only on a prefill node, or use --pp-size 1",
            )
        if pp_spec_env:
            refuse(
                PP_DSPARK_NOT_PP_SPEC,
                release,
                gave=f"--speculative-algorithm DSPARK with {pp} and SGLANG_ENABLE_PP_SPEC",
                way_out="unset SGLANG_ENABLE_PP_SPEC on the prefill node",
            )
        return  # then the algorithm itself is not modelled (resolve_speculative)
    if alg != "EAGLE" or multi_layer_eagle:
        gave = f"--speculative-algorithm {alg}" + (" --enable-multi-layer-eagle" if multi_layer_eagle else "")
        refuse(
            PP_EAGLE_ONLY,
            release,
            gave=f"{gave} with {pp}",
            way_out="use EAGLE (or NEXTN) without --enable-multi-layer-eagle, or --pp-size 1",
        )
    if not pp_spec_env:
        refuse(
            PP_SPEC_PREFILL_ONLY,
            release,
            gave=f"speculative decoding with {pp} and SGLANG_ENABLE_PP_SPEC unset",
            way_out="export SGLANG_ENABLE_PP_SPEC=1 on every node (a prefill node's pools are not modelled), "
            "or use --pp-size 1",
        )
        return
    if disaggregation_mode != "null":
        refuse(
            PP_SPEC_NOT_DISAGG,
            release,
            gave=f"SGLANG_ENABLE_PP_SPEC with --disaggregation-mode {disaggregation_mode}",
            way_out="unset SGLANG_ENABLE_PP_SPEC on a PD node, or drop --disaggregation-mode",
        )
    if adaptive:
        refuse(
            PP_SPEC_NOT_ADAPTIVE,
            release,
            gave=f"SGLANG_ENABLE_PP_SPEC with --speculative-adaptive and {pp}",
            way_out="drop --speculative-adaptive, or use --pp-size 1",
        )
    if attention_dp:
        refuse(
            PP_SPEC_NOT_DP_ATTENTION if not _at_least(release, "0.5.22") else PP_SPEC_NOT_ATTN_DP,
            release,
            gave=f"SGLANG_ENABLE_PP_SPEC with attention DP and {pp}",
            way_out="drop attention DP or speculative decoding",
        )


def check_mixed_chunk(release: str, *, pp_size: int, enable_mixed_chunk: bool, speculative: bool) -> None:
    """0.5.2-0.5.10.post1 refuse ``--enable-mixed-chunk`` under pp > 1 (``check_server_args``). An
    EAGLE-family setup turns mixed chunking off first ("Mixed chunked prefill is disabled because of
    using eagle speculative decoding"): its own refusal under PP is :func:`check_pp_spec`'s."""
    if pp_size <= 1 or not enable_mixed_chunk or speculative:
        return
    refuse(
        PP_REFUSES_SPEC_MIXED,
        release,
        gave=f"--enable-mixed-chunk with --pp-size {pp_size}",
        way_out="drop --enable-mixed-chunk or use SGLang 0.5.11 or later",
    )


def zero_micro_batch_refused(release: str) -> bool:
    """Whether ``release`` refuses ``--pp-max-micro-batch-size 0`` at start-up (0.5.11+); before, the
    scheduler reads 0 as unset (``if not pp_max_micro_batch_size``)."""
    return _at_least(release, FIRST_ZERO_MICRO_BATCH_CHECK)
