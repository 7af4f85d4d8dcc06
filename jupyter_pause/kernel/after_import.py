"""Running something right after a module is first imported, without importing it now.

A restore puts numpy's global random generator state back. numpy 2 imports ``numpy.random``
only when it is first used, and importing it to set the state cost a restore 2.8 MB and a
few ``.so`` reads from a cold disk (bench/README.md) for a module the notebook may never use
again. Nobody can draw from that generator before the module is imported, so setting the
state as the import finishes continues the same stream.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import warnings
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def call_after_import(name: str, then: Callable[[ModuleType], object], what: str) -> None:
    """Call ``then(module)`` once ``name`` is imported: now if it is, else when it first is.

    ``what`` says in a warning what was lost if ``then`` fails (the import itself goes on).
    A second call for the same name replaces a first one still waiting.
    """
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    for finder in list(sys.meta_path):
        if isinstance(finder, _ThenFinder) and finder.name == name:
            sys.meta_path.remove(finder)
    sys.meta_path.insert(0, _ThenFinder(name, then, what))


class _ThenFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it asks the other finders and wraps the loader they give."""

    def __init__(self, name: str, then: Callable[[ModuleType], object], what: str) -> None:
        self.name = name
        self._then = then
        self._what = what

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):  # once: the others find the module from now on
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenLoader(spec.loader, self._then, self._what)
        return spec


class _ThenLoader(importlib.abc.Loader):
    """The module's own loader, then ``then``; afterwards the module keeps its own loader."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], object], what: str) -> None:
        self._loader = loader
        self._then = then
        self._what = what

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._then(module)
        except Exception as err:  # the notebook's import must not fail for it
            warnings.warn(f"jupyter_pause: {self._what} not restored: {err}", stacklevel=2)
