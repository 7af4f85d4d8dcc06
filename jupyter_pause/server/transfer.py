"""Export and import of a session (``session_file``) on this server, and trusting an import.

Export: a running session is checkpointed first, a paused one is taken as it is; the latest
good checkpoint and the notebook go into a session file written to a temporary file of the
store (off the event loop; the caller streams it and removes it). Import: the uploaded file
is read and checked into a staging folder of the store, then placed under the notebook path
asked for (which must not exist yet): the notebook file and its checkpoint, the session
paused, untrusted. Nothing of it is unpickled until the user trusts it.
"""

from __future__ import annotations

import contextlib
import getpass
import platform
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .. import session_file
from ..kernel import imported as imported_mod
from ..kernel import store as store_mod
from ..kernel.environment_diff import differences
from ..kernel.files import write_file_atomically
from ..records import SessionRecord
from .sessions import Sessions
from .states import RUNNING_STATES, Conflict, PauseError, UnknownSession


class ImportRefused(PauseError):
    """A session file that is damaged, altered, unsafe or of a newer format (400)."""

    status = 400


@dataclass
class Export:
    """A session file ready to stream: its members hashed, its length known, the store
    folder locked (collection keeps its hands off the files) until ``close``."""

    index: session_file.Index
    notebook: bytes
    files: dict[str, Path]
    size: int  # the exact length of the stream (Content-Length)
    name: str  # a file name for the download
    lock: contextlib.ExitStack

    def write(self, out: IO[bytes]) -> None:
        session_file.write_tar(out, self.index, self.notebook, self.files)

    def close(self) -> None:
        self.lock.close()


class ChunkQueue:
    """A few chunks between the thread writing a tar stream and the handler sending it:
    memory stays at ``depth`` chunks however large the stream."""

    def __init__(self, depth: int = 8) -> None:
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(depth)
        self._cancelled = threading.Event()

    def write(self, data: bytes) -> int:
        while True:
            if self._cancelled.is_set():
                raise ConnectionAbortedError("the download was broken off")
            try:
                self._queue.put(bytes(data), timeout=0.5)
                return len(data)
            except queue.Full:
                continue

    def fill(self, export: Export) -> None:
        """Write the whole stream (in the writer thread); None ends it, an error is passed on."""
        try:
            export.write(self)  # type: ignore[arg-type]
            self._put_end(None)
        except BaseException as err:
            self._put_end(err)

    def _put_end(self, end: BaseException | None) -> None:
        while not self._cancelled.is_set():
            try:
                self._queue.put(end, timeout=0.5)
                return
            except queue.Full:
                continue

    def get(self) -> bytes | None:
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self._cancelled.set()


def _staging_root(store_root: Path) -> Path:
    return store_root / ".transfer"


def prepare_export(
    sessions: Sessions, record: SessionRecord, notebook_file: Path, server_path: str
) -> Export:
    """``record``'s latest good checkpoint and notebook, hashed, ready to stream (blocking:
    run off the loop). Nothing is copied: the stream reads the store's files."""
    store = sessions.store_for(record)
    checkpoint_id = store.latest_id()
    if checkpoint_id is None:
        raise Conflict(f"{record.path} has no checkpoint to export: checkpoint it first")
    try:
        notebook = notebook_file.read_bytes()
    except OSError as err:
        raise Conflict(f"{record.path} cannot be read to export it ({err.strerror})") from err
    lock = contextlib.ExitStack()
    lock.enter_context(store.locked())
    try:
        manifest = store.read_manifest(checkpoint_id)
        files = session_file.checkpoint_members(store, checkpoint_id)
        index = session_file.Index(
            format=session_file.FORMAT,
            notebook=server_path,
            checkpoint_id=checkpoint_id,
            made_by=getpass.getuser(),
            made_on=platform.node(),
            made_at=time.time(),
            environment=dict(manifest.get("environment") or {}),
        )
        session_file.hash_members(index, notebook, files)
    except BaseException:
        lock.close()
        raise
    stem = Path(server_path).stem or "session"
    return Export(
        index, notebook, files, session_file.tar_size(index), f"{stem}{session_file.SUFFIX}", lock
    )


def require_new(sessions: Sessions, server_path: str, notebook_file: Path) -> None:
    """Conflict when notebook ``server_path`` exists here already (asked before the upload)."""
    if notebook_file.exists() or server_path in sessions.records:
        raise Conflict(f"{server_path} exists already: import the session under another name")


def stage(sessions: Sessions, upload: IO[bytes]) -> session_file.Staged:
    """Read and check a session file into a staging folder of the store (blocking: run in a
    thread; ``upload`` may be the request's body as it arrives, ``ChunkReader``)."""
    staging = _staging_root(sessions.store_root) / f"import-{secrets.token_hex(6)}"
    try:
        return session_file.read(upload, staging)
    except session_file.SessionFileError as err:
        raise ImportRefused(f"Session file refused, nothing was imported: {err}") from err


def place_import(
    sessions: Sessions, staged: session_file.Staged, server_path: str, notebook_file: Path
) -> tuple[SessionRecord, list[str]]:
    """Place a checked session as notebook ``server_path`` (blocking): the record (paused,
    untrusted) and what differs from this environment. The staging folder goes either way."""
    try:
        require_new(sessions, server_path, notebook_file)
        key = sessions.notebook_key(server_path)
        store = session_file.place(staged, sessions.store_root, key)
        notebook_file.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomically(notebook_file, (staged.folder / session_file.NOTEBOOK).read_bytes())
    except session_file.SessionFileError as err:
        raise Conflict(str(err)) from err
    finally:
        staged.remove()
    index = staged.index
    differs = differences(index.environment)
    record = SessionRecord(server_path, key, state="paused")
    record.checkpoint = _latest(store)
    sessions.records[server_path] = record
    sessions.set(record, "paused", imported_message(index, trusted=False, differs=differs))
    return record, differs


class ChunkReader:
    """The request's body as a file for the thread that reads it as it arrives: a few chunks
    in flight (the handler waits while they are full, and so does the client)."""

    def __init__(self, depth: int = 8) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue(depth)
        self._chunk, self._offset = b"", 0
        self._ended = False
        self._closed = threading.Event()
        self._broken = threading.Event()

    def put(self, chunk: bytes | None) -> None:
        """A chunk of the body (None: its end); dropped once the reader has stopped."""
        while not self._closed.is_set():
            try:
                self._queue.put(chunk, timeout=0.5)
                return
            except queue.Full:
                continue

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        wanted = size
        while wanted != 0 and not self._ended:
            if self._offset == len(self._chunk):
                if not self._next_chunk():
                    break
                continue
            end = len(self._chunk) if wanted < 0 else min(len(self._chunk), self._offset + wanted)
            parts.append(self._chunk[self._offset : end])
            if wanted > 0:
                wanted -= end - self._offset
            self._offset = end
        return b"".join(parts)

    def _next_chunk(self) -> bool:
        """The next chunk of the body; False at its end (or once it was broken off)."""
        while True:
            try:
                chunk = self._queue.get(timeout=0.5)
            except queue.Empty:
                if self._broken.is_set():  # the upload was broken off: a truncated file
                    self._ended = True
                    return False
                continue
            if chunk is None:
                self._ended = True
                return False
            self._chunk, self._offset = chunk, 0
            return True

    def break_off(self) -> None:
        """The client went away mid-upload: the reader ends with what it has (truncated)."""
        self._broken.set()

    def close(self) -> None:
        """The reader is done (or refused the file): later chunks are dropped, not waited on."""
        self._closed.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)  # a read still waiting ends


def _latest(store: store_mod.NotebookStore) -> dict[str, Any] | None:
    from .store_view import inspect_store

    _stamp, view = inspect_store(store)
    return view.latest


#: How an imported session's message begins (the frontend keys its trust question on it).
IMPORTED = "Paused (imported from "


def imported_message(index: session_file.Index, trusted: bool, differs: list[str]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(index.made_at))
    text = f"{IMPORTED}{index.made_by} on {index.made_on}, {when})."
    text += (
        " Resume restores it from files."
        if trusted
        else " Trust it to resume: restoring runs code from it."
    )
    if differs:
        text += " Differs here: " + "; ".join(differs) + "."
    return text


def trust_session(sessions: Sessions, record: SessionRecord) -> SessionRecord:
    """The user trusts an imported session: its restore may unpickle it (blocking)."""
    if record.state in RUNNING_STATES:
        raise Conflict(f"{record.path} runs: only a paused import needs trust")
    store = sessions.store_for(record)
    try:
        saved = imported_mod.trust(store)
    except store_mod.StoreError as err:
        raise UnknownSession(f"{record.path}: {err}") from err
    index = session_file.Index.from_json(_full_index(saved))
    sessions.set(record, "paused", imported_message(index, True, differences(index.environment)))
    return record


def _full_index(record: dict[str, Any]) -> dict[str, Any]:
    index = dict(record.get("index") or {})
    index["members"] = {}
    return index


def untrusted(sessions: Sessions, record: SessionRecord) -> str | None:
    """Why ``record``'s store may not be restored yet (an untrusted import), or None."""
    try:
        imported_mod.require_trusted(sessions.store_for(record))
    except store_mod.StoreError as err:
        return str(err)
    return None
