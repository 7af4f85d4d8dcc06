"""What the drill writes and checks: its notebooks, its steps, and what it found.

Shared by the steps (``steps``, ``probes``), the report (``render``), the upgrade check and
the command; it imports none of them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

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


def between(events: list[dict[str, Any]], first: str, then: str, since: float) -> float | None:
    """Seconds from the first ``first`` event at or after ``since`` to the next ``then``."""
    start = next((e["at"] for e in events if e["kind"] == first and e["at"] >= since), None)
    if start is None:
        return None
    end = next((e["at"] for e in events if e["kind"] == then and e["at"] >= start), None)
    return None if end is None else end - start


def count(events: list[dict[str, Any]], kind: str, since: float) -> int:
    return sum(1 for e in events if e["kind"] == kind and e["at"] >= since)
