"""``checker derive``: every stage's derivation in one process, for capacity planning.

python -m checker derive --model kimi-k3 --pp-size 8 --budget-gib 8
python -m checker derive --model-config config.json --pp-size 4 --tp-size 2 --format json
python -m checker derive --model kimi-k3 --pp-size 8 --max-mamba-cache-size 4 --materialize
python -m checker derive --model-config config.json --pp-size 4 --engine both   # exit 4 on drift
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

from checker.cli.options import (
    DEFAULT_BUDGET_GIB,
    add_engine_args,
    add_flag_args,
    add_layout_args,
    add_model_args,
    add_output_args,
)
from checker.config import DeriveConfig
from checker.core.errors import BudgetError, FlagError
from checker.core.sizing import CHECKED_VALUES, CapacityInputs, StageCapacity, divergent_values
from checker.engines.drift import drift_lines
from checker.outputs.jsondoc import json_inputs, json_layout, stage_dict, status_doc
from checker.outputs.tables import fmt_bytes, fmt_int, format_table, mark, outliers
from checker.status import CONSISTENT, DIVERGENT, ERROR, EXIT_CODES, MODEL_DRIFT

HELP = "derive every stage's pool size and limits in one process (no torch needed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_layout_args(parser, pp_default=8)
    add_flag_args(parser)
    add_engine_args(parser)
    add_output_args(parser)
    parser.add_argument(
        "--materialize",
        action="store_true",
        help="allocate every stage's pool for real, one stage at a time (SGLang's shapes "
        "and dtypes), and compare with the prediction; exit 2 on a failure or mismatch",
    )
    parser.add_argument(
        "--materialize-device",
        metavar="DEVICE",
        default="cpu",
        help="where --materialize allocates: cpu (default), cuda or cuda:N",
    )


def header(inputs: CapacityInputs) -> str:
    g = inputs.geometry
    strategy = inputs.strategy_label
    lines = [
        f"model {g.name}: {g.num_hidden_layers} layers, {g.num_linear_layers} linear; "
        f"state per layer {fmt_int(g.bytes_per_layer)} B (conv {g.conv_dtype}, temporal "
        f"{g.temporal_dtype}); per_req {fmt_bytes(g.per_req_bytes)}",
        f"layout pp {inputs.pp_size} x tp {inputs.tp_size} (dp {inputs.dp_size}); policy "
        f"{inputs.resolved_policy}; budget {inputs.budget_gib:g} GiB, r {inputs.mamba_full_memory_ratio:g}; "
        f"{strategy}, {inputs.slots_per_request()} slots per request",
    ]
    if inputs.partition_env and inputs.pp_size > 1:
        lines.append(f"SGLANG_PP_LAYER_PARTITION={inputs.partition_env}")
    return "\n".join(lines)


def stage_table(stages: list[StageCapacity], materialized: list | None = None) -> str:
    marks = {n: outliers([getattr(s, n) for s in stages]) for n in CHECKED_VALUES}
    rows = [
        [
            s.pp_rank,
            f"[{s.start_layer}, {s.end_layer})",
            s.stage_linear_layers,
            fmt_int(s.stage_per_req_bytes),
            *(mark(fmt_int(getattr(s, n)), i in marks[n]) for n in CHECKED_VALUES),
            f"{s.kv_budget_gib:.2f}",
            *(
                [fmt_int(materialized[i].predicted_bytes), fmt_int(materialized[i].allocated_bytes)]
                if materialized
                else []
            ),
        ]
        for i, s in enumerate(stages)
    ]
    headers = ["pp_rank", "layers", "linear", "stage_per_req_bytes", *CHECKED_VALUES, "kv_gib_left"]
    if materialized:
        headers += ["predicted_bytes", "allocated_bytes"]
    return format_table(headers, rows)


def verdict(stages: list[StageCapacity]) -> str:
    bad = divergent_values(stages)
    if not bad:
        s = stages[0]
        return (
            f"all {len(stages)} stages agree: max_mamba_cache_size {s.max_mamba_cache_size}, "
            f"max_running_requests {s.max_running_requests}, pp_max_micro_batch_size "
            f"{s.pp_max_micro_batch_size}"
        )
    return (
        f"DIVERGENT: {', '.join(bad)} differ across stages (outliers marked *); "
        "stages that disagree disagree on which sequences are in flight"
    )


def materialize_all(inputs: CapacityInputs, stages: list[StageCapacity], device_name: str) -> list:
    """One stage at a time, each freed before the next: the peak is the largest stage, not the sum."""
    from checker.device.materialize import materialize_stage, resolve_device

    device = resolve_device(device_name)
    return [materialize_stage(inputs, s, device) for s in stages]


# --- JSON: one vocabulary with check's report (docs/json-output.md, docs/report.schema.json) ------


def run(args: argparse.Namespace) -> int:
    releases = [v.strip() for v in (args.sglang_version or "").split(",") if v.strip()]
    if len(releases) > 1:
        return run_upgrade(args, releases)
    config = DeriveConfig.from_args(args, default_budget_gib=DEFAULT_BUDGET_GIB)
    inputs = config.inputs(os.environ)
    engines = config.engines(inputs, os.environ)
    stages, drifts = engines.derive_all(inputs.pp_size)
    if stages is None:  # the builtin refused a stage SGLang derives: only the drift is left to show
        return _report_drift_only(args, inputs, engines, drifts)
    results, materialize_s = None, 0.0
    if args.materialize:
        t0 = time.monotonic()
        results = materialize_all(inputs, stages, args.materialize_device)
        materialize_s = time.monotonic() - t0
    failed = [m for m in results or [] if not m.ok]
    divergent = divergent_values(stages)
    if failed:
        status, code = ERROR, EXIT_CODES[ERROR]
    elif drifts:
        status, code = MODEL_DRIFT, EXIT_CODES[MODEL_DRIFT]
    else:  # a divergence is derive's answer, not its failure: exit 0 (check is the gate)
        status, code = (DIVERGENT if divergent else CONSISTENT), 0
    if args.format == "json":
        doc = {
            "command": "derive",
            **status_doc(status, code),
            "layout": json_layout(inputs),
            "inputs": json_inputs(inputs, config.sizing, config.release, **_budget(args, inputs)),
            "geometry": inputs.geometry.describe(),
            "ranks": [
                stage_dict(s, inputs.tp_size, results[i] if results else None) for i, s in enumerate(stages)
            ],
            "divergent": divergent,
            **_engine_doc(engines, drifts),
        }
        if results is not None:
            doc["materialize"] = {
                "device": results[0].device,
                "ok": not failed,
                "timings": {"materialize_s": materialize_s},
            }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.quiet:
        print(verdict(stages))
    else:
        print(header(inputs))
        print()
        print(stage_table(stages, results))
        print()
        print(verdict(stages))
        if results is not None and not failed:
            total = sum(m.allocated_bytes for m in results)
            print(
                f"materialized every stage on {results[0].device}, one at a time: allocated == "
                f"predicted ({fmt_bytes(total)} in all, {materialize_s:.1f} s), all freed"
            )
        for line in _engine_lines(engines, drifts):
            print(line)
    for m in failed:
        print(f"checker: error: {m.error}", file=sys.stderr)
    return code


def _budget(args: argparse.Namespace, inputs: CapacityInputs) -> dict[str, object]:
    from checker.launch.merge import launch_text

    given = getattr(args, "budget_gib", None) is not None
    return {
        "budget_gib": float(inputs.budget_gib),
        "budget_source": "--budget-gib" if given else "default",
        "launch_command": launch_text(args),
    }


def _engine_doc(engines, drifts) -> dict[str, object]:
    """Who derived (the installed SGLang's version is ``inputs.sglang_installed``) and what drifted."""
    return {"engine": engines.mode, "drift": [vars(d) for d in drifts]}


def _engine_lines(engines, drifts) -> list[str]:
    if engines.mode == "builtin":
        return []
    if engines.mode == "sglang":
        return [f"engine: {engines.who()} (on CPU, no server)"]
    if not drifts:
        return [
            f"engines agree: the builtin model and SGLang {engines.sglang_version} derive the same "
            "values on every stage"
        ]
    return ["", *drift_lines(drifts, sglang_version=engines.sglang_version)]


def _report_drift_only(args: argparse.Namespace, inputs: CapacityInputs, engines, drifts) -> int:
    if args.format == "json":
        config = DeriveConfig.from_args(args, default_budget_gib=DEFAULT_BUDGET_GIB)
        doc = {
            "command": "derive",
            **status_doc(MODEL_DRIFT, EXIT_CODES[MODEL_DRIFT]),
            "layout": json_layout(inputs),
            "inputs": json_inputs(inputs, config.sizing, config.release, **_budget(args, inputs)),
            "geometry": inputs.geometry.describe(),
            "ranks": None,
            "divergent": [],
            **_engine_doc(engines, drifts),
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(header(inputs))
        print()
        for line in drift_lines(drifts, sglang_version=engines.sglang_version):
            print(line)
    return EXIT_CODES[MODEL_DRIFT]


# --- --sglang-version A,B: an upgrade, side by side ------------------------------------------------


def run_upgrade(args: argparse.Namespace, releases: list[str]) -> int:
    """Every stage under each release, side by side, and what differs: planning a rolling upgrade.

    A cluster half on A and half on B disagrees on every value that differs here (the preflight then
    names the releases per node); the explanation says which change in SGLang's code causes it.
    """
    from checker.core.upgrade import UpgradeFacts, explain

    if args.engine != "builtin" or args.materialize:
        raise FlagError(
            "--sglang-version A,B compares the builtin models of two releases; drop --engine "
            "and --materialize (or give one release)"
        )
    if len(set(releases)) != len(releases):
        raise FlagError(f"--sglang-version {','.join(releases)} names a release twice")
    base = DeriveConfig.from_args(args, default_budget_gib=DEFAULT_BUDGET_GIB)
    by_release: dict[str, list[StageCapacity]] = {}
    inputs_by_release: dict[str, CapacityInputs] = {}
    errors: dict[str, str] = {}
    for version in releases:
        config = replace(base, engine=replace(base.engine, sglang_version=version))
        inputs = config.inputs(os.environ)
        inputs_by_release[version] = inputs
        try:
            by_release[version] = [
                config.engines(inputs, os.environ).derive(k)[0] for k in range(inputs.pp_size)
            ]
        except BudgetError as exc:  # does not boot under this release: part of the answer
            errors[version] = str(exc)
    differences = _release_differences(by_release)
    explanations = []
    for a, b in zip(releases, releases[1:], strict=False):
        if differences or a in errors or b in errors:
            explanations += explain(a, b, UpgradeFacts.of(inputs_by_release[b]))
    if args.format == "json":
        first = inputs_by_release[releases[0]]
        described = json_inputs(
            first,
            base.sizing,
            replace(base, engine=replace(base.engine, sglang_version=releases[0])).release,
            **_budget(args, first),
            resolved=False,
        )
        described["derived_as"] = None  # one per release: by_release.<release>.derived_as
        doc = {
            "command": "derive",
            **status_doc(DIVERGENT if differences or errors else CONSISTENT, 0),
            "layout": json_layout(first),
            "inputs": described,
            "geometry": first.geometry.describe(),
            "releases": releases,
            "by_release": {
                v: {
                    "derived_as": f"{inputs_by_release[v].release.label} (--sglang-version)",
                    "resolved_policy": inputs_by_release[v].resolved_policy,
                    "ranks": (
                        [stage_dict(s, first.tp_size) for s in by_release[v]] if v in by_release else None
                    ),
                    "error": errors.get(v),
                }
                for v in releases
            },
            "differences": differences,
            "explanations": explanations,
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not args.quiet:
        print(
            header(inputs_by_release[releases[-1]]).replace(
                f"policy {inputs_by_release[releases[-1]].resolved_policy}; ", ""
            )
        )
        print()
        print(_upgrade_table(releases, by_release, errors))
        print()
    if not differences and not errors:
        print(
            f"SGLang {' and '.join(releases)} derive the same values on every stage: ranks on either "
            "release agree"
        )
        return 0
    names = sorted({d["value"] for d in differences})
    print(
        f"SGLang {' and '.join(releases)} derive different {', '.join(names) or 'outcomes'}: a cluster "
        "running both during a rolling upgrade disagrees on which sequences are in flight"
    )
    for version, err in errors.items():
        print(f"  SGLang {version}: does not boot: {err}")
    for line in explanations:
        print(f"  why: {line}")
    return 0


def _release_differences(by_release: dict[str, list[StageCapacity]]) -> list[dict[str, object]]:
    versions = list(by_release)
    out = []
    for name in CHECKED_VALUES:
        for k in range(len(next(iter(by_release.values()), []))):
            values = {v: getattr(by_release[v][k], name) for v in versions}
            if len(set(values.values())) > 1:
                out.append({"value": name, "pp_rank": k, "by_release": values})
    return out


def _upgrade_table(
    releases: list[str], by_release: dict[str, list[StageCapacity]], errors: dict[str, str]
) -> str:
    short = {
        "max_mamba_cache_size": "pool",
        "max_running_requests": "requests",
        "pp_max_micro_batch_size": "micro-batch",
    }
    stages = next(iter(by_release.values()), [])
    headers = ["pp_rank", "layers", *(f"{short[n]} {v}" for n in CHECKED_VALUES for v in releases)]
    rows = []
    for k, s in enumerate(stages):
        cells: list[object] = [k, f"[{s.start_layer}, {s.end_layer})"]
        for n in CHECKED_VALUES:
            values = [getattr(by_release[v][k], n) if v in by_release else None for v in releases]
            differ = len(set(values)) > 1
            cells += [mark("-" if x is None else fmt_int(x), differ) for x in values]
        rows.append(cells)
    return format_table(headers, rows)
