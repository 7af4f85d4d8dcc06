"""jupyter_pause: pause a GPU notebook session and continue the same experiment later.

This module stays tiny and lazy: a kernel that runs ``%load_ext jupyter_pause`` must not
import jupyter_server, and the server must not import the kernel-side machinery.
"""

from __future__ import annotations

from typing import Any

from .version import __version__

__all__ = [
    "__version__",
    "checkpoint",
    "delete",
    "drop",
    "every",
    "keep",
    "list_checkpoints",
    "marked",
    "process_token",
    "restore",
]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-pause"}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .server.app import PauseApp

    return [{"module": "jupyter_pause.server.app", "app": PauseApp}]


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext jupyter_pause``: registers ``%checkpoint`` and change tracking."""
    from .kernel.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Called by ``%unload_ext jupyter_pause``: removes every hook ``load`` installed."""
    from .kernel.extension import unload

    unload(ipython)


def process_token() -> str:
    """The random token that lives only in this process's memory.

    A manifest records the token of the process that wrote it, so a session whose token
    still matches after a resume is the same live process (restored from a snapshot), not a
    new process rebuilt from files.
    """
    from .kernel.token import process_token as _token

    return _token()


def _current() -> Any:
    from .kernel.current import current

    return current()


def checkpoint(*, full: bool = False) -> Any:
    """Save the marked variables (or every savable one) now; returns a ``CheckpointResult``."""
    return _current().checkpoint(full=full)


def restore(checkpoint_id: int | None = None, names: list[str] | None = None) -> Any:
    """Load the latest (or the given) checkpoint into the namespace; returns a ``RestoreResult``."""
    return _current().restore(checkpoint_id, names)


def keep(*names: str) -> list[str]:
    """Mark variables to save; returns the marked set."""
    return _current().keep(*names)


def drop(*names: str) -> list[str]:
    """Unmark variables; returns the marked set."""
    return _current().drop(*names)


def marked() -> list[str]:
    """The marked variable names (empty: every savable variable is saved)."""
    return _current().marked()


def list_checkpoints() -> list[Any]:
    """The checkpoints of this notebook, oldest first, as ``CheckpointInfo`` records."""
    return _current().list_checkpoints()


def delete(checkpoint_id: int) -> None:
    """Delete one checkpoint; its data is collected when no other checkpoint uses it."""
    _current().delete(checkpoint_id)


def every(interval: str | float | None) -> Any:
    """Take checkpoints on a schedule (``"30m"``, seconds as a number), ``None``/"off" to stop."""
    return _current().every(interval)
