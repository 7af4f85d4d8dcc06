"""The checkpoint store on disk: one folder per notebook, immutable data files, atomic manifests.

Layout of ``<root>/<notebook-slug>-<hash>/``::

    notebook.json          which notebook (or working directory) this folder belongs to
    lock                   flock()ed while a checkpoint is written or collected
    manifests/000007.json  one per checkpoint; written last, so a manifest that exists is complete
    blobs/ab/<hash>        large buffers (tensor storages, array data), one immutable file each
    packs/000007-<r>.pack  small buffers of one checkpoint (pickled frames, small arrays), 64-byte aligned
    tmp/                   files being written; leftovers there are checkpoints that were torn
    damaged/               manifests that could not be read, moved aside (with why) so they
                           neither hide the intact checkpoints nor block new ones
    hold.json              present while retention is held (a restore did not bring everything
                           back): no checkpoint is deleted until the user decides
    images/000007/         the process image (criu backend) of a kernel paused with checkpoint 7
                           as its safety net: collected with that checkpoint, never after it

Every data file is named by (or indexed by) the xxh3-128 hash of its content and never
rewritten: a kernel may still have it memory-mapped, so new data always goes to a new file
that is renamed into place after fsync. Unreferenced files are unlinked, which is safe for a
process that still maps them.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .reading import open_for_reading

if TYPE_CHECKING:
    from .writer import CheckpointWriter

MANIFEST_FORMAT = 1
# A pack whose live bytes fall below this share is compacted: its live buffers are copied to
# a new pack and the old one deleted, so dead data does not linger behind a little live data.
COMPACT_BELOW = 0.5
# A checkpoint that lacks more than this share of the variables of the one before it is marked
# as shrunk, and the one before is kept (retention held) until the user accepts: a kernel
# without the session's state must never push the last complete checkpoint out.
SHRINK = 0.5
_MANIFEST_RE = re.compile(r"^(\d{6,})\.json$")
_IMAGE_RE = re.compile(r"^(\d{6,})$")
_TMP_RE = re.compile(r"^(\d{6,})-(\d+)\.")
_COMPACT_TMP_RE = re.compile(r"^compact-(\d+)\.")
# A data file a manifest may name: inside blobs/ or packs/, never a way out of the folder.
_DATA_FILE_RE = re.compile(r"^(blobs/[0-9a-f]{2}/[0-9a-f]+|packs/[A-Za-z0-9._-]+\.pack)$")
# What loading and collection read from every manifest, and its JSON type.
_MANIFEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "created": (int, float),
    "process_token": str,
    "buffers": dict,
    "frames": list,
    "skipped": dict,
}
_KIND_NAMES = {(int, float): "a number", str: "a string", dict: "an object", list: "a list"}


class StoreError(Exception):
    """A problem with the checkpoint store that the user can act on; the message says how."""


class StoreOwnershipError(StoreError):
    """The store (or a file in it) belongs to someone else or is writable by others."""


class CheckpointNotFound(StoreError):
    """No checkpoint with that id exists for this notebook."""


class DamagedCheckpoint(StoreError):
    """A manifest that is not a readable checkpoint (garbled, or lacking what a restore needs)."""


class UnreadableCheckpoint(StoreError):
    """A manifest this version must not use (another format, someone else's file); kept as is."""


@dataclass
class BufferLocation:
    """Where one buffer lives: a file and a byte range in it."""

    file: str
    offset: int
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "offset": self.offset, "nbytes": self.nbytes}


@dataclass
class TornCheckpoint:
    """A checkpoint whose writer died before its manifest was in place."""

    checkpoint_id: int
    pid: int
    started: float
    bytes_left: int


@dataclass
class WriteStats:
    bytes_written: int = 0
    bytes_reused: int = 0


def default_store_root() -> Path:
    """``$JUPYTER_PAUSE_STORE``, else ``<jupyter data dir>/jupyter_pause/checkpoints``."""
    env = os.environ.get("JUPYTER_PAUSE_STORE")
    if env:
        return Path(env).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "jupyter_pause" / "checkpoints"


def notebook_folder_name(key: str) -> str:
    """A readable, collision-free folder name for a notebook key (an absolute path)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    stem = Path(key).name or "root"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:48].strip("._") or "notebook"
    return f"{slug}-{digest}"


def _ensure_private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents owner-only (0700); refuse a folder that is a
    symbolic link or someone else's, since its permissions are about to be changed."""
    missing = []
    parent = path
    while not os.path.lexists(parent) and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise StoreOwnershipError(
            f"The checkpoint folder {path} is a symbolic link (to {os.readlink(path)}); refusing "
            "to use it. Point JUPYTER_PAUSE_STORE (or c.PauseApp.store_root) at the real folder."
        )
    if not stat.S_ISDIR(st.st_mode):
        raise StoreOwnershipError(f"{path} should be a checkpoint folder but is not a folder.")
    if st.st_uid != os.geteuid():
        raise StoreOwnershipError(
            f"The checkpoint folder {path} belongs to user id {st.st_uid}, not to you "
            f"(user id {os.geteuid()}); refusing to use it. Point JUPYTER_PAUSE_STORE at a "
            "folder of your own."
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _check_owned(fd: int, path: Path) -> None:
    """Refuse a file we are about to trust (unpickle) unless it is ours and not writable by others."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise StoreOwnershipError(
            f"{path} belongs to user id {st.st_uid}, not to you; refusing to load it "
            "(loading a checkpoint runs code from it)."
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreOwnershipError(
            f"{path} is writable by other users; refusing to load it. Run `chmod 600 {path}` "
            "if you trust its content."
        )


def _write_all(fd: int, data: memoryview) -> None:
    view = data
    while view.nbytes:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_new_private(path: Path, extra_flags: int = 0) -> int:
    """Create ``path`` for writing, owner-only, failing if it exists."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | extra_flags
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # the umask must not widen (or narrow) what we promise
    return fd


def write_private(path: Path, data: bytes) -> None:
    """A small owner-only file, not flushed: for markers and progress, not for data."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        _write_all(fd, memoryview(data))
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: bytes) -> None:
    """temp file + fsync + rename + fsync of the folder: readers see the old or the new file."""
    # Only this thread of this process writes this temp name: one that exists is a leftover
    # of an earlier failure (a full disk), never a write in progress.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = open_new_private(tmp)
    except FileExistsError:
        tmp.unlink()
        fd = open_new_private(tmp)
    try:
        try:
            _write_all(fd, memoryview(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
if _LIBC is not None:
    _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _syncfs(path: Path) -> bool:
    """Flush the whole filesystem holding ``path`` and wait; False where syncfs is missing."""
    syncfs = getattr(_LIBC, "syncfs", None)
    if syncfs is None:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)
    return True


_LIBC_MINCORE = getattr(_LIBC, "mincore", None)
if _LIBC_MINCORE is not None:
    _LIBC_MINCORE.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_RESIDENT_BIT = bytes(i & 1 for i in range(256))


def map_address(mapped: mmap.mmap) -> int:
    """Where a map starts in memory (the map must stay open while the address is used)."""
    anchor = ctypes.c_char.from_buffer(mapped)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor  # release the export at once, so the map can still be closed


_MADV_WILLNEED = 3
_MADV_POPULATE_READ = 22  # Linux 5.14+; Python's mmap module does not name it
_PREFETCH_CHUNK = 32 << 20
_PREFETCH_THREADS = max(1, min(4, os.cpu_count() or 1))


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
            for offset in range(0, nbytes, _PREFETCH_CHUNK):
                events.append(threading.Event())
                length = min(_PREFETCH_CHUNK, nbytes - offset)
                self._pieces.append((address + offset, length, events[-1]))
        self._advice = _MADV_POPULATE_READ
        self._threads = [
            threading.Thread(target=self._work, name="jupyter-pause-prefetch", daemon=True)
            for _ in range(min(_PREFETCH_THREADS, len(self._pieces)))
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
        if _LIBC.madvise(start, length, advice) == 0:
            return
        if ctypes.get_errno() == errno.EINVAL and advice == _MADV_POPULATE_READ:
            self._advice = _MADV_WILLNEED
            _LIBC.madvise(start, length, _MADV_WILLNEED)
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


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def folder_notebook_key(folder: Path) -> str | None:
    """The notebook a store folder belongs to (its ``notebook.json``); None when it names none.

    Raises ValueError when ``notebook.json`` is there but cannot be read.
    """
    info = folder / "notebook.json"
    try:
        key = json.loads(info.read_bytes()).get("key")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(f"{info} is unreadable ({err})") from None
    if not isinstance(key, str):
        raise ValueError(f"{info} names no notebook")
    return key


def _numbered(folder: Path) -> list[int]:
    """Ids of the ``000007.json`` files in a folder, sorted (none when it is missing)."""
    try:
        entries = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for e in entries if (m := _MANIFEST_RE.match(e)))


def _read_torn_log(path: Path) -> list[dict[str, Any]] | None:
    """Valid entries of a torn-checkpoint log; [] when there is none, None when unreadable."""
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return None
    if not isinstance(entries, list):
        return None
    fields = {"checkpoint_id": int, "pid": int, "started": (int, float), "bytes_left": int}
    return [
        {name: entry[name] for name in fields}
        for entry in entries
        if isinstance(entry, dict)
        and all(
            isinstance(entry.get(name), kind) and not isinstance(entry.get(name), bool)
            for name, kind in fields.items()
        )
    ]


def manifest_problem(manifest: Any) -> str | None:
    """What a manifest lacks for loading and collection, or None when it is complete."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    for name, kind in _MANIFEST_FIELDS.items():
        value = manifest.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{name!r} missing or not {_KIND_NAMES[kind]}"
    for digest, loc in manifest["buffers"].items():
        if not (
            isinstance(loc, dict)
            and isinstance(loc.get("file"), str)
            and _DATA_FILE_RE.match(loc["file"])
            and all(
                isinstance(loc.get(k), int) and not isinstance(loc.get(k), bool) and loc[k] >= 0
                for k in ("offset", "nbytes")
            )
        ):
            return f"buffer {digest[:16]} has no valid location"
    for frame in manifest["frames"]:
        if not (
            isinstance(frame, dict)
            and isinstance(frame.get("frame"), str)
            and isinstance(frame.get("names"), list)
            and all(isinstance(n, str) for n in frame["names"])
        ):
            return "a frame lacks its names or data"
    if not isinstance(manifest.get("aliases", {}), dict):
        return "'aliases' is not an object"
    return None


class NotebookStore:
    """The checkpoints of one notebook."""

    def __init__(self, root: Path, key: str):
        self.root = Path(root)
        self.key = key
        self.path = self.root / notebook_folder_name(key)
        self._maps: dict[str, mmap.mmap | bytearray] = {}

    # -- layout -------------------------------------------------------------------------------
    @property
    def manifests_dir(self) -> Path:
        return self.path / "manifests"

    def prepare(self) -> None:
        """Create the folders (0700) and record which notebook this folder is for."""
        _ensure_private_dir(self.root)
        _ensure_private_dir(self.path)
        for sub in ("manifests", "blobs", "packs", "tmp"):
            _ensure_private_dir(self.path / sub)
        info = self.path / "notebook.json"
        if not info.exists():
            write_file_atomically(info, json.dumps({"key": self.key}).encode())

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
        return _numbered(self.manifests_dir)

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
                _check_owned(fd, path)
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
        used = self.checkpoint_ids() + _numbered(self.path / "damaged")
        tmp = self.path / "tmp"
        if tmp.is_dir():
            for entry in os.listdir(tmp):
                match = _TMP_RE.match(entry)
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
                _ensure_private_dir(folder)
                name = self.manifest_path(checkpoint_id).name
                write_private(folder / f"{name}.why", str(err).encode())
                os.replace(self.manifest_path(checkpoint_id), folder / name)
                _fsync_dir(self.manifests_dir)
            except StoreError:
                continue  # another format or not ours: not damaged, left where it is

    def damaged(self) -> dict[int, str]:
        """Checkpoints moved aside as damaged, and why."""
        found = {}
        for checkpoint_id in _numbered(self.path / "damaged"):
            note = self.path / "damaged" / f"{checkpoint_id:06d}.json.why"
            try:
                found[checkpoint_id] = note.read_text(errors="replace")
            except OSError:
                found[checkpoint_id] = "damaged"
        return found

    # -- retention hold ------------------------------------------------------------------------
    @property
    def hold_path(self) -> Path:
        return self.path / "hold.json"

    def retention_hold(self) -> dict[str, Any] | None:
        """Why retention is held (a restore that did not bring everything back), or None."""
        try:
            hold = json.loads(self.hold_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:  # unreadable: keep holding, say why
            return {"checkpoints": {}, "unreadable": str(err)}
        if not isinstance(hold, dict) or not isinstance(hold.get("checkpoints"), dict):
            return {"checkpoints": {}, "unreadable": "not a hold record"}
        return hold

    def hold_retention(
        self, checkpoint_id: int, failed: dict[str, Any], newer: int | None = None
    ) -> dict[str, Any]:
        """Keep every checkpoint (no retention) until ``release_retention``: checkpoint
        ``checkpoint_id`` holds what a restore could not bring back (``failed``), or, with
        ``newer``, the variables that checkpoint ``newer`` lacks (it shrank: see SHRINK)."""
        self.prepare()
        hold = self.retention_hold() or {"checkpoints": {}}
        hold.pop("unreadable", None)
        entry: dict[str, Any] = {"failed": failed, "since": time.time()}
        if newer is not None:
            entry.update(kind="shrunk", newer=newer)
        hold["checkpoints"][str(checkpoint_id)] = entry
        write_file_atomically(self.hold_path, json.dumps(hold).encode())
        return hold

    def release_retention(self, checkpoint_id: int | None = None) -> None:
        """End the hold for one checkpoint (restored in full since), or for all (None)."""
        hold = self.retention_hold()
        if hold is not None and checkpoint_id is not None:
            if "unreadable" in hold:
                return  # what it held is unknown: only the user's decision ends it
            hold["checkpoints"].pop(str(checkpoint_id), None)
            if hold["checkpoints"]:
                write_file_atomically(self.hold_path, json.dumps(hold).encode())
                return
        self.hold_path.unlink(missing_ok=True)

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
        if _read_torn_log(torn_log) is None:
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
            compaction = _COMPACT_TMP_RE.match(entry)
            if compaction and not _pid_alive(int(compaction.group(1))):
                (tmp / entry).unlink()  # an interrupted compaction: the old pack is still there
                continue
            match = _TMP_RE.match(entry)
            if not match:
                continue
            checkpoint_id, pid = int(match.group(1)), int(match.group(2))
            if _pid_alive(pid):
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
        return _read_torn_log(self.path / "torn.json") or []

    def torn_history(self) -> list[TornCheckpoint]:
        return [TornCheckpoint(**entry) for entry in self.torn_history_raw()]

    # -- writing --------------------------------------------------------------------------------
    def begin(
        self, checkpoint_id: int, known: dict[str, BufferLocation], *, direct: bool = False
    ) -> CheckpointWriter:
        from .writer import CheckpointWriter  # the saving side: a restore never loads it

        return CheckpointWriter(self, checkpoint_id, known, direct=direct)

    # -- reading --------------------------------------------------------------------------------
    def open_buffer(self, location: dict[str, Any]) -> memoryview:
        """A writable, copy-on-write memory map of one buffer: pages load when first touched."""
        mapped = self._map(location["file"])
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
            _check_owned(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd, direct

    def _map(self, name: str, *, read_ahead: bool = True) -> mmap.mmap | bytearray:
        mapped = self._maps.get(name)
        if mapped is not None:
            return mapped
        path = self.path / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StoreError(f"Data file {path} is missing: the checkpoint is damaged.") from None
        try:
            _check_owned(fd, path)
            size = os.fstat(fd).st_size
            # ACCESS_COPY: private pages, so a restored model can train in place while the
            # file (shared with other checkpoints) never changes.
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else bytearray()
        finally:
            os.close(fd)
        if read_ahead and isinstance(mapped, mmap.mmap):
            with contextlib.suppress(AttributeError, OSError):
                mapped.madvise(mmap.MADV_WILLNEED)
        self._maps[name] = mapped
        return mapped

    def start_prefetch(self, manifest: dict[str, Any], digests: list[str]) -> Prefetch | None:
        """Fault the mapped buffers ``digests`` of ``manifest`` in on worker threads, in that
        order (None when there is nothing to fetch, or no C library to ask: not Linux). The
        reader ``wait``s for a buffer before touching it; the caller ``join``s the prefetch
        before the maps may go (``cancel`` first drops what the workers have not started)."""
        if _LIBC is None:
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
        if _LIBC is None:
            return False
        try:
            mapped = self._map(name, read_ahead=False)
        except StoreError:
            return False
        if not isinstance(mapped, mmap.mmap):
            return True  # an empty file: nothing to read
        pages = -(-len(mapped) // mmap.PAGESIZE)
        residency = (ctypes.c_ubyte * pages)()
        if _LIBC_MINCORE is None or _LIBC_MINCORE(map_address(mapped), len(mapped), residency):
            return False
        # Bit 0 says resident; the others are reserved.
        return bytes(residency).translate(_RESIDENT_BIT).count(0) == 0

    def forget_map(self, name: str) -> None:
        """Drop our map of a file that will be read instead (nothing built on it yet)."""
        mapped = self._maps.pop(name, None)
        if isinstance(mapped, mmap.mmap):
            mapped.close()

    def release_maps(self) -> None:
        """Forget our references; live arrays keep their own maps alive as long as they need."""
        self._maps.clear()

    # -- process images (criu backend) ----------------------------------------------------------
    def image_path(self, checkpoint_id: int) -> Path:
        """The folder of the process image that belongs to checkpoint ``checkpoint_id``."""
        return self.path / "images" / f"{checkpoint_id:06d}"

    def new_image_folder(self, checkpoint_id: int) -> Path:
        """An empty owner-only folder for the image of checkpoint ``checkpoint_id`` (an older
        image of it, never restored, is replaced)."""
        self.prepare()
        _ensure_private_dir(self.path / "images")
        folder = self.image_path(checkpoint_id)
        shutil.rmtree(folder, ignore_errors=True)
        _ensure_private_dir(folder)
        return folder

    def image_ids(self) -> list[int]:
        try:
            entries = os.listdir(self.path / "images")
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(m.group(1)) for e in entries if (m := _IMAGE_RE.match(e)))

    def image_bytes(self, checkpoint_id: int) -> int:
        folder = self.image_path(checkpoint_id)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
        return 0

    def _collect_images(self, checkpoints: set[int]) -> int:
        """Delete the images whose checkpoint is gone; bytes freed."""
        freed = 0
        for checkpoint_id in self.image_ids():
            if checkpoint_id not in checkpoints:
                freed += self.image_bytes(checkpoint_id)
                _remove_image(self.image_path(checkpoint_id))
        return freed

    # -- retention and collection ---------------------------------------------------------------
    def delete(self, checkpoint_id: int) -> None:
        with self.locked():
            path = self.manifest_path(checkpoint_id)
            if not path.exists():
                self.read_manifest(checkpoint_id)  # raises CheckpointNotFound with the list
            path.unlink()
            _fsync_dir(self.manifests_dir)
            self._collect_locked()

    def apply_retention(
        self, keep_last: int, max_age_seconds: float = 0, max_bytes: int = 0
    ) -> list[int]:
        """Delete old checkpoints by policy (never the newest one) and collect unused data."""
        with self.locked():
            removed = self._retention_locked(keep_last, max_age_seconds, max_bytes)
            self._collect_locked()
        return removed

    def _retention_locked(
        self, keep_last: int, max_age_seconds: float, max_bytes: int
    ) -> list[int]:
        # Retention decides over the intact checkpoints only: one this version cannot read is
        # never deleted by it. While a hold is in place (a restore did not bring everything
        # back) nothing is deleted: older checkpoints may hold data the newer ones lack.
        if self.retention_hold() is not None:
            return []
        manifests, _unreadable = self.scan()
        ids = sorted(manifests)
        if not ids:
            return []
        newest = ids[-1]
        doomed: set[int] = set()
        if keep_last > 0:
            doomed.update(ids[:-keep_last])
        if max_age_seconds > 0:
            cutoff = time.time() - max_age_seconds
            doomed.update(i for i, m in manifests.items() if m["created"] < cutoff)
        if max_bytes > 0:
            # Walk newest to oldest, keeping checkpoints while the data they need fits.
            seen: set[tuple[str, int]] = set()
            total = 0
            for i in sorted(manifests, reverse=True):
                if i in doomed:
                    continue
                spans = {
                    (loc["file"], loc["offset"]): loc["nbytes"]
                    for loc in manifests[i]["buffers"].values()
                    if (loc["file"], loc["offset"]) not in seen
                }
                extra = sum(spans.values()) + self.image_bytes(i)
                if total + extra > max_bytes and i != newest:
                    doomed.add(i)
                    continue
                seen.update(spans)
                total += extra
        doomed.discard(newest)
        for i in sorted(doomed):
            self.manifest_path(i).unlink()
        if doomed:
            _fsync_dir(self.manifests_dir)
        return sorted(doomed)

    def _collect_locked(self) -> int:
        """Unlink data files no manifest references, compact mostly-dead packs; bytes freed.

        Nothing is collected while a manifest cannot be read (its files are unknown); data a
        manifest set aside as damaged still names (when it names any) stays with it.
        """
        manifests, unreadable = self.scan()
        if unreadable:
            return 0
        freed = self._collect_images(set(manifests))
        live: dict[str, int] = {}
        for manifest in manifests.values():
            for loc in manifest["buffers"].values():
                live[loc["file"]] = live.get(loc["file"], 0)  # referenced, even if empty
        untouched = self._files_of_damaged()  # neither deleted nor compacted
        spans = {
            (loc["file"], loc["offset"]): loc["nbytes"]
            for manifest in manifests.values()
            for loc in manifest["buffers"].values()
        }
        for (name, _offset), nbytes in spans.items():
            live[name] += nbytes
        for folder in ("blobs", "packs"):
            for dirpath, _dirs, files in os.walk(self.path / folder):
                for name in files:
                    full = Path(dirpath) / name
                    rel = full.relative_to(self.path).as_posix()
                    size = full.stat().st_size
                    if rel in untouched:
                        continue
                    if rel not in live:
                        freed += size
                        full.unlink()
                    elif folder == "packs" and size and live[rel] < COMPACT_BELOW * size:
                        freed += self._compact(rel, manifests) - live[rel]
        return freed

    def _files_of_damaged(self) -> set[str]:
        """Data files the manifests set aside as damaged still name, where they can be read."""
        files: set[str] = set()
        for checkpoint_id in _numbered(self.path / "damaged"):
            path = self.path / "damaged" / f"{checkpoint_id:06d}.json"
            with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                for loc in json.loads(path.read_bytes()).get("buffers").values():
                    with contextlib.suppress(AttributeError, TypeError):
                        files.add(str(loc.get("file")))
        return files

    def _compact(self, pack: str, manifests: dict[int, dict[str, Any]]) -> int:
        """Copy a pack's live buffers to a new pack, repoint the manifests, delete the old one.

        Crash-safe by order: until the last manifest is rewritten the old pack stays, so every
        manifest on disk points at a complete file. Returns the old pack's size.
        """
        spans = {
            (loc["offset"], loc["nbytes"])
            for manifest in manifests.values()
            for loc in manifest["buffers"].values()
            if loc["file"] == pack
        }
        from .writer import CheckpointWriter

        writer = CheckpointWriter(self, max(manifests), {}, prefix=f"compact-{os.getpid()}")
        source = self._map(pack)
        moved: dict[tuple[int, int], BufferLocation] = {}
        for offset, nbytes in sorted(spans):
            moved[(offset, nbytes)] = writer.append(memoryview(source)[offset : offset + nbytes])
        writer.finish_files()
        for checkpoint_id, manifest in manifests.items():
            changed = False
            for loc in manifest["buffers"].values():
                if loc["file"] == pack:
                    loc.update(moved[(loc["offset"], loc["nbytes"])].to_json())
                    changed = True
            if changed:
                write_file_atomically(
                    self.manifest_path(checkpoint_id),
                    json.dumps(manifest, separators=(",", ":")).encode(),
                )
        self._maps.pop(pack, None)
        size = (self.path / pack).stat().st_size
        (self.path / pack).unlink()
        return size

    def disk_usage(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.path):
            total += sum((Path(dirpath) / f).stat().st_size for f in files)
        return total


def manifest_bytes(manifest: dict[str, Any]) -> int:
    """The data a checkpoint needs, shared buffers included."""
    return sum(location["nbytes"] for location in manifest["buffers"].values())


def manifest_variables(manifest: dict[str, Any]) -> list[str]:
    """The variable names a checkpoint holds, aliases included."""
    names = [name for frame in manifest["frames"] for name in frame["names"]]
    return sorted(names + list(manifest.get("aliases", {})))


def shrinks(before: list[str], after: list[str]) -> list[str]:
    """The variables of ``before`` that ``after`` lacks, when it lacks most of them (SHRINK),
    else an empty list: a checkpoint like that was written by a kernel without the
    session's state (a reopened notebook), or after the notebook deleted most of it."""
    missing = sorted(set(before) - set(after))
    return missing if len(missing) > SHRINK * len(before) else []


def manifest_shrink(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """``{"id": older, "missing": [...]}`` when the checkpoint shrank from ``older``, else None
    (a malformed mark counts as none: it only informs, it never decides what loads)."""
    mark = manifest.get("shrunk_from")
    if (
        isinstance(mark, dict)
        and isinstance(mark.get("id"), int)
        and isinstance(mark.get("missing"), list)
        and all(isinstance(name, str) for name in mark["missing"])
    ):
        return {"id": mark["id"], "missing": mark["missing"]}
    return None


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


def _remove_image(folder: Path) -> None:
    """Delete a process image that will never be restored, its network lock lifted first
    (criu's nftables table holds the kernel's connections until then)."""
    from ..backends.criu_tool import unlock_network  # only images need it; stdlib only

    unlock_network(folder)
    shutil.rmtree(folder, ignore_errors=True)
