"""The kernel-pod backend in the jupyter_pause server, driven through its REST API.

A real jupyter_server with ``c.PauseApp.backend = "kernel-pod"`` and the shipped kernel-pods
kernelspec (``deploy/kernel-pods/``): opening a notebook launches its kernel as a pod, placed by
the real kube-scheduler on this test's node of one ``nvidia.com/gpu`` and run by the played
kubelet as a real ipykernel. Pauses and resumes are asked of the extension's REST API the way
the toolbar and the CLI ask them; the cluster is read through its API server. The kernel's
restarter looks every 0.5 s and its launch timeout is 12 s (a first kernel start on a loaded
2-core CI machine took over 5 s), so waits past them stay short.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ..servers import Server
from .kernel_pod_fixtures import (
    KERNEL_NAME,
    KernelPods,
    kernel_pod_server_config,
    other_team_holds_the_gpu,
    scheduled,
    until,
)
from .real_players import core

pytest.importorskip("gateway_provisioners", reason="the kernel-pod backend's tests")

NOTEBOOK = "exp.ipynb"
LAUNCH_TIMEOUT = 12


@pytest.fixture
def launches_at_once() -> int:
    """``c.PauseApp.kernel_pod_launches_at_once`` (a test parametrized on it overrides it)."""
    return 1


@pytest.fixture
def jp_server_config(
    kernel_pods: KernelPods,
    pause_store: Any,
    monkeypatch: pytest.MonkeyPatch,
    launches_at_once: int,
) -> dict:
    """The kernel-pod backend; the kernel pods' template values in the server's environment
    (jupyter-server gives its kernels its own), as a deployment sets them."""
    config = kernel_pod_server_config(kernel_pods, pause_store, monkeypatch, LAUNCH_TIMEOUT)
    config["PauseApp"]["kernel_pod_launches_at_once"] = launches_at_once
    return config


@pytest.fixture
def pod_server(server: Server, kernel_pods: KernelPods, jp_asyncio_loop: Any) -> Iterator[Server]:
    """The server; its kernels (their pods) shut down while the cluster is still there."""
    yield server
    jp_asyncio_loop.run_until_complete(server.app.kernel_manager.shutdown_all(now=True))


async def open_gpu_notebook(server: Server, path: str = NOTEBOOK) -> str:
    """What JupyterLab does when the notebook opens with the GPU kernel: its kernel id."""
    body = {
        "path": path,
        "name": path,
        "type": "notebook",
        "kernel": {"name": KERNEL_NAME},
    }
    response = await server.fetch("api", "sessions", method="POST", body=json.dumps(body))
    return json.loads(response.body)["kernel"]["id"]


async def a_paused_gpu_notebook(
    server: Server, kernel_pods: KernelPods, before_pause: Any = None
) -> tuple[str, dict]:
    """A notebook whose kernel pod held ``weights`` and ``step``, paused through the API
    (``before_pause(kernel_id)`` awaited first)."""
    kernel_id = await open_gpu_notebook(server)
    if before_pause is not None:
        await before_pause(kernel_id)
    (pod,) = kernel_pods.kernel_pods()
    assert pod["metadata"]["labels"]["kernel_id"] == kernel_id
    await server.run(kernel_id, "weights = [1.5, 2.5]\nstep = 41")
    await server.watched(NOTEBOOK)
    code, record = await server.call("POST", "pause", NOTEBOOK)
    assert code == 202, record
    paused = await server.wait_state(NOTEBOOK, "paused", "active")
    assert paused["state"] == "paused", paused
    return kernel_id, pod


async def kernel_ids(server: Server) -> list[str]:
    response = await server.fetch("api", "kernels")
    return [k["id"] for k in json.loads(response.body)]


async def execute_over(ws: Any, code: str, timeout: float = 60) -> str:
    """Run ``code`` through a notebook's websocket, as JupyterLab does; its stdout."""
    msg_id = uuid.uuid4().hex
    ws.write_message(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "msg_type": "execute_request",
                    "username": "tab",
                    "session": "tab",
                    "version": "5.3",
                    "date": "",
                },
                "parent_header": {},
                "metadata": {},
                "content": {"code": code, "silent": False},
                "channel": "shell",
                "buffers": [],
            }
        )
    )
    out: list[str] = []
    replied = idle = False
    while not (replied and idle):  # the reply (shell) and the output (iopub) in any order
        text = await asyncio.wait_for(ws.read_message(), timeout)
        assert text is not None, "the websocket closed"
        msg = json.loads(text)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "execute_reply":
            assert msg["content"]["status"] == "ok", msg["content"]
            replied = True
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    return "".join(out)


async def a_resume_waiting_for_the_gpu(server: Server, kernel_pods: KernelPods) -> str:
    """A paused GPU notebook resumed while another team's pod holds the only GPU: its kernel id,
    once the resume says the scheduler's reason."""
    kernel_id, _ = await a_paused_gpu_notebook(server, kernel_pods)
    await other_team_holds_the_gpu(kernel_pods)
    await resumed_until_refused(server)
    return kernel_id


async def resumed_until_refused(server: Server) -> dict[str, Any]:
    """Resume the paused notebook, until the scheduler refused its pod a GPU; its record."""
    code, _ = await server.call("POST", "resume", NOTEBOOK)
    assert code == 202
    return await server.wait_for(
        NOTEBOOK, lambda r: "Insufficient nvidia.com/gpu" in (r["message"] or ""), timeout=60
    )


async def test_a_pause_frees_the_gpu_and_a_resume_brings_the_same_kernel_back_from_files(
    pod_server: Server, kernel_pods: KernelPods, jp_ws_fetch: Any
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster

    # Given a notebook whose GPU kernel pod holds variables, open in a tab (its websocket),
    # paused through the REST API
    tabs: list[Any] = []

    async def open_tab(kernel_id: str) -> None:
        params = {"session_id": "tab"}
        tabs.append(await jp_ws_fetch("api", "kernels", kernel_id, "channels", params=params))

    kernel_id, pod = await a_paused_gpu_notebook(server, kernel_pods, open_tab)
    (tab,) = tabs

    # Then its pod is gone, while the server runs on and still lists the kernel and its session
    assert kernel_pods.kernel_pods() == []
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "paused" and record["kernel_id"] == kernel_id, record
    assert record["checkpoint"]["variables"] == ["step", "weights"]
    assert kernel_id in await kernel_ids(server)
    _, timeline = await server.call("GET", "timeline", NOTEBOOK)
    (released,) = [e for e in timeline["events"] if e["kind"] == "gpu_released"]
    assert released["data"]["measured"] is True
    # and the GPU is free: another team's GPU pod is scheduled on that node
    other_ns, other = await other_team_holds_the_gpu(kernel_pods)
    assert cluster.api.get(core(other_ns, "pods", other))["spec"]["nodeName"] == (
        f"{cluster.pool}-gpu"
    )
    cluster.release_gpus()
    await until(
        lambda: cluster.api.get(core(other_ns, "pods", other)) is None,
        60,
        "the other team's pod to be gone",
        cluster,
    )

    # When the restarter has looked many times over (every 0.5 s, for 4 s)
    await asyncio.sleep(4)

    # Then it brought nothing back: no pod, still paused
    assert kernel_pods.kernel_pods() == []
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "paused", record

    # When the notebook is opened again in a second tab meanwhile (its connection finds no pod)
    late_tab = await jp_ws_fetch(
        "api", "kernels", kernel_id, "channels", params={"session_id": "late"}
    )

    # When the notebook is resumed, a GPU being free
    async def state_when_closed(ws: Any) -> str:
        while await asyncio.wait_for(ws.read_message(), 120) is not None:
            pass
        _, record = await server.call("GET", "sessions", NOTEBOOK)
        return record["state"]

    closed = asyncio.ensure_future(state_when_closed(tab))
    late_closed = asyncio.ensure_future(state_when_closed(late_tab))
    code, _ = await server.call("POST", "resume", NOTEBOOK)
    assert code == 202
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")

    # Then the same kernel runs again in a new pod, its variables restored from the files
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] == kernel_id
    assert ready["restore"]["restored"] == ["step", "weights"]
    (again,) = kernel_pods.kernel_pods()
    assert again["metadata"]["labels"]["kernel_id"] == kernel_id
    assert again["metadata"]["uid"] != pod["metadata"]["uid"]
    assert await kernel_ids(server) == [kernel_id]
    # and the kernel answers code, the pod's own process, with what it held
    out = await server.run(kernel_id, "import os\nprint(sum(weights), step, os.getpid())")
    total, step, pid = out.split()
    played = cluster.pods[again["metadata"]["uid"]].container
    assert (total, step, int(pid)) == ("4.0", "41", played.process.pid)
    # and the open tab's websocket was closed with 1012, "service restart" (JupyterLab then
    # reconnects at once, without a "kernel restarting" dialog), once the restore was done
    # (the notebook's next cell then runs in the restored kernel, never before the restore)
    assert await closed == "ready"
    tab.close()  # the client's side too (tornado warns of an unclosed one when collected)
    assert tab.close_code == 1012, (tab.close_code, tab.close_reason)
    # and so was the second tab's, opened while paused
    assert await late_closed == "ready"
    late_tab.close()
    assert late_tab.close_code == 1012, (late_tab.close_code, late_tab.close_reason)
    # and its reconnection, the same session, reaches the new pod (not the old pod's streams
    # jupyter-server kept for that session)
    assert kernel_id not in server.app.kernel_manager._kernel_buffers
    tab = await jp_ws_fetch("api", "kernels", kernel_id, "channels", params={"session_id": "tab"})
    assert await execute_over(tab, "print(step + 1)") == "42\n"
    tab.close()


async def test_a_resume_waits_for_a_gpu_with_the_schedulers_reason_and_is_joined_or_cancelled(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster

    # Given a paused GPU notebook resumed while another team's pod holds the only GPU
    kernel_id = await a_resume_waiting_for_the_gpu(server, kernel_pods)

    # Then it waits for resources, saying the scheduler's reason and its place
    _, waiting = await server.call("GET", "sessions", NOTEBOOK)
    assert waiting["state"] == "waiting-for-resources", waiting
    assert "Insufficient nvidia.com/gpu" in waiting["message"], waiting
    assert "1st in line; the scheduler says: 0/" in waiting["message"], waiting
    assert waiting["queue_position"] == 1
    (pending,) = kernel_pods.kernel_pods()
    assert pending["status"]["phase"] == "Pending" and not scheduled(pending)

    # When the resume is cancelled
    code, record = await server.call("POST", "cancel", NOTEBOOK)

    # Then the pending pod is deleted and the session is paused, its checkpoint intact
    assert code == 200 and record["state"] == "paused", record
    assert "Resume cancelled" in record["message"] and "is intact" in record["message"]
    await until(lambda: kernel_pods.kernel_pods() == [], 60, "no kernel pod", cluster)
    assert record["kernel_id"] == kernel_id and kernel_id in await kernel_ids(server)
    # and nothing is left to cancel
    status, message = await server.error("POST", "cancel", NOTEBOOK)
    assert status == 409 and "no resume waits for resources" in message

    # When it is resumed twice (two tabs), the GPU still taken
    for _ in range(2):
        code, record = await server.call("POST", "resume", NOTEBOOK)
        assert code == 202, record
    await server.wait_state(NOTEBOOK, "waiting-for-resources", timeout=60)

    # Then it waits twice as long as the launch timeout, with one pending pod
    await asyncio.sleep(2 * LAUNCH_TIMEOUT)
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "waiting-for-resources", record
    assert "Insufficient nvidia.com/gpu" in record["message"], record
    assert len(kernel_pods.kernel_pods()) == 1
    _, status = await server.call("GET", "status")
    assert status["resources"]["queue"] == [NOTEBOOK], status

    # When the other team's pod goes
    cluster.release_gpus()

    # Then the one resume completes: the same kernel, from files, in one pod
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] == kernel_id
    (pod,) = kernel_pods.kernel_pods()
    assert pod["metadata"]["labels"]["kernel_id"] == kernel_id
    assert pod["spec"]["nodeName"] == f"{cluster.pool}-gpu"
    assert await server.run(kernel_id, "print(sum(weights) + step)") == "45.0\n"
    _, timeline = await server.call("GET", "timeline", NOTEBOOK)
    kinds = [e["kind"] for e in timeline["events"]]
    assert kinds.count("resume_requested") == 2 and kinds.count("state_restored") == 1


async def test_a_resume_the_cluster_refuses_says_why_and_leaves_the_session_paused(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster
    # Given a paused GPU notebook
    kernel_id, _ = await a_paused_gpu_notebook(server, kernel_pods)
    # and the server's account no longer allowed to manage pods (its RoleBinding removed)
    rbac = "rbac.authorization.k8s.io/v1"
    path = f"/apis/{rbac}/namespaces/{kernel_pods.namespace}/rolebindings"
    cluster.api.delete(f"{path}/jupyter-pause-kernel-pods")

    # When it is resumed
    code, _ = await server.call("POST", "resume", NOTEBOOK)
    assert code == 202
    record = await server.wait_state(NOTEBOOK, "paused", "failed", "ready", timeout=120)

    # Then the session is paused again, saying what the cluster refused and what to do
    assert record["state"] == "paused", record
    assert "Resume failed" in record["message"], record
    assert "403" in record["error"]["what"] and "rbac.yaml" in record["error"]["what"], record
    assert "is intact" in record["error"]["recovery"], record
    assert "Traceback" not in json.dumps(record)
    assert record["kernel_id"] == kernel_id and kernel_pods.kernel_pods() == []
    _, listing = await server.call("GET", "checkpoints", NOTEBOOK)
    assert [c["id"] for c in listing["checkpoints"]] == [record["checkpoint"]["id"]]


async def test_a_pause_while_the_api_server_is_unreachable_says_so_and_the_kernel_runs_on(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    from kubernetes import client

    server = pod_server
    # Given a GPU notebook holding variables
    kernel_id = await open_gpu_notebook(server)
    await server.run(kernel_id, "weights = [1.5, 2.5]\nstep = 41")
    await server.watched(NOTEBOOK)
    # and the server's way to the API server broken (nothing listens where it points now)
    working = client.Configuration.get_default_copy()
    broken = client.Configuration.get_default_copy()
    broken.host = "https://127.0.0.1:9"
    client.Configuration.set_default(broken)
    try:
        # When it is paused
        code, _ = await server.call("POST", "pause", NOTEBOOK)
        assert code == 202
        record = await server.wait_state(NOTEBOOK, "active", "paused")
    finally:
        client.Configuration.set_default(working)

    # Then the pause failed saying why, in words, and the session runs on, its checkpoint taken
    assert record["state"] == "active", record
    assert "the API server did not answer" in record["error"]["what"], record
    assert "Nothing was lost" in record["error"]["recovery"], record
    assert "Traceback" not in json.dumps(record)
    assert record["kernel_id"] == kernel_id and record["checkpoint"]["id"] == 1
    (pod,) = kernel_pods.kernel_pods()
    assert pod["metadata"]["labels"]["kernel_id"] == kernel_id
    assert await server.run(kernel_id, "print(sum(weights) + step)") == "45.0\n"


async def test_a_paused_notebook_whose_kernel_was_shut_down_resumes_in_a_new_kernel_pod(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster
    # Given a paused GPU notebook whose kernel was then shut down (culled, or the server
    # restarted: jupyter-server no longer has it)
    kernel_id, _ = await a_paused_gpu_notebook(server, kernel_pods)
    await server.fetch("api", "kernels", kernel_id, method="DELETE")
    record = await server.wait_for(NOTEBOOK, lambda r: r["kernel_id"] is None)
    assert record["state"] == "paused", record
    # and another team's pod holding the only GPU
    await other_team_holds_the_gpu(kernel_pods)

    # When it is resumed
    code, _ = await server.call("POST", "resume", NOTEBOOK)
    assert code == 202

    # Then a new kernel pod waits, saying the scheduler's reason
    waiting = await server.wait_state(NOTEBOOK, "waiting-for-resources", timeout=60)
    assert "Insufficient nvidia.com/gpu" in waiting["message"], waiting
    (pending,) = kernel_pods.kernel_pods()
    assert pending["metadata"]["labels"]["kernel_id"] != kernel_id

    # When the GPU frees, then the new kernel is the notebook's, restored from files
    cluster.release_gpus()
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] == pending["metadata"]["labels"]["kernel_id"]
    assert await kernel_ids(server) == [ready["kernel_id"]]
    assert await server.run(ready["kernel_id"], "print(sum(weights) + step)") == "45.0\n"


@pytest.mark.parametrize("launches_at_once", [1, 3], ids=["one-pod-at-a-time", "3-at-once"])
async def test_a_morning_rush_is_served_in_request_order_each_showing_its_place(
    pod_server: Server, kernel_pods: KernelPods, launches_at_once: int
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster
    cluster.node("gpu-b", gpus=2)  # with the fixture's node: 3 GPUs

    # Given three paused GPU notebooks, each kernel pod on a GPU of its own at first
    notebooks = ["a.ipynb", "b.ipynb", "c.ipynb"]
    kernels = {}
    for path in notebooks:
        kernels[path] = await open_gpu_notebook(server, path)
        await server.run(kernels[path], f"who = {path!r}")
        await server.watched(path)
    for path in notebooks:
        code, record = await server.call("POST", "pause", path)
        assert code == 202, record
        paused = await server.wait_state(path, "paused", "active")
        assert paused["state"] == "paused", paused
    assert kernel_pods.kernel_pods() == []
    # and another team's pods on two of the three GPUs
    cluster.block_gpus(2)
    await until(
        lambda: (
            len(cluster.api.list(core(f"{kernel_pods.namespace}-other-team", "pods"))) == 2
            and all(
                scheduled(p)
                for p in cluster.api.list(core(f"{kernel_pods.namespace}-other-team", "pods"))
            )
        ),
        60,
        "the other team's pods on two GPUs",
        cluster,
    )

    # When all three are resumed, a first, then b, then c
    for path in notebooks:
        code, record = await server.call("POST", "resume", path)
        assert code == 202, record

    # Then a gets the free GPU; b waits first in line with the scheduler's reason, c second
    # in line with no pod of its own (the next GPU freed goes to b's pod). Made one at a time,
    # c's pod is never made; made at once, c's pod is refused too and withdrawn, and whichever
    # launcher finished first, a later pod that took the GPU gives it back to a.
    ready = await server.wait_state("a.ipynb", "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    b = await server.wait_for(
        "b.ipynb", lambda r: "Insufficient nvidia.com/gpu" in (r["message"] or "")
    )
    assert b["state"] == "waiting-for-resources" and b["queue_position"] == 1, b
    assert "1st in line; the scheduler says:" in b["message"], b
    c = await server.wait_for("c.ipynb", lambda r: r["queue_position"] == 2)
    assert c["state"] == "waiting-for-resources", c
    assert "2nd in line; 1 resume on this server gets a GPU first" in c["message"], c
    await until(lambda: len(kernel_pods.kernel_pods()) == 2, 60, "c's pod withdrawn", cluster)
    pods = {p["metadata"]["labels"]["kernel_id"]: p for p in kernel_pods.kernel_pods()}
    assert set(pods) == {kernels["a.ipynb"], kernels["b.ipynb"]}, pods
    assert not scheduled(pods[kernels["b.ipynb"]])
    _, status = await server.call("GET", "status")
    assert status["resources"]["queue"] == ["b.ipynb", "c.ipynb"], status

    refused_b = pods[kernels["b.ipynb"]]

    # When a pauses again
    code, record = await server.call("POST", "pause", "a.ipynb")
    assert code == 202, record

    # Then its GPU goes to b, and c is first in line, its pod waiting for the scheduler
    ready = await server.wait_state("b.ipynb", "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    # and b's refused pod was made anew once a's was gone, for the scheduler to try it at once
    # rather than when its backoff for b's pod ended
    pods = {p["metadata"]["labels"]["kernel_id"]: p for p in kernel_pods.kernel_pods()}
    given = pods[kernels["b.ipynb"]]
    assert given["metadata"]["name"] == refused_b["metadata"]["name"] and scheduled(given)
    assert given["metadata"]["uid"] != refused_b["metadata"]["uid"]
    c = await server.wait_for(
        "c.ipynb", lambda r: "Insufficient nvidia.com/gpu" in (r["message"] or "")
    )
    assert c["queue_position"] == 1 and "1st in line" in c["message"], c

    # When the other team's pods go
    cluster.release_gpus()

    # Then c is ready; each notebook was restored once, into its own kernel and one pod
    ready = await server.wait_state("c.ipynb", "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    for path in ("b.ipynb", "c.ipynb"):
        assert await server.run(kernels[path], "print(who)") == f"{path}\n"
        _, timeline = await server.call("GET", "timeline", path)
        kinds = [e["kind"] for e in timeline["events"]]
        assert kinds.count("state_restored") == 1, kinds
    # and the timeline of each kept the places it waited at, with why
    _, timeline = await server.call("GET", "timeline", "c.ipynb")
    places = [e["data"] for e in timeline["events"] if e["kind"] == "waiting_for_resources"]
    order = [p["place"] for p in places]  # 3rd while a's pod had no node yet, then 2nd, 1st
    assert order[-2:] == [2, 1] and order == sorted(set(order), reverse=True), places
    assert "Insufficient nvidia.com/gpu" in places[-1]["reason"], places
    pods = [p["metadata"]["labels"]["kernel_id"] for p in kernel_pods.kernel_pods()]
    assert sorted(pods) == sorted([kernels["b.ipynb"], kernels["c.ipynb"]]), pods


async def test_a_kernel_pod_shut_down_hands_its_gpu_to_the_first_in_line_at_once(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    # Given a paused GPU notebook, and another notebook whose kernel pod holds the only GPU
    kernel_id, _ = await a_paused_gpu_notebook(server, kernel_pods)
    other = await open_gpu_notebook(server, "other.ipynb")
    # and the paused one's resume waiting, its pod refused by the scheduler
    waiting = await resumed_until_refused(server)
    assert waiting["state"] == "waiting-for-resources", waiting
    (refused,) = [
        p for p in kernel_pods.kernel_pods() if p["metadata"]["labels"]["kernel_id"] == kernel_id
    ]

    # When the other notebook's kernel is shut down (JupyterLab's Shut Down Kernel)
    response = await server.fetch("api", "kernels", other, method="DELETE")
    assert response.code == 204

    # Then the freed GPU went to the waiting resume's pod, made anew once the kernel was gone
    # (the scheduler tries a new pod at once, a refused one only when its backoff ends)
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["kernel_id"] == kernel_id, ready
    (pod,) = kernel_pods.kernel_pods()
    assert pod["metadata"]["name"] == refused["metadata"]["name"] and scheduled(pod)
    assert pod["metadata"]["uid"] != refused["metadata"]["uid"]
    assert await server.run(kernel_id, "print(sum(weights) + step)") == "45.0\n"


async def test_a_kernel_shut_down_while_its_resume_waits_ends_the_wait_and_keeps_the_checkpoint(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster
    # Given a paused GPU notebook whose resume waits: another team holds the only GPU
    kernel_id = await a_resume_waiting_for_the_gpu(server, kernel_pods)
    assert len(kernel_pods.kernel_pods()) == 1

    # When its kernel is shut down (JupyterLab's Shut Down Kernel, a culler)
    response = await server.fetch("api", "kernels", kernel_id, method="DELETE")

    # Then the kernel is gone with its waiting pod, and the notebook is paused, its
    # checkpoint intact
    assert response.code == 204
    assert kernel_id not in await kernel_ids(server)
    await until(lambda: kernel_pods.kernel_pods() == [], 60, "no kernel pod", cluster)
    paused = await server.wait_state(NOTEBOOK, "paused", timeout=60)
    assert paused["checkpoint"] is not None, paused

    # When the GPU is free and the notebook resumed
    cluster.release_gpus()
    code, record = await server.call("POST", "resume", NOTEBOOK)
    assert code == 202, record

    # Then it is back from files in a new kernel pod
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert await server.run(ready["kernel_id"], "print(sum(weights) + step)") == "45.0\n"


async def test_a_resume_waiting_for_a_gpu_restores_on_cpu_when_asked_in_a_pod_without_one(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster

    # Given a paused GPU notebook whose resume waits: another team holds the only GPU
    kernel_id = await a_resume_waiting_for_the_gpu(server, kernel_pods)

    # When the user asks for it on CPU now
    code, record = await server.call("POST", "resume", NOTEBOOK, body={"accelerators": "none"})
    assert code == 202, record

    # Then the same kernel is back from files in a pod that asks for no GPU, on a node
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] == kernel_id and "On CPU, as asked" in ready["message"], ready
    (pod,) = kernel_pods.kernel_pods()
    assert pod["metadata"]["labels"]["kernel_id"] == kernel_id and scheduled(pod)
    (container,) = pod["spec"]["containers"]
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources") or {}), container
    assert await server.run(kernel_id, "print(sum(weights) + step)") == "45.0\n"
    _, status = await server.call("GET", "status")
    assert status["resources"]["queue"] == [], status

    # When it is paused and resumed again once the GPU is free, its pod asks for the GPU again
    cluster.release_gpus()
    code, _ = await server.call("POST", "pause", NOTEBOOK)
    assert code == 202
    assert (await server.wait_state(NOTEBOOK, "paused", "active"))["state"] == "paused"
    code, _ = await server.call("POST", "resume", NOTEBOOK)
    again = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")
    assert again["state"] == "ready", again
    (pod,) = kernel_pods.kernel_pods()
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1", container


async def test_the_idle_policy_frees_an_idle_kernel_pod_never_a_busy_one_while_the_ui_stays(
    pod_server: Server, kernel_pods: KernelPods, jp_ws_fetch: Any, request: pytest.FixtureRequest
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster
    policy = server.orchestrator.policy
    policy.idle_pause_minutes = 0.0005  # 30 ms
    policy.kernelspec_overrides = {}

    # Given a GPU notebook open in a tab (its websocket), whose kernel pod runs a long cell
    kernel_id = await open_gpu_notebook(server)
    tab = await jp_ws_fetch("api", "kernels", kernel_id, "channels", params={"session_id": "t"})
    request.addfinalizer(tab.close)
    await server.run(kernel_id, "x = 41")
    await server.watched(NOTEBOOK)
    running = asyncio.ensure_future(execute_over(tab, "import time; time.sleep(3); print('done')"))
    await server.wait_for(NOTEBOOK, lambda r: r["busy"])

    # Then the idle policy leaves it while the cell runs, however long past the threshold
    await asyncio.sleep(0.5)
    assert await server.orchestrator.check_idle() == []
    assert await running == "done\n"

    # When it has been idle past the threshold, the tab still open (not activity)
    await asyncio.sleep(0.1)
    assert await server.orchestrator.check_idle() == [NOTEBOOK]

    # Then it is paused: its pod (and GPU) gone, while the notebook's session and kernel stay
    paused = await server.wait_state(NOTEBOOK, "paused", "active")
    assert paused["state"] == "paused" and paused["kernel_id"] == kernel_id, paused
    await until(lambda: kernel_pods.kernel_pods() == [], 60, "no kernel pod", cluster)
    sessions = json.loads((await server.fetch("api", "sessions")).body)
    assert [(s["path"], s["kernel"]["id"]) for s in sessions] == [(NOTEBOOK, kernel_id)]
    _, timeline = await server.call("GET", "timeline", NOTEBOOK)
    (asked,) = [e for e in timeline["events"] if e["kind"] == "pause_requested"]
    assert asked["data"]["reason"].startswith("idle for"), asked
    # and a resume brings it back in the same kernel
    code, _ = await server.call("POST", "resume", NOTEBOOK)
    assert code == 202
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["kernel_id"] == kernel_id, ready
    assert await server.run(kernel_id, "print(x + 1)") == "42\n"


async def test_restart_kernel_pressed_while_a_resume_waits_for_the_gpu_joins_that_resume(
    pod_server: Server, kernel_pods: KernelPods
) -> None:
    server = pod_server
    cluster = kernel_pods.cluster
    # Given a resume waiting for the GPU, its pod pending
    kernel_id = await a_resume_waiting_for_the_gpu(server, kernel_pods)
    (pending,) = kernel_pods.kernel_pods()

    # When the user presses Restart Kernel (JupyterLab's POST .../restart)
    restart = asyncio.ensure_future(
        server.fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    )
    await asyncio.sleep(3)

    # Then the restart waits for the resume, which waits on in its one pod
    assert not restart.done()
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "waiting-for-resources", record
    (pod,) = kernel_pods.kernel_pods()
    assert pod["metadata"]["uid"] == pending["metadata"]["uid"]

    # When the GPU frees
    cluster.release_gpus()

    # Then the restart answers with the kernel the resume brought back, restored from files
    answer = await asyncio.wait_for(restart, 120)
    assert answer.code == 200 and json.loads(answer.body)["id"] == kernel_id
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert await server.run(kernel_id, "print(sum(weights) + step)") == "45.0\n"
    assert len(kernel_pods.kernel_pods()) == 1
