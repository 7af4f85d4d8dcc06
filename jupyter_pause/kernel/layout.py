"""The checkpoint store's vocabulary: where things go, what they are called, what can go wrong.

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

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST_FORMAT = 1
# A pack whose live bytes fall below this share is compacted: its live buffers are copied to
# a new pack and the old one deleted, so dead data does not linger behind a little live data.
COMPACT_BELOW = 0.5
# A checkpoint that lacks more than this share of the variables of the one before it is marked
# as shrunk, and the one before is kept (retention held) until the user accepts: a kernel
# without the session's state must never push the last complete checkpoint out.
SHRINK = 0.5
MANIFEST_RE = re.compile(r"^(\d{6,})\.json$")
IMAGE_RE = re.compile(r"^(\d{6,})$")
TMP_RE = re.compile(r"^(\d{6,})-(\d+)\.")
COMPACT_TMP_RE = re.compile(r"^compact-(\d+)\.")
# A data file a manifest may name: inside blobs/ or packs/, never a way out of the folder.
DATA_FILE_RE = re.compile(r"^(blobs/[0-9a-f]{2}/[0-9a-f]+|packs/[A-Za-z0-9._-]+\.pack)$")


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


def numbered(folder: Path) -> list[int]:
    """Ids of the ``000007.json`` files in a folder, sorted (none when it is missing)."""
    try:
        entries = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for e in entries if (m := MANIFEST_RE.match(e)))


def read_torn_log(path: Path) -> list[dict[str, Any]] | None:
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
