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

from checker import __version__
from checker.config import DeriveConfig
from checker.core.sizing import CHECKED_VALUES, CapacityInputs, StageCapacity, divergent_values
from checker.engines.drift import drift_lines
from checker.materialize import MATERIALIZE_STATUS_NAMES
from checker.options import (
    DEFAULT_BUDGET_GIB,
    add_engine_args,
    add_flag_args,
    add_layout_args,
    add_model_args,
)
from checker.status import EXIT_CODES, MODEL_DRIFT
from checker.tables import fmt_bytes, fmt_int, format_table, mark, outliers

HELP = "derive every stage's pool size and limits in one process (no torch needed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_layout_args(parser, pp_default=8)
    add_flag_args(parser)
    add_engine_args(parser)
    g = parser.add_argument_group("output")
    g.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text (default) or one JSON object on stdout",
    )
    g.add_argument("--quiet", "-q", action="store_true", help="print only the one-line verdict")
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
    from checker.materialize import materialize_stage, resolve_device

    device = resolve_device(device_name)
    return [materialize_stage(inputs, s, device) for s in stages]


def _rank_dict(s: StageCapacity, m) -> dict[str, object]:
    d = s.as_dict()
    if m is not None:
        d.update(
            predicted_bytes=m.predicted_bytes,
            allocated_bytes=m.allocated_bytes,
            materialize_status=MATERIALIZE_STATUS_NAMES[m.status],
            materialize_error=m.error or None,
        )
    return d


def run(args: argparse.Namespace) -> int:
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
    if args.format == "json":
        doc = {
            "checker_version": __version__,
            "inputs": inputs.describe(),
            "geometry": inputs.geometry.describe(),
            "ranks": [_rank_dict(s, results[i] if results else None) for i, s in enumerate(stages)],
            "divergent": divergent_values(stages),
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
    if failed:
        return 2
    return EXIT_CODES[MODEL_DRIFT] if drifts else 0


def _engine_doc(engines, drifts) -> dict[str, object]:
    return {
        "engine": engines.mode,
        "sglang_version": engines.sglang_version,
        "drift": [vars(d) for d in drifts],
    }


def _engine_lines(engines, drifts) -> list[str]:
    if engines.mode == "builtin":
        return []
    if engines.mode == "sglang":
        return [f"engine: SGLang {engines.sglang_version}'s own sizing code (on CPU, no server)"]
    if not drifts:
        return [
            f"engines agree: the builtin model and SGLang {engines.sglang_version} derive the same "
            "values on every stage"
        ]
    return ["", *drift_lines(drifts, sglang_version=engines.sglang_version)]


def _report_drift_only(args: argparse.Namespace, inputs: CapacityInputs, engines, drifts) -> int:
    if args.format == "json":
        doc = {
            "checker_version": __version__,
            "inputs": inputs.describe(),
            "ranks": None,
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
