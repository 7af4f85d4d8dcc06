"""Restoring a tensor storage straight onto a CUDA device, without a host copy of the whole.

Reading a buffer into host memory and then calling ``.to("cuda")`` costs fresh host memory
as large as the model and runs the disk and the copy one after the other. Here the buffer is
read in 8 MiB pieces into a few pinned (page-locked) host buffers, several reads in flight on
the reader threads; as each piece arrives it is hashed (the content check) and copied to its
place in the device storage asynchronously, on a stream of its own, while the next pieces
are read. A pinned buffer is read into again only after the copy out of it finished (a CUDA
event). The disk and the host-to-device copy then overlap, and host memory stays a few
pinned buffers whatever the model's size.

Used only for storages restored onto a CUDA device; with ``device`` the CPU the same steps
run synchronously on ordinary buffers (how the tests exercise the piece arithmetic).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import xxhash

from .arrays import _host_view
from .reading import ALIGN, FileReads, ReadError, read_into

SLOTS = 4  # pinned buffers: up to SLOTS - 1 reads in flight while one is copied
PIECE = 8 << 20  # one read into a pinned buffer (page-locked memory is scarce: 4 x 8 MiB)


def pieces(offset: int, nbytes: int) -> list[tuple[int, int, int]]:
    """Block-aligned reads covering ``nbytes`` at ``offset``: (file offset, bytes to read,
    where the buffer's bytes start in it), each at most ``PIECE`` + one block."""
    out = []
    position = offset - offset % ALIGN
    end = offset + nbytes
    while position < end:
        length = min(PIECE, end - position)
        length += -length % ALIGN
        out.append((position, length, max(offset - position, 0)))
        position += length
    return out


class _Staging:
    """``SLOTS`` aligned host buffers (pinned for CUDA) and, per slot, what must finish
    before the slot is read into again."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        size = PIECE + 2 * ALIGN
        self.tensors = [torch.empty(size, dtype=torch.uint8, pin_memory=cuda) for _ in range(SLOTS)]
        # O_DIRECT needs an aligned address: start each slot at its first aligned byte.
        self.skip = [-t.data_ptr() % ALIGN for t in self.tensors]
        self.views = [
            _host_view(t.data_ptr() + skip, PIECE + ALIGN)
            for t, skip in zip(self.tensors, self.skip, strict=True)
        ]
        self.copied: list[Any] = [None] * SLOTS  # CUDA events of the last copy out of a slot


def read_to_device(
    reads: FileReads, name: str, offset: int, nbytes: int, device: Any, digest: str | None
) -> Any:
    """A new ``torch.UntypedStorage`` on ``device`` with the ``nbytes`` at ``offset`` of data
    file ``name``; ReadError if the file is short or unreadable or (``digest`` given) its
    content does not hash to ``digest``."""
    import torch

    device = torch.device(device)
    cuda = device.type == "cuda"
    fd, direct = reads.file(name)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    staging = _Staging(torch, cuda)
    stream = torch.cuda.Stream(device) if cuda else None
    hasher = xxhash.xxh3_128() if digest is not None else None
    plan = pieces(offset, nbytes)

    def read(index: int) -> Callable[[], int]:
        position, length, _start = plan[index]
        slot = index % SLOTS
        copied = staging.copied[slot]

        def work() -> int:
            if copied is not None:
                copied.synchronize()  # the copy out of this slot is done (waits without the GIL)
            return read_into(fd, direct, staging.views[slot][:length], position)

        return work

    in_flight = {i: reads.submit(read(i)) for i in range(min(SLOTS, len(plan)))}
    done = 0
    try:
        for index, (position, length, start) in enumerate(plan):
            got = in_flight.pop(index).result()
            want = min(length, offset + nbytes - position)
            if got < want:
                raise ReadError(
                    f"Data file {name} is shorter than recorded: the checkpoint is damaged."
                )
            slot = index % SLOTS
            piece = staging.views[slot][start:want]
            if hasher is not None:
                hasher.update(piece)
            begin = staging.skip[slot] + start
            source = staging.tensors[slot][begin : begin + piece.nbytes]
            destination = target[done : done + piece.nbytes]
            if stream is None:
                destination.copy_(source)
            else:
                with torch.cuda.stream(stream):
                    destination.copy_(source, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(stream)
                staging.copied[slot] = event
            done += piece.nbytes
            if index + SLOTS < len(plan):
                in_flight[index + SLOTS] = reads.submit(read(index + SLOTS))
    except OSError as err:
        raise ReadError(f"{name}: {err.strerror}") from None
    finally:
        for future in in_flight.values():  # a failed piece: let the others finish first
            future.exception()
        if stream is not None:
            stream.synchronize()  # the pinned buffers must outlive the copies out of them
    if hasher is not None and hasher.hexdigest() != digest:
        raise ReadError(f"data in {name} does not match its hash: the file is damaged")
    return target.untyped_storage()
