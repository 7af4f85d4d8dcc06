"""The Kubernetes calls of the workspace backend and of ``jupyter pause --workspace``.

Only the API objects this project touches, through the official ``kubernetes`` client: a pod
(its own, or a workspace's), a Kubeflow ``Workspace`` (``kubeflow.org/v1beta1``), and the GKE
Pod Snapshot objects (``podsnapshot.gke.io/v1``). The calls are synchronous: the backend runs
them on worker threads. Answers are plain JSON dicts. Every failure is a ``KubeError`` whose
message names what is missing, in words an admin can act on: the RBAC verb and resource, the
CRD, the quota, or the API server that cannot be reached.

Connection: in a pod, the service account's token and CA (a directory, configurable so a test
"pod" can point at a test API server) and ``KUBERNETES_SERVICE_HOST``/``_PORT``; outside, a
kubeconfig.
"""

from __future__ import annotations

import calendar
import datetime
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import BackendError

#: Where Kubernetes mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: The label the Kubeflow Workspace controller puts on a workspace's pod.
WORKSPACE_LABEL = "notebooks.kubeflow.org/workspace-name"
#: Pod annotation (at creation) naming the PodSnapshot GKE must restore the pod from.
PIN_ANNOTATION = "podsnapshot.gke.io/ps-name"
#: Label GKE puts on a PodSnapshot made by a manual trigger: the trigger's name.
TRIGGERED_BY_LABEL = "gke-pod-snapshot-triggered-by"
#: Workspace annotation where jupyter_pause records the last pause/restore (read by the CLI).
STATE_ANNOTATION = "jupyter-pause.io/state"
#: Seconds a call may take to connect, then to answer.
TIMEOUT = (5.0, 30.0)


@dataclass(frozen=True)
class Resource:
    """A kind of API object, as RBAC and CRDs name it."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str

    @property
    def qualified(self) -> str:
        """``workspaces.kubeflow.org`` (the CRD's name), or ``pods`` for the core group."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = Resource("", "v1", "pods", "Pod")
WORKSPACES = Resource("kubeflow.org", "v1beta1", "workspaces", "Workspace")
POLICIES = Resource("podsnapshot.gke.io", "v1", "podsnapshotpolicies", "PodSnapshotPolicy")
TRIGGERS = Resource(
    "podsnapshot.gke.io", "v1", "podsnapshotmanualtriggers", "PodSnapshotManualTrigger"
)
SNAPSHOTS = Resource("podsnapshot.gke.io", "v1", "podsnapshots", "PodSnapshot")


class KubeError(BackendError):
    """A Kubernetes call failed; ``kind`` says how (forbidden, missing-crd, unreachable, ...)."""

    def __init__(self, message: str, kind: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def _explain(err: Any, verb: str, resource: Resource, namespace: str, name: str) -> KubeError:
    """A client exception as a KubeError naming what to fix."""
    status = getattr(err, "status", None)
    if status is None or status == 0:  # urllib3: no HTTP answer at all
        reason = getattr(err, "reason", None) or err
        return KubeError(f"the Kubernetes API server cannot be reached ({reason})", "unreachable")
    try:
        body = json.loads(getattr(err, "body", None) or "{}")
    except ValueError:
        body = {}
    message = body.get("message") or getattr(err, "reason", "") or f"HTTP {status}"
    where = f" in namespace {namespace}" if namespace else ""
    what = f"{resource.qualified} {name!r}" if name else resource.qualified
    if status == 401:
        return KubeError(
            f"the API server refused the credentials ({message}): the service-account "
            "token is missing, expired or revoked",
            "unauthorized",
            status,
        )
    if status == 403 and "exceeded quota" in message:
        return KubeError(
            f"a ResourceQuota{where} refuses to {verb} {what}: {message}", "quota", 403
        )
    if status == 403:
        group = f' in API group "{resource.group}"' if resource.group else ""
        return KubeError(
            f'forbidden: RBAC does not allow the verb "{verb}" on "{resource.plural}"{group}'
            f"{where} ({message}); grant it as shipped: for the server in a workspace, its "
            "mode's deploy/modes/<mode>/clusterrole.yaml and rbac-workspace.yaml; for "
            "jupyter pause --workspace, deploy/rbac-user.yaml; for kernel pods, "
            "deploy/kernel-pods/rbac.yaml",
            "forbidden",
            403,
        )
    if status == 404 and not (body.get("details") or {}).get("name"):
        # The URL itself is unknown: the resource type does not exist on this cluster.
        return KubeError(
            f"the API server does not serve {resource.kind} ({resource.group}/"
            f"{resource.version}): the CRD {resource.qualified} is not installed",
            "missing-crd",
            404,
        )
    if status == 404:
        return KubeError(f"{what} not found{where}", "not-found", 404)
    if status == 409:
        return KubeError(f"{what} already exists{where} ({message})", "conflict", 409)
    if status == 422:
        return KubeError(f"the API server rejected {what}: {message}", "invalid", 422)
    return KubeError(f"{verb} {what}{where} failed: HTTP {status}: {message}", "other", status)


class Kube:
    """The API calls jupyter_pause makes, on one ``kubernetes.client.ApiClient``."""

    def __init__(
        self,
        api_client: Any,
        namespace: str | None = None,
        where: str = "",
        reload_token: Callable[[], None] | None = None,
    ) -> None:
        from kubernetes import client

        self.api_client = api_client
        # Re-read a rotated service-account token now (after a 401), not a minute later.
        self.reload_token = reload_token
        self.namespace = namespace  # the default namespace (the pod's, or the kubeconfig's)
        self.where = where or api_client.configuration.host  # for messages: which cluster
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    # -- connecting -------------------------------------------------------------------------------
    @classmethod
    def in_cluster(
        cls,
        service_account_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Kube:
        """As a pod sees the cluster: its service account and ``KUBERNETES_SERVICE_HOST``."""
        from kubernetes import client
        from kubernetes.config.config_exception import ConfigException
        from kubernetes.config.incluster_config import InClusterConfigLoader

        folder = Path(service_account_dir or SERVICE_ACCOUNT_DIR)
        configuration = client.Configuration()
        loader = InClusterConfigLoader(
            token_filename=str(folder / "token"),
            cert_filename=str(folder / "ca.crt"),
            environ=dict(os.environ if environ is None else environ),
        )
        try:
            loader.load_and_set(configuration)  # re-reads the token file as it rotates
        except ConfigException as err:
            raise KubeError(
                f"no in-cluster configuration ({err}; service account folder {folder})",
                "unconfigured",
            ) from None
        namespace = None
        namespace_file = folder / "namespace"
        if namespace_file.is_file():
            namespace = namespace_file.read_text().strip() or None

        def reload_token() -> None:
            loader.token_expires_at = datetime.datetime.min  # read again at the next call

        return cls(client.ApiClient(configuration), namespace, reload_token=reload_token)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> Kube:
        """As ``kubectl`` sees the cluster: ``$KUBECONFIG`` or ``~/.kube/config``."""
        from kubernetes import config
        from kubernetes.config.config_exception import ConfigException

        try:
            api_client = config.new_client_from_config(config_file=path, context=context)
            _contexts, current = config.list_kube_config_contexts(config_file=path)
        except (ConfigException, OSError) as err:
            raise KubeError(f"no usable kubeconfig ({err})", "unconfigured") from None
        if context is not None:
            current = next((c for c in _contexts if c["name"] == context), current)
        namespace = ((current or {}).get("context") or {}).get("namespace")
        return cls(api_client, namespace or "default")

    def close(self) -> None:
        self.api_client.close()

    # -- calls ------------------------------------------------------------------------------------
    def _call(
        self, verb: str, resource: Resource, namespace: str, name: str, call: Callable[[], Any]
    ) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            try:
                answer = call()
            except ApiException as err:
                if err.status != 401 or self.reload_token is None:
                    raise
                self.reload_token()  # a pod restored from a snapshot has a new token file
                answer = call()
        except ApiException as err:
            raise _explain(err, verb, resource, namespace, name) from None
        except (HTTPError, OSError) as err:
            raise KubeError(
                f"the Kubernetes API server at {self.where} cannot be reached ({err})",
                "unreachable",
            ) from None
        data = answer.data if hasattr(answer, "data") else answer
        return json.loads(data) if data else {}

    def _custom(
        self, verb: str, resource: Resource, namespace: str, name: str = "", **kw: Any
    ) -> Any:
        """One call on a custom resource: ``verb`` is the RBAC verb (get, list, create, ...)."""
        common = {
            "group": resource.group,
            "version": resource.version,
            "namespace": namespace,
            "plural": resource.plural,
            "_preload_content": False,
            "_request_timeout": TIMEOUT,
        }
        method = {
            "get": self.custom.get_namespaced_custom_object,
            "list": self.custom.list_namespaced_custom_object,
            "create": self.custom.create_namespaced_custom_object,
            "patch": self.custom.patch_namespaced_custom_object,
            "delete": self.custom.delete_namespaced_custom_object,
        }[verb]
        if name and verb != "create":  # a create names its object in the body
            common["name"] = name
        return self._call(verb, resource, namespace, name, lambda: method(**common, **kw))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(
            "get",
            PODS,
            namespace,
            name,
            lambda: self.core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=TIMEOUT
            ),
        )

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        answer = self._call(
            "list",
            PODS,
            namespace,
            "",
            lambda: self.core.list_namespaced_pod(
                namespace,
                label_selector=label_selector,
                _preload_content=False,
                _request_timeout=TIMEOUT,
            ),
        )
        return answer.get("items") or []

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
        """A merge patch of a pod's labels (the kernel-pod backend's snapshot label)."""
        return self._call(
            "patch",
            PODS,
            namespace,
            name,
            lambda: self.core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": {"labels": labels}},
                _preload_content=False,
                _request_timeout=TIMEOUT,
            ),
        )

    def get_workspace(self, namespace: str, name: str) -> dict[str, Any]:
        return self._custom("get", WORKSPACES, namespace, name)

    def patch_workspace(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (``null`` removes a key) of a Workspace."""
        return self._custom(
            "patch",
            WORKSPACES,
            namespace,
            name,
            body=patch,
            _content_type="application/merge-patch+json",
        )

    def watch_workspace(
        self, namespace: str, name: str, seconds: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """A Workspace's changes, as ``(event type, object)``, for up to ``seconds`` (the API
        server then ends the watch): its state now first (``ADDED``), then each change. A
        watch by name, so RBAC's ``watch`` on that one Workspace (``resourceNames``) is enough.
        Blocks between events: run it on a thread of its own."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        stream = watch.Watch().stream(
            self.custom.list_namespaced_custom_object,
            WORKSPACES.group,
            WORKSPACES.version,
            namespace,
            WORKSPACES.plural,
            field_selector=f"metadata.name={name}",
            timeout_seconds=seconds,
            deserialize=False,
            _request_timeout=(TIMEOUT[0], seconds + TIMEOUT[1]),
        )
        try:
            for event in stream:
                yield event.get("type", ""), event.get("object") or {}
        except ApiException as err:
            if err.status == 401 and self.reload_token is not None:
                self.reload_token()  # a pod restored from a snapshot has a new token file
            raise _explain(err, "watch", WORKSPACES, namespace, name) from None
        except (HTTPError, OSError) as err:
            raise KubeError(
                f"the Kubernetes API server at {self.where} cannot be reached ({err})",
                "unreachable",
            ) from None
        finally:
            stream.close()

    def list_policies(self, namespace: str) -> list[dict[str, Any]]:
        return self._custom("list", POLICIES, namespace).get("items") or []

    def create_trigger(
        self, namespace: str, name: str, pod: str, labels: dict[str, str]
    ) -> dict[str, Any]:
        body = {
            "apiVersion": f"{TRIGGERS.group}/{TRIGGERS.version}",
            "kind": TRIGGERS.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"targetPod": pod},
        }
        return self._custom("create", TRIGGERS, namespace, name, body=body)

    def get_trigger(self, namespace: str, name: str) -> dict[str, Any]:
        return self._custom("get", TRIGGERS, namespace, name)

    def get_snapshot(self, namespace: str, name: str) -> dict[str, Any]:
        return self._custom("get", SNAPSHOTS, namespace, name)

    def list_snapshots(self, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        extra = {"label_selector": label_selector} if label_selector else {}
        return self._custom("list", SNAPSHOTS, namespace, **extra).get("items") or []

    def delete_snapshot(self, namespace: str, name: str) -> None:
        self._custom("delete", SNAPSHOTS, namespace, name)

    def delete_trigger(self, namespace: str, name: str) -> None:
        self._custom("delete", TRIGGERS, namespace, name)


# -- reading objects --------------------------------------------------------------------------------
def epoch(stamp: str | None) -> float | None:
    """An RFC 3339 time of the API server (``2024-01-01T10:00:00Z``) as a Unix time."""
    if not stamp:
        return None
    try:
        return float(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind`` of an object, or None."""
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(entry, dict) and entry.get("type") == kind:
            return entry
    return None


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels + matchExpressions) selects ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))


def gpu_limit(pod: Mapping[str, Any], resource: str = "nvidia.com/gpu") -> int:
    """Accelerators the pod's containers are given (their limits; requests when no limit)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(resource) or (
            resources.get("requests") or {}
        ).get(resource)
        try:
            total += int(value or 0)
        except (TypeError, ValueError):
            continue
    return total
