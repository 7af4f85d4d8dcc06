"""How fast the `jupyter pause` command line answers, against `jupyter server list`.

Every command runs as a fresh process, as a user typing it would start it, with no server
running and then with one real Jupyter server (with jupyter_pause) running. The commands run
in rotated order over several rounds (each after each other); the table shows the median and
the range of every command's wall time, and its ratio to `jupyter server list` in the same
conditions.

    python bench/cli_speed.py                # 5 rounds x 5 runs per command and condition
    python bench/cli_speed.py --rounds 3 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS = {
    "jupyter pause status": [str(BIN / "jupyter"), "pause", "status"],
    "jupyter-pause status": [str(BIN / "jupyter-pause"), "status"],
    "jupyter server list": [str(BIN / "jupyter"), "server", "list"],
}
REFERENCE = "jupyter server list"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(env: dict[str, str], rounds: int, runs: int) -> dict[str, list[float]]:
    """Wall times per command: in round r the order starts at command r (rotation)."""
    names = list(COMMANDS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            times[name] += [timed(COMMANDS[name], env) for _ in range(runs)]
    return times


def start_server(env: dict[str, str], root: Path) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [
            str(BIN / "jupyter"),
            "server",
            "--no-browser",
            "--allow-root",
            f"--port={free_port()}",
            "--ServerApp.token=bench",
            f"--ServerApp.root_dir={root}",
            f"--PauseApp.store_root={root / 'store'}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runtime = Path(env["JUPYTER_RUNTIME_DIR"])
    deadline = time.monotonic() + 60
    while not list(runtime.glob("jpserver-*.json")):
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise SystemExit("the Jupyter server did not start")
        time.sleep(0.1)
    return server


def table(results: dict[str, dict[str, list[float]]]) -> str:
    lines = [
        "| condition | command | median ms | range ms | / `jupyter server list` |",
        "|---|---|---|---|---|",
    ]
    for condition, times in results.items():
        reference = statistics.median(times[REFERENCE])
        for name, samples in times.items():
            median = statistics.median(samples)
            lines.append(
                f"| {condition} | `{name}` | {median * 1000:.0f} | "
                f"{min(samples) * 1000:.0f}-{max(samples) * 1000:.0f} | {median / reference:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5, help="runs of each command per round")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="jupyter-pause-cli-bench-"))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(scratch / "runtime")}
    env.pop("JUPYTER_PAUSE_URL", None)
    (scratch / "runtime").mkdir()
    results = {"no server": measure(env, args.rounds, args.runs)}
    server = start_server(env, scratch)
    try:
        results["one server running"] = measure(env, args.rounds, args.runs)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)
    print(table(results))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "cli_speed.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
