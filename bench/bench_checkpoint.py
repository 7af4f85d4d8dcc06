"""Benchmark: save and restore a live notebook namespace, jupyter_pause against its peers.

One run on one machine measures the raw disk (write+fsync, cold sequential read) and then, per
method, a SAVE subprocess (builds the state with the same seed, checkpoints it, changes a scalar,
checkpoints again) and a RESTORE subprocess (loads the latest checkpoint into a fresh process and
touches every tensor and array plus one forward pass). Page cache is dropped between the two so
restores read from disk. Prints a markdown table and writes bench/results/latest.{md,json}.

    python bench/bench_checkpoint.py            # full workload (~710 MB of state)
    python bench/bench_checkpoint.py --quick    # tiny smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
MB = 1e6

# Targets jupyter_pause is held to (see bench/README.md).
TARGET_SAVE_FRACTION = 0.8
TARGET_RESTORE_FRACTION = 0.65
TARGET_INCREMENTAL_S = 0.1
TARGET_EXTRA_SAVE_MB = 64.0
# An incremental checkpoint may write metadata (manifest, the scalar) but no tensor/array data.
INCREMENTAL_BYTES_ALLOWANCE = 256 * 1024

METHODS = ("pickle", "dill", "torch", "kishu", "jupyter_pause", "jupyter_pause_direct")
REFERENCE = "raw"  # runs before the first and after every method run; fractions divide by it
# Names IPython puts in user_ns on its own; they are not notebook state.
IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython", "open"}

BUILD_STATE_CODE = """\
import numpy as np
import torch

torch.manual_seed(0)
WIDTH, DEPTH = {width}, {depth}
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
model(torch.ones(8, WIDTH)).square().mean().backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
arr = np.random.default_rng(0).standard_normal({n_arr})
objs = [{{"id": i, "name": f"item{{i}}", "score": i * 0.5, "tags": ["a", "b"]}} for i in range({n_objs})]
lr = 0.01
"""
CHANGE_SCALAR_CODE = "lr = 0.02\n"


# --------------------------------------------------------------------------- workload sizing


def workload(scale: float) -> dict[str, int]:
    """Sizes for a scale: 1.0 is 42M params (504 MB with Adam), 200 MB array, 100k dicts."""
    # Params grow with width**2, so scaling the width by sqrt(scale) keeps bytes linear in scale.
    width = max(16, round(2048 * math.sqrt(scale)))
    return {
        "width": width,
        "depth": 10,
        "n_arr": max(1, int(25_000_000 * scale)),
        "n_objs": max(1, int(100_000 * scale)),
    }


def build_code(scale: float) -> str:
    return BUILD_STATE_CODE.format(**workload(scale))


# --------------------------------------------------------------------------- process probes


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def reset_peak_rss() -> bool:
    """Reset the kernel's VmHWM so the next peak covers only what follows (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bytes_written_by_process() -> int:
    """wchar counts every write() syscall of this process, whatever the storage layer does."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def settle_memory() -> None:
    """Free build temporaries back to the OS so they cannot hide a saver's own allocations."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def tree_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def tree_bytes(root: Path) -> int:
    """Allocated bytes of the files under root, each inode once (hard links share data)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for p in tree_files(root):
        st = p.stat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def tree_stamps(root: Path) -> dict[Path, tuple[int, int, int]]:
    """(inode, mtime, size) of root and everything under it, to spot what a save touched."""
    out = {}
    for p in [root, *root.rglob("*")]:
        st = p.stat()
        out[p] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def fsync_changed(root: Path, before: dict[Path, tuple[int, int, int]]) -> int:
    """fsync every file and folder a save created or modified, so each method pays for
    durability; cheap for what its writer already synced. Untouched files (an earlier
    checkpoint's data) are left alone: syncing them would be our cost, not the method's."""
    changed = [p for p, stamp in tree_stamps(root).items() if before.get(p) != stamp]
    for p in changed:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return len(changed)


def drop_page_cache(paths: list[Path]) -> str:
    """Evict files from the page cache so the next read hits the disk; returns what was used."""
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    used = "fadvise(DONTNEED)"
    if os.geteuid() == 0:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1")
            used += " + drop_caches"
        except OSError:
            pass
    return used


# --------------------------------------------------------------------------- the state itself


def user_state(ns: dict[str, Any]) -> dict[str, Any]:
    """The notebook's own variables: what a user would expect a checkpoint to keep."""
    return {
        k: v
        for k, v in ns.items()
        if not k.startswith("_") and k not in IPYTHON_NAMES and not isinstance(v, types.ModuleType)
    }


def state_tensors(ns: dict[str, Any]) -> list[Any]:
    import torch

    opt_state = [
        t for s in ns["optimizer"].state.values() for t in s.values() if torch.is_tensor(t)
    ]
    return list(ns["model"].state_dict().values()) + opt_state


def state_buffers(ns: dict[str, Any]) -> list[memoryview]:
    """The state as raw bytes: every tensor and array buffer, then the other values pickled."""
    import numpy as np

    arrays = [t.detach().reshape(-1).numpy() for t in state_tensors(ns)] + [ns["arr"]]
    views = [memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a in arrays]
    rest = {k: v for k, v in ns.items() if k not in ("model", "optimizer", "arr")}
    return [*views, memoryview(pickle.dumps(rest, protocol=5))]


def state_bytes(ns: dict[str, Any]) -> int:
    objs_bytes = len(pickle.dumps(ns["objs"], protocol=5))
    return sum(t.nbytes for t in state_tensors(ns)) + ns["arr"].nbytes + objs_bytes


def touch(ns: dict[str, Any]) -> int:
    """Make the state usable: read one byte of every 4 KiB page of every tensor and array
    (so lazily loaded or memory-mapped data is really in memory) and run one forward pass.

    Deliberately cheap: a float64 sum of 700 MB costs more CPU than reading it from disk, and
    would hide the difference between methods behind arithmetic they all share."""
    import numpy as np
    import torch

    touched = 0
    for tensor in [*state_tensors(ns), torch.from_numpy(np.ascontiguousarray(ns["arr"]))]:
        flat = tensor.detach().reshape(-1).view(torch.uint8)
        touched += int(flat[::4096].sum())
    with torch.no_grad():
        ns["model"](torch.ones(4, ns["model"][0].in_features))
    return touched


def fingerprint(ns: dict[str, Any]) -> dict[str, Any]:
    """What must match between the saving and the restoring process (computed off the clock)."""
    import torch

    model, optimizer = ns["model"], ns["optimizer"]
    tensors = state_tensors(ns)
    with torch.no_grad():
        forward = model(torch.ones(4, model[0].in_features)).sum(dtype=torch.float64).item()
    return {
        "tensor_sum": sum(t.sum(dtype=torch.float64).item() for t in tensors),
        "n_tensors": len(tensors),
        "arr_sum": float(ns["arr"].sum()),
        "n_objs": len(ns["objs"]),
        "last_obj": ns["objs"][-1]["name"],
        "lr": ns["lr"],
        "forward": forward,
        # A restore that copies parameters apart from the optimizer breaks training silently.
        "optimizer_shares_params": optimizer.param_groups[0]["params"][0] is model[0].weight,
    }


# --------------------------------------------------------------------------- methods (children)


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


class Method:
    """One way to checkpoint. A SAVE child calls build, save(1), change_scalar, save(2);
    a RESTORE child calls restore. Peers have no incremental mode, so save(2) is a full save."""

    def __init__(self, store: Path, scale: float) -> None:
        self.store = store
        self.scale = scale
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
        """Imports, shell and extension loading: same for every notebook, kept off the clock."""

    def restore(self) -> dict[str, Any]:
        raise NotImplementedError


class RawMethod(Method):
    """The disk's own speed, measured in the same harness as every method: the state's bytes
    (every tensor and array buffer, then the pickled plain objects) written as one file with
    write + fsync, and read back sequentially into one reused buffer. Fractions divide by it.

    It runs in the same kind of processes at the same points as the methods, because on a
    virtual machine the speed depends on when memory was last freed, not only on the disk:
    here a cold read right after dropping the page cache ran at 2.6 GB/s, the same read 10 s
    later at 0.8 GB/s. A sample taken elsewhere would compare unlike conditions."""

    def save(self, n: int) -> None:
        ns = user_state(self.shell.user_ns)
        with open(self.store / f"raw.{n}.bin", "wb", buffering=0) as f:
            for view in state_buffers(ns):
                while view.nbytes:
                    view = view[f.write(view) :]
            os.fsync(f.fileno())

    def restore(self) -> dict[str, Any]:
        buf = bytearray(64 << 20)
        with open(latest(self.store, "raw.*.bin"), "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
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
    def _load(self) -> Any:
        os.environ["JUPYTER_PAUSE_STORE"] = str(self.store / "store")
        os.environ["JUPYTER_PAUSE_NOTEBOOK"] = "/bench/notebook.ipynb"
        sys.path.insert(0, str(REPO))
        import jupyter_pause

        self.shell = new_shell()
        self.shell.run_line_magic("load_ext", "jupyter_pause")
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


class PauseDirectMethod(PauseMethod):
    """jupyter_pause with ``Checkpointer.direct_io = True``: data written around the page
    cache (O_DIRECT). See bench/README.md for why both configurations are in the table."""

    def _load(self) -> Any:
        jupyter_pause = super()._load()
        self.shell.run_line_magic("config", "Checkpointer.direct_io = True")
        return jupyter_pause


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


def latest(store: Path, pattern: str) -> Path:
    return max(store.glob(pattern), key=lambda p: p.name)


METHOD_CLASSES = {
    "raw": RawMethod,
    "pickle": PickleMethod,
    "dill": DillMethod,
    "torch": TorchMethod,
    "kishu": KishuMethod,
    "jupyter_pause": PauseMethod,
    "jupyter_pause_direct": PauseDirectMethod,
}


# --------------------------------------------------------------------------- child entry points


class Profiler:
    """cProfile around one measured step when --profile is given; off the numbers otherwise."""

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
        import io
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
        "state_rss": first["rss_before"],
        "build_s": build_s,
        "save": first,
        "incremental": second,
        "disk_bytes_first": first["disk_growth"],
        "fingerprint": fingerprint(ns),
        "note": method.note,
        "reported": method.reported,
    }


def child_restore(method: Method) -> dict[str, Any]:
    import numpy  # noqa: F401 - import cost is the same for every method; keep it off the clock
    import torch  # noqa: F401

    t_setup = time.perf_counter()
    method.prepare_restore()
    t0 = time.perf_counter()
    with Profiler(f"{type(method).__name__}-restore"):
        ns = method.restore()
        if ns:  # the raw reference reads bytes back; it has no state to touch
            touch(ns)
    seconds = time.perf_counter() - t0
    fp = fingerprint(ns) if ns else None
    return {
        "seconds": seconds,
        "setup_s": t0 - t_setup,
        "fingerprint": fp,
        "peak_rss": peak_rss(),
        "rss_after": rss(),
        "reported": method.reported,
        "note": method.note,
    }


def run_child(args: argparse.Namespace) -> int:
    store = Path(args.store)
    method = METHOD_CLASSES[args.method](store, args.scale)
    out = child_save(method) if args.child == "save" else child_restore(method)
    Path(args.out).write_text(json.dumps(out, default=repr))
    return 0


# --------------------------------------------------------------------------- orchestration


def spawn(args: argparse.Namespace, kind: str, method: str, store: Path) -> dict[str, Any]:
    out = store.parent / f"{method}.{kind}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--method",
        method,
        "--store",
        str(store),
        "--out",
        str(out),
        "--scale",
        str(args.scale),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{kind} timed out after {args.timeout}s"}
    if proc.returncode != 0 or not out.exists():
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        if args.verbose:
            print(proc.stderr[-4000:], file=sys.stderr)
        return {"error": f"{kind} failed: {tail[0][:160]}"}
    return json.loads(out.read_text())


def run_method(args: argparse.Namespace, work: Path, method: str) -> dict[str, Any]:
    store = work / method
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    saved = spawn(args, "save", method, store)
    if "error" in saved:
        return saved
    cache = drop_page_cache(tree_files(store))
    restored = spawn(args, "restore", method, store)
    shutil.rmtree(store, ignore_errors=True)
    if "error" in restored:
        return {**saved, "error": restored["error"]}
    ok = (
        None if restored["fingerprint"] is None else restored["fingerprint"] == saved["fingerprint"]
    )
    notes = [n for n in (saved["note"], restored.get("note")) if n]
    note = "; ".join(dict.fromkeys(notes))  # the shim note comes from both processes
    return {**saved, "restore": restored, "restore_cache_drop": cache, "ok": ok, "note": note}


def derive(row: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """Turn child measurements into the table's columns (None where unavailable)."""
    if "save" not in row:
        return {}
    sb = row["state_bytes"]
    save_s = row["save"]["seconds"]
    d = {
        "save_s": save_s,
        "save_frac": sb / save_s / MB / raw["write_mbps"],
        "disk_mb": row["disk_bytes_first"] / MB,
        "save_peak_mb": row["save"]["peak_rss"] / MB,
        "extra_mb": row["save"]["extra_peak"] / MB,
        "incr_s": row["incremental"]["seconds"],
        "incr_bytes": incremental_bytes(row),
        "state_mb": sb / MB,
    }
    if "restore" in row:
        rs = row["restore"]["seconds"]
        d |= {
            "restore_s": rs,
            "restore_frac": sb / rs / MB / raw["read_mbps"],
            "restore_peak_mb": row["restore"]["peak_rss"] / MB,
            "ok": row["ok"],
        }
    return d


def incremental_bytes(row: dict[str, Any]) -> int:
    """Largest of: write() bytes (misses mmap writes), disk growth (misses overwrites) and what
    the method itself reports, so no way of writing goes unseen."""
    inc = row["incremental"]
    reported = row.get("reported", {}).get("save2", {}).get("bytes_written", 0)
    return max(inc["wchar"], inc["disk_growth"], reported or 0)


def check_targets(d: dict[str, Any]) -> dict[str, bool]:
    checks = {
        "save_frac": d.get("save_frac", 0) >= TARGET_SAVE_FRACTION,
        "extra_mb": d.get("extra_mb", math.inf) <= TARGET_EXTRA_SAVE_MB,
        "incr_s": d.get("incr_s", math.inf) <= TARGET_INCREMENTAL_S,
        "incr_bytes": d.get("incr_bytes", math.inf) <= INCREMENTAL_BYTES_ALLOWANCE,
    }
    if "restore_frac" in d:
        checks["restore_frac"] = d["restore_frac"] >= TARGET_RESTORE_FRACTION
    return checks


def fmt(v: Any, spec: str, check: bool | None = None) -> str:
    if v is None:
        return "n/a"
    s = format(v, spec)
    return s if check is None else f"{s} {'PASS' if check else 'FAIL'}"


COLUMNS = [
    ("save s", "save_s", ".2f"),
    ("save frac (>=0.8)", "save_frac", ".2f"),
    ("restore s", "restore_s", ".2f"),
    ("restore frac (>=0.65)", "restore_frac", ".2f"),
    ("disk MB", "disk_mb", ".0f"),
    ("save peak RSS MB", "save_peak_mb", ".0f"),
    ("extra save MB (<=64)", "extra_mb", ".0f"),
    ("restore peak RSS MB", "restore_peak_mb", ".0f"),
    ("incr s (<=0.1)", "incr_s", ".3f"),
    ("incr bytes (~0)", "incr_bytes", ",.0f"),
]


def render(results: dict[str, Any], raw: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"## Checkpoint benchmark ({meta['when']}, scale {meta['scale']}, "
        f"{meta['cpus']} CPUs, state {meta['state_mb']:.0f} MB, "
        f"median of {meta['repeat']} run(s) per method, 1-min load average "
        f"{meta['loadavg_1min'][0]:.1f} at start / {meta['loadavg_1min'][1]:.1f} at end)",
        "",
        f"Raw disk, measured by the `{REFERENCE}` reference ({raw['samples']} runs, before the "
        f"first and after every method run, {raw['bytes'] / MB:.0f} MB each; median): "
        f"write+fsync **{raw['write_mbps']:.0f} MB/s** "
        f"(range {raw['write_mbps_range'][0]:.0f}-{raw['write_mbps_range'][1]:.0f}), "
        f"cold sequential read **{raw['read_mbps']:.0f} MB/s** "
        f"(range {raw['read_mbps_range'][0]:.0f}-{raw['read_mbps_range'][1]:.0f}); "
        f"page cache dropped with {raw['cache_drop']}.",
        "",
        "| method | " + " | ".join(c[0] for c in COLUMNS) + " | restored ok | targets |",
        "|---" * (len(COLUMNS) + 3) + "|",
    ]
    notes = []
    ordered = {REFERENCE: results[REFERENCE], **results} if REFERENCE in results else results
    for name, row in ordered.items():
        d = row["derived"]
        if not d:
            lines.append(
                f"| {name} | "
                + " | ".join([f"n/a: {row['error']}"] + [""] * (len(COLUMNS) + 1))
                + " |"
            )
            continue
        checks = check_targets(d) if name != REFERENCE else {}
        cells = [fmt(d.get(key), spec, checks.get(key)) for _, key, spec in COLUMNS]
        fails = [k for k, ok in checks.items() if not ok]
        verdict = "all PASS" if not fails else "FAIL: " + ", ".join(fails)
        if name == REFERENCE:
            verdict = "reference: the fractions' denominators"
        ok = {True: "yes", False: "NO (fingerprint differs)", None: "n/a"}[d.get("ok")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ok} | {verdict} |")
        if row.get("note"):
            notes.append(f"- {name}: {row['note']}")
        if row.get("error"):
            notes.append(f"- {name}: {row['error']}")
    lines += ["", *faster_than_peers(results), "", "Notes:", *notes, *STANDING_NOTES]
    return "\n".join(lines) + "\n"


STANDING_NOTES = [
    f"- save/restore frac compare each run with the mean of the two `{REFERENCE}` runs right "
    "before and right after it (the disk's speed drifts), then take the median. `raw` writes "
    "the state's buffers as one file with write+fsync and reads it back sequentially, in the "
    "same kind of processes at the same points as every method.",
    "- PASS/FAIL marks compare every row with jupyter_pause's targets; peers are not expected "
    "to meet them.",
    "- save s includes write + fsync; restore s runs in a fresh process from a cold page cache "
    "until one byte of every 4 KiB page of every tensor/array was read and one forward pass "
    "ran (imports excluded); the correctness fingerprint is computed off the clock.",
    "- incr: after the first checkpoint only `lr` changes and a second checkpoint is taken; "
    "peers re-save everything. incr bytes = max(write() bytes of the process, disk growth).",
    "- kishu runs with ENV_KISHU_TEST_MODE=1, which only skips the JupyterLab frontend round "
    "trips (saving the .ipynb) a headless shell cannot answer; its save is the commit in its "
    "post_run_cell hook (it checkpoints after every cell), its restore is `checkout`.",
    "- dill runs in a plain fresh `__main__` (dump_module of an IPython user module pickles the "
    "shell itself).",
]


def faster_than_peers(results: dict[str, Any]) -> list[str]:
    me = results.get("jupyter_pause", {}).get("derived")
    if not me:
        return ["jupyter_pause: no result, so no comparison with peers."]
    out = ["jupyter_pause vs every peer (lower is better):", ""]
    for label, key in [
        ("save s", "save_s"),
        ("restore s", "restore_s"),
        ("incr s", "incr_s"),
        ("extra save MB", "extra_mb"),
        ("incr bytes", "incr_bytes"),
    ]:
        peers = {
            n: r["derived"].get(key)
            for n, r in results.items()
            if n != REFERENCE
            and not n.startswith("jupyter_pause")  # its own variants are not peers
            and r["derived"]
            and r["derived"].get(key) is not None
        }
        if me.get(key) is None or not peers:
            out.append(f"- {label}: n/a")
            continue
        best = min(peers, key=peers.get)
        verdict = "PASS" if me[key] < peers[best] else "FAIL"
        out.append(
            f"- {label}: jupyter_pause {me[key]:.3g} vs best peer {best} "
            f"{peers[best]:.3g} -> {verdict}"
        )
    return out


def orchestrate(args: argparse.Namespace) -> int:
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.profile:
        (RESULTS / "profile").mkdir(parents=True, exist_ok=True)
        os.environ["BENCH_PROFILE_DIR"] = str(RESULTS / "profile")
    methods = [m for m in (args.methods.split(",") if args.methods else METHODS) if m != REFERENCE]
    load_start = os.getloadavg()[0]
    # The disk's (and the VM's) speed drifts, so the raw reference runs before the first and
    # after every method run, and each run is compared with the mean of the two around it.
    references = [run_reference(args, work)]
    results: dict[str, Any] = {}
    for method in methods:
        runs = []
        for i in range(args.repeat):
            print(f"[bench] {method} run {i + 1}/{args.repeat}", file=sys.stderr, flush=True)
            run = run_method(args, work, method)
            references.append(run_reference(args, work))
            run["raw"] = paired_raw(references[-2:])
            runs.append(run)
        results[method] = {"runs": runs, **{k: first(runs, k) for k in ("note", "error")}}
    raw = summarize_raw(references)
    for reference in references:
        reference["raw"] = paired_raw([reference])
    results[REFERENCE] = {"runs": references, "note": "", "error": ""}
    for row in results.values():
        row["derived"] = combine([derive(run, run["raw"]) for run in row["runs"]])
    nbytes = references[0]["state_bytes"]
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "scale": args.scale,
        "cpus": os.cpu_count(),
        "state_mb": nbytes / MB,
        "repeat": args.repeat,
        # Other processes on the machine skew every number; the header shows how busy it was.
        "loadavg_1min": (load_start, os.getloadavg()[0]),
        "python": sys.version.split()[0],
    }
    md = render(results, raw, meta)
    print(md)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.md").write_text(md)
    (RESULTS / "latest.json").write_text(
        json.dumps({"meta": meta, "raw": raw, "results": results}, indent=1, default=repr)
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


def first(runs: list[dict[str, Any]], key: str) -> Any:
    return next((r[key] for r in runs if r.get(key)), "")


def combine(derived: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-column median over repeated runs; 'ok' only if every run restored correctly."""
    import statistics

    good = [d for d in derived if d]
    out: dict[str, Any] = {}
    for key in good[0] if good else ():
        values = [d[key] for d in good if key in d]
        if key == "ok":  # None: nothing to check (the raw reference)
            out[key] = None if None in values else all(values)
        else:
            out[key] = statistics.median(values)
    return out


def run_reference(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One run of the raw reference, with its speeds; the benchmark is void without it."""
    run = run_method(args, work, REFERENCE)
    if "error" in run:
        raise SystemExit(f"the raw disk reference failed: {run['error']}")
    run["write_mbps"] = run["state_bytes"] / run["save"]["seconds"] / MB
    run["read_mbps"] = run["state_bytes"] / run["restore"]["seconds"] / MB
    return run


def paired_raw(around: list[dict[str, Any]]) -> dict[str, float]:
    return {k: sum(s[k] for s in around) / len(around) for k in ("write_mbps", "read_mbps")}


def summarize_raw(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of the samples (what fractions use) plus the spread, which the table shows."""
    import statistics

    out: dict[str, Any] = {
        "bytes": samples[0]["state_bytes"],
        "cache_drop": samples[0]["restore_cache_drop"],
    }
    for key in ("write_mbps", "read_mbps"):
        values = sorted(s[key] for s in samples)
        out[key] = statistics.median(values)
        out[key + "_range"] = (values[0], values[-1])
    out["samples"] = len(samples)
    out["all"] = [(round(s["write_mbps"]), round(s["read_mbps"])) for s in samples]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0, help="workload size (1.0 = ~710 MB)")
    p.add_argument("--quick", action="store_true", help="tiny smoke run (scale 0.01)")
    p.add_argument(
        "--methods",
        default="",
        help=f"comma list, default all: {','.join(METHODS)}",
    )
    p.add_argument("--workdir", default=str(RESULTS / "work"), help="scratch dir on the disk")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    p.add_argument("--repeat", type=int, default=1, help="runs per method; table shows medians")
    p.add_argument(
        "--profile", action="store_true", help="cProfile each step into bench/results/profile/"
    )
    p.add_argument("--verbose", action="store_true", help="print children's stderr on failure")
    p.add_argument("--child", choices=["save", "restore"], help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.scale = 0.01
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_child(args) if args.child else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
