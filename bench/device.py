"""The device reference: how fast this disk writes and reads the state's bytes, nothing else.

Every fraction in the benchmark divides by this, measured in every round, in the same kind
of processes as the methods. A page-cache write alone is no disk ceiling on a VM (its speed
swings several-fold with the guest's memory state), so each direction takes the best of two
ways of moving the same bytes:

- write: ``O_DIRECT`` (each buffer's block-aligned interior straight from the tensor's
  memory, 8 MiB per request; the under-4 KiB ends and the pickled plain values gathered in
  one aligned buffer, written last) + fsync, and a buffered ``write`` of every buffer in
  order + fsync;
- cold read: ``O_DIRECT`` with the restore's requests (64 MiB, four in flight: one thread
  each, each into a reused aligned buffer), and a buffered sequential ``read`` into one
  reused 64 MiB buffer (the kernel's readahead keeps the disk busy).

Reused buffers on purpose: this is the disk's speed, without the cost of the fresh memory
that any restore must also fill. That cost is measured beside it, outside the reference: the
same ``O_DIRECT`` read into one fresh anonymous map of the file's size (``read_fresh``),
which is the least any restore that builds the state in memory of its own has to do.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path

from jupyter_pause.kernel.reading import READ_THREADS, REQUEST, fresh_memory

ALIGN = 4096
WRITE_REQUEST = 8 << 20
# Reads use the restore's own request size and count (``reading.REQUEST``, ``READ_THREADS``):
# a reference read with other parameters would measure something a restore does not do.
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def _address(view: memoryview) -> int:
    import ctypes

    anchor = ctypes.c_char.from_buffer(view)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def _fsync_file_and_folder(fd: int, path: Path) -> None:
    os.fsync(fd)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_direct(path: Path, views: list[memoryview]) -> float:
    """Seconds to write ``views`` with O_DIRECT and fsync (every view's bytes, once)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o600)
    ends = bytearray()
    try:
        t0 = time.perf_counter()
        offset = 0
        for view in views:
            view = view.cast("B")
            if view.readonly or view.nbytes < ALIGN:
                ends += view
                continue
            head = -_address(view) % ALIGN
            middle = (view.nbytes - head) // ALIGN * ALIGN
            ends += view[:head]
            ends += view[head + middle :]
            for start in range(head, head + middle, WRITE_REQUEST):
                piece = view[start : min(start + WRITE_REQUEST, head + middle)]
                offset += os.pwrite(fd, piece, offset)
        staged = mmap.mmap(-1, len(ends) + (-len(ends) % ALIGN) or ALIGN)
        staged[: len(ends)] = ends
        os.pwrite(fd, staged, offset)
        _fsync_file_and_folder(fd, path)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def write_buffered(path: Path, views: list[memoryview]) -> float:
    """Seconds to write ``views`` in order through the page cache and fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        for view in views:
            view = view.cast("B")
            while view.nbytes:
                view = view[os.write(fd, view) :]
        _fsync_file_and_folder(fd, path)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def _faulted_in(buffer: mmap.mmap | bytearray) -> mmap.mmap | bytearray:
    """The buffer with every page already mapped, so no read pays for fresh memory."""
    for offset in range(0, len(buffer), ALIGN):
        buffer[offset] = 0
    return buffer


def read_direct(path: Path) -> float:
    """Seconds to read the whole file with O_DIRECT, ``READ_THREADS`` requests in flight, each
    reader into a reused buffer of its own."""
    return _read_direct(path, fresh=False)


def read_fresh(path: Path) -> float:
    """The same read into fresh memory: one new map of the file's size, every page faulted
    in by the read itself, as in a restore."""
    return _read_direct(path, fresh=True)


def _read_direct(path: Path, fresh: bool) -> float:
    fd = os.open(path, os.O_RDONLY | _O_DIRECT)
    size = os.fstat(fd).st_size
    next_offset = [0]
    lock = threading.Lock()
    memory = None
    if fresh:
        length = size + (-size % ALIGN) or ALIGN
        memory = fresh_memory(length)  # the memory a restore reads into
    buffers = [None if fresh else _faulted_in(mmap.mmap(-1, REQUEST)) for _ in range(READ_THREADS)]

    def reader(buffer: mmap.mmap | None) -> None:
        while True:
            with lock:
                offset = next_offset[0]
                next_offset[0] += REQUEST
            if offset >= size:
                return
            if buffer is not None:
                os.preadv(fd, [buffer], offset)
                continue
            assert memory is not None
            with memoryview(memory)[offset : offset + REQUEST] as target:
                os.preadv(fd, [target], offset)

    try:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=reader, args=(buffer,)) for buffer in buffers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        if memory is not None:
            memory.close()


def read_buffered(path: Path) -> float:
    """Seconds to read the whole file sequentially through the page cache."""
    buffer = _faulted_in(bytearray(64 << 20))
    with open(path, "rb", buffering=0) as f:
        t0 = time.perf_counter()
        while f.readinto(buffer):
            pass
        return time.perf_counter() - t0
