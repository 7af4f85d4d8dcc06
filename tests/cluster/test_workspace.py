"""The workspace backend against a real Kubernetes API server, the cluster's other parts played.

Every "pod" is a real jupyter server with real kernels on this machine; it talks to the API
server with a service-account token from the TokenRequest API, bound only to the shipped
Role (deploy/rbac.yaml). Given/When/Then; the data's checksum is compared after every return.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .notebooks import RemoteServer
from .players import PlayedCluster, WorkspacePlay, wait_for

DATA_CELL = """
import hashlib, os, numpy as np
os.environ["EXPERIMENT"] = "gpu-42"
data = np.arange(300_000, dtype=np.float64) * 1.5
weights = {"w": np.linspace(0.0, 1.0, 5000)}
"""
CHECKSUM_CELL = (
    "print(hashlib.sha256(data.tobytes() + weights['w'].tobytes()).hexdigest(), "
    "os.environ['EXPERIMENT'], np.__name__)"
)


def server_of(play: WorkspacePlay) -> RemoteServer:
    assert play.current is not None, "the workspace has no running pod"
    return RemoteServer(play.current.url, play.jupyter_token)


def running(
    cluster: PlayedCluster, play: WorkspacePlay, previous: str | None = None
) -> RemoteServer:
    """The server of the workspace's pod once it runs (another pod than ``previous``)."""
    wait_for(
        lambda: (
            play.current is not None
            and play.current.pod_uid != previous
            and not play.current.frozen
        ),
        120,
        "the workspace's pod to run",
    )
    return server_of(play)


def notebook_with_data(server: RemoteServer, path: str) -> tuple[str, str]:
    kernel_id = server.open_notebook(path)
    server.run(kernel_id, DATA_CELL)
    return kernel_id, server.run(kernel_id, CHECKSUM_CELL)


def store(play: WorkspacePlay) -> Path:
    """The checkpoint store on the workspace's home volume (the shipped config's store_root)."""
    return play.home / ".jupyter-pause" / "checkpoints"


def on_volume(play: WorkspacePlay) -> dict[str, dict]:
    """Each notebook's session record as the PVC holds it (readable while no pod runs)."""
    records = {}
    for path in store(play).glob("*/session.json"):
        record = json.loads(path.read_text())
        records[record["path"]] = record
    return records


def pause_workspace(cluster: PlayedCluster, play: WorkspacePlay, path: str) -> dict[str, dict]:
    """Pause a notebook (so the workspace); once its pod is gone, what the PVC says."""
    code, record = server_of(play).request("POST", f"/jupyter-pause/pause/{path}")
    assert code == 202 and record["state"] == "checkpointing", record
    wait_for(
        lambda: cluster.workspace(play.name)["spec"]["paused"] and play.current is None,
        120,
        "the workspace to pause and its pod to go",
    )
    return on_volume(play)


def cli(
    cluster: PlayedCluster, tmp_path: Path, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``jupyter pause ...`` as a user outside the cluster runs it (their own kubeconfig)."""
    kubeconfig = cluster.user_kubeconfig(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBERNETES"))}
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture
def workspace(cluster: PlayedCluster, tmp_path: Path) -> WorkspacePlay:
    cluster.create_policy("manual")
    return cluster.create_workspace("lab", tmp_path / "home")


def test_pause_and_resume_live_from_a_pod_snapshot(
    cluster: PlayedCluster, workspace: WorkspacePlay, tmp_path: Path
) -> None:
    # Given a workspace pod whose two notebooks hold data
    server = running(cluster, workspace)
    first_pod = workspace.current.pod_uid
    kernel_a, expected = notebook_with_data(server, "a.ipynb")
    kernel_b = server.open_notebook("b.ipynb")
    server.run(kernel_b, "counter = 7")
    connection = json.loads(
        (workspace.current.workdir / "runtime" / f"kernel-{kernel_a}.json").read_text()
    )
    assert connection["transport"] == "ipc"  # the shipped config: Unix sockets, restorable

    # When one notebook is paused
    started = time.monotonic()
    paused = pause_workspace(cluster, workspace, "a.ipynb")
    pause_seconds = time.monotonic() - started

    # Then the whole workspace paused: both notebooks checkpointed, a pod snapshot, the pod gone
    (snapshot,) = cluster.snapshot_names()
    for path in ("a.ipynb", "b.ipynb"):
        assert paused[path]["state"] == "paused", paused[path]
        assert paused[path]["checkpoint"]["snapshot"] == snapshot
        assert f"pod snapshot {snapshot}" in paused[path]["message"]
    pinned = cluster.workspace("lab")["spec"]["podTemplate"]["podMetadata"]["annotations"]
    assert pinned["podsnapshot.gke.io/ps-name"] == snapshot  # never an older one silently
    recorded = cluster.state_annotation("lab")
    assert recorded["state"] == "paused" and recorded["snapshot"] == snapshot
    assert recorded["bytes"] == sum(r["checkpoint"]["bytes"] for r in paused.values())

    # When the user resumes the workspace from outside
    started = time.monotonic()
    done = cli(cluster, tmp_path, "resume", "--workspace", f"{cluster.namespace}/lab")
    resume_seconds = time.monotonic() - started

    # Then the same processes came back (proven), frozen for a while, and say so
    assert done.returncode == 0, done.stderr + done.stdout
    server = running(cluster, workspace, previous=first_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready" and ready["how"] == "live", ready
    assert "restored from snapshot" in ready["message"] and "frozen for" in ready["message"]
    assert ready["kernel_id"] == kernel_a
    assert server.session("b.ipynb")["how"] == "live"
    # And the kernels answer through the server after the freeze and thaw, state intact
    assert server.run(kernel_a, CHECKSUM_CELL) == expected
    assert server.run(kernel_b, "print(counter)") == "7\n"
    print(f"\nlive: pause {pause_seconds:.2f} s, resume (CLI) {resume_seconds:.2f} s")
