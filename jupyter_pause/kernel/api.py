"""The checkpoint engine as a Python API: save, list, restore and delete live notebook state.

``Checkpointer`` works on any namespace dict; inside IPython it also follows cell executions
(``ChangeTracker``) so that incremental checkpoints only re-pickle what cells touched.
Results are dataclasses; the magics format them, the server reads them as JSON.
"""

from __future__ import annotations

import errno
import functools
import gc
import json
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traitlets import Bool, Enum, Float, Int, Unicode, default
from traitlets.config import Configurable

from ..formatting import format_bytes, format_count, format_reasons
from ..policy import KERNEL_POLICY_ENV
from . import store as store_mod
from .arrays import content_hash, content_hasher
from .capture import rng_states, select_variables, set_rng_states
from .loading import BufferSource, buffer_source
from .reading import OWN_MEMORY_AT_LEAST
from .session import Baseline, SessionContext, SessionReport, apply_session, capture_session
from .state import (
    ObjectKeys,
    RestoreError,
    StateLoader,
    buffers_in_load_order,
    load_order,
    streamed_buffers,
)
from .token import process_token

if TYPE_CHECKING:
    from .describing import Storage
    from .snapshot import Snapshotter
    from .writer import CheckpointWriter

ProgressCallback = Callable[[str, int, int], None]  # (phase, bytes done, bytes total)


@dataclass
class CheckpointResult:
    """What one checkpoint saved, skipped, wrote and reused."""

    checkpoint_id: int
    notebook: str
    created: float
    saved: list[str]
    skipped: dict[str, str]
    bytes_written: int
    bytes_reused: int
    bytes_total: int
    seconds: float
    reason: str = "manual"
    torn: list[int] = field(default_factory=list)
    retired: list[int] = field(default_factory=list)
    session: dict[str, Any] = field(default_factory=dict)  # SessionReport.to_json()
    warnings: list[str] = field(default_factory=list)
    detached: dict[str, str] = field(default_factory=dict)  # name -> autograd function

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        line = (
            f"Checkpoint {self.checkpoint_id}: {format_count(len(self.saved), 'variable')} saved, "
            f"{format_bytes(self.bytes_written)} written, {format_bytes(self.bytes_reused)} reused, "
            f"{self.seconds:.2f} s"
        )
        done = self.session.get("done", {})
        if done:
            line += "; with the session: " + ", ".join(
                format_count(len(labels), "import") if group == "imports" else ", ".join(labels)
                for group, labels in done.items()
            )
        if self.skipped:
            line += "; skipped: " + format_reasons(self.skipped, "; ")
        if self.session.get("failed"):
            line += "; session not saved: " + format_reasons(self.session["failed"], "; ")
        if self.detached:
            line += "; autograd graph not saved: " + _detached_reasons(self.detached)
        if self.torn:
            ids = ", ".join(str(i) for i in self.torn)
            line += f"; found interrupted checkpoint(s) {ids} (kernel died while writing), removed"
        for warning in self.warnings:
            line += f"\nWarning: {warning}"
        return line


@dataclass
class RestoreResult:
    """What came back from a checkpoint, what did not, and why."""

    checkpoint_id: int
    notebook: str
    restored: list[str]
    failed: dict[str, str]
    not_saved: dict[str, str]
    warnings: list[str]
    rng: list[str]
    seconds: float
    bytes_read: int
    saved_by_token: str
    same_process: bool
    session: dict[str, Any] = field(default_factory=dict)  # SessionReport.to_json()
    detached: dict[str, str] = field(default_factory=dict)  # name -> autograd function
    # Variables this kernel had defined itself (it did not write the checkpoint) that the
    # restore replaced: a cell run in a reopened notebook before its resume, for example.
    replaced: list[str] = field(default_factory=list)
    # A restore by name: the checkpoint's other variables, which were not asked for.
    not_asked: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def complete(self) -> bool:
        """Everything the checkpoint held came back (what it never held is listed apart)."""
        return not self.failed and not self.session.get("failed")

    def summary(self) -> str:
        line = (
            f"Restored checkpoint {self.checkpoint_id}: "
            f"{format_count(len(self.restored), 'variable')} "
            f"({', '.join(self.restored) or 'none'}), {format_bytes(self.bytes_read)}, "
            f"{self.seconds:.2f} s"
        )
        done = self.session.get("done", {})
        if done:
            line += "; " + SessionReport(done=done).describe()
        if self.failed:
            line += "; not restored: " + format_reasons(self.failed, "; ")
        if self.session.get("failed"):
            line += "; session not restored: " + format_reasons(self.session["failed"], "; ")
        if self.detached:
            line += "; autograd graph not restored: " + _detached_reasons(self.detached)
        if self.not_saved:
            line += "; not in the checkpoint: " + format_reasons(self.not_saved, "; ")
        if self.replaced:
            line += "; replaced what this kernel had defined: " + ", ".join(self.replaced)
        for warning in self.warnings:
            line += f"\nWarning: {warning}"
        return line


def _detached_reasons(detached: dict[str, str]) -> str:
    return format_reasons(
        {
            name: f"computed by {function}; detached after a restore: run the cell that "
            "computes it again before a backward() through it"
            for name, function in detached.items()
        },
        "; ",
    )


@dataclass
class CheckpointInfo:
    """One line of ``%checkpoint list``."""

    checkpoint_id: int
    created: float
    nbytes: int
    variables: list[str]
    skipped: dict[str, str]
    reason: str
    process_token: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class CheckpointError(Exception):
    """A checkpoint or restore that did not happen; the message says why and what is intact."""


def notebook_key() -> str:
    """The notebook this kernel serves, as an absolute path; its working directory if none.

    The server names it explicitly (``JUPYTER_PAUSE_NOTEBOOK``); jupyter-server tells every
    kernel its session path (``JPY_SESSION_NAME``, relative to the server root, while the
    kernel starts in the notebook's folder); a console or plain jupyter_client kernel has
    neither, so a kernel started in the same folder finds the same checkpoints.
    """
    explicit = os.environ.get("JUPYTER_PAUSE_NOTEBOOK")
    if explicit:
        return os.path.abspath(explicit)
    session = os.environ.get("JPY_SESSION_NAME")
    if session:
        if os.path.isabs(session):
            return session
        return os.path.join(os.getcwd(), os.path.basename(session))
    return os.getcwd()


class Checkpointer(Configurable):
    """Kernel-side checkpoint settings (``c.Checkpointer.*`` in ipython_kernel_config.py)."""

    store_root = Unicode(
        help="Folder that holds the checkpoints, one subfolder per notebook. Default: "
        "$JUPYTER_PAUSE_STORE, else <jupyter data dir>/jupyter_pause/checkpoints "
        "(so JUPYTER_DATA_DIR moves it).",
    ).tag(config=True)

    keep_last = Int(
        5, help="Checkpoints kept per notebook (older ones are deleted, unused data collected)."
    ).tag(config=True)

    max_age_hours = Float(
        0.0,
        help="Delete checkpoints older than this many hours (0: no age limit). The newest "
        "checkpoint is always kept.",
    ).tag(config=True)

    max_bytes = Int(
        0,
        help="Keep at most this many bytes of checkpoint data per notebook (0: no limit). "
        "The newest checkpoint is always kept.",
    ).tag(config=True)

    save_unmarked = Enum(
        ["all", "none"],
        "all",
        help="What %checkpoint saves when no variable is marked: 'all' savable user variables, "
        "or 'none'.",
    ).tag(config=True)

    verify = Bool(
        True, help="Check every buffer's content hash when restoring (xxh3, tens of GB/s)."
    ).tag(config=True)

    trust_change_tracking = Bool(
        True,
        help="Let an incremental checkpoint skip re-hashing the tensors/arrays that only "
        "unchanged variables reference (unchanged: no cell since the last checkpoint mentions "
        "them, and PyTorch's version counters of their tensors did not move). Checkpoints "
        "taken for a pause or before culling, and %checkpoint --full, re-hash everything.",
    ).tag(config=True)

    direct_io = Bool(
        True,
        help="Write checkpoint data around the page cache (O_DIRECT, straight from the "
        "tensors' memory, where the filesystem allows it). Off: through the page cache, "
        "which on this project's VMs saves 2-6x slower (bench/README.md) and leaves the "
        "checkpoint in memory, where a restore on the same machine soon after maps it "
        "instead of reading the disk. Restores read files that are not in the page cache "
        "with O_DIRECT either way.",
    ).tag(config=True)

    @default("store_root")
    def _default_store_root(self) -> str:
        return str(store_mod.default_store_root())

    def __init__(
        self,
        namespace: dict[str, Any] | None = None,
        *,
        hidden: dict[str, Any] | None = None,
        tracker: Any = None,
        key: str | None = None,
        shell: Any = None,
        baseline: Baseline | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # The server passes the admin's policy to every kernel it starts; it wins over config.
        for trait, env, cast in KERNEL_POLICY_ENV:
            if os.environ.get(env):
                setattr(self, trait, cast(os.environ[env]))
        self.namespace = namespace if namespace is not None else {}
        self.hidden = hidden if hidden is not None else {}
        self.tracker = tracker
        self.shell = shell
        self.baseline = baseline or Baseline.take(late=False)
        self.key = key or notebook_key()
        self.store = store_mod.NotebookStore(Path(self.store_root), self.key)
        self.keys = ObjectKeys()
        self._marked: list[str] = []
        self._base_id: int | None = None  # the checkpoint the live namespace was last synced with
        self._base_ids: dict[str, int] = {}  # id() of each variable at that checkpoint
        # Buffers of that checkpoint: identity -> (content hash, version counters of its tensors)
        self._base_storages: dict[tuple[str, int, int], tuple[str, dict[str, int | None]]] = {}
        self.on_checkpoint: list[Callable[[CheckpointResult], None]] = []
        # Called after each restore the notebook asks for (not the server's own: it knows).
        self.on_restore: list[Callable[[RestoreResult], None]] = []

    @functools.cached_property
    def _snapshotter(self) -> Snapshotter:
        # Made by the first checkpoint: a kernel that only restores never loads the pickling
        # side (``snapshot``, cloudpickle), which is memory its restore would report.
        from .snapshot import Snapshotter

        return Snapshotter(self.keys, self.namespace)

    def set_key(self, key: str) -> None:
        """Point at another notebook's checkpoints (the server names the notebook for certain)."""
        self.key = key
        self.store = store_mod.NotebookStore(Path(self.store_root), key)
        self._base_id = None
        self._base_ids = {}
        self._base_storages = {}

    # -- marking ---------------------------------------------------------------------------------
    def keep(self, *names: str) -> list[str]:
        bad = [n for n in names if not n.isidentifier()]
        if bad:
            raise CheckpointError(f"Not a variable name: {', '.join(bad)}")
        for name in names:
            if name not in self._marked:
                self._marked.append(name)
        return self.marked()

    def drop(self, *names: str) -> list[str]:
        unknown = [n for n in names if n not in self._marked]
        if unknown:
            raise CheckpointError(
                f"Not marked: {', '.join(unknown)} (marked: {', '.join(self._marked) or 'none'})"
            )
        self._marked = [n for n in self._marked if n not in names]
        return self.marked()

    def marked(self) -> list[str]:
        return list(self._marked)

    # -- checkpoint ------------------------------------------------------------------------------
    def checkpoint(
        self,
        *,
        full: bool = False,
        reason: str = "manual",
        progress: ProgressCallback | None = None,
    ) -> CheckpointResult:
        """Save now. A failure leaves every earlier checkpoint as it was and raises CheckpointError."""
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
                "environment": _environment(),
                "marked": self.marked(),
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
        try:
            with buffer_source(store, manifest, [d for d in needed if d not in streamed]) as source:
                return self._load_variables(
                    manifest, checkpoint_id, names, started, source, streamed
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
    ) -> RestoreResult:
        verified: set[str] = set()
        bytes_read = 0

        def location_of(digest: str) -> dict[str, Any]:
            location = manifest["buffers"].get(digest)
            if location is None:
                raise store_mod.StoreError(f"checkpoint {checkpoint_id} lacks buffer {digest}")
            return location

        def read_buffer(digest: str) -> memoryview:
            nonlocal bytes_read
            location = location_of(digest)
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
        not_saved = {} if names else dict(manifest["skipped"])
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
        )

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
        return apply_session(states, self._session_context([]))

    # -- listing and deleting --------------------------------------------------------------------
    def list_checkpoints(self) -> list[CheckpointInfo]:
        infos = []
        for checkpoint_id in self.store.checkpoint_ids():
            try:
                manifest = self.store.read_manifest(checkpoint_id)
            except store_mod.StoreError:
                continue
            infos.append(
                CheckpointInfo(
                    checkpoint_id=checkpoint_id,
                    created=manifest["created"],
                    nbytes=store_mod.manifest_bytes(manifest),
                    variables=store_mod.manifest_variables(manifest),
                    skipped=manifest["skipped"],
                    reason=manifest.get("reason", "manual"),
                    process_token=manifest["process_token"],
                )
            )
        return infos

    def torn_checkpoints(self) -> list[store_mod.TornCheckpoint]:
        if not self.store.exists():
            return []
        with self.store.locked():
            self.store.recover_torn()
        return self.store.torn_history()

    def delete(self, checkpoint_id: int) -> None:
        try:
            self.store.delete(checkpoint_id)
        except store_mod.StoreError as err:
            raise CheckpointError(str(err)) from None
        if checkpoint_id == self._base_id:
            self._base_id = None

    # -- schedule (implemented by the kernel extension, which knows about cells) ----------------
    scheduler: Any = None

    def every(self, interval: str | float | None) -> Any:
        if self.scheduler is None:
            raise CheckpointError(
                "Scheduled checkpoints need the IPython extension: %load_ext jupyter_pause"
            )
        return self.scheduler.set_interval(interval)


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


def _unpickle_plain(data: memoryview) -> Any:
    import pickle

    return pickle.loads(bytes(data))


def _environment() -> dict[str, Any]:
    env = {"python": platform.python_version(), "host": platform.node()}
    for module in ("torch", "numpy", "pandas"):
        if module in sys.modules:
            env[module] = getattr(sys.modules[module], "__version__", "?")
    return env


_current: Checkpointer | None = None


def current() -> Checkpointer:
    """The checkpointer of this kernel (created by ``%load_ext jupyter_pause``)."""
    global _current
    if _current is None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            from .extension import load

            load(shell)
        else:
            _current = Checkpointer(sys.modules["__main__"].__dict__)
    assert _current is not None
    return _current


def set_current(checkpointer: Checkpointer | None) -> None:
    global _current
    _current = checkpointer
