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

    def brief(self) -> str:
        """One line for a report: the error, else the start of what was printed or shown."""
        if self.error:
            return self.error
        if self.status != "ok":
            return self.status
        for text in (self.stdout, self.stderr):
            if text.strip():
                return _first_line(text)
        for display in self.displays:
            if "text/plain" in display:
                return _first_line(display["text/plain"])
            return ", ".join(display)
        return "(no output)"


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


def _first_line(text: str, width: int = 120) -> str:
    line = text.strip().splitlines()[0]
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
