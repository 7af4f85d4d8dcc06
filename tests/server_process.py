"""A jupyter server with jupyter_pause in a process of its own: stopping it and starting
another on the same store is a real server restart (kernels see their parent change)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .cluster.notebooks import RemoteServer


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    server: RemoteServer
    log: Path

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it; it shuts its kernels down first."""
        self.process.terminate()
        self.process.wait(60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(workdir: Path, root_dir: Path, config: str) -> ServerProcess:
    """A server serving ``root_dir``, its files in ``workdir``; ``config``: more config lines."""
    workdir.mkdir(parents=True)
    port, token = free_port(), secrets.token_hex(16)
    config_file = workdir / "jupyter_server_config.py"
    config_file.write_text(
        "c.ServerApp.jpserver_extensions = {'jupyter_pause': True}\n"
        f"c.ServerApp.port = {port}\n"
        "c.ServerApp.ip = '127.0.0.1'\n"
        f"c.IdentityProvider.token = {token!r}\n"
        f"c.ServerApp.root_dir = {str(root_dir)!r}\n"
        "c.ServerApp.open_browser = False\n"
        "c.ServerApp.allow_root = True\n" + config
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(JUPYTER_RUNTIME_DIR=str(workdir / "runtime"), JUPYTER_CONFIG_DIR=str(workdir))
    log = workdir / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--config={config_file}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=root_dir,
        )
    started = ServerProcess(process, RemoteServer(f"http://127.0.0.1:{port}", token), log)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(
                f"{started.server.url}/api/status?token={token}", timeout=2
            ):
                return started
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline, f"no answer from the server:\n{log.read_text()}"
            time.sleep(0.2)
