"""Fingerprints of a notebook's variables, computed inside the kernel after its last cell.

The harness loads this file into a kernel by path (it imports nothing but the standard
library, and numpy/torch/pandas/matplotlib only when the notebook already did), so the
fingerprints of a resumed run can be compared with those of an uninterrupted one.

A fingerprint covers what a later cell could observe: array and tensor bytes (gradients
included), types, file positions, whether a notebook function still sees the notebook's own
globals, and how objects are shared inside the namespace (an optimizer holding the model's
own parameters, two top-level arrays over the same memory). A look-alike copy does not pass.
Values with no stable fingerprint are reported as ``?reason``: only their presence counts.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import types
from typing import Any

#: The pseudo-variable that records which top-level arrays and tensors share memory.
SHARED_MEMORY = "(shared memory)"

_MAX_NODES = 200_000
_MAX_DEPTH = 60
_ATOMS = (type(None), bool, int, float, complex, str, bytes)


class Undigestable(Exception):
    """This value has no fingerprint that another process could reproduce."""


def namespace_digests(namespace: dict[str, Any], hidden: dict[str, Any]) -> dict[str, str]:
    """name -> fingerprint for every user variable, plus the shared-memory groups."""
    # IPython's own entries (In, Out, get_ipython, ...) are left out even when a restore
    # replaced them with copies (dill brings back its own `open`): they are not the notebook's.
    names = sorted(name for name in namespace if not name.startswith("_") and name not in hidden)
    digester = _Digester(namespace)
    digests = {}
    for name in names:
        value = namespace[name]
        try:
            digests[name] = digester.digest(name, value)
        except Undigestable as err:
            digests[name] = f"?{err}"
        except RecursionError:
            digests[name] = "?nested too deeply"
        except Exception as err:  # one odd value must not stop the run: it is not compared
            digests[name] = f"?{type(value).__name__}: {type(err).__name__}"
    digests[SHARED_MEMORY] = repr(_shared_memory_groups({n: namespace[n] for n in names}))
    return digests


class _Digester:
    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        # Objects seen so far: id -> (variable, visit index within that variable), kept alive
        # so that no id is reused while the namespace is walked. A second sighting is fed as
        # that reference, not as content: sharing between variables is part of the value,
        # and a missing variable does not shift the references of the others.
        self.seen: dict[int, tuple[str, int]] = {}
        self.alive: list[Any] = []
        self.variable = ""
        self.visits = 0
        self.nodes = 0

    def digest(self, name: str, value: Any) -> str:
        hasher = hashlib.blake2b(digest_size=12)
        self.variable, self.visits, self.nodes = name, 0, 0
        self._feed(hasher, value, 0)
        return f"{type(value).__name__}:{hasher.hexdigest()}"

    # -- dispatch --------------------------------------------------------------------------------
    def _feed(self, h: Any, value: Any, depth: int) -> None:
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise Undigestable(f"more than {_MAX_NODES} objects")
        if depth > _MAX_DEPTH:
            raise Undigestable("nested too deeply")
        kind = type(value)
        if kind in _ATOMS:
            _put(h, kind.__name__, repr(value))
            return
        if isinstance(value, types.ModuleType):
            _put(h, "module", value.__name__)
            return
        if isinstance(value, type):
            _put(h, "class", value.__module__, value.__qualname__)
            return
        if kind is tuple:
            _put(h, "tuple", str(len(value)))
            for item in value:
                self._feed(h, item, depth + 1)
            return
        if kind is frozenset:
            self._feed_set(h, value, depth)
            return
        # numpy arrays by content only: libraries copy or view them at will (a restored array
        # that views a buffer makes sklearn copy it), so which object holds them is no part
        # of the notebook's state. Overlapping top-level arrays are checked by memory instead.
        if self._feed_numpy(h, value, depth):
            return
        if self._seen_before(h, value):
            return
        for feeder in (
            self._feed_library_value,
            self._feed_builtin_container,
            self._feed_callable,
            self._feed_file,
        ):
            if feeder(h, value, depth):
                return
        self._feed_reduced(h, value, depth)

    def _seen_before(self, h: Any, value: Any) -> bool:
        first = self.seen.get(id(value))
        if first is not None:
            _put(h, "ref", first[0], str(first[1]))
            return True
        self.seen[id(value)] = (self.variable, self.visits)
        self.visits += 1
        self.alive.append(value)
        return False

    # -- libraries -------------------------------------------------------------------------------
    def _feed_numpy(self, h: Any, value: Any, depth: int) -> bool:
        numpy = sys.modules.get("numpy")
        if numpy is None:
            return False
        if isinstance(value, numpy.ndarray):
            self._feed_ndarray(h, value, depth)
            return True
        if isinstance(value, numpy.generic):
            _put(h, "numpy scalar", value.dtype.str, value.tobytes().hex())
            return True
        return False

    def _feed_library_value(self, h: Any, value: Any, depth: int) -> bool:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            self._feed_tensor(h, value, depth)
            return True
        pandas = sys.modules.get("pandas")
        if pandas is not None and isinstance(
            value, pandas.DataFrame | pandas.Series | pandas.Index
        ):
            self._feed_pandas(h, value, pandas)
            return True
        jax = sys.modules.get("jax")
        if jax is not None and isinstance(value, jax.Array):
            self._feed_jax_array(h, value, jax)
            return True
        matplotlib = sys.modules.get("matplotlib")
        artist = getattr(matplotlib, "artist", None)
        if artist is not None and isinstance(value, artist.Artist):
            self._feed_artist(h, value, depth)
            return True
        return False

    def _feed_jax_array(self, h: Any, array: Any, jax: Any) -> None:
        """By content, as numpy arrays: what its pickle reduces to names this process's device
        and sharding objects. PRNG keys (``jax.random.key``) by their key data."""
        if isinstance(array, jax.core.Tracer):  # leaked from a trace: no value, its type only
            _put(h, "jax tracer", type(array).__name__, str(array.aval))
            return
        if jax.dtypes.issubdtype(array.dtype, jax.dtypes.prng_key):
            _put(h, "jax key", str(array.dtype))
            array = jax.random.key_data(array)
        host = sys.modules["numpy"].asarray(array)
        _put(h, "jax array", host.dtype.str, repr(host.shape))
        h.update(host.tobytes())

    def _feed_ndarray(self, h: Any, array: Any, depth: int) -> None:
        _put(h, "ndarray", array.dtype.str, repr(array.shape), str(array.flags.writeable))
        if array.dtype.hasobject:
            for item in array.flat:
                self._feed(h, item, depth + 1)
        else:
            import numpy

            h.update(numpy.ascontiguousarray(array).tobytes())

    def _feed_tensor(self, h: Any, tensor: Any, depth: int) -> None:
        import torch

        _put(
            h,
            type(tensor).__name__,
            str(tensor.dtype),
            repr(tuple(tensor.shape)),
            str(tensor.layout),
            tensor.device.type,
            str(tensor.requires_grad),
        )
        data = tensor.detach()
        if data.is_quantized:
            _put(h, "quantized", str(data.qscheme()))
            data = data.int_repr()
        if data.layout != torch.strided:
            data = data.to_dense()
        if data.device.type != "meta":
            data = data.resolve_conj().resolve_neg().cpu().contiguous()
            h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        # .grad only exists on leaves; reading it on anything else warns.
        grad = tensor.grad if tensor.is_leaf else None
        if grad is not None:
            _put(h, "grad")
            self._feed(h, grad, depth + 1)

    def _feed_pandas(self, h: Any, value: Any, pandas: Any) -> None:
        _put(h, type(value).__name__, repr(value.shape))
        if isinstance(value, pandas.DataFrame):
            _put(h, repr(list(value.columns)), repr([str(t) for t in value.dtypes]))
        elif isinstance(value, pandas.Series):
            _put(h, repr(value.name), str(value.dtype))
        index = value if isinstance(value, pandas.Index) else value.index
        _put(h, repr(index.names), str(index.dtype))
        try:
            hashes = pandas.util.hash_pandas_object(
                value, index=not isinstance(value, pandas.Index)
            )
        except TypeError as err:  # unhashable cells (lists, dicts)
            _put(h, repr(value.to_dict() if hasattr(value, "to_dict") else list(value)))
            _put(h, str(err))
            return
        h.update(hashes.to_numpy().tobytes())

    def _feed_artist(self, h: Any, artist: Any, depth: int) -> None:
        """Figures by what they show: a pickled figure is never drawn, so its internals differ."""
        _put(h, "artist", type(artist).__name__, str(artist.get_visible()), str(artist.get_label()))
        if hasattr(artist, "get_size_inches"):  # Figure
            _put(h, repr(tuple(artist.get_size_inches())), repr(artist.dpi))
            for axes in artist.get_axes():
                self._feed(h, axes, depth + 1)
        if hasattr(artist, "get_xlim") and hasattr(artist, "get_lines"):  # Axes
            _put(h, artist.get_title(), artist.get_xlabel(), artist.get_ylabel())
            _put(h, repr(artist.get_xlim()), repr(artist.get_ylim()))
            _put(h, artist.get_xscale(), artist.get_yscale())
            for child in [*artist.lines, *artist.images, *artist.collections, *artist.patches]:
                self._feed(h, child, depth + 1)
        if hasattr(artist, "get_xydata"):  # Line2D
            _put(h, repr(artist.get_linewidth()), repr(artist.get_color()), artist.get_linestyle())
            self._feed(h, artist.get_xydata(), depth + 1)
        if hasattr(artist, "get_array") and hasattr(artist, "get_cmap"):  # images, collections
            self._feed(h, artist.get_array(), depth + 1)
        if hasattr(artist, "get_offsets"):  # scatter points
            self._feed(h, artist.get_offsets(), depth + 1)

    # -- Python's own types ----------------------------------------------------------------------
    def _feed_builtin_container(self, h: Any, value: Any, depth: int) -> bool:
        if isinstance(value, list):
            _put(h, type(value).__qualname__, str(len(value)))
            for item in value:
                self._feed(h, item, depth + 1)
            return True
        if isinstance(value, dict):
            _put(h, type(value).__qualname__, str(len(value)))
            factory = getattr(value, "default_factory", None)
            if factory is not None:
                self._feed(h, factory, depth + 1)
            for key, item in value.items():
                self._feed(h, key, depth + 1)
                self._feed(h, item, depth + 1)
            return True
        if isinstance(value, set):
            self._feed_set(h, value, depth)
            return True
        return False

    def _feed_set(self, h: Any, value: Any, depth: int) -> None:
        # Iteration order of a set is not part of its value: fingerprint members, sorted.
        members = []
        for item in value:
            sub = hashlib.blake2b(digest_size=12)
            self._feed(sub, item, depth + 1)
            members.append(sub.hexdigest())
        _put(h, type(value).__qualname__, *sorted(members))

    def _feed_callable(self, h: Any, value: Any, depth: int) -> bool:
        if isinstance(value, types.FunctionType):
            _put(h, "function", value.__module__ or "", value.__qualname__)
            if value.__module__ != "__main__":
                return True  # a library function travels by reference
            # A notebook function must run against the live notebook namespace.
            _put(h, "live globals" if value.__globals__ is self.namespace else "own globals")
            self._feed_code(h, value.__code__, depth)
            self._feed(h, value.__defaults__, depth + 1)
            self._feed(h, value.__kwdefaults__, depth + 1)
            for cell in value.__closure__ or ():
                try:
                    contents = cell.cell_contents
                except ValueError:
                    _put(h, "empty cell")
                else:
                    self._feed(h, contents, depth + 1)
            return True
        if isinstance(value, types.MethodType):
            _put(h, "method")
            self._feed(h, value.__func__, depth + 1)
            self._feed(h, value.__self__, depth + 1)
            return True
        if isinstance(value, types.BuiltinFunctionType | types.BuiltinMethodType):
            _put(h, "builtin", getattr(value, "__module__", None) or "", value.__qualname__)
            owner = getattr(value, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                self._feed(h, owner, depth + 1)
            return True
        if isinstance(value, types.CodeType):
            self._feed_code(h, value, depth)
            return True
        return False

    def _feed_code(self, h: Any, code: types.CodeType, depth: int) -> None:
        # Not co_filename: a cell's file name carries the kernel's process id.
        _put(h, "code", code.co_code.hex(), repr(code.co_names), repr(code.co_varnames))
        _put(h, repr(code.co_freevars), repr(code.co_cellvars))
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._feed_code(h, const, depth + 1)
            else:
                self._feed(h, const, depth + 1)

    def _feed_file(self, h: Any, value: Any, depth: int) -> bool:
        if not isinstance(value, io.IOBase):
            return False
        name = getattr(value, "name", None)
        if isinstance(name, str):  # the same file, whether reopened by a relative path or not
            name = os.path.abspath(name)
        _put(h, "file", type(value).__name__, repr(name))
        _put(h, repr(getattr(value, "mode", None)), str(value.closed))
        if not value.closed and value.seekable():
            _put(h, str(value.tell()))
        return True

    def _feed_reduced(self, h: Any, value: Any, depth: int) -> None:
        """Anything else by the state pickle would save, walked with the rules above."""
        try:
            reduced = value.__reduce_ex__(4)
        except Exception as err:
            text = repr(value)
            if " at 0x" in text:
                raise Undigestable(f"{type(value).__name__}: {err}") from None
            _put(h, "repr", text)
            return
        if isinstance(reduced, str):  # a global, pickled by name
            _put(h, "global", type(value).__module__, reduced)
            return
        _put(h, "reduced", type(value).__module__, type(value).__qualname__)
        constructor, args, *rest = reduced
        self._feed(h, constructor, depth + 1)
        self._feed(h, args, depth + 1)
        state = rest[0] if rest else None
        self._feed(h, state, depth + 1)
        for items in rest[1:3]:
            if items is not None:
                self._feed(h, list(items), depth + 1)


def _put(h: Any, *parts: str) -> None:
    for part in parts:
        h.update(part.encode("utf-8", "backslashreplace"))
        h.update(b"\x00")


def _shared_memory_groups(values: dict[str, Any]) -> list[list[str]]:
    """Top-level arrays and tensors whose bytes overlap, as sorted groups of names."""
    spans = [(span, name) for name, value in values.items() if (span := _byte_span(value))]
    groups: list[list[str]] = []
    end = -1
    for (start, stop), name in sorted(spans):
        if groups and start < end:
            groups[-1].append(name)
            end = max(end, stop)
        else:
            groups.append([name])
            end = stop
    return sorted(sorted(group) for group in groups if len(group) > 1)


def _byte_span(value: Any) -> tuple[int, int] | None:
    """[first byte, last byte + 1) of an array's or CPU tensor's elements; None if empty/other."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray) and value.size:
        start = value.__array_interface__["data"][0]
        return _strided_span(start, value.shape, value.strides, value.itemsize)
    torch = sys.modules.get("torch")
    if (
        torch is not None
        and isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and value.numel()
    ):
        size = value.element_size()
        strides = [s * size for s in value.stride()]
        return _strided_span(value.data_ptr(), tuple(value.shape), strides, size)
    return None


def _strided_span(start: int, shape: Any, strides: Any, itemsize: int) -> tuple[int, int]:
    low = start + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    high = start + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0)
    return low, high + itemsize
