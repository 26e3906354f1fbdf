"""Import-only stand-in for triton (see ../README.md): lets SGLang's sizing code import on a CPU machine.

Decorators return the decorated function unchanged, every other attribute is a permissive dummy, and
``triton.runtime.driver`` raises so SGLang's "no GPU" fallbacks run instead of reading a dummy target.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+checker-stub"
_DECORATORS = ("jit", "autotune", "heuristics", "constexpr_function")


class _DummyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy


class _Dummy(metaclass=_DummyMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Dummy()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy()

    def __getitem__(self, key):
        return _Dummy()


def _decorator(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


class _NoDriver:
    """``triton.runtime.driver``: there is no GPU driver behind this stub."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError("triton stub: no GPU driver (CPU-only checker environment)")


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    if name in _DECORATORS:
        return _decorator
    if name == "driver":
        return _NoDriver()
    return _Dummy


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("triton."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__getattr__ = _module_getattr
