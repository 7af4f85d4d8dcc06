"""The kernel-pod backend: each GPU kernel in a pod of its own, paused by deleting that pod.

JupyterLab runs on a small CPU pod; a notebook's kernel of the kernel-pods kernelspec
(``deploy/kernel-pods/``) runs in a pod that ``KernelPodProvisioner`` launches
(``kernel_pod_provisioner.py``). A pause (after the application checkpoint) deletes that pod:
the scheduler has its GPU back, while jupyter-server keeps the kernel, its id and the notebook's
session. A resume is jupyter-server's own restart of that kernel, which the provisioner makes a
new pod under the same id (so the notebook's kernel connection follows the new pod's address).
Resumes go through this server's line (``resume_line.py``): first asked first served, their pods
made at once while GPUs are free, only the first in line keeping a pod the scheduler refused,
which a pause or a kernel shut down on this server makes anew so the GPU freed goes to it at
once (``_hand_off``); a waiting resume says its place and the scheduler's own message. Where the
pause took a pod snapshot (``kernel_pod_snapshots.py``) the new pod pins it and the kernel may be
the very process that paused ("live"); else the orchestrator restores the checkpoint into the
new kernel from files. A resume on CPU skips the line and asks for no GPU. A resume joined by a
second request makes one pod; a cancelled or refused one leaves the kernel paused, its
checkpoint intact.

A kernel that is not a kernel pod (a CPU kernel beside the server) is stopped and started again
as the local backend does, without a GPU queue: the cluster's scheduler is the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
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
from .kernel_pod_provisioner import (
    PROVISIONER_NAME,
    WITHOUT_GPUS_VARIABLE,
    KernelPodProvisioner,
    pod_placement,
)
from .kernel_pod_snapshots import KernelPodSnapshots
from .kernels import forget_unfinished_start, running_kernel, start_kernel
from .resume_line import Placement, ResumeLine

log = logging.getLogger(__name__)

#: Set in a resume's own launch: its restart of the kernel is not a user's Restart Kernel.
_resume_launch = contextvars.ContextVar("jupyter_pause_resume_launch", default=False)

#: jupyter-server's event of a kernel's start, restart, interrupt or shutdown, once done.
KERNEL_ACTIONS = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"


class KernelPodBackend(Backend):
    """Kernels in pods of their own (see the module docstring)."""

    name = "kernel-pod"
    restores_on_cpu = True  # the kernel's new pod asks for no GPU
    pauses_on_server_stop = True  # each kernel pod and its GPU go; the checkpoint stays

    def __init__(
        self,
        kernel_manager: Any,
        session_manager: Any,
        poll_seconds: float = 0.5,
        launches_at_once: int = 1,
        snapshots: KernelPodSnapshots | None = None,
    ) -> None:
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.snapshots = snapshots or KernelPodSnapshots()
        self._resumes: dict[str, asyncio.Task[None]] = {}  # kernel id -> its new pod's launch
        # Resumes whose pod has no node yet, first asked first (``resume_line.py``).
        self._line = ResumeLine(poll_seconds, launches_at_once)
        self._hand_offs: set[asyncio.Task[None]] = set()  # held until done (``_hand_off``)
        self._shut_down: set[str] = set()  # kernels whose resume a shutdown ended (``end_resume``)

    async def join_resume(self, kernel_id: str) -> bool:
        """For a restart of ``kernel_id`` asked elsewhere (a user's Restart Kernel): when a
        resume of that kernel is in flight, wait for it to end (however it ends) and answer
        True; False when there is none, or this is the resume's own restart."""
        launch = self._resumes.get(kernel_id)
        if launch is None or launch.done() or _resume_launch.get():
            return False
        with contextlib.suppress(BaseException):
            await asyncio.shield(launch)
        return True

    async def end_resume(self, kernel_id: str) -> bool:
        """For a shutdown of ``kernel_id`` asked elsewhere (a user's Shut Down Kernel, a culler,
        a deleted notebook): a resume of that kernel in flight ends first, as a cancel does (its
        pod deleted, the session paused, saying why), so that jupyter-server shuts down a kernel
        that is not starting. True when there was one to end."""
        launch = self._resumes.get(kernel_id)
        if launch is None or launch.done() or _resume_launch.get():
            return False
        self._shut_down.add(kernel_id)
        launch.cancel()
        with contextlib.suppress(BaseException):
            await launch
        return True

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
        details: dict[str, Any] = {"kernel_pod": pod}
        snapshot = None
        if pod:
            taken = await self.snapshots.take(provisioner.kernel_namespace, pod)
            snapshot = taken.name
            if snapshot is None:
                details["snapshot_problem"] = taken.problem
            else:
                details["seconds"] = round(taken.seconds, 3)
        try:
            await provisioner.pause()
        except KernelPodError as err:
            if snapshot is not None:  # the kernel runs on: its snapshot would only cost
                await self.snapshots.drop(provisioner.kernel_namespace, snapshot)
            raise BackendError(str(err)) from None
        provisioner.snapshot = snapshot  # the resume's pod pins it
        self._hand_off()
        namespace = provisioner.kernel_namespace
        provisioner.drop_snapshot = lambda name: self.snapshots.drop(namespace, name)
        # The pod is gone from the API server: the scheduler can place another pod on its GPU.
        gone = time.time()
        return StopOutcome(gone, gone, True, snapshot=snapshot, kernel_kept=True, details=details)

    # -- resume -----------------------------------------------------------------------------------
    async def request_resources(self, session: SessionSpec, on_queued: QueueCallback) -> Allocation:
        """For a paused kernel pod: its new pod, scheduled and running (the scheduler places it,
        this server's line orders the resumes); ``on_queued`` hears the place in the line and the
        scheduler's reason while the resume waits."""
        kernel_id = session.kernel_id
        provisioner = self.provisioner(kernel_id)
        if kernel_id is None or provisioner is None:
            return await self._new_kernel_pod(session, on_queued)
        launch = self._resumes.get(kernel_id)
        if launch is not None and launch.done():  # ended; its callback has not run yet
            launch = None
        if launch is None:
            if not provisioner.paused:
                return Allocation(granted_at=time.time())
            if session.gpus == 0:  # on CPU: no GPU to wait in line for
                launch = self._track(kernel_id, self._restart(kernel_id, gpus=False))
            else:

                async def look() -> Placement:  # a kernel still paused has no new pod yet
                    return provisioner.placed and not provisioner.paused, provisioner.waiting_reason

                launch = self._join_line(
                    kernel_id, session.path, lambda: self._restart(kernel_id), look,
                    give_back=lambda: self._pause_again(kernel_id),
                )  # fmt: skip
        await self._follow(kernel_id, launch, on_queued)
        return Allocation(
            granted_at=time.time(), details={"kernel_pod": provisioner.container_name}
        )

    async def _new_kernel_pod(self, session: SessionSpec, on_queued: QueueCallback) -> Allocation:
        """A paused notebook whose kernel the server no longer has (the server restarted, the
        kernel was shut down or culled): for a kernel-pods kernelspec a new kernel, whose pod
        is waited for the same way (read from the API server, in the namespace of
        ``KERNEL_NAMESPACE``); a restore then fills it from files."""
        running = await running_kernel(self.kernel_manager, self.session_manager, session.path)
        if running is not None or not self._kernel_pod_spec(session.kernel_name):
            return Allocation(granted_at=time.time())
        kernel_id = str(uuid.uuid4())
        if session.gpus == 0:  # on CPU: a pod that asks for no GPU, no line to wait in
            await self._start(session, kernel_id, {WITHOUT_GPUS_VARIABLE: "1"})
            return Allocation(granted_at=time.time(), details={"kernel_id": kernel_id})
        namespace = os.environ.get("KERNEL_NAMESPACE")

        async def look() -> Placement:
            if not namespace:
                return True, None
            return await asyncio.to_thread(pod_placement, namespace, kernel_id)

        launch = self._join_line(
            kernel_id, session.path, lambda: self._start(session, kernel_id), look
        )
        await self._follow(kernel_id, launch, on_queued)
        return Allocation(granted_at=time.time(), details={"kernel_id": kernel_id})

    def _join_line(
        self,
        kernel_id: str,
        path: str,
        start: Callable[[], Awaitable[None]],
        look: Callable[[], Awaitable[Placement]],
        give_back: Callable[[], Awaitable[None]] | None = None,
    ) -> asyncio.Task[None]:
        """The resume of ``kernel_id`` takes the last place in this server's line, which
        launches it (``start``) when the line's rules let it (``resume_line.py``): GPUs handed
        out in request order, none left free while a resume waits. ``look`` reads its pod;
        ``give_back`` deletes it again when a resume before it should have had its node (a
        paused kernel's resume; a new kernel pod keeps the node it got)."""
        return self._track(kernel_id, self._line.serve(kernel_id, path, start, look, give_back))

    def _track(self, kernel_id: str, launch: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """``launch`` as the kernel's resume in flight, which later requests join; once it
        ends it lets go of that place only while it still holds it (a resume asked meanwhile,
        after a cancel, may hold it already)."""
        task = asyncio.create_task(launch)
        self._resumes[kernel_id] = task
        self._shut_down.discard(kernel_id)

        def forget(done: asyncio.Task[None]) -> None:
            if self._resumes.get(kernel_id) is done:
                del self._resumes[kernel_id]

        task.add_done_callback(forget)
        return task

    async def _follow(
        self, kernel_id: str, launch: asyncio.Task[None], on_queued: QueueCallback
    ) -> None:
        """Wait for ``launch``, telling ``on_queued`` the place in this server's line and the
        scheduler's reason while the resume waits for a GPU; a cancelled wait cancels the
        launch (its pod deleted, if it had one)."""
        told = None
        try:
            while not launch.done():
                waiting = self._line.waiting(kernel_id)
                if waiting is not None:
                    text = _waiting_text(*waiting)
                    if text != told:
                        on_queued(waiting[0], text)
                        told = text
                await self._line.until_changed(launch)
        except asyncio.CancelledError:
            # The resume was cancelled: so is the launch, whose pod is deleted (still paused).
            launch.cancel()
            with contextlib.suppress(BaseException):
                await launch
            raise
        if launch.cancelled() and kernel_id in self._shut_down:
            self._shut_down.discard(kernel_id)
            raise StillPaused("its kernel was shut down while it waited; a resume starts a new one")
        launch.result()  # StillPaused, with why

    def _kernel_pod_spec(self, kernel_name: str) -> bool:
        """Whether the kernelspec's kernels are kernel pods (its provisioner is ours)."""
        try:
            spec = self.kernel_manager.kernel_spec_manager.get_kernel_spec(kernel_name)
        except Exception:  # no such kernelspec (any more): start_kernel will say so
            return False
        provisioner = (spec.metadata or {}).get("kernel_provisioner") or {}
        return provisioner.get("provisioner_name") == PROVISIONER_NAME

    async def _start(
        self, session: SessionSpec, kernel_id: str, env: dict[str, str] | None = None
    ) -> None:
        try:
            await start_kernel(
                self.kernel_manager, self.session_manager, session, env or {}, kernel_id=kernel_id
            )
        except BackendError as err:
            raise StillPaused(str(err)) from None

    async def _restart(self, kernel_id: str, gpus: bool = True) -> None:
        """jupyter-server's restart of the paused kernel: a new pod under its id (``gpus``
        False: a pod that asks for none)."""
        _resume_launch.set(True)  # in this launch's task only
        provisioner = self.provisioner(kernel_id)
        if provisioner is not None:
            provisioner.on_placed = self._line.nudge
            provisioner.without_gpus = not gpus
            # a GPU process's snapshot needs its GPU; on CPU it is spent unused
            provisioner.pin_snapshot = provisioner.snapshot if gpus else None
        try:
            # Returns once the new pod's kernel sent its connection info. Its kernel_info
            # future is not awaited: on a restart that changes the ports (a new pod always
            # does) jupyter-server 2.x cancels its own wait without resolving it. The
            # orchestrator's first request to the kernel waits for it instead.
            await self.kernel_manager.restart_kernel(kernel_id, now=True)
        except KernelPodError as err:
            raise StillPaused(str(err)) from None
        except Exception as err:  # the launcher's or the kernel's failure, as jupyter says it
            raise StillPaused(f"the kernel pod could not be started again: {err}") from None
        except asyncio.CancelledError:
            # Cancelled (or withdrawn from the line) while it waited, or just after its kernel
            # answered: the kernel is paused again, as before the restart.
            forget_unfinished_start(self.kernel_manager, kernel_id)
            with contextlib.suppress(Exception):
                await self._pause_again(kernel_id)
            raise
        finally:
            if provisioner is not None:
                provisioner.on_placed = None

    async def _pause_again(self, kernel_id: str) -> None:
        """A resume's new pod, whose kernel already answered, goes again and the kernel stays
        paused: the resume was cancelled, or gives the node back to a resume before it in line.
        Its GPU is not held by a kernel that waits."""
        provisioner = self.provisioner(kernel_id)
        if provisioner is not None and not provisioner.paused and provisioner.container_name:
            await provisioner.pause()
            self._hand_off()

    def follow_shutdowns(self, event_logger: Any) -> None:
        """Hand on the GPU of each kernel shut down (by its user, a culler, a deleted
        notebook) as a pause's is: jupyter-server's ``event_logger`` says when a shutdown is
        done, and gateway-provisioners deleted its pod at once (grace period 0)."""

        async def on_action(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
            if data.get("action") == "shutdown" and data.get("status") == "success":
                self._hand_off()

        event_logger.add_listener(schema_id=KERNEL_ACTIONS, listener=on_action)

    def _hand_off(self) -> None:
        """A pod of this server's is gone from its node (a pause, a give-back, a kernel shut
        down): the first resume in line, when the scheduler refused its pod, has that pod made
        anew (``KernelPodProvisioner.requeue``), which the scheduler tries at once. Else the
        freed GPU stays idle until the scheduler's backoff for the refused pod ends (up to
        10 s; ``bench/kernel_pods_rush.py``). In the background: a pause does not wait for it."""
        key = self._line.first_refused()
        provisioner = self.provisioner(key)
        if key is None or provisioner is None:
            return
        task = asyncio.create_task(self._requeue(key, provisioner))
        self._hand_offs.add(task)
        task.add_done_callback(self._hand_offs.discard)

    async def _requeue(self, kernel_id: str, provisioner: KernelPodProvisioner) -> None:
        try:
            if await asyncio.to_thread(provisioner.requeue):
                log.info("Kernel %s: its refused pod made anew for a GPU just freed", kernel_id)
        except KernelPodError as err:  # its launch ends with the same error
            log.warning("Kernel %s: %s", kernel_id, err)

    async def restore(self, session: SessionSpec, allocation: Allocation) -> RestoreOutcome:
        started = allocation.details.get("kernel_id")
        if started is not None:  # a new kernel pod (the paused kernel was gone)
            return RestoreOutcome(started, live=False, details={"kernel_pod": "new"})
        provisioner = self.provisioner(session.kernel_id)
        if provisioner is not None:
            assert session.kernel_id is not None
            details = dict(allocation.details)
            restored = provisioner.restored_from
            if restored:
                details["snapshot"] = restored
            return RestoreOutcome(
                session.kernel_id, live=bool(restored), details=details, moved=True
            )
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
            queue=self._line.paths(),
            details={"scheduler": "the cluster's kube-scheduler places each kernel pod"},
        )


def ordinal(place: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= place % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(place % 10, "th")
    return f"{place}{suffix}"


def _waiting_text(place: int, reason: str | None) -> str:
    """``2nd in line; 1 resume on this server gets a GPU first`` or ``1st in line; the scheduler
    says: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.`` (the notebook's chip shows
    the part before the first ``;``: "Waiting for GPU (2nd in line)")."""
    parts = [f"{ordinal(place)} in line"]
    if place > 1:
        ahead = place - 1
        parts.append(f"{ahead} resume{'s' if ahead > 1 else ''} on this server "
                     f"get{'' if ahead > 1 else 's'} a GPU first")  # fmt: skip
    if reason:
        parts.append(f"the scheduler says: {reason}")
    return "; ".join(parts)
