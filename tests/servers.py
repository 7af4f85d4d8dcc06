"""The test server, driven through its REST API the way the frontend and the CLI drive it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from . import openapi_contract


class Server:
    """The test server, driven the way the frontend and the CLI drive it."""

    def __init__(self, fetch: Any, app: Any) -> None:
        self.fetch = fetch
        self.app = app

    @property
    def orchestrator(self) -> Any:
        return self.app.web_app.settings["jupyter_pause_orchestrator"]

    async def start_extension(self) -> None:
        """What a server does once it serves (the test server never gets there): start the
        extension (its backend's start-up checks, the idle monitor)."""
        (app,) = self.app.extension_manager.extension_apps["jupyter_pause"]
        await app._start_jupyter_server_extension(self.app)

    async def restart_extension(self) -> None:
        """What a server restart does to the extension: its memory is gone, the store remains."""
        (app,) = self.app.extension_manager.extension_apps["jupyter_pause"]
        await app.stop_extension()
        app.initialize_settings()
        await app._start_jupyter_server_extension(self.app)
        self.app.web_app.settings["jupyter_pause_orchestrator"] = app.orchestrator

    async def call(self, method: str, *parts: str, body: Any = None) -> tuple[int, Any]:
        """One request; its answer (or error) must be one the OpenAPI document describes."""
        kwargs: dict[str, Any] = {"method": method}
        if method != "GET":
            kwargs["body"] = json.dumps(body or {})
        url_path = "/".join(("/jupyter-pause", *parts))
        try:
            response = await self.fetch("jupyter-pause", *parts, **kwargs)
        except HTTPClientError as err:
            assert err.response is not None
            openapi_contract.check(method, url_path, err.code, json.loads(err.response.body))
            raise
        answer = json.loads(response.body) if response.body else None
        openapi_contract.check(method, url_path, response.code, answer)
        return response.code, answer

    async def error(self, method: str, *parts: str) -> tuple[int, str]:
        with pytest.raises(HTTPClientError) as info:
            await self.call(method, *parts)
        return info.value.code, json.loads(info.value.response.body)["message"]

    async def open_notebook(self, path: str) -> str:
        """What JupyterLab does when a notebook opens: a session with a kernel."""
        body = {
            "path": path,
            "name": os.path.basename(path),
            "type": "notebook",
            "kernel": {"name": "python3"},
        }
        response = await self.fetch("api", "sessions", method="POST", body=json.dumps(body))
        return json.loads(response.body)["kernel"]["id"]

    async def run(self, kernel_id: str, code: str, timeout: float = 120) -> str:
        """Execute a cell as a user would; returns its stdout, fails on an error."""
        client = self.app.kernel_manager.get_kernel(kernel_id).client()
        out: list[str] = []
        errors: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

        client.start_channels()
        try:  # closed however it ends: a socket left open fails a later test (ResourceWarning)
            await client.wait_for_ready(timeout=60)  # iopub subscribed: no output is missed
            await client.execute_interactive(code, output_hook=hook, timeout=timeout)
        finally:
            client.stop_channels()
        assert not errors, errors
        return "".join(out)

    async def watched(self, path: str) -> dict[str, Any]:
        """Wait until the server watches the notebook's kernel (sees every busy/idle change)."""
        return await self.wait_for(path, lambda r: r["watching"])

    async def wait_for(self, path: str, check: Any, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            _, record = await self.call("GET", "sessions", path)
            if check(record):
                return record
            assert time.monotonic() < deadline, f"{path}: condition not met: {record}"
            await asyncio.sleep(0.05)

    async def wait_state(self, path: str, *states: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            _, record = await self.call("GET", "sessions", path)
            if record["state"] in states:
                return record
            assert time.monotonic() < deadline, f"{path} stuck in {record['state']}: {record}"
            await asyncio.sleep(0.1)


async def pause_and_wait(server: Server, path: str) -> dict[str, Any]:
    code, record = await server.call("POST", "pause", path)
    assert code == 202 and record["state"] == "checkpointing"
    return await server.wait_state(path, "paused", "active")


def pause_server_config(pause_store: Path, **policy: Any) -> dict:
    """A server with jupyter_pause writing to ``pause_store``; ``policy`` overrides PauseApp's
    defaults here: one GPU to share (set by the admin: no GPU needed), short busy waits."""
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}},
        "PauseApp": {
            "store_root": str(pause_store),
            "gpu_count": 1,
            "busy_wait_seconds": 1.0,
            "monitor_interval_seconds": 3600.0,
            **policy,
        },
    }
