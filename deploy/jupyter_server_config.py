"""jupyter_pause in a Kubeflow Workspace pod (GKE Workspaces too).

The image in ``Dockerfile`` copies this file to ``/etc/jupyter/jupyter_server_config.py``.
"""

import os

c = get_config()  # noqa: F821 - provided by Jupyter when it loads this file

# This server runs in a Workspace pod: a pause checkpoints every kernel, snapshots the pod
# where a PodSnapshotPolicy selects it, and pauses the Workspace ("auto" detects this too).
c.PauseApp.backend = "workspace"

# Checkpoints on the home volume: the PVC outlives the pod, the pod's own disk does not.
c.PauseApp.store_root = os.path.join(os.path.expanduser("~"), ".jupyter-pause", "checkpoints")

# Kernel connections over Unix sockets inside the pod, not TCP: a pod snapshot restores
# Unix-domain and loopback sockets, so kernels still answer after a live restore.
c.KernelManager.transport = "ipc"

# Pause idle notebooks with a pod snapshot (a live restore later) before the platform's own
# idle pause (WorkspaceKind activityRules, 60 min in workspacekind.yaml) stops the pod.
c.PauseApp.idle_pause_minutes = 50

# On SIGTERM (the platform's idle pause, a node drain, an upgrade) every kernel is checkpointed
# within this many seconds; Kubernetes' grace period is 30 s unless the pod says otherwise.
c.PauseApp.platform_stop_seconds = 25

# Keep the snapshot the next resume restores, and no other one.
c.PauseApp.snapshots_keep_last = 1
