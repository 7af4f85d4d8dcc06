"""GKE Workspaces: the snapshot add-on takes the pod snapshots; we ask as the Kubeflow UI does.

The add-on (``gke-workspace-snapshot-addon``, gke-labs/workspaces ``providers/gke``) owns this
Workspace's snapshots: its webhook holds a ``spec.paused: true`` back (annotation
``checkpoint-state: Checkpointing``) while it snapshots the pod with a policy and a trigger of
its own (``ws-<name>-policy``, ``ws-<name>-trigger``), lets the pause through once the
PodSnapshot is Ready (``checkpoint-state: Ready``, ``last-checkpoint-name``), pins that
snapshot on the next pod, and deletes snapshot and trigger once that pod is Ready. So after
the application checkpoint a pause here is exactly the Kubeflow UI's Pause (one merge patch
of ``spec.paused``), followed on the add-on's annotations and its trigger's and snapshot's
conditions for progress and failure. We never create a policy, trigger or pin here: a second
snapshot would be taken, and the wrong one named.

A snapshot that fails (or never comes): the add-on would hold the pause back for ever. The
pause goes through without one (``checkpoint-state: Ready`` with no checkpoint named, which
the add-on's webhook lets through and its reconciler cleans up after the next start), the
next pod starts cold, and the resume restores the checkpoints and says why.

A pause asked outside jupyter_pause (the dashboard, kubectl, a culler) is held by the add-on
all the same: the server checkpoints every kernel in the hold, and ``hold`` keeps the add-on
from asking GKE for the snapshot until the checkpoints are written. The add-on waits its
settle grace (``--settle-grace-period``, 3 s by default) from ``checkpoint-started-at``
before it creates its trigger; ``hold`` moves that stamp to now while the trigger does not
exist yet, once a second (so the add-on's grace must be over 1 s: its default is). Then
``snapshot(ask=False)`` follows the add-on to the outcome as for our own pause.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from .base import PhaseCallback, SnapshotInfo, SnapshotOutcome
from .kube import PIN_ANNOTATION, STATE_ANNOTATION, KubeError, condition
from .pod_snapshots import snapshot_outcome, trigger_outcome
from .workspace_modes import GKE_WORKSPACES, SnapshotMode

#: The add-on's annotations on the Workspace (its ``internal/snapshot/snapshot.go``).
CHECKPOINT_STATE = "podsnapshot.gke.kubeflow.org/checkpoint-state"
CHECKPOINT_STARTED_AT = "podsnapshot.gke.kubeflow.org/checkpoint-started-at"
LAST_CHECKPOINT = "podsnapshot.gke.kubeflow.org/last-checkpoint-name"
CHECKPOINTING, READY = "Checkpointing", "Ready"


def addon_trigger(workspace: str) -> str:
    """The add-on's one PodSnapshotManualTrigger of a Workspace (its ``triggerNameFor``)."""
    return f"ws-{workspace}-trigger"


class AddonMode(SnapshotMode):
    """The add-on snapshots; a pause is ``spec.paused: true``, followed to its outcome."""

    name = GKE_WORKSPACES
    followed: str | None = None  # the add-on's PodSnapshot, once its trigger named it

    async def snapshot(self, on_phase: PhaseCallback, ask: bool = True) -> SnapshotOutcome:
        target = self.target
        started = time.monotonic()
        deadline = started + target.timeout_seconds
        if ask:
            on_phase("Pod snapshot: asking the GKE Workspaces add-on (spec.paused: true)")
            try:
                await target.patch_workspace({"spec": {"paused": True}})
            except KubeError as err:
                return SnapshotOutcome(None, f"the pause could not be asked for: {err}")
        else:  # asked already (a pause from outside): asking again would restart its hold
            on_phase("Pod snapshot: the GKE Workspaces add-on takes it")
        problem = f"the add-on made no snapshot in {target.timeout_seconds:.0f} s"
        self.followed = None
        ran = (time.time(), time.monotonic())  # the last look: the pod ran until then
        while time.monotonic() < deadline:
            waited = time.monotonic() - started
            try:
                restored_in = await self._restored_elsewhere()
                if restored_in is not None:
                    # The add-on's policy stops the pod right after its snapshot: this process
                    # was frozen in this loop and runs again in the pod restored from it (the
                    # add-on pinned the snapshot on that pod; frozen before the trigger named
                    # it, this loop may not know it otherwise). It stopped after its last look.
                    pin = ((restored_in.get("metadata") or {}).get("annotations") or {}).get(
                        PIN_ANNOTATION
                    )
                    return SnapshotOutcome(
                        pin or self.followed,
                        None,
                        seconds=ran[1] - started,
                        resumed_from_snapshot=True,
                        details={"stopped_at": ran[0]},
                    )
                workspace = await target.read_workspace()
                annotations = (workspace.get("metadata") or {}).get("annotations") or {}
                state = annotations.get(CHECKPOINT_STATE)
                if (workspace.get("spec") or {}).get("paused"):
                    name = annotations.get(LAST_CHECKPOINT) if state == READY else None
                    outcome = SnapshotOutcome(
                        name,
                        None if name else "the add-on let the pause through without a snapshot",
                        seconds=time.monotonic() - started,
                    )
                    outcome.details = await self._details(name)
                    return outcome
                failure = await self._follow(on_phase, waited) if state == CHECKPOINTING else ""
            except KubeError as err:
                failure = ""  # the API may be away for a moment: look again
                on_phase(f"Pod snapshot: the API server did not answer ({err}); waiting")
            if failure:
                problem = failure
                break
            ran = (time.time(), time.monotonic())
            await asyncio.sleep(target.poll_seconds)
        await self._pause_without_snapshot()
        return SnapshotOutcome(None, problem, seconds=time.monotonic() - started)

    async def hold(self) -> bool:
        """Keep the add-on from asking GKE for the snapshot a moment longer (its settle grace
        runs from ``checkpoint-started-at``: moved to now). False once there is nothing left to
        hold: the pause is no longer held, or the add-on has asked (its trigger exists)."""
        target = self.target
        workspace = await target.read_workspace()
        metadata = workspace.get("metadata") or {}
        held = (metadata.get("annotations") or {}).get(CHECKPOINT_STATE) == CHECKPOINTING
        if not held or (workspace.get("spec") or {}).get("paused"):
            return False
        trigger = addon_trigger(target.workspace)
        try:
            await asyncio.to_thread(target.kube.get_trigger, target.namespace, trigger)
            return False
        except KubeError as err:
            if err.status != 404:
                raise
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # On the Workspace as read: changed meanwhile (409), it is looked at again next time.
        version = metadata.get("resourceVersion")
        try:
            await target.patch_workspace(
                {
                    "metadata": {
                        "resourceVersion": version,
                        "annotations": {CHECKPOINT_STARTED_AT: stamp},
                    }
                }
            )
        except KubeError as err:
            if err.status != 409:
                raise
        return True

    async def _restored_elsewhere(self) -> dict[str, Any] | None:
        """The pod this process now runs in, when it is another than the one that paused."""
        target = self.target
        try:
            pod = await asyncio.to_thread(target.kube.get_pod, target.namespace, target.pod_name)
        except KubeError as err:
            if err.status == 404:  # between the old pod and the new one
                return None
            raise
        uid = (pod.get("metadata") or {}).get("uid")
        return pod if uid and uid != target.instance else None

    async def _follow(self, on_phase: PhaseCallback, waited: float) -> str:
        """One look at the add-on's trigger and snapshot: a phase, or why it failed."""
        target = self.target
        name = addon_trigger(target.workspace)
        try:
            trigger = await asyncio.to_thread(target.kube.get_trigger, target.namespace, name)
        except KubeError as err:
            if err.status == 404:  # the add-on waits for the pod to settle first
                on_phase(f"Pod snapshot: the add-on prepares it ({waited:.0f} s)")
                return ""
            raise
        snapshot, failure = trigger_outcome(trigger, name)
        if failure or snapshot is None:
            if not failure:
                on_phase(
                    f"Pod snapshot: trigger {name} waits for the node's agent ({waited:.0f} s)"
                )
            return failure
        self.followed = snapshot
        found = await asyncio.to_thread(target.kube.get_snapshot, target.namespace, snapshot)
        ready, failure = snapshot_outcome(found, snapshot)
        if not ready and not failure:
            on_phase(f"Pod snapshot: {snapshot} is being written ({waited:.0f} s)")
        return failure

    async def _pause_without_snapshot(self) -> None:
        """Let the pause through with no snapshot named (the add-on's own way of completing a
        pause of a pod it cannot snapshot): the next pod starts cold."""
        await self.target.patch_workspace(
            {
                "metadata": {"annotations": {CHECKPOINT_STATE: READY, CHECKPOINT_STARTED_AT: None}},
                "spec": {"paused": True},
            }
        )

    async def _details(self, name: str | None) -> dict[str, Any]:
        """What the PodSnapshot says of itself (its size where GKE reports one)."""
        if not name:
            return {}
        try:
            found = await asyncio.to_thread(
                self.target.kube.get_snapshot, self.target.namespace, name
            )
        except KubeError:
            return {}
        status = found.get("status") or {}
        size = status.get("snapshotSize") or status.get("size")
        return {"bytes": int(size)} if isinstance(size, int | str) and str(size).isdigit() else {}

    async def pause(self, state: dict[str, Any], outcome: SnapshotOutcome) -> None:
        # The add-on completed the pause already (or we let it through): record ours only.
        await self.target.patch_workspace(
            {"metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state, sort_keys=True)}}}
        )

    async def list_snapshots(self) -> list[SnapshotInfo]:
        """The add-on's snapshots of this Workspace (it deletes them itself after a restore)."""
        target = self.target
        items = await asyncio.to_thread(target.kube.list_snapshots, target.namespace)
        trigger = addon_trigger(target.workspace)
        found = []
        for item in items:
            metadata = item.get("metadata") or {}
            labels = metadata.get("labels") or {}
            if labels.get("gke-pod-snapshot-triggered-by") != trigger:
                continue
            ready = (condition(item, "Ready") or {}).get("status") == "True"
            found.append(
                SnapshotInfo(
                    metadata["name"], metadata.get("creationTimestamp") or "", ready, False, trigger
                )
            )
        return sorted(found, key=lambda s: (s.created, s.name))
