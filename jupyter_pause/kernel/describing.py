"""Describing live tensors and arrays for a checkpoint: the storages they view, as manifest
records (the format, and rebuilding them: ``arrays``). Only a checkpoint loads this module.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .arrays import _host_view, saved_as_buffer


@dataclass
class Storage:
    """One buffer to write: a torch storage or the base memory of numpy arrays."""

    key: str
    nbytes: int
    owner: Any  # keeps the memory alive while we write it
    device: str
    address: int  # where it lives on its device; with device and size, its identity
    fetch: Callable[[], memoryview]  # its bytes in host memory (a device buffer is copied)
    _data: memoryview | None = None

    @property
    def identity(self) -> tuple[str, int, int]:
        return (self.device, self.address, self.nbytes)

    @property
    def data(self) -> memoryview:
        """Fetched on first use, so a device buffer known to be unchanged is never copied."""
        if self._data is None:
            self._data = self.fetch()
        return self._data


class Describer:
    """Turns live tensors/arrays into manifest records, collecting the storages they view.

    Host memory can be viewed by storages of two libraries at once (``torch.from_numpy(a[1:])``
    views part of ``a``'s buffer): a storage that lies inside another one is recorded *within*
    it, so the restore rebuilds both on the same memory and they keep sharing it.
    """

    def __init__(self, on_new: Callable[[Storage], None] | None = None) -> None:
        self.storages: dict[tuple[str, int], Storage] = {}
        self.within: dict[str, tuple[str, int]] = {}  # storage key -> (enclosing key, offset)
        self._host: list[tuple[int, int, str]] = []  # (address, -size, key) of host storages
        self._by_key: dict[str, Storage] = {}
        self._keepalive: list[Any] = []  # host copies of device storages, until written
        self._on_new = on_new  # lets the caller start writing while the rest is still pickled

    def _storage(self, device: str, ptr: int, nbytes: int, owner: Any, data_fn: Any) -> str:
        ident = (device, ptr)
        found = self.storages.get(ident)
        if found is None or found.nbytes < nbytes:
            key = found.key if found else f"s{len(self.storages)}"
            found = Storage(key, nbytes, owner, device, ptr, data_fn)
            self.storages[ident] = found
            self._by_key[key] = found
            enclosing = self._enclosing(found) if device == "cpu" else None
            if enclosing is not None:
                self.within[key] = (enclosing.key, ptr - enclosing.address)
            else:
                if device == "cpu":
                    bisect.insort(self._host, (ptr, -nbytes, key))
                if self._on_new is not None:
                    self._on_new(found)
        return found.key

    def storage(self, key: str) -> Storage:
        return self._by_key[key]

    def _enclosing(self, storage: Storage) -> Storage | None:
        """A host storage already known that holds all of ``storage``'s bytes.

        Host storages rarely overlap, so the one starting last at or before this one is
        the only candidate worth a look (``link_overlapping`` settles the rare rest).
        """
        index = bisect.bisect_right(self._host, (storage.address, 0, "")) - 1
        if index < 0:
            return None
        other = self._by_key[self._host[index][2]]
        if (
            other is not storage
            and storage.address + storage.nbytes <= other.address + other.nbytes
        ):
            return other
        return None

    def link_overlapping(self) -> None:
        """Record host storages that overlap storages written before them.

        ``_storage`` already links a storage that arrives inside a known one; this settles
        the other orders: one that arrives around known ones, or two that only partly
        overlap (then a span covering both is written and each is recorded within it).
        """
        host = sorted(
            (s for s in self.storages.values() if s.device == "cpu" and s.key not in self.within),
            key=lambda s: s.address,
        )
        group: list[Storage] = []
        end = -1
        for storage in [*host, None]:
            if storage is not None and storage.address < end:
                group.append(storage)
                end = max(end, storage.address + storage.nbytes)
                continue
            if len(group) > 1:
                self._link_group(group, end)
            if storage is not None:
                group, end = [storage], storage.address + storage.nbytes

    def _link_group(self, group: list[Storage], end: int) -> None:
        start = group[0].address
        outer = next((s for s in group if s.address == start and s.nbytes == end - start), None)
        if outer is None:
            # A span covering the partial overlaps; keeps every member's owner alive.
            owners = [s.owner for s in group]
            outer = Storage(
                f"s{len(self.storages)}",
                end - start,
                owners,
                "cpu",
                start,
                lambda: _host_view(start, end - start),
            )
            self.storages[("span", start)] = outer
            self._by_key[outer.key] = outer
            if self._on_new is not None:
                self._on_new(outer)
        for storage in group:
            if storage is not outer:
                self.within[storage.key] = (outer.key, storage.address - start)
        for key, (parent, offset) in list(self.within.items()):
            if parent in self.within:  # within a storage that is now within the span
                grand, base = self.within[parent]
                self.within[key] = (grand, base + offset)

    def describe(self, obj: Any) -> dict[str, Any] | None:
        """A record for a tensor/array, or None if it must be pickled normally."""
        module = type(obj).__module__
        if module.startswith("torch"):
            return self._describe_tensor(obj)
        return self._describe_array(obj)

    def _describe_tensor(self, tensor: Any) -> dict[str, Any] | None:
        import torch

        if not saved_as_buffer(tensor):
            return None
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        device = str(tensor.device)
        if tensor.device.type == "cpu":

            def data_fn() -> memoryview:
                return _host_view(storage.data_ptr(), nbytes)

            owner: Any = storage
        else:
            # Copy device memory to the host once per storage, in the writer thread, and only
            # if the buffer has to be hashed or written.
            on = tensor.device

            def data_fn() -> memoryview:
                if on.type == "cuda":  # this thread's stream must not overtake the user's
                    torch.cuda.synchronize(on)
                host = torch.empty(nbytes, dtype=torch.uint8)
                host.untyped_storage().copy_(storage)
                self._keepalive.append(host)
                return _host_view(host.data_ptr(), nbytes)

            owner = storage
        key = self._storage(device, storage.data_ptr(), nbytes, owner, data_fn)
        return {
            "kind": "torch",
            "storage": key,
            "offset": tensor.storage_offset(),
            "shape": list(tensor.shape),
            "stride": list(tensor.stride()),
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "device": device,
            # A tensor computed with autograd (``loss``, ``output``) has a graph no process
            # can carry: it comes back detached, so a backward() through it fails loudly
            # instead of silently missing the tensors it was computed from.
            "requires_grad": bool(tensor.requires_grad) and tensor.grad_fn is None,
            "computed_by": tensor.grad_fn.name() if tensor.grad_fn is not None else None,
            "parameter": isinstance(tensor, torch.nn.Parameter),
            # Lazy conjugate/negative views: same memory, the bit says how to read it.
            "conj": bool(tensor.is_conj()),
            "neg": bool(tensor.is_neg()),
        }

    def _describe_array(self, array: Any) -> dict[str, Any] | None:
        import numpy as np

        if array.dtype.hasobject:
            return None
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        if not (root.flags.c_contiguous or root.flags.f_contiguous):
            root = array = np.ascontiguousarray(array)
        root_ptr = root.__array_interface__["data"][0]
        ptr = array.__array_interface__["data"][0]
        key = self._storage(
            "cpu", root_ptr, root.nbytes, root, lambda: _host_view(root_ptr, root.nbytes)
        )
        return {
            "kind": "numpy",
            "storage": key,
            "offset": ptr - root_ptr,
            "shape": list(array.shape),
            "stride": list(array.strides),
            "dtype": np.lib.format.dtype_to_descr(array.dtype),
            "writeable": bool(array.flags.writeable),
        }
