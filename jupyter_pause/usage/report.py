"""The numbers of a GPU-hours report, from a usage listing (``sources``), as plain JSON data.

Everything is clipped to the report's window (``--since``). Groups are notebooks, users (who
owns the notebook's store folder) or kernelspecs; weeks and days are the local calendar's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from .spans import (
    LIVE_NOT_PROVEN,
    NotebookSpans,
    Span,
    clip,
    gpu_seconds,
    notebook_spans,
    percentile,
)
from .study import Costs, measured_costs, recommend, replay, study

GROUPS: dict[str, Callable[[NotebookSpans], str]] = {
    "notebook": lambda nb: nb.path,
    "user": lambda nb: nb.user,
    "kernelspec": lambda nb: nb.kernel_name,
}
HOUR = 3600.0
GB = 1e9


def parse_since(text: str) -> float:
    """``7d``, ``36h``, ``90m``, ``2w`` as seconds; ValueError otherwise."""
    units = {"m": 60.0, "h": HOUR, "d": 24 * HOUR, "w": 7 * 24 * HOUR}
    number, unit = text[:-1], text[-1:].lower()
    if unit not in units:
        raise ValueError(f"{text!r}: give a number and a unit, e.g. 7d, 36h, 90m, 2w")
    value = float(number)
    if value <= 0:
        raise ValueError(f"{text!r}: must be more than 0")
    return value * units[unit]


def _bucket(at: float, unit: str) -> datetime:
    day = datetime.fromtimestamp(at).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday()) if unit == "week" else day


def _label(start: datetime, unit: str) -> str:
    if unit == "week":
        year, week, _ = start.isocalendar()
        return f"{year}-W{week:02d}"
    return start.strftime("%Y-%m-%d")


def per_calendar(spans: list[Span], unit: str) -> dict[str, float]:
    """GPU hours of ``spans`` per local day or ISO week (``unit``: day | week)."""
    hours: dict[str, float] = defaultdict(float)
    for span in spans:
        at = span.start
        while at < span.end:
            start = _bucket(at, unit)
            following = (start + timedelta(days=7 if unit == "week" else 1)).timestamp()
            upto = min(span.end, following)
            hours[_label(start, unit)] += (upto - at) * span.gpus / HOUR
            at = upto
    return dict(hours)


def _hours(spans: list[Span]) -> float:
    return gpu_seconds(spans) / HOUR


def _totals(notebooks: list[NotebookSpans]) -> dict[str, float]:
    allocated = _hours([s for nb in notebooks for s in nb.held])
    idle = _hours([s for nb in notebooks for s in nb.idle])
    return {
        "gpu_hours_allocated": allocated,
        "gpu_hours_active": max(0.0, allocated - idle),
        "gpu_hours_idle": idle,
        "gpu_hours_released": _hours([s for nb in notebooks for s in nb.released]),
    }


def _calendar(notebooks: list[NotebookSpans], unit: str) -> list[dict[str, Any]]:
    kinds = {
        "allocated": [s for nb in notebooks for s in nb.held],
        "idle": [s for nb in notebooks for s in nb.idle],
        "released": [s for nb in notebooks for s in nb.released],
    }
    tables = {kind: per_calendar(spans, unit) for kind, spans in kinds.items()}
    rows = []
    for label in sorted({label for table in tables.values() for label in table}):
        allocated = tables["allocated"].get(label, 0.0)
        rows.append(
            {
                unit: label,
                "gpu_hours_allocated": allocated,
                "gpu_hours_active": max(0.0, allocated - tables["idle"].get(label, 0.0)),
                "gpu_hours_released": tables["released"].get(label, 0.0),
            }
        )
    return rows


def _latency(values: list[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else None,
    }


def _windowed(nb: NotebookSpans, start: float, end: float) -> NotebookSpans:
    """The notebook's spans, absences and resumes within [start, end]."""
    nb.held, nb.idle, nb.released = (clip(s, start, end) for s in (nb.held, nb.idle, nb.released))
    absences = []
    for a in nb.absences:
        if a.end > start:
            absences.append(type(a)(max(a.start, start), a.end, a.gpus, a.returned))
    nb.absences = absences
    nb.resumes = [r for r in nb.resumes if start <= r.requested <= end]
    nb.pauses = [at for at in nb.pauses if start <= at <= end]
    nb.pauses_outside = [at for at in nb.pauses_outside if start <= at <= end]
    return nb


def build(
    listing: dict[str, Any],
    since_seconds: float | None,
    by: str = "notebook",
    prices: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The report's numbers as JSON data; ``prices`` override the server's."""
    now = float(listing["now"])
    all_spans = [notebook_spans(nb, now) for nb in listing.get("notebooks") or []]
    first = min(
        (float(e["at"]) for nb in listing.get("notebooks") or [] for e in nb.get("events") or []),
        default=now,
    )
    start = now - since_seconds if since_seconds else first
    pauses_recorded = sum(len(nb.pauses) for nb in all_spans)  # before the window clips them
    notebooks = [_windowed(nb, start, now) for nb in all_spans]
    gpu_notebooks = [nb for nb in notebooks if nb.uses_gpus]
    prices = {**(listing.get("prices") or {}), **(prices or {})}

    groups: dict[str, list[NotebookSpans]] = defaultdict(list)
    for nb in notebooks:
        groups[GROUPS[by](nb)].append(nb)
    rows = []
    for name, members in sorted(groups.items()):
        storage = sum(nb.storage_bytes for nb in members)
        rows.append(
            {
                by: name,
                **_totals(members),
                "pauses": sum(len(nb.pauses) for nb in members),
                "resumes": sum(len(nb.resumes) for nb in members),
                "storage_bytes": storage,
            }
        )

    resumes = [r for nb in notebooks for r in nb.resumes]
    restores = {
        how: 0 for how in ("live", LIVE_NOT_PROVEN, "files", "partial", "failed", "in flight")
    }
    for r in resumes:
        restores[r.how or "in flight"] += 1
    totals = _totals(notebooks)
    storage_bytes = sum(nb.storage_bytes for nb in notebooks)
    money = _money(totals, storage_bytes, prices)
    return {
        "window": {"start": start, "end": now, "seconds": now - start},
        "by": by,
        "notebooks": len(notebooks),
        "gpu_notebooks": len(gpu_notebooks),
        # requests, as `jupyter pause timeline` counts them
        "pauses": sum(len(nb.pauses) for nb in notebooks),
        # of which the platform's own: the dashboard, kubectl, a culler, a SIGTERM
        "pauses_outside": sum(len(nb.pauses_outside) for nb in notebooks),
        "resumes": len(resumes),
        "pauses_recorded": pauses_recorded,
        "totals": totals,
        "groups": rows,
        "weeks": _calendar(notebooks, "week"),
        "days": _calendar(notebooks, "day"),
        "storage": {
            "bytes": storage_bytes,
            "checkpoints": sum(nb.checkpoints for nb in notebooks),
            "snapshots": sum(nb.snapshots for nb in notebooks),
            "store": listing.get("store"),
        },
        "resume_latency_seconds": {
            "queue": _latency([v for r in resumes if (v := r.queue_seconds) is not None]),
            "to_ready": _latency([v for r in resumes if (v := r.to_ready_seconds) is not None]),
            "to_next_cell": _latency(
                [v for r in resumes if (v := r.to_next_cell_seconds) is not None]
            ),
        },
        "restores": restores,
        "prices": prices,
        "money": money,
        "idle_threshold_study": _study(gpu_notebooks),
    }


def _money(totals: dict[str, float], storage_bytes: int, prices: dict[str, float]) -> dict | None:
    gpu_price = float(prices.get("gpu_hour") or 0.0)
    storage_price = float(prices.get("storage_gb_month") or 0.0)
    if not gpu_price and not storage_price:
        return None
    return {
        "saved_by_pausing": totals["gpu_hours_released"] * gpu_price,
        "spent_on_idle_gpus": totals["gpu_hours_idle"] * gpu_price,
        "spent_on_allocated_gpus": totals["gpu_hours_allocated"] * gpu_price,
        "storage_per_month": storage_bytes / GB * storage_price,
    }


def _study(notebooks: list[NotebookSpans]) -> dict[str, Any]:
    costs = measured_costs(notebooks)
    absences = [a for nb in notebooks for a in nb.absences]
    outcomes = study(absences, costs)
    by_kernelspec = {}
    for name in sorted({nb.kernel_name for nb in notebooks}):
        members = [nb for nb in notebooks if nb.kernel_name == name]
        own = measured_costs(members)
        # Too few pauses of this kernelspec to measure: the costs measured over all of them.
        chosen = own if own.pauses_measured and own.restores_measured else costs
        best = recommend(study([a for nb in members for a in nb.absences], chosen))
        by_kernelspec[name] = {
            "recommended_minutes": None if best is None else best.minutes,
            "outcome": None if best is None else best.to_json(),
            "costs": chosen.to_json(),
        }
    best = recommend(outcomes)
    return {
        "costs": costs.to_json(),
        "absences": len(absences),
        "at_zero": replay(absences, 0.0, Costs(0.0, 0.0, 0, 0)).to_json(),
        "thresholds": [o.to_json() for o in outcomes],
        "recommended_minutes": None if best is None else best.minutes,
        "by_kernelspec": by_kernelspec,
    }
