"""The preflight's prediction, read back from its JSON report (``checker check --report``).

What each rank predicted (``ranks[]``: docs/json-output.md), where it ran (``host``), from what
(``inputs``: the release it derived as, the budget and its source, the flags and SGLANG_* variables),
and the weights figure its budget used. Which SGLang process each rank stands for follows from the
layout: ``pp_rank`` is the stage, and the rank's place in its stage's TP group (``rank % (tp_size x
dp_size)``) is the TP number SGLang's prefix shows (the global one under attention DP).

A report that is not the preflight's, or not readable, is one :class:`PredictionError` line.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from checker.core.errors import CheckerInputError, json_kind, printable

MAX_REPORT_BYTES = 256 << 20
"""A preflight report of 4,096 ranks is about 25 MB; anything far larger is not one."""
MAX_REPORT_DEPTH = 32
"""A preflight report nests 5 levels (``inputs`` -> a value by rank -> ...). Python's json gives up near
1,000 levels with a RecursionError at a depth that depends on the stack; anything past this is not a
report, refused before any of it is read."""
_FORMULA = re.compile(r"free_after ([-+\d.eE]+) - (?:max\()?free_before ([-+\d.eE]+)")
_LABEL_WEIGHTS = re.compile(r"weights ([\d.,eE+-]+) GiB")
_RELEASE = re.compile(r"SGLang (\S+)")
_FRACTION = re.compile(r"free_before ([\d.eE+-]+) \* \(1 - ([\d.eE+-]+)\)")


class PredictionError(CheckerInputError):
    """The preflight report cannot be read or is not the preflight's: one line, exit 2."""

    code = 2


@dataclass(frozen=True)
class RankPrediction:
    rank: int
    host: str | None
    pp_rank: int
    tp: int
    """The TP number SGLang's prefix shows for this rank (global within the stage under attention DP)."""
    dp: int | None
    """The attention DP rank (its prefix's DP token), None without attention DP."""
    ok: bool
    error: str | None
    max_mamba_cache_size: int | None
    max_running_requests: int | None
    pp_max_micro_batch_size: int | None
    pp_size: int
    state_allocated_bytes: int | None
    device_free_gib: float | None
    weights_gib: float | None
    """The weights figure this rank's budget used (None: the budget did not come from one)."""
    weights_per_rank: bool
    """``weights_gib`` is this rank's own figure; False: one figure for every rank (the busiest's)."""
    inputs: Mapping[str, object] = field(default_factory=dict)
    max_total_num_tokens: int | None = None
    """The KV pool after the MIN over the pipeline (SGLang's ``max_total_num_tokens``); None: a report of
    a checker that sized no KV pool."""
    context_len: int | None = None
    kv_own_tokens: int | None = None
    """The stage's own KV capacity, before the MIN."""
    kv_cell_bytes: int | None = None
    """Bytes one token of the stage's KV pool holds (0: the pool was given as --token-capacity)."""
    kv_limiting: bool = False
    """This stage's own capacity is the MIN."""
    budget_gib: float | None = None
    """``total_rest_memory`` the rank sized its pools from."""
    free_before_gib: float | None = None
    """The free memory before the weights its budget formula used (None: a fixed --budget-gib)."""
    mem_fraction_static: float | None = None
    """The fraction its budget formula used (None: a fixed --budget-gib)."""

    @property
    def release(self) -> str | None:
        """The release the rank derived as (``derived_as``: "SGLang 0.5.23 (...)")."""
        m = _RELEASE.match(str(self.inputs.get("derived_as") or ""))
        return m.group(1).rstrip(",") if m else None

    @property
    def user_micro_batch(self) -> int | None:
        """``--pp-max-micro-batch-size`` as the preflight was given it (0 is SGLang's unset)."""
        value = self.inputs.get("pp_max_micro_batch_size")
        return value if isinstance(value, int) and value > 0 else None


@dataclass(frozen=True)
class Prediction:
    path: str
    status: str
    world_size: int
    pp_size: int | None
    tp_size: int | None
    dp_size: int
    """Attention DP (the checker's --dp-size): the TP group is tp_size x dp_size ranks."""
    ranks: tuple[RankPrediction, ...]
    weights_source: str
    """Where the weights figure came from: ``--weights-gib`` per rank or for all, the agreed formula, or
    ``none`` (a fixed --budget-gib, or the device's free memory with no weights figure)."""

    @property
    def group(self) -> int:
        return (self.tp_size or 1) * self.dp_size

    def rank_of(self, pp: int, tp: int) -> RankPrediction | None:
        return self._by_process.get((pp, tp))

    def by_rank(self, rank: int) -> RankPrediction:
        return self._by_rank[rank]

    @cached_property
    def _by_process(self) -> dict[tuple[int, int], RankPrediction]:
        return {(r.pp_rank, r.tp): r for r in reversed(self.ranks)}  # the lowest rank wins a duplicate

    @cached_property
    def _by_rank(self) -> dict[int, RankPrediction]:
        return {r.rank: r for r in self.ranks}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _object(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _agreed(inputs: Mapping[str, object], name: str) -> object:
    value = inputs.get(name)
    if isinstance(value, dict) and "by_rank" in value:
        return None
    return value


def _weights(source: str, world_size: int) -> tuple[list[float] | None, bool, str]:
    """(figures, one per rank?, where from) from a rank's ``budget_source``: a report of an older checker,
    without the top-level ``weights_gib``. The text is cut at the wire's width (ending in ``...``): a
    figure it no longer holds is unknown, not 0."""
    if source.endswith("...") and not (_FORMULA.search(source) or _LABEL_WEIGHTS.search(source)):
        return None, False, "unknown: the report's budget_source is cut before the figure"
    if not source.startswith("device"):
        return None, False, f"a fixed budget ({source or 'unknown'})"
    m = _FORMULA.search(source)
    if m:  # agreed: free_before - free_after is the busiest rank's weights (the MIN over ranks)
        figure = max(float(m.group(2)) - float(m.group(1)), 0.0)
        return [round(figure, 4)], False, "the agreed budget: free_before - free_after"
    m = _LABEL_WEIGHTS.search(source)
    if m:
        values = [float(v) for v in m.group(1).split(",") if v]
        if len(values) == world_size and world_size > 1:
            return values, True, "--weights-gib, one per rank"
        return values[:1], False, "--weights-gib"
    return [0.0], False, "none given (--budget-from-device without --weights-gib: 0 GiB)"


def read_prediction(path: str) -> Prediction:
    shown = printable(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        raise PredictionError(f"--report {shown}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_REPORT_BYTES:
        raise PredictionError(
            f"--report {shown}: larger than {MAX_REPORT_BYTES >> 20} MiB, not a preflight report"
        )
    deep = (
        f"--report {shown}: nests deeper than {MAX_REPORT_DEPTH} levels, and a preflight report nests 5; "
        "give the file `checker check --report PATH` wrote"
    )
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_not_json)
    except UnicodeDecodeError:
        raise PredictionError(f"--report {shown}: not UTF-8 text; give the preflight's JSON report") from None
    except json.JSONDecodeError as exc:
        raise PredictionError(
            f"--report {shown}: not JSON (line {exc.lineno}: {exc.msg}); give the file `checker check "
            "--report PATH` wrote"
        ) from None
    except RecursionError:  # the parser's own limit, near 1,000 levels
        raise PredictionError(deep) from None
    if _depth(doc) > MAX_REPORT_DEPTH:  # what it parsed: every later walk (the JSON output) stays bounded
        raise PredictionError(deep)
    return prediction_from(doc, shown)


def _not_json(name: str) -> object:
    """NaN and Infinity: Python's json reads them, JSON has no such values and the checker never writes
    one (a NaN figure would compare unequal to everything)."""
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


def _depth(doc: object) -> int:
    """How deep ``doc`` nests (breadth first, no recursion), counted up to MAX_REPORT_DEPTH + 1."""
    level, depth = [doc], 0
    while level and depth <= MAX_REPORT_DEPTH:
        depth += 1
        level = [
            v
            for node in level
            for v in (node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())
            if isinstance(v, (dict, list))
        ]
    return depth


def prediction_from(doc: object, shown: str) -> Prediction:
    if not isinstance(doc, dict):
        raise PredictionError(f"--report {shown}: {json_kind(doc)}, not the preflight's JSON report")
    command = doc.get("command")
    if command != "check":
        what = f"`checker {command}`'s output" if isinstance(command, str) else "not a checker report"
        raise PredictionError(
            f"--report {shown} is {what}, not the preflight's report; give the file `checker check "
            "--report PATH` wrote"
        )
    ranks = doc.get("ranks")
    world = _int(doc.get("world_size"))
    if not isinstance(ranks, list) or world is None:
        raise PredictionError(f"--report {shown}: no `ranks` list or `world_size`; is it cut short?")
    inputs, layout = _object(doc.get("inputs")), _object(doc.get("layout"))
    pp_size, tp_size = _int(layout.get("pp_size")), _int(layout.get("tp_size"))
    dp_size = _int(_agreed(inputs, "dp_size")) or 1
    top = doc.get("weights_gib")
    top_figures = [float(w) for w in top if _float(w) is not None] if isinstance(top, list) else []
    top_source = str(doc.get("weights_source") or "the report's weights_gib")
    sources: set[str] = set()
    out: list[RankPrediction] = []
    for i, r in enumerate(ranks):
        if not isinstance(r, dict) or _int(r.get("rank")) is None:
            raise PredictionError(f"--report {shown}: ranks[{i}] has no integer `rank`")
        rank = int(r["rank"])
        rank_inputs = _object(r.get("inputs"))
        figures: list[float] | None
        if top_figures:  # the figures whole, as rank 0 was given them
            figures, per_rank, source = top_figures, len(top_figures) > 1, top_source
        else:
            figures, per_rank, source = _weights(str(rank_inputs.get("budget_source") or ""), world)
        sources.add(source)
        weights = (
            None if figures is None else (figures[rank] if per_rank and len(figures) > rank else figures[0])
        )
        own_tp = _int(r.get("tp_size")) or tp_size or 1  # the layout's is null where ranks disagree
        group = own_tp * dp_size
        pp_rank = _int(r.get("pp_rank"))
        if pp_rank is None or pp_rank < 0:
            pp_rank = rank // group
        tp = rank % group
        free = _int(r.get("device_free_bytes"))
        formula = _FRACTION.search(str(rank_inputs.get("budget_source") or ""))
        budget = _float(r.get("budget_gib"))
        if budget is None:
            budget = _float(rank_inputs.get("budget_gib"))
        out.append(
            RankPrediction(
                rank=rank,
                host=printable(r["host"]) if isinstance(r.get("host"), str) else None,
                pp_rank=pp_rank,
                tp=tp,
                dp=tp // own_tp if dp_size > 1 else None,
                ok=r.get("status") == "ok",
                error=printable(r["error"]) if isinstance(r.get("error"), str) else None,
                max_mamba_cache_size=_int(r.get("max_mamba_cache_size")),
                max_running_requests=_int(r.get("max_running_requests")),
                pp_max_micro_batch_size=_int(r.get("pp_max_micro_batch_size")),
                pp_size=_int(r.get("pp_size")) or pp_size or 1,
                state_allocated_bytes=_int(r.get("state_allocated_bytes")),
                device_free_gib=None if free is None or free < 0 else free / 2**30,
                weights_gib=weights,
                weights_per_rank=per_rank,
                inputs=rank_inputs,
                max_total_num_tokens=_int(r.get("max_total_num_tokens")),
                context_len=_int(r.get("context_len")),
                kv_own_tokens=_int(r.get("kv_own_tokens")),
                kv_cell_bytes=_int(r.get("kv_cell_bytes")),
                kv_limiting=r.get("kv_limiting") is True,
                budget_gib=budget,
                free_before_gib=float(formula.group(1)) if formula else None,
                mem_fraction_static=float(formula.group(2)) if formula else None,
            )
        )
    status = doc.get("status")
    return Prediction(
        path=shown,
        status=status if isinstance(status, str) else "unknown",
        world_size=world,
        pp_size=pp_size,
        tp_size=tp_size,
        dp_size=dp_size,
        ranks=tuple(sorted(out, key=lambda p: p.rank)),
        weights_source="; ".join(sorted(sources)) or "none",
    )
