"""``timeline``: a notebook's pause and resume events, and where its GPU time went."""

from __future__ import annotations

import argparse
from typing import Any

from ..formatting import format_bytes, format_duration
from .client import EXIT_OK, Client, quote_path
from .output import format_time, plural, print_json, table


def cmd_timeline(client: Client, args: argparse.Namespace) -> int:
    data = client.get("timeline", quote_path(args.path))
    if args.json:
        print_json(data)
        return EXIT_OK
    print(f"Timeline of {data['path']} (now {data['state']}):")
    events = data.get("events") or []
    first = events[0]["at"] if events else 0.0
    rows = [
        (format_time(e["at"]), f"+{format_duration(e['at'] - first)}", e["kind"], event_data(e))
        for e in events
    ]
    if rows:
        print(
            table(
                ("  TIME", "SINCE START", "EVENT", "DETAILS"), [("  " + r[0], *r[1:]) for r in rows]
            )
        )
    else:
        print("  no events yet")
    print(accounting_text(data.get("accounting") or {}))
    return EXIT_OK


def event_data(event: dict[str, Any]) -> str:
    """An event's data as short ``key=value`` pairs: one line per event stays readable."""
    return " ".join(f"{key}={short_value(key, value)}" for key, value in event["data"].items())


def short_value(key: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if key.startswith("bytes") and isinstance(value, int | float):
        return format_bytes(value).replace(" ", "")
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict):  # e.g. skipped/failed: the names; the reasons are in `list`
        value = list(value)
    if isinstance(value, list):
        shown = ",".join(str(v) for v in value[:5])
        return shown + (f",+{len(value) - 5}" if len(value) > 5 else "") if value else "-"
    return str(value)


def accounting_text(acc: dict[str, Any]) -> str:
    gpus = acc.get("gpus", 0)
    return "\n".join(
        (
            f"GPU time ({plural(gpus, 'GPU')}): "
            f"allocated {format_duration(acc.get('gpu_seconds_allocated', 0))}, "
            f"active {format_duration(acc.get('gpu_seconds_active', 0))}, "
            f"released {format_duration(acc.get('gpu_seconds_released', 0))}",
            f"Pauses: {acc.get('pauses', 0)}, resumes: {acc.get('resumes', 0)}; last resume to "
            f"ready {format_duration(acc.get('last_resume_to_ready_seconds'))}, "
            f"to next cell {format_duration(acc.get('last_resume_to_next_cell_seconds'))}",
            f"Checkpoint data written: {format_bytes(acc.get('bytes_saved', 0))}",
        )
    )
