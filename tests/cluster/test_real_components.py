"""The real components the cluster tests run against, each tested end to end through the API
server: kube-controller-manager makes a StatefulSet's Pod, kube-scheduler binds it to a node with
a free ``nvidia.com/gpu`` (or leaves it Unschedulable), the node lifecycle controller follows the
nodes' heartbeats, and GKE Workspaces' snapshot add-on mutates an enabled Workspace's pod and holds
its pause until GKE's snapshot is Ready. No kubelet runs: where one would act, the test does
(``RealCluster.kubelet_*``), as the cluster tests do; everything else is the real process.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .control_plane import (
    GPU,
    NOT_READY_TAINT,
    ControlPlane,
    SnapshotAddon,
    now_rfc3339,
    wait_until,
)

WORKSPACE_LABEL = "notebooks.kubeflow.org/workspace-name"
ENABLED = "podsnapshot.gke.kubeflow.org/enabled"
CHECKPOINT_STATE = "podsnapshot.gke.kubeflow.org/checkpoint-state"
STARTED_AT = "podsnapshot.gke.kubeflow.org/checkpoint-started-at"
LAST_CHECKPOINT = "podsnapshot.gke.kubeflow.org/last-checkpoint-name"
ACTIVE_GATE = "podsnapshot.gke.kubeflow.org/active"
POOL_LABEL = "jupyter-pause.io/test-pool"
MERGE = "application/merge-patch+json"
_numbers = itertools.count(1)


class RealCluster:
    """One test's corner of ``upstream_control_plane``: a namespace, and nodes of a pool of its
    own (the plane and its scheduler are shared by the session; the pods here select the pool)."""

    def __init__(self, plane: ControlPlane) -> None:
        from kubernetes import client

        self.plane = plane
        number = next(_numbers)
        self.namespace = f"real-{number}"
        self.pool = f"pool-{number}"
        self.api = plane.admin.api_client()
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.nodes: list[str] = []
        self.core.create_namespace({"metadata": {"name": self.namespace}})

    def node(self, role: str, gpus: int, sandbox: bool = False) -> str:
        name = f"{self.pool}-{role}"
        self.plane.register_node(name, gpus, sandbox=sandbox, labels={POOL_LABEL: self.pool})
        self.nodes.append(name)
        return name

    def close(self) -> None:
        for name in self.nodes:  # the pod garbage collector then removes their pods
            self.plane.remove_node(name)
        self.core.delete_namespace(self.namespace)
        self.api.close()

    # -- objects ----------------------------------------------------------------------------------
    def statefulset(
        self, name: str, gpus: int, workspace: str | None = None, home: str | None = None
    ) -> str:
        """A StatefulSet of one replica, as the Notebooks v2 workspace controller makes for a
        Workspace (the workspace-name label on its pods, the ``home`` claim mounted); returns
        its pod's name."""
        labels = {"app": name, **({WORKSPACE_LABEL: workspace} if workspace else {})}
        volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": home}}] if home else []
        mounts = [{"name": "home", "mountPath": "/home/jovyan"}] if home else []
        self.apps.create_namespaced_stateful_set(
            self.namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "replicas": 1,
                    "serviceName": name,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "nodeSelector": {POOL_LABEL: self.pool},
                            "volumes": volumes,
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "jupyterlab-pause:test",
                                    "resources": {"limits": {GPU: str(gpus)}},
                                    "volumeMounts": mounts,
                                }
                            ],
                        },
                    },
                },
            },
        )
        return f"{name}-0"

    def scale(self, name: str, replicas: int) -> None:
        self.apps.patch_namespaced_stateful_set_scale(
            name, self.namespace, {"spec": {"replicas": replicas}}
        )

    def pod(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api.sanitize_for_serialization(
                self.core.read_namespaced_pod(name, self.namespace)
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def wait_pod(self, name: str, check: Callable[[dict[str, Any]], bool], what: str) -> dict:
        return wait_until(
            lambda: (pod := self.pod(name)) is not None and check(pod) and pod, 60, what
        )

    def workspace_kind(self) -> str:
        """A WorkspaceKind that is valid under the upstream CRD: one image, one GPU pod config."""
        name = f"jupyterlab-{self.pool}"
        self.custom.create_cluster_custom_object(
            "kubeflow.org",
            "v1beta1",
            "workspacekinds",
            {
                "apiVersion": "kubeflow.org/v1beta1",
                "kind": "WorkspaceKind",
                "metadata": {"name": name},
                "spec": {
                    "spawner": {
                        "displayName": "JupyterLab",
                        "description": "JupyterLab with jupyter_pause",
                        "icon": {"url": "https://jupyter.org/favicon.ico"},
                        "logo": {"url": "https://jupyter.org/logo.svg"},
                    },
                    "podTemplate": {
                        "ports": [
                            {
                                "id": "jupyterlab",
                                "defaultDisplayName": "JupyterLab",
                                "protocol": "HTTP",
                            }
                        ],
                        "volumeMounts": {"home": "/home/jovyan"},
                        "options": {
                            "imageConfig": {
                                "spawner": {"default": "pause"},
                                "values": [
                                    {
                                        "id": "pause",
                                        "spawner": {"displayName": "jupyterlab-pause"},
                                        "spec": {
                                            "image": "jupyterlab-pause:test",
                                            "ports": [{"id": "jupyterlab", "port": 8888}],
                                        },
                                    }
                                ],
                            },
                            "podConfig": {
                                "spawner": {"default": "gpu-1"},
                                "values": [
                                    {
                                        "id": "gpu-1",
                                        "spawner": {"displayName": "1 GPU"},
                                        "spec": {"resources": {"limits": {GPU: "1"}}},
                                    }
                                ],
                            },
                        },
                    },
                },
            },
        )
        return name

    def workspace(self, name: str, kind: str, enabled: bool) -> dict[str, Any]:
        body = {
            "apiVersion": "kubeflow.org/v1beta1",
            "kind": "Workspace",
            "metadata": {"name": name, "annotations": {ENABLED: "true"} if enabled else {}},
            "spec": {
                "kind": kind,
                "podTemplate": {
                    "options": {"imageConfig": "pause", "podConfig": "gpu-1"},
                    "volumes": {},
                },
            },
        }
        return self.custom.create_namespaced_custom_object(
            "kubeflow.org", "v1beta1", self.namespace, "workspaces", body
        )

    def read_workspace(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            "kubeflow.org", "v1beta1", self.namespace, "workspaces", name
        )

    def snapshot_object(self, plural: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(
                "podsnapshot.gke.io", "v1", self.namespace, plural, name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    # -- what a kubelet would do ------------------------------------------------------------------
    def kubelet_run(self, name: str) -> None:
        """The pod's container started and ready. PodReady also needs every readiness gate True,
        as a kubelet computes it."""
        pod = self.pod(name)
        assert pod is not None
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
        conditions = {c["type"]: c for c in pod["status"].get("conditions") or []}
        gates_true = all(conditions.get(g, {}).get("status") == "True" for g in gates)
        now = now_rfc3339()
        own = {
            "Initialized": "True",
            "ContainersReady": "True",
            "Ready": "True" if gates_true else "False",
        }
        for kind, status in own.items():
            conditions[kind] = {"type": kind, "status": status, "lastTransitionTime": now}
        self.core.patch_namespaced_pod_status(
            name,
            self.namespace,
            {
                "status": {
                    "phase": "Running",
                    "podIP": "127.0.0.1",
                    "conditions": list(conditions.values()),
                    "containerStatuses": [
                        {
                            "name": "main",
                            "ready": True,
                            "restartCount": 0,
                            "image": "jupyterlab-pause:test",
                            "imageID": "",
                            "state": {"running": {"startedAt": now}},
                        }
                    ],
                }
            },
        )

    def kubelet_finish_deletion(self, name: str) -> None:
        """A pod bound to a node is deleted gracefully: it stays, Terminating, until the node's
        kubelet has stopped its containers and confirms with a deletion without grace."""
        self.wait_pod(
            name, lambda pod: bool(pod["metadata"].get("deletionTimestamp")), f"{name} deleted"
        )
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        wait_until(lambda: self.pod(name) is None, 30, f"{name} gone")


@pytest.fixture
def real_cluster(upstream_control_plane: ControlPlane) -> Iterator[RealCluster]:
    corner = RealCluster(upstream_control_plane)
    try:
        yield corner
    finally:
        corner.close()


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == kind), {})


def test_a_statefulset_pod_is_made_by_the_controller_manager_and_bound_to_the_gpu_node(
    real_cluster: RealCluster, upstream_control_plane: ControlPlane
) -> None:
    real_cluster.node("cpu", gpus=0)
    gpu_node = real_cluster.node("gpu", gpus=1)
    upstream_control_plane.provide_claim(real_cluster.namespace, "lab-home")

    pod_name = real_cluster.statefulset("ws-lab", gpus=1, home="lab-home")

    pod = real_cluster.wait_pod(pod_name, lambda pod: True, "the StatefulSet controller's pod")
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("StatefulSet", "ws-lab", True)
    pod = real_cluster.wait_pod(
        pod_name, lambda pod: bool(pod["spec"].get("nodeName")), "the scheduler to bind the pod"
    )
    assert pod["spec"]["nodeName"] == gpu_node  # the only node with a GPU to give
    assert _condition(pod, "PodScheduled")["status"] == "True"

    # A Workspace's pause, as the workspace controller makes it: no replica. The controller
    # deletes the pod; it is gone once the node's kubelet (played) confirms.
    real_cluster.scale("ws-lab", 0)
    real_cluster.kubelet_finish_deletion(pod_name)


def test_a_pod_wanting_a_gpu_none_has_free_waits_unschedulable_then_is_bound_when_one_frees(
    real_cluster: RealCluster,
) -> None:
    gpu_node = real_cluster.node("gpu", gpus=1)
    holder = real_cluster.statefulset("holder", gpus=1)
    real_cluster.wait_pod(
        holder, lambda pod: pod["spec"].get("nodeName") == gpu_node, "holder bound"
    )

    waiter = real_cluster.statefulset("waiter", gpus=1)

    pod = real_cluster.wait_pod(
        waiter,
        lambda pod: _condition(pod, "PodScheduled").get("reason") == "Unschedulable",
        "the scheduler to find no node for the second GPU pod",
    )
    scheduled = _condition(pod, "PodScheduled")
    assert scheduled["status"] == "False"
    assert f"Insufficient {GPU}" in scheduled["message"], scheduled["message"]
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")

    real_cluster.scale("holder", 0)
    real_cluster.kubelet_finish_deletion(holder)
    pod = real_cluster.wait_pod(
        waiter,
        lambda pod: pod["spec"].get("nodeName") == gpu_node,
        "the scheduler to bind the waiting pod once the GPU is free",
    )
    assert _condition(pod, "PodScheduled")["status"] == "True"


def test_the_node_lifecycle_controller_taints_a_node_whose_heartbeat_stops_and_only_that_one(
    real_cluster: RealCluster, upstream_control_plane: ControlPlane
) -> None:
    beating = real_cluster.node("beating", gpus=1)
    silent = real_cluster.node("silent", gpus=1)
    upstream_control_plane.heartbeat.remove(silent)  # its kubelet goes quiet

    def taints(name: str) -> set[str]:
        return {taint.key for taint in real_cluster.core.read_node(name).spec.taints or []}

    # The node lifecycle controller's grace period is 40 s: both leases were renewed together
    # until the silent one stopped; by the time it is marked unreachable, the beating node would
    # be too, were its heartbeat not renewed.
    wait_until(
        lambda: "node.kubernetes.io/unreachable" in taints(silent),
        120,
        "the node lifecycle controller to mark the silent node unreachable",
        interval=1,
    )
    assert not taints(beating) & {"node.kubernetes.io/unreachable", NOT_READY_TAINT}
    assert not upstream_control_plane.heartbeat.errors


def test_the_addon_puts_an_enabled_workspaces_pod_in_gvisor_and_leaves_the_others_alone(
    real_cluster: RealCluster, gke_addon: SnapshotAddon
) -> None:
    plain_node = real_cluster.node("plain", gpus=1)
    sandbox_node = real_cluster.node("sandbox", gpus=1, sandbox=True)
    kind = real_cluster.workspace_kind()
    created = real_cluster.workspace("lab", kind, enabled=True)
    assert created["spec"]["paused"] is False  # the upstream CRD's default
    real_cluster.workspace("other", kind, enabled=False)

    lab = real_cluster.statefulset("ws-lab", gpus=1, workspace="lab")
    other = real_cluster.statefulset("ws-other", gpus=1, workspace="other")

    pod = real_cluster.wait_pod(lab, lambda pod: bool(pod["spec"].get("nodeName")), "lab bound")
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert {"conditionType": ACTIVE_GATE} in spec["readinessGates"]
    volume = next(v for v in spec["volumes"] if v["name"] == "jupyter-ipc-config")
    assert volume["configMap"]["name"] == "jupyter-ipc-config"
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == "/etc/jupyter/jupyter_server_config.py"
    # RuntimeClass gvisor's scheduling, as on GKE: only a GKE Sandbox node takes it
    assert spec["nodeName"] == sandbox_node
    config = real_cluster.core.read_namespaced_config_map(
        "jupyter-ipc-config", real_cluster.namespace
    )
    assert "c.KernelManager.transport = 'ipc'" in config.data["jupyter_server_config.py"]
    policy = wait_until(
        lambda: real_cluster.snapshot_object("podsnapshotpolicies", "ws-lab-policy"),
        30,
        "the add-on's PodSnapshotPolicy for the enabled Workspace",
    )
    assert policy["spec"]["triggerConfig"] == {"type": "manual", "postCheckpoint": "stop"}
    assert policy["spec"]["selector"] == {"matchLabels": {WORKSPACE_LABEL: "lab"}}

    pod = real_cluster.wait_pod(other, lambda pod: bool(pod["spec"].get("nodeName")), "other bound")
    assert "runtimeClassName" not in pod["spec"]
    assert not pod["spec"].get("readinessGates")
    assert "jupyter-ipc-config" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert pod["spec"]["nodeName"] == plain_node  # no toleration for the sandbox taint


def test_the_addon_holds_a_pause_until_gkes_snapshot_is_ready(
    real_cluster: RealCluster, gke_addon: SnapshotAddon
) -> None:
    real_cluster.node("sandbox", gpus=1, sandbox=True)
    real_cluster.workspace("lab", real_cluster.workspace_kind(), enabled=True)
    pod_name = real_cluster.statefulset("ws-lab", gpus=1, workspace="lab")
    real_cluster.wait_pod(pod_name, lambda pod: bool(pod["spec"].get("nodeName")), "lab bound")
    real_cluster.kubelet_run(pod_name)
    pod = real_cluster.wait_pod(
        pod_name,
        lambda pod: _condition(pod, ACTIVE_GATE).get("status") == "True",
        "the add-on to open the readiness gate of the running pod",
    )
    assert _condition(pod, "Ready")["status"] == "True"

    # The pause as the Kubeflow UI asks for it.
    answer = real_cluster.custom.patch_namespaced_custom_object(
        "kubeflow.org", "v1beta1", real_cluster.namespace, "workspaces", "lab",
        {"spec": {"paused": True}}, _content_type=MERGE,
    )  # fmt: skip

    annotations = answer["metadata"]["annotations"]
    assert answer["spec"]["paused"] is False  # held back by the webhook
    assert annotations[CHECKPOINT_STATE] == "Checkpointing"
    started_at = annotations[STARTED_AT]
    pod = real_cluster.wait_pod(
        pod_name,
        lambda pod: _condition(pod, ACTIVE_GATE).get("status") == "False",
        "the add-on to take the pod out of its Service",
    )
    assert _condition(pod, "Ready")["status"] == "False"
    # After the socket settle period (3 s) its reconciler asks GKE for a snapshot.
    trigger = wait_until(
        lambda: real_cluster.snapshot_object("podsnapshotmanualtriggers", "ws-lab-trigger"),
        60,
        "the add-on's PodSnapshotManualTrigger",
    )
    assert trigger["spec"] == {"targetPod": pod_name}
    assert trigger["metadata"]["annotations"][STARTED_AT] == started_at
    assert trigger["metadata"]["ownerReferences"][0]["name"] == "lab"
    policy = real_cluster.snapshot_object("podsnapshotpolicies", "ws-lab-policy")
    assert policy is not None and policy["spec"]["triggerConfig"]["postCheckpoint"] == "stop"
    workspace = real_cluster.read_workspace("lab")
    assert workspace["spec"]["paused"] is False
    assert workspace["metadata"]["annotations"][CHECKPOINT_STATE] == "Checkpointing"

    # GKE's part, played: the trigger made a PodSnapshot, now Ready.
    real_cluster.custom.create_namespaced_custom_object(
        "podsnapshot.gke.io", "v1", real_cluster.namespace, "podsnapshots",
        {"apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshot",
         "metadata": {"name": "snap-1",
                      "labels": {"gke-pod-snapshot-triggered-by": "ws-lab-trigger"}},
         "spec": {"policyName": "ws-lab-policy"}},
    )  # fmt: skip
    real_cluster.custom.patch_namespaced_custom_object_status(
        "podsnapshot.gke.io", "v1", real_cluster.namespace, "podsnapshots", "snap-1",
        {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Complete",
                                    "lastTransitionTime": now_rfc3339()}]}},
        _content_type=MERGE,
    )  # fmt: skip
    real_cluster.custom.patch_namespaced_custom_object_status(
        "podsnapshot.gke.io", "v1", real_cluster.namespace, "podsnapshotmanualtriggers",
        "ws-lab-trigger",
        {"status": {"snapshotCreated": {"name": "snap-1"},
                    "conditions": [{"type": "Triggered", "status": "True", "reason": "Complete",
                                    "lastTransitionTime": now_rfc3339()}]}},
        _content_type=MERGE,
    )  # fmt: skip

    workspace = wait_until(
        lambda: (ws := real_cluster.read_workspace("lab"))["spec"]["paused"] and ws,
        60,
        "the add-on to let the pause through once the snapshot is Ready",
    )
    annotations = workspace["metadata"]["annotations"]
    assert annotations[CHECKPOINT_STATE] == "Ready"
    assert annotations[LAST_CHECKPOINT] == "snap-1"
    assert STARTED_AT not in annotations
