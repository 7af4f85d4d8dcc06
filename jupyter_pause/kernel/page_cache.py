"""Memory maps of the store's data files, and bringing them into memory before a restore."""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import errno
import mmap
import os
import threading
import time
from collections.abc import Hashable
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
#: How often a prefetch that follows the notebook looks for the buffer it touches (seconds),
#: and where in a piece.
FOLLOW_EVERY = 0.003
FOLLOW_PROBE_AT = 1 << 20
#: How far past the end of what was read the kernel's read-ahead may reach (a device's
#: ``read_ahead_kb``, 8 MiB on this project's VMs, doubled): a buffer right after another
#: of the same file that was read to its end shows pages in that far without being read.
READ_AHEAD_REACH = 16 << 20
#: The notebook stopped reading a buffer once no new piece of it came in for this long.
FOLLOW_QUIET = 0.02


@dataclasses.dataclass
class _Piece:
    address: int
    length: int
    done: threading.Event
    key: Hashable  # the buffer it is part of

    def probed_page(self) -> int:
        """Where the notebook's reads show: 1 MiB in (its first fault reads ahead that far)."""
        at = self.address + min(self.length - 1, FOLLOW_PROBE_AT)
        return at - at % mmap.PAGESIZE


def pages_in_memory(address: int, length: int) -> tuple[int, int]:
    """(pages in memory, pages) of the memory ``[address, address + length)``, widened to
    whole pages: one ``mincore`` (none in memory when it fails: an address not mapped)."""
    start = address - address % mmap.PAGESIZE
    pages = -(-(address + length - start) // mmap.PAGESIZE)
    residency = (ctypes.c_ubyte * pages)()
    if LIBC_MINCORE(start, pages * mmap.PAGESIZE, residency) != 0:
        return 0, pages
    # Bit 0 says resident; the others are reserved.
    return pages - bytes(residency).translate(RESIDENT_BIT).count(0), pages


def page_in_memory(address: int) -> bool:
    """Whether the page holding ``address`` is in memory."""
    return pages_in_memory(address, 1)[0] == 1


def _resident(piece: _Piece) -> bool:
    """Whether the page a piece is probed at is in memory."""
    return page_in_memory(piece.probed_page())


def _read_by_itself(piece: _Piece) -> bool:
    """Whether the first piece of a buffer shows reads of its own: its probed page is in,
    or, when the memory just before the buffer is in too (the end of another buffer of the
    same file, read), a page past the read-ahead those reads brought into this one. A piece
    too short to look past that never shows."""
    before = piece.address - piece.address % mmap.PAGESIZE - mmap.PAGESIZE
    if not page_in_memory(before):
        return _resident(piece)
    at = piece.address + READ_AHEAD_REACH
    return at < piece.address + piece.length and page_in_memory(at)


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

    ``follow_faults`` (a lazy restore, where the notebook runs beside the prefetch): every
    few milliseconds, the first piece not started of each buffer is looked at (``mincore``
    of a page 1 MiB in). In memory although no worker fetched it means the notebook's own
    faults are reading that buffer. The workers then start nothing new while it does (its
    faults' own read-ahead reads one stream faster than workers beside it would: measured in
    bench/README.md), and go on once every page of it is in, or no new page of it came in for
    ``FOLLOW_QUIET``, with that buffer's pieces first. (How far the notebook came is counted
    in pages, not probes: the kernel's read-ahead brings a probed page in well before the
    notebook's reads reach it, and ending the step-aside then let the workers compete with
    the rest of the notebook's read: measured.) A buffer right after one of the same file that
    was read to its end is looked at past ``READ_AHEAD_REACH``, where that read's read-ahead
    cannot have reached. Only buffers no worker has started are looked at: the
    read-ahead of a fetched piece can reach into the next. (Pieces of 8 MiB would step aside
    sooner, but load 8 GB at half the speed: measured.) ``hold``: the workers start only after
    this long (seconds), or as soon as the notebook's first reads end if they begin meanwhile:
    a cell run at once finds the disk its own, and nothing waits after it.
    """

    def __init__(
        self,
        buffers: list[tuple[Hashable, int, int]],
        anchors: list[Any],
        *,
        follow_faults: bool = False,
        threads: int = PREFETCH_THREADS,
        hold: float = 0.0,
    ) -> None:
        """``buffers``: (key, address, nbytes) of mapped buffers, in the order needed, each
        key naming one buffer; ``anchors``: what keeps those maps where they are until
        ``join``."""
        self._anchors = anchors
        self._lock = threading.Lock()
        self._pieces: collections.deque[_Piece] = collections.deque()
        self._of: dict[Hashable, list[_Piece]] = {}  # the pieces of each buffer
        for key, address, nbytes in buffers:
            mine = self._of[key] = [
                _Piece(
                    address + offset, min(PREFETCH_CHUNK, nbytes - offset), threading.Event(), key
                )
                for offset in range(0, nbytes, PREFETCH_CHUNK)
            ]
            self._pieces.extend(mine)
        self._advice = MADV_POPULATE_READ
        self._ended = threading.Event()
        self._go = threading.Event()  # cleared while the notebook reads a buffer on its own
        self.stepped_aside_for: Hashable | None = None  # that buffer, while the workers wait
        self.followed: list[Hashable] = []  # the buffers the notebook was found reading, in order
        self.in_memory_at_start: set[Hashable] = set()
        self._threads = [
            threading.Thread(target=self._work, name="jupyter-pause-prefetch", daemon=True)
            for _ in range(min(threads, len(self._pieces)))
        ]
        if follow_faults and LIBC_MINCORE is not None and self._pieces:
            # In memory before anything was read (a warm page cache): not the notebook's doing.
            self.in_memory_at_start = {key for key, mine in self._of.items() if _resident(mine[0])}
            # The workers wait: the notebook's first reads go first (see ``hold``).
            self._threads.append(
                threading.Thread(
                    target=self._follow, args=(hold,), name="jupyter-pause-follow", daemon=True
                )
            )
        else:
            self._go.set()
        for thread in self._threads:
            thread.start()

    def _take(self) -> _Piece | None:
        """The next piece no worker has started (None when none is left)."""
        self._go.wait()
        with self._lock:
            if not self._pieces:
                self._ended.set()
                return None
            return self._pieces.popleft()

    def _work(self) -> None:
        while (piece := self._take()) is not None:
            try:
                self._advise(piece.address, piece.length)
            finally:
                piece.done.set()

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

    def _follow(self, hold: float) -> None:
        reading: Hashable | None = None  # the buffer the notebook reads on its own
        came_in, changed = 0, 0.0
        whole = 0  # pieces of it read to their last page (those stay in memory)
        held_until = time.monotonic() + hold
        try:
            while not self._ended.wait(FOLLOW_EVERY):
                now = time.monotonic()
                if reading is None:
                    reading = self.follow_once()
                    if reading is not None:
                        self.stepped_aside_for = reading
                        self._go.clear()
                        came_in, changed, whole = 0, now, 0
                    elif now >= held_until:
                        self._go.set()
                    continue
                whole, now_in = self._read_so_far(reading, whole)
                if now_in > came_in:
                    came_in, changed = now_in, now
                if whole == len(self._of[reading]) or now - changed > FOLLOW_QUIET:
                    reading = self.stepped_aside_for = None
                    held_until = now  # the cell run at once had the disk: no need to hold on
        finally:
            self.stepped_aside_for = None
            self._go.set()

    def _read_so_far(self, key: Hashable, whole: int) -> tuple[int, int]:
        """How far the notebook's reads of a buffer came: (pieces in whole, pages in), given
        ``whole`` pieces known to be in already. One ``mincore`` per piece newly in, and one
        over the piece being read."""
        pieces, pages = self._of[key], 0
        while whole < len(pieces):
            found, of = pages_in_memory(pieces[whole].address, pieces[whole].length)
            if found < of:
                pages = found
                break
            whole += 1
        return whole, whole * (PREFETCH_CHUNK // mmap.PAGESIZE) + pages

    def follow_once(self) -> Hashable | None:
        """Put first the buffer the notebook is reading, if it reads one not started yet (see
        the class); which one."""
        with self._lock:
            if not self._pieces:
                self._ended.set()
                return None
            waiting = collections.Counter(piece.key for piece in self._pieces)
            # Only buffers no worker has touched (the read-ahead of a piece they fetched can
            # reach into the next one), that were not in memory already, nor followed before.
            candidates = [
                key
                for key, count in waiting.items()
                if count == len(self._of[key])
                and key not in self.in_memory_at_start
                and key not in self.followed
                and key != self._pieces[0].key  # first already
            ]
        for key in candidates:
            if _read_by_itself(self._of[key][0]):
                with self._lock:
                    mine = [p for p in self._pieces if p.key == key]
                    others = [p for p in self._pieces if p.key != key]
                    self._pieces = collections.deque(mine + others)
                self.followed.append(key)
                return key
        return None

    def waiting(self) -> list[Hashable]:
        """The buffers of the pieces not started, in the order they will be (one entry per
        piece)."""
        with self._lock:
            return [piece.key for piece in self._pieces]

    def wait(self, key: Hashable, at: int | None = None) -> None:
        """Return once every piece of buffer ``key`` is in (or was tried); with ``at``, once
        the piece holding its byte ``at`` is (a reader going through the buffer in order
        waits for each piece once)."""
        pieces = self._of.get(key, [])
        if at is not None:
            index = at // PREFETCH_CHUNK
            pieces = pieces[index : index + 1]
        for piece in pieces:
            piece.done.wait()

    def cancel(self) -> None:
        """Drop the pieces no worker has started (waking anyone waiting on them)."""
        self._ended.set()
        self._go.set()
        while (piece := self._take()) is not None:
            piece.done.set()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()
        self._anchors.clear()
