"""How sizes, durations and reasons read in messages, the CLI and the magics (one place, one style)."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """``702413312`` -> ``"702.4 MB"`` (decimal units, like disk vendors and `df -H`)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def format_reasons(reasons: dict[str, str], separator: str = ", ") -> str:
    """``{"f": "an open file"}`` -> ``"f (an open file)"``: what was left out, and why."""
    return separator.join(f"{name} ({why})" for name, why in reasons.items())


def format_count(n: int, noun: str) -> str:
    """``1, "variable"`` -> ``"1 variable"``; ``2`` -> ``"2 variables"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def format_duration(seconds: float | None) -> str:
    """Seconds as ``4.1 s``, ``12 min 5 s`` or ``3 h 02 min``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
