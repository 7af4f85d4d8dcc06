"""A server of the drill's own, started as ``make lab`` starts one, stopped at the end.

Its configuration, log and runtime files live in a temporary folder that goes with it (also
on Ctrl-C and on failure). Its root and store do too, unless the drill keeps its notebook for
a later ``--upgrade-check``: then they live in a stable folder (``server_dir``) that the next
``--own-server --upgrade-check`` serves again.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from jupyter_core.paths import jupyter_data_dir

from ..client import ServerInfo
from .client import DrillError


def default_server_dir() -> Path:
    """Where the drill's own server keeps what ``--keep`` keeps (``--server-dir``)."""
    return Path(jupyter_data_dir()) / "jupyter_pause" / "drill-server"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnServer:
    """jupyter-server with jupyter_pause in a temporary root and store, or the root and store
    of ``kept`` (created when missing); ``info`` reaches it."""

    def __init__(
        self, gpus: int, backend: str | None, timeout: float, kept: Path | None = None
    ) -> None:
        if kept is not None:
            kept.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix="pause-drill-"))
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.kept = kept
        base = self.folder if kept is None else kept
        root, store = base / "root", base / "store"
        root.mkdir(exist_ok=True)
        # The user's own config applies (a backend's settings, e.g. criu_binary): the server
        # is the one they run, but for what the drill must own, given on the command line
        # (which wins over config files). The extension is enabled from a config path of its
        # own, in case the installed one is not (a dict: it merges with the user's), and the
        # token goes in the environment, out of `ps`.
        (self.folder / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_pause": True}}})
        )
        self.command = [
            sys.executable,
            "-m",
            "jupyter_server",
            f"--port={self.port}",
            "--no-browser",
            f"--ServerApp.root_dir={root}",
            f"--PauseApp.store_root={store}",
            f"--PauseApp.gpu_count={gpus}",
        ]
        if backend:
            self.command.append(f"--PauseApp.backend={backend}")
        if os.geteuid() == 0:
            self.command.append("--allow-root")
        self.timeout = timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.info = ServerInfo(f"http://127.0.0.1:{self.port}/", self.token, str(root))

    def __enter__(self) -> OwnServer:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def _start(self) -> None:
        # A kept drill's log is kept with it: its kernels write to it, and the criu backend
        # restores a paused kernel's open log at its path (the next run's server appends).
        log_file = (self.kept or self.folder) / "server.log"
        with log_file.open("ab") as log:
            config_path = os.pathsep.join(
                p for p in (str(self.folder), os.environ.get("JUPYTER_CONFIG_PATH", "")) if p
            )
            env = {
                **os.environ,
                "JUPYTER_RUNTIME_DIR": str(self.folder / "runtime"),
                "JUPYTER_CONFIG_PATH": config_path,
                "JUPYTER_TOKEN": self.token,
            }
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                # (its folder goes with it: what it said comes here)
                tail = log_file.read_text(errors="replace")[-2000:]
                raise DrillError(f"the drill's server exited; its last words:\n{tail}")
            try:
                request = urllib.request.Request(self.info.url + "jupyter-pause/status")
                request.add_header("Authorization", f"token {self.token}")
                urllib.request.urlopen(request, timeout=2).close()
                return
            except OSError:
                time.sleep(0.3)
        raise DrillError(f"the drill's server did not start within {self.timeout:.0f} s")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        """The server stopped (it shuts its kernels down), its temporary folder removed."""
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
