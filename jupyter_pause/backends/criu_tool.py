"""The ``criu`` command line: dump a kernel's process tree to a folder, restore it from there.

Blocking calls (the backend runs them on worker threads). Choices, each measured on this
project's machines (see the README's criu section):

* **TCP with ``--tcp-established``** and ``--network-lock nftables``: the connections the
  server (and every open notebook, through it) holds to the kernel survive the pause. The
  kernel's end is dumped in TCP repair mode and the network lock drops every packet of those
  connections while the process is away, so the server's end never sees a reset; the restore
  puts the kernel's end back and lifts the lock. Output of a cell paused mid-run reaches the
  notebook through the very connection it was going to. The IPC transport cannot do this:
  criu refuses to dump one half of a Unix stream connection ("Can't dump half of stream unix
  connection"), and the server's half is outside the dump.
* **``--restore-detached --restore-sibling``**: the restored kernel becomes a child of the
  process that ran criu, the server, which can then wait for it like for a kernel it started.
* **The server's stdin/stdout/stderr** that the kernel inherited (a terminal, a pipe,
  journald's socket) are outside the dump: they are named ``--external`` where criu needs it
  and handed back with ``--inherit-fd`` at the restore, the server's streams of that moment
  (after a server restart, the new server's). A log file is reopened at its path, in append
  mode (``append_to_logs``).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DUMP_LOG = "dump.log"
RESTORE_LOG = "restore.log"
#: Deleted files a kernel still holds (a ``tempfile.TemporaryFile``) go into the image up to
#: this size each; criu's default (1 MiB) would refuse to pause a kernel holding a larger one.
GHOST_LIMIT = "256M"
#: Log lines criu writes as errors that change nothing (an unprivileged RLIMIT_NOFILE raise).
_HARMLESS = ("RLIMIT_NOFILE",)
_RUN_ID_FIELD = 13  # inventory_entry.dump_criu_run_id in criu's images/inventory.proto


class CriuError(Exception):
    """criu could not do it; the message says why, from criu's own log."""


@dataclass(frozen=True)
class OutsideFile:
    """A file the kernel inherited from the server (its stdin, stdout or stderr).

    ``resource`` is criu's name for it; ``external`` what ``criu dump --external`` must be
    told (None for a pipe, which criu dumps as such and lets be replaced at the restore).
    """

    stream: int  # the server's descriptor it came from: 0, 1 or 2
    resource: str
    external: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OutsideFile:
        return cls(int(data["stream"]), str(data["resource"]), data.get("external"))


def outside_files(pid: int) -> list[OutsideFile]:
    """The kernel's descriptors that are the server's own stdin/stdout/stderr, by identity."""
    ours: dict[tuple[int, int], int] = {}
    for stream in (0, 2, 1):  # where two are the same file (a terminal), stdout wins
        try:
            st = os.fstat(stream)
        except OSError:
            continue
        ours[(st.st_dev, st.st_ino)] = stream
    found: dict[str, OutsideFile] = {}
    fd_dir = Path(f"/proc/{pid}/fd")
    for entry in os.listdir(fd_dir):
        try:
            st = os.stat(fd_dir / entry)
        except OSError:
            continue  # closed meanwhile
        stream = ours.get((st.st_dev, st.st_ino))
        if stream is None:
            continue
        outside = _describe(st, stream)
        if outside is not None:
            found.setdefault(outside.resource, outside)
    return sorted(found.values(), key=lambda o: o.stream)


def _describe(st: os.stat_result, stream: int) -> OutsideFile | None:
    if stat.S_ISFIFO(st.st_mode):
        return OutsideFile(stream, f"pipe:[{st.st_ino}]", None)
    if stat.S_ISSOCK(st.st_mode):
        return OutsideFile(stream, f"socket:[{st.st_ino}]", f"unix[{st.st_ino}]")
    if stat.S_ISCHR(st.st_mode):
        if not os.isatty(stream):
            return None  # /dev/null and the like: criu reopens them by path
        name = f"tty[{st.st_rdev:x}:{st.st_dev:x}]"
        return OutsideFile(stream, name, name)
    # A log file is reopened by criu at its path (see ``append_to_logs``); a deleted file
    # goes into the image (up to GHOST_LIMIT).
    return None


def append_to_logs() -> list[int]:
    """Make the server's stdout/stderr append-only where they are files it writes to (its log,
    which its kernels inherited: the same open file, so theirs too); the streams changed.

    criu checks at the restore that a regular file has the size it had at the dump, and a log
    grows while the kernel is away; it skips that check for write-only files in append mode,
    as logs should be opened anyway (several processes write them).
    """
    changed = []
    for stream in (1, 2):
        try:
            if not stat.S_ISREG(os.fstat(stream).st_mode):
                continue
            flags = fcntl.fcntl(stream, fcntl.F_GETFL)
            if flags & os.O_ACCMODE == os.O_WRONLY and not flags & os.O_APPEND:
                fcntl.fcntl(stream, fcntl.F_SETFL, flags | os.O_APPEND)
                changed.append(stream)
        except OSError:
            continue
    return changed


class Criu:
    """One criu binary, and the options this project runs it with."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def check(self) -> str | None:
        """None when ``criu check`` passes here; else why criu cannot be used, in words."""
        path = shutil.which(self.binary)
        if path is None:
            return (
                f"no criu binary at {self.binary!r} (set c.PauseApp.criu_binary; CRIU >= 4.1 is "
                "needed on Linux >= 6.13, see the README)"
            )
        try:
            done = subprocess.run(
                [path, "check"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.SubprocessError) as err:
            return f"{path} check could not run: {err}"
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            hint = "" if os.geteuid() == 0 else " (criu needs root or CAP_CHECKPOINT_RESTORE)"
            return f"`{path} check` failed{hint}: {' '.join(said[-3:]) or done.returncode}"
        return None

    def dump(self, pid: int, images: Path, outside: list[OutsideFile]) -> float:
        """Dump the process tree of ``pid`` into ``images`` (durably: fsynced) and end it;
        returns the seconds. On failure criu lets the tree run on as it was (and lifts its
        network lock).
        """
        args = [
            self.binary,
            "dump",
            "--tree",
            str(pid),
            "--images-dir",
            str(images),
            "--log-file",
            DUMP_LOG,
            "--tcp-established",
            "--network-lock",
            "nftables",
            "--ghost-limit",
            GHOST_LIMIT,
        ]
        for item in outside:
            if item.external:
                args += ["--external", item.external]
        seconds = self._run(args, images / DUMP_LOG, "dump", pass_fds=())
        started = time.monotonic()
        _fsync_folder(images)  # criu leaves it in the page cache; the paused state must last
        return seconds + time.monotonic() - started

    def restore(self, images: Path, outside: list[OutsideFile], pidfile: Path) -> tuple[int, float]:
        """Restore the tree from ``images`` as a child of this process: (its PID, seconds)."""
        args = [
            self.binary,
            "restore",
            "--images-dir",
            str(images),
            "--log-file",
            RESTORE_LOG,
            "--restore-detached",
            "--restore-sibling",
            "--tcp-established",
            "--network-lock",
            "nftables",
            "--pidfile",
            str(pidfile),
        ]
        handed: list[int] = []
        try:
            for item in outside:  # the server's streams of now, under numbers criu passes on
                try:
                    fd = os.dup(item.stream)
                except OSError:
                    fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                handed.append(fd)
                args += ["--inherit-fd", f"fd[{fd}]:{item.resource}"]
            seconds = self._run(args, images / RESTORE_LOG, "restore", pass_fds=tuple(handed))
        finally:
            for fd in handed:
                os.close(fd)
        try:
            return int(pidfile.read_text().strip()), seconds
        except (OSError, ValueError) as err:
            raise CriuError(
                f"criu restored, but its pid file {pidfile} is unreadable ({err})"
            ) from err

    def _run(self, args: list[str], log: Path, what: str, pass_fds: tuple[int, ...]) -> float:
        started = time.monotonic()
        try:
            # umask 077: the image holds the kernel's whole memory; only its owner reads it.
            done = subprocess.run(
                args,
                capture_output=True,
                text=True,
                check=False,
                umask=0o077,
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
            )
        except OSError as err:
            raise CriuError(f"criu {what} could not run: {err}") from err
        if done.returncode != 0:
            raise CriuError(f"criu {what} failed: {log_errors(log) or done.stderr.strip()}")
        return time.monotonic() - started


def log_errors(log: Path, most: int = 3) -> str:
    """The last errors criu logged (its own words), the harmless ones left out."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [
        re.sub(r"^\(\d+\.\d+\)\s*", "", line).strip()
        for line in lines
        if "Error (" in line and not any(h in line for h in _HARMLESS)
    ]
    return "; ".join(errors[-most:])


def network_lock_table(images: Path) -> str | None:
    """The nftables table criu's network lock of this dump lives in (``inet CRIU-...``).

    criu names it after the dump's run id (kept in ``inventory.img``), cut to the 31
    characters of its name buffer. None when the inventory cannot be read.
    """
    try:
        data = (images / "inventory.img").read_bytes()
    except OSError:
        return None
    run_id = _protobuf_string(data[8 : 8 + int.from_bytes(data[4:8], "little")], _RUN_ID_FIELD)
    return None if run_id is None else f"inet CRIU-{run_id}"[:31]


def unlock_network(images: Path) -> str | None:
    """Lift the network lock of a dump that will never be restored; None, or why not.

    Until then the server's ends of the dumped connections hang (their packets are dropped)
    instead of being reset.
    """
    table = network_lock_table(images)
    nft = shutil.which("nft")
    if table is None:
        return f"the network lock of {images} is unknown (inventory.img unreadable)"
    if nft is None:
        return f"nft is not installed: nftables table {table!r} stays"
    done = subprocess.run(
        [nft, "delete", "table", *table.split(" ", 1)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0 and "No such file" not in done.stderr:
        return f"nft could not delete table {table!r}: {done.stderr.strip()}"
    return None


def _protobuf_string(message: bytes, field: int) -> str | None:
    """The value of one string field of a protobuf message (enough for criu's inventory)."""
    pos = 0

    def varint() -> int:
        nonlocal pos
        value, shift = 0, 0
        while True:
            byte = message[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    try:
        while pos < len(message):
            key = varint()
            number, kind = key >> 3, key & 7
            if kind == 0:
                varint()
            elif kind == 1:
                pos += 8
            elif kind == 5:
                pos += 4
            elif kind == 2:
                length = varint()
                if number == field:
                    return message[pos : pos + length].decode()
                pos += length
            else:
                return None
    except (IndexError, UnicodeDecodeError):
        return None
    return None


def _fsync_folder(folder: Path) -> None:
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def image_bytes(images: Path) -> int:
    return sum(entry.stat().st_size for entry in images.iterdir() if entry.is_file())


def pid_gone(pid: int, timeout: float) -> bool:
    """Wait until no process has ``pid`` (a zombie still holds it); False after ``timeout``."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
