"""The workspace backend: a Kubeflow Workspace pod (GKE Workspaces too), paused as a whole.

The server and its kernels share the pod and its GPUs. A pause of any notebook pauses the
pod: the orchestrator checkpoints every kernel to the home volume (the PVC outlives the pod),
then this backend

1. snapshots the pod where a ``PodSnapshotPolicy`` selects it (GKE Pod Snapshots, gVisor): a
   ``PodSnapshotManualTrigger`` for a ``manual`` policy, followed to its ``PodSnapshot``
   being ready; a write to ``/proc/gvisor/checkpoint`` for a ``workload`` policy. No policy,
   no permission, a failed snapshot: it says so and the pause goes on with the checkpoints;
2. merge-patches its own Workspace ``{"spec": {"paused": true}}`` (pinning the snapshot in the
   pod template's annotations, ``podsnapshot.gke.io/ps-name``): the controller deletes the pod
   and the GPU goes back to the pool.

Back in a new pod, ``environment_facts`` tells whether the platform restored it from the
snapshot (the pod's ``PodRestored`` condition); the orchestrator adds the proof only the
process itself has (its in-memory token) before it calls anything "live".
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import (
    Allocation,
    BackendError,
    EnvironmentBackend,
    EnvironmentFacts,
    PhaseCallback,
    QueueCallback,
    ResourceStatus,
    RestoreOutcome,
    SessionSpec,
    SnapshotInfo,
    SnapshotOutcome,
    StopOutcome,
)
from .kernels import running_kernel, start_kernel
from .kube import (
    PIN_ANNOTATION,
    STATE_ANNOTATION,
    TRIGGERED_BY_LABEL,
    WORKSPACE_LABEL,
    Kube,
    KubeError,
    condition,
    gpu_limit,
    selector_matches,
)

#: The pod condition GKE sets on a pod it restored from a snapshot.
RESTORED_CONDITION = "PodRestored"
#: gVisor's file for a workload-triggered checkpoint: write "1", read how it went.
GVISOR_CHECKPOINT = "/proc/gvisor/checkpoint"


@dataclass
class WorkspaceSettings:
    """Where the pod is and how to reach the API server (admin traits of PauseApp)."""

    pod_name: str
    namespace: str
    service_account_dir: str
    environ: dict[str, str]
    snapshots: bool = True  # False: never snapshot, pause with the checkpoints only
    snapshot_timeout_seconds: float = 900.0
    poll_seconds: float = 1.0
    gvisor_checkpoint: str = GVISOR_CHECKPOINT


def detect(service_account_dir: str, environ: dict[str, str]) -> bool:
    """Whether this server runs in a Kubernetes pod that can find itself (auto-detection)."""
    return (
        Path(service_account_dir, "token").is_file()
        and bool(environ.get("KUBERNETES_SERVICE_HOST"))
        and bool(environ.get("POD_NAME"))
        and bool(environ.get("POD_NAMESPACE"))
    )


def epoch(stamp: str | None) -> float | None:
    """An RFC 3339 time of the API server (``2024-01-01T10:00:00Z``) as a Unix time."""
    if not stamp:
        return None
    try:
        return float(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def dns_label(text: str) -> str:
    """``text`` as a piece of a Kubernetes object name (lower case, digits and dashes)."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40] or "pod"


class WorkspaceBackend(EnvironmentBackend):
    """Kernels in this pod; a pause snapshots the pod and pauses its Kubeflow Workspace."""

    name = "workspace"

    def __init__(
        self, kernel_manager: Any, session_manager: Any, settings: WorkspaceSettings
    ) -> None:
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.settings = settings
        self.kube: Kube | None = None
        self.pod: dict[str, Any] = {}  # own pod as last read
        self.workspace: str | None = None
        self.gpus = 0
        self.problem: str | None = None  # why the cluster cannot be used now, named
        self._connecting: asyncio.Future[None] | None = None
        self.trigger_prefix = f"jp-{dns_label(settings.pod_name)}-"

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        # In the background: the server serves while the client loads and the pod is read.
        self._connecting = asyncio.ensure_future(asyncio.to_thread(self._connect))

    async def connected(self) -> Kube:
        """The API client once the pod has been read; BackendError naming what is missing."""
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(asyncio.to_thread(self._connect))
        try:
            await asyncio.shield(self._connecting)
        except KubeError as err:  # the session keeps running: pauses say what is missing
            self.problem = str(err)
        if self.kube is None:
            raise BackendError(f"the Kubernetes API cannot be used: {self.problem}")
        return self.kube

    def _connect(self) -> None:
        try:
            kube = Kube.in_cluster(self.settings.service_account_dir, self.settings.environ)
            self.pod = kube.get_pod(self.settings.namespace, self.settings.pod_name)
        except KubeError as err:
            self.problem = str(err)
            raise
        self.kube = kube
        labels = (self.pod.get("metadata") or {}).get("labels") or {}
        self.workspace = labels.get(WORKSPACE_LABEL)
        self.gpus = gpu_limit(self.pod)
        if self.workspace:
            self.trigger_prefix = f"jp-{dns_label(self.workspace)}-"
        else:
            self.problem = (
                f"pod {self.settings.pod_name} has no {WORKSPACE_LABEL} label: it is not a "
                "Kubeflow Workspace's pod, so it cannot be paused from here"
            )

    async def close(self) -> None:
        if self._connecting is not None and not self._connecting.done():
            with contextlib.suppress(Exception):
                await self._connecting
        if self.kube is not None:
            await asyncio.to_thread(self.kube.close)

    def _api(self) -> Kube:
        """The client, from worker threads and coroutines that ran ``connected`` first."""
        if self.kube is None:
            raise BackendError(f"the Kubernetes API cannot be used: {self.problem}")
        return self.kube

    @property
    def instance(self) -> str:
        return (self.pod.get("metadata") or {}).get("uid", "")

    # -- kernels in the pod -----------------------------------------------------------------------
    async def stop(self, session: SessionSpec) -> StopOutcome:
        raise BackendError("a workspace pauses as a whole: pause the environment instead")

    async def request_resources(self, session: SessionSpec, on_queued: QueueCallback) -> Allocation:
        # The pod holds its GPUs; every kernel in it sees them all.
        return Allocation(
            gpus=list(range(self.gpus)) if session.gpus else [], granted_at=time.time()
        )

    async def restore(self, session: SessionSpec, allocation: Allocation) -> RestoreOutcome:
        existing = await running_kernel(self.kernel_manager, self.session_manager, session.path)
        if existing is not None:  # the kernel that paused (alive after a live restore) or a new one
            return RestoreOutcome(existing, live=False, details={"reused_kernel": True})
        kernel_id = await start_kernel(self.kernel_manager, self.session_manager, session, {})
        return RestoreOutcome(kernel_id, live=False)

    async def release(self, session: SessionSpec) -> None:
        return None

    def adopt(self, session: SessionSpec) -> list[int]:
        return list(range(self.gpus)) if session.gpus else []

    def describe_resources(self) -> ResourceStatus:
        busy = bool(self.kernel_manager.list_kernel_ids())
        return ResourceStatus(
            backend=self.name,
            gpus_total=self.gpus,
            gpus_free=0 if busy else self.gpus,
            queue=[],
            details={
                "namespace": self.settings.namespace,
                "pod": self.settings.pod_name,
                "workspace": self.workspace,
                "problem": self.problem,
            },
        )

    # -- the whole pod ----------------------------------------------------------------------------
    async def snapshot_environment(self, on_phase: PhaseCallback) -> SnapshotOutcome:
        if not self.settings.snapshots:
            return SnapshotOutcome(None, "pod snapshots are turned off (PauseApp.pod_snapshots)")
        started = time.monotonic()
        try:
            await self.connected()
            policy = await asyncio.to_thread(self._policy)
        except BackendError as err:
            return SnapshotOutcome(None, f"no pod snapshot: {err}")
        if policy is None:
            return SnapshotOutcome(
                None,
                f"no PodSnapshotPolicy in namespace {self.settings.namespace} selects this pod",
            )
        kind = ((policy.get("spec") or {}).get("triggerConfig") or {}).get("type")
        policy_name = policy["metadata"]["name"]
        if kind == "workload":
            outcome = await self._workload_snapshot(on_phase, started)
        elif kind == "manual":
            outcome = await self._manual_snapshot(on_phase, started)
        else:
            return SnapshotOutcome(
                None, f"PodSnapshotPolicy {policy_name} has trigger type {kind!r}"
            )
        outcome.seconds = time.monotonic() - started
        if outcome.name is not None and not outcome.resumed_from_snapshot:
            # Here since the snapshot: still the pod that paused, or already a restored one?
            try:
                facts = await self.environment_facts()
                outcome.resumed_from_snapshot = facts.instance != self.instance
            except BackendError:
                pass
        return outcome

    def _policy(self) -> dict[str, Any] | None:
        """The PodSnapshotPolicy selecting this pod, if any."""
        kube = self._api()
        labels = (self.pod.get("metadata") or {}).get("labels") or {}
        for policy in kube.list_policies(self.settings.namespace):
            if selector_matches((policy.get("spec") or {}).get("selector") or {}, labels):
                return policy
        return None

    async def _manual_snapshot(self, on_phase: PhaseCallback, started: float) -> SnapshotOutcome:
        """A PodSnapshotManualTrigger for this pod, followed to a ready PodSnapshot.

        A spent trigger never fires again: a failed one is replaced by a new one, once.
        """
        kube = self._api()
        namespace = self.settings.namespace
        deadline = started + self.settings.snapshot_timeout_seconds
        problem = "no snapshot was made"
        for attempt in (1, 2):
            name = f"{self.trigger_prefix}{int(time.time())}-{secrets.token_hex(2)}"
            labels = {"app.kubernetes.io/managed-by": "jupyter-pause"}
            if self.workspace:
                labels[WORKSPACE_LABEL] = self.workspace
            try:
                await asyncio.to_thread(
                    kube.create_trigger, namespace, name, self.settings.pod_name, labels
                )
                snapshot, problem = await self._follow_trigger(name, on_phase, started, deadline)
            except KubeError as err:
                return SnapshotOutcome(None, f"no pod snapshot: {err}")
            if snapshot is not None:
                return SnapshotOutcome(snapshot)
            if attempt == 1 and time.monotonic() < deadline and "timed out" not in problem:
                on_phase(f"Pod snapshot failed ({problem}); trying once more with a new trigger")
        return SnapshotOutcome(None, problem)

    async def _follow_trigger(
        self, name: str, on_phase: PhaseCallback, started: float, deadline: float
    ) -> tuple[str | None, str]:
        """(snapshot name, None) once its PodSnapshot is ready, else (None, why)."""
        kube = self._api()
        namespace = self.settings.namespace
        snapshot: str | None = None
        while time.monotonic() < deadline:
            waited = time.monotonic() - started
            if snapshot is None:
                trigger = await asyncio.to_thread(kube.get_trigger, namespace, name)
                triggered = condition(trigger, "Triggered") or {}
                if triggered.get("status") == "True":
                    created = ((trigger.get("status") or {}).get("snapshotCreated") or {}).get(
                        "name"
                    )
                    if not created:
                        return None, f"trigger {name} completed without naming its PodSnapshot"
                    snapshot = created
                    continue
                if triggered.get("status") == "False" and triggered.get("reason") in (
                    "Failed",
                    "Error",
                ):
                    why = triggered.get("message") or triggered["reason"]
                    return None, f"the pod snapshot failed (trigger {name}: {why})"
                on_phase(
                    f"Pod snapshot: trigger {name} waits for the node's agent ({waited:.0f} s)"
                )
            else:
                found = await asyncio.to_thread(kube.get_snapshot, namespace, snapshot)
                ready = condition(found, "Ready") or {}
                if ready.get("status") == "True":
                    return snapshot, ""
                if ready.get("status") == "False" and ready.get("reason") in ("Failed", "Error"):
                    return (
                        None,
                        f"PodSnapshot {snapshot} failed: {ready.get('message') or ready['reason']}",
                    )
                on_phase(f"Pod snapshot: {snapshot} is being written ({waited:.0f} s)")
            await asyncio.sleep(self.settings.poll_seconds)
        return (
            None,
            f"the pod snapshot timed out after {self.settings.snapshot_timeout_seconds:.0f} s",
        )

    async def _workload_snapshot(self, on_phase: PhaseCallback, started: float) -> SnapshotOutcome:
        """gVisor's workload trigger: write ``1``, read ``resume``, ``restore`` or ``error``."""
        path = self.settings.gvisor_checkpoint
        on_phase("Pod snapshot: gVisor is checkpointing the pod")
        try:
            result = await asyncio.wait_for(
                asyncio.to_thread(_gvisor_checkpoint, path),
                timeout=self.settings.snapshot_timeout_seconds,
            )
        except TimeoutError:
            return SnapshotOutcome(
                None, f"{path} gave no answer in {self.settings.snapshot_timeout_seconds:.0f} s"
            )
        except OSError as err:
            return SnapshotOutcome(
                None, f"no pod snapshot: {path} cannot be used ({err}): not in GKE Sandbox?"
            )
        if result not in ("resume", "restore"):
            return SnapshotOutcome(None, f"the pod snapshot failed ({path} answered {result!r})")
        name = None
        since = time.time() - (time.monotonic() - started) - 5
        with contextlib.suppress(KubeError):  # it exists; only not named (so not pinned)
            name = await asyncio.to_thread(self._newest_snapshot_since, since)
        return SnapshotOutcome(name, None, resumed_from_snapshot=result == "restore")

    def _newest_snapshot_since(self, since: float) -> str | None:
        newest = None
        for item in self._api().list_snapshots(self.settings.namespace):
            created = epoch((item.get("metadata") or {}).get("creationTimestamp"))
            if (
                created is not None
                and created >= since
                and (newest is None or created >= newest[0])
            ):
                newest = (created, item["metadata"]["name"])
        return None if newest is None else newest[1]

    async def stop_environment(self, state: dict[str, Any]) -> None:
        kube = await self.connected()
        if not self.workspace:
            raise BackendError(self.problem or "this pod belongs to no Workspace")
        snapshot = state.get("snapshot")
        patch = {
            "metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state, sort_keys=True)}},
            "spec": {
                "paused": True,
                # The next pod restores this snapshot, or none: never an older one silently.
                "podTemplate": {"podMetadata": {"annotations": {PIN_ANNOTATION: snapshot}}},
            },
        }
        await asyncio.to_thread(
            kube.patch_workspace, self.settings.namespace, self.workspace, patch
        )

    async def announce(self, state: dict[str, Any]) -> None:
        kube = await self.connected()
        if not self.workspace:
            raise BackendError(self.problem or "this pod belongs to no Workspace")
        patch = {"metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state, sort_keys=True)}}}
        await asyncio.to_thread(
            kube.patch_workspace, self.settings.namespace, self.workspace, patch
        )

    async def environment_facts(self) -> EnvironmentFacts:
        kube = await self.connected()
        pod = await asyncio.to_thread(kube.get_pod, self.settings.namespace, self.settings.pod_name)
        return facts_of(pod)

    async def wait_until_moved(self, instance: str) -> EnvironmentFacts:
        while True:
            try:
                facts = await self.environment_facts()
                if facts.instance and facts.instance != instance:
                    self.pod = await asyncio.to_thread(
                        self._api().get_pod, self.settings.namespace, self.settings.pod_name
                    )
                    return facts
            except BackendError:
                pass  # the pod is being replaced, or the API is away: look again
            await asyncio.sleep(self.settings.poll_seconds)

    # -- snapshot hygiene -------------------------------------------------------------------------
    async def list_snapshots(self) -> list[SnapshotInfo]:
        kube = await self.connected()
        items = await asyncio.to_thread(
            kube.list_snapshots, self.settings.namespace, TRIGGERED_BY_LABEL
        )
        ours = []
        for item in items:
            metadata = item.get("metadata") or {}
            trigger = (metadata.get("labels") or {}).get(TRIGGERED_BY_LABEL) or ""
            if not trigger.startswith(self.trigger_prefix):
                continue
            ready = (condition(item, "Ready") or {}).get("status") == "True"
            ours.append(
                SnapshotInfo(
                    metadata["name"], metadata.get("creationTimestamp") or "", ready, False, trigger
                )
            )
        return sorted(ours, key=lambda s: (s.created, s.name))

    async def expire_snapshots(
        self, keep_last: int, max_age_hours: float, pinned: str | None = None
    ) -> list[str]:
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
                self._api().delete_snapshot, self.settings.namespace, snapshot.name
            )
            deleted.append(snapshot.name)
        return deleted


def facts_of(pod: dict[str, Any]) -> EnvironmentFacts:
    """What a pod object says about its start: its uid, restored or not, pinned snapshot."""
    metadata = pod.get("metadata") or {}
    restored = condition(pod, RESTORED_CONDITION)
    scheduled = condition(pod, "PodScheduled") or {}
    created = epoch(metadata.get("creationTimestamp"))
    started = (
        epoch(scheduled.get("lastTransitionTime")) if scheduled.get("status") == "True" else None
    )
    return EnvironmentFacts(
        instance=metadata.get("uid", ""),
        restored=None if restored is None else restored.get("status") == "True",
        restored_message=(restored or {}).get("message") or (restored or {}).get("reason") or "",
        pinned_snapshot=(metadata.get("annotations") or {}).get(PIN_ANNOTATION),
        waited_seconds=None if created is None or started is None else max(0.0, started - created),
    )


def _gvisor_checkpoint(path: str) -> str:
    """Ask gVisor for a checkpoint of the whole sandbox (blocks until it is written)."""
    with open(path, "w") as request:
        request.write("1")
    with open(path) as answer:
        return answer.read().strip()


def workspace_settings(
    service_account_dir: str, environ: dict[str, str] | None = None, **options: Any
) -> WorkspaceSettings:
    """Settings from the downward API's ``POD_NAME``/``POD_NAMESPACE``, or BackendError."""
    env = dict(os.environ if environ is None else environ)
    missing = [name for name in ("POD_NAME", "POD_NAMESPACE") if not env.get(name)]
    if missing:
        raise BackendError(
            f"the workspace backend needs {' and '.join(missing)} from the downward API "
            "(env: valueFrom: fieldRef: metadata.name / metadata.namespace)"
        )
    return WorkspaceSettings(
        env["POD_NAME"], env["POD_NAMESPACE"], service_account_dir, env, **options
    )
