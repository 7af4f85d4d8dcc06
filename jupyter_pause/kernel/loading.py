"""Where a restore gets each buffer's bytes: read into fresh memory, or mapped from the cache.

A data file that is not (wholly) in the page cache, the usual case after an ``O_DIRECT``
save, a reboot or a move to another machine, is read with ``O_DIRECT`` into memory of our
own (``reading.FileReads``). A file whose every page is in the page cache already (written
through it recently, or on tmpfs) is mapped copy-on-write instead, and its pages are faulted
in by ``store.Prefetch``: nothing has to come from the disk, and a map costs no copy, so
mapping wins there (measured in bench/README.md). Tensors that go to a CUDA device are
streamed there through pinned buffers (``device_reads``) instead of landing in host memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from . import store as store_mod
from .reading import FileReads, ReadError


class BufferSource:
    """The bytes of a manifest's buffers, each from its file's best path (see the module)."""

    #: Which data files are mapped: "cached" (those wholly in the page cache), "always" or
    #: "never". Not a setting: bench/bench_checkpoint.py changes it to compare the paths.
    map_files = "cached"

    def __init__(self, store: store_mod.NotebookStore, manifest: dict[str, Any]) -> None:
        self._store = store
        self._buffers: dict[str, dict[str, Any]] = manifest["buffers"]
        self._mapped: dict[str, bool] = {}  # data file -> whether it is mapped
        self._reads = FileReads(self._open)
        self._prefetches: list[store_mod.Prefetch] = []

    def _open(self, name: str) -> tuple[int, bool]:
        try:
            return self._store.open_data_file(name)
        except store_mod.StoreError as err:
            raise ReadError(str(err)) from None

    def _is_mapped(self, name: str) -> bool:
        found = self._mapped.get(name)
        if found is None:
            if self.map_files == "cached":
                found = self._store.in_page_cache(name)
            else:
                found = self.map_files == "always"
            self._mapped[name] = found
            if not found:
                self._store.forget_map(name)
        return found

    def fetch(self, digests: list[str]) -> None:
        """Start bringing these buffers in, in this order (a whole restore asks for all)."""
        mapped, read = [], []
        for digest in digests:
            location = self._buffers[digest]
            if self._is_mapped(location["file"]):
                mapped.append(digest)
            else:
                read.append((digest, location["file"], location["offset"], location["nbytes"]))
        self._reads.schedule(read)
        prefetch = self._store.start_prefetch({"buffers": self._buffers}, mapped)
        if prefetch is not None:
            self._prefetches.append(prefetch)

    def get(
        self, digest: str, each_piece: Callable[[memoryview], object] | None = None
    ) -> memoryview:
        """One buffer's bytes (fetched now if ``fetch`` did not ask for it); StoreError if the
        file is missing, shorter than recorded or unreadable. ``each_piece`` sees the bytes
        in order, piece by piece as they are read (see ``FileReads.get``)."""
        location = self._buffers[digest]
        if self._is_mapped(location["file"]):
            for prefetch in self._prefetches:
                prefetch.wait(digest)
            data = self._store.open_buffer(location)
            if each_piece is not None:
                each_piece(data)
            return data
        self.fetch([digest])
        try:
            return self._reads.get(digest, each_piece)
        except ReadError as err:
            raise store_mod.StoreError(str(err)) from None

    def map_now(self, digest: str, *, own: bool = False) -> memoryview:
        """One buffer's copy-on-write map, at once: its pages come in when first touched
        (a lazy restore; StoreError if its file is missing or shorter than recorded).
        ``own``: a map no other buffer shares pages with (see ``store.open_buffer``)."""
        return self._store.open_buffer(self._buffers[digest], read_ahead=False, own=own)

    def to_device(self, digest: str, device: Any, verify: bool) -> Any:
        """A torch storage on ``device`` (CUDA) holding the buffer, streamed there from the
        disk; None when the file is mapped (its bytes are in memory: copy them from there)."""
        location = self._buffers[digest]
        if self._is_mapped(location["file"]):
            return None
        from .device_reads import read_to_device

        try:
            return read_to_device(
                self._reads,
                location["file"],
                location["offset"],
                location["nbytes"],
                device,
                digest if verify else None,
            )
        except ReadError as err:
            raise store_mod.StoreError(str(err)) from None

    def close(self, cancel: bool) -> None:
        """Wait for the work in flight (dropping what was not started if ``cancel``)."""
        for prefetch in self._prefetches:
            if cancel:
                prefetch.cancel()
            prefetch.join()
        self._reads.close()


@contextlib.contextmanager
def buffer_source(
    store: store_mod.NotebookStore, manifest: dict[str, Any], digests: list[str]
) -> Iterator[BufferSource]:
    """A ``BufferSource`` that starts fetching ``digests`` at once; leaving the block waits
    for its workers (an error first drops what they have not started)."""
    source = BufferSource(store, manifest)
    cancel = True
    try:
        source.fetch(digests)
        yield source
        cancel = False
    finally:
        source.close(cancel)
