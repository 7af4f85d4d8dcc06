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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import metrics
from .backends.base import Backend, BackendError, SessionSpec
from .formatting import format_bytes, format_count, format_reasons
from .kernel import store as store_mod
from .kernel_bridge import KernelActivity, KernelBridge, KernelCallError
from .policy import Policy
from .timeline import Timeline

STATES = (
    "active",
    "checkpointing",
    "pausing",
    "paused",
    "resuming",
    "waiting-for-resources",
    "restoring",
    "ready",
    "failed",
)
RUNNING_STATES = ("active", "ready")
IN_FLIGHT_STATES = ("checkpointing", "pausing", "resuming", "waiting-for-resources", "restoring")

log = logging.getLogger(__name__)


class PauseError(Exception):
    """A request that cannot be carried out; ``status`` is the HTTP status to answer with."""

    status = 400


class UnknownSession(PauseError):
    status = 404


class Conflict(PauseError):
    status = 409


@dataclass
class SessionRecord:
    """Everything known about one notebook session; ``to_json`` is the REST representation."""

    path: str
    key: str
    state: str = "active"
    message: str = "Running."
    since: float = field(default_factory=time.time)
    kernel_id: str | None = None
    kernel_name: str = "python3"
    gpus: list[int] = field(default_factory=list)
    gpus_needed: int = 0
    progress: dict[str, Any] | None = None
    how: str | None = None  # "live" | "files", once ready after a resume
    restore: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    checkpoint: dict[str, Any] | None = None
    queue_position: int | None = None
    process_token: str | None = None
    started: float = field(default_factory=time.time)
    busy_seconds_before: float = 0.0  # active time of kernels this session had before
    timeline: Timeline = field(default_factory=Timeline)
    activity: KernelActivity = field(default_factory=KernelActivity)
    awaiting_first_cell: bool = False

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("timeline", "activity")}
        data["busy"] = self.activity.busy
        data["busy_since"] = self.activity.busy_since
        data["execution_count"] = self.activity.execution_count
        data["last_activity"] = self.activity.last_activity or None
        data["watching"] = self.activity.watching
        return data

    def persisted(self) -> dict[str, Any]:
        data = self.to_json()
        data["timeline"] = self.timeline.to_json()
        data["busy_seconds_before"] = self.busy_seconds()
        return data

    def busy_seconds(self) -> float:
        return self.busy_seconds_before + self.activity.busy_seconds

    @classmethod
    def from_persisted(cls, data: dict[str, Any]) -> SessionRecord:
        record = cls(path=data["path"], key=data["key"])
        for name in (
            "state",
            "message",
            "since",
            "kernel_id",
            "kernel_name",
            "gpus",
            "gpus_needed",
            "progress",
            "how",
            "restore",
            "error",
            "checkpoint",
            "process_token",
            "started",
            "busy_seconds_before",
        ):
            if name in data:
                setattr(record, name, data[name])
        record.timeline = Timeline.from_json(data.get("timeline", []))
        return record


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
        self._load_records()  # paused sessions survive a server restart

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, monitor_interval: float = 30.0) -> None:
        await self.backend.start()
        self._monitor = asyncio.create_task(self._monitor_loop(monitor_interval))

    async def stop(self) -> None:
        tasks = [self._monitor, *self._watchers.values(), *self._tasks.values(), *self._background]
        for task in tasks:
            if task is not None:
                task.cancel()
        for task in tasks:
            if task is not None:
                with contextlib.suppress(BaseException):
                    await task
        await self.backend.close()

    def _load_records(self) -> None:
        if not self.store_root.is_dir():
            return
        for path in self.store_root.glob("*/session.json"):
            try:
                record = SessionRecord.from_persisted(json.loads(path.read_text()))
            except (ValueError, KeyError) as err:
                log.warning("jupyter_pause: ignoring unreadable %s (%s)", path, err)
                continue
            if record.state != "paused":
                # The server stopped while the kernel ran or mid-way through a pause/resume; its
                # kernels stopped with it. The checkpoint on disk is the truth.
                record.kernel_id, record.gpus, record.progress = None, [], None
                if self._latest_checkpoint(record) is None:
                    continue
                self._set(
                    record,
                    "paused",
                    f"The server restarted while this notebook was {record.state}."
                    + self._intact_text(record),
                )
            self.records[record.path] = record

    # -- lookups ---------------------------------------------------------------------------------
    def notebook_key(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.root_dir, path))

    def store_for(self, record: SessionRecord) -> store_mod.NotebookStore:
        return store_mod.NotebookStore(self.store_root, record.key)

    def _lock(self, path: str) -> asyncio.Lock:
        return self._locks.setdefault(path, asyncio.Lock())

    async def get(self, path: str) -> SessionRecord:
        await self.sync_sessions()
        record = self.records.get(path)
        if record is None:
            known = self.store_for(SessionRecord(path, self.notebook_key(path)))
            if known.latest_id() is None:
                raise UnknownSession(
                    f"No session for {path!r}: open the notebook (start a kernel) or check the path"
                )
            # Checkpoints exist (taken from the notebook) but the server never saw a pause.
            record = SessionRecord(path, self.notebook_key(path), state="paused")
            record.checkpoint = self._latest_checkpoint(record)
            record.message = "Not running; a checkpoint can be restored."
            self.records[path] = record
        return record

    def list(self) -> list[SessionRecord]:
        return sorted(self.records.values(), key=lambda r: r.path)

    # -- discovering kernels ---------------------------------------------------------------------
    async def sync_sessions(self) -> None:
        """Match jupyter-server's notebook sessions with our records; watch new kernels.

        Follows renames (a session keeps its kernel under a new path) and notices kernels
        that ended outside a pause (shut down, culled, notebook deleted): what they held is
        given back to the pool.
        """
        sessions = await self.session_manager.list_sessions()
        by_kernel = {r.kernel_id: r for r in self.records.values() if r.kernel_id}
        for model in sessions:
            path, kernel = model.get("path"), model.get("kernel") or {}
            if not path or not kernel.get("id"):
                continue
            moved = by_kernel.get(kernel["id"])
            if moved is not None and moved.path != path and path not in self._tasks:
                self._rename(moved, path)
            record = self.records.get(path)
            if record is None:
                record = SessionRecord(path, self.notebook_key(path))
                self.records[path] = record
            if record.kernel_id == kernel["id"]:
                continue
            if path in self._tasks and record.state in IN_FLIGHT_STATES:
                continue  # our own resume is starting this kernel
            await self._attach(record, kernel["id"], kernel.get("name") or record.kernel_name)
        for record in list(self.records.values()):
            gone = (
                record.kernel_id is not None and record.kernel_id not in self.bridge.kernel_manager
            )
            if gone and record.path not in self._tasks:
                await self._kernel_ended(record)

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
        if self._latest_checkpoint(record) is None:
            self._save(record)
            self.records.pop(record.path, None)
            return
        self._set(
            record,
            "paused",
            "The kernel ended outside jupyter_pause (shut down or culled)."
            + self._intact_text(record),
        )

    async def _attach(self, record: SessionRecord, kernel_id: str, kernel_name: str) -> None:
        old = record.kernel_id
        if old and old in self._watchers:
            self._watchers.pop(old).cancel()
        record.busy_seconds_before = record.busy_seconds()
        record.kernel_id, record.kernel_name = kernel_id, kernel_name
        record.activity = KernelActivity(last_activity=self._kernel_last_activity(kernel_id))
        kernel_policy = self.policy.for_kernelspec(kernel_name)
        record.gpus_needed = kernel_policy.gpus
        if record.path in self._tasks:
            pass  # our own resume attaches the kernel it started
        elif record.state in ("paused", "failed") and self._latest_checkpoint(record):
            # The notebook was opened again and JupyterLab started a fresh kernel: the session
            # stays paused (that kernel has none of its state) until the user resumes into it.
            self._set(
                record,
                record.state,
                "A new kernel is running without the saved state: resume to restore "
                f"checkpoint {self._latest_checkpoint(record)['id']} into it.",
            )
        elif record.state not in RUNNING_STATES:
            self._set(record, "active", "Running.")
        if not record.gpus and record.gpus_needed:
            record.gpus = self.backend.adopt(self._spec(record))
            if record.gpus:
                record.timeline.add("gpu_acquired", gpus=record.gpus)
        self._watchers[kernel_id] = asyncio.create_task(self._watch(record, kernel_id))
        self._spawn(self._hello(record, kernel_id))
        self._save(record)

    def _kernel_last_activity(self, kernel_id: str) -> float:
        """jupyter-server's own idea of the kernel's last activity, for a kernel seen late."""
        try:
            seen = self.bridge.kernel_manager.get_kernel(kernel_id).last_activity
            return float(seen.timestamp())
        except (KeyError, AttributeError):
            return time.time()

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
            if kind == "cell" and record.awaiting_first_cell:
                record.awaiting_first_cell = False
                event = record.timeline.add("first_cell_executed", **data)
                resumed = record.timeline.last("resume_requested")
                if resumed is not None:
                    metrics.resume_to_next_cell(event.at - resumed.at)
                self._save(record)
            elif kind == "request" and data.get("action") == "pause":
                self._spawn(self._pause_when_idle(record.path, "%pause in the notebook"))

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
        store = self.store_for(record)
        try:
            store.prepare()
            store_mod.write_file_atomically(
                store.path / "session.json", json.dumps(record.persisted()).encode()
            )
        except OSError as err:  # the state still lives in memory; say so, do not crash
            log.warning("jupyter_pause: cannot record the state of %s: %s", record.path, err)

    def _spec(self, record: SessionRecord) -> SessionSpec:
        return SessionSpec(
            path=record.path,
            key=record.key,
            kernel_name=record.kernel_name,
            kernel_id=record.kernel_id,
            gpus=record.gpus_needed,
        )

    def _latest_checkpoint(self, record: SessionRecord) -> dict[str, Any] | None:
        store = self.store_for(record)
        latest = store.latest_id()
        if latest is None:
            return None
        try:
            manifest = store.read_manifest(latest)
        except store_mod.StoreError:
            return None
        return {
            "id": latest,
            "created": manifest["created"],
            "bytes": store_mod.manifest_bytes(manifest),
            "process_token": manifest["process_token"],
        }

    # -- checkpoint ------------------------------------------------------------------------------
    async def checkpoint(self, path: str) -> dict[str, Any]:
        """Checkpoint a running session now; returns the kernel's CheckpointResult."""
        record = await self.get(path)
        async with self._lock(path):
            self._require_running(record, "checkpoint")
            await self._wait_idle(record, "checkpoint")
            return await self._checkpoint(record, reason="manual", then=record.state)

    async def _checkpoint(self, record: SessionRecord, reason: str, then: str) -> dict[str, Any]:
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
            intact = self._intact_text(record)
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
        record.process_token = answer.get("token")
        record.checkpoint = self._latest_checkpoint(record)
        record.timeline.add(
            "checkpoint_written",
            checkpoint_id=result["checkpoint_id"],
            bytes_written=result["bytes_written"],
            bytes_total=result["bytes_total"],
            seconds=result["seconds"],
            skipped=result["skipped"],
        )
        metrics.checkpoint_written(result["bytes_written"])
        # A manual checkpoint returns to the state (and message) it interrupted.
        self._set(
            record, then, message if then != "checkpointing" else record.message, progress=None
        )
        return result

    async def _poll_progress(self, record: SessionRecord) -> None:
        progress_file = self.store_for(record).path / "progress.json"
        with contextlib.suppress(FileNotFoundError):
            progress_file.unlink()
        while True:
            await asyncio.sleep(0.25)
            with contextlib.suppress(FileNotFoundError, ValueError):
                record.progress = json.loads(progress_file.read_text())

    def _intact_text(self, record: SessionRecord) -> str:
        latest = self._latest_checkpoint(record)
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
        while record.activity.busy:
            if time.monotonic() >= deadline:
                cell = record.activity.execution_count
                minutes = (time.time() - (record.activity.busy_since or time.time())) / 60
                what = f"cell [{cell}]" if cell is not None else "a cell"
                raise Conflict(
                    f"Cannot {action} {record.path}: kernel busy running {what} for "
                    f"{minutes:.0f} min; it is never interrupted. Try again when it finishes."
                )
            await asyncio.sleep(0.1)

    # -- pause -----------------------------------------------------------------------------------
    async def pause(self, path: str, reason: str = "user") -> SessionRecord:
        """Start a pause (returns at once with the record; follow its state)."""
        record = await self.get(path)
        async with self._lock(path):
            if record.state == "paused":
                raise Conflict(f"{path} is already paused")
            self._require_running(record, "pause")
            await self._wait_idle(record, "pause")
            record.timeline.add("last_activity", at=record.activity.last_activity or record.started)
            record.timeline.add("pause_requested", reason=reason)
            self._set(record, "checkpointing", "Saving the session state.", error=None, how=None)
            self._tasks[path] = asyncio.create_task(self._run_pause(record, reason))
        return record

    async def _pause_when_idle(self, path: str, reason: str) -> None:
        record = self.records.get(path)
        if record is None:
            return
        while record.activity.busy:  # %pause: the cell that asked must finish first
            await asyncio.sleep(0.1)
        with contextlib.suppress(PauseError):
            await self.pause(path, reason)

    async def _run_pause(self, record: SessionRecord, reason: str) -> None:
        try:
            try:
                await self._checkpoint(record, reason="pause", then="checkpointing")
            except Conflict:
                record.timeline.add("failed", what="checkpoint", recovery="session still running")
                self._set(record, "active", record.message)
                metrics.pause_finished("failed")
                return
            self._set(record, "pausing", "Stopping the kernel and releasing its GPU.")
            try:
                outcome = await self.backend.stop(self._spec(record))
            except BackendError as err:
                intact = self._intact_text(record)
                record.timeline.add("failed", what=f"stop: {err}")
                self._set(
                    record,
                    "active",
                    f"Pause failed: {err}. The session keeps running.",
                    error={"what": f"stop failed: {err}", "recovery": "Nothing was lost." + intact},
                )
                metrics.pause_finished("failed")
                return
            record.timeline.add("kernel_stopped", at=outcome.stopped_at)
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
            self._set(
                record,
                "paused",
                f"Paused since {when} ({saved} saved).",
                kernel_id=None,
                gpus=[],
                progress=None,
            )
            metrics.pause_finished("paused")
        finally:
            self._tasks.pop(record.path, None)

    # -- resume ----------------------------------------------------------------------------------
    async def resume(self, path: str) -> SessionRecord:
        """Start a resume, or join the one in flight (two tabs, CLI + UI, retries)."""
        record = await self.get(path)
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
            if self._latest_checkpoint(record) is None:
                raise Conflict(f"Cannot resume {path}: it has no checkpoint to restore")
            record.timeline.add("resume_requested")
            self._set(record, "resuming", "Resuming.", error=None, how=None, restore=None)
            self._tasks[path] = asyncio.create_task(self._run_resume(record))
        return record

    async def _run_resume(self, record: SessionRecord) -> None:
        started = time.time()
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
            record.kernel_id = outcome.kernel_id
            await self._attach(record, outcome.kernel_id, record.kernel_name)
            self._set(record, "restoring", "Restoring the session state.")
            hello = await self.bridge.call(outcome.kernel_id, "hello", timeout=300, key=record.key)
            checkpoint = self._latest_checkpoint(record) or {}
            if hello.get("token") and hello["token"] == checkpoint.get("process_token"):
                # The very process that wrote the checkpoint is alive again: a live restore.
                record.timeline.add("state_restored", how="live")
                self._finish_resume(record, "live", None, started)
                return
            answer = await self.bridge.call(
                outcome.kernel_id,
                "restore",
                self.policy.kernel_call_timeout_seconds,
                key=record.key,
            )
            if not answer.get("ok"):
                raise KernelCallError(answer["error"])
            result = answer["result"]
            record.timeline.add(
                "state_restored",
                how="files",
                checkpoint_id=result["checkpoint_id"],
                restored=result["restored"],
                failed=result["failed"],
            )
            self._finish_resume(record, "files", result, started)
        except (BackendError, KernelCallError) as err:
            recovery = (self._intact_text(record).strip() or "No data was changed.") + (
                " Resume again to restore from files, or run `%checkpoint restore` in a new kernel."
            )
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

    def _finish_resume(
        self, record: SessionRecord, how: str, result: dict[str, Any] | None, started: float
    ) -> None:
        ready = record.timeline.add("kernel_ready")
        record.awaiting_first_cell = True
        if how == "live":
            message = "Ready: live session restored."
        else:
            assert result is not None
            message = (
                f"Ready: restored from files ({format_count(len(result['restored']), 'variable')}"
            )
            if result["failed"]:
                reasons = format_reasons(result["failed"])
                message += f"; {len(result['failed'])} not restored: {reasons}"
            message += ")."
        self._set(record, "ready", message, how=how, restore=result, progress=None)
        metrics.resume_finished(how, ready.at - started)

    # -- activity and idle pause -----------------------------------------------------------------
    def note_user_activity(self, path: str) -> None:
        record = self.records.get(path)
        if record is None:
            raise UnknownSession(f"No session for {path!r}")
        record.activity.last_activity = time.time()

    async def _monitor_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_idle()
                if self.policy.max_age_hours > 0:  # age limits expire without any new checkpoint
                    await asyncio.to_thread(self.gc)
            except Exception:  # the monitor must survive anything one notebook does
                log.exception("jupyter_pause: idle check failed")

    async def check_idle(self, now: float | None = None) -> list[str]:
        """Pause every session idle longer than its policy allows; returns their paths."""
        await self.sync_sessions()
        now = time.time() if now is None else now
        paused = []
        for record in list(self.records.values()):
            if record.state not in RUNNING_STATES or record.kernel_id is None:
                continue
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
                with contextlib.suppress(PauseError):
                    await self.pause(record.path, reason=f"idle for {idle_for / 60:.0f} min")
                    paused.append(record.path)
        return paused

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

    def gc(self) -> dict[str, Any]:
        """Apply the retention policy to every notebook's checkpoints; returns what went."""
        removed: dict[str, list[int]] = {}
        freed = 0
        if not self.store_root.is_dir():
            return {"removed": removed, "bytes_freed": 0}
        for folder in sorted(self.store_root.iterdir()):
            info = folder / "notebook.json"
            if not info.exists():
                continue
            store = store_mod.NotebookStore(self.store_root, json.loads(info.read_text())["key"])
            before = store.disk_usage()
            gone = store.apply_retention(
                self.policy.keep_last, self.policy.max_age_hours * 3600, self.policy.max_bytes
            )
            freed += before - store.disk_usage()
            if gone:
                removed[store.key] = gone
        return {"removed": removed, "bytes_freed": freed}

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
