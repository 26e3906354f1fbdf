"""``checker derive``: every stage's derivation in one process, for capacity planning.

    python -m checker derive --model kimi-k3 --pp-size 8 --budget-gib 8
    python -m checker derive --model-config config.json --pp-size 4 --tp-size 2 --format json
"""

from __future__ import annotations

import argparse
import json
import sys

from checker import __version__
from checker.core.sizing import CHECKED_VALUES, CapacityInputs, StageCapacity, derive_all, divergent_values
from checker.options import add_flag_args, add_layout_args, add_model_args, inputs_from_args
from checker.tables import fmt_bytes, fmt_int, format_table, mark, outliers

HELP = "derive every stage's pool size and limits in one process (no torch needed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_layout_args(parser, pp_default=8)
    add_flag_args(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")


def header(inputs: CapacityInputs) -> str:
    g = inputs.geometry
    strategy = (
        "radix cache disabled"
        if inputs.disable_radix_cache
        else f"strategy {inputs.resolved_strategy}"
        + (" (auto)" if inputs.mamba_radix_cache_strategy == "auto" else "")
    )
    lines = [
        f"model {g.name}: {g.num_hidden_layers} layers, {g.num_linear_layers} linear; "
        f"state per layer {fmt_int(g.bytes_per_layer)} B (conv {g.conv_dtype}, temporal "
        f"{g.temporal_dtype}); per_req {fmt_bytes(g.per_req_bytes)}",
        f"layout pp {inputs.pp_size} x tp {inputs.tp_size} (dp {inputs.dp_size}); policy "
        f"{inputs.policy}; budget {inputs.budget_gib:g} GiB, r {inputs.mamba_full_memory_ratio:g}; "
        f"{strategy}, {inputs.slots_per_request()} slots per request",
    ]
    if inputs.partition_env and inputs.pp_size > 1:
        lines.append(f"SGLANG_PP_LAYER_PARTITION={inputs.partition_env}")
    return "\n".join(lines)


def stage_table(stages: list[StageCapacity]) -> str:
    marks = {n: outliers([getattr(s, n) for s in stages]) for n in CHECKED_VALUES}
    rows = [
        [
            s.pp_rank,
            f"[{s.start_layer}, {s.end_layer})",
            s.stage_linear_layers,
            fmt_int(s.stage_per_req_bytes),
            *(mark(fmt_int(getattr(s, n)), i in marks[n]) for n in CHECKED_VALUES),
            f"{s.kv_budget_gib:.2f}",
        ]
        for i, s in enumerate(stages)
    ]
    headers = ["pp_rank", "layers", "linear", "stage_per_req_bytes", *CHECKED_VALUES, "kv_gib_left"]
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


def run(args: argparse.Namespace) -> int:
    inputs = inputs_from_args(args)
    stages = derive_all(inputs)
    if args.format == "json":
        doc = {
            "checker_version": __version__,
            "inputs": inputs.describe(),
            "geometry": inputs.geometry.describe(),
            "ranks": [s.as_dict() for s in stages],
            "divergent": divergent_values(stages),
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(header(inputs))
        print()
        print(stage_table(stages))
        print()
        print(verdict(stages))
    return 0
