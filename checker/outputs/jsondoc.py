"""The JSON every command prints (``--format json``) and writes (``--report``): one vocabulary of key
names across check, derive, plan and sweep, described by ``docs/report.schema.json`` and
``docs/json-output.md`` (torch-free). ``checker.outputs.report`` builds check's report; the single-process
commands build theirs from these pieces.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import fields

from checker import __version__
from checker.config import EngineChoice, SizingFlags, sglang_env
from checker.core.releases.releases import ReleaseChoice, installed_sglang_version
from checker.core.sizing.row import NOT_INSTALLED, model_label
from checker.core.sizing.sizing import CapacityInputs, StageCapacity
from checker.device.materialize import MATERIALIZE_STATUS_NAMES, MaterializeResult
from checker.families.weights_source import RankWeightsFigure
from checker.preflight.resolve import choose_release
from checker.status import ERROR


def json_inputs(
    inputs: CapacityInputs,
    sizing: SizingFlags,
    release: ReleaseChoice | None,
    *,
    budget_source: str | None,
    budget_gib: float | None = None,
    resolved: bool = True,
    launch_command: str | None = None,
) -> dict[str, object]:
    """Every input under check's report's name: the flags as given (``policy`` null: the release's
    own), the SGLang env vars as set, ``sglang_installed`` the INSTALLED release and ``derived_as`` the
    release derived as (``release``: the command's one choice); then what the flags resolve to
    (``resolved_*``), as derive/plan/sweep add. ``release`` None: the installed release's model (sweep)."""
    if release is None:
        release = choose_release(EngineChoice(), installed_sglang_version(), own_code=False)
    d: dict[str, object] = {
        "checker_version": __version__,
        "sglang_installed": release.installed or NOT_INSTALLED,
        "derived_as": release.label,
        "model": model_label(inputs.geometry),
        "budget_gib": budget_gib,
        "budget_source": budget_source,
    }
    d.update({f.name: getattr(sizing, f.name) for f in fields(SizingFlags)})
    d["pp_size"] = inputs.pp_size
    d.update(sglang_env(os.environ))
    d["launch_command"] = launch_command
    d["sglang_best_effort"] = inputs.sglang_best_effort
    if resolved:
        d["resolved_policy"] = inputs.resolved_policy
        d["resolved_strategy"] = None if inputs.disable_radix_cache else inputs.resolved_strategy
        d["overlap_schedule"] = inputs.effective_overlap_schedule
        d["slots_per_request"] = inputs.slots_per_request()
        # What the release resolves itself from --speculative-algorithm (checker.core.releases.startup).
        d["resolved_speculative_num_draft_tokens"] = inputs.speculative_num_draft_tokens
        d["resolved_max_running_requests"] = inputs.max_running_requests
    return d


def json_layout(inputs: CapacityInputs) -> dict[str, int]:
    """The deployment the values are for (check's ``layout``): pp_size x the TP group (tp_size x
    dp_size: attention DP is inside SGLang's --tp-size) ranks."""
    return {
        "world_size": inputs.pp_size * inputs.tp_group_size,
        "pp_size": inputs.pp_size,
        "tp_size": inputs.tp_size,
    }


def stage_dict(s: StageCapacity, group_size: int, m: MaterializeResult | None = None) -> dict[str, object]:
    """One stage, with check's per-rank names: ``rank`` is the stage's first rank (the TP group,
    ``tp_group_size``, is the inner dimension: pp_rank = rank // group_size), ``status``/``error`` fold
    in a --materialize failure."""
    d: dict[str, object] = {"rank": s.pp_rank * group_size, "status": "ok", "error": None, **s.as_dict()}
    if m is not None:
        d.update(predicted_bytes=m.predicted_bytes, allocated_bytes=m.allocated_bytes)
        if not m.ok:
            d.update(status=ERROR, error=m.error or MATERIALIZE_STATUS_NAMES[m.status])
    return d


def status_doc(status: str, exit_code: int) -> dict[str, object]:
    return {"checker_version": __version__, "status": status, "exit_code": exit_code}


def weights_per_rank_doc(figures: Sequence[RankWeightsFigure]) -> list[dict[str, object]]:
    """Every rank's weights figure as integers, under check's ``ranks[]`` names: ``weights_bytes`` (the
    total), its parts where the checkpoint gave it (``param_bytes`` exactly as the release's class holds
    them, ``buffer_bytes``, ``margin_bytes`` beyond the parameters, ``draft_bytes`` the speculative draft
    loaded before the pool is sized: param + margin + draft == total; null for a figure given as a number),
    ``draft_source`` (where the draft's bytes came from: checker.families.weights_source.DraftSource; null
    where the rank loads no draft) and ``weights_source``. ``rank`` is the global rank (tp the inner
    dimension)."""
    docs: list[dict[str, object]] = []
    for rank, f in enumerate(figures):
        d = f.detail
        total = d.total_bytes if d is not None else (None if f.gib is None else round(f.gib * 2**30))
        docs.append(
            {
                "rank": rank,
                "weights_bytes": total,
                "param_bytes": None if d is None else d.param_bytes,
                "buffer_bytes": None if d is None else d.buffer_bytes,
                "margin_bytes": None if d is None else d.margin_bytes,
                "draft_bytes": None if d is None else d.draft_bytes,
                "draft_source": f.draft_source.label,
                "weights_source": f.source.label,
            }
        )
    return docs
