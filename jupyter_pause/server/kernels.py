"""The notebooks' kernels as jupyter-server runs them: found, followed, watched, and let go.

jupyter-server's session manager says which kernel each notebook uses; ``sync`` matches that
with the records: a new kernel is attached (its GPU adopted, its iopub watched, its process
token learnt), a renamed notebook keeps its session, a notebook that uses another one's kernel
shares that one's record, and a kernel that ended outside a pause gives back what it held.
What a watched kernel reports (a cell ran, ``%pause``, a checkpoint, a restore typed into the
notebook) goes to the ``on_event`` callback: the orchestrator decides what it means.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..backends.base import Backend
from ..formatting import format_bytes, format_count
from ..policy import Policy
from ..records import KernelActivity, SessionRecord
from . import transfer
from .kernel_bridge import KernelBridge, KernelCallError
from .sessions import Sessions, intact_text, resume_target, spec
from .states import IN_FLIGHT_STATES, RUNNING_STATES

log = logging.getLogger(__name__)

#: ``on_event(record, kernel_id, kind, data)``: what a watched kernel reported.
KernelEvent = Callable[[SessionRecord, str, str, dict[str, Any]], Awaitable[None]]


class Kernels:
    """Follows the kernels of the server's notebook sessions."""

    def __init__(
        self,
        sessions: Sessions,
        backend: Backend,
        bridge: KernelBridge,
        session_manager: Any,
        policy: Policy,
        on_event: KernelEvent,
    ) -> None:
        self.sessions = sessions
        self.backend = backend
        self.bridge = bridge
        self.session_manager = session_manager
        self.policy = policy
        self.on_event = on_event
        self.watchers: dict[str, asyncio.Task[None]] = {}  # kernel id -> its iopub watcher
        self.background: set[asyncio.Task[Any]] = set()

    async def sync(self) -> None:
        """Match jupyter-server's notebook sessions with our records; watch new kernels.

        Follows renames (a session keeps its kernel under a new path) and notices kernels
        that ended outside a pause (shut down, culled, notebook deleted): what they held is
        given back to the pool. A notebook whose session uses the kernel of another one
        (JupyterLab's "use the kernel of another session") shares that one's record.
        """
        records, tasks = self.sessions.records, self.sessions.tasks
        sessions = await self.session_manager.list_sessions()
        paths_of: dict[str, list[str]] = {}
        names: dict[str, str] = {}
        for model in sessions:
            path, kernel = model.get("path"), model.get("kernel") or {}
            if path and kernel.get("id"):
                paths_of.setdefault(kernel["id"], []).append(path)
                names[kernel["id"]] = kernel.get("name") or ""
        by_kernel = {r.kernel_id: r for r in records.values() if r.kernel_id}
        for kernel_id, paths in paths_of.items():
            owner = by_kernel.get(kernel_id)
            if owner is not None and owner.path not in paths and paths[0] not in tasks:
                settled = records.get(paths[0])
                if settled is not None and settled is not owner:
                    self._hand_over(owner, settled)
                    owner = None
                else:
                    self._rename(owner, paths[0])
            primary = owner.path if owner is not None and owner.path in paths else paths[0]
            record = records.get(primary)
            if record is None:
                record = SessionRecord(primary, self.sessions.notebook_key(primary))
                records[primary] = record
            self._note_sharing(record, [p for p in paths if p != primary])
            if record.kernel_id == kernel_id:
                continue
            if primary in tasks and record.state in IN_FLIGHT_STATES:
                continue  # our own resume is starting this kernel
            await self.attach(record, kernel_id, names[kernel_id] or record.kernel_name)
        for record in list(records.values()):
            gone = (
                record.kernel_id is not None and record.kernel_id not in self.bridge.kernel_manager
            )
            if gone and record.path not in tasks:
                await self.ended(record)

    def _note_sharing(self, record: SessionRecord, others: list[str]) -> None:
        """Notebooks using ``record``'s kernel. A notebook with a record of its own (its own
        checkpoints) keeps it; while the kernel is paused, those that shared it stay listed
        (their sessions ended with it, and come back with it)."""
        others = [p for p in others if p not in self.sessions.records]
        if record.state in RUNNING_STATES:
            sharing = others
        else:
            sharing = list(dict.fromkeys([*record.sharing_notebooks, *others]))
        if sharing != record.sharing_notebooks:
            record.sharing_notebooks = sharing
            self.sessions.save(record)

    def _rename(self, record: SessionRecord, path: str) -> None:
        """The notebook was renamed while its kernel ran: the session (and its GPU) moves."""
        old, old_key = record.path, record.key
        self.sessions.records.pop(old, None)
        record.path, record.key = path, self.sessions.notebook_key(path)
        self.sessions.records[path] = record
        self.backend.rename(old, path)
        self.sessions.writer.discard(old_key)  # its checkpoints, if any, stay where they are
        self.sessions.save(record)

    def _hand_over(self, placeholder: SessionRecord, record: SessionRecord) -> None:
        """A kernel seen under one path moved to a notebook that has a record of its own.

        JupyterLab 4 starts a notebook's session under a placeholder path (``<folder>/<uuid>``,
        apputils' SessionContext) and moves it to the notebook once the kernel runs. A sync
        that ran in between made a record for the placeholder; renaming that record onto the
        notebook would replace the notebook's own (a paused one would show "Active" and forget
        its pause). The notebook's record is the one that stays: it takes the kernel (and what
        the placeholder was granted), and the placeholder's record goes.
        """
        self.stop_watching(placeholder)
        self.sessions.records.pop(placeholder.path, None)
        self.sessions.writer.discard(placeholder.key)
        if placeholder.gpus and not record.gpus:
            self.backend.rename(placeholder.path, record.path)
        elif placeholder.gpus:  # the notebook already holds its own: give these back
            self.spawn(self.backend.release(spec(placeholder)))

    async def ended(self, record: SessionRecord) -> None:
        """A kernel ended without a pause: release what it held, keep what it saved."""
        self.stop_watching(record)
        await self.backend.release(spec(record))
        if record.gpus:
            record.timeline.add("gpu_released", measured=False, gpus=record.gpus)
        record.timeline.add("kernel_stopped")
        record.busy_seconds_before = record.busy_seconds()
        record.activity = KernelActivity()
        record.kernel_id, record.gpus = None, []
        view = await self.sessions.inspect(record)
        if record.unrestored_kernel:
            # The kernel of a reopened paused notebook ended: it never held the session, so
            # the pause (its checkpoint, its process token) stands as it was.
            record.unrestored_kernel = False
            self.sessions.set(
                record,
                record.state,
                "The new kernel ended before the resume; still paused."
                + intact_text(resume_target(record, view)),
            )
            return
        # The session's own process is gone: nothing can come back live from here on.
        record.paused_process_token, record.paused_checkpoint_id = None, None
        latest = view.latest
        if latest is None:
            self.sessions.save(record)
            self.sessions.records.pop(record.path, None)
            return
        self.sessions.set(
            record,
            "paused",
            "The kernel ended outside jupyter_pause (shut down or culled)." + intact_text(latest),
        )

    async def attach(self, record: SessionRecord, kernel_id: str, kernel_name: str) -> None:
        old = record.kernel_id
        if old and old in self.watchers:
            self.watchers.pop(old).cancel()
        record.busy_seconds_before = record.busy_seconds()
        record.kernel_id, record.kernel_name = kernel_id, kernel_name
        record.activity = KernelActivity(last_activity=self._kernel_last_activity(kernel_id))
        kernel_policy = self.policy.for_kernelspec(kernel_name)
        record.gpus_needed = kernel_policy.gpus
        ours = record.path in self.sessions.tasks  # our own resume attaches the kernel it started
        view = None if ours else await self.sessions.inspect(record)
        latest = view.latest if view is not None else None
        if ours:
            pass
        elif record.state in ("paused", "failed") and view is not None and latest:
            # The notebook was opened again (or its kernel restarted) and JupyterLab started a
            # fresh kernel: the session stays paused (that kernel has none of its state) until
            # the user resumes into it. Its token says nothing about the paused process.
            target = resume_target(record, view) or latest
            record.checkpoint = target
            offer = _resume_offer(target)
            if record.message.startswith(transfer.IMPORTED) and await asyncio.to_thread(
                transfer.untrusted, self.sessions, record
            ):
                offer = record.message  # an import stays one, waiting for its user's trust
            self.sessions.set(record, record.state, offer, unrestored_kernel=True)
        elif record.state not in RUNNING_STATES:
            self.sessions.set(record, "active", "Running.", unrestored_kernel=False)
        if not record.gpus and record.gpus_needed:
            record.gpus = self.backend.adopt(spec(record))
            if record.gpus:
                record.timeline.add("gpu_acquired", gpus=record.gpus)
        self.watchers[kernel_id] = asyncio.create_task(self._watch(record, kernel_id))
        self.spawn(self._hello(record, kernel_id))
        self.sessions.save(record)

    def stop_watching(self, record: SessionRecord) -> None:
        watcher = self.watchers.pop(record.kernel_id or "", None)
        if watcher:
            watcher.cancel()

    def _kernel_last_activity(self, kernel_id: str) -> float:
        """jupyter-server's own idea of the kernel's last activity, for a kernel seen late."""
        manager = self.bridge.kernel_manager
        if kernel_id not in manager:  # get_kernel would answer jupyter-server's HTTP 404
            return time.time()
        seen = getattr(manager.get_kernel(kernel_id), "last_activity", None)
        return float(seen.timestamp()) if seen is not None else time.time()

    async def _hello(self, record: SessionRecord, kernel_id: str) -> None:
        """Load the kernel extension and learn the process token (for live-restore checks)."""
        try:
            answer = await self.bridge.call(kernel_id, "hello", timeout=120, key=record.key)
        except KernelCallError as err:
            log.info("jupyter_pause: kernel %s of %s: %s", kernel_id, record.path, err)
            return
        if record.kernel_id == kernel_id:
            record.process_token = answer.get("token")

    async def _watch(self, record: SessionRecord, kernel_id: str) -> None:
        async def on_event(kind: str, data: dict[str, Any]) -> None:
            await self.on_event(record, kernel_id, kind, data)

        try:
            await self.bridge.watch(kernel_id, record.activity, on_event)
        except KernelCallError:
            return

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background; ``stop`` cancels it."""
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def tasks(self) -> list[asyncio.Task[Any]]:
        """What runs in the background: cancelled when the server stops."""
        return [*self.watchers.values(), *self.background]


def _resume_offer(checkpoint: dict[str, Any]) -> str:
    """``Paused: a new kernel runs without the saved state. Resume restores model,
    optimizer and 10 more (12 variables, 1.2 GB, checkpoint 7) into it.``"""
    names = list(checkpoint.get("variables") or [])
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    what = f"{shown} (" if names else "("
    return (
        "Paused: a new kernel runs without the saved state. Resume restores "
        f"{what}{format_count(len(names), 'variable')}, "
        f"{format_bytes(checkpoint.get('bytes', 0))}, checkpoint {checkpoint['id']}) into "
        "it; what you define in it meanwhile is kept unless the checkpoint holds the same "
        "name."
    )
