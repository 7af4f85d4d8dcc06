"""The idle-threshold study: what other idle thresholds would have released, and cost users.

Each recorded absence (``spans.Absence``) is replayed under a threshold T: an absence no longer
than T pauses nothing; a longer one pauses at T after the last activity, keeps the GPU for the
measured pause cost (checkpoint and stop), then releases it until the user returns, who then
waits the measured restore time. At T = 0 with no costs, everything idle is released: a week
of 168 GPU hours allocated with 40 worked releases 128.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from .spans import Absence, NotebookSpans

#: Thresholds tried, in minutes (5 min to 4 h).
THRESHOLDS_MINUTES = (5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240)
#: The recommendation: the longest threshold releasing this share of what the shortest does.
RELEASE_SHARE = 0.9


@dataclass(frozen=True)
class Costs:
    """What one pause and one resume cost, measured on the recorded timelines."""

    pause_seconds: float  # from the pause request until the GPU was back in the pool
    restore_seconds: float  # from the resume request until the kernel was ready
    pauses_measured: int
    restores_measured: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    """What threshold ``minutes`` would have done to the recorded absences."""

    minutes: float
    gpu_hours_released: float
    pauses: int
    waits: int  # returns that would have waited for a restore
    wait_minutes: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measured_costs(notebooks: list[NotebookSpans]) -> Costs:
    """Median pause and restore costs of ``notebooks``; 0 where none was recorded."""
    pauses = [s for nb in notebooks for s in nb.pause_seconds]
    restores = [
        r.to_ready_seconds
        for nb in notebooks
        for r in nb.resumes
        if r.to_ready_seconds is not None and r.how in ("live", "files", "partial")
    ]
    return Costs(
        pause_seconds=statistics.median(pauses) if pauses else 0.0,
        restore_seconds=statistics.median(restores) if restores else 0.0,
        pauses_measured=len(pauses),
        restores_measured=len(restores),
    )


def replay(absences: list[Absence], minutes: float, costs: Costs) -> Outcome:
    """The absences under an idle threshold of ``minutes``."""
    threshold = minutes * 60
    released = wait = 0.0
    pauses = waits = 0
    for absence in absences:
        if absence.gpus == 0 or absence.seconds <= threshold:
            continue
        pauses += 1
        released += max(0.0, absence.seconds - threshold - costs.pause_seconds) * absence.gpus
        if absence.returned:
            waits += 1
            wait += costs.restore_seconds
    return Outcome(minutes, released / 3600, pauses, waits, wait / 60)


def study(
    absences: list[Absence], costs: Costs, thresholds: tuple[float, ...] = THRESHOLDS_MINUTES
) -> list[Outcome]:
    return [replay(absences, minutes, costs) for minutes in thresholds]


def recommend(outcomes: list[Outcome]) -> Outcome | None:
    """The longest threshold that still releases ``RELEASE_SHARE`` of what the shortest does:
    shorter ones make users wait more often for little more. None: nothing to release."""
    if not outcomes or outcomes[0].gpu_hours_released <= 0:
        return None
    enough = RELEASE_SHARE * outcomes[0].gpu_hours_released
    return max((o for o in outcomes if o.gpu_hours_released >= enough), key=lambda o: o.minutes)
