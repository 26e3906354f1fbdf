"""The ``sglang`` engine: the INSTALLED SGLang's own sizing code, run on CPU without a server or weights.

What runs is SGLang's, called exactly as the server calls it; only the objects it reads are stand-ins:

1. **Argument resolution** - a real ``ServerArgs`` (model_path = a temporary folder holding the
   config.json, ``device="cuda"``, the rank's flags) goes through SGLang's own resolution pipeline
   (``ServerArgs.resolve_once``): ``auto`` strategy, the PP overlap-disable pass, page-size default,
   attention-DP widths. On a host without a GPU one platform predicate is a stand-in:
   ``arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer`` answers as on CUDA (the
   deployment's platform), since on CPU SGLang refuses extra_buffer outright.
2. **Published config** - ``runtime_context.create_context(server_args)`` projects the resolved bags;
   ``use_context`` activates them only for the duration of a derivation, so nothing leaks.
3. **Model config and state geometry** - ``ModelConfig`` is built by SGLang from the config.json, and
   ``hybrid_arch.mambaish_config(model_config).mamba2_cache_params`` gives the linear layer ids, state
   shapes and dtypes (inside the published parallel context: attention-TP width from the resolution).
4. **Pool sizing** - the release's three sizing methods, as the real methods of an instance of the
   real class made without its constructor, holding only what they read (:func:`strict_instance`):
   0.5.16+ ``KVCacheConfigurator._handle_max_mamba_cache`` (max-share scale, the three branches, the
   spec-decoding reservation), ``_calculate_mamba_ratio`` (slots per request) and
   ``resolve_max_num_reqs``, on a configurator holding ``model_config``/``mambaish_config``/
   ``hybrid_*_config`` (real SGLang objects), the widths, ``spec_algorithm``,
   ``extra_mamba_cache_bytes_per_req``, ``spec_aux_config``, ``is_hybrid_swa``, ``is_draft_worker``;
   0.5.10-0.5.15 ``ModelRunner.handle_max_mamba_cache``, ``_calculate_mamba_ratio`` and
   ``_resolve_max_num_reqs`` (the KV-cache mixin) on a model runner holding ``server_args``,
   ``model_config``, ``mambaish_config`` (its own property's answer), ``dp_size``, ``spec_algorithm``.
   **Strict stand-ins**: reading anything a stand-in does not hold raises :class:`StandInRead` (not an
   AttributeError, so ``getattr(x, name, default)`` and ``hasattr`` cannot answer for the release): a
   release that sizes from a new input fails in one line naming it, never with a silent default. That
   is what lets a release newer than the newest modelled one run here by default.
   ``stage_per_req`` and the max-share scale are read from the method's own frame when it returns (it
   computes them as locals and does not return them).
5. **Stage slice** - ``distributed.utils.get_pp_indices`` with the rank's SGLANG_PP_LAYER_PARTITION.

Not callable standalone, so reproduced here (each one says where the SGLang code lives):

* ``pp_max_micro_batch_size`` - inlined in ``Scheduler.__init__`` (``managers/scheduler.py`` 1237-1243,
  after ``tp_worker.get_worker_info()``): ``max(max_running_requests // pp_size, 1)`` unless set. The
  expression is applied to SGLang's own max_running_requests and resolved pp values, and the installed
  scheduler source is checked to still contain it (otherwise: an error, not a guess).
* The "no memory left for the KV pool" check after the state pool - inlined in
  ``_profile_available_bytes`` (which measures the device): ``rest <= 0`` is an error.
* The KV token pool is sized by the release's own code from the bytes its state-pool sizing left (the
  profile, which measures the device, is replaced by that remainder, as for the state pool): 0.5.11+ the
  pool configurator (``create_memory_pool_configurator(...).calculate_pool_sizes``, the cell from the
  stage's full-attention layers, ``--kv-cache-dtype`` as ``configure_kv_cache_dtype`` resolves it), then
  ``_apply_token_constraints`` (``--max-total-tokens``, page alignment) and, after the MIN, 0.5.16+
  ``config_from_budget``; 0.5.10 ``get_cell_size_per_token`` and ``_resolve_token_capacity``. The
  all-reduce MIN over the world group is answered without a process group: with this stage's own
  capacity first, then with the MIN of every stage's (each sized the same way). ``resolve_max_num_reqs``
  runs on the pool after the MIN. ``--token-capacity`` replaces the profile, as in the builtin. A preset
  or JSON model spec has no config.json: its attention facts (KV heads, head dims, MLA dims, full-
  attention layer ids) stand in for the carrier config's where the cell reads them
  (``_CheckerModelConfig``, and the pool configurator's ``mambaish_config`` lookup).
* Spec decoding: ``spec_algorithm`` is a stand-in (EAGLE) when ``--speculative-num-draft-tokens`` is
  set; resolving a real draft setup would need a draft model. SGLang's sizing only asks whether spec
  decoding is on and reads D from the resolved spec config.
* Startup validation that runs after argument resolution (``ServerArgs.check_server_args``, called by
  ``entrypoints/engine.py``) is not run: it needs a real speculative setup. Its refusals of the inputs
  the checker reads are made before either engine runs (:mod:`checker.core.releases.startup`, in
  ``CapacityInputs``: speculative decoding and mixed chunking under PP), with the rules of the modelled
  release (the newest one for a release the checker does not model).
* Whether the installed release STARTS the model's class under PP is read from that class's own code
  (:meth:`SglangEngine.check_pipeline`, :mod:`checker.engines.model_code`), the rule
  :mod:`checker.core.releases.pp_support` holds for the modelled releases.
* Presets and JSON model specs have no config.json: their layer ids, shapes and dtypes are the
  checker's, packed into an object whose ``mamba_cache_per_req`` is SGLang's own property
  (``BaseLinearStateParams``); the resolution runs on a Qwen3-Next config.json with the same layer
  count and context length (every supported family resolves the strategy the same way).

The checker's own parts, before SGLang runs: input validation (``CapacityInputs``: a value the checker
refuses never reaches SGLang), and ``--mamba-ssm-dtype`` spelling (``bf16`` is passed as ``bfloat16``:
SGLang's own flag has argparse choices, so no deployment runs another spelling). Only ``--policy
max-share`` exists in SGLang; the other policies are the checker's what-ifs.

Releases (0.5.10 to 0.5.23 and any later one; each adapter is a feature test on the installed code, not
a version switch, so a later release takes the newest path it still matches, and anything it reads that
the checker does not hold is a StandInRead):

* where the sizing lives: ``mem_cache/kv_cache_configurator.py`` (0.5.16+) or ModelRunner's KV-cache
  mixin (``model_executor/model_runner_kv_cache_mixin.py``, 0.5.10-0.5.15). 0.5.9 and older compute the
  slots per request and the request cap inline in ``init_memory_pool`` (which allocates the pools) and
  ``ModelRunner.__init__``: not callable, so not supported (the builtin models them).
* argument resolution: 0.5.19+ ``ServerArgs.resolve_once()``; 0.5.10-0.5.18 resolve in
  ``ServerArgs.__post_init__`` (construction). The strategy flag is ``mamba_scheduler_strategy`` up to
  0.5.13.post1. Attention DP: ``attn_dp_size`` (0.5.22+) or
  ``enable_dp_attention`` + ``dp_size`` (before). Model config: ``arg_groups.overrides.model_config_of``
  (0.5.19+) or ``ModelConfig.from_server_args``.
* extra-buffer platform predicate (CPU stand-in): ``mamba_hook._platform_supports_mamba_cache_extra_buffer``
  (0.5.22+), ``mamba_hook.get_platform`` inside ``validate_mamba_extra_buffer`` (0.5.19-0.5.21),
  ``server_args.is_cuda`` inside ``ServerArgs._validate_mamba_extra_buffer`` (0.5.15-0.5.18) or
  ``ServerArgs._handle_mamba_radix_cache`` (0.5.10-0.5.14).
* published config: ``runtime_context.create_context``/``use_context`` (0.5.22+); before, the single
  process-wide context, ``publish(server_args, role=...)`` (0.5.17-0.5.21) or
  ``get_context().set_server_args`` (0.5.16). Where ``get_parallel()`` reads live process groups
  (0.5.16-0.5.18) the widths go in through its ``override`` hook. 0.5.10-0.5.15 publish nothing the
  sizing reads: the model configs' ``mamba2_cache_params`` read the attention-TP width from
  ``layers.dp_attention.get_attention_tp_size``, answered with the resolved width.
* ``KVCacheConfigurator`` fields: ``ps`` (a ParallelState: pp_size, attn_dp_size) up to 0.5.20, plain
  ``pp_size``/``attn_dp_size`` from 0.5.21; ``server_args`` (0.5.16-0.5.17); ``hybrid_kda_config``
  (0.5.21+); ``extra_mamba_cache_bytes_per_req`` (0.5.22+).
* where K is written: the schedule bag via ``get_context().override`` (0.5.17+),
  ``server_args.override`` (0.5.16) or a plain ``server_args`` attribute (0.5.10-0.5.15). Up to 0.5.16
  every stage is charged the whole model (no ``pp_layer_scale`` local) and no padding slot; whether the
  padding slot is charged is read from the remainder SGLang returns.
* the scheduler's micro-batch rule reads ``self.pp_size`` (0.5.10-0.5.12), ``self.ps.pp_size``
  (0.5.13-0.5.20), ``get_parallel().pp_size`` after.

Process hygiene: the env vars SGLang's import sets (kernel-cache folders) are taken back out, the rank's
SGLANG_* vars are set only while SGLang runs, and what SGLang's resolution writes to the environment
(``--mamba-ssm-dtype`` -> SGLANG_MAMBA_SSM_DTYPE) is replayed in every later call, as in a server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import re
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checker.core.errors import BudgetError, CheckerInputError, ConfigError, FlagError, LayoutError
from checker.core.releases.model_support import pipeline_refusal
from checker.core.releases.releases import MODELLED_RELEASES, release_key
from checker.core.sizing.attention import AttentionGeometry
from checker.core.sizing.environ import SGLANG_ENV_VARS
from checker.core.sizing.geometry import canonical_dtype
from checker.core.sizing.models import read_json
from checker.core.sizing.sizing import CapacityInputs, StageCapacity
from checker.engines import ModelSource, model_code, quiet_sglang
from checker.engines.errors import (
    IMPORT_FAILURES,
    SGLANG_CHANGED,
    SGLANG_REFUSES,
    SglangChanged,
    SglangUnavailable,
    StandInRead,
    sglang_changed,
)
from checker.families.geometry import model_architectures

FIRST_SUPPORTED = "0.5.10"
"""The first release whose three sizing steps (pool size, slots per request, request cap) are methods the
engine can call: 0.5.9 computes the last two inline in ``init_memory_pool`` (which allocates the pools)
and ``ModelRunner.__init__``, so running them would mean re-typing them (the builtin model, not SGLang's
code). Every later release runs, a release newer than the newest modelled one included (strict
stand-ins: see :class:`StandInRead`)."""
SUPPORTED_VERSIONS = MODELLED_RELEASES[MODELLED_RELEASES.index(FIRST_SUPPORTED) :]
"""The modelled releases whose own code the engine runs (and any later release, modelled or not)."""
SUPPORTED_RANGE = f"{FIRST_SUPPORTED} and later"
INSTALL_HINT = (
    "run where the deployment's SGLang is installed, or build a CPU environment with "
    f"scripts/sglang_cpu_env.sh (sglang {SUPPORTED_RANGE}, --no-deps, plus its few import-time packages)"
)
ENGINE_FLAG = "--engine sglang/both"
"""Who asked for SGLang's code, in messages (unless the release did: one the checker does not model)."""
# Env vars the derivation reads; set from the rank's env for the duration of a derivation only.
ENGINE_ENV = SGLANG_ENV_VARS
GIB = 1 << 30
# The pp_max_micro_batch_size rule as the scheduler writes it (see module docstring).
# 0.5.10-0.5.12 spell the pp size ``self.pp_size``, 0.5.13-0.5.20 ``self.ps.pp_size``, 0.5.21+
# ``get_parallel().pp_size``.
MICRO_BATCH_RULE = re.compile(
    r"max\(\s*self\.max_running_requests\s*//\s*(?:get_parallel\(\)\.|self\.ps\.|self\.)pp_size\s*,\s*1\s*\)"
)
# KVCacheConfigurator override sources -> the branch letters (A: --max-mamba-cache-size, B: radix off +
# --max-running-requests, C: auto-fit) of KVCacheConfigurator._handle_max_mamba_cache
# (sglang/srt/mem_cache/kv_cache_configurator.py).
BRANCHES = {
    "mamba_pool.per_dp_shard": "A",
    "mamba_pool.from_max_running_requests": "B",
    "mamba_pool.memory_budget": "C",
    "mamba_pool.memory_budget_spec": "C",
}


def _stand_in_read(owner: str, name: str, version: str | None, detail: str = "") -> StandInRead:
    return StandInRead(
        f"SGLang {version or '?'}'s sizing code reads {owner}.{name}{detail}, an input the checker does not "
        "know (its stand-in holds only what the modelled releases read); this release sizes from something "
        "new: run a checker that knows it, or report the release and this line"
    )


def strict_instance(cls: type, values: dict[str, Any], *, version: str | None) -> Any:
    """An instance of SGLang's ``cls`` made without its constructor that holds ``values`` only.

    Methods, properties and class constants of ``cls`` work as usual (they are SGLang's code); reading a
    dataclass field or an attribute that is not in ``values`` raises :class:`StandInRead`, even through
    ``getattr(obj, name, default)`` or ``hasattr``. What SGLang's code writes to the instance is kept
    (it is read back, e.g. a pool size written as an attribute).
    """
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    held = dict(values)
    owner = cls.__name__

    def __getattribute__(self: Any, name: str) -> Any:
        if name in held:
            return held[name]
        if name.startswith("__") or name not in fields:
            try:
                return object.__getattribute__(self, name)  # methods, properties, class constants
            except AttributeError as exc:
                if name.startswith("__"):
                    raise
                raise _stand_in_read(owner, name, version, f" ({exc})" if str(exc) else "") from None
        raise _stand_in_read(owner, name, version)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        held[name] = value

    strict = type(
        f"Strict{owner}", (cls,), {"__getattribute__": __getattribute__, "__setattr__": __setattr__}
    )
    return object.__new__(strict)


class _StandIn:
    """The engine's own stand-ins: an attribute they do not define is :class:`StandInRead`."""

    _owner = "a stand-in"
    _version: str | None = None

    def __getattr__(self, name: str) -> Any:  # only reached when normal lookup fails
        if name.startswith("__"):
            raise AttributeError(name)  # Python protocols (copy, pickle) probe dunders
        raise _stand_in_read(self._owner, name, self._version)


def installed_version() -> str | None:
    """The installed SGLang's version from its metadata, without importing it (None: not installed)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version(version: str | None, *, best_effort: bool, reason: str = ENGINE_FLAG) -> str:
    """The installed release, if the engine runs its code: every release from FIRST_SUPPORTED on, a
    release newer than the newest modelled one included. ``reason``: who asked (for the message)."""
    if version is None:
        raise SglangUnavailable(
            f"SGLang is not installed in this Python ({sys.executable}), and {reason} runs its code; "
            f"{INSTALL_HINT}"
        )
    try:
        older = release_key(version) < release_key(FIRST_SUPPORTED)
    except CheckerInputError:
        older = True  # no release number: nothing says its code is one the engine can drive
    if older and not best_effort:
        raise SglangUnavailable(
            f"{reason}: installed SGLang {version} is not a supported version (supported: "
            f"{SUPPORTED_RANGE}); install one of those, or pass --sglang-best-effort to try its code anyway"
        )
    return version


@contextlib.contextmanager
def _process_env(env: Mapping[str, str], written: dict[str, str | None]) -> Iterator[None]:
    """The rank's SGLang env vars in os.environ while SGLang runs; the whole environ restored after.

    SGLang reads these through os.environ (``envs.X.get()``, ``os.getenv``), and its resolution WRITES
    some (``--mamba-ssm-dtype`` becomes SGLANG_MAMBA_SSM_DTYPE, read later by the state dtype): what it
    wrote is recorded in ``written`` and replayed in every later scope, as in the server's process.
    """
    saved = dict(os.environ)
    for key in ENGINE_ENV:
        if env.get(key) is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = env[key]
    for key, value in written.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    before = dict(os.environ)
    try:
        yield
    finally:
        after = dict(os.environ)
        for key in before.keys() | after.keys():
            if before.get(key) != after.get(key):
                written[key] = after.get(key)
        os.environ.clear()
        os.environ.update(saved)


def _optional_module(name: str) -> types.ModuleType | None:
    """A module some releases do not have (``None`` then); any other import failure propagates."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise  # something it imports is missing: a broken install, not an older release
        return None  # the module, or its package (sglang.srt.arg_groups before 0.5.13), is not there


def _import_api() -> types.SimpleNamespace:
    """Import exactly the SGLang pieces the engine calls; a failure names the missing module.

    SGLang's import sets kernel-cache env vars (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, ...) for a
    server process; this process is not one, so they are taken back out. Pieces only some supported
    releases have are ``None`` in the others (see "Releases" in the module docstring). Where the three
    sizing methods live decides the ``host``: ``configurator`` (0.5.16+, ``KVCacheConfigurator``) or
    ``runner`` (0.5.10-0.5.15, ``ModelRunner``'s KV-cache mixin).
    """
    saved = dict(os.environ)
    try:
        with quiet_sglang():
            server_args = importlib.import_module("sglang.srt.server_args")
            dist_utils = importlib.import_module("sglang.srt.distributed.utils")
            mamba_utils = importlib.import_module("sglang.srt.configs.mamba_utils")
            model_config = importlib.import_module("sglang.srt.configs.model_config")
            spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
            runtime = _optional_module("sglang.srt.runtime_context")  # 0.5.15+
            hybrid_arch = _optional_module("sglang.srt.configs.hybrid_arch")  # 0.5.16+
            kv = _optional_module("sglang.srt.mem_cache.kv_cache_configurator")  # 0.5.16+
            mamba_hook = _optional_module("sglang.srt.arg_groups.mamba_hook")  # 0.5.19+
            overrides = _optional_module("sglang.srt.arg_groups.overrides")
            runner = dp_attention = None
            if kv is None:  # 0.5.10-0.5.15: the sizing methods are ModelRunner's
                runner = importlib.import_module("sglang.srt.model_executor.model_runner")
                dp_attention = importlib.import_module("sglang.srt.layers.dp_attention")
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise SglangUnavailable(
            f"SGLang is installed but does not import here (missing {missing!r}); {INSTALL_HINT}"
        ) from None
    except IMPORT_FAILURES as exc:
        # A module that raises while it imports (a broken install, or a dependency of another release
        # than the one it pins): one line naming what it raised, never a traceback.
        raise SglangUnavailable(
            f"importing SGLang failed ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        ) from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
    ServerArgs = server_args.ServerArgs
    if kv is not None:
        host, host_cls = "configurator", kv.KVCacheConfigurator
        methods = ("_handle_max_mamba_cache", "_calculate_mamba_ratio", "resolve_max_num_reqs")
    else:
        assert runner is not None  # imported above where the configurator module is not there
        host, host_cls = "runner", runner.ModelRunner
        methods = ("handle_max_mamba_cache", "_calculate_mamba_ratio", "_resolve_max_num_reqs")
    missing_methods = [m for m in methods if not callable(getattr(host_cls, m, None))]
    if missing_methods:
        raise SglangChanged(
            f"this SGLang's {host_cls.__name__} has no {', '.join(missing_methods)}: its pool sizing is not "
            f"where the engine calls it (supported: {SUPPORTED_RANGE})"
        )
    return types.SimpleNamespace(
        server_args_module=server_args,
        mamba_hook=mamba_hook,
        ServerArgs=ServerArgs,
        server_arg_fields=frozenset(inspect.signature(ServerArgs).parameters),
        resolution_result=getattr(overrides, "resolution_result", None),  # 0.5.19+
        model_config_of=getattr(overrides, "model_config_of", None),  # 0.5.19+
        ModelConfig=model_config.ModelConfig,
        AttentionArch=model_config.AttentionArch,
        runtime=runtime if kv is not None else None,  # the runner host reads no published context
        get_pp_indices=dist_utils.get_pp_indices,
        mambaish_config=getattr(hybrid_arch, "mambaish_config", None),  # 0.5.16+ (else a runner property)
        hybrid_gdn_config=getattr(hybrid_arch, "hybrid_gdn_config", None),
        hybrid_kda_config=getattr(hybrid_arch, "hybrid_kda_config", None),  # 0.5.21+
        BaseLinearStateParams=mamba_utils.BaseLinearStateParams,
        Mamba2StateDType=mamba_utils.Mamba2StateDType,
        host=host,
        host_cls=host_cls,
        pool_method=methods[0],
        ratio_method=methods[1],
        requests_method=methods[2],
        configurator_fields=frozenset(f.name for f in dataclasses.fields(host_cls))
        if dataclasses.is_dataclass(host_cls)
        else frozenset(),
        runner_module=runner,
        dp_attention=dp_attention,
        pp_local_per_request_bytes=getattr(kv, "_pp_local_per_request_bytes", None),  # 0.5.19+
        SpeculativeAlgorithm=spec_info.SpeculativeAlgorithm,
        get_platform=getattr(runtime, "get_platform", None),  # 0.5.19+
    )


def _check_micro_batch_rule() -> None:
    """The one rule we cannot call: make sure the installed scheduler still says what we apply."""
    spec = importlib.util.find_spec("sglang.srt.managers.scheduler")
    text = Path(spec.origin).read_text() if spec and spec.origin else ""
    if not MICRO_BATCH_RULE.search(text):
        raise SglangChanged(
            "--engine sglang/both: the installed SGLang's scheduler no longer derives "
            "pp_max_micro_batch_size as max(max_running_requests // pp_size, 1); this checker cannot "
            "model it"
        )


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


class _CudaPlatform:
    """The real platform object, except that it says CUDA (0.5.19-0.5.21's extra-buffer check)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    is_cuda = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _ParallelState(_StandIn):
    """``KVCacheConfigurator.ps`` (0.5.16-0.5.20): the two widths the sizing reads, nothing else."""

    _owner = "KVCacheConfigurator.ps"

    def __init__(self, pp_size: int, attn_dp_size: int, version: str | None) -> None:
        self.pp_size, self.attn_dp_size, self._version = pp_size, attn_dp_size, version


class SglangEngine:
    name = "sglang"

    def __init__(self, *, best_effort: bool = False, reason: str = ENGINE_FLAG) -> None:
        self.version: str | None = check_version(installed_version(), best_effort=best_effort, reason=reason)
        self.reason = reason
        try:
            self.api = _import_api()
        except SglangUnavailable as exc:  # say who asked for SGLang's code: a flag, or the release itself
            raise SglangUnavailable(f"{reason}: {exc}") from None
        _check_micro_batch_rule()
        self._platform_is_gpu = self._detect_gpu_platform()

    @property
    def policy(self) -> str:
        """The charging the installed release's sizing code does: max-share where its pool sizing
        computes ``pp_layer_scale`` (0.5.17+), whole-model before."""
        code = getattr(self.api.host_cls, self.api.pool_method).__code__
        return "max-share" if "pp_layer_scale" in code.co_varnames else "whole-model"

    def _detect_gpu_platform(self) -> bool:
        """Whether this host is a GPU platform SGLang keeps the extra-buffer strategy on (then nothing
        stands in for its answer): 0.5.19+ ``runtime_context.get_platform()``'s flags (the object
        ``mamba_hook`` asks); 0.5.10-0.5.18 the ``is_cuda()`` their ``ServerArgs`` asks."""
        get_platform = self.api.get_platform
        where = "runtime_context.get_platform()" if get_platform is not None else "server_args.is_cuda()"
        try:
            if get_platform is not None:
                p = get_platform()
                return bool(p.is_cuda or p.is_hip or p.is_musa or p.is_npu or p.is_xpu)
            is_cuda = getattr(self.api.server_args_module, "is_cuda", None)
            return bool(is_cuda()) if is_cuda is not None else False
        except SGLANG_CHANGED as exc:
            raise sglang_changed(self.version, where, exc) from None

    @contextlib.contextmanager
    def _gpu_platform(self) -> Iterator[None]:
        """On a CPU host, answer SGLang's extra-buffer platform question as the deployment's GPU would.

        Only that one predicate, wherever the release asks it (see "Releases" in the module docstring):
        0.5.22+ ``mamba_hook._platform_supports_mamba_cache_extra_buffer``; 0.5.19-0.5.21 the
        ``get_platform()`` that ``mamba_hook.validate_mamba_extra_buffer`` reads; 0.5.15-0.5.18 the
        ``is_cuda()`` that ``ServerArgs._validate_mamba_extra_buffer`` reads, 0.5.10-0.5.14 the one
        ``ServerArgs._handle_mamba_radix_cache`` reads (during that call only).
        """
        if self._platform_is_gpu:
            yield
            return
        hook = self.api.mamba_hook
        with contextlib.ExitStack() as stack:
            if hook is not None and hasattr(hook, "_platform_supports_mamba_cache_extra_buffer"):
                stack.enter_context(
                    _patched(hook, "_platform_supports_mamba_cache_extra_buffer", lambda: True)
                )
            elif hook is not None and hasattr(hook, "get_platform"):
                real = hook.get_platform
                stack.enter_context(_patched(hook, "get_platform", lambda: _CudaPlatform(real())))
            else:
                cls, module = self.api.ServerArgs, self.api.server_args_module
                name = next(
                    (
                        n
                        for n in ("_validate_mamba_extra_buffer", "_handle_mamba_radix_cache")
                        if n in cls.__dict__
                    ),
                    None,
                )
                if name is not None and hasattr(module, "is_cuda"):
                    validate = cls.__dict__[name]

                    def on_cuda(*args: Any, **kwargs: Any) -> Any:
                        with _patched(module, "is_cuda", lambda: True):
                            return validate(*args, **kwargs)

                    stack.enter_context(_patched(cls, name, on_cuda))
            yield

    def prepare(self, inputs: CapacityInputs, source: ModelSource, env: Mapping[str, str]) -> PreparedSglang:
        policy = self.policy
        if inputs.policy not in (None, policy):
            raise FlagError(
                f"SGLang {self.version}'s own code derives here ({self.reason}), and it charges {policy} "
                f"only; --policy {inputs.policy} is a checker what-if (use --engine builtin for it)"
            )
        self.check_pipeline(inputs, source)
        env = dict(env)
        # The slices follow the inputs (plan compares partitions by changing them), like the builtin's.
        env.pop("SGLANG_PP_LAYER_PARTITION", None)
        if inputs.partition_env is not None:
            env["SGLANG_PP_LAYER_PARTITION"] = inputs.partition_env
        return PreparedSglang(self, inputs, source, env)

    def check_pipeline(self, inputs: CapacityInputs, source: ModelSource) -> None:
        """Under pp > 1: whether the INSTALLED release starts the class its registry picks for the model,
        read from that class's own code (:mod:`checker.engines.model_code`: its constructor's asserts and
        layer builder, ``forward``'s ``pp_proxy_tensors``, ``load_weights``), the same rule the table of
        modelled releases holds (:func:`checker.core.releases.model_support.check_pipeline`): a release newer
        than
        the modelled ones is judged by its own code. Nothing is imported: the files are read."""
        if inputs.pp_size <= 1:
            return

        archs = model_architectures(model=source.model, model_config=source.model_config)
        spec = importlib.util.find_spec("sglang")
        if not archs or spec is None or not spec.submodule_search_locations:
            return  # a JSON model spec names no class (the release rules hold it to the coarse answer)
        root = Path(next(iter(spec.submodule_search_locations))).parent
        arch, module = next(
            ((a, m) for a in archs if (m := model_code.entry_module(a, root)) is not None), (None, None)
        )
        if arch is None or module is None:
            return  # no class of the release's own: check_architectures' question, not this one
        entry, runner = _installed_pipeline_status(root, arch, module)
        if entry is None:
            raise FlagError(
                f"SGLang {self.version}: the checker cannot tell from {module.removeprefix('sglang/srt/')} "
                f"whether {arch} builds only its own layers on each pipeline stage (no make_layers / "
                "make_pp_layers in its constructor); run it at --pp-size 1, or report it"
            )
        if entry[0] != "stages":
            raise pipeline_refusal(
                str(self.version),
                arch,
                entry,
                runner=str(runner) if runner else None,
                pp_size=inputs.pp_size,
                tp_group_size=inputs.tp_group_size,
            )


@functools.lru_cache(maxsize=64)
def _installed_pipeline_status(
    root: Path, arch: str, module: str
) -> tuple[tuple[str, str, str] | None, model_code.Where | None]:
    """(:func:`model_code.pipeline_status`, the model runner's assert) of ``arch`` in the installed
    release under ``root``. Cached per process: the files it imported do not change under it, and
    reading a class parses every module its constructor reaches, which a budget search or a plan
    (one prepare per candidate) would otherwise repeat."""

    def installed(path: str) -> str | None:
        f = root / path
        return f.read_text(encoding="utf-8", errors="replace") if f.is_file() else None

    reading = model_code.read_class(arch, module, installed)
    runner = model_code.model_runner_assert(installed)
    return (model_code.pipeline_status(reading, runner) if reading is not None else None), runner


# ------------------------------------------------------------------------------------------------------
# The model: a config.json SGLang builds everything from, or the checker's geometry for presets/specs
# ------------------------------------------------------------------------------------------------------


def _carrier_config(inputs: CapacityInputs) -> dict[str, Any]:
    """A Qwen3-Next config.json with the preset's layer count: drives only SGLang's argument resolution."""
    g = inputs.geometry
    cfg: dict[str, Any] = {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "num_hidden_layers": g.num_hidden_layers,
        "full_attention_interval": 4,
    }
    ctx = inputs.context_len or g.context_len
    if ctx:
        cfg["max_position_embeddings"] = ctx
    if g.attention is not None:  # what --kv-cache-dtype auto resolves to (ModelConfig.dtype)
        cfg["torch_dtype"] = g.attention.dtype
    return cfg


class _Shape(_StandIn):
    """A preset's per-rank state shapes, as SGLang's ``mamba_cache_per_req`` reads them."""

    _owner = "mamba2_cache_params.shape"

    def __init__(self, conv: list[tuple[int, ...]], temporal: tuple[int, ...], version: str | None) -> None:
        self.conv, self.temporal, self._version = conv, temporal, version


class _CheckerStateParams(_StandIn):
    """The checker's geometry with SGLang's own ``mamba_cache_per_req`` arithmetic (presets, specs)."""

    _owner = "mamba2_cache_params"

    def __init__(self, api: types.SimpleNamespace, inputs: CapacityInputs, version: str | None) -> None:
        import torch  # torch: SGLang imports it anyway, but only once the engine is driven

        g = inputs.geometry
        self._version = version
        self.layers = list(g.linear_layer_ids)
        self.shape = _Shape([tuple(s) for s in g.conv_shapes], tuple(g.temporal_shape), version)
        self.dtype = api.Mamba2StateDType(
            conv=getattr(torch, g.conv_dtype), temporal=getattr(torch, g.temporal_dtype)
        )
        # SGLang's property body (an int of bytes)
        self._per_req: Callable[[_CheckerStateParams], int] = (
            api.BaseLinearStateParams.mamba_cache_per_req.fget
        )

    @property
    def mamba_cache_per_req(self) -> int:
        return self._per_req(self)


class _CheckerMambaConfig(_StandIn):
    """Stand-in for a model config class: only ``mamba2_cache_params`` is read by the sizing."""

    _owner = "mambaish_config"

    def __init__(self, params: _CheckerStateParams, attention: AttentionGeometry | None) -> None:
        self.mamba2_cache_params = params
        self._version = params._version
        # The layers a stage's KV cell counts (the family config classes' ``full_attention_layer_ids``).
        self.full_attention_layer_ids = list(attention.full_attention_layer_ids) if attention else []


class _CheckerModelConfig:
    """A preset's or JSON model spec's attention facts in the place SGLang's KV cell reads them: the
    carrier ``ModelConfig`` (SGLang's own, for everything else) with the checker's KV heads, head dims,
    MLA latent dims and attention arch. SGLang's own ``get_num_kv_heads`` runs on it."""

    def __init__(self, real: Any, attention: AttentionGeometry, arch: Any) -> None:
        self._real = real
        self.attention_arch = arch.MLA if attention.mla else arch.MHA
        self.num_key_value_heads = attention.num_kv_heads
        self.head_dim = attention.head_dim
        self.v_head_dim = attention.v_head_dim
        self.kv_lora_rank = attention.kv_lora_rank
        self.qk_rope_head_dim = attention.qk_rope_head_dim
        self.full_attention_layer_ids = list(attention.full_attention_layer_ids)
        self._kv_heads = attention.num_kv_heads

    def get_total_num_kv_heads(self) -> int:
        return self._kv_heads

    def get_num_kv_heads(self, *args: Any, **kwargs: Any) -> int:
        return int(type(self._real).get_num_kv_heads(self, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._real, name)


def _map_error(phase: str, exc: BaseException) -> CheckerInputError:
    """SGLang's own refusal, as one line naming the phase (which says what the user should change)."""
    text = " ".join(str(exc).split())
    if not text:  # a bare ``assert``: the failing SGLang line is the message
        import traceback  # only for a bare assert's message: the module loads it for nothing else

        tb = traceback.extract_tb(exc.__traceback__)
        if tb:
            last = tb[-1]
            where = last.filename.split("site-packages/")[-1]
            text = f"{(last.line or '').strip()} ({where}:{last.lineno})"
    cls = {"config": ConfigError, "layout": LayoutError, "resolve": FlagError, "pool": BudgetError}[phase]
    what = {
        "config": "rejects the model config",
        "layout": "rejects the layer partition",
        "resolve": "rejects the flags",
        "pool": "cannot size the state pool",
    }[phase]
    return cls(f"SGLang {what}: {type(exc).__name__}: {text}")


@contextlib.contextmanager
def _sglang_call(
    phase: str, where: str, version: str | None, *, asserts: str | None = None
) -> Iterator[None]:
    """SGLang's code running for ``phase``: what it raises on the inputs (:data:`SGLANG_REFUSES`) is the
    phase's input error (:func:`_map_error`; a bare ``assert`` is ``asserts``' where given); what a call
    raises because the code is not what the engine was written against (:data:`SGLANG_CHANGED`) is
    :class:`SglangChanged` naming ``where``. The checker's own errors (a strict stand-in's) pass."""
    try:
        yield
    except CheckerInputError:
        raise
    except AssertionError as exc:
        raise _map_error(asserts or phase, exc) from None
    except SGLANG_REFUSES as exc:
        raise _map_error(phase, exc) from None
    except SGLANG_CHANGED as exc:
        raise sglang_changed(version, where, exc) from None


@dataclass
class _Frame:
    """Locals of ``_handle_max_mamba_cache`` captured when it returns or raises."""

    values: dict[str, Any]


@contextlib.contextmanager
def _capture_locals(code: types.CodeType) -> Iterator[_Frame]:
    """Read a function's locals at its return, via the profiler hook (no change to its code)."""
    frame = _Frame({})
    previous = sys.getprofile()

    def hook(f: types.FrameType, event: str, arg: Any) -> None:
        if event == "return" and f.f_code is code:
            frame.values = dict(f.f_locals)

    sys.setprofile(hook)
    try:
        yield frame
    finally:
        sys.setprofile(previous)


class PreparedSglang:
    """One rank's inputs resolved by SGLang once; :meth:`derive` is cheap (a budget search re-uses it)."""

    def __init__(
        self, engine: SglangEngine, inputs: CapacityInputs, source: ModelSource, env: dict[str, str]
    ) -> None:
        self.engine, self.api, self.inputs, self.env = engine, engine.api, inputs, env
        self.version = engine.version
        self.written_env: dict[str, str | None] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="checker-sglang-")
        hf = self._hf_config(source)
        self.from_config = hf is not None
        Path(self._tmp.name, "config.json").write_text(json.dumps(hf or _carrier_config(inputs)))
        rt = self.api.runtime
        self._parallel_widths: dict[str, int] | None = None
        self.context: Any = None  # SGLang's runtime context (0.5.16+; untyped there); None before
        with self._scope(activate=False):
            self.server_args = self._resolve(source)
            with _sglang_call("resolve", "publishing the resolved config (runtime_context)", self.version):
                if rt is None:  # 0.5.10-0.5.15: the sizing reads the ServerArgs itself
                    pass
                elif hasattr(rt, "create_context"):  # 0.5.22+: a context of our own
                    self.context = rt.create_context(self.server_args, role="scheduler")
                else:  # 0.5.16-0.5.21: the one process-wide context, published in _activate
                    self.context = rt.get_context()
                    self._publish()
        with self._scope():
            self._parallel_widths = self._widths_if_unpublished()
        with self._scope():
            self._build_model()
        with self._scope():
            self._kv_setup()
        self._own_cache: dict[float, list[_OwnStage | CheckerInputError]] = {}

    # -- scopes ------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _scope(self, *, activate: bool = True) -> Iterator[None]:
        with quiet_sglang(), _process_env(self.env, self.written_env), self.engine._gpu_platform():
            if not activate:
                yield
                return
            with self._activate():
                yield

    def _publish(self) -> None:
        rt = self.api.runtime
        if hasattr(rt, "publish"):  # 0.5.17-0.5.21
            rt.publish(self.server_args, role="scheduler")
        else:  # 0.5.16
            self.context.set_server_args(self.server_args)

    @contextlib.contextmanager
    def _activate(self) -> Iterator[None]:
        """Our resolved configuration as the one SGLang's code reads while it runs.

        0.5.22+: ``use_context`` swaps our own context in. 0.5.16-0.5.21 have one process-wide context:
        ours is (re)published when another derivation's is in it. Releases whose ``get_parallel()``
        reads live process groups (none exist here) get the resolved widths through its own
        ``override`` hook (``_parallel_widths``, set by :meth:`_widths_if_unpublished`). 0.5.10-0.5.15
        (the runner host) publish nothing: their model configs read the attention-TP width from
        ``layers.dp_attention.get_attention_tp_size``, answered with the resolved width.
        """
        rt = self.api.runtime
        if rt is None:
            widths = self._parallel_widths
            if widths is None or self.api.dp_attention is None:
                yield
                return
            width = widths["attn_tp_size"]
            with contextlib.ExitStack() as stack:
                # The KV cell reads it through the names the mixin and the pool configurator imported.
                for name in (
                    "",
                    ".model_executor.model_runner_kv_cache_mixin",
                    ".model_executor.pool_configurator",
                ):
                    module = self.api.dp_attention if not name else sys.modules.get("sglang.srt" + name)
                    if module is not None and hasattr(module, "get_attention_tp_size"):
                        stack.enter_context(_patched(module, "get_attention_tp_size", lambda: width))
                yield
            return
        if hasattr(rt, "use_context"):
            with rt.use_context(self.context):
                yield
            return
        if getattr(self.context, "_server_args", None) is not self.server_args:
            self._publish()
        if self._parallel_widths is None:
            yield
            return
        with rt.get_parallel().override(**self._parallel_widths):
            yield

    # -- building ----------------------------------------------------------------------------------------

    @staticmethod
    def _hf_config(source: ModelSource) -> dict[str, Any] | None:
        if source.model_config is None:
            return None
        data = read_json(source.model_config)
        return None if "linear_layer_ids" in data else data

    def _resolve(self, source: ModelSource) -> Any:  # the release's ServerArgs (untyped there)
        i = self.inputs
        fields = self.api.server_arg_fields
        # The strategy flag's name up to 0.5.13.post1 is --mamba-scheduler-strategy.
        strategy = next(n for n in ("mamba_radix_cache_strategy", "mamba_scheduler_strategy") if n in fields)
        kwargs: dict[str, Any] = dict(
            model_path=self._tmp.name,
            device="cuda",  # the deployment's device; nothing is allocated
            skip_tokenizer_init=True,
            tp_size=i.tp_size * i.dp_size,  # the checker's tp is the attention-TP width
            pp_size=i.pp_size,
            page_size=i.page_size,
            disable_radix_cache=i.disable_radix_cache,
            disable_overlap_schedule=i.disable_overlap_schedule,
            max_running_requests=i.max_running_requests,
            max_mamba_cache_size=i.max_mamba_cache_size,
            speculative_num_draft_tokens=i.speculative_num_draft_tokens,
            pp_max_micro_batch_size=i.pp_max_micro_batch_size,
            context_length=i.context_len,
            kv_cache_dtype=i.kv_cache_dtype,
            max_total_tokens=i.max_total_tokens,
        )
        kwargs[strategy] = i.mamba_radix_cache_strategy
        if not source.release_default_ratio:  # not given: the release's own ServerArgs default decides
            kwargs["mamba_full_memory_ratio"] = i.mamba_full_memory_ratio
        if "attn_dp_size" in fields:  # 0.5.22+
            kwargs["attn_dp_size"] = i.dp_size
        elif i.dp_size > 1:  # 0.5.10-0.5.21: DP attention is a switch plus --dp-size
            kwargs.update(enable_dp_attention=True, dp_size=i.dp_size)
        if i.enable_linear_replayssm_spec:  # the ReplaySSM ring (0.5.16: --enable-gdn-replayssm-spec)
            name = (
                "enable_linear_replayssm_spec"
                if "enable_linear_replayssm_spec" in fields
                else "enable_gdn_replayssm_spec"
            )
            kwargs[name] = True
        if i.linear_replayssm_cache_len is not None:
            kwargs["linear_replayssm_cache_len"] = i.linear_replayssm_cache_len
        if source.mamba_ssm_dtype is not None:
            # The checker's flag takes short spellings (bf16); SGLang's own flag would refuse them in
            # argparse, so what a deployment can run is the canonical name.
            kwargs["mamba_ssm_dtype"] = canonical_dtype(source.mamba_ssm_dtype, source="--mamba-ssm-dtype")
        unknown = sorted(k for k in kwargs if k not in fields)
        if unknown:  # a release that renamed or dropped a flag the sizing needs: not a silent default
            raise SglangChanged(
                f"SGLang {self.version}'s ServerArgs has no {', '.join(unknown)}: the flags the checker "
                "derives from are not this release's"
            )
        with _sglang_call("resolve", "ServerArgs(...) and its resolution", self.version):
            server_args = self.api.ServerArgs(**kwargs)  # 0.5.10-0.5.18 resolve here (__post_init__)
            if hasattr(server_args, "resolve_once"):  # 0.5.19+
                server_args.resolve_once()
        return server_args

    def _widths_if_unpublished(self) -> dict[str, int] | None:
        """None when ``get_parallel()`` serves the widths from the published config (0.5.19+).

        0.5.10-0.5.18 read them from live process groups (none here): the widths as their resolution
        defines them instead, attention DP only with --enable-dp-attention, attention TP = tp / dp.
        """
        rt = self.api.runtime
        if rt is not None:
            try:
                int(rt.get_parallel().attn_tp_size)
                return None
            except AssertionError as exc:
                # 0.5.16-0.5.18: "attention tensor model parallel group is not initialized" (the live
                # group); any other assert is not the one this adapter answers.
                if "not initialized" not in str(exc):
                    raise sglang_changed(
                        self.version, "runtime_context.get_parallel().attn_tp_size", exc
                    ) from None
            except SGLANG_CHANGED as exc:
                raise sglang_changed(
                    self.version, "runtime_context.get_parallel().attn_tp_size", exc
                ) from None
        sa = self.server_args
        attn_dp = int(sa.dp_size) if getattr(sa, "enable_dp_attention", False) else 1
        return dict(
            pp_size=int(sa.pp_size),
            tp_size=int(sa.tp_size),
            attn_tp_size=int(sa.tp_size) // attn_dp,
            attn_dp_size=attn_dp,
        )

    def _model_config(self) -> Any:
        api = self.api
        if api.model_config_of is not None:  # 0.5.19+
            return api.model_config_of(self.server_args)
        return api.ModelConfig.from_server_args(self.server_args)

    def _build_model(self) -> None:
        api = self.api
        where = f"the model config and its {api.host_cls.__name__} (mamba2_cache_params)"
        with _sglang_call("config", where, self.version):
            self.model_config = self._model_config()
            if api.host == "runner":
                self._build_runner()
            else:
                self._build_configurator()
            self.params = self.mamba.mamba2_cache_params  # reads the attention-TP width

    def _checker_mamba(self) -> _CheckerMambaConfig:
        params = _CheckerStateParams(self.api, self.inputs, self.version)
        return _CheckerMambaConfig(params, self.inputs.geometry.attention)

    def _spec_algorithm(self) -> Any:
        algo = self.api.SpeculativeAlgorithm
        return algo.EAGLE if self.draft_tokens else algo.NONE

    def _build_runner(self) -> None:
        """0.5.10-0.5.15: a ``ModelRunner`` holding what its KV-cache mixin's sizing methods read."""
        sa = self.server_args
        self.pp_size = int(sa.pp_size)
        self.attn_dp_size = int(sa.dp_size) if getattr(sa, "enable_dp_attention", False) else 1
        self.user_micro = sa.pp_max_micro_batch_size
        self.draft_tokens = sa.speculative_num_draft_tokens
        held: dict[str, Any] = dict(
            server_args=sa,
            model_config=self.model_config,
            # ModelRunner.__init__: ``self.dp_size = server_args.dp_size if enable_dp_attention else 1``
            dp_size=self.attn_dp_size,
            spec_algorithm=self._spec_algorithm(),
            is_draft_worker=False,
        )
        unset = getattr(self.api.runner_module, "_UNSET", None)
        if unset is not None:  # 0.5.15: the linear-attention registry's "not looked up yet"
            held["_linear_attn_registry_cache"] = unset
        runner = strict_instance(self.api.host_cls, held, version=self.version)
        if self.from_config:
            mamba = runner.mambaish_config  # ModelRunner's own property, on SGLang's config classes
            if mamba is None:
                raise ValueError("SGLang does not treat this model as a hybrid (mamba-ish) model")
        else:
            mamba = self._checker_mamba()
        runner.mambaish_config = mamba  # held from now on: the property is not re-run
        self.mamba = mamba
        self._held = {**held, "mambaish_config": mamba}
        self.host = runner

    def _build_configurator(self) -> None:
        """0.5.16+: a ``KVCacheConfigurator`` holding what its three sizing methods read."""
        api = self.api
        mamba = api.mambaish_config(self.model_config)
        if mamba is None:
            raise ValueError("SGLang does not treat this model as a hybrid (mamba-ish) model")
        if not self.from_config:
            mamba = self._checker_mamba()
        self.mamba = mamba
        rt = api.runtime
        sa = self.server_args
        parallel = rt.get_parallel()
        self.pp_size = int(parallel.pp_size)
        self.attn_dp_size = int(parallel.attn_dp_size)
        self.user_micro = getattr(parallel, "pp_max_micro_batch_size", None)
        if self.user_micro is None:  # 0.5.16-0.5.18: a server arg, not a parallel leaf
            self.user_micro = sa.pp_max_micro_batch_size
        spec = rt.get_spec() if hasattr(rt, "get_spec") else sa  # the spec bag is 0.5.17+
        self.draft_tokens = spec.speculative_num_draft_tokens
        cls = api.host_cls
        fields = api.configurator_fields
        held: dict[str, Any] = dict(
            model_config=self.model_config,
            mambaish_config=mamba,
            hybrid_gdn_config=api.hybrid_gdn_config(self.model_config) if self.from_config else None,
            spec_algorithm=self._spec_algorithm(),
            spec_aux_config=None,
            is_hybrid_swa=bool(self.model_config.is_hybrid_swa),
            is_draft_worker=False,
        )
        if "hybrid_kda_config" in fields:  # 0.5.21+
            held["hybrid_kda_config"] = api.hybrid_kda_config(self.model_config) if self.from_config else None
        if "pp_size" in fields:  # 0.5.21+
            held.update(pp_size=self.pp_size, attn_dp_size=self.attn_dp_size)
        else:  # 0.5.16-0.5.20 read both through a ParallelState
            held["ps"] = _ParallelState(self.pp_size, self.attn_dp_size, self.version)
        if "server_args" in fields:  # 0.5.16-0.5.17 read some flags from it directly
            held["server_args"] = sa
        if "extra_mamba_cache_bytes_per_req" in fields:  # 0.5.22+
            held["extra_mamba_cache_bytes_per_req"] = (
                self.inputs.geometry.extra_per_slot_bytes
                if not self.from_config
                else _field_default(cls, "extra_mamba_cache_bytes_per_req")
            )
        # The real class, made without its constructor; only the fields its sizing methods read are held.
        self._held = held
        self.host = strict_instance(cls, held, version=self.version)

    # -- deriving ----------------------------------------------------------------------------------------

    def derive(self, pp_rank: int, budget_gib: float | None = None) -> StageCapacity:
        """Stage ``pp_rank`` after SGLang's MIN of every stage's own KV pool: each stage's own capacity
        from the release's pool configurator, then its own ``_apply_token_constraints`` (the all-reduce
        answered with the MIN of the stages' own capacities) and ``resolve_max_num_reqs`` on what that
        leaves (a stage that cannot size its own pools is left out of the MIN: its ranks report why)."""
        rest = self.inputs.budget_gib if budget_gib is None else budget_gib
        stages = self._own_cache.get(rest)
        if stages is None:
            stages = []
            for k in range(self.pp_size):
                try:
                    stages.append(self._own(k, rest))
                except CheckerInputError as exc:
                    stages.append(exc)
            self._own_cache = {rest: stages}
        mine = stages[pp_rank]
        if isinstance(mine, CheckerInputError):
            raise mine
        minimum = min(s.stage.kv_own_tokens for s in stages if isinstance(s, _OwnStage))
        with self._scope(), self._pool_size(mine.stage.max_mamba_cache_size):
            where = f"the KV pool after the MIN and {self.api.host_cls.__name__}.{self.api.requests_method}"
            with _sglang_call("pool", where, self.version, asserts="resolve"):
                T = self._after_min(mine, minimum)
                if T <= 0:
                    raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
                n = int(getattr(self.host, self.api.requests_method)(T))
        s = mine.stage
        micro = self.user_micro or max(n // self.pp_size, 1)
        idle = (s.kv_own_tokens - T) * s.kv_cell_bytes if s.kv_cell_bytes and s.kv_own_tokens >= T else 0
        return dataclasses.replace(
            s,
            max_total_num_tokens=T,
            max_running_requests=n,
            pp_max_micro_batch_size=int(micro),
            kv_idle_bytes=idle,
            kv_limiting=self.pp_size > 1 and s.kv_own_tokens == minimum,
        )

    def _own(self, pp_rank: int, rest: float) -> _OwnStage:
        """Stage ``pp_rank``'s state pool and its own KV capacity, by the release's code."""
        api, c = self.api, self.host
        L = int(self.model_config.num_hidden_layers)
        with self._scope():
            with _sglang_call("layout", "distributed.utils.get_pp_indices", self.version):
                start, end = api.get_pp_indices(L, pp_rank, self.pp_size)
            # SGLang writes K into the published config (or the ServerArgs); it is put back afterwards
            # so the next derivation (another stage, another budget) starts from the user's value.
            with self._pool_size_slot() as (read_k, new_sources):
                handle = getattr(api.host_cls, api.pool_method)
                where = (
                    f"{api.host_cls.__name__}.{api.pool_method}, {api.ratio_method} and the stage's KV pool"
                )
                with _sglang_call("pool", where, self.version, asserts="resolve"):
                    with _capture_locals(handle.__code__) as frame:
                        kv_left = getattr(c, api.pool_method)(rest)
                    K = int(read_k())
                    ratio = int(getattr(c, api.ratio_method)())
                    if kv_left <= 0:  # _profile_available_bytes refuses this next (see docstring)
                        raise RuntimeError(
                            f"the state pool leaves {kv_left:.3f} GB for the KV cache (rest <= 0)"
                        )
                    kv = self._own_kv(start, end, pp_rank, kv_left)
                sources = new_sources()
        loc = frame.values
        branch = next((BRANCHES[s] for s in reversed(sources) if s in BRANCHES), None) or self._branch(loc)
        layers = list(self.params.layers)
        per_req = int(self.params.mamba_cache_per_req)
        stage_layers = sum(1 for x in layers if start <= x < end)
        if "stage_per_req" in loc:  # 0.5.17+: max-share, computed as locals
            spr, max_stage, scale = (
                int(loc["stage_per_req"]),
                int(loc["max_stage_mamba_layers"]),
                float(loc["pp_layer_scale"]),
            )
        else:  # up to 0.5.16 every stage is charged the whole model's state
            spr, max_stage, scale = per_req, len(layers), 1.0
        # Only the spec-decoding paths bind the reservation taken from ``rest`` (``intermediate_size``;
        # 0.5.10-0.5.12 ``mamba_state_intermediate_size``).
        intermediate = 0
        if self.draft_tokens:
            intermediate = int(loc.get("intermediate_size", loc.get("mamba_state_intermediate_size", 0)))
        per_layer = per_req // len(layers) if layers else 0
        # What rides on every slot beside the state: 0.5.22+ ``extra_per_slot``; the ReplaySSM ring per
        # slot, 0.5.20-0.5.21 ``replayssm_ring_per_slot``, 0.5.17-0.5.19 ``replayssm_ring_per_req``.
        extra = int(
            loc.get(
                "extra_per_slot", loc.get("replayssm_ring_per_slot", loc.get("replayssm_ring_per_req", 0))
            )
        )
        fixed = int(loc.get("replayssm_fixed_bytes", 0))  # the GDN ring charged once (0.5.20+)
        # How many slots SGLang took off the budget for the state pool: K, or K + 1 where the release
        # charges the pool's padding slot (0.5.17+), read from its own returned remainder.
        charged = ((rest - intermediate / GIB - kv_left) * GIB - fixed) / (spr + extra)
        stage = StageCapacity(
            pp_rank=pp_rank,
            start_layer=int(start),
            end_layer=int(end),
            stage_linear_layers=stage_layers,
            max_stage_linear_layers=max_stage,
            total_linear_layers=len(layers),
            scale=scale,
            per_req_bytes=per_req,
            stage_per_req_bytes=spr,
            extra_per_slot_bytes=extra,
            padding_slot_charged=round(charged) == K + 1,
            slots_per_request=ratio,
            own_state_bytes_per_slot=int(api.pp_local_per_request_bytes(per_req, layers, start, end))
            if api.pp_local_per_request_bytes is not None and layers and per_req % len(layers) == 0
            else per_layer * stage_layers,
            branch=branch,
            replayssm_fixed_bytes=fixed,
            replayssm_active=bool(loc.get("replayssm_active", False)),
            max_mamba_cache_size=K,
            intermediate_state_bytes=intermediate,
            kv_budget_gib=float(kv_left),
            max_running_requests=0,
            pp_max_micro_batch_size=0,
            context_len=int(self.model_config.context_len),
            kv_attention_layers=kv.layers,
            kv_cell_bytes=kv.cell,
            kv_available_bytes=kv.available,
            kv_profiled_tokens=kv.profiled,
            kv_estimate_tokens=kv.profiled,
            kv_own_tokens=kv.own,
        )
        return _OwnStage(stage=stage, kv=kv)

    # -- the KV token pool ---------------------------------------------------------------------------------

    def _kv_setup(self) -> None:
        """What every stage's KV pool reads besides its layers: the KV element type as the release's own
        ``configure_kv_cache_dtype`` resolves it (mem_cache/kv_cache_dtype.py, 0.5.16+; the ModelRunner
        method before), the MLA switch (``use_mla_backend``), the
        draft's layers, and whether the model class has a ``start_layer`` (else every stage counts the
        whole model: ``getattr(model, "start_layer", 0)``)."""
        self._pool_module = _optional_module("sglang.srt.model_executor.pool_configurator")  # 0.5.11+
        attention = self.inputs.geometry.attention
        self.kv_model_config = self.model_config
        if not self.from_config and attention is not None:
            self.kv_model_config = _CheckerModelConfig(self.model_config, attention, self.api.AttentionArch)
        mc = self.kv_model_config
        self.use_mla_backend = str(getattr(mc.attention_arch, "name", mc.attention_arch)) == "MLA"
        given = self._server_arg("kv_cache_dtype")
        dtype_module = _optional_module("sglang.srt.mem_cache.kv_cache_dtype")  # 0.5.16+
        with _sglang_call("resolve", "configure_kv_cache_dtype", self.version):
            if dtype_module is not None and hasattr(dtype_module, "configure_kv_cache_dtype"):
                resolved, self.kv_cache_dtype = dtype_module.configure_kv_cache_dtype(
                    server_args_kv_cache_dtype=given,
                    model=None,
                    model_dtype=mc.dtype,
                    is_draft_worker=False,
                    is_dflash=False,
                    speculative_draft_attention_backend=None,
                )
                self.kv_cache_dtype_str = resolved if resolved is not None else given
            else:  # 0.5.10-0.5.15: the runner's own method, on the runner the sizing already holds
                runner = strict_instance(
                    self.api.host_cls,
                    dict(server_args=self.server_args, model=_NoQuantModel(self.version), dtype=mc.dtype),
                    version=self.version,
                )
                runner.configure_kv_cache_dtype()
                self.kv_cache_dtype = runner.kv_cache_dtype
                self.kv_cache_dtype_str = given
        self.own_stage = self._class_has_start_layer()

    def _server_arg(self, name: str) -> Any:
        """A flag as the release's resolution left it (0.5.19+ keep resolved values apart)."""
        r = self.api.resolution_result
        return r(self.server_args, name, None) if r is not None else getattr(self.server_args, name)

    def _class_has_start_layer(self) -> bool:
        """Read from the installed class's own code (checker.engines.model_code): a preset or a JSON model
        spec names no class, and counts its own stage."""
        if not self.from_config:
            return True
        archs = list(getattr(self.model_config.hf_config, "architectures", None) or [])
        spec = importlib.util.find_spec("sglang")
        if not archs or spec is None or not spec.submodule_search_locations:
            return True
        root = Path(next(iter(spec.submodule_search_locations))).parent

        def installed(path: str) -> str | None:
            f = root / path
            return f.read_text(encoding="utf-8", errors="replace") if f.is_file() else None

        module = model_code.entry_module(archs[0], root)
        if module is None:
            return True
        return model_code.stage_range_attribute(archs[0], module, installed) is not None

    def _stage_range(self, start: int, end: int) -> tuple[int, int]:
        """The layers the stage's KV cell counts: its own, or the whole model's (see :meth:`_kv_setup`)."""
        if self.own_stage:
            return start, end
        return 0, int(self.model_config.num_hidden_layers)

    def _kv_host(self, start: int, end: int) -> Any:
        """The sizing host again, holding the stage's layer range and KV type: a ``KVCacheConfigurator``
        (0.5.16+) or a ``ModelRunner`` (0.5.10-0.5.15)."""
        lo, hi = self._stage_range(start, end)
        held = dict(self._held, model_config=self.kv_model_config)
        kv = dict(kv_cache_dtype=self.kv_cache_dtype, use_mla_backend=self.use_mla_backend)
        if self.api.host == "configurator":
            fields = self.api.configurator_fields
            held.update(kv)
            held["layer_info"] = _LayerInfo(lo, hi, self.version)
            if "kv_cache_dtype_str" in fields:
                held["kv_cache_dtype_str"] = self.kv_cache_dtype_str
            if "spec_aux_config" in fields:
                held["spec_aux_config"] = self._spec_aux()
            if "server_args" in fields:
                held["server_args"] = self.server_args
            if "page_size" in fields:
                held["page_size"] = int(self.server_args.page_size)
            if "model_dtype" in fields:
                held["model_dtype"] = self.model_config.dtype
            return strict_instance(self.api.host_cls, held, version=self.version)
        held.update(
            kv, start_layer=lo, end_layer=hi, num_effective_layers=hi - lo, eagle_draft_num_layers=None
        )
        held.update(
            dflash_draft_num_layers=None, pp_size=self.pp_size, page_size=int(self.server_args.page_size)
        )
        # ModelRunner.__init__: ``self.is_hybrid_swa = model_config.is_hybrid_swa`` (the 0.5.11-0.5.15
        # pool configurator factory picks the hybrid-SWA configurator on it)
        held["is_hybrid_swa"] = bool(self.model_config.is_hybrid_swa)
        return strict_instance(self.api.host_cls, held, version=self.version)

    def _spec_aux(self) -> Any:
        """``spec_aux_config``: the release's own resolution where it has one (0.5.16+), for a
        speculative setup; its defaults otherwise (no draft layers)."""
        module = _optional_module("sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state")
        if module is None:
            return None
        if not self.draft_tokens:
            return module.SpecAuxHiddenStateConfig()
        return module.resolve_spec_aux_hidden_state_config(
            server_args=self.server_args,
            model_config=self.model_config,
            spec_algorithm=self._spec_algorithm(),
            is_draft_worker=False,
        )

    def _own_kv(self, start: int, end: int, pp_rank: int, kv_left: float) -> _Kv:
        """The stage's own KV capacity by the release's code: its pool configurator's
        ``calculate_pool_sizes`` on the bytes the state pool left (0.5.11+; 0.5.10: its
        ``get_cell_size_per_token`` over the stage's full-attention layers), then its own token
        constraints (--max-total-tokens, page alignment) with the MIN over stages answered by this
        stage alone. --token-capacity replaces the profile, as the builtin does."""
        try:
            return self._own_kv_sized(start, end, kv_left)
        except ZeroDivisionError as exc:
            # Up to 0.5.16 a stage with no full-attention layer divides by its 0-byte KV cell.
            raise LayoutError(
                f"SGLang rejects the layer partition: stage {pp_rank} ([{start}, {end})) holds no "
                f"full-attention layer, so its KV cell is 0 bytes and SGLang {self.version} divides by it "
                f"(ZeroDivisionError: {exc})"
            ) from None

    def _own_kv_sized(self, start: int, end: int, kv_left: float) -> _Kv:
        i = self.inputs
        available = int(kv_left * (1 << 30))
        host = self._kv_host(start, end)
        page = int(self.server_args.page_size)
        with self._world_min(host, None):
            if self._pool_module is not None:
                pool = self._pool_module.create_memory_pool_configurator(host)
                cell = int(pool._cell_size)
                if i.token_capacity is not None:
                    aligned = int(
                        pool.calculate_pool_sizes_from_max_tokens(i.token_capacity, page).max_total_num_tokens
                    )
                else:
                    aligned = int(pool.calculate_pool_sizes(available, page).max_total_num_tokens)
                own = int(host._apply_token_constraints(aligned))
                profiled = (
                    i.token_capacity
                    if i.token_capacity is not None
                    else (available // cell if cell else aligned)
                )
                return _Kv(
                    host=host,
                    pool=pool,
                    cell=cell,
                    available=available,
                    profiled=profiled,
                    aligned=aligned,
                    own=own,
                    layers=self._layers(start, end),
                )
            layers = self._layers(start, end)
            cell = int(host.get_cell_size_per_token(layers))
            profiled = i.token_capacity if i.token_capacity is not None else available // cell
            own = int(host._resolve_token_capacity(profiled))
            return _Kv(
                host=host,
                pool=None,
                cell=cell,
                available=available,
                profiled=profiled,
                aligned=own,
                own=own,
                layers=layers,
            )

    def _layers(self, start: int, end: int) -> int:
        lo, hi = self._stage_range(start, end)
        return sum(1 for x in self.mamba.full_attention_layer_ids if lo <= x < hi)

    def _after_min(self, mine: _OwnStage, minimum: int) -> int:
        """The stage's pool after the MIN: the release's own constraints again, the all-reduce answering
        ``minimum`` (0.5.16+ ``config_from_budget``; 0.5.11-0.5.15 ``_apply_token_constraints`` and the
        pool's re-alignment; 0.5.10 ``_resolve_token_capacity``)."""
        kv = mine.kv
        page = int(self.server_args.page_size)
        with self._world_min(kv.host, minimum):
            if kv.pool is None:
                return int(kv.host._resolve_token_capacity(kv.profiled))
            if self.api.host == "configurator" and self.inputs.token_capacity is None:
                return int(kv.host.config_from_budget(kv.available).max_total_num_tokens)
            T = int(kv.host._apply_token_constraints(kv.aligned))
            if T != kv.aligned:
                T = int(kv.pool.calculate_pool_sizes_from_max_tokens(T, page).max_total_num_tokens)
            return T

    @contextlib.contextmanager
    def _world_min(self, host: Any, minimum: int | None) -> Iterator[None]:
        """SGLang's all-reduce MIN over the world group, answered without a process group: with
        ``minimum`` (every stage's own capacity, MINed), or by this stage alone (None). The world group
        it names is a stand-in (``get_world_group()`` / ``get_parallel().world_group``)."""
        import torch  # torch: SGLang imports it anyway, but only once the engine is driven

        def all_reduce(tensor: Any, op: Any = None, group: Any = None, **_: Any) -> None:
            if minimum is not None:
                tensor.fill_(min(int(tensor.item()), minimum))

        names = ("_apply_token_constraints", "_resolve_token_capacity", "config_from_budget")
        scopes = [getattr(type(host), n).__globals__ for n in names if callable(getattr(type(host), n, None))]
        with contextlib.ExitStack() as stack:
            stack.enter_context(_patched(torch.distributed, "all_reduce", all_reduce))
            pool = self._pool_module
            if not self.from_config and pool is not None and hasattr(pool, "mambaish_config"):
                # 0.5.16+ pool configurators look the model's hybrid config up from the model config
                # (the carrier's, for a preset): the checker's layer ids stand in, as for the state pool.
                stack.enter_context(_patched(pool, "mambaish_config", lambda _mc: self.mamba))
            for g in {id(x): x for x in scopes}.values():
                if "get_world_group" in g:
                    stack.enter_context(_patched_global(g, "get_world_group", lambda: _WORLD))
                if "get_parallel" in g:
                    real = g["get_parallel"]
                    stack.enter_context(
                        _patched_global(g, "get_parallel", lambda real=real: _Parallel(real()))
                    )
            yield

    @contextlib.contextmanager
    def _pool_size(self, K: int) -> Iterator[None]:
        """The stage's K where the release's request cap reads it (the published schedule bag, 0.5.17+;
        the ServerArgs before), for the duration of one resolution."""
        rt = self.api.runtime
        if rt is not None and hasattr(rt, "get_schedule"):
            with rt.get_schedule().override(max_mamba_cache_size=K):
                yield
            return
        sa = self.server_args
        saved = sa.max_mamba_cache_size
        object.__setattr__(sa, "max_mamba_cache_size", K)
        try:
            yield
        finally:
            object.__setattr__(sa, "max_mamba_cache_size", saved)

    def _branch(self, loc: dict[str, Any]) -> str:
        """The branch the runner host's pool sizing took (it logs no override source): the auto-fit
        branch binds the memory budget as a local; of the explicit ones, A is --max-mamba-cache-size."""
        if any(k in loc for k in ("mamba_budget", "mamba_state_memory_raw", "mamba_budget_bytes")):
            return "C"
        return "A" if self.inputs.max_mamba_cache_size is not None else "B"

    @contextlib.contextmanager
    def _pool_size_slot(self) -> Iterator[tuple[Any, Any]]:
        """Where SGLang writes K, read back and restored: (read K, override sources written since).

        0.5.17+: the published schedule bag (``get_context().override``, logged in ``overrides_log``);
        0.5.16: the ``ServerArgs`` itself (``server_args.override``, logged in its declaration stash
        ``_resolved_overrides`` or ``_runtime_mutations``); 0.5.10-0.5.15: the ``ServerArgs`` attribute,
        assigned (no log).
        """
        rt = self.api.runtime
        if rt is not None and hasattr(rt, "get_schedule"):
            schedule = rt.get_schedule()
            with schedule.override(max_mamba_cache_size=schedule.max_mamba_cache_size):
                before = len(self.context.overrides_log())
                yield (
                    lambda: schedule.max_mamba_cache_size,
                    lambda: [s for s, _ in self.context.overrides_log()[before:]],
                )
            return
        sa = self.server_args
        logs = ("_resolved_overrides", "_runtime_mutations")
        saved = sa.max_mamba_cache_size
        lengths = {name: len(getattr(sa, name, None) or ()) for name in logs}
        written: list[str] = []

        def sources() -> list[str]:
            for name in logs:
                written.extend(src for src, _ in (getattr(sa, name, None) or ())[lengths[name] :])
            return written

        try:
            yield (lambda: sa.max_mamba_cache_size, sources)
        finally:
            object.__setattr__(sa, "max_mamba_cache_size", saved)
            for name in logs:
                if getattr(sa, name, None) is not None:
                    del getattr(sa, name)[lengths[name] :]

    def describe(self) -> dict[str, object]:
        """What SGLang resolved (for reports): the values a user would otherwise have to guess."""
        sa = self.server_args
        r = self.api.resolution_result or (lambda args, name, default: getattr(args, name, default))
        p = self.params
        strategy = r(sa, "mamba_radix_cache_strategy", None) or r(sa, "mamba_scheduler_strategy", None)
        return {
            "sglang_version": self.engine.version,
            "geometry_from": "sglang config class" if self.from_config else "checker (preset/spec)",
            "platform_stand_in": not self.engine._platform_is_gpu,
            "mamba_radix_cache_strategy": strategy,
            "disable_overlap_schedule": r(sa, "disable_overlap_schedule", None),
            "page_size": r(sa, "page_size", None),
            "num_hidden_layers": int(self.model_config.num_hidden_layers),
            "num_linear_layers": len(p.layers),
            "conv_shapes": [list(s) for s in p.shape.conv],
            "temporal_shape": list(p.shape.temporal),
            "conv_dtype": str(p.dtype.conv).removeprefix("torch."),
            "temporal_dtype": str(p.dtype.temporal).removeprefix("torch."),
            "per_req_bytes": int(p.mamba_cache_per_req),
        }


@dataclass(frozen=True)
class _Kv:
    """One stage's own KV pool as the release's code sized it, and the objects that sized it."""

    host: Any
    pool: Any
    cell: int
    available: int
    profiled: int
    aligned: int
    own: int
    layers: int


@dataclass(frozen=True)
class _OwnStage:
    stage: StageCapacity
    kv: _Kv


class _LayerInfo(_StandIn):
    """``layer_info`` (0.5.16+): the stage's layer range, as ``resolve_layer_indices`` gives it."""

    _owner = "KVCacheConfigurator.layer_info"

    def __init__(self, start: int, end: int, version: str | None) -> None:
        self.start_layer, self.end_layer, self._version = start, end, version
        self.num_effective_layers = end - start
        self.swa_attention_layer_ids = None
        self.full_attention_layer_ids = None
        self.is_hybrid_swa_mtp_draft = False


class _NoQuantModel(_StandIn):
    """The model ``configure_kv_cache_dtype`` asks for its quantization (an FP8 KV checkpoint): none."""

    _owner = "ModelRunner.model"

    def __init__(self, version: str | None) -> None:
        self.quant_config = None
        self._version = version


class _WorldGroup:
    """The world group SGLang's MIN names: nothing reduces over it here (see ``_world_min``)."""

    cpu_group = None
    world_size = 1


_WORLD = _WorldGroup()


class _Parallel:
    """``get_parallel()`` with the world group the MIN names; everything else is the real bag's."""

    def __init__(self, real: Any) -> None:
        self._real = real

    @property
    def world_group(self) -> _WorldGroup:
        return _WORLD

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def _patched_global(scope: dict[str, Any], name: str, value: Any) -> Iterator[None]:
    original = scope[name]
    scope[name] = value
    try:
        yield
    finally:
        scope[name] = original


def _field_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.default
    raise AttributeError(name)
