"""GKE Pod Snapshots of kernel pods: the kernel's live process kept across a pause.

Where a ``PodSnapshotPolicy`` with a manual trigger selects ``jupyter-pause.io/kernel-snapshots:
manual`` (``deploy/kernel-pods/podsnapshot-policy.yaml``) and kernel pods run in GKE Sandbox
(``KERNEL_RUNTIME_CLASS_NAME=gvisor``), a pause, after the application checkpoint, labels the
kernel's pod so (only a pod that is snapshotted or pins a snapshot carries the label: GKE
restores the newest matching snapshot into a pod that pins none, and a new kernel must never get
another kernel's process), snapshots it with a ``PodSnapshotManualTrigger`` (the workspace
backend's own-policy mode, ``pod_snapshots.py``, on the kernel's pod), then the pod is deleted.
The resume's pod pins that snapshot (``podsnapshot.gke.io/ps-name``); GKE restores it and the
kernel is the process that paused (its liveness token proves it: "live"), or it cold-starts and
the checkpoint is restored from files. Without such a policy a pause keeps the checkpoint only,
and says why.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from .base import SnapshotOutcome
from .kube import Kube, KubeError
from .pod_snapshots import OwnPolicyMode
from .workspace_modes import (
    GVISOR_RUNTIME_CLASS,
    POD_SNAPSHOTS,
    ModeChoice,
    WorkspacePod,
    selecting_policy,
)

log = logging.getLogger(__name__)

#: The label the kernel pods' snapshot policy selects (``deploy/kernel-pods/``).
SNAPSHOT_LABEL = "jupyter-pause.io/kernel-snapshots"
SNAPSHOT_LABEL_VALUE = "manual"
POLICY_FILE = "deploy/kernel-pods/podsnapshot-policy.yaml"


@dataclass
class KernelPodSnapshots:
    """Snapshots kernel pods through the API (the server's service account)."""

    enabled: bool = True
    timeout_seconds: float = 900.0
    poll_seconds: float = 0.5
    _kube: Kube | None = field(default=None, init=False, repr=False)

    @property
    def kube(self) -> Kube:
        """One client for every call, made at the first: with the Kubernetes client's default
        configuration, the one the provisioner uses (in-cluster, or a kubeconfig)."""
        if self._kube is None:
            from kubernetes import client

            self._kube = Kube(client.ApiClient())
        return self._kube

    async def take(self, namespace: str, pod_name: str) -> SnapshotOutcome:
        """A Ready snapshot of the kernel's pod, named, or why there is none (the pause goes
        on with the checkpoint only)."""
        if not self.enabled:
            return SnapshotOutcome(None, "pod snapshots are turned off (PauseApp.pod_snapshots)")
        kube = self.kube
        try:
            pod = await asyncio.to_thread(kube.get_pod, namespace, pod_name)
            policies = await asyncio.to_thread(kube.list_policies, namespace)
        except KubeError as err:
            return SnapshotOutcome(None, f"no pod snapshot: {err}")
        labels = {**((pod.get("metadata") or {}).get("labels") or {})}
        labels[SNAPSHOT_LABEL] = SNAPSHOT_LABEL_VALUE
        choice, problem = _choose(namespace, pod, labels, policies)
        if choice is None:
            return SnapshotOutcome(None, problem)
        try:
            await asyncio.to_thread(
                kube.label_pod, namespace, pod_name, {SNAPSHOT_LABEL: SNAPSHOT_LABEL_VALUE}
            )
        except KubeError as err:
            return SnapshotOutcome(None, f"no pod snapshot: {err}")
        pod["metadata"]["labels"] = labels
        target = WorkspacePod(
            kube, namespace, pod_name, pod, "", self.poll_seconds, self.timeout_seconds
        )

        def on_phase(text: str) -> None:
            log.info("Kernel pod %s: %s", pod_name, text)

        return await OwnPolicyMode(target, choice, gvisor_checkpoint="").snapshot(on_phase)

    async def drop(self, namespace: str, name: str) -> None:
        """A snapshot a resume pinned is spent (restored, or too old after a cold start): it is
        deleted, its storage freed; a failure is only logged (the policy's retention ends it)."""
        try:
            await asyncio.to_thread(self.kube.delete_snapshot, namespace, name)
        except KubeError as err:
            if err.kind != "not-found":
                log.warning("Pod snapshot %s of a kernel is left: %s", name, err)


def _choose(
    namespace: str, pod: dict[str, Any], labels: dict[str, str], policies: list[dict[str, Any]]
) -> tuple[ModeChoice | None, str]:
    """The policy that snapshots this kernel pod, or why none does."""
    policy = selecting_policy(policies, labels)
    if policy is None:
        return None, (
            f"no PodSnapshotPolicy in namespace {namespace} selects kernel pods "
            f"({SNAPSHOT_LABEL}={SNAPSHOT_LABEL_VALUE}, see {POLICY_FILE})"
        )
    name = policy["metadata"]["name"]
    runtime = (pod.get("spec") or {}).get("runtimeClassName")
    if runtime != GVISOR_RUNTIME_CLASS:
        return None, (
            f"PodSnapshotPolicy {name} selects kernel pods, but this one does not run in GKE "
            f"Sandbox (runtimeClassName {runtime or 'unset'}, not {GVISOR_RUNTIME_CLASS}): set "
            f"KERNEL_RUNTIME_CLASS_NAME={GVISOR_RUNTIME_CLASS} in the kernelspec's env"
        )
    kind = ((policy.get("spec") or {}).get("triggerConfig") or {}).get("type")
    if kind != "manual":
        return None, (
            f"PodSnapshotPolicy {name} has a {kind!r} trigger: kernel pods are snapshotted by "
            f"the server with a manual one ({POLICY_FILE})"
        )
    why = f"GKE Pod Snapshots: PodSnapshotPolicy {name} (manual trigger) selects kernel pods"
    return ModeChoice(POD_SNAPSHOTS, why, policy), ""
