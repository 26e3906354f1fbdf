"""``checker sweep``: where in budget space each charging policy makes the stages disagree.

    python -m checker sweep --budgets 4:40:0.25 --mamba-full-memory-ratio 0.5
    python -m checker sweep --budgets 4:40:0.25 --policy own-share --policy max-share \\
        --report sweep.json --plot sweep.png
    python -m checker sweep --budgets 8,16,24 --model-config config.json --pp-size 4 \\
        --require-consistent max-share

Every stage (pp_rank 0..P-1) derives its three checked values at every budget, vectorised with torch
and bit-identical to the scalar core; then, per policy and value, the budgets where the stages diverge
are counted. A budget at which no stage can boot is a boot failure, not a divergence; one at which some
stages boot and others do not is divergent. Exit 0 when every --require-consistent policy (default
max-share) never diverges, 1 when one does, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TextIO

from checker import __version__
from checker.cli.options import (
    add_flag_args,
    add_group_args,
    add_layout_args,
    add_model_args,
    add_output_args,
)
from checker.config import GroupOptions, ModelChoice, OutputOptions, SizingFlags, SweepConfig, capacity_inputs
from checker.core.errors import FlagError
from checker.core.sizing import CHECKED_VALUES, POLICIES, CapacityInputs
from checker.core.sweep import UPSTREAM_GRID, BudgetGrid, budget_runs, parse_budgets
from checker.outputs.files import check_output_path, write_file
from checker.outputs.tables import fmt_bytes, format_table
from checker.status import CONSISTENT, DIVERGENT, ERROR, EXIT_CODES, INFRASTRUCTURE_FAILURE

if TYPE_CHECKING:  # torch is imported in run(), so --help and input errors cost no torch import
    import torch

DEFAULT_PP_SIZE = 8
"""Without torchrun a sweep derives every stage of a pp 8 deployment unless --pp-size says otherwise."""
HELP = "sweep budgets: where each policy makes pipeline stages diverge (text, JSON report, plot)"
LONG_SWEEP_BUDGETS = 10_000
"""From this many budgets a sweep reports progress on stderr even when stderr is not a terminal."""
EXIT_DIVERGENT = EXIT_CODES[DIVERGENT]
PRETTY_REPORT_BUDGETS = 2_000
"""Up to this many budgets the --report JSON is indented."""
SHOWN_RUNS = 8
"""Runs of divergent budgets listed in the text output; the report lists every budget."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budgets",
        default=UPSTREAM_GRID,
        metavar="START:STOP:STEP|A,B,...",
        help="budgets in GiB (total_rest_memory): a range with STOP included, or a comma list "
        f"(default {UPSTREAM_GRID}, the upstream sweep's 145 budgets)",
    )
    parser.add_argument(
        "--require-consistent",
        action="append",
        choices=POLICIES,
        metavar="POLICY",
        help="exit 1 if this policy diverges at any budget; repeatable (default max-share)",
    )
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help="write a PNG: pool size per stage against budget, divergence marked (needs the 'plot' extra)",
    )
    parser.add_argument("--device", default="cpu", help="torch device for the derivation (default cpu)")
    parser.add_argument("--no-progress", action="store_true", help="never report progress on stderr")
    add_output_args(
        parser,
        report="write the findings and every assumption as JSON",
        quiet="print only the required-consistent line (and never progress)",
    )
    add_model_args(parser)
    add_layout_args(parser, pp_default=None)
    add_flag_args(parser, with_budget=False, with_policy=False)
    add_group_args(parser.add_argument_group("under torchrun (each rank derives its own stage)"))
    parser.add_argument(
        "--policy",
        action="append",
        choices=POLICIES,
        help="charging policy to sweep; repeatable (default: all three)",
    )


class Progress:
    """A progress line on stderr: redrawn in place on a terminal, two plain lines in a log.

    Cheap by construction: one update per stage derived, and a terminal redraw at most every 0.1 s.
    """

    def __init__(self, total: int, what: str, *, enabled: bool, stream: TextIO | None = None) -> None:
        stream = sys.stderr if stream is None else stream  # looked up now: tests and tools swap it
        self.total, self.what, self.enabled, self.stream = total, what, enabled, stream
        self.tty = enabled and _isatty(stream)
        self.done = 0
        self.t0 = self.last = time.monotonic()
        if enabled and not self.tty:
            print(f"sweep: {what} ...", file=stream, flush=True)

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.tty and (now - self.last >= 0.1 or self.done == self.total):
            self.last = now
            width = 30
            filled = width * self.done // self.total
            self.stream.write(
                f"\rsweep: {self.what} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            )
            self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[K")  # leave the terminal as it was
        else:
            print(f"sweep: derived in {time.monotonic() - self.t0:.2f} s", file=self.stream)
        self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream is no terminal
        return False


def resolve_device(name: str) -> torch.device:
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise FlagError(f"--device {name!r} is not a torch device; use cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise FlagError(f"--device {name}: no CUDA device is available here; use --device cpu")
    return device


def single_process_stack(
    inputs_by_policy: Mapping[str, CapacityInputs],
    budgets: Sequence[float],
    device: torch.device,
    progress: Progress,
) -> torch.Tensor:
    """Every stage's :func:`local_sweep` in this process: int64 (P, policies, budgets, 3).

    A distributed sweep replaces this with one all-gather of each rank's own ``local_sweep``.
    """
    import torch

    from checker.device.sweep import local_sweep

    pp_size = next(iter(inputs_by_policy.values())).pp_size
    rest = torch.tensor(budgets, dtype=torch.float64, device=device)
    stages = []
    for k in range(pp_size):
        stages.append(local_sweep(inputs_by_policy, k, rest, device))
        progress.step()
    return torch.stack(stages)


def required_policies(require: Sequence[str] | None, policies: Sequence[str]) -> list[str]:
    if require is None:
        return ["max-share"] if "max-share" in policies else []
    required = list(dict.fromkeys(require))
    missing = [p for p in required if p not in policies]
    if missing:
        raise FlagError(
            f"--require-consistent {' '.join(missing)} names a policy this sweep does not derive; "
            f"add --policy {' --policy '.join(missing)}"
        )
    return required


def notes(inputs: CapacityInputs) -> dict[str, str]:
    """What the counts assume beyond the inputs, in words."""
    return {
        "token_capacity": (
            "not modelled: the KV pool does not bind, so max_running_requests = min(4096, K // slots)"
            if inputs.token_capacity is None
            else "KV token capacity T clamps max_running_requests (docs/how-it-computes.md)"
        ),
        "boot_failure_rule": (
            "a stage cannot boot at a budget where its pool K <= 0, its state pool exceeds the budget, or "
            "max_running_requests <= 0; a boot failure when every stage fails alike, divergent otherwise"
        ),
    }


def sweep_json_inputs(inputs: CapacityInputs, sizing: SizingFlags | None) -> dict[str, object]:
    """Everything the counts depend on, under check's names: budget_gib null (the grid is
    ``budget_grid``) and no ``policy`` (the policies swept are the keys of ``policies``)."""
    from checker.outputs.jsondoc import json_inputs

    d = json_inputs(inputs, replace(sizing or SizingFlags(), policy=None), None, budget_source=None)
    for k in ("policy", "resolved_policy"):
        d.pop(k)
    torch = sys.modules.get("torch")
    if torch is not None:
        d["torch_version"] = torch.__version__
    return d


def _policy_json(info: Mapping[str, object]) -> dict[str, object]:
    """One policy's analysis under check's names: ``divergent`` lists the values that diverge at some
    budget; ``divergent_counts`` says at how many budgets."""
    counts = info["divergent"]
    assert isinstance(counts, dict)
    out = {k: v for k, v in info.items() if k != "divergent"}
    out["divergent"] = [v for v in CHECKED_VALUES if counts[v]]
    out["divergent_counts"] = dict(counts)
    return out


def build_report(
    analysis: dict,
    grid: BudgetGrid,
    inputs: CapacityInputs,
    required: Sequence[str],
    device: str,
    sizing: SizingFlags | None = None,
) -> dict:
    failing = [p for p in required if not analysis["policies"][p]["consistent"]]
    return {
        "command": "sweep",
        "checker_version": __version__,
        "status": DIVERGENT if failing else CONSISTENT,
        "exit_code": EXIT_DIVERGENT if failing else 0,
        "mode": "single-process",
        "device": device,
        "layout": {
            "world_size": inputs.pp_size * inputs.tp_size,
            "pp_size": inputs.pp_size,
            "tp_size": inputs.tp_size,
        },
        "inputs": sweep_json_inputs(inputs, sizing),
        "geometry": inputs.geometry.describe(),
        "budget_grid": grid.describe(),
        "notes": notes(inputs),
        "require_consistent": list(required),
        "failing_required": failing,
        **{k: v for k, v in analysis.items() if k != "policies"},
        "policies": {p: _policy_json(info) for p, info in analysis["policies"].items()},
        "budgets_gib": list(grid.budgets),
    }


def fmt_budget(b: float) -> str:
    return f"{b:.15g}"


def fmt_runs(indices: Sequence[int], budgets: Sequence[float]) -> str:
    runs = budget_runs(indices, budgets)
    shown = [fmt_budget(a) if a == b else f"{fmt_budget(a)}-{fmt_budget(b)}" for a, b in runs[:SHOWN_RUNS]]
    more = f" and {len(runs) - SHOWN_RUNS} more runs (see --report)" if len(runs) > SHOWN_RUNS else ""
    return ", ".join(shown) + more + " GiB"


def header(inputs: CapacityInputs, grid: BudgetGrid) -> str:
    g = inputs.geometry
    strategy = inputs.strategy_label
    T = "not modelled (does not bind)" if inputs.token_capacity is None else f"{inputs.token_capacity:,}"
    b = grid.budgets
    return "\n".join(
        [
            f"model {g.name}: {g.num_hidden_layers} layers, {g.num_linear_layers} linear; per_req "
            f"{fmt_bytes(g.per_req_bytes)}",
            f"layout pp {inputs.pp_size} x tp {inputs.tp_size} (dp {inputs.dp_size}); r "
            f"{inputs.mamba_full_memory_ratio:g}; {strategy}, {inputs.slots_per_request()} slots per "
            f"request; KV token capacity {T}",
            f"budgets {grid.spec}: {len(b):,} from {fmt_budget(b[0])} to {fmt_budget(b[-1])} GiB",
        ]
    )


def text_report(report: dict, grid: BudgetGrid) -> str:
    n = report["num_budgets"]
    budgets = grid.budgets
    index = {b: i for i, b in enumerate(budgets)}

    def cell(count: int) -> str:
        return f"{count:,} ({100 * count / n:.1f}%)" if count else "0"

    rows = [
        [
            policy,
            *(cell(info["divergent_counts"][v]) for v in CHECKED_VALUES),
            cell(info["boot_failures"]),
            "consistent" if info["consistent"] else "DIVERGENT",
        ]
        for policy, info in report["policies"].items()
    ]
    lines = [
        f"budgets (of {n:,}) at which the stages diverge, per policy and value",
        format_table(["policy", *CHECKED_VALUES, "boot failures", "verdict"], rows),
    ]
    details = []
    for policy, info in report["policies"].items():
        for v in CHECKED_VALUES:
            if info["divergent_counts"][v]:
                idx = [index[b] for b in info["divergent_budgets"][v]]
                details.append(f"  {policy}: {v} diverges at {fmt_runs(idx, budgets)}")
        if info["partial_boot_failures"]:
            idx = [index[b] for b in info["partial_boot_budgets"]]
            details.append(f"  {policy}: some stages cannot boot at {fmt_runs(idx, budgets)}")
        if info["boot_failures"]:
            idx = [index[b] for b in info["boot_failure_budgets"]]
            details.append(f"  {policy}: no stage can boot at {fmt_runs(idx, budgets)}")
    if details:
        lines += ["", *details]
    required = report["require_consistent"]
    if required:
        failing = report["failing_required"]
        state = "; ".join(f"{p} {'DIVERGES' if p in failing else 'never diverges'}" for p in required)
        lines += ["", f"required consistent: {state} -> exit {EXIT_DIVERGENT if failing else 0}"]
    return "\n".join(lines)


def write_report(path: str, report: dict) -> None:
    # Indented for a person when it is short; compact when it lists many budgets, because json's
    # indenting encoder is pure Python and costs seconds on a dense sweep (the C encoder, milliseconds).
    indent = 1 if report["num_budgets"] <= PRETTY_REPORT_BUDGETS else None
    problem = write_file(path, json.dumps(report, indent=indent) + "\n", what="--report")
    if problem:
        raise FlagError(problem)


def plot_title(inputs: CapacityInputs, grid: BudgetGrid) -> str:
    strategy = "no radix cache" if inputs.disable_radix_cache else inputs.resolved_strategy
    return (
        f"{inputs.geometry.name}, pp {inputs.pp_size} x tp {inputs.tp_size}, r = "
        f"{inputs.mamba_full_memory_ratio:g}, {strategy} ({inputs.slots_per_request()} slots/request), "
        f"budgets {grid.spec} ({len(grid):,})"
    )


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    check_output_path("--report", args.report)
    check_output_path("--plot", args.plot)
    return SweepConfig(
        model=ModelChoice.from_args(args),
        sizing=SizingFlags.from_args(args, policy=None),  # --policy here is the list swept: `policies`
        group=GroupOptions.from_args(args),
        output=OutputOptions(report=args.report, format=args.format, quiet=args.quiet),
        budgets=args.budgets,
        policies=tuple(dict.fromkeys(args.policy or POLICIES)),
        require_consistent=tuple(args.require_consistent) if args.require_consistent else None,
        plot=args.plot,
        device=args.device,
        progress=not (args.no_progress or args.quiet),
    )


def sweep_inputs(
    config: SweepConfig, pp_size: int
) -> tuple[BudgetGrid, list[str], list[str], dict[str, CapacityInputs]]:
    grid = parse_budgets(config.budgets)
    policies = list(config.policies)
    required = required_policies(config.require_consistent, policies)
    # Inputs are validated at the grid's first budget: every other input is budget-independent.
    inputs_by_policy = {
        p: capacity_inputs(
            config.model, config.sizing, budget_gib=grid.budgets[0], policy=p, pp_size=pp_size, env=os.environ
        )
        for p in policies
    }
    for inp in inputs_by_policy.values():
        inp.slots_per_request()  # a strategy SGLang rejects fails here, before torch is imported
    return grid, policies, required, inputs_by_policy


def _progress_enabled(config: SweepConfig, grid: BudgetGrid) -> bool:
    return config.progress and (_isatty(sys.stderr) or len(grid) >= LONG_SWEEP_BUDGETS)


def run(args: argparse.Namespace) -> int:
    from checker.distributed.launch_env import RankEnv

    config = config_from_args(args)
    env = RankEnv.from_environ()
    if env.world_size > 1 or config.group.init_method:
        return DistributedSweep(config, env).run()
    grid, policies, required, inputs_by_policy = sweep_inputs(
        config, config.sizing.pp_size or DEFAULT_PP_SIZE
    )
    inputs = inputs_by_policy[policies[0]]

    import torch

    device = resolve_device(config.device)
    if device.type == "cpu":
        # A few elementwise ops per stage: intra-op threads only contend on a shared host (8 ranks
        # on 2 cores spin each other out), so one thread is both the fastest and the polite choice.
        torch.set_num_threads(1)
    progress = Progress(
        inputs.pp_size,
        f"{len(grid):,} budgets x {inputs.pp_size} stages x {len(policies)} policies",
        enabled=_progress_enabled(config, grid),
    )
    try:
        stack = single_process_stack(inputs_by_policy, grid.budgets, device, progress)
    finally:
        progress.close()
    return present(config, stack.cpu(), grid, policies, required, inputs, device=str(device))


def present(
    config: SweepConfig,
    stack,
    grid,
    policies,
    required,
    inputs,
    *,
    device: str,
    mode: str = "single-process",
    world_size: int = 1,
) -> int:
    """Analyse a (stages, policies, budgets, 3) stack, print and write the findings; the exit code."""
    from checker.device.sweep import analyse

    analysis = analyse(stack, grid.budgets, policies)
    report = build_report(analysis, grid, inputs, required, device, config.sizing)
    report["mode"] = mode
    report["world_size"] = world_size

    if config.output.format == "json":
        print(json.dumps(report, indent=1 if report["num_budgets"] <= PRETTY_REPORT_BUDGETS else None))
    elif config.output.quiet:
        print(text_report(report, grid).splitlines()[-1])
    else:
        print(header(inputs, grid))
        print()
        print(text_report(report, grid))
    if config.output.report:
        write_report(config.output.report, report)
    if config.plot:
        from checker.outputs.plot import plot_sweep

        values = {p: stack[:, i].cpu().numpy() for i, p in enumerate(policies)}
        plot_sweep(
            config.plot,
            budgets=grid.budgets,
            values=values,
            analysis=analysis,
            title=plot_title(inputs, grid),
        )
    return EXIT_DIVERGENT if report["failing_required"] else 0


class DistributedSweep:
    """Each rank derives its own stage for every budget and policy; ONE all-gather carries the sweep.

    Collectives run in the same order on every rank whatever its inputs: a header gather (status and
    payload length), then the payload gather only when every rank is ok and the lengths agree. The
    process group's lifecycle (watchdog, SIGTERM, liveness, the report handshake) is the preflight's:
    :class:`checker.distributed.session.Session`.
    """

    def __init__(self, config: SweepConfig, env) -> None:
        from checker.distributed.session import Session

        self.config, self.env = config, env
        self.session = Session(env, config.group)

    def _say(self, status: str, detail: str) -> None:
        print(f"[rank {self.env.rank}] checker sweep: {status}: {detail}", file=sys.stderr, flush=True)

    def on_abort(self, abort) -> None:
        from checker.distributed.liveness import describe

        self._say(INFRASTRUCTURE_FAILURE, f"{abort.detail}; missing: {describe(abort.missing_ranks)}")

    def run(self) -> int:
        from checker.core.errors import CheckerInputError
        from checker.core.layout import layout
        from checker.device.sweep import analyse, local_sweep
        from checker.distributed.group import InfrastructureFailure
        from checker.distributed.liveness import describe
        from checker.distributed.session import SchemaMismatch
        from checker.distributed.wire import Header
        from checker.outputs.tables import rank_ranges
        from checker.status import ROW_OK

        env, session, config = self.env, self.session, self.config
        session.start(self.on_abort)
        is_rank0 = env.rank == 0
        status, error, payload, ctx = ROW_OK, "", None, None
        try:
            session.make_group()
        except CheckerInputError as exc:
            if is_rank0:
                self._say(ERROR, str(exc))
            return session.finish(
                EXIT_CODES[ERROR],
                publish=lambda: None,
                fallback=lambda: None,
                one_line=f"checker sweep error: {exc}",
                clean=False,
            )
        import torch

        try:
            pp_size, pp_rank = layout(
                env.world_size, env.rank, pp_size=config.sizing.pp_size, tp_size=config.sizing.tp_size
            )
            ctx = sweep_inputs(config, pp_size)
            grid, policies, required, inputs_by_policy = ctx
            device = session.device if session.device.type == "cuda" else resolve_device(config.device)
            if device.type == "cpu":
                torch.set_num_threads(1)
            # Rank 0 reports progress for its own stage (every rank derives one stage, in parallel).
            progress = Progress(
                1,
                f"{len(grid):,} budgets x {len(policies)} policies on each of {env.world_size} ranks",
                enabled=is_rank0 and _progress_enabled(config, grid),
            )
            payload = local_sweep(inputs_by_policy, pp_rank, grid.budgets, device).reshape(-1)
            progress.step()
            progress.close()
        except CheckerInputError as exc:
            status, error = exc.code, str(exc)
            self._say(ERROR, error)

        try:
            session.connect()
            n = 0 if payload is None else payload.numel()
            headers = session.exchange_headers(
                Header(rank=env.rank, payload_len=n, checker_version=__version__, status=status)
            )
            failed = [h.rank for h in headers if h.status != ROW_OK]
            if failed or len({h.payload_len for h in headers}) > 1:
                why = (
                    f"{rank_ranges(failed)} could not derive the sweep (each printed its error above)"
                    if failed
                    else "ranks derive sweeps of different sizes: pass the same --budgets and --policy "
                    "everywhere"
                )
                return session.finish(
                    EXIT_CODES[ERROR],
                    publish=lambda: self._say(ERROR, why),
                    fallback=lambda: None,
                    one_line=f"checker sweep error: {why}",
                )
            gathered = session.all_gather(payload)
        except (SchemaMismatch, CheckerInputError) as exc:  # CheckerInputError: a stale rendezvous store
            msg = str(exc)
            return session.finish(
                EXIT_CODES[ERROR],
                publish=lambda: self._say(ERROR, msg),
                fallback=lambda: None,
                one_line=f"checker sweep error: {msg}",
                clean=isinstance(exc, SchemaMismatch),
            )
        except InfrastructureFailure as exc:
            abort = session.failed(str(exc))
            line = f"{exc}; missing: {describe(abort.missing_ranks)}"
            return session.finish(
                EXIT_CODES[INFRASTRUCTURE_FAILURE],
                publish=lambda: self._say(INFRASTRUCTURE_FAILURE, line),
                fallback=lambda: self._say(INFRASTRUCTURE_FAILURE, line),
                one_line=f"checker sweep infrastructure_failure: {line}",
                clean=False,
            )

        assert ctx is not None
        grid, policies, required, inputs_by_policy = ctx
        # Every rank is a row: tp ranks of one stage must agree with each other as well.
        stack = gathered.view(env.world_size, len(policies), len(grid.budgets), len(CHECKED_VALUES))
        verdicts = analyse(stack, grid.budgets, policies)["policies"]
        code = EXIT_DIVERGENT if any(not verdicts[p]["consistent"] for p in required) else 0
        box: dict[str, int] = {}

        def publish() -> None:
            try:
                box["code"] = present(
                    config,
                    stack,
                    grid,
                    policies,
                    required,
                    inputs_by_policy[policies[0]],
                    device=str(session.device),
                    mode="distributed",
                    world_size=env.world_size,
                )
            except CheckerInputError as exc:  # --report or --plot could not be written
                print(f"checker sweep: error: {exc}", file=sys.stderr, flush=True)
                box["code"] = EXIT_CODES[ERROR]

        result = session.finish(
            code,
            publish=publish,
            fallback=lambda: None,
            one_line=f"checker sweep: a required policy diverges (exit {code})",
        )
        return box.get("code", result)
