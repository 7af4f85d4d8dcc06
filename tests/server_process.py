"""A jupyter server with jupyter_pause in a process of its own: stopping it and starting
another on the same store is a real server restart (kernels see their parent change)."""

from __future__ import annotations

import os
import pwd
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


def server_config(port: int, token: str, root_dir: Path) -> str:
    """The config lines of every test server: loopback, a token, its root, no browser."""
    return (
        f"c.ServerApp.port = {port}\n"
        "c.ServerApp.ip = '127.0.0.1'\n"
        f"c.IdentityProvider.token = {token!r}\n"
        f"c.ServerApp.root_dir = {str(root_dir)!r}\n"
        "c.ServerApp.open_browser = False\n"
        "c.ServerApp.allow_root = True\n"
    )


def spawn_server(
    config_file: Path,
    env: dict[str, str],
    cwd: Path,
    log: Path,
    user: pwd.struct_passwd | None = None,
) -> subprocess.Popen[bytes]:
    """``jupyter_server --config=config_file`` in its own process, its output in ``log``; as
    ``user`` when given (this process must be root)."""
    as_user: dict = {}
    if user is not None:
        env = {**env, "HOME": str(config_file.parent), "USER": user.pw_name}
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--config={config_file}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            **as_user,
        )


def wait_serving(process: subprocess.Popen[bytes], url: str, token: str, log: Path) -> None:
    """Until the server answers ``/api/status``; AssertionError with its log if it exits or
    does not answer within a minute."""
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline, f"no answer from the server:\n{log.read_text()}"
            time.sleep(0.2)


def start_server(
    workdir: Path, root_dir: Path, config: str, user: pwd.struct_passwd | None = None
) -> ServerProcess:
    """A server serving ``root_dir``, its files in ``workdir``; ``config``: more config lines;
    ``user``: the OS user it runs as (it owns ``workdir`` and ``root_dir``)."""
    workdir.mkdir(parents=True)
    port, token = free_port(), secrets.token_hex(16)
    config_file = workdir / "jupyter_server_config.py"
    config_file.write_text(
        "c.ServerApp.jpserver_extensions = {'jupyter_pause': True}\n"
        + server_config(port, token, root_dir)
        + config
    )
    if user is not None:
        for folder in (workdir, root_dir):
            chown_tree(folder, user)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(JUPYTER_RUNTIME_DIR=str(workdir / "runtime"), JUPYTER_CONFIG_DIR=str(workdir))
    log = workdir / "server.log"
    process = spawn_server(config_file, env, root_dir, log, user)
    started = ServerProcess(process, RemoteServer(f"http://127.0.0.1:{port}", token), log)
    wait_serving(process, started.server.url, token, log)
    return started


def chown_tree(folder: Path, user: pwd.struct_passwd) -> None:
    """``chown -R user: folder``."""
    for path in (folder, *folder.rglob("*")):
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


#: The second OS user of the tests that need two (created when the tests run as root).
PEER_USER = "jupyter-pause-peer"


def peer_user() -> pwd.struct_passwd | None:
    """Another OS user than this process's, who can run this Python and this checkout; ``None``
    when this process is not root (it cannot start a process as anyone else)."""
    if os.geteuid() != 0:
        return None
    try:
        user = pwd.getpwnam(PEER_USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PEER_USER],
            capture_output=True,
            text=True,
        )
        try:  # (a test beside this one may have made it first)
            user = pwd.getpwnam(PEER_USER)
        except KeyError:
            raise AssertionError(f"useradd {PEER_USER} failed: {made.stderr}") from None
    probe = subprocess.run(
        [sys.executable, "-c", "import jupyter_pause, jupyter_server, ipykernel"],
        capture_output=True,
        text=True,
        cwd="/",
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
    )
    if probe.returncode != 0:
        raise AssertionError(
            f"the user {PEER_USER} cannot run {sys.executable} with this checkout: every folder "
            "above it needs search permission for others (`chmod o+x` on it, as .ci/run does "
            f"for /root):\n{probe.stderr[-2000:]}"
        )
    return user
