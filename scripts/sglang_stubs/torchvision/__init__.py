"""Import-only stand-in for torchvision (see ../README.md).

PyPI torchvision wheels fail to load against torch 2.13.0+cpu, and transformers imports many
``torchvision.*`` submodules once it sees the package. Every submodule is synthesised; every attribute is
a dummy class whose instances refuse to be called, so any real use fails loudly.
"""

import importlib.abc
import importlib.machinery
import sys
import types

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


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
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
