"""Typed, frozen configuration: built once from argparse at a command's entry (torch-free).

Nothing below the command layer sees an ``argparse.Namespace``: the derivation reads
:class:`SizingFlags` and :class:`ModelChoice`, the process group reads
:class:`~checker.distributed.launch_env.GroupOptions` (defined beside the session), engines
read :class:`EngineChoice`. :class:`SizingFlags` is the table of sizing inputs
(:mod:`checker.core.sizing.server_args`): its field names are SGLang's server-arg names, so the preflight's
inputs (which ranks compare by digest) follow from :data:`SIZING_FLAG_NAMES` and need no list of their own.

Data only: what a derivation runs with (the release, the capacity inputs, the engines, the model as
the sglang engine rebuilds it) is resolved from it in :mod:`checker.preflight.resolve`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from checker.core.errors import CheckerInputError, FlagError, printable
from checker.core.sizing.environ import SGLANG_ENV_VARS
from checker.core.sizing.server_args import (
    SIZING_FLAG_NAMES as SIZING_FLAG_NAMES,  # re-exported with the config
)
from checker.core.sizing.server_args import (
    SizingFlags as SizingFlags,  # re-exported: the config's table of inputs
)
from checker.distributed.launch_env import GroupOptions
from checker.families import DEFAULT_MODEL

if TYPE_CHECKING:
    from collections.abc import Iterator

    from checker.core.releases.releases import ReleaseChoice
    from checker.core.weights.weights import WeightsLayout
    from checker.families.weights_source import RankWeightsFigure
    from checker.launch.merge import GivenFlags, LaunchInputs


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """Which model: a built-in preset or an HF config (file or model directory)."""

    model: str | None = None
    model_config: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelChoice:
        """``--model-config`` as a local path: a hub id is found in the local Hugging Face cache, by the
        launch command's ``--model-path`` rule (:func:`checker.core.weights.hub_cache.local_model_path`)."""
        # start-up: the hub cache rules load only for a --model-config
        from checker.core.weights.hub_cache import local_model_path

        path = args.model_config
        return cls(
            model=args.model,
            model_config=None if path is None else local_model_path(path, flag="--model-config"),
        )

    @property
    def label(self) -> str:
        return self.model_config or self.model or DEFAULT_MODEL  # none named: the default preset


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


@dataclass(frozen=True, kw_only=True)
class WeightsFlags:
    """What a rank's weights figure depends on beyond the layout and the sizing flags: where SGLang reads
    the weights, and the launch command's flags that change what its model class holds."""

    model_dir: str | None = None
    """The directory SGLang loads the weights from (the model's own directory; a hub id's snapshot under
    --download-dir where the launch command gives one); None for a preset or a JSON model spec."""
    looked: str = ""
    """Where no checkpoint was found, in words, for the line that asks for --weights-gib instead."""
    ep_size: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    enable_dp_lm_head: bool = False
    language_model_only: bool = False
    disable_shared_experts_fusion: bool = False
    moe_runner_backend: str = "auto"
    draft_path: str | None = None
    """``--speculative-draft-model-path`` where EAGLE/NEXTN runs a draft (None: the target checkpoint's
    own NEXTN/MTP layer, or no speculative decoding: see :attr:`draft`)."""
    draft: str | None = None
    """``"nextn"``: an EAGLE/NEXTN draft is loaded from the target checkpoint; ``"separate"``: from
    :attr:`draft_path` (checker.core.weights.weights.WeightsLayout.draft); None: no draft."""
    draft_algorithm: str | None = None
    """``--speculative-algorithm`` (upper case) where :attr:`draft` is set."""
    gpu_sm_count: int | None = None
    """``--gpu-sm-count``: the SMs a Marlin workspace is sized for (else a GPU rank's own, else 132)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace, model: ModelChoice) -> WeightsFlags:
        launch = getattr(args, "launch", None)
        given: dict[str, object] = dict(getattr(launch, "weights", {}) or {})
        model_dir, looked = weights_directory(model, launch)
        algorithm = getattr(args, "speculative_algorithm", None)
        draft_path = given.get("speculative_draft_model_path")
        draft_path = None if draft_path is None else str(draft_path)
        if (
            draft_path is not None
            and model_dir is not None
            and os.path.realpath(draft_path) == os.path.realpath(model_dir)
        ):
            draft_path = None  # the target's own checkpoint: its NEXTN/MTP layer
        draft = None
        if isinstance(algorithm, str) and algorithm.upper() in ("EAGLE", "NEXTN"):
            draft = "nextn" if draft_path is None else "separate"
        elif isinstance(algorithm, str) and algorithm.upper() == "EAGLE3" and draft_path is not None:
            draft = "separate"  # an EAGLE3 draft is always its own checkpoint (checker.families.drafts)
        return cls(
            draft_path=draft_path,
            draft=draft,
            draft_algorithm=str(algorithm).upper() if draft is not None else None,
            model_dir=model_dir,
            looked=looked,
            # the launch command's --ep-size, parsed as an int (command.WEIGHTS_DESTS); given holds objects
            ep_size=int(given.get("ep_size", 1)),  # type: ignore[call-overload]
            dtype=str(given.get("dtype", "auto")),
            quantization=None if given.get("quantization") is None else str(given["quantization"]),
            enable_dp_lm_head=bool(given.get("enable_dp_lm_head", False)),
            language_model_only=bool(given.get("language_model_only", False)),
            disable_shared_experts_fusion=bool(given.get("disable_shared_experts_fusion", False)),
            moe_runner_backend=str(given.get("moe_runner_backend", "auto")),
            gpu_sm_count=getattr(args, "gpu_sm_count", None),
        )

    @property
    def no_checkpoint(self) -> str:
        """Why no rank has a checkpoint figure, in words (the model is resolved and holds no shards)."""
        if self.model_dir is not None:
            return f"{self.model_dir} holds no *.safetensors beside its config.json"
        return self.looked or "the model is not a model directory"

    def layout(self, sizing: SizingFlags, *, pp_size: int, partition_env: str | None) -> WeightsLayout:
        """The :class:`checker.core.weights.weights.WeightsLayout` of a deployment."""
        # start-up: the weights rules load only when a weights figure is derived
        from checker.core.weights.weights import WeightsLayout

        return WeightsLayout(
            pp_size=pp_size,
            tp_size=sizing.tp_size,
            dp_size=sizing.dp_size,
            ep_size=self.ep_size,
            partition_env=partition_env,
            enable_dp_lm_head=self.enable_dp_lm_head,
            language_model_only=self.language_model_only,
            dtype=self.dtype,
            disable_shared_experts_fusion=self.disable_shared_experts_fusion,
            moe_runner_backend=self.moe_runner_backend,
            draft=self.draft,
            draft_path=self.draft_path,
            draft_algorithm=self.draft_algorithm,
            gpu_sm_count=self.gpu_sm_count,
        )


def weights_directory(model: ModelChoice, launch: LaunchInputs | None) -> tuple[str | None, str]:
    """Where SGLang's loader reads the weights: the model's directory (beside its config.json), or, for a
    hub id with ``--download-dir``, that cache's snapshot (``snapshot_download(cache_dir=download_dir)``);
    and, where there is none, where it would be, in words."""
    path = model.model_config
    if path is None:
        return None, f"{model.label} is a preset, not a model directory"
    if launch is not None and launch.download_dir:
        # start-up: the hub cache rules load only under --download-dir
        from checker.core.weights.hub_cache import is_hub_id, local_model_path

        raw = next((w for w in _model_path_words(launch.argv)), None)
        if raw is not None and is_hub_id(raw) and not os.path.exists(raw):
            try:
                return local_model_path(raw, revision=launch.revision, cache_dir=launch.download_dir), ""
            except CheckerInputError:  # not downloaded there yet: SGLang would fetch it at start-up
                return None, (
                    f"--download-dir {printable(launch.download_dir)} holds no snapshot of {printable(raw)} "
                    "yet; SGLang downloads it there at start-up"
                )
    if os.path.isdir(path):
        return path, ""
    # a config.json's directory is the model's; any other file (a JSON model spec, a fixture) stands alone
    if os.path.basename(path) == "config.json":
        return os.path.dirname(path) or ".", ""
    return None, f"{model.label} is a model spec, not a model directory"


def _model_path_words(argv: tuple[str, ...]) -> Iterator[str]:
    for i, word in enumerate(argv):
        if word in ("--model-path", "--model") and i + 1 < len(argv):
            yield argv[i + 1]
        elif word.startswith(("--model-path=", "--model=")):
            yield word.split("=", 1)[1]


MISSING_FRACTION = (
    "--budget-from-device needs the server's --mem-fraction-static (in the launch command, or as a flag): "
    "SGLang picks one from the GPU's total memory and the serving mode when it is unset, and this rank has "
    "no GPU to read the total from; add --mem-fraction-static F as the server is started, or "
    "--device-total-gib G (the GPU's total memory) for the release's own default"
)
"""A --budget-from-device without a fraction and without a GPU total (derive --gpu-free-gib refuses the
same): a fraction the checker picked would size a pool the server never has."""


@dataclass(frozen=True, kw_only=True)
class BudgetSource:
    """Where ``total_rest_memory`` comes from: a fixed GiB value, or free device memory."""

    budget_gib: float | None = None
    from_device: bool = False
    mem_fraction_static: float | None = None
    """The server's --mem-fraction-static; unset with ``from_device``, the release's own default from the
    GPU's total memory (``device_total_gib`` or the rank's GPU: checker.core.releases.mem_fraction), never
    assumed."""
    device_total_gib: float | None = None
    """``--device-total-gib``: the GPU's total memory, where the rank cannot read it (a CPU rank)."""
    total_from_device: bool = False
    """The fraction is unset and this rank reads the GPU's total memory as SGLang does."""
    device_free_gib: tuple[float, ...] = ()
    """Free memory to assume instead of measuring it: one value, or one per rank."""
    agree: bool = True
    """MIN over ranks, as SGLang all-reduces free memory (``--no-agree-budget`` turns it off)."""
    weights_gib: tuple[float, ...] = ()
    """``--weights-gib`` (or ``--weights-from-log``): the weights' footprint per rank (one value, or one
    per rank); unset, the checkpoint's figure per rank (``weights``), else none."""
    weights_source: str | None = None
    """Where ``weights_gib`` came from when not typed as ``--weights-gib``: ``--weights-from-log LOG``."""
    weights: WeightsFlags = field(default_factory=WeightsFlags)

    def __post_init__(self) -> None:
        if self.from_device and not self.fraction_known:
            raise FlagError(MISSING_FRACTION)

    @property
    def fraction_known(self) -> bool:
        """A fraction given, or a GPU total to compute the release's default from."""
        given = self.mem_fraction_static is not None or self.device_total_gib is not None
        return given or self.total_from_device

    @property
    def fraction(self) -> float:
        """The server's --mem-fraction-static (with ``from_device``, where it is required)."""
        if self.mem_fraction_static is None:
            raise FlagError(MISSING_FRACTION)
        return self.mem_fraction_static

    @property
    def label(self) -> str:
        if self.from_device:
            agreement = "MIN over ranks" if self.agree else "not agreed"
            fraction = (
                f"--mem-fraction-static {self.mem_fraction_static:g}"
                if self.mem_fraction_static is not None
                else "--mem-fraction-static: the release's default for the GPU"
            )
            return f"device free, {fraction}, {self.weights_label}, {agreement}"
        return "--budget-gib"

    @property
    def weights_label(self) -> str:
        """Where the weights figure of --budget-from-device comes from, in words."""
        # start-up: the checkpoint reader loads only when the weights source is named
        from checker.core.weights.checkpoint import has_safetensors

        if self.weights_gib:
            figures = ",".join(f"{w:g}" for w in self.weights_gib)
            return f"weights {figures} GiB ({self.weights_source or '--weights-gib'})"
        if self.weights.model_dir is not None and has_safetensors(self.weights.model_dir):
            return "weights per rank from the checkpoint"
        if self.weights.model_dir is not None and os.path.isfile(
            os.path.join(self.weights.model_dir, "config.json")
        ):
            return "weights per rank from config.json (no shards)"
        return "no weights figure (no --weights-gib, no model directory: a budget larger than the server's)"


@dataclass(frozen=True, kw_only=True)
class OutputOptions:
    report: str | None = None
    junit: str | None = None
    format: str = "text"
    quiet: bool = False
    plot: str | None = None
    """check --plot: the stage picture the publishing rank (rank 0) writes."""


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
    launch: LaunchInputs | None = None
    """The whole launch command as given and how it was read: rank 0's goes into the report whole."""
    given: GivenFlags | None = None
    """Which sizing inputs the user typed (the rest are defaults): a rank's inputs name only these, so a
    root cause never names a default (None: unknown, every value counts as given)."""


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
    budget_given: bool = False
    """Whether --budget-gib was given (else ``budget_gib`` is the command's default)."""
    output: OutputOptions = field(default_factory=OutputOptions)
    launch_command: str | None = None
    """The launch command's explicit sizing inputs, as read (its parser and release first)."""
    materialize: bool = False
    materialize_device: str = "cpu"
    weights: WeightsFlags = field(default_factory=WeightsFlags)
    """What the model's weights per rank depend on (the checkpoint's directory, the launch flags)."""
    budget_formula: str | None = None
    """derive --gpu-free-gib: how ``budget_gib`` was computed (the release's formula, the weights and
    where they came from)."""
    weights_gib: float | None = None
    """derive --gpu-free-gib: the weights figure the budget assumed (--weights-gib, else the checkpoint's
    busiest rank); the picture of --plot draws it."""
    plot: str | None = None
    """derive --plot: where the stage picture is written (PNG)."""
    weights_figures: tuple[RankWeightsFigure, ...] = ()
    """derive --gpu-free-gib: every rank's weights figure the budget chose its busiest from (the
    checkpoint's), or the one --weights-gib figure for every rank."""
    mem_fraction_static: float | None = None
    """derive --gpu-free-gib: the --mem-fraction-static the budget used."""
    mem_fraction_source: str | None = None
    """Where it came from: ``given`` (the flag or the launch command) or ``release default``."""
    release: ReleaseChoice | None = None
    """The release derived as and who derives it, chosen once for this process (derive and plan run as
    the installed SGLang, like one rank) by :func:`checker.preflight.resolve.with_release` after the
    command's flag checks; None until then, and in the config of ``--sglang-version A,B`` (each release's
    own: :func:`checker.preflight.resolve.as_release`)."""

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, *, default_budget_gib: float, **given: object
    ) -> DeriveConfig:
        """The config of a parsed derive or plan command line; ``given`` sets the fields only one of
        them has (``launch_command``, ``materialize``...)."""
        model = ModelChoice.from_args(args)
        return cls(
            model=model,
            sizing=SizingFlags.from_args(args),
            engine=EngineChoice.from_args(args),
            budget_gib=default_budget_gib if args.budget_gib is None else args.budget_gib,
            budget_given=args.budget_gib is not None,
            output=OutputOptions(format=args.format, quiet=args.quiet),
            weights=WeightsFlags.from_args(args, model),
            **given,  # type: ignore[arg-type]  # each a field's value, named by the caller (from_args' docstring)
        )

    @property
    def budget_source(self) -> str:
        if self.budget_formula is not None:
            return self.budget_formula
        return "--budget-gib" if self.budget_given else "default"

    @property
    def releases(self) -> tuple[str, ...]:
        """The releases of ``--sglang-version A,B[,...]`` (one, or none: a single derivation)."""
        return tuple(v.strip() for v in (self.engine.sglang_version or "").split(",") if v.strip())


IN_TOKENS_ONE_RELEASE = (
    "--target-tokens and --target-requests are searched with the builtin model of one "
    "release: drop --engine and give one --sglang-version (a modelled one)"
)
"""plan in tokens under several releases, or under an engine other than the builtin (which the chosen
release decides: the command checks it once the release is chosen, after the flags above)."""


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """``plan``: the smallest budget for a running-request target, or a partition with a larger pool."""

    derive: DeriveConfig
    """What every derivation of the plan starts from (``derive.sizing.policy``: plan's --policy)."""
    target_max_running_requests: int | None = None
    """The budget search's target (None: --suggest-partition)."""
    partition_slack: int | None = None
    """--suggest-partition: layers a stage may hold beyond the even split (None: the default)."""
    gpu_free_gib: float | None = None
    weights_gib: float | None = None
    """With --gpu-free-gib, the budget found is also given as the --mem-fraction-static that reaches it,
    with these weights on the busiest rank: --weights-gib (or --weights-from-log), else the checkpoint's."""
    weights_source: str | None = None
    """Where ``weights_gib`` came from when not typed: ``--weights-from-log LOG`` (the busiest rank's)."""
    all_policies: bool = False
    """--all-policies: every charging policy, not only the release's own."""
    target_tokens: int | None = None
    """--target-tokens N: the smallest budget at which every stage holds N KV tokens after the MIN."""
    target_requests: int | None = None
    """--target-requests R: ... at which every stage serves R requests of the resolved context length."""

    def __post_init__(self) -> None:
        """Flags that belong to another mode, one line each (the first that applies)."""
        derive = self.derive
        fraction_given = self.gpu_free_gib is not None or self.weights_gib is not None
        if len(derive.releases) > 1:
            if self.suggest_partition:
                raise FlagError(
                    "--sglang-version A,B compares the budget a target needs; use it with "
                    "--target-max-running-requests (or give one release)"
                )
            if derive.engine.engine != "builtin":
                raise FlagError(
                    "--sglang-version A,B compares the builtin models of two releases; drop --engine"
                )
            if len(set(derive.releases)) != len(derive.releases):
                raise FlagError(f"--sglang-version {','.join(derive.releases)} names a release twice")
            if derive.budget_given or self.partition_slack is not None:
                raise FlagError("plan searches the budget: drop --budget-gib and --partition-slack")
        elif self.suggest_partition:
            if fraction_given:
                raise FlagError(
                    "--gpu-free-gib and --weights-gib apply to --target-max-running-requests; drop them"
                )
            if self.all_policies:
                raise FlagError("--all-policies applies to --target-max-running-requests; drop it")
        elif derive.budget_given:
            raise FlagError(
                "--budget-gib has no meaning with --target-max-running-requests: plan searches the budget; "
                "drop it (or use derive at a budget)"
            )
        elif self.partition_slack is not None:
            raise FlagError("--partition-slack only applies to --suggest-partition; drop it")
        if self.weights_gib is not None and self.gpu_free_gib is None:
            raise FlagError(
                "--weights-gib needs --gpu-free-gib (free memory before the weights) to give the "
                "--mem-fraction-static; add it"
            )
        if self.all_policies and derive.sizing.policy is not None:
            raise FlagError("--all-policies and --policy both choose the policies; give one")
        if self.in_tokens and len(derive.releases) > 1:
            raise FlagError(IN_TOKENS_ONE_RELEASE)  # the engine, once the release is chosen (plan)

    @property
    def in_tokens(self) -> bool:
        """--target-tokens or --target-requests (a plan in tokens)."""
        return self.target_tokens is not None or self.target_requests is not None

    @property
    def suggest_partition(self) -> bool:
        return self.target_max_running_requests is None and not self.in_tokens


def sglang_env(env: Mapping[str, str]) -> dict[str, str | None]:
    """The SGLang environment variables a derivation reads, as this process sees them."""
    return {name: env.get(name) for name in SGLANG_ENV_VARS}
