"""Where a paused session's process goes: the local machine, or a Kubernetes cluster.

The orchestrator only speaks to ``Backend`` (see ``base.py``); adding a cluster backend
(GKE Pod Snapshots, Kubeflow Workspaces) means implementing that interface, nothing else.
"""
