"""The checkpoint store on disk: one folder per notebook, immutable data files, atomic manifests.

The layout of a notebook's folder and the names in it are in ``layout``; owner-only and
crash-safe writes in ``files``; manifests are read in ``manifests``; retention and collection
(``Retention``, a part of ``NotebookStore``) in ``retention``; writing a checkpoint in
``writer``, which only saving loads.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import mmap
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .files import (
    LIBC,
    check_owned,
    ensure_private_dir,
    fsync_dir,
    pid_alive,
    write_file_atomically,
    write_private,
)
from .layout import (
    COMPACT_TMP_RE,
    IMAGE_RE,
    MANIFEST_FORMAT,
    TMP_RE,
    BufferLocation,
    CheckpointNotFound,
    DamagedCheckpoint,
    StoreError,
    StoreOwnershipError,
    TornCheckpoint,
    UnreadableCheckpoint,
    WriteStats,
    default_store_root,
    folder_notebook_key,
    notebook_folder_name,
    numbered,
    read_torn_log,
)
from .manifests import (
    manifest_bytes,
    manifest_problem,
    manifest_shrink,
    manifest_variables,
    shrinks,
)
from .page_cache import LIBC_MINCORE, Prefetch, map_address, pages_in_memory
from .reading import open_for_reading
from .retention import Retention

if TYPE_CHECKING:
    from .writer import CheckpointWriter

#: The store's vocabulary, for the modules that use the store as one thing (``store_mod.X``).
__all__ = [
    "MANIFEST_FORMAT",
    "BufferLocation",
    "CheckpointNotFound",
    "DamagedCheckpoint",
    "NotebookStore",
    "Prefetch",
    "StoreError",
    "StoreOwnershipError",
    "TornCheckpoint",
    "UnreadableCheckpoint",
    "WriteStats",
    "default_store_root",
    "folder_notebook_key",
    "known_buffers",
    "manifest_bytes",
    "manifest_shrink",
    "manifest_variables",
    "notebook_folder_name",
    "shrinks",
    "write_file_atomically",
    "write_private",
]


#: The folders ``NotebookStore.prepare`` makes in a notebook's folder.
SUBFOLDERS = ("manifests", "blobs", "packs", "tmp")


class NotebookStore(Retention):
    """The checkpoints of one notebook."""

    def __init__(self, root: Path, key: str):
        self.root = Path(root)
        self.key = key
        self.path = self.root / notebook_folder_name(key)
        self._maps: dict[str, mmap.mmap | bytearray] = {}
        self._read_maps: dict[str, mmap.mmap | bytes] = {}  # lazy restores check through these

    # -- layout -------------------------------------------------------------------------------
    @property
    def manifests_dir(self) -> Path:
        return self.path / "manifests"

    def prepare(self) -> None:
        """Create the folders (0700) and record which notebook this folder is for."""
        ensure_private_dir(self.root)
        ensure_private_dir(self.path)
        for sub in SUBFOLDERS:
            ensure_private_dir(self.path / sub)
        info = self.path / "notebook.json"
        if not info.exists():
            write_file_atomically(info, json.dumps({"key": self.key}).encode())

    def remove_if_unused(self) -> None:
        """Remove the folder while it holds only what ``prepare`` made (empty folders and
        ``notebook.json``); anything else in it, and it stays. OSError when it cannot."""
        with contextlib.suppress(FileNotFoundError):  # gone already
            if set(os.listdir(self.path)) - {*SUBFOLDERS, "notebook.json"}:
                return
            if any(os.listdir(self.path / sub) for sub in SUBFOLDERS if (self.path / sub).is_dir()):
                return
            for sub in SUBFOLDERS:
                with contextlib.suppress(FileNotFoundError):
                    (self.path / sub).rmdir()
            (self.path / "notebook.json").unlink(missing_ok=True)
            self.path.rmdir()

    def exists(self) -> bool:
        return self.manifests_dir.is_dir()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialise writers and collectors (two kernels of one notebook, a kernel and the server).

        Whoever takes the lock first moves damaged manifests aside: no reader or writer after
        it trips over them, and the intact checkpoints stay in view.
        """
        self.prepare()
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._set_aside_damaged()
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- manifests ----------------------------------------------------------------------------
    def checkpoint_ids(self) -> list[int]:
        return numbered(self.manifests_dir)

    def manifest_path(self, checkpoint_id: int) -> Path:
        return self.manifests_dir / f"{checkpoint_id:06d}.json"

    def read_manifest(self, checkpoint_id: int) -> dict[str, Any]:
        """The manifest, checked to hold what loading and collection rely on.

        Raises CheckpointNotFound, DamagedCheckpoint (garbled or incomplete),
        UnreadableCheckpoint (another format, or a file we must not trust)."""
        path = self.manifest_path(checkpoint_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            known = ", ".join(str(i) for i in self.checkpoint_ids()) or "none"
            raise CheckpointNotFound(
                f"No checkpoint {checkpoint_id} for {self.key} (checkpoints: {known})."
            ) from None
        try:
            try:
                check_owned(fd, path)
            except StoreOwnershipError as err:
                raise UnreadableCheckpoint(str(err)) from None
            with os.fdopen(os.dup(fd), "rb") as handle:
                raw = handle.read()
        finally:
            os.close(fd)
        try:
            manifest = json.loads(raw)
        except ValueError as err:
            raise DamagedCheckpoint(
                f"Checkpoint {checkpoint_id} is damaged ({path}: {err})."
            ) from None
        if (
            isinstance(manifest, dict)
            and manifest.get("format", MANIFEST_FORMAT) != MANIFEST_FORMAT
        ):
            raise UnreadableCheckpoint(
                f"Checkpoint {checkpoint_id} was written in format {manifest.get('format')}, "
                f"this jupyter_pause reads format {MANIFEST_FORMAT}."
            )
        problem = manifest_problem(manifest)
        if problem:
            raise DamagedCheckpoint(f"Checkpoint {checkpoint_id} is damaged ({path}: {problem}).")
        return manifest

    def scan(self) -> tuple[dict[int, dict[str, Any]], dict[int, StoreError]]:
        """Every manifest: (id -> manifest for the intact ones, id -> why for the others)."""
        intact: dict[int, dict[str, Any]] = {}
        bad: dict[int, StoreError] = {}
        for checkpoint_id in self.checkpoint_ids():
            try:
                intact[checkpoint_id] = self.read_manifest(checkpoint_id)
            except CheckpointNotFound:
                continue  # deleted meanwhile
            except StoreError as err:
                bad[checkpoint_id] = err
        return intact, bad

    def latest_id(self) -> int | None:
        """The newest checkpoint that can be restored; damaged newer ones are passed over.

        None when there is no checkpoint; when there are some but none can be used, the
        newest one's error says why (rather than "no checkpoint").
        """
        newest_error: StoreError | None = None
        for checkpoint_id in reversed(self.checkpoint_ids()):
            try:
                self.read_manifest(checkpoint_id)
            except CheckpointNotFound:
                continue
            except StoreError as err:
                newest_error = newest_error or err
                continue
            return checkpoint_id
        if newest_error is not None:
            raise newest_error
        return None

    def next_id(self) -> int:
        """One past every id in use, torn and damaged ones included, so an id is never reused."""
        used = self.checkpoint_ids() + numbered(self.path / "damaged")
        tmp = self.path / "tmp"
        if tmp.is_dir():
            for entry in os.listdir(tmp):
                match = TMP_RE.match(entry)
                if match:
                    used.append(int(match.group(1)))
        used.extend(torn.checkpoint_id for torn in self.torn_history())
        return max(used, default=0) + 1

    def _set_aside_damaged(self) -> None:
        """Move damaged manifests to ``damaged/`` with a note of why (lock held)."""
        for checkpoint_id in self.checkpoint_ids():
            try:
                self.read_manifest(checkpoint_id)
            except DamagedCheckpoint as err:
                folder = self.path / "damaged"
                ensure_private_dir(folder)
                name = self.manifest_path(checkpoint_id).name
                write_private(folder / f"{name}.why", str(err).encode())
                os.replace(self.manifest_path(checkpoint_id), folder / name)
                fsync_dir(self.manifests_dir)
            except StoreError:
                continue  # another format or not ours: not damaged, left where it is

    def damaged(self) -> dict[int, str]:
        """Checkpoints moved aside as damaged, and why."""
        found = {}
        for checkpoint_id in numbered(self.path / "damaged"):
            note = self.path / "damaged" / f"{checkpoint_id:06d}.json.why"
            try:
                found[checkpoint_id] = note.read_text(errors="replace")
            except OSError:
                found[checkpoint_id] = "damaged"
        return found

    def change_stamp(self) -> tuple[Any, ...]:
        """Changes whenever a manifest, the hold or the torn log does (names, sizes, times,
        permissions): a reader may keep what it read from them until then."""
        stamp: list[Any] = []
        for folder in (self.manifests_dir, self.path / "damaged"):
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    stamp.append((entry.path, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        for path in (self.hold_path, self.path / "torn.json"):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                st = path.stat()
                stamp.append((str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return tuple(stamp)

    def problems(self, bad: dict[int, StoreError] | None = None) -> list[str]:
        """What is wrong in this folder, one sentence each (empty when nothing is); ``bad``:
        what ``scan`` found, when the caller already scanned."""
        found = []
        if bad is None:
            _intact, bad = self.scan()
        for checkpoint_id, err in bad.items():
            found.append(f"checkpoint {checkpoint_id} cannot be used: {err}")
        for checkpoint_id, why in self.damaged().items():
            found.append(
                f"checkpoint {checkpoint_id} was damaged and moved to "
                f"{self.path / 'damaged' / f'{checkpoint_id:06d}.json'} ({why})"
            )
        torn_log = self.path / "torn.json"
        if read_torn_log(torn_log) is None:
            found.append(f"{torn_log} is unreadable; the log of interrupted checkpoints restarts")
        hold = self.retention_hold()
        if hold and "unreadable" in hold:
            found.append(f"{self.hold_path} is unreadable ({hold['unreadable']}); retention held")
        return found

    # -- torn checkpoints -----------------------------------------------------------------------
    def recover_torn(self) -> list[TornCheckpoint]:
        """Find checkpoints whose writer died mid-way, log them, and remove their partial files.

        Must be called with the lock held. Returns the ones found now; ``torn_history`` gives all.
        """
        tmp = self.path / "tmp"
        if not tmp.is_dir():
            return []
        found: dict[tuple[int, int], TornCheckpoint] = {}
        for entry in os.listdir(tmp):
            compaction = COMPACT_TMP_RE.match(entry)
            if compaction and not pid_alive(int(compaction.group(1))):
                (tmp / entry).unlink()  # an interrupted compaction: the old pack is still there
                continue
            match = TMP_RE.match(entry)
            if not match:
                continue
            checkpoint_id, pid = int(match.group(1)), int(match.group(2))
            if pid_alive(pid):
                continue
            path = tmp / entry
            st = path.stat()
            torn = found.setdefault(
                (checkpoint_id, pid), TornCheckpoint(checkpoint_id, pid, st.st_mtime, 0)
            )
            torn.started = min(torn.started, st.st_mtime)
            torn.bytes_left += st.st_size
            path.unlink()
        if found:
            history = self.torn_history_raw()
            history.extend(vars(t) for t in found.values())
            write_file_atomically(self.path / "torn.json", json.dumps(history).encode())
        return sorted(found.values(), key=lambda t: t.checkpoint_id)

    def torn_history_raw(self) -> list[dict[str, Any]]:
        """The log of torn checkpoints; entries that do not read as one are left out."""
        return read_torn_log(self.path / "torn.json") or []

    def torn_history(self) -> list[TornCheckpoint]:
        return [TornCheckpoint(**entry) for entry in self.torn_history_raw()]

    # -- writing --------------------------------------------------------------------------------
    def begin(
        self, checkpoint_id: int, known: dict[str, BufferLocation], *, direct: bool = False
    ) -> CheckpointWriter:
        from .writer import CheckpointWriter  # the saving side: a restore never loads it

        return CheckpointWriter(self, checkpoint_id, known, direct=direct)

    # -- reading --------------------------------------------------------------------------------
    def open_buffer(
        self, location: dict[str, Any], *, read_ahead: bool = True, own: bool = False
    ) -> memoryview:
        """A writable, copy-on-write memory map of one buffer: pages load when first touched.

        ``read_ahead``: ask the kernel to start reading its file at once (a restore about to
        read it all); a lazy restore leaves the order to its own load (``lazy.LazyLoad``).
        ``own``: a map of its own, whose pages no other buffer of the same file shares (a
        second storage of equal content: its copy, still loaded lazily)."""
        name = location["file"]
        mapped = self._new_map(name, read_ahead) if own else self._map(name, read_ahead=read_ahead)
        offset, nbytes = location["offset"], location["nbytes"]
        if offset + nbytes > len(mapped):
            raise StoreError(
                f"Data file {location['file']} is shorter than recorded: the checkpoint is damaged."
            )
        return memoryview(mapped)[offset : offset + nbytes]

    def open_buffer_as_written(self, location: dict[str, Any]) -> memoryview:
        """A read-only map of one buffer as its file holds it: what a lazy restore checks,
        unchanged by the notebook's writes to its own copy-on-write map of the same pages."""
        mapped = self._read_maps.get(location["file"])
        if mapped is None:
            path = self.path / location["file"]
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise StoreError(
                    f"Data file {path} is missing: the checkpoint is damaged."
                ) from None
            try:
                check_owned(fd, path)
                size = os.fstat(fd).st_size
                mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
            finally:
                os.close(fd)
            self._read_maps[location["file"]] = mapped
        offset, nbytes = location["offset"], location["nbytes"]
        if offset + nbytes > len(mapped):
            raise StoreError(
                f"Data file {location['file']} is shorter than recorded: the checkpoint is damaged."
            )
        return memoryview(mapped)[offset : offset + nbytes]

    def open_data_file(self, name: str) -> tuple[int, bool]:
        """``(fd, direct)`` reading a data file, around the page cache where the filesystem
        allows it (``reading.FileReads`` reads it); checked like a file we map."""
        path = self.path / name
        try:
            fd, direct = open_for_reading(path)
        except FileNotFoundError:
            raise StoreError(f"Data file {path} is missing: the checkpoint is damaged.") from None
        try:
            check_owned(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd, direct

    def _map(self, name: str, *, read_ahead: bool = True) -> mmap.mmap | bytearray:
        mapped = self._maps.get(name)
        if mapped is None:
            mapped = self._maps[name] = self._new_map(name, read_ahead)
        return mapped

    def _new_map(self, name: str, read_ahead: bool) -> mmap.mmap | bytearray:
        path = self.path / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StoreError(f"Data file {path} is missing: the checkpoint is damaged.") from None
        try:
            check_owned(fd, path)
            size = os.fstat(fd).st_size
            # ACCESS_COPY: private pages, so a restored model can train in place while the
            # file (shared with other checkpoints) never changes.
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else bytearray()
        finally:
            os.close(fd)
        if read_ahead and isinstance(mapped, mmap.mmap):
            with contextlib.suppress(AttributeError, OSError):
                mapped.madvise(mmap.MADV_WILLNEED)
        return mapped

    def start_prefetch(self, manifest: dict[str, Any], digests: list[str]) -> Prefetch | None:
        """Fault the mapped buffers ``digests`` of ``manifest`` in on worker threads, in that
        order (None when there is nothing to fetch, or no C library to ask: not Linux). The
        reader ``wait``s for a buffer before touching it; the caller ``join``s the prefetch
        before the maps may go (``cancel`` first drops what the workers have not started)."""
        if LIBC is None:
            return None
        buffers = []
        anchors = []  # buffer exports pin each map's address while the workers use it
        addresses: dict[str, int] = {}
        for digest in digests:
            location = manifest["buffers"][digest]
            name = location["file"]
            if name not in addresses:
                try:
                    mapped = self._map(name, read_ahead=False)
                except StoreError:
                    continue  # reported for each variable that needs the file
                if not isinstance(mapped, mmap.mmap):
                    continue  # an empty file
                anchors.append(ctypes.c_char.from_buffer(mapped))
                addresses[name] = ctypes.addressof(anchors[-1])
            if location["offset"] + location["nbytes"] <= len(self._maps[name]):
                buffers.append((digest, addresses[name] + location["offset"], location["nbytes"]))
        return Prefetch(buffers, anchors) if buffers else None

    def in_page_cache(self, name: str) -> bool:
        """Whether every page of a data file is in the page cache (written through it
        recently, read recently, or on tmpfs); False for a missing or damaged file."""
        if LIBC is None:
            return False
        try:
            mapped = self._map(name, read_ahead=False)
        except StoreError:
            return False
        if not isinstance(mapped, mmap.mmap):
            return True  # an empty file: nothing to read
        if LIBC_MINCORE is None:
            return False
        found, pages = pages_in_memory(map_address(mapped), len(mapped))
        return found == pages

    def forget_map(self, name: str) -> None:
        """Drop our map of a file that will be read instead (nothing built on it yet)."""
        mapped = self._maps.pop(name, None)
        if isinstance(mapped, mmap.mmap):
            mapped.close()

    def release_maps(self) -> None:
        """Forget our references; live arrays keep their own maps alive as long as they need."""
        self._maps.clear()
        self._read_maps.clear()

    # -- process images (criu backend) ----------------------------------------------------------
    def image_path(self, checkpoint_id: int) -> Path:
        """The folder of the process image that belongs to checkpoint ``checkpoint_id``."""
        return self.path / "images" / f"{checkpoint_id:06d}"

    def new_image_folder(self, checkpoint_id: int) -> Path:
        """An empty owner-only folder for the image of checkpoint ``checkpoint_id`` (an older
        image of it, never restored, is replaced)."""
        self.prepare()
        ensure_private_dir(self.path / "images")
        folder = self.image_path(checkpoint_id)
        shutil.rmtree(folder, ignore_errors=True)
        ensure_private_dir(folder)
        return folder

    def image_ids(self) -> list[int]:
        try:
            entries = os.listdir(self.path / "images")
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(m.group(1)) for e in entries if (m := IMAGE_RE.match(e)))

    def image_bytes(self, checkpoint_id: int) -> int:
        folder = self.image_path(checkpoint_id)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
        return 0


def known_buffers(
    store: NotebookStore, manifest: dict[str, Any] | None
) -> dict[str, BufferLocation]:
    """The buffers a new checkpoint may reuse: those of the given (latest) manifest."""
    if not manifest:
        return {}
    known = {}
    for digest, loc in manifest["buffers"].items():
        if (store.path / loc["file"]).exists():
            known[digest] = BufferLocation(loc["file"], loc["offset"], loc["nbytes"])
    return known
