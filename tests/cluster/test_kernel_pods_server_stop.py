"""The CPU server pod stops while its notebooks' kernel pods run (Kubeflow stops the workspace,
a node drains): each notebook is paused, its kernel pod and GPU go, a resume waiting for a GPU
is given up (its checkpoint kept), and once the server is back on its volume, each resumes from
its checkpoint, on a GPU or, asked so, at once on CPU.

A real ``jupyter_server`` process on the kernel-pod backend (``kernel_pod_server.py``, the
shipped kernelspec and RBAC) on the real control plane, sent SIGTERM as the kubelet stops a pod,
then started again on the same folder.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .kernel_pod_server import KERNEL_NAME, kernel_pod_server, kernel_pod_server_env
from .notebooks import RemoteServer
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


def watched(server: RemoteServer, path: str) -> None:
    """Until the server sees each busy/idle change of the notebook's kernel."""
    while not server.session(path)["watching"]:
        time.sleep(0.1)


def resumed_until_refused(server: RemoteServer, path: str) -> dict:
    """Resume a paused notebook, until the scheduler refused its pod a GPU; its record."""
    code, record = server.request("POST", f"/jupyter-pause/resume/{path}")
    assert code == 202, record
    deadline = time.monotonic() + 60
    while "Insufficient nvidia.com/gpu" not in (record["message"] or ""):
        assert time.monotonic() < deadline, record
        time.sleep(0.2)
        record = server.session(path)
    return record


def test_a_stopping_server_pauses_each_kernel_pod_and_each_notebook_resumes_once_it_is_back(
    real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    chain = real_chain
    chain.node("gpu", gpus=2)
    env = kernel_pod_server_env(chain, tmp_path / "setup")
    folder = tmp_path / "server"
    process, server = kernel_pod_server(env, folder, "c.PauseApp.platform_stop_seconds = 25\n")
    try:
        # Given a notebook paused earlier
        later = server.open_notebook("later.ipynb", KERNEL_NAME)
        server.run(later, "plan = 'tomorrow'")
        watched(server, "later.ipynb")
        code, record = server.request("POST", "/jupyter-pause/pause/later.ipynb")
        assert code == 202, record
        assert server.wait_state("later.ipynb", "paused", "active")["state"] == "paused"
        # and two notebooks on GPU kernel pods: one idle, one running a cell
        idle = server.open_notebook("idle.ipynb", KERNEL_NAME)
        server.run(idle, "weights = [0.5] * 8\nnote = 'kept'")
        busy = server.open_notebook("busy.ipynb", KERNEL_NAME)
        server.run(busy, "step = -1")
        for path in ("idle.ipynb", "busy.ipynb"):
            watched(server, path)
        server.start_cell(busy, COUNTING)
        while not server.session("busy.ipynb")["busy"]:
            time.sleep(0.1)
        time.sleep(1)  # it counts
        assert len(kernel_pods(chain)) == 2
        # and the paused one resumed: its pod waits for a GPU, both taken
        waiting = resumed_until_refused(server, "later.ipynb")
        assert waiting["state"] == "waiting-for-resources", waiting
        assert waiting["queue_position"] == 1, waiting
        assert len(kernel_pods(chain)) == 3

        # When the platform stops the server pod
        stop(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)

    # Then it exited within the grace period, and no kernel pod is left holding a GPU or
    # waiting for one
    assert kernel_pods(chain) == []
    log = "".join(p.read_text() for p in folder.glob("server-*.log"))
    assert "SIGTERM: 2 notebook(s) paused" in log, log[-3000:]

    # When the server is back on its volume
    process, server = kernel_pod_server(env, folder)
    try:
        # Then each notebook says it is paused, its checkpoint kept: the two paused at the
        # stop, and the one whose resume waited
        for path in ("idle.ipynb", "busy.ipynb", "later.ipynb"):
            record = server.session(path)
            assert record["state"] == "paused", record
            assert record["checkpoint"] is not None, record
        _, timeline = server.request("GET", "/jupyter-pause/timeline/idle.ipynb")
        reasons = [e["data"].get("reason") for e in timeline["events"]]
        assert "the server is stopping (SIGTERM)" in reasons, timeline

        # and each resumes from files into a new kernel pod, its variables back: two on the
        # GPUs, the third, which waits for a GPU, asked on CPU now (its waiting kernel given
        # up: the server still exits at its next stop)
        for path in ("idle.ipynb", "later.ipynb"):
            code, record = server.request("POST", f"/jupyter-pause/resume/{path}")
            assert code == 202, record
            ready = server.wait_state(path, "ready", "partial", "failed", "paused")
            assert ready["state"] == "ready" and ready["how"] == "files", ready
        resumed_until_refused(server, "busy.ipynb")
        code, record = server.request(
            "POST", "/jupyter-pause/resume/busy.ipynb", {"accelerators": "none"}
        )
        assert code == 202, record
        ready = server.wait_state("busy.ipynb", "ready", "partial", "failed", "paused", timeout=60)
        assert ready["state"] == "ready" and "On CPU, as asked" in ready["message"], ready
        kernel = server.session("idle.ipynb")["kernel_id"]
        assert server.run(kernel, "print(sum(weights), note)") == "4.0 kept\n"
        kernel = server.session("later.ipynb")["kernel_id"]
        assert server.run(kernel, "print(plan)") == "tomorrow\n"
        # the cell that ran was interrupted, with what it had counted so far
        kernel = server.session("busy.ipynb")["kernel_id"]
        assert int(server.run(kernel, "print(step)")) > 0
        pods = {p["metadata"]["labels"]["kernel_id"]: p for p in kernel_pods(chain)}
        assert len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods.values()), pods
        (container,) = pods[kernel]["spec"]["containers"]
        assert "nvidia.com/gpu" not in json.dumps(container.get("resources") or {}), container
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
