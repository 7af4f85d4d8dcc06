"""An imported session's record in its store folder (``imported.json``): where it came from,
and whether its user trusts it. Restoring unpickles, and unpickling runs code: a session made
elsewhere is restored only once trusted (the server checks before a resume, the kernel again
before it reads a frame)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from .files import write_file_atomically
from .layout import StoreError

if TYPE_CHECKING:
    from .store import NotebookStore

IMPORTED = "imported.json"


def imported(store: NotebookStore) -> dict[str, Any] | None:
    """The import record of a store folder; None for a session made here."""
    try:
        return json.loads((store.path / IMPORTED).read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise StoreError(
            f"{store.path / IMPORTED} cannot be read ({err}); import it again"
        ) from err


def require_trusted(store: NotebookStore) -> None:
    """StoreError unless the folder's session was made here or its user trusted it."""
    record = imported(store)
    if record is None or record.get("trusted") is True:
        return
    index = record.get("index") or {}
    raise StoreError(
        f"This session was imported from {index.get('made_by', '?')} on "
        f"{index.get('made_on', '?')} ({time.strftime('%Y-%m-%d %H:%M', time.localtime(float(index.get('made_at') or 0)))}). "
        "Restoring it runs code from it: trust it first (`jupyter pause trust NOTEBOOK`, or "
        "Trust in the notebook's menu)."
    )


def trust(store: NotebookStore) -> dict[str, Any]:
    record = imported(store)
    if record is None:
        raise StoreError("this session was not imported: there is nothing to trust")
    record["trusted"] = True
    record["trusted_at"] = time.time()
    write_file_atomically(store.path / IMPORTED, json.dumps(record).encode())
    return record
