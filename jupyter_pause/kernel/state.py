"""A namespace's checkpoint format, and loading it back: one pickle "frame" per variable,
tensors and arrays out of band.

Why frames per variable, linked by references, rather than one pickle of the namespace:
- one unpicklable variable is skipped with its reason instead of failing the checkpoint;
- an unchanged variable's frame is reused byte for byte (content hash), so it is not rewritten;
- a single variable can be restored on its own.

What keeps shared objects shared, which naive per-variable pickling breaks:
- every tensor/array is a persistent reference ``("a", key)`` to one record per object, keyed
  stably for the life of the process; ``model`` and ``optimizer`` get the same Parameter objects;
- an object that is itself the value of another saved variable becomes ``("v", name)``, so
  ``trainer.cfg is cfg`` still holds; variables that reference each other in a cycle share one
  frame (a "group") so the cycle is pickled once.
A function whose globals are the notebook's namespace comes back bound to the namespace it is
restored into (not to a private copy of the globals it used), so after a restore ``g = 2;
read_g()`` sees the new ``g`` and ``global counter`` updates the notebook's.

Writing frames is ``snapshot``'s (with cloudpickle); this module is what a restore needs, so a
kernel that only restores never loads the pickling side. Frames name ``_reference``,
``_notebook_function`` and ``_set_notebook_function_state`` by this module's path: they stay here.
"""

from __future__ import annotations

import contextvars
import io
import pickle
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .arrays import Rebuilder


class ReadBuffer(Protocol):
    """A buffer's bytes by digest; with ``copy_of`` (the bytes of an equal storage restored
    already), in memory of their own."""

    def __call__(self, digest: str, copy_of: memoryview | None = None) -> memoryview: ...


class ObjectKeys:
    """Stable keys for tensors/arrays in this process: a reused frame's references stay valid."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[Any], str]] = {}
        self._by_key: dict[str, weakref.ref[Any]] = {}
        self._counter = 0

    def key_for(self, obj: Any) -> str:
        entry = self._by_id.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        self._counter += 1
        key = f"o{self._counter}"
        self.adopt(obj, key)
        return key

    def adopt(self, obj: Any, key: str) -> None:
        """Give ``obj`` a known key (restored objects keep the key they were saved under)."""
        ref = weakref.ref(obj)
        self._by_id[id(obj)] = (ref, key)
        self._by_key[key] = ref
        if key.startswith("o") and key[1:].isdigit():
            self._counter = max(self._counter, int(key[1:]))

    def lookup(self, key: str) -> Any | None:
        ref = self._by_key.get(key)
        return ref() if ref is not None else None


class _NotebookGlobals:
    """Stands for the notebook's namespace in a pickled function: loaded as the live one."""


_NOTEBOOK_GLOBALS = _NotebookGlobals()


_ACTIVE_LOADER: contextvars.ContextVar[Any] = contextvars.ContextVar("jupyter_pause_loader")


def _notebook_function(code: types.CodeType, namespace: dict[str, Any], closure: Any) -> Any:
    return types.FunctionType(code, namespace, None, None, closure)


def _set_notebook_function_state(func: types.FunctionType, state: Any) -> None:
    """cloudpickle's function state, minus what would write into the live namespace (its
    ``__globals__`` update and ``__builtins__``)."""
    attributes, slotstate = state
    func.__dict__.update(attributes)
    closure = slotstate.pop("__closure__")
    slotstate.pop("_cloudpickle_submodules", None)  # loading them imported them already
    if closure is not None:
        for cell, saved in zip(func.__closure__ or (), closure, strict=True):
            try:
                cell.cell_contents = saved.cell_contents
            except ValueError:  # an empty cell stays empty
                continue
    for name, value in slotstate.items():
        setattr(func, name, value)


def _reference(kind: str, key: str) -> Any:
    """Resolves a reference written by ``reducer_override``, against the loader running now."""
    loader = _ACTIVE_LOADER.get(None)
    if loader is None:
        raise pickle.UnpicklingError("a jupyter_pause frame can only be loaded by its checkpoint")
    return loader.resolve(kind, key)


class _FrameReader:
    """A frame being unpickled, read where it lies (no copy of the whole). The C unpickler
    asks for every 64 KiB frame through ``read``: a Python call, where the GIL can pass to
    the threads reading tensor data (see ``snapshot._FrameBuffer``)."""

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._position = 0

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._data)
        if size is not None and size >= 0:
            end = min(end, self._position + size)
        chunk = self._data[self._position : end].tobytes()
        self._position = end
        return chunk

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        count = min(target.nbytes, len(self._data) - self._position)
        target[:count] = self._data[self._position : self._position + count]
        self._position += count
        return count

    def readline(self, size: int | None = -1) -> bytes:
        """Up to and with the next newline (text opcodes: a few bytes)."""
        limit = len(self._data)
        if size is not None and size >= 0:
            limit = min(limit, self._position + size)
        end = self._position
        while end < limit:
            window = self._data[end : min(end + 256, limit)].tobytes()
            found = window.find(b"\n")
            end += len(window) if found < 0 else found + 1
            if found >= 0:
                break
        return self.read(end - self._position)


class _FrameUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, loader: Any):
        super().__init__(file)
        self._loader = loader

    def persistent_load(self, pid: Any) -> Any:
        return self._loader.resolve(*pid)

    def load(self) -> Any:
        token = _ACTIVE_LOADER.set(self._loader)  # for references written by reducer_override
        try:
            return super().load()
        finally:
            _ACTIVE_LOADER.reset(token)


class RestoreError(Exception):
    """One variable could not be restored; the message says why and what to do."""


def load_order(manifest: dict[str, Any], names: Iterable[str]) -> list[str]:
    """The order a restore loads variables in: those holding fewer tensors/arrays first, so
    plain objects unpickle on the CPU while the tensor data is still on its way."""
    counts = {name: len(frame["arrays"]) for frame in manifest["frames"] for name in frame["names"]}
    return sorted(names, key=lambda name: counts.get(name, 0))


def storage_buffer(manifest: dict[str, Any], key: str) -> str:
    """The buffer holding a storage's bytes: its own, or that of the storage it lies within."""
    record = manifest["storages"][key]
    while "within" in record:
        record = manifest["storages"][record["within"]["storage"]]
    return record["buffer"]


def buffers_in_load_order(manifest: dict[str, Any], names: list[str]) -> list[str]:
    """Every buffer of the manifest, those that loading ``names`` (in that order) reads first,
    in the order it reads them: the session settings applied before any variable, then each
    variable's frame and the storages of its arrays."""
    frames = {name: frame for frame in manifest["frames"] for name in frame["names"]}
    order: dict[str, None] = {}
    before = manifest.get("session", {}).get("before")
    if before is not None:
        order[before] = None
    for name in names:
        frame = frames.get(name)
        if frame is None:
            continue  # an alias: loaded through the variable it names
        order[frame["frame"]] = None
        for key in frame["arrays"]:
            order[storage_buffer(manifest, manifest["objects"][key]["storage"])] = None
    order.update(dict.fromkeys(manifest["buffers"]))  # the rest (RNG states) last
    return list(order)


def streamed_buffers(manifest: dict[str, Any], at_least: int) -> set[str]:
    """Buffers of ``at_least`` bytes whose storages go to a CUDA device this process has:
    they are streamed there (``device_reads``) rather than read into host memory."""
    devices = {
        record["device"]
        for record in manifest["storages"].values()
        if record.get("device", "cpu").startswith("cuda") and "buffer" in record
    }
    if not devices:
        return set()
    from .arrays import device_available

    present = {device for device in devices if device_available(device)}
    return {
        record["buffer"]
        for record in manifest["storages"].values()
        if record.get("device") in present and "buffer" in record and record["nbytes"] >= at_least
    }


class StateLoader:
    """Loads variables from a manifest on demand, each shared object exactly once."""

    def __init__(
        self,
        manifest: dict[str, Any],
        read_buffer: ReadBuffer,
        keys: ObjectKeys,
        namespace: dict[str, Any],
        read_to_device: Callable[[str, str], Any] | None = None,
    ) -> None:
        self.manifest = manifest
        self._read_buffer = read_buffer
        # (digest, device) -> a torch storage on that device, or None where it is not streamed
        self._read_to_device = read_to_device
        self._on_device: dict[tuple[str, str], Any] = {}
        self._keys = keys
        self.namespace = namespace  # what restored notebook functions see as their globals
        self._objects: dict[str, Any] = {}
        self._values: dict[str, Any] = {}
        self._failed: dict[str, str] = {}
        self._group_of: dict[str, dict[str, Any]] = {}
        for frame in manifest["frames"]:
            for name in frame["names"]:
                self._group_of[name] = frame
        self._storage_owner: dict[str, str] = {}  # buffer digest -> storage key mapped on it
        self._storage_views: dict[str, memoryview] = {}  # storage key -> its restored memory
        self.rebuilder = Rebuilder(self._storage_bytes, self._device_storage)

    def _device_storage(self, key: str, device: str) -> Any:
        """A storage streamed onto ``device``, or None (then it is built in host memory and
        copied there). Two storages with equal content get one read and a device copy."""
        record = self.manifest["storages"][key]
        if self._read_to_device is None or "within" in record:
            return None
        digest = record["buffer"]
        first = self._on_device.get((digest, device))
        if first is not None:
            return first.clone()
        storage = self._read_to_device(digest, device)
        if storage is not None:
            self._on_device[(digest, device)] = storage
        return storage

    def _storage_bytes(self, key: str) -> memoryview:
        """The bytes of one storage. Two storages with equal content share one buffer on disk
        (content addressing) but must not share memory once restored: the second gets a copy.
        A storage saved within another one is a slice of that one's memory."""
        found = self._storage_views.get(key)
        if found is not None:  # every array and tensor on one storage shares its memory
            return found
        record = self.manifest["storages"][key]
        within = record.get("within")
        if within is not None:
            outer = self._storage_bytes(within["storage"])
            view = outer[within["offset"] : within["offset"] + record["nbytes"]]
        else:
            digest = record["buffer"]
            owner = self._storage_owner.setdefault(digest, key)
            if owner == key:
                view = self._read_buffer(digest)
            else:  # memory of its own, with the first one's content
                view = self._read_buffer(digest, copy_of=self._storage_views[owner])
        self._storage_views[key] = view
        return view

    def resolve(self, kind: str, key: str) -> Any:
        """The object a frame's reference names: a tensor/array or another variable."""
        if kind == "a":
            return self.array(key)
        if kind == "v":
            return self.variable(key)
        if kind == "g":
            return self.namespace
        raise pickle.UnpicklingError(f"unknown reference {kind!r}")

    def array(self, key: str) -> Any:
        obj = self._objects.get(key)
        if obj is None:
            record = self.manifest["objects"][key]
            obj = self.rebuilder.rebuild(record)
            self._objects[key] = obj
            self._keys.adopt(obj, key)
            if "grad" in record:
                try:
                    obj.grad = self.array(record["grad"])
                except RuntimeError as err:  # e.g. the tensor landed on another device
                    self.rebuilder.warnings.append(f"a gradient was not restored: {err}")
        return obj

    def variable(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        if name in self._failed:
            raise RestoreError(self._failed[name])
        alias = self.manifest.get("aliases", {}).get(name)
        if alias is not None:
            value = self.variable(alias)
            self._values[name] = value
            return value
        frame = self._group_of.get(name)
        if frame is None:
            raise RestoreError("not in this checkpoint")
        try:
            loaded = _FrameUnpickler(_FrameReader(self._read_buffer(frame["frame"])), self).load()
        except RestoreError as err:
            message = f"needs a variable that could not be restored ({err})"
            self._fail(frame, message)
            raise RestoreError(message) from None
        except Exception as err:
            message = _explain_load_error(err)
            self._fail(frame, message)
            raise RestoreError(message) from None
        values = [loaded] if len(frame["names"]) == 1 else list(loaded)
        for member, value in zip(frame["names"], values, strict=True):
            self._values[member] = value
        return self._values[name]

    def extra(self, digest: str) -> Any:
        """Load something saved beside the variables (``Snapshotter.pickle_extra``)."""
        try:
            return _FrameUnpickler(_FrameReader(self._read_buffer(digest)), self).load()
        except RestoreError as err:
            raise RestoreError(f"needs a variable that could not be restored ({err})") from None
        except Exception as err:
            raise RestoreError(_explain_load_error(err)) from None

    def _fail(self, frame: dict[str, Any], message: str) -> None:
        for member in frame["names"]:
            self._failed[member] = message


def _explain_load_error(err: BaseException) -> str:
    if isinstance(err, ModuleNotFoundError):
        return (
            f"needs the module {err.name!r}, which this environment lacks: install it, "
            "then restore this variable again"
        )
    if isinstance(err, AttributeError) and "on <module" in str(err):
        return f"its class or function no longer exists where it was defined ({err})"
    return f"{type(err).__name__}: {err}"
