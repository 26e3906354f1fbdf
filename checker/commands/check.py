"""``checker check`` (the default): the preflight, one verdict on every rank.

    torchrun --standalone --nproc-per-node 8 -m checker --model kimi-k3 --budget-gib 8
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m checker --model-config config.json --tp-size 2 --report report.json

Each rank derives its stage's capacity locally (no collective, as SGLang does), then every rank joins
two fixed-size int64 all-gathers and decides the same verdict: exit 0 consistent, 1 divergent, 2 error,
3 infrastructure failure, 4 model drift (``--engine both``: the builtin model and the installed SGLang
derive different values). torchrun turns any non-zero exit into 1: read ``status`` from --report.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from checker import __version__
from checker.core.errors import CheckerInputError, LayoutError
from checker.dist.launch_env import RankEnv
from checker.dist.wire import MISSING, STATUS_DRIFT, STATUS_INTERNAL, STATUS_OK, RankRow, input_text
from checker.engines import add_engine_args
from checker.options import (
    DEFAULT_BUDGET_GIB,
    add_flag_args,
    add_layout_args,
    add_model_args,
    finite_float,
    inputs_from_args,
)

HELP = "the preflight under torchrun: every rank derives locally, all ranks agree or the job fails"
GRACE_S = 3.0
"""How long rank 0 waits for survivors to check in after a failure, and others wait for its report."""
WATCHDOG_EXTRA_S = 10.0
FLAG_INPUTS = (
    "pp_size", "tp_size", "dp_size", "policy", "mamba_full_memory_ratio", "mamba_radix_cache_strategy",
    "page_size", "disable_radix_cache", "disable_overlap_schedule", "max_running_requests",
    "max_mamba_cache_size", "pp_max_micro_batch_size", "speculative_num_draft_tokens",
    "mamba_ssm_dtype", "token_capacity", "context_len",
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_layout_args(parser, pp_default=None)
    add_flag_args(parser)
    add_engine_args(parser)
    add_preflight_args(parser)


def add_group_args(g: argparse._ActionsContainer) -> None:
    """Options of any command that runs over a process group (check, sweep)."""
    g.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: nccl with tensors on cuda:LOCAL_RANK when a GPU is present, else gloo")
    g.add_argument("--timeout-s", type=finite_float, default=60.0,
                   help="bound on init and on every collective; a lost rank ends the run after about "
                   "this long with status infrastructure_failure (default 60)")
    g.add_argument("--init-method", metavar="URL", default=None,
                   help="rendezvous without torchrun: file:///path/to/fresh/file (tests); default: "
                   "torchrun's store from MASTER_ADDR/MASTER_PORT")


def add_preflight_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("preflight")
    add_group_args(g)
    g.add_argument("--budget-from-device", action="store_true",
                   help="budget = free device memory x --mem-fraction-static, all-reduced MIN as SGLang does")
    g.add_argument("--mem-fraction-static", type=finite_float, default=0.9,
                   help="fraction of free device memory handed to pool sizing (default 0.9)")
    g.add_argument("--device-free-gib", metavar="GIB[,GIB...]",
                   help="free device memory to assume instead of measuring it (CPU runs, tests): one "
                   "value, or one per rank")
    g.add_argument("--no-agree-budget", action="store_true",
                   help="skip the MIN all-reduce: shows the divergence a missing agreement would cause")
    g.add_argument("--strict-inputs", action="store_true",
                   help="fail (exit 1) when inputs differ across ranks even if every derived value agrees")
    g.add_argument("--report", metavar="PATH", help="write the JSON report here (rank 0)")
    g.add_argument("--junit", metavar="PATH", help="write JUnit XML here (rank 0)")
    g.add_argument("--materialize", action="store_true",
                   help="allocate this rank's stage pool for real (SGLang's shapes and dtypes), measure "
                   "it against the prediction, free it; a failure or mismatch is an error")
    g.add_argument("--materialize-device", metavar="DEVICE", default="auto",
                   help="where --materialize allocates: auto (the exchange's device: cuda:LOCAL_RANK "
                   "under nccl, else cpu), cpu, cuda (GPU LOCAL_RANK mod the GPU count: gloo ranks "
                   "may share one GPU) or cuda:N")


class _Watchdog:
    """Last line of defence: whatever blocks, the rank ends with a verdict, never a hang."""

    def __init__(self, seconds: float, on_fire) -> None:
        self.finishing = threading.Event()
        self._timer = threading.Timer(seconds, self._fire, args=(on_fire,))
        self._timer.daemon = True
        self._timer.start()

    def _fire(self, on_fire) -> None:
        if not self.finishing.is_set():
            on_fire()

    def cancel(self) -> None:
        import faulthandler

        self.finishing.set()
        self._timer.cancel()
        faulthandler.cancel_dump_traceback_later()


def layout(args: argparse.Namespace, env: RankEnv) -> tuple[int, int]:
    """(pp_size, pp_rank): tp is the inner dimension, pp_rank = rank // tp_size."""
    world, tp = env.world_size, args.tp_size
    pp = args.pp_size or (world // tp if world % tp == 0 else 0)
    if world % tp or pp * tp != world:
        raise LayoutError(
            f"world_size {world} is not pp_size x tp_size = {args.pp_size or '?'} x {tp}; launch "
            f"pp x tp ranks (e.g. --nproc-per-node {tp * (args.pp_size or 1)}) or fix --pp-size/--tp-size"
        )
    return pp, env.rank // tp


def _device_free_bytes(args: argparse.Namespace, env: RankEnv, device) -> int:
    if args.device_free_gib:
        values = args.device_free_gib.split(",")
        if len(values) not in (1, env.world_size):
            raise LayoutError(
                f"--device-free-gib has {len(values)} values for world_size {env.world_size}; "
                "give one value or one per rank"
            )
        try:
            gib = finite_float(values[0] if len(values) == 1 else values[env.rank])
        except argparse.ArgumentTypeError as exc:
            raise LayoutError(f"--device-free-gib: {exc}") from None
        if gib <= 0:
            raise LayoutError(f"--device-free-gib {gib} must be positive")
        return int(gib * 2**30)
    if device.type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    raise LayoutError(
        "--budget-from-device on a CPU rank needs --device-free-gib (no device memory to measure); "
        "or pass --budget-gib"
    )


def agreed_budget_gib(free_bytes: list[int], own: int, *, fraction: float, agree: bool) -> float:
    """SGLang all-reduces free memory (GiB, float32) with MIN, then applies the static fraction."""
    import torch

    known = [b for b in free_bytes if b != MISSING]
    chosen = (min(known) if agree and known else own) / 2**30
    return float(torch.tensor(chosen, dtype=torch.float32)) * fraction


def run(args: argparse.Namespace) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    # record() writes an unexpected exception to TORCHELASTIC_ERROR_FILE: torchrun's "Root Cause".
    return record(_run)(args)


def _run(args: argparse.Namespace) -> int:
    import torch

    from checker import report
    from checker.dist.faults import maybe_inject
    from checker.dist.group import Group, InfrastructureFailure
    from checker.dist.wire import Header, RankRow, WireError
    from checker.verdict import decide, infrastructure_failure

    t0 = time.monotonic()
    timings: dict[str, float] = {}
    env = RankEnv.from_environ()
    is_rank0 = env.rank == 0
    summary = f"world {env.world_size}"

    def finish(verdict, *, clean: bool, group=None) -> int:
        """Rank 0 prints and writes before anyone exits non-zero (torchrun kills the rest)."""
        watchdog.finishing.set()  # the Python watchdog stands down; the GIL-free backstop stays armed
        timings["total_s"] = time.monotonic() - t0
        extra = {"checker_version": __version__, "torch_version": torch.__version__,
                 "backend": getattr(group, "backend", args.backend), "timings": timings}
        if is_rank0:
            problems = report.write_all(verdict, report=args.report, junit=args.junit,
                                        summary=summary, elapsed_s=timings["total_s"], extra=extra)
            print(report.to_text(verdict, summary=summary, elapsed_s=timings["total_s"]), flush=True)
            for p in problems:
                print(f"checker: warning: {p}", file=sys.stderr, flush=True)
            if group is not None:
                group.announce("report_written")
        elif group is None or not group.wait_for("report_written", wait_s=GRACE_S + 2):
            # Rank 0 is gone or unreachable: this rank's own verdict must not be lost.
            print(f"[rank {env.rank}] " + report.to_text(verdict, summary=summary,
                                                        elapsed_s=timings["total_s"]),
                  file=sys.stderr, flush=True)
        if verdict.exit_code:
            _record_for_torchrun(verdict)
        watchdog.cancel()
        if clean and group is not None:
            group.close()
            return verdict.exit_code
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(verdict.exit_code)  # a broken group's destructor can block; leave now

    def on_watchdog() -> None:
        detail = f"no verdict within --timeout-s {args.timeout_s:g} s + {WATCHDOG_EXTRA_S:g} s (watchdog)"
        print(f"[rank {env.rank}] checker: {detail}", file=sys.stderr, flush=True)
        if is_rank0:
            v = infrastructure_failure(world_size=env.world_size, detail=detail, missing_ranks=[])
            report.write_all(v, report=args.report, junit=args.junit, summary=summary,
                             elapsed_s=time.monotonic() - t0, extra={"timings": timings})
            print(report.to_text(v, summary=summary, elapsed_s=time.monotonic() - t0), flush=True)
        os._exit(3)

    watchdog = _Watchdog(args.timeout_s + WATCHDOG_EXTRA_S, on_watchdog)
    # Backstop that needs no GIL (a C++ call that blocks holding it stalls the Python watchdog):
    # faulthandler's own thread dumps the stacks and exits 1 a little later.
    import faulthandler

    faulthandler.dump_traceback_later(args.timeout_s + 2 * WATCHDOG_EXTRA_S, exit=True)
    if env.max_restarts > 0 and is_rank0:
        print(f"checker: warning: torchrun --max-restarts {env.max_restarts} only repeats a "
              "deterministic disagreement; use --max-restarts 0", file=sys.stderr)

    group = None
    try:
        maybe_inject(env.rank, "start")
        group = Group(env, backend=args.backend, timeout_s=args.timeout_s, init_method=args.init_method)
        summary = f"world {env.world_size}, {group.backend}"
        # Local facts first (no collective): this rank's layout and free device memory.
        status, error, pp_size, pp_rank = STATUS_OK, "", 0, 0
        free = MISSING
        try:
            pp_size, pp_rank = layout(args, env)
            if args.budget_from_device:
                free = _device_free_bytes(args, env, group.device)
        except CheckerInputError as exc:
            status, error = exc.code, str(exc)

        group.connect()
        timings["init_s"] = time.monotonic() - t0
        maybe_inject(env.rank, "exchange")
        headers = group.all_gather_int64(
            Header(rank=env.rank, device_free_bytes=free, checker_version=__version__).encode()
        ).tolist()
        schemas = {Header.schema_of(h) for h in headers}
        if len(schemas) > 1:
            raise _SchemaMismatch(headers)

        # The derivation itself: local, exactly as SGLang computes it on this stage.
        t_derive = time.monotonic()
        row = _derive_row(args, env, status=status, error=error, pp_size=pp_size, pp_rank=pp_rank,
                          free=free, all_free=[h[4] for h in headers], torch_version=torch.__version__,
                          device=group.device, deadline=t0 + args.timeout_s, timings=timings)
        timings["derive_s"] = time.monotonic() - t_derive
        summary = (f"world {env.world_size} = pp {row.ints.get('pp_size', '?')} x tp {args.tp_size}, "
                   f"{group.backend}; {row.inputs.get('model')}, budget {row.inputs.get('budget_gib')} "
                   f"GiB ({row.inputs.get('budget_source')}), policy {args.policy}")
        t_x = time.monotonic()
        gathered = group.all_gather_int64(row.encode()).tolist()
        timings["exchange_s"] = time.monotonic() - t_x
        rows = [RankRow.decode(g) for g in gathered]
        verdict = decide(rows, world_size=env.world_size, strict_inputs=args.strict_inputs)
        return finish(verdict, clean=True, group=group)
    except _SchemaMismatch as exc:
        from checker.verdict import Verdict

        v = Verdict(status="error", world_size=env.world_size, errors=[str(exc)])
        return finish(v, clean=True, group=group)
    except WireError as exc:
        from checker.verdict import Verdict

        v = Verdict(status="error", world_size=env.world_size, errors=[f"unreadable row: {exc}"])
        return finish(v, clean=True, group=group)
    except InfrastructureFailure as exc:
        missing: list[int] = []
        if group is not None and group.store is not None:
            group.shorten_store_timeout(GRACE_S)
            group.mark("alive")
            if is_rank0:
                alive = group.ranks_with("alive", wait_s=GRACE_S)
                missing = [r for r in range(env.world_size) if r not in alive]
        v = infrastructure_failure(world_size=env.world_size, detail=str(exc), missing_ranks=missing)
        return finish(v, clean=False, group=group)


def _record_for_torchrun(verdict) -> None:
    """Put the verdict in torchrun's error file so its "Root Cause" names it, not just "exitcode 1".

    Same format as torch elastic's ``record`` (message + extraInfo), written directly so no traceback
    is involved: torchrun shows the message where it would show a traceback.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    import json

    from checker.report import one_line

    line = one_line(verdict)
    data = {"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


class _SchemaMismatch(Exception):
    def __init__(self, headers: list[list[int]]) -> None:
        from checker.verdict import rank_ranges

        by: dict[tuple, list[int]] = {}
        for r, h in enumerate(headers):
            by.setdefault(tuple(h[:3]), []).append(r)
        parts = [f"{rank_ranges(rs)} speak wire schema {k[1]} ({k[2]} ints)" for k, rs in by.items()]
        super().__init__(
            "ranks run different checker versions: " + "; ".join(parts)
            + "; install the same checker on every node"
        )


def _derive_row(args, env: RankEnv, *, status: int, error: str, pp_size: int, pp_rank: int,
                free: int, all_free: list[int], torch_version: str, device=None,
                deadline: float | None = None, timings: dict[str, float] | None = None) -> RankRow:
    """This rank's row: ok with its values, or its error. Never raises: every rank must join."""
    from checker.dist.faults import maybe_inject
    from checker.dist.wire import env_inputs

    ints = {"rank": env.rank, "world_size": env.world_size, "pp_rank": pp_rank,
            "tp_rank": env.rank % args.tp_size, "node_rank": env.node_rank,
            "local_rank": env.local_rank, "pp_size": pp_size, "tp_size": args.tp_size,
            "device_free_bytes": free}
    inputs = {name: input_text(getattr(args, name, None)) for name in FLAG_INPUTS}
    inputs.update(env_inputs(os.environ))
    inputs["checker_version"] = __version__
    inputs["torch_version"] = torch_version
    inputs["sglang_version"] = None  # set below when an engine runs SGLang's code
    inputs["model"] = args.model_config or args.model or "kimi-k3"
    if args.budget_from_device:
        source = f"device free x {args.mem_fraction_static:g}" + (
            ", not agreed" if args.no_agree_budget else ", MIN over ranks")
    else:
        source = "--budget-gib" if args.budget_gib is not None else "default"
    inputs["budget_source"] = source
    if status == STATUS_OK:
        try:
            budget = (
                agreed_budget_gib(all_free, free, fraction=args.mem_fraction_static,
                                  agree=not args.no_agree_budget)
                if args.budget_from_device
                else (args.budget_gib if args.budget_gib is not None else DEFAULT_BUDGET_GIB)
            )
            inputs["budget_gib"] = input_text(float(budget))
            ints["budget_millionths_gib"] = round(budget * 1e6)
            maybe_inject(env.rank, "derive")
            cap_inputs = inputs_from_args(args, pp_size=pp_size, budget_gib=budget)
            # The geometry digest covers the resolved shapes and dtypes, not just the path.
            import hashlib
            import json

            geo = json.dumps(cap_inputs.geometry.describe(), sort_keys=True)
            inputs["model"] = (f"{cap_inputs.geometry.name} "
                               f"#{hashlib.blake2b(geo.encode(), digest_size=4).hexdigest()}")
            from checker.engines.drift import drift_summary, prepare_from_args

            engines = prepare_from_args(args, cap_inputs)
            inputs["sglang_version"] = engines.sglang_version
            stage, drifts = engines.derive(pp_rank)
            if stage is None:  # the builtin refused what SGLang derives: only the drift to report
                status, error = STATUS_DRIFT, drift_summary(drifts)
                raise _Drifted
            for name in ("max_mamba_cache_size", "max_running_requests", "pp_max_micro_batch_size",
                         "start_layer", "end_layer", "stage_linear_layers", "max_stage_linear_layers",
                         "stage_per_req_bytes", "slots_per_request"):
                ints[name] = getattr(stage, name)
            ints["state_allocated_bytes"] = stage.state_allocated_bytes
            ints["state_charged_bytes"] = stage.state_charged_bytes
            if drifts:  # the more specific finding: the model and the deployed code disagree
                status, error = STATUS_DRIFT, drift_summary(drifts)
            else:
                if device is not None:
                    _check_on_device(cap_inputs, pp_rank, budget, stage, device)
                if getattr(args, "materialize", False):
                    status, error = _materialize(args, env, cap_inputs, stage, ints, device=device,
                                                 deadline=deadline, timings=timings)
        except _Drifted:
            pass
        except CheckerInputError as exc:
            status, error = exc.code, str(exc)
        except Exception as exc:  # a bug or a broken environment: still join, still report
            status, error = STATUS_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
    ints["status"] = status
    return RankRow(ints=ints, host=env.host, error=error, inputs=inputs)


def _check_on_device(cap_inputs, pp_rank: int, budget: float, stage, device) -> None:
    """Derive the stage again on the rank's own device (the sweep's vectorised path, float64 tensors)
    and hold it against the scalar core: on a GPU rank this is the derivation done on the GPU."""
    from checker.core.sizing import CHECKED_VALUES
    from checker.sweep_torch import derive_sweep

    on_device = derive_sweep(cap_inputs, pp_rank, [budget], device)[0].tolist()
    scalar = [getattr(stage, n) for n in CHECKED_VALUES]
    if on_device != scalar:
        raise RuntimeError(
            f"the derivation on {device} gives {dict(zip(CHECKED_VALUES, on_device, strict=True))} but "
            f"the scalar core {dict(zip(CHECKED_VALUES, scalar, strict=True))}; please report this"
        )


class _Drifted(Exception):
    """Leaves the derivation early with the drift status already set (no values to fill in)."""


def _materialize(args, env: RankEnv, cap_inputs, stage, ints: dict[str, int], *, device,
                 deadline: float | None, timings: dict[str, float] | None) -> tuple[int, str]:
    """--materialize: allocate this stage's pool, fill the three wire slots; a finding is an error."""
    from checker.materialize import (
        STATUS_FAILED,
        STATUS_MATERIALIZE,
        materialize_stage,
        predicted_bytes,
        resolve_device,
    )

    # The prediction is reported even when the device cannot be resolved.
    ints.update(predicted_bytes=predicted_bytes(cap_inputs, stage), materialize_status=STATUS_FAILED)
    target = resolve_device(args.materialize_device, local_rank=env.local_rank,
                            default=str(device) if device is not None else "cpu")
    t_m = time.monotonic()
    m = materialize_stage(cap_inputs, stage, target, host_share=env.local_world_size, deadline=deadline)
    if timings is not None:
        timings["materialize_s"] = time.monotonic() - t_m
    ints.update(predicted_bytes=m.predicted_bytes, allocated_bytes=m.allocated_bytes,
                materialize_status=m.status)
    return (STATUS_OK, "") if m.ok else (STATUS_MATERIALIZE, m.error)
