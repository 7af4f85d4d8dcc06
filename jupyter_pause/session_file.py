"""A session file: one notebook and its latest good checkpoint, to carry to another server.

An uncompressed tar stream (``*.jpsession``), written and read member by member, so memory
stays flat however large the checkpoint:

    session.json                  first: the format, where and when it was made, the
                                  environment its objects came from, every member's size and
                                  SHA-256
    notebook.ipynb                the notebook, as it was on disk
    checkpoint/manifests/N.json   the checkpoint's manifest, as stored
    checkpoint/packs/..., checkpoint/blobs/...
                                  the data files the manifest names, as stored

Reading checks, before anything is placed: the index comes first and is of a format this
version reads; every member is a plain file the index lists, under a name of the layout (no
absolute path, no ``..``, no link); its size and SHA-256 are the index's; none is missing.
Members stream into a staging folder beside the store (removed on any refusal); only a fully
checked session is moved into place, and it stays untrusted (nothing in it is unpickled)
until its user says to trust it (``imported.json`` in the store folder).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from .kernel import store as store_mod
from .kernel.files import ensure_private_dir, write_file_atomically
from .kernel.imported import IMPORTED
from .kernel.layout import DATA_FILE_RE

#: The version of this layout; a file of a newer one is refused, naming both.
FORMAT = 1
SUFFIX = ".jpsession"
INDEX = "session.json"
NOTEBOOK = "notebook.ipynb"
CHECKPOINT = "checkpoint/"
#: Largest index accepted (it lists members and packages, never data).
INDEX_LIMIT = 16 * 2**20
CHUNK = 2**20
_MANIFEST_RE = re.compile(r"^manifests/\d{6,}\.json$")

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class SessionFileError(Exception):
    """A session file refused, or one that cannot be made; the message says which and why."""


@dataclass
class Index:
    """What ``session.json`` says."""

    format: int
    notebook: str  # its path on the server that made it (relative to that server's root)
    checkpoint_id: int
    made_by: str
    made_on: str  # the host
    made_at: float
    environment: dict[str, Any]
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> size, sha256

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "notebook": self.notebook,
            "checkpoint_id": self.checkpoint_id,
            "made_by": self.made_by,
            "made_on": self.made_on,
            "made_at": self.made_at,
            "environment": self.environment,
            "members": self.members,
        }

    @classmethod
    def from_json(cls, data: Any) -> Index:
        if not isinstance(data, dict) or not isinstance(data.get("format"), int):
            raise SessionFileError(f"{INDEX} is not a session file's index (no format)")
        if data["format"] > FORMAT:
            raise SessionFileError(
                f"made by a newer jupyter_pause (session file format {data['format']}); this one "
                f"reads format {FORMAT} and older: upgrade jupyter_pause here to import it"
            )
        try:
            members = {
                str(name): {"size": int(info["size"]), "sha256": str(info["sha256"])}
                for name, info in data["members"].items()
            }
            return cls(
                format=data["format"],
                notebook=str(data["notebook"]),
                checkpoint_id=int(data["checkpoint_id"]),
                made_by=str(data["made_by"]),
                made_on=str(data["made_on"]),
                made_at=float(data["made_at"]),
                environment=dict(data.get("environment") or {}),
                members=members,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise SessionFileError(f"{INDEX} lacks what an import needs ({err!r})") from err


def _sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def checkpoint_members(store: store_mod.NotebookStore, checkpoint_id: int) -> dict[str, Path]:
    """Member name -> file of the store, for one checkpoint: its manifest and the data files
    it names."""
    manifest = store.read_manifest(checkpoint_id)
    members = {
        f"{CHECKPOINT}manifests/{checkpoint_id:06d}.json": store.manifest_path(checkpoint_id)
    }
    for location in (manifest.get("buffers") or {}).values():
        name = location["file"]
        if not DATA_FILE_RE.match(name):
            raise SessionFileError(f"checkpoint {checkpoint_id} names a file outside its folder")
        members[f"{CHECKPOINT}{name}"] = store.path / name
    return members


def hash_members(index: Index, notebook: bytes, files: dict[str, Path]) -> None:
    """The first pass: every member's size and SHA-256 into ``index`` (nothing kept)."""
    index.members = {
        NOTEBOOK: {"size": len(notebook), "sha256": hashlib.sha256(notebook).hexdigest()}
    }
    for name, path in files.items():
        size, digest = _sha256(path)
        index.members[name] = {"size": size, "sha256": digest}


def _infos(index: Index) -> Iterator[tuple[tarfile.TarInfo, bytes | None]]:
    """Each member's header, in order, with the bytes of the ones made here (the index)."""
    raw = json.dumps(index.to_json(), indent=1).encode()
    for name, size in [(INDEX, len(raw))] + [(n, m["size"]) for n, m in index.members.items()]:
        info = tarfile.TarInfo(name)
        # a whole second: a fraction would add a pax header of its own
        info.size, info.mtime, info.mode = size, int(index.made_at), 0o600
        yield info, raw if name == INDEX else None


def tar_size(index: Index) -> int:
    """The exact length of the stream ``write_tar`` writes for ``index`` (Content-Length)."""
    size = 0
    for info, _raw in _infos(index):
        size += len(info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))
        size += -(-info.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    size += 2 * tarfile.BLOCKSIZE  # the end-of-archive blocks
    return -(-size // tarfile.RECORDSIZE) * tarfile.RECORDSIZE  # padded to a whole record


def write_tar(
    out: IO[bytes],
    index: Index,
    notebook: bytes,
    files: dict[str, Path],
    progress: Progress | None = None,
) -> None:
    """The second pass: the index, then the members, streamed into ``out`` (of a hashed
    ``index``); ``progress(done, total)`` in bytes of the members."""
    total, done = sum(m["size"] for m in index.members.values()), 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)

    # Stream mode writes in chunks of bufsize: a few large writes, not one per 10 KiB record.
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:
        for info, raw in _infos(index):
            if raw is not None:
                tar.addfile(info, io.BytesIO(raw))
            elif info.name == NOTEBOOK:
                tar.addfile(info, _Counting(io.BytesIO(notebook), step))
            else:
                with open(files[info.name], "rb") as source:
                    tar.addfile(info, _Counting(source, step))


def write(out: IO[bytes], index: Index, notebook: bytes, files: dict[str, Path]) -> None:
    """The whole session file into ``out``: both passes."""
    hash_members(index, notebook, files)
    write_tar(out, index, notebook, files)


class _Counting:
    """A file whose reads count towards the progress."""

    def __init__(self, source: IO[bytes], step: Callable[[int], None]) -> None:
        self.source, self.step = source, step

    def read(self, size: int = -1) -> bytes:
        chunk = self.source.read(size)
        self.step(len(chunk))
        return chunk


def _safe_name(name: str) -> str:
    """A member name of the layout, or SessionFileError naming it."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or "\x00" in name:
        raise SessionFileError(f"member {name!r} points outside the session (refused)")
    if name in (INDEX, NOTEBOOK):
        return name
    inner = name.removeprefix(CHECKPOINT)
    if name.startswith(CHECKPOINT) and (_MANIFEST_RE.match(inner) or DATA_FILE_RE.match(inner)):
        return name
    raise SessionFileError(f"member {name!r} is not part of a session file (refused)")


@dataclass
class Staged:
    """A session file read and checked into ``folder`` (``remove`` when done with it)."""

    index: Index
    folder: Path

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def read(source: IO[bytes], staging: Path, progress: Progress | None = None) -> Staged:
    """Read a session file into ``staging`` (a new folder), checking every member; on any
    refusal the folder is removed and SessionFileError says which member and why."""
    ensure_private_dir(staging.parent)
    staging.mkdir(mode=0o700)
    try:
        return Staged(_read(source, staging, progress), staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _read(source: IO[bytes], staging: Path, progress: Progress | None) -> Index:
    index: Index | None = None
    seen: set[str] = set()
    done = 0
    try:
        with tarfile.open(fileobj=source, mode="r|", bufsize=CHUNK) as tar:
            for member in tar:
                name = _safe_name(member.name)
                if not member.isreg():
                    kind = "a link" if member.issym() or member.islnk() else "not a plain file"
                    raise SessionFileError(f"member {name!r} is {kind} (refused)")
                if index is None:
                    if name != INDEX:
                        raise SessionFileError(f"the session file does not start with {INDEX}")
                    if member.size > INDEX_LIMIT:
                        raise SessionFileError(f"{INDEX} is larger than an index can be")
                    raw = _read_all(tar, member)
                    try:
                        index = Index.from_json(json.loads(raw))
                    except ValueError as err:
                        raise SessionFileError(f"{INDEX} is not JSON ({err})") from err
                    total = sum(m["size"] for m in index.members.values())
                    continue
                expected = index.members.get(name)
                if expected is None or name in seen:
                    raise SessionFileError(f"member {name!r} is not in the index (refused)")
                seen.add(name)
                done = _stage(tar, member, staging / name, expected, done, total, progress)
    except (tarfile.TarError, EOFError) as err:  # OSError (the disk here) is not the file's
        raise SessionFileError(
            f"the session file is truncated or not a tar stream ({err})"
        ) from err
    if index is None:
        raise SessionFileError("the session file is empty")
    missing = sorted(set(index.members) - seen)
    if missing:
        raise SessionFileError(f"the session file is truncated: {missing[0]!r} is missing")
    return index


def _read_all(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    assert handle is not None
    return handle.read()


def _stage(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    target: Path,
    expected: dict[str, Any],
    done: int,
    total: int,
    progress: Progress | None,
) -> int:
    if member.size != expected["size"]:
        raise SessionFileError(
            f"member {member.name!r} has {member.size} bytes, the index says {expected['size']}"
        )
    handle = tar.extractfile(member)
    assert handle is not None
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    digest = hashlib.sha256()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != expected["sha256"]:
        raise SessionFileError(
            f"member {member.name!r} does not match its checksum: the file was altered or damaged"
        )
    return done


def place(staged: Staged, store_root: Path, key: str) -> store_mod.NotebookStore:
    """Move a checked session's checkpoint into the store folder of notebook ``key`` (which
    must hold no checkpoint yet), the manifest last; record it as imported, untrusted."""
    store = store_mod.NotebookStore(store_root, key)
    if store.exists() and store.checkpoint_ids():
        raise SessionFileError(
            f"{key} has checkpoints here already; import the session under another name"
        )
    store.prepare()
    folder = staged.folder / CHECKPOINT.rstrip("/")
    manifests = sorted((folder / "manifests").glob("*.json"))
    with store.locked():
        for path in _files(folder):
            if path.parent.name == "manifests":
                continue
            target = store.path / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.replace(path, target)
        record = {
            "index": staged.index.to_json() | {"members": len(staged.index.members)},
            "imported_at": time.time(),
            "trusted": False,
        }
        write_file_atomically(store.path / IMPORTED, json.dumps(record).encode())
        for manifest in manifests:  # last: a manifest that exists is a complete checkpoint
            os.replace(manifest, store.manifests_dir / manifest.name)
    return store


def _files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            yield path
