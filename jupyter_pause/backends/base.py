"""The small interface every backend implements.

A pause is: the orchestrator has the kernel write its application checkpoint, then asks the
backend to ``stop`` the session (snapshotting the process where the platform can) and so
release its accelerators. A resume is: ``request_resources`` (which may wait in a queue),
then ``restore`` (the same process from a snapshot when possible, else a new process into
which the orchestrator restores the application checkpoint), and ``release`` when a session
ends for good. ``describe_resources`` feeds the status API and the metrics.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


class BackendError(Exception):
    """The backend could not do what was asked; the message is shown to the user."""


class ResourcesUnavailable(BackendError):
    """No accelerator can ever be granted for this request (not just: not now)."""


@dataclass
class SessionSpec:
    """What a backend needs to know about one notebook session."""

    path: str  # notebook path relative to the server root
    key: str  # absolute notebook path: names the checkpoint folder
    kernel_name: str
    kernel_id: str | None
    gpus: int  # accelerators this session needs while it runs


@dataclass
class StopOutcome:
    stopped_at: float
    gpu_released_at: float | None  # when measured (NVML/nvidia-smi, node freed); else None
    gpu_release_measured: bool
    snapshot: str | None = None  # a memory snapshot id, when the platform took one


@dataclass
class Allocation:
    gpus: list[int] = field(default_factory=list)  # device indices (local) or a claim name
    granted_at: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class RestoreOutcome:
    kernel_id: str
    live: bool  # True: the same process came back from a snapshot
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class ResourceStatus:
    backend: str
    gpus_total: int
    gpus_free: int
    queue: list[str]  # notebook paths waiting for an accelerator, first served first
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


QueueCallback = Callable[[int, str], None]  # (1-based place in the queue, reason)


class Backend(abc.ABC):
    """A place where notebook kernels run and can be stopped and brought back."""

    name: str = "abstract"

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Called once when the server starts."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the server stops."""

    @abc.abstractmethod
    async def stop(self, session: SessionSpec) -> StopOutcome:
        """Snapshot the session where possible, stop its process, release its accelerators."""

    @abc.abstractmethod
    async def request_resources(self, session: SessionSpec, on_queued: QueueCallback) -> Allocation:
        """Wait (first come, first served) until the session's accelerators can be granted."""

    @abc.abstractmethod
    async def restore(self, session: SessionSpec, allocation: Allocation) -> RestoreOutcome:
        """Bring the session back: its snapshot if it has a valid one, else a new kernel."""

    @abc.abstractmethod
    async def release(self, session: SessionSpec) -> None:
        """Give back what the session holds (its kernel ended without a pause)."""

    @abc.abstractmethod
    def describe_resources(self) -> ResourceStatus:
        """Accelerators in total, free now, and the waiting queue."""

    def adopt(self, session: SessionSpec) -> list[int]:
        """A running kernel was found (started outside a resume): account for what it holds."""
        return []

    def rename(self, old_path: str, new_path: str) -> None:  # noqa: B027 - optional hook
        """A notebook was renamed while its kernel ran: what it holds moves with it."""
