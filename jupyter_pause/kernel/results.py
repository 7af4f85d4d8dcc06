"""What the checkpoint engine answers: results of a checkpoint and a restore, and its error.

Dataclasses with ``to_json`` (the server reads them) and ``summary`` (the magics print it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..formatting import format_bytes, format_count, format_reasons
from .session import SessionReport

ProgressCallback = Callable[[str, int, int], None]  # (phase, bytes done, bytes total)


@dataclass
class CheckpointResult:
    """What one checkpoint saved, skipped, wrote and reused."""

    checkpoint_id: int
    notebook: str
    created: float
    saved: list[str]
    skipped: dict[str, str]
    bytes_written: int
    bytes_reused: int
    bytes_total: int
    seconds: float
    reason: str = "manual"
    torn: list[int] = field(default_factory=list)
    retired: list[int] = field(default_factory=list)
    session: dict[str, Any] = field(default_factory=dict)  # SessionReport.to_json()
    warnings: list[str] = field(default_factory=list)
    detached: dict[str, str] = field(default_factory=dict)  # name -> autograd function

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        line = (
            f"Checkpoint {self.checkpoint_id}: {format_count(len(self.saved), 'variable')} saved, "
            f"{format_bytes(self.bytes_written)} written, {format_bytes(self.bytes_reused)} reused, "
            f"{self.seconds:.2f} s"
        )
        done = self.session.get("done", {})
        if done:
            line += "; with the session: " + ", ".join(
                format_count(len(labels), "import") if group == "imports" else ", ".join(labels)
                for group, labels in done.items()
            )
        if self.skipped:
            line += "; skipped: " + format_reasons(self.skipped, "; ")
        if self.session.get("failed"):
            line += "; session not saved: " + format_reasons(self.session["failed"], "; ")
        if self.detached:
            line += "; autograd graph not saved: " + _detached_reasons(self.detached)
        if self.torn:
            ids = ", ".join(str(i) for i in self.torn)
            line += f"; found interrupted checkpoint(s) {ids} (kernel died while writing), removed"
        for warning in self.warnings:
            line += f"\nWarning: {warning}"
        return line


@dataclass
class RestoreResult:
    """What came back from a checkpoint, what did not, and why."""

    checkpoint_id: int
    notebook: str
    restored: list[str]
    failed: dict[str, str]
    not_saved: dict[str, str]
    warnings: list[str]
    rng: list[str]
    seconds: float
    bytes_read: int
    saved_by_token: str
    same_process: bool
    session: dict[str, Any] = field(default_factory=dict)  # SessionReport.to_json()
    detached: dict[str, str] = field(default_factory=dict)  # name -> autograd function
    # Variables this kernel had defined itself (it did not write the checkpoint) that the
    # restore replaced: a cell run in a reopened notebook before its resume, for example.
    replaced: list[str] = field(default_factory=list)
    # A restore by name: the checkpoint's other variables, which were not asked for.
    not_asked: list[str] = field(default_factory=list)
    # A lazy restore: bytes handed over as maps, still coming in (and checked) after ready.
    loading_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def complete(self) -> bool:
        """Everything the checkpoint held came back (what it never held is listed apart)."""
        return not self.failed and not self.session.get("failed")

    def summary(self) -> str:
        line = (
            f"Restored checkpoint {self.checkpoint_id}: "
            f"{format_count(len(self.restored), 'variable')} "
            f"({', '.join(self.restored) or 'none'}), {format_bytes(self.bytes_read)}, "
            f"{self.seconds:.2f} s"
        )
        done = self.session.get("done", {})
        if done:
            line += "; " + SessionReport(done=done).describe()
        if self.failed:
            line += "; not restored: " + format_reasons(self.failed, "; ")
        if self.session.get("failed"):
            line += "; session not restored: " + format_reasons(self.session["failed"], "; ")
        if self.detached:
            line += "; autograd graph not restored: " + _detached_reasons(
                self.detached, restored=True
            )
        if self.not_saved:
            line += "; not in the checkpoint: " + format_reasons(self.not_saved, "; ")
        if self.replaced:
            line += "; replaced what this kernel had defined: " + ", ".join(self.replaced)
        for warning in self.warnings:
            line += f"\nWarning: {warning}"
        return line


def _detached_reasons(detached: dict[str, str], restored: bool = False) -> str:
    """Per variable: which backward() will fail, with what error, and what to do first."""
    when = "detached" if restored else "detached after a restore"
    return format_reasons(
        {
            name: f"computed by {function}; {when}, so {name}.backward() or any backward() "
            'through it raises "element 0 of tensors does not require grad": re-run the '
            "forward pass that computes it first"
            for name, function in detached.items()
        },
        "; ",
    )


@dataclass
class CheckpointInfo:
    """One line of ``%checkpoint list``."""

    checkpoint_id: int
    created: float
    nbytes: int
    variables: list[str]
    skipped: dict[str, str]
    reason: str
    process_token: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class CheckpointError(Exception):
    """A checkpoint or restore that did not happen; the message says why and what is intact."""
