"""Import-only stand-in for sgl_kernel (SGLang's CUDA kernels), on the path of 0.5.10-0.5.12.post1 only.

Those releases import ``sgl_kernel.kvcacheio`` at module level on the way to ``ModelRunner`` (the KV
cache mixin the engine calls: model_runner -> elastic_ep -> schedule_batch -> radix_cache ->
hicache_storage -> memory_pool_host); later releases import it lazily. No kernel is ever called by the
sizing code: every name is a dummy whose call raises, so a real use fails loudly. Kept off the path of
the other releases (scripts/sglang_cpu_env.sh), where ``import sgl_kernel`` failing is what their own
fallbacks expect.
"""

import importlib.abc
import sys

from _stub_modules import install  # scripts/sglang_stubs, on the path after this folder

__version__ = "0.0.0+checker-stub"


class _Dummy:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise NotImplementedError("sgl_kernel stub (CPU-only checker environment)")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy()


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Dummy()


__getattr__ = _module_getattr
install("sgl_kernel", _module_getattr)


class _NoScalarType(importlib.abc.MetaPathFinder):
    """``sgl_kernel.scalar_type`` is missing, as it is on the later releases' CPU path: their
    ``get_scalar_types`` (quantization/utils.py:19-40) then answers its named stand-ins (``uint4b8``,
    ``uint8b128``), which Marlin's support checks compare; dummies would match nothing and read a GPTQ
    checkpoint Marlin takes as plain ``gptq`` (0.5.10 gptq.py:413-435)."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "sgl_kernel.scalar_type":
            raise ModuleNotFoundError(f"No module named {fullname!r} (checker stub)", name=fullname)
        return None


sys.meta_path.insert(0, _NoScalarType())
