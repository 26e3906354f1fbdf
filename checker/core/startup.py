"""What SGLang resolves from the speculative-decoding flags, and what it refuses at start-up from the
launch flags and the layout, per release (torch-free).

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
from checker.core.releases import MODELLED_RELEASES, parse_version, release_model

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


def _validation_file(release: str) -> str:
    """Where ``check_server_args`` lives in ``release``."""
    return "arg_groups/validation_hook.py" if _at_least(release, "0.5.19") else "server_args.py"


def _pp_message(release: str) -> str:
    """SGLang's own words when PP refuses speculative decoding (0.5.2-0.5.20)."""
    mixed = ", mixed chunked prefill." if not _at_least(release, "0.5.11") else ""
    return f"Pipeline parallelism is not compatible with overlap schedule, speculative decoding{mixed}"


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


def check_pp_spec(
    release: str,
    *,
    pp_size: int,
    algorithm: str | None,
    speculative: bool,
    pp_spec_env: bool,
    attention_dp: bool,
) -> None:
    """FlagError where ``release`` refuses speculative decoding under ``pp_size`` > 1 at start-up.
    ``algorithm``: after :func:`resolve_speculative` (None with ``speculative``: the checker's own
    --speculative-num-draft-tokens stand-in, read as EAGLE); ``pp_spec_env``: SGLANG_ENABLE_PP_SPEC set
    truthy; ``attention_dp``: attention DP > 1.

    * 0.5.2-0.5.20: any algorithm (``check_server_args``: ``assert disable_overlap_schedule and
      speculative_algorithm is None``; 0.5.20 lets EAGLE through on NPU only, not modelled).
    * 0.5.21+ (``validation_hook.py`` ``check_pipeline_parallel_compat``): EAGLE only, not multi-layer;
      with SGLANG_ENABLE_PP_SPEC not with attention DP; without it only on a prefill node
      (``--disaggregation-mode prefill``, whose pools the checker does not model).
    """
    if pp_size <= 1 or not speculative or release not in MODELLED_RELEASES:
        return
    where = f"sglang/srt/{_validation_file(release)}"
    if not release_model(release).rules.pp_with_spec:
        raise FlagError(
            f"speculative decoding with --pp-size {pp_size}: SGLang {release} refuses it at start-up "
            f'({where} check_server_args: "{_pp_message(release)}"); drop speculative decoding, use '
            f"--pp-size 1, or SGLang {FIRST_PP_SPEC} or later (EAGLE)"
        )
    alg = algorithm or "EAGLE"
    if alg != "EAGLE":
        raise FlagError(
            f"--speculative-algorithm {alg} with --pp-size {pp_size}: SGLang {release} refuses it at "
            f'start-up ({where}: "Pipeline parallelism currently only supports EAGLE (non-multi-layer) '
            'speculative decoding"); use EAGLE (or NEXTN), or --pp-size 1'
        )
    if not pp_spec_env:
        raise FlagError(
            f"speculative decoding with --pp-size {pp_size}: SGLang {release} starts it only with "
            f'SGLANG_ENABLE_PP_SPEC=1, or on a prefill node ({where}: "PP + speculative decoding (MTP) is '
            'only supported on prefill nodes (disaggregation-mode=prefill)"), whose pools the checker does '
            "not model; export SGLANG_ENABLE_PP_SPEC=1 on every node, or use --pp-size 1"
        )
    if attention_dp:
        raise FlagError(
            f"SGLANG_ENABLE_PP_SPEC with attention DP: SGLang {release} refuses it at start-up ({where}: "
            '"SGLANG_ENABLE_PP_SPEC is not compatible with attention DP"); drop attention DP or speculative '
            "decoding"
        )


def check_mixed_chunk(release: str, *, pp_size: int, enable_mixed_chunk: bool, speculative: bool) -> None:
    """0.5.2-0.5.10.post1 refuse ``--enable-mixed-chunk`` under pp > 1 (``check_server_args``). An
    EAGLE-family setup turns mixed chunking off first ("Mixed chunked prefill is disabled because of
    using eagle speculative decoding"): its own refusal under PP is :func:`check_pp_spec`'s."""
    if pp_size <= 1 or not enable_mixed_chunk or speculative or release not in MODELLED_RELEASES:
        return
    if _at_least(release, "0.5.11"):
        return
    raise FlagError(
        f"--enable-mixed-chunk with --pp-size {pp_size}: SGLang {release} refuses it at start-up "
        f'(sglang/srt/server_args.py check_server_args: "{_pp_message(release)}"); drop --enable-mixed-chunk '
        "or use SGLang 0.5.11 or later"
    )


def zero_micro_batch_refused(release: str) -> bool:
    """Whether ``release`` refuses ``--pp-max-micro-batch-size 0`` at start-up (0.5.11+); before, the
    scheduler reads 0 as unset (``if not pp_max_micro_batch_size``)."""
    return _at_least(release, FIRST_ZERO_MICRO_BATCH_CHECK)
