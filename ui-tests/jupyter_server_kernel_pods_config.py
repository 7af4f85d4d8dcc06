"""JupyterLab for the kernel-pods galata test (``playwright-kernel-pods.config.js``): the
kernel-pod backend on the real control plane that ``tests/cluster/kernel_pods_lab.py`` starts
(which also sets the kernel pods' environment and installs the shipped kernelspec).
"""

import os
import shutil
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

configure_jupyter_server(c)  # noqa: F821 - `c` is the config object jupyter provides
c.ServerApp.allow_root = True  # noqa: F821
c.ServerApp.port = int(os.environ.get("UI_TESTS_PORT", "8888"))  # noqa: F821
store = Path(__file__).resolve().parent / ".pause-store-kernel-pods"
shutil.rmtree(store, ignore_errors=True)
store.mkdir(mode=0o700)
c.PauseApp.store_root = str(store)  # noqa: F821
c.PauseApp.backend = "kernel-pod"  # noqa: F821
c.KernelPodProvisioner.launch_timeout = 60  # noqa: F821 - s from when the pod has a node
