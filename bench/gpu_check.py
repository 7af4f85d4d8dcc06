"""GPU round trip: CUDA model + Adam saved with jupyter_pause and restored in a fresh process.

Checks that every tensor comes back on its original device and that one more training step
after the restore gives bit-identical loss, weights and optimizer state to the original process
taking the same step; that the restored values are bit-identical to the saved ones; that a CUDA
stream is skipped with its reason; and that the same checkpoint restored with no GPU visible
(`CUDA_VISIBLE_DEVICES=`) puts every tensor on the CPU, says so, and keeps the values.

Prints save/restore seconds and GB/s, and puts the restore (large CUDA storages are streamed
from the disk through pinned buffers onto the device, ``jupyter_pause.kernel.device_reads``)
against its two ceilings measured in the same run: the disk's cold read of the checkpoint's
own data files (``device.read_direct``, O_DIRECT, four 8 MiB reads in flight) and the
host-to-device copy bandwidth from pinned memory. Needs an NVIDIA GPU; without one it prints
"no CUDA device: skipped" and exits 0. Not run in CI.

    python bench/gpu_check.py              # ~1.6 GB of model + Adam state
    python bench/gpu_check.py --gib 8.3    # the 8.3 GiB model of the GKE Pod Snapshots numbers
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import device  # noqa: E402
from methods import new_shell, run_cell  # noqa: E402
from workload import drop_page_cache, tree_files  # noqa: E402

GB = 1e9
GIB = 1 << 30
_BYTES_AT_SCALE_1 = 8 * (4096 * 4096 + 4096) * 4 * 3  # 8 x Linear(4096): weights + Adam

# Deterministic kernels, so a difference can only come from the restored state.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# Process-wide settings and imports are not notebook state: a restored kernel runs them again,
# as a user re-runs the imports cell.
SETUP_CODE = """\
import torch

torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
"""

BUILD_CODE = """\
torch.manual_seed(0)
WIDTH, DEPTH, BATCH = {width}, {depth}, 64
layers = []
for _ in range(DEPTH):
    layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers).to("{device}")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
step_no = 0
"""

# The same step in both processes; its batch comes from its own seeded generator so the
# check isolates the restored tensors from the (separately checked) global RNG state.
STEP_CODE = """\
step_no += 1
_g = torch.Generator(device="{device}").manual_seed(1234 + step_no)
_x = torch.randn(BATCH, WIDTH, device="{device}", generator=_g)
_loss = model(_x).square().mean()
optimizer.zero_grad(set_to_none=True)
_loss.backward()
optimizer.step()
step_loss = _loss.item()
del _g, _x, _loss
"""


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rng_state() -> list[int]:
    import torch

    state = torch.cuda.get_rng_state() if torch.cuda.is_available() else torch.get_rng_state()
    return state.tolist()


def state_tensors(ns: dict[str, Any]) -> dict[str, Any]:
    import torch

    out = {f"model.{k}": v for k, v in ns["model"].state_dict().items()}
    # optimizer.state, not state_dict(): the latter imports torch._dynamo (1+ s) on first use.
    params = [p for group in ns["optimizer"].param_groups for p in group["params"]]
    for i, param in enumerate(params):
        state = ns["optimizer"].state.get(param, {})
        out |= {f"adam.{i}.{k}": v for k, v in state.items() if torch.is_tensor(v)}
    return out


def digest(ns: dict[str, Any], with_device: bool = True) -> dict[str, Any]:
    """Bit-exact fingerprint: a hash of every tensor's bytes and dtype (and its device)."""
    import torch

    sync()
    out = {}
    for name, t in state_tensors(ns).items():
        raw = t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()
        value = f"{t.dtype}/{hashlib.blake2b(raw, digest_size=16).hexdigest()}"
        out[name] = f"{t.device}/{value}" if with_device else value
    return out


def load_pause(store: Path) -> Any:
    os.environ["JUPYTER_PAUSE_STORE"] = str(store)
    os.environ["JUPYTER_PAUSE_NOTEBOOK"] = "/bench/gpu_check.ipynb"
    import jupyter_pause

    shell = new_shell()
    shell.run_line_magic("load_ext", "jupyter_pause")
    return jupyter_pause, shell


def child_save(store: Path, scale: float, device: str) -> dict[str, Any]:
    jp, shell = load_pause(store)
    width = max(64, round(4096 * math.sqrt(scale)))
    run_cell(shell, SETUP_CODE)
    run_cell(shell, BUILD_CODE.format(width=width, depth=8, device=device))
    run_cell(shell, STEP_CODE.format(device=device))
    if device == "cuda":
        # Not saveable: a device queue belongs to one process. Must be skipped with its reason.
        run_cell(shell, "side_stream = torch.cuda.Stream()")
    ns = shell.user_ns
    nbytes = sum(t.nbytes for t in state_tensors(ns).values())
    rng = rng_state()  # what the checkpoint captures
    values = digest(ns, with_device=False)
    sync()
    t0 = time.perf_counter()
    res = jp.checkpoint()
    save_s = time.perf_counter() - t0
    # The original process now takes the step the restored one will take.
    run_cell(shell, STEP_CODE.format(device=device))
    return {
        "save_s": save_s,
        "state_bytes": nbytes,
        "bytes_written": res.bytes_written,
        "skipped": res.skipped,
        "values": values,
        "after_step": {"loss": ns["step_loss"], "tensors": digest(ns)},
        "rng": rng,
    }


def host_to_device_gbps() -> float | None:
    """Copy bandwidth from pinned host memory to the GPU (best of 3 copies of 1 GiB)."""
    import torch

    if not torch.cuda.is_available():
        return None
    host = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    best = math.inf
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        target.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del host, target
    torch.cuda.empty_cache()
    return GIB / best / GB


def child_restore(store: Path, device: str) -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        torch.cuda.init()  # CUDA context creation is per process, not restore work
    h2d = host_to_device_gbps()  # before the clock; the page cache stays cold
    jp, shell = load_pause(store)
    # The user's setup cell, as a restored notebook runs it first. Off the clock: restoring
    # use_deterministic_algorithms(True) otherwise costs an import of torch._dynamo (~2 s),
    # which is torch's price for that setting, not the data's.
    run_cell(shell, SETUP_CODE)
    t0 = time.perf_counter()
    res = jp.restore()
    # Usable means on the device and materialized: touch every tensor, wait for the GPU.
    ns = shell.user_ns
    touched = sum(float(t.float().sum()) for t in state_tensors(ns).values())
    sync()
    restore_s = time.perf_counter() - t0
    devices = {k: str(t.device) for k, t in state_tensors(ns).items()}
    found = {
        "restore_s": restore_s,
        "h2d_gbps": h2d,
        "restore_call_s": res.seconds,
        "failed": res.failed,
        "warnings": res.warnings,
        "touched": touched,
        "devices": devices,
        "values": digest(ns, with_device=False),
    }
    if not torch.cuda.is_available() and device == "cuda":
        return found  # the CPU-fallback child: a GPU step cannot run here
    found["rng"] = rng_state()
    run_cell(shell, STEP_CODE.format(device=device))
    found["after_step"] = {"loss": ns["step_loss"], "tensors": digest(ns)}
    return found


def spawn(
    kind: str, store: Path, args: argparse.Namespace, env: dict[str, str] | None = None
) -> dict[str, Any]:
    out = store.parent / f"gpu.{kind}.json"
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "save" if kind == "save" else "restore",
        "--store",
        str(store),
        "--scale",
        str(args.scale),
        "--device",
        args.device,
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{kind} child failed (exit {proc.returncode})")
    return json.loads(out.read_text())


def differing(want: dict[str, str], got: dict[str, str]) -> list[str]:
    return [k for k in want if want[k] != got.get(k)]


def count_detail(diff: list[str], total: int) -> str:
    return f"{len(diff)} differ: {', '.join(diff[:5])}" if diff else f"{total} tensors"


def compare(
    saved: dict[str, Any], restored: dict[str, Any], fallback: dict[str, Any] | None
) -> list[tuple[str, bool, str]]:
    """(check, passed, detail) rows."""
    want, got = saved["after_step"], restored["after_step"]
    wrong_device = [
        k for k, d in restored["devices"].items() if d != want["tensors"][k].split("/")[0]
    ]
    changed = differing(saved["values"], restored["values"])
    after_step = differing(want["tensors"], got["tensors"])
    rows = [
        ("restore reported no failures", not restored["failed"], str(restored["failed"] or "")),
        ("tensors back on their devices", not wrong_device, ", ".join(wrong_device[:5])),
        (
            "restored values bit-identical to saved",
            not changed,
            count_detail(changed, len(saved["values"])),
        ),
        (
            "next-step loss bit-identical",
            want["loss"] == got["loss"],
            f"{want['loss']!r} vs {got['loss']!r}",
        ),
        (
            "next-step weights + Adam state bit-identical",
            not after_step,
            count_detail(after_step, len(want["tensors"])),
        ),
        # Informational: jupyter_pause restores RNG states; a mismatch here does not fail.
        (
            "RNG state restored (info)",
            True,
            "same" if saved["rng"] == restored["rng"] else "differs",
        ),
    ]
    if fallback is not None:  # a GPU run (the CPU self-test has neither stream nor fallback)
        reason = saved["skipped"].get("side_stream", "")
        rows.append(("CUDA stream skipped with its reason", "CUDA stream" in reason, reason))
        off_cpu = [k for k, d in fallback["devices"].items() if d != "cpu"]
        warned = [w for w in fallback["warnings"] if "restored on the CPU" in w]
        changed = differing(saved["values"], fallback["values"])
        rows += [
            ("no GPU visible: restore reported no failures", not fallback["failed"], ""),
            ("no GPU visible: every tensor on the CPU", not off_cpu, ", ".join(off_cpu[:5])),
            ("no GPU visible: a warning says so", bool(warned), (warned or [""])[0]),
            (
                "no GPU visible: values bit-identical to saved",
                not changed,
                count_detail(changed, len(saved["values"])),
            ),
        ]
    return rows


def raw_read(store: Path) -> dict[str, float]:
    """The disk's cold read of the checkpoint's data files (O_DIRECT, best of two reads)."""
    files = [p for p in tree_files(store) if "/blobs/" in str(p) or "/packs/" in str(p)]
    nbytes = sum(p.stat().st_size for p in files)
    best = math.inf
    for _ in range(2):
        drop_page_cache(files)
        best = min(best, sum(device.read_direct(p) for p in files))
    return {"bytes": nbytes, "seconds": best}


def report(
    saved: dict[str, Any], restored: dict[str, Any], raw: dict[str, float], checks: list[Any]
) -> str:
    import torch

    nbytes = saved["state_bytes"]
    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU self-test"
    restore_gbps = nbytes / restored["restore_s"] / GB
    raw_gbps = raw["bytes"] / raw["seconds"] / GB
    h2d = restored.get("h2d_gbps")
    ceiling = min(raw_gbps, h2d) if h2d else raw_gbps
    lines = [
        f"## jupyter_pause GPU round trip ({where}, {nbytes / GB:.2f} GB = "
        f"{nbytes / GIB:.2f} GiB of model + Adam state)",
        "",
        "| step | seconds | GB/s | against |",
        "|---|---|---|---|",
        f"| pause: checkpoint (D2H + write + fsync) | {saved['save_s']:.2f} | "
        f"{nbytes / saved['save_s'] / GB:.2f} | |",
        f"| resume: restore (fresh process, on the GPU, every tensor read) | "
        f"{restored['restore_s']:.2f} | {restore_gbps:.2f} | "
        f"{restore_gbps / ceiling:.2f} of min(raw read, host-to-device) |",
        f"| raw cold read of the data files (O_DIRECT, 4 x 8 MiB in flight) | "
        f"{raw['seconds']:.2f} | {raw_gbps:.2f} | restore is {restore_gbps / raw_gbps:.2f} of it |",
        "| host-to-device copy from pinned memory (1 GiB) | | "
        + (f"{h2d:.2f} | restore is {restore_gbps / h2d:.2f} of it |" if h2d else "n/a | |"),
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *[f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in checks],
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0, help="1.0 = 134M params (~1.6 GB)")
    p.add_argument("--gib", type=float, help="state size in GiB instead of --scale")
    p.add_argument("--workdir", default=str(HERE / "results" / "gpu-work"))
    # cpu: self-test of this script on a machine without a GPU (not a GPU check).
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help=argparse.SUPPRESS)
    p.add_argument("--child", choices=["save", "restore"], help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.gib:
        args.scale = args.gib * GIB / _BYTES_AT_SCALE_1

    if args.child:
        store = Path(args.store)
        if args.child == "save":
            out = child_save(store, args.scale, args.device)
        else:
            out = child_restore(store, args.device)
        Path(args.out).write_text(json.dumps(out))
        return 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    store = work / "store"
    store.mkdir(parents=True)
    saved = spawn("save", store, args)
    raw = raw_read(store)  # ends with the page cache dropped: the restore reads the disk
    restored = spawn("restore", store, args)
    fallback = None
    if args.device == "cuda":
        # The same checkpoint on a machine without the GPU: CPU tensors and a clear warning.
        fallback = spawn("fallback", store, args, env={"CUDA_VISIBLE_DEVICES": ""})
    checks = compare(saved, restored, fallback)
    md = report(saved, restored, raw, checks)
    print(md)
    (HERE / "results" / "gpu_latest.md").write_text(md)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
