"""Import-only stand-in for triton (see ../README.md): lets SGLang's sizing code import on a CPU machine.

Decorators return the decorated function unchanged, every other attribute is a permissive dummy, and
``triton.runtime.driver`` raises so SGLang's "no GPU" fallbacks run instead of reading a dummy target.
"""

from _stub_modules import install

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
    if name == "runtime":  # ``triton.runtime.driver`` read without importing triton.runtime first
        import importlib

        return importlib.import_module("triton.runtime")
    return _Dummy


install("triton", _module_getattr)
__getattr__ = _module_getattr
