"""What the platform does to this server's Workspace and pod by itself, seen from inside the pod.

A pause may start outside jupyter_pause: the Kubeflow / GKE Workspaces dashboard's Pause,
``kubectl patch``, a culler. Each sets the Workspace's ``spec.paused``; with the GKE Workspaces
add-on, its webhook holds that back (``checkpoint-state: Checkpointing``) while the pod runs
on for its snapshot, then the snapshot stops the pod's processes, this server with them, and
a start thaws them in a new pod. ``WorkspaceWatch`` follows the Workspace (a watch by name,
the API server's, on a thread of its own) and says:

* ``on_pause(PlatformPause)`` once for each pause it sees begin: the add-on holding one, or
  ``spec.paused`` set while this pod runs. Whose pause it is, the environment knows (its own
  ask is one of them);
* ``on_moved(pod)`` when this process runs in another pod than the one it last saw: thawed
  from a snapshot it did not see coming. The pod is read again at every change of the
  Workspace and after every stretch in which this process did not run (a freeze shows as a
  gap in a one-second tick, on the wall clock or the monotonic one): nothing read before a
  freeze is trusted after it.

Where RBAC does not allow the watch (an older Role), the Workspace is read every
``poll_seconds`` instead, and the status says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .base import PlatformPause
from .gke_workspaces import CHECKPOINT_STARTED_AT, CHECKPOINT_STATE, CHECKPOINTING
from .kube import Kube, KubeError, epoch

log = logging.getLogger(__name__)

#: How long the API server keeps one watch open before this side opens the next.
WATCH_SECONDS = 240
#: A tick of the freeze detector, and the gap past which this process was not running.
TICK_SECONDS = 1.0
FROZEN_GAP_SECONDS = 5.0


def platform_pause(workspace: dict[str, Any]) -> PlatformPause | None:
    """The pause a Workspace object shows, or None: held by the GKE Workspaces add-on (asked at
    its ``checkpoint-started-at``), or ``spec.paused`` set (the pod is being stopped)."""
    annotations = (workspace.get("metadata") or {}).get("annotations") or {}
    if annotations.get(CHECKPOINT_STATE) == CHECKPOINTING:
        asked = epoch(annotations.get(CHECKPOINT_STARTED_AT))
        return PlatformPause(True, asked if asked is not None else time.time())
    if (workspace.get("spec") or {}).get("paused"):
        return PlatformPause(False, time.time())
    return None


class WorkspaceWatch:
    """Follows one Workspace and its pod for the environment (see the module's docstring)."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        workspace: str,
        pod_name: str,
        instance: str,
        on_pause: Callable[[PlatformPause], Awaitable[None]],
        on_moved: Callable[[dict[str, Any]], Awaitable[None]],
        poll_seconds: float = 1.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.workspace = workspace
        self.pod_name = pod_name
        self.instance = instance  # the uid of the pod this process last knew it ran in
        self.on_pause = on_pause
        self.on_moved = on_moved
        self.poll_seconds = poll_seconds
        self.problem: str | None = None  # why the watch cannot be used (polling instead)
        self._paused = False  # a pause is on: reported once, until the Workspace runs again
        self._changes: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._stopped = threading.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=self._watch, args=(loop,), name="jupyter-pause-workspace-watch", daemon=True
        )
        thread.start()  # a daemon: a watch blocked in a read never holds the server's exit
        self._tasks = [
            asyncio.create_task(self._react()),
            asyncio.create_task(self._notice_freezes()),
        ]

    async def close(self) -> None:
        self._stopped.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- the Workspace, on the watch's thread ----------------------------------------------------
    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        def deliver(workspace: dict[str, Any] | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped
                loop.call_soon_threadsafe(self._changes.put_nowait, workspace)

        backoff = self.poll_seconds
        while not self._stopped.is_set():
            try:
                if self.problem is None:
                    for kind, workspace in self.kube.watch_workspace(
                        self.namespace, self.workspace, WATCH_SECONDS
                    ):
                        if self._stopped.is_set():
                            return
                        if kind in ("ADDED", "MODIFIED"):
                            deliver(workspace)
                else:  # no watch allowed: read it now and then instead
                    deliver(self.kube.get_workspace(self.namespace, self.workspace))
                    self._stopped.wait(self.poll_seconds)
                backoff = self.poll_seconds
            except KubeError as err:
                if err.kind == "forbidden" and self.problem is None:
                    self.problem = (
                        f"the Workspace cannot be watched ({err}); it is read every "
                        f"{self.poll_seconds:g} s instead"
                    )
                    log.warning("jupyter_pause: %s", self.problem)
                    continue
                if err.status != 410:  # 410: the watch expired; open the next one at once
                    log.info("jupyter_pause: watching Workspace %s: %s", self.workspace, err)
                    self._stopped.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                deliver(None)  # a gap in what was seen: look at the pod again

    # -- on the server's event loop ----------------------------------------------------------------
    async def _react(self) -> None:
        seen = None  # the version of the Workspace last looked at (a read finds it unchanged)
        while True:
            workspace = await self._changes.get()
            if workspace is not None:
                version = (workspace.get("metadata") or {}).get("resourceVersion")
                if version is not None and version == seen:
                    continue
                seen = version
            try:
                await self._check_pod()
                if workspace is not None:
                    await self._check_pause(workspace)
            except Exception:  # the watch must outlive anything one change does
                log.exception("jupyter_pause: a change of Workspace %s", self.workspace)

    async def _check_pause(self, workspace: dict[str, Any]) -> None:
        pause = platform_pause(workspace)
        if pause is not None and not self._paused:
            # A change may have waited out a freeze in the stream: only a pause still on now
            # is one (the one seen may be over, this process thawed in a new pod since).
            try:
                now = await asyncio.to_thread(
                    self.kube.get_workspace, self.namespace, self.workspace
                )
            except KubeError:
                return  # the next change, or the next read, looks again
            pause = platform_pause(now)
        if pause is None:
            self._paused = False
            return
        if self._paused:
            return
        self._paused = True
        await self.on_pause(pause)

    async def _check_pod(self) -> None:
        """Read the pod this process runs in: another one than before means a thaw."""
        try:
            pod = await asyncio.to_thread(self.kube.get_pod, self.namespace, self.pod_name)
        except KubeError:
            return  # between two pods, or the API away: the next change looks again
        uid = (pod.get("metadata") or {}).get("uid")
        if uid and uid != self.instance:
            self.instance = uid
            await self.on_moved(pod)

    async def _notice_freezes(self) -> None:
        """A tick that came late by more than ``FROZEN_GAP_SECONDS`` (this process was stopped,
        and perhaps thawed in another pod): look at the pod again."""
        while True:
            wall, steady = time.time(), time.monotonic()
            await asyncio.sleep(TICK_SECONDS)
            gap = max(time.time() - wall, time.monotonic() - steady) - TICK_SECONDS
            if gap > FROZEN_GAP_SECONDS:
                log.info("jupyter_pause: this process did not run for %.0f s", gap)
                self._changes.put_nowait(None)
