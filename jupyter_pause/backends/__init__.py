"""Where a paused session's process goes: the local machine, or a Kubernetes cluster.

The orchestrator only speaks to ``Backend`` and ``EnvironmentBackend`` (see ``base.py``):
``local.py`` stops kernels on this machine; ``workspace.py`` pauses the Kubeflow Workspace pod
the server runs in (GKE Pod Snapshots where the cluster has them), through ``kube.py``.
"""
