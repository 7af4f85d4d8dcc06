"""Checkpoints the server asks a running kernel for: now, before a pause, before the culler.

A running cell is never interrupted: a request waits for it (up to the policy's
``busy_wait_seconds``), and a second request while one waits is answered at once. The kernel
writes the checkpoint; the server follows its progress file, and puts each checkpoint on the
notebook's timeline once (the kernel also announces the ones it takes by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from ..policy import Policy
from ..records import SessionRecord
from . import metrics
from .kernel_bridge import KernelBridge, KernelCallError
from .sessions import Sessions, intact_text, resume_target
from .states import Conflict


class Checkpoints:
    """Takes the checkpoints of running sessions through their kernels."""

    def __init__(self, sessions: Sessions, bridge: KernelBridge, policy: Policy) -> None:
        self.sessions = sessions
        self.bridge = bridge
        self.policy = policy
        self._waiting_idle: dict[str, str] = {}  # path -> the pause/checkpoint waiting for idle

    async def checkpoint(self, record: SessionRecord) -> dict[str, Any]:
        """Checkpoint a running session now; returns the kernel's CheckpointResult."""
        self.refuse_if_waiting(record, "checkpoint")
        async with self.sessions.lock(record.path):
            self.sessions.require_running(record, "checkpoint")
            await self.wait_idle(record, "checkpoint")
            result, _token = await self.take(record, reason="manual", then=record.state)
            return result

    async def take(
        self, record: SessionRecord, reason: str, then: str
    ) -> tuple[dict[str, Any], str | None]:
        """The kernel's CheckpointResult, and the token of the process that wrote it (from
        this very answer: a pause records it as the token its resume must show)."""
        assert record.kernel_id is not None
        message = record.message
        self.sessions.set(
            record,
            "checkpointing",
            "Saving the session state.",
            error=None,
            progress={"phase": "starting", "done": 0, "total": 0},
        )
        poller = asyncio.create_task(self._poll_progress(record))
        try:
            answer = await self.bridge.call(
                record.kernel_id,
                "checkpoint",
                self.policy.kernel_call_timeout_seconds,
                key=record.key,
                reason=reason,
            )
        except KernelCallError as err:
            answer = {"ok": False, "error": str(err)}
        finally:
            poller.cancel()
        if not answer.get("ok") or "result" not in answer:
            answer.setdefault("error", f"unexpected answer from the kernel: {answer}")
            intact = intact_text((await self.sessions.inspect(record)).latest)
            self.sessions.set(
                record,
                then,
                f"Checkpoint failed: {answer['error']}. The session keeps running.",
                progress=None,
                error={
                    "what": f"checkpoint failed: {answer['error']}",
                    "recovery": f"The kernel is still running; nothing was lost.{intact}",
                },
            )
            metrics.checkpoint_failed()
            raise Conflict(f"Checkpoint failed: {answer['error']}")
        result = answer["result"]
        token = answer.get("token")
        record.process_token = token
        await self.note(record, result)
        # A manual checkpoint returns to the state (and message) it interrupted.
        self.sessions.set(
            record, then, message if then != "checkpointing" else record.message, progress=None
        )
        return result, token

    async def note(self, record: SessionRecord, result: dict[str, Any]) -> None:
        """Put a checkpoint on the notebook's timeline, once: the kernel announces every one
        (``%checkpoint``, scheduled ones, and those the server asked for)."""
        checkpoint_id = result.get("checkpoint_id")
        # Checked and added before the first await: the announcement and the server's own
        # call may race; both then wait for the record of the checkpoint.
        if not any(
            event.kind == "checkpoint_written" and event.data.get("checkpoint_id") == checkpoint_id
            for event in record.timeline.events
        ):
            record.timeline.add(
                "checkpoint_written",
                checkpoint_id=checkpoint_id,
                bytes_written=result.get("bytes_written", 0),
                bytes_total=result.get("bytes_total", 0),
                seconds=result.get("seconds", 0.0),
                skipped=result.get("skipped", {}),
                reason=result.get("reason", "manual"),
            )
            metrics.checkpoint_written(int(result.get("bytes_written", 0)))
        view = await self.sessions.inspect(record)
        # While paused, the record shows what a resume restores (a kernel without the
        # session's state may write checkpoints meanwhile).
        paused = record.state in ("paused", "failed")
        record.checkpoint = resume_target(record, view) if paused else view.latest

    async def _poll_progress(self, record: SessionRecord) -> None:
        progress_file = self.sessions.store_for(record).path / "progress.json"
        await asyncio.to_thread(progress_file.unlink, missing_ok=True)
        while True:
            await asyncio.sleep(0.25)
            with contextlib.suppress(OSError, ValueError):
                progress = json.loads(await asyncio.to_thread(progress_file.read_bytes))
                if isinstance(progress, dict):
                    record.progress = progress

    # -- a running cell is never interrupted -----------------------------------------------------
    async def wait_idle(self, record: SessionRecord, action: str) -> None:
        deadline = time.monotonic() + self.policy.busy_wait_seconds
        self._waiting_idle[record.path] = action
        try:
            while record.activity.busy:
                if time.monotonic() >= deadline:
                    raise Conflict(
                        f"Cannot {action} {record.path}: kernel busy running {cell_name(record)}"
                        f" for {_busy_minutes(record):.0f} min; it is never interrupted. "
                        "Try again when it finishes."
                    )
                await asyncio.sleep(0.1)
        finally:
            self._waiting_idle.pop(record.path, None)

    def refuse_if_waiting(self, record: SessionRecord, action: str) -> None:
        """A pause or checkpoint already waits for the running cell: answer now, not in 30 s."""
        waiting = self._waiting_idle.get(record.path)
        if waiting is not None:
            raise Conflict(
                f"Cannot {action} {record.path}: a {waiting} is already waiting (up to "
                f"{self.policy.busy_wait_seconds:.0f} s) for {cell_name(record)} to finish; "
                "it is never interrupted. Follow that one, or try again when the cell finishes."
            )


def cell_name(record: SessionRecord) -> str:
    """``cell [12]`` (the one running), or ``a cell``."""
    cell = record.activity.execution_count
    return f"cell [{cell}]" if cell is not None else "a cell"


def _busy_minutes(record: SessionRecord) -> float:
    return (time.time() - (record.activity.busy_since or time.time())) / 60
