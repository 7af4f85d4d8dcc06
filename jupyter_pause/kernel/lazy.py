"""Ready before the bytes are in: large buffers handed over as maps, loaded behind the user.

A lazy restore (``Checkpointer.lazy_restore``) gives each large CPU array and tensor the
copy-on-write map of its checkpoint data file (``store.open_buffer``): a plain ``ndarray`` or
``Tensor`` whose pages come in on first touch, and whose writes land in private pages (the
file never changes). The kernel is ready once the small objects are back. ``LazyLoad`` then
faults every mapped buffer in on worker threads (``page_cache.Prefetch``), in the order the
restore handed them out, and hashes each piece as soon as it is in, so the check ends with
the last read. A buffer that does not match takes back the variables built on it (each still
holding that very object) and names them: a damaged file is never silently worked with.

The hash reads the notebook's own map (the pages the workers just brought in: no second
fault per page). Only when that does not match (the notebook may have written to its copy
already) are the file's bytes, as written, hashed again to tell a write from damage.

A file cut short is found before any of this: ``open_buffer`` refuses a buffer that reaches
past the end of its file, so no map can reach a page the file does not have (no SIGBUS).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .arrays import content_hasher
from .page_cache import LIBC, PREFETCH_CHUNK, Prefetch

#: Buffers at least this large are mapped and loaded after ready; smaller ones are read
#: (and checked) before, as in an eager restore: mapping a small buffer saves nothing.
LAZY_AT_LEAST = 1 << 20
#: The load starts this long after ready (seconds), or as soon as a cell run at once has read
#: what it reads: that cell reads alone, and nothing is held back after it.
LOAD_AFTER = 0.05
#: How often progress is told (seconds): a chip that counts is enough.
PROGRESS_EVERY = 0.5


@dataclass
class MappedBuffer:
    """One buffer handed to the notebook as a map, not yet known to be in or intact."""

    digest: str
    view: memoryview  # the notebook's copy-on-write map (keeps it alive until checked)
    written: memoryview  # the same bytes as the file holds them (read-only): what is checked
    file: str
    users: set[str] = field(default_factory=set)  # the variables built on it


@dataclass
class LoadOutcome:
    """What the background load found, once it ended."""

    bytes_total: int
    bytes_done: int
    seconds: float
    failed: dict[str, str]  # variable -> why it was taken back
    stopped: bool  # stopped before the end (a checkpoint, a pause, a new restore)

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes_total": self.bytes_total,
            "bytes_done": self.bytes_done,
            "seconds": round(self.seconds, 3),
            "failed": self.failed,
            "stopped": self.stopped,
        }


class LazyLoad:
    """Faults the mapped buffers in and checks them, behind the notebook (see the module)."""

    def __init__(
        self,
        buffers: list[MappedBuffer],
        namespace: dict[str, Any],
        restored: dict[str, Any],
        *,
        verify: bool,
        on_progress: Callable[[int, int], None],
        on_end: Callable[[LoadOutcome], None],
    ) -> None:
        self.buffers = buffers
        self.total = sum(b.view.nbytes for b in buffers)
        self.done = 0
        self._namespace = namespace
        self._restored = restored  # name -> the object the restore put there
        self._verify = verify
        self._on_progress = on_progress
        self._on_end = on_end
        self._stop = threading.Event()
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="jupyter-pause-lazy", daemon=True)
        self._prefetch: Prefetch | None = None
        self.outcome: LoadOutcome | None = None

    @property
    def pending(self) -> int:
        """Bytes not in (and hashed) yet."""
        return self.total - self.done

    def start(self) -> None:
        # One thread now; it starts the workers: the notebook is ready without waiting for them.
        self._thread.start()

    def _start_prefetch(self) -> None:
        if LIBC is None:
            return
        anchors = [ctypes.c_char.from_buffer(b.view) for b in self.buffers]
        self._prefetch = Prefetch(
            [  # keyed by position: equal buffers (a storage and its copy) are loaded apart
                (key, ctypes.addressof(anchor), b.view.nbytes)
                for key, (b, anchor) in enumerate(zip(self.buffers, anchors, strict=True))
            ],
            anchors,
            follow_faults=True,
            hold=LOAD_AFTER,
        )

    def stop(self) -> None:
        """Stop where it is (what was not checked stays as it is) and wait for the workers."""
        self._stop.set()
        if self._prefetch is not None:
            self._prefetch.cancel()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the load ended; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        failed: dict[str, str] = {}
        told = 0.0
        try:
            if not self._stop.is_set():
                self._start_prefetch()
            for key, buffer in enumerate(self.buffers):
                check = content_hasher() if self._verify else None
                for start in range(0, buffer.view.nbytes, PREFETCH_CHUNK):
                    end = min(start + PREFETCH_CHUNK, buffer.view.nbytes)
                    if self._prefetch is not None:
                        self._prefetch.wait(key, at=start)
                    if self._stop.is_set():
                        return
                    if check is not None and not _hash_into(check, buffer.view[start:end]):
                        check = None  # unreadable (EIO): the file's bytes tell
                    self.done += end - start
                    now = time.perf_counter()
                    if now - told >= PROGRESS_EVERY:
                        told = now
                        self._on_progress(self.done, self.total)
                if self._verify and not self._intact(buffer, check):
                    failed.update(self._take_back(buffer))
                # checked: the variables keep their map alive, the file's goes
                buffer.view = buffer.written = memoryview(b"")
        finally:
            if self._prefetch is not None:
                self._prefetch.cancel()
                self._prefetch.join()
                self._prefetch = None
            # Ended: no reference of ours may keep a variable (or its map) alive any longer.
            self._restored = {}
            for buffer in self.buffers:
                buffer.view = buffer.written = memoryview(b"")
            self.outcome = LoadOutcome(
                bytes_total=self.total,
                bytes_done=self.done,
                seconds=time.perf_counter() - self._started,
                failed=failed,
                stopped=self._stop.is_set() and self.done < self.total,
            )
            self._on_end(self.outcome)

    def _intact(self, buffer: MappedBuffer, notebook_map_hash: Any) -> bool:
        """Whether a buffer holds what was saved: the hash of the notebook's map (None when
        it could not be read) says so at once; else the file's bytes as written decide (the
        notebook may have written to its own pages already)."""
        if notebook_map_hash is not None and notebook_map_hash.hexdigest() == buffer.digest:
            return True
        check = content_hasher()
        return _hash_into(check, buffer.written) and check.hexdigest() == buffer.digest

    def _take_back(self, buffer: MappedBuffer) -> dict[str, str]:
        """The variables built on a damaged buffer leave the namespace (when they still hold
        what the restore put there); why, per variable."""
        why = (
            f"its data in {buffer.file} did not match its hash once loaded (the file is "
            "damaged): taken back; restore an older checkpoint with `%checkpoint restore ID`"
        )
        taken = {}
        for name in sorted(buffer.users):
            value = self._restored.get(name)
            if value is not None and self._namespace.get(name) is value:
                del self._namespace[name]
            taken[name] = why
        return taken


def _hash_into(check: Any, data: memoryview) -> bool:
    """Add ``data`` to a hash; False when a page of it cannot be read (EIO): as damaged as a
    wrong hash."""
    try:
        check.update(data)
    except Exception:
        return False
    return True
