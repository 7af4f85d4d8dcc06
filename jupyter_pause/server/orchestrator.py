"""Pause, checkpoint and resume of notebook sessions: the state machine and its timeline.

Plain asyncio, no HTTP: the REST handlers, the idle monitor and ``%pause`` requests all call
the same methods here. Per notebook::

    active -> checkpointing -> pausing -> paused -> resuming -> waiting-for-resources
           -> restoring -> ready            (and failed, from any step)

Each state is written to ``session.json`` next to the notebook's checkpoints, so a server
restart finds paused sessions paused. Nothing is ever lost on a failure: a failed pause
leaves the kernel running; a failed resume leaves the checkpoint intact and says how to
recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..backends.base import Backend, BackendError, EnvironmentBackend, SessionSpec
from ..formatting import format_bytes, format_count, format_duration, format_reasons
from ..kernel import store as store_mod
from ..policy import Policy
from ..records import KernelActivity, RecordWriter, SessionRecord, read_folder
from . import holds, metrics, store_view
from .environment import Environment
from .kernel_bridge import KernelBridge, KernelCallError
from .states import (
    IN_FLIGHT_STATES,
    RUNNING_AGAIN,
    RUNNING_STATES,
    STATES,
    Conflict,
    PauseError,
    UnknownSession,
)
from .store_view import StoreView, inspect_store

log = logging.getLogger(__name__)


def restore_shortfall(result: dict[str, Any]) -> dict[str, str]:
    """What a kernel's restore did not bring back: variables and session items, with why.

    Empty when everything came back; anything else is a partial restore, never a success.
    """
    missing = dict(result.get("failed") or {})
    session = result.get("session") or {}
    if isinstance(session, dict):
        missing.update(session.get("failed") or {})
    return missing


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
        self.backend = backend
        self.bridge = bridge
        self.session_manager = session_manager
        self.policy = policy
        self.store_root = Path(store_root)
        self.root_dir = root_dir
        # jupyter-server's own culler kills idle kernels: checkpoint them before it does.
        self.cull_idle_seconds = cull_idle_seconds
        self.records: dict[str, SessionRecord] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}  # the pause or resume in flight
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._monitor: asyncio.Task[None] | None = None
        self._waiting_idle: dict[str, str] = {}  # path -> the pause/checkpoint waiting for idle
        self._collecting: asyncio.Future[dict[str, Any]] | None = None  # the gc in flight
        self._views: dict[str, tuple[Any, StoreView]] = {}  # key -> what its store last showed
        self.writer = RecordWriter(self.store_root)
        # Damaged store content that belongs to no known notebook, named (GET /status).
        self.problems: list[str] = []
        # Notebooks whose kernel ran when the last server process ended (not paused).
        self.interrupted: list[str] = []
        # A backend that pauses whole environments (a workspace pod) pauses every notebook.
        self.environment = (
            Environment(self, backend) if isinstance(backend, EnvironmentBackend) else None
        )
        self._load_records()  # paused sessions survive a server restart

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, monitor_interval: float = 30.0) -> None:
        await self.backend.start()
        if self.environment is not None:
            await self.environment.on_start()
        self._monitor = asyncio.create_task(self._monitor_loop(monitor_interval))

    async def platform_stop(self, budget: float) -> None:
        """The platform is stopping this server (SIGTERM): save every kernel first."""
        if self.environment is not None:
            await self.environment.platform_stop(budget)

    async def stop(self) -> None:
        tasks = [self._monitor, *self._watchers.values(), *self._tasks.values(), *self._background]
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

    def _load_records(self) -> None:
        """Read every notebook's session.json (at start-up, before the server serves).

        One unreadable file affects only its notebook: it is named in a warning and in that
        notebook's status, and its state is rebuilt from its checkpoints.
        """
        try:
            folders = sorted(self.store_root.iterdir()) if self.store_root.is_dir() else []
        except OSError as err:
            self._problem(f"the checkpoint store {self.store_root} cannot be read ({err})")
            return
        for folder in folders:
            if folder.is_dir() or folder.is_symlink():
                self._load_folder(folder)

    def _load_folder(self, folder: Path) -> None:
        record, key, problem = read_folder(folder)
        if record is None and key is not None and problem is not None:
            path = self._path_of(key)
            if path is not None:  # session.json is unreadable: the checkpoints tell the state
                record = SessionRecord(path, key, state="paused")
                problem += "; its state was rebuilt from the checkpoints"
        if record is None:
            if problem:
                self._problem(problem)
            return
        if problem:
            record.file_warnings.append(problem)
        for warning in record.file_warnings:
            log.warning("jupyter_pause: %s: %s", record.path, warning)
        try:
            _stamp, view = inspect_store(self.store_for(record))
        except (OSError, store_mod.StoreError) as err:
            self._problem(f"{folder} cannot be read ({err})")
            return
        record.hold, record.warnings = view.hold, list(view.problems)
        if view.latest and (record.checkpoint or {}).get("id") != view.latest["id"]:
            record.checkpoint = view.latest  # the one a resume restores
        # A new server process never has the kernels of the last one (a workspace pause
        # keeps them recorded until its pod goes).
        record.kernel_id, record.gpus = None, []
        if record.state != "paused" or problem:
            # The server stopped while the kernel ran or mid-way through a pause/resume; its
            # kernels stopped with it. The checkpoint on disk is the truth.
            record.progress = None
            if view.latest is None:
                if problem:
                    self._problem(f"{problem}, but it has no checkpoint to restore")
                return
            if not problem:
                self.interrupted.append(record.path)
            message = (
                "Not running; a checkpoint can be restored."
                if problem
                else f"The server restarted while this notebook was {record.state}."
                + self._intact_text(view.latest)
            )
            self._set(record, "paused", message)
        self.records[record.path] = record

    def _problem(self, text: str) -> None:
        log.warning("jupyter_pause: %s", text)
        self.problems.append(text)

    def _path_of(self, key: str) -> str | None:
        """The server path of a notebook key, or None when it lies outside the server root."""
        rel = os.path.relpath(key, self.root_dir)
        if rel == "." or rel == ".." or rel.startswith(".." + os.sep) or os.path.isabs(rel):
            return None
        return rel.replace(os.sep, "/")

    # -- lookups ---------------------------------------------------------------------------------
    def notebook_key(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.root_dir, path))

    def store_for(self, record: SessionRecord) -> store_mod.NotebookStore:
        return store_mod.NotebookStore(self.store_root, record.key)

    def _lock(self, path: str) -> asyncio.Lock:
        return self._locks.setdefault(path, asyncio.Lock())

    async def get(self, path: str) -> SessionRecord:
        """The session of a notebook, its store's hold and problems read afresh.

        A notebook whose session uses another notebook's kernel answers that one's record.
        """
        await self.sync_sessions()
        record = self.records.get(path) or self._sharing_owner(path)
        if record is not None:
            await self._inspect(record)
            return record
        record = SessionRecord(path, self.notebook_key(path), state="paused")
        view = await self._inspect(record)
        if path in self.records:  # found while we read the store
            return self.records[path]
        if view.latest is None:
            raise UnknownSession(
                f"No session for {path!r}: open the notebook (start a kernel) or check the path"
            )
        # Checkpoints exist (taken from the notebook) but the server never saw a pause.
        record.checkpoint = view.latest
        record.message = "Not running; a checkpoint can be restored."
        self.records[path] = record
        return record

    def _sharing_owner(self, path: str) -> SessionRecord | None:
        return next((r for r in self.records.values() if path in r.sharing_notebooks), None)

    async def _inspect(self, record: SessionRecord) -> StoreView:
        """Read the notebook's store off the event loop; the record shows its hold and problems."""
        try:
            known = self._views.get(record.key)
            self._views[record.key] = await asyncio.to_thread(
                inspect_store, self.store_for(record), known
            )
            view = self._views[record.key][1]
        except (OSError, store_mod.StoreError) as err:
            view = StoreView({}, None, [f"the checkpoint folder cannot be read ({err})"])
        record.hold, record.warnings = view.hold, list(view.problems)
        return view

    def list(self) -> list[SessionRecord]:
        return sorted(self.records.values(), key=lambda r: r.path)

    # -- discovering kernels ---------------------------------------------------------------------
    async def sync_sessions(self) -> None:
        """Match jupyter-server's notebook sessions with our records; watch new kernels.

        Follows renames (a session keeps its kernel under a new path) and notices kernels
        that ended outside a pause (shut down, culled, notebook deleted): what they held is
        given back to the pool. A notebook whose session uses the kernel of another one
        (JupyterLab's "use the kernel of another session") shares that one's record.
        """
        sessions = await self.session_manager.list_sessions()
        paths_of: dict[str, list[str]] = {}
        names: dict[str, str] = {}
        for model in sessions:
            path, kernel = model.get("path"), model.get("kernel") or {}
            if path and kernel.get("id"):
                paths_of.setdefault(kernel["id"], []).append(path)
                names[kernel["id"]] = kernel.get("name") or ""
        by_kernel = {r.kernel_id: r for r in self.records.values() if r.kernel_id}
        for kernel_id, paths in paths_of.items():
            owner = by_kernel.get(kernel_id)
            if owner is not None and owner.path not in paths and paths[0] not in self._tasks:
                self._rename(owner, paths[0])
            primary = owner.path if owner is not None and owner.path in paths else paths[0]
            record = self.records.get(primary)
            if record is None:
                record = SessionRecord(primary, self.notebook_key(primary))
                self.records[primary] = record
            self._note_sharing(record, [p for p in paths if p != primary])
            if record.kernel_id == kernel_id:
                continue
            if primary in self._tasks and record.state in IN_FLIGHT_STATES:
                continue  # our own resume is starting this kernel
            await self._attach(record, kernel_id, names[kernel_id] or record.kernel_name)
        for record in list(self.records.values()):
            gone = (
                record.kernel_id is not None and record.kernel_id not in self.bridge.kernel_manager
            )
            if gone and record.path not in self._tasks:
                await self._kernel_ended(record)

    def _note_sharing(self, record: SessionRecord, others: list[str]) -> None:
        """Notebooks using ``record``'s kernel. A notebook with a record of its own (its own
        checkpoints) keeps it; while the kernel is paused, those that shared it stay listed
        (their sessions ended with it, and come back with it)."""
        others = [p for p in others if p not in self.records]
        if record.state in RUNNING_STATES:
            sharing = others
        else:
            sharing = list(dict.fromkeys([*record.sharing_notebooks, *others]))
        if sharing != record.sharing_notebooks:
            record.sharing_notebooks = sharing
            self._save(record)

    def _rename(self, record: SessionRecord, path: str) -> None:
        """The notebook was renamed while its kernel ran: the session (and its GPU) moves."""
        old = record.path
        self.records.pop(old, None)
        record.path, record.key = path, self.notebook_key(path)
        self.records[path] = record
        self.backend.rename(old, path)
        self._save(record)

    async def _kernel_ended(self, record: SessionRecord) -> None:
        """A kernel ended without a pause: release what it held, keep what it saved."""
        watcher = self._watchers.pop(record.kernel_id or "", None)
        if watcher:
            watcher.cancel()
        await self.backend.release(self._spec(record))
        if record.gpus:
            record.timeline.add("gpu_released", measured=False, gpus=record.gpus)
        record.timeline.add("kernel_stopped")
        record.busy_seconds_before = record.busy_seconds()
        record.activity = KernelActivity()
        record.kernel_id, record.gpus = None, []
        view = await self._inspect(record)
        if record.unrestored_kernel:
            # The kernel of a reopened paused notebook ended: it never held the session, so
            # the pause (its checkpoint, its process token) stands as it was.
            record.unrestored_kernel = False
            self._set(
                record,
                record.state,
                "The new kernel ended before the resume; still paused."
                + self._intact_text(self._resume_target(record, view)),
            )
            return
        # The session's own process is gone: nothing can come back live from here on.
        record.paused_process_token, record.paused_checkpoint_id = None, None
        latest = view.latest
        if latest is None:
            self._save(record)
            self.records.pop(record.path, None)
            return
        self._set(
            record,
            "paused",
            "The kernel ended outside jupyter_pause (shut down or culled)."
            + self._intact_text(latest),
        )

    def _resume_target(self, record: SessionRecord, view: StoreView) -> dict[str, Any] | None:
        """The checkpoint a resume restores: the pause's own while it is intact (a kernel
        without the session's state may have written newer ones since), else the newest."""
        paused = view.checkpoints.get(record.paused_checkpoint_id or -1)
        return paused or view.latest

    async def _attach(self, record: SessionRecord, kernel_id: str, kernel_name: str) -> None:
        old = record.kernel_id
        if old and old in self._watchers:
            self._watchers.pop(old).cancel()
        record.busy_seconds_before = record.busy_seconds()
        record.kernel_id, record.kernel_name = kernel_id, kernel_name
        record.activity = KernelActivity(last_activity=self._kernel_last_activity(kernel_id))
        kernel_policy = self.policy.for_kernelspec(kernel_name)
        record.gpus_needed = kernel_policy.gpus
        ours = record.path in self._tasks  # our own resume attaches the kernel it started
        view = None if ours else await self._inspect(record)
        latest = view.latest if view is not None else None
        if ours:
            pass
        elif record.state in ("paused", "failed") and view is not None and latest:
            # The notebook was opened again (or its kernel restarted) and JupyterLab started a
            # fresh kernel: the session stays paused (that kernel has none of its state) until
            # the user resumes into it. Its token says nothing about the paused process.
            target = self._resume_target(record, view) or latest
            record.checkpoint = target
            self._set(record, record.state, self._resume_offer(target), unrestored_kernel=True)
        elif record.state not in RUNNING_STATES:
            self._set(record, "active", "Running.", unrestored_kernel=False)
        if not record.gpus and record.gpus_needed:
            record.gpus = self.backend.adopt(self._spec(record))
            if record.gpus:
                record.timeline.add("gpu_acquired", gpus=record.gpus)
        self._watchers[kernel_id] = asyncio.create_task(self._watch(record, kernel_id))
        self._spawn(self._hello(record, kernel_id))
        self._save(record)

    @staticmethod
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
            if kind == "cell":
                self._note_return(record, data.pop("idle_since", None))
            if kind == "cell" and record.awaiting_first_cell:
                record.awaiting_first_cell = False
                event = record.timeline.add("first_cell_executed", **data)
                resumed = record.timeline.last("resume_requested")
                if resumed is not None:
                    metrics.resume_to_next_cell(event.at - resumed.at)
                self._save(record)
            elif kind == "request" and data.get("action") == "pause":
                self._spawn(self._pause_when_idle(record.path, "%pause in the notebook"))
            elif kind == "request" and data.get("action") == "checkpointed":
                await self._note_checkpoint(record, data)
                self._save(record)
            elif kind == "request" and data.get("action") == "restored":
                await self._note_restore_in_notebook(record, kernel_id, data.get("result"))

        try:
            await self.bridge.watch(kernel_id, record.activity, on_event)
        except KernelCallError:
            return

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- state changes ---------------------------------------------------------------------------
    def _set(self, record: SessionRecord, state: str, message: str, **fields: Any) -> None:
        if state != record.state:
            record.since = time.time()
        record.state, record.message = state, message
        for name, value in fields.items():
            setattr(record, name, value)
        self._save(record)

    def _save(self, record: SessionRecord) -> None:
        self.writer.save(record)

    def _spec(self, record: SessionRecord) -> SessionSpec:
        return SessionSpec(
            path=record.path,
            key=record.key,
            kernel_name=record.kernel_name,
            kernel_id=record.kernel_id,
            gpus=record.gpus_needed,
            checkpoint_id=(record.checkpoint or {}).get("id"),
            busy=record.activity.busy,
        )

    # -- checkpoint ------------------------------------------------------------------------------
    async def checkpoint(self, path: str) -> dict[str, Any]:
        """Checkpoint a running session now; returns the kernel's CheckpointResult."""
        record = await self.get(path)
        self._refuse_if_waiting(record, "checkpoint")
        async with self._lock(record.path):
            self._require_running(record, "checkpoint")
            await self._wait_idle(record, "checkpoint")
            result, _token = await self._checkpoint(record, reason="manual", then=record.state)
            return result

    async def _checkpoint(
        self, record: SessionRecord, reason: str, then: str
    ) -> tuple[dict[str, Any], str | None]:
        """The kernel's CheckpointResult, and the token of the process that wrote it (from
        this very answer: a pause records it as the token its resume must show)."""
        assert record.kernel_id is not None
        message = record.message
        self._set(
            record,
            "checkpointing",
            "Saving the session state.",
            error=None,
            progress={"phase": "starting", "done": 0, "total": 0},
        )
        poller = asyncio.create_task(self._poll_progress(record))
        try:
            answer = await self.bridge.call(
                record.kernel_id,
                "checkpoint",
                self.policy.kernel_call_timeout_seconds,
                key=record.key,
                reason=reason,
            )
        except KernelCallError as err:
            answer = {"ok": False, "error": str(err)}
        finally:
            poller.cancel()
        if not answer.get("ok") or "result" not in answer:
            answer.setdefault("error", f"unexpected answer from the kernel: {answer}")
            intact = self._intact_text((await self._inspect(record)).latest)
            self._set(
                record,
                then,
                f"Checkpoint failed: {answer['error']}. The session keeps running.",
                progress=None,
                error={
                    "what": f"checkpoint failed: {answer['error']}",
                    "recovery": f"The kernel is still running; nothing was lost.{intact}",
                },
            )
            metrics.checkpoint_failed()
            raise Conflict(f"Checkpoint failed: {answer['error']}")
        result = answer["result"]
        token = answer.get("token")
        record.process_token = token
        await self._note_checkpoint(record, result)
        # A manual checkpoint returns to the state (and message) it interrupted.
        self._set(
            record, then, message if then != "checkpointing" else record.message, progress=None
        )
        return result, token

    async def _note_checkpoint(self, record: SessionRecord, result: dict[str, Any]) -> None:
        """Put a checkpoint on the notebook's timeline, once: the kernel announces every one
        (``%checkpoint``, scheduled ones, and those the server asked for)."""
        checkpoint_id = result.get("checkpoint_id")
        # Checked and added before the first await: the announcement and the server's own
        # call may race; both then wait for the record of the checkpoint.
        if not any(
            event.kind == "checkpoint_written" and event.data.get("checkpoint_id") == checkpoint_id
            for event in record.timeline.events
        ):
            record.timeline.add(
                "checkpoint_written",
                checkpoint_id=checkpoint_id,
                bytes_written=result.get("bytes_written", 0),
                bytes_total=result.get("bytes_total", 0),
                seconds=result.get("seconds", 0.0),
                skipped=result.get("skipped", {}),
                reason=result.get("reason", "manual"),
            )
            metrics.checkpoint_written(int(result.get("bytes_written", 0)))
        view = await self._inspect(record)
        # While paused, the record shows what a resume restores (a kernel without the
        # session's state may write checkpoints meanwhile).
        paused = record.state in ("paused", "failed")
        record.checkpoint = self._resume_target(record, view) if paused else view.latest

    async def _poll_progress(self, record: SessionRecord) -> None:
        progress_file = self.store_for(record).path / "progress.json"
        await asyncio.to_thread(progress_file.unlink, missing_ok=True)
        while True:
            await asyncio.sleep(0.25)
            with contextlib.suppress(OSError, ValueError):
                progress = json.loads(await asyncio.to_thread(progress_file.read_bytes))
                if isinstance(progress, dict):
                    record.progress = progress

    @staticmethod
    def _intact_text(latest: dict[str, Any] | None) -> str:
        """`` Your checkpoint 3 from 18:02 is intact.`` (empty when there is none)."""
        if latest is None:
            return ""
        when = time.strftime("%H:%M", time.localtime(latest["created"]))
        return f" Your checkpoint {latest['id']} from {when} is intact."

    def _require_running(self, record: SessionRecord, action: str) -> None:
        if record.path in self._tasks:
            raise Conflict(f"Cannot {action} {record.path}: a {record.state} is in progress")
        if record.state not in RUNNING_STATES or record.kernel_id is None:
            raise Conflict(f"Cannot {action} {record.path}: it is {record.state}, not running")

    async def _wait_idle(self, record: SessionRecord, action: str) -> None:
        deadline = time.monotonic() + self.policy.busy_wait_seconds
        self._waiting_idle[record.path] = action
        try:
            while record.activity.busy:
                if time.monotonic() >= deadline:
                    raise Conflict(
                        f"Cannot {action} {record.path}: kernel busy running {self._cell(record)}"
                        f" for {self._busy_minutes(record):.0f} min; it is never interrupted. "
                        "Try again when it finishes."
                    )
                await asyncio.sleep(0.1)
        finally:
            self._waiting_idle.pop(record.path, None)

    def _refuse_if_waiting(self, record: SessionRecord, action: str) -> None:
        """A pause or checkpoint already waits for the running cell: answer now, not in 30 s."""
        waiting = self._waiting_idle.get(record.path)
        if waiting is not None:
            raise Conflict(
                f"Cannot {action} {record.path}: a {waiting} is already waiting (up to "
                f"{self.policy.busy_wait_seconds:.0f} s) for {self._cell(record)} to finish; "
                "it is never interrupted. Follow that one, or try again when the cell finishes."
            )

    @staticmethod
    def _cell(record: SessionRecord) -> str:
        cell = record.activity.execution_count
        return f"cell [{cell}]" if cell is not None else "a cell"

    @staticmethod
    def _busy_minutes(record: SessionRecord) -> float:
        return (time.time() - (record.activity.busy_since or time.time())) / 60

    # -- pause -----------------------------------------------------------------------------------
    async def pause(self, path: str, reason: str = "user") -> SessionRecord:
        """Start a pause (returns at once with the record; follow its state)."""
        if self.environment is not None:  # every notebook of the environment pauses with it
            origin = (
                "user" if reason == "user" else "idle" if reason.startswith("idle") else "notebook"
            )
            return await self.environment.pause(path, reason, origin)
        record = await self.get(path)
        path = record.path  # a notebook sharing another's kernel pauses that one
        self._refuse_if_waiting(record, "pause")
        async with self._lock(path):
            if record.state == "paused" and record.unrestored_kernel:
                raise Conflict(
                    f"{path} is already paused; the kernel running for it does not hold its "
                    "state: resume to restore it into that kernel"
                )
            if record.state == "paused":
                raise Conflict(f"{path} is already paused")
            self._require_running(record, "pause")
            cell = None
            if record.activity.busy and await self.backend.pauses_running_cells():
                cell = await self._running_cell_pause(record)
            else:
                await self._wait_idle(record, "pause")
            record.timeline.add("last_activity", at=record.activity.last_activity or record.started)
            if cell is None:
                record.timeline.add("pause_requested", reason=reason)
                self._set(
                    record, "checkpointing", "Saving the session state.", error=None, how=None
                )
            else:
                record.timeline.add("pause_requested", reason=reason, during_cell=cell)
                self._set(
                    record,
                    "pausing",
                    f"Pausing during cell [{cell}]: its process is saved as it stands."
                    + self._fallback_text(record.checkpoint),
                    error=None,
                    how=None,
                )
            record.paused_during_cell = cell
            self._tasks[path] = asyncio.create_task(self._run_pause(record, reason))
        return record

    async def _running_cell_pause(self, record: SessionRecord) -> int | None:
        """The cell a busy kernel is paused in (the backend snapshots its process as it runs);
        Conflict when there is no checkpoint to fall back on if that process cannot come back."""
        latest = (await self._inspect(record)).latest
        if latest is None:
            raise Conflict(
                f"Cannot pause {record.path} while {self._cell(record)} runs: it has no "
                "checkpoint yet to fall back on if its process cannot be brought back. Try "
                "again when the cell finishes (the pause then takes one)."
            )
        record.checkpoint = latest
        return record.activity.execution_count

    @staticmethod
    def _fallback_text(checkpoint: dict[str, Any] | None) -> str:
        """`` Checkpoint 3 from 18:02, the last one taken at a safe point, is the fallback.``"""
        if not checkpoint:
            return ""
        when = time.strftime("%H:%M", time.localtime(checkpoint["created"]))
        return (
            f" Checkpoint {checkpoint['id']} from {when}, the last one taken at a safe point, "
            "is the fallback."
        )

    async def _pause_when_idle(self, path: str, reason: str) -> None:
        record = self.records.get(path)
        if record is None:
            return
        while record.activity.busy:  # %pause: the cell that asked must finish first
            await asyncio.sleep(0.1)
        with contextlib.suppress(PauseError):
            await self.pause(path, reason)

    async def _run_pause(self, record: SessionRecord, reason: str) -> None:
        token = None  # of the process this pause stops: from this pause's own answers
        try:
            if record.paused_during_cell is None:
                try:
                    _result, token = await self._checkpoint(
                        record, reason="pause", then="checkpointing"
                    )
                except Conflict:
                    record.timeline.add(
                        "failed", what="checkpoint", recovery="session still running"
                    )
                    self._set(record, "active", record.message)
                    metrics.pause_finished("failed")
                    return
                self._set(record, "pausing", "Stopping the kernel and releasing its GPU.")
            snapshot = await self.backend.pauses_running_cells()
            if snapshot:
                token = await self._before_process_snapshot(record) or token
            try:
                outcome = await self.backend.stop(self._spec(record))
            except Exception as err:  # a backend's bug too: never leave the session "pausing"
                if not isinstance(err, BackendError):
                    log.exception("jupyter_pause: stopping %s failed", record.path)
                if snapshot:
                    await self._after_failed_snapshot(record)
                intact = self._intact_text((await self._inspect(record)).latest)
                record.timeline.add("failed", what=f"stop: {err}")
                self._set(
                    record,
                    "active",
                    f"Pause failed: {err}. The session keeps running.",
                    error={"what": f"stop failed: {err}", "recovery": "Nothing was lost." + intact},
                    paused_during_cell=None,
                )
                metrics.pause_finished("failed")
                return
            if outcome.snapshot:
                record.timeline.add("snapshot_taken", name=outcome.snapshot, **outcome.details)
            no_snapshot = outcome.details.get("snapshot_problem")
            record.timeline.add(
                "kernel_stopped",
                at=outcome.stopped_at,
                **({"no_snapshot": no_snapshot} if no_snapshot else {}),
            )
            if record.gpus or record.gpus_needed:
                record.timeline.add(
                    "gpu_released",
                    at=outcome.gpu_released_at or outcome.stopped_at,
                    measured=outcome.gpu_release_measured,
                    gpus=record.gpus,
                )
            if outcome.snapshot:
                record.checkpoint = {**(record.checkpoint or {}), "snapshot": outcome.snapshot}
            watcher = self._watchers.pop(record.kernel_id or "", None)
            if watcher:
                watcher.cancel()
            record.busy_seconds_before = record.busy_seconds()
            record.activity = KernelActivity()
            saved = format_bytes((record.checkpoint or {}).get("bytes", 0))
            when = time.strftime("%H:%M", time.localtime())
            message = f"Paused since {when} ({saved} saved)."
            if record.paused_during_cell is not None:
                image = format_bytes(outcome.details.get("bytes", 0))
                message = (
                    f"Paused during cell [{record.paused_during_cell}] since {when} (process "
                    f"image {image}); the cell runs on after the resume."
                    + self._fallback_text(record.checkpoint)
                )
            elif outcome.snapshot:
                image = format_bytes(outcome.details.get("bytes", 0))
                message = f"Paused since {when} ({saved} saved, process image {image})."
            elif no_snapshot:
                message += f" No process image ({no_snapshot}): the resume restores from files."
            self._set(
                record,
                "paused",
                message,
                kernel_id=None,
                gpus=[],
                progress=None,
                # Without an answer from this pause (a busy kernel that did not say who it
                # is), the token the server learnt from this very kernel before it stopped.
                paused_process_token=token or record.process_token,
                paused_checkpoint_id=(record.checkpoint or {}).get("id"),
                unrestored_kernel=False,
            )
            metrics.pause_finished("paused")
        finally:
            self._tasks.pop(record.path, None)

    async def _before_process_snapshot(self, record: SessionRecord) -> str | None:
        """The kernel lets go of its parent process (so it may come back under a restarted
        server) and says who it is (the token its restore must show), on its control channel:
        a running cell does not delay it. Without an answer, the checkpoint's token stands."""
        assert record.kernel_id is not None
        try:
            answer = await self.bridge.control(record.kernel_id, "release_parent")
        except KernelCallError as err:
            log.info("jupyter_pause: %s before its snapshot: %s", record.path, err)
            return None
        token = answer.get("token")
        record.process_token = token or record.process_token
        return token

    async def _after_failed_snapshot(self, record: SessionRecord) -> None:
        """The kernel runs on: it follows its server again and reopens what it let go of
        (IPython's history database), as after a restore."""
        if record.kernel_id is None:
            return
        try:
            await self.bridge.control(record.kernel_id, "identify")
        except KernelCallError as err:
            log.info("jupyter_pause: %s after its failed snapshot: %s", record.path, err)

    # -- resume ----------------------------------------------------------------------------------
    async def resume(self, path: str) -> SessionRecord:
        """Start a resume, or join the one in flight (two tabs, CLI + UI, retries)."""
        record = await self.get(path)
        path = record.path  # a notebook sharing another's kernel resumes that one
        if self.environment is not None and self.environment.status()["state"] != "running":
            raise Conflict(
                f"Cannot resume {path} here: the whole workspace is "
                f"{self.environment.status()['state']}; resume the workspace (jupyter pause "
                "resume --workspace NAMESPACE/NAME)"
            )
        async with self._lock(path):
            if path in self._tasks and record.state in (
                "resuming",
                "waiting-for-resources",
                "restoring",
            ):
                return record  # join the restore already running
            if record.state in RUNNING_STATES and record.kernel_id is not None:
                return record  # already back: a late retry gets the result
            if path in self._tasks:
                raise Conflict(f"Cannot resume {path}: a {record.state} is in progress")
            if (await self._inspect(record)).latest is None:
                raise Conflict(f"Cannot resume {path}: it has no checkpoint to restore")
            record.timeline.add("resume_requested")
            self._set(record, "resuming", "Resuming.", error=None, how=None, restore=None)
            self._tasks[path] = asyncio.create_task(self._run_resume(record))
        return record

    async def resume_for_environment(
        self, record: SessionRecord, trust_live: bool, note: str
    ) -> None:
        """Resume one notebook of an environment that came back (live where proven)."""
        async with self._lock(record.path):
            if record.path in self._tasks:
                raise Conflict(f"Cannot resume {record.path}: a {record.state} is in progress")
            record.timeline.add("resume_requested", by="workspace")
            self._set(record, "resuming", "Resuming.", error=None, how=None, restore=None)
            task = asyncio.create_task(self._run_resume(record, trust_live, note))
            self._tasks[record.path] = task
        await task

    async def _run_resume(
        self, record: SessionRecord, trust_live: bool = True, note: str | None = None
    ) -> None:
        """Bring a notebook back; ``trust_live`` False: restore from files whatever the kernel
        says (its environment was not proven to be the one that paused); ``note`` says why."""
        started = time.time()
        restoring = False  # once the kernel restores, a failure may have left it half-restored
        # Recorded at the pause, never read from a kernel since: only the process that paused
        # can show it, so a kernel started after the pause is never taken for a live one.
        paused_token = record.paused_process_token
        try:
            record.gpus_needed = self.policy.for_kernelspec(record.kernel_name).gpus
            spec = self._spec(record)

            def on_queued(place: int, reason: str) -> None:
                self._set(
                    record,
                    "waiting-for-resources",
                    f"Waiting for a GPU: {reason}",
                    queue_position=place,
                )

            allocation = await self.backend.request_resources(spec, on_queued)
            record.gpus = allocation.gpus
            record.timeline.add("resources_acquired", gpus=allocation.gpus)
            self._set(
                record,
                "restoring",
                "Starting the kernel.",
                queue_position=None,
                progress={"phase": "starting kernel", "done": 0, "total": 0},
            )
            outcome = await self.backend.restore(spec, allocation)
            note = note or outcome.details.get("why")
            record.kernel_id = outcome.kernel_id
            await self._attach(record, outcome.kernel_id, record.kernel_name)
            self._set(record, "restoring", "Restoring the session state.")
            hello = await self._hello_after_restore(record, outcome.kernel_id, outcome.live)
            token = hello.get("token")
            if trust_live and paused_token and token == paused_token:
                # The very process that paused is alive again.
                live = {k: v for k, v in outcome.details.items() if k != "why"}
                if record.paused_during_cell is not None:
                    live["during_cell"] = record.paused_during_cell
                record.timeline.add(
                    "state_restored",
                    how="live",
                    token_matched=True,
                    **live,
                    **({"why": note} if note else {}),
                )
                await self._reopen_sharing(record, outcome.kernel_id)
                await self._finish_resume(record, "live", None, started, note)
                return
            if trust_live and outcome.live and not note:
                note = "the kernel that came back is not the process that paused"
            target = self._resume_target(record, await self._inspect(record))
            restoring = True
            answer = await self.bridge.call(
                outcome.kernel_id,
                "restore",
                self.policy.kernel_call_timeout_seconds,
                key=record.key,
                checkpoint_id=(target or {}).get("id"),
            )
            if not answer.get("ok"):
                raise KernelCallError(str(answer.get("error") or f"unexpected answer {answer}"))
            result = answer.get("result")
            if not isinstance(result, dict) or not isinstance(result.get("checkpoint_id"), int):
                raise KernelCallError(f"unexpected answer from the kernel: {answer}")
            result.pop("notebook", None)  # the notebook's absolute path: the record has its path
            record.timeline.add(
                "state_restored",
                how="files",
                checkpoint_id=result["checkpoint_id"],
                restored=result.get("restored", []),
                failed=restore_shortfall(result),
                **({"why": note} if note else {}),
            )
            await self._reopen_sharing(record, outcome.kernel_id)
            await self._finish_resume(record, "files", result, started, note)
        except Exception as err:  # a backend's bug too: never leave the session "resuming"
            if not isinstance(err, BackendError | KernelCallError):
                log.exception("jupyter_pause: resuming %s failed", record.path)
            latest = (await self._inspect(record)).latest
            if restoring and latest is not None:
                # The kernel may hold part of the state: keep every checkpoint until it is
                # restored in full, or the user decides to carry on without it.
                missing = {"(everything)": f"the restore failed: {err}"}
                await holds.hold(self.store_for(record), record, latest["id"], missing)
            recovery = (self._intact_text(latest).strip() or "No data was changed.") + (
                " Resume again to restore from files, or run `%checkpoint restore` in a new kernel."
            )
            if record.hold:
                recovery += " " + holds.advice(record)
            record.timeline.add("failed", what=f"resume: {err}", recovery=recovery)
            self._set(
                record,
                "failed",
                f"Resume failed: {err}",
                progress=None,
                queue_position=None,
                error={"what": f"resume failed: {err}", "recovery": recovery},
            )
            metrics.resume_finished("failed", None)
        finally:
            self._tasks.pop(record.path, None)

    async def _note_restore_in_notebook(
        self, record: SessionRecord, kernel_id: str, result: Any
    ) -> None:
        """A restore typed into the notebook (``%checkpoint restore``). In a paused notebook's
        new kernel it is the resume, from files, as if Resume had been pressed; a restore of
        some variables by name leaves the rest missing (partial, held). In a running session
        it only goes on the timeline."""
        if not isinstance(result, dict) or not isinstance(result.get("checkpoint_id"), int):
            return
        async with self._lock(record.path):
            if record.kernel_id != kernel_id or record.path in self._tasks:
                return
            restored = [n for n in result.get("restored") or [] if isinstance(n, str)]
            result = {**result, "failed": dict(result.get("failed") or {})}
            if record.state not in ("paused", "failed"):
                record.timeline.add(
                    "checkpoint_restored",
                    by="notebook",
                    checkpoint_id=result["checkpoint_id"],
                    restored=restored,
                    failed=restore_shortfall(result),
                )
                self._save(record)
                return
            asked = f"`%checkpoint restore {result['checkpoint_id']} {' '.join(restored)}`"
            for name in result.get("not_asked") or []:
                result["failed"][name] = (
                    f"not asked for: {asked} restored only {', '.join(restored)}"
                )
            result.pop("notebook", None)
            started = time.time()
            record.timeline.add("resume_requested", by="notebook")
            record.timeline.add(
                "state_restored",
                how="files",
                by="notebook",
                checkpoint_id=result["checkpoint_id"],
                restored=restored,
                failed=restore_shortfall(result),
            )
            await self._finish_resume(
                record,
                "files",
                result,
                started,
                "restored by `%checkpoint restore` in the notebook",
            )

    async def _hello_after_restore(
        self, record: SessionRecord, kernel_id: str, live: bool
    ) -> dict[str, Any]:
        """Who the kernel is. A process the backend restored may be in the middle of a cell:
        it is asked on its control channel, which the cell does not hold up."""
        if live:
            with contextlib.suppress(KernelCallError):
                return await self.bridge.control(kernel_id, "identify", timeout=30)
        return await self.bridge.call(kernel_id, "hello", timeout=300, key=record.key)

    async def _finish_resume(
        self,
        record: SessionRecord,
        how: str,
        result: dict[str, Any] | None,
        started: float,
        note: str | None = None,
    ) -> None:
        ready = record.timeline.add("kernel_ready")
        record.awaiting_first_cell = True
        missing: dict[str, str] = {}
        if how == "live":
            message = "Ready: live session restored."
            if record.paused_during_cell is not None:
                message = (
                    f"Ready: live session restored; cell [{record.paused_during_cell}] runs on."
                )
        else:
            assert result is not None
            missing = restore_shortfall(result)
            count = len(result.get("restored") or [])
            message = f"Ready: restored from files ({format_count(count, 'variable')})."
            held = (record.hold or {}).get("checkpoints", {})
            if missing:
                await holds.hold(self.store_for(record), record, result["checkpoint_id"], missing)
                message = (
                    f"Restored partially from files ({format_count(count, 'variable')}; "
                    f"{len(missing)} not "
                    f"restored: {format_reasons(missing)})."
                )
            elif (
                str(result["checkpoint_id"]) in held
                and held[str(result["checkpoint_id"])].get("kind") != "shrunk"
            ):  # all came back: that hold ends (a shrink's ends with a checkpoint)
                await holds.release(self.store_for(record), record, result["checkpoint_id"])
        if note:  # why it is (or is not) live, when the environment came back
            message += f" {note[:1].upper()}{note[1:]}."
        if record.hold and not holds.holds_missing_data(record):
            message += f" Retention {holds.what(record)}, until a checkpoint holds them again."
        if holds.holds_missing_data(record):
            if not missing:
                message += f" Still {holds.what(record)}."
            error = {"what": holds.what(record), "recovery": holds.advice(record)}
            self._set(
                record,
                "partial",
                message,
                how=how,
                restore=result,
                progress=None,
                error=error,
                **RUNNING_AGAIN,
            )
            metrics.resume_finished("partial", ready.at - started)
            return
        self._set(
            record,
            "ready",
            message,
            how=how,
            restore=result,
            progress=None,
            error=None,
            **RUNNING_AGAIN,
        )
        metrics.resume_finished(how, ready.at - started)

    async def _reopen_sharing(self, record: SessionRecord, kernel_id: str) -> None:
        """The notebooks that shared the paused kernel get the resumed one (their sessions
        ended with the old kernel); a notebook that meanwhile has a kernel of its own keeps
        it, and shares no more."""
        for path in list(record.sharing_notebooks):
            try:
                existing = await self.session_manager.get_session(path=path)
            except Exception:  # jupyter-server raises web.HTTPError(404) when there is none
                existing = None
            if existing is not None and (existing.get("kernel") or {}).get("id") != kernel_id:
                record.sharing_notebooks.remove(path)
                continue
            if existing is None:
                with contextlib.suppress(Exception):
                    await self.session_manager.create_session(
                        path=path,
                        name=os.path.basename(path),
                        type="notebook",
                        kernel_name=record.kernel_name,
                        kernel_id=kernel_id,
                    )

    # -- retention hold after an incomplete restore (see holds.py) ------------------------------
    async def accept(self, path: str) -> SessionRecord:
        """The user decides to carry on after an incomplete restore (or a checkpoint that
        lacks most of the one before it): retention applies again."""
        record = await self.get(path)
        path = record.path
        async with self._lock(path):
            if not record.hold:
                raise Conflict(f"{path} has no incomplete restore to accept: nothing is held")
            if path in self._tasks:
                raise Conflict(f"Cannot accept for {path}: a {record.state} is in progress")
            what = holds.what(record)
            await holds.release(self.store_for(record), record)
            record.timeline.add("hold_released", what=what)
            if record.state == "partial":
                self._set(
                    record,
                    "ready",
                    "Ready: carrying on without what was not restored (accepted).",
                    error=None,
                )
            else:
                self._save(record)
        return record

    # -- activity and idle pause -----------------------------------------------------------------
    def note_user_activity(self, path: str) -> None:
        record = self.records.get(path)
        if record is None:
            raise UnknownSession(f"No session for {path!r}")
        self._note_return(record, record.activity.last_activity)
        record.activity.last_activity = time.time()

    def _note_return(self, record: SessionRecord, idle_since: float | None) -> None:
        """The user is back: a long idle gap while the kernel held GPUs goes on the timeline
        (the GPU-hours report's idle-threshold study replays them)."""
        if record.gpus and record.timeline.add_idle_gap(idle_since) is not None:
            self._save(record)

    async def _monitor_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_idle()
                if self.policy.max_age_hours > 0:  # age limits expire without any new checkpoint
                    await self.gc()
            except Exception:  # the monitor must survive anything one notebook does
                log.exception("jupyter_pause: idle check failed")

    async def check_idle(self, now: float | None = None) -> list[str]:
        """Pause every session idle longer than its policy allows; returns their paths."""
        await self.sync_sessions()
        now = time.time() if now is None else now
        running, idle = 0, []
        for record in list(self.records.values()):
            if record.unrestored_kernel and record.kernel_id is not None:
                await self._stop_if_idle_without_state(record, now)
                continue
            if record.state not in RUNNING_STATES or record.kernel_id is None:
                continue
            running += 1
            if record.activity.busy or record.path in self._tasks:
                continue  # a busy kernel is never auto-paused, however long it runs
            idle_for = now - max(record.activity.last_activity, record.started)
            await self._checkpoint_before_cull(record, idle_for)
            rules = self.policy.for_kernelspec(record.kernel_name)
            if not rules.auto_pause or rules.idle_minutes <= 0:
                continue
            running_for = now - record.started
            if (
                idle_for >= rules.idle_minutes * 60
                and running_for >= rules.min_running_minutes * 60
            ):
                idle.append((record.path, f"idle for {idle_for / 60:.0f} min"))
        if self.environment is not None:
            # The environment (and its GPU) pauses only once every notebook in it is idle.
            if not idle or len(idle) < running:
                return []
            idle = idle[:1]
        paused = []
        for path, reason in idle:
            with contextlib.suppress(PauseError):
                await self.pause(path, reason=reason)
                paused.append(path)
        return paused

    async def _stop_if_idle_without_state(self, record: SessionRecord, now: float) -> None:
        """A paused notebook opened again whose new kernel nobody resumed or used for the idle
        time: that kernel would hold its GPU all night. It is stopped (what cells ran in it
        saved first); the pause stands as it was, and Resume still restores its checkpoint."""
        rules = self.policy.for_kernelspec(record.kernel_name)
        kernel_id = record.kernel_id
        if (
            not rules.auto_pause
            or rules.idle_minutes <= 0
            or record.activity.busy
            or record.path in self._tasks
            or kernel_id is None
            or now - record.activity.last_activity < rules.idle_minutes * 60
        ):
            return
        idle_seconds = now - record.activity.last_activity
        async with self._lock(record.path):
            # Ours while it stops: sessions seen meanwhile must not end it a second time.
            self._tasks[record.path] = asyncio.current_task()  # type: ignore[assignment]
            try:
                if record.activity.execution_count:  # cells ran in it: keep what they made
                    with contextlib.suppress(PauseError):
                        await self._checkpoint(record, reason="idle", then=record.state)
                with contextlib.suppress(Exception):  # gone already: its end is noted all the same
                    await self.bridge.kernel_manager.shutdown_kernel(kernel_id)
                await self._kernel_ended(record)
            finally:
                self._tasks.pop(record.path, None)
            record.timeline.add("unrestored_kernel_stopped", idle_seconds=round(idle_seconds))
            self._set(
                record,
                record.state,
                f"The kernel opened without the saved state was idle for "
                f"{format_duration(idle_seconds)}: stopped, its GPU released. Still paused; "
                "resume to restore."
                + self._intact_text(self._resume_target(record, await self._inspect(record))),
            )

    async def _checkpoint_before_cull(self, record: SessionRecord, idle_for: float) -> None:
        """Save an idle kernel's state before jupyter-server's culler shuts it down."""
        if not self.cull_idle_seconds or idle_for < 0.8 * self.cull_idle_seconds:
            return
        saved = record.timeline.last("checkpoint_written")
        if saved is not None and saved.at >= record.activity.last_activity:
            return  # nothing happened since the last checkpoint
        async with self._lock(record.path):
            if record.state in RUNNING_STATES and record.kernel_id is not None:
                with contextlib.suppress(PauseError):
                    await self._checkpoint(record, reason="before-cull", then=record.state)

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
        store = store_mod.NotebookStore(self.store_root, self.notebook_key(path))
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
            store_view.collect_all, self.store_root, self.policy, self._path_of
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
