"""The open notebooks' kernel connections, moved to a kernel's new address.

A kernel-pod resume brings a kernel back under its id in a new pod: new address, new ports
(``backends/kernel_pods.py``). jupyter-server connects a websocket's ZMQ streams once, when it
opens, and keeps a closed websocket's streams to replay to the same session when it reconnects.
So each open websocket of that kernel is closed with 1012 ("service restart"): JupyterLab
reconnects at once, as after a network drop (no "kernel restarting" dialog, its cells and
outputs as they were), and its new websocket's streams go to the new pod, the old ones dropped.
The resume does this once the restore is done (``RestoreOutcome.moved``, ``resuming.py``).
"""

from __future__ import annotations

from typing import Any

#: RFC 6455: the server is restarting; a client may reconnect.
SERVICE_RESTART = 1012


def reconnect_notebooks(kernel_manager: Any, kernel_id: str) -> int:
    """Close the websockets open on ``kernel_id`` so their clients reconnect to its new
    address; how many were open."""
    from jupyter_server.services.kernels.connection.channels import (
        ZMQChannelsWebsocketConnection,
    )

    open_here = [
        c for c in list(ZMQChannelsWebsocketConnection._open_sockets) if c.kernel_id == kernel_id
    ]
    for connection in open_here:

        def drop_buffer(_: Any) -> None:
            # jupyter-server buffered the closed websocket's streams (the old pod's) to replay
            # them to its session: a reconnect must get new ones.
            kernel_manager.stop_buffering(kernel_id)

        connection._close_future.add_done_callback(drop_buffer)
        protocol = connection.websocket_handler.ws_connection
        if protocol is None:  # closing already
            continue
        # The protocol's close, not the handler's: that one forgets the websocket's protocol
        # at once, and jupyter-server then reads a message the client sent before it saw the
        # close (JupyterLab's kernel_info request) in the legacy binary format: a v1 message
        # read so asks for ~400 million buffers, and building that blocks the whole server
        # for ~30 s before it fails. Here such a message reaches the old pod's streams, as
        # any message sent just before the move would.
        protocol.close(SERVICE_RESTART, "the kernel moved to a new pod")
    return len(open_here)
