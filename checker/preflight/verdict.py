"""From every rank's row to one verdict (torch-free, so it is tested without a process group).

Every rank runs :func:`decide` on the same gathered rows, so every rank reaches the same status and exit
code; rank 0 is the one that prints and writes it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from checker.core.errors import CheckerInputError
from checker.core.ranks import is_split, outliers, rank_ranges, ranks_do
from checker.core.releases.releases import parse_version
from checker.core.sizing.environ import SGLANG_ENV_VARS, SKIP_DECODE_LOCK_ENV
from checker.core.sizing.kv_pool import KvStage, release_at, resolve_one
from checker.core.sizing.row import (
    ATTENTION_LAYOUT,
    FOLLOWS,
    MISSING,
    NOT_INSTALLED,
    RESOLVED_INPUTS,
    VERSION_INPUTS,
    RankRow,
)
from checker.core.sizing.sizing import CHECKED_VALUES, env_flag
from checker.core.sizing.upgrade import UpgradeFacts, explain
from checker.distributed.wire import sent_text
from checker.families import FAMILY_TABLE
from checker.preflight.pipeline import PipelineFault, pipeline_faults
from checker.status import (
    CONSISTENT,
    DIVERGENT,
    ERROR,
    EXIT_CODES,
    INFRASTRUCTURE_FAILURE,
    MODEL_DRIFT,
    ROW_DRIFT,
    ROW_OK,
)

INSTALLED = "sglang_installed"
"""The input naming each rank's installed SGLang (the release it derives as is ``derived_as``)."""

EFFICIENCY_WARN_BELOW = 0.5
COMPARED_VALUES = (*CHECKED_VALUES, "max_total_num_tokens", "context_len")
"""What every rank must agree on: the three values, and the KV pool after the MIN with the context length
that sized its request estimate (what SGLang logs at start-up beside max_running_requests)."""
STAGE_VALUES = ("kv_own_tokens",)
"""What the ranks of one stage must agree on, and stages may not: the stage's own KV capacity."""


@dataclass(kw_only=True)
class ValueGroup:
    """The ranks that derived one value of a checked name."""

    value: int
    ranks: list[int]
    hosts: list[str]
    pp_ranks: list[int]
    layers: list[tuple[int, int]]
    """The distinct layer slices ``[start, end)`` of the group's stages."""
    linear_layers: list[int]
    """The distinct numbers of linear (state-holding) layers in the group's stages, in slice order."""
    outlier: bool
    """The value differs from the majority's (never set in an even split: no majority)."""
    share: str
    """``majority``, ``outlier``, or ``split`` when no value is held by more ranks than every other."""


@dataclass(kw_only=True)
class Verdict:
    status: str
    world_size: int
    rows: list[RankRow] = field(default_factory=list)
    divergent: list[str] = field(default_factory=list)
    divergent_groups: dict[str, list[ValueGroup]] = field(default_factory=dict)
    differing_inputs: list[str] = field(default_factory=list)
    pipeline: list[PipelineFault] = field(default_factory=list)
    """How the ranks are not one pipeline of one model (checker.preflight.pipeline): each is a divergence,
    whatever the three values say."""
    root_causes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    infrastructure_detail: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def input_causes(self) -> list[str]:
        """The root causes that name a differing input (after the pipeline's own lines)."""
        return self.root_causes[len(self.pipeline) :]


def _show(value: str | None) -> str:
    """A value as a line shows it: ``value`` is :func:`checker.distributed.wire.sent_text` (cut marked)."""
    if value is None:
        return "<unset>"
    if value == "":  # set to the empty string, which is not unset: quoted so the reader sees it
        return "''"
    return value


def _upgrade_facts(rows: Sequence[RankRow]) -> UpgradeFacts:
    """The deployment as the exchanged inputs describe it (a per-slot extra state is not among them: it
    shows in the model's digest)."""
    i = rows[0].inputs
    return UpgradeFacts(
        max_running_requests=i.get("max_running_requests") is not None,
        skip_decode_lock=any(env_flag(r.inputs.get(SKIP_DECODE_LOCK_ENV)) for r in rows),
        strategy=i.get("mamba_radix_cache_strategy") or "auto",
        speculative=i.get("speculative_num_draft_tokens") is not None,
        pp_size=max((r.pp_size for r in rows), default=1),
        budget_from_device=(i.get("budget_source") or "").startswith("device"),
    )


def _odd_first_order(groups: Sequence[Sequence[RankRow]]) -> list[Sequence[RankRow]]:
    """Groups of ranks largest first, equal sizes in rank order: a strict majority leads and the odd
    ones follow it; in an even split (no majority) the ranks are read in order."""
    return sorted(groups, key=lambda g: (-len(g), min(r.rank for r in g)))


def _hosts(members: Sequence[RankRow]) -> str:
    """The hosts of a group of ranks, at most four named (a large group would fill the line)."""
    hosts = sorted({r.host for r in members})
    return ", ".join(hosts[:4]) + (", ..." if len(hosts) > 4 else "")


def _where(members: Sequence[RankRow]) -> str:
    """``rank 2 (node-b)``: the ranks of an error and where they run (every error names both)."""
    hosts = _hosts(members)
    return rank_ranges([r.rank for r in members]) + (f" ({hosts})" if hosts else "")


def _release_words(version: str, *, one: bool) -> str:
    if version == NOT_INSTALLED:
        return f"{'has' if one else 'have'} no SGLang installed"
    return f"{'runs' if one else 'run'} SGLang {version}"


def _release_order(version: str | None) -> tuple[int, tuple[int, int, int, int], str]:
    """Sort key: release numbers in release order; text that is not one (never modelled) after them."""
    try:
        return 0, parse_version(version or ""), ""
    except CheckerInputError:
        return 1, (0, 0, 0, 0), version or ""


def explain_releases(rows: Sequence[RankRow]) -> str:
    """Installed SGLang releases that differ, per node ("nodes 0-2 run 0.5.23; node 3 runs 0.5.16"),
    the majority first, and the changes between them that can make the ranks derive differently."""
    by_version: dict[str, list[RankRow]] = defaultdict(list)
    for r in rows:
        by_version[r.inputs.get(INSTALLED) or NOT_INSTALLED].append(r)
    nodes_of = defaultdict(set)
    for r in rows:
        nodes_of[r.node_rank].add(r.inputs.get(INSTALLED) or NOT_INSTALLED)
    parts = []
    for members in _odd_first_order(list(by_version.values())):
        version = members[0].inputs.get(INSTALLED) or NOT_INSTALLED
        nodes = sorted({r.node_rank for r in members})
        hosts = _hosts(members)
        ranks = rank_ranges(r.rank for r in members)
        if all(n >= 0 and len(nodes_of[n]) == 1 for n in nodes):  # whole nodes: name them
            shown = _release_words(version, one=len(nodes) == 1)
            parts.append(f"{rank_ranges(nodes, noun='node')} ({hosts}, {ranks}) {shown}")
        else:
            parts.append(f"{ranks} (on {hosts}) {_release_words(version, one=len(members) == 1)}")
    line = f"{INSTALLED}: " + "; ".join(parts)
    # In release order (0.5.9 before 0.5.10), so each step is explained between neighbours.
    named = {v for r in rows if (v := r.inputs.get(INSTALLED)) is not None}
    installed = sorted(named - {NOT_INSTALLED}, key=_release_order)
    why: list[str] = []
    for a, b in zip(installed, installed[1:], strict=False):
        try:
            why += explain(a, b, _upgrade_facts(rows), FAMILY_TABLE)
        except CheckerInputError:  # a release the model does not know: nothing to explain with
            continue
    if why:
        line += " -- what changed: " + "; ".join(why)
    return line


def explain_input(name: str, rows: Sequence[RankRow]) -> str:
    """One line naming who differs in one input, e.g. the partition env set on some nodes only.

    The largest group of ranks comes first; every other group is an odd one and is followed by its own
    hosts, so with 3 ranks against 1 (or 5 against 3) the line names the smaller group and where it
    runs. In an even split (2 against 2) there is no majority: the groups come in rank order and each
    after the first names its hosts.
    """
    rows = compared_rows(name, rows)
    if name == INSTALLED:
        return explain_releases(rows)
    by_digest: dict[int, list[RankRow]] = defaultdict(list)
    for row in rows:
        by_digest[row.input_digests[name]].append(row)
    parts = []
    for i, g in enumerate(_odd_first_order(list(by_digest.values()))):
        ranks = [r.rank for r in g]
        value = sent_text(g[0], name)  # as the wire carried it: a cut value ends in CUT_MARK
        if name in SGLANG_ENV_VARS:
            part = (
                f"{ranks_do(ranks, 'leaves', 'leave')} it unset"
                if value is None
                else f"{ranks_do(ranks, 'sets', 'set')} {name}={_show(value)}"
            )
        elif name in VERSION_INPUTS:
            part = f"{ranks_do(ranks, 'runs', 'run')} {name.removesuffix('_version')} {_show(value)}"
        elif name == "model":
            part = f"{ranks_do(ranks, 'loads', 'load')} {_show(value)}"
        elif name == "derived_as":
            part = f"{ranks_do(ranks, 'derives', 'derive')} as {_show(value)}"
        elif name == "budget_gib":
            part = f"{ranks_do(ranks, 'derives', 'derive')} with a budget of {_show(value)} GiB"
        elif name == "budget_source":
            part = f"{ranks_do(ranks, 'takes', 'take')} the budget from {_show(value)}"
        elif name == ATTENTION_LAYOUT:
            part = (
                f"{ranks_do(ranks, 'gives', 'give')} no --tp-size or attention-DP flag"
                if value is None
                else f"{ranks_do(ranks, 'has', 'have')} {_show(value)}"
            )
        elif name == "launch_command":
            if value is None:
                part = f"{ranks_do(ranks, 'was started', 'were started')} without one"
            else:  # "FORM: FLAGS" (launch.merge.LaunchInputs.input): the flags no other input compares
                form, _, own = value.partition(": ")
                flags = _show(own) if own else "no other sizing flag"
                part = f"{rank_ranges(ranks)} ran `{form} ...` with {flags}"
        else:
            flag = "--" + name.replace("_", "-")
            part = (
                f"{ranks_do(ranks, 'leaves', 'leave')} {flag} unset"
                if value is None
                else f"{ranks_do(ranks, 'has', 'have')} {flag}={_show(value)}"
            )
        parts.append(part if i == 0 else f"{part} (on {_hosts(g)})")
    return f"{name}: " + "; ".join(parts)


def compared_rows(name: str, rows: Sequence[RankRow]) -> list[RankRow]:
    """The rows whose value of input ``name`` is compared: every row, except, for an input a rank resolves
    while deriving (RESOLVED_INPUTS), the rows of ranks that failed before resolving it."""
    if name not in RESOLVED_INPUTS:
        return list(rows)
    return [r for r in rows if r.inputs.get(name) is not None]


def differing_inputs(rows: Sequence[RankRow]) -> list[str]:
    """The inputs that differ across ranks, each only where it is a cause: an input that follows from
    another that differs too (FOLLOWS) is left out, as the other one is what the user changes."""
    if not rows:
        return []
    names = rows[0].input_digests.keys()
    differ = [n for n in names if len({r.input_digests[n] for r in compared_rows(n, rows)}) > 1]
    return [n for n in differ if not set(FOLLOWS.get(n, ())) & set(differ)]


def value_groups(name: str, rows: Sequence[RankRow]) -> list[ValueGroup]:
    values = [getattr(r, name) for r in rows]
    odd = outliers(values)
    split = is_split(values)
    grouped: dict[int, list[int]] = defaultdict(list)
    for i, v in enumerate(values):
        grouped[v].append(i)
    out = []
    # The largest group first; equal sizes in rank order (the order a person scans the ranks in).
    for v, idx in sorted(grouped.items(), key=lambda kv: (-len(kv[1]), rows[kv[1][0]].rank)):
        out.append(
            ValueGroup(
                value=v,
                ranks=[rows[i].rank for i in idx],
                hosts=sorted({rows[i].host for i in idx}),
                pp_ranks=sorted({rows[i].pp_rank for i in idx}),
                layers=(slices := sorted({(rows[i].start_layer, rows[i].end_layer) for i in idx})),
                # Distinct counts, in the order of the slices they belong to ([0, 23) -> 18 first).
                linear_layers=list(
                    dict.fromkeys(
                        next(
                            r.stage_linear_layers
                            for r in (rows[i] for i in idx)
                            if (r.start_layer, r.end_layer) == sl
                        )
                        for sl in slices
                    )
                ),
                outlier=idx[0] in odd,
                share="split" if split else "outlier" if idx[0] in odd else "majority",
            )
        )
    return out


def efficiency_warning(rows: Sequence[RankRow]) -> str | None:
    """Stages charged for far more state than they allocate (whole-model charging).

    The headline ratio is over the whole world (allocated / charged, summed), so whole-model at pp 8
    reads "1/8"; the worst single stage is named too.
    """
    pairs = [(r.state_allocated_bytes, r.state_charged_bytes) for r in rows if r.state_charged_bytes > 0]
    if not pairs:
        return None
    overall = sum(a for a, _ in pairs) / sum(c for _, c in pairs)
    worst = min(a / c for a, c in pairs)
    if overall >= EFFICIENCY_WARN_BELOW:
        return None
    return (
        f"stages allocate only about 1/{round(1 / overall)} of the state memory they "
        f"are charged for (worst stage {worst:.0%}); max-share charging gives a larger pool at the "
        "same budget"
    )


def _kv_stage(row: RankRow) -> KvStage:
    def opt(value: int) -> int | None:
        return None if value == MISSING else value

    return KvStage(
        release=release_at(row.kv_release),
        pp_rank=row.pp_rank,
        pp_size=row.pp_size,
        page_size=row.page_size,
        own_tokens=row.kv_own_tokens,
        profiled_tokens=row.kv_profiled_tokens,
        estimate_tokens=row.kv_estimate_tokens,
        cell_bytes=row.kv_cell_bytes,
        context_len=row.context_len,
        requests_per_worker=opt(row.requests_per_worker),
        user_max_running_requests=opt(row.user_max_running_requests),
        max_mamba_cache_size=row.max_mamba_cache_size,
        slots_per_request=row.slots_per_request,
        user_micro=opt(row.user_micro_batch_size),
    )


def resolve_kv_rows(rows: Sequence[RankRow]) -> list[RankRow]:
    """Every rank's KV pool after SGLang's MIN over the world group, from the gathered rows: the MIN of
    their own capacities, then each rank's pool, max_running_requests and micro-batch size by its own
    release's rules (checker.core.sizing.kv_pool.resolve_one). A rank derives these alone from its own view of
    every stage; here they follow from what every rank really holds, so a rank that caps its pool
    (another --max-total-tokens on one node) lowers everyone's, as the MIN in SGLang does. A rank the
    resolution refuses (no request fits its pool) carries that error."""
    sized = [r for r in rows if r.status in (ROW_OK, ROW_DRIFT) and r.kv_release != MISSING]
    if not sized:
        return list(rows)
    minimum = min(r.kv_own_tokens for r in sized)
    out = []
    for r in rows:
        if r not in sized:
            out.append(r)
            continue
        try:
            kv = resolve_one(_kv_stage(r), minimum)
        except CheckerInputError as exc:
            out.append(replace(r, status=exc.code, error=str(exc)))
            continue
        out.append(
            replace(
                r,
                max_total_num_tokens=kv.max_total_num_tokens,
                max_running_requests=kv.max_running_requests,
                pp_max_micro_batch_size=kv.pp_max_micro_batch_size,
                kv_idle_bytes=kv.idle_bytes,
                kv_limiting=int(kv.limiting),
            )
        )
    return out


def stage_divergent(name: str, rows: Sequence[RankRow]) -> bool:
    """Whether the ranks of some one stage differ in ``name`` (stages may differ from each other)."""
    by_stage: dict[int, set[int]] = defaultdict(set)
    for r in rows:
        by_stage[r.pp_rank].add(getattr(r, name))
    return any(len(values) > 1 for values in by_stage.values())


def _compared_rows(name: str, rows: Sequence[RankRow]) -> list[RankRow]:
    """The rows a differing value is grouped over: every rank, or for a stage's own value the ranks of the
    stages that disagree within themselves."""
    if name not in STAGE_VALUES:
        return list(rows)
    odd = {
        k for k in {r.pp_rank for r in rows} if len({getattr(r, name) for r in rows if r.pp_rank == k}) > 1
    }
    return [r for r in rows if r.pp_rank in odd]


def decide(rows: Sequence[RankRow], *, world_size: int, strict_inputs: bool = False) -> Verdict:
    rows = sorted(rows, key=lambda r: r.rank)
    rows = resolve_kv_rows(rows)
    v = Verdict(status=CONSISTENT, world_size=world_size, rows=list(rows))
    v.differing_inputs = differing_inputs(rows)
    v.root_causes = [explain_input(n, rows) for n in v.differing_inputs]

    failed = [r for r in rows if r.status not in (ROW_OK, ROW_DRIFT)]
    drifted = [r for r in rows if r.status == ROW_DRIFT]
    if drifted and not failed:
        # Before divergence: when the model is wrong, its verdict on stage agreement is not evidence.
        v.status = MODEL_DRIFT
        by_drift: dict[str, list[RankRow]] = defaultdict(list)
        for r in drifted:
            by_drift[r.error].append(r)
        v.errors = [f"{_where(rs)}: {msg}" for msg, rs in by_drift.items()]
        return v
    if failed:
        v.status = ERROR
        by_msg: dict[str, list[RankRow]] = defaultdict(list)
        for r in failed:
            by_msg[r.error or f"status {r.status}"].append(r)
        v.errors = [f"{_where(rs)}: {msg}" for msg, rs in by_msg.items()]
        return v

    v.divergent = [n for n in COMPARED_VALUES if len({getattr(r, n) for r in rows}) > 1]
    # A stage's own KV capacity is its own (stages with more attention layers hold fewer tokens): only
    # the ranks of one stage must agree on it.
    v.divergent += [n for n in STAGE_VALUES if stage_divergent(n, rows)]
    v.divergent_groups = {n: value_groups(n, _compared_rows(n, rows)) for n in v.divergent}
    # One pipeline of one model, or not green: the pipeline's faults come first among the causes, each
    # naming the inputs whose own lines follow.
    v.pipeline = pipeline_faults(rows, v.differing_inputs)
    v.root_causes = [f"pipeline: {f.text}" for f in v.pipeline] + v.root_causes
    if v.divergent or v.pipeline:
        v.status = DIVERGENT
    elif v.differing_inputs:
        msg = "inputs differ across ranks although every derived value agrees: " + ", ".join(
            v.differing_inputs
        )
        if strict_inputs:
            v.status = DIVERGENT
            v.errors.append(msg + " (--strict-inputs)")
        else:
            v.warnings.append(msg)
    eff = efficiency_warning(rows)
    if eff:
        # "consistent" only where it is: a divergent verdict can be wasteful too.
        v.warnings.append(f"consistent, but {eff}" if v.status == CONSISTENT else eff)
    return v


def infrastructure_failure(
    *, world_size: int, detail: str, missing_ranks: Sequence[int], rows: Sequence[RankRow] = ()
) -> Verdict:
    return Verdict(
        status=INFRASTRUCTURE_FAILURE,
        world_size=world_size,
        rows=list(rows),
        missing_ranks=sorted(missing_ranks),
        infrastructure_detail=detail,
    )
