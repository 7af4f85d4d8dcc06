"""What the server asks a kernel over its *control* channel: answered even while a cell runs.

Shell requests (``server_calls``) queue behind the running cell; ipykernel serves the control
channel on a thread of its own. The criu backend pauses busy kernels, so it needs two answers
that cannot wait for the cell:

* ``identify``: the process token (after a restore, the proof that this is the very process
  that paused) and the PID;
* ``release_parent`` before a process snapshot: ipykernel's parent poller ends a kernel whose
  parent process changes, and a kernel restored under a restarted server has a new parent.
  The poller then only ends the kernel once it is orphaned (its parent is init), and
  ``identify`` after the restore makes the server that restored it the parent to follow.
  It also lets go of IPython's history database (``history.sqlite``, shared by every kernel
  of the profile): other kernels grow it while this process is away, and criu restores no
  process holding a file whose size changed. ``identify`` opens it again (after a restore,
  or after a snapshot that failed: the kernel ran on).

The handler is one entry in ipykernel's ``control_handlers``; ``uninstall`` removes it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from .token import process_token

#: Message types of the request and its reply (the content carries ``op``).
REQUEST_MSG_TYPE = "jupyter_pause_control_request"
REPLY_MSG_TYPE = "jupyter_pause_control_reply"

_released = False  # the parent poller was told to stop following the parent's PID
_history: Any = None  # IPython's history manager, its database let go of until reopened


def install(kernel: Any) -> None:
    """Answer the server's control requests in this kernel (a no-op outside a kernel)."""
    handlers = getattr(kernel, "control_handlers", None)
    if isinstance(handlers, dict):
        handlers[REQUEST_MSG_TYPE] = _Handler(kernel)


def uninstall(kernel: Any) -> None:
    handlers = getattr(kernel, "control_handlers", None)
    if isinstance(handlers, dict) and isinstance(handlers.get(REQUEST_MSG_TYPE), _Handler):
        del handlers[REQUEST_MSG_TYPE]


class _Handler:
    """ipykernel calls it with (stream, idents, message) on its control thread."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __call__(self, stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        global _released, _history
        op = (parent.get("content") or {}).get("op")
        content: dict[str, Any] = {"ok": True, "token": process_token(), "pid": os.getpid()}
        if op == "identify":
            if _released:  # restored: follow the server that brought this process back
                _follow_parent(os.getppid())
                _released = False
            if _history is not None:
                _reopen_history(_history)
                _history = None
        elif op == "release_parent":
            _released = _follow_parent(0) or _released
            _history = _history or _release_history()
        else:
            content = {"ok": False, "error": f"unknown control request {op!r}"}
        self.kernel.session.send(stream, REPLY_MSG_TYPE, content, parent, idents)


def _follow_parent(pid: int) -> bool:
    """Point ipykernel's parent poller at ``pid`` (0: only an orphaned kernel ends); False
    when this kernel has no such poller (an independent kernel, another kernel app)."""
    try:
        from ipykernel.kernelapp import IPKernelApp
    except ImportError:
        return False
    if not IPKernelApp.initialized():
        return False
    poller = getattr(IPKernelApp.instance(), "poller", None)
    if poller is None or not hasattr(poller, "parent_pid"):
        return False
    poller.parent_pid = pid
    return True


def _history_manager() -> Any:
    """IPython's history manager when it keeps a history file (None otherwise)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    manager = getattr(get_ipython(), "history_manager", None)
    if manager is None or not getattr(manager, "enabled", False):
        return None
    if str(getattr(manager, "hist_file", ":memory:")) == ":memory:":
        return None
    return manager


def _release_history() -> Any:
    """Write out IPython's pending history, stop its saving thread and close the database
    (the thread closes its own connection); the manager, to reopen it, or None.

    Until then a cell's inputs stay in the manager's cache (its saving thread is gone, so
    nothing tries to write them).
    """
    manager = _history_manager()
    if manager is None:
        return None
    with contextlib.suppress(Exception):  # what it cannot write stays in its cache
        manager.writeout_cache()
    thread = getattr(manager, "save_thread", None)
    if thread is not None:
        thread.stop()
        manager.save_thread = None
    with contextlib.suppress(Exception):
        manager.db.close()
    return manager


def _reopen_history(manager: Any) -> None:
    """Open the history database again, restart the saving thread, and let it write out what
    the cells entered meanwhile."""
    try:
        from IPython.core.history import HistorySavingThread

        manager.init_db()
        if getattr(manager, "save_thread", None) is None:
            manager.save_thread = HistorySavingThread(manager)
            manager.save_thread.start()
        flag = getattr(manager, "save_flag", None)
        if flag is not None:
            flag.set()
    except Exception:  # a kernel without its history still runs
        return
