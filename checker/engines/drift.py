"""``--engine both``: derive with the builtin model and with the installed SGLang, and name any difference.

A difference is a "model drift" finding: the checker's model no longer says what the deployed SGLang
will do, so its verdicts about stage agreement cannot be trusted until the model is fixed (or SGLang
is the version the model describes). Exit code 4 (checker.status MODEL_DRIFT) in every command.

Compared per stage: the three values every stage must agree on, the stage slice,
``stage_per_req_bytes`` (the charge behind the pool size), and the KV token pool: the stage's own
capacity (what it hands the MIN), the pool after the MIN (``max_total_num_tokens``), the KV bytes per
token and the context length the request estimate divides by. One engine refusing the inputs while the
other derives values is drift too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from checker.core.errors import CheckerInputError
from checker.core.releases.releases import ReleaseChoice
from checker.core.sizing.sizing import CHECKED_VALUES, CapacityInputs, StageCapacity, derive_each_stage
from checker.engines import ModelSource, PreparedEngine, get_engine

DRIFT_VALUES = (
    *CHECKED_VALUES,
    "stage_slice",
    "stage_per_req_bytes",
    "kv_own_tokens",
    "max_total_num_tokens",
    "kv_cell_bytes",
    "context_len",
)


@dataclass(frozen=True)
class Outcome:
    """One engine's result for one stage: values, or the error it raised."""

    pp_rank: int
    stage: StageCapacity | None = None
    error: CheckerInputError | None = None


@dataclass(frozen=True)
class Drift:
    """One value on which the builtin model and SGLang disagree."""

    pp_rank: int
    value: str
    builtin: str
    sglang: str

    def __str__(self) -> str:
        where = f" on pp_rank {self.pp_rank}" if self.pp_rank >= 0 else ""
        return f"{self.value}{where}: builtin {self.builtin}, sglang {self.sglang}"

    def text(self) -> str:
        """Without the stage: a rank's row already says which stage it is (and equal findings group)."""
        return f"{self.value}: builtin {self.builtin}, sglang {self.sglang}"


def _value(stage: StageCapacity, name: str) -> str:
    if name == "stage_slice":
        return f"[{stage.start_layer}, {stage.end_layer})"
    return str(getattr(stage, name))


def compare(builtin: Outcome, sglang: Outcome) -> list[Drift]:
    k = builtin.pp_rank
    if builtin.stage is None and sglang.stage is None:
        return []  # both refuse: an input error, reported as such
    if builtin.stage is None or sglang.stage is None:
        b = f"error ({builtin.error})" if builtin.stage is None else "derives values"
        s = f"error ({sglang.error})" if sglang.stage is None else "derives values"
        return [Drift(k, "outcome", b, s)]
    return [
        Drift(k, name, _value(builtin.stage, name), _value(sglang.stage, name))
        for name in DRIFT_VALUES
        if _value(builtin.stage, name) != _value(sglang.stage, name)
    ]


def outcome(
    engine: PreparedEngine | None,
    pp_rank: int,
    budget_gib: float | None = None,
    prepare_error: CheckerInputError | None = None,
) -> Outcome:
    if engine is None:
        return Outcome(pp_rank, error=prepare_error)
    try:
        return Outcome(pp_rank, stage=engine.derive(pp_rank, budget_gib))
    except CheckerInputError as exc:
        return Outcome(pp_rank, error=exc)


@dataclass
class EngineSet:
    """The engines one command runs, prepared once for one set of inputs."""

    mode: str
    """builtin | sglang | both"""
    primary: PreparedEngine
    """Whose values the command reports: builtin for builtin/both, sglang for sglang."""
    shadow: PreparedEngine | None = None
    """The SGLang engine under ``both`` (None when it refused to prepare: see shadow_error)."""
    shadow_error: CheckerInputError | None = None
    sglang_version: str | None = None
    """The installed SGLang whose code ran (None: builtin only)."""
    release: ReleaseChoice | None = None
    """The release derived as, when the caller chose it (its ``label`` says whose code derived)."""

    @property
    def compares(self) -> bool:
        return self.mode == "both"

    def who(self) -> str:
        """Whose code derived, for a report line: "SGLang 0.5.23's own sizing code", or the release's label
        when the checker does not model it ("SGLang 0.5.24, newer than modelled: derived by its own code
        (installed)")."""
        if self.release is not None and self.release.own_code:
            return self.release.label
        return f"SGLang {self.sglang_version}'s own sizing code"

    def derive(
        self, pp_rank: int, budget_gib: float | None = None
    ) -> tuple[StageCapacity | None, list[Drift]]:
        """The primary engine's stage; under ``both`` also every drift. Raises the primary's input error
        when nothing drifts (both refuse, or only one engine runs); None for the stage when the primary
        refused and the drift says why."""
        first = outcome(self.primary, pp_rank, budget_gib)
        drifts: list[Drift] = []
        if self.compares:
            drifts = compare(first, outcome(self.shadow, pp_rank, budget_gib, self.shadow_error))
        if first.stage is None and not drifts:
            assert first.error is not None
            raise first.error
        return first.stage, drifts

    def derive_all(
        self, pp_size: int, budget_gib: float | None = None
    ) -> tuple[list[StageCapacity] | None, list[Drift]]:
        """Every stage; ``None`` stages when drift left the primary without values on some stage. Of
        several refusals, the one no budget fixes is raised first (``derive_each_stage``), as the sweep
        does."""
        results = derive_each_stage(lambda k: self.derive(k, budget_gib), pp_size)
        stages = [stage for stage, _ in results if stage is not None]
        drifts = [d for _, found in results for d in found]
        return (stages if len(stages) == pp_size else None), drifts


def prepare_engines(
    mode: str,
    inputs: CapacityInputs,
    source: ModelSource,
    env: Mapping[str, str],
    *,
    best_effort: bool = False,
    release: ReleaseChoice | None = None,
) -> EngineSet:
    """Prepare the engines of ``mode`` (the effective one: ``release.engine``). SGLang being unavailable
    is an input error (exit 2) in every mode that asks for it; its refusing THESE inputs under ``both``
    is kept for the drift comparison."""
    if mode == "builtin":
        return EngineSet(mode, get_engine("builtin").prepare(inputs, source, env), release=release)
    # A release the checker does not model runs its own code because of what it is, not a flag: say so.
    reason = release.label if release is not None and release.own_code else None
    sglang = get_engine("sglang", best_effort=best_effort, reason=reason)  # raises SglangUnavailable
    if mode == "sglang":
        return EngineSet(
            mode, sglang.prepare(inputs, source, env), sglang_version=sglang.version, release=release
        )
    builtin = get_engine("builtin").prepare(inputs, source, env)
    if inputs.policy is not None and inputs.resolved_policy != inputs.release.rules.policy:
        # Not drift: SGLang has no such policy. Say so instead of comparing apples and pears.
        sglang.prepare(inputs, source, env)  # raises the FlagError naming the policy
    try:
        shadow, shadow_error = sglang.prepare(inputs, source, env), None
    except CheckerInputError as exc:
        shadow, shadow_error = None, exc
    return EngineSet(
        mode,
        builtin,
        shadow=shadow,
        shadow_error=shadow_error,
        sglang_version=sglang.version,
        release=release,
    )


def drift_lines(drifts: Iterable[Drift], *, sglang_version: str | None) -> list[str]:
    drifts = list(drifts)
    if not drifts:
        return []
    head = (
        f"MODEL DRIFT: the builtin model and SGLang {sglang_version or '?'} derive different values "
        f"({len(drifts)} finding{'s' if len(drifts) != 1 else ''}); the builtin verdict cannot be "
        "trusted for this deployment:"
    )
    return [head, *(f"  {d}" for d in drifts)]


def drift_summary(drifts: list[Drift], *, limit: int = 3) -> str:
    """One line for a rank's error slot (fixed width on the wire): the first few findings."""
    shown = "; ".join(d.text() for d in drifts[:limit])
    more = f"; and {len(drifts) - limit} more" if len(drifts) > limit else ""
    return f"model drift: {shown}{more}"
