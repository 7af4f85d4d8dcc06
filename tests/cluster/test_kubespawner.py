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
from .z2jh_hub import merged, start_z2jh_hub, user_pod, wait_pod_gone

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
    # the timeline spans the stop: pause, the spawn asked, the pod's wait, the restore
    code, timeline = alice.request("GET", f"/jupyter-pause/timeline/{path}")
    kinds = [e["kind"] for e in timeline["events"]]
    order = ["pause_requested", "kernel_stopped", "start_requested", "server_started"]
    assert [kinds.index(k) for k in order] == sorted(kinds.index(k) for k in order), kinds
    assert kinds.index("server_started") < kinds.index("state_restored"), kinds
    (started,) = [e for e in timeline["events"] if e["kind"] == "server_started"]
    assert started["data"]["waited_seconds"] > 0, started
    code, listing = alice.request("GET", "/jupyter-pause/usage")
    assert code == 200, listing
    assert report.build(listing, since_seconds=None)["pauses"] == 1


def test_the_culler_with_kubespawners_1_s_grace_loses_nothing_the_checkpoint_before_it_held(
    real_chain: RealPlayedCluster, z2jh
) -> None:
    # Given the culler at 40 s (checked every 5 s), jupyter_pause told so, the Hub's activity
    # read every 5 s (the chart's 60 s and the server's 300 s, scaled to the timeout), and
    # KubeSpawner's default 1 s of grace: the pod's SIGTERM is no time to checkpoint in
    real_chain.node(gpus=1)
    values = merged(
        pause_settings(hub_culler_timeout_seconds=40, monitor_interval_seconds=1),
        {
            "cull": {"timeout": 40, "every": 5},
            "hub": {
                "config": {
                    "KubeSpawner": {"delete_grace_period": 1},
                    "JupyterHub": {"last_activity_interval": 5},
                }
            },
            "singleuser": {"extraEnv": {"JUPYTERHUB_ACTIVITY_INTERVAL": "5"}},
        },
    )
    hub = z2jh(values)
    alice = spawn(hub, "alice")
    path = notebook(alice)
    kernel = alice.open_notebook(path)
    alice.run(kernel, "x = 42")

    # Then the culler stops the idle server: KubeSpawner deletes the pod with 1 s of grace
    wait_pod_gone(real_chain, "alice", timeout=120)
    hub.wait_stopped("alice")

    # When alice comes back: the checkpoint taken before the cull restores everything
    alice = spawn(hub, "alice")
    paused = alice.session(path)
    assert paused["state"] == "paused", paused
    assert "Resume restores it from files" in paused["message"], paused["message"]
    code, _ = alice.request("POST", f"/jupyter-pause/resume/{path}")
    assert code == 202
    ready = alice.wait_state(path, "ready", "partial", "failed")
    assert (ready["state"], ready["how"]) == ("ready", "files"), ready
    assert alice.run(alice.session(path)["kernel_id"], "print(x)").strip() == "42"
    code, timeline = alice.request("GET", f"/jupyter-pause/timeline/{path}")
    reasons = [
        e["data"].get("reason") for e in timeline["events"] if e["kind"] == "checkpoint_written"
    ]
    assert reasons[:1] == ["before-cull"], timeline["events"]


def test_an_admin_stop_with_the_shipped_grace_checkpoints_the_latest_state_on_sigterm(
    real_chain: RealPlayedCluster, z2jh
) -> None:
    # Given the shipped values: delete_grace_period 30 s, platform_stop_seconds 25 s
    real_chain.node(gpus=1)
    hub = z2jh({})
    alice = spawn(hub, "alice")
    path = notebook(alice)
    kernel = alice.open_notebook(path)
    alice.run(kernel, "x = 42")
    assert alice.request("POST", f"/jupyter-pause/checkpoint/{path}")[0] == 200
    alice.run(kernel, "x = 43\nlate = 'saved at the stop'")

    # When an admin stops the server (the Hub's admin page: its REST API)
    code, _ = hub.request("DELETE", "/users/alice/server")
    assert code in (202, 204)
    wait_pod_gone(real_chain, "alice")
    hub.wait_stopped("alice")

    # Then the pod's SIGTERM checkpointed the latest state, and the next spawn says so
    alice = spawn(hub, "alice")
    paused = alice.session(path)
    assert paused["state"] == "paused", paused
    assert "the Hub stopped this server" in paused["message"], paused["message"]
    assert "checkpoint 2 from" in paused["message"], paused["message"]
    code, _ = alice.request("POST", f"/jupyter-pause/resume/{path}")
    assert code == 202
    assert alice.wait_state(path, "ready", "partial", "failed")["state"] == "ready"
    kernel = alice.session(path)["kernel_id"]
    assert alice.run(kernel, "print(x, late)").split() == ["43", "saved", "at", "the", "stop"]
