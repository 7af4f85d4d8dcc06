"""Whether a jupyter_pause server follows this kernel, and asking it to act (over iopub).

``server_calls`` (what the server asks of the kernel) marks the kernel attached when a server
introduces itself; the extension and ``%pause`` ask the server through ``request_from_server``.
This module imports nothing of the kernel side, so that all of them can import it.
"""

from __future__ import annotations

from typing import Any

#: Set once a server has introduced itself: ``%pause`` then knows someone is listening.
SERVER_ATTACHED = False
#: iopub message type a kernel uses to ask the server for something (``%pause``).
REQUEST_MSG_TYPE = "jupyter_pause_request"


def request_from_server(action: str, **data: Any) -> bool:
    """Ask the server (over iopub) to act on this kernel; False when no server listens."""
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if not SERVER_ATTACHED or kernel is None:
        return False
    content = {"action": action, **data}
    kernel.session.send(
        kernel.iopub_socket, REQUEST_MSG_TYPE, content, parent=kernel.get_parent("shell")
    )
    return True
