"""Where the GPU hours went: the timestamped events of each pause and resume, and their sums.

One timeline answers the researcher (how long until my next cell ran?), the platform team
(when was the GPU back in the pool?) and whoever pays (how many GPU-hours were allocated,
used, and given back?). Plain data, no I/O: the orchestrator records, the API reports.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: Event kinds, in the order a pause/resume cycle produces them.
EVENT_KINDS = (
    "gpu_acquired",  # a kernel holding accelerators started (or was first seen)
    "last_activity",  # end of active work: the last cell run / edit before the pause
    "pause_requested",
    "checkpoint_written",  # data: bytes_written, bytes_total, checkpoint_id
    "snapshot_taken",  # a pod snapshot of the whole environment (data: name, seconds, mode)
    "snapshot_missing",  # a pause without a pod snapshot (data: mode, why)
    "kernel_stopped",  # the process (or pod) is gone
    "gpu_released",  # the accelerator is back in the pool (measured where possible)
    "start_requested",  # the platform was asked to start the server again (a Hub's spawn)
    "server_started",  # a new server process after the last one ended (data: after: how,
    # waited_seconds: since start_requested, where the platform says)
    "resume_requested",
    "waiting_for_resources",  # the resume waits for a GPU; data: place, reason (each new place)
    "resources_acquired",  # an accelerator was granted again
    "state_restored",  # data: how (live|files), restored, failed; token_matched (live: proven)
    "checkpoint_restored",  # a running session restored from a checkpoint in the notebook
    "unrestored_kernel_stopped",  # a paused notebook's new kernel, idle and stopped (GPU back)
    "kernel_ready",
    "fully_loaded",  # a lazy restore's last byte in and checked (data: checkpoint_id, bytes,
    # seconds since ready, failed: what a damaged file took back, stopped: by a pause)
    "first_cell_executed",  # the researcher's next cell after the resume
    "hold_released",  # the user accepted an incomplete restore: retention applies again
    "idle_gap",  # at: the start of a gap without activity; data: seconds (the user came back)
    "failed",  # data: what, recovery
)

#: Shorter gaps without activity are not recorded: the shortest idle threshold worth studying.
IDLE_GAP_MIN_SECONDS = 300.0


@dataclass
class Event:
    kind: str
    at: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Accounting:
    """GPU-seconds and latencies derived from the events (never stored: always recomputed)."""

    gpus: int
    gpu_seconds_allocated: float
    gpu_seconds_active: float
    gpu_seconds_released: float
    pauses: int
    resumes: int
    last_resume_to_ready_seconds: float | None
    last_resume_to_next_cell_seconds: float | None
    bytes_saved: int
    snapshots: int  # pod snapshots taken (workspace backend)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Timeline:
    """The events of one notebook session, oldest first."""

    def __init__(self, events: list[Event] | None = None, limit: int = 2000) -> None:
        self.events: list[Event] = events or []
        self.limit = limit  # keep the file small for sessions paused every day for months

    def add(self, kind: str, at: float | None = None, **data: Any) -> Event:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown timeline event {kind!r}")
        event = Event(kind, time.time() if at is None else at, data)
        # Some events are recorded after the fact (the end of active work is known only when
        # the pause comes): keep the list in time order, the order accounting walks it in.
        bisect.insort(self.events, event, key=lambda e: e.at)
        if len(self.events) > self.limit:
            del self.events[: len(self.events) - self.limit]
        return event

    def add_idle_gap(self, since: float | None, now: float | None = None) -> Event | None:
        """The user came back at ``now`` after no activity since ``since``: a gap long enough
        to matter for an idle policy is recorded (the GPU-hours report replays them)."""
        now = time.time() if now is None else now
        if not since or now - since < IDLE_GAP_MIN_SECONDS:
            return None
        return self.add("idle_gap", at=since, seconds=now - since)

    def last(self, kind: str) -> Event | None:
        for event in reversed(self.events):
            if event.kind == kind:
                return event
        return None

    def to_json(self) -> list[dict[str, Any]]:
        return [e.to_json() for e in self.events]

    @classmethod
    def from_json(cls, raw: list[dict[str, Any]]) -> Timeline:
        return cls([Event(e["kind"], e["at"], e.get("data", {})) for e in raw])

    def accounting(self, gpus: int, busy_seconds: float, now: float | None = None) -> Accounting:
        """Sum the allocated and released intervals; ``busy_seconds`` is the measured active time."""
        now = time.time() if now is None else now
        allocated = released = 0.0
        held_since: float | None = None
        released_since: float | None = None
        pauses = resumes = bytes_saved = snapshots = 0
        last_resume: float | None = None
        ready_latency = next_cell_latency = None
        for event in self.events:
            if event.kind in ("gpu_acquired", "resources_acquired"):
                if released_since is not None:
                    released += event.at - released_since
                    released_since = None
                if held_since is None:
                    held_since = event.at
            elif event.kind == "gpu_released":
                if held_since is not None:
                    allocated += event.at - held_since
                    held_since = None
                released_since = event.at
            elif event.kind == "pause_requested":
                pauses += 1
            elif event.kind == "checkpoint_written":
                bytes_saved += int(event.data.get("bytes_written", 0))
            elif event.kind == "snapshot_taken":
                snapshots += 1
            elif event.kind == "resume_requested":
                resumes += 1
                last_resume = event.at
            elif event.kind == "kernel_ready" and last_resume is not None:
                ready_latency = event.at - last_resume
            elif event.kind == "first_cell_executed" and last_resume is not None:
                next_cell_latency = event.at - last_resume
        if held_since is not None:
            allocated += now - held_since
        if released_since is not None:
            released += now - released_since
        return Accounting(
            gpus=gpus,
            gpu_seconds_allocated=allocated * gpus,
            gpu_seconds_active=min(busy_seconds, allocated) * gpus,
            gpu_seconds_released=released * gpus,
            pauses=pauses,
            resumes=resumes,
            last_resume_to_ready_seconds=ready_latency,
            last_resume_to_next_cell_seconds=next_cell_latency,
            bytes_saved=bytes_saved,
            snapshots=snapshots,
        )
