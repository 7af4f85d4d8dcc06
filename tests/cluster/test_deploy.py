"""The shipped ``deploy/`` examples of the three modes, applied to a real kube-apiserver (1.20)
with Kubeflow Notebooks v2's own CRDs and GKE's podsnapshot.gke.io ones (``upstream_control_plane``):

* every manifest is accepted and keeps every field (a field the CRD does not know would be
  pruned silently), and none is shipped untested;
* the per-Workspace RBAC: a Workspace's ServiceAccount may pause its own Workspace and no
  other, with exactly the verbs its mode needs (real calls with its own token, and the API
  server's SelfSubjectAccessReview for the whole table);
* each mode's pod, as its WorkspaceKind and the cluster make it, is detected in that mode by the
  server's own code, with nothing but the Workspace's own rights (gke-workspaces: the real
  GKE Workspaces add-on mutates the pod);
* the MutatingAdmissionPolicy that puts pod-snapshots pods in gVisor. Kubernetes 1.36's API,
  which this 1.20 API server does not serve: it is checked against the Kubernetes client's
  models of that API (every field one the API defines, the required ones there), and its
  label selector is evaluated by the API server against the pods each WorkspaceKind makes.
  That the policy really sets ``runtimeClassName`` cannot be run here (1.20 has no CEL);
* the kernel pods' Kubeflow kind (``deploy/kernel-pods/kubeflow/``): a CPU pod whose account has
  exactly ``deploy/kernel-pods/rbac.yaml``'s rights, and the kernel pod template, rendered by
  gateway-provisioners' own launcher with that kind's ``KERNEL_VOLUMES`` /
  ``KERNEL_VOLUME_MOUNTS`` (and without them), is a pod the API server accepts as rendered.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .control_plane import ControlPlane, SnapshotAddon, wait_until
from .deploy_manifests import (
    DEPLOY,
    MODES,
    WORKSPACE_LABEL,
    addon_ipc_config,
    create_once,
    documents,
    install_workspace_rbac,
    mode_file,
    not_kept,
    pod_labels,
    service_account_token,
    workspace_kind,
)

_numbers = itertools.count(1)
BUCKET = "a-bucket"
GVISOR_POLICY = mode_file("pod-snapshots", "gvisor-admission-policy.yaml")
KERNEL_PODS = DEPLOY / "kernel-pods"
KUBEFLOW = KERNEL_PODS / "kubeflow"
#: Each manifest and the placeholders its install step fills (deploy/README.md); "" is the
#: test's namespace. (Each mode stamps its Role for a Workspace of its own: same names.)
MANIFESTS = {
    DEPLOY / "rbac-user.yaml": {"NAMESPACE": "", "USER": "alice@example.com"},
    DEPLOY / "kernel-pods" / "rbac.yaml": {"NAMESPACE": "", "SERVICE_ACCOUNT": "jupyter-server"},
    DEPLOY / "kernel-pods" / "podsnapshot-policy.yaml": {"NAMESPACE": ""},
    mode_file("gke-workspaces", "workspacekind.yaml"): {},
    mode_file("gke-workspaces", "clusterrole.yaml"): {},
    mode_file("gke-workspaces", "rbac-workspace.yaml"): {"NAMESPACE": "", "WORKSPACE": "lab-gke"},
    mode_file("pod-snapshots", "workspacekind.yaml"): {},
    mode_file("pod-snapshots", "clusterrole.yaml"): {},
    mode_file("pod-snapshots", "rbac-workspace.yaml"): {"NAMESPACE": "", "WORKSPACE": "lab-pod"},
    mode_file("pod-snapshots", "podsnapshot-storage.yaml"): {"BUCKET": BUCKET},
    mode_file("pod-snapshots", "podsnapshot-policy.yaml"): {"NAMESPACE": ""},
    mode_file("no-snapshots", "workspacekind.yaml"): {},
    mode_file("no-snapshots", "clusterrole.yaml"): {},
    mode_file("no-snapshots", "rbac-workspace.yaml"): {"NAMESPACE": "", "WORKSPACE": "lab-none"},
    KUBEFLOW / "clusterrole.yaml": {},
    KUBEFLOW / "workspacekind.yaml": {},
}


@pytest.fixture(scope="module")
def kinds(upstream_control_plane: ControlPlane) -> dict[str, str]:
    """The three shipped WorkspaceKinds (cluster-wide, as an admin installs them): mode -> name."""
    names = {}
    for mode in MODES:
        (kind,) = create_once(upstream_control_plane, mode_file(mode, "workspacekind.yaml"))
        names[mode] = kind["metadata"]["name"]
    return names


@pytest.fixture
def namespace(upstream_control_plane: ControlPlane) -> Iterator[str]:
    """A profile namespace of this test's own."""
    from kubernetes import client

    name = f"deploy-{next(_numbers)}"
    with upstream_control_plane.admin.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        try:
            # Pods are refused until the ServiceAccount controller has made its "default"
            wait_until(
                lambda: any(a.metadata.name == "default" for a in
                            core.list_namespaced_service_account(name).items),
                30, f"the ServiceAccount default of namespace {name}",
            )  # fmt: skip
            yield name
        finally:
            core.delete_namespace(name)


def read_back(api: Any, document: dict[str, Any]) -> dict[str, Any]:
    """The object the API server stored for a shipped document, by its kind's REST path."""
    from kubernetes.dynamic import DynamicClient

    resource = DynamicClient(api).resources.get(
        api_version=document["apiVersion"], kind=document["kind"]
    )
    metadata = document["metadata"]
    return resource.get(name=metadata["name"], namespace=metadata.get("namespace")).to_dict()


def create_workspace(
    plane: ControlPlane, namespace: str, name: str, mode: str, annotations: dict | None = None
) -> dict[str, Any]:
    """A Workspace of the mode's shipped kind, as the Kubeflow UI creates one (its defaults)."""
    from kubernetes import client

    shipped = workspace_kind(mode)
    kind = shipped["metadata"]["name"]
    options = shipped["spec"]["podTemplate"]["options"]
    with plane.admin.api_client() as api:
        return client.CustomObjectsApi(api).create_namespaced_custom_object(
            "kubeflow.org",
            "v1beta1",
            namespace,
            "workspaces",
            {
                "apiVersion": "kubeflow.org/v1beta1",
                "kind": "Workspace",
                "metadata": {"name": name, "annotations": annotations or {}},
                "spec": {
                    "kind": kind,
                    "podTemplate": {
                        "options": {
                            "imageConfig": options["imageConfig"]["spawner"]["default"],
                            "podConfig": options["podConfig"]["spawner"]["default"],
                        },
                        "volumes": {},
                    },
                },
            },
        )


def create_pod(
    plane: ControlPlane,
    namespace: str,
    name: str,
    labels: dict[str, str],
    account: str,
    runtime_class: str | None = None,
) -> dict[str, Any]:
    """A Workspace's pod as its StatefulSet makes it (no node takes it: it stays Pending), after
    every admission plugin and webhook of the API server; returns it as stored."""
    from kubernetes import client

    spec: dict[str, Any] = {
        "serviceAccountName": account,
        # the token Secret may not be made yet; nothing here runs the pod
        "automountServiceAccountToken": False,
        "containers": [{"name": "main", "image": "REGISTRY/jupyterlab-pause:0.1.0"}],
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    with plane.admin.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(
            namespace, {"metadata": {"name": name, "labels": labels}, "spec": spec}
        )
        return api.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))


# -- every manifest accepted, every field kept -------------------------------------------------------
def test_every_manifest_of_every_mode_is_accepted_and_keeps_every_field(
    upstream_control_plane: ControlPlane, kinds: dict[str, str], namespace: str
) -> None:
    plane = upstream_control_plane
    # Given every shipped manifest but the admission policy (tested below): none is left out
    # (deploy/jupyterhub/values.yaml is Helm values for Zero to JupyterHub, not a manifest)
    shipped = set(DEPLOY.rglob("*.yaml")) - {DEPLOY / "jupyterhub" / "values.yaml"}
    assert shipped == {*MANIFESTS, GVISOR_POLICY}, shipped ^ {*MANIFESTS, GVISOR_POLICY}

    # When each is installed as deploy/README.md says (a namespace where one is asked for)
    stored = []
    with plane.admin.api_client() as api:
        for path, values in MANIFESTS.items():
            filled = {k: v or namespace for k, v in values.items()}
            for document in create_once(plane, path, **filled):
                stored.append((path, document, read_back(api, document)))

    # Then the API server kept every field of every object
    for path, document, kept in stored:
        where = f"{path.relative_to(DEPLOY)} {document['kind']}"
        assert not_kept(document, kept) == [], where
    # and each WorkspaceKind names the ClusterRole shipped beside it for its pods' accounts
    for mode in MODES:
        (role,) = documents(mode_file(mode, "clusterrole.yaml"))
        account = workspace_kind(mode)["spec"]["podTemplate"]["serviceAccount"]
        assert account == {"clusterRoles": [{"name": role["metadata"]["name"]}]}, mode
    # and the pod-snapshots policy snapshots what its WorkspaceKind labels, into its storage
    (policy,) = documents(mode_file("pod-snapshots", "podsnapshot-policy.yaml"), NAMESPACE="x")
    (storage,) = documents(mode_file("pod-snapshots", "podsnapshot-storage.yaml"), BUCKET="b")
    spec = policy["spec"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels("pod-snapshots", "a").items()
    assert spec["storageConfigName"] == storage["metadata"]["name"]
    assert spec["triggerConfig"] == {"type": "manual", "postCheckpoint": "resume"}
    # one snapshot kept per Workspace: the one the next resume restores
    grouping = spec["snapshotGroupingRules"]["groupByLabelValue"]
    assert grouping["labels"] == ["notebooks.kubeflow.org/workspace-name"]
    assert grouping["groupRetentionPolicy"] == {"maxSnapshotCountPerGroup": 1}
    # and only the GKE Workspaces kind turns the add-on on
    enabled = {
        mode: (workspace_kind(mode)["metadata"].get("annotations") or {}).get(
            "podsnapshot.gke.kubeflow.org/enabled"
        )
        for mode in MODES
    }
    assert enabled == {"gke-workspaces": "true", "pod-snapshots": None, "no-snapshots": None}


# -- per-Workspace RBAC --------------------------------------------------------------------------
#: What a Workspace's account may do in its namespace, per mode: (verb, resource, name) -> allowed.
#: "own"/"other": its own Workspace (or the add-on's trigger for it) and another's.
ANY = ""
VERBS = ("get", "list", "watch", "create", "patch", "update", "delete")
TABLE_RESOURCES = (
    ("", "pods", ANY),
    ("kubeflow.org", "workspaces", "own"),
    ("kubeflow.org", "workspaces", "other"),
    ("kubeflow.org", "workspacekinds", ANY),
    ("podsnapshot.gke.io", "podsnapshotpolicies", ANY),
    ("podsnapshot.gke.io", "podsnapshotmanualtriggers", ANY),
    ("podsnapshot.gke.io", "podsnapshotmanualtriggers", "own"),
    ("podsnapshot.gke.io", "podsnapshotmanualtriggers", "other"),
    ("podsnapshot.gke.io", "podsnapshots", ANY),
    ("", "serviceaccounts", ANY),
    ("rbac.authorization.k8s.io", "roles", ANY),
)
ALLOWED = {
    "gke-workspaces": {
        ("get", "pods", ANY),
        ("get", "workspaces", "own"),
        ("patch", "workspaces", "own"),
        ("watch", "workspaces", "own"),  # a pause from outside, seen as it begins
        ("list", "podsnapshotpolicies", ANY),
        ("get", "podsnapshotmanualtriggers", "own"),
        ("get", "podsnapshots", ANY),
        ("list", "podsnapshots", ANY),
    },
    "pod-snapshots": {
        ("get", "pods", ANY),
        ("get", "workspaces", "own"),
        ("patch", "workspaces", "own"),
        ("watch", "workspaces", "own"),  # a pause from outside, seen as it begins
        ("list", "podsnapshotpolicies", ANY),
        # triggers by any name: their names are made at the pause (and RBAC cannot limit a
        # create by name at all)
        *(
            (verb, "podsnapshotmanualtriggers", which)
            for verb in ("create", "get", "delete")
            for which in (ANY, "own", "other")
        ),
        ("get", "podsnapshots", ANY),
        ("list", "podsnapshots", ANY),
        ("delete", "podsnapshots", ANY),
    },
    "no-snapshots": {
        ("get", "pods", ANY),
        ("get", "workspaces", "own"),
        ("patch", "workspaces", "own"),
        ("watch", "workspaces", "own"),  # a pause from outside, seen as it begins
        ("list", "podsnapshotpolicies", ANY),
    },
}


def name_of(which: str, resource: str, own: str, other: str) -> str:
    if not which:
        return ""
    workspace = own if which == "own" else other
    return workspace if resource == "workspaces" else f"ws-{workspace}-trigger"


@pytest.mark.parametrize("mode", MODES)
def test_a_workspaces_account_may_pause_its_own_workspace_and_no_other(
    upstream_control_plane: ControlPlane, kinds: dict[str, str], namespace: str, mode: str
) -> None:
    from kubernetes import client

    from jupyter_pause.backends.kube import STATE_ANNOTATION, Kube, KubeError

    plane = upstream_control_plane
    # Given two Workspaces of the mode's kind in one namespace, each with its RBAC as the
    # Notebooks controller and the admin's stamp give it, and A's pod
    for name in ("a", "b"):
        create_workspace(plane, namespace, name, mode)
        install_workspace_rbac(plane, mode, namespace, name)
    pod = create_pod(plane, namespace, "ws-a-x1y2z-0", pod_labels(mode, "a"), "ws-a")

    # When A's server calls the API with A's own token (what its pod mounts)
    token = service_account_token(plane, namespace, "ws-a")
    with plane.credentials(token).api_client() as as_a:
        kube = Kube(as_a, namespace)

        # Then it may read its pod and its Workspace, and write its pause record there
        assert kube.get_pod(namespace, pod["metadata"]["name"])["metadata"]["uid"]
        kube.patch_workspace(
            namespace, "a", {"metadata": {"annotations": {STATE_ANNOTATION: '{"state": "x"}'}}}
        )
        assert kube.get_workspace(namespace, "a")["metadata"]["annotations"][STATE_ANNOTATION]
        # and watch it by name (a pause from outside seen as it begins): its state now first
        # (a loaded API server may end the 1 s watch late and send it again: A's each time)
        events = list(kube.watch_workspace(namespace, "a", 1))
        assert events and events[0][0] == "ADDED", events
        assert {watched["metadata"]["name"] for _kind, watched in events} == {"a"}, events
        # but neither pause, read nor watch B (refused by RBAC, before any admission webhook)
        for attempt in (
            lambda: kube.patch_workspace(namespace, "b", {"spec": {"paused": True}}),
            lambda: kube.get_workspace(namespace, "b"),
            lambda: list(kube.watch_workspace(namespace, "b", 1)),
        ):
            with pytest.raises(KubeError) as refused:
                attempt()
            assert refused.value.kind == "forbidden", refused.value
        # nor touch anything in another namespace
        with pytest.raises(KubeError) as refused:
            kube.get_workspace("default", "a")
        assert refused.value.kind == "forbidden"

        # And the calls its mode makes work (and the others' do not), with these rights alone
        calls = {
            "list policies": lambda: kube.list_policies(namespace),
            "list snapshots": lambda: kube.list_snapshots(namespace),
            "create trigger": lambda: kube.create_trigger(
                namespace, "jp-a-1", pod["metadata"]["name"], {}
            ),
            "get own add-on trigger": lambda: kube.get_trigger(namespace, "ws-a-trigger"),
            "get other add-on trigger": lambda: kube.get_trigger(namespace, "ws-b-trigger"),
        }
        works = {
            "gke-workspaces": {"list policies", "list snapshots", "get own add-on trigger"},
            "pod-snapshots": set(calls),  # its triggers' names are made at the pause: any
            "no-snapshots": {"list policies"},
        }[mode]
        outcomes = {}
        for what, call in calls.items():
            try:
                call()
                outcomes[what] = "ok"
            except KubeError as err:  # not-found: allowed, and there is none (no add-on here)
                outcomes[what] = "ok" if err.kind == "not-found" else err.kind
        assert outcomes == {w: "ok" if w in works else "forbidden" for w in calls}, outcomes

        # And the API server's own answer for the whole table is exactly the mode's verbs
        authorization = client.AuthorizationV1Api(as_a)
        allowed = set()
        for group, resource, which in TABLE_RESOURCES:
            for verb in VERBS:
                review = authorization.create_self_subject_access_review(
                    {
                        "spec": {
                            "resourceAttributes": {
                                "namespace": namespace,
                                "verb": verb,
                                "group": group,
                                "resource": resource,
                                "name": name_of(which, resource, "a", "b"),
                            }
                        }
                    }
                )
                if review.status.allowed:
                    allowed.add((verb, resource, which))
    assert allowed == ALLOWED[mode], allowed ^ ALLOWED[mode]
    # B is as it was: not paused, no record of A's
    with plane.admin.api_client() as api:
        b = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "kubeflow.org", "v1beta1", namespace, "workspaces", "b"
        )
    assert b["spec"]["paused"] is False
    assert STATE_ANNOTATION not in (b["metadata"].get("annotations") or {})


# -- each mode detected, with the Workspace's own rights -----------------------------------------
def detect(plane: ControlPlane, namespace: str, pod: dict[str, Any], workspace: str) -> Any:
    """The server's mode detection for ``pod``, with the Workspace's own token."""
    from jupyter_pause.backends.kube import Kube
    from jupyter_pause.backends.workspace_modes import WorkspacePod, detect_mode

    token = service_account_token(plane, namespace, f"ws-{workspace}")
    with plane.credentials(token).api_client() as api:
        kube = Kube(api, namespace)
        name = pod["metadata"]["name"]
        mine = kube.get_pod(namespace, name)
        return detect_mode(WorkspacePod(kube, namespace, name, mine, workspace, 0.1, 1.0))


def test_gke_workspaces_pods_are_put_in_gvisor_by_the_addon_and_detected_in_that_mode(
    upstream_control_plane: ControlPlane,
    kinds: dict[str, str],
    namespace: str,
    gke_addon: SnapshotAddon,
) -> None:
    from jupyter_pause.backends.workspace_modes import (
        ADDON_READINESS_GATE,
        GKE_WORKSPACES,
        NO_SNAPSHOTS,
    )

    plane, mode = upstream_control_plane, "gke-workspaces"
    # Given a Workspace of the shipped GKE Workspaces kind (no annotation of its own), and one
    # that opts out, each with its RBAC
    create_workspace(plane, namespace, "a", mode)
    opted_out = {"podsnapshot.gke.kubeflow.org/enabled": "false"}
    create_workspace(plane, namespace, "c", mode, opted_out)
    for name in ("a", "c"):
        install_workspace_rbac(plane, mode, namespace, name)

    # When their pods are created (the add-on's webhook sees them)
    pod = create_pod(plane, namespace, "ws-a-x1y2z-0", pod_labels(mode, "a"), "ws-a")
    other = create_pod(plane, namespace, "ws-c-x1y2z-0", pod_labels(mode, "c"), "ws-c")

    # Then the kind's annotation turned the add-on on for A: gVisor (with GKE Sandbox's node
    # selector, from the RuntimeClass), its readiness gate, its config mounted over
    # /etc/jupyter/jupyter_server_config.py (why ours is JSON beside it)
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["nodeSelector"] == {"sandbox.gke.io/runtime": "gvisor"}
    assert {"conditionType": ADDON_READINESS_GATE} in spec["readinessGates"]
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert "/etc/jupyter/jupyter_server_config.py" in mounts
    assert "/etc/jupyter/jupyter_server_config.json" not in mounts
    # and the config it mounts is the one tests/test_workspace_config.py runs ours beside
    from kubernetes import client

    with plane.admin.api_client() as api:
        config = client.CoreV1Api(api).read_namespaced_config_map("jupyter-ipc-config", namespace)
    assert config.data["jupyter_server_config.py"] == addon_ipc_config()
    # and A's server, with A's rights only, finds itself in the GKE Workspaces mode
    choice = detect(plane, namespace, pod, "a")
    assert choice.name == GKE_WORKSPACES, choice
    # while the opted-out Workspace's pod is left alone, and its server says why it takes none
    assert "runtimeClassName" not in other["spec"]
    choice = detect(plane, namespace, other, "c")
    assert choice.name == NO_SNAPSHOTS
    assert f"no PodSnapshotPolicy in namespace {namespace} selects this pod" in choice.why


def test_pod_snapshots_pods_are_detected_in_that_mode_once_in_gvisor(
    upstream_control_plane: ControlPlane, kinds: dict[str, str], namespace: str
) -> None:
    from jupyter_pause.backends.workspace_modes import NO_SNAPSHOTS, POD_SNAPSHOTS

    plane, mode = upstream_control_plane, "pod-snapshots"
    # Given the shipped policy in the namespace, and two Workspaces of the pod-snapshots kind
    plane.apply_file(mode_file(mode, "podsnapshot-policy.yaml"), NAMESPACE=namespace)
    for name in ("a", "b"):
        create_workspace(plane, namespace, name, mode)
        install_workspace_rbac(plane, mode, namespace, name)

    # When A's pod runs in gVisor (what gvisor-admission-policy.yaml does on GKE >= 1.36: here
    # the test sets runtimeClassName, as 1.20 has no admission policies) and B's does not
    pod = create_pod(
        plane, namespace, "ws-a-x1y2z-0", pod_labels(mode, "a"), "ws-a", runtime_class="gvisor"
    )
    outside = create_pod(plane, namespace, "ws-b-x1y2z-0", pod_labels(mode, "b"), "ws-b")

    # Then the RuntimeClass gave A's pod GKE Sandbox's node selector (the kind sets none)
    assert pod["spec"]["nodeSelector"] == {"sandbox.gke.io/runtime": "gvisor"}
    # and A's server, with A's rights only, takes pod snapshots through the shipped policy
    choice = detect(plane, namespace, pod, "a")
    assert choice.name == POD_SNAPSHOTS, choice
    assert choice.policy is not None and choice.policy["metadata"]["name"] == "jupyter-pause"
    # while B's says it cannot be snapshotted outside gVisor, and names the fix
    choice = detect(plane, namespace, outside, "b")
    assert choice.name == NO_SNAPSHOTS
    assert "does not run in GKE Sandbox" in choice.why


def test_no_snapshots_pods_are_detected_in_that_mode_beside_a_snapshot_policy(
    upstream_control_plane: ControlPlane, kinds: dict[str, str], namespace: str
) -> None:
    from jupyter_pause.backends.workspace_modes import NO_SNAPSHOTS

    plane, mode = upstream_control_plane, "no-snapshots"
    # Given a namespace with the pod-snapshots policy too, and a no-snapshots Workspace
    plane.apply_file(mode_file("pod-snapshots", "podsnapshot-policy.yaml"), NAMESPACE=namespace)
    create_workspace(plane, namespace, "a", mode)
    install_workspace_rbac(plane, mode, namespace, "a")

    # When its pod is created
    pod = create_pod(plane, namespace, "ws-a-x1y2z-0", pod_labels(mode, "a"), "ws-a")

    # Then no policy selects it, and its server says so (it may look: no verb to ask for)
    choice = detect(plane, namespace, pod, "a")
    assert choice.name == NO_SNAPSHOTS
    assert f"no PodSnapshotPolicy in namespace {namespace} selects this pod" in choice.why


# -- the MutatingAdmissionPolicy (Kubernetes 1.36) -------------------------------------------------
def selector_string(selector: dict[str, Any]) -> str:
    """A LabelSelector as the ``labelSelector`` query parameter the API server evaluates."""
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = ",".join(expression.get("values") or [])
        terms.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }[operator]
        )
    return ",".join(terms)


def test_the_gvisor_admission_policy_is_kubernetes_1_36s_api_and_selects_the_workspace_pods(
    upstream_control_plane: ControlPlane, namespace: str
) -> None:
    from kubernetes import client

    plane = upstream_control_plane
    # Given the shipped policy and its binding
    policy, binding = documents(GVISOR_POLICY)

    # Then this API server (1.20) cannot take them: it serves no MutatingAdmissionPolicy
    with plane.admin.api_client() as api:
        served = client.AdmissionregistrationV1Api(api).get_api_resources().resources
    assert "mutatingadmissionpolicies" not in {r.name for r in served}
    assert "mutatingwebhookconfigurations" in {r.name for r in served}  # the listing works

    # And each is, field for field, Kubernetes 1.36's admissionregistration.k8s.io/v1 object
    # (the client's models of that API: a misspelt or unknown field would be dropped, a
    # missing required one refused)
    models = {
        "MutatingAdmissionPolicy": "V1MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding": "V1MutatingAdmissionPolicyBinding",
    }
    api = client.ApiClient()
    for document in (policy, binding):
        assert document["apiVersion"] == "admissionregistration.k8s.io/v1"
        model = api.deserialize(json.dumps(document), models[document["kind"]], "application/json")
        assert api.sanitize_for_serialization(model) == document
    assert binding["spec"] == {"policyName": policy["metadata"]["name"]}
    spec = policy["spec"]
    # pods, at their creation, whatever the namespace (a profile's)
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    assert "namespaceSelector" not in spec["matchConstraints"]
    # set runtimeClassName: gvisor (the only mutation); a failing policy never blocks a pod
    (mutation,) = spec["mutations"]
    assert mutation["patchType"] == "ApplyConfiguration"
    expression = " ".join(mutation["applyConfiguration"]["expression"].split())
    assert expression == 'Object{spec: Object.spec{runtimeClassName: "gvisor"}}'
    assert spec["failurePolicy"] == "Ignore"

    # When the pods each shipped WorkspaceKind makes, and a pod of no Workspace with the
    # same label, are in a namespace
    pods = {
        "pod-snapshots": pod_labels("pod-snapshots", "a"),
        "no-snapshots": pod_labels("no-snapshots", "b"),
        "gke-workspaces": pod_labels("gke-workspaces", "c"),
        "no workspace": {"jupyter-pause.io/snapshots": "manual"},
    }
    for number, labels in enumerate(pods.values()):
        with plane.admin.api_client() as admin:
            client.CoreV1Api(admin).create_namespaced_pod(
                namespace,
                {
                    "metadata": {"name": f"pod-{number}", "labels": labels},
                    "spec": {
                        "automountServiceAccountToken": False,  # its Secret may not exist yet
                        "containers": [{"name": "main", "image": "x"}],
                    },
                },
            )

    # Then the API server selects with the policy's objectSelector the pod-snapshots kind's
    # pod alone (which the shipped PodSnapshotPolicy snapshots too)
    def selected(selector: dict[str, Any]) -> set[str]:
        with plane.admin.api_client() as admin:
            listed = client.CoreV1Api(admin).list_namespaced_pod(
                namespace, label_selector=selector_string(selector)
            )
        names = {p.metadata.name for p in listed.items}
        return {what for number, what in enumerate(pods) if f"pod-{number}" in names}

    assert selected(spec["matchConstraints"]["objectSelector"]) == {"pod-snapshots"}
    (snapshot_policy,) = documents(
        mode_file("pod-snapshots", "podsnapshot-policy.yaml"), NAMESPACE=namespace
    )
    assert "pod-snapshots" in selected(snapshot_policy["spec"]["selector"])
    assert not {"no-snapshots", "gke-workspaces"} & selected(snapshot_policy["spec"]["selector"])


# -- kernel pods on Kubeflow: the CPU server's kind, its rights, the kernel pod template ---------
def kernel_pods_kind() -> dict[str, Any]:
    (kind,) = documents(KUBEFLOW / "workspacekind.yaml")
    return kind


def kind_env(kind: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in kind["spec"]["podTemplate"]["extraEnv"]}


def expand(value: str, env: dict[str, str]) -> str:
    """An env value as the kubelet makes it: ``$(NAME)`` of a variable defined before it."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)


def access(plane: ControlPlane, namespace: str, account: str) -> set[tuple[str, str, str]]:
    """What the API server says ``account`` may do (its own token, SelfSubjectAccessReview):
    (namespace, verb, resource) over pods and a few others, here and in ``default``."""
    from kubernetes import client

    allowed = set()
    token = service_account_token(plane, namespace, account)
    with plane.credentials(token).api_client() as api:
        authorization = client.AuthorizationV1Api(api)
        for where in (namespace, "default"):
            for group, resource in (
                ("", "pods"),
                ("", "secrets"),
                ("kubeflow.org", "workspaces"),
                ("podsnapshot.gke.io", "podsnapshots"),
            ):
                for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
                    attributes = {"namespace": where, "verb": verb, "group": group}
                    attributes["resource"] = resource
                    review = authorization.create_self_subject_access_review(
                        {"spec": {"resourceAttributes": attributes}}
                    )
                    if review.status.allowed:
                        allowed.add((where, verb, resource))
    return allowed


def test_the_kernel_pods_kind_is_a_cpu_server_with_the_kernel_pod_rbacs_rights(
    upstream_control_plane: ControlPlane, namespace: str
) -> None:
    from kubernetes import client

    plane = upstream_control_plane
    kind = kernel_pods_kind()
    template = kind["spec"]["podTemplate"]
    # Given the shipped kind: its pods ask no GPU (the kernel pods do, from their kernelspec)
    for option in template["options"]["podConfig"]["values"]:
        assert "nvidia.com/gpu" not in json.dumps(option["spec"]), option["id"]
    # and its server runs the kernel-pod backend, in the kernels' namespace, storing on home
    config = json.loads((KUBEFLOW / "jupyter_server_config.json").read_text())
    assert config["PauseApp"]["backend"] == "kernel-pod"
    env = kind_env(kind)
    assert env["KERNEL_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    home = template["volumeMounts"]["home"]
    assert Path(env["JUPYTER_PAUSE_STORE"]["value"]).is_relative_to(home)
    # and its ClusterRole has exactly the rules of the kernel pods' Role
    (cluster_role,) = documents(KUBEFLOW / "clusterrole.yaml")
    role, _ = documents(KERNEL_PODS / "rbac.yaml", NAMESPACE="x", SERVICE_ACCOUNT="y")
    assert cluster_role["rules"] == role["rules"]
    assert template["serviceAccount"] == {
        "clusterRoles": [{"name": cluster_role["metadata"]["name"]}]
    }

    # When a Workspace's account is bound as the Notebooks controller binds it (a RoleBinding
    # in its namespace per ClusterRole of its kind), and another account gets rbac.yaml
    create_once(plane, KUBEFLOW / "clusterrole.yaml")
    create_once(plane, KUBEFLOW / "workspacekind.yaml")
    with plane.admin.api_client() as api:
        core = client.CoreV1Api(api)
        for account in ("ws-lab", "jupyter-server"):
            core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
        for entry in template["serviceAccount"]["clusterRoles"]:
            client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
                namespace,
                {
                    "metadata": {"name": f"ws-lab-{entry['name']}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": entry["name"],
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": "ws-lab", "namespace": namespace}
                    ],
                },
            )
    plane.apply_file(
        KERNEL_PODS / "rbac.yaml", NAMESPACE=namespace, SERVICE_ACCOUNT="jupyter-server"
    )

    # Then the API server gives the Workspace's account exactly rbac.yaml's rights: pods and
    # their snapshots in its namespace, nothing elsewhere
    workspace_rights = access(plane, namespace, "ws-lab")
    assert workspace_rights == {
        *(
            (namespace, verb, "pods")
            for verb in ("create", "delete", "get", "list", "watch", "patch")
        ),
        *((namespace, verb, "podsnapshots") for verb in ("get", "delete")),
    }
    assert workspace_rights == access(plane, namespace, "jupyter-server")

    # And the server pod the kind makes (its env, with the downward API's fields) is accepted,
    # the Workspace's name read from the label the controller gives its pod
    (option,) = template["options"]["podConfig"]["values"]
    with plane.admin.api_client() as api:
        core = client.CoreV1Api(api)
        body = {
            "metadata": {"name": "ws-lab-x1y2z-0", "labels": {WORKSPACE_LABEL: "lab"}},
            "spec": {
                "serviceAccountName": "ws-lab",
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "main",
                        "image": "REGISTRY/jupyterlab-pause-kernel-pods:0.1.0",
                        "env": template["extraEnv"],
                        "resources": option["spec"]["resources"],
                    }
                ],
            },
        }
        core.create_namespaced_pod(namespace, body)
        stored = api.sanitize_for_serialization(
            core.read_namespaced_pod(body["metadata"]["name"], namespace)
        )
    assert (
        not_kept(body["spec"]["containers"][0]["env"], stored["spec"]["containers"][0]["env"]) == []
    )


@pytest.fixture
def launcher(tmp_path: Path) -> Any:
    """gateway-provisioners' ``launch_kubernetes.py`` beside our template, installed by the
    shipped script as in the server's image: its ``generate_kernel_pod_yaml`` renders the pod."""
    pytest.importorskip("gateway_provisioners", reason="the kernel pod template's launcher")
    installed = subprocess.run(
        ["sh", str(KERNEL_PODS / "install-kernelspec.sh"), str(tmp_path / "kernels")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    script = Path(installed.stdout.strip()) / "scripts" / "launch_kubernetes.py"
    spec = importlib.util.spec_from_file_location("launch_kubernetes_under_test", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render_kernel_pod(launcher: Any, env: dict[str, str]) -> list[dict[str, Any]]:
    """The launcher's rendering: every KERNEL_* value of the kernel's environment, read as YAML
    and lower-cased, as ``launch_kubernetes_kernel`` passes them; the documents of the result."""
    keywords = {k.lower(): yaml.safe_load(v) for k, v in env.items() if k.startswith("KERNEL_")}
    return [d for d in yaml.safe_load_all(launcher.generate_kernel_pod_yaml(keywords)) if d]


def kernel_env(namespace: str, name: str, **more: str) -> dict[str, str]:
    """What the provisioner puts in a kernel's environment for the launcher (its pod's name,
    namespace, account, ids, image) and the kernelspec's KERNEL_GPUS."""
    return {
        "KERNEL_ID": f"{name}-id",
        "KERNEL_POD_NAME": name,
        "KERNEL_NAMESPACE": namespace,
        "KERNEL_SERVICE_ACCOUNT_NAME": "default",
        "KERNEL_UID": "1000",
        "KERNEL_GID": "100",
        "KERNEL_IMAGE": "REGISTRY/jupyter-pause-kernel:0.1.0",
        "KERNEL_NAME": "python-gpu-pod",
        "KERNEL_GPUS": "1",
        "KERNEL_GPUS_LIMIT": "1",
        **more,
    }


def create_stored(plane: ControlPlane, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    from kubernetes import client

    with plane.admin.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, pod)
        return api.sanitize_for_serialization(
            core.read_namespaced_pod(pod["metadata"]["name"], namespace)
        )


def test_the_kernel_pod_mounts_the_kinds_kernel_volumes_in_a_pod_the_api_server_accepts(
    upstream_control_plane: ControlPlane, namespace: str, launcher: Any
) -> None:
    # Given the kind's KERNEL_VOLUMES / KERNEL_VOLUME_MOUNTS as the server's pod has them (the
    # kubelet expanded $(WORKSPACE_NAME)), plus volumes of a user's own: shared memory, and a
    # data set read-only (a boolean through the template)
    env = kind_env(kernel_pods_kind())
    server = {"WORKSPACE_NAME": "lab"}
    names = list(env)  # the kubelet expands $(NAME) of a variable defined earlier only
    assert names.index("WORKSPACE_NAME") < names.index("KERNEL_VOLUMES")
    volumes = yaml.safe_load(expand(env["KERNEL_VOLUMES"]["value"], server))
    mounts = yaml.safe_load(expand(env["KERNEL_VOLUME_MOUNTS"]["value"], server))
    volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
    mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    volumes.append(
        {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
    )
    mounts.append({"name": "data", "mountPath": "/data", "readOnly": True})

    # When the launcher renders the kernel pod with them, and it is created in the namespace
    (pod,) = render_kernel_pod(
        launcher,
        kernel_env(
            namespace,
            "kernel-volumes",
            KERNEL_VOLUMES=json.dumps(volumes),
            KERNEL_VOLUME_MOUNTS=yaml.safe_dump(mounts, default_flow_style=True),
        ),
    )
    stored = create_stored(upstream_control_plane, namespace, pod)

    # Then the API server kept the pod as rendered: the Workspace's home PVC and the user's
    # volume, mounted in the kernel's container where the server has them
    assert not_kept(pod, stored) == []
    assert stored["spec"]["volumes"] == [
        {"name": "home", "persistentVolumeClaim": {"claimName": "lab-home"}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
    ]
    (container,) = stored["spec"]["containers"]
    assert [(m["name"], m["mountPath"], m.get("readOnly")) for m in container["volumeMounts"]] == [
        ("home", "/home/jovyan", None),
        ("shm", "/dev/shm", None),
        ("data", "/data", True),
    ]
    # and the checkpoint store the server uses is on the mounted home volume
    store = Path(env["JUPYTER_PAUSE_STORE"]["value"])
    assert store.is_relative_to(container["volumeMounts"][0]["mountPath"])
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}


@pytest.mark.parametrize("volumes", [None, "[]"], ids=["unset", "empty"])
def test_the_kernel_pod_without_kernel_volumes_has_none_and_is_accepted(
    upstream_control_plane: ControlPlane, namespace: str, launcher: Any, volumes: str | None
) -> None:
    # Given a kernel's environment without volumes (unset, or empty lists)
    more = {} if volumes is None else {"KERNEL_VOLUMES": volumes, "KERNEL_VOLUME_MOUNTS": volumes}
    # When the launcher renders its pod
    (pod,) = render_kernel_pod(launcher, kernel_env(namespace, "kernel-plain", **more))
    # Then it is one Pod with neither volumes nor mounts, which the API server accepts as it is
    assert pod["kind"] == "Pod" and "volumes" not in pod["spec"]
    assert "volumeMounts" not in pod["spec"]["containers"][0]
    stored = create_stored(upstream_control_plane, namespace, pod)
    assert not_kept(pod, stored) == []
    assert not stored["spec"].get("volumes")
    assert not stored["spec"]["containers"][0].get("volumeMounts")


def test_the_deploy_readme_names_every_shipped_file() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md"):
        assert str(path.relative_to(DEPLOY)) in readme, path
