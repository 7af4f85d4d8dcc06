"""Saving a checkpoint: choose what changed, pickle it, write its buffers, then its manifest.

``Saving`` is a part of ``Checkpointer`` (its methods use the checkpointer's namespace, store
and settings). The pickling side (``snapshot``, cloudpickle) and the writer are imported by
the first checkpoint only: a kernel that only restores never loads them.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import store as store_mod
from .arrays import content_hash
from .capture import rng_states, select_variables
from .results import CheckpointError, CheckpointResult, ProgressCallback
from .session import SessionContext, SessionReport, capture_session
from .token import process_token

if TYPE_CHECKING:
    from .describing import Storage
    from .writer import CheckpointWriter


class Saving:
    """``checkpoint()`` and what it needs: incremental frames, shrink holds, disk errors."""

    # -- checkpoint ------------------------------------------------------------------------------
    def checkpoint(
        self,
        *,
        full: bool = False,
        reason: str = "manual",
        progress: ProgressCallback | None = None,
    ) -> CheckpointResult:
        """Save now. A failure leaves every earlier checkpoint as it was and raises CheckpointError."""
        if reason in ("pause", "before-cull"):
            # The kernel stops next: a lazy restore's load stops first, cleanly (the maps'
            # files are the checkpoint's own, unchanged, so nothing of it is lost).
            self.stop_lazy_load()
        started = time.perf_counter()
        selection = select_variables(self.namespace, self.hidden, self._marked, self.save_unmarked)
        context = self._session_context(selection.imports)
        try:
            self.store.prepare()
            with self.store.locked():
                result = self._checkpoint_locked(
                    selection.values, selection.skipped, context, full, reason, progress
                )
        except OSError as err:
            raise CheckpointError(self._explain_os_error(err)) from None
        except store_mod.StoreError as err:
            raise CheckpointError(str(err)) from None
        result.seconds = time.perf_counter() - started
        for callback in self.on_checkpoint:
            callback(result)
        return result

    def _session_context(self, imports: list[Any]) -> SessionContext:
        return SessionContext(self.namespace, self.shell, self.baseline, imports)

    def _checkpoint_locked(
        self,
        values: dict[str, Any],
        skipped: dict[str, str],
        context: SessionContext,
        full: bool,
        reason: str,
        progress: ProgressCallback | None,
    ) -> CheckpointResult:
        store = self.store
        torn = store.recover_torn()
        base = self._read_base()
        latest_id = store.latest_id()
        latest = base if latest_id == self._base_id else self._read_quietly(latest_id)
        known = store_mod.known_buffers(store, latest)
        known.update(store_mod.known_buffers(store, base))
        previous = {} if (full or base is None) else self._reusable_frames(base, values, known)
        checkpoint_id = store.next_id()
        intent = store.path / "tmp" / f"{checkpoint_id:06d}-{os.getpid()}.intent"
        store_mod.write_private(intent, json.dumps({"started": time.time()}).encode())
        writer = store.begin(checkpoint_id, known, direct=self.direct_io)
        trusted = (
            self._base_storages
            if previous and self.trust_change_tracking and reason not in _VERIFIED_REASONS
            else {}
        )
        background = _BufferWriter(writer, progress, trusted)
        shrunk: dict[str, Any] | None = None  # set once the manifest is about to be written
        # The writer thread needs the GIL back after every write; the default 5 ms switch
        # interval would idle the disk that long per buffer while the main thread pickles.
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)
        try:
            try:
                capture = self._snapshotter.capture(
                    values,
                    previous,
                    lambda name: name in previous,
                    lambda data: content_hash(memoryview(data)),
                    on_storage=background.submit,
                )
            except BaseException:
                background.finish(None)
                raise
            finally:
                sys.setswitchinterval(switch_interval)
            versions = self._storage_versions(capture)
            fresh = _storages_of_new_frames(capture)

            def changed(storage: Storage) -> bool:
                return (
                    storage.key in fresh
                    or versions.get(storage.key, {}) != trusted[storage.identity][1]
                )

            storages = background.finish(changed)
            for key, (outer, offset) in capture.describer.within.items():
                storages[key] = {
                    "within": {"storage": outer, "offset": offset},
                    "nbytes": capture.describer.storage(key).nbytes,
                    "device": "cpu",
                }
            skipped.update(capture.skipped)
            frames = []
            for frame in capture.frames:
                data = memoryview(frame.data) if frame.data is not None else None
                writer.add(frame.digest, data)
                frames.append(
                    {
                        "names": frame.names,
                        "frame": frame.digest,
                        "arrays": frame.arrays,
                        "depends": frame.depends,
                        "nbytes": frame.nbytes,
                    }
                )
            rng = self._rng_frame()
            writer.add(rng[1], memoryview(rng[0]))
            saved = {name: value for name, value in values.items() if name not in skipped}
            session, session_report = self._session_frames(context, saved)
            for data, digest in session.values():
                writer.add(digest, memoryview(data))
            if progress:
                progress("syncing", writer.stats.bytes_written, writer.stats.bytes_written)
            names = sorted([n for f in capture.frames for n in f.names] + list(capture.aliases))
            shrunk = self._hold_if_shrunk(latest_id, latest, checkpoint_id, names)
            manifest = {
                "format": store_mod.MANIFEST_FORMAT,
                "id": checkpoint_id,
                "created": time.time(),
                "notebook": self.key,
                "reason": reason,
                "process_token": process_token(),
                "pid": os.getpid(),
                "environment": _environment(capture.types, [imp.module for imp in context.imports]),
                "marked": self.marked(),
                # the order a lazy restore loads in: the most recently used first
                "recent": self.tracker.recent_first(names) if self.tracker else [],
                "frames": frames,
                "aliases": capture.aliases,
                "types": capture.types,
                "objects": capture.objects,
                "storages": storages,
                "rng": rng[1],
                "session": {phase: digest for phase, (_data, digest) in session.items()},
                "skipped": skipped,
                "detached": {n: f for n, f in capture.detached.items() if n not in skipped},
            }
            if shrunk is not None:
                manifest["shrunk_from"] = shrunk
            writer.commit(manifest)
        except BaseException:
            writer.abort()
            intent.unlink(missing_ok=True)
            if shrunk is not None and self._holds_shrink(shrunk["id"], checkpoint_id):
                store.release_retention(shrunk["id"])
            raise
        intent.unlink(missing_ok=True)
        self._release_recovered_holds(names)
        retired = store._retention_locked(self.keep_last, self.max_age_hours * 3600, self.max_bytes)
        store._collect_locked()
        self._remember_base(checkpoint_id, values)
        self._base_storages = {
            storage.identity: (storages[storage.key]["buffer"], versions.get(storage.key, {}))
            for storage in capture.describer.storages.values()
            if "buffer" in storages.get(storage.key, {})
        }
        total = sum(loc.nbytes for loc in writer.used.values())
        warnings = list(capture.warnings)
        if shrunk is not None:
            warnings.append(self._shrink_warning(checkpoint_id, shrunk, latest))
        return CheckpointResult(
            checkpoint_id=checkpoint_id,
            notebook=self.key,
            created=manifest["created"],
            saved=names,
            skipped=skipped,
            bytes_written=writer.stats.bytes_written,
            bytes_reused=writer.stats.bytes_reused,
            bytes_total=total,
            seconds=0.0,
            reason=reason,
            torn=[t.checkpoint_id for t in torn],
            retired=retired,
            session=session_report.to_json(),
            warnings=warnings,
            detached=manifest["detached"],
        )

    def _hold_if_shrunk(
        self,
        previous_id: int | None,
        previous: dict[str, Any] | None,
        checkpoint_id: int,
        names: list[str],
    ) -> dict[str, Any] | None:
        """When the new checkpoint lacks most variables of the one before, keep that one (and
        every other) until the user accepts; the mark for the new manifest, or None.

        Held before the new checkpoint commits: a kernel that dies in between leaves the older
        one held (nothing lost), never a shrunk newest checkpoint with nothing held.
        """
        if previous_id is None or previous is None:
            return None
        missing = store_mod.shrinks(store_mod.manifest_variables(previous), names)
        if not missing:
            return None
        hold = self.store.retention_hold() or {"checkpoints": {}}
        if str(previous_id) not in hold["checkpoints"]:  # a hold it has already keeps it
            why = f"not in checkpoint {checkpoint_id}, which lacks most variables of this one"
            self.store.hold_retention(previous_id, dict.fromkeys(missing, why), newer=checkpoint_id)
        return {"id": previous_id, "missing": missing}

    def _shrink_warning(
        self, checkpoint_id: int, shrunk: dict[str, Any], previous: dict[str, Any] | None
    ) -> str:
        had = len(store_mod.manifest_variables(previous)) if previous else len(shrunk["missing"])
        missing = shrunk["missing"]
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        return (
            f"checkpoint {checkpoint_id} lacks {len(missing)} of the {had} variables of "
            f"checkpoint {shrunk['id']} ({shown}). If this kernel was started without the "
            f"notebook's state, `%checkpoint restore {shrunk['id']}` brings it back; checkpoint "
            f"{shrunk['id']} and every older one are kept until you accept (Accept in "
            f"JupyterLab, or `jupyter pause accept {os.path.basename(self.key)}`)."
        )

    def _holds_shrink(self, held_id: int, newer: int) -> bool:
        """Whether ``held_id`` is held because ``newer`` shrank (and for nothing else)."""
        entry = (self.store.retention_hold() or {}).get("checkpoints", {}).get(str(held_id))
        return bool(entry) and entry.get("kind") == "shrunk" and entry.get("newer") == newer

    def _release_recovered_holds(self, names: list[str]) -> None:
        """A checkpoint that holds again every variable a shrink left out ends that hold."""
        hold = self.store.retention_hold()
        if not hold or "unreadable" in hold:
            return
        present = set(names)
        for held_id, entry in list(hold["checkpoints"].items()):
            if entry.get("kind") == "shrunk" and set(entry.get("failed") or {}) <= present:
                self.store.release_retention(int(held_id))

    def _storage_versions(self, capture: Any) -> dict[str, dict[str, int | None]]:
        """Storage key -> version counter of every tensor viewing it (None: not tracked).

        PyTorch bumps a tensor's counter on every in-place change, through any code path
        except writes through ``tensor.data`` or memory shared outside PyTorch; those are
        covered by the cell analysis (a cell that does them mentions the variable).
        """
        versions: dict[str, dict[str, int | None]] = {}
        for key, record in capture.objects.items():
            if record["kind"] != "torch":
                continue
            tensor = self.keys.lookup(key)
            try:
                version = tensor._version
            except (AttributeError, RuntimeError):  # inference tensors keep no counter
                version = None
            versions.setdefault(record["storage"], {})[key] = version
        return versions

    def _session_frames(
        self, context: SessionContext, values: dict[str, Any]
    ) -> tuple[dict[str, tuple[bytes, str]], SessionReport]:
        """The session settings, pickled: those applied before the variables (they may not
        refer to any) and those applied after (a magic is a notebook function, a variable)."""

        def pickled(states: dict[str, Any], references: dict[str, Any]) -> bytes:
            return self._snapshotter.pickle_extra("__session__", states, references)

        from . import session_settings  # noqa: F401  (the built-in settings register on import)

        before, after, report = capture_session(context, lambda state: pickled(state, {}))
        frames = {}
        for phase, states, references in (("before", before, {}), ("after", after, values)):
            if states:
                data = pickled(states, references)
                frames[phase] = (data, content_hash(memoryview(data)))
        return frames, report

    def _rng_frame(self) -> tuple[bytes, str]:
        data = self._snapshotter.pickle_extra("__rng__", rng_states(), {})
        return data, content_hash(memoryview(data))

    def _reusable_frames(
        self, base: dict[str, Any], values: dict[str, Any], known: dict[str, Any]
    ) -> dict[str, dict[str, Any]]:
        """Frames of the base checkpoint whose variables provably did not change since."""
        tracker = self.tracker
        if tracker is None:
            return {}
        records = {}
        for frame in base["frames"]:
            if len(frame["names"]) == 1 and frame["frame"] in known:
                records[frame["names"][0]] = frame

        def unchanged(name: str) -> bool:
            return (
                name in values
                and self._base_ids.get(name) == id(values[name])
                and not tracker.maybe_changed(name)
            )

        clean = {name for name in records if unchanged(name)}
        # A changed variable may have changed what it references; a frame referencing a
        # changed variable must be re-pickled (its reference may now be stale).
        changed = True
        while changed:
            changed = False
            for name, record in records.items():
                if name in clean and not all(dep in clean for dep in record["depends"]):
                    clean.discard(name)
                    changed = True
                if name not in clean:
                    for dep in record["depends"]:
                        if dep in clean:
                            clean.discard(dep)
                            changed = True
        return {name: records[name] for name in clean}

    def _remember_base(self, checkpoint_id: int, values: dict[str, Any]) -> None:
        self._base_id = checkpoint_id
        self._base_ids = {name: id(value) for name, value in values.items()}
        if self.tracker is not None:
            self.tracker.reset()

    def _read_base(self) -> dict[str, Any] | None:
        return self._read_quietly(self._base_id)

    def _read_quietly(self, checkpoint_id: int | None) -> dict[str, Any] | None:
        if checkpoint_id is None:
            return None
        try:
            return self.store.read_manifest(checkpoint_id)
        except store_mod.CheckpointNotFound:
            return None

    def _explain_os_error(self, err: OSError) -> str:
        latest = self._read_quietly(self.store.latest_id()) if self.store.exists() else None
        intact = (
            f" Checkpoint {latest['id']} from {time.strftime('%H:%M', time.localtime(latest['created']))}"
            " is intact."
            if latest
            else ""
        )
        where = err.filename or self.store.path
        if err.errno == errno.ENOSPC:
            return f"Checkpoint not saved: no space left on the device holding {where}.{intact}"
        if err.errno == errno.EDQUOT:
            return f"Checkpoint not saved: disk quota exceeded for {where}.{intact}"
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return f"Checkpoint not saved: no permission to write {where} ({err.strerror}).{intact}"
        return f"Checkpoint not saved: {err.strerror or err} ({where}).{intact}"


# Checkpoints that must hold exactly what is in memory: every buffer is re-hashed for them.
_VERIFIED_REASONS = frozenset({"pause", "before-cull"})


def _storages_of_new_frames(capture: Any) -> set[str]:
    """Storages that re-pickled variables reference: what those variables hold may be new."""
    return {
        capture.objects[key]["storage"]
        for frame in capture.frames
        if frame.data is not None
        for key in frame.arrays
    }


class _BufferWriter:
    """Hashes and writes tensor/array buffers on a thread while the main thread pickles.

    ``os.write`` releases the GIL, so with two cores the pickling of the remaining variables
    costs (almost) nothing on top of the disk time. Buffers in ``trusted`` (those of the last
    checkpoint, by identity) wait until the caller knows whether anything may have changed
    them: then they are re-hashed, or keep their hash without reading 700 MB again.
    """

    def __init__(
        self,
        writer: CheckpointWriter,
        progress: ProgressCallback | None,
        trusted: dict[tuple[str, int, int], tuple[str, dict[str, int | None]]],
    ):
        self.writer = writer
        self.progress = progress
        self.storages: dict[str, dict[str, Any]] = {}
        self._trusted = trusted
        self._deferred: list[Storage] = []
        self._queue: queue.SimpleQueue[tuple[Storage, str | None] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._submitted = 0
        self._done = 0
        self._thread = threading.Thread(target=self._run, name="jupyter-pause-writer", daemon=True)
        self._thread.start()

    def submit(self, storage: Storage) -> None:
        self._submitted += storage.nbytes
        if storage.identity in self._trusted:
            self._deferred.append(storage)
        else:
            self._queue.put((storage, None))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            storage, digest = item
            if self._error is not None:
                continue  # drain: the checkpoint is being abandoned
            try:
                if digest is not None and self.writer.holds(digest):
                    self.writer.add(digest, None)  # trusted and stored: not even fetched
                else:
                    digest = content_hash(storage.data)
                    self.writer.add(digest, storage.data)
            except BaseException as err:  # handed to the main thread by finish()
                self._error = err
                continue
            self.storages[storage.key] = {
                "buffer": digest,
                "nbytes": storage.nbytes,
                "device": storage.device,
            }
            self._done += storage.nbytes
            if self.progress:
                self.progress("writing", self._done, self._submitted)

    def finish(self, changed: Callable[[Storage], bool] | None) -> dict[str, dict[str, Any]]:
        """Settle the deferred buffers, wait for every buffer, re-raise a write error here.

        ``changed(storage)`` says whether a trusted buffer must be re-hashed; None abandons
        the checkpoint (nothing deferred is written).
        """
        for storage in self._deferred if changed is not None else ():
            trusted_digest = None if changed(storage) else self._trusted[storage.identity][0]
            self._queue.put((storage, trusted_digest))
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.storages


def _environment(types: dict[str, str], imported: list[str]) -> dict[str, Any]:
    """Where the saved objects come from, for a restore elsewhere to compare: Python, the
    platform, the version of each package their types and the notebook's imports come from,
    torch's CUDA build and the GPU it used (read only if CUDA is already initialised)."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "host": platform.node(),
        "platform": f"{platform.system()} {platform.machine()}",
    }
    for module in ("torch", "numpy", "pandas"):
        if module in sys.modules:
            env[module] = getattr(sys.modules[module], "__version__", "?")
    qualified = [name for name in types.values() if "." in name]  # "C": a notebook class
    tops = {name.split(".")[0] for name in [*qualified, *imported] if name}
    packages = {}
    for top in sorted(tops - set(sys.stdlib_module_names) - {"builtins", "__main__"}):
        version = getattr(sys.modules.get(top), "__version__", None)
        if isinstance(version, str):
            packages[top] = version
    env["packages"] = packages
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        env["torch_cuda"] = getattr(torch.version, "cuda", None)
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized() and cuda.device_count():
            env["gpu"] = cuda.get_device_name(0)
    return env
