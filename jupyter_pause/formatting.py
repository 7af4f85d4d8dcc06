"""How sizes and reasons read in messages, the CLI and the magics (one place, one style)."""

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
