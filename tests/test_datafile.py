"""Data files written around the page cache: every byte lands where ``append`` says it does."""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
from pathlib import Path

import pytest

from jupyter_pause.kernel.datafile import ALIGN, DataFileWriter, buffer_address

MB = 1 << 20


def pattern(nbytes: int, seed: int) -> bytes:
    """Bytes that differ at every offset, so a misplaced block cannot go unnoticed."""
    return (bytes(range(seed % 251, 251)) + bytes(range(seed % 251))) * (nbytes // 251 + 1)


def writable_at(arena: ctypes.Array, region: int, misalign: int, data: bytes) -> memoryview:
    """A writable buffer holding ``data`` at ``misalign`` bytes past a page boundary, in the
    arena's ``region``-th MB."""
    base = ctypes.addressof(arena) + region * MB
    start = region * MB + (-base % ALIGN) + misalign
    view = memoryview(arena).cast("B")[start : start + len(data)]
    view[:] = data
    return view


def resident_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache (mincore on a private map of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    residency = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)
    anchor = ctypes.c_char.from_buffer(mapped)  # the map's address; nothing is touched
    try:
        if libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), size, residency) != 0:
            pytest.fail(f"mincore: {os.strerror(ctypes.get_errno())}")
    finally:
        del anchor
        mapped.close()
    return sum(flag & 1 for flag in residency)


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "page_cache"])
def test_every_buffer_lands_at_its_offset(tmp_path: Path, direct: bool) -> None:
    arena = (ctypes.c_char * (80 * MB))()
    pieces = [
        # (buffer, alignment asked for small buffers)
        (memoryview(pattern(100, 1))[:100], 64),  # small, read-only: staged
        (writable_at(arena, 0, 64, pattern(3 * MB + 5, 2)), ALIGN),  # torch-like address
        (memoryview(pattern(5 * MB + 3, 3)), ALIGN),  # large but read-only: staged
        (writable_at(arena, 8, 16, pattern(9 * MB + 4095, 4)), ALIGN),  # numpy-like
        (memoryview(pattern(70, 5))[:70], 64),
        (writable_at(arena, 20, 0, pattern(2 * MB, 6)), ALIGN),  # page-aligned
        (writable_at(arena, 24, 4095, pattern(50 * MB + 1, 7)), ALIGN),
        (memoryview(pattern(3, 8))[:3], 64),  # ends mid-block: the last block is padded
    ]
    writer = DataFileWriter(tmp_path / "data", direct=direct)
    placed = []
    for view, align in pieces:
        address = buffer_address(view) if view.nbytes >= MB else None
        offset = writer.append(view, align)
        placed.append((offset, bytes(view)))
        if address is not None:
            assert offset % ALIGN == address % ALIGN  # at least as aligned as in memory
        else:
            assert offset % align == 0
    writer.finish()
    os.fsync(writer.fd)
    writer.close()

    content = (tmp_path / "data").read_bytes()
    assert len(content) == writer.size == placed[-1][0] + 3
    for offset, expected in placed:
        assert content[offset : offset + len(expected)] == expected
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o600
    if direct and not writer.direct:
        pytest.skip("this filesystem refuses O_DIRECT: written through the page cache")


def test_direct_writes_leave_the_page_cache_alone(tmp_path: Path) -> None:
    arena = (ctypes.c_char * (40 * MB))()
    writer = DataFileWriter(tmp_path / "data")
    if not writer.direct:
        writer.close()
        pytest.skip("this filesystem refuses O_DIRECT")
    writer.append(writable_at(arena, 0, 64, pattern(32 * MB, 9)), ALIGN)
    writer.finish()
    os.fsync(writer.fd)
    writer.close()
    assert writer.direct  # no write fell back to the page cache
    assert resident_pages(tmp_path / "data") <= 2  # at most the two staged end blocks
