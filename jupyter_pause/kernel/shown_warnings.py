"""Warnings already shown: Python's "once per location" memory, kept across filter changes.

Python shows a warning once per place it comes from (the ``default`` action): each module's
``__warningregistry__`` remembers what it showed, and ``warnings.onceregistry`` what the
``once`` action showed. A registry is stamped with the version of the warnings filters; any
change of the filters (``warnings.catch_warnings``, ``simplefilter``) starts a new version, and
a registry of an older one is forgotten at its module's next warning, so the warning shows
again. Two things here keep that memory:

* ``keeping_shown``: jupyter_pause silences libraries while it reads or sets their settings
  (``catch_warnings``, three new versions): registries stamped before are stamped again after,
  so a checkpoint never makes a notebook's warnings show twice;
* ``capture`` and ``apply``: the registries of the current version, by module, restored in
  the new kernel with its version, so a warning shown before the pause is not shown again.

The filters' version is not public: ``filters_version`` reads it by warning into a scratch
registry (stamped before the filters are consulted) with the display silenced.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

_PROBE_TEXT = "jupyter_pause: which version of the warnings filters is current"


class _VersionProbe(Warning):
    """Never shown: warned into a scratch registry to read the filters' version."""


def filters_version() -> int | None:
    """The current version of the warnings filters; None where it cannot be read."""
    scratch: dict[Any, Any] = {"version": -1}
    show = warnings.__dict__.get("_showwarnmsg")
    warnings._showwarnmsg = lambda message: None  # type: ignore[attr-defined]
    try:
        warnings.warn_explicit(_PROBE_TEXT, _VersionProbe, "<jupyter_pause>", 1, registry=scratch)
    except Warning:
        pass  # an "error" filter for every warning raised it; the version is stamped already
    finally:
        if show is None:
            del warnings._showwarnmsg  # type: ignore[attr-defined]
        else:
            warnings._showwarnmsg = show  # type: ignore[attr-defined]
        warnings.onceregistry.pop((_PROBE_TEXT, _VersionProbe), None)
    version = scratch.get("version")
    return version if isinstance(version, int) and version >= 0 else None


def registries() -> Iterator[tuple[str, dict[Any, Any]]]:
    """(module name, its ``__warningregistry__``) of every imported module that has one."""
    for name, module in list(sys.modules.items()):
        if name == "__main__":
            continue  # IPython forgets the notebook's own before every cell (its gh-6611)
        registry = getattr(module, "__dict__", {}).get("__warningregistry__")
        if isinstance(registry, dict):
            yield name, registry


#: The versions current when each enclosing ``keeping_shown`` began: registries stamped with
#: them are current too (they are stamped again on the way out).
_kept: list[int] = []


@contextlib.contextmanager
def keeping_shown() -> Iterator[None]:
    """Filters changed inside (and set back) do not make shown warnings show again."""
    before = filters_version()
    if before is not None:
        _kept.append(before)
    try:
        yield
    finally:
        if before is not None:
            _kept.pop()
        after = filters_version()
        if before is not None and after is not None and after != before:
            for _name, registry in registries():
                if registry.get("version") == before:
                    registry["version"] = after


def _category_name(category: type) -> tuple[str, str]:
    return (category.__module__, category.__qualname__)


def _category(name: tuple[str, str]) -> type | None:
    """The class named; None when its module is not imported (or no longer has it)."""
    found: Any = sys.modules.get(name[0])
    for part in name[1].split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) and issubclass(found, Warning) else None


def capture() -> dict[str, Any] | None:
    """What was shown, by module: (text, category, line) of each place, and the ``once``
    action's (text, category); None when nothing was shown since the filters last changed."""
    version = filters_version()
    if version is None:
        return None
    current = {version, *_kept}
    shown: dict[str, list[tuple[str, tuple[str, str], int]]] = {}
    for name, registry in registries():
        if registry.get("version") not in current:
            continue  # forgotten at that module's next warning anyway
        places = [
            (key[0], _category_name(key[1]), key[2])
            for key, value in registry.items()
            if value is True
            and isinstance(key, tuple)
            and len(key) == 3
            and isinstance(key[0], str)
            and isinstance(key[1], type)
            and isinstance(key[2], int)
        ]
        if places:
            shown[name] = places
    once = [
        (key[0], _category_name(key[1]))
        for key, value in warnings.onceregistry.items()
        if value is True and isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], type)
    ]
    return {"modules": shown, "once": once} if shown or once else None


def apply(state: dict[str, Any]) -> int:
    """Stamp what was shown into this kernel's registries, of its version; returns how many
    places. A module not imported here is left out: its warnings show once more."""
    version = filters_version()
    if version is None:
        raise RuntimeError("the version of this Python's warnings filters cannot be read")
    count = 0
    for name, places in state["modules"].items():
        module = sys.modules.get(name)
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        registry = namespace.setdefault("__warningregistry__", {})
        if registry.get("version") != version:
            registry.clear()
            registry["version"] = version
        for text, category_name, line in places:
            category = _category(category_name)
            if category is not None:
                registry[(text, category, line)] = True
                count += 1
    for text, category_name in state["once"]:
        category = _category(category_name)
        if category is not None:
            warnings.onceregistry[(text, category)] = True
            count += 1
    return count
