"""Handles that a restore can open again without harm: files on disk and sqlite3 databases.

A file handle belongs to its process, but what it points at usually outlives it: the restore
opens the same file again, at the same position, in a mode that never truncates (``w`` becomes
``r+``: the data written before the pause stays), provided the file still exists. A sqlite3
connection to a database file reconnects. What cannot be reopened this way (pipes, sockets,
in-memory databases, a connection in the middle of a transaction) keeps a specific reason.
"""

from __future__ import annotations

import contextvars
import io
import os
import stat
import sys
from typing import Any

#: Set while a frame is unpickled only to prove that it loads: reopen nothing then.
TRIAL = contextvars.ContextVar("jupyter_pause_trial_load", default=False)

_FILE_TYPES = (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.FileIO)


def _file_path(handle: Any) -> str | None:
    name = getattr(handle, "name", None)
    if not isinstance(name, str):
        return None
    path = os.path.abspath(name)
    try:
        return path if stat.S_ISREG(os.stat(path).st_mode) else None
    except OSError:
        return None


def _sqlite_path(connection: Any) -> str:
    """The main database file of a connection ('' for an in-memory database)."""
    for _seq, schema, path in connection.execute("PRAGMA database_list"):
        if schema == "main":
            return path or ""
    return ""


def is_handle(value: Any) -> bool:
    """A file, stream or database connection: what this module reopens or explains."""
    sqlite3 = sys.modules.get("sqlite3")
    return isinstance(value, io.IOBase) or (
        sqlite3 is not None and isinstance(value, sqlite3.Connection | sqlite3.Cursor)
    )


def not_reopenable(value: Any) -> str | None:
    """Why a file handle or database connection cannot come back, or None when it can."""
    if isinstance(value, _FILE_TYPES):
        if _file_path(value) is None:
            what = getattr(value, "name", None)
            label = f"open file {what!r}" if isinstance(what, str) else "open stream"
            return f"{label} is not a regular file on disk: open it again after restore"
        if isinstance(value, io.TextIOWrapper) and not value.closed:
            try:
                value.tell()
            except OSError:
                return (
                    f"open file {value.name!r} is being iterated (its position is unknown): "
                    "open it again after restore"
                )
        return None
    if isinstance(value, io.IOBase):
        what = getattr(value, "name", None)
        label = f"open file {what!r}" if isinstance(what, str) else "open file or stream"
        return f"{label}: a stream of this kind belongs to its process; open it again after restore"
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(value, sqlite3.Cursor):
        return "database cursor: run its query again after restore"
    if sqlite3 is not None and isinstance(value, sqlite3.Connection):
        try:
            path = _sqlite_path(value)
        except sqlite3.ProgrammingError as err:  # closed, or made in another thread
            return f"database connection: {err}; reconnect after restore"
        if not path:
            return (
                "in-memory database: its content lives in this process; copy it to a file "
                "(conn.backup) to keep it"
            )
        if value.in_transaction:
            return (
                f"database connection to {path!r} has an uncommitted transaction: commit it, "
                "then checkpoint again"
            )
        return None
    return None


def reduce_handle(value: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """A pickle reduction that reopens a file or reconnects a database, or None."""
    if isinstance(value, _FILE_TYPES) and not_reopenable(value) is None:
        return _reduce_file(value)
    sqlite3 = sys.modules.get("sqlite3")
    if (
        sqlite3 is not None
        and isinstance(value, sqlite3.Connection)
        and not_reopenable(value) is None
    ):
        return _reconnect_sqlite, (_sqlite_path(value), value.isolation_level)
    return None


def _reduce_file(handle: Any) -> tuple[Any, tuple[Any, ...]]:
    path = _file_path(handle)
    mode = handle.mode if isinstance(handle.mode, str) else "r"
    if isinstance(handle, io.FileIO):
        mode = mode if "b" in mode else mode + "b"
    closed = handle.closed
    position = 0
    if not closed:
        if handle.writable():
            handle.flush()  # what the notebook wrote is on disk, where the reopened file reads
        position = handle.tell()
    text = isinstance(handle, io.TextIOWrapper)
    options = {"encoding": handle.encoding, "errors": handle.errors} if text else {}
    buffered = not isinstance(handle, io.FileIO)
    return _reopen_file, (path, _never_truncating(mode), position, closed, buffered, options)


def _never_truncating(mode: str) -> str:
    """``w``/``x`` opened (and truncated or created) the file once; reopening must not."""
    if "w" in mode or "x" in mode:
        return "r+" + ("b" if "b" in mode else "")
    return mode


def _reopen_file(
    path: str, mode: str, position: int, closed: bool, buffered: bool, options: dict[str, Any]
) -> Any:
    if not os.path.exists(path):
        raise FileNotFoundError(f"the file {path!r} it had open no longer exists")
    if TRIAL.get():
        return None
    handle = open(path, mode, buffering=-1 if buffered else 0, **options)  # noqa: SIM115
    if closed:
        handle.close()
    elif "a" not in mode:
        handle.seek(position)
    return handle


def _reconnect_sqlite(path: str, isolation_level: str | None) -> Any:
    import sqlite3

    if not os.path.exists(path):
        raise FileNotFoundError(f"the database file {path!r} no longer exists")
    if TRIAL.get():
        return None
    return sqlite3.connect(path, isolation_level=isolation_level)
