"""A jupyter server in a test "pod", driven over HTTP and websockets as JupyterLab drives it.

The server runs in another process (the pod), so these calls block; cells run through the
server's kernel websocket, the path JupyterLab's cells take (server <-> kernel included).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

from .. import openapi_contract


class RemoteServer:
    """The jupyter server of a pod (its URL changes with the pod; the token does not)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 60
    ) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"{self.url}/{path.lstrip('/')}",
            method=method,
            data=None if method == "GET" else json.dumps(body or {}).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                raw = answer.read()
                code = answer.status
        except urllib.error.HTTPError as err:
            raw, code = err.read(), err.code
        data = json.loads(raw) if raw else None
        if path.startswith("/jupyter-pause/") or path.startswith("jupyter-pause/"):
            url_path = "/" + path.lstrip("/").split("?")[0]
            openapi_contract.check(method, urllib.parse.unquote(url_path), code, data)
        return code, data

    def session(self, path: str) -> dict[str, Any]:
        code, record = self.request("GET", f"/jupyter-pause/sessions/{path}")
        assert code == 200, (code, record)
        return record

    def wait_state(self, path: str, *states: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            record = self.session(path)
            if record["state"] in states:
                return record
            assert time.monotonic() < deadline, f"{path} stuck in {record['state']}: {record}"
            time.sleep(0.1)

    def open_notebook(self, path: str) -> str:
        """What JupyterLab does when a notebook opens: a session with a kernel."""
        body = {
            "path": path,
            "name": path.rsplit("/", 1)[-1],
            "type": "notebook",
            "kernel": {"name": "python3"},
        }
        code, model = self.request("POST", "/api/sessions", body)
        assert code == 201, (code, model)
        return model["kernel"]["id"]

    def run(self, kernel_id: str, code: str, timeout: float = 120) -> str:
        """Execute a cell through the server's websocket; its stdout (fails on an error)."""
        return asyncio.run(self._run(kernel_id, code, timeout))

    def start_cell(self, kernel_id: str, code: str) -> None:
        """Start a long cell and leave it running (the tab closes; the kernel carries on)."""
        asyncio.run(self._run(kernel_id, code, 0.0, wait=False))

    async def _run(self, kernel_id: str, code: str, timeout: float, wait: bool = True) -> str:
        from tornado.websocket import websocket_connect

        ws_url = self.url.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels"
        request_url = f"{ws_url}?session_id={uuid.uuid4().hex}"
        connection = await websocket_connect(_authorized(request_url, self.token))
        msg_id = uuid.uuid4().hex
        connection.write_message(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "username": "test",
                        "session": uuid.uuid4().hex,
                        "msg_type": "execute_request",
                        "version": "5.3",
                        "date": "",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": True,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                    "channel": "shell",
                    "buffers": [],
                }
            )
        )
        out: list[str] = []
        errors: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            while wait:
                left = deadline - time.monotonic()
                assert left > 0, f"no answer from kernel {kernel_id} in {timeout} s"
                raw = await asyncio.wait_for(connection.read_message(), left)
                assert raw is not None, "the kernel websocket closed"
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["msg_type"]
                if kind == "stream":
                    out.append(msg["content"]["text"])
                elif kind == "error":
                    errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    break
            if not wait:  # the request is on its way once the kernel says it is busy with it
                while True:
                    msg = json.loads(await asyncio.wait_for(connection.read_message(), 30) or "{}")
                    if msg.get("parent_header", {}).get("msg_id") == msg_id:
                        break
        finally:
            connection.close()
        assert not errors, errors
        return "".join(out)


def _authorized(url: str, token: str) -> Any:
    from tornado.httpclient import HTTPRequest

    return HTTPRequest(url, headers={"Authorization": f"token {token}"})
