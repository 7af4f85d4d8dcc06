"""The session registry: every notebook's record, its lock, the task in flight, and its file.

Each state change goes through ``set``, which writes ``session.json`` next to the notebook's
checkpoints (off the event loop, see ``records.RecordWriter``), so a server restart finds
paused sessions paused: ``load`` reads them back at start-up. What a notebook's store shows
(its latest checkpoint, its retention hold, damaged files) is read here too, and cached by the
store's stamp so that a poll does not re-read an unchanged folder.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..backends.base import SessionSpec
from ..kernel import store as store_mod
from ..records import RecordWriter, SessionRecord, read_folder
from .states import RUNNING_STATES, Conflict, UnknownSession
from .store_view import StoreView, inspect_store

log = logging.getLogger(__name__)


class Sessions:
    """The records of one server's notebooks, keyed by their server path."""

    def __init__(self, store_root: Path, root_dir: str) -> None:
        self.store_root = Path(store_root)
        self.root_dir = root_dir
        self.records: dict[str, SessionRecord] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}  # the pause or resume in flight
        self.writer = RecordWriter(self.store_root)
        # Damaged store content that belongs to no known notebook, named (GET /status).
        self.problems: list[str] = []
        # Notebooks whose kernel ran when the last server process ended (not paused).
        self.interrupted: list[str] = []
        self._locks: dict[str, asyncio.Lock] = {}
        self._views: dict[str, tuple[Any, StoreView]] = {}  # key -> what its store last showed

    # -- start-up --------------------------------------------------------------------------------
    def load(self) -> None:
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
            path = self.path_of(key)
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
                + intact_text(view.latest)
            )
            self.set(record, "paused", message)
        self.records[record.path] = record

    def _problem(self, text: str) -> None:
        log.warning("jupyter_pause: %s", text)
        self.problems.append(text)

    def path_of(self, key: str) -> str | None:
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

    def lock(self, path: str) -> asyncio.Lock:
        return self._locks.setdefault(path, asyncio.Lock())

    async def find(self, path: str) -> SessionRecord:
        """The session of a notebook, its store's hold and problems read afresh (the caller
        has matched jupyter-server's sessions first).

        A notebook whose session uses another notebook's kernel answers that one's record.
        """
        record = self.records.get(path) or self._sharing_owner(path)
        if record is not None:
            await self.inspect(record)
            return record
        record = SessionRecord(path, self.notebook_key(path), state="paused")
        view = await self.inspect(record)
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

    async def inspect(self, record: SessionRecord) -> StoreView:
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

    def require_running(self, record: SessionRecord, action: str) -> None:
        if record.path in self.tasks:
            raise Conflict(f"Cannot {action} {record.path}: a {record.state} is in progress")
        if record.state not in RUNNING_STATES or record.kernel_id is None:
            raise Conflict(f"Cannot {action} {record.path}: it is {record.state}, not running")

    # -- state changes ---------------------------------------------------------------------------
    def set(self, record: SessionRecord, state: str, message: str, **fields: Any) -> None:
        if state != record.state:
            record.since = time.time()
        record.state, record.message = state, message
        for name, value in fields.items():
            setattr(record, name, value)
        self.save(record)

    def save(self, record: SessionRecord) -> None:
        self.writer.save(record)


def spec(record: SessionRecord) -> SessionSpec:
    """What a backend is told about a session."""
    return SessionSpec(
        path=record.path,
        key=record.key,
        kernel_name=record.kernel_name,
        kernel_id=record.kernel_id,
        gpus=record.gpus_needed,
        checkpoint_id=(record.checkpoint or {}).get("id"),
        busy=record.activity.busy,
    )


def resume_target(record: SessionRecord, view: StoreView) -> dict[str, Any] | None:
    """The checkpoint a resume restores: the pause's own while it is intact (a kernel
    without the session's state may have written newer ones since), else the newest."""
    paused = view.checkpoints.get(record.paused_checkpoint_id or -1)
    return paused or view.latest


def intact_text(latest: dict[str, Any] | None) -> str:
    """`` Your checkpoint 3 from 18:02 is intact.`` (empty when there is none)."""
    if latest is None:
        return ""
    when = time.strftime("%H:%M", time.localtime(latest["created"]))
    return f" Your checkpoint {latest['id']} from {when} is intact."
