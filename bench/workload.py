"""The benchmark's notebook state and the probes its child processes take.

The state is built by one notebook cell, the same in every process (fixed seeds): an MLP of
10 square ``Linear`` layers and its Adam optimizer after one step (weights, ``exp_avg`` and
``exp_avg_sq``: 71% of the bytes), a float64 numpy array (28%) and a list of small dicts
(1%), plus a scalar ``lr``. ``--gb`` sizes all three together, so cost can be plotted
against state size.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import pickle
import types
from pathlib import Path
from typing import Any

MB = 1e6
GB = 1e9

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
_DEPTH = 10
_PICKLED_BYTES_PER_OBJ = 70  # measured: 100k dicts pickle to ~7 MB


# --------------------------------------------------------------------------- sizing


def workload(scale: float) -> dict[str, int]:
    """Sizes for a scale: 1.0 is 42M params (504 MB with Adam), 200 MB array, 100k dicts."""
    # Params grow with width**2, so scaling the width by sqrt(scale) keeps bytes linear in scale.
    width = max(16, round(2048 * math.sqrt(scale)))
    return {
        "width": width,
        "depth": _DEPTH,
        "n_arr": max(1, int(25_000_000 * scale)),
        "n_objs": max(1, int(100_000 * scale)),
    }


def expected_bytes(scale: float) -> int:
    """The state's bytes at a scale (tensors + array + pickled dicts), before building it."""
    w = workload(scale)
    params = w["depth"] * (w["width"] ** 2 + w["width"])
    return 3 * 4 * params + 8 * w["n_arr"] + _PICKLED_BYTES_PER_OBJ * w["n_objs"]


def scale_for_gb(gb: float) -> float:
    """The scale whose state is ``gb`` GB (to a fraction of a percent)."""
    low, high = 0.0, 1.0
    while expected_bytes(high) < gb * GB:
        high *= 2
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if expected_bytes(middle) < gb * GB else (low, middle)
    return high


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


def tensor_bytes(tensor: Any) -> memoryview:
    """A tensor's or array's bytes, without a copy for contiguous ones."""
    import numpy as np
    import torch

    if isinstance(tensor, np.ndarray):
        return memoryview(np.ascontiguousarray(tensor).reshape(-1).view(np.uint8))
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())


def state_views(ns: dict[str, Any]) -> list[memoryview]:
    """The state as raw bytes: every tensor and array buffer, then the other values pickled."""
    rest = {k: v for k, v in ns.items() if k not in ("model", "optimizer", "arr")}
    return [
        *(tensor_bytes(t) for t in [*state_tensors(ns), ns["arr"]]),
        memoryview(pickle.dumps(rest, protocol=5)),
    ]


def state_bytes(ns: dict[str, Any]) -> int:
    objs_bytes = len(pickle.dumps(ns["objs"], protocol=5))
    return sum(t.nbytes for t in state_tensors(ns)) + ns["arr"].nbytes + objs_bytes


def read_every_tensor(ns: dict[str, Any]) -> list[str]:
    """The "usable" point of a restore: every byte of every tensor and array read (hashed,
    xxh3, ~20 GB/s here, the same cost for every method), so data a method maps or loads
    lazily is really in memory. Returns the digests, which the fingerprint compares."""
    import xxhash

    return [xxhash.xxh3_128_hexdigest(tensor_bytes(t)) for t in [*state_tensors(ns), ns["arr"]]]


def fingerprint(ns: dict[str, Any], digests: list[str] | None = None) -> dict[str, Any]:
    """What must match between the saving and the restoring process: every tensor and array
    bit for bit, the plain values, and that the optimizer still holds the model's parameters."""
    model, optimizer = ns["model"], ns["optimizer"]
    return {
        "digests": digests if digests is not None else read_every_tensor(ns),
        "n_objs": len(ns["objs"]),
        "last_obj": ns["objs"][-1]["name"],
        "lr": ns["lr"],
        # A restore that copies parameters apart from the optimizer breaks training silently.
        "optimizer_shares_params": optimizer.param_groups[0]["params"][0] is model[0].weight,
    }
