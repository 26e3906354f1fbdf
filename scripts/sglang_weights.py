"""Each rank's weights as SGLang's own model class holds them: the class built on the meta device, on CPU.

Run with a release's CPU environment (scripts/sglang_cpu_env.sh builds them):

    PYTHONPATH=scripts/sglang_stubs:$HOME/.cache/pp-checker/sglang-cpu/releases/0.5.23 \\
        $HOME/.cache/pp-checker/sglang-cpu/venv/bin/python scripts/sglang_weights.py \\
        --config tests/fixtures/qwen3_5_397b_a17b.json --layout pp=2,tp=4 --layout pp=1,tp=8,dp=2

For every rank of every layout it builds the release's model class exactly as the loader does
(``model_loader/loader.py``: ``_initialize_model`` under ``set_default_torch_dtype(model_config.dtype)``
and the target device, here ``meta``), after SGLang itself has worked out the rank's place: a real
``ServerArgs`` resolved by the release's own pipeline, published with the rank's world rank so the
release derives every width and rank (0.5.17+), and process-group coordinators made without a process
group and registered where the release reads them. Nothing is allocated and no weight is read. It prints
one JSON document: per rank, the bytes of every parameter (``param_bytes``, deduplicated as
``model.parameters()`` does, so a tied head shared with the embedding counts once) and of every buffer
(``buffer_bytes``), and with ``--per-param`` each parameter's shape and dtype.

``SGLANG_ROPE_CACHE_FP32=1`` is set, as the RoPE cache is fp32 on CUDA (``rotary_embedding/base.py``).
The platform predicate that refuses the extra-buffer strategy on CPU is avoided with
``disable_radix_cache`` (it sizes nothing here). Modules a release imports on the way that this CPU
environment lacks (uvicorn, vllm, ...) are import-only stand-ins: the constructors never call them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
import types
import warnings
from typing import Any

os.environ.setdefault("SGLANG_ROPE_CACHE_FP32", "1")
warnings.filterwarnings("ignore")

_MISSING = ("uvicorn", "setproctitle", "uvloop", "vllm", "cutlass", "torchaudio", "fastapi", "quack")


class _Anything:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Anything()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import-only stand-ins for packages a release imports on the way but never calls here. Only used
    where the real package is absent (appended to sys.meta_path, after the real finders)."""

    late: tuple[str, ...] = ()
    """Stood in for only where a release needs it, and only once SGLang's own import is done (``cuda``:
    tvm_ffi, which xgrammar imports on the way, and later releases' modules treat an importable ``cuda``
    as CUDA bindings to call; 0.5.8-0.5.15 import it unguarded on the way to some model modules, e.g.
    at the top of ``jit_kernel/cutedsl_gdn.py`` via ``hybrid_linear_attn_backend``)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith(_ABSENT):
            return None  # imported under try/except ImportError: absent, as on a CUDA host without vLLM
        if fullname.split(".")[0] in _MISSING or fullname.split(".")[0] in self.late:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        own = _OWN_CLASSES.get(spec.name)

        def getattr_(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            if own is not None:  # the class SGLang defines itself, as on CUDA (see _OWN_CLASSES)
                return getattr(sys.modules[own], name)
            return _Anything

        module.__getattr__ = getattr_  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


# 0.5.2-0.5.7 replace their own RMSNorm/GemmaRMSNorm by vLLM's on a platform without sgl-kernel
# (layers/layernorm.py, at the end of the module: ``from vllm.model_executor.layers.layernorm import
# GemmaRMSNorm, RMSNorm``); on CUDA they keep their own. The stand-in answers with the module's own
# classes, already defined when that line runs, so the build holds what the CUDA build holds.
_OWN_CLASSES = {"vllm.model_executor.layers.layernorm": "sglang.srt.layers.layernorm"}
# 0.5.2-0.5.x import vLLM's quantization configs under ``try: ... except ImportError`` and patch them when
# they import: absent here, as on a host without vLLM.
_ABSENT = ("vllm.model_executor.layers.quantization",)

_STAND_INS = _StandIns()
_FAMILY_MODULES = ("qwen3_next", "qwen3_5", "kimi_linear", "nemotron_h", "falcon_h1", "granitemoehybrid")
sys.meta_path.append(_STAND_INS)


def _coordinator_class() -> type:
    from sglang.srt.distributed import parallel_state

    base = parallel_state.GroupCoordinator

    class MetaGroup(base):  # type: ignore[misc, valid-type]
        """A GroupCoordinator with its rank and width and no process group: the model constructors read
        ``rank_in_group``, ``world_size``, ``ranks`` and ``is_first_rank``/``is_last_rank``, never a
        communicator (nothing runs a collective here)."""

        def __init__(self, name: str, ranks: list[int], rank: int) -> None:  # noqa: D107
            self.unique_name = name
            self.ranks = ranks
            self.rank = rank
            self.rank_in_group = ranks.index(rank)
            self.world_size = len(ranks)
            self.local_rank = rank
            self.device_group = None
            self.cpu_group = None
            self.use_pynccl = False
            self.pynccl_comm = None
            self.ca_comm = None
            self.mq_broadcaster = None

        # A tied head under PP is sent from the first stage to the last in the constructor (nemotron_h.py):
        # here the last stage receives an empty tensor of the shape asked (nothing is loaded anyway).
        def send(self, tensor: Any, dst: Any = None) -> None:  # noqa: D102
            return None

        def recv(self, size: Any, dtype: Any, src: Any = None) -> Any:  # noqa: D102
            import torch

            return torch.empty(size, dtype=dtype, device="meta")

    return MetaGroup


# Module flags that change which parameters a class builds on CUDA, set as on CUDA for the build (the
# rest of the module's CUDA checks pick kernels at run time, which nothing here runs):
# models/qwen2_moe.py Qwen2MoeSparseMoeBlock fuses the shared expert into the experts when
# ``_is_cuda and enable_cuda_shared_expert_fusion`` (Qwen3-Next passes it).
# layers/rotary_embedding.py (up to 0.5.9; rotary_embedding/base.py from 0.5.10) keeps its cos/sin cache
# in float32 only when ``_is_cuda`` (0.5.16+ also reads SGLANG_ROPE_CACHE_FP32, set above).
_CUDA_LAYOUT_FLAGS = (
    ("sglang.srt.models.qwen2_moe", "_is_cuda"),
    ("sglang.srt.layers.rotary_embedding", "_is_cuda"),
    ("sglang.srt.layers.rotary_embedding.base", "_is_cuda"),
)

# group name -> (rank name, width name) in the release's parallel context
_GROUPS = {
    "tp_group": ("tp_rank", "tp_size"),
    "pp_group": ("pp_rank", "pp_size"),
    "attn_tp_group": ("attn_tp_rank", "attn_tp_size"),
    "attn_cp_group": ("attn_cp_rank", "attn_cp_size"),
    "moe_ep_group": ("moe_ep_rank", "moe_ep_size"),
    "moe_tp_group": ("moe_tp_rank", "moe_tp_size"),
    "moe_dp_group": ("moe_dp_rank", "moe_dp_size"),
    "dcp_group": ("attn_dcp_rank", "attn_dcp_size"),
}


def _direct_group(cls: type, world_rank: int) -> Any:
    """A GroupCoordinator built directly (``GroupCoordinator(group_ranks=..., ...)``): this rank's group."""

    def make(group_ranks: list[list[int]] | None = None, *args: Any, **kwargs: Any) -> Any:
        ranks = group_ranks if group_ranks is not None else kwargs.get("group_ranks", [[world_rank]])
        mine = next((list(g) for g in ranks if world_rank in g), [world_rank])
        return cls(kwargs.get("group_name") or "group", mine, world_rank)

    return make


def _group(cls: type, name: str, world_rank: int, rank: int, size: int, *, stride: int = 1) -> Any:
    """A coordinator of ``size`` members in which this process (``world_rank``) is member ``rank``."""
    ranks = [world_rank + (i - rank) * stride for i in range(size)]
    return cls(name, ranks, world_rank)


class _NoStream:
    """Constructors make an alternate CUDA stream for overlap (``torch.cuda.Stream()``); nothing runs here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any):
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


@contextlib.contextmanager
def _env(values: dict[str, str | None]):
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _tolerate_stub_kernels() -> None:
    """0.5.3.post1-0.5.3.post3 wrap Triton kernels at import in ``CachedKernel``, which asserts a real
    ``JITFunction`` (utils/common.py); with the import-only Triton stub that assertion fails and the
    Falcon-H1 and Nemotron-H modules (which import LoRA's kernels on the way) do not import. The wrapper
    keeps the plain function instead: no kernel runs here."""
    common = sys.modules.get("sglang.srt.utils.common")
    kernel = getattr(common, "CachedKernel", None)
    if kernel is None:
        return
    real_init = kernel.__init__

    def init(self: Any, fn: Any, key_fn: Any = None) -> None:
        try:
            real_init(self, fn, key_fn)
        except (AssertionError, AttributeError):
            self.fn, self.key_fn = fn, key_fn

    kernel.__init__ = init


def _hopper_capability() -> None:
    """SGLang's own ``get_device_capability`` (``utils/common.py``) answers (None, None) without CUDA, and
    the quantization configs read it where the model config picks a method (0.5.23
    ``GPTQMarlinConfig.override_quantization_method`` -> ``check_marlin_supported``, marlin_utils.py:104-139,
    and the Marlin schemes' ``verify_marlin_supported`` at construction): it answers SM90, Hopper, as the
    checker models, in the module and in every module that imported the name."""
    common = sys.modules.get("sglang.srt.utils.common")
    real = getattr(common, "get_device_capability", None)
    if real is None:
        return

    def hopper(device_id: int = 0) -> tuple[int, int]:
        return 9, 0

    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "get_device_capability", None) is real:
            module.get_device_capability = hopper  # type: ignore[attr-defined]
    # 0.5.10's gptq.py reads its import-time ``_is_cuda`` where the model config picks the method
    # (``GPTQMarlinConfig.is_gptq_marlin_compatible``, gptq.py:420): False on CPU would read a Marlin-able
    # checkpoint as plain ``gptq``, which CUDA never does (0.5.13+ moved the file and dropped the test)
    gptq = sys.modules.get("sglang.srt.layers.quantization.gptq")
    if gptq is not None and hasattr(gptq, "_is_cuda"):
        gptq._is_cuda = True  # type: ignore[attr-defined]


def _cuda_awq() -> None:
    """0.5.23's ``AWQMarlinConfig.is_awq_marlin_compatible`` answers no off CUDA (``if not _is_cuda: return
    False``, layers/quantization/awq/awq.py:409), so on this CPU the model config would keep plain ``awq``:
    the one patch, that module's ``_is_cuda`` set True, so the method is picked as on the Hopper GPU the
    checker models (the flag is read there only: at import, awq.py:515, the fake-op registration has run)."""
    for name in ("sglang.srt.layers.quantization.awq.awq", "sglang.srt.layers.quantization.awq"):
        # 0.5.13+ awq/awq.py; 0.5.10 the module awq.py (is_awq_marlin_compatible reads it at :346)
        try:
            awq = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(awq, "_is_cuda"):
            awq._is_cuda = True
            return


class Release:
    """What differs between releases in how a rank's model is built (feature tests on the installed
    code, never a version switch)."""

    def __init__(self) -> None:
        import sglang
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader import loader
        from sglang.srt.server_args import ServerArgs

        self.version = getattr(sglang, "__version__", "?")
        self.ServerArgs, self.ModelConfig, self.LoadConfig, self.loader = (
            ServerArgs,
            ModelConfig,
            LoadConfig,
            loader,
        )
        self.fields = {f for f in getattr(ServerArgs, "__dataclass_fields__", {})}
        _tolerate_stub_kernels()
        for name in _FAMILY_MODULES:  # 0.5.8-0.5.15 reach cuda-python unguarded on the way to some
            try:
                importlib.import_module(f"sglang.srt.models.{name}")
            except ModuleNotFoundError as exc:
                if (exc.name or "").split(".")[0] == "cuda":
                    _STAND_INS.late = ("cuda",)  # stood in for from here on (the failed import is retried)
            except Exception:
                pass
        try:
            self.rc = importlib.import_module("sglang.srt.runtime_context")
        except ImportError:
            self.rc = None
        self.Group = _coordinator_class()
        _hopper_capability()
        _cuda_awq()

    def server_args(self, model_dir: str, layout: dict[str, int], flags: dict[str, Any]) -> Any:
        tp_group = layout["tp"] * layout.get("dp", 1)
        kwargs: dict[str, Any] = dict(
            model_path=model_dir,
            device="cuda",
            skip_tokenizer_init=True,
            disable_radix_cache=True,
            tp_size=tp_group,
            pp_size=layout["pp"],
        )
        if layout.get("ep", 1) > 1:
            kwargs["ep_size"] = layout["ep"]
        dp = layout.get("dp", 1)
        if "attn_dp_size" in self.fields:
            kwargs["attn_dp_size"] = dp
        elif dp > 1:
            kwargs.update(enable_dp_attention=True, dp_size=dp)
        kwargs.update(flags)
        sa = self.ServerArgs(**kwargs)
        if hasattr(sa, "resolve_once"):
            sa.resolve_once()
        return sa

    def place(self, sa: Any, world_rank: int, layout: dict[str, int]) -> dict[str, int]:
        """Put this process at ``world_rank``; return the widths and ranks the release derived."""
        if self.rc is not None and hasattr(self.rc, "SpawnRanks"):
            return self._place_published(sa, world_rank, layout)
        return self._place_groups(sa, world_rank, layout)

    def _place_published(self, sa: Any, world_rank: int, layout: dict[str, int]) -> dict[str, int]:
        """0.5.22+: publish the rank; the release derives every width and rank from it. The coordinators
        are registered as ``initialize_model_parallel`` does (``override_permanently``)."""
        rc = self.rc
        if hasattr(rc.get_parallel(), "clear_stamp"):
            rc.get_parallel().clear_stamp()  # the groups of the previous layout
        rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=world_rank))
        par = rc.get_parallel()
        seen: dict[str, int] = {}
        groups = {}
        for group, (rank_name, size_name) in _GROUPS.items():
            try:
                rank, size = getattr(par, rank_name), getattr(par, size_name)
            except Exception:
                continue
            seen[rank_name], seen[size_name] = rank, size
            stride = (layout["tp"] * layout.get("dp", 1)) if group == "pp_group" else 1
            groups[group] = _group(
                self.Group, group.removesuffix("_group"), world_rank, rank, size, stride=stride
            )
        par.override_permanently(**groups)
        # then, as distributed/bootstrap.py does after initialize_model_parallel: the DP-attention flags
        # (is_dp_attention_enabled() reads them) and the attention-DP placement
        import inspect

        from sglang.srt.layers import dp_attention

        init_dp = dp_attention.initialize_dp_attention
        kwargs = {"server_args": sa}
        init_dp(**{k: v for k, v in kwargs.items() if k in inspect.signature(init_dp).parameters})
        return seen

    def _place_groups(self, sa: Any, world_rank: int, layout: dict[str, int]) -> dict[str, int]:
        """Up to 0.5.21: the release's own ``initialize_model_parallel`` builds every group (with
        coordinators that hold no process group: ``init_model_parallel_group`` answers with the group
        of ``group_ranks`` this rank is in), then its ``initialize_dp_attention``, as its model runner
        does. The server args are made global (and published, 0.5.16+) first."""
        import inspect

        import torch.distributed as dist
        from sglang.srt.distributed import parallel_state as ps
        from sglang.srt.layers import dp_attention

        server_args_module = importlib.import_module("sglang.srt.server_args")
        if hasattr(server_args_module, "set_global_server_args_for_scheduler"):
            server_args_module.set_global_server_args_for_scheduler(sa)
        rc = self.rc
        if rc is not None and hasattr(rc, "publish"):
            rc.publish(sa, role="scheduler")
        elif rc is not None and hasattr(rc.get_context(), "set_server_args"):
            rc.get_context().set_server_args(sa)
        if rc is not None and hasattr(rc.get_parallel(), "clear_derived_widths"):
            rc.get_parallel().clear_derived_widths()
        world = layout["pp"] * layout["tp"] * layout.get("dp", 1)
        for name in dir(ps):  # the groups a previous rank built
            if name.startswith("_") and name.isupper() and isinstance(getattr(ps, name), ps.GroupCoordinator):
                setattr(ps, name, None)
        Group = self.Group

        def init_group(group_ranks: list[list[int]], *args: Any, **kwargs: Any) -> Any:
            mine = next((list(g) for g in group_ranks if world_rank in g), [world_rank])
            return Group(kwargs.get("group_name") or "group", mine, world_rank)

        ps._WORLD = Group("world", list(range(world)), world_rank)
        ps._WORLD.world_size = world
        candidates = dict(
            tensor_model_parallel_size=layout["tp"] * layout.get("dp", 1),
            expert_model_parallel_size=layout.get("ep", 1),
            pipeline_model_parallel_size=layout["pp"],
            attention_data_parallel_size=layout.get("dp", 1),
            backend="gloo",
        )
        init = ps.initialize_model_parallel
        accepted = inspect.signature(init).parameters
        with contextlib.ExitStack() as stack:
            stack.enter_context(_patched(ps, "init_model_parallel_group", init_group))
            stack.enter_context(_patched(dist, "is_initialized", lambda: True))
            stack.enter_context(_patched(dist, "get_world_size", lambda group=None: world))
            stack.enter_context(_patched(dist, "get_rank", lambda group=None: world_rank))
            stack.enter_context(_patched(dist, "get_backend", lambda group=None: "gloo"))
            stack.enter_context(_patched(dist, "new_group", lambda *a, **k: None))
            init(**{k: v for k, v in candidates.items() if k in accepted})
            if hasattr(dp_attention, "GroupCoordinator"):  # up to 0.5.8 it builds the attention-TP group
                stack.enter_context(
                    _patched(dp_attention, "GroupCoordinator", _direct_group(Group, world_rank))
                )
            mc = self.ModelConfig.from_server_args(sa)
            init_dp = dp_attention.initialize_dp_attention
            dp_params = inspect.signature(init_dp).parameters
            kwargs = {"server_args": sa, "model_config": mc}
            init_dp(**{k: v for k, v in kwargs.items() if k in dp_params})
        seen = {}
        for fn, name in (
            ("get_tensor_model_parallel_rank", "tp_rank"),
            ("get_tensor_model_parallel_world_size", "tp_size"),
            ("get_pipeline_model_parallel_rank", "pp_rank"),
            ("get_pipeline_model_parallel_world_size", "pp_size"),
            ("get_moe_expert_parallel_rank", "moe_ep_rank"),
            ("get_moe_expert_parallel_world_size", "moe_ep_size"),
            ("get_moe_tensor_parallel_rank", "moe_tp_rank"),
            ("get_moe_tensor_parallel_world_size", "moe_tp_size"),
        ):
            try:
                seen[name] = getattr(ps, fn)()
            except Exception:
                pass
        for fn, name in (
            ("get_attention_tp_rank", "attn_tp_rank"),
            ("get_attention_tp_size", "attn_tp_size"),
        ):
            try:
                seen[name] = getattr(dp_attention, fn)()
            except Exception:
                pass
        return seen

    def build(self, sa: Any) -> Any:
        import inspect

        import torch

        mc = self.ModelConfig.from_server_args(sa)
        lc = self.LoadConfig()
        # Import the model's module (and the registry's) first, then set the CUDA layout flags: a module
        # imported after them would read them at its own import and reach for CUDA-only packages.
        self.loader.get_model_architecture(mc)
        for module, attr in _CUDA_LAYOUT_FLAGS:  # the layout the class builds on CUDA
            try:
                setattr(importlib.import_module(module), attr, True)
            except ImportError:
                pass
        init = self.loader._initialize_model
        with (
            _hopper_nvfp4_moe(),
            self.loader.set_default_torch_dtype(mc.dtype),
            torch.device("meta"),
            _patched(torch.cuda, "Stream", _NoStream),
            # 0.5.2-0.5.x pass device=torch.cuda.current_device() to some norms: the build's device here
            _patched(torch.cuda, "current_device", lambda: torch.device("meta")),
            # the GPU a quantized scheme is picked for (compressed-tensors' _check_scheme_supported reads
            # it at construction, compressed_tensors.py:416): Hopper, SM90, as the checker models
            _patched(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0)),
            # 0.5.10-0.5.17's swizzle_blockscale moves the NVFP4 experts' swizzled scales with .cuda()
            # (quantization/utils.py:618; .to(scale.device) from 0.5.20): on the meta device they stay
            _patched(torch.Tensor, "cuda", _meta_cuda(torch.Tensor.cuda)),
        ):
            if len(inspect.signature(init).parameters) == 2:  # up to 0.5.8 it takes the quant config itself
                return init(mc, lc)
            return init(mc, lc, self.loader._get_quantization_config(mc, lc))


def _meta_cuda(real: Any) -> Any:
    """``Tensor.cuda`` that leaves a meta tensor where it is (the build's device), else the real one."""

    def cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self if self.is_meta else real(self, *args, **kwargs)

    return cuda


@contextlib.contextmanager
def _hopper_nvfp4_moe():
    """ModelOpt NVFP4's MoE method picks its runner at construction from ``is_cuda()`` and the device
    capability (0.5.23 modelopt_quant.py:2377-2387: the auto runner on SM80-SM99 is the Marlin fallback,
    anything else not Blackwell raises): here it sees a CUDA SM90 device, as the checker models, and only
    that constructor does (the module's other ``is_cuda()`` callers are left as on CPU)."""
    try:
        mq = importlib.import_module("sglang.srt.layers.quantization.modelopt_quant")
    except ImportError:
        yield
        return
    cls = getattr(mq, "ModelOptNvFp4FusedMoEMethod", None)
    if cls is None or not hasattr(mq, "is_cuda") or not hasattr(mq, "get_device_capability"):
        yield
        return
    real = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        with (
            _patched(mq, "is_cuda", lambda: True),
            _patched(mq, "get_device_capability", lambda *a, **k: (9, 0)),
        ):
            real(self, *args, **kwargs)

    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = real


def rank_weights(model: Any, per_param: bool) -> dict[str, Any]:
    params = {n: p for n, p in model.named_parameters()}
    out: dict[str, Any] = {
        "param_bytes": sum(p.numel() * p.element_size() for p in params.values()),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
    }
    if per_param:
        out["params"] = {n: [list(p.shape), str(p.dtype).removeprefix("torch.")] for n, p in params.items()}
        out["buffers"] = {
            n: [list(b.shape), str(b.dtype).removeprefix("torch.")] for n, b in model.named_buffers()
        }
    return out


def parse_layout(text: str) -> dict[str, int]:
    layout = {"pp": 1, "tp": 1}
    for part in text.split(","):
        key, _, value = part.partition("=")
        layout[key.strip()] = int(value)
    return layout


def run_layouts(
    rel: Release,
    config: str,
    layouts: list[str],
    partition: str | None,
    flags: dict[str, Any],
    *,
    ranks: set[int] | None = None,
    per_param: bool = False,
) -> list[dict[str, Any]]:
    """Every rank of every layout of one config: the class built on the meta device, its bytes."""
    out = []
    tmp = tempfile.mkdtemp(prefix="sglang-weights-")
    try:
        shutil.copy(config, os.path.join(tmp, "config.json"))
        beside = config.removesuffix(".json") + ".hf_quant_config.json"
        if os.path.isfile(beside):  # ModelOpt's file beside config.json, which SGLang reads too
            shutil.copy(beside, os.path.join(tmp, "hf_quant_config.json"))
        for text in layouts:
            layout = parse_layout(text)
            world = layout["pp"] * layout["tp"] * layout.get("dp", 1)
            part = partition if layout["pp"] > 1 else None
            entry: dict[str, Any] = {"layout": layout, "partition": part, "ranks": []}
            with _env({"SGLANG_PP_LAYER_PARTITION": part}):
                sa = rel.server_args(tmp, layout, flags)
                for world_rank in range(world):
                    if ranks is not None and world_rank not in ranks:
                        continue
                    seen = rel.place(sa, world_rank, layout)
                    model = rel.build(sa)
                    entry["ranks"].append({"rank": world_rank, **seen, **rank_weights(model, per_param)})
                    del model
            out.append(entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", help="a config.json")
    ap.add_argument("--layout", action="append", default=[], help="pp=P,tp=T[,dp=D][,ep=E]")
    ap.add_argument("--partition", help="SGLANG_PP_LAYER_PARTITION for every layout with pp > 1")
    ap.add_argument("--flag", action="append", default=[], help="a ServerArgs field=JSON value")
    ap.add_argument("--ranks", help="only these world ranks (comma-separated)")
    ap.add_argument("--per-param", action="store_true")
    ap.add_argument(
        "--cases",
        help="a JSON file {id: {config, layouts, partition, flags}}: run each in this one process and "
        "print {id: {layouts} or {error}} (a case the release refuses records its one-line error)",
    )
    args = ap.parse_args(argv)
    rel = Release()
    if args.cases:
        import traceback

        cases = json.loads(open(args.cases).read())
        results: dict[str, Any] = {}
        for cid, case in cases.items():
            done: list[Any] = []
            for layout in case["layouts"]:
                try:
                    done += run_layouts(
                        rel, case["config"], [layout], case.get("partition"), case.get("flags", {})
                    )
                except Exception as exc:  # the release's own refusal: recorded with its layout, not fatal
                    lines = [ln for ln in traceback.format_exception_only(type(exc), exc) if ln.strip()]
                    results[cid] = {"error": " ".join(lines[-1].split())[:300]}
                    if len(case["layouts"]) > 1:
                        results[cid]["layout"] = layout
                    break
            else:
                results[cid] = {"layouts": done}
            print(f"{cid}: {results[cid].get('error', 'ok')}", file=sys.stderr, flush=True)
        json.dump({"release": rel.version, "cases": results}, sys.stdout)
        print()
        return 0
    flags = {}
    for f in args.flag:
        k, _, v = f.partition("=")
        flags[k] = json.loads(v)
    ranks = {int(r) for r in args.ranks.split(",")} if args.ranks else None
    layouts = run_layouts(
        rel, args.config, args.layout, args.partition, flags, ranks=ranks, per_param=args.per_param
    )
    out = {"release": rel.version, "config": args.config, "flags": flags, "layouts": layouts}
    json.dump(out, sys.stdout, indent=1 if args.per_param else None)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
