"""Writing one checkpoint: its data files, then its manifest, the commit point.

Only saving (and compacting packs) loads this module; a restore reads through ``store``.
It imports nothing of the store but its vocabulary (``layout``) and its writes (``files``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from . import files as files_mod
from .datafile import DataFileWriter
from .files import write_file_atomically
from .layout import BufferLocation, StoreError, WriteStats

# Buffers this large get a file of their own: collected exactly, never rewritten. Smaller ones
# share the checkpoint's pack: one sequential file is written and read back at full disk speed
# (dozens of files cost a journal commit and a readahead ramp-up each).
LARGE_BUFFER_BYTES = 64 << 20
_PAGE = 4096  # page-aligned buffers map straight into memory
_ALIGN = 64  # small buffers: 64 suits every dtype and SIMD loads
_FSYNC_AT_MOST = 4  # more data files than this are flushed with one syncfs


class StoreFolder(Protocol):
    """What the writer needs of a ``NotebookStore``: its folder and where a manifest goes."""

    path: Path

    def manifest_path(self, checkpoint_id: int) -> Path: ...


class CheckpointWriter:
    """Writes the buffers of one checkpoint, then its manifest: the manifest is the commit point.

    Large buffers go to their own content-named file; small ones to this checkpoint's pack.
    Everything is written to ``tmp/`` first and renamed into place only after fsync.
    """

    def __init__(
        self,
        store: StoreFolder,
        checkpoint_id: int,
        known: dict[str, BufferLocation],
        prefix: str | None = None,
        *,
        direct: bool = False,
    ):
        self.store = store
        self.direct = direct  # data files around the page cache (O_DIRECT) where possible
        self.checkpoint_id = checkpoint_id
        self.known = known
        self.used: dict[str, BufferLocation] = {}
        self.stats = WriteStats()
        # Temp names carry the checkpoint id and pid: a dead writer's leftovers are a torn
        # checkpoint. Compaction passes its own prefix, so its leftovers are not mistaken for one.
        self._prefix = prefix or f"{checkpoint_id:06d}-{os.getpid()}"
        self._tmp = store.path / "tmp"
        self._pending: list[tuple[DataFileWriter, Path]] = []  # (file in tmp/, final path)
        self._pack: DataFileWriter | None = None
        self._pack_name = f"packs/{self._prefix}-{os.urandom(4).hex()}.pack"
        self._pack_tmp = self._tmp / f"{self._prefix}.pack.partial"

    def holds(self, digest: str) -> bool:
        """Whether a buffer with this hash is in this checkpoint or one it may reuse."""
        return digest in self.used or digest in self.known

    def add(self, digest: str, data: memoryview | None) -> BufferLocation:
        """Store one buffer under its content hash, reusing an earlier copy when there is one.

        ``data`` may be None for a buffer known to be stored already (a reused frame).
        """
        location = self.used.get(digest) or self.known.get(digest)
        if location is not None:
            if digest not in self.used:
                self.stats.bytes_reused += location.nbytes
            self.used[digest] = location
            return location
        if data is None:
            raise StoreError(f"buffer {digest} was expected in the store but is gone")
        nbytes = data.nbytes
        if nbytes >= LARGE_BUFFER_BYTES:
            rel = f"blobs/{digest[:2]}/{digest}"
            final = self.store.path / rel
            if final.exists():  # written by another checkpoint since we listed the store
                # A blob file is the buffer after under a page of alignment padding.
                location = BufferLocation(rel, final.stat().st_size - nbytes, nbytes)
                self.stats.bytes_reused += nbytes
            else:
                blob = DataFileWriter(
                    self._tmp / f"{self._prefix}.{digest}.partial", direct=self.direct
                )
                self._pending.append((blob, final))
                location = BufferLocation(rel, blob.append(data, _PAGE), nbytes)
                self.stats.bytes_written += nbytes
        else:
            location = self.append(data)
        self.used[digest] = location
        return location

    def append(self, data: memoryview) -> BufferLocation:
        """Add a buffer to this checkpoint's pack (no dedup: ``add`` is the way in for that)."""
        nbytes = data.nbytes
        if self._pack is None:
            self._pack = DataFileWriter(self._pack_tmp, direct=self.direct)
        offset = self._pack.append(data, _PAGE if nbytes >= _PAGE else _ALIGN)
        self.stats.bytes_written += nbytes
        return BufferLocation(self._pack_name, offset, nbytes)

    def commit(self, manifest: dict[str, Any]) -> Path:
        """Make every data file durable and put it in place, then write the manifest."""
        self.finish_files()
        manifest["buffers"] = {d: loc.to_json() for d, loc in self.used.items()}
        path = self.store.manifest_path(self.checkpoint_id)
        write_file_atomically(path, json.dumps(manifest, separators=(",", ":")).encode())
        return path

    def finish_files(self) -> None:
        """Flush the data files and rename them into place (the manifest may then point there).

        One ``syncfs`` flushes all files at once; where it is missing, each file and folder
        is fsynced.
        """
        files = list(self._pending)
        if self._pack is not None:
            files.append((self._pack, self.store.path / self._pack_name))
        if not files:
            return
        try:
            for data_file, _final in files:
                data_file.finish()
            # A few files (an incremental checkpoint): fsync them; many: one syncfs for all.
            flushed = len(files) > _FSYNC_AT_MOST and files_mod.syncfs_of(self.store.path)
            if not flushed:
                for data_file, _final in files:
                    os.fsync(data_file.fd)
        except BaseException:
            self.abort()
            raise
        self._pending.clear()
        self._pack = None
        for data_file, final in files:
            data_file.close()
            final.parent.mkdir(mode=0o700, exist_ok=True)
            os.replace(data_file.path, final)
        # The renames must be durable before the manifest that points at them.
        if not (flushed and files_mod.syncfs_of(self.store.path)):
            for folder in {final.parent for _data_file, final in files}:
                files_mod.fsync_dir(folder)

    def abort(self) -> None:
        """Remove everything this writer left in tmp/; the previous checkpoint is untouched."""
        if self._pack is not None:
            self._pending.append((self._pack, self._pack.path))
            self._pack = None
        for data_file, _final in self._pending:
            data_file.close()
            data_file.path.unlink(missing_ok=True)
        self._pending.clear()
