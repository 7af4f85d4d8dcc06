"""The kernel-pod backend's test setting, shared by ``test_kernel_pods.py`` (a bare
KernelManager) and ``test_kernel_pods_server.py`` (a jupyter_server and its REST API): a GPU node,
the server's ServiceAccount with the shipped RBAC, the shipped kernelspec installed by its script,
and helpers to wait on the played cluster. ``conftest.py`` makes the fixtures visible.
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


def kernel_pod_server_config(
    kernel_pods: KernelPods,
    pause_store: Path,
    monkeypatch: pytest.MonkeyPatch,
    launch_timeout: int,
) -> dict[str, Any]:
    """A jupyter_server's config on the kernel-pod backend; the kernel pods' template values in
    the server's environment (jupyter-server gives its kernels its own), as a deployment sets
    them; the restarter looks every 0.5 s."""
    from ..servers import pause_server_config

    for name, value in kernel_pods.env().items():
        if name.startswith("KERNEL_"):
            monkeypatch.setenv(name, value)
    config = pause_server_config(pause_store, backend="kernel-pod")
    config["KernelPodProvisioner"] = {"launch_timeout": launch_timeout}
    config["KernelRestarter"] = {"time_to_dead": 0.5}
    return config


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


async def other_team_holds_the_gpu(kernel_pods: KernelPods) -> tuple[str, str]:
    """Another team's pod asking one GPU, placed by the scheduler: (namespace, name)."""
    cluster = kernel_pods.cluster
    (other,) = cluster.block_gpus(1)
    namespace = f"{kernel_pods.namespace}-other-team"
    await until(
        lambda: scheduled(cluster.api.get(core(namespace, "pods", other)) or {"spec": {}}),
        60,
        "the other team's GPU pod to be scheduled",
        cluster,
    )
    return namespace, other
