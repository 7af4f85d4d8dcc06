"""Export and import of a session file, against a plain ``tar`` of the same files.

Two jupyter servers with jupyter_pause (``tests/server_process.py``: each its own root and
store, the ``local`` backend), a notebook holding ``--mb`` MB of numpy data, checkpointed and
paused on the first. Measured, each in the same round and in an order rotated by one per
round:

* ``export``: ``jupyter pause export`` until the file is complete (the server hashes the
  checkpoint's files, writes the tar stream, the CLI downloads it), and the server's resident
  memory at its peak during it, sampled every 20 ms, above what it held before;
* ``import``: ``jupyter pause import`` of that file into the second server (uploaded, every
  member checked, placed), and its server's peak memory likewise;
* ``tar``: ``tar -cf`` of the same files (the store folder of the notebook), then ``tar -xf``
  of it into an empty folder: the device's own speed for the same bytes.

The table gives medians (ranges) over the rounds.

    python bench/session_file.py --mb 2048 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server_process import ServerProcess, start_server  # noqa: E402

EMPTY = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


class PeakMemory:
    """The peak resident memory of a process while the block runs, above its level before."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.before = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def grew_mb(self) -> float:
        return (self.peak - self.before) / 2**20


def server(folder: Path, name: str) -> ServerProcess:
    root = folder / f"{name}-root"
    root.mkdir(parents=True)
    store = folder / f"{name}-store"
    config = f"c.PauseApp.backend = 'local'\nc.PauseApp.store_root = {str(store)!r}\n"
    return start_server(folder / f"{name}-server", root, config)


def cli(started: ServerProcess, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", *args, "--url", started.server.url,
         "--token", started.server.token, "--json"],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def prepared(folder: Path, mb: int) -> tuple[ServerProcess, Path]:
    """A server whose notebook holds ``mb`` MB, paused: (server, its store folder)."""
    here = server(folder, "here")
    (folder / "here-root" / "big.ipynb").write_text(json.dumps(EMPTY))
    kernel = here.server.open_notebook("big.ipynb")
    here.server.run(
        kernel,
        f"import numpy as np\ndata = np.random.default_rng(0).random({mb * 2**20 // 8})",
        timeout=900,
    )
    code, _ = here.server.request("POST", "/jupyter-pause/pause/big.ipynb")
    assert code == 202
    here.server.wait_state("big.ipynb", "paused", "active", timeout=900)
    (store,) = [p for p in (folder / "here-store").iterdir() if p.name.startswith("big.ipynb")]
    return here, store


def measure(method: str, folder: Path, here: ServerProcess, store: Path, n: int) -> dict:
    if method == "tar":
        archive, out = folder / f"plain-{n}.tar", folder / f"untarred-{n}"
        out.mkdir()
        started = time.monotonic()
        subprocess.run(["tar", "-cf", str(archive), "-C", str(store), "."], check=True)
        packed = time.monotonic() - started
        started = time.monotonic()
        subprocess.run(["tar", "-xf", str(archive), "-C", str(out)], check=True)
        unpacked = time.monotonic() - started
        archive.unlink()
        subprocess.run(["rm", "-rf", str(out)], check=True)
        return {"export_s": packed, "import_s": unpacked}
    target = folder / f"big-{n}.jpsession"
    with PeakMemory(here.process.pid) as exported:
        started = time.monotonic()
        cli(here, "export", "big.ipynb", "-o", str(target))
        export_s = time.monotonic() - started
    there = server(folder, f"there-{n}")
    try:
        with PeakMemory(there.process.pid) as imported:
            started = time.monotonic()
            cli(there, "import", str(target), "--as", "big.ipynb")
            import_s = time.monotonic() - started
    finally:
        there.stop()
    size = target.stat().st_size
    target.unlink()
    return {"export_s": export_s, "import_s": import_s, "bytes": size,
            "export_mem_mb": exported.grew_mb, "import_mem_mb": imported.grew_mb}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of notebook data (default 1024)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    methods = ["session-file", "tar"]
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="jp-bench-session-file-") as tmp:
        folder = Path(tmp)
        here, store = prepared(folder, args.mb)
        try:
            for number in range(args.rounds):
                shift = number % len(methods)
                row = {}
                for method in methods[shift:] + methods[:shift]:
                    row[method] = measure(method, folder, here, store, number)
                    print(f"round {number + 1} {method}: {row[method]}", file=sys.stderr)
                rounds.append(row)
        finally:
            here.stop()
    ours = [r["session-file"] for r in rounds]
    plain = [r["tar"] for r in rounds]
    print("| method | export / tar -cf s | import / tar -xf s | peak server memory growth MB |")
    print("|---|---|---|---|")
    print(
        f"| session file (jupyter pause export / import) | {spread([o['export_s'] for o in ours])} "
        f"| {spread([o['import_s'] for o in ours])} | export "
        f"{spread([o['export_mem_mb'] for o in ours])}, import "
        f"{spread([o['import_mem_mb'] for o in ours])} |"
    )
    print(
        f"| plain tar of the same files | {spread([p['export_s'] for p in plain])} "
        f"| {spread([p['import_s'] for p in plain])} | - |"
    )
    ratio_out = [o["export_s"] / p["export_s"] for o, p in zip(ours, plain, strict=True)]
    ratio_in = [o["import_s"] / p["import_s"] for o, p in zip(ours, plain, strict=True)]
    print(
        f"\n{args.mb} MB of notebook data ({ours[0]['bytes'] / 2**20:.0f} MiB session file); "
        f"{len(rounds)} rounds, medians (ranges); export / tar -cf {spread(ratio_out)}, "
        f"import / tar -xf {spread(ratio_in)}."
    )


if __name__ == "__main__":
    main()
