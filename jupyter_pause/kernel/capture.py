"""What a checkpoint saves: the marked names, else every user variable that can be saved.

Values that can never cross into another process (open files, sockets, generators, locks,
CUDA streams, ...) are skipped up front with a reason that says what to do instead; anything
else that fails to pickle is skipped later with the pickler's own reason.
"""

from __future__ import annotations

import io
import socket
import sys
import threading
import types
from typing import Any

# Names IPython and ipykernel put in every namespace; they are not the user's state.
_SHELL_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def _is_user_name(name: str) -> bool:
    return not name.startswith("_") and name not in _SHELL_NAMES


def unsavable_reason(value: Any) -> str | None:
    """Why this value can never be saved, or None when it is worth trying."""
    if isinstance(value, io.IOBase):
        what = getattr(value, "name", None)
        label = f"open file {what!r}" if isinstance(what, str) else "open file or stream"
        return f"{label}: a file handle belongs to its process; open it again after restore"
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
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(value, sqlite3.Connection):
        return "database connection: reconnect after restore"
    subprocess = sys.modules.get("subprocess")
    if subprocess is not None and isinstance(value, subprocess.Popen):
        return "running process: it stays with this session; start it again after restore"
    return None


def select_variables(
    namespace: dict[str, Any],
    hidden: dict[str, Any],
    marked: list[str],
    save_unmarked: str,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The variables to save (name -> value) and the names skipped with their reasons."""
    skipped: dict[str, str] = {}
    if marked:
        names = list(marked)
    elif save_unmarked == "none":
        names = []
    else:
        names = [
            name
            for name, value in namespace.items()
            if _is_user_name(name)
            and not (name in hidden and hidden[name] is value)
            and not isinstance(value, types.ModuleType)
        ]
    values: dict[str, Any] = {}
    for name in names:
        if name not in namespace:
            skipped[name] = "marked, but not defined in the namespace"
            continue
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            skipped[name] = "module: import it again after restore"
            continue
        reason = unsavable_reason(value)
        if reason:
            skipped[name] = reason
        else:
            values[name] = value
    return values, skipped


def rng_states() -> dict[str, Any]:
    """The global random number generators of the libraries the notebook imported."""
    import random

    states: dict[str, Any] = {"python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        states["numpy"] = numpy.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        states["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["torch_cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> list[str]:
    """Put saved generator states back; returns which were restored."""
    import random

    restored = []
    random.setstate(states["python"])
    restored.append("python")
    if "numpy" in states:
        import numpy

        numpy.random.set_state(states["numpy"])
        restored.append("numpy")
    if "torch" in states:
        import torch

        torch.set_rng_state(states["torch"])
        restored.append("torch")
        if "torch_cuda" in states and torch.cuda.is_available():
            cuda_states = states["torch_cuda"][: torch.cuda.device_count()]
            torch.cuda.set_rng_state_all(cuda_states)
            restored.append("torch_cuda")
    return restored
