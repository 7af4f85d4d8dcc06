"""Reading checkpoint data into fresh memory: ``O_DIRECT``, several reads in flight, in order.

A restore needs every byte of every buffer in memory the kernel owns. Mapping the data files
and faulting their pages in (what a restore did before) reads through the page cache: each
4 KiB gets a page-cache page, and the first write of a restored tensor copies it again
(copy-on-write). After an ``O_DIRECT`` save the data is not in the page cache, so nothing is
gained by going through it. Here each buffer of 1 MiB or more gets anonymous memory of its
own, and worker threads read it with ``O_DIRECT`` straight from the disk into that memory,
up to 64 MiB per request, four requests at once, in the order the restore needs the buffers.
Measured on this project's VM (bench/README.md): faster than faulting a mapping in.

The tensors and arrays built on a buffer keep its memory alive (``torch.frombuffer`` and
``numpy.ndarray`` hold the map), so it is freed with them. Smaller buffers (pickled frames,
small arrays) are read together, a few MiB per request, and each is handed out as a copy of
its own, so one small array never keeps its neighbours' memory alive.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

ALIGN = 4096  # O_DIRECT wants offsets, lengths and addresses aligned to the block size
# One read request. Large, so that the disk stays busy while the restore's main thread holds
# the GIL (unpickling, hashing) and no reader thread can queue its next request: 64 MiB
# restored 8 GB in 6.15 s against 7.38 s with 8 MiB, faster in each of 4 paired rounds
# (bench/README.md); no difference at 2 GB and below.
REQUEST = 64 << 20
OWN_MEMORY_AT_LEAST = 1 << 20  # smaller buffers share a read and are copied out of it
_SMALL_SPAN_AT_MOST = 4 << 20  # small buffers read in one request
_SMALL_GAP_AT_MOST = 64 << 10  # bytes between two small buffers read along with them
READ_THREADS = 4  # requests in flight; the threads wait on the disk, not on a core
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class ReadError(Exception):
    """A data file could not be read as recorded; the message names it and says why."""


def fresh_memory(nbytes: int) -> mmap.mmap:
    """Page-aligned, zero-filled, writable memory of our own.

    Private: Python's default for anonymous maps is MAP_SHARED (shmem), which a forked child
    (a DataLoader worker) would share with the kernel, writes included. No MADV_HUGEPAGE:
    where the kernel compacts memory for it on the fault (``defrag=madvise``, a common
    default), a 0.71 GB restore took 5 s instead of 0.8 s here once memory was fragmented.
    """
    return mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def open_for_reading(path: os.PathLike[str] | str) -> tuple[int, bool]:
    """An fd that reads around the page cache where the filesystem allows it; (fd, direct)."""
    flags = os.O_RDONLY | os.O_CLOEXEC
    if _O_DIRECT:
        try:
            return os.open(path, flags | _O_DIRECT), True
        except OSError as err:
            if err.errno != errno.EINVAL:  # only "no O_DIRECT here" is ours to handle
                raise
    return os.open(path, flags), False


def read_into(fd: int, direct: bool, target: memoryview, offset: int) -> int:
    """Read ``target.nbytes`` bytes at ``offset`` (fewer at the end of the file); bytes read.

    With ``O_DIRECT`` a short read only happens at the end of the file: the next request
    would start mid-block, which ``O_DIRECT`` refuses, so it stops there.
    """
    got = 0
    while got < target.nbytes:
        n = os.preadv(fd, [target[got:]], offset + got)
        if n == 0:
            break
        got += n
        if direct and got % ALIGN:
            break
    return got


@dataclass
class Span:
    """One block-aligned range of one file, read into one region of fresh memory, ``REQUEST``
    bytes per request."""

    file: str
    start: int  # file offset, aligned
    end: int  # file offset up to which bytes must exist (the last buffer's end)
    memory: mmap.mmap | None = None
    read: list[threading.Event] = field(default_factory=list)  # per chunk: done (or failed)
    error: str | None = None

    @property
    def length(self) -> int:
        return self.end - self.start + (-self.end % ALIGN)


@dataclass
class Placed:
    """Where a buffer is: its span and its offset in the span's memory."""

    span: Span
    offset: int
    nbytes: int
    shared: bool  # the span holds other buffers too: hand out a copy


class FileReads:
    """Reads buffers of data files into fresh memory on worker threads, in the order asked.

    ``open_file(name)`` returns ``(fd, direct)`` for a data file or raises ``ReadError``;
    fds are closed with ``close``. ``schedule`` queues buffers (large ones alone, runs of
    small ones together); ``get`` waits for one and returns its bytes.
    """

    def __init__(self, open_file: Callable[[str], tuple[int, bool]]) -> None:
        self._open_file = open_file
        self._files: dict[str, tuple[int, bool] | str] = {}  # name -> (fd, direct) or why not
        self._placed: dict[str, Placed] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="jupyter-pause-read")
        self._submitted: list[Future[int]] = []

    def file(self, name: str) -> tuple[int, bool]:
        """The open file, or ReadError (remembered, so a missing file is tried once)."""
        found = self._files.get(name)
        if found is None:
            try:
                found = self._open_file(name)
            except ReadError as err:
                found = str(err)
            self._files[name] = found
        if isinstance(found, str):
            raise ReadError(found)
        return found

    def schedule(self, buffers: list[tuple[str, str, int, int]]) -> None:
        """Queue ``(key, file, offset, nbytes)`` buffers, read in this order (small ones
        with their neighbours in the file); keys already queued are skipped."""
        small: dict[str, list[tuple[str, int, int]]] = {}
        spans: list[tuple[Span, list[tuple[str, int, int]]]] = []
        for key, name, offset, nbytes in buffers:
            if key in self._placed:
                continue
            if nbytes >= OWN_MEMORY_AT_LEAST:
                spans.append((Span(name, offset - offset % ALIGN, offset + nbytes), []))
                self._placed[key] = Placed(spans[-1][0], offset % ALIGN, nbytes, False)
            else:
                if name not in small:
                    spans.append((Span(name, 0, 0), small.setdefault(name, [])))
                small[name].append((key, offset, nbytes))
        for span, members in spans:
            if members:  # a placeholder: where the file's small buffers come in the order
                for grouped in self._group_small(span.file, members):
                    self._start(grouped)
            else:
                self._start(span)

    def _group_small(self, name: str, members: list[tuple[str, int, int]]) -> list[Span]:
        """Runs of small buffers close together in the file, each read as one span."""
        groups: list[Span] = []
        for key, offset, nbytes in sorted(members, key=lambda m: m[1]):
            last = groups[-1] if groups else None
            if (
                last is None
                or offset - last.end > _SMALL_GAP_AT_MOST
                or offset + nbytes - last.start > _SMALL_SPAN_AT_MOST
            ):
                last = Span(name, offset - offset % ALIGN, offset + nbytes)
                groups.append(last)
            last.end = max(last.end, offset + nbytes)
            self._placed[key] = Placed(last, offset - last.start, nbytes, True)
        return groups

    def _start(self, span: Span) -> None:
        starts = range(0, span.length, REQUEST)
        span.read = [threading.Event() for _ in starts]
        try:
            fd, direct = self.file(span.file)
        except ReadError as err:
            self._fail(span, str(err))
            return
        span.memory = fresh_memory(span.length)
        view = memoryview(span.memory)
        for index, start in enumerate(starts):
            target = view[start : min(start + REQUEST, span.length)]
            self._pool.submit(self._read, span, index, fd, direct, target)

    def _read(self, span: Span, index: int, fd: int, direct: bool, target: memoryview) -> None:
        position = span.start + index * REQUEST
        try:
            got = read_into(fd, direct, target, position)
            if position + got < min(span.end, position + target.nbytes):
                raise ReadError(
                    f"Data file {span.file} is shorter than recorded: the checkpoint is damaged."
                )
        except (OSError, ReadError) as err:
            why = str(err) if isinstance(err, ReadError) else f"{span.file}: {err.strerror}"
            with self._lock:
                span.error = span.error or why
        finally:
            target.release()
            span.read[index].set()

    def _fail(self, span: Span, why: str) -> None:
        span.error = span.error or why
        for done in span.read:
            done.set()

    def get(self, key: str, each_piece: Callable[[memoryview], object] | None = None) -> memoryview:
        """The buffer's bytes once read (``schedule`` it first, and again to ``get`` it again);
        ReadError if they cannot be.

        ``each_piece`` sees the bytes in order as each request lands, while the rest is still
        being read (the restore hashes them so): hashing a 200 MB buffer in one go would hold
        the GIL for 50 ms, and the reader threads could queue no request meanwhile.
        """
        placed = self._placed[key]
        span = placed.span
        low, high = placed.offset, placed.offset + placed.nbytes
        streamed = each_piece is not None and not placed.shared
        for index in range(low // REQUEST, -(-high // REQUEST)):
            span.read[index].wait()
            if streamed and span.error is None:
                piece = slice(max(low, index * REQUEST), min(high, (index + 1) * REQUEST))
                each_piece(memoryview(span.memory)[piece])  # type: ignore[arg-type,misc]
        if span.error is not None:
            raise ReadError(span.error)
        view = memoryview(span.memory)[low:high]  # type: ignore[arg-type]
        if not placed.shared:
            # The caller's view keeps the memory alive as long as it needs it (a frame: until
            # it is unpickled); asked again, the buffer is read again.
            del self._placed[key]
            return view
        own = memoryview(bytearray(view))
        if each_piece is not None:
            each_piece(own)
        return own

    def submit(self, work: Callable[[], int]) -> Future[int]:
        """Run ``work`` on a reader thread (the CUDA path queues its own reads here)."""
        future = self._pool.submit(work)
        self._submitted.append(future)
        return future

    def close(self) -> None:
        """Drop reads not started, wait for the others, close the files."""
        # Every read done (the usual end of a restore), the idle workers exit on their own: a
        # restore is not kept waiting for them (a few ms of a lazy restore's time to ready).
        idle = all(
            done.is_set() for placed in self._placed.values() for done in placed.span.read
        ) and all(future.done() for future in self._submitted)
        self._pool.shutdown(wait=not idle, cancel_futures=True)
        for placed in self._placed.values():
            if not all(done.is_set() for done in placed.span.read):  # a cancelled read
                self._fail(placed.span, "the restore stopped before this was read")
        for found in self._files.values():
            if not isinstance(found, str):
                os.close(found[0])
        self._files.clear()
