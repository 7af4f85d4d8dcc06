"""The pause of one notebook: checkpoint, stop the kernel, give back its GPU (and of every
notebook at once when the platform stops the server, for a backend whose kernels run elsewhere).

``start`` checks the request and returns at once with the record in ``checkpointing`` (or
``pausing``, for a running cell that a backend can snapshot as it runs); ``_run`` does the
work in a task the registry holds, so that a second request sees it in flight. A failed
pause never loses anything: the kernel keeps running and the record says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ..backends.base import Backend, BackendError
from ..formatting import format_bytes
from ..records import KernelActivity, SessionRecord
from . import metrics
from .checkpoints import Checkpoints, cell_name
from .kernel_bridge import KernelBridge, KernelCallError
from .kernels import Kernels
from .sessions import Sessions, intact_text, spec
from .states import RUNNING_STATES, Conflict

log = logging.getLogger(__name__)


class Pauses:
    """Pauses single notebooks (a whole environment pauses in ``environment.py``)."""

    def __init__(
        self,
        sessions: Sessions,
        kernels: Kernels,
        checkpoints: Checkpoints,
        backend: Backend,
        bridge: KernelBridge,
    ) -> None:
        self.sessions = sessions
        self.kernels = kernels
        self.checkpoints = checkpoints
        self.backend = backend
        self.bridge = bridge

    async def start(self, record: SessionRecord, reason: str) -> SessionRecord:
        """Start a pause (returns at once with the record; follow its state)."""
        path = record.path  # a notebook sharing another's kernel pauses that one
        self.checkpoints.refuse_if_waiting(record, "pause")
        async with self.sessions.lock(path):
            if record.state == "paused" and record.unrestored_kernel:
                raise Conflict(
                    f"{path} is already paused; the kernel running for it does not hold its "
                    "state: resume to restore it into that kernel"
                )
            if record.state == "paused":
                raise Conflict(f"{path} is already paused")
            self.sessions.require_running(record, "pause")
            cell = None
            if record.activity.busy and await self.backend.pauses_running_cells():
                cell = await self._running_cell_pause(record)
            else:
                await self.checkpoints.wait_idle(record, "pause")
            record.timeline.add("last_activity", at=record.activity.last_activity or record.started)
            if cell is None:
                record.timeline.add("pause_requested", reason=reason)
                self.sessions.set(
                    record, "checkpointing", "Saving the session state.", error=None, how=None
                )
            else:
                record.timeline.add("pause_requested", reason=reason, during_cell=cell)
                self.sessions.set(
                    record,
                    "pausing",
                    f"Pausing during cell [{cell}]: its process is saved as it stands."
                    + _fallback_text(record.checkpoint),
                    error=None,
                    how=None,
                )
            record.paused_during_cell = cell
            self.sessions.tasks[path] = asyncio.create_task(self._run(record))
        return record

    async def pause_all(self, reason: str, budget: float) -> list[str]:
        """The server is stopping (SIGTERM): pause every running notebook within ``budget``
        seconds, so each comes back from its checkpoint once the server is back. A running
        cell is interrupted first: it would end with the server's shutdown of its kernel
        anyway, and what it computed so far is saved. Returns the paths paused; the log names
        the others and why."""
        deadline = time.monotonic() + budget
        running = [
            record
            for record in list(self.sessions.records.values())
            if record.state in RUNNING_STATES
            and record.kernel_id
            and record.path not in self.sessions.tasks
        ]
        for record in running:
            if record.activity.busy and record.kernel_id:
                with contextlib.suppress(Exception):
                    await self.bridge.kernel_manager.interrupt_kernel(record.kernel_id)
        pauses = []
        for record in running:
            while record.activity.busy and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            try:
                await self.start(record, reason)
            except Conflict as err:
                log.warning(
                    "jupyter_pause: %s not paused at the server's stop: %s", record.path, err
                )
                continue
            if record.path in self.sessions.tasks:
                pauses.append(self.sessions.tasks[record.path])
        if pauses:
            await asyncio.wait(pauses, timeout=max(0.1, deadline - time.monotonic()))
        paused = [record.path for record in running if record.state == "paused"]
        for record in running:
            if record.state != "paused":
                log.warning(
                    "jupyter_pause: %s not paused within %.0f s of the server's stop (%s): %s",
                    record.path,
                    budget,
                    record.state,
                    record.message,
                )
        return paused

    async def _running_cell_pause(self, record: SessionRecord) -> int | None:
        """The cell a busy kernel is paused in (the backend snapshots its process as it runs);
        Conflict when there is no checkpoint to fall back on if that process cannot come back."""
        latest = (await self.sessions.inspect(record)).latest
        if latest is None:
            raise Conflict(
                f"Cannot pause {record.path} while {cell_name(record)} runs: it has no "
                "checkpoint yet to fall back on if its process cannot be brought back. Try "
                "again when the cell finishes (the pause then takes one)."
            )
        record.checkpoint = latest
        return record.activity.execution_count

    async def _run(self, record: SessionRecord) -> None:
        sessions = self.sessions
        token = None  # of the process this pause stops: from this pause's own answers
        try:
            if record.paused_during_cell is None:
                try:
                    _result, token = await self.checkpoints.take(
                        record, reason="pause", then="checkpointing"
                    )
                except Conflict:
                    record.timeline.add(
                        "failed", what="checkpoint", recovery="session still running"
                    )
                    sessions.set(record, "active", record.message)
                    metrics.pause_finished("failed")
                    return
                sessions.set(record, "pausing", "Stopping the kernel and releasing its GPU.")
            snapshot = await self.backend.pauses_running_cells()
            if snapshot:
                token = await self._before_process_snapshot(record) or token
            try:
                outcome = await self.backend.stop(spec(record))
            except Exception as err:  # a backend's bug too: never leave the session "pausing"
                if not isinstance(err, BackendError):
                    log.exception("jupyter_pause: stopping %s failed", record.path)
                if snapshot:
                    await self._after_failed_snapshot(record)
                intact = intact_text((await sessions.inspect(record)).latest)
                record.timeline.add("failed", what=f"stop: {err}")
                sessions.set(
                    record,
                    "active",
                    f"Pause failed: {err}. The session keeps running.",
                    error={"what": f"stop failed: {err}", "recovery": "Nothing was lost." + intact},
                    paused_during_cell=None,
                )
                metrics.pause_finished("failed")
                return
            if outcome.snapshot:
                record.timeline.add("snapshot_taken", name=outcome.snapshot, **outcome.details)
            no_snapshot = outcome.details.get("snapshot_problem")
            record.timeline.add(
                "kernel_stopped",
                at=outcome.stopped_at,
                **({"no_snapshot": no_snapshot} if no_snapshot else {}),
            )
            if record.gpus or record.gpus_needed:
                record.timeline.add(
                    "gpu_released",
                    at=outcome.gpu_released_at or outcome.stopped_at,
                    measured=outcome.gpu_release_measured,
                    gpus=record.gpus,
                )
            if outcome.snapshot:
                record.checkpoint = {**(record.checkpoint or {}), "snapshot": outcome.snapshot}
            self.kernels.stop_watching(record)
            record.busy_seconds_before = record.busy_seconds()
            record.activity = KernelActivity()
            saved = format_bytes((record.checkpoint or {}).get("bytes", 0))
            when = time.strftime("%H:%M", time.localtime())
            message = f"Paused since {when} ({saved} saved)."
            if record.paused_during_cell is not None:
                image = format_bytes(outcome.details.get("bytes", 0))
                message = (
                    f"Paused during cell [{record.paused_during_cell}] since {when} (process "
                    f"image {image}); the cell runs on after the resume."
                    + _fallback_text(record.checkpoint)
                )
            elif outcome.snapshot:
                image = format_bytes(outcome.details.get("bytes", 0))
                message = f"Paused since {when} ({saved} saved, process image {image})."
            elif no_snapshot:
                message += f" No process image ({no_snapshot}): the resume restores from files."
            sessions.set(
                record,
                "paused",
                message,
                # A kernel pod keeps its kernel (and the notebook its session) while paused.
                kernel_id=record.kernel_id if outcome.kernel_kept else None,
                gpus=[],
                progress=None,
                # Without an answer from this pause (a busy kernel that did not say who it
                # is), the token the server learnt from this very kernel before it stopped.
                paused_process_token=token or record.process_token,
                paused_checkpoint_id=(record.checkpoint or {}).get("id"),
                unrestored_kernel=False,
            )
            metrics.pause_finished("paused")
        finally:
            sessions.tasks.pop(record.path, None)

    async def _before_process_snapshot(self, record: SessionRecord) -> str | None:
        """The kernel lets go of its parent process (so it may come back under a restarted
        server) and says who it is (the token its restore must show), on its control channel:
        a running cell does not delay it. Without an answer, the checkpoint's token stands."""
        assert record.kernel_id is not None
        try:
            answer = await self.bridge.control(record.kernel_id, "release_parent")
        except KernelCallError as err:
            log.info("jupyter_pause: %s before its snapshot: %s", record.path, err)
            return None
        token = answer.get("token")
        record.process_token = token or record.process_token
        return token

    async def _after_failed_snapshot(self, record: SessionRecord) -> None:
        """The kernel runs on: it follows its server again and reopens what it let go of
        (IPython's history database), as after a restore."""
        if record.kernel_id is None:
            return
        try:
            await self.bridge.control(record.kernel_id, "identify")
        except KernelCallError as err:
            log.info("jupyter_pause: %s after its failed snapshot: %s", record.path, err)


def _fallback_text(checkpoint: dict[str, Any] | None) -> str:
    """`` Checkpoint 3 from 18:02, the last one taken at a safe point, is the fallback.``"""
    if not checkpoint:
        return ""
    when = time.strftime("%H:%M", time.localtime(checkpoint["created"]))
    return (
        f" Checkpoint {checkpoint['id']} from {when}, the last one taken at a safe point, "
        "is the fallback."
    )
