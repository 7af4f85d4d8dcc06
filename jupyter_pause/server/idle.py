"""Idle sessions: the auto-pause, the checkpoint before jupyter-server's culler, and the user.

``check_idle`` runs from the orchestrator's monitor every ``monitor_interval_seconds``. A
busy kernel is never auto-paused however long it runs; a session idle longer than its
kernelspec's policy allows is paused (an environment only once every notebook in it is idle);
an idle kernel is checkpointed at 80% of the culler's timeout; and the kernel of a reopened
paused notebook that nobody resumed or used is stopped rather than holding its GPU all night.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..formatting import format_duration
from ..policy import Policy
from ..records import SessionRecord
from .checkpoints import Checkpoints
from .kernel_bridge import KernelBridge
from .kernels import Kernels
from .sessions import Sessions, intact_text, resume_target
from .states import RUNNING_STATES, PauseError, UnknownSession


class Idle:
    """Watches how long each session has been idle, and acts on the policy."""

    def __init__(
        self,
        sessions: Sessions,
        kernels: Kernels,
        checkpoints: Checkpoints,
        bridge: KernelBridge,
        policy: Policy,
        pause: Callable[[str, str], Awaitable[Any]],
        whole_environment: bool,
        cull_idle_seconds: float = 0.0,
    ) -> None:
        self.sessions = sessions
        self.kernels = kernels
        self.checkpoints = checkpoints
        self.bridge = bridge
        self.policy = policy
        self.pause = pause  # the orchestrator's: a whole environment pauses as one
        self.whole_environment = whole_environment
        # jupyter-server's own culler kills idle kernels: checkpoint them before it does.
        self.cull_idle_seconds = cull_idle_seconds
        # Set where a pause gives the whole server back (JupyterHub): called with the idle
        # pause's threshold (s) when no kernel runs here, it stops a server left with no work
        # (an open tab on paused notebooks would hold it, and its GPU, for good).
        self.when_empty: Callable[[float], Awaitable[None]] | None = None

    # -- the user ----------------------------------------------------------------------------------
    def note_user_activity(self, path: str) -> None:
        record = self.sessions.records.get(path)
        if record is None:
            raise UnknownSession(f"No session for {path!r}")
        self.note_return(record, record.activity.last_activity)
        record.activity.last_activity = time.time()

    def note_return(self, record: SessionRecord, idle_since: float | None) -> None:
        """The user is back: a long idle gap while the kernel held GPUs goes on the timeline
        (the GPU-hours report's idle-threshold study replays them)."""
        if record.gpus and record.timeline.add_idle_gap(idle_since) is not None:
            self.sessions.save(record)

    # -- the policy ------------------------------------------------------------------------------
    async def check_idle(self, now: float | None = None) -> list[str]:
        """Pause every session idle longer than its policy allows; returns their paths."""
        await self.kernels.sync()
        now = time.time() if now is None else now
        running, idle = 0, []
        for record in list(self.sessions.records.values()):
            if record.unrestored_kernel and record.kernel_id is not None:
                await self._stop_if_idle_without_state(record, now)
                continue
            if record.state not in RUNNING_STATES or record.kernel_id is None:
                continue
            running += 1
            if record.activity.busy or record.path in self.sessions.tasks:
                continue  # a busy kernel is never auto-paused, however long it runs
            idle_for = now - max(record.activity.last_activity, record.started)
            await self._checkpoint_before_cull(record, idle_for)
            rules = self.policy.for_kernelspec(record.kernel_name)
            if not rules.auto_pause or rules.idle_minutes <= 0:
                continue
            running_for = now - record.started
            if (
                idle_for >= rules.idle_minutes * 60
                and running_for >= rules.min_running_minutes * 60
            ):
                idle.append((record.path, f"idle for {idle_for / 60:.0f} min"))
        if (
            running == 0
            and self.when_empty is not None
            and self.policy.idle_pause_minutes > 0
            and not any(r.kernel_id for r in self.sessions.records.values())
        ):
            await self.when_empty(self.policy.idle_pause_minutes * 60)
        if self.whole_environment:
            # The environment (and its GPU) pauses only once every notebook in it is idle.
            if not idle or len(idle) < running:
                return []
            idle = idle[:1]
        paused = []
        for path, reason in idle:
            with contextlib.suppress(PauseError):
                await self.pause(path, reason)
                paused.append(path)
        return paused

    async def _stop_if_idle_without_state(self, record: SessionRecord, now: float) -> None:
        """A paused notebook opened again whose new kernel nobody resumed or used for the idle
        time: that kernel would hold its GPU all night. It is stopped (what cells ran in it
        saved first); the pause stands as it was, and Resume still restores its checkpoint."""
        rules = self.policy.for_kernelspec(record.kernel_name)
        kernel_id = record.kernel_id
        tasks = self.sessions.tasks
        if (
            not rules.auto_pause
            or rules.idle_minutes <= 0
            or record.activity.busy
            or record.path in tasks
            or kernel_id is None
            or now - record.activity.last_activity < rules.idle_minutes * 60
        ):
            return
        idle_seconds = now - record.activity.last_activity
        async with self.sessions.lock(record.path):
            # Ours while it stops: sessions seen meanwhile must not end it a second time.
            tasks[record.path] = asyncio.current_task()  # type: ignore[assignment]
            try:
                if record.activity.execution_count:  # cells ran in it: keep what they made
                    with contextlib.suppress(PauseError):
                        await self.checkpoints.take(record, reason="idle", then=record.state)
                with contextlib.suppress(Exception):  # gone already: its end is noted all the same
                    await self.bridge.kernel_manager.shutdown_kernel(kernel_id)
                await self.kernels.ended(record)
            finally:
                tasks.pop(record.path, None)
            record.timeline.add("unrestored_kernel_stopped", idle_seconds=round(idle_seconds))
            self.sessions.set(
                record,
                record.state,
                f"The kernel opened without the saved state was idle for "
                f"{format_duration(idle_seconds)}: stopped, its GPU released. Still paused; "
                "resume to restore."
                + intact_text(resume_target(record, await self.sessions.inspect(record))),
            )

    async def _checkpoint_before_cull(self, record: SessionRecord, idle_for: float) -> None:
        """Save an idle kernel's state before jupyter-server's culler shuts it down."""
        if not self.cull_idle_seconds or idle_for < 0.8 * self.cull_idle_seconds:
            return
        saved = record.timeline.last("checkpoint_written")
        if saved is not None and saved.at >= record.activity.last_activity:
            return  # nothing happened since the last checkpoint
        async with self.sessions.lock(record.path):
            if record.state in RUNNING_STATES and record.kernel_id is not None:
                with contextlib.suppress(PauseError):
                    await self.checkpoints.take(record, reason="before-cull", then=record.state)
