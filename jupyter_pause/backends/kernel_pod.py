"""Kernel pods, the plain part: what a kernel pod's state says, and errors people can read.

The ``kernel-pod`` backend keeps JupyterLab on a small CPU pod and runs each GPU kernel as a pod
of its own, launched by Jupyter's own Kubernetes provisioner (gateway-provisioners'
``KubernetesProvisioner``, subclassed in ``kernel_pod_provisioner.py``). A pause deletes the
kernel's pod after its application checkpoint, so the GPU goes back while the kernel keeps its id;
a resume creates the pod again under that id, and waits, saying why, while the scheduler has no
GPU for it.

This module imports neither gateway-provisioners nor the Kubernetes client: the server can read
these answers (and the tests check them) where the optional backend is not installed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: What the kernel-pod backend needs beyond jupyter_pause (``pip install jupyter_pause[kernel-pods]``).
INSTALL_HINT = "pip install 'gateway-provisioners[k8s]==0.4.0'"

#: Variables of the server's environment that go on to the launcher and into the kernel pod.
#: gateway-provisioners' launcher copies its whole environment into the pod's container: the
#: server's PATH, HOME or tokens would override the kernel image's and leak into the pod spec.
#: ``KERNEL_*`` are the provisioners' template values, ``JUPYTER_PAUSE_*`` the admin's policy and
#: the store, ``JPY_SESSION_NAME`` the notebook; ``KUBECONFIG`` and ``KUBERNETES_SERVICE_*`` are
#: how the launcher reaches the API server (outside a pod, in one).
FORWARDED_PREFIXES = (
    "KERNEL_",
    "JUPYTER_PAUSE_",
    "JPY_SESSION_NAME",
    "KUBECONFIG",
    "KUBERNETES_SERVICE_",
)


class KernelPodError(RuntimeError):
    """A kernel pod could not be made, found or deleted; the message says what and why."""


def launcher_env(env: Mapping[str, str], kernelspec_env: Iterable[str] = ()) -> dict[str, str]:
    """The part of ``env`` the launcher and the kernel pod get: ``FORWARDED_PREFIXES`` and the
    variables the kernelspec itself sets (an admin's choice for that kernel)."""
    keep = set(kernelspec_env)
    return {k: v for k, v in env.items() if k in keep or k.startswith(FORWARDED_PREFIXES)}


def unschedulable_reason(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message while ``pod`` (a pod as JSON) waits for room, None otherwise.

    A pod waits while it is ``Pending`` with ``PodScheduled`` False for ``Unschedulable``; the
    message is the scheduler's own, e.g. ``0/2 nodes are available: 2 Insufficient
    nvidia.com/gpu.``"""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending":
        return None
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return condition.get("message") or "the scheduler found no node for the kernel pod"
    return None


def api_error(action: str, namespace: str, status: int | None, detail: str) -> KernelPodError:
    """A clear error for a failed API call: what was tried, where, and what to do about it."""
    where = f"in namespace {namespace!r}"
    if status in (401, 403):
        return KernelPodError(
            f"could not {action} {where}: the server's service account is not allowed to "
            f"({status}: {detail}); apply deploy/kernel-pods/rbac.yaml to that namespace"
        )
    if status is None:
        return KernelPodError(
            f"could not {action} {where}: the API server did not answer ({detail})"
        )
    return KernelPodError(f"could not {action} {where}: the API server answered {status}: {detail}")


def api_detail(body: str | None, reason: str | None) -> str:
    """The API server's own message from an error body (JSON ``Status``), else its reason."""
    import json

    try:
        message = json.loads(body or "").get("message")
    except (ValueError, AttributeError):
        message = None
    return message or reason or "no detail"


def launcher_failure(stderr: str) -> tuple[int | None, str]:
    """(HTTP status, message) of a launcher that died on a Kubernetes ``ApiException``, read from
    its stderr (``(403)`` and the ``HTTP response body``'s message); (None, last line) else."""
    import re

    status_match = re.search(r"ApiException: \((\d{3})\)", stderr)
    body_match = re.search(r"HTTP response body: (.*)", stderr)
    if status_match:
        reason = re.search(r"Reason: (.*)", stderr)
        detail = api_detail(body_match[1] if body_match else None, reason[1] if reason else None)
        return int(status_match[1]), detail
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return None, lines[-1] if lines else "it wrote nothing to stderr"


def unblock_responses(response_manager: Any) -> None:
    """Make the response manager's listening socket non-blocking.

    gateway-provisioners 0.4 accepts the launchers' connections every 0.1 ms on a socket with a
    10 ms timeout (``GP_SOCKET_TIMEOUT``), so from the first kernel pod on the server's event
    loop waits inside ``accept()`` most of the time: each pass of the loop took ~5 ms instead of
    ~4 µs, for every request, websocket message and kernel output of the server
    (``bench/event_loop_hops.py``). Non-blocking, ``loop.sock_accept`` waits for a connection
    as any other socket read, and the response manager's periodic call awaits it.
    """
    listening = getattr(response_manager, "_response_socket", None)
    if listening is not None and listening.gettimeout() != 0:
        listening.setblocking(False)


#: What a pod made anew keeps of the pod it replaces (``pod_made_anew``); the rest of its
#: metadata (uid, resourceVersion, creationTimestamp, managedFields) is the API server's.
KEPT_METADATA = ("name", "namespace", "labels", "annotations", "ownerReferences")


def pod_made_anew(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest that makes ``pod`` (a pod as JSON, with no node) again: its name, labels,
    owner and spec, nothing the API server or the scheduler wrote (admission's additions to the
    spec, a priority from its class or default tolerations, are what admission adds again)."""
    metadata = pod.get("metadata") or {}
    spec = {key: value for key, value in (pod.get("spec") or {}).items() if key != "nodeName"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {key: metadata[key] for key in KEPT_METADATA if key in metadata},
        "spec": spec,
    }
