"""The shipped ``deploy/`` manifests as the tests install them: read with their placeholders
filled (as the README's ``envsubst`` does), compared with what the API server kept, and a
Workspace's RBAC installed the way a cluster gets it (``install_workspace_rbac``): the mode's
ClusterRole once, the Notebooks controller's part (the Workspace's ServiceAccount ``ws-NAME``
and a RoleBinding for each ClusterRole its WorkspaceKind names), and the admin's part (the
mode's ``rbac-workspace.yaml`` stamped for that Workspace).

Used by ``test_deploy.py``; the players can install a Workspace's RBAC with it too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .control_plane import AUDIENCE, ControlPlane

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MODES = ("gke-workspaces", "pod-snapshots", "no-snapshots")
WORKSPACE_LABEL = "notebooks.kubeflow.org/workspace-name"
#: The add-on's source, carried in gke-addon/: where its IPC config for Jupyter is written.
ADDON_SNAPSHOT_GO = Path(__file__).resolve().parent / "gke-addon/internal/snapshot/snapshot.go"


def mode_file(mode: str, name: str) -> Path:
    return DEPLOY / "modes" / mode / name


def documents(path: Path, **values: str) -> list[dict[str, Any]]:
    """The objects of a manifest, ``${NAME}`` placeholders filled as ``apply_file`` fills them."""
    text = path.read_text()
    for name, value in values.items():
        text = text.replace("${" + name + "}", value)
    left = re.findall(r"\$\{[A-Z_]+\}", text)
    assert not left, f"{path}: placeholders left unfilled: {left}"
    return [d for d in yaml.safe_load_all(text) if d]


def workspace_kind(mode: str) -> dict[str, Any]:
    (kind,) = documents(mode_file(mode, "workspacekind.yaml"))
    return kind


def pod_labels(mode: str, workspace: str) -> dict[str, str]:
    """The labels the Notebooks controller gives a Workspace's pod: its kind's podMetadata
    labels, then its own (``notebooks.kubeflow.org/workspace-name``, ``statefulset``)."""
    metadata = workspace_kind(mode)["spec"]["podTemplate"].get("podMetadata") or {}
    return {**(metadata.get("labels") or {}), WORKSPACE_LABEL: workspace, "statefulset": workspace}


def addon_ipc_config() -> str:
    """The ``jupyter_server_config.py`` the GKE Workspaces add-on mounts into the pods it
    snapshots, read from its source (``const jupyterIPCServerConfig``)."""
    source = ADDON_SNAPSHOT_GO.read_text()
    found = re.search(r"const jupyterIPCServerConfig = `([^`]*)`", source)
    assert found, f"{ADDON_SNAPSHOT_GO} no longer defines jupyterIPCServerConfig"
    return found.group(1)


def not_kept(shipped: Any, stored: Any, where: str = "") -> list[str]:
    """Where ``stored`` lacks or changed what ``shipped`` says (the API server prunes a field its
    schema does not know, and may add defaults: those are not differences)."""
    if isinstance(shipped, dict):
        if not isinstance(stored, dict):
            return [f"{where or '.'}: {stored!r} instead of an object"]
        return [
            problem
            for key, value in shipped.items()
            for problem in (
                not_kept(value, stored[key], f"{where}.{key}")
                if key in stored
                else [f"{where}.{key}: dropped"]
            )
        ]
    if isinstance(shipped, list):
        if not isinstance(stored, list) or len(stored) != len(shipped):
            return [f"{where}: {stored!r} instead of {shipped!r}"]
        return [
            problem
            for i, (mine, theirs) in enumerate(zip(shipped, stored, strict=True))
            for problem in not_kept(mine, theirs, f"{where}[{i}]")
        ]
    return [] if shipped == stored else [f"{where}: {stored!r} instead of {shipped!r}"]


def create_once(plane: ControlPlane, path: Path, **values: str) -> list[dict[str, Any]]:
    """``apply_file``, where an object that already exists (a cluster-scoped one, made by an
    earlier test) is fine."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.utils import FailToCreateError

    done = []
    for document in documents(path, **values):
        single = plane.workdir / "one-manifest.yaml"
        single.write_text(yaml.safe_dump(document))
        try:
            plane.apply_file(single)
        except ApiException as err:
            if err.status != 409:
                raise
        except FailToCreateError as err:
            if any(e.status != 409 for e in err.api_exceptions):
                raise
        done.append(document)
    return done


def service_account_token(plane: ControlPlane, namespace: str, account: str) -> str:
    """A token of the ServiceAccount, as the kubelet mounts one into its pods (TokenRequest)."""
    from kubernetes import client

    with plane.admin.api_client() as api:
        answer = client.CoreV1Api(api).create_namespaced_service_account_token(
            account,
            namespace,
            client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
            ),
        )
    return answer.status.token


def install_workspace_rbac(plane: ControlPlane, mode: str, namespace: str, workspace: str) -> None:
    """A Workspace's RBAC in ``mode``: the ClusterRole (once per cluster); the Notebooks
    controller's ServiceAccount ``ws-WORKSPACE`` and its RoleBinding to each ClusterRole the
    mode's WorkspaceKind names (``podTemplate.serviceAccount.clusterRoles``, bound in the
    Workspace's namespace only); and ``rbac-workspace.yaml`` stamped for it, as an admin does."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    create_once(plane, mode_file(mode, "clusterrole.yaml"))
    account = f"ws-{workspace}"
    roles = workspace_kind(mode)["spec"]["podTemplate"]["serviceAccount"]["clusterRoles"]
    with plane.admin.api_client() as api:
        try:
            client.CoreV1Api(api).create_namespaced_service_account(
                namespace, {"metadata": {"name": account}}
            )
        except ApiException as err:
            if err.status != 409:
                raise
        for role in roles:
            client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
                namespace,
                {
                    "metadata": {
                        "name": f"{account}-{role['name']}"[:63],
                        "labels": {WORKSPACE_LABEL: workspace},
                    },
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": role["name"],
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
                    ],
                },
            )
    plane.apply_file(
        mode_file(mode, "rbac-workspace.yaml"), NAMESPACE=namespace, WORKSPACE=workspace
    )
