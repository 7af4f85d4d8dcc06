"""The workspace backend: a Kubeflow Workspace pod (GKE Workspaces too), paused as a whole.

The server and its kernels share the pod and its GPUs. A pause of any notebook pauses the
pod: the orchestrator checkpoints every kernel to the home volume (the PVC outlives the pod),
then this backend snapshots the pod and pauses its Workspace in the **mode** the cluster
offers (``workspace_modes``: the GKE Workspaces add-on, GKE Pod Snapshots with our own
trigger and pin, or no snapshots at all), detected when the server starts and again at each
pause, and named in the status, the chip and the timeline.

Back in a new pod, ``environment_facts`` tells whether the platform restored it from the
snapshot (the pod's ``PodRestored`` condition); the orchestrator adds the proof only the
process itself has (its in-memory token) before it calls anything "live".

The platform pauses the Workspace by itself too (the dashboard, kubectl, a culler):
``watch_platform`` follows the Workspace (``workspace_watch``) and tells the orchestrator. Any
pause may freeze this process and thaw it in another pod, so nothing read of the pod is kept
across one: each pause reads the pod again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import (
    BackendError,
    EnvironmentBackend,
    EnvironmentFacts,
    PhaseCallback,
    PlatformPause,
    ResourceStatus,
    SnapshotInfo,
    SnapshotOutcome,
)
from .gke_workspaces import AddonMode
from .kernels import ServerKernels
from .kube import (
    PIN_ANNOTATION,
    STATE_ANNOTATION,
    WORKSPACE_LABEL,
    Kube,
    KubeError,
    condition,
    epoch,
    gpu_limit,
)
from .pod_snapshots import OwnPolicyMode
from .workspace_modes import (
    GKE_WORKSPACES,
    NO_SNAPSHOTS,
    POD_SNAPSHOTS,
    ModeChoice,
    NoSnapshots,
    SnapshotMode,
    WorkspacePod,
    detect_mode,
)
from .workspace_watch import WorkspaceWatch

log = logging.getLogger(__name__)

#: The pod condition GKE sets on a pod it restored from a snapshot.
RESTORED_CONDITION = "PodRestored"
#: gVisor's file for a workload-triggered checkpoint: write "1", read how it went.
GVISOR_CHECKPOINT = "/proc/gvisor/checkpoint"


#: The mode's reason until the pod and its Workspace have been read (at start, in the
#: background: the server serves meanwhile).
NOT_DETECTED = "not known yet: the pod and its Workspace are being read"


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
    #: How long a process that runs again in a new pod waits for the node to post
    #: ``PodRestored`` (the proof of a live restore) before taking the pod as a cold start.
    restored_condition_seconds: float = 60.0


def detect(service_account_dir: str, environ: dict[str, str]) -> bool:
    """Whether this server runs in a Kubernetes pod that can find itself (auto-detection)."""
    return (
        Path(service_account_dir, "token").is_file()
        and bool(environ.get("KUBERNETES_SERVICE_HOST"))
        and bool(environ.get("POD_NAME"))
        and bool(environ.get("POD_NAMESPACE"))
    )


class WorkspaceBackend(ServerKernels, EnvironmentBackend):
    """Kernels in this pod; a pause snapshots the pod and pauses its Kubeflow Workspace."""

    name = "workspace"

    def __init__(
        self, kernel_manager: Any, session_manager: Any, settings: WorkspaceSettings
    ) -> None:
        super().__init__(kernel_manager, session_manager)
        self.settings = settings
        self.kube: Kube | None = None
        self.pod: dict[str, Any] = {}  # own pod as last read
        self.workspace: str | None = None
        self.problem: str | None = None  # why the cluster cannot be used now, named
        self._connecting: asyncio.Future[None] | None = None
        # How a pause snapshots this pod (detected at start, again at each pause).
        self.mode = ModeChoice(NO_SNAPSHOTS, NOT_DETECTED)
        self._pausing: SnapshotMode | None = None  # the mode of the pause in flight
        self.watch: WorkspaceWatch | None = None  # what the platform does by itself
        self._watching: asyncio.Future[None] | None = None  # the watch, once connected

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
            self.mode = detect_mode(self._target(kube), self.settings.snapshots)
        else:
            self.problem = (
                f"pod {self.settings.pod_name} has no {WORKSPACE_LABEL} label: it is not a "
                "Kubeflow Workspace's pod, so it cannot be paused from here"
            )

    async def close(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(BaseException):
                await self._watching
        if self.watch is not None:
            await self.watch.close()
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
                "mode": self.mode.name,
                "mode_reason": self.mode.why,
                "watch_problem": None if self.watch is None else self.watch.problem,
            },
        )

    # -- the whole pod ----------------------------------------------------------------------------
    def _target(self, kube: Kube) -> WorkspacePod:
        return WorkspacePod(
            kube,
            self.settings.namespace,
            self.settings.pod_name,
            self.pod,
            self.workspace or "",
            self.settings.poll_seconds,
            self.settings.snapshot_timeout_seconds,
        )

    async def snapshot_mode(self) -> SnapshotMode:
        """The mode a pause takes now, for the pod as it is now (both read afresh: a policy may
        have been added, and this process may have been frozen and thawed in another pod)."""
        kube = await self.connected()
        self.pod = await asyncio.to_thread(
            kube.get_pod, self.settings.namespace, self.settings.pod_name
        )
        target = self._target(kube)
        self.mode = await asyncio.to_thread(detect_mode, target, self.settings.snapshots)
        if self.mode.name == GKE_WORKSPACES:
            return AddonMode(target, self.mode)
        if self.mode.name == POD_SNAPSHOTS:
            return OwnPolicyMode(target, self.mode, self.settings.gvisor_checkpoint)
        return NoSnapshots(target, self.mode)

    async def pause_mode(self) -> tuple[str, str]:
        try:
            mode = await self.snapshot_mode()
        except BackendError as err:
            return NO_SNAPSHOTS, str(err)
        return mode.name, mode.choice.why

    async def snapshot_environment(
        self, on_phase: PhaseCallback, ask: bool = True, paused_in: str = ""
    ) -> SnapshotOutcome:
        try:
            mode = await self.snapshot_mode()
        except BackendError as err:
            return SnapshotOutcome(None, f"no pod snapshot: {err}", mode=NO_SNAPSHOTS)
        self._pausing = mode
        if paused_in and mode.target.instance != paused_in:
            # Frozen and thawed in another pod before the snapshot was followed (a pause from
            # outside whose checkpoints took longer than the hold): the pod pins the snapshot
            # it was restored from, and that snapshot says when the old pod stopped.
            pin = facts_of(mode.target.pod).pinned_snapshot
            return SnapshotOutcome(
                pin,
                None,
                resumed_from_snapshot=True,
                mode=mode.name,
                mode_reason=mode.choice.why,
                details={"stopped_at": await self._taken_at(pin)},
            )
        outcome = await mode.snapshot(on_phase, ask)
        outcome.mode, outcome.mode_reason = mode.name, mode.choice.why
        if outcome.name is not None and not outcome.resumed_from_snapshot:
            # Here since the snapshot: still the pod that paused, or already a restored one?
            try:
                facts = await self.environment_facts()
                outcome.resumed_from_snapshot = facts.instance != mode.target.instance
            except BackendError:
                pass
        return outcome

    async def _taken_at(self, snapshot: str | None) -> float | None:
        """When a PodSnapshot was taken (its creation), or None where it cannot be read."""
        if not snapshot:
            return None
        try:
            found = await asyncio.to_thread(
                self._api().get_snapshot, self.settings.namespace, snapshot
            )
        except BackendError:
            return None
        return epoch((found.get("metadata") or {}).get("creationTimestamp"))

    async def watch_platform(
        self,
        on_pause: Callable[[PlatformPause], Awaitable[None]],
        on_moved: Callable[[EnvironmentFacts], Awaitable[None]],
    ) -> None:
        # Once the pod has been read, in the background: the server serves meanwhile.
        self._watching = asyncio.ensure_future(self._watch(on_pause, on_moved))

    async def _watch(
        self,
        on_pause: Callable[[PlatformPause], Awaitable[None]],
        on_moved: Callable[[EnvironmentFacts], Awaitable[None]],
    ) -> None:
        try:
            kube = await self.connected()
        except BackendError:
            return  # the status says why; nothing can be watched
        if not self.workspace or self.watch is not None:
            return

        async def moved(pod: dict[str, Any]) -> None:
            await on_moved(facts_of(pod))

        self.watch = WorkspaceWatch(
            kube,
            self.settings.namespace,
            self.workspace,
            self.settings.pod_name,
            self.instance,
            on_pause,
            moved,
            self.settings.poll_seconds,
        )
        self.watch.start()

    async def hold_platform_pause(self) -> bool:
        if self.mode.name != GKE_WORKSPACES:
            return False  # only the add-on holds a pause for a snapshot
        try:
            return await AddonMode(self._target(await self.connected()), self.mode).hold()
        except BackendError as err:
            log.info("jupyter_pause: holding the add-on's pause: %s", err)
            return True  # the API may be away a moment: try again at the next tick

    async def stop_environment(self, state: dict[str, Any]) -> None:
        await self.connected()
        if not self.workspace:
            raise BackendError(self.problem or "this pod belongs to no Workspace")
        mode = self._pausing or await self.snapshot_mode()
        outcome = SnapshotOutcome(state.get("snapshot"), state.get("snapshot_problem"))
        await mode.pause(state, outcome)

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
        """The facts of the new pod this process runs in once it does. This process running
        again is not the proof of a live restore: the node's ``PodRestored`` is, and the node
        posts it with the pod's status, which may come after the process was thawed. So a new
        pod that does not say yet is watched a while before it counts as a cold start."""
        moved_at: float | None = None
        while True:
            try:
                facts = await self.environment_facts()
                if facts.instance and facts.instance != instance:
                    moved_at = moved_at if moved_at is not None else time.monotonic()
                    waited = time.monotonic() - moved_at
                    if (
                        facts.restored is not None
                        or waited >= self.settings.restored_condition_seconds
                    ):
                        self.pod = await asyncio.to_thread(
                            self._api().get_pod, self.settings.namespace, self.settings.pod_name
                        )
                        return facts
            except BackendError:
                pass  # the pod is being replaced, or the API is away: look again
            await asyncio.sleep(self.settings.poll_seconds)

    # -- snapshot hygiene -------------------------------------------------------------------------
    async def list_snapshots(self) -> list[SnapshotInfo]:
        return await (await self.snapshot_mode()).list_snapshots()

    async def expire_snapshots(
        self, keep_last: int, max_age_hours: float, pinned: str | None = None
    ) -> list[str]:
        return await (await self.snapshot_mode()).expire(keep_last, max_age_hours, pinned)


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
