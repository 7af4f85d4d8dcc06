"""The drill's steps (issue 16's six, its sixth printed as three: the failure probe, the morning
rush, the clean-up, in ``probes``): each measures, checks, and prints one progress line.

A check that fails names what went wrong in words an operator can act on; the drill goes on
with the next steps where it can, and exits 1 at the end. What cannot be measured where the
drill runs (GPU memory without a GPU) is said so, never invented.
"""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, TextIO

from ...formatting import format_bytes
from ...version import __version__
from ..client import PAUSE_IN_FLIGHT, RESUME_IN_FLIGHT, quote_path
from . import notebook
from .client import DrillError, ServerClient
from .plan import (
    BASELINE,
    MAIN,
    STEPS,
    Check,
    Findings,
    between,
    count,
)
from .probes import ProbeSteps


def _alive(pid: int) -> bool:
    from ...kernel.files import pid_alive

    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone in all but name
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _gpu_inventory() -> dict[str, Any] | None:
    """GPU model, driver and memory from nvidia-smi on this machine (None: no GPU here)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = "--query-gpu=name,driver_version,memory.total,memory.used"
    try:
        out = subprocess.run(
            [smi, query, "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = [
        dict(
            zip(
                ("name", "driver", "memory_total", "memory_used"),
                (v.strip() for v in line.split(",")),
                strict=False,
            )
        )
        for line in out.stdout.strip().splitlines()
    ]
    return {"gpus": gpus} if gpus else None


def _gpu_pids() -> set[int] | None:
    from ...backends.local import gpu_pids

    return gpu_pids()


class Drill(ProbeSteps):
    """Runs the steps against one server; ``findings`` holds the results."""

    def __init__(self, client: ServerClient, args: Any, stream: TextIO = sys.stderr) -> None:
        self.client = client
        self.args = args
        self.stream = stream
        self.findings = Findings()
        self.numbers = self.findings.numbers
        self.timeout = float(args.timeout)
        self.before: dict[str, Any] = {}
        self.kernel: str | None = None

    # -- bookkeeping -----------------------------------------------------------------------------
    def check(
        self, step: int, name: str, ok: bool | None, detail: str, otherwise: str = ""
    ) -> bool:
        """Record a check; ``ok`` None: ``otherwise`` (not measurable here / not applicable)."""
        status = "pass" if ok else "fail" if ok is not None else otherwise
        self.findings.checks.append(Check(step, name, status, detail))
        return bool(ok)

    def progress(self, step: int, title: str, text: str) -> None:
        failed = [c for c in self.findings.checks if c.step == step and c.status == "fail"]
        mark = "FAILED" if failed else "ok"
        self.stream.write(f"[{step}/{STEPS}] {title}: {text} ... {mark}\n")
        for check in failed:
            self.stream.write(f"      FAILED {check.name}: {check.detail}\n")
        self.stream.flush()

    def wait(self, path: str, done: Any, seen: list[dict[str, Any]] | None = None) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            record = self.client.session(path)
            if seen is not None:
                seen.append(record)
            if done(record):
                return record
            if time.monotonic() > deadline:
                raise DrillError(
                    f"{path} still {record['state']} after {self.timeout:.0f} s: {record['message']}"
                )
            time.sleep(0.2)

    def pause(self, path: str) -> dict[str, Any]:
        self.client.post("pause", quote_path(path))
        return self.wait(path, lambda r: r["state"] not in PAUSE_IN_FLIGHT)

    def resume(self, path: str, seen: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        self.client.post("resume", quote_path(path))
        return self.wait(path, lambda r: r["state"] not in RESUME_IN_FLIGHT, seen)

    def usage_of(self, paths: list[str]) -> dict[str, dict[str, Any]]:
        listing = self.client.get("usage")
        self.numbers["store"] = listing.get("store")
        return {nb["path"]: nb for nb in listing["notebooks"] if nb["path"] in paths}

    # -- 1 ---------------------------------------------------------------------------------------
    def environment(self) -> None:
        status = self.client.get("status")
        if self.args.backend and status["backend"] != self.args.backend:
            raise DrillError(
                f"the server uses the {status['backend']} backend, not {self.args.backend}"
            )
        listing = self.client.get("usage")
        resources, policy = status["resources"], status["policy"]
        self.numbers["environment"] = {
            "server": self.client.server.url,
            "backend": status["backend"],
            "jupyter_pause": status["version"],
            "drill": __version__,
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "gpus_total": resources["gpus_total"],
            "gpus_free": resources["gpus_free"],
            "gpus_per_kernel": policy.get("gpus_per_kernel"),
            "policy": policy,
            "gpu_inventory": _gpu_inventory(),
            "store": listing["store"],
            "prices": listing["prices"],
        }
        store = listing["store"] or {}
        gpu = self.numbers["environment"]["gpu_inventory"]
        self.check(1, "server reachable with jupyter_pause", True, f"{status['backend']} backend")
        self.progress(
            1,
            "Environment",
            f"{status['backend']} backend, {resources['gpus_total']} GPU(s) to hand out, "
            + (
                f"{gpu['gpus'][0]['name']} (driver {gpu['gpus'][0]['driver']})"
                if gpu
                else "no GPU visible here (nvidia-smi absent)"
            )
            + f", store {format_bytes(store.get('free_bytes', 0))} free",
        )

    # -- 2 ---------------------------------------------------------------------------------------
    def prepare(self) -> None:
        self.client.write_notebook(MAIN, notebook.cells(self.args.model))
        started = time.time()
        self.kernel = self.client.open_notebook(MAIN)
        setup = self.client.run_cell(self.kernel, notebook.SETUP, self.timeout).json_line()
        code = notebook.cells(self.args.model)
        model = self.client.run_cell(self.kernel, code[1], self.timeout).json_line()
        probe = self.client.run_cell(self.kernel, notebook.PROBE, self.timeout).json_line()
        saved = self.client.run_cell(self.kernel, notebook.RESULT, self.timeout).json_line()
        files = self.client.run_cell(self.kernel, notebook.FILES, self.timeout).json_line()
        session = self.wait(MAIN, lambda r: r["watching"])
        status = self.client.get("status")
        self.before = {
            **setup,
            **model,
            **probe,
            "files": files,
            "checkpoint": saved,
            "gpus": session["gpus"],
            "gpus_free": status["resources"]["gpus_free"],
            "at": time.time(),
            "built_in_seconds": time.time() - started,
        }
        self.numbers["before_pause"] = dict(self.before)
        self.check(2, "notebook ran", True, f"model of {model['parameters']} parameters")
        self.progress(
            2,
            "Drill notebook",
            f"{MAIN}: model of {model['parameters']:,} parameters on {setup['device']}, "
            f"checkpoint {saved['checkpoint_id']} ({format_bytes(saved['bytes_written'])}), "
            f"GPUs held {session['gpus'] or 'none'}",
        )

    # -- 3 ---------------------------------------------------------------------------------------
    def pause_and_check(self) -> None:
        asked = time.time()
        record = self.pause(MAIN)
        took = time.time() - asked
        self.check(
            3,
            "paused",
            record["state"] == "paused",
            f"the pause ended {record['state']}: {record['message']}",
        )
        gone = self.kernel not in self.client.kernel_ids()
        self.check(
            3,
            "kernel stopped",
            gone,
            "the kernel is gone" if gone else f"kernel {self.kernel} still runs",
        )
        same_host = self.before["host"] == socket.gethostname()
        if same_host:
            alive = _alive(self.before["pid"])
            self.check(
                3,
                "kernel process gone",
                not alive,
                f"process {self.before['pid']} " + ("still runs" if alive else "is gone"),
            )
        else:
            self.check(
                3,
                "kernel process gone",
                None,
                "the kernel ran on another machine",
                "not measurable here",
            )
        events = self.client.timeline(MAIN)
        held = self.before["gpus"]
        status = self.client.get("status")["resources"]
        if held:
            holders = status["details"].get("holders", {}) if status.get("details") else {}
            back = MAIN not in holders and status["gpus_free"] >= self.before["gpus_free"] + len(
                held
            )
            self.check(
                3,
                "GPU released",
                back and count(events, "gpu_released", asked) == 1,
                f"GPU(s) {held} back in the pool ({status['gpus_free']} of {status['gpus_total']} free)"
                if back
                else f"the GPU was not released: {status['gpus_free']} of {status['gpus_total']} free, "
                f"still held by {', '.join(holders) or 'nobody'}",
            )
        else:
            self.check(3, "GPU released", None, "the notebook held no GPU", "not applicable")
        self.gpu_memory_check()
        listing = self.client.get("checkpoints", quote_path(MAIN))
        kept = [c for c in listing["checkpoints"] if "damaged" not in c]
        stored = self.usage_of([MAIN]).get(MAIN, {}).get("storage_bytes", 0)
        self.numbers["pause"] = {
            "seconds": took,
            "to_kernel_stopped": between(events, "pause_requested", "kernel_stopped", asked),
            "to_gpu_released": between(events, "pause_requested", "gpu_released", asked),
            "checkpoints_kept": len(kept),
            "checkpoint_bytes": kept[-1]["bytes"] if kept else 0,
            "storage_bytes": stored,
        }
        self.check(
            3,
            "checkpoint kept",
            bool(kept),
            f"{len(kept)} checkpoint(s), {format_bytes(stored)} in the store",
        )
        self.progress(
            3,
            "Pause",
            f"paused in {took:.1f} s; kernel stopped; "
            f"{len(kept)} checkpoint(s), {format_bytes(stored)} kept",
        )

    def gpu_memory_check(self) -> None:
        if self.before.get("cuda_bytes") is None:
            self.check(
                3,
                "GPU memory released",
                None,
                "the kernel used no GPU memory (no CUDA device in the kernel)",
                "not measurable here",
            )
            return
        pids = _gpu_pids()
        if pids is None or self.before["host"] != socket.gethostname():
            self.check(
                3,
                "GPU memory released",
                None,
                "nvidia-smi cannot see the kernel's GPU",
                "not measurable here",
            )
            return
        freed = self.before["pid"] not in pids
        self.check(
            3,
            "GPU memory released",
            freed,
            f"process {self.before['pid']} "
            + ("holds no GPU memory" if freed else "still holds GPU memory"),
        )

    # -- 4 ---------------------------------------------------------------------------------------
    def resume_and_check(self) -> None:
        asked = time.time()
        record = self.resume(MAIN)
        ready_at = time.time()
        ok = self.check(
            4,
            "ready",
            record["state"] == "ready",
            f"the resume ended {record['state']}: {record['message']}",
        )
        if not ok:
            raise DrillError(f"the resume failed: {record['message']}")
        self.kernel = record["kernel_id"]
        probe = self.client.run_cell(self.kernel, notebook.PROBE, self.timeout)
        after = probe.json_line()
        files = self.client.run_cell(self.kernel, notebook.FILES, self.timeout).json_line()
        same = after["digest"] == self.before["digest"]
        self.check(
            4,
            "model output bit-identical",
            same,
            "the loaded model gives the same output bytes as before the pause"
            if same
            else f"output digest {after['digest'][:12]} differs from {self.before['digest'][:12]}",
        )
        intact = files["input"] == self.before["files"]["input"] and (
            files["result"] == self.before["files"]["result"]
        )
        self.check(
            4,
            "files intact",
            intact,
            "input data and result file unchanged"
            if intact
            else "the drill's data files changed across the pause",
        )
        self.check(4, "state restored", files["has_model"], "the model is in the namespace")
        events = self.client.timeline(MAIN)
        self.numbers["resume"] = {
            "how": record["how"],
            "to_ready_seconds": ready_at - asked,
            "to_next_cell_done_seconds": probe.done_at - asked,
            "timeline_to_ready": between(events, "resume_requested", "kernel_ready", asked - 1),
            "timeline_to_first_cell": between(
                events, "resume_requested", "first_cell_executed", asked - 1
            ),
            "restored": (record.get("restore") or {}).get("restored"),
        }
        self.progress(
            4,
            "Resume",
            f"ready ({record['how']}) in {ready_at - asked:.1f} s, next "
            f"cell done after {probe.done_at - asked:.1f} s; output bit-identical: {same}",
        )

    # -- 5 ---------------------------------------------------------------------------------------
    def compare(self) -> None:
        resume = self.numbers["resume"]
        backend = self.numbers["environment"]["backend"]
        ways = {
            "live": None,
            "files": None,
            "rerun": None,
        }
        ways[resume["how"]] = {
            k: resume[k] for k in ("to_ready_seconds", "to_next_cell_done_seconds")
        }
        notes = {}
        if resume["how"] == "files":
            notes["live"] = f"not available on the {backend} backend (a resume starts a new kernel)"
        else:
            notes["files"] = "forcing a restore from files is not offered by the API yet"
        self.pause(MAIN)  # the GPU goes back for the baseline
        self.client.write_notebook(BASELINE, notebook.cells(self.args.model))
        asked = time.time()
        kernel = self.client.open_notebook(BASELINE)
        started = self.client.run_cell(kernel, notebook.READY, self.timeout).done_at
        for code in notebook.cells(self.args.model)[:2]:
            self.client.run_cell(kernel, code, self.timeout).json_line()
        probe = self.client.run_cell(kernel, notebook.PROBE, self.timeout)
        rerun = probe.json_line()
        ways["rerun"] = {
            "to_ready_seconds": started - asked,
            "to_next_cell_done_seconds": probe.done_at - asked,
        }
        self.numbers["compare"] = {"ways": ways, "notes": notes}
        if self.args.model.startswith("seed"):
            self.check(
                5,
                "re-run reproduces the output",
                rerun["digest"] == self.before["digest"],
                "the seeded model rebuilt from the top gives the same output",
            )
        rows = ", ".join(
            f"{name} {v['to_next_cell_done_seconds']:.1f} s" for name, v in ways.items() if v
        )
        self.progress(5, "Resume vs re-run", f"to the next cell done: {rows}")
