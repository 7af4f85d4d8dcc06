"""GPU live pause with the criu backend: a CUDA model paused as a process and resumed as itself.

A real jupyter server (``c.PauseApp.backend = "criu"``) runs a kernel that loads a model on the
GPU. The check pauses it (criu dump with NVIDIA's cuda-checkpoint around it), resumes it, and
verifies, printing one line per check:

* the same PID, and the server calls the resume live (proven by the kernel's token);
* the weights read back from VRAM after the resume are bit-identical (a hash of their bytes);
* the output on a fixed input is bit-identical;
* while paused, the kernel holds no GPU memory (``nvidia-smi``: its PID is gone from the
  compute apps and the GPU's used memory fell by what the model held);
* the frozen time (from the kernel stopping to it answering again), the dump and restore
  seconds and the image size.

Needs an NVIDIA GPU with driver >= 550, ``cuda-checkpoint`` (github.com/NVIDIA/cuda-checkpoint),
torch with CUDA, root and CRIU 4.1.1 (``tests/criu/criu.sh``). Anything missing: it says what
and exits 2. A failed check exits 1. Not run in CI.

    sudo .venv/bin/python bench/gpu_live_check.py                     # ~1 GB of weights
    sudo .venv/bin/python bench/gpu_live_check.py --mb 8192 --cuda-checkpoint /opt/cuda-checkpoint
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server_process import start_server  # noqa: E402

NOTEBOOK = "gpu_live.ipynb"

MODEL_CELL = """
import hashlib, os, time, torch
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)
WIDTH = 4096
model = torch.nn.Sequential(
    *[torch.nn.Linear(WIDTH, WIDTH) for _ in range(max(1, {mb} * 2**20 // (WIDTH * WIDTH * 4)))]
).cuda()
probe = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(7)).cuda()

def digest(tensors):
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        h.update(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

def facts():
    torch.cuda.synchronize()
    with torch.no_grad():
        out = model(probe)
    return {{"pid": os.getpid(), "weights": digest(model.parameters()), "output": digest([out]),
            "allocated": torch.cuda.memory_allocated(), "clock": time.time()}}
"""
FACTS = "import json; print(json.dumps(facts()))"


def missing(args: argparse.Namespace) -> list[str]:
    """What this machine lacks for the check, in words (empty: it can run)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root: criu needs root (or CAP_CHECKPOINT_RESTORE)")
    smi = shutil.which("nvidia-smi")
    gpus = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else ""
    if not gpus.strip():
        problems.append("no NVIDIA GPU (nvidia-smi missing or lists none)")
    if shutil.which(args.cuda_checkpoint) is None:
        problems.append(
            f"no cuda-checkpoint at {args.cuda_checkpoint!r} (github.com/NVIDIA/cuda-checkpoint, "
            "driver >= 550; --cuda-checkpoint PATH)"
        )
    probe = "import torch; print(torch.cuda.is_available())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if done.stdout.strip() != "True":
        problems.append(
            f"torch sees no CUDA device ({(done.stderr or done.stdout).strip()[-200:]})"
        )
    return problems


def gpu_memory() -> tuple[int, set[int]]:
    """(MiB used on all GPUs, PIDs holding GPU memory), from nvidia-smi."""
    used = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sum(int(u) for u in used), {int(p) for p in apps if p.isdigit()}


def event(timeline: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [e for e in timeline["events"] if e["kind"] == kind]
    return found[-1] if found else {"at": float("nan"), "data": {}}


def check(args: argparse.Namespace, work: Path) -> list[tuple[str, bool, str]]:
    criu = subprocess.run(
        ["bash", str(ROOT / "tests" / "criu" / "criu.sh")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    config = (
        "c.PauseApp.backend = 'criu'\n"
        f"c.PauseApp.criu_binary = {criu!r}\n"
        f"c.PauseApp.cuda_checkpoint_binary = {args.cuda_checkpoint!r}\n"
        f"c.PauseApp.store_root = {str(work / 'store')!r}\n"
        "c.PauseApp.gpus_per_kernel = 1\n"
    )
    root = work / "notebooks"
    root.mkdir()
    started = start_server(work / "server", root, config)
    server = started.server
    try:
        kernel_id = server.open_notebook(NOTEBOOK)
        server.run(kernel_id, MODEL_CELL.format(mb=args.mb), timeout=600)
        before = json.loads(server.run(kernel_id, FACTS))
        used_before, holders_before = gpu_memory()

        code, _ = server.request("POST", f"/jupyter-pause/pause/{NOTEBOOK}")
        paused = server.wait_state(NOTEBOOK, "paused", "active", timeout=1800)
        used_paused, holders_paused = gpu_memory()
        time.sleep(args.paused_seconds)

        server.request("POST", f"/jupyter-pause/resume/{NOTEBOOK}")
        ready = server.wait_state(NOTEBOOK, "ready", "partial", "failed", timeout=1800)
        after = json.loads(server.run(ready["kernel_id"] or kernel_id, FACTS))
        _, timeline = server.request("GET", f"/jupyter-pause/timeline/{NOTEBOOK}")
    finally:
        started.stop()
    snapshot = event(timeline, "snapshot_taken")["data"]
    restored = event(timeline, "state_restored")
    frozen = event(timeline, "kernel_ready")["at"] - event(timeline, "kernel_stopped")["at"]
    model_mib = before["allocated"] / 2**20
    return [
        (
            "paused with a process image",
            paused["state"] == "paused" and bool(snapshot),
            f"{paused['message']} (cuda: {snapshot.get('cuda')})",
        ),
        (
            "GPU memory free while paused",
            before["pid"] not in holders_paused and used_before - used_paused >= 0.9 * model_mib,
            f"{used_before} -> {used_paused} MiB used; model {model_mib:.0f} MiB; "
            f"kernel held GPU memory before: {before['pid'] in holders_before}",
        ),
        ("resumed live (token proof)", ready["how"] == "live", ready["message"]),
        ("same PID", after["pid"] == before["pid"], f"{before['pid']} -> {after['pid']}"),
        (
            "weights bit-identical (read back from VRAM)",
            after["weights"] == before["weights"],
            after["weights"],
        ),
        (
            "output bit-identical on the fixed input",
            after["output"] == before["output"],
            after["output"],
        ),
        (
            "frozen time",
            True,
            f"{frozen:.1f} s stopped (of which {args.paused_seconds} s paused on purpose); dump "
            f"{snapshot.get('seconds')} s, {snapshot.get('bytes', 0) / 1e9:.2f} GB image; restore "
            f"{restored['data'].get('seconds')} s; pause answered {code}",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mb", type=int, default=1024, help="weights on the GPU, MiB")
    parser.add_argument("--cuda-checkpoint", default="cuda-checkpoint")
    parser.add_argument("--paused-seconds", type=float, default=5.0)
    args = parser.parse_args()
    problems = missing(args)
    if problems:
        print("gpu_live_check cannot run here:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu-live-") as tmp:
        results = check(args, Path(tmp))
    width = max(len(name) for name, _, _ in results)
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name:<{width}}  {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
