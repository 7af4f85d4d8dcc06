"""The checkpoint engine as a Python API: save, list, restore and delete live notebook state.

``Checkpointer`` works on any namespace dict; inside IPython it also follows cell executions
(``ChangeTracker``) so that incremental checkpoints only re-pickle what cells touched.
Results are dataclasses (``results``); the magics format them, the server reads them as JSON.
Saving is in ``saving``, restoring in ``restoring``; ``%load_ext jupyter_pause`` (``extension``)
builds on this module, never the reverse.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traitlets import Bool, Enum, Float, Int, Unicode, default
from traitlets.config import Configurable

from ..policy import KERNEL_POLICY_ENV
from . import store as store_mod
from .lazy import LazyLoad, LoadOutcome
from .restoring import Restoring
from .results import CheckpointError, CheckpointInfo, CheckpointResult, RestoreResult
from .saving import Saving
from .session import Baseline
from .state import ObjectKeys

if TYPE_CHECKING:
    from .snapshot import Snapshotter

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointResult",
    "Checkpointer",
    "RestoreResult",
    "installed",
    "notebook_key",
    "set_current",
]


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


class Checkpointer(Saving, Restoring, Configurable):
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

    lazy_restore = Bool(
        True,
        help="Restore from files ready before the bytes are in: CPU arrays and tensors of at "
        "least 1 MiB come back as copy-on-write maps of their checkpoint files (plain numpy "
        "arrays and tensors, whose pages load on first touch), loaded and checked behind the "
        "notebook right after; the kernel is ready once the small objects are back. Off: "
        "every byte is read and checked before ready.",
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
        # A lazy restore's background load: its progress (checkpoint id, bytes in, bytes in
        # all), then its end (checkpoint id, LoadOutcome).
        self.lazy_load: LazyLoad | None = None
        self.on_loading: list[Callable[[int, int, int], None]] = []
        self.on_loaded: list[Callable[[int, LoadOutcome], None]] = []

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


_current: Checkpointer | None = None


def installed() -> Checkpointer | None:
    """The checkpointer of this kernel, if one was made (``jupyter_pause.kernel.current``
    makes one when there is none)."""
    return _current


def set_current(checkpointer: Checkpointer | None) -> None:
    global _current
    _current = checkpointer
