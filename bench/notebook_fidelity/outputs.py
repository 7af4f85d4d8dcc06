"""What one cell showed, in a form two kernels can be compared on.

Text is compared after removing what differs between any two processes (memory addresses,
the kernel's per-process cell file names). Images are compared by a hash of their bytes
where the two reference runs drew identical images, otherwise only by their presence.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_CELL_FILE = re.compile(r"/tmp/ipykernel_\d+/\d+\.py|<ipython-input-[\d-]+-[0-9a-f]+>")
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")

#: How a cell's outputs compare: byte-exact images, images by presence, or not at all.
STRICT, LOOSE, UNSTABLE = "strict", "loose", "unstable"


def normalize(text: str) -> str:
    return _CELL_FILE.sub("<cell>", _ADDRESS.sub("0x?", text))


@dataclass
class CellOutput:
    """Everything a cell sent to the notebook, normalized."""

    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    displays: list[dict[str, str]] = field(default_factory=list)
    status: str = "ok"  # ok, error, timeout, dead (the kernel process died)

    def add_message(self, kind: str, content: dict[str, Any]) -> None:
        """One iopub message of this cell."""
        if kind == "stream":
            text = normalize(content["text"])
            if content["name"] == "stdout":
                self.stdout += text
            else:
                self.stderr += text
        elif kind in ("display_data", "execute_result", "update_display_data"):
            self.displays.append(_display(content.get("data", {})))
        elif kind == "error":
            self.error = normalize(f"{content['ename']}: {content['evalue']}")
            self.status = "error"
        elif kind == "clear_output":
            self.stdout, self.stderr, self.displays = "", "", []

    def record(self, level: str = STRICT) -> dict[str, Any]:
        """The comparable form; LOOSE keeps which images were shown but not their bytes."""
        displays = self.displays
        if level == LOOSE:
            displays = [
                {mime: ("shown" if mime in _IMAGE_TYPES else value) for mime, value in d.items()}
                for d in displays
            ]
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "error": self.error,
            "displays": displays,
            "status": self.status,
        }


def describe_difference(expected: CellOutput, got: CellOutput, level: str) -> tuple[str, str]:
    """The first part of a cell's outputs that differs, as one line each: (expected, got)."""
    want, have = expected.record(level), got.record(level)
    for key in ("error", "status", "stdout", "stderr"):
        if want[key] != have[key]:
            return _first_different_line(want[key] or "", have[key] or "", key)
    for shown, shows in zip_longest(want["displays"], have["displays"], fillvalue={}):
        if shown != shows:
            return _display_line(shown), _display_line(shows)
    return "(same)", "(same)"


def _first_different_line(want: str, have: str, what: str) -> tuple[str, str]:
    for old, new in zip_longest(want.splitlines(), have.splitlines(), fillvalue=""):
        if old != new:
            return f"{what}: {_clip(old) or '(none)'}", f"{what}: {_clip(new) or '(none)'}"
    return f"{what}: (none)", f"{what}: (none)"


def _display_line(shown: dict[str, str]) -> str:
    if not shown:
        return "(no display)"
    parts = [
        f"{mime} {_clip(value.strip().splitlines()[0]) if value.strip() else ''}"
        for mime, value in shown.items()
    ]
    return "display: " + "; ".join(parts)


def _display(data: dict[str, Any]) -> dict[str, str]:
    shown: dict[str, str] = {}
    if "text/plain" in data:
        shown["text/plain"] = normalize(data["text/plain"])
    for mime in _IMAGE_TYPES:
        if mime in data:
            raw = data[mime]
            payload = base64.b64decode(raw) if mime != "image/svg+xml" else raw.encode()
            shown[mime] = hashlib.sha256(payload).hexdigest()[:16]
    if not shown:  # HTML-only, widgets, ...: which kinds of output, not their content
        shown = {mime: "shown" for mime in sorted(data)}
    return shown


def _clip(line: str, width: int = 120) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def stability(first: CellOutput, second: CellOutput) -> str:
    """How a cell compares, from two uninterrupted runs of the notebook."""
    if first.record(STRICT) == second.record(STRICT):
        return STRICT
    if first.record(LOOSE) == second.record(LOOSE):
        return LOOSE
    return UNSTABLE


def same_output(reference: CellOutput, resumed: CellOutput, level: str) -> bool:
    return reference.record(level) == resumed.record(level)
