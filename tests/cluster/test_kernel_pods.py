"""The kernel-pod backend (``jupyter_pause/backends/kernel_pod_provisioner.py``) on the real
control plane: JupyterLab's KernelManager launches each kernel as a pod through the shipped
kernelspec (``deploy/kernel-pods/``, installed by its own script) and gateway-provisioners'
launcher; the real kube-scheduler places the pod on a node the test registered with one
``nvidia.com/gpu``; the played kubelet (``real_players.py``) runs the pod's command, gateway's
``launch_ipykernel.py``, as a real ipykernel process with the pod's environment, which sends its
connection info back to the provisioner. Every API call of the provisioner and its launcher is
made with the server's ServiceAccount token and nothing but ``deploy/kernel-pods/rbac.yaml``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from .control_plane import ControlPlane
from .deploy_manifests import service_account_token
from .real_players import POOL_LABEL, RealPlayedCluster, core

ROOT = Path(__file__).resolve().parents[2]
KERNEL_PODS = ROOT / "deploy" / "kernel-pods"
KERNEL_NAME = "python-gpu-pod"
SERVER_ACCOUNT = "jupyter-server"
ENTRY_POINTS = "jupyter_client.kernel_provisioners"
PROVISIONER = "jupyter-pause-kernel-pod"

pytest.importorskip("gateway_provisioners", reason="the kernel-pod backend's tests")


@dataclass
class KernelPods:
    """One test's kernel-pod setting: the played cluster, the server's account, the store."""

    cluster: RealPlayedCluster
    namespace: str
    store: Path
    notebook: Path

    def env(self) -> dict[str, str]:
        """What jupyter-server gives a kernel it starts: its environment, plus the values the
        kernel pod template and jupyter_pause read."""
        return {
            **os.environ,
            "KERNEL_USERNAME": "alice",
            "KERNEL_NAMESPACE": self.namespace,
            # this test's nodes (the scheduler and other tests' nodes are shared)
            "KERNEL_NODE_SELECTOR": json.dumps({POOL_LABEL: self.cluster.pool}),
            "JUPYTER_PAUSE_STORE": str(self.store),
            "JUPYTER_PAUSE_NOTEBOOK": str(self.notebook),
        }

    def kernel_pods(self) -> list[dict[str, Any]]:
        return self.cluster.api.list(core(self.namespace, "pods"), labelSelector="component=kernel")

    def manager(self, launch_timeout: int = 30) -> Any:
        """An async KernelManager as jupyter-server's (with its restarter), of the shipped
        kernelspec; its restarter looks every 0.5 s."""
        from jupyter_client.ioloop import AsyncIOLoopKernelManager
        from traitlets.config import Config

        config = Config(
            {
                "KernelRestarter": {"time_to_dead": 0.5},
                "KernelPodProvisioner": {"launch_timeout": launch_timeout},
            }
        )
        return AsyncIOLoopKernelManager(kernel_name=KERNEL_NAME, config=config)


def _shipped_entry_point() -> str:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["entry-points"][ENTRY_POINTS][PROVISIONER]


@pytest.fixture
def provisioner_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped entry point, as an install of this checkout registers it: an editable install
    made before the entry point existed lacks it, and then it is registered from
    pyproject.toml in a dist-info of the test's own."""
    found = [e for e in metadata.entry_points(group=ENTRY_POINTS) if e.name == PROVISIONER]
    if found:
        assert found[0].value == _shipped_entry_point()
        return
    info = tmp_path / "entry-points" / "jupyter_pause_kernel_pod_test-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jupyter-pause-kernel-pod-test\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINTS}]\n{PROVISIONER} = {_shipped_entry_point()}\n"
    )
    monkeypatch.syspath_prepend(str(info.parent))


@pytest.fixture
def kernel_pods(
    real_chain: RealPlayedCluster,
    provisioner_registered: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[KernelPods]:
    """A GPU node of one GPU; the server's ServiceAccount with the shipped RBAC, its token for the
    provisioner (the Kubernetes client's default) and for the launcher (KUBECONFIG); the shipped
    kernelspec installed by its script."""
    from gateway_provisioners.response_manager import ResponseManager
    from kubernetes import client

    plane: ControlPlane = real_chain.plane
    namespace = real_chain.namespace
    real_chain.node("gpu", gpus=1)
    real_chain.api.create(
        core(namespace, "serviceaccounts"), {"metadata": {"name": SERVER_ACCOUNT}}
    )
    plane.apply_file(KERNEL_PODS / "rbac.yaml", NAMESPACE=namespace, SERVICE_ACCOUNT=SERVER_ACCOUNT)
    credentials = plane.credentials(service_account_token(plane, namespace, SERVER_ACCOUNT))
    kubeconfig = credentials.kubeconfig(tmp_path / "server.kubeconfig", namespace)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: KUBECONFIG
    configuration = client.Configuration()
    configuration.host = credentials.url
    configuration.ssl_ca_cert = credentials.ca_file
    configuration.api_key = {"authorization": f"Bearer {credentials.token}"}
    previous = client.Configuration.get_default_copy()
    client.Configuration.set_default(configuration)
    kernels = tmp_path / "jupyter" / "kernels"
    installed = subprocess.run(
        ["sh", str(KERNEL_PODS / "install-kernelspec.sh"), str(kernels)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    assert installed.stdout.strip() == str(kernels / KERNEL_NAME)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    try:
        yield KernelPods(real_chain, namespace, tmp_path / "store", tmp_path / "exp.ipynb")
    finally:
        for container in real_chain.commands:  # shown with a failed test's output
            print(f"--- kernel pod {container.pod_name}:\n{container.log.read_text()[-3000:]}")
        client.Configuration.set_default(previous)
        # The response manager is a process-wide singleton polling on the event loop it was
        # made on; each test runs its own loop, so each gets its own (a server has one loop).
        manager = ResponseManager._instance
        if manager is not None:
            sock = manager._response_socket
            manager.stop_response_manager()
            if sock is not None:
                sock.close()
            ResponseManager.clear_instance()


async def run_cell(manager: Any, code: str, timeout: float = 60) -> str:
    """Run ``code`` in the kernel over its channels; its stdout (a failed cell fails the test)."""
    kernel = manager.client()
    kernel.start_channels()
    try:
        await kernel.wait_for_ready(timeout=timeout)
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])

        reply = await kernel.execute_interactive(code, output_hook=hook, timeout=timeout)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)
    finally:
        kernel.stop_channels()


async def until(check: Any, timeout: float, what: str, cluster: RealPlayedCluster) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        cluster.check()
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.2)


def scheduled(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName"))


def test_a_kernel_pod_runs_pauses_without_its_gpu_and_resumes_under_its_id_from_files(
    kernel_pods: KernelPods,
) -> None:
    from jupyter_pause.backends.kernel_pod_provisioner import KernelPodProvisioner, resume_kernel

    cluster = kernel_pods.cluster

    async def scenario() -> None:
        # Given a kernel started through the shipped kernelspec
        manager = kernel_pods.manager()
        restarts: list[str] = []
        manager.add_restart_callback(lambda: restarts.append("restart"), "restart")
        await manager.start_kernel(env=kernel_pods.env())
        try:
            assert isinstance(manager.provisioner, KernelPodProvisioner)
            kernel_id = manager.kernel_id

            # Then it is one pod, placed by the real scheduler on the GPU node, asking one GPU
            (pod,) = kernel_pods.kernel_pods()
            assert pod["metadata"]["labels"]["kernel_id"] == kernel_id
            assert pod["spec"]["nodeName"] == f"{cluster.pool}-gpu"
            (container,) = pod["spec"]["containers"]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
            assert pod["spec"]["automountServiceAccountToken"] is False
            # and a real ipykernel: the pod's own process (the played kubelet's), its env
            played = cluster.pods[pod["metadata"]["uid"]].container
            assert played is not None
            facts = json.loads(
                await run_cell(
                    manager,
                    "import os, json\n"
                    "print(json.dumps([os.getpid(), type(get_ipython().kernel).__module__,"
                    " os.environ['KERNEL_ID']]))",
                )
            )
            assert facts == [played.process.pid, "ipykernel.ipkernel", kernel_id]
            # When the notebook's state is checkpointed and the kernel paused
            await run_cell(
                manager,
                "weights = [1.5, 2.5]\nstep = 41\n"
                "saved = __import__('jupyter_pause').checkpoint()\n"
                "assert {'weights', 'step'} <= set(saved.saved), saved.summary()",
            )
            await manager.provisioner.pause()

            # Then its pod is gone and the kernel is the same: its id, its manager, "alive"
            assert kernel_pods.kernel_pods() == []
            assert played.process.poll() is not None  # the kernel's process ended with it
            assert manager.kernel_id == kernel_id and manager.has_kernel
            assert await manager.is_alive()  # paused is not dead
            # and its GPU is free: another team's GPU pod is scheduled on that node
            (other,) = cluster.block_gpus(1)
            other_ns = f"{kernel_pods.namespace}-other-team"
            await until(
                lambda: scheduled(cluster.api.get(core(other_ns, "pods", other)) or {"spec": {}}),
                60,
                "the other team's GPU pod to be scheduled",
                cluster,
            )
            cluster.release_gpus()
            # and the restarter, looking every 0.5 s, brought nothing back in 5 s
            await asyncio.sleep(5)
            assert restarts == [] and kernel_pods.kernel_pods() == []

            # When it is resumed (the other pod gone, the GPU free)
            await until(
                lambda: cluster.api.get(core(other_ns, "pods", other)) is None,
                60,
                "the other team's pod to be gone",
                cluster,
            )
            await resume_kernel(manager)

            # Then one new pod runs the kernel under the same id, a new process
            (again,) = kernel_pods.kernel_pods()
            assert again["metadata"]["labels"]["kernel_id"] == kernel_id
            assert again["metadata"]["uid"] != pod["metadata"]["uid"]
            assert manager.kernel_id == kernel_id and not manager.provisioner.paused
            # and the variables come back from the checkpoint files
            restored = await run_cell(
                manager,
                "%load_ext jupyter_pause\n"
                "import json\n"
                "result = __import__('jupyter_pause').restore()\n"
                "print(json.dumps([result.complete, sorted(result.restored), weights, step]))",
            )
            assert json.loads(restored) == [True, ["step", "weights"], [1.5, 2.5], 41]
        finally:
            await manager.shutdown_kernel(now=True)
        # and a shutdown deletes the pod for good
        await until(lambda: kernel_pods.kernel_pods() == [], 60, "no kernel pod", cluster)

    asyncio.run(scenario())


def test_a_resume_without_a_free_gpu_waits_with_the_schedulers_reason_past_the_launch_timeout(
    kernel_pods: KernelPods,
) -> None:
    from jupyter_pause.backends.kernel_pod_provisioner import resume_kernel

    cluster = kernel_pods.cluster
    launch_timeout = 5

    async def scenario() -> None:
        # Given a paused kernel pod whose launch timeout is 5 s
        manager = kernel_pods.manager(launch_timeout=launch_timeout)
        await manager.start_kernel(env=kernel_pods.env())
        try:
            kernel_id = manager.kernel_id
            await manager.provisioner.pause()
            # and another team's pod holding the only GPU meanwhile
            (other,) = cluster.block_gpus(1)
            other_ns = f"{kernel_pods.namespace}-other-team"
            await until(
                lambda: scheduled(cluster.api.get(core(other_ns, "pods", other)) or {"spec": {}}),
                60,
                "the other team's GPU pod to be scheduled",
                cluster,
            )

            # When the kernel is resumed
            resume = asyncio.create_task(resume_kernel(manager))

            # Then it waits, saying the scheduler's reason, for three times its launch timeout
            reason = await until(
                lambda: manager.provisioner.waiting_reason, 60, "the reason of the wait", cluster
            )
            assert "Insufficient nvidia.com/gpu" in reason, reason
            await asyncio.sleep(3 * launch_timeout)
            assert not resume.done(), resume
            (waiting,) = kernel_pods.kernel_pods()
            assert waiting["status"]["phase"] == "Pending" and not scheduled(waiting)
            assert "Insufficient nvidia.com/gpu" in manager.provisioner.waiting_reason

            # When the other team's pod goes
            cluster.release_gpus()

            # Then the resume completes: the kernel runs again under its id, on the GPU node
            await asyncio.wait_for(resume, 120)
            assert manager.provisioner.waiting_reason is None
            (pod,) = kernel_pods.kernel_pods()
            assert pod["metadata"]["labels"]["kernel_id"] == kernel_id
            assert pod["spec"]["nodeName"] == f"{cluster.pool}-gpu"
            assert await run_cell(manager, "print(6 * 7)") == "42\n"
        finally:
            await manager.shutdown_kernel(now=True)

    asyncio.run(scenario())


def test_the_shipped_rbac_lets_the_servers_account_manage_pods_in_its_namespace_only(
    kernel_pods: KernelPods,
) -> None:
    from kubernetes import client

    # Given the server's ServiceAccount with deploy/kernel-pods/rbac.yaml (the fixture's), as
    # the provisioner calls the API (the Kubernetes client's default configuration)
    namespace = kernel_pods.namespace
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
    resources = ("pods", "pods/exec", "pods/log", "pods/status", "secrets", "configmaps",
                 "services", "serviceaccounts", "events")  # fmt: skip

    # When the API server is asked about every verb on each resource, here and in "default"
    allowed = set()
    with client.ApiClient() as api:
        authorization = client.AuthorizationV1Api(api)
        for where in (namespace, "default"):
            for resource in resources:
                kind, _, sub = resource.partition("/")
                for verb in verbs:
                    attributes = {"namespace": where, "verb": verb, "resource": kind}
                    if sub:
                        attributes["subresource"] = sub
                    review = authorization.create_self_subject_access_review(
                        {"spec": {"resourceAttributes": attributes}}
                    )
                    if review.status.allowed:
                        allowed.add((where, resource, verb))

    # Then it may create, delete, get, list and watch pods in its own namespace, nothing else
    wanted = {(namespace, "pods", v) for v in ("create", "delete", "get", "list", "watch")}
    assert allowed == wanted, allowed ^ wanted
