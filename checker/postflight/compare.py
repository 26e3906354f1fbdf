"""The post-flight verdict: every rank's logged values held to the preflight's prediction for it.

Held, as the server's own lines give them (docs/postflight.md):

* ``max_mamba_cache_size`` on every rank (``Mamba Cache is allocated.``; 0.5.2-0.5.3.post1 log no size,
  only the pool's conv and ssm state in GB: those are held to the predicted allocation instead, to the
  line's 0.01 GB rounding);
* ``max_running_requests`` on each stage's TP 0 (only that rank logs it; under attention DP the TP
  number is the global one, so that is DP 0);
* ``pp_max_micro_batch_size``, never logged: recomputed from the logged ``max_running_requests`` as the
  release does (``max(max_running_requests // pp_size, 1)`` unless ``--pp-max-micro-batch-size``);
* the weights' ``mem usage`` against the weights figure the preflight's budget used, within
  ``--weights-margin-gib``. One figure for every rank (``--weights-gib W``, or the agreed budget) is the
  busiest rank's: a rank over it by more than the margin, or a busiest rank under it by more, is named.

A divergence names the rank, its host (from the report), the value predicted and logged, and the most
likely cause, first found of: another release (the form of the rank's lines), the post-capture cap
(SGLANG_ENABLE_POST_CAPTURE_KV_SIZING), the KV pool capping the requests (which the preflight does not
size), the weights figure, less free memory than the preflight measured, else the flags or environment
the server was started with on that node. A rank the prediction has and the logs lack is named (error:
the logs are incomplete); a rank the logs have and the prediction lacks is named (divergent: the server
runs another layout). Precedence: divergent, then error, then consistent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from checker.core.ranks import outliers, rank_ranges
from checker.core.sizing.server_args import SIZING_ARG
from checker.postflight.prediction import Prediction, RankPrediction
from checker.postflight.ranks import Logged, RankRead, span
from checker.status import CONSISTENT, DIVERGENT, ERROR, EXIT_CODES

GIB = 2**30
WEIGHTS_MARGIN_GIB = 0.1
"""Default --weights-margin-gib: SGLang logs mem usage to 0.01 GB, and the same checkpoint on the same
GPU takes the same memory start after start; a figure off by more than this gives the preflight a budget
the server never had."""
FREE_MARGIN_GIB = 1.0
"""Less free memory than the preflight measured by more than this (the server's CUDA context and
communicators come out of it) is named as a cause."""
STATE_ROUNDING_GIB = 0.011
"""conv_state + ssm_state, each rounded to 0.01 GB by the log: their sum is within 0.01 of the truth."""

VALUES = (
    "max_mamba_cache_size",
    "max_total_num_tokens",
    "context_len",
    "max_running_requests",
    "pp_max_micro_batch_size",
    "weights_gib",
)
"""What is held, in the order every rendering shows it."""
SUMMARY_VALUES = ("max_total_num_tokens", "context_len", "max_running_requests")
"""The values of the ``max_total_num_tokens=...`` line, logged by each stage's TP 0 only."""
REQUESTS = ("max_running_requests", "pp_max_micro_batch_size")
POOL_TOLERANCE_GIB = 0.05
"""The log gives its memory figures to 0.01 GB: inputs within this (plus 2% of the difference they are
to explain) of each other count as the same."""
OK, DIVERGES, MISSING, SKIPPED = "ok", "divergent", "missing", "not_checked"


@dataclass
class Check:
    value: str
    rank: int | None
    """The preflight rank (None: a rank only the logs have)."""
    replica: int | None
    """The DP replica (``DP<d>``) without attention DP; None otherwise."""
    prefix: str
    host: str | None
    predicted: float | int | None
    logged: float | int | None
    status: str
    where: str | None
    detail: str = ""
    cause: str = ""


@dataclass
class Postflight:
    status: str
    exit_code: int
    checks: list[Check]
    reads: list[RankRead]
    divergent: list[str]
    missing: list[str]
    """Ranks the prediction has and the logs lack, each as a line naming it."""
    extra: list[str]
    """Ranks the logs have and the prediction lacks."""
    root_causes: list[str]
    errors: list[str]
    warnings: list[str]
    prediction: Prediction | None
    matched: dict[tuple[int | None, int], RankRead] = field(default_factory=dict)
    weights_margin_gib: float = WEIGHTS_MARGIN_GIB


def who(pred: RankPrediction | None, read: RankRead | None, replica: int | None = None) -> str:
    """``rank 5 (PP1 TP1, node-b)``: the preflight rank, its prefix in the log, its host."""
    prefix = read.prefix if read is not None else (_expected_prefix(pred, replica) if pred else "")
    where = ", ".join(x for x in (prefix or "no prefix", pred.host if pred else None) if x)
    if pred is None:
        return f"[{prefix}]" if prefix else "the unprefixed process"
    replica_text = f"replica DP{replica} " if replica is not None else ""
    return f"{replica_text}rank {pred.rank} ({where})"


def _expected_prefix(pred: RankPrediction, replica: int | None) -> str:
    parts = []
    if replica is not None:
        parts.append(f"DP{replica}")
    elif pred.dp is not None:
        parts.append(f"DP{pred.dp}")
    parts += [f"PP{pred.pp_rank}", f"TP{pred.tp}"]
    return " ".join(parts)


def _fmt(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _inputs_line(pred: RankPrediction) -> str:
    """The preflight's inputs for a rank, short: its budget, release, the sizing flags it was given away
    from their defaults and the SGLANG_* variables set: what a node started differently would differ in."""

    i = pred.inputs
    parts = []
    budget = i.get("budget_gib")
    if isinstance(budget, (int, float)):
        parts.append(f"budget {budget:.6g} GiB ({str(i.get('budget_source') or '?').split(':')[0]})")
    if pred.release:
        parts.append(f"SGLang {pred.release}")
    for name, value in i.items():
        row = SIZING_ARG.get(name)
        if name.startswith("SGLANG_") and value is not None:
            parts.append(f"{name}={value}")
        elif row is not None and not row.layout and value is not None and value != row.default:
            parts.append(f"{row.flag} {value}")
    return ", ".join(parts)


class _Causes:
    """The most likely cause of one rank's divergence, from what the log and the report hold."""

    def __init__(
        self, prediction: Prediction, margin: float, matched: dict[tuple[int | None, int], RankRead]
    ) -> None:
        self.prediction = prediction
        self.matched = matched
        self.margin = margin
        self.weights_off: dict[tuple[int | None, int], str] = {}

    def of(self, value: str, pred: RankPrediction, read: RankRead, key: tuple[int | None, int]) -> str:
        if pred.release and read.releases and pred.release not in read.releases:
            return (
                f"another SGLang release: its lines are in the form SGLang {span(read.releases)} writes; the "
                f"preflight derived as {pred.release} there"
            )
        a, b = read.capped_from.value, read.max_running_requests.value
        if value in ("max_running_requests", "pp_max_micro_batch_size") and a is not None and a != b:
            return (
                f"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: the server capped max_running_requests {a} -> {b} "
                f"after CUDA graph capture ({read.capped_from.where}); the preflight predicts the value "
                "before that cap: unset it, or expect each stage to cap on its own"
            )
        context = _off(pred.context_len, read.context_len)
        if value == "context_len" or (value in REQUESTS and context):
            return self._context(pred, read)
        if value == "max_total_num_tokens" or (
            value in (*REQUESTS, "max_mamba_cache_size")
            and _off(pred.max_total_num_tokens, read.max_total_num_tokens)
        ):  # the state pool is sized from the same budget as the KV pool
            pool = self._pool(pred, read, key)
            if pool:
                return pool
        if key in self.weights_off:
            return self.weights_off[key]
        free, measured = read.free_before_gib.value, pred.device_free_gib
        if free is not None and measured is not None and free < measured - FREE_MARGIN_GIB:
            return (
                f"the environment: the server found {free:.2f} GiB free on this GPU before its weights, the "
                f"preflight measured {measured:.2f} GiB (another process holds memory there?)"
            )
        return (
            f"the flags or environment the server was started with there: the preflight derived with "
            f"{_inputs_line(pred)}; start both from one launch command and one environment"
        )

    @staticmethod
    def _context(pred: RankPrediction, read: RankRead) -> str:
        given = pred.inputs.get("context_len")
        source = f"--context-length {given}" if isinstance(given, int) else "the model's config"
        env = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
        return (
            f"the context length: the server resolved context_len {_fmt(read.context_len.value)} "
            f"({read.context_len.where}), the preflight {_fmt(pred.context_len)} from {source}; "
            f"max_running_requests follows from it (clamp(int(max_total_num_tokens / context_len x 512), "
            f"2048, 4096)): start both with one --context-length, model config and {env}"
        )

    def _pool(self, pred: RankPrediction, read: RankRead, key: tuple[int | None, int]) -> str:
        """Which input explains a KV pool (``max_total_num_tokens``) other than predicted: the budget the
        logged pool needs on the stage that sets the MIN (its tokens x its cell, plus its logged state
        pool's slots), against what the log shows of the budget's inputs: the free memory before the
        weights (``Load weight begin. avail mem=``), the weights (``mem usage=``), and, as what is left,
        the fraction (or a fixed --budget-gib). "" when the report carries too little to say."""
        limiting = self._limiting(key[0]) or (pred, read)
        lim, lread = limiting
        T, logged_T = lim.max_total_num_tokens, read.max_total_num_tokens.value
        cell = lim.kv_cell_bytes
        if not isinstance(logged_T, int) or T is None or not cell or lim.budget_gib is None:
            return ""
        state_note = ""
        d_state = 0.0
        K, logged_K = lim.max_mamba_cache_size, lread.max_mamba_cache_size.value
        if isinstance(logged_K, int) and K and lim.state_allocated_bytes:
            slot = lim.state_allocated_bytes / (K + 1)
            d_state = (logged_K - K) * slot / GIB
            if logged_K != K:
                state_note = f" and {logged_K - K:+d} state slots"
        d_tokens = logged_T - T
        implied = d_tokens * cell / GIB + d_state
        stage = f"stage {lim.pp_rank}'s ({who(lim, lread)})"
        needs = (
            f"the KV pool: max_total_num_tokens {logged_T} logged, {T} predicted; {stage} "
            f"{d_tokens:+d} tokens x {cell} bytes{state_note} need a budget {abs(implied):.2f} GiB "
            f"{'larger' if implied > 0 else 'smaller'} than the preflight's {lim.budget_gib:.2f} GiB"
        )
        auto_fit = (
            not lim.inputs.get("disable_radix_cache") and lim.inputs.get("max_mamba_cache_size") is None
        )
        if (
            auto_fit
            and isinstance(logged_K, int)
            and K
            and K >= 16
            and logged_K == K
            and abs(d_tokens) * K >= 2 * T
        ):
            return (
                f"the KV pool alone: max_total_num_tokens {logged_T} logged, {T} predicted, while {stage} "
                f"state pool ({K} slots, sized from the same budget) is as predicted: not the memory but an "
                "input of the KV pool only (--max-total-tokens, --kv-cache-dtype, --page-size, the "
                f"attention layers the stage holds); the preflight derived with {_inputs_line(lim)}"
            )
        tol = POOL_TOLERANCE_GIB + 0.02 * abs(implied)
        if abs(implied) <= tol:
            return ""
        found: list[tuple[str, float]] = []
        weights = self._weights(lim, lread)
        if weights is not None:
            logged_w, figure = weights
            found.append(
                (
                    f"the weights: the server's weights took {logged_w:.2f} GiB, the preflight's budget "
                    f"assumed {figure:.2f} GiB ({self.prediction.weights_source}; rerun the preflight with "
                    "--weights-from-log)",
                    figure - logged_w,
                )
            )
        free = self._free()
        f = lim.mem_fraction_static
        if free is not None and f is not None and lim.free_before_gib is not None:
            found.append(
                (
                    f"free memory: the server found {free:.2f} GiB free before its weights (Load weight "
                    f"begin. avail mem, the MIN over the ranks), the preflight's budget used "
                    f"{lim.free_before_gib:.2f} GiB (at --mem-fraction-static {f:g})",
                    (free - lim.free_before_gib) * f,
                )
            )
        named = [(text, c) for text, c in found if abs(c) > tol]
        left = implied - sum(c for _, c in named)
        parts = [f"{text}: {c:+.2f} GiB" for text, c in named]
        if abs(left) > tol:
            if f is not None:
                base = free if free is not None else lim.free_before_gib
                if base:
                    parts.append(
                        f"the fraction: {left:+.2f} GiB that the memory the log shows does not explain, "
                        f"--mem-fraction-static {f + left / base:.3f} where the preflight used {f:g} (start "
                        "both with one --mem-fraction-static)"
                    )
                else:
                    parts.append(f"the fraction: {left:+.2f} GiB unexplained at --mem-fraction-static {f:g}")
            else:
                parts.append(
                    f"the budget: the preflight sized with a fixed {lim.budget_gib:.2f} GiB "
                    f"({_budget_source(lim)}), the server had about {lim.budget_gib + left:.2f} GiB; "
                    "give the preflight the server's --mem-fraction-static with --budget-from-device"
                )
        return f"{needs}: " + "; ".join(parts)

    def _limiting(self, replica: int | None) -> tuple[RankPrediction, RankRead] | None:
        """The prediction and read of the stage whose own pool is the MIN (its TP 0)."""
        for p in self.prediction.ranks:
            read = self.matched.get((replica, p.rank))
            if p.kv_limiting and read is not None and read.key.tp == 0:
                return p, read
        return None

    def _weights(self, pred: RankPrediction, read: RankRead) -> tuple[float, float] | None:
        """(what the weights took, the figure the budget used): this rank's own where the preflight had
        one per rank, else the busiest rank's (SGLang sizes from the MIN of free memory over the ranks)."""
        if pred.weights_gib is None:
            return None
        if pred.weights_per_rank:
            w = read.weights_gib.value
            return (float(w), pred.weights_gib) if w is not None else None
        logged = [
            float(r.weights_gib.value) for r in self.matched.values() if r.weights_gib.value is not None
        ]
        return (max(logged), pred.weights_gib) if logged else None

    def _free(self) -> float | None:
        logged = [
            float(r.free_before_gib.value)
            for r in self.matched.values()
            if r.free_before_gib.value is not None
        ]
        return min(logged) if logged else None


def _off(predicted: int | None, logged: Logged) -> bool:
    return isinstance(logged.value, int) and predicted is not None and logged.value != predicted


def _budget_source(pred: RankPrediction) -> str:
    return str(pred.inputs.get("budget_source") or "?").split(":")[0]


def _match(
    prediction: Prediction, reads: Sequence[RankRead]
) -> tuple[dict[tuple[int | None, int], RankRead], list[RankRead], list[int | None]]:
    """(replica, rank) -> its read; the reads no prediction has; the replicas. Without attention DP a
    ``DP<d>`` prefix is a replica (``--dp-size`` without ``--enable-dp-attention``): each replica sizes
    as the preflight's one did, so each is held to it."""
    plain_dp = prediction.dp_size == 1 and any(r.key.dp for r in reads)
    replicas: list[int | None] = sorted({r.key.dp for r in reads}) if plain_dp else [None]  # type: ignore[assignment]
    matched: dict[tuple[int | None, int], RankRead] = {}
    extra: list[RankRead] = []
    for read in reads:
        pred = prediction.rank_of(read.key.pp, read.key.tp)
        replica = read.key.dp if plain_dp else None
        if pred is None or (pred.dp is not None and "DP" in read.prefix and read.key.dp != pred.dp):
            extra.append(read)
        elif (replica, pred.rank) in matched:
            extra.append(read)  # the same rank under another prefix spelling: cannot both be it
        else:
            matched[(replica, pred.rank)] = read
    return matched, extra, replicas


def hold(
    prediction: Prediction,
    reads: Sequence[RankRead],
    *,
    weights_margin_gib: float = WEIGHTS_MARGIN_GIB,
    log_errors: Sequence[str] = (),
    log_warnings: Sequence[str] = (),
) -> Postflight:
    """The verdict of ``reads`` against ``prediction``."""
    matched, extra_reads, replicas = _match(prediction, reads)
    causes = _Causes(prediction, weights_margin_gib, matched)
    checks: list[Check] = []
    errors = list(log_errors)
    warnings = list(log_warnings)
    missing: list[str] = []
    no_prediction = [p for p in prediction.ranks if not p.ok]
    for p in no_prediction:
        errors.append(
            f"the preflight has no prediction for rank {p.rank}"
            + (f" (its error: {p.error})" if p.error else f" (preflight status {prediction.status})")
        )
    for replica in replicas:
        for pred in prediction.ranks:
            read = matched.get((replica, pred.rank))
            if read is None:
                missing.append(
                    f"{who(pred, None, replica)}: no line of it in the logs; give every node's log"
                )
                continue
            if pred.ok:
                checks += _rank_checks(pred, read, replica)
    _weights_checks(checks, prediction, matched, weights_margin_gib, causes, warnings)
    for c in checks:
        if c.status == DIVERGES and not c.cause and c.rank is not None:
            key = (c.replica, c.rank)
            pred = prediction.by_rank(c.rank)
            c.cause = causes.of(c.value, pred, matched[key], key)
    extra = [
        f"{who(None, r)}: the logs have this rank, the preflight did not check it (the server runs another "
        f"layout than the preflight's pp {prediction.pp_size} x tp {prediction.group}?)"
        for r in extra_reads
    ]
    for c in checks:
        if c.status == MISSING:
            errors.append(f"{who_of(c)}: {c.detail}")
    divergent = [v for v in VALUES if any(c.value == v and c.status == DIVERGES for c in checks)]
    for read in reads:
        if read.starts > 1:
            warnings.append(
                f"[{read.prefix or 'no prefix'}] logged lines of {read.starts} different starts; the latest "
                "(by timestamp) is held"
            )
        if read.weights_overlap:
            warnings.append(
                f"[{read.prefix or 'no prefix'}] loads its weights with --startup-weight-load-mode overlap: "
                "its Load weight end. line has no mem usage, so its weights are not checked"
            )
    if divergent or extra:
        status = DIVERGENT
    elif errors or missing:
        status = ERROR
    else:
        status = CONSISTENT
    return Postflight(
        status=status,
        exit_code=EXIT_CODES[status],
        checks=checks,
        reads=list(reads),
        divergent=divergent,
        missing=missing,
        extra=extra,
        root_causes=_root_causes(checks, extra),
        errors=errors,
        warnings=_unique(warnings),
        prediction=prediction,
        matched=matched,
        weights_margin_gib=weights_margin_gib,
    )


def who_of(c: Check) -> str:
    replica = f"replica DP{c.replica} " if c.replica is not None else ""
    where = ", ".join(x for x in (c.prefix or "no prefix", c.host) if x)
    return f"{replica}rank {c.rank} ({where})"


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _check(
    value: str,
    pred: RankPrediction,
    read: RankRead,
    replica: int | None,
    predicted: int | None,
    logged: Logged,
) -> Check:
    c = Check(
        value=value,
        rank=pred.rank,
        replica=replica,
        prefix=read.prefix,
        host=pred.host,
        predicted=predicted,
        logged=logged.value,
        status=OK,
        where=str(logged.where) if logged.where else None,
    )
    if logged.value is None:
        c.status = MISSING
        line = {
            "max_mamba_cache_size": "Mamba Cache is allocated.",
            **{
                v: "max_total_num_tokens=..., max_running_requests=..., context_len=..."
                for v in SUMMARY_VALUES
            },
        }.get(value, value)
        c.detail = (
            f"its '{line}' line is cut before {value} ({logged.where})"
            if logged.note == "cut"
            else f"no '{line}' line of it in the logs"
            if logged.note == "no line"
            else f"{value}: {logged.note} ({logged.where})"
        )
    elif logged.value != predicted:
        c.status = DIVERGES
    return c


def _rank_checks(pred: RankPrediction, read: RankRead, replica: int | None) -> list[Check]:
    out = []
    k = read.max_mamba_cache_size
    if k.value is None and k.note.startswith("not logged") and read.state_gib.value is not None:
        # 0.5.2-0.5.3.post1: no size in the line; its pool's state sizes, held to the allocation predicted.
        predicted_gib = None if pred.state_allocated_bytes is None else pred.state_allocated_bytes / 2**30
        c = Check(
            value="max_mamba_cache_size",
            rank=pred.rank,
            replica=replica,
            prefix=read.prefix,
            host=pred.host,
            predicted=pred.max_mamba_cache_size,
            logged=None,
            status=SKIPPED if predicted_gib is None else OK,
            where=str(read.state_gib.where),
            detail=f"{k.note}: its state pool, conv_state + ssm_state = {read.state_gib.value:.2f} GB "
            "logged, "
            f"{_fmt(predicted_gib)} GiB predicted ((K + 1) slots)",
        )
        if (
            predicted_gib is not None
            and abs(float(read.state_gib.value) - predicted_gib) > STATE_ROUNDING_GIB
        ):
            c.status = DIVERGES
        out.append(c)
    else:
        out.append(_check("max_mamba_cache_size", pred, read, replica, pred.max_mamba_cache_size, k))
    if read.key.tp == 0:
        for value, predicted, logged_value in (
            ("max_total_num_tokens", pred.max_total_num_tokens, read.max_total_num_tokens),
            ("context_len", pred.context_len, read.context_len),
        ):
            c = _check(value, pred, read, replica, predicted, logged_value)
            if predicted is None and c.status != MISSING:
                c.status = SKIPPED
                c.detail = (
                    f"not held: the preflight's report predicts no {value} (a checker before the KV pool)"
                )
            elif value == "max_total_num_tokens":
                c.detail = "the KV pool after the MIN over the pipeline"
            out.append(c)
        mrr = _check(
            "max_running_requests", pred, read, replica, pred.max_running_requests, read.max_running_requests
        )
        if read.capped_from.value is not None:
            mrr.detail = (
                f"capped from {read.capped_from.value} after CUDA graph capture ({read.capped_from.where})"
            )
        out.append(mrr)
        logged = read.max_running_requests.value
        if isinstance(logged, int):
            user = pred.user_micro_batch
            micro = user or max(logged // pred.pp_size, 1)
            how = (
                f"--pp-max-micro-batch-size {user}"
                if user
                else f"max(max_running_requests {logged} // pp_size {pred.pp_size}, 1)"
            )
            out.append(
                Check(
                    value="pp_max_micro_batch_size",
                    rank=pred.rank,
                    replica=replica,
                    prefix=read.prefix,
                    host=pred.host,
                    predicted=pred.pp_max_micro_batch_size,
                    logged=micro,
                    status=OK if micro == pred.pp_max_micro_batch_size else DIVERGES,
                    where=mrr.where,
                    detail=f"not logged; recomputed as the release does: {how}",
                )
            )
    return out


def _weights_checks(
    checks: list[Check],
    prediction: Prediction,
    matched: dict[tuple[int | None, int], RankRead],
    margin: float,
    causes: _Causes,
    warnings: list[str],
) -> None:
    by_rank = {p.rank: p for p in prediction.ranks}
    figured = [
        (key, by_rank[key[1]], read)
        for key, read in sorted(matched.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1]))
        if by_rank[key[1]].ok
    ]
    if not any(p.weights_gib is not None for _, p, _ in figured):
        for key, pred, read in figured:  # shown, not held: what --weights-from-log would take
            checks.append(
                Check(
                    value="weights_gib",
                    rank=pred.rank,
                    replica=key[0],
                    prefix=read.prefix,
                    host=pred.host,
                    predicted=None,
                    logged=read.weights_gib.value,
                    status=SKIPPED,
                    where=str(read.weights_gib.where) if read.weights_gib.where else None,
                    detail="not held: the preflight's budget used no weights figure",
                )
            )
        if figured:
            warnings.append(
                f"the preflight's budget used no weights figure ({prediction.weights_source}): the weights "
                "are not checked; the logged figures can feed the next preflight (--weights-from-log)"
            )
        return
    single: list[tuple[tuple[int | None, int], RankPrediction, RankRead, Check]] = []
    for key, pred, read in figured:
        if pred.weights_gib is None or read.weights_overlap:
            continue
        logged = read.weights_gib
        c = Check(
            value="weights_gib",
            rank=pred.rank,
            replica=key[0],
            prefix=read.prefix,
            host=pred.host,
            predicted=round(pred.weights_gib, 2),
            logged=logged.value,
            status=OK,
            where=str(logged.where) if logged.where else None,
        )
        if logged.value is None:
            c.status = MISSING
            c.detail = (
                f"its 'Load weight end.' line is cut before mem usage ({logged.where})"
                if logged.note == "cut"
                else "no 'Load weight end.' line of it in the logs"
            )
            checks.append(c)
            continue
        w, figure = float(logged.value), pred.weights_gib
        if pred.weights_per_rank:
            c.detail = f"this rank's own figure, within {margin:g} GiB"
            off = abs(w - figure) > margin
        else:
            c.detail = f"one figure for every rank (the busiest's), this rank at most {margin:g} GiB over it"
            off = w > figure + margin
            single.append((key, pred, read, c))
        if off:
            c.status = DIVERGES
            causes.weights_off[key] = _weights_cause(w, figure, prediction.weights_source)
        checks.append(c)
    read_single = [x for x in single if isinstance(x[3].logged, float)]
    if read_single:
        key, pred, read, c = max(read_single, key=lambda x: float(x[3].logged or 0.0))
        figure = float(pred.weights_gib or 0.0)
        if float(c.logged or 0.0) < figure - margin:
            c.status = DIVERGES
            c.detail = (
                f"the busiest rank: every rank's weights took at most {float(c.logged or 0.0):.2f} GiB, "
                "the preflight's "
                f"one figure is {figure:.2f} GiB (more than {margin:g} GiB apart)"
            )
            causes.weights_off[key] = _weights_cause(
                float(c.logged or 0.0), figure, prediction.weights_source
            )


def _weights_cause(logged: float, figure: float, source: str) -> str:
    return (
        f"the budget: the server's weights took {logged:.2f} GiB here, the preflight's budget assumed "
        f"{figure:.2f} GiB ({source}); rerun the preflight with --weights-from-log"
    )


def _root_causes(checks: Sequence[Check], extra: Sequence[str]) -> list[str]:
    """One line per cause, naming every rank it explains (rank order)."""
    by_cause: dict[str, list[Check]] = {}
    for c in checks:
        if c.status == DIVERGES and c.cause:
            by_cause.setdefault(c.cause, []).append(c)
    out = []
    for cause, cs in by_cause.items():
        ranks = sorted({(c.replica or 0, c.rank or 0) for c in cs})
        hosts = sorted({c.host for c in cs if c.host})
        values = ", ".join(dict.fromkeys(c.value for c in cs))
        names = _rank_list(
            [r for _, r in ranks], replicas=sorted({c.replica for c in cs if c.replica is not None})
        )
        on = f" on {', '.join(hosts)}" if hosts else ""
        out.append(f"{names}{on} ({values}): {cause}")
    if extra:
        out.append(
            f"{len(extra)} rank(s) in the logs that the preflight did not check: the server's layout differs"
        )
    return out


def _rank_list(ranks: list[int], replicas: list[int]) -> str:
    text = rank_ranges(ranks)
    return f"{text} of replicas DP{', DP'.join(map(str, replicas))}" if replicas else text


def inferred_rank(read: RankRead, group: int) -> int:
    """A rank's number read from the logs alone: pp x the stage's TP count (``group``: the largest TP
    number + 1) + tp (TP inner, as SGLang numbers its processes); a DP replica's ranks are numbered within
    the replica."""
    return read.key.pp * group + read.key.tp


def tp_group(reads: Sequence[RankRead]) -> int:
    return max((r.key.tp for r in reads), default=0) + 1


def across(
    reads: Sequence[RankRead], *, log_errors: Sequence[str] = (), log_warnings: Sequence[str] = ()
) -> Postflight:
    """Without a preflight report: every rank's values as logged, and whether the ranks agree (every
    rank's ``max_mamba_cache_size``, every stage's ``max_running_requests`` and the micro-batch size it
    gives): what the preflight would have caught, seen in the server itself. ``exit_code`` 0 whatever the
    ranks logged (the report-less reading is an answer, not a gate), 2 on an error."""
    pp_size = max((r.key.pp for r in reads), default=0) + 1
    checks: list[Check] = []
    group = tp_group(reads)
    for read in reads:
        rank = inferred_rank(read, group)
        base = {"rank": rank, "replica": read.key.dp if "DP" in read.prefix else None, "prefix": read.prefix}
        summary = (
            ("max_total_num_tokens", read.max_total_num_tokens),
            ("context_len", read.context_len),
            ("max_running_requests", read.max_running_requests),
        )
        for value, logged in (
            ("max_mamba_cache_size", read.max_mamba_cache_size),
            *(summary if read.key.tp == 0 else ()),
            ("weights_gib", read.weights_gib),
        ):
            checks.append(
                Check(
                    value=value,
                    host=None,
                    predicted=None,
                    logged=logged.value,
                    status=OK if logged.value is not None else MISSING,
                    where=str(logged.where) if logged.where else None,
                    detail=logged.note,
                    **base,  # type: ignore[arg-type]
                )
            )
        n = read.max_running_requests.value
        if read.key.tp == 0 and isinstance(n, int):
            checks.append(
                Check(
                    value="pp_max_micro_batch_size",
                    host=None,
                    predicted=None,
                    logged=max(n // pp_size, 1),
                    status=OK,
                    where=str(read.max_running_requests.where),
                    detail=f"not logged; max(max_running_requests {n} // pp_size {pp_size}, 1) unless "
                    "--pp-max-micro-batch-size was given",
                    **base,  # type: ignore[arg-type]
                )
            )

    divergent = []
    for value in VALUES[:-1]:  # the weights differ across stages by design; the KV pool is the MIN
        held = [c for c in checks if c.value == value and c.logged is not None]
        if len({c.logged for c in held}) > 1:
            divergent.append(value)
            for i in outliers([c.logged for c in held]) or range(len(held)):
                held[i].status = DIVERGES
    errors = list(log_errors)
    status = ERROR if errors else DIVERGENT if divergent else CONSISTENT
    return Postflight(
        status=status,
        exit_code=EXIT_CODES[ERROR] if errors else 0,
        checks=checks,
        reads=list(reads),
        divergent=divergent,
        missing=[],
        extra=[],
        root_causes=[],
        errors=errors,
        warnings=list(log_warnings),
        prediction=None,
    )
