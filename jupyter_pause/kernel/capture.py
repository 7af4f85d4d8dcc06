"""What a checkpoint saves: the marked names, else every user variable that can be saved.

Names bound by imports (``import numpy as np``, ``from torch import nn``, ``from math import
sqrt``) are not variables: they are recorded as imports and imported again on restore.
Values that can never cross into another process (sockets, generators, locks, CUDA streams,
...) are skipped up front with a reason that says what to do instead; anything else that
fails to pickle is skipped later with the pickler's own reason.
"""

from __future__ import annotations

import socket
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

from . import handles
from .after_import import call_after_import

# Names IPython and ipykernel put in every namespace; they are not the user's state.
_SHELL_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def _is_user_name(name: str) -> bool:
    return not name.startswith("_") and name not in _SHELL_NAMES


def unsavable_reason(value: Any) -> str | None:
    """Why this value can never be saved, or None when it is worth trying."""
    if handles.is_handle(value):
        return handles.not_reopenable(value)
    if isinstance(value, socket.socket):
        return "network socket: connections cannot be carried over; reconnect after restore"
    if isinstance(value, types.GeneratorType | types.AsyncGeneratorType | types.CoroutineType):
        return (
            "generator/coroutine: its paused frame cannot be saved; create it again after restore"
        )
    if isinstance(value, _LOCK_TYPES):
        return "lock: locks belong to the threads of one process; create a new one after restore"
    if isinstance(value, threading.Thread):
        return "thread: running threads cannot be saved; start it again after restore"
    if isinstance(value, memoryview):
        return "memoryview: save the array or bytes it views instead"
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        cuda_types = tuple(
            t
            for t in (getattr(torch.cuda, "Stream", None), getattr(torch.cuda, "Event", None))
            if t
        )
        if cuda_types and isinstance(value, cuda_types):
            return "CUDA stream/event: device queues belong to one process; create it again"
    subprocess = sys.modules.get("subprocess")
    if subprocess is not None and isinstance(value, subprocess.Popen):
        return "running process: it stays with this session; start it again after restore"
    return _jax_reason(value)


def _jax_reason(value: Any) -> str | None:
    """JAX values that hold a traced computation, which no process can carry."""
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(jax, "core"):
        return None
    if isinstance(value, jax.core.Tracer):
        return (
            "a JAX tracer that escaped its jit/grad/vmap trace: it has no value outside that "
            "trace; compute it again after the restore"
        )
    kind = type(value)
    if kind.__module__.startswith("jax.") and kind.__name__ == "VJP":
        return "a JAX pullback from `jax.vjp`: call `jax.vjp` again after the restore"
    partial = getattr(getattr(jax, "tree_util", None), "Partial", None)
    inner = getattr(value, "func", None)
    if (
        partial is not None
        and isinstance(value, partial)
        and type(inner).__module__.startswith("jax._src.")  # a linearized jaxpr's wrapper
    ):
        return (
            "a JAX function holding a traced computation (`jax.linearize`, `jax.vjp`): call "
            "it again after the restore"
        )
    return None


@dataclass
class Import:
    """A name the notebook bound by importing: ``module`` itself, or ``attribute`` of it."""

    name: str
    module: str
    attribute: str | None = None

    def statement(self) -> str:
        if self.attribute is None:
            alias = "" if self.name == self.module else f" as {self.name}"
            return f"import {self.module}{alias}"
        alias = "" if self.name == self.attribute else f" as {self.name}"
        return f"from {self.module} import {self.attribute}{alias}"


@dataclass
class Selection:
    """What a checkpoint saves from the namespace."""

    values: dict[str, Any] = field(default_factory=dict)  # variables: name -> value
    imports: list[Import] = field(default_factory=list)  # in the order they were imported
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why not


def imported_as(name: str, value: Any) -> Import | None:
    """The import that bound ``value``, when importing it again gives the very same object."""
    if isinstance(value, types.ModuleType):
        module = getattr(value, "__name__", None)
        if isinstance(module, str) and sys.modules.get(module) is value:
            return Import(name, module)
        return None
    home = ufunc_home(value)
    if home is not None:
        return Import(name, home, value.__name__)
    if type(value) is float:
        # `from numpy import nan`: a module's float constant keeps its identity (`x is nan`);
        # a float the notebook computed is a new object that no module holds under its name.
        home = _public_home(name, value)
        return Import(name, home, name) if home is not None else None
    if not isinstance(value, type | types.FunctionType | types.BuiltinFunctionType):
        return None
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(module, str) or module == "__main__" or not isinstance(qualname, str):
        return None
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return Import(name, module, qualname) if found is value else None


#: The notebook's own namespace under the names pickle's module search also looks in.
_NOTEBOOK_MODULES = frozenset({"__main__", "__mp_main__"})


def ufunc_home(value: Any) -> str | None:
    """The module to import a numpy ufunc from when it does not say (None for anything else).

    Ufuncs made by extension modules (``scipy.special.expit``) have no ``__module__``, so
    pickle looks for them in every module; once ``multiprocessing`` is imported (torch,
    scikit-learn and joblib import it) the notebook's namespace is one of them,
    ``__mp_main__``, and they were pickled as attributes of the notebook. The public module
    with the shortest name that holds the very object wins (``scipy.special``, not
    ``scipy.special._ufuncs``).
    """
    numpy = sys.modules.get("numpy")
    ufunc = getattr(numpy, "ufunc", None)
    if ufunc is None or not isinstance(value, ufunc) or getattr(value, "__module__", None):
        return None
    return _public_home(value.__name__, value)


def _public_home(name: str, value: Any) -> str | None:
    """The module that holds ``value`` as ``name`` (None if none does): the public one with the
    shortest name wins. Module ``__dict__``s are read directly, so no lazy module
    ``__getattr__`` runs (or warns)."""
    holders = [
        module_name
        for module_name, module in list(sys.modules.items())
        if module_name not in _NOTEBOOK_MODULES
        and getattr(module, "__dict__", {}).get(name) is value
    ]
    if not holders:
        return None
    return min(holders, key=lambda n: (any(p.startswith("_") for p in n.split(".")), len(n), n))


def _import_order(imports: list[Import]) -> list[Import]:
    """First imported first: sys.modules keeps modules in the order they were imported."""
    position = {module: index for index, module in enumerate(sys.modules)}
    return sorted(imports, key=lambda imp: position.get(imp.module, len(position)))


def select_variables(
    namespace: dict[str, Any],
    hidden: dict[str, Any],
    marked: list[str],
    save_unmarked: str,
) -> Selection:
    """The variables to save, the imports to redo (always, marked or not), what is skipped."""
    selection = Selection()
    user_names = [
        name
        for name, value in namespace.items()
        if _is_user_name(name) and not (name in hidden and hidden[name] is value)
    ]
    imports = {}
    for name in user_names:
        found = imported_as(name, namespace[name])
        if found is not None:
            imports[name] = found
        elif isinstance(namespace[name], types.ModuleType):
            selection.skipped[name] = (
                "module not importable by its name (made by hand?): create it again after restore"
            )
    selection.imports = _import_order(list(imports.values()))
    if marked:
        names = list(marked)
    elif save_unmarked == "none":
        names = []
    else:
        names = [n for n in user_names if n not in imports and n not in selection.skipped]
    for name in names:
        if name in imports:
            continue
        if name not in namespace:
            selection.skipped[name] = "marked, but not defined in the namespace"
            continue
        value = namespace[name]
        reason = unsavable_reason(value)
        if reason:
            selection.skipped[name] = reason
        else:
            selection.values[name] = value
    return selection


def rng_states() -> dict[str, Any]:
    """The global random number generators of the libraries the notebook imported."""
    import random

    states: dict[str, Any] = {"python": random.getstate()}
    # Not imported (numpy 2 imports it at first use): its generator was never drawn from, and
    # importing it here would only cost memory.
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        states["numpy"] = numpy_random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        # As bytes: a pickled tensor goes through torch.save, whose random serialization id
        # would make an unchanged state a new buffer at every checkpoint.
        states["torch"] = torch.get_rng_state().numpy().tobytes()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["torch_cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    return states


def _byte_tensor(state: Any) -> Any:
    import torch

    if isinstance(state, bytes):
        return torch.frombuffer(bytearray(state), dtype=torch.uint8)
    return state  # a checkpoint from before states were kept as bytes


def set_rng_states(states: dict[str, Any]) -> list[str]:
    """Put saved generator states back; returns which were restored. numpy's goes back when
    ``numpy.random`` is imported, now or at its first use (``after_import``)."""
    import random

    restored = []
    random.setstate(states["python"])
    restored.append("python")
    if "numpy" in states:
        numpy_state = states["numpy"]
        call_after_import(
            "numpy.random",
            lambda numpy_random: numpy_random.set_state(numpy_state),
            "numpy's random generator state",
        )
        restored.append("numpy")
    if "torch" in states:
        import torch

        torch.set_rng_state(_byte_tensor(states["torch"]))
        restored.append("torch")
        if "torch_cuda" in states and torch.cuda.is_available():
            cuda_states = states["torch_cuda"][: torch.cuda.device_count()]
            torch.cuda.set_rng_state_all([_byte_tensor(state) for state in cuda_states])
            restored.append("torch_cuda")
    return restored
