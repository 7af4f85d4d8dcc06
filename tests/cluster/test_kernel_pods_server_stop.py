"""The CPU server pod stops while its notebooks' kernel pods run (Kubeflow stops the workspace,
a node drains): each notebook is paused, its kernel pod and GPU go, and once the server is back
on its volume, each resumes from its checkpoint.

A real ``jupyter_server`` process on the kernel-pod backend (``kernel_pod_server.py``, the
shipped kernelspec and RBAC) on the real control plane, sent SIGTERM as the kubelet stops a pod,
then started again on the same folder.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from .kernel_pod_server import KERNEL_NAME, kernel_pod_server, kernel_pod_server_env
from .real_players import RealPlayedCluster, core

pytest.importorskip("gateway_provisioners", reason="the kernel-pod backend's tests")

COUNTING = "import time\nfor step in range(6000):\n    time.sleep(0.05)\nprint('finished')"


def kernel_pods(chain: RealPlayedCluster) -> list[dict]:
    return chain.api.list(core(chain.namespace, "pods"), labelSelector="component=kernel")


def stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as the kubelet stops a pod; its exit status (the grace period: 30 s)."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("the server did not exit within 30 s of SIGTERM") from None


def test_a_stopping_server_pauses_each_kernel_pod_and_each_notebook_resumes_once_it_is_back(
    real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    chain = real_chain
    chain.node("gpu", gpus=2)
    env = kernel_pod_server_env(chain, tmp_path / "setup")
    folder = tmp_path / "server"
    process, server = kernel_pod_server(env, folder, "c.PauseApp.platform_stop_seconds = 25\n")
    try:
        # Given two notebooks on GPU kernel pods: one idle, one running a cell
        idle = server.open_notebook("idle.ipynb", KERNEL_NAME)
        server.run(idle, "weights = [0.5] * 8\nnote = 'kept'")
        busy = server.open_notebook("busy.ipynb", KERNEL_NAME)
        server.run(busy, "step = -1")
        for path in ("idle.ipynb", "busy.ipynb"):
            while not server.session(path)["watching"]:  # it sees each busy/idle change
                time.sleep(0.1)
        server.start_cell(busy, COUNTING)
        while not server.session("busy.ipynb")["busy"]:
            time.sleep(0.1)
        time.sleep(1)  # it counts
        assert len(kernel_pods(chain)) == 2

        # When the platform stops the server pod
        stop(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)

    # Then it exited within the grace period, and no kernel pod is left holding a GPU
    assert kernel_pods(chain) == []
    log = "".join(p.read_text() for p in folder.glob("server-*.log"))
    assert "SIGTERM: 2 notebook(s) paused" in log, log[-3000:]

    # When the server is back on its volume
    process, server = kernel_pod_server(env, folder)
    try:
        # Then each notebook says it was paused at the stop, its checkpoint kept
        for path in ("idle.ipynb", "busy.ipynb"):
            record = server.session(path)
            assert record["state"] == "paused", record
            assert record["checkpoint"] is not None, record
        _, timeline = server.request("GET", "/jupyter-pause/timeline/idle.ipynb")
        reasons = [e["data"].get("reason") for e in timeline["events"]]
        assert "the server is stopping (SIGTERM)" in reasons, timeline

        # and each resumes from files into a new kernel pod, its variables back; the cell
        # that ran was interrupted, with what it had counted so far
        for path in ("idle.ipynb", "busy.ipynb"):
            code, record = server.request("POST", f"/jupyter-pause/resume/{path}")
            assert code == 202, record
            ready = server.wait_state(path, "ready", "partial", "failed", "paused")
            assert ready["state"] == "ready" and ready["how"] == "files", ready
        kernel = server.session("idle.ipynb")["kernel_id"]
        assert server.run(kernel, "print(sum(weights), note)") == "4.0 kept\n"
        kernel = server.session("busy.ipynb")["kernel_id"]
        assert int(server.run(kernel, "print(step)")) > 0
        assert len(kernel_pods(chain)) == 2
    finally:
        stop(process)


def test_a_server_pod_lost_without_a_pause_takes_its_kernel_pods_with_it(
    real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    chain = real_chain
    chain.node("gpu", gpus=1)
    # Given the server's pod (never placed: this machine runs the server itself), its name and
    # uid in the server's environment as the downward API gives them (the Kubeflow example)
    owner = chain.api.create(
        core(chain.namespace, "pods"),
        {
            "metadata": {"name": "workspace-0"},
            "spec": {
                "nodeSelector": {"jupyter-pause.io/test": "nowhere"},
                "containers": [{"name": "jupyterlab", "image": "jupyterlab-pause-kernel-pods"}],
            },
        },
    )
    env = kernel_pod_server_env(chain, tmp_path / "setup")
    env.update(KERNEL_SERVER_POD_NAME="workspace-0", KERNEL_SERVER_POD_UID=owner["metadata"]["uid"])
    process, server = kernel_pod_server(env, tmp_path / "server")
    try:
        # and a notebook on a GPU kernel pod, owned by the server's pod
        kernel = server.open_notebook("a.ipynb", KERNEL_NAME)
        assert server.run(kernel, "print(6 * 7)") == "42\n"
        (pod,) = kernel_pods(chain)
        (reference,) = pod["metadata"]["ownerReferences"]
        assert reference["kind"] == "Pod" and reference["name"] == "workspace-0", reference
        assert reference["uid"] == owner["metadata"]["uid"], reference
    finally:
        # When the server is lost without a pause (killed with its node: no SIGTERM)
        process.kill()
        process.wait(30)
    assert len(kernel_pods(chain)) == 1  # its kernel pod runs on, holding the GPU

    # and the lost server's pod is deleted (as the node's pods are once the node is gone)
    chain.api.delete(f"{core(chain.namespace, 'pods')}/workspace-0")

    # Then the cluster's garbage collector deletes the kernel pod: the GPU is free again
    deadline = time.monotonic() + 60
    while kernel_pods(chain):
        assert time.monotonic() < deadline, "the kernel pod outlived its server's pod"
        chain.check()
        time.sleep(0.5)
