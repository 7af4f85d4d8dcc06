"""The drill's hands on a server: its REST APIs and cells run in kernels, as a user runs them.

Cells go over the kernel's websocket (``/api/kernels/<id>/channels``), like JupyterLab's: they
are the user's activity, so the server's timeline sees them (the next cell after a resume).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any

from ..client import EXIT_NO_SERVER, EXIT_UNKNOWN, Client, CliError, quote_path


class DrillError(Exception):
    """A step could not go on; the message says what happened."""


@dataclass
class CellRun:
    stdout: str
    error: str | None
    seconds: float
    done_at: float

    def json_line(self) -> dict[str, Any]:
        """The last line of the output as JSON (the drill's cells print their results so)."""
        if self.error:
            raise DrillError(f"the cell failed: {self.error}")
        lines = [line for line in self.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise DrillError(f"the cell printed no result: {self.stdout[-300:]!r}")
        return json.loads(lines[-1])


class ServerClient(Client):
    """The jupyter_pause API (inherited) and jupyter-server's own REST API."""

    def api(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> Any:
        import urllib.error
        import urllib.request

        url = self.server.url.rstrip("/") + "/api/" + path
        request = urllib.request.Request(url, method=method)
        request.add_header("Authorization", f"token {self.server.token}")
        request.add_header("Content-Type", "application/json")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            request.data = json.dumps(body or {}).encode()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                data = response.read()
        except urllib.error.HTTPError as err:
            raise self.http_error(err) from None
        except OSError as err:
            raise CliError(f"Cannot reach {self.server.url}: {err}", EXIT_NO_SERVER) from None
        return json.loads(data) if data else None

    def session(self, path: str) -> dict[str, Any]:
        return self.get("sessions", quote_path(path))

    def timeline(self, path: str) -> list[dict[str, Any]]:
        return self.get("timeline", quote_path(path))["events"]

    def open_notebook(self, path: str, kernel_name: str = "python3") -> str:
        """What JupyterLab does when a notebook opens: a session with a kernel; its id."""
        body = {
            "path": path,
            "name": path.rsplit("/", 1)[-1],
            "type": "notebook",
            "kernel": {"name": kernel_name},
        }
        return self.api("POST", "sessions", body)["kernel"]["id"]

    def close_notebook(self, path: str) -> None:
        """Shut the notebook's kernel down (the way JupyterLab's "Shut Down Kernel" does)."""
        for session in self.api("GET", "sessions"):
            if session.get("path") == path:
                self.api("DELETE", f"sessions/{session['id']}")

    def kernels_of(self, path: str) -> list[str]:
        return [s["kernel"]["id"] for s in self.api("GET", "sessions") if s.get("path") == path]

    def kernel_ids(self) -> set[str]:
        return {k["id"] for k in self.api("GET", "kernels")}

    def write_notebook(self, path: str, cells: list[str]) -> None:
        folder = path.rsplit("/", 1)[0] if "/" in path else ""
        if folder:
            self.api("PUT", f"contents/{quote_path(folder)}", {"type": "directory"})
        content = {
            "cells": [
                {
                    "id": f"drill-{i}",
                    "cell_type": "code",
                    "metadata": {},
                    "source": code,
                    "outputs": [],
                    "execution_count": None,
                }
                for i, code in enumerate(cells)
            ],
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        body = {"type": "notebook", "format": "json", "content": content}
        self.api("PUT", f"contents/{quote_path(path)}", body)

    def list_folder(self, path: str) -> list[dict[str, Any]]:
        """The folder's entries (name, path, type), as the contents API lists them (hidden
        files are not); empty when there is no such folder."""
        try:
            listing = self.api("GET", f"contents/{quote_path(path)}?content=1")
        except CliError as err:
            if err.code != EXIT_UNKNOWN:
                raise
            return []
        return listing["content"] if listing.get("type") == "directory" else []

    def delete_file(self, path: str) -> None:
        try:
            self.api("DELETE", f"contents/{quote_path(path)}")
        except CliError as err:
            if err.code != EXIT_UNKNOWN:
                raise

    def run_cell(self, kernel_id: str, code: str, timeout: float = 300.0) -> CellRun:
        return asyncio.run(self._run_cell(kernel_id, code, timeout))

    async def _run_cell(self, kernel_id: str, code: str, timeout: float) -> CellRun:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        base = self.server.url.rstrip("/").replace("http", "ws", 1)
        session = uuid.uuid4().hex
        query = urllib.parse.urlencode({"session_id": session})
        request = HTTPRequest(
            f"{base}/api/kernels/{kernel_id}/channels?{query}",
            headers={"Authorization": f"token {self.server.token}"},
        )
        started = time.time()
        connection = await asyncio.wait_for(websocket_connect(request), timeout)
        msg_id = uuid.uuid4().hex
        connection.write_message(json.dumps(execute_request(msg_id, session, code)))
        out: list[str] = []
        error = None
        replied = idle = False
        deadline = time.monotonic() + timeout
        try:
            while not (replied and idle):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DrillError(f"the cell did not finish within {timeout:.0f} s")
                raw = await asyncio.wait_for(connection.read_message(), remaining)
                if raw is None:
                    raise DrillError("the kernel's connection closed while the cell ran")
                if not isinstance(raw, str):
                    continue
                msg = json.loads(raw)
                if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["header"]["msg_type"], msg["content"]
                if kind == "stream":
                    out.append(content["text"])
                elif kind == "error":
                    error = f"{content['ename']}: {content['evalue']}"
                elif kind == "execute_reply":
                    replied = True
                elif kind == "status" and content.get("execution_state") == "idle":
                    idle = True
        finally:
            connection.close()
        done = time.time()
        return CellRun("".join(out), error, done - started, done)


def execute_request(
    msg_id: str, session: str, code: str, username: str = "pause-drill"
) -> dict[str, Any]:
    """A cell to run, as a notebook tab sends it on the server's kernel websocket."""
    return {
        "header": {
            "msg_id": msg_id,
            "session": session,
            "username": username,
            "msg_type": "execute_request",
            "version": "5.3",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
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
