"""Pause, checkpoint and resume of notebook sessions: the coordinator over their parts.

Plain asyncio, no HTTP: the REST handlers, the idle monitor and ``%pause`` requests all call
the same methods here. Each concern is a part of its own, and this class only builds them,
resolves a notebook path to its record, and sequences them::

    sessions.py      the registry: records, locks, the task in flight, session.json
    kernels.py       jupyter-server's kernels found, attached, watched, let go
    checkpoints.py   checkpoints asked of a running kernel; a running cell is never interrupted
    pausing.py       the pause of one notebook
    resuming.py      the resume of one notebook, live or from files
    idle.py          auto-pause, the checkpoint before the culler, the user's activity
    environment.py   the pause and resume of a whole workspace pod (an EnvironmentBackend)

The states are in ``states.py``. Each state is written to ``session.json`` next to the
notebook's checkpoints, so a server restart finds paused sessions paused. Nothing is ever lost
on a failure: a failed pause leaves the kernel running; a failed resume leaves the checkpoint
intact and says how to recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from ..backends.base import Backend, EnvironmentBackend
from ..kernel import store as store_mod
from ..policy import Policy
from ..records import RecordWriter, SessionRecord
from . import holds, store_view, transfer
from .checkpoints import Checkpoints
from .environment import Environment
from .idle import Idle
from .kernel_bridge import KernelBridge
from .kernels import Kernels
from .mapped_files import held_by_maps
from .pausing import Pauses
from .resuming import Resumes
from .sessions import Sessions
from .states import STATES, Conflict, PauseError, UnknownSession

log = logging.getLogger(__name__)


class Orchestrator:
    """Runs pauses and resumes for the notebooks of one jupyter-server."""

    def __init__(
        self,
        backend: Backend,
        bridge: KernelBridge,
        session_manager: Any,
        policy: Policy,
        store_root: Path,
        root_dir: str,
        cull_idle_seconds: float = 0.0,
    ) -> None:
        self.bridge = bridge
        self.session_manager = session_manager
        self.policy = policy
        self.sessions = Sessions(store_root, root_dir)
        self.kernels = Kernels(
            self.sessions, backend, bridge, session_manager, policy, self._kernel_event
        )
        self.checkpointer = Checkpoints(self.sessions, bridge, policy)
        self.pauses = Pauses(self.sessions, self.kernels, self.checkpointer, backend, bridge)
        self.resumes = Resumes(
            self.sessions, self.kernels, backend, bridge, session_manager, policy
        )
        # A backend that pauses whole environments (a workspace pod) pauses every notebook.
        self.environment = (
            Environment(
                backend,
                self.sessions,
                self.checkpointer,
                bridge,
                policy,
                sync=self.kernels.sync,
                resume=self.resumes.for_environment,
            )
            if isinstance(backend, EnvironmentBackend)
            else None
        )
        self.idle = Idle(
            self.sessions,
            self.kernels,
            self.checkpointer,
            bridge,
            policy,
            pause=self.pause,
            whole_environment=self.environment is not None,
            cull_idle_seconds=cull_idle_seconds,
        )
        self.backend = backend
        self._monitor: asyncio.Task[None] | None = None
        self._collecting: asyncio.Future[dict[str, Any]] | None = None  # the gc in flight
        self.sessions.load()  # paused sessions survive a server restart

    # -- what the parts share --------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return self._backend

    @backend.setter
    def backend(self, backend: Backend) -> None:
        self._backend = backend
        for part in (self.kernels, self.pauses, self.resumes):
            part.backend = backend

    @property
    def cull_idle_seconds(self) -> float:
        """jupyter-server's culler timeout: idle kernels are checkpointed at 80% of it."""
        return self.idle.cull_idle_seconds

    @cull_idle_seconds.setter
    def cull_idle_seconds(self, seconds: float) -> None:
        self.idle.cull_idle_seconds = seconds

    @property
    def records(self) -> dict[str, SessionRecord]:
        return self.sessions.records

    @property
    def writer(self) -> RecordWriter:
        return self.sessions.writer

    @property
    def store_root(self) -> Path:
        return self.sessions.store_root

    @property
    def root_dir(self) -> str:
        return self.sessions.root_dir

    @property
    def problems(self) -> list[str]:
        return self.sessions.problems

    def store_for(self, record: SessionRecord) -> store_mod.NotebookStore:
        return self.sessions.store_for(record)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, monitor_interval: float = 30.0) -> None:
        await self.backend.start()
        if self.environment is not None:
            await self.environment.on_start()
        self._monitor = asyncio.create_task(self._monitor_loop(monitor_interval))

    async def platform_stop(self, budget: float, signal_name: str = "SIGTERM") -> None:
        """The platform is stopping this server (SIGTERM): save every kernel first. In a
        workspace pod, every kernel is checkpointed with the workspace; with kernel pods, each
        notebook is paused (its pod and GPU go), to resume from files once the server is back."""
        if self.environment is not None:
            await self.environment.platform_stop(budget, signal_name)
        elif self.backend.pauses_on_server_stop:
            paused = await self.pauses.pause_all(f"the server is stopping ({signal_name})", budget)
            log.warning("jupyter_pause: %s: %d notebook(s) paused", signal_name, len(paused))

    async def stop(self) -> None:
        tasks = [self._monitor, *self.kernels.tasks(), *self.sessions.tasks.values()]
        if self.environment is not None:
            tasks += [
                self.environment.pausing,
                self.environment.waiting,
                self.environment.restoring,
            ]
        for task in tasks:
            if task is not None:
                task.cancel()
        for task in tasks:
            if task is not None:
                with contextlib.suppress(BaseException):
                    await task
        await self.writer.flush()
        await self.backend.close()

    async def _monitor_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_idle()
                if self.policy.max_age_hours > 0:  # age limits expire without any new checkpoint
                    await self.gc()
            except Exception:  # the monitor must survive anything one notebook does
                log.exception("jupyter_pause: idle check failed")

    # -- requests --------------------------------------------------------------------------------
    async def get(self, path: str) -> SessionRecord:
        """The session of a notebook, its store's hold and problems read afresh.

        A notebook whose session uses another notebook's kernel answers that one's record.
        """
        await self.sync_sessions()
        return await self.sessions.find(path)

    def list(self) -> list[SessionRecord]:
        return self.sessions.list()

    async def sync_sessions(self) -> None:
        """Match jupyter-server's notebook sessions with our records (see ``Kernels.sync``)."""
        await self.kernels.sync()

    async def checkpoint(self, path: str) -> dict[str, Any]:
        """Checkpoint a running session now; returns the kernel's CheckpointResult."""
        return await self.checkpointer.checkpoint(await self.get(path))

    async def pause(self, path: str, reason: str = "user") -> SessionRecord:
        """Start a pause (returns at once with the record; follow its state)."""
        if self.environment is not None:  # every notebook of the environment pauses with it
            origin = (
                "user" if reason == "user" else "idle" if reason.startswith("idle") else "notebook"
            )
            return await self.environment.pause(path, await self.get(path), reason, origin)
        return await self.pauses.start(await self.get(path), reason)

    async def resume(self, path: str, on_cpu: bool = False) -> SessionRecord:
        """Start a resume, or join the one in flight (two tabs, CLI + UI, retries); ``on_cpu``:
        from files into a kernel without a GPU, now (see ``Resumes.start``)."""
        record = await self.get(path)
        if self.environment is not None and self.environment.status()["state"] != "running":
            raise Conflict(
                f"Cannot resume {record.path} here: the whole workspace is "
                f"{self.environment.status()['state']}; resume the workspace (jupyter pause "
                "resume --workspace NAMESPACE/NAME)"
            )
        untrusted = await asyncio.to_thread(transfer.untrusted, self.sessions, record)
        if untrusted is not None:
            raise Conflict(f"Cannot resume {record.path} yet. {untrusted}")
        return await self.resumes.start(record, on_cpu)

    async def cancel(self, path: str) -> SessionRecord:
        """Cancel a resume that waits for resources; the session stays paused."""
        return await self.resumes.cancel(await self.get(path))

    async def accept(self, path: str) -> SessionRecord:
        """The user decides to carry on after an incomplete restore (or a checkpoint that
        lacks most of the one before it): retention applies again (see holds.py)."""
        record = await self.get(path)
        path = record.path
        async with self.sessions.lock(path):
            if not record.hold:
                raise Conflict(f"{path} has no incomplete restore to accept: nothing is held")
            if path in self.sessions.tasks:
                raise Conflict(f"Cannot accept for {path}: a {record.state} is in progress")
            what = holds.what(record)
            await holds.release(self.store_for(record), record)
            record.timeline.add("hold_released", what=what)
            if record.state == "partial":
                self.sessions.set(
                    record,
                    "ready",
                    "Ready: carrying on without what was not restored (accepted).",
                    error=None,
                )
            else:
                self.sessions.save(record)
        return record

    def note_user_activity(self, path: str) -> None:
        self.idle.note_user_activity(path)

    async def check_idle(self, now: float | None = None) -> list[str]:
        """Pause every session idle longer than its policy allows; returns their paths."""
        return await self.idle.check_idle(now)

    # -- what a kernel reports -------------------------------------------------------------------
    async def _kernel_event(
        self, record: SessionRecord, kernel_id: str, kind: str, data: dict[str, Any]
    ) -> None:
        if kind == "cell":
            self.idle.note_return(record, data.pop("idle_since", None))
        if kind == "cell" and record.awaiting_first_cell:
            self.resumes.note_first_cell(record, data)
        elif kind == "request" and data.get("action") == "pause":
            self.kernels.spawn(self._pause_when_idle(record.path, "%pause in the notebook"))
        elif kind == "request" and data.get("action") == "checkpointed":
            await self.checkpointer.note(record, data)
            self.sessions.save(record)
        elif kind == "request" and data.get("action") == "restored":
            await self.resumes.note_restore_in_notebook(record, kernel_id, data.get("result"))
        elif kind == "request" and data.get("action") in ("loading", "loaded"):
            await self.resumes.note_loading(record, kernel_id, data)

    async def _pause_when_idle(self, path: str, reason: str) -> None:
        record = self.records.get(path)
        if record is None:
            return
        while record.activity.busy:  # %pause: the cell that asked must finish first
            await asyncio.sleep(0.1)
        with contextlib.suppress(PauseError):
            await self.pause(path, reason)

    async def held_by_maps(self) -> int:
        """Disk that deleted checkpoint files hold because this server's kernels still map
        them (a lazy restore's arrays); 0 where the kernels are not local processes."""
        manager = self.kernels.bridge.kernel_manager
        pids = []
        for kernel_id in list(manager.list_kernel_ids()):
            with contextlib.suppress(Exception):
                pid = getattr(manager.get_kernel(kernel_id).provisioner, "pid", None)
                if isinstance(pid, int):
                    pids.append(pid)
        return await asyncio.to_thread(held_by_maps, pids, self.store_root)

    # -- timeline, status and collection ---------------------------------------------------------
    def timeline(self, record: SessionRecord) -> dict[str, Any]:
        gpus = max(len(record.gpus), record.gpus_needed)
        accounting = record.timeline.accounting(gpus, record.busy_seconds())
        return {
            "path": record.path,
            "state": record.state,
            "events": record.timeline.to_json(),
            "accounting": accounting.to_json(),
        }

    async def checkpoints(self, path: str) -> dict[str, Any]:
        """A notebook's checkpoints, newest last, damaged ones named, and interrupted ones."""
        store = store_mod.NotebookStore(self.store_root, self.sessions.notebook_key(path))
        listing = await asyncio.to_thread(store_view.list_checkpoints, store)
        if not listing["checkpoints"] and path not in self.records:
            raise UnknownSession(f"No session or checkpoints for {path!r}")
        return {"path": path, **listing}

    async def gc(self) -> dict[str, Any]:
        """Apply the retention policy to every notebook's checkpoints, off the event loop.

        Concurrent calls share the run in flight; it waits for each notebook's lock (a kernel
        writing a checkpoint) on a worker thread, never on the server's loop.
        """
        if self._collecting is None or self._collecting.done():
            self._collecting = asyncio.ensure_future(self._collect())
        return await asyncio.shield(self._collecting)

    async def _collect(self) -> dict[str, Any]:
        result = await asyncio.to_thread(
            store_view.collect_all, self.store_root, self.policy, self.sessions.path_of
        )
        if self.environment is not None:  # the pod snapshots this workspace made, too
            result["snapshots"] = await self.environment.expire_snapshots()
        return result

    async def snapshots(self) -> dict[str, Any]:
        """The pod snapshots of this environment (none where the backend takes none)."""
        if self.environment is None:
            return {"snapshots": [], "problem": None}
        return await self.environment.snapshots()

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the Prometheus collector reports at each scrape."""
        resources = self.backend.describe_resources()
        sessions = dict.fromkeys(STATES, 0)
        totals = {"allocated": 0.0, "active": 0.0, "released": 0.0}
        for record in self.records.values():
            sessions[record.state] += 1
            accounting = self.timeline(record)["accounting"]
            for kind in totals:
                totals[kind] += accounting[f"gpu_seconds_{kind}"]
        return {
            "sessions": sessions,
            "gpus_total": resources.gpus_total,
            "gpus_free": resources.gpus_free,
            "waiting": len(resources.queue),
            **{f"gpu_seconds_{kind}": value for kind, value in totals.items()},
        }
