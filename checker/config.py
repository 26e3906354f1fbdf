"""Typed, frozen configuration: built once from argparse at a command's entry (torch-free).

Nothing below the command layer sees an ``argparse.Namespace``: the derivation reads
:class:`SizingFlags` and :class:`ModelChoice`, the process group reads :class:`GroupOptions`, engines
read :class:`EngineChoice`. Field names are SGLang's server-arg names, so the preflight's inputs (which
ranks compare by digest) follow from :data:`SIZING_FLAG_NAMES` and need no list of their own.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import TYPE_CHECKING

from checker.core.environ import SGLANG_ENV_VARS
from checker.core.geometry import resolve_dtypes
from checker.core.models import load_geometry
from checker.core.partition import PARTITION_ENV
from checker.core.sizing import CapacityInputs, env_flag

if TYPE_CHECKING:
    from checker.core.releases import ReleaseChoice


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """Which model: a built-in preset or an HF config (file or model directory)."""

    model: str | None = None
    model_config: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelChoice:
        return cls(model=args.model, model_config=args.model_config)

    @property
    def label(self) -> str:
        return self.model_config or self.model or "?"


@dataclass(frozen=True, kw_only=True)
class SizingFlags:
    """Every flag a rank's derivation reads, by SGLang's name. Each one is a preflight input."""

    pp_size: int | None = None
    tp_size: int = 1
    dp_size: int = 1
    policy: str | None = None
    mamba_full_memory_ratio: float | None = None
    """None: the release's own default (0.9; 0.2 in SGLang 0.5.3.post2)."""
    mamba_radix_cache_strategy: str = "auto"
    page_size: int = 1
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    max_running_requests: int | None = None
    max_mamba_cache_size: int | None = None
    pp_max_micro_batch_size: int | None = None
    speculative_num_draft_tokens: int | None = None
    mamba_ssm_dtype: str | None = None
    token_capacity: int | None = None
    context_len: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SizingFlags:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


SIZING_FLAG_NAMES = tuple(f.name for f in fields(SizingFlags))


@dataclass(frozen=True, kw_only=True)
class EngineChoice:
    """Who derives: the builtin model, the installed SGLang's own code, or both (drift check)."""

    engine: str = "builtin"
    best_effort: bool = False
    sglang_version: str | None = None
    """``--sglang-version``: derive as this release (default: the installed one, else the newest)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineChoice:
        return cls(
            engine=args.engine, best_effort=args.sglang_best_effort, sglang_version=args.sglang_version
        )

    def choose(self, installed: str | None, *, own_code: bool = True) -> ReleaseChoice:
        """The release to derive as and who derives it (:func:`checker.core.releases.choose_release`, the one
        place this is decided); ``installed``: this rank's installed SGLang version (None: none)."""
        from checker.core.releases import choose_release

        return choose_release(
            self.sglang_version,
            installed,
            engine=self.engine,
            best_effort=self.best_effort,
            own_code=own_code,
        )


@dataclass(frozen=True, kw_only=True)
class GroupOptions:
    """How a rank joins the process group (check and sweep under torchrun)."""

    backend: str = "auto"
    timeout_s: float = 60.0
    init_method: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GroupOptions:
        return cls(backend=args.backend, timeout_s=args.timeout_s, init_method=args.init_method)


@dataclass(frozen=True, kw_only=True)
class BudgetSource:
    """Where ``total_rest_memory`` comes from: a fixed GiB value, or free device memory."""

    budget_gib: float | None = None
    from_device: bool = False
    mem_fraction_static: float = 0.9
    device_free_gib: tuple[float, ...] = ()
    """Free memory to assume instead of measuring it: one value, or one per rank."""
    agree: bool = True
    """MIN over ranks, as SGLang all-reduces free memory (``--no-agree-budget`` turns it off)."""
    weights_gib: tuple[float, ...] = ()
    """The weights' footprint per rank (one value, or one per rank); the checker loads none."""

    @property
    def label(self) -> str:
        if self.from_device:
            agreement = "MIN over ranks" if self.agree else "not agreed"
            weights = (
                f", weights {','.join(f'{w:g}' for w in self.weights_gib)} GiB" if self.weights_gib else ""
            )
            return f"device free, --mem-fraction-static {self.mem_fraction_static:g}{weights}, {agreement}"
        return "--budget-gib"


@dataclass(frozen=True, kw_only=True)
class OutputOptions:
    report: str | None = None
    junit: str | None = None
    format: str = "text"
    quiet: bool = False


@dataclass(frozen=True, kw_only=True)
class PreflightConfig:
    """``checker check``."""

    model: ModelChoice
    sizing: SizingFlags
    engine: EngineChoice
    group: GroupOptions
    budget: BudgetSource
    output: OutputOptions
    strict_inputs: bool = False
    materialize: bool = False
    materialize_device: str = "auto"
    launch_command: str | None = None
    """The launch command's explicit sizing inputs, as read (its parser and release first)."""


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """``checker sweep`` (single process, or under torchrun with one stage per rank)."""

    model: ModelChoice
    sizing: SizingFlags
    group: GroupOptions
    output: OutputOptions
    budgets: str
    policies: tuple[str, ...]
    require_consistent: tuple[str, ...] | None
    plot: str | None = None
    device: str = "cpu"
    progress: bool = True


@dataclass(frozen=True, kw_only=True)
class DeriveConfig:
    """``derive`` and ``plan``: one process derives every stage (no process group)."""

    model: ModelChoice
    sizing: SizingFlags
    engine: EngineChoice
    budget_gib: float

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, default_budget_gib: float) -> DeriveConfig:
        budget = args.budget_gib if getattr(args, "budget_gib", None) is not None else default_budget_gib
        return cls(
            model=ModelChoice.from_args(args),
            sizing=SizingFlags.from_args(args),
            engine=EngineChoice.from_args(args),
            budget_gib=budget,
        )

    @cached_property
    def release(self) -> ReleaseChoice:
        """The release derived as and who derives it, chosen once for this process (derive and plan run
        as the installed SGLang, like one rank)."""
        from checker.core.releases import installed_sglang_version

        return self.engine.choose(installed_sglang_version())

    def inputs(self, env: Mapping[str, str], *, policy: str | None = None) -> CapacityInputs:
        return capacity_inputs(
            self.model, self.sizing, budget_gib=self.budget_gib, policy=policy, env=env, release=self.release
        )

    def engines(self, inputs: CapacityInputs, env: Mapping[str, str]):
        """The engines of ``--engine`` (``sglang`` for a release the checker does not model), prepared for
        ``inputs`` (an ``EngineSet``)."""
        from checker.engines.drift import prepare_engines

        return prepare_engines(
            self.release.engine,
            inputs,
            model_source(self.model, self.sizing),
            env,
            best_effort=self.engine.best_effort,
            release=self.release,
        )


def model_source(model: ModelChoice, sizing: SizingFlags):
    """What the sglang engine rebuilds the geometry from: the model as the user named it."""
    from checker.engines import ModelSource

    return ModelSource(
        model=model.model,
        model_config=model.model_config,
        mamba_ssm_dtype=sizing.mamba_ssm_dtype,
        release_default_ratio=sizing.mamba_full_memory_ratio is None,
    )


def capacity_inputs(
    model: ModelChoice,
    sizing: SizingFlags,
    *,
    budget_gib: float,
    pp_size: int | None = None,
    policy: str | None = None,
    env: Mapping[str, str],
    release: ReleaseChoice | None = None,
) -> CapacityInputs:
    """One rank's :class:`CapacityInputs`, derived as ``release`` (chosen by the caller, once; None: the
    installed release's model, for commands that run the checker's model only); raises CheckerInputError
    on anything invalid."""
    from checker.core.releases import installed_sglang_version, release_model

    if release is None:
        release = EngineChoice().choose(installed_sglang_version(), own_code=False)
    geometry = load_geometry(model=model.model, model_config=model.model_config, tp_size=sizing.tp_size)
    if release.modelled == release.derived_as:  # a release the checker models: its registry is known
        from checker.core.model_support import check_architectures, model_architectures

        archs = model_architectures(model=model.model, model_config=model.model_config)
        check_architectures(release.derived_as, archs, model=model.label, env=env)
    geometry = resolve_dtypes(geometry, env=env, mamba_ssm_dtype=sizing.mamba_ssm_dtype)
    return CapacityInputs(
        geometry=geometry,
        budget_gib=budget_gib,
        pp_size=pp_size or sizing.pp_size or 1,
        tp_size=sizing.tp_size,
        dp_size=sizing.dp_size,
        mamba_full_memory_ratio=(
            sizing.mamba_full_memory_ratio
            if sizing.mamba_full_memory_ratio is not None
            else release_model(release.modelled).rules.default_full_memory_ratio
        ),
        mamba_radix_cache_strategy=sizing.mamba_radix_cache_strategy,
        page_size=sizing.page_size,
        disable_radix_cache=sizing.disable_radix_cache,
        disable_overlap_schedule=sizing.disable_overlap_schedule,
        max_running_requests=sizing.max_running_requests,
        max_mamba_cache_size=sizing.max_mamba_cache_size,
        speculative_num_draft_tokens=sizing.speculative_num_draft_tokens,
        pp_max_micro_batch_size=sizing.pp_max_micro_batch_size,
        token_capacity=sizing.token_capacity,
        context_len=sizing.context_len,
        partition_env=env.get(PARTITION_ENV),
        skip_decode_lock=env_flag(env.get("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK")),
        policy=policy or sizing.policy,
        # The model the checker's own pieces apply: derived_as, or the newest one standing in for a
        # release it does not model (the label, from ``release``, says which).
        sglang_version=release.derived_as if release.best_effort else release.modelled,
        sglang_best_effort=release.best_effort,
    )


def sglang_env(env: Mapping[str, str]) -> dict[str, str | None]:
    """The SGLang environment variables a derivation reads, as this process sees them."""
    return {name: env.get(name) for name in SGLANG_ENV_VARS}
