"""Disk that deleted checkpoint files still hold because kernels map them.

A lazy restore leaves a kernel's large arrays as maps of checkpoint data files. Retention and
gc may delete those files meanwhile (unlinking is safe: the map keeps the data), but the disk
space comes back only when the kernel lets go of the arrays. The kernels' ``/proc/PID/maps``
name each such file with `` (deleted)``; its size is read through ``/proc/PID/map_files``
where the kernel allows it, else the mapped extent is counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

DELETED = " (deleted)"


def held_by_maps(pids: Iterable[int], store_root: Path) -> int:
    """Bytes of store files deleted from disk that the processes ``pids`` still map (each
    file counted once)."""
    root = os.path.realpath(store_root) + os.sep
    sizes: dict[tuple[str, str], int] = {}  # (device, inode) -> bytes
    for pid in set(pids):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                lines = maps.read().splitlines()
        except OSError:  # gone meanwhile, or another user's
            continue
        for line in lines:
            fields = line.split(None, 5)
            if len(fields) < 6 or not fields[5].endswith(DELETED):
                continue
            if not fields[5][: -len(DELETED)].startswith(root):
                continue
            span, device, inode = fields[0], fields[3], fields[4]
            start, end = (int(part, 16) for part in span.split("-"))
            try:
                size = os.stat(f"/proc/{pid}/map_files/{span}").st_size
            except OSError:
                size = end - start
            sizes[(device, inode)] = max(sizes.get((device, inode), 0), size)
    return sum(sizes.values())
