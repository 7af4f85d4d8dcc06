"""The parts of a GKE cluster that cannot run here, played on top of the real components.

``upstream_control_plane`` runs the real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler with Kubeflow Notebooks v2's own CRDs (and ``gke_addon`` the real GKE Workspaces
snapshot add-on). ``RealPlayedCluster`` plays the three parts left, each on the real API objects,
so a test runs the whole chain::

    Workspace -> (workspace controller, played) -> StatefulSet + Service + ServiceAccount
      -> (real StatefulSet controller) -> Pod -> (real scheduler) -> bound to a test's node
      -> (kubelet, played) a real ``jupyter server`` process with the pod's environment
      -> (GKE's node agent for Pod Snapshots, played) PodSnapshots, restores, ``PodRestored``

* ``WorkspaceController``: Kubeflow Notebooks v2's workspace controller, transcribed from
  ``workspaces/controller/internal/controller/workspace_controller.go`` at kubeflow/notebooks
  ``8b6105775132f4ea0af2a1dc3833519789651233`` (branch notebooks-v2); its real binary builds
  (``/work/shared/recipes/gke-snapshot-addon``) but kube-apiserver 1.20 rejects every status
  write it makes. Function names are upstream's, in snake case, so the two read side by side.
* the kubelet (``RealPlayedCluster._kubelet_sync`` and its workers), for the pods the real
  scheduler bound to a node this cluster registered: the pod's volumes (a PVC's hostPath
  volume, ConfigMaps, emptyDirs), env (values, the downward API, ConfigMap/Secret keys, the
  kubernetes Service's) and service-account token (TokenRequest, bound to the pod, as a kubelet
  projects it); a real ``jupyter server`` for the Notebooks image, the container's command for
  the kernel image of kernel pods (gateway's ``launch_ipykernel.py``: a real ipykernel), ``sleep``
  for any other; the
  pod's status, its conditions (Ready only when every readiness gate is True) and container
  statuses as a kubelet writes them; a crashed container restarted after a back-off
  (CrashLoopBackOff); graceful deletion (SIGTERM, the grace period, SIGKILL, the final delete
  with grace 0); an image marked unpullable gives ``ErrImagePull``, ``ImagePullBackOff``, the
  kubelet's events, and no process until it can be pulled.
* GKE's node agent for Pod Snapshots (``_agent_sync``, ``_fire``, ``_take_snapshot``,
  ``_gvisor_agent``, ``_agent_restore_for``), as GKE documents it: a
  ``PodSnapshotManualTrigger`` (or a workload's request through gVisor's checkpoint file, a pty
  here) makes a ``PodSnapshot`` named with a UUID, labelled with its trigger and origin pod,
  under the policy that selects the pod; ``postCheckpoint: stop`` stops the pod's processes;
  a new gVisor pod pinning a snapshot (``podsnapshot.gke.io/ps-name``), or else the newest
  Ready one that matches it (its policy selects the pod, same StatefulSet, same containers), is
  restored, ``PodRestored`` naming it; scripted failures: a snapshot that fails, one that no
  longer matches, a silent cold start.

What cannot be real here, and is played instead:

* a "snapshot" holds the pod's very processes, not a copy: they are frozen (SIGSTOP) when the
  pod goes and thawed (SIGCONT) by a restore. So a pod whose processes a snapshot holds is not
  sent SIGTERM when deleted (the copy and the original are one), and every snapshot of one
  process tree restores its state of now, not of when it was taken;
* snapshots are Ready at once (no upload), and GKE's ``stop`` leaves the pod's status as it
  was (only the processes stop); gVisor's ``EINVAL`` for a checkpoint no workload policy
  allows cannot cross a pty: the file answers ``e``;
* the kubelet runs one container per pod (no init containers), takes a container as ready once
  its server answers HTTP (probes are not run), enforces no resources, and gives the server its
  user config directory in the pod's own folder (not ``~/.jupyter`` on the home volume).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import itertools
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import tty
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import urllib3

from ..server_process import free_port, server_config, wait_serving
from .control_plane import AUDIENCE, GPU, ControlPlane, Credentials

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

#: kubeflow/notebooks, the commit the workspace controller is transcribed from (and the CRDs').
UPSTREAM_COMMIT = "8b6105775132f4ea0af2a1dc3833519789651233"
UPSTREAM_FILE = "workspaces/controller/internal/controller/workspace_controller.go"

WORKSPACE_LABEL = "notebooks.kubeflow.org/workspace-name"  # upstream's workspaceNameLabel
SELECTOR_LABEL = "statefulset"  # upstream's workspaceSelectorLabel
CONTAINER = "main"  # upstream's workspacePodTemplateContainerName
WORKSPACE_KIND_FINALIZER = "notebooks.kubeflow.org/workspacekind-protection"
ENABLED = "podsnapshot.gke.kubeflow.org/enabled"  # the GKE Workspaces add-on's switch
ACTIVE_GATE = "podsnapshot.gke.kubeflow.org/active"  # the add-on's readiness gate
PIN_ANNOTATION = "podsnapshot.gke.io/ps-name"
TRIGGERED_BY = "gke-pod-snapshot-triggered-by"
ORIGIN_POD = "podsnapshot.gke.io/origin-pod"
RESTORED = "PodRestored"
GVISOR = "gvisor"
#: Each test's nodes carry this label with a value of their own, and its pods select it: the
#: scheduler and the nodes of other tests are shared by the session.
POOL_LABEL = "jupyter-pause.io/test-pool"
#: The played Notebooks image: any image whose name has this in it runs a jupyter server.
JUPYTER_IMAGE = "jupyterlab-pause"
IMAGE = "jupyterlab-pause:test"
IMAGE_HOME = "/home/jovyan"  # the Kubeflow notebook images' HOME (and working directory)
IMAGE_PORT = 8888
#: The played kernel image of kernel pods (deploy/kernel-pods/): any image whose name has this in
#: it runs its container's command, with the image's files where gateway's kernel images have
#: them (``KERNEL_IMAGE_FILES``) and its ``python`` this interpreter.
KERNEL_IMAGE = "jupyter-pause-kernel"
# deploy/jupyterhub/values.yaml's single-user image: jupyterhub-singleuser with jupyter_pause
SINGLEUSER_IMAGE = "jupyter-pause-singleuser"
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"

_numbers = itertools.count(1)
_pod_addresses = itertools.count(0)  # a single-user pod's own loopback address (pod_ip)


def pod_ip(pod: dict[str, Any]) -> str:
    """The pod's status.podIP: a single-user pod (Hub-spawned, reached by the Hub and its proxy
    at its own IP and port 8888) gets a loopback address of its own, as a pod network would
    give it; the other pods share this machine's (they are reached at their own ports)."""
    if not any(SINGLEUSER_IMAGE in c["image"] for c in pod["spec"]["containers"]):
        return "127.0.0.1"
    while True:  # an address whose port is free (another process's pod may still hold one)
        number = next(_pod_addresses)
        address = f"127.0.{1 + number // 250 % 250}.{2 + number % 250}"
        with socket.socket() as probe:
            try:
                probe.bind((address, IMAGE_PORT))
            except OSError:
                continue
        return address


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_millis() -> int:
    return int(time.time() * 1000)


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry
    return {}


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector against a pod's labels (matchLabels and matchExpressions, ANDed)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    for owner in obj["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            return owner
    return None


# -- a JSON client ----------------------------------------------------------------------------------
class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:600]}")
        self.status = status
        self.body = body


class Api:
    """The API server's REST interface, JSON in and out, over pooled keep-alive connections
    (the players ask many times a second; a TLS handshake each time would load the machine)."""

    def __init__(self, credentials: Credentials) -> None:
        self.base = credentials.url
        self.pool = urllib3.PoolManager(
            maxsize=16, block=False, ca_certs=credentials.ca_file, cert_reqs="CERT_REQUIRED"
        )
        self.token = credentials.token

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        answer = self.pool.request(
            method,
            url,
            body=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
            timeout=urllib3.Timeout(connect=10, read=60),
            retries=False,
        )
        text = answer.data.decode(errors="replace")
        if answer.status >= 300:
            raise ApiError(method, path, answer.status, text)
        return json.loads(text) if text else None

    def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when there is none (404)."""
        try:
            return self.request("GET", path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def list(self, path: str, **query: str) -> list[dict[str, Any]]:
        return self.request("GET", path, query=query or None)["items"]

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("PUT", path, body)

    def merge(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def strategic(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request(
            "PATCH", path, body, content_type="application/strategic-merge-patch+json"
        )

    def delete(self, path: str, body: dict[str, Any] | None = None) -> None:
        """Deleted, or already gone (404), or gone and replaced (409 on a uid precondition)."""
        try:
            self.request("DELETE", path, body)
        except ApiError as err:
            if err.status not in (404, 409):
                raise


def core(namespace: str | None, plural: str, name: str = "", sub: str = "") -> str:
    path = "/api/v1" + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def group(
    group_version: str, namespace: str | None, plural: str, name: str = "", sub: str = ""
) -> str:
    path = f"/apis/{group_version}" + (f"/namespaces/{namespace}" if namespace else "")
    return path + f"/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


KUBEFLOW = "kubeflow.org/v1beta1"
SNAPSHOTS = "podsnapshot.gke.io/v1"
RBAC = "rbac.authorization.k8s.io/v1"
STATE_ANNOTATION = "jupyter-pause.io/state"  # what jupyter_pause records on its Workspace


# -- the Kubeflow Notebooks v2 workspace controller ---------------------------------------------------
STATE_MSG = {
    "ErrorUnknownWorkspaceKind": "Workspace references unknown WorkspaceKind: %s",
    "ErrorInvalidImageConfig": "Workspace has invalid imageConfig: %s",
    "ErrorInvalidPodConfig": "Workspace has invalid podConfig: %s",
    "ErrorGenFailureStatefulSet": "Workspace failed to generate StatefulSet with error: %s",
    "ErrorGenFailureService": "Workspace failed to generate Service with error: %s",
    "ErrorMultipleStatefulSets": "Workspace owns multiple StatefulSets: %s",
    "ErrorMultipleServices": "Workspace owns multiple Services: %s",
    "ErrorMultipleServiceAccounts": "Workspace owns multiple ServiceAccounts: %s",
    "ErrorServiceAccountNotOwned": (
        "Workspace ServiceAccount %s already exists and is not owned by the Workspace"
    ),
    "ErrorStatefulSetWarningEvent": "Workspace StatefulSet has warning event: %s",
    "ErrorPodUnschedulable": "Workspace Pod is unschedulable: %s",
    "ErrorPodSchedulingGate": "Workspace Pod is waiting for scheduling gate: %s",
    "ErrorPodSchedulerError": "Workspace Pod has scheduler error: %s",
    "ErrorPodWarningEvent": "Workspace Pod has warning event: %s",
    "ErrorContainerCrashLoopBackOff": "Workspace Container is not running (CrashLoopBackOff)",
    "ErrorContainerImagePullBackOff": "Workspace Container is not running (ImagePullBackOff)",
    "Paused": "Workspace is paused",
    "Pending": "Workspace is pending",
    "Running": "Workspace is running",
    "Terminating": "Workspace is terminating",
    "Unknown": "Workspace is in an unknown state",
}
GENERATE_NAME_SUFFIX_LENGTH = 6
NAME_HASH_LENGTH = 8
MAX_SERVICE_NAME_LENGTH = 63
MAX_STATEFULSET_NAME_LENGTH = 52
MAX_SERVICE_ACCOUNT_NAME_LENGTH = 253
MAX_ROLEBINDING_NAME_LENGTH = 253
WORKSPACE_CONNECT_PATH = "/workspace/connect/%s/%s/%s/"


def go_quote(text: str) -> str:
    """Go's %q of a plain string (what upstream's error messages quote ids with)."""
    return json.dumps(text)


def zero_status(status: dict[str, Any] | None) -> dict[str, Any]:
    """A Workspace status as upstream's Go struct holds it after decoding: every field that has
    no ``omitempty`` present, with its zero value where the object lacks it (what upstream
    compares before and after, and writes back whole)."""
    status = copy.deepcopy(status or {})
    activity = status.setdefault("activity", {})
    activity.setdefault("lastActivity", 0)
    activity.setdefault("lastUpdate", 0)
    status.setdefault("lastRunningTime", 0)
    status.setdefault("pauseTime", 0)
    status.setdefault("pendingRestart", False)
    options = status.setdefault("podTemplateOptions", {})
    options.setdefault("imageConfig", {})
    options.setdefault("podConfig", {})
    status.setdefault("podTemplatePod", {})  # name, nodeName: see generate_workspace_pod_status
    status.setdefault("state", "")
    status.setdefault("stateMessage", "")
    return status


def generate_name_prefix(workspace_name: str, max_length: int) -> str:
    name_prefix = f"ws-{workspace_name}"
    max_length = max_length - GENERATE_NAME_SUFFIX_LENGTH - 1
    if len(name_prefix) > max_length:
        name_prefix = name_prefix[:max_length]
    if not name_prefix.endswith("-"):
        name_prefix += "-"
    return name_prefix


def hash_name(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:NAME_HASH_LENGTH]


def generate_service_account_name(workspace_name: str) -> str:
    name = f"ws-{workspace_name}"
    if len(name) <= MAX_SERVICE_ACCOUNT_NAME_LENGTH:
        return name
    suffix = hash_name(workspace_name)
    return f"{name[: MAX_SERVICE_ACCOUNT_NAME_LENGTH - len(suffix) - 1]}-{suffix}"


def generate_role_binding_name(workspace_name: str, cluster_role_name: str) -> str:
    suffix = hash_name(workspace_name, cluster_role_name)
    prefix = f"ws-{workspace_name}"[: MAX_ROLEBINDING_NAME_LENGTH - len(suffix) - 1]
    return f"{prefix}-{suffix}"


def get_workspace_connect_path(namespace: str, workspace_name: str, port_id: str) -> str:
    return WORKSPACE_CONNECT_PATH % (namespace, workspace_name, port_id)


def render_go_template(text: str, http_path_prefix: Callable[[str], str]) -> str:
    """upstream's helper.RenderGoTemplate for the one function it offers (``httpPathPrefix``);
    any other template action is refused, as Go's parser would an unknown function."""
    rendered = re.sub(
        r'\{\{-?\s*httpPathPrefix\s+"([^"]*)"\s*-?\}\}', lambda m: http_path_prefix(m[1]), text
    )
    if "{{" in rendered:
        raise ValueError(f"template: unsupported action in {text!r}")
    return rendered


def set_controller_reference(workspace: dict[str, Any], obj: dict[str, Any]) -> None:
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": KUBEFLOW,
            "kind": "Workspace",
            "name": workspace["metadata"]["name"],
            "uid": workspace["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def owned_by(items: list[dict[str, Any]], workspace_name: str) -> list[dict[str, Any]]:
    """upstream's index ``.metadata.controller``: objects whose controller is the Workspace."""
    found = []
    for item in items:
        owner = controller_of(item)
        if (
            owner
            and (owner["apiVersion"], owner["kind"]) == (KUBEFLOW, "Workspace")
            and owner["name"] == workspace_name
        ):
            found.append(item)
    return found


def get_option_config(
    workspace: dict[str, Any], workspace_kind: dict[str, Any], option: str
) -> tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, str]] | None]:
    """upstream's getImageConfig / getPodConfig: the current value, the desired one after
    redirects (or None), and the redirect chain; ValueError as upstream's errors."""
    values = {
        v["id"]: v
        for v in workspace_kind["spec"]["podTemplate"]["options"][option].get("values") or []
    }
    current_key = workspace["spec"]["podTemplate"]["options"][option]
    current = values.get(current_key)
    if current is None:
        raise ValueError(f"{option} with id {go_quote(current_key)} not found")
    desired = current
    chain: list[dict[str, str]] = []
    visited = {current["id"]}
    while (desired.get("redirect") or {}).get("to"):
        target = desired["redirect"]["to"]
        if target in visited:
            raise ValueError(f"{option} with id {go_quote(desired['id'])} has a circular redirect")
        following = values.get(target)
        if following is None:
            raise ValueError(
                f"{option} with id {go_quote(target)} not found, was redirected from "
                f"{go_quote(desired['id'])}"
            )
        chain.append({"source": desired["id"], "target": following["id"]})
        desired = following
        visited.add(desired["id"])
    if current["id"] != desired["id"]:
        return current, desired, chain
    return current, None, None


def generate_stateful_set(
    workspace: dict[str, Any],
    workspace_kind: dict[str, Any],
    image_config_spec: dict[str, Any],
    pod_config_spec: dict[str, Any],
    service_account_name: str,
) -> dict[str, Any]:
    """upstream's generateStatefulSet, field for field (ValueError as its errors)."""
    name = workspace["metadata"]["name"]
    namespace = workspace["metadata"]["namespace"]
    kind_template = workspace_kind["spec"]["podTemplate"]
    template = workspace["spec"]["podTemplate"]
    replicas = 0 if workspace["spec"].get("paused") else 1

    # pod metadata from the Workspace takes precedence over the WorkspaceKind's
    pod_annotations: dict[str, str] = {}
    pod_labels: dict[str, str] = {}
    for metadata in (kind_template.get("podMetadata"), template.get("podMetadata")):
        if metadata:
            pod_annotations.update(metadata.get("annotations") or {})
            pod_labels.update(metadata.get("labels") or {})

    image_pull_policy = image_config_spec.get("imagePullPolicy") or "IfNotPresent"

    container_ports_by_id: dict[str, dict[str, Any]] = {}

    def http_path_prefix(port_id: str) -> str:
        if port_id in container_ports_by_id:
            return get_workspace_connect_path(namespace, name, port_id)
        return ""

    container_ports = []
    seen_ports: set[int] = set()
    for port in image_config_spec.get("ports") or []:
        if port["port"] in seen_ports:
            raise ValueError(f"duplicate port number {port['port']} in imageConfig")
        container_ports.append(
            {"name": f"http-{port['port']}", "containerPort": port["port"], "protocol": "TCP"}
        )
        seen_ports.add(port["port"])
        container_ports_by_id[port["id"]] = port

    container_env = []
    for env in kind_template.get("extraEnv") or []:
        env = copy.deepcopy(env)
        if env.get("value"):
            try:
                env["value"] = render_go_template(env["value"], http_path_prefix)
            except ValueError as err:
                raise ValueError(
                    f"failed to render extraEnv {go_quote(env['name'])}: {err}"
                ) from None
        container_env.append(env)

    probes = kind_template.get("probes") or {}

    volumes: list[dict[str, Any]] = []
    volume_mounts: list[dict[str, Any]] = []
    seen_volume_names: set[str] = set()
    seen_mount_paths: set[str] = set()
    declared = template.get("volumes") or {}
    if declared.get("home"):
        volumes.append(
            {"name": "home-volume", "persistentVolumeClaim": {"claimName": declared["home"]}}
        )
        mount = {"name": "home-volume", "mountPath": kind_template["volumeMounts"]["home"]}
        volume_mounts.append(mount)
        seen_volume_names.add("home-volume")
        seen_mount_paths.add(mount["mountPath"])
    for index, data in enumerate(declared.get("data") or []):
        volume = {
            "name": f"data-volume-{index}",
            "persistentVolumeClaim": {"claimName": data["pvcName"]},
        }
        mount = {"name": volume["name"], "mountPath": data["mountPath"]}
        if data.get("readOnly"):
            volume["persistentVolumeClaim"]["readOnly"] = True
            mount["readOnly"] = True
        if volume["name"] in seen_volume_names or mount["mountPath"] in seen_mount_paths:
            continue  # silently skipped, as upstream does
        seen_volume_names.add(volume["name"])
        seen_mount_paths.add(mount["mountPath"])
        volumes.append(volume)
        volume_mounts.append(mount)
    for index, secret in enumerate(declared.get("secrets") or []):
        volume = {
            "name": f"secret-volume-{index}",
            "secret": {
                "secretName": secret["secretName"],
                "defaultMode": secret.get("defaultMode", 420),
            },
        }
        mount = {"name": volume["name"], "mountPath": secret["mountPath"]}
        if volume["name"] in seen_volume_names or mount["mountPath"] in seen_mount_paths:
            continue
        seen_volume_names.add(volume["name"])
        seen_mount_paths.add(mount["mountPath"])
        volumes.append(volume)
        volume_mounts.append(mount)
    for extra in kind_template.get("extraVolumes") or []:
        if extra["name"] in seen_volume_names:
            continue
        volumes.append(extra)
        seen_volume_names.add(extra["name"])
    for extra in kind_template.get("extraVolumeMounts") or []:
        if extra["mountPath"] in seen_mount_paths or extra["name"] not in seen_volume_names:
            continue
        volume_mounts.append(extra)
        seen_mount_paths.add(extra["mountPath"])

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image_config_spec["image"],
        "imagePullPolicy": image_pull_policy,
        "ports": container_ports,
        "volumeMounts": volume_mounts,
        "env": container_env,
        "resources": pod_config_spec.get("resources") or {},
    }
    for key in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probes.get(key):
            container[key] = probes[key]
    if kind_template.get("containerSecurityContext"):
        container["securityContext"] = kind_template["containerSecurityContext"]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "serviceAccountName": service_account_name,
        "volumes": volumes,
    }
    for key, value in (
        ("affinity", pod_config_spec.get("affinity")),
        ("nodeSelector", pod_config_spec.get("nodeSelector")),
        ("tolerations", pod_config_spec.get("tolerations")),
        ("securityContext", kind_template.get("securityContext")),
    ):
        if value:
            pod_spec[key] = value
    selector = {WORKSPACE_LABEL: name, SELECTOR_LABEL: name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "generateName": generate_name_prefix(name, MAX_STATEFULSET_NAME_LENGTH),
            "namespace": namespace,
            "labels": {WORKSPACE_LABEL: name},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"annotations": pod_annotations, "labels": {**pod_labels, **selector}},
                "spec": pod_spec,
            },
        },
    }


def generate_service(
    workspace: dict[str, Any], image_config_spec: dict[str, Any]
) -> dict[str, Any]:
    name = workspace["metadata"]["name"]
    ports = []
    seen: set[int] = set()
    for port in image_config_spec.get("ports") or []:
        if port["port"] in seen:
            raise ValueError(f"duplicate port number {port['port']} in imageConfig")
        ports.append(
            {"name": f"http-{port['port']}", "targetPort": port["port"], "port": port["port"],
             "protocol": "TCP"}
        )  # fmt: skip
        seen.add(port["port"])
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "generateName": generate_name_prefix(name, MAX_SERVICE_NAME_LENGTH),
            "namespace": workspace["metadata"]["namespace"],
            "labels": {WORKSPACE_LABEL: name},
        },
        "spec": {
            "ports": ports,
            "selector": {WORKSPACE_LABEL: name, SELECTOR_LABEL: name},
            "type": "ClusterIP",
        },
    }


def copy_label_fields(desired: dict[str, str], target: dict[str, str]) -> tuple[dict, bool]:
    """upstream's copyLabelFields / copyAnnotationFields (only the target's keys are compared,
    as upstream does)."""
    desired = desired or {}
    return desired, any(desired.get(k) != v for k, v in (target or {}).items())


def copy_stateful_set_fields(desired: dict[str, Any], target: dict[str, Any]) -> bool:
    require_update = False
    target["metadata"]["labels"], updated = copy_label_fields(
        desired["metadata"].get("labels"), target["metadata"].get("labels")
    )
    require_update |= updated
    target["metadata"]["annotations"], updated = copy_label_fields(
        desired["metadata"].get("annotations"), target["metadata"].get("annotations")
    )
    require_update |= updated
    if desired["spec"]["replicas"] != target["spec"].get("replicas"):
        target["spec"]["replicas"] = desired["spec"]["replicas"]
        require_update = True
    if target["spec"]["selector"] != desired["spec"]["selector"]:
        target["spec"]["selector"] = desired["spec"]["selector"]
        require_update = True
    if target["spec"]["template"] != desired["spec"]["template"]:
        target["spec"]["template"] = desired["spec"]["template"]
        require_update = True
    return require_update


def copy_service_fields(desired: dict[str, Any], target: dict[str, Any]) -> bool:
    require_update = False
    for key in ("labels", "annotations"):
        target["metadata"][key], updated = copy_label_fields(
            desired["metadata"].get(key), target["metadata"].get(key)
        )
        require_update |= updated
    for key in ("ports", "selector", "type"):
        if target["spec"].get(key) != desired["spec"][key]:
            target["spec"][key] = desired["spec"][key]
            require_update = True
    return require_update


class WorkspaceController:
    """Kubeflow Notebooks v2's workspace controller, played: upstream's ``Reconcile`` of
    ``workspaces/controller/internal/controller/workspace_controller.go`` at kubeflow/notebooks
    ``8b6105775132f4ea0af2a1dc3833519789651233``, step for step, for every Workspace of the
    namespaces given, on every pass (upstream is woken by watches; a pass every 0.2 s sees the
    same changes).

    What it does as upstream does: the WorkspaceKind's finalizer; the imageConfig/podConfig and
    their redirects (``status.pendingRestart``, ``status.podTemplateOptions``); the
    ServiceAccount ``ws-<name>``, the StatefulSet (``generateName: ws-<name>-``, ``replicas`` 0
    when ``spec.paused``, the pod template from the kind's image and pod configs, podMetadata of
    kind then Workspace, home/data/secret and extra volumes, extraEnv with ``httpPathPrefix``)
    and the Service, each owned by the Workspace and found by that ownership; the RoleBindings
    of ``podTemplate.serviceAccount.clusterRoles``; the status from the pod ``<sts>-0``
    (``generateWorkspaceState``: Terminating, Unschedulable/SchedulingGated/SchedulerError,
    Running only when the pod is Ready, CrashLoopBackOff/ImagePullBackOff, the newest Warning
    Event of the pod or StatefulSet, Pending, Paused), ``pauseTime`` and ``lastRunningTime`` in
    milliseconds, written whole through the ``status`` subresource (a PUT, with the
    resourceVersion read: a conflict waits for the next pass, as upstream requeues).

    Not played: Istio VirtualServices (upstream's default is off), the activity probe and
    activityRules (``status.activity`` stays zero; a kind with an ``activityProbe`` is never
    paused for inactivity here), the validating webhooks, and the WorkspaceKind controller
    (which would lift the finalizer once no Workspace uses the kind). It acts as the cluster's
    admin, not under upstream's ClusterRole.

    Status writes and kube-apiserver 1.20: the real binary's writes are refused (the recipe's
    README): 1.20.2 takes any "" in a custom object for null, and upstream writes
    ``podTemplatePod.name``/``nodeName`` as "" while there is no pod (or it is not scheduled).
    Here every field upstream writes is written, except those two while empty, which are left
    out (the CRD's ``required`` of them is the one other line deleted from upstream's,
    ``upstream-crds/README.md``).
    """

    def __init__(self, api: Api, namespaces: set[str]) -> None:
        self.api = api
        self.namespaces = namespaces
        # StatefulSet uid -> (the template last sent, the resourceVersion that came back):
        # upstream's Update when the template differs from the API server's (defaulted) copy
        # is stored by nothing when the API server's defaulting makes them equal; the same
        # template is not sent again while the StatefulSet has not changed since.
        self._sent: dict[str, tuple[str, str]] = {}

    def reconcile_all(self) -> None:
        for namespace in sorted(self.namespaces):
            for workspace in self.api.list(group(KUBEFLOW, namespace, "workspaces")):
                self.reconcile(workspace)

    # upstream: Reconcile
    def reconcile(self, workspace: dict[str, Any]) -> None:
        metadata = workspace["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        if metadata.get("deletionTimestamp"):
            return
        current_status = zero_status(workspace.get("status"))
        status = copy.deepcopy(current_status)

        kind_name = workspace["spec"]["kind"]
        workspace_kind = self.api.get(group(KUBEFLOW, None, "workspacekinds", kind_name))
        if workspace_kind is None:
            return self.update_workspace_state(
                workspace, status, "Error", STATE_MSG["ErrorUnknownWorkspaceKind"] % kind_name
            )
        kind_meta = workspace_kind["metadata"]
        if not kind_meta.get("deletionTimestamp") and WORKSPACE_KIND_FINALIZER not in (
            kind_meta.get("finalizers") or []
        ):
            try:
                self.api.merge(
                    group(KUBEFLOW, None, "workspacekinds", kind_name),
                    {"metadata": {"resourceVersion": kind_meta["resourceVersion"],
                                  "finalizers": [*(kind_meta.get("finalizers") or []),
                                                 WORKSPACE_KIND_FINALIZER]}},
                )  # fmt: skip
            except ApiError as err:
                if err.status == 409:
                    return None  # upstream: requeue
                raise

        status["pendingRestart"] = False
        options = status["podTemplateOptions"]
        try:
            current_image, desired_image, image_chain = get_option_config(
                workspace, workspace_kind, "imageConfig"
            )
        except ValueError as err:
            return self.update_workspace_state(
                workspace, status, "Error", STATE_MSG["ErrorInvalidImageConfig"] % err
            )
        self._option_status(
            status, options["imageConfig"], current_image, desired_image, image_chain
        )
        try:
            current_pod, desired_pod, pod_chain = get_option_config(
                workspace, workspace_kind, "podConfig"
            )
        except ValueError as err:
            return self.update_workspace_state(
                workspace, status, "Error", STATE_MSG["ErrorInvalidPodConfig"] % err
            )
        self._option_status(status, options["podConfig"], current_pod, desired_pod, pod_chain)

        # generate ServiceAccount (before the StatefulSet: its pods reference it by name)
        service_account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": generate_service_account_name(name),
                "namespace": namespace,
                "labels": {WORKSPACE_LABEL: name},
            },
        }
        set_controller_reference(workspace, service_account)
        owned = owned_by(self.api.list(core(namespace, "serviceaccounts")), name)
        if len(owned) > 1:
            names = ", ".join(a["metadata"]["name"] for a in owned)
            return self.update_workspace_state(
                workspace, status, "Error", STATE_MSG["ErrorMultipleServiceAccounts"] % names
            )
        if not owned:
            try:
                self.api.create(core(namespace, "serviceaccounts"), service_account)
            except ApiError as err:
                if err.status != 409:
                    raise
                existing = self.api.get(
                    core(namespace, "serviceaccounts", service_account["metadata"]["name"])
                )
                if existing is None:
                    return None  # a stale cache upstream: requeue
                owner = controller_of(existing)
                if not owner or owner.get("uid") != metadata["uid"]:
                    return self.update_workspace_state(
                        workspace, status, "Error",
                        STATE_MSG["ErrorServiceAccountNotOwned"] % existing["metadata"]["name"],
                    )  # fmt: skip
                return None
            service_account_name = service_account["metadata"]["name"]
        else:
            found = owned[0]
            service_account_name = found["metadata"]["name"]
            # upstream's CopyServiceAccountFields merges (keeps what others added)
            labels = found["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in service_account["metadata"]["labels"].items()):
                self.api.merge(
                    core(namespace, "serviceaccounts", service_account_name),
                    {"metadata": {"labels": service_account["metadata"]["labels"]}},
                )

        # generate StatefulSet
        try:
            stateful_set = generate_stateful_set(
                workspace, workspace_kind, current_image["spec"], current_pod["spec"],
                service_account_name,
            )  # fmt: skip
        except ValueError as err:
            return self.update_workspace_state(
                workspace, status, "Error", STATE_MSG["ErrorGenFailureStatefulSet"] % err
            )
        set_controller_reference(workspace, stateful_set)
        apps = group("apps/v1", namespace, "statefulsets")
        owned = owned_by(self.api.list(apps), name)
        if len(owned) > 1:
            names = ", ".join(s["metadata"]["name"] for s in owned)
            return self.update_workspace_state(
                workspace, status, "Error", STATE_MSG["ErrorMultipleStatefulSets"] % names
            )
        if not owned:
            stateful_set = self.api.create(apps, stateful_set)
        else:
            found = owned[0]
            if copy_stateful_set_fields(stateful_set, found):
                uid = found["metadata"]["uid"]
                sent = json.dumps(found["spec"], sort_keys=True)
                if self._sent.get(uid) != (sent, found["metadata"]["resourceVersion"]):
                    try:
                        found = self.api.put(f"{apps}/{found['metadata']['name']}", found)
                    except ApiError as err:
                        if err.status == 409:
                            return None  # upstream: requeue
                        raise
                    self._sent[uid] = (sent, found["metadata"]["resourceVersion"])
            stateful_set = found
        stateful_set_name = stateful_set["metadata"]["name"]

        # generate Service
        try:
            service = generate_service(workspace, current_image["spec"])
        except ValueError as err:
            return self.update_workspace_state(
                workspace, status, "Error", STATE_MSG["ErrorGenFailureService"] % err
            )
        set_controller_reference(workspace, service)
        services = core(namespace, "services")
        owned = owned_by(self.api.list(services), name)
        if len(owned) > 1:
            names = ", ".join(s["metadata"]["name"] for s in owned)
            return self.update_workspace_state(
                workspace, status, "Error", STATE_MSG["ErrorMultipleServices"] % names
            )
        if not owned:
            self.api.create(services, service)
        elif copy_service_fields(service, owned[0]):
            try:
                self.api.put(f"{services}/{owned[0]['metadata']['name']}", owned[0])
            except ApiError as err:
                if err.status == 409:
                    return None
                raise

        if not self.reconcile_role_bindings(workspace, workspace_kind, service_account_name):
            return None

        # fetch Pod: the first StatefulSet pod is always "{statefulSetName}-0"
        pod = self.api.get(core(namespace, "pods", f"{stateful_set_name}-0"))

        status = self.generate_workspace_status(
            workspace, status, pod, stateful_set, service_account_name
        )
        if status != current_status:
            self._write_status(workspace, status)
        return None

    @staticmethod
    def _option_status(
        status: dict[str, Any],
        info: dict[str, Any],
        current: dict[str, Any],
        desired: dict[str, Any] | None,
        chain: list[dict[str, str]] | None,
    ) -> None:
        if desired is not None:
            status["pendingRestart"] = True
            info["desired"] = desired["id"]
            info["redirectChain"] = chain
        else:
            info["desired"] = current["id"]
            info.pop("redirectChain", None)  # nil, omitempty

    def _write_status(self, workspace: dict[str, Any], status: dict[str, Any]) -> bool:
        """upstream's ``r.Status().Update``: the object with its new status, PUT to the status
        subresource with the resourceVersion read; False on a conflict (upstream requeues)."""
        metadata = workspace["metadata"]
        body = {**copy.deepcopy(workspace), "status": status}
        try:
            self.api.put(
                group(KUBEFLOW, metadata["namespace"], "workspaces", metadata["name"], "status"),
                body,
            )
        except ApiError as err:
            if err.status in (404, 409):
                return False
            raise
        return True

    # upstream: updateWorkspaceState
    def update_workspace_state(
        self, workspace: dict[str, Any], status: dict[str, Any], state: str, message: str
    ) -> None:
        if status["state"] != state or status["stateMessage"] != message:
            status["state"], status["stateMessage"] = state, message
            self._write_status(workspace, status)

    # upstream: reconcileRoleBindings
    def reconcile_role_bindings(
        self, workspace: dict[str, Any], workspace_kind: dict[str, Any], service_account_name: str
    ) -> bool:
        """False where upstream requeues (a conflict)."""
        name, namespace = workspace["metadata"]["name"], workspace["metadata"]["namespace"]
        desired: dict[str, dict[str, Any]] = {}
        account = workspace_kind["spec"]["podTemplate"].get("serviceAccount") or {}
        for role in account.get("clusterRoles") or []:
            binding = {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {
                    "name": generate_role_binding_name(name, role["name"]),
                    "namespace": namespace,
                    "labels": {WORKSPACE_LABEL: name},
                },
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role["name"]},
                "subjects": [{"kind": "ServiceAccount", "name": service_account_name,
                              "namespace": namespace}],
            }  # fmt: skip
            set_controller_reference(workspace, binding)
            desired[binding["metadata"]["name"]] = binding
        path = group("rbac.authorization.k8s.io/v1", namespace, "rolebindings")
        for found in owned_by(self.api.list(path), name):
            wanted = desired.get(found["metadata"]["name"])
            if wanted is not None and wanted["roleRef"] == found["roleRef"]:
                del desired[found["metadata"]["name"]]
                labels, changed = copy_label_fields(
                    wanted["metadata"]["labels"], found["metadata"].get("labels")
                )
                if changed or found.get("subjects") != wanted["subjects"]:
                    found["metadata"]["labels"] = labels
                    found["subjects"] = wanted["subjects"]
                    try:
                        self.api.put(f"{path}/{found['metadata']['name']}", found)
                    except ApiError as err:
                        if err.status == 409:
                            return False
                        raise
                continue
            self.api.delete(f"{path}/{found['metadata']['name']}")  # roleRef is immutable
        for binding in desired.values():
            self.api.create(path, binding)
        return True

    # upstream: generateWorkspaceStatus
    def generate_workspace_status(
        self,
        workspace: dict[str, Any],
        status: dict[str, Any],
        pod: dict[str, Any] | None,
        stateful_set: dict[str, Any],
        service_account_name: str,
    ) -> dict[str, Any]:
        status = copy.deepcopy(status)
        paused = bool(workspace["spec"].get("paused"))
        if paused:
            if status["pauseTime"] == 0:
                status["pauseTime"] = now_millis()  # milliseconds, as upstream's UnixMilli()
        elif status["pauseTime"] != 0:
            status["pauseTime"] = 0
        status["podTemplatePod"] = self.generate_workspace_pod_status(pod)
        status["podTemplatePod"]["serviceAccountName"] = service_account_name
        state, message = self.generate_workspace_state(paused, stateful_set, pod)
        previous_state = zero_status(workspace.get("status"))["state"]
        status["state"], status["stateMessage"] = state, message
        self.record_running_transition(status, previous_state, state)
        return status

    @staticmethod
    def record_running_transition(status: dict[str, Any], current: str, new: str) -> None:
        if new != "Running":
            return
        if current != "Running" or status["lastRunningTime"] == 0:
            status["lastRunningTime"] = now_millis()
            status["activity"] = {"lastActivity": 0, "lastUpdate": 0}

    @staticmethod
    def generate_workspace_pod_status(pod: dict[str, Any] | None) -> dict[str, Any]:
        """upstream's, but a ``name`` or ``nodeName`` upstream would write as "" (no pod, or one
        not scheduled yet) is left out: kube-apiserver 1.20.2 takes "" in a custom object for
        null and refuses the whole status (upstream-crds/README.md, where the CRD's
        ``required`` of the two goes for it)."""
        if pod is None:
            return {}
        found: dict[str, Any] = {"name": pod["metadata"]["name"]}
        if pod["spec"].get("nodeName"):
            found["nodeName"] = pod["spec"]["nodeName"]
        for key in ("containers", "initContainers"):
            names = [{"name": c["name"]} for c in pod["spec"].get(key) or []]
            if names:  # omitempty
                found[key] = names
        return found

    def _last_warning_event(self, namespace: str, uid: str) -> dict[str, Any] | None:
        events = self.api.list(core(namespace, "events"), fieldSelector=f"involvedObject.uid={uid}")
        last = None
        for event in events:
            # upstream: LastTimestamp.Before(...); "" is Go's zero time
            if event.get("type") == "Warning" and (
                last is None
                or (last.get("lastTimestamp") or "") < (event.get("lastTimestamp") or "")
            ):
                last = event
        return last

    # upstream: generateWorkspaceState
    def generate_workspace_state(
        self, paused: bool, stateful_set: dict[str, Any], pod: dict[str, Any] | None
    ) -> tuple[str, str]:
        if pod is None:
            if paused:
                return "Paused", STATE_MSG["Paused"]
            warning = self._last_warning_event(
                stateful_set["metadata"]["namespace"], stateful_set["metadata"]["uid"]
            )
            if warning is not None:
                return "Error", STATE_MSG["ErrorStatefulSetWarningEvent"] % warning.get("message")
            return "Unknown", STATE_MSG["Unknown"]
        if pod["metadata"].get("deletionTimestamp"):
            return "Terminating", STATE_MSG["Terminating"]
        phase = (pod.get("status") or {}).get("phase")
        scheduled = condition(pod, "PodScheduled")
        ready = condition(pod, "Ready").get("status") == "True"
        if scheduled.get("status") != "True":
            reason, message = scheduled.get("reason"), scheduled.get("message", "")
            if reason == "Unschedulable":
                return "Error", STATE_MSG["ErrorPodUnschedulable"] % message
            if reason == "SchedulingGated":
                return "Error", STATE_MSG["ErrorPodSchedulingGate"] % message
            if reason == "SchedulerError":
                return "Error", STATE_MSG["ErrorPodSchedulerError"] % message
        if phase == "Running" and ready:
            return "Running", STATE_MSG["Running"]
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        main = next((s for s in statuses if s.get("name") == CONTAINER), {})
        waiting = (main.get("state") or {}).get("waiting")
        if waiting:
            if waiting.get("reason") == "CrashLoopBackOff":
                return "Error", STATE_MSG["ErrorContainerCrashLoopBackOff"]
            if waiting.get("reason") == "ImagePullBackOff":
                return "Error", STATE_MSG["ErrorContainerImagePullBackOff"]
        warning = self._last_warning_event(pod["metadata"]["namespace"], pod["metadata"]["uid"])
        if warning is not None:
            return "Error", STATE_MSG["ErrorPodWarningEvent"] % warning.get("message")
        if phase == "Pending":
            return "Pending", STATE_MSG["Pending"]
        return "Unknown", STATE_MSG["Unknown"]


# -- the kubelet and GKE's node agent --------------------------------------------------------------
@dataclass
class PodProcess:
    """One incarnation of a pod's container: a process tree on this machine."""

    pod_uid: str
    process: subprocess.Popen[bytes]
    port: int
    token: str
    workdir: Path  # ephemeral: runtime dir, service-account files (the pod's own disk)
    log: Path
    frozen: bool = False
    exit_seconds: float | None = None  # SIGTERM to exit, when it was stopped
    stopped: threading.Event = field(default_factory=threading.Event)  # the kubelet is done

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def freeze(self) -> None:
        for proc in self.tree():
            proc.suspend()
        self.frozen = True

    def thaw(self) -> None:
        for proc in self.tree():
            proc.resume()
        self.frozen = False

    def kill(self) -> None:
        for proc in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.process.wait()


@dataclass(eq=False)  # one container is one process tree: compared by identity
class Container(PodProcess):
    """A played container: its process tree, and what the kubelet knows of it. For the
    Notebooks image a real jupyter server (and its kernels); for any other image ``sleep``."""

    namespace: str = ""
    pod_name: str = ""
    image: str = ""
    workspace: str | None = None
    attached: bool = True  # the process of a live pod (False: only a snapshot holds it)
    signals: list[str] = field(default_factory=list)  # what the kubelet sent it, in order
    agent_end: int | None = None  # gVisor's end of the checkpoint file (a pty)
    gvisor_file: str | None = None  # the pod's end: its /proc/gvisor/checkpoint
    answer_on_restore: bytes | None = None  # a workload checkpoint's answer, owed
    pids: list[int] = field(default_factory=list)  # as started (a restore keeps them)

    def stop(self, grace: float) -> None:
        """The kubelet's stop of a container: SIGTERM, SIGKILL after ``grace`` seconds."""
        self.signals.append("SIGTERM")
        kernels = self.tree()[1:]
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
            self.exit_seconds = time.monotonic() - started
        except subprocess.TimeoutExpired:
            self.exit_seconds = None
            self.signals.append("SIGKILL")
        for proc in [*self.tree(), *kernels]:  # the container's end takes every process along
            with contextlib.suppress(Exception):
                proc.kill()
        self.process.wait()
        self.stopped.set()

    def discard(self) -> None:
        """Gone without a stop (a snapshot dropped, the test's end): thawed, then killed."""
        if self.process.poll() is None:
            with contextlib.suppress(Exception):
                self.thaw()
            self.kill()
        self.stopped.set()


@dataclass
class Snapshot:
    """A PodSnapshot GKE's played agent made, and what it holds: the processes of the pod it
    was taken of (None when it failed)."""

    namespace: str
    name: str
    trigger: str
    policy: str
    pod_name: str
    pod_uid: str
    owner_uid: str  # the origin pod's controller (a Workspace's StatefulSet)
    images: tuple[tuple[str, str], ...]  # (container name, image) of the origin pod
    created: float
    holds: Container | None


@dataclass
class PlayedWorkspace:
    """A Workspace of the test: its home folder (the PVC's volume) and its pods' containers."""

    namespace: str
    name: str
    kind: str
    home: Path
    claim: str
    jupyter_token: str = field(default_factory=lambda: os.urandom(12).hex())
    extra_config: str = ""  # more jupyter_server_config.py lines for its pods
    #: Where its pods' ``KUBERNETES_SERVICE_PORT`` points: None, the API server; a closed port
    #: plays a pod whose network cannot reach it (a NetworkPolicy, a broken CNI).
    api_port: int | None = None
    current: Container | None = None  # the container of its running pod
    containers: list[Container] = field(default_factory=list)  # every one, in start order


@dataclass(eq=False)
class KubeletPod:
    """What the played kubelet tracks of one pod (by uid)."""

    namespace: str
    name: str
    uid: str
    node: str
    workspace: str | None = None  # its notebooks.kubeflow.org/workspace-name label
    phase: str = "new"  # new, starting, pulling, running, backoff, ended, stopping, gone
    ip: str = "127.0.0.1"  # status.podIP: a single-user pod has one of its own (pod_ip)
    container: Container | None = None
    restarts: int = 0
    retry_at: float = 0.0  # pulling / backoff: when to try again
    lock: threading.Lock = field(default_factory=threading.Lock)


class RealPlayedCluster:
    """One test's corner of ``upstream_control_plane`` with its missing parts played.

    A namespace, the shipped RBAC of each WorkspaceKind's mode (``deploy/modes/<mode>/``: its
    ClusterRole, which the workspace controller binds, and per Workspace the stamped
    ``rbac-workspace.yaml``), nodes of a pool of its own (the scheduler and the other tests'
    nodes are shared by the session: every pod here selects the pool), WorkspaceKinds and
    Workspaces under Kubeflow's own CRDs; ``start`` runs the workspace
    controller, the kubelet and GKE's node agent, each in a thread of its own that passes over
    the API objects every 0.2 s. A player's exception stops that player and is raised by the
    next ``wait`` (and by ``close``), so a test fails instead of hanging; ``close`` leaves no
    process behind.
    """

    INTERVAL = 0.2

    def __init__(self, plane: ControlPlane, workdir: Path) -> None:
        number = next(_numbers)
        self.plane = plane
        self.workdir = workdir
        self.namespace = f"chain-{number}"
        self.pool = f"chain-pool-{number}"
        self.api = Api(plane.admin)
        self.namespaces = {self.namespace}  # whose Workspaces the controller reconciles
        self.other_namespaces: set[str] = set()  # other teams'
        self.nodes: list[str] = []
        self.workspaces: dict[tuple[str, str], PlayedWorkspace] = {}
        self.pods: dict[str, KubeletPod] = {}  # uid -> what the kubelet knows
        self.snapshots: dict[tuple[str, str], Snapshot] = {}
        self.unpullable: set[str] = set()
        self.commands: list[Container] = []  # every kernel image container, in start order
        self.kind_modes: dict[str, str | None] = {}  # WorkspaceKind -> its RBAC's mode
        self.cluster_roles: list[str] = []  # ClusterRoles this test made (edit_role)
        self.fail_triggers: list[str] = []  # the node agent fails the next ones, with these
        # Every trigger the node agent fired, in order: (trigger, its PodSnapshot, why that
        # snapshot failed or None when it is Ready); GKE's own record is gone once the trigger
        # is deleted, as ours are once spent.
        self.fired: list[tuple[str, str, str | None]] = []
        # How the node agent restores a pod that a snapshot matches: "live" (GKE's way),
        # "mismatch" (the snapshot no longer matches: a cold start, PodRestored=False) or
        # "silent" (a cold start without any condition).
        self.restore_mode = "live"
        self.errors: list[str] = []
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []
        self._blockers = itertools.count(1)
        self.controller = WorkspaceController(self.api, self.namespaces)

    # -- setup ------------------------------------------------------------------------------------
    def create_namespace(self) -> None:
        """The test's namespace (a Kubeflow profile's); RBAC comes per WorkspaceKind's mode."""
        self.api.create(core(None, "namespaces"), {"metadata": {"name": self.namespace}})

    def _create_once(self, path: Path, **values: str) -> list[dict[str, Any]]:
        """The objects of a shipped manifest (``${NAME}`` filled as ``envsubst`` does), each
        created unless it exists (a cluster-scoped one, made by an earlier test)."""
        import yaml

        text = path.read_text()
        for key, value in values.items():
            text = text.replace("${" + key + "}", value)
        documents = [d for d in yaml.safe_load_all(text) if d]
        for document in documents:
            version = document["apiVersion"]
            plural = document["kind"].lower() + "s"
            namespace = document["metadata"].get("namespace")
            base = f"/apis/{version}" if "/" in version else f"/api/{version}"
            base += f"/namespaces/{namespace}" if namespace else ""
            try:
                self.api.create(f"{base}/{plural}", document)
            except ApiError as err:
                if err.status != 409:
                    raise
        return documents

    def mode_rbac(self, mode: str) -> list[str]:
        """The mode's ClusterRole(s) (``deploy/modes/<mode>/clusterrole.yaml``), made once; their
        names, for a WorkspaceKind's ``podTemplate.serviceAccount.clusterRoles``: the workspace
        controller binds them to each Workspace's account, as upstream does."""
        documents = self._create_once(DEPLOY / "modes" / mode / "clusterrole.yaml")
        return [d["metadata"]["name"] for d in documents if d["kind"] == "ClusterRole"]

    def node(self, role: str = "gpu", gpus: int = 1, sandbox: bool = False, **kwargs: str) -> str:
        """A node of this test's pool with ``gpus`` GPUs (``sandbox``: a GKE Sandbox node,
        gVisor's label and taint), registered as a kubelet does; this cluster's kubelet plays
        the pods bound to it."""
        name = f"{self.pool}-{role}"
        self.plane.register_node(
            name, gpus, sandbox=sandbox, labels={POOL_LABEL: self.pool}, **kwargs
        )
        self.nodes.append(name)
        return name

    def workspace_kind(
        self,
        *,
        gpus: int = 1,
        image: str = IMAGE,
        images: dict[str, str] | None = None,
        enabled: bool = False,
        pod_metadata: dict[str, Any] | None = None,
        mode: str | None = "no-snapshots",
    ) -> str:
        """A WorkspaceKind valid under the upstream CRD: the Notebooks image (``images``: more
        imageConfig ids -> images), a podConfig ``gpu-<n>`` asking for ``gpus`` GPUs on this
        test's pool, the home volume at ``/home/jovyan``, ``POD_NAME``/``POD_NAMESPACE`` from the
        downward API, and ``mode``'s ClusterRole for its Workspaces' accounts (as the shipped
        ``deploy/modes/<mode>/workspacekind.yaml``); ``enabled``: annotated for the GKE
        Workspaces add-on. Returns its name."""
        name = f"jupyterlab-{self.pool}-{next(_numbers)}"
        cluster_roles = self.mode_rbac(mode) if mode else []
        values = [
            {"id": option, "spawner": {"displayName": option},
             "spec": {"image": picture, "ports": [{"id": "jupyterlab", "port": IMAGE_PORT}]}}
            for option, picture in {"pause": image, **(images or {})}.items()
        ]  # fmt: skip
        pod_config = {"id": f"gpu-{gpus}", "spawner": {"displayName": f"{gpus} GPU"},
                      "spec": {"resources": {"limits": {GPU: str(gpus)}} if gpus else {},
                               "nodeSelector": {POOL_LABEL: self.pool}}}  # fmt: skip
        template: dict[str, Any] = {
            "podMetadata": pod_metadata or {"labels": {}, "annotations": {}},
            "volumeMounts": {"home": IMAGE_HOME},
            "ports": [{"id": "jupyterlab", "defaultDisplayName": "JupyterLab", "protocol": "HTTP"}],
            "extraEnv": [
                {"name": "NB_PREFIX", "value": '{{ httpPathPrefix "jupyterlab" }}'},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {
                    "name": "POD_NAMESPACE",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                },
            ],
            "options": {
                "imageConfig": {"spawner": {"default": "pause"}, "values": values},
                "podConfig": {"spawner": {"default": pod_config["id"]}, "values": [pod_config]},
            },
        }
        if cluster_roles:
            template["serviceAccount"] = {"clusterRoles": [{"name": r} for r in cluster_roles]}
        self.kind_modes[name] = mode
        self.api.create(
            group(KUBEFLOW, None, "workspacekinds"),
            {"apiVersion": KUBEFLOW, "kind": "WorkspaceKind",
             "metadata": {"name": name, "annotations": {ENABLED: "true"} if enabled else {}},
             "spec": {"spawner": {"displayName": "JupyterLab", "description": "jupyter_pause",
                                  "icon": {"url": "https://jupyter.org/favicon.ico"},
                                  "logo": {"url": "https://jupyter.org/logo.svg"}},
                      "podTemplate": template}},
        )  # fmt: skip
        return name

    def shipped_workspace_kind(self, mode: str) -> str:
        """``deploy/modes/<mode>/workspacekind.yaml`` as shipped (its ClusterRole made), renamed
        for this test and its podConfigs confined to this test's pool (the only changes).
        Returns its name."""
        import yaml

        self.mode_rbac(mode)
        path = DEPLOY / "modes" / mode / "workspacekind.yaml"
        document = yaml.safe_load(path.read_text())
        name = f"{document['metadata']['name']}-{self.pool}-{next(_numbers)}"
        self.kind_modes[name] = mode
        document["metadata"]["name"] = name
        for value in document["spec"]["podTemplate"]["options"]["podConfig"]["values"]:
            spec = value.setdefault("spec", {})
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), POOL_LABEL: self.pool}
        self.api.create(group(KUBEFLOW, None, "workspacekinds"), document)
        return name

    def workspace(
        self,
        name: str,
        kind: str,
        home: Path,
        *,
        enabled: bool = False,
        paused: bool = False,
        image_config: str | None = None,
        pod_config: str | None = None,
        pod_metadata: dict[str, Any] | None = None,
        extra_config: str = "",
        api_port: int | None = None,
    ) -> PlayedWorkspace:
        """A Workspace of ``kind`` whose home volume (a PVC bound to a volume at ``home``) is
        made first, as upstream requires, and the admin's RBAC for it (its kind's mode's
        ``rbac-workspace.yaml``, stamped); ``enabled``: annotated for the GKE Workspaces add-on;
        ``extra_config`` and ``api_port``: as ``PlayedWorkspace``'s, for every pod of it."""
        home.mkdir(parents=True, exist_ok=True)
        mode = self.kind_modes.get(kind)
        if mode:
            self._create_once(
                DEPLOY / "modes" / mode / "rbac-workspace.yaml",
                NAMESPACE=self.namespace,
                WORKSPACE=name,
            )
        claim = f"{name}-home"
        self.plane.provide_claim(self.namespace, claim, host_path=home)
        found = self.api.get(group(KUBEFLOW, None, "workspacekinds", kind))
        assert found is not None, f"no WorkspaceKind {kind}"
        options = found["spec"]["podTemplate"]["options"]  # the spawner's defaults otherwise
        image_config = image_config or options["imageConfig"]["spawner"]["default"]
        pod_config = pod_config or options["podConfig"]["spawner"]["default"]
        played = PlayedWorkspace(self.namespace, name, kind, home, claim,
                                 extra_config=extra_config, api_port=api_port)  # fmt: skip
        with self.lock:
            self.workspaces[(self.namespace, name)] = played
        self.api.create(
            group(KUBEFLOW, self.namespace, "workspaces"),
            {"apiVersion": KUBEFLOW, "kind": "Workspace",
             "metadata": {"name": name, "annotations": {ENABLED: "true"} if enabled else {}},
             "spec": {"paused": paused, "kind": kind,
                      "podTemplate": {"podMetadata": pod_metadata or {"labels": {}, "annotations": {}},
                                      "volumes": {"home": claim},
                                      "options": {"imageConfig": image_config,
                                                  "podConfig": pod_config}}}},
        )  # fmt: skip
        return played

    def create_policy(
        self,
        name: str = "jupyter-pause",
        selector: dict[str, Any] | None = None,
        trigger: str = "manual",
        post_checkpoint: str = "resume",
    ) -> None:
        """A PodSnapshotPolicy of the namespace (GKE Pod Snapshots without the add-on)."""
        self.api.create(
            group(SNAPSHOTS, self.namespace, "podsnapshotpolicies"),
            {"apiVersion": SNAPSHOTS, "kind": "PodSnapshotPolicy", "metadata": {"name": name},
             "spec": {"storageConfigName": "jupyter-pause-snapshots",
                      "selector": selector or {"matchExpressions": [{"key": WORKSPACE_LABEL,
                                                                     "operator": "Exists"}]},
                      "triggerConfig": {"type": trigger, "postCheckpoint": post_checkpoint}}},
        )  # fmt: skip

    def start(self) -> None:
        for name, step in (
            ("workspace-controller", self.controller.reconcile_all),
            ("kubelet", self._kubelet_sync),
            ("node-agent", self._agent_sync),
        ):
            thread = threading.Thread(target=self._loop, args=(name, step), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        for worker in list(self._workers):
            worker.join(timeout=90)
        with self.lock:
            containers = {id(p.container): p.container for p in self.pods.values() if p.container}
            for snapshot in self.snapshots.values():
                if snapshot.holds is not None:
                    containers[id(snapshot.holds)] = snapshot.holds
            for played in self.workspaces.values():
                for container in played.containers:
                    containers[id(container)] = container
            for container in self.commands:
                containers[id(container)] = container
        for container in containers.values():
            container.discard()
            shutil.rmtree(container.workdir, ignore_errors=True)
        for name in self.nodes:  # the pod garbage collector then removes their pods
            with contextlib.suppress(Exception):
                self.plane.remove_node(name)
        for namespace in [self.namespace, *self.other_namespaces]:
            with contextlib.suppress(Exception):
                self.api.delete(core(None, "namespaces", namespace))
        for role in self.cluster_roles:  # an admin's edited copies (edit_role)
            with contextlib.suppress(Exception):
                self.api.delete(group(RBAC, None, "clusterroles", role))
        self.api.pool.clear()
        assert not self.errors, "a player failed:\n" + "\n".join(self.errors)

    # -- the loops --------------------------------------------------------------------------------
    def _loop(self, name: str, step: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                step()
            except Exception:  # a player's bug must fail the test, not hang it
                if not self._stop.is_set():
                    self.errors.append(f"{name}:\n{traceback.format_exc()}")
                return
            self._stop.wait(self.INTERVAL)

    def _work(self, name: str, target: Callable[..., None], *args: Any) -> None:
        """A kubelet's or agent's longer task (a start, a stop), beside the loops."""

        def run() -> None:
            try:
                target(*args)
            except Exception:
                if not self._stop.is_set():
                    self.errors.append(f"{name}:\n{traceback.format_exc()}")

        worker = threading.Thread(target=run, name=name, daemon=True)
        self._workers = [w for w in self._workers if w.is_alive()]
        self._workers.append(worker)
        worker.start()

    def check(self) -> None:
        """AssertionError with a player's traceback, once one has failed."""
        if self.errors:
            raise AssertionError("a player failed:\n" + "\n".join(self.errors))

    def wait(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        """``check()``'s first truthy value; AssertionError after ``timeout`` s or as soon as a
        player fails."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.1)

    # -- kubelet ----------------------------------------------------------------------------------
    def _kubelet_sync(self) -> None:
        """One pass of the kubelet of every node of this cluster over the pods bound there."""
        seen: set[str] = set()
        for node in list(self.nodes):
            for pod in self.api.list(core(None, "pods"), fieldSelector=f"spec.nodeName={node}"):
                uid = pod["metadata"]["uid"]
                seen.add(uid)
                with self.lock:
                    known = self.pods.get(uid)
                    if known is None:
                        known = self.pods[uid] = KubeletPod(
                            pod["metadata"]["namespace"], pod["metadata"]["name"], uid, node,
                            (pod["metadata"].get("labels") or {}).get(WORKSPACE_LABEL),
                            ip=pod_ip(pod),
                        )  # fmt: skip
                if pod["metadata"].get("deletionTimestamp"):
                    if known.phase not in ("stopping", "gone"):
                        known.phase = "stopping"
                        self._work(f"kubelet-stop-{known.name}", self._stop_pod, known, pod)
                elif known.phase == "new" or (
                    known.phase in ("pulling", "backoff") and time.monotonic() >= known.retry_at
                ):
                    known.phase = "starting"
                    self._work(f"kubelet-start-{known.name}", self._start_pod, known, pod)
                elif known.phase == "running":
                    self._sync_running(known, pod)
        with self.lock:
            vanished = [p for uid, p in self.pods.items() if uid not in seen and p.phase != "gone"]
        for known in vanished:  # deleted without the kubelet (forced, or its node removed)
            if known.phase in ("starting", "stopping"):
                continue  # its worker finishes first
            known.phase = "gone"
            self._detach(known, stop_grace=0)

    def _pod_status(self, known: KubeletPod, pod: dict[str, Any], status: dict[str, Any]) -> bool:
        """A strategic merge of the pod's status (conditions merged by type: the scheduler's and
        the add-on's stay), only onto the pod read (uid and resourceVersion): False when the
        pod changed meanwhile or is gone."""
        body = {"metadata": {"uid": known.uid, "resourceVersion": pod["metadata"]["resourceVersion"]},
                "status": status}  # fmt: skip
        try:
            self.api.strategic(core(known.namespace, "pods", known.name, "status"), body)
        except ApiError as err:
            if err.status in (404, 409):
                return False
            raise
        return True

    def _write_pod_status(self, known: KubeletPod, make: Callable[[dict], dict]) -> None:
        """``make(pod)``'s status written onto the freshest pod, again on a conflict."""
        for _attempt in range(20):
            pod = self.api.get(core(known.namespace, "pods", known.name))
            if pod is None or pod["metadata"]["uid"] != known.uid:
                return
            if self._pod_status(known, pod, make(pod)):
                return
            time.sleep(0.05)
        raise AssertionError(f"pod {known.name}: its status could not be written")

    def _event(
        self, known: KubeletPod, kind: str, reason: str, message: str, component: str = "kubelet"
    ) -> None:
        now = now_rfc3339()
        self.api.create(
            core(known.namespace, "events"),
            {"metadata": {"generateName": f"{known.name}."},
             "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": known.namespace,
                                "name": known.name, "uid": known.uid,
                                "fieldPath": f"spec.containers{{{CONTAINER}}}"},
             "reason": reason, "message": message, "type": kind,
             "source": {"component": component, "host": known.node},
             "firstTimestamp": now, "lastTimestamp": now, "count": 1},
        )  # fmt: skip

    @staticmethod
    def _kubelet_conditions(pod: dict[str, Any], containers_ready: bool) -> list[dict[str, Any]]:
        """Initialized, ContainersReady and Ready as a kubelet computes them: Ready needs the
        containers ready and every readiness gate's condition True (the add-on's gate is
        written by the add-on)."""
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
        gates_true = all(condition(pod, g).get("status") == "True" for g in gates)
        ready = containers_ready and gates_true
        now = now_rfc3339()

        def entry(kind: str, value: bool, reason: str) -> dict[str, Any]:
            old = condition(pod, kind)
            status = "True" if value else "False"
            found = {"type": kind, "status": status,
                     "lastTransitionTime": old.get("lastTransitionTime")
                     if old.get("status") == status else now}  # fmt: skip
            if not value:
                found["reason"] = reason
            return found

        return [
            entry("Initialized", True, ""),
            entry("ContainersReady", containers_ready, "ContainersNotReady"),
            entry(
                "Ready",
                ready,
                "ContainersNotReady" if not containers_ready else "ReadinessGatesNotReady",
            ),
        ]

    def _container_status(self, pod: dict[str, Any], known: KubeletPod, state: dict[str, Any],
                          ready: bool) -> list[dict[str, Any]]:  # fmt: skip
        spec = pod["spec"]["containers"][0]
        return [{"name": spec["name"], "image": spec["image"], "imageID": "",
                 "ready": ready, "started": ready, "restartCount": known.restarts,
                 "state": state}]  # fmt: skip

    def _start_pod(self, known: KubeletPod, pod: dict[str, Any]) -> None:
        with known.lock:
            self._start_pod_locked(known, pod)

    def _start_pod_locked(self, known: KubeletPod, pod: dict[str, Any]) -> None:
        if self._stop.is_set():
            return
        containers = pod["spec"]["containers"]
        if len(containers) != 1 or pod["spec"].get("initContainers"):
            raise AssertionError(f"pod {known.name}: the played kubelet runs one container only")
        image = containers[0]["image"]
        started_at = (pod.get("status") or {}).get("startTime") or now_rfc3339()
        base = {"hostIP": "127.0.0.1", "podIP": known.ip, "startTime": started_at}

        def waiting(reason: str, message: str = "") -> Callable[[dict], dict]:
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
            return lambda fresh: {
                **base, "phase": "Pending",
                "conditions": self._kubelet_conditions(fresh, False),
                "containerStatuses": self._container_status(fresh, known, state, False),
            }  # fmt: skip

        if image in self.unpullable:
            if not known.retry_at:  # the first pull: its events (a kubelet counts the others)
                self._event(known, "Normal", "Pulling", f'Pulling image "{image}"')
                self._event(known, "Warning", "Failed",
                            f'Failed to pull image "{image}": rpc error: code = NotFound desc = '
                            f'failed to pull and unpack image "{image}": not found')  # fmt: skip
                self._event(known, "Warning", "Failed", "Error: ErrImagePull")
                self._write_pod_status(known, waiting("ErrImagePull", f'failed to pull "{image}"'))
                self._event(known, "Normal", "BackOff", f'Back-off pulling image "{image}"')
                self._event(known, "Warning", "Failed", "Error: ImagePullBackOff")
            self._write_pod_status(
                known, waiting("ImagePullBackOff", f'Back-off pulling image "{image}"')
            )
            known.retry_at = time.monotonic() + 2.0  # the kubelet tries the pull again
            known.phase = "pulling"
            return
        self._write_pod_status(known, waiting("ContainerCreating"))

        restored: Container | None = None
        restore_condition: dict[str, Any] | None = None
        if pod["spec"].get("runtimeClassName") == GVISOR and known.restarts == 0:
            restored, restore_condition = self._agent_restore_for(pod)
        if restored is not None:
            container = restored
            self._attach_restored(known, pod, container)
        else:
            container = self._run_container(known, pod)
        with self.lock:
            known.container = container
            played = self._workspace_of(pod)
            if played is not None:
                played.current = container
                if container not in played.containers:
                    played.containers.append(container)
        conditions = [restore_condition] if restore_condition else []
        now = now_rfc3339()
        state = {"running": {"startedAt": now}}

        def running(fresh: dict[str, Any]) -> dict[str, Any]:
            return {**base, "phase": "Running",
                    "conditions": [*self._kubelet_conditions(fresh, True), *conditions],
                    "containerStatuses": self._container_status(fresh, known, state, True)}  # fmt: skip

        self._write_pod_status(known, running)
        if known.phase == "starting":
            known.phase = "running"

    def _sync_running(self, known: KubeletPod, pod: dict[str, Any]) -> None:
        """A kubelet's periodic sync of a running pod: Ready follows the readiness gates; a
        container whose process ended is restarted after a back-off (CrashLoopBackOff), as its
        ``restartPolicy`` says: with ``Never`` (a kernel pod's) the pod ends, Failed or
        Succeeded by its exit code, and is never started again."""
        container = known.container
        if container is None or known.lock.locked():
            return
        code = container.process.poll()
        if code is not None:  # ended by itself: it was not stopped
            with self.lock:
                played = self._workspace_of(pod)
                if played is not None and played.current is container:
                    played.current = None
            known.container = None
            policy = pod["spec"].get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                known.phase = "ended"  # the sync leaves it be until it is deleted
                phase = "Succeeded" if not code else "Failed"
                state = {"terminated": {"exitCode": code, "finishedAt": now_rfc3339(),
                                        "reason": "Completed" if not code else "Error"}}  # fmt: skip
            else:
                known.restarts += 1
                known.phase = "backoff"
                known.retry_at = time.monotonic() + min(300.0, 10.0 * 2 ** (known.restarts - 1))
                self._event(known, "Warning", "BackOff", "Back-off restarting failed container")
                phase = "Running"
                state = {"waiting": {"reason": "CrashLoopBackOff",
                                     "message": f"back-off restarting failed container (exit {code})"}}  # fmt: skip
            self._write_pod_status(known, lambda fresh: {
                "phase": phase, "conditions": self._kubelet_conditions(fresh, False),
                "containerStatuses": self._container_status(fresh, known, state, False)})  # fmt: skip
            return
        wanted = self._kubelet_conditions(pod, True)
        if any(condition(pod, c["type"]).get("status") != c["status"] for c in wanted):
            self._pod_status(known, pod, {"conditions": wanted})  # a conflict: the next pass

    def _stop_pod(self, known: KubeletPod, pod: dict[str, Any]) -> None:
        """A graceful deletion: the container stopped (SIGTERM, the pod's grace period,
        SIGKILL), then the pod deleted with grace 0, which is what removes it."""
        with known.lock:  # a start under way finishes first
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            code = self._detach(known, stop_grace=float(grace))
            state = {"terminated": {"exitCode": code if code is not None else 0,
                                    "reason": "Completed" if not code else "Error",
                                    "finishedAt": now_rfc3339()}}  # fmt: skip
            self._write_pod_status(known, lambda fresh: {
                "conditions": self._kubelet_conditions(fresh, False),
                "containerStatuses": self._container_status(fresh, known, state, False)})  # fmt: skip
            self.api.delete(
                core(known.namespace, "pods", known.name),
                {"gracePeriodSeconds": 0, "preconditions": {"uid": known.uid}},
            )
            known.phase = "gone"

    def _detach(self, known: KubeletPod, stop_grace: float) -> int | None:
        """The pod's container leaves it: kept frozen where a snapshot holds its processes
        (played GKE: the snapshot is a copy that outlives the pod), else stopped. Its exit
        code, None when kept."""
        container = known.container
        known.container = None
        if container is None:
            return None
        # Only a snapshot that still exists holds them: one deleted a moment ago (by a pause
        # that took none) must not keep the pod's processes from their SIGTERM.
        self._forget_deleted_snapshots()
        with self.lock:
            for played in self.workspaces.values():
                if played.current is container:
                    played.current = None
            container.attached = False
            held = any(s.holds is container for s in self.snapshots.values())
            if held and container.process.poll() is None:
                if not container.frozen:
                    container.freeze()
                container.signals.append("kept-frozen")
                return None
        if stop_grace <= 0 or container.frozen:  # a sandbox GKE stopped has nothing to end
            container.signals.append("SIGKILL")
            container.discard()
        else:
            container.stop(stop_grace)
        return container.process.returncode

    def _workspace_of(self, pod: dict[str, Any]) -> PlayedWorkspace | None:
        labels = pod["metadata"].get("labels") or {}
        return self.workspaces.get((pod["metadata"]["namespace"], labels.get(WORKSPACE_LABEL, "")))

    def service_account_token(self, pod: dict[str, Any]) -> str:
        """A token of the pod's service account bound to the pod (TokenRequest), as a kubelet
        projects it: it stops being valid once that pod is gone."""
        answer = self.api.create(
            core(pod["metadata"]["namespace"], "serviceaccounts",
                 pod["spec"].get("serviceAccountName") or "default", "token"),
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"audiences": [AUDIENCE], "expirationSeconds": 3600,
                      "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                         "name": pod["metadata"]["name"],
                                         "uid": pod["metadata"]["uid"]}}},
        )  # fmt: skip
        return answer["status"]["token"]

    def _env(self, pod: dict[str, Any], spec: dict[str, Any]) -> dict[str, str]:
        """The container's env as a kubelet resolves it (values, the downward API, ConfigMap
        and Secret keys) and the service env it adds."""
        env: dict[str, str] = {}
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": pod["metadata"]["namespace"],
            "metadata.uid": pod["metadata"]["uid"],
            "spec.nodeName": pod["spec"].get("nodeName", ""),
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.podIP": self.pods[pod["metadata"]["uid"]].ip,
            "status.hostIP": "127.0.0.1",
        }
        namespace = pod["metadata"]["namespace"]
        for entry in spec.get("env") or []:
            source = entry.get("valueFrom")
            if source is None:
                env[entry["name"]] = entry.get("value", "")
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
                if match:
                    env[entry["name"]] = (pod["metadata"].get(match[1]) or {}).get(match[2], "")
                else:
                    env[entry["name"]] = fields[path]
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                found = self.api.get(core(namespace, "configmaps", ref["name"])) or {}
                env[entry["name"]] = (found.get("data") or {}).get(ref["key"], "")
            elif "secretKeyRef" in source:
                import base64

                ref = source["secretKeyRef"]
                found = self.api.get(core(namespace, "secrets", ref["name"])) or {}
                raw = (found.get("data") or {}).get(ref["key"], "")
                env[entry["name"]] = base64.b64decode(raw).decode() if raw else ""
            else:
                raise AssertionError(f"the played kubelet cannot resolve env {entry}")
        played = self._workspace_of(pod)
        env.update(
            KUBERNETES_SERVICE_HOST="127.0.0.1",  # the kubernetes Service, routed to the API
            KUBERNETES_SERVICE_PORT=str((played and played.api_port) or self.plane.port),
            HOSTNAME=pod["metadata"]["name"],
        )
        return env

    def _mounts(self, pod: dict[str, Any], spec: dict[str, Any], workdir: Path) -> dict[str, Path]:
        """mountPath -> local path of each volume mount (a PVC's hostPath volume, a ConfigMap's
        files, an emptyDir): what a kubelet would mount there."""
        namespace = pod["metadata"]["namespace"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts: dict[str, Path] = {}
        for mount in spec.get("volumeMounts") or []:
            volume = volumes.get(mount["name"]) or {}
            local = workdir / "volumes" / mount["name"]
            if "persistentVolumeClaim" in volume:
                claim = self.api.get(
                    core(namespace, "persistentvolumeclaims",
                         volume["persistentVolumeClaim"]["claimName"])
                )  # fmt: skip
                assert claim is not None and claim["spec"].get("volumeName"), f"claim {volume}"
                bound = self.api.get(core(None, "persistentvolumes", claim["spec"]["volumeName"]))
                assert bound is not None and "hostPath" in bound["spec"], f"volume of {claim}"
                local = Path(bound["spec"]["hostPath"]["path"])
                local.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume:
                found = self.api.get(core(namespace, "configmaps", volume["configMap"]["name"]))
                local.mkdir(parents=True, exist_ok=True)
                for key, text in ((found or {}).get("data") or {}).items():
                    (local / key).write_text(text)
            elif "emptyDir" in volume:
                local.mkdir(parents=True, exist_ok=True)
            elif "secret" in volume and not mount["mountPath"].startswith(SERVICE_ACCOUNT_MOUNT):
                import base64

                found = self.api.get(core(namespace, "secrets", volume["secret"]["secretName"]))
                if found is None:
                    continue
                data = {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}
                items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
                local.mkdir(parents=True, exist_ok=True)
                for item in items:
                    (local / item["path"]).write_bytes(data[item["key"]])
            else:
                continue  # secrets, projected tokens...: the service account's is done apart
            if mount.get("subPath"):
                local = local / mount["subPath"]
            mounts[mount["mountPath"]] = local
        return mounts

    @staticmethod
    def image_files() -> dict[str, Path]:
        """What the Notebooks image adds under /etc/jupyter: ``deploy/Dockerfile``'s COPY lines
        (destination -> this repository's file), read as shipped."""
        files: dict[str, Path] = {}
        for line in (DEPLOY / "Dockerfile").read_text().splitlines():
            words = [w for w in line.split() if not w.startswith("--")]
            if len(words) == 3 and words[0] == "COPY" and words[2].startswith("/etc/jupyter"):
                source, destination = ROOT / words[1], words[2]
                if destination.endswith("/"):
                    destination += source.name
                files[destination] = source
        return files

    def _run_container(self, known: KubeletPod, pod: dict[str, Any]) -> Container:
        """A new process for the pod's container: the Notebooks image's jupyter server, or a
        ``sleep`` for any other image."""
        spec = pod["spec"]["containers"][0]
        workdir = Path(tempfile.mkdtemp(prefix="jp-pod-", dir="/tmp"))  # short: socket paths
        root = workdir / "root"  # the container's own file system, where nothing is mounted
        env_pod = self._env(pod, spec)
        mounts = self._mounts(pod, spec, workdir)
        log = workdir / "container.log"
        base_env = {
            k: v for k, v in os.environ.items()
            if not k.startswith(("JUPYTER", "KUBERNETES", "POD_"))
        }  # fmt: skip
        if KERNEL_IMAGE in spec["image"]:
            return self._run_command(known, spec, workdir, log, {**base_env, **env_pod})
        if SINGLEUSER_IMAGE in spec["image"]:
            return self._run_singleuser(
                known, pod["spec"], workdir, log, mounts, {**base_env, **env_pod}
            )
        if JUPYTER_IMAGE not in spec["image"]:
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    ["sleep", "infinity"], stdout=out, stderr=subprocess.STDOUT,
                    env={**base_env, **env_pod}, cwd=workdir,
                )  # fmt: skip
            return Container(known.uid, process, 0, "", workdir, log, namespace=known.namespace,
                             pod_name=known.name, image=spec["image"], pids=[process.pid])  # fmt: skip
        played = self._workspace_of(pod)
        token = played.jupyter_token if played else os.urandom(12).hex()
        home = mounts.get(IMAGE_HOME, root / IMAGE_HOME.lstrip("/"))
        home.mkdir(parents=True, exist_ok=True)
        # The service account's token, CA and namespace, as a kubelet projects them.
        accounts = workdir / "sa"
        accounts.mkdir()
        (accounts / "token").write_text(self.service_account_token(pod))
        shutil.copy(self.plane.pki / "ca.crt", accounts / "ca.crt")
        (accounts / "namespace").write_text(known.namespace)
        # /etc/jupyter: the image's files, then the pod's mounts over them (a ConfigMap mounted
        # on the image's config file replaces it, as in a real pod).
        etc = root / "etc" / "jupyter"
        etc.mkdir(parents=True)
        for destination, source in self.image_files().items():
            target = root / destination.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
        for path, local in mounts.items():
            if path.startswith("/etc/jupyter"):
                target = root / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                if local.is_dir():
                    shutil.rmtree(target, ignore_errors=True)
                    shutil.copytree(local, target)
                else:
                    target.unlink(missing_ok=True)
                    shutil.copy(local, target)
        # gVisor's checkpoint file in a GKE Sandbox pod: a file the workload opens once, writes
        # "1" to, then reads from; the read blocks until the checkpoint is done. A pty's other
        # end behaves so (raw: no echo, no line buffering). Outside gVisor there is none.
        agent_end = None
        if pod["spec"].get("runtimeClassName") == GVISOR:
            agent_end, pod_end = os.openpty()
            tty.setraw(pod_end)
            gvisor = os.ttyname(pod_end)
        else:
            pod_end, gvisor = None, str(root / "proc" / "gvisor" / "checkpoint")
        limits = (spec.get("resources") or {}).get("limits") or {}
        port = free_port()  # the pod's port 8888, on this machine's loopback
        config = workdir / "config"
        config.mkdir()
        # What is different here from a real pod, said where Jupyter reads its own user config
        # (highest priority): paths, the port, the token; the image's config stays in force.
        (config / "jupyter_server_config.py").write_text(
            "import faulthandler, signal\n"  # SIGUSR2: every thread's stack in the log
            "faulthandler.register(signal.SIGUSR2, all_threads=True)\n"
            f"c.PauseApp.service_account_dir = {str(accounts)!r}\n"
            f"c.PauseApp.gvisor_checkpoint_file = {gvisor!r}\n"
            "c.PauseApp.workspace_poll_seconds = 0.2\n"
            "c.PauseApp.monitor_interval_seconds = 3600.0\n"
            "c.PauseApp.busy_wait_seconds = 5.0\n"
            f"c.PauseApp.gpu_count = {int(limits.get(GPU, 0))}\n"  # the GPUs the pod is given
            + server_config(port, token, home)
            + (played.extra_config if played else "")
        )
        env = {
            **base_env,
            "HOME": str(home),
            "JUPYTER_CONFIG_DIR": str(config),
            # The image's /etc/jupyter is the system path, below the user's config; here it can
            # only be a JUPYTER_CONFIG_PATH entry, which Jupyter ranks above the user's: listing
            # the user's first keeps a real pod's order (the image's JSON would win otherwise).
            "JUPYTER_CONFIG_PATH": os.pathsep.join((str(config), str(etc))),
            "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
            **env_pod,
        }
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "jupyter_server"],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=home,
            )  # fmt: skip
        container = Container(
            known.uid, process, port, token, workdir, log, namespace=known.namespace,
            pod_name=known.name, image=spec["image"], workspace=played.name if played else None,
            agent_end=agent_end, gvisor_file=gvisor if agent_end is not None else None,
            pids=[process.pid],
        )  # fmt: skip
        try:
            wait_serving(process, container.url, token, log)
        except AssertionError:
            if pod_end is not None:
                os.close(pod_end)
            raise
        if agent_end is not None:
            assert pod_end is not None
            self._work(f"gvisor-{known.name}", self._gvisor_agent, container, agent_end, pod_end)
        return container

    def _run_singleuser(
        self, known: KubeletPod, pod_spec: dict[str, Any], workdir: Path, log: Path,
        mounts: dict[str, Path], env: dict[str, str],
    ) -> Container:  # fmt: skip
        """The single-user image's container (docker-stacks with jupyter_pause): its command
        run here as the pod would see it. What a pod's own namespaces give it is translated:
        a path under a mount is the mounted folder, the image's HOME its home volume (else a
        folder of the container's own), the image's /etc/jupyter its mounted files (a system
        config path), and 0.0.0.0 the pod's own address (pod_ip)."""
        spec = pod_spec["containers"][0]
        root = workdir / "root"
        home = mounts.get(IMAGE_HOME, root / IMAGE_HOME.lstrip("/"))
        home.mkdir(parents=True, exist_ok=True)
        etc = root / "etc" / "jupyter"
        etc.mkdir(parents=True)
        for path, local in mounts.items():
            if path.startswith("/etc/jupyter/"):
                target = root / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(local, target)
        places = sorted({**mounts, IMAGE_HOME: home}.items(), key=lambda m: -len(m[0]))

        def local(text: str) -> str:
            for path, folder in places:
                if text == path or text.startswith(path.rstrip("/") + "/"):
                    return str(folder) + text[len(path.rstrip("/")) :]
            return text.replace("//0.0.0.0:", f"//{known.ip}:")

        env = {name: local(value) for name, value in env.items()}
        env.update(HOME=str(home), JUPYTER_CONFIG_PATH=str(etc))
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the image's
        argv = [local(a) for a in [*(spec.get("command") or []), *(spec.get("args") or [])]]
        assert argv, f"pod {known.name}: the single-user image runs its command (KubeSpawner.cmd)"
        cwd = Path(local(spec.get("workingDir") or IMAGE_HOME))
        if os.geteuid() == 0:
            # A real pod runs as the image's user (the chart's uid 1000); here the container
            # runs as this machine's user, root, whose Python lives in root's home: a played
            # config path, first, lets jupyter-server run as root.
            played = root / "played-config"
            played.mkdir()
            (played / "jupyter_server_config.py").write_text("c.ServerApp.allow_root = True\n")
            env["JUPYTER_CONFIG_PATH"] = os.pathsep.join((str(played), str(etc)))
        with open(log, "wb") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
        return Container(known.uid, process, IMAGE_PORT, "", workdir, log, namespace=known.namespace,
                         pod_name=known.name, image=spec["image"], pids=[process.pid])  # fmt: skip

    def kernel_image_files(self) -> dict[str, Path]:
        """Where the played kernel image has gateway-provisioners' launchers, assembled as its
        ``jupyter image-bootstrap install --languages python`` does: the Python launcher with
        the shared ``server_listener.py`` over its placeholder (from the package installed here)."""
        import importlib.util

        found = importlib.util.find_spec("gateway_provisioners")
        assert found is not None and found.origin, "gateway-provisioners is not installed"
        source = Path(found.origin).parent / "kernel-launchers"
        image = self.workdir / "kernel-image" / "kernel-launchers"
        if not image.exists():
            for part in ("python", "shared"):
                shutil.copytree(source / part, image / "python", dirs_exist_ok=True)
        return {"/usr/local/bin/kernel-launchers/": image}

    def _run_command(
        self, known: KubeletPod, spec: dict[str, Any], workdir: Path, log: Path, env: dict[str, str]
    ) -> Container:
        """The container's command and args as a local process: ``$(VAR)`` expanded from its
        env as a kubelet does, the image's paths and ``python`` mapped onto this machine."""
        files = self.kernel_image_files()

        def expand(text: str) -> str:
            text = re.sub(
                r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]),
                text,
            )
            for image_path, local in files.items():
                if text.startswith(image_path):
                    text = str(local / text[len(image_path) :])
            return text

        argv = [expand(a) for a in [*(spec.get("command") or []), *(spec.get("args") or [])]]
        assert argv, f"pod {known.name}: the kernel image has no default command here"
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        cwd = workdir / "root" / (spec.get("workingDir") or "").lstrip("/")
        cwd.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
        container = Container(known.uid, process, 0, "", workdir, log, namespace=known.namespace,
                              pod_name=known.name, image=spec["image"], pids=[process.pid])  # fmt: skip
        with self.lock:
            self.commands.append(container)
        return container

    def _attach_restored(
        self, known: KubeletPod, pod: dict[str, Any], container: Container
    ) -> None:
        """A snapshot's processes in the new pod: its service-account token is the new pod's
        (the kubelet projects it into the restored sandbox; the old one died with the old pod),
        what a workload checkpoint owes its reader is answered, and they are thawed."""
        if (
            container.workdir / "sa"
        ).is_dir():  # a pod without automountServiceAccountToken has none
            (container.workdir / "sa" / "token").write_text(self.service_account_token(pod))
        with self.lock:
            container.pod_uid = known.uid
            container.pod_name = known.name
            container.attached = True
            container.signals.append("restored")
            if container.answer_on_restore is not None and container.agent_end is not None:
                os.write(container.agent_end, container.answer_on_restore)
                container.answer_on_restore = None
            container.thaw()

    # -- GKE's node agent for Pod Snapshots ---------------------------------------------------------
    def _agent_sync(self) -> None:
        """One pass: every new PodSnapshotManualTrigger of this cluster's namespaces fired, and
        the processes of every PodSnapshot deleted since let go."""
        for namespace in sorted(self.namespaces):
            for trigger in self.api.list(group(SNAPSHOTS, namespace, "podsnapshotmanualtriggers")):
                if (trigger.get("status") or {}).get("conditions"):
                    continue  # spent: a trigger fires once
                self._fire(trigger)
        self._forget_deleted_snapshots()

    def _forget_deleted_snapshots(self) -> None:
        """The processes of every PodSnapshot deleted since the last look let go. (Listed under
        the lock: a snapshot the agent registers meanwhile is never taken for a deleted one.)"""
        with self.lock:
            existing = set()
            for namespace in sorted(self.namespaces):
                for item in self.api.list(group(SNAPSHOTS, namespace, "podsnapshots")):
                    existing.add((namespace, item["metadata"]["name"]))
            for key in [k for k in self.snapshots if k not in existing]:
                self._drop_snapshot(self.snapshots.pop(key))

    def _drop_snapshot(self, snapshot: Snapshot) -> None:
        """A deleted PodSnapshot: the processes it held end, unless a pod or another snapshot
        has them."""
        held = snapshot.holds
        snapshot.holds = None
        if held is None or held.attached:
            return
        if any(s.holds is held for s in self.snapshots.values()):
            return
        held.discard()

    def _trigger_status(self, trigger: dict[str, Any], status: str, reason: str, message: str,
                        snapshot: str | None = None) -> None:  # fmt: skip
        body: dict[str, Any] = {
            "status": {
                "conditions": [{"type": "Triggered", "status": status, "reason": reason,
                                "message": message, "lastTransitionTime": now_rfc3339()}]
            }
        }  # fmt: skip
        if snapshot:
            body["status"]["snapshotCreated"] = {"name": snapshot}
        metadata = trigger["metadata"]
        try:
            self.api.merge(
                group(SNAPSHOTS, metadata["namespace"], "podsnapshotmanualtriggers",
                      metadata["name"], "status"), body)  # fmt: skip
        except ApiError as err:
            if err.status != 404:  # deleted meanwhile
                raise

    def _selecting_policy(self, pod: dict[str, Any], trigger_type: str) -> dict[str, Any] | None:
        labels = pod["metadata"].get("labels") or {}
        policies = self.api.list(
            group(SNAPSHOTS, pod["metadata"]["namespace"], "podsnapshotpolicies")
        )
        for policy in sorted(policies, key=lambda p: p["metadata"]["name"]):
            spec = policy.get("spec") or {}
            if selector_matches(spec.get("selector") or {}, labels) and (
                (spec.get("triggerConfig") or {}).get("type") == trigger_type
            ):
                return policy
        return None

    def _fire(self, trigger: dict[str, Any]) -> None:
        namespace, name = trigger["metadata"]["namespace"], trigger["metadata"]["name"]
        target = trigger["spec"]["targetPod"]
        pod = self.api.get(core(namespace, "pods", target))
        if pod is not None and pod["spec"].get("nodeName") not in self.nodes:
            return  # another node's agent
        with self.lock:
            known = self.pods.get(pod["metadata"]["uid"]) if pod else None
            container = known.container if known else None
        if pod is None or container is None or container.frozen or known.phase != "running":
            self._trigger_status(trigger, "False", "Failed", f"pod {target} is not running")
            return
        if pod["spec"].get("runtimeClassName") != GVISOR:
            self._trigger_status(trigger, "False", "Failed",
                                 f"pod {target} does not run in GKE Sandbox (gVisor)")  # fmt: skip
            return
        policy = self._selecting_policy(pod, "manual")
        if policy is None:
            self._trigger_status(trigger, "False", "Failed",
                                 f"no PodSnapshotPolicy with a manual trigger selects pod {target}")  # fmt: skip
            return
        with self.lock:
            failure = self.fail_triggers.pop(0) if self.fail_triggers else None
        snapshot = self._take_snapshot(pod, container, policy, name, failure)
        with self.lock:
            self.fired.append((name, snapshot, failure))
        self._trigger_status(
            trigger, "True", "Complete", f"PodSnapshot {snapshot} created", snapshot
        )

    def _take_snapshot(
        self,
        pod: dict[str, Any],
        container: Container,
        policy: dict[str, Any],
        trigger: str,
        failure: str | None = None,
    ) -> str:
        """A PodSnapshot of the pod, named with a UUID and labelled as GKE does (the trigger
        that asked for it, the pod it is of), Ready (or, scripted, failed); it holds the pod's
        processes, which ``postCheckpoint: stop`` freezes right away, as GKE stops the sandbox."""
        namespace = pod["metadata"]["namespace"]
        name = str(uuid.uuid4())
        path = group(SNAPSHOTS, namespace, "podsnapshots")
        self.api.create(
            path,
            {"apiVersion": SNAPSHOTS, "kind": "PodSnapshot",
             "metadata": {"name": name, "labels": {TRIGGERED_BY: trigger,
                                                   ORIGIN_POD: pod["metadata"]["name"]}},
             "spec": {"policyName": policy["metadata"]["name"]}},
        )  # fmt: skip
        owner = controller_of(pod) or {}
        with self.lock:  # what it holds is known before anyone sees it Ready
            self.snapshots[(namespace, name)] = Snapshot(
                namespace, name, trigger, policy["metadata"]["name"], pod["metadata"]["name"],
                pod["metadata"]["uid"], owner.get("uid", ""),
                tuple((c["name"], c["image"]) for c in pod["spec"]["containers"]),
                time.time(), None if failure else container,
            )  # fmt: skip
        ready = (
            {"type": "Ready", "status": "False", "reason": "Failed", "message": failure}
            if failure
            else {"type": "Ready", "status": "True", "reason": "Ready"}
        )
        self.api.merge(
            f"{path}/{name}/status",
            {"status": {"conditions": [{**ready, "lastTransitionTime": now_rfc3339()}]}},
        )
        with self.lock:
            stop = ((policy.get("spec") or {}).get("triggerConfig") or {}).get("postCheckpoint")
            if not failure and stop == "stop" and not container.frozen:
                container.freeze()
                container.signals.append("snapshot-stopped")
        return name

    def _gvisor_agent(self, container: Container, agent_end: int, pod_end: int) -> None:
        """gVisor's side of a workload trigger: a ``1`` from the pod, a snapshot under the
        workload policy that selects the pod, then ``r`` (or ``e`` when none does). Under
        ``postCheckpoint: stop`` the answer waits for a restore: the sandbox is stopped."""
        try:
            while not self._stop.is_set() and container.process.poll() is None:
                ready, _, _ = select.select([agent_end], [], [], 0.2)
                if not ready or os.read(agent_end, 1) != b"1":
                    continue
                pod = self.api.get(core(container.namespace, "pods", container.pod_name))
                policy = self._selecting_policy(pod, "workload") if pod else None
                if pod is None or policy is None:
                    os.write(agent_end, b"e")
                    continue
                self._take_snapshot(pod, container, policy, "workload")
                with self.lock:
                    if container.frozen:
                        container.answer_on_restore = b"r"
                    else:
                        os.write(agent_end, b"r")
        finally:
            container.agent_end = None
            os.close(agent_end)
            os.close(pod_end)

    def _matches(self, snapshot: Snapshot, pod: dict[str, Any]) -> bool:
        """GKE's matching: the snapshot's policy (still there) selects the new pod, and the
        snapshot is of a pod of the same workload (its controller) with the same containers."""
        if snapshot.namespace != pod["metadata"]["namespace"]:
            return False
        policy = self.api.get(
            group(SNAPSHOTS, snapshot.namespace, "podsnapshotpolicies", snapshot.policy)
        )
        if policy is None or not selector_matches(
            (policy.get("spec") or {}).get("selector") or {}, pod["metadata"].get("labels") or {}
        ):
            return False
        owner = controller_of(pod) or {}
        images = tuple((c["name"], c["image"]) for c in pod["spec"]["containers"])
        return owner.get("uid", "") == snapshot.owner_uid and images == snapshot.images

    def _agent_restore_for(
        self, pod: dict[str, Any]
    ) -> tuple[Container | None, dict[str, Any] | None]:
        """What GKE's agent does with a new gVisor pod: the snapshot it pins
        (``podsnapshot.gke.io/ps-name``), or else the newest Ready one that matches it, restored
        (its processes, and ``PodRestored=True`` naming it); a cold start otherwise, with
        ``PodRestored=False`` and why where a restore was asked for or scripted to fail."""
        pin = (pod["metadata"].get("annotations") or {}).get(PIN_ANNOTATION)
        namespace = pod["metadata"]["namespace"]
        now = now_rfc3339()

        def restored(status: str, reason: str, message: str) -> dict[str, Any]:
            return {"type": RESTORED, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": now}  # fmt: skip

        with self.lock:
            if pin:
                snapshot = self.snapshots.get((namespace, pin))
                if snapshot is None:
                    exists = self.api.get(group(SNAPSHOTS, namespace, "podsnapshots", pin))
                    why = "was not taken by GKE" if exists else "does not exist"
                    return None, restored("False", "SnapshotNotFound", f"PodSnapshot {pin} {why}")
                if not self._matches(snapshot, pod):
                    return None, restored(
                        "False", "NoMatchingSnapshot",
                        f"PodSnapshot {pin} does not match this pod's spec hash",
                    )  # fmt: skip
            else:
                candidates = [
                    s
                    for s in self.snapshots.values()
                    if s.holds is not None and self._matches(s, pod)
                ]
                if not candidates:
                    return None, None
                snapshot = max(candidates, key=lambda s: s.created)
            if self.restore_mode == "silent":
                return None, None
            if self.restore_mode == "mismatch":
                return None, restored(
                    "False", "NoMatchingSnapshot",
                    f"PodSnapshot {snapshot.name} does not match this pod's spec hash",
                )  # fmt: skip
            held = snapshot.holds
            if held is None or held.attached or held.process.poll() is not None:
                return None, restored(
                    "False", "RestoreFailed", f"PodSnapshot {snapshot.name} could not be restored"
                )
            held.attached = True  # this pod's now; no other may take it meanwhile
            return held, restored(
                "True", "Restored", f"Pod restored from PodSnapshot {snapshot.name}"
            )

    # -- what tests do as the platform, a user or the admin --------------------------------------
    def set_paused(self, name: str, paused: bool) -> dict[str, Any]:
        """A pause or resume as the Kubeflow UI asks for it (a merge patch of ``spec.paused``);
        the Workspace as the API server answered (webhooks applied)."""
        return self.api.merge(
            group(KUBEFLOW, self.namespace, "workspaces", name), {"spec": {"paused": paused}}
        )

    def workspace_object(self, name: str) -> dict[str, Any]:
        found = self.api.get(group(KUBEFLOW, self.namespace, "workspaces", name))
        assert found is not None, f"no Workspace {name}"
        return found

    def status(self, name: str) -> dict[str, Any]:
        return self.workspace_object(name).get("status") or {}

    def stateful_set(self, name: str) -> dict[str, Any] | None:
        owned = owned_by(self.api.list(group("apps/v1", self.namespace, "statefulsets")), name)
        return owned[0] if owned else None

    def pod_of(self, name: str) -> dict[str, Any] | None:
        """The Workspace's pod, as the API server has it now (None when it has none)."""
        pods = self.api.list(
            core(self.namespace, "pods"), labelSelector=f"{WORKSPACE_LABEL}={name}"
        )
        return pods[0] if pods else None

    def snapshot_names(self) -> list[str]:
        items = self.api.list(group(SNAPSHOTS, self.namespace, "podsnapshots"))
        return sorted(i["metadata"]["name"] for i in items)

    def snapshot_object(self, plural: str, name: str) -> dict[str, Any] | None:
        return self.api.get(group(SNAPSHOTS, self.namespace, plural, name))

    def snapshot_objects(self, plural: str) -> list[dict[str, Any]]:
        return self.api.list(group(SNAPSHOTS, self.namespace, plural))

    def state_annotation(self, name: str) -> dict[str, Any]:
        """What jupyter_pause recorded on the Workspace (``jupyter-pause.io/state``), parsed."""
        raw = (self.workspace_object(name)["metadata"].get("annotations") or {}).get(
            STATE_ANNOTATION
        )
        return json.loads(raw) if raw else {}

    def pinned(self, name: str) -> str | None:
        """The snapshot the Workspace's pod template pins (``podsnapshot.gke.io/ps-name``)."""
        template = self.workspace_object(name)["spec"]["podTemplate"]
        return ((template.get("podMetadata") or {}).get("annotations") or {}).get(PIN_ANNOTATION)

    def pods_of(self, played: PlayedWorkspace) -> list[str]:
        """The uids of the Workspace's pods the kubelet has run (or tried to), oldest first."""
        with self.lock:
            return [
                p.uid
                for p in self.pods.values()
                if (p.namespace, p.workspace) == (played.namespace, played.name)
            ]

    def shipped_policy(self, trigger: str = "manual") -> str:
        """``deploy/modes/pod-snapshots/podsnapshot-policy.yaml`` in this namespace, as its
        README's ``envsubst`` makes it, with ``triggerConfig.type`` set to ``trigger`` (the
        file's is ``manual``; ``workload``: the pod asks through gVisor's checkpoint file). Not
        played: its ``snapshotGroupingRules`` and ``retentionConfig`` (GKE's own retention;
        jupyter_pause's keeps to one snapshot per Workspace anyway). Returns its name."""
        import yaml

        path = DEPLOY / "modes" / "pod-snapshots" / "podsnapshot-policy.yaml"
        document = yaml.safe_load(path.read_text().replace("${NAMESPACE}", self.namespace))
        document["spec"]["triggerConfig"]["type"] = trigger
        self.api.create(group(SNAPSHOTS, self.namespace, "podsnapshotpolicies"), document)
        return document["metadata"]["name"]

    def quota(self, resource: str, hard: int) -> None:
        """A ResourceQuota ``limits`` of ``hard`` on ``resource``; returns once the real quota
        controller (kube-controller-manager's) has counted what is used, from which moment the
        API server's quota admission enforces it (before, it refuses with "status unknown")."""
        path = core(self.namespace, "resourcequotas")
        self.api.create(path, {"metadata": {"name": "limits"},
                               "spec": {"hard": {resource: str(hard)}}})  # fmt: skip

        def counted() -> bool:
            found = self.api.get(f"{path}/limits") or {}
            return resource in ((found.get("status") or {}).get("used") or {})

        # (the controller discovers a new CRD's resources every 30 s)
        self.wait(counted, 120, f"the quota controller to count {resource}")

    def edit_role(self, played: PlayedWorkspace, drop: dict[str, str]) -> None:
        """An admin takes verbs from the shipped RBAC of ``played`` (resource -> verb); returns
        once the API server refuses each of them to its pod, and grants every other verb the
        shipped RBAC grants it, asked with that pod's own token (a SelfSubjectAccessReview:
        exactly the identity the pause uses).

        Workspace verbs are in the Workspace's own Role (``rbac-workspace.yaml``, stamped):
        edited in place. The others are in its kind's mode's ClusterRole, which every Workspace
        shares: the admin makes an edited copy and names it in the WorkspaceKind's
        ``podTemplate.serviceAccount.clusterRoles`` instead; the workspace controller replaces
        the Workspace's RoleBinding with one to the copy, as upstream's reconcileRoleBindings
        does (a binding deleted by hand would come back)."""
        granted: list[tuple[str, str, str, str | None]] = []  # group, resource, verb, name

        def without(rules: list[dict[str, Any]], name: str | None) -> list[dict[str, Any]]:
            kept = []
            for rule in rules:
                for api_group in rule.get("apiGroups") or [""]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            granted.append((api_group, resource, verb, name))
                verbs = [v for v in rule["verbs"] if drop.get(rule["resources"][0]) != v]
                if verbs:
                    kept.append({**rule, "verbs": verbs})
            return kept

        roles = group(RBAC, self.namespace, "roles")
        own = self.api.get(f"{roles}/jupyter-pause-ws-{played.name}")
        assert own is not None, f"no Role of Workspace {played.name}"
        self.api.merge(f"{roles}/jupyter-pause-ws-{played.name}",
                       {"rules": without(own["rules"], played.name)})  # fmt: skip
        kind_path = group(KUBEFLOW, None, "workspacekinds", played.kind)
        kind = self.api.get(kind_path)
        assert kind is not None
        account = kind["spec"]["podTemplate"].get("serviceAccount") or {}
        edit_shared = any(resource != "workspaces" for resource in drop)
        edited_roles = []
        for entry in account.get("clusterRoles") or []:
            shared = self.api.get(group(RBAC, None, "clusterroles", entry["name"]))
            assert shared is not None, f"no ClusterRole {entry['name']}"
            rules = without(shared["rules"], None)
            if edit_shared:
                edited = f"{entry['name']}-edited-{self.namespace}"
                self.api.create(group(RBAC, None, "clusterroles"),
                                {"metadata": {"name": edited}, "rules": rules})  # fmt: skip
                self.cluster_roles.append(edited)
                edited_roles.append({"name": edited})
        if edit_shared:
            self.api.merge(kind_path, {"spec": {"podTemplate": {
                "serviceAccount": {"clusterRoles": edited_roles}}}})  # fmt: skip
        pod = self.pod_of(played.name)
        assert pod is not None, f"Workspace {played.name} has no pod"
        current = played.current
        token = (
            (current.workdir / "sa" / "token").read_text()
            if current is not None
            else self.service_account_token(pod)
        )
        as_pod = Api(self.plane.credentials(token))
        reviews = group("authorization.k8s.io/v1", None, "selfsubjectaccessreviews")

        def as_wanted() -> bool:
            for api_group, resource, verb, name in granted:
                answer = as_pod.create(reviews, {
                    "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": {
                        "namespace": self.namespace, "group": api_group, "resource": resource,
                        "verb": verb, **({"name": name} if name else {})}}})  # fmt: skip
                if answer["status"].get("allowed", False) == (drop.get(resource) == verb):
                    return False
            return True

        try:
            self.wait(as_wanted, 60, f"the API server to refuse {drop} to {played.name}'s pod")
        finally:
            as_pod.pool.clear()

    def fail_next_trigger(self, message: str = "checkpoint of the sandbox failed") -> None:
        """The node agent's next snapshot fails: a PodSnapshot with Ready False, reason Failed."""
        with self.lock:
            self.fail_triggers.append(message)

    def make_unpullable(self, image: str) -> None:
        """Pulls of ``image`` fail (ErrImagePull, then ImagePullBackOff) until made pullable."""
        self.unpullable.add(image)

    def make_pullable(self, image: str) -> None:
        self.unpullable.discard(image)

    def block_gpus(self, count: int, gpus_each: int = 1, sandbox: bool = False) -> list[str]:
        """Another team's GPU pods on this test's nodes (a namespace of theirs): GPUs become
        scarce. Returns their names; ``release_gpus`` deletes them."""
        namespace = f"{self.namespace}-other-team"
        if namespace not in self.other_namespaces:
            self.api.create(core(None, "namespaces"), {"metadata": {"name": namespace}})
            self.other_namespaces.add(namespace)
        names = []
        for _ in range(count):
            name = f"training-{next(self._blockers)}"
            spec: dict[str, Any] = {
                "nodeSelector": {POOL_LABEL: self.pool},
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": CONTAINER, "image": "trainer:latest",
                                "resources": {"limits": {GPU: str(gpus_each)}}}],
            }  # fmt: skip
            if sandbox:
                spec["runtimeClassName"] = GVISOR
            body = {"metadata": {"name": name, "labels": {"team": "other"}}, "spec": spec}

            def created(body: dict[str, Any] = body) -> bool:
                try:
                    self.api.create(core(namespace, "pods"), body)
                except ApiError as err:  # a new namespace's "default" account comes a bit later
                    if err.status == 403 and "serviceaccount" in err.body:
                        return False
                    raise
                return True

            self.wait(created, 30, f"pod {namespace}/{name} to be accepted")
            names.append(name)
        return names

    def release_gpus(self) -> None:
        for namespace in self.other_namespaces:
            for pod in self.api.list(core(namespace, "pods"), labelSelector="team=other"):
                self.api.delete(core(namespace, "pods", pod["metadata"]["name"]))

    def running(
        self, played: PlayedWorkspace, previous_pod: str | None = None, timeout: float = 180
    ) -> Container:
        """The container of the Workspace's pod once it runs and the Workspace is Running; with
        ``previous_pod`` (a pod's uid), of another pod than that one (a restored pod's container
        may be the very processes of the previous one)."""

        def up() -> Container | None:
            current = played.current
            if current is None or current.frozen or current.pod_uid == previous_pod:
                return None
            return current

        try:
            container = self.wait(up, timeout, f"a running pod of Workspace {played.name}")
            self.wait(
                lambda: self.status(played.name).get("state") == "Running",
                timeout,
                f"Workspace {played.name} to be Running",
            )
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.describe(played.name)}") from None
        return container

    def describe(self, name: str) -> str:
        """What a test that waited in vain needs to know: the Workspace's status, its pod's."""
        status = self.status(name)
        pod = self.pod_of(name)
        lines = [f"Workspace {name}: {status.get('state')}: {status.get('stateMessage')}"]
        if pod is not None:
            found = pod.get("status") or {}
            lines.append(
                f"pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')}: "
                f"{found.get('phase')} {found.get('conditions')} {found.get('containerStatuses')}"
            )
        return "\n".join(lines)

    def user_kubeconfig(self, folder: Path) -> Path:
        """A kubeconfig of the unprivileged user, bound to deploy/rbac-user.yaml here."""
        path = folder / f"kubeconfig-{self.namespace}"
        if not path.exists():
            self.plane.apply_file(
                DEPLOY / "rbac-user.yaml", NAMESPACE=self.namespace, USER="pause-user"
            )
            self.plane.user.kubeconfig(path, self.namespace)
        return path


@contextlib.contextmanager
def real_played_cluster(plane: ControlPlane, workdir: Path) -> Iterator[RealPlayedCluster]:
    """A started ``RealPlayedCluster`` with its namespace, closed at the end."""
    cluster = RealPlayedCluster(plane, workdir)
    cluster.create_namespace()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()
