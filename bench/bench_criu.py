"""Benchmark: a CRIU process image of a kernel against its application checkpoint, same state.

Per state size (numpy arrays of random float64, incompressible), in every round:

* raw: the disk itself, in this process: the state's size written with write + fsync, and read
  back sequentially after the page cache was dropped. Fractions divide by it.
* checkpoint: ``jupyter_pause.checkpoint()`` in a kernel holding the state, then (page cache
  dropped) ``jupyter_pause.restore()`` in a new kernel; the times are the calls, measured in
  the kernels; starting the new kernel is a column of its own.
* criu: the criu backend's dump of a kernel holding the state (``criu dump`` with the
  backend's options, image fsynced) and (page cache dropped) its restore; the restored
  kernel answers over the connection that was open at the dump, with the same PID and state.

The three run in a rotated order, one rotation per round and size, so that none always runs
on a disk just written to or on memory just freed. The table shows medians and ranges.

    sudo .venv/bin/python bench/bench_criu.py                  # 256 MB, 1 GB, 2 GB; 3 rounds
    sudo .venv/bin/python bench/bench_criu.py --sizes-mb 64 --rounds 1   # smoke run

Needs root (criu) and CRIU 4.1.1 (``tests/criu/criu.sh`` builds it; ``--criu`` to choose).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench_checkpoint import MB, drop_page_cache  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

from jupyter_pause.backends.criu_tool import Criu, image_bytes, outside_files  # noqa: E402

METHODS = ("raw", "checkpoint", "criu")

STATE_CELL = """
import numpy as np, os, time, jupyter_pause
_rng = np.random.default_rng(0)
data = [_rng.random(n) for n in {counts}]
def fingerprint():
    return [os.getpid(), round(float(sum(a.sum() for a in data)), 3)]
"""


class Kernel:
    """A python3 kernel of this process (as a server's), with one client held open."""

    def __init__(self, store: Path) -> None:
        env = {**os.environ, "JUPYTER_PAUSE_STORE": str(store), "JUPYTER_PAUSE_NOTEBOOK": "bench"}
        self.km = AsyncKernelManager(kernel_name="python3")
        self.env = env
        self.client: Any = None

    async def start(self) -> float:
        started = time.perf_counter()
        await self.km.start_kernel(env=self.env)
        self.client = self.km.client()
        self.client.start_channels()
        await self.client.wait_for_ready(timeout=120)
        return time.perf_counter() - started

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid

    async def value(self, expression: str, timeout: float = 600) -> Any:
        """Evaluate ``expression`` in the kernel; its value (JSON)."""
        reply = await self.client.execute(
            "",
            user_expressions={"r": f"__import__('json').dumps({expression})"},
            reply=True,
            timeout=timeout,
        )
        result = reply["content"]["user_expressions"]["r"]
        if result["status"] != "ok":
            raise RuntimeError(f"{expression}: {result['ename']}: {result['evalue']}")
        return json.loads(ast.literal_eval(result["data"]["text/plain"]))

    async def run(self, code: str) -> None:
        reply = await self.client.execute(code, reply=True, timeout=600)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{reply['content']['ename']}: {reply['content']['evalue']}")

    async def close(self) -> None:
        self.client.stop_channels()
        await self.km.shutdown_kernel(now=True)


def counts(size_mb: int) -> list[int]:
    """float64 counts of arrays of at most 256 MiB that add up to ``size_mb`` MiB."""
    left, out = size_mb * 2**20 // 8, []
    while left:
        out.append(min(left, 2**25))
        left -= out[-1]
    return out


def raw(work: Path, size_mb: int) -> dict[str, float]:
    path = work / "raw.bin"
    block = os.urandom(8 << 20)
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(size_mb // 8):
            f.write(block)
        os.fsync(f.fileno())
    write_s = time.perf_counter() - started
    drop_page_cache([path])
    buf = bytearray(64 << 20)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    read_s = time.perf_counter() - started
    path.unlink()
    return {
        "write_mbps": size_mb * 2**20 / MB / write_s,
        "read_mbps": size_mb * 2**20 / MB / read_s,
    }


async def checkpoint(work: Path, size_mb: int) -> dict[str, Any]:
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    kernel = Kernel(store)
    await kernel.start()
    try:
        await kernel.run(STATE_CELL.format(counts=counts(size_mb)))
        expected = await kernel.value("fingerprint()[1]")
        save = await kernel.value(
            "(lambda t: (jupyter_pause.checkpoint(), time.perf_counter() - t)[1])"
            "(time.perf_counter())"
        )
    finally:
        await kernel.close()
    drop_page_cache([p for p in store.rglob("*") if p.is_file()])
    fresh = Kernel(store)
    start_s = await fresh.start()
    try:
        await fresh.run("import time, jupyter_pause")
        restore = await fresh.value(
            "(lambda t: (jupyter_pause.restore(), time.perf_counter() - t)[1])(time.perf_counter())"
        )
        got = await fresh.value("round(float(sum(a.sum() for a in data)), 3)")
    finally:
        await fresh.close()
    disk = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    return {
        "save_s": save,
        "restore_s": restore,
        "new_kernel_s": start_s,
        "disk_bytes": disk,
        "ok": got == expected,
    }


async def criu_round(work: Path, size_mb: int, criu: Criu) -> dict[str, Any]:
    images = work / "images"
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(mode=0o700)
    kernel = Kernel(work / "store")
    await kernel.start()
    restored_pid = None
    try:
        await kernel.run(STATE_CELL.format(counts=counts(size_mb)))
        expected = await kernel.value("fingerprint()")
        pid = kernel.pid
        outside = outside_files(pid)
        dump_s = await asyncio.to_thread(criu.dump, pid, images, outside)
        kernel.km.provisioner.process.wait()  # criu ended it: reap it, its PID is free again
        size = image_bytes(images)
        drop_page_cache([p for p in images.iterdir() if p.is_file()])
        restored_pid, restore_s = await asyncio.to_thread(
            criu.restore, images, outside, images / "restored.pid"
        )
        # over the very connection the client held at the dump
        got = await kernel.value("fingerprint()", timeout=60)
    finally:
        kernel.client.stop_channels()
        victim = restored_pid or (
            kernel.pid if kernel.km.provisioner.process.poll() is None else None
        )
        if victim:
            os.kill(victim, signal.SIGKILL)
            os.waitpid(victim, 0)
        await kernel.km.cleanup_resources()
    return {
        "dump_s": dump_s,
        "restore_s": restore_s,
        "image_bytes": size,
        "ok": got == expected,
    }


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


COLUMNS = (
    ("raw write MB/s", "raw", "write_mbps", None),
    ("raw read MB/s", "raw", "read_mbps", None),
    ("checkpoint save s", "checkpoint", "save_s", None),
    ("save frac", "checkpoint", "save_s", "write_mbps"),
    ("checkpoint restore s", "checkpoint", "restore_s", None),
    ("restore frac", "checkpoint", "restore_s", "read_mbps"),
    ("new kernel s", "checkpoint", "new_kernel_s", None),
    ("criu dump s", "criu", "dump_s", None),
    ("dump frac", "criu", "dump_s", "write_mbps"),
    ("image MB", "criu", "image_bytes", None),
    ("criu restore s", "criu", "restore_s", None),
    ("restore frac", "criu", "restore_s", "read_mbps"),
)


def column(
    rounds: list[dict[str, Any]], state: float, method: str, key: str, ref: str | None
) -> str:
    """Medians (ranges) over the rounds; a fraction is the state's bytes per second over the
    raw disk's, both of the same round."""
    if ref is not None:
        return spread([state / r[method][key] / r["raw"][ref] for r in rounds])
    scale = MB if key.endswith("bytes") else 1
    return spread([r[method][key] / scale for r in rounds])


def table(results: dict[int, list[dict[str, Any]]]) -> str:
    head = ["state MB", *(name for name, *_ in COLUMNS), "restored ok"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size_mb, rounds in sorted(results.items()):
        state = size_mb * 2**20 / MB
        ok = all(r["checkpoint"]["ok"] and r["criu"]["ok"] for r in rounds)
        cells = [column(rounds, state, *spec) for _name, *spec in COLUMNS]
        lines.append("| " + " | ".join([f"{state:.0f}", *cells, "yes" if ok else "NO"]) + " |")
    return "\n".join(lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes-mb", default="256,1024,2048")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--criu", help="criu binary (default: the one tests/criu/criu.sh built)")
    parser.add_argument("--workdir", default=str(HERE / "results" / "criu-work"))
    args = parser.parse_args()
    binary = (
        args.criu
        or subprocess.run(
            ["bash", str(ROOT / "tests" / "criu" / "criu.sh")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
    )
    criu = Criu(binary)
    if problem := criu.check():
        print(f"criu cannot run here: {problem}", file=sys.stderr)
        return 2
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    results: dict[int, list[dict[str, Any]]] = {s: [] for s in sizes}
    for rnd in range(args.rounds):
        for index, size_mb in enumerate(sizes):
            shift = (rnd + index) % len(METHODS)
            row: dict[str, Any] = {}
            for method in METHODS[shift:] + METHODS[:shift]:
                if method == "raw":
                    row[method] = raw(work, size_mb)
                elif method == "checkpoint":
                    row[method] = await checkpoint(work, size_mb)
                else:
                    row[method] = await criu_round(work, size_mb, criu)
                print(f"round {rnd + 1} {size_mb} MB {method}: {row[method]}", file=sys.stderr)
            results[size_mb].append(row)
    text = table(results)
    print(text)
    out = HERE / "results"
    (out / "criu.md").write_text(text + "\n")
    (out / "criu.json").write_text(json.dumps(results, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
