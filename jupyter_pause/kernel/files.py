"""Owner-only files and folders, and writes that survive a crash (fsync, atomic renames).

The store, the writer and the server's session records write through these: a file is
created owner-only whatever the umask, a folder someone else owns is refused, and a file
replaced atomically is either the old or the new one after a crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import sys
import threading
from pathlib import Path

from .layout import StoreOwnershipError


def ensure_private_dir(path: Path) -> None:
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


def check_owned(fd: int, path: Path) -> None:
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


def write_all(fd: int, data: memoryview) -> None:
    view = data
    while view.nbytes:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(path: Path) -> None:
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
        write_all(fd, memoryview(data))
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
            write_all(fd, memoryview(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
if LIBC is not None:
    LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def syncfs_of(path: Path) -> bool:
    """Flush the whole filesystem holding ``path`` and wait; False where syncfs is missing."""
    syncfs = getattr(LIBC, "syncfs", None)
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


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
