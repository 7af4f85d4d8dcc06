"""The small interface every backend implements.

A pause is: the orchestrator has the kernel write its application checkpoint, then asks the
backend to ``stop`` the session (snapshotting the process where the platform can) and so
release its accelerators. A backend that ``pauses_running_cells`` (``criu``) is also asked to
stop a busy kernel, without a new checkpoint: the last one, taken at a safe point, is then the
fallback of its process snapshot. A resume is: ``request_resources`` (which may wait in a queue),
then ``restore`` (the same process from a snapshot when possible, else a new process into
which the orchestrator restores the application checkpoint; ``kernel-pod`` keeps the kernel's
id through the pause and launches its new process under it), and ``release`` when a session
ends for good. ``describe_resources`` feeds the status API and the metrics.

An ``EnvironmentBackend`` pauses a whole environment instead (a workspace pod: the server and
every kernel in it): the orchestrator checkpoints every kernel, then the backend snapshots the
environment where the platform can (``snapshot_environment``) and stops it
(``stop_environment``). The platform may pause it by itself too (a dashboard, a culler): the
backend tells of it (``watch_platform``), and the orchestrator saves every kernel before the
platform's snapshot where the platform holds the pause for one. Whether the process that comes back is the one that paused (a live
restore) or a new one (a cold start, restored from the checkpoints) is proven on return from
``pod_facts`` and the in-memory tokens, never assumed.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any


class BackendError(Exception):
    """The backend could not do what was asked; the message is shown to the user."""


class ResourcesUnavailable(BackendError):
    """No accelerator can ever be granted for this request (not just: not now)."""


class StillPaused(BackendError):
    """A resume that could not bring the session back left it as it was: paused, its kernel
    and checkpoint intact (the cluster refused, or the new kernel never came up)."""


@dataclass
class SessionSpec:
    """What a backend needs to know about one notebook session."""

    path: str  # notebook path relative to the server root
    key: str  # absolute notebook path: names the checkpoint folder
    kernel_name: str
    kernel_id: str | None
    gpus: int  # accelerators this session needs while it runs
    checkpoint_id: int | None = None  # the newest checkpoint: a process snapshot belongs to it
    busy: bool = False  # a cell runs (only a backend that pauses running cells is asked then)


@dataclass
class StopOutcome:
    stopped_at: float
    gpu_released_at: float | None  # when measured (NVML/nvidia-smi, node freed); else None
    gpu_release_measured: bool
    snapshot: str | None = None  # a memory snapshot id, when the platform took one
    # What the snapshot took (bytes, seconds), or why there is none (``snapshot_problem``).
    details: dict[str, Any] = field(default_factory=dict)
    # The kernel keeps its id in jupyter-server while paused (its pod is gone, the notebook's
    # session stays): the resume brings that kernel back rather than starting another.
    kernel_kept: bool = False


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
    # The kernel came back at a new address under its id (a new pod): the open notebooks'
    # connections still lead to the old one, and are moved once the restore is done.
    moved: bool = False


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
    #: Whether a resume can bring a session back without its GPUs (``SessionSpec.gpus`` 0: a
    #: new kernel restored from files), as the user may ask while a GPU is scarce.
    restores_on_cpu: bool = False
    #: Whether each notebook is paused when the platform stops this server (SIGTERM): its
    #: kernels run elsewhere (kernel pods), and a notebook paused comes back from files once the
    #: server is back, where jupyter-server would only shut its kernel down.
    pauses_on_server_stop: bool = False

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

    async def pauses_running_cells(self) -> bool:
        """Whether a busy kernel can be paused: its process is snapshotted where it stands and
        the running cell goes on after the resume. Else a pause waits for the cell."""
        return False

    def adopt(self, session: SessionSpec) -> list[int]:
        """A running kernel was found (started outside a resume): account for what it holds."""
        return []

    def rename(self, old_path: str, new_path: str) -> None:  # noqa: B027 - optional hook
        """A notebook was renamed while its kernel ran: what it holds moves with it."""


@dataclass
class SnapshotOutcome:
    """What the platform kept of the environment's memory at a pause."""

    name: str | None  # the snapshot taken; None: the pause goes on with the checkpoints only
    problem: str | None = None  # why there is no snapshot, in words for the user
    seconds: float = 0.0
    # This very process runs in a new environment restored from that snapshot (the platform
    # resumes a restored process where the snapshot was taken: inside this call).
    resumed_from_snapshot: bool = False
    mode: str = ""  # how the platform snapshots it (the workspace backend's mode), named
    mode_reason: str = ""  # why that mode (what the cluster showed)
    details: dict[str, Any] = field(default_factory=dict)  # what the snapshot took (bytes)


@dataclass
class EnvironmentFacts:
    """What the platform says about the environment this process runs in now."""

    instance: str  # changes whenever the environment is recreated (a pod's uid)
    restored: bool | None  # the platform restored it from a snapshot: True/False, None: unsaid
    restored_message: str = ""
    pinned_snapshot: str | None = None  # the snapshot it was created to restore, if pinned
    waited_seconds: float | None = None  # how long it waited for resources before it started


@dataclass
class SnapshotInfo:
    name: str
    created: str  # RFC 3339, as the API server wrote it
    ready: bool
    pinned: bool  # the one the next resume restores: never expired
    trigger: str | None = None


PhaseCallback = Callable[[str], None]  # a line saying what the pause waits for now


@dataclass(frozen=True)
class PlatformPause:
    """A pause of the whole environment that the platform carries out."""

    #: The platform holds it while it snapshots the environment (the GKE Workspaces add-on:
    #: the pod runs on until its snapshot is taken); else the environment is being stopped.
    held: bool
    #: When it was asked, as Unix time (the platform's word for it where it says).
    asked_at: float


class EnvironmentBackend(Backend):
    """A backend whose pause stops the whole environment: the server and every kernel."""

    #: What a pause stops, in the user's words.
    noun: str = "workspace"
    #: A new server process restores every paused notebook at once (the user resumed the
    #: environment to work in it, and its GPU is back). False: each stays paused until resumed
    #: (JupyterHub: a spawn is a login, not a resume).
    restores_at_start: bool = True
    #: Who ends this server with a signal when it is not our pause, for the timeline.
    stopper: str = "the platform stopped the pod"
    #: The platform ends this process before it answers ``stop_environment`` (a Hub answers
    #: once the server has stopped): the stop goes on the timeline when it is asked.
    ends_before_answering: bool = False
    #: When the platform was asked to start this server (epoch s; a Hub's spawn), where it
    #: says: the wait until this process began (a GPU pod pending, an image pulled) goes on
    #: the timeline of the notebooks paused before.
    start_requested_at: float | None = None

    @abc.abstractmethod
    async def snapshot_environment(
        self, on_phase: PhaseCallback, ask: bool = True, paused_in: str = ""
    ) -> SnapshotOutcome:
        """Snapshot the environment's memory where the platform can; never raises for that.
        ``ask`` False: the platform asked for this pause itself (``watch_platform``): follow
        the snapshot it takes, if it takes one, without asking again. ``paused_in``: the
        environment the pause began in (an outcome ``resumed_from_snapshot`` once this
        process runs in another)."""

    async def watch_platform(
        self,
        on_pause: Callable[[PlatformPause], Awaitable[None]],
        on_moved: Callable[[EnvironmentFacts], Awaitable[None]],
    ) -> None:
        """Start telling ``on_pause`` of each pause the platform begins (this server's own
        pauses among them), and ``on_moved`` when this process runs in a new environment
        without a pause of this server: thawed from a snapshot it did not see coming."""

    async def hold_platform_pause(self) -> bool:
        """Keep a pause the platform holds from going on for a moment longer (the checkpoints
        are still being written); False when there is nothing (left) to hold."""
        return False

    async def pause_mode(self) -> tuple[str, str]:
        """(mode, why) of the snapshot a pause would take now; ("", "") for a backend with one
        way only. Recorded before the snapshot, which may stop this process."""
        return "", ""

    @abc.abstractmethod
    async def stop_environment(self, state: dict[str, Any]) -> None:
        """Ask the platform to stop the environment (and give its accelerators back).

        ``state`` describes the pause (snapshot, bytes, origin) for whoever looks from
        outside. Raises BackendError when the platform refuses: nothing stops then.
        """

    @abc.abstractmethod
    async def environment_facts(self) -> EnvironmentFacts:
        """The environment this process runs in, as the platform sees it now."""

    @abc.abstractmethod
    async def wait_until_moved(self, instance: str) -> EnvironmentFacts:
        """Return once this process runs in another environment than ``instance``.

        After a pause, the platform either ends the process (SIGTERM) or, where it kept a
        snapshot of it, brings it back in a new environment: this returns then.
        """

    @abc.abstractmethod
    async def announce(self, state: dict[str, Any]) -> None:
        """Publish the environment's pause/restore state where tools outside can read it."""

    @abc.abstractmethod
    async def list_snapshots(self) -> list[SnapshotInfo]:
        """Snapshots this environment made, oldest first (BackendError when unreadable)."""

    @abc.abstractmethod
    async def expire_snapshots(
        self, keep_last: int, max_age_hours: float, pinned: str | None
    ) -> list[str]:
        """Delete this environment's snapshots beyond ``keep_last`` (``pinned`` counted first,
        then the newest) or older than ``max_age_hours`` (0: no limit), never ``pinned``;
        returns their names."""
