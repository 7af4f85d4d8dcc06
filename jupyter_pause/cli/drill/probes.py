"""The drill's last three steps: the failure probe (6), the morning rush (7), the clean-up (8).

``ProbeSteps`` is a part of ``Drill`` (its methods use the drill's client, findings and
progress line).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...formatting import format_bytes
from ..client import RESUME_IN_FLIGHT, quote_path
from . import notebook
from .plan import (
    BASELINE,
    CLEANUP,
    CLEANUP_STEP,
    FOLDER,
    MAIN,
    METADATA_BYTES,
    PROBE_STEP,
    RUSH_STEP,
    between,
    count,
)


class ProbeSteps:
    """Steps 6-8 of ``Drill``."""

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
        requests = count(self.client.timeline(MAIN), "resume_requested", asked)
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
        restored = count(events, "state_restored", asked)
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
            "waited_seconds": between(events, "resume_requested", "resources_acquired", asked),
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
                    "restores": count(events, "state_restored", started),
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
