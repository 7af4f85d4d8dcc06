"""Tensors and arrays kept out of the pickle stream: raw buffers plus dtype/shape/stride/device.

A torch storage or a numpy base buffer is written once, however many tensors view it (tied
weights, ``model`` and ``optimizer`` holding the same parameters, array slices), and is
rebuilt once, so those tensors share memory again after a restore. numpy and torch are only
touched when the notebook already imported them: this module imports neither eagerly.
Turning live ones into records is ``describing``'s (a restore does not load it).
"""

from __future__ import annotations

import ctypes
import sys
import warnings
from collections.abc import Callable
from typing import Any

import xxhash


def content_hash(data: memoryview) -> str:
    """xxh3-128: tens of GB/s, so re-hashing what may have changed costs little."""
    return xxhash.xxh3_128_hexdigest(data)


def content_hasher() -> Any:
    """``content_hash`` fed piece by piece (``update``), then read with ``hexdigest()``."""
    return xxhash.xxh3_128()


def _host_view(ptr: int, nbytes: int) -> memoryview:
    """A zero-copy byte view of host memory we keep alive through the owning object."""
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")


def saved_as_buffer(obj: Any) -> bool:
    """Whether a tensor/array of an external type is written as a raw buffer (else pickled).

    Sparse, quantized, meta and nested tensors and object arrays have no single strided
    buffer; their own pickling (torch's reduce saves a sparse tensor's indices and values as
    plain tensors, which are buffers again) keeps them exact.
    """
    dtype = getattr(obj, "dtype", None)
    if getattr(dtype, "hasobject", False):
        return False
    if type(obj).__module__.startswith("torch"):
        import torch

        return (
            obj.layout == torch.strided
            and not obj.is_quantized
            and not obj.is_nested
            and obj.device.type != "meta"
        )
    return True


def subclass_view_reduce(obj: Any) -> tuple[Any, ...] | None:
    """A recarray, matrix or masked array as a plain array view of its memory plus its
    attributes (None for anything else): the plain view is saved as a buffer like any array,
    so the subclass view shares memory with the arrays it viewed again after a restore
    (pickled whole, it came back a copy). A masked array's mask is such an array too."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not isinstance(obj, numpy.ndarray) or obj.dtype.hasobject:
        return None
    kinds = [numpy.recarray, numpy.matrix]
    masked = sys.modules.get("numpy.ma")
    if masked is not None:
        kinds.append(masked.MaskedArray)
    if type(obj) not in kinds:
        return None
    return view_as_subclass, (type(obj), obj.view(numpy.ndarray), dict(vars(obj)))


def view_as_subclass(cls: type, array: Any, attributes: dict[str, Any]) -> Any:
    """Rebuild what ``subclass_view_reduce`` saved: a view of ``array``'s memory."""
    view = array.view(cls)
    view.__dict__.update(attributes)
    return view


def leaf_grad(tensor: Any) -> Any:
    """The gradient a leaf tensor accumulated, if any (asking a non-leaf would warn)."""
    if not type(tensor).__module__.startswith("torch") or not tensor.is_leaf:
        return None
    return tensor.grad


def external_types() -> tuple[type, ...]:
    """The exact types written as raw buffers (subclasses are pickled normally)."""
    types: list[type] = []
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "Tensor"):
        types += [torch.Tensor, torch.nn.Parameter]
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "ndarray"):
        types.append(numpy.ndarray)
    return tuple(types)


def device_available(device: str) -> bool:
    """Whether this process can put tensors on ``device`` ("cuda:1", "mps"; never "cpu")."""
    import torch

    kind, _, index = device.partition(":")
    if kind == "cuda":
        return torch.cuda.is_available() and int(index or 0) < torch.cuda.device_count()
    if kind == "mps":
        return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    return hasattr(torch, kind) and getattr(torch, kind).is_available()


class Rebuilder:
    """Rebuilds tensors/arrays from records, one storage per buffer, on the recorded device."""

    def __init__(
        self,
        open_storage: Callable[[str], memoryview],
        device_storage: Callable[[str, str], Any] | None = None,
    ) -> None:
        self._open_storage = open_storage  # key -> memoryview of the bytes
        # (key, device) -> a torch storage already on that device, or None: take the host path
        self._device_storage = device_storage
        self._torch_storages: dict[tuple[str, str], Any] = {}
        self.warnings: list[str] = []
        self._missing_devices: set[str] = set()

    def rebuild(self, record: dict[str, Any]) -> Any:
        if record["kind"] == "torch":
            return self._rebuild_tensor(record)
        return self._rebuild_array(record)

    def _target_device(self, device: str) -> str:
        if device == "cpu" or device_available(device):
            return device
        if device not in self._missing_devices:
            self._missing_devices.add(device)
            self.warnings.append(
                f"Tensors saved on {device} were restored on the CPU: this machine has no "
                f"{device}. Move them with .to('{device}') once one is available."
            )
        return "cpu"

    def _rebuild_tensor(self, record: dict[str, Any]) -> Any:
        import torch

        device = self._target_device(record["device"])
        cache_key = (record["storage"], device)
        storage = self._torch_storages.get(cache_key)
        if storage is None and device != "cpu" and self._device_storage is not None:
            storage = self._device_storage(record["storage"], device)
            if storage is not None:
                self._torch_storages[cache_key] = storage
        if storage is None:
            raw = self._open_storage(record["storage"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "buffer is not writable" cannot apply to COW maps
                base = (
                    torch.frombuffer(raw, dtype=torch.uint8)
                    if raw.nbytes
                    else torch.empty(0, dtype=torch.uint8)
                )
            if device != "cpu":
                base = base.to(device)
            storage = base.untyped_storage()
            self._torch_storages[cache_key] = storage
        dtype = getattr(torch, record["dtype"])
        tensor = torch.empty(0, dtype=dtype, device=device)
        tensor.set_(storage, record["offset"], record["shape"], record["stride"])
        if record.get("neg"):
            tensor = torch._neg_view(tensor)
        if record.get("conj"):
            tensor = tensor.conj()
        if record["parameter"]:
            return torch.nn.Parameter(tensor, requires_grad=record["requires_grad"])
        if record["requires_grad"]:
            tensor.requires_grad_(True)
        return tensor

    def _rebuild_array(self, record: dict[str, Any]) -> Any:
        import numpy as np

        raw = self._open_storage(record["storage"])
        dtype = np.lib.format.descr_to_dtype(_as_descr(record["dtype"]))
        array = np.ndarray(
            tuple(record["shape"]),
            dtype=dtype,
            buffer=raw if raw.nbytes else np.empty(0, dtype=np.uint8),
            offset=record["offset"],
            strides=tuple(record["stride"]),
        )
        if not record.get("writeable", True):
            array.flags.writeable = False
        return array


def _as_descr(descr: Any) -> Any:
    """JSON turns numpy's structured descr tuples into lists; numpy wants tuples back.

    A field is ``(name, type)`` or ``(name, type, shape)``: the name may be a ``(title,
    name)`` pair, the type a nested structure, the shape that of a sub-array field.
    """
    if not isinstance(descr, list):
        return descr
    fields = []
    for name, kind, *shape in descr:
        field = (tuple(name) if isinstance(name, list) else name, _as_descr(kind))
        fields.append(field + tuple(tuple(part) for part in shape))
    return fields
