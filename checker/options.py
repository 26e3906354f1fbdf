"""The model and flag options every command shares (SGLang's flag names), and how they become inputs.

Kept free of torch so ``--help`` and bad-input errors cost no torch import.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping

from checker.core.geometry import resolve_dtypes
from checker.core.models import DEFAULT_MODEL, PRESETS, load_geometry
from checker.core.partition import PARTITION_ENV
from checker.core.sizing import POLICIES, STRATEGIES, CapacityInputs, env_flag

DEFAULT_BUDGET_GIB = 8.0
# Env vars that change what a rank derives; each one joins the preflight's input digests.
RELEVANT_ENV = (
    PARTITION_ENV,
    "SGLANG_MAMBA_CONV_DTYPE",
    "SGLANG_MAMBA_SSM_DTYPE",
    "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK",
)


def int_at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``, with a one-line reason otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise argparse.ArgumentTypeError(f"{value} must be {what}")
        return value

    return parse


positive_int = int_at_least(1)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    m = g.add_mutually_exclusive_group()
    m.add_argument(
        "--model",
        metavar="NAME",
        help=f"built-in preset ({', '.join(PRESETS)}); default {DEFAULT_MODEL} when no config is given",
    )
    m.add_argument(
        "--model-config",
        metavar="PATH",
        help="an HF config.json (Qwen3-Next, Qwen3.5, Kimi-Linear, Nemotron-H, Falcon-H1, "
        "Granite-4.0-H) or a JSON model spec (see README)",
    )


def add_layout_args(parser: argparse.ArgumentParser, *, pp_default: int | None) -> None:
    g = parser.add_argument_group("parallel layout")
    g.add_argument(
        "--pp-size",
        type=positive_int,
        default=pp_default,
        help="pipeline-parallel size P"
        + (f" (default {pp_default})" if pp_default else " (default: world_size // tp_size)"),
    )
    g.add_argument("--tp-size", type=positive_int, default=1, help="attention TP size (default 1)")
    g.add_argument("--dp-size", type=positive_int, default=1, help="attention DP size (default 1)")


def add_flag_args(
    parser: argparse.ArgumentParser, *, with_budget: bool = True, with_policy: bool = True
) -> None:
    """``with_policy=False``: the command adds its own --policy (a sweep takes it repeatable)."""
    g = parser.add_argument_group("sizing flags (SGLang server-arg names)")
    if with_budget:
        g.add_argument(
            "--budget-gib",
            type=finite_float,
            default=None,
            metavar="GIB",
            help="total_rest_memory handed to pool sizing: GiB left for the KV and state pools "
            f"(default {DEFAULT_BUDGET_GIB}, the upstream test's)",
        )
    if with_policy:
        g.add_argument(
            "--policy",
            choices=POLICIES,
            default="max-share",
            help="how a stage is charged for state: max-share (SGLang since the fix, default), "
            "own-share (rejected alternative), whole-model (the old bug)",
        )
    g.add_argument("--mamba-full-memory-ratio", type=finite_float, default=0.9, metavar="R",
                   help="r: the state pool's share is r/(1+r) of the budget (default 0.9)")
    g.add_argument("--mamba-radix-cache-strategy", choices=STRATEGIES, default="auto",
                   help="default auto: extra_buffer unless --disable-overlap-schedule with page_size 1 "
                   "(then no_buffer); under pp > 1 extra_buffer runs without overlap: 4 slots. "
                   "An explicit no_buffer needs --disable-overlap-schedule and page_size 1, as in SGLang")
    g.add_argument("--page-size", type=positive_int, default=1)
    g.add_argument("--disable-radix-cache", action="store_true")
    g.add_argument("--disable-overlap-schedule", action="store_true",
                   help="(forced on by SGLang whenever pp size > 1)")
    g.add_argument("--max-running-requests", type=positive_int, metavar="N")
    g.add_argument("--max-mamba-cache-size", type=positive_int, metavar="K")
    g.add_argument("--pp-max-micro-batch-size", type=positive_int, metavar="N")
    g.add_argument("--speculative-num-draft-tokens", type=positive_int, metavar="D")
    g.add_argument("--mamba-ssm-dtype", metavar="DTYPE",
                   help="temporal state dtype (float32, bfloat16, float16); sets SGLANG_MAMBA_SSM_DTYPE")
    g.add_argument("--token-capacity", type=positive_int, metavar="T",
                   help="KV token capacity; unset means it does not bind")
    g.add_argument("--context-len", type=positive_int, metavar="N",
                   help="context length for the running-request estimate (default: the config's)")


def relevant_env(env: Mapping[str, str]) -> dict[str, str | None]:
    return {k: env.get(k) for k in RELEVANT_ENV}


def inputs_from_args(
    args: argparse.Namespace,
    *,
    env: Mapping[str, str] | None = None,
    pp_size: int | None = None,
    budget_gib: float | None = None,
    policy: str | None = None,
) -> CapacityInputs:
    """Build one rank's :class:`CapacityInputs`; raises CheckerInputError on anything invalid."""
    env = os.environ if env is None else env
    geometry = load_geometry(model=args.model, model_config=args.model_config, tp_size=args.tp_size)
    geometry = resolve_dtypes(geometry, env=env, mamba_ssm_dtype=args.mamba_ssm_dtype)
    budget = budget_gib if budget_gib is not None else getattr(args, "budget_gib", None)
    return CapacityInputs(
        geometry=geometry,
        budget_gib=DEFAULT_BUDGET_GIB if budget is None else budget,
        pp_size=pp_size or args.pp_size,
        tp_size=args.tp_size,
        dp_size=args.dp_size,
        policy=policy or args.policy,
        mamba_full_memory_ratio=args.mamba_full_memory_ratio,
        mamba_radix_cache_strategy=args.mamba_radix_cache_strategy,
        page_size=args.page_size,
        disable_radix_cache=args.disable_radix_cache,
        disable_overlap_schedule=args.disable_overlap_schedule,
        max_running_requests=args.max_running_requests,
        max_mamba_cache_size=args.max_mamba_cache_size,
        speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        pp_max_micro_batch_size=args.pp_max_micro_batch_size,
        token_capacity=args.token_capacity,
        context_len=args.context_len,
        partition_env=env.get(PARTITION_ENV),
        skip_decode_lock=env_flag(env.get("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK")),
    )
