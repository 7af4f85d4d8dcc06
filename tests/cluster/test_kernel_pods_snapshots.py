"""Kernel pods with GKE Pod Snapshots: a pause snapshots the kernel's pod, the resume's pod pins
the snapshot, and the same kernel process comes back ("live"); where GKE does not restore it the
checkpoint comes back from files.

A real jupyter_server with ``c.PauseApp.backend = "kernel-pod"``, the shipped kernelspec with
``KERNEL_RUNTIME_CLASS_NAME=gvisor`` (its pods go to this test's GKE Sandbox node of one GPU,
as the real RuntimeClass admission places them), the shipped RBAC and
``deploy/kernel-pods/podsnapshot-policy.yaml``. GKE's node agent is played
(``real_players.py``): a snapshot holds the pod's very processes, frozen when the pod goes and
thawed into the pod that pins it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..servers import Server
from .kernel_pod_fixtures import KERNEL_PODS, KernelPods, kernel_pod_server_config, until
from .test_kernel_pods_server import NOTEBOOK, open_gpu_notebook

pytest.importorskip("gateway_provisioners", reason="the kernel-pod backend's tests")

PIN = "podsnapshot.gke.io/ps-name"


@pytest.fixture
def jp_server_config(
    kernel_pods: KernelPods, pause_store: Any, monkeypatch: pytest.MonkeyPatch
) -> dict:
    """The kernel-pod backend, its kernel pods in GKE Sandbox (as the admin's kernelspec or the
    server's environment says), the shipped snapshot policy in the namespace."""
    monkeypatch.setenv("KERNEL_RUNTIME_CLASS_NAME", "gvisor")
    kernel_pods.cluster.node("sandbox-gpu", gpus=1, sandbox=True)
    kernel_pods.cluster.plane.apply_file(
        KERNEL_PODS / "podsnapshot-policy.yaml", NAMESPACE=kernel_pods.namespace
    )
    return kernel_pod_server_config(kernel_pods, pause_store, monkeypatch, 30)


@pytest.fixture
def pod_server(server: Server, kernel_pods: KernelPods, jp_asyncio_loop: Any) -> Iterator[Server]:
    yield server
    jp_asyncio_loop.run_until_complete(server.app.kernel_manager.shutdown_all(now=True))


LIVE_ONLY = (
    "import os\n"
    "weights = [1.5, 2.5]\nstep = 41\n"
    "pid = os.getpid()\n"
    "counter = (i for i in range(10)); next(counter)\n"  # a generator: no checkpoint keeps it
)


async def pause(server: Server) -> dict:
    code, record = await server.call("POST", "pause", NOTEBOOK)
    assert code == 202, record
    paused = await server.wait_state(NOTEBOOK, "paused", "active")
    assert paused["state"] == "paused", paused
    return paused


async def resume(server: Server) -> dict:
    code, record = await server.call("POST", "resume", NOTEBOOK)
    assert code == 202, record
    return await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused", timeout=180)


async def test_a_paused_kernel_pod_comes_back_live_from_its_snapshot_or_else_from_files(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster

    # Given a GPU notebook whose kernel pod runs in GKE Sandbox, holding a generator
    kernel_id = await open_gpu_notebook(server)
    (pod,) = kernel_pods.kernel_pods()
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["nodeName"] == f"{cluster.pool}-sandbox-gpu"
    assert "jupyter-pause.io/kernel-snapshots" not in pod["metadata"]["labels"]
    await server.run(kernel_id, LIVE_ONLY)
    await server.watched(NOTEBOOK)

    # When it is paused
    paused = await pause(server)

    # Then its pod was snapshotted (labelled for the policy first), then deleted
    (snapshot,) = cluster.snapshot_names()
    assert "process image" in paused["message"], paused
    _, timeline = await server.call("GET", "timeline", NOTEBOOK)
    taken = [e for e in timeline["events"] if e["kind"] == "snapshot_taken"]
    assert [e["data"]["name"] for e in taken] == [snapshot], taken
    await until(lambda: kernel_pods.kernel_pods() == [], 60, "no kernel pod", cluster)
    assert paused["kernel_id"] == kernel_id

    # When it is resumed
    ready = await resume(server)

    # Then the pod pins the snapshot, GKE restored it, and the kernel is the one that paused
    assert ready["state"] == "ready" and ready["how"] == "live", ready
    assert ready["kernel_id"] == kernel_id
    (pod,) = kernel_pods.kernel_pods()
    assert pod["metadata"]["annotations"][PIN] == snapshot
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["PodRestored"] == "True", pod["status"]
    out = await server.run(kernel_id, "print(next(counter), step + 1, os.getpid() == pid)")
    assert out == "1 42 True\n"
    # and the spent snapshot is deleted
    await until(lambda: cluster.snapshot_names() == [], 30, "the snapshot deleted", cluster)

    # When it is paused again and GKE cannot restore the snapshot (a cold start)
    await pause(server)
    (second,) = cluster.snapshot_names()
    cluster.restore_mode = "mismatch"
    ready = await resume(server)

    # Then the checkpoint comes back from files into the same kernel id, saying so
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] == kernel_id
    (pod,) = kernel_pods.kernel_pods()
    assert pod["metadata"]["annotations"][PIN] == second
    assert await server.run(kernel_id, "print(sum(weights) + step)") == "45.0\n"
    out = await server.run(kernel_id, "print('counter' in dir(), os.getpid() == pid)")
    assert out == "False False\n", out
    await until(lambda: cluster.snapshot_names() == [], 30, "the spent snapshot deleted", cluster)


async def test_without_a_snapshot_policy_a_pause_says_why_and_the_resume_is_from_files(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster
    # Given the policy removed by the admin
    cluster.api.delete(
        f"/apis/podsnapshot.gke.io/v1/namespaces/{kernel_pods.namespace}"
        "/podsnapshotpolicies/jupyter-pause-kernels"
    )
    kernel_id = await open_gpu_notebook(server)
    await server.run(kernel_id, LIVE_ONLY)
    await server.watched(NOTEBOOK)

    # When it is paused and resumed
    paused = await pause(server)
    ready = await resume(server)

    # Then the pause said why there is no process image, and the resume restored files
    assert "no PodSnapshotPolicy in namespace" in paused["message"], paused
    assert cluster.snapshot_names() == []
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    (pod,) = kernel_pods.kernel_pods()
    assert PIN not in (pod["metadata"].get("annotations") or {})
    assert "jupyter-pause.io/kernel-snapshots" not in pod["metadata"]["labels"]
    assert await server.run(kernel_id, "print(sum(weights) + step)") == "45.0\n"


async def test_restart_kernel_on_a_paused_kernel_pod_gives_a_fresh_process_not_its_snapshot(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster
    # Given a paused GPU notebook whose pod was snapshotted
    kernel_id = await open_gpu_notebook(server)
    await server.run(kernel_id, LIVE_ONLY)
    await server.watched(NOTEBOOK)
    await pause(server)
    assert len(cluster.snapshot_names()) == 1

    # When the user presses Restart Kernel (JupyterLab's POST .../restart)
    await server.fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")

    # Then the kernel is a fresh process in a pod that pins no snapshot
    (pod,) = kernel_pods.kernel_pods()
    assert PIN not in (pod["metadata"].get("annotations") or {}), pod["metadata"]
    assert "jupyter-pause.io/kernel-snapshots" not in pod["metadata"]["labels"]
    assert await server.run(kernel_id, "print('weights' in dir())") == "False\n"
    # and the snapshot it passed over is deleted (its storage costs until then)
    assert cluster.snapshot_names() == []
    # and a resume restores the checkpoint into it from files, never calling it live
    ready = await resume(server)
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert await server.run(kernel_id, "print(sum(weights) + step)") == "45.0\n"
