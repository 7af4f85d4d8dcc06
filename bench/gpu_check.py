"""GPU round trip: CUDA model + Adam saved with jupyter_pause and restored in a fresh process.

Checks that every tensor comes back on its original device and that one more training step
after the restore gives bit-identical loss, weights and optimizer state to the original process
taking the same step; that the restored values are bit-identical to the saved ones; that a CUDA
stream is skipped with its reason; and that the same checkpoint restored with no GPU visible
(`CUDA_VISIBLE_DEVICES=`) puts every tensor on the CPU, says so, and keeps the values. Prints a
table with save/restore seconds and GB/s. Needs an NVIDIA GPU; without one it prints
"no CUDA device: skipped" and exits 0. Not run in CI.

    python bench/gpu_check.py              # ~1.6 GB of model + Adam state
    python bench/gpu_check.py --scale 4    # ~6.4 GB
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

from bench_checkpoint import drop_page_cache, new_shell, run_cell, tree_files  # noqa: E402

GB = 1e9

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


def child_restore(store: Path, device: str) -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        torch.cuda.init()  # CUDA context creation is per process, not restore work
    jp, shell = load_pause(store)
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
    run_cell(shell, SETUP_CODE)
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


def report(saved: dict[str, Any], restored: dict[str, Any], checks: list[Any]) -> str:
    import torch

    nbytes = saved["state_bytes"]
    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU self-test"
    lines = [
        f"## jupyter_pause GPU round trip ({where}, {nbytes / GB:.2f} GB of model + Adam state)",
        "",
        "| step | seconds | GB/s |",
        "|---|---|---|",
        f"| save (checkpoint, fsync) | {saved['save_s']:.2f} | {nbytes / saved['save_s'] / GB:.2f} |",
        f"| restore (fresh process, tensors touched) | {restored['restore_s']:.2f} | "
        f"{nbytes / restored['restore_s'] / GB:.2f} |",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *[f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in checks],
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0, help="1.0 = 134M params (~1.6 GB)")
    p.add_argument("--workdir", default=str(HERE / "results" / "gpu-work"))
    # cpu: self-test of this script on a machine without a GPU (not a GPU check).
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help=argparse.SUPPRESS)
    p.add_argument("--child", choices=["save", "restore"], help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()

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
    drop_page_cache(tree_files(store))  # the restore reads from disk, not from RAM
    restored = spawn("restore", store, args)
    fallback = None
    if args.device == "cuda":
        # The same checkpoint on a machine without the GPU: CPU tensors and a clear warning.
        fallback = spawn("fallback", store, args, env={"CUDA_VISIBLE_DEVICES": ""})
    checks = compare(saved, restored, fallback)
    md = report(saved, restored, checks)
    print(md)
    (HERE / "results" / "gpu_latest.md").write_text(md)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
