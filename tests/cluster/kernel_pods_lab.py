"""JupyterLab on the kernel-pod backend, for the kernel-pods galata test.

``python -m tests.cluster.kernel_pods_lab`` (what ``ui-tests/playwright-kernel-pods.config.js``
starts) brings up the real control plane of the cluster tests (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler), plays the kubelet of one node of one
``nvidia.com/gpu`` (a kernel pod the scheduler puts there becomes a real ipykernel process on
this machine), and runs ``jupyter lab`` with ``ui-tests/jupyter_server_kernel_pods_config.py``
in the setting ``kernel_pod_server.py`` makes. It serves until SIGTERM or SIGINT, then stops
JupyterLab (its kernels' pods deleted), the played cluster and the control plane.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..lab_process import end, until_signalled
from .kernel_pod_server import ROOT, kernel_pod_server_env, started_plane
from .real_players import real_played_cluster

CONFIG = ROOT / "ui-tests" / "jupyter_server_kernel_pods_config.py"


def main() -> int:
    stopping = until_signalled()
    with tempfile.TemporaryDirectory(prefix="jp-kernel-pods-lab-") as tmp:
        folder = Path(tmp)
        plane = started_plane(folder / "control-plane")
        try:
            with real_played_cluster(plane, folder / "cluster") as chain:
                chain.node("gpu", gpus=1)
                env = kernel_pod_server_env(chain, folder / "server")
                lab = subprocess.Popen(
                    [sys.executable, "-m", "jupyter", "lab", f"--config={CONFIG}"],
                    env=env,
                    cwd=CONFIG.parent,
                )
                print(f"kernel-pods lab: namespace {chain.namespace}, node {chain.nodes[0]}")
                try:
                    while not stopping() and lab.poll() is None:
                        chain.check()
                        time.sleep(0.5)
                finally:
                    end(lab)  # jupyter-server stops its kernels (their pods) first
                return lab.returncode or 0
        finally:
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
