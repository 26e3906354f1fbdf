#!/usr/bin/env python3
"""Build a model class on the meta device, stage by stage, from an SGLang release's own code (CPU only).

    PYTHONPATH=scripts/sglang_stubs:$HOME/.cache/pp-checker/sglang-cpu/releases/X \\
        ~/.cache/pp-checker/sglang-cpu/venv/bin/python scripts/pp_meta_build.py CONFIG_DIR --pp-size 2

What ``scripts/build_pp_support.py`` cannot settle by reading, this runs: for every pipeline stage of
``--pp-size`` (tp 1) it builds the config's class as the release's model loader does
(``model_loader/loader.py`` ``_initialize_model``: the class from the registry, ``config`` and
``quant_config``), under ``torch.device("meta")`` (nothing is allocated), then streams one checkpoint
tensor name per layer through the class's own ``load_weights`` (as meta tensors: the names of the
layer norms every layer has, as the checkpoint spells them). It prints one line per stage: built or the
constructor's exception with the SGLang file:line that raised it, and what ``load_weights`` did.

Only the parallel groups are stand-ins (no process group exists): objects with the ranks, sizes and
``is_first_rank``/``is_last_rank`` of a real ``GroupCoordinator``, registered where the release reads them
(0.5.22+: ``runtime_context.publish(..., ranks=SpawnRanks(world_rank=r))`` and
``get_parallel().override_permanently``, as ``initialize_model_parallel`` does). Import-only modules the
release needs on the way (``uvicorn``, ``fastapi``, ...) are synthesised here when absent. Releases before
0.5.22 keep their groups in ``distributed/parallel_state.py`` globals; this script supports 0.5.22+ (the
findings on older releases in HAND_CHECKED were made by reading, see its evidence).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import traceback
import types
from pathlib import Path

_IMPORT_ONLY = ("uvicorn", "fastapi", "setproctitle", "uvloop", "starlette", "vllm")
"""Imported on the way to a model class, never run here (the HTTP server; vllm's rotary kernel, picked
when the platform is neither CUDA nor a CPU engine)."""


class _Dummy:
    def __init__(self, *a, **k) -> None:
        pass

    def __call__(self, *a, **k):
        return _Dummy()

    def __getattr__(self, name: str):
        return _Dummy()

    def __mro_entries__(self, bases):
        return (object,)


class _ImportOnly(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Synthesise a package the release imports but never runs here (the HTTP server's)."""

    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top in _IMPORT_ONLY and importlib.machinery.PathFinder.find_spec(top) is None:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def getattr_(name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Dummy()

        module.__getattr__ = getattr_  # type: ignore[method-assign]
        return module

    def exec_module(self, module) -> None:
        pass


class Group:
    """A GroupCoordinator's answers for one rank, without a process group."""

    def __init__(self, ranks: range | list[int], rank: int) -> None:
        self.ranks = list(ranks)
        self.rank = rank
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(rank)
        self.local_rank = rank
        self.device_group = self.cpu_group = self.device_communicator = None
        self.unique_name = "meta"

    first_rank = property(lambda self: self.ranks[0])
    last_rank = property(lambda self: self.ranks[-1])
    is_first_rank = property(lambda self: self.rank == self.ranks[0])
    is_last_rank = property(lambda self: self.rank == self.ranks[-1])


def _sglang_frame(exc: BaseException) -> str:
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/sglang/srt/" in frame.filename:
            return f"{frame.filename.split('/sglang/srt/')[-1]}:{frame.lineno}"
    return "?"


def _optional(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class _extra_buffer_on_cpu:
    """On CPU SGLang refuses the extra_buffer strategy outright; the deployment's GPU would not."""

    def __enter__(self) -> None:
        hook = _optional("sglang.srt.arg_groups.mamba_hook")
        if hook is not None and hasattr(hook, "_platform_supports_mamba_cache_extra_buffer"):
            hook._platform_supports_mamba_cache_extra_buffer = lambda: True
        import sglang.srt.server_args as sa

        if hasattr(sa, "is_cuda"):
            sa.is_cuda = lambda: True

    def __exit__(self, *exc: object) -> None:
        pass


def _stage(rc, new: bool, server_args, rank: int, pp: int):  # noqa: ANN001, ANN202 - SGLang's objects
    """Make ``rank`` (pp_rank = rank, tp 1) the current one, where the release reads it; its ModelConfig."""
    one = Group([rank], rank)
    groups = dict(tp_group=one, pp_group=Group(range(pp), rank), attn_tp_group=one, attn_cp_group=one)
    if new:  # 0.5.22+: the published rank bundle and the permanent stamp initialize_model_parallel writes
        rc.publish(server_args, role="scheduler", ranks=rc.SpawnRanks(world_rank=rank))
        rc.get_parallel().override_permanently(**groups, moe_ep_group=one, moe_tp_group=one)
        from sglang.srt.arg_groups.overrides import model_config_of

        return model_config_of(server_args)
    # Up to 0.5.21: the groups are parallel_state globals, attention TP/DP dp_attention globals.
    from sglang.srt.distributed import parallel_state as ps

    for name in ("_WORLD", "_TP", "_ATTN_TP", "_ATTN_CP", "_DCP", "_MOE_DP", "_MOE_EP", "_MOE_TP"):
        if hasattr(ps, name):
            setattr(ps, name, one)
    ps._PP = Group(range(pp), rank)
    dpa = importlib.import_module("sglang.srt.layers.dp_attention")
    for name, value in (
        ("_ATTN_TP_SIZE", 1),
        ("_ATTN_TP_RANK", 0),
        ("_ATTN_DP_SIZE", 1),
        ("_ATTN_DP_RANK", 0),
        ("_LOCAL_ATTN_DP_SIZE", 1),
        ("_LOCAL_ATTN_DP_RANK", 0),
        ("_ENABLE_DP_ATTENTION_FLAG", False),
    ):
        if hasattr(dpa, name):
            setattr(dpa, name, value)
    sa = importlib.import_module("sglang.srt.server_args")
    if hasattr(sa, "set_global_server_args_for_scheduler"):
        sa.set_global_server_args_for_scheduler(server_args)
    if rc is not None and hasattr(rc, "publish"):  # 0.5.17-0.5.21
        rc.publish(server_args, role="scheduler")
    elif rc is not None and hasattr(rc, "get_context"):  # 0.5.16
        rc.get_context().set_server_args(server_args)
    if rc is not None and hasattr(rc, "get_parallel"):
        with contextlib.suppress(Exception):
            rc.get_parallel().override_permanently(pp_size=pp, pp_rank=rank, tp_size=1, tp_rank=0)
    from sglang.srt.configs.model_config import ModelConfig

    return ModelConfig.from_server_args(server_args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config_dir", type=Path, help="a folder holding the model's config.json")
    parser.add_argument("--pp-size", type=int, default=2)
    args = parser.parse_args(argv)
    sys.meta_path.insert(0, _ImportOnly())
    os.environ.setdefault("SGLANG_ROPE_CACHE_FP32", "1")
    import torch

    if not torch.cuda.is_available():  # a side stream some constructors ask for (alt_stream): none here

        class _NoStream:
            def __init__(self, *a: object, **k: object) -> None:
                pass

        torch.cuda.Stream = _NoStream  # type: ignore[assignment,misc]
    copy = torch.Tensor.copy_

    def meta_copy(self, src, *args, **kwargs):  # a weight loader copying a meta tensor: nothing to move
        if getattr(src, "is_meta", False) or self.is_meta:
            return self
        return copy(self, src, *args, **kwargs)

    torch.Tensor.copy_ = meta_copy  # type: ignore[method-assign]

    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import _initialize_model
    from sglang.srt.server_args import ServerArgs

    rc = _optional("sglang.srt.runtime_context")
    new = rc is not None and hasattr(rc, "SpawnRanks")  # 0.5.22+
    pp = args.pp_size
    with _extra_buffer_on_cpu():
        server_args = ServerArgs(
            model_path=str(args.config_dir),
            device="cpu",
            tp_size=1,
            pp_size=pp,
            skip_tokenizer_init=True,
            disable_radix_cache=True,
        )
        if hasattr(server_args, "resolve_once"):
            server_args.resolve_once()
    config = json.loads((args.config_dir / "config.json").read_text())
    layers = int(config.get("num_hidden_layers") or config.get("text_config", {}).get("num_hidden_layers", 0))
    built: dict[int, object] = {}
    # The registry imports every model module; some make tensors at import: not under the meta device.
    importlib.import_module("sglang.srt.models.registry").ModelRegistry.get_supported_archs()
    for rank in range(pp):
        model_config = _stage(rc, new, server_args, rank, pp)
        torch.set_default_dtype(model_config.dtype)
        try:
            with torch.device("meta"):
                built[rank] = _initialize_model(model_config, LoadConfig())
            print(f"stage {rank}: built {type(built[rank]).__name__}")
        except Exception as exc:
            print(f"stage {rank}: constructor {type(exc).__name__}: {exc} ({_sglang_frame(exc)})")
    # One checkpoint name per layer: the layer's first norm as the stages that built it name it (the
    # parameter name a norm has is the checkpoint's), else the HF default.
    norm: dict[int, str] = {}
    for model in built.values():
        for name, _ in model.named_parameters():  # type: ignore[attr-defined]
            parts = name.split(".")
            if "layers" in parts and "norm" in name and parts[parts.index("layers") + 1].isdigit():
                norm.setdefault(int(parts[parts.index("layers") + 1]), name)
    names = [norm.get(i, f"model.layers.{i}.input_layernorm.weight") for i in range(layers)]
    for rank, model in built.items():
        _stage(rc, new, server_args, rank, pp)
        params = dict(model.named_parameters())  # type: ignore[attr-defined]
        fed = [(n, torch.empty(params[n].shape if n in params else (1,), device="meta")) for n in names]
        try:
            model.load_weights(iter(fed))  # type: ignore[attr-defined]
            held = sum(n in params for n in names)
            print(f"stage {rank}: load_weights took the {held} of {layers} layers' names it holds")
        except Exception as exc:
            print(f"stage {rank}: load_weights {type(exc).__name__}: {exc} ({_sglang_frame(exc)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
