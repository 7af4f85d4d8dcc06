"""GKE Pod Snapshots without the GKE Workspaces add-on: our trigger, our pin.

A ``PodSnapshotPolicy`` selects the pod and the pod runs in gVisor (``workspace_modes``). A
pause snapshots the pod (a ``PodSnapshotManualTrigger`` for a ``manual`` policy, followed to a
ready ``PodSnapshot`` and then deleted, spent; ``/proc/gvisor/checkpoint`` for a ``workload``
one), then pauses the Workspace with the snapshot pinned in its pod template
(``podsnapshot.gke.io/ps-name``).

GKE restores the **newest matching** PodSnapshot into a pod that pins none. So a pause without
a new snapshot (it failed, it timed out) removes the pin and deletes this Workspace's older
snapshots: they hold a state older than the checkpoints just written, and must not come back
unannounced. The restored process proves itself anyway (``environment.py``), this keeps it from
having to.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import time
from typing import Any

from .base import PhaseCallback, SnapshotInfo, SnapshotOutcome
from .kube import TRIGGERED_BY_LABEL, WORKSPACE_LABEL, KubeError, condition, epoch
from .workspace_modes import POD_SNAPSHOTS, ModeChoice, SnapshotMode, WorkspacePod, pause_workspace

#: Label (GKE) on a PodSnapshot naming the pod it was taken of.
ORIGIN_POD_LABEL = "podsnapshot.gke.io/origin-pod"
#: Label on the triggers (and so on their snapshots' ``TRIGGERED_BY_LABEL``) we create.
MANAGED_BY = {"app.kubernetes.io/managed-by": "jupyter-pause"}


class OwnPolicyMode(SnapshotMode):
    """GKE Pod Snapshots through the policy that selects the pod (no add-on)."""

    name = POD_SNAPSHOTS

    def __init__(self, target: WorkspacePod, choice: ModeChoice, gvisor_checkpoint: str) -> None:
        super().__init__(target, choice)
        self.gvisor_checkpoint = gvisor_checkpoint
        self.trigger_prefix = f"jp-{dns_label(target.workspace or target.pod_name)}-"

    @property
    def policy_name(self) -> str:
        return (self.choice.policy or {}).get("metadata", {}).get("name", "")

    # -- taking a snapshot -------------------------------------------------------------------------
    async def snapshot(self, on_phase: PhaseCallback, ask: bool = True) -> SnapshotOutcome:
        if not ask:
            return SnapshotOutcome(
                None, "the pause was asked outside jupyter_pause while the pod was being stopped"
            )
        kind = (((self.choice.policy or {}).get("spec") or {}).get("triggerConfig") or {}).get(
            "type"
        )
        started = time.monotonic()
        if kind == "workload":
            outcome = await self._workload_snapshot(on_phase, started)
        elif kind == "manual":
            outcome = await self._manual_snapshot(on_phase, started)
        else:
            return SnapshotOutcome(
                None, f"PodSnapshotPolicy {self.policy_name} has trigger type {kind!r}"
            )
        outcome.seconds = time.monotonic() - started
        return outcome

    async def _manual_snapshot(self, on_phase: PhaseCallback, started: float) -> SnapshotOutcome:
        """A PodSnapshotManualTrigger for this pod, followed to a ready PodSnapshot.

        A spent trigger never fires again: it is deleted once followed (GKE leaves it), and a
        failed one is replaced by a new one, once.
        """
        target = self.target
        deadline = started + target.timeout_seconds
        problem = "no snapshot was made"
        for attempt in (1, 2):
            name = f"{self.trigger_prefix}{int(time.time())}-{secrets.token_hex(2)}"
            labels = dict(MANAGED_BY)
            if target.workspace:
                labels[WORKSPACE_LABEL] = target.workspace
            try:
                await asyncio.to_thread(
                    target.kube.create_trigger, target.namespace, name, target.pod_name, labels
                )
            except KubeError as err:
                return SnapshotOutcome(None, f"no pod snapshot: {err}")
            try:
                snapshot, problem = await self._follow_trigger(name, on_phase, started, deadline)
            except KubeError as err:
                snapshot, problem = None, f"no pod snapshot: {err}"
            finally:
                with contextlib.suppress(KubeError):  # spent either way; GKE keeps it otherwise
                    await asyncio.to_thread(target.kube.delete_trigger, target.namespace, name)
            if snapshot is not None:
                return SnapshotOutcome(snapshot)
            if attempt == 1 and time.monotonic() < deadline and "timed out" not in problem:
                on_phase(f"Pod snapshot failed ({problem}); trying once more with a new trigger")
        return SnapshotOutcome(None, problem)

    async def _follow_trigger(
        self, name: str, on_phase: PhaseCallback, started: float, deadline: float
    ) -> tuple[str | None, str]:
        """(snapshot name, "") once its PodSnapshot is ready, else (None, why)."""
        target = self.target
        snapshot: str | None = None
        while time.monotonic() < deadline:
            waited = time.monotonic() - started
            if snapshot is None:
                trigger = await asyncio.to_thread(target.kube.get_trigger, target.namespace, name)
                snapshot, failure = trigger_outcome(trigger, name)
                if failure:
                    return None, failure
                if snapshot is None:
                    on_phase(
                        f"Pod snapshot: trigger {name} waits for the node's agent ({waited:.0f} s)"
                    )
                continue
            found = await asyncio.to_thread(target.kube.get_snapshot, target.namespace, snapshot)
            ready, failure = snapshot_outcome(found, snapshot)
            if ready:
                return snapshot, ""
            if failure:
                return None, failure
            on_phase(f"Pod snapshot: {snapshot} is being written ({waited:.0f} s)")
            await asyncio.sleep(target.poll_seconds)
        return None, f"the pod snapshot timed out after {target.timeout_seconds:.0f} s"

    async def _workload_snapshot(self, on_phase: PhaseCallback, started: float) -> SnapshotOutcome:
        """gVisor's workload trigger (``gvisor_checkpoint``), then this pod's new PodSnapshot."""
        path = self.gvisor_checkpoint
        timeout = self.target.timeout_seconds
        if not await asyncio.to_thread(os.access, path, os.W_OK):
            return SnapshotOutcome(
                None, f"no pod snapshot: {path} cannot be written (not in GKE Sandbox?)"
            )
        on_phase("Pod snapshot: gVisor is checkpointing the pod")
        try:
            result = await asyncio.wait_for(asyncio.to_thread(gvisor_checkpoint, path), timeout)
        except TimeoutError:
            return SnapshotOutcome(None, f"{path} gave no answer in {timeout:.0f} s")
        except OSError as err:
            why = "no checkpoint was started" if err.errno == errno.EINVAL else str(err)
            return SnapshotOutcome(None, f"the pod snapshot failed ({path}: {why})")
        if result not in (b"", b"r"):
            return SnapshotOutcome(None, f"the pod snapshot failed ({path} answered {result!r})")
        since = time.time() - (time.monotonic() - started) - 5
        name = None
        with contextlib.suppress(KubeError):  # it exists; only not named (so not pinned)
            name = await asyncio.to_thread(self._newest_of_this_pod, since)
        # Whether this process is the one that paused or a restored copy, the pod tells (the
        # backend compares the pod's uid before and after).
        return SnapshotOutcome(name, None)

    def _newest_of_this_pod(self, since: float) -> str | None:
        """This pod's newest PodSnapshot since ``since``: GKE labels it with its origin pod
        (another pod of the namespace under the same policy is never taken for ours)."""
        newest = None
        target = self.target
        selector = f"{ORIGIN_POD_LABEL}={target.pod_name}"
        for item in target.kube.list_snapshots(target.namespace, selector):
            if (item.get("spec") or {}).get("policyName") not in (None, self.policy_name):
                continue
            created = epoch((item.get("metadata") or {}).get("creationTimestamp"))
            if (
                created is not None
                and created >= since
                and (newest is None or created >= newest[0])
            ):
                newest = (created, item["metadata"]["name"])
        return None if newest is None else newest[1]

    # -- pausing -----------------------------------------------------------------------------------
    async def pause(self, state: dict[str, Any], outcome: SnapshotOutcome) -> None:
        if outcome.name is None:
            # GKE would restore the newest matching snapshot into an unpinned pod: none of
            # ours may be left for it to pick (they are older than these checkpoints).
            for snapshot in await self.list_snapshots():
                with contextlib.suppress(KubeError):
                    await asyncio.to_thread(
                        self.target.kube.delete_snapshot, self.target.namespace, snapshot.name
                    )
        await pause_workspace(self.target, state, outcome.name)

    # -- hygiene -----------------------------------------------------------------------------------
    async def list_snapshots(self) -> list[SnapshotInfo]:
        """This Workspace's PodSnapshots: those of our triggers, and those of this pod."""
        target = self.target
        items = await asyncio.to_thread(target.kube.list_snapshots, target.namespace)
        ours = []
        for item in items:
            metadata = item.get("metadata") or {}
            labels = metadata.get("labels") or {}
            trigger = labels.get(TRIGGERED_BY_LABEL) or ""
            origin = labels.get(ORIGIN_POD_LABEL)
            if not trigger.startswith(self.trigger_prefix) and origin != target.pod_name:
                continue
            ready, _failure = snapshot_outcome(item, metadata.get("name", ""))
            ours.append(
                SnapshotInfo(
                    metadata["name"],
                    metadata.get("creationTimestamp") or "",
                    ready,
                    False,
                    trigger or "workload",
                )
            )
        return sorted(ours, key=lambda s: (s.created, s.name))

    async def expire(self, keep_last: int, max_age_hours: float, pinned: str | None) -> list[str]:
        snapshots = await self.list_snapshots()
        # The pinned one counts first; the newest others fill what keep_last leaves.
        others = [s.name for s in snapshots if s.name != pinned]
        room = max(0, keep_last - (1 if pinned else 0))
        keep = set(others[len(others) - room :]) if room else set()
        now = time.time()
        deleted = []
        for snapshot in snapshots:
            created = epoch(snapshot.created) or now
            too_old = max_age_hours > 0 and now - created > max_age_hours * 3600
            if snapshot.name == pinned or (snapshot.name in keep and not too_old):
                continue
            await asyncio.to_thread(
                self.target.kube.delete_snapshot, self.target.namespace, snapshot.name
            )
            deleted.append(snapshot.name)
        return deleted


def trigger_outcome(trigger: dict[str, Any], name: str) -> tuple[str | None, str]:
    """(the PodSnapshot a trigger made, or None; why it failed, or "") from its status."""
    triggered = condition(trigger, "Triggered") or {}
    if triggered.get("status") == "True":
        created = ((trigger.get("status") or {}).get("snapshotCreated") or {}).get("name")
        if not created:
            return None, f"trigger {name} completed without naming its PodSnapshot"
        return created, ""
    if triggered.get("status") == "False" and triggered.get("reason") in ("Failed", "Error"):
        return (
            None,
            f"the pod snapshot failed (trigger {name}: {triggered.get('message') or triggered['reason']})",
        )
    return None, ""


def snapshot_outcome(snapshot: dict[str, Any], name: str) -> tuple[bool, str]:
    """(ready to restore; why it failed, or "") from a PodSnapshot's Ready condition."""
    ready = condition(snapshot, "Ready") or {}
    if ready.get("status") == "True":
        return True, ""
    if ready.get("status") == "False" and ready.get("reason") in ("Failed", "Error"):
        return False, f"PodSnapshot {name} failed: {ready.get('message') or ready['reason']}"
    return False, ""


def gvisor_checkpoint(path: str) -> bytes:
    """Ask gVisor for a checkpoint of the whole sandbox; what it answered once it is done.

    One open for both the request and the answer: the read on the descriptor that wrote the
    request blocks until that checkpoint (and, in a restored copy, the restore) completes,
    then gives ``b""`` or ``b"r"``. Closing and reopening the file to read would register
    for the *next* checkpoint and wait for one that never comes. ``EINVAL`` on the read: no
    checkpoint was started (the policy is not a workload one).
    """
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    try:
        os.write(fd, b"1")
        return os.read(fd, 1)
    finally:
        os.close(fd)


def dns_label(text: str) -> str:
    """``text`` as a piece of a Kubernetes object name (lower case, digits and dashes)."""
    import re

    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40] or "pod"
