"""Serialising a namespace: one small pickle "frame" per variable, tensors and arrays out of band.

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
Frames use cloudpickle, so functions, lambdas and classes defined in the notebook travel by value;
unlike plain cloudpickle, a function whose globals are the notebook's namespace comes back bound
to the namespace it is restored into (not to a private copy of the globals it used), so after a
restore ``g = 2; read_g()`` sees the new ``g`` and ``global counter`` updates the notebook's.
"""

from __future__ import annotations

import contextvars
import io
import pickle
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from . import handles
from .arrays import Describer, Rebuilder, Storage, external_types, leaf_grad, saved_as_buffer

PROTOCOL = 5

# Values whose identity carries no meaning: never worth a cross-variable reference.
_VALUE_TYPES = frozenset(
    {int, float, complex, bool, str, bytes, type(None), range, slice, type(Ellipsis), frozenset}
)
_BY_REFERENCE_TYPES = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


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


@dataclass
class Frame:
    """The pickled form of one variable, or of a group of variables that reference each other."""

    names: list[str]
    data: bytes | None  # None when reused from the previous checkpoint unchanged
    digest: str
    arrays: list[str]  # keys of tensors/arrays this frame references
    depends: list[str]  # other variables this frame references
    nbytes: int


@dataclass
class Capture:
    """Everything a checkpoint will hold, ready to be written."""

    frames: list[Frame] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # name -> name of the same object
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> tensor/array record
    describer: Describer = field(default_factory=Describer)
    skipped: dict[str, str] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # variable -> the autograd function that computed a tensor in it (saved without its graph)
    detached: dict[str, str] = field(default_factory=dict)


# The C pickler saves exact instances of these before it asks reducer_override, so a reference
# to another variable that is one of them can only be caught by persistent_id.
_CONTAINER_TYPES = frozenset({dict, list, tuple, set, frozenset, bytearray})


class _NotebookGlobals:
    """Stands for the notebook's namespace in a pickled function: loaded as the live one."""


_NOTEBOOK_GLOBALS = _NotebookGlobals()


class _FramePickler(cloudpickle.Pickler):
    """Tensors/arrays and other variables become references, through ``reducer_override``.

    The C pickler calls ``reducer_override`` for objects other than ints, floats, strings and
    plain containers, and never for memo hits, so a list of 100k small dicts pickles at C speed
    (a ``persistent_id`` hook would be a Python call for every single object).
    """

    def __init__(
        self,
        file: io.BytesIO,
        own: set[int],
        others: dict[int, str],
        externals: tuple[type, ...],
        keys: ObjectKeys,
        namespace: dict[str, Any] | None,
    ):
        super().__init__(file, protocol=PROTOCOL)
        self._own = own
        self._others = others
        self._externals = externals
        self._keys = keys
        self._namespace = namespace
        self.arrays: dict[str, Any] = {}
        self.depends: set[str] = set()

    def _variable(self, obj: Any) -> str | None:
        ident = id(obj)
        if ident in self._others and ident not in self._own:
            name = self._others[ident]
            self.depends.add(name)
            return name
        return None

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) in self._externals and saved_as_buffer(obj):
            key = self._keys.key_for(obj)
            self.arrays[key] = obj
            return _reference, ("a", key)
        name = self._variable(obj)
        if name is not None:
            return _reference, ("v", name)
        if obj is _NOTEBOOK_GLOBALS:
            return _reference, ("g", "")
        reopen = handles.reduce_handle(obj)
        if reopen is not None:
            return reopen
        return super().reducer_override(obj)

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        """A notebook function keeps its code, defaults, closure and attributes, not its globals:
        it is rebuilt on the namespace it is restored into, the live one (cloudpickle would
        give it a private copy of the values it used, frozen at the checkpoint)."""
        if self._namespace is None or func.__globals__ is not self._namespace:
            return super()._dynamic_function_reduce(func)
        code, _globals, _name, _defaults, closure = self._function_getnewargs(func)
        state, slotstate = cloudpickle.cloudpickle._function_getstate(func)
        del slotstate["__globals__"]  # the values live in the namespace, saved as variables
        return (
            _notebook_function,
            (code, _NOTEBOOK_GLOBALS, closure),
            (state, slotstate),
            None,
            None,
            _set_notebook_function_state,
        )


class _ContainerAwarePickler(_FramePickler):
    """Used only when another variable is a plain container this frame might contain."""

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in _CONTAINER_TYPES:
            name = self._variable(obj)
            if name is not None:
                return ("v", name)
        return None


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


def _holds_buffers(value: Any) -> bool:
    """Cheap guess: tensors, arrays, modules, optimizers and frames hold big buffers."""
    kind = type(value)
    module = kind.__module__
    if module.startswith(("torch", "numpy", "pandas")):
        return True
    return any(base.__module__.startswith("torch.") for base in kind.__mro__[1:])


def _identity_matters(value: Any) -> bool:
    kind = type(value)
    if kind in _VALUE_TYPES:
        return False
    if kind in (tuple, frozenset) and all(type(item) in _VALUE_TYPES for item in value):
        return False  # `shape = (28, 28)`: equal copies are as good as the same one
    # Importable functions and classes pickle by reference: a second copy is the same object.
    return not (
        isinstance(value, _BY_REFERENCE_TYPES)
        and getattr(value, "__module__", "__main__") != "__main__"
    )


class _FrameBuffer(io.BytesIO):
    """A frame being pickled. The C pickler hands it every 64 KiB frame through ``write``;
    done in Python, each call gives the interpreter a point to pass the GIL to the thread
    writing tensor data. The C pickler alone never lets go of it: pickling 100k small dicts
    kept that thread from issuing its next write for 50 ms."""

    def write(self, data: Any) -> int:
        return super().write(data)


class _FrameReader:
    """A frame being unpickled, read where it lies (no copy of the whole). The C unpickler
    asks for every 64 KiB frame through ``read``: a Python call, where the GIL can pass to
    the threads reading tensor data (see ``_FrameBuffer``)."""

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


def pickle_frame(
    names: list[str],
    values: list[Any],
    others: dict[int, str],
    externals: tuple[type, ...],
    keys: ObjectKeys,
    containers: frozenset[int] = frozenset(),
    namespace: dict[str, Any] | None = None,
) -> tuple[bytes, dict[str, Any], set[str]]:
    """Pickle one variable (or a group); returns the bytes, the arrays and variables it references.

    ``others``: id -> name of the other variables' values; ``containers``: which of those ids
    are plain containers (they need the slower ``persistent_id`` path to be caught);
    ``namespace``: the notebook's globals, which its functions are bound to again on restore.
    """
    buffer = _FrameBuffer()
    root: Any = values[0] if len(values) == 1 else tuple(values)
    own = {id(v) for v in values}
    pickler_class = _ContainerAwarePickler if containers - own else _FramePickler
    pickler = pickler_class(buffer, own, others, externals, keys, namespace)
    pickler.dump(root)
    return buffer.getvalue(), pickler.arrays, pickler.depends - set(names)


def describe_error(err: BaseException) -> str:
    """A short, specific reason a value could not be pickled."""
    text = str(err) or type(err).__name__
    if isinstance(err, RecursionError):
        return "nesting too deep to save (maximum recursion depth exceeded)"
    return f"cannot be saved: {text}"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; groups of variables that reference each other in a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    return (
        kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
    )


#: Frames up to this size are unpickled once at checkpoint time, to find values whose pickle
#: round trip fails on load (a ``__getattr__`` that recurses on a half-built object, a
#: ``__setstate__`` that raises) now, rather than at restore time.
TRIAL_LOAD_MAX_BYTES = 1 << 20


class Snapshotter:
    """Builds a ``Capture`` of chosen variables, reusing unchanged frames of the last checkpoint."""

    def __init__(self, keys: ObjectKeys, namespace: dict[str, Any] | None = None) -> None:
        self.keys = keys
        self.namespace = namespace

    def capture(
        self,
        values: dict[str, Any],
        previous: dict[str, dict[str, Any]],
        clean: Callable[[str], bool],
        hash_frame: Callable[[bytes], str],
        on_storage: Callable[[Storage], None] | None = None,
    ) -> Capture:
        """``previous``: the last manifest's frame records by name; ``clean(name)``: unchanged since.

        ``on_storage`` sees each tensor/array buffer as soon as a frame reveals it, so it can be
        written while the remaining variables are pickled.
        """
        result = Capture(describer=Describer(on_storage))
        externals = external_types()
        first_name: dict[int, str] = {}
        for name, value in values.items():
            if _identity_matters(value):
                owner = first_name.setdefault(id(value), name)
                if owner != name:
                    result.aliases[name] = owner
        others = {ident: name for ident, name in first_name.items()}
        containers = frozenset(
            ident for ident, name in others.items() if type(values[name]) in _CONTAINER_TYPES
        )
        pickled: dict[str, tuple[bytes, dict[str, Any], set[str]]] = {}
        reused: dict[str, dict[str, Any]] = {}
        # Buffer-rich values first: their buffers start being written while the rest pickles.
        for name in sorted(values, key=lambda n: not _holds_buffers(values[n])):
            value = values[name]
            if name in result.aliases:
                continue
            result.types[name] = type_name(value)
            record = previous.get(name)
            if record is not None and clean(name) and self._still_valid(record, values):
                reused[name] = record
                self._describe_all(record["arrays"], result, name)
                continue
            try:
                frame = pickle_frame(
                    [name], [value], others, externals, self.keys, containers, self.namespace
                )
                self._describe_all(frame[1], result, name)
                if len(frame[0]) <= TRIAL_LOAD_MAX_BYTES:
                    trial_load(frame[0], values, self.keys)
            except Exception as err:  # any failure skips this variable, with why
                result.skipped[name] = describe_error(err)
                continue
            pickled[name] = frame
        # Variables that depend on a skipped one cannot be rebuilt faithfully: skip them too.
        self._drop_dependents(pickled, reused, result.skipped)
        graph = {name: set(p[2]) for name, p in pickled.items()}
        graph.update({name: set(r["depends"]) for name, r in reused.items()})
        for group in strongly_connected(graph):
            if len(group) == 1:
                name = group[0]
                if name in reused:
                    result.frames.append(self._reuse(name, reused[name]))
                else:
                    data, arrays, depends = pickled[name]
                    result.frames.append(self._new_frame([name], data, arrays, depends, hash_frame))
                continue
            try:
                data, arrays, depends = pickle_frame(
                    group,
                    [values[n] for n in group],
                    others,
                    externals,
                    self.keys,
                    containers,
                    self.namespace,
                )
            except Exception as err:
                for name in group:
                    result.skipped[name] = describe_error(err)
                continue
            result.frames.append(self._new_frame(group, data, arrays, depends, hash_frame))
        # Keep only what the final frames reference (a dropped dependent's arrays go), and
        # the gradients of those tensors.
        referenced = {key for frame in result.frames for key in frame.arrays}
        self._describe_all(referenced, result)
        referenced |= {
            result.objects[key]["grad"] for key in referenced if "grad" in result.objects[key]
        }
        result.describer.link_overlapping()
        result.objects = {k: v for k, v in result.objects.items() if k in referenced}
        for alias, owner in list(result.aliases.items()):
            if owner in result.skipped:
                result.skipped[alias] = f"same object as {owner}, which " + result.skipped[owner]
                del result.aliases[alias]
        return result

    def pickle_extra(self, label: str, value: Any, references: dict[str, Any]) -> bytes:
        """Pickle something beside the variables (the session's settings); an object that is
        one of ``references`` (saved variables) becomes a reference to that variable. Tensors
        in it are pickled inline: it has no place in the checkpoint's buffer table."""
        others = {id(v): name for name, v in references.items() if _identity_matters(v)}
        containers = frozenset(
            i for i, n in others.items() if type(references[n]) in _CONTAINER_TYPES
        )
        data, _arrays, _depends = pickle_frame(
            [label], [value], others, (), self.keys, containers, self.namespace
        )
        return data

    def _still_valid(self, record: dict[str, Any], values: dict[str, Any]) -> bool:
        if len(record["names"]) != 1:  # a cycle group is re-pickled whole, never in parts
            return False
        if any(self.keys.lookup(key) is None for key in record["arrays"]):
            return False
        return all(dep in values for dep in record["depends"])

    def _reuse(self, name: str, record: dict[str, Any]) -> Frame:
        return Frame(
            [name],
            None,
            record["frame"],
            list(record["arrays"]),
            list(record["depends"]),
            record["nbytes"],
        )

    def _new_frame(
        self,
        names: list[str],
        data: bytes,
        arrays: dict[str, Any],
        depends: Iterable[str],
        hash_frame: Callable[[bytes], str],
    ) -> Frame:
        return Frame(names, data, hash_frame(data), sorted(arrays), sorted(depends), len(data))

    def _describe_all(self, keys: Iterable[str], result: Capture, owner: str | None = None) -> None:
        for key in keys:
            if key in result.objects:
                continue
            obj = self.keys.lookup(key)
            record = result.describer.describe(obj)
            if record is None:  # the pickler only hands out keys of savable buffers
                raise RuntimeError(f"a {type(obj).__name__} changed while it was being saved")
            result.objects[key] = record
            if owner is not None and record.get("computed_by"):
                result.detached.setdefault(owner, record["computed_by"])
            grad = leaf_grad(obj)
            if grad is None:
                continue
            if saved_as_buffer(grad):
                record["grad"] = self.keys.key_for(grad)
                self._describe_all([record["grad"]], result)
            else:
                result.warnings.append(
                    f"a {grad.layout} gradient of a {list(obj.shape)} tensor was not saved"
                )

    @staticmethod
    def _drop_dependents(
        pickled: dict[str, tuple[bytes, dict[str, Any], set[str]]],
        reused: dict[str, dict[str, Any]],
        skipped: dict[str, str],
    ) -> None:
        changed = True
        while changed:
            changed = False
            for table, deps_of in ((pickled, lambda p: p[2]), (reused, lambda r: r["depends"])):
                for name in list(table):
                    bad = [d for d in deps_of(table[name]) if d in skipped]
                    if bad:
                        skipped[name] = f"refers to {bad[0]}, which could not be saved"
                        del table[name]
                        changed = True


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


class _TrialResolver:
    """References of a frame loaded on trial resolve to the live objects, the notebook's
    namespace to a scratch dict: a trial load changes nothing and reopens nothing."""

    def __init__(self, values: dict[str, Any], keys: ObjectKeys) -> None:
        self._values = values
        self._keys = keys
        self._scratch: dict[str, Any] = {}

    def resolve(self, kind: str, key: str) -> Any:
        if kind == "a":
            return self._keys.lookup(key)
        if kind == "v":
            return self._values.get(key)
        return self._scratch


def _leave_live_class(cls: type, _state: Any) -> type:
    return cls


class _TrialUnpickler(_FrameUnpickler):
    """In the process that pickled them, cloudpickle rebuilds notebook classes as the live
    class itself and then overwrites its attributes; a trial load must leave them alone."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "cloudpickle.cloudpickle" and name == "_class_setstate":
            return _leave_live_class
        return super().find_class(module, name)


def trial_load(data: bytes, values: dict[str, Any], keys: ObjectKeys) -> None:
    """Unpickle a frame once, to prove it loads; raises what a restore would meet."""
    token = handles.TRIAL.set(True)
    try:
        _TrialUnpickler(io.BytesIO(data), _TrialResolver(values, keys)).load()
    except RecursionError:
        raise pickle.UnpicklingError(
            "it pickles, but loading it back recurses without end"
        ) from None
    except Exception as err:
        raise pickle.UnpicklingError(
            f"it pickles, but loading it back fails ({type(err).__name__}: {err})"
        ) from None
    finally:
        handles.TRIAL.reset(token)


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
    in the order it reads them: each variable's frame, then the storages of its arrays."""
    frames = {name: frame for frame in manifest["frames"] for name in frame["names"]}
    order: dict[str, None] = {}
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
        read_buffer: Callable[[str], memoryview],
        keys: ObjectKeys,
        namespace: dict[str, Any],
        read_to_device: Callable[[str, str], Any] | None = None,
    ) -> None:
        self.manifest = manifest
        self._read_buffer = read_buffer  # digest -> bytes
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
            else:  # a copy of the first one's memory, read and checked already
                view = memoryview(bytearray(self._storage_views[owner]))
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
