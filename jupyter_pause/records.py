"""The session record of each notebook and its ``session.json`` beside the checkpoints.

A record is what the REST API answers for a notebook; its file lets a server restart find
paused sessions paused. The file is read defensively (one damaged file must never stop the
extension: it is named, and the notebook's state is rebuilt from its checkpoints) and
written off the event loop (a disk busy with a 1 GB checkpoint must not stall the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .contract import session_field_conforms
from .kernel import store as store_mod
from .timeline import Timeline

log = logging.getLogger(__name__)

SESSION_FILE = "session.json"

_NUMBER = (int, float)
#: The fields a record takes back from ``session.json`` (the rest is recomputed).
_PERSISTED = (
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
    "paused_process_token",
    "paused_checkpoint_id",
    "sharing_notebooks",
    "started",
    "busy_seconds_before",
    "paused_during_cell",
)


@dataclass
class KernelActivity:
    """What the watcher knows about a kernel's work (the orchestrator's idea of "idle")."""

    busy: bool = False
    busy_since: float | None = None
    execution_count: int | None = None
    last_activity: float = 0.0
    busy_seconds: float = 0.0  # total time spent executing cells since the watcher started
    cells_executed: int = 0
    watching: bool = False  # the iopub watcher is subscribed: busy/idle changes are seen


@dataclass
class SessionRecord:
    """Everything known about one notebook session; ``to_json`` is the REST representation."""

    path: str
    key: str  # the notebook's absolute path: names its checkpoint folder, never answered
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
    # While set, no checkpoint of this notebook is deleted: checkpoint id -> what a restore
    # of it could not bring back. Mirrors the store's hold.json.
    hold: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)  # damaged files of this notebook, named
    queue_position: int | None = None
    process_token: str | None = None
    # Recorded when a pause completes, from that pause's own answers (its checkpoint, or the
    # kernel saying who it is before its process snapshot), and never read from the kernel
    # afterwards: a resume is "live" only when the kernel it gets shows this very token.
    paused_process_token: str | None = None
    # The checkpoint the pause wrote (or fell back on): what a resume restores, even when a
    # kernel without the session's state has written newer ones since (a reopened notebook).
    paused_checkpoint_id: int | None = None
    # A kernel runs for this paused notebook that does not hold its state (the notebook was
    # opened again, or its kernel restarted): a resume restores the checkpoint into it.
    unrestored_kernel: bool = False
    # Other notebooks whose sessions use this session's kernel: they pause and resume with it.
    sharing_notebooks: list[str] = field(default_factory=list)
    # The execution count of the cell a pause stopped in its course (it runs on after a live
    # resume); None when the kernel was idle.
    paused_during_cell: int | None = None
    started: float = field(default_factory=time.time)
    busy_seconds_before: float = 0.0  # active time of kernels this session had before
    timeline: Timeline = field(default_factory=Timeline)
    activity: KernelActivity = field(default_factory=KernelActivity)
    awaiting_first_cell: bool = False
    file_warnings: list[str] = field(default_factory=list)  # about session.json itself
    # A lazy restore's background load, as the kernel tells it: checkpoint_id, done, total,
    # and once it ended, outcome (lazy.LoadOutcome.to_json()). Not kept across servers.
    loading: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        hidden = ("key", "timeline", "activity", "file_warnings", "loading")
        data = {k: v for k, v in asdict(self).items() if k not in hidden}
        data["warnings"] = [*self.file_warnings, *self.warnings]
        data["busy"] = self.activity.busy
        data["busy_since"] = self.activity.busy_since
        data["execution_count"] = self.activity.execution_count
        data["last_activity"] = self.activity.last_activity or None
        data["watching"] = self.activity.watching
        return data

    def persisted(self) -> dict[str, Any]:
        data = self.to_json()
        data["key"] = self.key
        data["timeline"] = self.timeline.to_json()
        data["busy_seconds_before"] = self.busy_seconds()
        return data

    def busy_seconds(self) -> float:
        return self.busy_seconds_before + self.activity.busy_seconds

    @classmethod
    def from_persisted(cls, data: Any) -> SessionRecord:
        """A record from ``session.json`` content; ValueError says what is wrong with it.

        Fields of the wrong type are left at their defaults (and named in ``file_warnings``):
        the checkpoints on disk, not this file, hold what matters.
        """
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object but {type(data).__name__}")
        if not isinstance(data.get("path"), str) or not isinstance(data.get("key"), str):
            raise ValueError("no notebook path and key")
        record = cls(path=data["path"], key=data["key"])
        wrong = []
        for name in _PERSISTED:
            if name not in data:
                continue
            # What the API answers for the field, exactly: a damaged file cannot break it.
            if session_field_conforms(name, data[name]):
                setattr(record, name, data[name])
            else:
                wrong.append(name)
        events = data.get("timeline", [])
        if isinstance(events, list) and all(_is_event(e) for e in events):
            record.timeline = Timeline.from_json(events)
        else:
            wrong.append("timeline")
        if wrong:
            record.file_warnings.append(
                f"{SESSION_FILE} had unreadable fields ({', '.join(wrong)}); they were reset"
            )
        return record


def _is_event(raw: Any) -> bool:
    return (
        isinstance(raw, dict)
        and isinstance(raw.get("kind"), str)
        and isinstance(raw.get("at"), _NUMBER)
        and not isinstance(raw.get("at"), bool)
        and isinstance(raw.get("data", {}), dict)
    )


def read_folder(folder: Path) -> tuple[SessionRecord | None, str | None, str | None]:
    """(record, notebook key, problem) of one notebook folder of the store.

    The record is None when ``session.json`` is missing or unreadable; the key then comes
    from ``notebook.json`` when that reads, so the notebook's state can be rebuilt from its
    checkpoints. ``problem`` names what could not be read.
    """
    if folder.is_symlink():
        return None, None, f"{folder} is a symbolic link; not used (the store holds no links)"
    problem = None
    path = folder / SESSION_FILE
    try:
        return SessionRecord.from_persisted(json.loads(path.read_bytes())), None, None
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as err:
        problem = f"{path} is unreadable ({err})"
    try:
        key = store_mod.folder_notebook_key(folder)
    except ValueError as err:
        return None, None, "; ".join(filter(None, (str(err), problem)))
    return None, key, problem


class RecordWriter:
    """Writes each record's ``session.json`` on a worker thread; the newest state wins.

    ``save`` never blocks: it notes the record, and one task per notebook writes the latest
    state of it (a burst of state changes costs one or two writes, not one each).
    """

    def __init__(self, store_root: Path) -> None:
        self.store_root = store_root
        self._pending: dict[str, SessionRecord] = {}  # key -> record to write
        self._writers: dict[str, asyncio.Task[None]] = {}

    def save(self, record: SessionRecord) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # at start-up, before the server's loop runs
            self._write_file(record.key, json.dumps(record.persisted()).encode(), record.path)
            return
        self._pending[record.key] = record
        if record.key not in self._writers:
            self._writers[record.key] = asyncio.create_task(self._write(record.key))

    async def _write(self, key: str) -> None:
        try:
            while (record := self._pending.pop(key, None)) is not None:
                data = json.dumps(record.persisted()).encode()
                await asyncio.to_thread(self._write_file, key, data, record.path)
        finally:
            self._forget_writer(key)

    def _forget_writer(self, key: str) -> None:
        """The task that ends leaves ``_writers``, only if it is still the one listed: a
        ``discard`` queued after it must stay there until done (``flush`` waits for it)."""
        if self._writers.get(key) is asyncio.current_task():
            self._writers.pop(key)

    def _write_file(self, key: str, data: bytes, path: str) -> None:
        store = store_mod.NotebookStore(self.store_root, key)
        try:
            store.prepare()
            store_mod.write_file_atomically(store.path / SESSION_FILE, data)
        except (OSError, store_mod.StoreError) as err:  # the state lives on in memory
            log.warning("jupyter_pause: cannot record the state of %s: %s", path, err)

    def discard(self, key: str) -> None:
        """The record of notebook ``key`` is no longer kept (a placeholder handed over, a
        notebook renamed): its ``session.json`` goes once any write of it is done, and its
        folder with it while that holds no checkpoint (else the usage report would list a
        notebook that is not there)."""
        self._pending.pop(key, None)
        running = self._writers.get(key)

        async def remove() -> None:
            try:
                if running is not None:
                    with contextlib.suppress(Exception):
                        await running
                await asyncio.to_thread(_remove_record_file, self.store_root, key)
            finally:
                self._forget_writer(key)

        self._writers[key] = asyncio.create_task(remove())

    async def flush(self) -> None:
        """Wait until every state saved so far is on disk."""
        while self._writers:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._writers.values())


def _remove_record_file(store_root: Path, key: str) -> None:
    """``session.json`` of ``key``, and its folder when that holds nothing else."""
    store = store_mod.NotebookStore(store_root, key)
    try:
        (store.path / SESSION_FILE).unlink(missing_ok=True)
        store.remove_if_unused()
    except OSError as err:  # it stays: a leftover folder is harmless, a crash is not
        log.info("jupyter_pause: %s stays: %s", store.path, err)
