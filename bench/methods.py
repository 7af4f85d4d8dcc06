"""The ways to checkpoint a notebook that the benchmark compares, and its child processes.

A SAVE child builds the state, then ``save(1)``, changes ``lr`` and ``save(2)`` (peers have
no incremental mode, so their second save writes everything again). A RESTORE child, started
after the page cache was dropped, imports numpy and torch (every notebook pays that, so it is
off the clock), then times ``prepare_restore`` (``%load_ext jupyter_pause``, or importing the
peer's library), ``restore`` and ``read_every_tensor``: the restore is *usable* once every
tensor and array was read, whatever the method does lazily.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import time
import types
from pathlib import Path
from typing import Any

import device
from workload import (
    CHANGE_SCALAR_CODE,
    build_code,
    bytes_written_by_process,
    fingerprint,
    fsync_changed,
    peak_rss,
    read_every_tensor,
    reset_peak_rss,
    rss,
    settle_memory,
    state_bytes,
    state_views,
    tree_bytes,
    tree_stamps,
    user_state,
)

REPO = Path(__file__).resolve().parent.parent


def new_shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


def run_cell(shell: Any, code: str) -> None:
    result = shell.run_cell(code, store_history=True)
    if not result.success:
        raise RuntimeError(f"cell failed: {result.error_in_exec or result.error_before_exec!r}")


def fsynced_dump(path: Path, dump: Any) -> None:
    with open(path, "wb") as f:
        dump(f)
        f.flush()
        os.fsync(f.fileno())


def latest(store: Path, pattern: str) -> Path:
    return max(store.glob(pattern), key=lambda p: p.name)


class Method:
    """One way to checkpoint (see the module docstring for what each child calls)."""

    def __init__(self, store: Path, scale: float, round_no: int) -> None:
        self.store = store
        self.scale = scale
        self.round_no = round_no
        self.note = ""
        self.reported: dict[str, Any] = {}

    def build(self) -> None:
        self.shell = new_shell()
        run_cell(self.shell, build_code(self.scale))

    def namespace(self) -> dict[str, Any]:
        return self.shell.user_ns

    def change_scalar(self) -> None:
        run_cell(self.shell, CHANGE_SCALAR_CODE)

    def save(self, n: int) -> None:
        raise NotImplementedError

    def prepare_restore(self) -> None:
        """What a notebook runs before the restore itself (timed with it)."""

    def restore(self) -> dict[str, Any]:
        raise NotImplementedError


class DeviceMethod(Method):
    """The device reference (``device.py``): best of an O_DIRECT and a buffered write+fsync
    of the state's bytes, and of an O_DIRECT and a buffered cold read of them (the writes in
    the opposite order every other round, the reads likewise). Beside it, not part of it and
    measured first: the O_DIRECT cold read into fresh memory."""

    def save(self, n: int) -> None:
        if n == 2:
            return  # a device has no incremental mode: the row shows no incr column
        views = state_views(user_state(self.shell.user_ns))  # pickling is not disk time
        ways = [("direct", device.write_direct), ("buffered", device.write_buffered)]
        for way, write in ways if self.round_no % 2 == 0 else ways[::-1]:
            self.reported[f"write_{way}_s"] = write(self.store / f"{way}.bin", views)

    def restore(self) -> dict[str, Any]:
        from workload import drop_page_cache

        # The read into fresh memory (beside the reference, not in it) always comes first, as
        # a method's restore does in its own process. Right after the buffered read had freed
        # its page cache, the 8 GB fresh read took 4.0-4.7 s here; as the process's first
        # read, 5.2-6.6 s (3 alternating rounds): what fresh memory costs depends on what was
        # freed just before (bench/fresh_memory.py).
        ways = [
            ("direct", device.read_direct, "direct.bin"),
            ("buffered", device.read_buffered, "buffered.bin"),
        ]
        turn = self.round_no % len(ways)
        reads = [("fresh", device.read_fresh, "direct.bin"), *ways[turn:], *ways[:turn]]
        for i, (way, read, name) in enumerate(reads):
            if i:  # the first read found the cache dropped by the harness
                drop_page_cache([self.store / name])
            self.reported[f"read_{way}_s"] = read(self.store / name)
        return {}


class PickleMethod(Method):
    def save(self, n: int) -> None:
        ns = user_state(self.shell.user_ns)
        fsynced_dump(self.store / f"ns.{n}.pkl", lambda f: pickle.dump(ns, f, protocol=5))

    def restore(self) -> dict[str, Any]:
        with open(latest(self.store, "ns.*.pkl"), "rb") as f:
            return pickle.load(f)


class TorchMethod(Method):
    def save(self, n: int) -> None:
        import torch

        ns = user_state(self.shell.user_ns)
        fsynced_dump(self.store / f"ns.{n}.pt", lambda f: torch.save(ns, f))

    def restore(self) -> dict[str, Any]:
        import torch

        return torch.load(latest(self.store, "ns.*.pt"), weights_only=False)


_LOADED_TENSORS: dict[str, Any] = {}  # what a skeleton's references resolve to while it loads


def _safetensors_ref(key: str, kind: str, requires_grad: bool) -> Any:
    """Rebuilds one reference of the skeleton pickle from the loaded safetensors file."""
    import torch

    tensor = _LOADED_TENSORS[key]
    if kind == "numpy":
        return tensor.numpy()
    if kind == "parameter":
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


class SafetensorsMethod(Method):
    """safetensors for every tensor and array (one file, ``save_file`` / ``load_file``) plus
    a "skeleton": a pickle of everything else whose tensors and arrays are references into
    that file (the same object twice, as in model + optimizer, is one reference)."""

    def save(self, n: int) -> None:
        import copyreg

        import numpy as np
        import torch
        from safetensors.torch import save_file

        tensors: dict[str, Any] = {}

        def reference(obj: Any) -> tuple[Any, tuple[str, str, bool]]:
            # Called once per object: the pickler's memo turns repeats into back-references.
            key = f"t{len(tensors)}"
            if isinstance(obj, np.ndarray):
                tensors[key] = torch.from_numpy(np.ascontiguousarray(obj))
                return _safetensors_ref, (key, "numpy", False)
            tensors[key] = obj.detach().contiguous()
            kind = "parameter" if isinstance(obj, torch.nn.Parameter) else "tensor"
            return _safetensors_ref, (key, kind, obj.requires_grad)

        skeleton = io.BytesIO()
        pickler = pickle.Pickler(skeleton, protocol=5)
        pickler.dispatch_table = copyreg.dispatch_table.copy()
        for kind in (torch.Tensor, torch.nn.Parameter, np.ndarray):
            pickler.dispatch_table[kind] = reference
        pickler.dump(user_state(self.shell.user_ns))
        save_file(tensors, self.store / f"tensors.{n}.safetensors")
        fsynced_dump(self.store / f"skeleton.{n}.pkl", lambda f: f.write(skeleton.getbuffer()))

    def prepare_restore(self) -> None:
        import safetensors.torch  # noqa: F401

    def restore(self) -> dict[str, Any]:
        from safetensors.torch import load_file

        _LOADED_TENSORS.update(load_file(latest(self.store, "tensors.*.safetensors")))
        try:
            with open(latest(self.store, "skeleton.*.pkl"), "rb") as f:
                return pickle.load(f)
        finally:
            _LOADED_TENSORS.clear()


class DillMethod(Method):
    """dill.dump_module pickles a whole module; an IPython user module drags the shell (and its
    sqlite history connection) along, so the state lives in a plain fresh __main__ here."""

    def build(self) -> None:
        self.note = dill_torch_shim()
        self.fallback = False
        self.module = fresh_main()
        exec(build_code(self.scale), self.module.__dict__)

    def namespace(self) -> dict[str, Any]:
        return self.module.__dict__

    def change_scalar(self) -> None:
        exec(CHANGE_SCALAR_CODE, self.module.__dict__)

    def save(self, n: int) -> None:
        import dill

        path = self.store / f"session.{n}.pkl"
        if not self.fallback:
            try:
                fsynced_dump(path, lambda f: dill.dump_module(f, module=self.module))
                return
            except Exception as exc:  # any failure is reported, then worked around
                path.unlink(missing_ok=True)
                self.fallback = True
                self.note += f"; dump_module failed ({type(exc).__name__}: {str(exc)[:90]}), "
                self.note += "fell back to dill.dump(namespace, byref=True)"
                raise RetrySave from exc
        # dump_module forces byref off; plain dill.dump with byref pickles the same variables.
        ns = user_state(self.module.__dict__)
        fsynced_dump(path.with_suffix(".dict"), lambda f: dill.dump(ns, f, byref=True))

    def prepare_restore(self) -> None:
        import dill  # noqa: F401

        dill_torch_shim()

    def restore(self) -> dict[str, Any]:
        import dill

        module = fresh_main()
        path = latest(self.store, "session.*")
        if path.suffix == ".pkl":
            dill.load_module(str(path), module=module)
            return module.__dict__
        with open(path, "rb") as f:
            return dill.load(f)


class KishuMethod(Method):
    """Kishu checkpoints after every cell from IPython's post_run_cell hook; we time that hook.

    Test mode skips the frontend round trips (saving the .ipynb through JupyterLab) that a
    headless shell cannot answer; the checkpointing path itself is unchanged."""

    def _kishu(self, shell: Any) -> Any:
        os.environ["KISHU_PATH_ROOT"] = str(self.store)
        os.environ["ENV_KISHU_TEST_MODE"] = "1"
        self.note = dill_torch_shim()
        import nbformat
        from kishu.jupyterint import KishuForJupyter
        from kishu.notebook_id import NotebookId

        nb_path = self.store / "bench.ipynb"
        if not nb_path.exists():
            nbformat.write(nbformat.v4.new_notebook(), nb_path)
        notebook_id = NotebookId(key="bench", path=nb_path, kernel_id="bench-kernel")
        return KishuForJupyter(notebook_id, ip=shell)

    def build(self) -> None:
        self.shell = new_shell()
        kishu = self._kishu(self.shell)
        commit = kishu.post_run_cell
        self.commit_seconds: list[float] = []
        self.before_commit: list[Any] = []

        def timed_commit(result: Any) -> None:
            for hook in self.before_commit:
                hook()
            before = tree_stamps(self.store)
            t0 = time.perf_counter()
            commit(result)
            fsync_changed(self.store, before)
            self.commit_seconds.append(time.perf_counter() - t0)

        kishu.post_run_cell = timed_commit  # install_kishu_hooks registers the instance attr
        kishu.install_kishu_hooks()
        self.kishu = kishu

    def prepare_restore(self) -> None:
        self.shell = new_shell()
        self.kishu = self._kishu(self.shell)
        self._count_reruns()

    def _count_reruns(self) -> None:
        """Kishu may re-execute cells instead of loading data (same values, other cost)."""
        from kishu.planning import plan

        rerun = plan.RerunCellRestoreAction.run
        self.reported["cells_rerun"] = 0

        def counting(action: Any, ctx: Any) -> Any:
            self.reported["cells_rerun"] += 1
            return rerun(action, ctx)

        plan.RerunCellRestoreAction.run = counting

    def restore(self) -> dict[str, Any]:
        commit_id = json.loads((self.store / "head.json").read_text())["commit_id"]
        self.kishu.checkout(commit_id)
        if self.reported["cells_rerun"]:
            self.note = f"checkout re-ran {self.reported['cells_rerun']} cell(s)"
        return self.shell.user_ns


class PauseMethod(Method):
    """jupyter_pause; subclasses change one setting (``settings``) and how a restore gets
    the data files (``map_files``, see ``jupyter_pause.kernel.loading.BufferSource``)."""

    settings: dict[str, Any] = {}
    map_files = "cached"  # the default

    def _load(self) -> Any:
        os.environ["JUPYTER_PAUSE_STORE"] = str(self.store / "store")
        os.environ["JUPYTER_PAUSE_NOTEBOOK"] = "/bench/notebook.ipynb"
        sys.path.insert(0, str(REPO))
        import jupyter_pause
        from jupyter_pause.kernel.loading import BufferSource

        self.shell = new_shell()
        self.shell.run_line_magic("load_ext", "jupyter_pause")
        for name, value in self.settings.items():
            self.shell.run_line_magic("config", f"Checkpointer.{name} = {value!r}")
        BufferSource.map_files = self.map_files
        return jupyter_pause

    def build(self) -> None:
        self.jp = self._load()
        run_cell(self.shell, build_code(self.scale))

    def save(self, n: int) -> None:
        res = self.jp.checkpoint()
        self.reported[f"save{n}"] = result_fields(res)

    def prepare_restore(self) -> None:
        self.jp = self._load()

    def restore(self) -> dict[str, Any]:
        res = self.jp.restore()
        self.reported["restore"] = result_fields(res)
        if getattr(res, "failed", None):
            raise RuntimeError(f"restore failed for {res.failed}")
        return self.shell.user_ns


class PauseMappedMethod(PauseMethod):
    """Data written with O_DIRECT, restored by mapping the files (the old ``direct_io``)."""

    map_files = "always"


class PausePageCacheMethod(PauseMethod):
    """Data written through the page cache, restored by mapping (the old default)."""

    settings = {"direct_io": False}
    map_files = "always"


class PausePageCacheReadMethod(PauseMethod):
    """Data written through the page cache, restored by reading it with O_DIRECT even when
    it is still in the page cache (the other side of ``map_files = "cached"``)."""

    settings = {"direct_io": False}
    map_files = "never"


class RetrySave(Exception):
    """A method's first save strategy failed and it switched to a fallback; time it again."""


def result_fields(res: Any) -> dict[str, Any]:
    fields = getattr(res, "__dict__", None) or {
        k: getattr(res, k) for k in dir(res) if not k.startswith("_")
    }
    return {
        k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)[:200]
        for k, v in fields.items()
        if not callable(v)
    }


def dill_torch_shim() -> str:
    """Let dill pickle torch.optim.Adam by reference.

    torch.optim deletes its submodule attributes, so dill 0.4 cannot locate
    torch.optim.adam.Adam, falls back to pickling the class by value and fails on a
    typing_extensions sentinel. Without this, dill cannot save the optimizer and Kishu
    silently skips it (and re-runs the cell on checkout)."""
    import torch

    for name in ("adam", "optimizer"):
        setattr(torch.optim, name, sys.modules[f"torch.optim.{name}"])
    return "shim: torch.optim.adam re-exposed so dill can pickle Adam by reference"


def fresh_main() -> types.ModuleType:
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    return module


METHOD_CLASSES: dict[str, type[Method]] = {
    "device": DeviceMethod,
    "pickle": PickleMethod,
    "dill": DillMethod,
    "torch": TorchMethod,
    "safetensors": SafetensorsMethod,
    "kishu": KishuMethod,
    "jupyter_pause": PauseMethod,
    "jupyter_pause_mapped": PauseMappedMethod,
    "jupyter_pause_page_cache": PausePageCacheMethod,
    "jupyter_pause_page_cache_read": PausePageCacheReadMethod,
}


# --------------------------------------------------------------------------- child entry points


class Profiler:
    """cProfile around one measured step when BENCH_PROFILE_DIR is set; off the numbers
    otherwise."""

    def __init__(self, label: str) -> None:
        self.path = os.environ.get("BENCH_PROFILE_DIR")
        self.label = label
        self.prof: Any = None

    def __enter__(self) -> Profiler:
        if self.path:
            import cProfile

            self.prof = cProfile.Profile()
            self.prof.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.prof is None:
            return
        import pstats

        self.prof.disable()
        out = io.StringIO()
        stats = pstats.Stats(self.prof, stream=out)
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(20)
        Path(self.path, f"{self.label}.txt").write_text(out.getvalue())


class SaveMeter:
    """Times one save and measures memory beyond the settled state and bytes it wrote."""

    def __init__(self, store: Path, label: str) -> None:
        self.store = store
        self.profiler = Profiler(label)

    def start(self) -> None:
        settle_memory()
        self.rss_before = rss()
        self.peak_reset = reset_peak_rss()
        self.disk_before = tree_bytes(self.store)
        self.wchar_before = bytes_written_by_process()
        self.stamps = tree_stamps(self.store)
        self.profiler.__enter__()
        self.t0 = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        seconds = time.perf_counter() - self.t0
        self.profiler.__exit__()
        peak = peak_rss()
        return {
            "seconds": seconds,
            "rss_before": self.rss_before,
            "peak_rss": peak,
            "peak_is_window": self.peak_reset,
            "extra_peak": max(0, peak - self.rss_before),
            "disk_growth": tree_bytes(self.store) - self.disk_before,
            "wchar": bytes_written_by_process() - self.wchar_before,
        }


def timed_save(method: Method, n: int) -> dict[str, Any]:
    meter = SaveMeter(method.store, f"{type(method).__name__}-save{n}")
    if isinstance(method, KishuMethod):
        return timed_kishu_commit(method, meter, n)
    for _ in range(2):
        meter.start()
        try:
            method.save(n)
        except RetrySave:
            continue
        fsync_changed(method.store, meter.stamps)
        return meter.stop()
    raise RuntimeError("save failed twice")


def timed_kishu_commit(method: KishuMethod, meter: SaveMeter, n: int) -> dict[str, Any]:
    """Kishu commits inside the cell's post hook; the meter starts right before that commit."""
    method.before_commit[:] = [meter.start]
    if n == 1:
        run_cell(method.shell, build_code(method.scale))
    else:
        run_cell(method.shell, CHANGE_SCALAR_CODE)
    out = meter.stop()
    out["seconds"] = method.commit_seconds[-1]
    head = method.kishu._kishu_branch.get_head().commit_id
    (method.store / "head.json").write_text(json.dumps({"commit_id": head}))
    return out


def child_save(method: Method) -> dict[str, Any]:
    t0 = time.perf_counter()
    method.build()
    # Kishu commits from the build cell's own hook, so its first save runs the build cell.
    first = timed_save(method, 1)
    build_s = time.perf_counter() - t0 - first["seconds"]
    if not isinstance(method, KishuMethod):  # Kishu's second save runs this cell itself
        method.change_scalar()
    second = timed_save(method, 2)
    ns = method.namespace()
    return {
        "state_bytes": state_bytes(ns),
        "build_s": build_s,
        "save": first,
        "incremental": second,
        "paired_write_s": paired_write(method, ns),
        "disk_bytes_first": first["disk_growth"],
        "fingerprint": fingerprint(ns),
        "note": method.note,
        "reported": method.reported,
    }


def paired_write(method: Method, ns: dict[str, Any]) -> float | None:
    """Seconds of the device's ``O_DIRECT`` write+fsync of the same state, from the same
    memory, in the same process, right after the method's saves (None for the device itself).

    Beside the per-round reference, which runs in a process of its own a minute away: on
    these VMs the disk's speed drifts between processes, and this shows what the disk did
    at the moment of the save."""
    if isinstance(method, DeviceMethod):
        return None
    target = method.store / "paired-device-write.bin"
    settle_memory()
    try:
        return device.write_direct(target, state_views(user_state(ns)))
    finally:
        target.unlink(missing_ok=True)


def child_restore(method: Method) -> dict[str, Any]:
    import numpy  # noqa: F401 - every notebook imports these: off the clock for all methods
    import torch  # noqa: F401

    new_shell()  # likewise the shell a notebook runs in
    settle_memory()
    rss_before = rss()
    reset_peak_rss()
    t0 = time.perf_counter()
    with Profiler(f"{type(method).__name__}-restore"):
        method.prepare_restore()
        ns = method.restore()
        digests = read_every_tensor(ns) if ns else None  # the device reads bytes only
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "fingerprint": fingerprint(ns, digests) if ns else None,
        "rss_before": rss_before,
        "peak_rss": peak_rss(),
        "reported": method.reported,
        "note": method.note,
    }


def run_child(kind: str, name: str, store: Path, scale: float, round_no: int, out: Path) -> int:
    method = METHOD_CLASSES[name](store, scale, round_no)
    result = child_save(method) if kind == "save" else child_restore(method)
    out.write_text(json.dumps(result, default=repr))
    return 0
