"""Derivation engines: who computes a stage's pool size and limits.

* ``builtin`` - the checker's own model of each modelled SGLang release (:mod:`checker.core.sizing.sizing`,
  :mod:`checker.core.releases.releases`); torch-free.
* ``sglang`` - the INSTALLED SGLang's own code, called on CPU with light stand-ins
  (:mod:`checker.engines.sglang`); what the deployment will really do.
* ``both`` - derive with each and report any difference as "model drift" (:mod:`checker.engines.drift`).

Every import of SGLang (and so of torch) happens inside :func:`get_engine`, never at module import:
``derive --engine builtin`` must stay as cheap as it was.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

from checker.core.sizing.sizing import CapacityInputs, StageCapacity

ENGINES = ("builtin", "sglang", "both")
DEFAULT_ENGINE = "builtin"


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """Where the model came from, as the user named it: the sglang engine rebuilds the geometry itself."""

    model: str | None = None
    """A built-in preset name (``--model``)."""
    model_config: str | None = None
    """``--model-config PATH``: an HF config.json or a JSON model spec."""
    mamba_ssm_dtype: str | None = None
    """``--mamba-ssm-dtype`` exactly as typed (SGLang applies it by writing SGLANG_MAMBA_SSM_DTYPE)."""
    release_default_ratio: bool = False
    """``--mamba-full-memory-ratio`` was not given: the installed release's own ``ServerArgs`` default
    decides in the sglang engine (the builtin takes its table's default for the release, so under
    ``both`` a changed default shows as drift, and a release the checker does not model keeps its own)."""


class PreparedEngine(Protocol):
    """An engine bound to one set of inputs; derives any stage at any budget."""

    def derive(self, pp_rank: int, budget_gib: float | None = None) -> StageCapacity: ...


class Engine(Protocol):
    name: str
    version: str | None
    """The SGLang version whose code runs (None for builtin)."""

    def prepare(
        self, inputs: CapacityInputs, source: ModelSource, env: Mapping[str, str]
    ) -> PreparedEngine: ...


def get_engine(name: str, *, best_effort: bool = False, reason: str | None = None) -> Engine:
    """``builtin`` or ``sglang`` (``both`` is two engines: ask for each). ``reason``: why SGLang's code
    runs, for its messages (default: --engine sglang/both)."""
    if name == "builtin":
        # start-up: the registry loads only the engine asked for (each imports this package)
        from checker.engines.builtin import BuiltinEngine

        return BuiltinEngine()
    if name == "sglang":
        # optional dependency: SGLang's engine imports sglang, and so torch
        from checker.engines.sglang import SglangEngine

        if reason is None:
            return SglangEngine(best_effort=best_effort)
        return SglangEngine(best_effort=best_effort, reason=reason)
    raise ValueError(f"unknown engine {name!r}")  # argparse choices keep users away from this


@contextlib.contextmanager
def quiet_sglang(*, stderr: bool = False) -> Iterator[None]:
    """While SGLang's own code runs: its import warns (no CUDA for AWQ/GGUF), its resolution logs, and
    its deprecated-alias flags print warnings (``stderr=True`` swallows those); none of it is ours."""
    logger = logging.getLogger("sglang")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stderr(io.StringIO()) if stderr else nullcontext(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
