"""Resolution: from the typed configuration (:mod:`checker.config`, data only) to what a derivation runs
with - the release a rank derives as, its :class:`~checker.core.sizing.sizing.CapacityInputs`, the model as
the sglang engine rebuilds it, the engines of ``--engine`` and the weights figure per rank (torch-free).

Every command and the preflight's rank derivation ask here; the configuration decides nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from checker.config import DeriveConfig, EngineChoice, ModelChoice, SizingFlags
from checker.core.errors import CheckerInputError, FlagError
from checker.core.releases.releases import ReleaseChoice, installed_sglang_version, release_model
from checker.core.releases.releases import choose_release as choose_release_as
from checker.core.releases.startup import (
    _AUTO_STANDALONE,  # STANDALONE's own (steps, top-k, draft tokens)
    EAGLE_FAMILY,
    auto_params,
    check_pp_spec,
    resolve_speculative,
)
from checker.core.sizing.environ import LONGER_CONTEXT_ENV
from checker.core.sizing.geometry import resolve_dtypes
from checker.core.sizing.models import read_json, resolve_config_path, shown_path
from checker.core.sizing.partition import PARTITION_ENV
from checker.core.sizing.server_args import SIZING_ARGS
from checker.core.sizing.sizing import CapacityInputs, env_flag
from checker.families.geometry import load_geometry, model_architectures

if TYPE_CHECKING:
    from checker.engines import ModelSource
    from checker.engines.drift import EngineSet
    from checker.families.weights_source import RankWeightsFigure


def choose_release(engine: EngineChoice, installed: str | None, *, own_code: bool = True) -> ReleaseChoice:
    """The release to derive as and who derives it (:func:`checker.core.releases.releases.choose_release`,
    the one place this is decided); ``installed``: this rank's installed SGLang version (None: none)."""
    return choose_release_as(
        engine.sglang_version,
        installed,
        engine=engine.engine,
        best_effort=engine.best_effort,
        own_code=own_code,
    )


def with_release(config: DeriveConfig) -> DeriveConfig:
    """``config`` with the release derive and plan derive as (``DeriveConfig.release``), chosen once for
    this process as the installed SGLang, like one rank; a config that holds one is returned as it is.
    The command calls it where the release is first needed, after the flag checks that come before it."""
    if config.release is not None:
        return config
    return replace(config, release=choose_release(config.engine, installed_sglang_version()))


def as_release(config: DeriveConfig, version: str) -> DeriveConfig:
    """``config`` derived as SGLang ``version`` (one release of ``--sglang-version A,B``), its release
    chosen."""
    one = replace(config, engine=replace(config.engine, sglang_version=version), release=None)
    return with_release(one)


def chosen(config: DeriveConfig) -> ReleaseChoice:
    """The release :func:`with_release` chose for ``config`` (a derivation never runs without one)."""
    if config.release is None:
        raise RuntimeError("a derivation of a config whose release is not chosen: call with_release first")
    return config.release


def model_source(model: ModelChoice, sizing: SizingFlags) -> ModelSource:
    """What the sglang engine rebuilds the geometry from: the model as the user named it."""
    # start-up: the engine registry loads only when a command derives
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
    draft: str | None = None,
) -> CapacityInputs:
    """One rank's :class:`CapacityInputs`, derived as ``release`` (chosen by the caller, once; None: the
    installed release's model, for commands that run the checker's model only); raises CheckerInputError
    on anything invalid. ``draft``: the speculative draft the launch command loads
    (:attr:`checker.config.WeightsFlags.draft`): ``"nextn"`` on an architecture no release has a NEXTN
    class for is refused here, whatever the budget's or the weights figure's source."""

    if release is None:
        release = choose_release(EngineChoice(), installed_sglang_version(), own_code=False)
    if model.model_config is not None and release.modelled == release.derived_as:
        # start-up: the config classes' rules load only for a model config. First: what the
        # release refuses at load is named with its file:line, before the geometry reader's own words.
        from checker.families.rules import check_model_config

        check_model_config(release.derived_as, model.model_config)
    geometry = load_geometry(model=model.model, model_config=model.model_config, tp_size=sizing.tp_size)
    stages = pp_size or sizing.pp_size or 1
    if release.modelled == release.derived_as:  # a release the checker models: its code is known
        # start-up: the model registry tables load only for a modelled release's check
        from checker.core.releases.model_support import check_architectures, check_pipeline

        archs = model_architectures(model=model.model, model_config=model.model_config)
        check_architectures(release.derived_as, archs, model=model.label, env=env)
        if draft == "nextn":
            _check_nextn_target(model, archs, release.derived_as)
        check_pipeline(
            release.derived_as,
            archs,
            pp_size=stages,
            tp_group_size=sizing.tp_group_size,
            env=env,
            tp_fits=lambda n: _shards(model, n // sizing.dp_size),
        )
    geometry = resolve_dtypes(geometry, env=env, mamba_ssm_dtype=sizing.mamba_ssm_dtype)
    ratio = sizing.mamba_full_memory_ratio
    if ratio is None:
        ratio = release_model(release.modelled).rules.default_full_memory_ratio
    flags = {row.name: getattr(sizing, row.name) for row in SIZING_ARGS}
    # What the release resolves of the speculative setup itself, before any sizing (a launch command's
    # --speculative-algorithm EAGLE alone runs with the release's own draft tokens and request cap).
    try:
        spec = resolve_speculative(
            release.modelled,
            algorithm=sizing.speculative_algorithm,
            steps=sizing.speculative_num_steps,
            topk=sizing.speculative_eagle_topk,
            draft_tokens=sizing.speculative_num_draft_tokens,
            max_running_requests=sizing.max_running_requests,
        )
    except FlagError:
        # An algorithm whose setup is not modelled (NGRAM, ...) that the release refuses under PP
        # anyway: the start-up refusal is what the user meets first, and it names the way out. (A setup
        # of the EAGLE family that does not go together is refused as SGLang does, before that check.)
        algorithm = (sizing.speculative_algorithm or "").strip().upper()
        if algorithm and algorithm not in EAGLE_FAMILY and algorithm != "NEXTN":
            check_pp_spec(
                release.modelled,
                pp_size=stages,
                algorithm=algorithm,
                speculative=True,
                pp_spec_env=env_flag(env.get("SGLANG_ENABLE_PP_SPEC")),
                attention_dp=sizing.dp_size > 1,
            )
        raise
    steps, topk = sizing.speculative_num_steps, sizing.speculative_eagle_topk
    if spec.algorithm is not None and steps is None:
        # The release picked all three itself (checker.core.releases.startup.resolve_speculative); up to
        # 0.5.6.post2 the KV pool grows by steps x top-k per request (checker.core.sizing.kv_pool).
        auto = _AUTO_STANDALONE if spec.algorithm == "STANDALONE" else auto_params(release.modelled)
        steps, topk = auto[0], auto[1]
    resolved = {
        "pp_size": stages,
        "mamba_full_memory_ratio": ratio,
        "policy": policy or sizing.policy,
        "speculative_algorithm": spec.algorithm,
        "speculative_num_draft_tokens": spec.draft_tokens,
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "max_running_requests": spec.max_running_requests,
    }
    return CapacityInputs(
        **{**flags, **resolved},
        geometry=geometry,
        budget_gib=budget_gib,
        partition_env=env.get(PARTITION_ENV),
        skip_decode_lock=env_flag(env.get("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK")),
        pp_spec_env=env_flag(env.get("SGLANG_ENABLE_PP_SPEC")),
        spec_note=spec.note,
        allow_longer_context=env_flag(env.get(LONGER_CONTEXT_ENV)),
        # The model the checker's own pieces apply: derived_as, or the newest one standing in for a
        # release it does not model (the label, from ``release``, says which).
        sglang_version=release.derived_as if release.best_effort else release.modelled,
        sglang_best_effort=release.best_effort,
    )


def _check_nextn_target(model: ModelChoice, archs: tuple[str, ...], release: str) -> None:
    """EAGLE/NEXTN from the target's own checkpoint on an architecture no release has a NEXTN/MTP class
    for: one line (checker.families.drafts.check_nextn_family), for a preset as for a config."""
    # start-up: the draft rules (and the weights rules they sit on) load only under EAGLE/NEXTN
    from checker.families.drafts import check_nextn_family

    config = None
    source = model.label
    if model.model_config is not None:
        path = resolve_config_path(model.model_config)
        config, source = read_json(path), shown_path(path)
    check_nextn_family(archs, config, release=release, source=source)


def _shards(model: ModelChoice, tp_size: int) -> bool:
    """Whether the model's state shapes split over ``tp_size`` attention-TP ranks (the way out a refusal
    under PP offers: the same GPUs as TP)."""

    try:
        load_geometry(model=model.model, model_config=model.model_config, tp_size=tp_size)
    except CheckerInputError:
        return False
    return True


def derive_inputs(
    config: DeriveConfig, env: Mapping[str, str], *, policy: str | None = None
) -> CapacityInputs:
    """derive's and plan's inputs (one process derives every stage), as ``config.release``."""
    release = chosen(config)
    return capacity_inputs(
        config.model,
        config.sizing,
        budget_gib=config.budget_gib,
        policy=policy,
        env=env,
        release=release,
        draft=config.weights.draft,
    )


def derive_engines(config: DeriveConfig, inputs: CapacityInputs, env: Mapping[str, str]) -> EngineSet:
    """The engines of ``--engine`` (``sglang`` for a release the checker does not model), prepared for
    ``inputs`` (an ``EngineSet``)."""
    # start-up: the engines and their comparison load only when a command derives
    from checker.engines.drift import prepare_engines

    release = chosen(config)
    return prepare_engines(
        release.engine,
        inputs,
        model_source(config.model, config.sizing),
        env,
        best_effort=config.engine.best_effort,
        release=release,
    )


def derive_rank_weights(
    config: DeriveConfig,
    inputs: CapacityInputs,
    env: Mapping[str, str],
    *,
    required: bool = True,
    flag_gib: tuple[float, ...] = (),
) -> list[RankWeightsFigure]:
    """Every rank's weights figure for this deployment, from the checkpoint beside the model's
    config.json (or that config.json alone) as the release's class holds it (a list of
    RankWeightsFigure; their source is ``none`` without a model directory; ``required``: as
    :func:`checker.families.weights_source.weights_per_rank`). ``flag_gib``: a figure given as a
    number (``--weights-gib``) for every rank, after the draft's
    rules that hold whatever the figure's source (checker.families.weights_source.check_draft_setup)."""
    # start-up: the weights rules and the checkpoint reader load only when a figure is read
    from checker.families.weights_source import weights_per_rank

    release = chosen(config)
    w = config.weights
    layout = w.layout(config.sizing, pp_size=inputs.pp_size, partition_env=env.get(PARTITION_ENV))
    return weights_per_rank(
        flag_gib=flag_gib,
        world_size=layout.world_size,
        model_dir=w.model_dir,
        layout=layout,
        release=release.modelled,
        quantization=w.quantization,
        required=required,
    )
