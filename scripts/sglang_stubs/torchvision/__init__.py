"""Import-only stand-in for torchvision (see ../README.md).

PyPI torchvision wheels fail to load against torch 2.13.0+cpu, and transformers imports many
``torchvision.*`` submodules once it sees the package. Every submodule is synthesised; every attribute is
a dummy class whose instances refuse to be called, so any real use fails loudly.
"""

from _stub_modules import install

__version__ = "0.0.0+checker-stub"


class _DummyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy


class _Dummy(metaclass=_DummyMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise NotImplementedError("torchvision stub (CPU-only checker environment)")


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Dummy


install("torchvision", _module_getattr)
__getattr__ = _module_getattr
