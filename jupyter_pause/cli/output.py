"""How the commands print: tables, times, JSON, and the progress line of a pause or resume."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from ..formatting import format_bytes


def format_time(at: float | None, with_date: bool = True) -> str:
    """A Unix time in the user's local time zone (the server may be elsewhere)."""
    if not at:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(at))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns; the last one is not padded so long messages do not wrap early."""
    cells = [list(headers), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers) - 1)]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def session_row(session: dict[str, Any]) -> tuple[str, str, str, str]:
    """A session as the PATH, STATE, GPUS, MESSAGE columns of `status` and `list`."""
    gpus = ",".join(str(g) for g in session.get("gpus") or []) or "-"
    return session["path"], session["state"], gpus, session.get("message") or ""


def describe(record: dict[str, Any], bar: bool) -> str:
    """One line of a session's state: phase, bytes done/total, percent, queue place."""
    state = record.get("state", "?")
    text = f"{record.get('path')}: {state}"
    if state == "waiting-for-resources":
        reason = (record.get("message") or "").removeprefix("Waiting for a GPU: ")
        place = record.get("queue_position")
        if place and "queue" not in reason:  # a backend's reason may already give the place
            reason = f"{reason}; " if reason else ""
            reason += f"place {place} in the queue"
        text += f" ({reason})" if reason else ""
    progress = record.get("progress") or {}
    if progress.get("phase"):
        text += f", {progress['phase']}"
    done, total = progress.get("done") or 0, progress.get("total") or 0
    if total:
        percent = min(100, int(100 * done / total))
        filled = "#" * (percent // 5)
        meter = f" [{filled:-<20}]" if bar else ""
        text += f"{meter} {format_bytes(done)}/{format_bytes(total)} {percent}%"
    return text


class Progress:
    """Shows the state on stderr: one rewritten line on a terminal, plain lines otherwise."""

    #: On a pipe, repeat a line of the same phase at most this often (logs stay short).
    PLAIN_EVERY_SECONDS = 2.0

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last_text = ""
        self.last_key: tuple[Any, ...] = ()
        self.last_print = 0.0

    def show(self, record: dict[str, Any]) -> None:
        text = describe(record, bar=self.tty)
        if text == self.last_text:
            return
        if self.tty:
            width = max(20, _terminal_width() - 1)
            self.stream.write("\r\x1b[K" + text[:width])
        else:
            key = (record.get("state"), (record.get("progress") or {}).get("phase"))
            if (
                key == self.last_key
                and time.monotonic() - self.last_print < self.PLAIN_EVERY_SECONDS
            ):
                return
            self.stream.write(text + "\n")
            self.last_key, self.last_print = key, time.monotonic()
        self.stream.flush()
        self.last_text = text

    def finish(self) -> None:
        if self.tty and self.last_text:
            self.stream.write("\n")
            self.stream.flush()


def _terminal_width() -> int:
    """Columns of the terminal on stderr; 80 where unknown (a pty may report 0)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or 80
    except (OSError, ValueError):
        return 80
