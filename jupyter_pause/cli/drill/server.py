"""A server of the drill's own, started as ``make lab`` starts one, stopped at the end."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from ..client import ServerInfo
from .client import DrillError


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnServer:
    """jupyter-server with jupyter_pause in a temporary root and store; ``info`` reaches it."""

    def __init__(self, gpus: int, backend: str | None, timeout: float) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="pause-drill-"))
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        root, store = self.folder / "root", self.folder / "store"
        root.mkdir()
        config = {
            "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}, "open_browser": False},
            "IdentityProvider": {"token": self.token},
            "PauseApp": {"store_root": str(store), "gpu_count": gpus},
        }
        if backend:
            config["PauseApp"]["backend"] = backend
        (self.folder / "jupyter_server_config.json").write_text(json.dumps(config))
        self.command = [
            sys.executable,
            "-m",
            "jupyter_server",
            f"--port={self.port}",
            "--no-browser",
            f"--ServerApp.root_dir={root}",
            f"--config={self.folder / 'jupyter_server_config.json'}",
        ]
        if os.geteuid() == 0:
            self.command.append("--allow-root")
        self.timeout = timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.info = ServerInfo(f"http://127.0.0.1:{self.port}/", self.token, str(root))

    def __enter__(self) -> OwnServer:
        log = (self.folder / "server.log").open("wb")
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.folder / "runtime")}
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DrillError(f"the drill's server exited: see {self.folder / 'server.log'}")
            try:
                request = urllib.request.Request(self.info.url + "jupyter-pause/status")
                request.add_header("Authorization", f"token {self.token}")
                urllib.request.urlopen(request, timeout=2).close()
                return self
            except OSError:
                time.sleep(0.3)
        raise DrillError(f"the drill's server did not start within {self.timeout:.0f} s")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
