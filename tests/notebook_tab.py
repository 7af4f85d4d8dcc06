"""A notebook tab's connection to its kernel: the server's kernel websocket, as JupyterLab uses it.

Cells sent here take the path JupyterLab's cells take (browser -> server -> kernel and back),
so a test sees what a user with the notebook open would see.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from jupyter_pause.cli.drill.client import execute_request


class NotebookTab:
    """One open kernel websocket; ``close`` it when the tab closes."""

    def __init__(self, connection: WebSocketClientConnection) -> None:
        self.connection = connection
        self.session = uuid.uuid4().hex

    @classmethod
    async def open(cls, server_url: str, token: str, kernel_id: str) -> NotebookTab:
        """``server_url``: http://host:port/base (no trailing slash)."""
        url = server_url.replace("http://", "ws://", 1) + f"/api/kernels/{kernel_id}/channels"
        request = HTTPRequest(
            f"{url}?session_id={uuid.uuid4().hex}", headers={"Authorization": f"token {token}"}
        )
        return cls(await websocket_connect(request))

    def execute(self, code: str) -> str:
        """Send a cell to run; returns its request id (follow it with ``output``)."""
        msg_id = uuid.uuid4().hex
        message = execute_request(msg_id, self.session, code, username="test")
        self.connection.write_message(json.dumps(message))
        return msg_id

    async def next_message(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The next message the kernel sent about request ``msg_id``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no message about {msg_id} in {timeout} s"
            raw = await asyncio.wait_for(self.connection.read_message(), left)
            assert raw is not None, "the kernel websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg

    async def output(self, msg_id: str, timeout: float) -> str:
        """Everything the cell prints until it ends (fails on an error in it)."""
        out: list[str] = []
        while True:
            msg = await self.next_message(msg_id, timeout)
            kind = msg["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                raise AssertionError(f"{msg['content']['ename']}: {msg['content']['evalue']}")
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)

    async def run(self, code: str, timeout: float = 120) -> str:
        return await self.output(self.execute(code), timeout)

    def close(self) -> None:
        self.connection.close()
