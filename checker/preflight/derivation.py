"""One rank's local facts and derivation, as its row: no collective, exactly as SGLang sizes its stage.

:func:`local_facts` runs before the exchange (the layout and the free device memory, which the header
carries so every rank can take the MIN); :func:`derive_row` runs after the header gather and never
raises: a rank whose derivation fails still joins the row gather with its error, so every rank reaches
the same verdict.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from checker import __version__
from checker.config import MISSING_FRACTION, PreflightConfig, SizingFlags, sglang_env
from checker.core.errors import CheckerInputError, LayoutError
from checker.core.releases.releases import ReleaseChoice, installed_sglang_version
from checker.core.sizing.budget import sizing_budget
from checker.core.sizing.kv_pool import release_index
from checker.core.sizing.layout import layout
from checker.core.sizing.partition import PARTITION_ENV
from checker.core.sizing.row import (
    ATTENTION_LAYOUT,
    MISSING,
    NOT_INSTALLED,
    RankRow,
    budget_slots,
    input_text,
    launch_digest,
    model_digest,
    model_label,
)
from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs, StageCapacity, requests_per_worker
from checker.device.materialize import MATERIALIZE_FAILED, materialize_stage, predicted_bytes, resolve_device
from checker.distributed.faults import maybe_inject
from checker.distributed.launch_env import RankEnv
from checker.engines.drift import drift_summary, prepare_engines
from checker.families.weights_source import RankWeightsFigure, WeightsSource, weights_per_rank
from checker.preflight.resolve import capacity_inputs, choose_release, model_source
from checker.status import ROW_DRIFT, ROW_INTERNAL, ROW_MATERIALIZE, ROW_OK

if TYPE_CHECKING:
    import torch

    from checker.launch.merge import GivenFlags

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class LocalFacts:
    """What a rank knows before any exchange."""

    pp_size: int = 0
    pp_rank: int = 0
    device_free_bytes: int = MISSING
    device_total_mib: float | None = None
    """The GPU's total memory as SGLang reads it, where the fraction is the release's default."""
    sm_count: int | None = None
    """A GPU rank's streaming multiprocessors (``multi_processor_count``): a Marlin workspace's size."""
    status: int = ROW_OK
    error: str = ""


def local_facts(config: PreflightConfig, env: RankEnv, device: torch.device | None) -> LocalFacts:
    try:
        pp_size, pp_rank = layout(
            env.world_size,
            env.rank,
            pp_size=config.sizing.pp_size,
            tp_size=config.sizing.tp_size,
            dp_size=config.sizing.dp_size,
        )
        free = _device_free_bytes(config, env, device) if config.budget.from_device else MISSING
        total = _device_total_mib(config, device) if config.budget.from_device else None
    except CheckerInputError as exc:
        return LocalFacts(status=exc.code, error=str(exc))
    sms = None
    if config.budget.from_device and device is not None and device.type == "cuda":
        import torch  # torch: the rank's device came from it already

        sms = int(torch.cuda.get_device_properties(device).multi_processor_count)
    return LocalFacts(
        pp_size=pp_size, pp_rank=pp_rank, device_free_bytes=free, device_total_mib=total, sm_count=sms
    )


def _device_total_mib(config: PreflightConfig, device: torch.device | None) -> float | None:
    """Where the fraction is unset: the GPU's total memory, given or read as SGLang reads it."""
    b = config.budget
    if b.mem_fraction_static is not None:
        return None
    if b.device_total_gib is not None:
        return b.device_total_gib * 1024
    if device is not None and device.type == "cuda":
        # start-up: the fraction's rule and its nvidia-smi reader load only where the fraction is unset
        from checker.preflight.default_fraction import sglang_device_total_mib

        return sglang_device_total_mib(device)
    raise LayoutError(MISSING_FRACTION)


def _device_free_bytes(config: PreflightConfig, env: RankEnv, device: torch.device | None) -> int:
    given = config.budget.device_free_gib
    if given:
        if len(given) not in (1, env.world_size):
            raise LayoutError(
                f"--device-free-gib has {len(given)} values for world_size {env.world_size}; "
                "give one value or one per rank"
            )
        return int((given[0] if len(given) == 1 else given[env.rank]) * GIB)
    if device is not None and device.type == "cuda":
        import torch  # torch: the rank's device came from it already; a CPU rank's derivation needs none

        return int(torch.cuda.mem_get_info(device)[0])
    raise LayoutError(
        "--budget-from-device on a CPU rank needs --device-free-gib (no device memory to measure); "
        "or pass --budget-gib"
    )


def rank_weights(
    config: PreflightConfig, env: RankEnv, local: LocalFacts, *, release: str, environ: Mapping[str, str]
) -> list[RankWeightsFigure]:
    """Every rank's weights figure, by precedence
    (:func:`checker.families.weights_source.weights_per_rank`):
    ``--weights-gib``, else the checkpoint beside the model's config.json as ``release``'s class holds it
    on each rank of this layout (every rank reads the same headers and gets the same list), else none."""
    b = config.budget
    w = b.weights
    layout = None
    if w.model_dir is not None or w.draft is not None:  # the draft's rules hold under --weights-gib too
        layout = w.layout(config.sizing, pp_size=local.pp_size, partition_env=environ.get(PARTITION_ENV))
        if layout.gpu_sm_count is None and local.sm_count is not None:  # the rank's own GPU sizes Marlin's
            layout = replace(layout, gpu_sm_count=local.sm_count)
    return weights_per_rank(
        flag_gib=b.weights_gib,
        flag_source=WeightsSource.LOG if b.weights_source else WeightsSource.FLAG,
        world_size=env.world_size,
        model_dir=w.model_dir,
        layout=layout,
        release=release,
        quantization=w.quantization,
    )


FRACTION_MILLIONTHS = 1_000_000
"""``mem_fraction_millionths`` per unit of --mem-fraction-static (the row's one int form of it)."""
FRACTION_GIVEN, FRACTION_DEFAULT = 1, 2
"""``mem_fraction_source`` on the row: given (the flag or the launch command), the release's default."""
FRACTION_SOURCES = {FRACTION_GIVEN: "given", FRACTION_DEFAULT: "release default"}


@dataclass(frozen=True)
class UsedFraction:
    """The --mem-fraction-static a device budget used, and where it came from (``FRACTION_*``)."""

    value: float
    source: int


def device_budget(
    config: PreflightConfig,
    env: RankEnv,
    local: LocalFacts,
    all_free: Sequence[int],
    *,
    release: str,
    weights: Sequence[RankWeightsFigure] | None = None,
) -> tuple[float, str, UsedFraction]:
    """``--budget-from-device``: the memory handed to sizing, computed as this rank's release does
    (:func:`checker.core.sizing.budget.sizing_budget`), the formula it used and the --mem-fraction-static.

    SGLang measures free memory before and after loading the weights, each all-reduced MIN over the
    ranks; the checker loads none, so free-after is free-before minus each rank's weights figure
    (``weights``: :func:`rank_weights`; none is 0, a budget larger than the server's by the weights).
    ``release``: the modelled SGLang release whose budget formula applies (ReleaseChoice.modelled).
    """
    b = config.budget
    if weights is None:
        weights = rank_weights(config, env, local, release=release, environ=os.environ)
    per_rank = [w.gib or 0.0 for w in weights]
    if len(per_rank) != env.world_size:
        raise LayoutError(
            f"--weights-gib has {len(per_rank)} values for world_size {env.world_size}; give one value or "
            "one per rank"
        )
    if b.agree:
        known = [(r, f) for r, f in enumerate(all_free) if f != MISSING]
    else:
        known = [(env.rank, local.device_free_bytes)]
    before = min(f for _, f in known) / GIB
    after = min(f / GIB - per_rank[r] for r, f in known)
    fraction, picked = b.mem_fraction_static, ""
    if fraction is None:  # the release's own default for this rank's GPU (never assumed)
        # start-up: the fraction's rule and its table load only where the fraction is unset
        from checker.preflight.default_fraction import release_default_fraction

        if local.device_total_mib is None:
            raise LayoutError(MISSING_FRACTION)
        default = release_default_fraction(config, None, local.device_total_mib, os.environ, release=release)
        fraction, picked = default.value, f"; {default.text}"
    result = sizing_budget(
        release,
        free_before_gib=before,
        weights_gib=max(before - after, 0.0),
        mem_fraction_static=fraction,
    )
    agreement = "MIN over ranks" if b.agree else "this rank's own, not agreed"
    # Where the weights came from is each rank's own field (weights_source): the formula is an input,
    # cut at the wire's width, and keeps the numbers first.
    used = UsedFraction(fraction, FRACTION_DEFAULT if picked else FRACTION_GIVEN)
    return result.budget_gib, f"device free ({agreement}): {result.formula}{picked}", used


def flag_inputs(sizing: SizingFlags, given: GivenFlags | None) -> dict[str, str | None]:
    """The sizing-flag inputs as the user gave them: a flag not typed (on the checker's command line or in
    the launch command) is its checker default (None where the release or the layout decides), never the
    value a release's parser defaults it to nor the pp size this rank works out from the world: those
    differ across ranks by release or layout, which their own inputs name. The attention TP and DP sizes
    (``tp_size``, ``dp_size``) are what the rank derives with; ``attention_layout`` holds the flags typed."""
    values: dict[str, object] = {f.name: getattr(sizing, f.name) for f in fields(sizing)}
    if given is not None:
        values = {
            f.name: values[f.name] if f.name in given.names or f.name in _DERIVED else f.default
            for f in fields(sizing)
        }
    out = {k: input_text(v) for k, v in values.items()}
    # Unknown (a config built without the entry point): unset on every rank, so tp_size and dp_size are
    # compared as themselves.
    out[ATTENTION_LAYOUT] = given.attention if given is not None else None
    return out


_DERIVED = ("tp_size", "dp_size")
"""Inputs that hold what the rank derives with: the attention TP and DP sizes (a launch command's
--tp-size and attention DP give them by the release's rules), compared beside the flags typed."""


def derive_row(
    config: PreflightConfig,
    env: RankEnv,
    local: LocalFacts,
    *,
    all_free: Sequence[int],
    torch_version: str,
    device: torch.device | None = None,
    deadline: float | None = None,
    timings: dict[str, float] | None = None,
    environ: Mapping[str, str] | None = None,
) -> RankRow:
    """This rank's row: ok with its values, or its error. Never raises: every rank must join."""
    environ = os.environ if environ is None else environ
    sizing = config.sizing
    row = RankRow(
        rank=env.rank,
        world_size=env.world_size,
        pp_rank=local.pp_rank,
        tp_rank=env.rank % sizing.tp_size,
        node_rank=env.node_rank,
        operator_node_rank=MISSING if env.operator_node_rank is None else env.operator_node_rank,
        local_rank=env.local_rank,
        pp_size=local.pp_size,
        tp_size=sizing.tp_size,
        device_free_bytes=local.device_free_bytes,
        host=env.host,
        status=local.status,
        error=local.error,
    )
    if config.launch is not None:  # the whole command, every word: the report groups ranks by it
        row.launch_digest = launch_digest(shlex.join(config.launch.argv))
    inputs: dict[str, str | None] = flag_inputs(sizing, config.given)
    inputs.update(sglang_env(environ))
    fixed_budget = None if config.budget.from_device else config.budget.budget_gib
    # The inputs this rank resolves below (RESOLVED_INPUTS) stay None until it has: a rank that fails
    # first is left out of their comparison instead of differing from every rank that got further. A
    # fixed --budget-gib is known now, so ranks given different ones differ even when they fail.
    inputs.update(
        checker_version=__version__,
        torch_version=torch_version,
        sglang_installed=None,
        model=None,
        budget_source=None if config.budget.from_device else config.budget.label,
        budget_gib=None if fixed_budget is None else budget_slots(fixed_budget)[0],
        derived_as=None,
        launch_command=config.launch_command,
    )
    row.inputs = inputs
    try:
        # The one choice of this rank's release (what is installed HERE decides; --sglang-version wins).
        installed = installed_sglang_version()
        inputs["sglang_installed"] = installed or NOT_INSTALLED
        release = choose_release(config.engine, installed)
        inputs["derived_as"] = release.label
    except CheckerInputError as exc:  # unreadable metadata, a version that is no release number
        if row.status == ROW_OK:
            row.status, row.error = exc.code, str(exc)
        return row
    if row.status != ROW_OK:
        return row
    try:
        _derive_into(
            row,
            config,
            env,
            local,
            release=release,
            all_free=all_free,
            device=device,
            deadline=deadline,
            timings=timings,
            environ=environ,
        )
    except CheckerInputError as exc:
        row.status, row.error = exc.code, str(exc)
    except Exception as exc:  # a bug or a broken environment: still join, still report
        row.status, row.error = ROW_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
    return row


def _derive_into(
    row: RankRow,
    config: PreflightConfig,
    env: RankEnv,
    local: LocalFacts,
    *,
    release: ReleaseChoice,
    all_free: Sequence[int],
    device: torch.device | None,
    deadline: float | None,
    timings: dict[str, float] | None,
    environ: Mapping[str, str],
) -> None:

    inputs = dict(row.inputs)  # this rank fills in its own row's inputs as it resolves them
    row.inputs = inputs

    b = config.budget
    if b.from_device:
        weights = rank_weights(config, env, local, release=release.modelled, environ=environ)
        mine = weights[env.rank]
        row.weights_source = int(mine.source)
        row.draft_source = int(mine.draft_source)
        if mine.gib is not None:
            row.weights_bytes = round(mine.gib * GIB)
        if mine.detail is not None:  # the checkpoint's figure: its parts, exactly
            d = mine.detail
            row.param_bytes, row.buffer_bytes, row.margin_bytes, row.draft_bytes = (
                d.param_bytes,
                d.buffer_bytes,
                d.margin_bytes,
                d.draft_bytes,
            )
            row.weights_bytes = d.total_bytes
        budget_gib, formula, fraction = device_budget(
            config, env, local, all_free, release=release.modelled, weights=weights
        )
        row.mem_fraction_millionths = round(fraction.value * FRACTION_MILLIONTHS)
        row.mem_fraction_source = fraction.source
        # Agreed (MIN over ranks), the formula is every rank's and says how the budget was reached; not
        # agreed, its numbers are this rank's own free memory, not an input: the flags are the source
        # then, and each rank's budget_gib shows what its memory gave.
        inputs["budget_source"] = formula if b.agree else b.label
    else:
        assert b.budget_gib is not None
        budget_gib = b.budget_gib
    inputs["budget_gib"], row.budget_millionths_gib = budget_slots(budget_gib)
    maybe_inject(env.rank, "derive")
    cap = capacity_inputs(
        config.model,
        config.sizing,
        budget_gib=budget_gib,
        pp_size=local.pp_size,
        env=environ,
        release=release,
        draft=config.budget.weights.draft,
    )
    # The model's own definition (not the dtypes or TP size this rank resolved: inputs of their own).
    inputs["model"] = model_label(cap.geometry)
    row.num_layers = cap.geometry.num_hidden_layers
    row.model_digest = int(model_digest(cap.geometry), 16)
    source = model_source(config.model, config.sizing)
    engines = prepare_engines(
        release.engine, cap, source, environ, best_effort=config.engine.best_effort, release=release
    )
    stage, drifts = engines.derive(local.pp_rank)
    if stage is None:  # the builtin refused what SGLang derives: only the drift to report
        row.status, row.error = ROW_DRIFT, drift_summary(drifts)
        return
    for name in (
        *CHECKED_VALUES,
        "start_layer",
        "end_layer",
        "stage_linear_layers",
        "max_stage_linear_layers",
        "stage_per_req_bytes",
        "slots_per_request",
        "state_allocated_bytes",
        "state_charged_bytes",
        "context_len",
        "kv_cell_bytes",
        "kv_available_bytes",
        "kv_profiled_tokens",
        "kv_estimate_tokens",
        "kv_own_tokens",
        "max_total_num_tokens",
        "kv_idle_bytes",
    ):
        setattr(row, name, getattr(stage, name))
    set_kv_rule(row, cap, stage)
    if drifts:  # the more specific finding: the model and the deployed code disagree
        row.status, row.error = ROW_DRIFT, drift_summary(drifts)
        return
    if device is not None and engines.mode != "sglang":
        # The device path re-derives with the builtin model: it checks the builtin's numbers, not those
        # of SGLang's own code (under --engine sglang, or a release the checker does not model).
        check_on_device(cap, local.pp_rank, budget_gib, stage, device)
    if config.materialize:
        _materialize(row, config, env, cap, stage, device=device, deadline=deadline, timings=timings)


def set_kv_rule(row: RankRow, cap: CapacityInputs, stage: StageCapacity) -> None:
    """What the verdict's resolution after the MIN reads of this rank beside its own capacity
    (checker.preflight.verdict.resolve_kv_rows): its release's rules and its request flags."""
    row.kv_limiting = int(stage.kv_limiting)
    row.kv_release = release_index(cap.release.version)
    row.page_size = cap.kv_page_size  # what the pool aligns to (0.5.11-0.5.13.post1 may reset it)
    per_worker = requests_per_worker(cap)
    row.requests_per_worker = MISSING if per_worker is None else per_worker
    row.user_max_running_requests = MISSING if cap.max_running_requests is None else cap.max_running_requests
    row.user_micro_batch_size = (
        MISSING if cap.pp_max_micro_batch_size is None else cap.pp_max_micro_batch_size
    )


def check_on_device(
    cap: CapacityInputs, pp_rank: int, budget: float, stage: StageCapacity, device: torch.device
) -> None:
    """Derive the stage again on the rank's own device (the sweep's vectorised path, float64 tensors)
    and hold it against the scalar core: on a GPU rank this is the derivation done on the GPU."""
    # torch: device.sweep imports it, only on a rank that derives on a device
    from checker.device.sweep import derive_sweep

    # The pool after the MIN is the scalar core's: a page-aligned MIN resolves to itself, so the device
    # re-derives this stage's own pools and its resolution from it without sizing every other stage
    # (which made a rank's cost grow with the pipeline: 2.7 s at 32 stages, bench/preflight_bench.py).
    on_device = derive_sweep(cap, pp_rank, [budget], device, minimum=stage.max_total_num_tokens)[0].tolist()
    scalar = [getattr(stage, n) for n in CHECKED_VALUES]
    if on_device != scalar:
        raise RuntimeError(
            f"the derivation on {device} gives {dict(zip(CHECKED_VALUES, on_device, strict=True))} but "
            f"the scalar core {dict(zip(CHECKED_VALUES, scalar, strict=True))}; please report this"
        )


def _materialize(
    row: RankRow,
    config: PreflightConfig,
    env: RankEnv,
    cap: CapacityInputs,
    stage: StageCapacity,
    *,
    device: torch.device | None,
    deadline: float | None,
    timings: dict[str, float] | None,
) -> None:
    """--materialize: allocate this stage's pool and fill the three wire slots; a finding is an error."""

    # The prediction is reported even when the device cannot be resolved.
    row.predicted_bytes = predicted_bytes(cap, stage)
    row.materialize_status = MATERIALIZE_FAILED
    target = resolve_device(
        config.materialize_device,
        local_rank=env.local_rank,
        default=str(device) if device is not None else "cpu",
    )
    t_m = time.monotonic()
    m = materialize_stage(cap, stage, target, host_share=env.local_world_size, deadline=deadline)
    if timings is not None:
        timings["materialize_s"] = time.monotonic() - t_m
    row.predicted_bytes, row.allocated_bytes, row.materialize_status = (
        m.predicted_bytes,
        m.allocated_bytes,
        m.status,
    )
    if not m.ok:
        row.status, row.error = ROW_MATERIALIZE, m.error
