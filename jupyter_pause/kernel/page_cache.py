"""Memory maps of the store's data files, and bringing them into memory before a restore."""

from __future__ import annotations

import collections
import ctypes
import errno
import mmap
import os
import threading
from typing import Any

from .files import LIBC

LIBC_MINCORE = getattr(LIBC, "mincore", None)
if LIBC_MINCORE is not None:
    LIBC_MINCORE.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
RESIDENT_BIT = bytes(i & 1 for i in range(256))


def map_address(mapped: mmap.mmap) -> int:
    """Where a map starts in memory (the map must stay open while the address is used)."""
    anchor = ctypes.c_char.from_buffer(mapped)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor  # release the export at once, so the map can still be closed


MADV_WILLNEED = 3
MADV_POPULATE_READ = 22  # Linux 5.14+; Python's mmap module does not name it
PREFETCH_CHUNK = 32 << 20
PREFETCH_THREADS = max(1, min(4, os.cpu_count() or 1))


class Prefetch:
    """Bring the buffers of a whole restore into memory, in the order it needs them, on
    worker threads.

    Each worker takes the next piece (a buffer, or 32 MiB of a larger one) and faults it in
    with ``madvise(MADV_POPULATE_READ)`` through ctypes: the kernel reads the pages and maps
    them without holding the GIL, several pieces at once. The restore ``wait``s for a buffer
    before it reads (hashes) it, rather than fault the pages itself: a fault of its own
    starts a second, competing read of the same pages.

    Kernels older than 5.14 refuse the advice; the workers then only queue the reads
    (``MADV_WILLNEED``) and the reader's page faults map the pages.
    """

    def __init__(self, buffers: list[tuple[str, int, int]], anchors: list[Any]) -> None:
        """``buffers``: (digest, address, nbytes) of mapped buffers, in the order needed;
        ``anchors``: what keeps those maps where they are until ``join``."""
        self._anchors = anchors
        self._pieces: collections.deque[tuple[int, int, threading.Event]] = collections.deque()
        self._done: dict[str, list[threading.Event]] = {}
        for digest, address, nbytes in buffers:
            events = self._done.setdefault(digest, [])
            for offset in range(0, nbytes, PREFETCH_CHUNK):
                events.append(threading.Event())
                length = min(PREFETCH_CHUNK, nbytes - offset)
                self._pieces.append((address + offset, length, events[-1]))
        self._advice = MADV_POPULATE_READ
        self._threads = [
            threading.Thread(target=self._work, name="jupyter-pause-prefetch", daemon=True)
            for _ in range(min(PREFETCH_THREADS, len(self._pieces)))
        ]
        for thread in self._threads:
            thread.start()

    def _take(self) -> tuple[int, int, threading.Event] | None:
        """The next piece no worker has started (None when none is left); threads share it."""
        try:
            return self._pieces.popleft()
        except IndexError:
            return None

    def _work(self) -> None:
        while (piece := self._take()) is not None:
            address, length, done = piece
            try:
                self._advise(address, length)
            finally:
                done.set()

    def _advise(self, address: int, length: int) -> None:
        # madvise wants a page-aligned start: widen the piece to its first page.
        start = address - address % mmap.PAGESIZE
        length += address - start
        advice = self._advice
        if LIBC.madvise(start, length, advice) == 0:
            return
        if ctypes.get_errno() == errno.EINVAL and advice == MADV_POPULATE_READ:
            self._advice = MADV_WILLNEED
            LIBC.madvise(start, length, MADV_WILLNEED)
        # Anything else (EIO, a file cut short) is the restore's to report: hashing or reading
        # the buffer meets the same error with the file's name attached.

    def wait(self, digest: str) -> None:
        """Return once every piece of buffer ``digest`` is in (or was tried)."""
        for done in self._done.get(digest, ()):
            done.wait()

    def cancel(self) -> None:
        """Drop the pieces no worker has started (waking anyone waiting on them)."""
        while (piece := self._take()) is not None:
            piece[2].set()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()
        self._anchors.clear()
