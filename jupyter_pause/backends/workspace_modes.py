"""How a workspace pod is snapshotted: three modes, detected from what the cluster shows, named.

* ``gke-workspaces``: the GKE Workspaces snapshot add-on runs the pod's snapshots (its webhook
  put its readiness gate on this pod: the add-on is present and the Workspace or its kind is
  enabled). A pause asks exactly what the Kubeflow UI asks (``spec.paused: true``) and follows
  the add-on; no policy, trigger or pin of ours (``gke_workspaces.py``).
* ``pod-snapshots``: GKE Pod Snapshots without the add-on: a ``PodSnapshotPolicy`` selects the
  pod and the pod runs in GKE Sandbox (gVisor). Our trigger, our pin (``pod_snapshots.py``).
* ``no-snapshots``: anything else (no policy, a pod that is not in gVisor, snapshots turned
  off, no permission to look): the application checkpoint, then the pause; the resume restores
  from files. The reason is said where the user looks.

A mode is detected when the server starts (for the status and the chip) and again at each
pause (an admin may have added a policy meanwhile).
"""

from __future__ import annotations

import abc
import asyncio
import json
from dataclasses import dataclass
from typing import Any

from .base import BackendError, PhaseCallback, SnapshotInfo, SnapshotOutcome
from .kube import PIN_ANNOTATION, STATE_ANNOTATION, Kube, KubeError, selector_matches

#: The readiness gate the GKE Workspaces add-on's webhook adds to the pods it snapshots.
ADDON_READINESS_GATE = "podsnapshot.gke.kubeflow.org/active"
#: The runtime class GKE Sandbox (gVisor) pods run with; pod snapshots need it.
GVISOR_RUNTIME_CLASS = "gvisor"

GKE_WORKSPACES = "gke-workspaces"
POD_SNAPSHOTS = "pod-snapshots"
NO_SNAPSHOTS = "no-snapshots"


@dataclass
class WorkspacePod:
    """The pod this server runs in and its Workspace: what every mode works on."""

    kube: Kube
    namespace: str
    pod_name: str
    pod: dict[str, Any]  # as last read
    workspace: str
    poll_seconds: float
    timeout_seconds: float

    @property
    def labels(self) -> dict[str, str]:
        return (self.pod.get("metadata") or {}).get("labels") or {}

    @property
    def instance(self) -> str:
        return (self.pod.get("metadata") or {}).get("uid", "")

    async def patch_workspace(self, patch: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(
            self.kube.patch_workspace, self.namespace, self.workspace, patch
        )

    async def read_workspace(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.kube.get_workspace, self.namespace, self.workspace)


@dataclass
class ModeChoice:
    """The mode a pause will take, and why (shown in the status, the chip and the timeline)."""

    name: str
    why: str
    policy: dict[str, Any] | None = None  # pod-snapshots: the policy selecting the pod


def detect_mode(target: WorkspacePod, snapshots_allowed: bool = True) -> ModeChoice:
    """Which mode this pod is in, from the pod and the namespace's policies (blocking)."""
    spec = target.pod.get("spec") or {}
    gates = [g.get("conditionType") for g in spec.get("readinessGates") or [] if g]
    if ADDON_READINESS_GATE in gates:
        return ModeChoice(
            GKE_WORKSPACES,
            "GKE Workspaces: the snapshot add-on takes this Workspace's pod snapshots (its "
            "webhook set up this pod); a pause asks it as the Kubeflow UI does",
        )
    if not snapshots_allowed:
        return ModeChoice(NO_SNAPSHOTS, "pod snapshots are turned off (PauseApp.pod_snapshots)")
    try:
        policies = target.kube.list_policies(target.namespace)
    except KubeError as err:
        return ModeChoice(NO_SNAPSHOTS, f"the snapshot policies cannot be read ({err})")
    policy = selecting_policy(policies, target.labels)
    if policy is None:
        return ModeChoice(
            NO_SNAPSHOTS,
            f"no PodSnapshotPolicy in namespace {target.namespace} selects this pod: "
            "a pause keeps the checkpoints only",
        )
    name = policy["metadata"]["name"]
    runtime = spec.get("runtimeClassName")
    if runtime != GVISOR_RUNTIME_CLASS:
        return ModeChoice(
            NO_SNAPSHOTS,
            f"PodSnapshotPolicy {name} selects this pod, but the pod does not run in GKE "
            f"Sandbox (runtimeClassName {runtime or 'unset'}, not {GVISOR_RUNTIME_CLASS}), "
            "so GKE cannot snapshot it: a pause keeps the checkpoints only. Put the "
            "Workspace's pods in gVisor (deploy/gvisor-admission-policy.yaml, or the GKE "
            "Workspaces add-on)",
        )
    kind = ((policy.get("spec") or {}).get("triggerConfig") or {}).get("type")
    return ModeChoice(
        POD_SNAPSHOTS,
        f"GKE Pod Snapshots: PodSnapshotPolicy {name} ({kind} trigger) selects this pod",
        policy,
    )


def selecting_policy(
    policies: list[dict[str, Any]], labels: dict[str, str]
) -> dict[str, Any] | None:
    """The first of ``policies`` (PodSnapshotPolicies) whose selector matches ``labels``."""
    return next(
        (
            p
            for p in policies
            if selector_matches((p.get("spec") or {}).get("selector") or {}, labels)
        ),
        None,
    )


class SnapshotMode(abc.ABC):
    """One way of snapshotting and pausing the pod (see the module's docstring)."""

    name: str

    def __init__(self, target: WorkspacePod, choice: ModeChoice) -> None:
        self.target = target
        self.choice = choice

    @abc.abstractmethod
    async def snapshot(self, on_phase: PhaseCallback, ask: bool = True) -> SnapshotOutcome:
        """Snapshot the pod where this mode can; the outcome names it, or says why not.
        ``ask`` False: the platform asked for this pause itself (outside jupyter_pause), and
        only a mode whose snapshots the platform takes by itself has one to follow."""

    @abc.abstractmethod
    async def pause(self, state: dict[str, Any], outcome: SnapshotOutcome) -> None:
        """Pause the Workspace (its pod goes, and the GPU with it), recording ``state``."""

    async def list_snapshots(self) -> list[SnapshotInfo]:
        """The pod snapshots of this Workspace that this mode manages (none by default)."""
        return []

    async def expire(self, keep_last: int, max_age_hours: float, pinned: str | None) -> list[str]:
        """Delete the snapshots retention lets go; their names."""
        return []


class NoSnapshots(SnapshotMode):
    """Application checkpoints only: the Workspace is paused, the resume restores from files."""

    name = NO_SNAPSHOTS

    async def snapshot(self, on_phase: PhaseCallback, ask: bool = True) -> SnapshotOutcome:
        return SnapshotOutcome(None, self.choice.why)

    async def pause(self, state: dict[str, Any], outcome: SnapshotOutcome) -> None:
        await pause_workspace(self.target, state, None)


async def pause_workspace(target: WorkspacePod, state: dict[str, Any], pin: str | None) -> None:
    """``spec.paused: true``, our record of the pause, and the snapshot pin: the one to
    restore, or none (a pin of an earlier pause must not bring an older state back)."""
    if not target.workspace:
        raise BackendError("this pod belongs to no Workspace")
    patch = {
        "metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state, sort_keys=True)}},
        "spec": {
            "paused": True,
            "podTemplate": {"podMetadata": {"annotations": {PIN_ANNOTATION: pin}}},
        },
    }
    await target.patch_workspace(patch)
