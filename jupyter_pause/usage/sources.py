"""The notebooks a usage report covers: from a checkpoint store on disk, or from a server.

Both give the same listing (``GET /jupyter-pause/usage``'s answer): per notebook its timeline,
kernelspec, owner, and the storage its checkpoints hold. Reading a store is blocking file work:
the server runs it on a worker thread.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import time
from pathlib import Path
from typing import Any

from ..kernel import store as store_mod
from ..records import SessionRecord, read_folder


def owner(folder: Path) -> str:
    """Who owns a notebook's folder of the store (who wrote its checkpoints); without a
    folder yet, who runs this process (the server's user: its kernels are theirs)."""
    try:
        uid = folder.stat().st_uid
    except OSError:
        uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def record_entry(record: SessionRecord, last_activity: float | None) -> dict[str, Any]:
    """What a notebook's record tells the listing (cheap: taken on the server's event loop,
    so the timeline is not read while the loop adds to it)."""
    return {
        "path": record.path,
        "user": "?",
        "kernel_name": record.kernel_name,
        "gpus_needed": record.gpus_needed,
        "state": record.state,
        "last_activity": last_activity,
        "events": record.timeline.to_json(),
        "storage_bytes": 0,
        "checkpoints": 0,
        "snapshots": 1 if (record.checkpoint or {}).get("snapshot") else 0,
    }


def add_storage(entry: dict[str, Any], store: store_mod.NotebookStore) -> dict[str, Any]:
    """The entry with its owner and the storage its checkpoints hold (blocking)."""
    entry["user"] = owner(store.path)
    try:
        intact, _bad = store.scan() if store.exists() else ({}, {})
        entry["storage_bytes"] = store.disk_usage() if store.path.is_dir() else 0
        entry["checkpoints"] = len(intact)
    except (OSError, store_mod.StoreError):
        pass  # an unreadable folder holds what `jupyter pause status` names; counted as 0 here
    return entry


def store_space(store_root: Path) -> dict[str, int] | None:
    """Free and total bytes of the store's file system (None: it cannot be read)."""
    try:
        usage = shutil.disk_usage(store_root if store_root.exists() else store_root.parent)
    except OSError:
        return None
    return {"free_bytes": usage.free, "total_bytes": usage.total}


def listing(
    store_root: Path,
    entries: list[dict[str, Any]],
    prices: dict[str, float],
    now: float | None = None,
) -> dict[str, Any]:
    return {
        "now": time.time() if now is None else now,
        "prices": prices,
        "store": store_space(store_root),
        "notebooks": entries,
    }


def read_store(store_root: Path) -> list[dict[str, Any]]:
    """Every notebook of a store with a readable ``session.json`` (blocking), named by its
    path on the server that recorded it. Folders that cannot be read are passed over."""
    try:
        folders = sorted(store_root.iterdir()) if store_root.is_dir() else []
    except OSError:
        return []
    entries = []
    for folder in folders:
        if not folder.is_dir() or folder.is_symlink():
            continue
        record, _key, _problem = read_folder(folder)
        if record is None:
            continue
        store = store_mod.NotebookStore(store_root, record.key)
        last = _persisted_last_activity(folder) if record.state in ("active", "ready") else None
        entries.append(add_storage(record_entry(record, last), store))
    return entries


def _persisted_last_activity(folder: Path) -> float | None:
    """The last activity ``session.json`` recorded for a running kernel (None if unknown)."""
    try:
        value = json.loads((folder / "session.json").read_bytes()).get("last_activity")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


async def server_listing(orchestrator: Any, prices: dict[str, float]) -> dict[str, Any]:
    """The listing of the notebooks a server knows; the store is read on a worker thread."""
    import asyncio

    pairs = []
    for record in orchestrator.list():
        running = record.kernel_id is not None
        last = (record.activity.last_activity or None) if running else None
        pairs.append((record_entry(record, last), orchestrator.store_for(record)))

    def read() -> dict[str, Any]:
        entries = [add_storage(entry, store) for entry, store in pairs]
        return listing(orchestrator.store_root, entries, prices)

    return await asyncio.to_thread(read)
