"""Restoring a checkpoint: map its files, check every buffer, rebuild the variables in order,
and put the session (imports, settings, random states) back around them.

``Restoring`` is a part of ``Checkpointer`` (its methods use the checkpointer's namespace,
store and settings).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from . import imported
from . import store as store_mod
from .arrays import content_hasher
from .capture import set_rng_states
from .environment_diff import differences
from .lazy import LAZY_AT_LEAST, LazyLoad, LoadOutcome, MappedBuffer
from .loading import BufferSource, buffer_source
from .reading import OWN_MEMORY_AT_LEAST
from .results import CheckpointError, RestoreResult
from .session import SessionReport, apply_session
from .state import RestoreError, StateLoader, buffers_in_load_order, load_order, streamed_buffers
from .token import process_token


class Restoring:
    """``restore()`` and the steps of it."""

    # -- restore ---------------------------------------------------------------------------------
    def restore(
        self,
        checkpoint_id: int | None = None,
        names: list[str] | None = None,
        *,
        announce: bool = True,
    ) -> RestoreResult:
        """Load a checkpoint (the latest by default) into the namespace, all or some variables.

        ``announce``: tell ``on_restore`` (the server follows restores the notebook makes; its
        own requests pass False).
        """
        self.stop_lazy_load()  # a new restore replaces what the last one still loads
        result = self._restore(checkpoint_id, names)
        if announce:
            for callback in self.on_restore:
                callback(result)
        return result

    def _restore(self, checkpoint_id: int | None, names: list[str] | None) -> RestoreResult:
        started = time.perf_counter()
        # Unpickling many small containers (100k dicts) would run the cyclic collector hundreds
        # of times, each pass walking the notebook's whole heap: 0.28 s -> 0.05 s without it.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with self.store.locked():  # no collection may unlink files while we map them
                return self._restore_locked(checkpoint_id, names, started)
        except store_mod.StoreError as err:
            raise CheckpointError(str(err)) from None
        except OSError as err:
            raise CheckpointError(
                f"Restore failed: {err.strerror or err} ({err.filename})."
            ) from None
        finally:
            if collecting:
                gc.enable()

    def _restore_locked(
        self, checkpoint_id: int | None, names: list[str] | None, started: float
    ) -> RestoreResult:
        store = self.store
        imported.require_trusted(store)  # unpickling runs code: never from an untrusted import
        if checkpoint_id is None:
            checkpoint_id = store.latest_id()
            if checkpoint_id is None:
                raise CheckpointError(
                    f"No checkpoint yet for {self.key}: run %checkpoint to save one."
                )
        manifest = store.read_manifest(checkpoint_id)
        # Large buffers bound for a CUDA device stream there; a whole restore queues every
        # other buffer now, in the order loading needs them. A partial one reads what it needs.
        streamed = streamed_buffers(manifest, OWN_MEMORY_AT_LEAST)
        needed = (
            buffers_in_load_order(
                manifest, load_order(manifest, store_mod.manifest_variables(manifest))
            )
            if names is None
            else []
        )
        lazy = lazy_buffers(manifest, streamed) if self.lazy_restore else set()
        try:
            with buffer_source(
                store, manifest, [d for d in needed if d not in streamed and d not in lazy]
            ) as source:
                return self._load_variables(
                    manifest, checkpoint_id, names, started, source, streamed, lazy
                )
        finally:
            store.release_maps()

    def _load_variables(
        self,
        manifest: dict[str, Any],
        checkpoint_id: int,
        names: list[str] | None,
        started: float,
        source: BufferSource,
        streamed: set[str],
        lazy: set[str],
    ) -> RestoreResult:
        verified: set[str] = set()
        bytes_read = 0
        handed_out: list[MappedBuffer] = []  # lazy buffers handed out, in that order
        mapped: dict[str, MappedBuffer] = {}  # those of them that are no copy, by digest
        loading = ""  # the variable being loaded: who a mapped buffer's users are

        def location_of(digest: str) -> dict[str, Any]:
            location = manifest["buffers"].get(digest)
            if location is None:
                raise store_mod.StoreError(f"checkpoint {checkpoint_id} lacks buffer {digest}")
            return location

        def read_buffer(digest: str, copy_of: memoryview | None = None) -> memoryview:
            """A buffer's bytes; with ``copy_of`` (the bytes of an equal storage restored
            already), in memory of their own."""
            nonlocal bytes_read
            location = location_of(digest)
            if digest in lazy:  # its map, now; its bytes come in and are checked after ready
                # A copy is a map of its own (private pages of the same file), loaded, checked
                # and taken back on its own.
                handed = mapped.get(digest) if copy_of is None else None
                if handed is None:
                    handed = MappedBuffer(
                        digest,
                        source.map_now(digest, own=copy_of is not None),
                        self.store.open_buffer_as_written(location),
                        location["file"],
                    )
                    handed_out.append(handed)
                    if copy_of is None:
                        mapped[digest] = handed
                handed.users.add(loading)
                return handed.view
            if copy_of is not None:  # read and checked already, as that storage's
                return memoryview(bytearray(copy_of))
            # Hashed piece by piece while the rest of the buffer is still being read.
            check = content_hasher() if self.verify and digest not in verified else None
            data = source.get(digest, None if check is None else check.update)
            if digest not in verified:
                if check is not None and check.hexdigest() != digest:
                    raise store_mod.StoreError(
                        f"data in {location['file']} does not match its hash: the file is damaged"
                    )
                verified.add(digest)
                bytes_read += data.nbytes
            return data

        def read_to_device(digest: str, device: str) -> Any:
            nonlocal bytes_read
            if digest not in streamed:
                return None
            storage = source.to_device(digest, device, self.verify)  # checks the hash itself
            if storage is not None and digest not in verified:
                verified.add(digest)
                bytes_read += location_of(digest)["nbytes"]
            return storage

        loader = StateLoader(manifest, read_buffer, self.keys, self.namespace, read_to_device)
        available = store_mod.manifest_variables(manifest)
        # Plain objects first: they unpickle on the CPU while the prefetched buffers stream in.
        wanted = load_order(manifest, names or available)
        restored: list[str] = []
        failed: dict[str, str] = {}
        values: dict[str, Any] = {}
        # A whole restore brings the session back too: where the code runs and what it
        # imported first (the variables may need both to unpickle), settings that refer to
        # variables last. A partial restore adds variables to a session that is running.
        session = SessionReport()
        if names is None:
            session.merge(self._apply_session(loader, manifest, "before"))
        for name in wanted:
            if name not in available:
                why = manifest["skipped"].get(name)
                failed[name] = (
                    f"was not saved in checkpoint {checkpoint_id}: {why}"
                    if why
                    else f"not in checkpoint {checkpoint_id} (it has: {', '.join(available)})"
                )
                continue
            loading = name
            try:
                values[name] = loader.variable(name)
            except RestoreError as err:
                failed[name] = str(err)
            except store_mod.StoreError as err:
                failed[name] = str(err)
        same_process = manifest["process_token"] == process_token()
        replaced = (
            []
            if same_process
            else sorted(n for n in values if n in self.namespace and n not in self.hidden)
        )
        self.namespace.update(values)
        restored = sorted(values)
        if names is None:
            session.merge(self._apply_session(loader, manifest, "after"))
        rng: list[str] = []
        if names is None:
            self._marked = list(manifest.get("marked", []))
            try:
                rng = set_rng_states(_unpickle_plain(read_buffer(manifest["rng"])))
            except Exception as err:  # an RNG state is never worth failing a restore for
                loader.rebuilder.warnings.append(f"random generator states not restored: {err}")
        if names is None and not failed:
            self._remember_base(checkpoint_id, values)
        recent = [n for n in manifest.get("recent", []) if isinstance(n, str)]
        if names is None and self.tracker is not None:
            self.tracker.carry_order(recent)
        loading_bytes = self._start_lazy_load(
            _recent_first(handed_out, recent), values, checkpoint_id
        )
        not_saved = {} if names else dict(manifest["skipped"])
        if not same_process:  # made elsewhere, or before an upgrade: say what differs
            loader.rebuilder.warnings.extend(
                f"made elsewhere: {difference}"
                for difference in differences(manifest.get("environment") or {})
            )
        return RestoreResult(
            checkpoint_id=checkpoint_id,
            notebook=self.key,
            restored=restored,
            failed=failed,
            not_saved=not_saved,
            warnings=loader.rebuilder.warnings,
            rng=rng,
            seconds=time.perf_counter() - started,
            bytes_read=bytes_read,
            saved_by_token=manifest["process_token"],
            same_process=same_process,
            session=session.to_json(),
            detached={n: f for n, f in manifest.get("detached", {}).items() if n in values},
            replaced=replaced,
            not_asked=sorted(set(available) - set(names)) if names else [],
            loading_bytes=loading_bytes,
        )

    # -- lazy restore ----------------------------------------------------------------------------
    def _start_lazy_load(
        self, buffers: list[MappedBuffer], values: dict[str, Any], checkpoint_id: int
    ) -> int:
        """Load the mapped buffers behind the notebook; the bytes still to come."""
        if not buffers:
            return 0
        users = {name for buffer in buffers for name in buffer.users}
        load = LazyLoad(
            buffers,
            self.namespace,
            {name: values[name] for name in users if name in values},
            verify=self.verify,
            on_progress=lambda done, total: self._lazy_progress(checkpoint_id, done, total),
            on_end=lambda outcome: self._lazy_end(checkpoint_id, outcome),
        )
        self.lazy_load = load
        load.start()
        return load.total

    def _lazy_progress(self, checkpoint_id: int, done: int, total: int) -> None:
        for callback in self.on_loading:
            callback(checkpoint_id, done, total)

    def _lazy_end(self, checkpoint_id: int, outcome: LoadOutcome) -> None:
        for callback in self.on_loaded:
            callback(checkpoint_id, outcome)

    def stop_lazy_load(self) -> None:
        """Stop the background load of the last restore, if it runs (before a checkpoint reads
        the same arrays, or a pause stops the kernel): it ends cleanly, saying how far it got."""
        load = self.lazy_load
        if load is not None:
            load.stop()
            self.lazy_load = None

    def _apply_session(
        self, loader: StateLoader, manifest: dict[str, Any], phase: str
    ) -> SessionReport:
        digest = manifest.get("session", {}).get(phase)
        if digest is None:  # nothing of this phase, or a checkpoint older than session saving
            return SessionReport()
        try:
            states = loader.extra(digest)
        except (RestoreError, store_mod.StoreError) as err:
            what = "imports, environment, settings" if phase == "before" else "registered magics"
            return SessionReport(failed={f"session ({what})": str(err)})
        from . import session_settings  # noqa: F401  (the built-in settings register on import)

        return apply_session(states, self._session_context([]))


def _unpickle_plain(data: memoryview) -> Any:
    import pickle

    return pickle.loads(bytes(data))


def lazy_buffers(manifest: dict[str, Any], streamed: set[str]) -> set[str]:
    """The buffers a lazy restore maps: the storages of CPU arrays and tensors at least
    LAZY_AT_LEAST large (a pickled frame is read whole at once anyway; CUDA tensors stream)."""
    buffers = manifest["buffers"]
    return {
        record["buffer"]
        for record in manifest.get("storages", {}).values()
        if "buffer" in record
        and record.get("device", "cpu") == "cpu"
        and record["buffer"] not in streamed
        and buffers.get(record["buffer"], {}).get("nbytes", 0) >= LAZY_AT_LEAST
    }


def _recent_first(buffers: list[MappedBuffer], recent: list[str]) -> list[MappedBuffer]:
    """The buffers of the most recently used variables first (``recent``: the checkpoint's
    order of use); the others after, in the order the restore handed them out."""
    rank = {name: i for i, name in enumerate(recent)}
    return sorted(
        buffers, key=lambda b: min((rank.get(n, len(rank)) for n in b.users), default=len(rank))
    )
