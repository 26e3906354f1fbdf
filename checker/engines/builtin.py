"""The ``builtin`` engine: the checker's own model of each modelled SGLang release
(:mod:`checker.core.sizing.sizing`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from checker.core.errors import CheckerInputError
from checker.core.sizing.sizing import (
    CapacityInputs,
    StageCapacity,
    StagePlan,
    plan_stage,
    size_pool,
    with_pool,
)
from checker.engines import ModelSource


@dataclass
class PreparedBuiltin:
    inputs: CapacityInputs
    _plans: dict[int, StagePlan] = field(default_factory=dict)
    _own: dict[float | None, list[StageCapacity | CheckerInputError]] = field(default_factory=dict)

    def _stage_own(self, pp_rank: int, budget_gib: float | None) -> StageCapacity:
        # The plan is budget-independent: a budget search re-uses it.
        if pp_rank not in self._plans:
            self._plans[pp_rank] = plan_stage(self.inputs, pp_rank)
        return size_pool(self._plans[pp_rank], self.inputs, budget_gib)

    def own(self, budget_gib: float | None = None) -> list[StageCapacity | CheckerInputError]:
        """Every stage's own pools at one budget (a stage that cannot size them: its error), kept for the
        last budget asked (every stage of one budget is asked in turn)."""
        if budget_gib not in self._own:
            out: list[StageCapacity | CheckerInputError] = []
            for k in range(self.inputs.pp_size):
                try:
                    out.append(self._stage_own(k, budget_gib))
                except CheckerInputError as exc:
                    out.append(exc)
            self._own = {budget_gib: out}
        return self._own[budget_gib]

    def derive(self, pp_rank: int, budget_gib: float | None = None) -> StageCapacity:
        """Stage ``pp_rank`` after the MIN of every stage's own KV capacity (a stage that cannot size its
        pools is left out of the MIN; its own ranks report why)."""
        stages = self.own(budget_gib)
        mine = stages[pp_rank]
        if isinstance(mine, CheckerInputError):
            raise mine
        minimum = min(s.kv_own_tokens for s in stages if isinstance(s, StageCapacity))
        return with_pool(mine, self.inputs, minimum)


class BuiltinEngine:
    name = "builtin"
    version: str | None = None

    def prepare(self, inputs: CapacityInputs, source: ModelSource, env: Mapping[str, str]) -> PreparedBuiltin:
        # The geometry in ``inputs`` was already built from ``source`` and ``env``.
        return PreparedBuiltin(inputs)
