"""Data files written around the page cache (``O_DIRECT``) where the filesystem allows it.

A checkpoint writes hundreds of MB that the kernel will not read again before it is paused.
Through the page cache every page first needs free memory, then a copy, then a flush. On
virtual machines whose host takes back the guest's free memory (balloon free-page
reporting), finding that memory costs more than the disk itself: measured on this project's
VMs, a buffered write+fsync of 708 MB ran at 0.35-0.5 GB/s when memory had been idle and at
2 GB/s right after other files were deleted, while ``O_DIRECT`` from the same memory ran at
2.4 GB/s every time.

``O_DIRECT`` wants memory addresses, file offsets and lengths aligned to the device's block
size, and tensors are not page-aligned (torch's allocator gives page + 64, numpy page + 16).
So a large buffer is placed at a file offset with the same remainder modulo 4096 as its
address: everything but the (under 4 KiB) ends is then written straight from the tensor's
memory, and the ends, small buffers and padding go through a small aligned staging buffer.
Where ``O_DIRECT`` is refused (tmpfs, some network filesystems) the same writes go through
the page cache.

The large writes run on two shared I/O threads: ``append`` returns as soon as one is queued,
so the caller hashes the next buffer while the disk takes this one (``finish`` waits for
them). The memory written from is the caller's, which keeps it alive until ``finish``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .files import open_new_private

ALIGN = 4096  # a multiple of every block size in use (512, 4096) and of the page size
_STAGE_BYTES = 1 << 20  # small buffers per write request; 4 MiB held 3 MB more per save
_DIRECT_AT_LEAST = 1 << 20  # smaller buffers are cheaper to copy than to write on their own
_WRITE_AT_MOST = 1 << 30  # one pwrite call; Linux caps a call at 2 GiB - 4 KiB
_ZEROS = bytes(ALIGN)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_WRITERS = ThreadPoolExecutor(2, thread_name_prefix="jupyter-pause-write")  # two writes in flight


def buffer_address(data: memoryview) -> int | None:
    """The address of a writable buffer's first byte (None for read-only or empty ones)."""
    try:
        anchor = ctypes.c_char.from_buffer(data)
    except (TypeError, ValueError):
        return None
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor  # release the export at once, so the buffer's owner may be freed


class DataFileWriter:
    """Appends buffers to a new owner-only file; the caller fsyncs ``fd`` after ``finish``."""

    def __init__(self, path: Path, *, direct: bool = True) -> None:
        self.path = path
        self.fd = -1
        self.direct = False
        if direct and _O_DIRECT:
            try:
                self.fd = open_new_private(path, _O_DIRECT)
                self.direct = True
            except OSError as err:
                if err.errno != errno.EINVAL:  # only "no O_DIRECT here" is ours to handle
                    raise
                path.unlink(missing_ok=True)  # Linux creates the file before refusing
        if self.fd < 0:
            self.fd = open_new_private(path)
        self.size = 0  # bytes of data (and padding) appended so far
        self._stage = mmap.mmap(-1, _STAGE_BYTES)  # anonymous, so page-aligned
        self._stage_start = 0  # file offset of the staging buffer's first byte, aligned
        self._stage_len = 0
        self._writes: list[Future[None]] = []  # large writes queued on the I/O threads

    def append(self, data: memoryview, align: int) -> int:
        """Write ``data`` after what is there; returns its offset in the file.

        Small buffers start at a multiple of ``align``; large ones at an offset congruent to
        their address modulo 4096 (so at least as aligned as they are in memory).
        """
        nbytes = data.nbytes
        address = buffer_address(data) if nbytes >= _DIRECT_AT_LEAST else None
        if address is None:
            offset = self.size + (-self.size % align)
            self._pad_to(offset)
            self._stage_bytes(data)
            return offset
        offset = self.size + (address - self.size) % ALIGN
        self._pad_to(offset)
        head = -address % ALIGN
        middle = (nbytes - head) // ALIGN * ALIGN
        self._stage_bytes(data[:head])  # the stage now ends on a block boundary
        self._flush_stage()
        self._writes.append(
            _WRITERS.submit(self._write_at, data[head : head + middle], offset + head)
        )
        self._stage_start = self.size = offset + head + middle
        self._stage_bytes(data[head + middle :])
        return offset

    def finish(self) -> None:
        """Wait for the queued writes (raising the first error), write what is staged; the
        file then holds exactly ``size`` bytes."""
        self._wait_for_writes()
        self._flush_stage()
        os.ftruncate(self.fd, self.size)
        self._stage.close()

    def close(self) -> None:
        for write in self._writes:  # no queued write may outlive the fd
            write.exception()  # waits; an error is finish()'s to raise, not close()'s
        self._writes.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if not self._stage.closed:
            # After a failed write (a full disk), the traceback being handled still holds
            # views of the stage: closing it now would replace that error with a BufferError.
            # The memory goes with the traceback.
            with contextlib.suppress(BufferError):
                self._stage.close()

    # -- internals --------------------------------------------------------------------------
    def _wait_for_writes(self) -> None:
        writes, self._writes = self._writes, []
        errors = [err for err in (write.exception() for write in writes) if err is not None]
        if errors:
            raise errors[0]

    def _pad_to(self, offset: int) -> None:
        while self.size < offset:
            self._stage_bytes(memoryview(_ZEROS)[: min(ALIGN, offset - self.size)])

    def _stage_bytes(self, data: memoryview) -> None:
        view = data.cast("B") if data.format != "B" else data
        while view.nbytes:
            n = min(_STAGE_BYTES - self._stage_len, view.nbytes)
            self._stage[self._stage_len : self._stage_len + n] = view[:n]
            self._stage_len += n
            self.size += n
            view = view[n:]
            if self._stage_len == _STAGE_BYTES:
                self._flush_stage()

    def _flush_stage(self) -> None:
        """Write the staged bytes. The stage ends on a block boundary, except in ``finish``,
        where the last block is padded with zeros that the truncation then removes."""
        if not self._stage_len:
            return
        whole = self._stage_len + (-self._stage_len % ALIGN)
        if whole > self._stage_len:
            self._stage[self._stage_len : whole] = _ZEROS[: whole - self._stage_len]
        self._write_at(memoryview(self._stage)[:whole], self._stage_start)
        self._stage_start += self._stage_len
        self._stage_len = 0

    def _write_at(self, data: memoryview, offset: int) -> None:
        view = data
        while view.nbytes:
            try:
                written = os.pwrite(self.fd, view[:_WRITE_AT_MOST], offset)
            except OSError as err:
                if not (self.direct and err.errno == errno.EINVAL):  # alignment refused
                    raise
                self._stop_direct()
                continue
            view = view[written:]
            offset += written
            if self.direct and written % ALIGN:
                self._stop_direct()  # a short, unaligned write: finish through the cache

    def _stop_direct(self) -> None:
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~_O_DIRECT)
        self.direct = False
