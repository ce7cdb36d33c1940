"""Shared machinery of the engine switches (openmla.integrations.vllm / .sglang): replace an
engine's FlashMLA entry points in its own module and in every module that imported them by name
already, now (`replace`) or when the engine's module is first imported (`after_import`)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable, Dict, Iterable, List


def replace(module_name: str, replacements: Dict[str, object],
            prefixes: Iterable[str]) -> List[str]:
    """Sets `replacements` on sys.modules[module_name], and wherever a loaded module whose name
    starts with one of `prefixes` holds the object it replaces under the same name (a
    `from module import name` done before). Returns the names of the modules changed."""
    module = sys.modules.get(module_name)
    if module is None:
        return []
    originals = {name: getattr(module, name) for name in replacements if hasattr(module, name)}
    changed = []
    for name, new in replacements.items():
        setattr(module, name, new)
    changed.append(module_name)
    prefixes = tuple(prefixes)
    for other_name, other in list(sys.modules.items()):
        if other is None or other is module or not other_name.startswith(prefixes):
            continue
        hit = False
        for name, old in originals.items():
            if old is not replacements[name] and getattr(other, name, None) is old:
                setattr(other, name, replacements[name])
                hit = True
        if hit:
            changed.append(other_name)
    return changed


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a module's own code has run, before anything imports from it
    (so `from module import name` in the engine's other modules sees what the callback set)."""

    def __init__(self, module_name: str, callback: Callable[[], object]):
        self.module_name = module_name
        self.callback = callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module_name:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _AfterImport):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        callback = self.callback

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                callback()

        spec.loader = Loader()
        return spec


def after_import(module_name: str, callback: Callable[[], object]) -> None:
    """Calls `callback` now if `module_name` is imported already, else right after its first
    import (once per interpreter: a second request for the same module is ignored)."""
    if module_name in sys.modules:
        callback()
        return
    if any(isinstance(f, _AfterImport) and f.module_name == module_name for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _AfterImport(module_name, callback))
