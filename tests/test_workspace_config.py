"""The workspace backend's configuration: what happens outside a pod, and the shipped
configuration (deploy/jupyter_server_config.json) beside the GKE Workspaces add-on's."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .cluster.deploy_manifests import DEPLOY, addon_ipc_config
from .cluster.notebooks import RemoteServer
from .server_process import free_port, server_config, wait_serving
from .servers import Server


@pytest.fixture
def jp_server_config(pause_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The workspace backend asked for where no pod is (no downward API variables)."""
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}},
        "PauseApp": {
            "store_root": str(pause_store),
            "backend": "workspace",
            "service_account_dir": str(tmp_path / "no-service-account"),
            "monitor_interval_seconds": 3600.0,
        },
    }


async def test_a_workspace_backend_without_a_pod_falls_back_to_local_and_loads(
    server: Server,
) -> None:
    # When the server started with the workspace backend but no POD_NAME/POD_NAMESPACE
    code, status = await server.call("GET", "status")

    # Then the extension loaded all the same, on the local backend
    assert code == 200 and status["backend"] == "local"
    code, listing = await server.call("GET", "snapshots")
    assert code == 200 and listing == {"snapshots": [], "problem": None}


def test_the_shipped_json_config_and_the_gke_addons_python_config_both_apply(
    tmp_path: Path,
) -> None:
    # Given /etc/jupyter as a GKE Workspaces pod has it: our jupyter_server_config.json from the
    # image (deploy/Dockerfile), and the add-on's jupyter_server_config.py mounted beside it
    # (its text taken from the add-on's own source, which tests/cluster/test_deploy.py checks
    # is what the running add-on mounts)
    etc = tmp_path / "etc-jupyter"
    etc.mkdir()
    shutil.copy(DEPLOY / "jupyter_server_config.json", etc / "jupyter_server_config.json")
    (etc / "jupyter_server_config.py").write_text(addon_ipc_config())
    # and a home volume, and the test's own server settings (port, token) as a user's config
    home = tmp_path / "home"
    home.mkdir()
    user = tmp_path / "user-config"
    user.mkdir()
    port, token = free_port(), secrets.token_hex(16)
    (user / "jupyter_server_config.py").write_text(
        "c.ServerApp.jpserver_extensions = {'jupyter_pause': True}\n"
        + server_config(port, token, home)
    )
    runtime = Path(tempfile.mkdtemp(prefix="jp-", dir="/tmp"))  # short: IPC socket paths
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JUPYTER", "POD_", "KUBERNETES", "IPYTHON"))
    }
    env.update(
        HOME=str(home),
        JUPYTER_CONFIG_PATH=str(etc),
        JUPYTER_CONFIG_DIR=str(user),
        JUPYTER_RUNTIME_DIR=str(runtime),
    )
    log = tmp_path / "server.log"

    # When a real jupyter server starts there (--debug: it logs each config file it loads)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--debug"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=home,
        )
    try:
        server = RemoteServer(f"http://127.0.0.1:{port}", token)
        wait_serving(process, server.url, token, log)

        # Then it loaded both files of that folder
        text = log.read_text()
        for name in ("jupyter_server_config.py", "jupyter_server_config.json"):
            assert f"Loaded config file: {etc / name}" in text, name
        # and ours is in effect: the idle pause (0 by default), the workspace backend (asked
        # for; outside a pod it says why it runs locally)
        code, status = server.request("GET", "/jupyter-pause/status")
        assert code == 200 and status["policy"]["idle_pause_minutes"] == 50
        assert "no workspace backend" in log.read_text() and status["backend"] == "local"
        # and a kernel talks to the server over IPC sockets (both files ask for it), and
        # checkpoints to the home volume ("~" in JSON is the server user's home)
        kernel_id = server.open_notebook("a.ipynb")
        connection = json.loads((runtime / f"kernel-{kernel_id}.json").read_text())
        assert connection["transport"] == "ipc"
        store = server.run(kernel_id, "import os; print(os.environ['JUPYTER_PAUSE_STORE'])")
        assert store.strip() == str(home / ".jupyter-pause" / "checkpoints")
    finally:
        process.terminate()
        process.wait(60)
        shutil.rmtree(runtime, ignore_errors=True)
