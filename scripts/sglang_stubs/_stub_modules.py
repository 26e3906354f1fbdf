"""Shared by the triton and torchvision stubs: synthesise every ``PACKAGE.*`` submodule on import,
each answering attribute lookups with the stub's own ``module_getattr``."""

import importlib.abc
import importlib.machinery
import sys
import types


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package, module_getattr):
        self.prefix = package + "."
        self.module_getattr = module_getattr

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(self.prefix):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = self.module_getattr
        return module

    def exec_module(self, module):
        pass


def install(package, module_getattr):
    sys.meta_path.insert(0, _Finder(package, module_getattr))
