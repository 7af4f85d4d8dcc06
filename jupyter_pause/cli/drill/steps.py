"""The drill's steps (issue 16's six, its sixth printed as three: the failure probe, the morning
rush, the clean-up): each measures, checks, and prints one progress line.

A check that fails names what went wrong in words an operator can act on; the drill goes on
with the next steps where it can, and exits 1 at the end. What cannot be measured where the
drill runs (GPU memory without a GPU) is said so, never invented.
"""

from __future__ import annotations

import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from ...formatting import format_bytes
from ...version import __version__
from ..client import PAUSE_IN_FLIGHT, RESUME_IN_FLIGHT, quote_path
from . import notebook
from .client import DrillError, ServerClient

FOLDER = "pause-drill"
MAIN = f"{FOLDER}/drill.ipynb"
BASELINE = f"{FOLDER}/baseline.ipynb"
CLEANUP = f"{FOLDER}/cleanup.ipynb"
#: Every notebook the drill writes in FOLDER (main, baseline, clean-up, GPU holders, rush):
#: what its clean-up deletes, and nothing else a user may have put there.
DRILL_NOTEBOOK = re.compile(r"(drill|baseline|cleanup|holder-\d+|rush-\d+)\.ipynb")
#: What may stay in a notebook's store folder once its checkpoints are deleted: the session
#: record, the notebook's name, the lock (a few KB).
METADATA_BYTES = 64 * 1024
STEPS = 8
#: Step numbers of the failure probe, the morning rush and the clean-up.
PROBE_STEP, RUSH_STEP, CLEANUP_STEP = 6, 7, 8


@dataclass
class Check:
    step: int
    name: str
    status: str  # pass | fail | not measurable here | not applicable
    detail: str


@dataclass
class Findings:
    """Everything the drill measured and checked: ``report.json``."""

    checks: list[Check] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_json(self) -> dict[str, Any]:
        return {"checks": [asdict(c) for c in self.checks], **self.numbers}


def _between(events: list[dict[str, Any]], first: str, then: str, since: float) -> float | None:
    """Seconds from the first ``first`` event at or after ``since`` to the next ``then``."""
    start = next((e["at"] for e in events if e["kind"] == first and e["at"] >= since), None)
    if start is None:
        return None
    end = next((e["at"] for e in events if e["kind"] == then and e["at"] >= start), None)
    return None if end is None else end - start


def _count(events: list[dict[str, Any]], kind: str, since: float) -> int:
    return sum(1 for e in events if e["kind"] == kind and e["at"] >= since)


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


class Drill:
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
                back and _count(events, "gpu_released", asked) == 1,
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
            "to_kernel_stopped": _between(events, "pause_requested", "kernel_stopped", asked),
            "to_gpu_released": _between(events, "pause_requested", "gpu_released", asked),
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
            "timeline_to_ready": _between(events, "resume_requested", "kernel_ready", asked - 1),
            "timeline_to_first_cell": _between(
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

    # -- 6 ---------------------------------------------------------------------------------------
    def probe_waiting(self) -> None:
        status = self.client.get("status")["resources"]
        if not status["gpus_total"] or not self.before["gpus"]:
            self.check(
                PROBE_STEP,
                "waits for resources",
                None,
                "this server hands out no GPU: resumes never wait",
                "not applicable",
            )
            self.progress(PROBE_STEP, "Failure probe", "not applicable without GPUs to hand out")
            return
        holders = [BASELINE]
        for i in range(1, status["gpus_total"] + 1):
            if self.client.get("status")["resources"]["gpus_free"] == 0:
                break
            holders.append(f"{FOLDER}/holder-{i}.ipynb")
            self.client.write_notebook(holders[-1], [])
            self.client.open_notebook(holders[-1])
            self.client.get("sessions")  # the server adopts the kernel and its GPU
        free = self.client.get("status")["resources"]["gpus_free"]
        if not self.check(
            PROBE_STEP, "resources made unavailable", free == 0, f"{free} GPU(s) still free"
        ):
            self.progress(PROBE_STEP, "Failure probe", "could not take every GPU")
            return
        asked = time.time() - 0.5
        with ThreadPoolExecutor(2) as pool:  # two tabs asking at once
            list(pool.map(lambda _: self.client.post("resume", quote_path(MAIN)), range(2)))
        waiting = self.wait(MAIN, lambda r: r["state"] != "resuming")
        self.check(
            PROBE_STEP,
            "waits with a reason",
            waiting["state"] == "waiting-for-resources" and bool(waiting["message"]),
            f"{waiting['state']}: {waiting['message']}",
        )
        requests = _count(self.client.timeline(MAIN), "resume_requested", asked)
        self.check(
            PROBE_STEP,
            "one restore for two requests",
            requests == 1,
            "the second request joined the first"
            if requests == 1
            else f"{requests} restores started for 2 requests: a second restore ran",
        )
        released = time.time()
        for holder in holders:
            self.client.close_notebook(holder)
        record = self.wait(MAIN, lambda r: r["state"] not in RESUME_IN_FLIGHT)
        events = self.client.timeline(MAIN)
        restored = _count(events, "state_restored", asked)
        kernels = len(self.client.kernels_of(MAIN))
        self.check(
            PROBE_STEP,
            "completes once resources return",
            record["state"] == "ready",
            f"{record['state']}: {record['message']}",
        )
        self.check(
            PROBE_STEP,
            "restored once",
            restored == 1 and kernels == 1,
            f"{restored} restore(s), {kernels} kernel(s) for {MAIN}",
        )
        self.numbers["probe"] = {
            "reason": waiting["message"],
            "queue_position": waiting.get("queue_position"),
            "waited_seconds": _between(events, "resume_requested", "resources_acquired", asked),
            "ready_after_release_seconds": time.time() - released,
        }
        self.progress(
            PROBE_STEP,
            "Failure probe",
            f"waited with a reason ({waiting['message'][:60]}...), "
            f"{restored} restore(s) once resources came back",
        )

    # -- 7 ---------------------------------------------------------------------------------------
    def rush(self) -> None:
        n = self.args.rush
        total = self.client.get("status")["resources"]["gpus_total"]
        if n <= 0 or not total or not self.before["gpus"]:
            self.check(
                RUSH_STEP,
                "morning rush",
                None,
                "skipped (--rush 0 or no GPUs to hand out)",
                "not applicable",
            )
            self.progress(RUSH_STEP, "Morning rush", "skipped (--rush 0 or no GPUs to hand out)")
            return
        self.pause(MAIN)
        paths = [f"{FOLDER}/rush-{i}.ipynb" for i in range(1, n + 1)]
        for i, path in enumerate(paths, start=1):
            self.client.write_notebook(path, [notebook.small_state(i)])
            kernel = self.client.open_notebook(path)
            self.client.run_cell(kernel, notebook.small_state(i), self.timeout)
            self.wait(path, lambda r: r["watching"])
            self.pause(path)
        started = time.time() - 0.5
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda p: self.client.post("resume", quote_path(p)), paths))
        reasons: dict[str, str] = {}
        values: dict[str, Any] = {}
        deadline = time.monotonic() + self.timeout
        while len(values) < n and time.monotonic() < deadline:
            for i, path in enumerate(paths, start=1):
                if path in values:
                    continue
                record = self.client.session(path)
                if record["state"] == "waiting-for-resources":
                    reasons.setdefault(path, record["message"])
                elif record["state"] in ("ready", "partial", "failed", "paused"):
                    values[path] = self._use_and_pause(path, record, i)
            time.sleep(0.2)
        rows = []
        for path in paths:
            events = self.client.timeline(path)
            rows.append(
                {
                    "path": path,
                    "requested": next(
                        (
                            e["at"]
                            for e in events
                            if e["kind"] == "resume_requested" and e["at"] >= started
                        ),
                        None,
                    ),
                    "acquired": next(
                        (
                            e["at"]
                            for e in events
                            if e["kind"] == "resources_acquired" and e["at"] >= started
                        ),
                        None,
                    ),
                    "ready": next(
                        (
                            e["at"]
                            for e in events
                            if e["kind"] == "kernel_ready" and e["at"] >= started
                        ),
                        None,
                    ),
                    "restores": _count(events, "state_restored", started),
                    "reason": reasons.get(path),
                    "outcome": values.get(path, "lost: never came back"),
                }
            )
        self._judge_rush(rows, n, total)

    def _use_and_pause(self, path: str, record: dict[str, Any], value: int) -> str:
        if record["state"] != "ready":
            return f"{record['state']}: {record['message']}"
        found = self.client.run_cell(
            record["kernel_id"], notebook.CHECK_SMALL_STATE, self.timeout
        ).json_line()
        self.client.post("pause", quote_path(path))  # the next in the queue gets its GPU
        return "restored" if found["value"] == value else f"wrong value {found['value']}"

    def _judge_rush(self, rows: list[dict[str, Any]], n: int, total: int) -> None:
        for row in rows:
            if row["requested"] is not None and row["acquired"] is not None:
                row["waited_seconds"] = row["acquired"] - row["requested"]
                row["to_ready_seconds"] = (row["ready"] or row["acquired"]) - row["requested"]
        self.numbers["rush"] = {"notebooks": n, "gpus": total, "rows": rows}
        lost = [r["path"] for r in rows if r["outcome"] != "restored"]
        self.check(
            RUSH_STEP,
            "rush: none lost",
            not lost,
            f"all {n} came back"
            if not lost
            else "not restored: "
            + "; ".join(f"{r['path']} ({r['outcome']})" for r in rows if r["path"] in lost),
        )
        twice = [r["path"] for r in rows if r["restores"] > 1]
        self.check(
            RUSH_STEP,
            "rush: none restored twice",
            not twice,
            "one restore each" if not twice else f"restored twice: {', '.join(twice)}",
        )
        served = [r for r in rows if r["acquired"] is not None and r["requested"] is not None]
        by_request = [r["path"] for r in sorted(served, key=lambda r: r["requested"])]
        by_grant = [r["path"] for r in sorted(served, key=lambda r: r["acquired"])]
        self.check(
            RUSH_STEP,
            "rush: served in order",
            by_request == by_grant,
            "first come, first served"
            if by_request == by_grant
            else f"asked {by_request}, served {by_grant}",
        )
        silent = [r["path"] for r in served if r.get("waited_seconds", 0) > 1 and not r["reason"]]
        self.check(
            RUSH_STEP,
            "rush: each wait has a reason",
            not silent,
            "every notebook that waited said why"
            if not silent
            else f"waited without a reason: {', '.join(silent)}",
        )
        if n <= total:
            self.check(
                RUSH_STEP,
                "rush: contention",
                None,
                f"{n} notebooks against {total} GPU(s): "
                f"nobody had to wait (use --rush {total + 1})",
                "not applicable",
            )
        waits = ", ".join(f"{r.get('waited_seconds', 0):.1f} s" for r in rows)
        self.progress(
            RUSH_STEP, "Morning rush", f"{n} notebooks against {total} GPU(s); waits {waits}"
        )

    # -- 8 ---------------------------------------------------------------------------------------
    def delete_and_check(self, paths: list[str]) -> int:
        """Delete the notebooks' checkpoints and check their storage is freed: bytes freed."""
        before = self.usage_of(paths)
        free_before = (self.numbers.get("store") or {}).get("free_bytes")
        self.client.write_notebook(CLEANUP, [])
        kernel = self.client.open_notebook(CLEANUP)
        names = [p.rsplit("/", 1)[-1] for p in paths]
        deleted = self.client.run_cell(
            kernel, notebook.delete_checkpoints(names), self.timeout
        ).json_line()
        self.client.close_notebook(CLEANUP)
        after = self.usage_of(paths)
        rows = []
        for path in paths:
            held_before = before.get(path, {}).get("storage_bytes", 0)
            left = after.get(path, {})
            rows.append(
                {
                    "path": path,
                    "bytes_before": held_before,
                    "bytes_after": left.get("storage_bytes", 0),
                    "checkpoints_after": left.get("checkpoints", 0),
                    "deleted": deleted.get(path.rsplit("/", 1)[-1], []),
                }
            )
        not_freed = [r for r in rows if r["checkpoints_after"] or r["bytes_after"] > METADATA_BYTES]
        freed = sum(r["bytes_before"] - r["bytes_after"] for r in rows)
        free_after = (self.numbers.get("store") or {}).get("free_bytes")
        self.numbers["storage"] = {
            "rows": rows,
            "bytes_freed": freed,
            "free_bytes_before": free_before,
            "free_bytes_after": free_after,
        }
        self.check(
            CLEANUP_STEP,
            "checkpoints deleted and storage freed",
            not not_freed,
            f"{format_bytes(freed)} freed"
            if not not_freed
            else "; ".join(
                f"{r['path']}: its checkpoints were deleted but "
                f"{format_bytes(r['bytes_after'])} remain in its store folder "
                f"({r['checkpoints_after']} checkpoint(s) left): the storage was not freed"
                for r in not_freed
            ),
        )
        snapshots = sum(nb.get("snapshots", 0) for nb in after.values())
        self.check(
            CLEANUP_STEP,
            "snapshots deleted",
            snapshots == 0 if snapshots else None,
            f"{snapshots} snapshot(s) left"
            if snapshots
            else f"no platform snapshots on the {self.numbers['environment']['backend']} backend",
            "not applicable",
        )
        return freed
