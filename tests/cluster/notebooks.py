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
from typing import Any

from .. import openapi_contract
from ..notebook_tab import NotebookTab


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

    def open_notebook(self, path: str, kernel_name: str = "python3") -> str:
        """What JupyterLab does when a notebook opens: a session with a kernel."""
        body = {
            "path": path,
            "name": path.rsplit("/", 1)[-1],
            "type": "notebook",
            "kernel": {"name": kernel_name},
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
        tab = await NotebookTab.open(self.url, self.token, kernel_id)
        try:
            msg_id = tab.execute(code)
            if wait:
                return await tab.output(msg_id, timeout)
            # the request is on its way once the kernel says something about it
            await tab.next_message(msg_id, 30)
            return ""
        finally:
            tab.close()
