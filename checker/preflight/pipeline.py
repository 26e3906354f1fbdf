"""Whether the gathered rows are one pipeline of one model (torch-free).

Three equal values do not make a deployment: SGLang places each stage's layers locally
(``get_pp_indices``, from the rank's own model config and ``SGLANG_PP_LAYER_PARTITION``), so a rank
that reads another partition or another config.json holds another slice, and its stages no longer tile
the model (a layer on two stages, or on none) while every pool size still agrees. The rows prove the
pipeline whole when:

* every rank loads one model: the same definition (``model_digest``) and layer count (``num_layers``);
* every rank runs the same number of stages (``pp_size``), and each pp_rank in ``[0, pp_size)`` has ranks;
* the ranks of one stage (its TP group) hold the same slice;
* the stages tile the layers in order: the first starts at 0, stage k ends where stage k + 1 starts, and
  the last ends at the layer count.

Each broken rule is one :class:`PipelineFault`, naming the ranks, the layer ranges and the inputs these
ranks differ in among those that place layers (the partition variable, the model file, the layout
flags, the release).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from checker.core.ranks import rank_ranges, ranks_do
from checker.core.sizing.partition import PARTITION_ENV
from checker.core.sizing.row import MISSING, RankRow

PLACEMENT_INPUTS = (
    PARTITION_ENV,
    "model",
    "pp_size",
    "attention_layout",
    "tp_size",
    "dp_size",
    "launch_command",
    "sglang_installed",
    "derived_as",
)
"""The inputs that decide which layers a rank holds: the partition, the model (its layer count), the
layout (which pp_rank a rank is, and how many stages), and the release whose rules place the layers."""

FAULT_KINDS = ("model", "stages", "slice", "gap", "overlap", "order", "beyond")


@dataclass(frozen=True, kw_only=True)
class PipelineFault:
    """One way the ranks are not one pipeline of one model."""

    kind: str
    """One of :data:`FAULT_KINDS`: ``model`` (another definition or layer count), ``stages`` (another
    number of stages, or a pp_rank no rank holds), ``slice`` (the ranks of one stage hold different
    layers), ``gap`` (layers on no stage), ``overlap`` (layers on two stages), ``order`` (stage k + 1 lies
    wholly before stage k), ``beyond`` (a stage past the model's last layer)."""
    ranks: list[int]
    """The ranks the fault is between (or of)."""
    layers: tuple[int, int] | None = None
    """The layers ``[start, end)`` on no stage, on two, or past the model (None: not about a range)."""
    inputs: list[str] = field(default_factory=list)
    """The inputs that place layers and differ across :attr:`ranks`: what made the fault."""
    text: str = ""
    """The root-cause line, without the ``pipeline: `` prefix."""


def _layers(start: int, end: int) -> str:
    return f"layer {start}" if end == start + 1 else f"layers [{start}, {end})"


def _is(start: int, end: int) -> str:
    return "is" if end == start + 1 else "are"


def _holders(members: Sequence[RankRow]) -> str:
    """'rank 1 (pp_rank 1) holds [11, 24)': who holds one slice of one stage."""
    r = members[0]
    pp = sorted({m.pp_rank for m in members})
    where = f"pp_rank {pp[0]}" if len(pp) == 1 else rank_ranges(pp, noun="pp_rank")
    held = f"[{r.start_layer}, {r.end_layer})"
    return f"{ranks_do([m.rank for m in members], 'holds', 'hold')} {held} ({where})"


def _model_of(members: Sequence[RankRow]) -> str:
    r = members[0]
    label = r.inputs.get("model") or f"#{r.model_digest & 0xFFFFFFFF:08x}"
    return f"{ranks_do([m.rank for m in members], 'loads', 'load')} {label} ({r.num_layers} layers)"


def _largest_first(groups: Sequence[list[RankRow]]) -> list[list[RankRow]]:
    return sorted(groups, key=lambda g: (-len(g), min(m.rank for m in g)))


def _differing(inputs: Sequence[str], members: Sequence[RankRow]) -> list[str]:
    """Of ``inputs`` (the differing inputs that are causes), those whose value differs across ``members``."""
    out = []
    for name in PLACEMENT_INPUTS:
        if name not in inputs:
            continue
        if len({m.input_digests.get(name) for m in members}) > 1:
            out.append(name)
    return out


def _why(names: Sequence[str]) -> str:
    if not names:
        return "; every input that places layers agrees across these ranks (please report this)"
    return f"; these ranks differ in {', '.join(names)}"


def pipeline_faults(rows: Sequence[RankRow], differing_inputs: Sequence[str] = ()) -> list[PipelineFault]:
    """Every way ``rows`` (the ok rows of one world) are not one pipeline of one model, in the order a
    reader fixes them: the model, the number of stages, each stage's slice, then the walk over the
    layers. ``differing_inputs``: the verdict's inputs that differ and are causes (FOLLOWS applied)."""
    rows = sorted(rows, key=lambda r: r.rank)
    if not rows or any(r.start_layer == MISSING or r.end_layer == MISSING for r in rows):
        return []
    faults: list[PipelineFault] = []

    def add(kind: str, members: Sequence[RankRow], text: str, layers: tuple[int, int] | None = None) -> None:
        names = _differing(differing_inputs, members)
        ranks = sorted({m.rank for m in members})
        faults.append(
            PipelineFault(kind=kind, ranks=ranks, layers=layers, inputs=names, text=text + _why(names))
        )

    # One model: one definition and one layer count on every rank.
    by_model: dict[tuple[int, int], list[RankRow]] = defaultdict(list)
    for r in rows:
        by_model[(r.model_digest, r.num_layers)].append(r)
    if len(by_model) > 1:
        groups = _largest_first(list(by_model.values()))
        add("model", rows, "not one model: " + "; ".join(_model_of(g) for g in groups))

    # One number of stages, every stage held.
    by_pp: dict[int, list[RankRow]] = defaultdict(list)
    for r in rows:
        by_pp[r.pp_size].append(r)
    if len(by_pp) > 1:
        groups = _largest_first(list(by_pp.values()))
        parts = [f"{ranks_do([m.rank for m in g], 'runs', 'run')} {g[0].pp_size} stages" for g in groups]
        add("stages", rows, "not one number of stages: " + "; ".join(parts))
        return faults  # stage k of one layout is not stage k of the other: no walk to make
    stages: dict[int, dict[tuple[int, int], list[RankRow]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        stages[r.pp_rank][(r.start_layer, r.end_layer)].append(r)
    pp_size = rows[0].pp_size
    missing = sorted(set(range(pp_size)) - set(stages)) if pp_size > 0 else []
    if missing:
        add("stages", rows, f"{rank_ranges(missing, noun='pp_rank')} of {pp_size} held by no rank")

    # The ranks of one stage hold one slice.
    for k in sorted(stages):
        if len(stages[k]) > 1:
            groups = _largest_first(list(stages[k].values()))
            members = [m for g in groups for m in g]
            add("slice", members, f"pp_rank {k} is not one slice: " + "; ".join(_holders(g) for g in groups))

    # The walk: stage 0 starts at 0, stage k ends where k + 1 starts, the last ends at the layer count.
    order = sorted(stages)
    for (start, _end), members in sorted(stages[order[0]].items()):
        if start > 0:
            add(
                "gap",
                members,
                f"{_layers(0, start)} {_is(0, start)} on no stage: the first stage starts at {start}: "
                + _holders(members),
                (0, start),
            )
    for k, k1 in zip(order, order[1:], strict=False):
        for (s, e), before in sorted(stages[k].items()):
            for (s1, e1), after in sorted(stages[k1].items()):
                both = [*before, *after]
                held = f"{_holders(before)}, {_holders(after)}"
                if s1 > e:
                    add("gap", both, f"{_layers(e, s1)} {_is(e, s1)} on no stage: {held}", (e, s1))
                elif s1 < e:
                    lo, hi = max(s, s1), min(e, e1)
                    if lo < hi:
                        text = f"{_layers(lo, hi)} {_is(lo, hi)} on two stages: {held}"
                        add("overlap", both, text, (lo, hi))
                    else:
                        add("order", both, f"pp_rank {k1} lies before pp_rank {k}: {held}")
    for (_start, end), members in sorted(stages[order[-1]].items()):
        by_count: dict[int, list[RankRow]] = defaultdict(list)
        for m in members:
            by_count[m.num_layers].append(m)
        for count, holders in sorted(by_count.items()):
            if count == MISSING:
                continue
            if end < count:
                add(
                    "gap",
                    holders,
                    f"{_layers(end, count)} {_is(end, count)} on no stage: the model has {count} layers and "
                    f"the last stage ends at {end}: " + _holders(holders),
                    (end, count),
                )
            elif end > count:
                add(
                    "beyond",
                    holders,
                    f"{_layers(count, end)} {_is(count, end)} past the model's {count} layers: "
                    + _holders(holders),
                    (count, end),
                )
    return faults


def agreed_num_layers(rows: Sequence[RankRow]) -> int | None:
    """The model's layer count where every rank that loaded it agrees (None otherwise)."""
    counts = {r.num_layers for r in rows} - {MISSING}
    return counts.pop() if len(counts) == 1 else None
