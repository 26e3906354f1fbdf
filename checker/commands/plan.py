"""``checker plan``: capacity planning from the same core every rank runs (no torch needed).

Two questions, one per mode:

    # the smallest budget (to 0.01 GiB) at which every stage reaches 48 running requests, per policy
    python -m checker plan --model kimi-k3 --pp-size 8 --target-max-running-requests 48

    # the layer partition that minimises the busiest stage's linear layers (max-share's charge)
    python -m checker plan --model-config config.json --pp-size 8 --budget-gib 20 \\
        --suggest-partition

The suggested partition is an env var that every node must set identically:
``export SGLANG_PP_LAYER_PARTITION=...``; the preflight (``checker check``) verifies that they do.
Without --policy, the budget search answers for all three policies and the partition is compared
under max-share.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from checker.cli.options import (
    DEFAULT_BUDGET_GIB,
    add_engine_args,
    add_flag_args,
    add_layout_args,
    add_model_args,
    add_output_args,
    int_at_least,
    positive_gib,
    positive_int,
)
from checker.config import DeriveConfig
from checker.core.errors import BudgetError, FlagError
from checker.core.partition import PARTITION_ENV
from checker.core.planning import MinBudget, SuggestedPartition, min_budget, suggest_partition
from checker.core.sizing import CHECKED_VALUES, POLICIES, CapacityInputs, StageCapacity
from checker.engines.drift import Drift, drift_lines
from checker.outputs.jsondoc import json_inputs, json_layout, stage_dict, status_doc
from checker.outputs.tables import fmt_bytes, fmt_int, format_table
from checker.status import CONSISTENT, DIVERGENT, EXIT_CODES, MODEL_DRIFT

HELP = "the smallest budget for a running-request target, or a partition with a larger pool"
DEFAULT_SLACK = 1


non_negative_int = int_at_least(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_layout_args(parser, pp_default=8)
    add_flag_args(parser, with_policy=False)
    g = parser.add_argument_group("planning")
    # Unset means "all three" for the budget search and max-share for the partition comparison.
    g.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help="restrict the budget search to one policy (default: all three); the policy the partition "
        "comparison derives with (default max-share)",
    )
    mode = g.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--target-max-running-requests",
        type=positive_int,
        metavar="N",
        help="find, per policy, the smallest --budget-gib (0.01 GiB steps) at which every stage derives "
        "max_running_requests >= N (per dp worker)",
    )
    mode.add_argument(
        "--suggest-partition",
        action="store_true",
        help=f"find the {PARTITION_ENV} that minimises the busiest stage's linear layers and compare "
        "it with the default split at --budget-gib",
    )
    g.add_argument(
        "--partition-slack",
        type=non_negative_int,
        default=None,
        metavar="S",
        help=f"each stage holds floor(L/P) - S to ceil(L/P) + S layers, at least 1 (default {DEFAULT_SLACK})",
    )
    d = parser.add_argument_group(
        "the budget as --mem-fraction-static (with --target-max-running-requests)",
        "SGLang does not take a budget: it derives total_rest_memory from free device memory measured "
        "before and after loading the weights and --mem-fraction-static. Give both figures to get the "
        "--mem-fraction-static the target needs, computed as the release does.",
    )
    d.add_argument(
        "--gpu-free-gib",
        type=positive_gib,
        metavar="GIB",
        help="free device memory before the weights load (e.g. 139 on an idle H200)",
    )
    d.add_argument(
        "--weights-gib", type=positive_gib, metavar="GIB", help="the weights' footprint on the busiest rank"
    )
    add_engine_args(parser)
    add_output_args(parser, quiet="leave out the model and layout header")


def _config(args: argparse.Namespace) -> DeriveConfig:
    return DeriveConfig.from_args(args, default_budget_gib=DEFAULT_BUDGET_GIB)


def _engine(args: argparse.Namespace) -> str:
    """Who derives: --engine, or sglang for an installed release the checker does not model."""
    return _config(args).release.engine


def header(inputs: CapacityInputs) -> str:
    g = inputs.geometry
    strategy = inputs.strategy_label
    return (
        f"model {g.name}: {g.num_hidden_layers} layers, {g.num_linear_layers} linear; per_req "
        f"{fmt_bytes(g.per_req_bytes)}\n"
        f"layout pp {inputs.pp_size} x tp {inputs.tp_size} (dp {inputs.dp_size}); r "
        f"{inputs.mamba_full_memory_ratio:g}; {strategy}, {inputs.slots_per_request()} slots per request"
    )


def _span(stages: list[StageCapacity], name: str) -> str:
    """One value when every stage agrees, else ``lo..hi *`` (own-share's stages differ)."""
    values = [getattr(s, name) for s in stages]
    lo, hi = min(values), max(values)
    return fmt_int(lo) if lo == hi else f"{fmt_int(lo)}..{fmt_int(hi)} *"


# --- mode 1: the smallest budget for a target ---------------------------------------------------------


def _below_text(result: MinBudget) -> str:
    if result.below is None:
        return "does not boot"
    worst = min(result.below, key=lambda s: s.max_running_requests)
    return f"{worst.max_running_requests} (stage {worst.pp_rank})"


def run_target(args: argparse.Namespace) -> int:
    if args.budget_gib is not None:
        raise FlagError(
            "--budget-gib has no meaning with --target-max-running-requests: plan searches the budget; "
            "drop it (or use derive at a budget)"
        )
    if args.partition_slack is not None:
        raise FlagError("--partition-slack only applies to --suggest-partition; drop it")
    # SGLang ships max-share only: with its engine the default is that one policy, not all three.
    policies = (args.policy,) if args.policy else POLICIES if _engine(args) == "builtin" else (None,)
    target = args.target_max_running_requests
    results = [min_budget(_config(args).inputs(os.environ, policy=p), target, policy=p) for p in policies]
    results, drifts, sglang_version = _engine_min_budgets(args, results)
    inputs = _config(args).inputs(os.environ, policy=policies[0])
    fractions = {r.policy: _fraction_for(args, inputs, r.budget_gib) for r in results}
    if args.format == "json":
        config = _config(args)
        described = json_inputs(inputs, config.sizing, config.release, budget_source=None)
        del described["resolved_policy"]  # one per policy: the keys of `policies`
        doc = {
            "command": "plan",
            **status_doc(MODEL_DRIFT if drifts else CONSISTENT, EXIT_CODES[MODEL_DRIFT] if drifts else 0),
            "layout": json_layout(inputs),
            "inputs": described,  # budget_gib null: searched; policy as given (null: all three)
            "geometry": inputs.geometry.describe(),
            "target_max_running_requests": target,
            "min_budget_gib": {r.policy: r.budget_gib for r in results},
            "mem_fraction_static": {p: f.as_dict() for p, f in fractions.items() if f is not None},
            **_engine_doc(args, sglang_version, drifts),
            "policies": {
                r.policy: {
                    "min_budget_gib": r.budget_gib,
                    "ranks": [stage_dict(s, inputs.tp_size) for s in r.stages],
                    "below": {
                        "budget_gib": r.below_budget_gib,
                        "ranks": None
                        if r.below is None
                        else [stage_dict(s, inputs.tp_size) for s in r.below],
                        "error": r.below_error,
                    },
                }
                for r in results
            },
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_CODES[MODEL_DRIFT] if drifts else 0
    if not args.quiet:
        print(header(inputs))
    if inputs.partition_env and inputs.pp_size > 1:
        print(f"{PARTITION_ENV}={inputs.partition_env}")
    print(f"target: every stage derives max_running_requests >= {target}\n")
    rows = [
        [
            r.policy,
            f"{r.budget_gib:.2f}",
            *(_span(r.stages, n) for n in CHECKED_VALUES),
            f"{r.below_budget_gib:.2f}",
            _below_text(r),
        ]
        for r in results
    ]
    print(
        format_table(
            ["policy", "min_budget_gib", *CHECKED_VALUES, "0.01 GiB less", "max_running_requests there"], rows
        )
    )
    if any(len({getattr(s, n) for s in r.stages}) > 1 for r in results for n in CHECKED_VALUES):
        print("\n* differs across stages (own-share): the lowest stage is the one the target binds")
    if any(f is not None for f in fractions.values()):
        print(
            f"\nas --mem-fraction-static, with {args.gpu_free_gib:g} GiB free before "
            f"{args.weights_gib:g} GiB of weights ({inputs.release.label}):"
        )
        for policy, f in fractions.items():
            if f is not None:
                print(f"  {policy}: {f.text}")
    return _print_engine(args, sglang_version, drifts)


class _Fraction:
    """The smallest --mem-fraction-static (to 0.001) whose total_rest_memory reaches a budget."""

    def __init__(self, value: float | None, formula: str, budget_gib: float) -> None:
        self.value, self.formula, self.budget_gib = value, formula, budget_gib

    @property
    def text(self) -> str:
        if self.value is None:
            return f"no --mem-fraction-static reaches {self.budget_gib:.2f} GiB: {self.formula}"
        return f"--mem-fraction-static {self.value:.3f} ({self.formula})"

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "budget_gib": self.budget_gib, "formula": self.formula}


def _fraction_for(args: argparse.Namespace, inputs: CapacityInputs, budget_gib: float) -> _Fraction | None:
    """Solve SGLang's ``total_rest_memory(f) >= budget`` for f in 0.001 steps, each step checked with the
    release's own formula (:func:`checker.core.budget.sizing_budget`)."""
    from checker.core.budget import sizing_budget

    if args.gpu_free_gib is None and args.weights_gib is None:
        return None
    if args.gpu_free_gib is None or args.weights_gib is None:
        raise FlagError("give both --gpu-free-gib and --weights-gib to get the --mem-fraction-static")
    version = inputs.release.version

    def rest(thousandths: int) -> float | None:
        try:
            return sizing_budget(
                version,
                free_before_gib=args.gpu_free_gib,
                weights_gib=args.weights_gib,
                mem_fraction_static=thousandths / 1000,
            ).gib
        except BudgetError:
            return None

    lo, hi = 1, 1000  # rest grows with f: bisect for the first f whose rest reaches the budget
    top = rest(hi)
    if top is None or top < budget_gib:
        avail = args.gpu_free_gib - args.weights_gib
        return _Fraction(
            None, f"even 1.0 leaves {top or 0:.2f} GiB ({avail:.2f} GiB free after the weights)", budget_gib
        )
    while lo < hi:
        mid = (lo + hi) // 2
        r = rest(mid)
        if r is not None and r >= budget_gib:
            hi = mid
        else:
            lo = mid + 1
    formula = sizing_budget(
        version,
        free_before_gib=args.gpu_free_gib,
        weights_gib=args.weights_gib,
        mem_fraction_static=hi / 1000,
    ).formula
    return _Fraction(hi / 1000, formula, budget_gib)


def _engine_min_budgets(
    args: argparse.Namespace, results: list[MinBudget]
) -> tuple[list[MinBudget], list[Drift], str | None]:
    """--engine sglang: SGLang's own boundary replaces the builtin's; both: the differences."""
    if _engine(args) == "builtin":
        return results, [], None
    from checker.engines.planning import engine_min_budget, min_budget_drift

    out: list[MinBudget] = []
    drifts: list[Drift] = []
    version = None
    for r in results:
        inputs = _config(args).inputs(os.environ, policy=r.policy)
        engines = _config(args).engines(inputs, os.environ)
        version = engines.sglang_version
        if _engine(args) == "sglang":
            out.append(engine_min_budget(engines.primary, inputs.pp_size, r))
            continue
        out.append(r)
        if engines.shadow is None:
            drifts.append(Drift(-1, "outcome", "derives values", f"error ({engines.shadow_error})"))
        else:
            drifts += min_budget_drift(
                r, engine_min_budget(engines.shadow, inputs.pp_size, r), engines.shadow
            )
    return out, drifts, version


def _engine_doc(args: argparse.Namespace, version: str | None, drifts: list[Drift]) -> dict[str, object]:
    """Who derived (the installed SGLang's version is ``inputs.sglang_installed``) and what drifted."""
    return {"engine": _engine(args), "drift": [vars(d) for d in drifts]}


def _print_engine(args: argparse.Namespace, version: str | None, drifts: list[Drift]) -> int:
    mode = _engine(args)
    if mode == "sglang":
        print(f"\nengine: SGLang {version}'s own sizing code derived every value above")
    elif mode == "both" and not drifts:
        print(f"\nengines agree: the builtin model and SGLang {version} give the same answers")
    elif drifts:
        print()
        for line in drift_lines(drifts, sglang_version=version):
            print(line)
    return EXIT_CODES[MODEL_DRIFT] if drifts else 0


# --- mode 2: the partition with the fewest linear layers on the busiest stage -------------------------


def _derive_or_error(
    args: argparse.Namespace, inputs: CapacityInputs, drifts: list[Drift]
) -> tuple[list[StageCapacity] | None, str | None, str | None]:
    """The chosen engine's stages (the builtin's under both; its drift findings join ``drifts``), the
    error when they do not boot, and the SGLang version that ran (None for builtin)."""
    engines = _config(args).engines(inputs, os.environ)
    try:
        stages, found = engines.derive_all(inputs.pp_size)
    except BudgetError as exc:
        return None, str(exc), engines.sglang_version
    drifts += found
    if stages is None:
        return (
            None,
            "the builtin model refuses a stage SGLang derives (see the drift findings)",
            engines.sglang_version,
        )
    return stages, None, engines.sglang_version


def _partition_doc(
    parts: tuple[int, ...],
    counts: list[int],
    stages: list[StageCapacity] | None,
    error: str | None,
    *,
    env: str | None,
    tp_size: int,
) -> dict[str, object]:
    return {
        PARTITION_ENV: env,
        "layers_per_stage": list(parts),
        "stage_linear_layers": counts,
        "max_stage_linear_layers": max(counts),
        "ranks": None if stages is None else [stage_dict(s, tp_size) for s in stages],
        "error": error,
    }


def run_partition(args: argparse.Namespace) -> int:
    if args.gpu_free_gib is not None or args.weights_gib is not None:
        raise FlagError("--gpu-free-gib and --weights-gib apply to --target-max-running-requests; drop them")
    slack = DEFAULT_SLACK if args.partition_slack is None else args.partition_slack
    base = _config(args).inputs(os.environ, policy=args.policy)
    policy = base.resolved_policy
    user_env = base.partition_env
    base = replace(base, partition_env=None)  # the comparison is against SGLang's default split
    g = base.geometry
    plan: SuggestedPartition = suggest_partition(
        num_hidden_layers=g.num_hidden_layers,
        linear_layer_ids=g.linear_layer_ids,
        pp_size=base.pp_size,
        slack=slack,
    )
    suggested_inputs = replace(base, partition_env=plan.env)
    drifts: list[Drift] = []
    suggested, error, version = _derive_or_error(args, suggested_inputs, drifts)
    if suggested is None and not drifts:
        raise BudgetError(f"the suggested partition {plan.env} does not boot: {error}")
    default, default_error, _ = _derive_or_error(args, base, drifts)

    if args.format == "json":
        config = _config(args)
        code = EXIT_CODES[MODEL_DRIFT] if drifts else 0
        described = json_inputs(
            base,
            config.sizing,
            config.release,
            budget_gib=float(base.budget_gib),
            budget_source="--budget-gib" if args.budget_gib is not None else "default",
        )
        described[PARTITION_ENV] = user_env  # as set here; the comparison is with the default split
        doc = {
            "command": "plan",
            **status_doc(MODEL_DRIFT if drifts else CONSISTENT, code),
            "layout": json_layout(base),
            "inputs": described,
            "geometry": g.describe(),
            PARTITION_ENV: plan.env,
            "partition_slack": slack,
            "layers_per_stage_bounds": [plan.bounds.lower, plan.bounds.upper],
            "suggested": _partition_doc(
                plan.partition,
                plan.stage_linear_layers,
                suggested,
                None,
                env=plan.env,
                tp_size=base.tp_size,
            ),
            "default": _partition_doc(
                plan.default_partition,
                plan.default_stage_linear_layers,
                default,
                default_error,
                env=None,
                tp_size=base.tp_size,
            ),
            **_engine_doc(args, version, drifts),
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return code

    if not args.quiet:
        print(header(base))
    print(
        f"policy {policy}; budget {base.budget_gib:g} GiB; each stage holds {plan.bounds.lower} to "
        f"{plan.bounds.upper} layers (slack {slack})"
    )
    if user_env and base.pp_size > 1:
        print(f"(ignoring the {PARTITION_ENV}={user_env} set here: compared with the default split)")
    print()

    def row(
        name: str, parts: tuple[int, ...], counts: list[int], stages: list[StageCapacity] | None
    ) -> list[str]:
        values = [_span(stages, n) for n in CHECKED_VALUES] if stages else ["does not boot", "", ""]
        return [name, ",".join(map(str, parts)), ",".join(map(str, counts)), str(max(counts)), *values]

    rows = [
        row("default split", plan.default_partition, plan.default_stage_linear_layers, default),
        row("suggested", plan.partition, plan.stage_linear_layers, suggested),
    ]
    print(format_table(["", "layers per stage", "linear per stage", "largest", *CHECKED_VALUES], rows))
    print()
    if plan.largest_stage_linear_layers == plan.default_largest_stage_linear_layers:
        print(
            f"no change needed: the default split already has the fewest linear layers on its busiest "
            f"stage ({plan.largest_stage_linear_layers}); leave {PARTITION_ENV} unset on every node"
        )
        return _print_engine(args, version, drifts)
    elif default is None:
        print(f"the default split does not boot at this budget: {default_error}")
    elif suggested is not None:
        # The smallest stage pool is what binds (all stages agree under max-share).
        before = min(s.max_mamba_cache_size for s in default)
        after = min(s.max_mamba_cache_size for s in suggested)
        print(
            f"busiest stage {plan.default_largest_stage_linear_layers} -> "
            f"{plan.largest_stage_linear_layers} linear layers: max_mamba_cache_size {before} -> {after} "
            f"({(after - before) / before:+.1%}) under {policy}"
        )
    if suggested is not None:
        print()
        print("to use it, every node must set, identically (the preflight checks that they do):")
        print(f"  export {PARTITION_ENV}={plan.env}")
    return _print_engine(args, version, drifts)


def run(args: argparse.Namespace) -> int:
    releases = [v.strip() for v in (args.sglang_version or "").split(",") if v.strip()]
    if len(releases) > 1:
        if args.suggest_partition:
            raise FlagError(
                "--sglang-version A,B compares the budget a target needs; use it with "
                "--target-max-running-requests (or give one release)"
            )
        return run_upgrade_target(args, releases)
    if args.suggest_partition:
        return run_partition(args)
    return run_target(args)


def _fraction_cell(f: _Fraction | None) -> str:
    if f is None:
        return "-"
    return "unreachable" if f.value is None else f"{f.value:.3f}"


def run_upgrade_target(args: argparse.Namespace, releases: list[str]) -> int:
    """--sglang-version A,B: the smallest budget for the target under each release's own rules (its
    own charging policy unless --policy), side by side, and why they differ."""
    from checker.core.upgrade import UpgradeFacts, explain

    if args.engine != "builtin":
        raise FlagError("--sglang-version A,B compares the builtin models of two releases; drop --engine")
    if len(set(releases)) != len(releases):
        raise FlagError(f"--sglang-version {','.join(releases)} names a release twice")
    if args.budget_gib is not None or args.partition_slack is not None:
        raise FlagError("plan searches the budget: drop --budget-gib and --partition-slack")
    base = _config(args)
    target = args.target_max_running_requests
    results: dict[str, MinBudget] = {}
    inputs_by: dict[str, CapacityInputs] = {}
    for version in releases:
        config = replace(base, engine=replace(base.engine, sglang_version=version))
        inputs = config.inputs(os.environ, policy=args.policy)
        inputs_by[version] = inputs
        results[version] = min_budget(inputs, target, policy=args.policy)
    budgets = {v: r.budget_gib for v, r in results.items()}
    explanations: list[str] = []
    for a, b in zip(releases, releases[1:], strict=False):
        if budgets[a] != budgets[b]:
            explanations += explain(a, b, UpgradeFacts.of(inputs_by[b]))
    fractions = {v: _fraction_for(args, inputs_by[v], r.budget_gib) for v, r in results.items()}
    differ = len(set(budgets.values())) > 1
    if args.format == "json":
        first = inputs_by[releases[0]]
        described = json_inputs(
            first,
            base.sizing,
            replace(base, engine=replace(base.engine, sglang_version=releases[0])).release,
            budget_source=None,
            resolved=False,
        )
        doc = {
            "command": "plan",
            **status_doc(DIVERGENT if differ else CONSISTENT, 0),
            "layout": json_layout(first),
            "inputs": described,
            "geometry": first.geometry.describe(),
            "target_max_running_requests": target,
            "releases": releases,
            "by_release": {
                v: {
                    "derived_as": inputs_by[v].release.label,
                    "resolved_policy": r.policy,
                    "min_budget_gib": r.budget_gib,
                    "ranks": [stage_dict(s, first.tp_size) for s in r.stages],
                    "mem_fraction_static": None if fractions[v] is None else fractions[v].as_dict(),
                }
                for v, r in results.items()
            },
            "explanations": explanations,
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not args.quiet:
        print(header(inputs_by[releases[-1]]))
    print(f"target: every stage derives max_running_requests >= {target}, under each release\n")
    rows = [
        [
            v,
            r.policy,
            f"{r.budget_gib:.2f}",
            *(_span(r.stages, n) for n in CHECKED_VALUES),
            "-"
            if fractions[v] is None
            else (f"{fractions[v].value:.3f}" if fractions[v].value else "unreachable"),
        ]
        for v, r in results.items()
    ]
    print(format_table(["release", "policy", "min_budget_gib", *CHECKED_VALUES, "mem_fraction_static"], rows))
    if differ:
        print(
            "\nthe releases need different budgets for the same target: size the deployment for the larger "
            "one while both run, and do not mix them in one deployment"
        )
        for line in explanations:
            print(f"  why: {line}")
    else:
        print("\nevery release needs the same budget for this target")
    return 0
