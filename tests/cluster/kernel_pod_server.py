"""A jupyter server on the kernel-pod backend, outside pytest: what ``bench/kernel_pods_rush.py``
and the kernel-pods galata test (``kernel_pods_lab.py``) start on the real control plane.

The setting is the one ``kernel_pod_fixtures.py`` gives the pytest tests: the server's
ServiceAccount with the shipped RBAC (its token in a kubeconfig, as a pod's own account would
be), the shipped kernelspec installed by its script, and the kernel pod template's values in the
server's environment (jupyter-server gives its kernels its own).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

from ..server_process import free_port, server_config, spawn_server, wait_serving
from .control_plane import UPSTREAM_CRDS, ControlPlane, apiserver_binary, kube_binary
from .deploy_manifests import service_account_token
from .notebooks import RemoteServer
from .real_players import POOL_LABEL, RealPlayedCluster, core

ROOT = Path(__file__).resolve().parents[2]
KERNEL_PODS = ROOT / "deploy" / "kernel-pods"
KERNEL_NAME = "python-gpu-pod"
ACCOUNT = "jupyter-server"


def kernel_pod_server_env(chain: RealPlayedCluster, folder: Path) -> dict[str, str]:
    """The environment of a jupyter server on the kernel-pod backend in ``chain``'s namespace,
    its kernels' pods on ``chain``'s nodes; ``folder`` holds its kubeconfig and kernelspec."""
    plane = chain.plane
    folder.mkdir(parents=True, exist_ok=True)
    chain.api.create(core(chain.namespace, "serviceaccounts"), {"metadata": {"name": ACCOUNT}})
    plane.apply_file(KERNEL_PODS / "rbac.yaml", NAMESPACE=chain.namespace, SERVICE_ACCOUNT=ACCOUNT)
    token = service_account_token(plane, chain.namespace, ACCOUNT)
    kubeconfig = plane.credentials(token).kubeconfig(folder / "server.kubeconfig", chain.namespace)
    subprocess.run(
        ["sh", str(KERNEL_PODS / "install-kernelspec.sh"), str(folder / "jupyter" / "kernels")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        check=True,
    )
    # PYTEST_CURRENT_TEST too: with it gateway-provisioners loads no Kubernetes configuration.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JUPYTER", "KUBE", "KERNEL_", "GP_", "PYTEST_"))
    }
    env.update(
        JUPYTER_PATH=str(folder / "jupyter"),
        JUPYTER_RUNTIME_DIR=str(folder / "runtime"),
        KUBECONFIG=str(kubeconfig),
        GP_USE_INCLUSTER_CONFIG="false",  # the kubeconfig, as outside a pod
        KERNEL_USERNAME="alice",
        KERNEL_NAMESPACE=chain.namespace,
        KERNEL_NODE_SELECTOR=json.dumps({POOL_LABEL: chain.pool}),
    )
    return env


def kernel_pod_server(
    env: dict[str, str], folder: Path, settings: str = ""
) -> tuple[subprocess.Popen[bytes], RemoteServer]:
    """A jupyter server process on the kernel-pod backend with ``env``
    (``kernel_pod_server_env``); its notebooks (``folder/notebooks``), checkpoints and config in
    ``folder``, ``settings`` more config lines. Started again on the same folder, it finds the
    same notebooks and checkpoints (a server pod back on its volume); each start logs to a
    ``server-PORT.log`` of its own."""
    env = {**env, "JUPYTER_CONFIG_DIR": str(folder)}
    root = folder / "notebooks"
    root.mkdir(parents=True, exist_ok=True)
    port, secret = free_port(), secrets.token_hex(16)
    config = folder / "jupyter_server_config.py"
    config.write_text(
        "c.ServerApp.jpserver_extensions = {'jupyter_pause': True}\n"
        + server_config(port, secret, root)
        + f"c.PauseApp.store_root = {str(folder / 'store')!r}\n"
        "c.PauseApp.backend = 'kernel-pod'\n"
        "c.PauseApp.busy_wait_seconds = 1.0\n"
        "c.PauseApp.monitor_interval_seconds = 3600.0\n" + settings
    )
    log = folder / f"server-{port}.log"
    process = spawn_server(config, env, root, log)
    server = RemoteServer(f"http://127.0.0.1:{port}", secret)
    try:
        wait_serving(process, server.url, secret, log)
    except BaseException:
        process.kill()
        raise
    return process, server


def started_plane(folder: Path) -> ControlPlane:
    """The real control plane as the cluster tests' session fixture starts it (the upstream
    CRDs, GKE Sandbox's RuntimeClass), its files in ``folder``; ``stop()`` it after use."""
    folder.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(
        folder,
        apiserver_binary(),
        controller_manager=kube_binary("kube-controller-manager"),
        scheduler=kube_binary("kube-scheduler"),
    )
    plane.start()
    try:
        plane.load_crds(UPSTREAM_CRDS)
        plane.install_gvisor_runtime_class()
    except BaseException:
        plane.stop()
        raise
    return plane
