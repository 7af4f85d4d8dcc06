"""The kernel-pod backend: each GPU kernel in a pod of its own, paused by deleting that pod.

JupyterLab runs on a small CPU pod; a notebook's kernel of the kernel-pods kernelspec
(``deploy/kernel-pods/``) runs in a pod that ``KernelPodProvisioner`` launches
(``kernel_pod_provisioner.py``). A pause (after the application checkpoint) deletes that pod:
the scheduler has its GPU back, while jupyter-server keeps the kernel, its id and the notebook's
session. A resume is jupyter-server's own restart of that kernel, which the provisioner makes a
new pod under the same id (so the notebook's kernel connection follows the new pod's address).
While the scheduler has no room for it, the resume waits with the scheduler's own message and
its place among this server's resumes waiting; then the orchestrator restores the checkpoint
into the new kernel (a new process: always "files"). A resume joined by a second request makes
one pod; a cancelled or refused one leaves the kernel paused, its checkpoint intact.

A kernel that is not a kernel pod (a CPU kernel beside the server) is stopped and started again
as the local backend does, without a GPU queue: the cluster's scheduler is the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from .base import (
    Allocation,
    Backend,
    BackendError,
    QueueCallback,
    ResourceStatus,
    RestoreOutcome,
    SessionSpec,
    StillPaused,
    StopOutcome,
)
from .kernel_pod import KernelPodError
from .kernel_pod_provisioner import PROVISIONER_NAME, KernelPodProvisioner, pending_reason
from .kernels import running_kernel, start_kernel

log = logging.getLogger(__name__)


class KernelPodBackend(Backend):
    """Kernels in pods of their own (see the module docstring)."""

    name = "kernel-pod"

    def __init__(
        self, kernel_manager: Any, session_manager: Any, poll_seconds: float = 0.5
    ) -> None:
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.poll_seconds = poll_seconds
        self._resumes: dict[str, asyncio.Task[None]] = {}  # kernel id -> its new pod's launch
        # Resumes waiting for the scheduler, first asked first: kernel id -> notebook path.
        self._waiting: dict[str, str] = {}

    def provisioner(self, kernel_id: str | None) -> KernelPodProvisioner | None:
        """The kernel's provisioner when it is a kernel pod known to jupyter-server."""
        if kernel_id is None or kernel_id not in self.kernel_manager:
            return None
        found = getattr(self.kernel_manager.get_kernel(kernel_id), "provisioner", None)
        return found if isinstance(found, KernelPodProvisioner) else None

    # -- pause ------------------------------------------------------------------------------------
    async def stop(self, session: SessionSpec) -> StopOutcome:
        kernel_id = session.kernel_id
        if kernel_id is None or kernel_id not in self.kernel_manager:
            raise BackendError("the notebook has no running kernel to stop")
        provisioner = self.provisioner(kernel_id)
        if provisioner is None:  # a kernel beside the server: stopped, started again later
            await self.kernel_manager.shutdown_kernel(kernel_id)
            return StopOutcome(time.time(), None, False)
        pod = provisioner.container_name
        try:
            await provisioner.pause()
        except KernelPodError as err:
            raise BackendError(str(err)) from None
        # The pod is gone from the API server: the scheduler can place another pod on its GPU.
        gone = time.time()
        return StopOutcome(gone, gone, True, kernel_kept=True, details={"kernel_pod": pod})

    # -- resume -----------------------------------------------------------------------------------
    async def request_resources(self, session: SessionSpec, on_queued: QueueCallback) -> Allocation:
        """For a paused kernel pod: its new pod, scheduled and running (the scheduler is the
        queue); ``on_queued`` hears the scheduler's reason while the pod waits for a node."""
        kernel_id = session.kernel_id
        provisioner = self.provisioner(kernel_id)
        if kernel_id is None or provisioner is None:
            return await self._new_kernel_pod(session, on_queued)
        launch = self._resumes.get(kernel_id)
        if launch is None:
            if not provisioner.paused:
                return Allocation(granted_at=time.time())
            launch = asyncio.create_task(self._launch(kernel_id))
            self._resumes[kernel_id] = launch
            launch.add_done_callback(lambda _: self._resumes.pop(kernel_id, None))

        async def reason() -> str | None:
            return provisioner.waiting_reason

        await self._follow(kernel_id, session.path, launch, reason, on_queued)
        return Allocation(
            granted_at=time.time(), details={"kernel_pod": provisioner.container_name}
        )

    async def _new_kernel_pod(self, session: SessionSpec, on_queued: QueueCallback) -> Allocation:
        """A paused notebook whose kernel the server no longer has (the server restarted, the
        kernel was shut down or culled): for a kernel-pods kernelspec a new kernel, whose pod
        is waited for the same way (its reason read from the API server, in the namespace of
        ``KERNEL_NAMESPACE``); a restore then fills it from files."""
        running = await running_kernel(self.kernel_manager, self.session_manager, session.path)
        if running is not None or not self._kernel_pod_spec(session.kernel_name):
            return Allocation(granted_at=time.time())
        kernel_id = str(uuid.uuid4())
        namespace = os.environ.get("KERNEL_NAMESPACE")
        launch = asyncio.create_task(self._start(session, kernel_id))

        async def reason() -> str | None:
            if not namespace:
                return None
            return await asyncio.to_thread(pending_reason, namespace, kernel_id)

        await self._follow(kernel_id, session.path, launch, reason, on_queued)
        return Allocation(granted_at=time.time(), details={"kernel_id": kernel_id})

    async def _follow(
        self,
        kernel_id: str,
        path: str,
        launch: asyncio.Task[None],
        reason: Callable[[], Awaitable[str | None]],
        on_queued: QueueCallback,
    ) -> None:
        """Wait for ``launch``, telling ``on_queued`` the scheduler's reason and the place among
        this server's resumes waiting; a cancelled wait cancels the launch (its pod deleted)."""
        told = None
        try:
            while not launch.done():
                why = await reason()
                if why:
                    self._waiting.setdefault(kernel_id, path)
                    place = list(self._waiting).index(kernel_id) + 1
                    text = _waiting_text(why, place, len(self._waiting))
                    if text != told:
                        on_queued(place, text)
                        told = text
                else:
                    self._waiting.pop(kernel_id, None)
                await asyncio.wait({launch}, timeout=self.poll_seconds)
        except asyncio.CancelledError:
            # The resume was cancelled: so is the launch, whose pod is deleted (still paused).
            launch.cancel()
            with contextlib.suppress(BaseException):
                await launch
            raise
        finally:
            self._waiting.pop(kernel_id, None)
        launch.result()  # StillPaused, with why

    def _kernel_pod_spec(self, kernel_name: str) -> bool:
        """Whether the kernelspec's kernels are kernel pods (its provisioner is ours)."""
        try:
            spec = self.kernel_manager.kernel_spec_manager.get_kernel_spec(kernel_name)
        except Exception:  # no such kernelspec (any more): start_kernel will say so
            return False
        provisioner = (spec.metadata or {}).get("kernel_provisioner") or {}
        return provisioner.get("provisioner_name") == PROVISIONER_NAME

    async def _start(self, session: SessionSpec, kernel_id: str) -> None:
        try:
            await start_kernel(
                self.kernel_manager, self.session_manager, session, {}, kernel_id=kernel_id
            )
        except BackendError as err:
            raise StillPaused(str(err)) from None

    async def _launch(self, kernel_id: str) -> None:
        """jupyter-server's restart of the paused kernel: a new pod under its id."""
        try:
            # Returns once the new pod's kernel sent its connection info. Its kernel_info
            # future is not awaited: on a restart that changes the ports (a new pod always
            # does) jupyter-server 2.x cancels its own wait without resolving it. The
            # orchestrator's first request to the kernel waits for it instead.
            await self.kernel_manager.restart_kernel(kernel_id, now=True)
            self._tell_connections(kernel_id)
        except KernelPodError as err:
            raise StillPaused(str(err)) from None
        except Exception as err:  # the launcher's or the kernel's failure, as jupyter says it
            raise StillPaused(f"the kernel pod could not be started again: {err}") from None

    def _tell_connections(self, kernel_id: str) -> None:
        """The open notebooks' websockets hear "restarting", as after jupyter's own automatic
        restart: JupyterLab then opens a new one, whose streams go to the new pod's address
        (jupyter-server connects a websocket's streams once, when it opens)."""
        restarter = getattr(self.kernel_manager.get_kernel(kernel_id), "_restarter", None)
        if restarter is not None:
            restarter._fire_callbacks("restart")

    async def restore(self, session: SessionSpec, allocation: Allocation) -> RestoreOutcome:
        started = allocation.details.get("kernel_id")
        if started is not None:  # a new kernel pod (the paused kernel was gone)
            return RestoreOutcome(started, live=False, details={"kernel_pod": "new"})
        if self.provisioner(session.kernel_id) is not None:
            assert session.kernel_id is not None
            return RestoreOutcome(session.kernel_id, live=False, details=dict(allocation.details))
        existing = await running_kernel(self.kernel_manager, self.session_manager, session.path)
        if existing is not None:  # the notebook was opened again with a new kernel
            return RestoreOutcome(existing, live=False, details={"reused_kernel": True})
        kernel_id = await start_kernel(self.kernel_manager, self.session_manager, session, {})
        return RestoreOutcome(kernel_id, live=False)

    async def release(self, session: SessionSpec) -> None:
        """Nothing is held here: the kernel's pod and its GPU go with the kernel."""

    def describe_resources(self) -> ResourceStatus:
        return ResourceStatus(
            backend=self.name,
            gpus_total=0,  # the cluster's, which the scheduler hands out
            gpus_free=0,
            queue=list(self._waiting.values()),
            details={"scheduler": "the cluster's kube-scheduler places each kernel pod"},
        )


def _waiting_text(reason: str, place: int, waiting: int) -> str:
    """``the scheduler says: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu. (resume
    1 of 2 waiting on this server)``"""
    return f"the scheduler says: {reason} (resume {place} of {waiting} waiting on this server)"
