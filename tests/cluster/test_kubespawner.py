"""Zero to JupyterHub with KubeSpawner on the real control plane (``z2jh_hub.py``): the chart's
own hub config with ``deploy/jupyterhub/values.yaml``, a real JupyterHub 6.1.1 and
jupyterhub-idle-culler 2.0.0, KubeSpawner 7.1.0 creating each user's PVC and pod on the real
kube-apiserver, the real scheduler and PV controller, and the played kubelet running the
single-user image's ``jupyterhub-singleuser`` with jupyter_pause at the pod's own address.

What users meet there: a pause deletes the pod (its GPU back in the pool, another user's
pending pod scheduled on it), and the next spawn, a new pod on the same home volume, restores
from files; a pod deleted with KubeSpawner's default 1 s of grace keeps what the last
checkpoint held; the culler stops an idle server only after jupyter_pause has checkpointed it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.usage import report

from ..hub_process import Hub
from .control_plane import GPU, wait_until
from .notebooks import RemoteServer
from .real_players import RealPlayedCluster
from .z2jh_hub import start_z2jh_hub, user_pod, wait_pod_gone

pytestmark = pytest.mark.timeout(420)

EMPTY_NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
GPU_PROFILE = "1-gpu"  # the shipped profile_list's "1 GPU", by KubeSpawner's slug of its name


def pause_settings(**settings: Any) -> dict[str, Any]:
    """Test values over the shipped ones: jupyter_pause's settings in the shipped extraFiles."""
    data = {"PauseApp": settings}
    return {"singleuser": {"extraFiles": {"jupyter-pause-config": {"data": data}}}}


@pytest.fixture
def z2jh(real_chain: RealPlayedCluster, tmp_path: Path):
    """``z2jh(values)``: a Hub of the chart's config on ``real_chain`` (started), stopped at
    the test's end."""
    started: list[Hub] = []

    def start(values: dict[str, Any]) -> Hub:
        real_chain.start()
        hub = start_z2jh_hub(real_chain, tmp_path / f"hub{len(started)}", values)
        started.append(hub)
        return hub

    yield start
    for hub in started:
        hub.stop()


def spawn(hub: Hub, user: str, profile: str | None = None, timeout: float = 120) -> RemoteServer:
    """The user's server started as the spawn page does (its profile form), ready."""
    body = {"profile": profile} if profile else None
    code, answer = hub.request("POST", f"/users/{user}/server", body)
    assert code in (201, 202), (code, answer, hub.tail())
    wait_until(lambda: (hub.server(user) or {}).get("ready"), timeout, f"{user}'s server\n")
    return RemoteServer(f"{hub.url}/user/{user}", hub.token)


def notebook(server: RemoteServer, name: str = "train.ipynb") -> str:
    """A new notebook, made as JupyterLab makes one (the contents API, as the pod's user)."""
    code, model = server.request(
        "PUT", f"/api/contents/{name}", {"type": "notebook", "content": EMPTY_NOTEBOOK}
    )
    assert code == 201, model
    return name


def test_a_pause_deletes_the_pod_frees_its_gpu_and_the_next_spawn_restores_from_files(
    real_chain: RealPlayedCluster, z2jh
) -> None:
    # Given one GPU node and the shipped chart values
    real_chain.node(gpus=1)
    hub = z2jh(pause_settings(monitor_interval_seconds=2))
    alice = spawn(hub, "alice", GPU_PROFILE)
    pod = user_pod(real_chain, "alice")
    assert pod is not None
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get(GPU) == "1", limits
    path = notebook(alice)
    kernel = alice.open_notebook(path)
    alice.run(kernel, "x = 42\nweights = list(range(1000))")
    code, status = alice.request("GET", "/jupyter-pause/status")
    assert (code, status["backend"]) == (200, "jupyterhub"), status
    # and bob, whose GPU server waits for that GPU (the Hub's spawn shows it pending)
    code, answer = hub.request("POST", "/users/bob/server", {"profile": GPU_PROFILE})
    assert code == 202, answer
    wait_until(
        lambda: (user_pod(real_chain, "bob") or {}).get("status", {}).get("conditions"),
        30,
        "the scheduler to say why bob's pod waits",
    )
    assert user_pod(real_chain, "bob")["status"]["phase"] == "Pending"

    # When alice pauses her notebook
    code, record = alice.request("POST", f"/jupyter-pause/pause/{path}")
    assert code == 202, record
    # Then KubeSpawner deletes her pod, and bob's is scheduled onto the freed GPU
    wait_pod_gone(real_chain, "alice")
    hub.wait_stopped("alice")
    wait_until(lambda: (hub.server("bob") or {}).get("ready"), 120, "bob's server\n")

    # When bob's done and alice logs in again: a new pod on her home volume
    hub.request("DELETE", "/users/bob/server")
    hub.wait_stopped("bob")
    alice = spawn(hub, "alice", GPU_PROFILE)
    paused = alice.session(path)
    assert paused["state"] == "paused", paused
    assert "Resume restores it from files: checkpoint 1 from" in paused["message"], paused
    code, record = alice.request("POST", f"/jupyter-pause/resume/{path}")
    assert code == 202, record
    ready = alice.wait_state(path, "ready", "partial", "failed")
    assert (ready["state"], ready["how"]) == ("ready", "files"), ready
    kernel = alice.session(path)["kernel_id"]
    assert alice.run(kernel, "print(x, sum(weights))").split() == ["42", "499500"]
    code, listing = alice.request("GET", "/jupyter-pause/usage")
    assert code == 200, listing
    assert report.build(listing, since_seconds=None)["pauses"] == 1
