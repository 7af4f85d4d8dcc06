"""One notebook's timeline as spans of time: GPUs held, held idle, released; absences; resumes.

Words, as the report uses them:

- *allocated*: a kernel held GPUs, from ``gpu_acquired`` / ``resources_acquired`` to
  ``gpu_released`` (or now), times the number of GPUs held.
- *idle*: held while nobody worked: a recorded ``idle_gap`` (the user came back after at
  least ``IDLE_GAP_MIN_SECONDS``), the time from the last activity before a pause until the
  GPU was released, and a kernel idle right now. Shorter gaps are not recorded: they count
  as work, as they do for the idle policy.
- *active*: allocated less idle (the hours worked).
- *released*: back in the pool, from ``gpu_released`` to the next acquisition (or now).
- *absence*: the user was away: from the last activity to their return (a cell after an
  idle gap, or a resume request); the idle-threshold study replays these.

Pure arithmetic, no I/O; times are Unix seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..timeline import IDLE_GAP_MIN_SECONDS


@dataclass(frozen=True)
class Span:
    """``gpus`` GPUs from ``start`` to ``end``."""

    start: float
    end: float
    gpus: int

    @property
    def gpu_seconds(self) -> float:
        return max(0.0, self.end - self.start) * self.gpus

    def clipped(self, start: float, end: float) -> Span | None:
        lo, hi = max(self.start, start), min(self.end, end)
        return Span(lo, hi, self.gpus) if hi > lo else None


@dataclass(frozen=True)
class Absence:
    """The user was away from ``start`` to ``end``, while ``gpus`` GPUs were (or had been)
    held; ``returned`` is False when they are still away (``end`` is then the report's now)."""

    start: float
    end: float
    gpus: int
    returned: bool

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class Resume:
    """One resume request and how it went (None: not reached)."""

    requested: float
    acquired: float | None = None  # resources granted (after any wait in the queue)
    ready: float | None = None
    next_cell: float | None = None
    #: live | live not proven | files | partial | failed; None while in flight
    how: str | None = None

    @property
    def queue_seconds(self) -> float | None:
        return None if self.acquired is None else self.acquired - self.requested

    @property
    def to_ready_seconds(self) -> float | None:
        return None if self.ready is None else self.ready - self.requested

    @property
    def to_next_cell_seconds(self) -> float | None:
        return None if self.next_cell is None else self.next_cell - self.requested


@dataclass
class NotebookSpans:
    """Everything the report needs of one notebook."""

    path: str
    user: str
    kernel_name: str
    held: list[Span] = field(default_factory=list)
    idle: list[Span] = field(default_factory=list)
    released: list[Span] = field(default_factory=list)
    absences: list[Absence] = field(default_factory=list)
    resumes: list[Resume] = field(default_factory=list)
    #: When each pause was requested (``jupyter pause timeline`` counts these as its pauses;
    #: one the kernel survived counts too, as does a pause of a kernel that held no GPU).
    pauses: list[float] = field(default_factory=list)
    #: Those asked outside jupyter_pause: the dashboard, kubectl or a culler (``spec.paused``),
    #: or the platform's own stop of the pod (SIGTERM).
    pauses_outside: list[float] = field(default_factory=list)
    #: Seconds from each pause request until the GPU was back: what a pause costs in GPU time.
    pause_seconds: list[float] = field(default_factory=list)
    storage_bytes: int = 0
    checkpoints: int = 0
    snapshots: int = 0

    @property
    def uses_gpus(self) -> bool:
        return bool(self.held)


def _gpus_of(event: dict[str, Any], fallback: int) -> int:
    gpus = (event.get("data") or {}).get("gpus")
    return len(gpus) if isinstance(gpus, list) else fallback


def notebook_spans(notebook: dict[str, Any], now: float) -> NotebookSpans:
    """Spans of one notebook of a usage listing (``GET /jupyter-pause/usage``'s format)."""
    fallback_gpus = max(1, int(notebook.get("gpus_needed") or 0))
    result = NotebookSpans(
        path=notebook["path"],
        user=notebook.get("user") or "?",
        kernel_name=notebook.get("kernel_name") or "?",
        storage_bytes=int(notebook.get("storage_bytes") or 0),
        checkpoints=int(notebook.get("checkpoints") or 0),
        snapshots=int(notebook.get("snapshots") or 0),
    )
    idle_raw: list[tuple[float, float]] = []
    held_since: float | None = None
    held_gpus = 0
    released_since: float | None = None
    last_activity: float | None = None
    away_since: float | None = None  # the last activity before the pause in effect
    pause_requested: float | None = None
    resume: Resume | None = None
    events = sorted(notebook.get("events") or [], key=lambda e: e["at"])
    for event in events:
        kind, at, data = event["kind"], float(event["at"]), event.get("data") or {}
        if kind in ("gpu_acquired", "resources_acquired"):
            if resume is not None and kind == "resources_acquired" and resume.acquired is None:
                resume.acquired = at
            gpus = _gpus_of(event, fallback_gpus)
            if gpus == 0:
                continue  # a CPU-only kernel: no GPU time
            if released_since is not None:
                result.released.append(Span(released_since, at, held_gpus))
                released_since = None
            if held_since is None:
                held_since, held_gpus = at, gpus
        elif kind == "gpu_released" and held_since is not None:
            result.held.append(Span(held_since, at, held_gpus))
            if pause_requested is not None:
                result.pause_seconds.append(at - pause_requested)
                idle_raw.append((away_since if away_since is not None else pause_requested, at))
            held_since, released_since, pause_requested = None, at, None
        elif kind == "last_activity":
            last_activity = at
        elif kind == "pause_requested":
            result.pauses.append(at)
            if data.get("origin") in ("outside", "platform"):
                result.pauses_outside.append(at)
            pause_requested = at
            away_since = last_activity if last_activity is not None else at
        elif kind == "idle_gap":
            end = at + float(data.get("seconds") or 0.0)
            idle_raw.append((at, end))
            result.absences.append(Absence(at, end, 0, True))
        elif kind == "resume_requested":
            resume = Resume(at)
            result.resumes.append(resume)
            if away_since is not None:
                result.absences.append(Absence(away_since, at, 0, True))
                away_since = None
        elif resume is not None:
            _follow_resume(resume, kind, at, data)
    if held_since is not None:
        result.held.append(Span(held_since, now, held_gpus))
        idle_since = notebook.get("last_activity")
        if isinstance(idle_since, int | float) and now - idle_since >= IDLE_GAP_MIN_SECONDS:
            idle_raw.append((float(idle_since), now))
            result.absences.append(Absence(float(idle_since), now, 0, False))
    if released_since is not None:
        result.released.append(Span(released_since, now, held_gpus))
        if away_since is not None:  # paused and not resumed yet
            result.absences.append(Absence(away_since, now, 0, False))
    result.idle = _within(idle_raw, result.held)
    result.absences = [_with_gpus(a, result.held) for a in result.absences]
    return result


#: A live restore recorded before the server proved one (``token_matched``, the token the
#: kernel answered against the one recorded at the pause): it may have been an empty kernel.
LIVE_NOT_PROVEN = "live not proven"


def restore_how(data: dict[str, Any]) -> str:
    """How a ``state_restored`` event says the state came back; "live" only when the token
    recorded at the pause matched, never on the word of an older version's event."""
    if data.get("failed"):
        return "partial"
    how = str(data.get("how") or "files")
    if how == "live" and data.get("token_matched") is not True:
        return LIVE_NOT_PROVEN
    return how


def _follow_resume(resume: Resume, kind: str, at: float, data: dict[str, Any]) -> None:
    if kind == "state_restored":
        resume.how = restore_how(data)
    elif kind == "kernel_ready" and resume.ready is None:
        resume.ready = at
    elif kind == "first_cell_executed" and resume.next_cell is None:
        resume.next_cell = at
    elif kind == "failed" and resume.ready is None and resume.how is None:
        resume.how = "failed"


def _within(raw: list[tuple[float, float]], held: list[Span]) -> list[Span]:
    """The parts of the ``raw`` intervals that lie in held spans, with those spans' GPUs."""
    spans = []
    for start, end in raw:
        for span in held:
            part = span.clipped(start, end)
            if part is not None:
                spans.append(part)
    return spans


def _with_gpus(absence: Absence, held: list[Span]) -> Absence:
    """The absence with the GPUs held when it began (0: no GPU was held then)."""
    for span in held:
        if span.start <= absence.start <= span.end:
            return Absence(absence.start, absence.end, span.gpus, absence.returned)
    return absence


def clip(spans: list[Span], start: float, end: float) -> list[Span]:
    """The parts of ``spans`` between ``start`` and ``end``."""
    return [part for span in spans if (part := span.clipped(start, end)) is not None]


def gpu_seconds(spans: list[Span]) -> float:
    return sum(span.gpu_seconds for span in spans)


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile (``share`` 0.5 is the median); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))  # ceil(n * share), at least 1
    return ordered[int(rank) - 1]
