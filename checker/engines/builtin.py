"""The ``builtin`` engine: the checker's own model of SGLang 0.5.23 (:mod:`checker.core.sizing`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from checker.core.sizing import CapacityInputs, StageCapacity, StagePlan, plan_stage, size_pool
from checker.engines import ModelSource


@dataclass
class PreparedBuiltin:
    inputs: CapacityInputs
    _plans: dict[int, StagePlan] = field(default_factory=dict)

    def derive(self, pp_rank: int, budget_gib: float | None = None) -> StageCapacity:
        # The plan is budget-independent: a budget search re-uses it.
        if pp_rank not in self._plans:
            self._plans[pp_rank] = plan_stage(self.inputs, pp_rank)
        return size_pool(self._plans[pp_rank], self.inputs, budget_gib)


class BuiltinEngine:
    name = "builtin"
    version: str | None = None

    def prepare(self, inputs: CapacityInputs, source: ModelSource, env: Mapping[str, str]) -> PreparedBuiltin:
        # The geometry in ``inputs`` was already built from ``source`` and ``env``.
        return PreparedBuiltin(inputs)
