"""A real JupyterHub on this machine, as deploy/jupyterhub/jupyterhub_config.py ships it.

The Hub (JupyterHub 6.1.1), its configurable-http-proxy (npm, from the project's
node_modules), the idle culler as a Hub service, and each user's jupyterhub-singleuser with
jupyter_pause, spawned by SimpleLocalProcessSpawner (LocalProcessSpawner without system
users: the same SIGINT/SIGTERM stop). The tests drive it through the Hub's REST API with a
service token of their own, and reach each user's server through the proxy.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cluster.notebooks import RemoteServer
from .server_process import free_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOY_CONFIG = ROOT / "deploy" / "jupyterhub" / "jupyterhub_config.py"
PROXY = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"


@dataclass
class Hub:
    url: str  # the proxy's public URL (what a browser opens)
    token: str  # a service token of the tests': admin of users and servers
    process: subprocess.Popen[bytes]
    workdir: Path
    log: Path

    def request(self, method: str, path: str, body: Any = None, token: str | None = None):
        """The Hub's REST API (``/hub/api`` + path): (status, JSON or None)."""
        request = urllib.request.Request(
            f"{self.url}/hub/api{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {token or self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                raw, code = answer.read(), answer.status
        except urllib.error.HTTPError as err:
            raw, code = err.read(), err.code
        try:
            return code, json.loads(raw) if raw else None
        except ValueError:  # the proxy's own error page while the Hub starts or stops
            return code, raw.decode(errors="replace")

    def user(self, name: str) -> dict[str, Any]:
        code, model = self.request("GET", f"/users/{name}")
        assert code == 200, (code, model)
        return model

    def server(self, name: str) -> dict[str, Any] | None:
        """The user's default server as the Hub sees it; None when it is stopped."""
        return (self.user(name).get("servers") or {}).get("")

    def spawn(self, name: str, timeout: float = 90) -> RemoteServer:
        """Start the user's server (as their login does) and wait until the Hub says ready."""
        code, body = self.request("POST", f"/users/{name}/server")
        assert code in (201, 202), (code, body, self.tail())
        deadline = time.monotonic() + timeout
        while not (self.server(name) or {}).get("ready"):
            assert time.monotonic() < deadline, f"{name}'s server never got ready:\n{self.tail()}"
            time.sleep(0.2)
        return RemoteServer(f"{self.url}/user/{name}", self.token)

    def wait_stopped(self, name: str, timeout: float = 60) -> float:
        """Until the Hub has no server for the user; returns when that was seen (time.time)."""
        deadline = time.monotonic() + timeout
        while self.server(name) is not None:
            assert time.monotonic() < deadline, f"{name}'s server still up:\n{self.tail()}"
            time.sleep(0.1)
        return time.time()

    def home(self, name: str) -> Path:
        return self.workdir / "home" / name

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def start_hub(workdir: Path, cull_seconds: int = 3600, extra: str = "") -> Hub:
    """A Hub on free loopback ports, its state in ``workdir``; ``extra``: more config lines
    (after the shipped file's, e.g. other server_token_scopes)."""
    assert PROXY.exists(), f"{PROXY} is missing: run `make setup` (jlpm install)"
    workdir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    port, hub_port, api_port = free_port(), free_port(), free_port()
    config = workdir / "jupyterhub_config.py"
    config.write_text(
        f"load_subconfig({str(DEPLOY_CONFIG)!r})\n"
        f"c.JupyterHub.bind_url = 'http://127.0.0.1:{port}'\n"
        f"c.JupyterHub.hub_bind_url = 'http://127.0.0.1:{hub_port}'\n"
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{api_port}'\n"
        "c.JupyterHub.services.append({'name': 'tests', 'api_token': %r})\n"
        "c.JupyterHub.load_roles.append({'name': 'tests', 'services': ['tests'], 'scopes': "
        "['admin:users', 'admin:servers', 'access:servers', 'read:users:activity']})\n"
        "c.Authenticator.allowed_users = {'alice', 'bob'}\n"
        "c.Spawner.http_timeout = 60\n"
        "c.Spawner.start_timeout = 90\n" % token + extra
    )
    env = {
        **os.environ,
        "JUPYTER_PAUSE_HUB_DEMO": str(workdir),
        "JUPYTER_PAUSE_HUB_CULL_SECONDS": str(cull_seconds),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    env.pop("JUPYTER_PAUSE_STORE", None)  # each user's store is in their own home
    log = workdir / "hub.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
    hub = Hub(f"http://127.0.0.1:{port}", token, process, workdir, log)
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, f"the Hub exited:\n{hub.tail()}"
        try:
            if hub.request("GET", "/")[0] == 200:
                return hub
        except OSError:
            pass
        assert time.monotonic() < deadline, f"the Hub never answered:\n{hub.tail()}"
        time.sleep(0.2)
