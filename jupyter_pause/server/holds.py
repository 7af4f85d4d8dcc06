"""The retention hold after an incomplete restore: what is kept, and how to get it back.

While a notebook's hold is set (``hold.json`` beside its checkpoints, honoured by kernels
too), no checkpoint of it is deleted, whatever ``keep_last``, age or size say: a restore
that did not bring everything back must never lose what it missed. These helpers set and
end a hold off the event loop, and say in words what is held and what to do about it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..formatting import format_reasons
from ..kernel import store as store_mod
from ..records import SessionRecord


async def hold(
    store: store_mod.NotebookStore,
    record: SessionRecord,
    checkpoint_id: int,
    missing: dict[str, str],
) -> None:
    """Keep every checkpoint of the notebook: ``checkpoint_id`` holds what is ``missing``."""
    try:
        record.hold = await asyncio.to_thread(store.hold_retention, checkpoint_id, missing)
    except (OSError, store_mod.StoreError) as err:
        record.warnings.append(
            f"retention could not be held ({err}): older checkpoints may be deleted"
        )


async def release(
    store: store_mod.NotebookStore, record: SessionRecord, checkpoint_id: int | None = None
) -> None:
    """End the hold of one checkpoint (all of them: None); the record shows what is left."""
    await asyncio.to_thread(store.release_retention, checkpoint_id)
    record.hold = await asyncio.to_thread(store.retention_hold)


def _held(record: SessionRecord) -> list[tuple[str, dict[str, Any]]]:
    return sorted((record.hold or {}).get("checkpoints", {}).items(), key=lambda i: int(i[0]))


def _shrunk(entry: dict[str, Any]) -> bool:
    return entry.get("kind") == "shrunk"


def holds_missing_data(record: SessionRecord) -> bool:
    """Whether a restore left data out (the session is then partial): a hold only because a
    newer checkpoint shrank does not make a session that restored everything partial."""
    hold = record.hold or {}
    return "unreadable" in hold or any(not _shrunk(e) for _cid, e in _held(record))


def _names(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def what(record: SessionRecord) -> str:
    """``not restored, and kept: checkpoint 3: model (why)``, or for a shrink ``kept:
    checkpoint 7, whose model, optimizer checkpoint 8 lacks``."""
    parts = [
        f"checkpoint {cid}, whose {_names(list(e.get('failed') or {}))} checkpoint "
        f"{e.get('newer')} lacks"
        if _shrunk(e)
        else f"checkpoint {cid}: {format_reasons(e.get('failed') or {})}"
        for cid, e in _held(record)
    ]
    lead = "not restored, and kept: " if holds_missing_data(record) else "kept: "
    return lead + ("; ".join(parts) or "see the retention hold")


def advice(record: SessionRecord) -> str:
    """How to bring the held data back, and how to end the hold."""
    steps = []
    for cid, entry in _held(record):
        failed = entry.get("failed") or {}
        names = [n for n in failed if n.isidentifier()]
        # A session item (an import, the working directory) only comes back with a whole
        # restore; variables alone can be restored by name, leaving the others as they are.
        if len(names) < len(failed) or _shrunk(entry):
            names = []  # a shrink: the whole older checkpoint is the session to go back to
        steps.append("`" + " ".join(["%checkpoint restore", cid, *names]) + "`")
    by_itself = (
        " (a checkpoint that holds it again ends the hold by itself)"
        if any(_shrunk(e) for _cid, e in _held(record))
        else ""
    )
    return (
        "No checkpoint of this notebook is deleted until you decide. Fix the cause, then "
        f"bring the data back in the notebook with {' and '.join(steps) or '%checkpoint restore'}"
        f"; once it is back{by_itself}, or to carry on without it, run `jupyter pause accept "
        f"{record.path}` (or Accept in JupyterLab)."
    )
