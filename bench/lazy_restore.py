"""Ready before the bytes are in (issue 40): a lazy restore against the eager one and the peers.

For each state size, the same state (8 large arrays, half numpy, half torch, plus small
objects) is saved once by each method; then, round after round with the methods in rotated
order, each restores it in a fresh process with the page cache dropped first, and says:

- ready: from the call to every variable being there (the kernel would say Ready);
- next cell: from the call until a cell that reads one of the 8 arrays (all its bytes) ran;
- fully loaded: until every byte is in memory (the lazy load ended, or, for the peers, every
  page of every tensor was touched; the eager restore is fully loaded when it is ready);
- extra memory: the process's RSS after that, less before the call.

Methods: ``lazy`` (jupyter_pause, ``lazy_restore=True``), ``eager`` (jupyter_pause as
shipped), ``safetensors`` (``safe_open`` with its mmap, ``get_tensor`` for each),
``torch_mmap`` (``torch.load(mmap=True)``). The device: an ``O_DIRECT`` read of the lazy
restore's data files into fresh memory (``device.read_fresh``), in the same rounds.

    python bench/lazy_restore.py                      # 0.25, 1, 4, 8 GB, 3 rounds
    python bench/lazy_restore.py --sizes 1 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.device import read_fresh
from bench.workload import drop_page_cache

METHODS = ("lazy", "eager", "safetensors", "torch_mmap")
ARRAYS = 8
RESULTS = Path(__file__).resolve().parent / "results"


# -- the child processes -----------------------------------------------------------------------
def build_state(gigabytes: float) -> dict[str, Any]:
    import numpy as np
    import torch

    items = int(gigabytes * 1e9 / 4 / ARRAYS)
    state: dict[str, Any] = {}
    for i in range(ARRAYS):
        array = np.arange(items, dtype=np.float32) + i
        state[f"a{i}"] = array if i % 2 == 0 else torch.from_numpy(array)
    state["config"] = {"lr": 0.01, "steps": list(range(1000))}
    state["note"] = "small objects beside the arrays"
    return state


def write(folder: Path, gigabytes: float) -> None:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from jupyter_pause.kernel.api import Checkpointer

    state = build_state(gigabytes)
    Checkpointer(state, key=str(folder / "nb.ipynb"), store_root=str(folder / "store")).checkpoint()
    tensors = {
        k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
        for k, v in state.items()
        if k.startswith("a")
    }
    save_file(tensors, str(folder / "state.safetensors"))
    torch.save(tensors, folder / "state.pt")


def _touch_pages(value: Any) -> None:
    """Every page of an array or tensor in memory (one byte read per page)."""
    import numpy as np

    array = value.numpy() if hasattr(value, "numpy") else value
    np.asarray(array).reshape(-1).view(np.uint8)[::4096].sum()


def restore(folder: Path, method: str) -> dict[str, float]:
    import psutil
    import torch

    from jupyter_pause.kernel.api import Checkpointer

    process = psutil.Process()
    before = process.memory_info().rss
    started = time.perf_counter()
    load = None
    if method in ("lazy", "eager"):
        namespace: dict[str, Any] = {}
        checkpointer = Checkpointer(
            namespace,
            key=str(folder / "nb.ipynb"),
            store_root=str(folder / "store"),
            lazy_restore=method == "lazy",
        )
        result = checkpointer.restore()
        assert result.complete, result.summary()
        load = checkpointer.lazy_load
    elif method == "safetensors":
        from safetensors import safe_open

        with safe_open(str(folder / "state.safetensors"), framework="pt") as opened:
            namespace = {k: opened.get_tensor(k) for k in opened.keys()}  # noqa: SIM118
    else:
        namespace = torch.load(folder / "state.pt", mmap=True, weights_only=True)
    ready = time.perf_counter() - started
    total = float(namespace["a1"].sum())  # the next cell: one array, all its bytes
    assert total > 0
    next_cell = time.perf_counter() - started
    if load is not None:
        load.wait()
        assert load.outcome is not None and not load.outcome.failed
    elif method != "eager":
        for name in sorted(namespace):
            if name.startswith("a"):
                _touch_pages(namespace[name])
    fully = time.perf_counter() - started
    return {
        "ready": ready,
        "next_cell": next_cell,
        "fully_loaded": fully,
        "extra_mb": (process.memory_info().rss - before) / 1e6,
    }


# -- the parent ------------------------------------------------------------------------------------
def _child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}


def data_files(store: Path) -> list[Path]:
    """A jupyter_pause store's data files (packs and blobs)."""
    return sorted(
        p
        for p in store.rglob("*")
        if p.is_file() and (p.parent.name == "packs" or "blobs" in p.relative_to(store).parts)
    )


def measure(folder: Path, rounds: int) -> dict[str, list[dict[str, float]]]:
    every = sorted(p for p in folder.rglob("*") if p.is_file())
    ours = data_files(folder / "store")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in (*METHODS, "device")}
    for round_ in range(rounds):
        order = [*METHODS, "device"]
        shift = round_ % len(order)
        for method in order[shift:] + order[:shift]:
            cache = drop_page_cache(every)
            if method == "device":
                seconds = sum(read_fresh(path) for path in ours)
                runs[method].append({"fully_loaded": seconds})
            else:
                runs[method].append(_child("--restore", method, str(folder)))
            runs[method][-1]["cache"] = cache  # type: ignore[assignment]
    return runs


def _cell(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return "-"
    median = statistics.median(values) * scale
    return (
        f"{median:.{digits}f} ({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"
    )


def table(gigabytes: float, runs: dict[str, list[dict[str, float]]]) -> str:
    device = statistics.median(r["fully_loaded"] for r in runs["device"])
    lines = [
        f"\n{gigabytes:g} GB of arrays ({ARRAYS} arrays; device: O_DIRECT read into fresh "
        f"memory {device:.2f} s)\n",
        "| method | ready s | next cell s | fully loaded s | fully loaded / device | extra memory MB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method in METHODS:
        rows = runs[method]
        fully = [r["fully_loaded"] for r in rows]
        lines.append(
            f"| {method} | {_cell([r['ready'] for r in rows], digits=3)} "
            f"| {_cell([r['next_cell'] for r in rows])} | {_cell(fully)} "
            f"| {statistics.median(fully) / device:.2f} "
            f"| {_cell([r['extra_mb'] for r in rows], digits=0)} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.25,1,4,8", help="GB of arrays, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="where the states are written")
    parser.add_argument("--write", nargs=2, metavar=("FOLDER", "GB"), help=argparse.SUPPRESS)
    parser.add_argument("--restore", nargs=2, metavar=("METHOD", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        write(Path(args.write[0]), float(args.write[1]))
        return 0
    if args.restore:
        print(json.dumps(restore(Path(args.restore[1]), args.restore[0])))
        return 0
    results: dict[str, Any] = {"rounds": args.rounds, "methods": METHODS, "sizes": {}}
    started = time.time()
    for size in (float(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(dir=args.workdir, prefix="lazy-bench-") as scratch:
            folder = Path(scratch)
            _child("--write", str(folder), str(size))
            runs = measure(folder, args.rounds)
        results["sizes"][str(size)] = runs
        print(table(size, runs), flush=True)
    results["seconds"] = time.time() - started
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"lazy_restore-{stamp}.json").write_text(json.dumps(results, indent=1))
    print(f"\nResults: {RESULTS / f'lazy_restore-{stamp}.json'} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
