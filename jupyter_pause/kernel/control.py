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

The handler is one entry in ipykernel's ``control_handlers``; ``uninstall`` removes it.
"""

from __future__ import annotations

import os
from typing import Any

from .token import process_token

#: Message types of the request and its reply (the content carries ``op``).
REQUEST_MSG_TYPE = "jupyter_pause_control_request"
REPLY_MSG_TYPE = "jupyter_pause_control_reply"

_released = False  # the parent poller was told to stop following the parent's PID


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
        global _released
        op = (parent.get("content") or {}).get("op")
        content: dict[str, Any] = {"ok": True, "token": process_token(), "pid": os.getpid()}
        if op == "identify":
            if _released:  # restored: follow the server that brought this process back
                _follow_parent(os.getppid())
                _released = False
        elif op == "release_parent":
            _released = _follow_parent(0) or _released
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
