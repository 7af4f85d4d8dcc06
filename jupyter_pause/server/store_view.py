"""What the server reads from the checkpoint store: blocking file work for worker threads.

The orchestrator never calls these on the event loop (``asyncio.to_thread``): a store on a
busy disk, or a kernel holding a notebook's lock while it writes a checkpoint, must not stall
the server. Each function reads one notebook folder, or walks them all, and turns damaged
content into named problems instead of exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kernel import store as store_mod
from ..policy import Policy


@dataclass
class StoreView:
    """What the server reads of one notebook's store (on a worker thread)."""

    # Every intact checkpoint, by id: id, created, bytes, token, variables (checkpoint_summary)
    checkpoints: dict[int, dict[str, Any]]
    hold: dict[str, Any] | None  # the retention hold (store.retention_hold), if any
    problems: list[str]  # damaged or unreadable files, named

    @property
    def latest(self) -> dict[str, Any] | None:
        """The newest intact checkpoint's summary, or None."""
        return self.checkpoints[max(self.checkpoints)] if self.checkpoints else None


def checkpoint_summary(checkpoint_id: int, manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API shows of a checkpoint (``Session.checkpoint``), from its manifest."""
    summary = {
        "id": checkpoint_id,
        "created": manifest["created"],
        "bytes": store_mod.manifest_bytes(manifest),
        "process_token": manifest["process_token"],
        "variables": store_mod.manifest_variables(manifest),
    }
    shrunk = store_mod.manifest_shrink(manifest)
    if shrunk is not None:
        summary["shrunk_from"] = shrunk
    return summary


def inspect_store(
    store: store_mod.NotebookStore, known: tuple[Any, StoreView] | None = None
) -> tuple[Any, StoreView]:
    """Read a notebook's store: blocking, so the orchestrator runs it off the event loop.

    ``known`` is the (stamp, view) of an earlier call: while nothing changed since, it is the
    answer, and no manifest is read again (sessions are polled every few seconds).
    """
    stamp = store.change_stamp()
    if known is not None and known[0] == stamp:
        return known
    intact, bad = store.scan()
    summaries = {i: checkpoint_summary(i, manifest) for i, manifest in intact.items()}
    return stamp, StoreView(summaries, store.retention_hold(), store.problems(bad))


def list_checkpoints(store: store_mod.NotebookStore) -> dict[str, Any]:
    """Every checkpoint of a store, newest last (blocking: run off the event loop)."""
    intact, bad = store.scan()
    checkpoints: list[dict[str, Any]] = []
    for checkpoint_id in sorted({*intact, *bad}):
        if checkpoint_id in bad:
            checkpoints.append({"id": checkpoint_id, "damaged": str(bad[checkpoint_id])})
            continue
        manifest = intact[checkpoint_id]
        checkpoints.append(
            {
                "id": checkpoint_id,
                "created": manifest["created"],
                "reason": manifest.get("reason")
                if isinstance(manifest.get("reason"), str)
                else None,
                "bytes": store_mod.manifest_bytes(manifest),
                "variables": store_mod.manifest_variables(manifest),
                "skipped": manifest["skipped"],
                **(
                    {"shrunk_from": store_mod.manifest_shrink(manifest)}
                    if store_mod.manifest_shrink(manifest)
                    else {}
                ),
            }
        )
    for checkpoint_id, why in store.damaged().items():
        checkpoints.append({"id": checkpoint_id, "damaged": f"moved aside: {why}"})
    checkpoints.sort(key=lambda c: c["id"])
    torn = [vars(t) for t in store.torn_history()]
    return {"checkpoints": checkpoints, "interrupted": torn, "hold": store.retention_hold()}


def collect_all(
    store_root: Path, policy: Policy, path_of: Callable[[str], str | None]
) -> dict[str, Any]:
    """Apply the retention policy to every notebook folder of the store (blocking).

    A folder that cannot be read is named in ``problems`` and the next one is collected; a
    notebook whose retention is held (an incomplete restore) is listed in ``held``, untouched.
    ``removed`` is keyed by ``path_of(key)``: the notebook's server path.
    """
    removed: dict[str, list[int]] = {}
    held: list[str] = []
    problems: list[dict[str, str]] = []
    freed = 0
    try:
        folders = sorted(store_root.iterdir()) if store_root.is_dir() else []
    except OSError as err:
        return {
            "removed": {},
            "bytes_freed": 0,
            "held": [],
            "problems": [{"folder": ".", "problem": f"the store cannot be read ({err})"}],
        }
    for folder in folders:
        try:
            store = folder_store(store_root, folder)
            if store is None:
                continue
            name = path_of(store.key) or folder.name
            if store.retention_hold() is not None:
                held.append(name)
                continue
            before = store.disk_usage()
            gone = store.apply_retention(
                policy.keep_last, policy.max_age_hours * 3600, policy.max_bytes
            )
            freed += before - store.disk_usage()
            if gone:
                removed[name] = gone
        except (OSError, ValueError, store_mod.StoreError) as err:
            problems.append({"folder": folder.name, "problem": str(err)})
    return {"removed": removed, "bytes_freed": freed, "held": held, "problems": problems}


def folder_store(store_root: Path, folder: Path) -> store_mod.NotebookStore | None:
    """The store of one folder (None: not a notebook's folder); ValueError when damaged."""
    if folder.is_symlink():
        raise ValueError("a symbolic link: not followed (the store holds no links)")
    key = store_mod.folder_notebook_key(folder) if folder.is_dir() else None
    if key is None:
        return None
    store = store_mod.NotebookStore(store_root, key)
    if store.path != folder:
        raise ValueError(f"notebook.json names a notebook of another folder ({store.path.name})")
    return store
