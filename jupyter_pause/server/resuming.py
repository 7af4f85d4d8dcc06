"""The resume of one notebook: a GPU, a kernel, and the state back in it, live or from files.

``start`` returns at once with the record in ``resuming`` (or joins the resume in flight: two
tabs, the CLI and the UI, retries all get one restore). ``run`` asks the backend for
resources (``waiting-for-resources`` while queued) and a kernel, then proves a live restore
(the kernel shows the very process token recorded at the pause) or restores the checkpoint from
files. What did not come back is held (see ``holds.py``) and the session is ``partial``, never
``ready``. A failed resume leaves the checkpoint intact and says how to recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from typing import Any

from ..backends.base import Backend, BackendError, StillPaused
from ..formatting import format_bytes, format_count, format_reasons
from ..policy import Policy
from ..records import SessionRecord
from . import holds, metrics
from .kernel_bridge import KernelBridge, KernelCallError
from .kernel_connections import reconnect_notebooks
from .kernels import Kernels
from .sessions import Sessions, intact_text, resume_target, spec
from .states import RUNNING_AGAIN, RUNNING_STATES, Conflict

#: What the message of a session whose restore still loads ends with.
_STILL_LOADING = re.compile(r" \S+ \S+ of \S+ \S+ still loading\.$")

log = logging.getLogger(__name__)

#: Why a resume on CPU restored from files (the ready message and the timeline say it).
ON_CPU_NOTE = "on CPU, as asked: no GPU until the notebook is paused and resumed again"


def restore_shortfall(result: dict[str, Any]) -> dict[str, str]:
    """What a kernel's restore did not bring back: variables and session items, with why.

    Empty when everything came back; anything else is a partial restore, never a success.
    """
    missing = dict(result.get("failed") or {})
    session = result.get("session") or {}
    if isinstance(session, dict):
        missing.update(session.get("failed") or {})
    return missing


class Resumes:
    """Resumes single notebooks, and each notebook of an environment that came back."""

    def __init__(
        self,
        sessions: Sessions,
        kernels: Kernels,
        backend: Backend,
        bridge: KernelBridge,
        session_manager: Any,
        policy: Policy,
    ) -> None:
        self.sessions = sessions
        self.kernels = kernels
        self.backend = backend
        self.bridge = bridge
        self.session_manager = session_manager
        self.policy = policy
        self._on_cpu: set[str] = set()  # paths whose resume in flight is on CPU

    async def start(self, record: SessionRecord, on_cpu: bool = False) -> SessionRecord:
        """Start a resume, or join the one in flight (two tabs, CLI + UI, retries).

        ``on_cpu``: restore from files into a kernel without a GPU, now: a resume that waits
        for a GPU gives its place up for it (cancelled first, what it asked for taken back)."""
        path = record.path  # a notebook sharing another's kernel resumes that one
        if on_cpu:
            if not self.backend.restores_on_cpu:
                raise Conflict(
                    f"Cannot resume {path} on CPU: the {self.backend.name} backend brings a "
                    "session back where it paused"
                )
            if (
                path in self.sessions.tasks
                and path not in self._on_cpu
                and record.state in ("resuming", "waiting-for-resources")
            ):
                await self.cancel(record)
        async with self.sessions.lock(path):
            if path in self.sessions.tasks and record.state in (
                "resuming",
                "waiting-for-resources",
                "restoring",
            ):
                return record  # join the restore already running
            if record.state in RUNNING_STATES and record.kernel_id is not None:
                return record  # already back: a late retry gets the result
            if path in self.sessions.tasks:
                raise Conflict(f"Cannot resume {path}: a {record.state} is in progress")
            if (await self.sessions.inspect(record)).latest is None:
                raise Conflict(f"Cannot resume {path}: it has no checkpoint to restore")
            if on_cpu:
                record.timeline.add("resume_requested", on_cpu=True)
                self._on_cpu.add(path)
            else:
                record.timeline.add("resume_requested")
            self.sessions.set(record, "resuming", "Resuming.", error=None, how=None, restore=None)
            self.sessions.tasks[path] = asyncio.create_task(self.run(record, on_cpu=on_cpu))
        return record

    async def cancel(self, record: SessionRecord) -> SessionRecord:
        """Cancel a resume that waits for resources: what it asked for is taken back (a
        pending kernel pod deleted) and the session stays paused, its checkpoint intact."""
        path = record.path
        task = self.sessions.tasks.get(path)
        if task is None or record.state not in ("resuming", "waiting-for-resources"):
            raise Conflict(
                f"Cannot cancel for {path}: no resume waits for resources (it is {record.state})"
            )
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return record

    async def for_environment(self, record: SessionRecord, trust_live: bool, note: str) -> None:
        """Resume one notebook of an environment that came back (live where proven)."""
        async with self.sessions.lock(record.path):
            if record.path in self.sessions.tasks:
                raise Conflict(f"Cannot resume {record.path}: a {record.state} is in progress")
            record.timeline.add("resume_requested", by="workspace")
            self.sessions.set(record, "resuming", "Resuming.", error=None, how=None, restore=None)
            task = asyncio.create_task(self.run(record, trust_live, note))
            self.sessions.tasks[record.path] = task
        await task

    async def run(
        self,
        record: SessionRecord,
        trust_live: bool = True,
        note: str | None = None,
        on_cpu: bool = False,
    ) -> None:
        """Bring a notebook back; ``trust_live`` False: restore from files whatever the kernel
        says (its environment was not proven to be the one that paused); ``note`` says why;
        ``on_cpu``: into a kernel without a GPU (asked by the user while a GPU was scarce)."""
        sessions = self.sessions
        started = time.time()
        restoring = False  # once the kernel restores, a failure may have left it half-restored
        # Recorded at the pause, never read from a kernel since: only the process that paused
        # can show it, so a kernel started after the pause is never taken for a live one.
        paused_token = record.paused_process_token
        moved: str | None = None  # a kernel back at a new address: its notebooks reconnect
        try:
            record.gpus_needed = (
                0 if on_cpu else self.policy.for_kernelspec(record.kernel_name).gpus
            )
            if on_cpu:
                note = note or ON_CPU_NOTE
            session = spec(record)

            def on_queued(place: int, reason: str) -> None:
                if place != record.queue_position:  # the timeline keeps each place, with why
                    record.timeline.add("waiting_for_resources", place=place, reason=reason)
                sessions.set(
                    record,
                    "waiting-for-resources",
                    f"Waiting for a GPU: {reason}",
                    queue_position=place,
                )

            allocation = await self.backend.request_resources(session, on_queued)
            record.gpus = allocation.gpus
            record.timeline.add("resources_acquired", gpus=allocation.gpus)
            sessions.set(
                record,
                "restoring",
                "Starting the kernel.",
                queue_position=None,
                progress={"phase": "starting kernel", "done": 0, "total": 0},
            )
            outcome = await self.backend.restore(session, allocation)
            note = note or outcome.details.get("why")
            record.kernel_id = outcome.kernel_id
            if outcome.moved:
                moved = outcome.kernel_id
            await self.kernels.attach(record, outcome.kernel_id, record.kernel_name)
            sessions.set(record, "restoring", "Restoring the session state.")
            hello = await self._hello_after_restore(record, outcome.kernel_id, outcome.live)
            token = hello.get("token")
            if trust_live and paused_token and token == paused_token:
                # The very process that paused is alive again.
                live = {k: v for k, v in outcome.details.items() if k != "why"}
                if record.paused_during_cell is not None:
                    live["during_cell"] = record.paused_during_cell
                record.timeline.add(
                    "state_restored",
                    how="live",
                    token_matched=True,
                    **live,
                    **({"why": note} if note else {}),
                )
                await self._reopen_sharing(record, outcome.kernel_id)
                await self._finish(record, "live", None, started, note)
                return
            if trust_live and outcome.live and not note:
                note = "the kernel that came back is not the process that paused"
            target = resume_target(record, await sessions.inspect(record))
            restoring = True
            answer = await self.bridge.call(
                outcome.kernel_id,
                "restore",
                self.policy.kernel_call_timeout_seconds,
                key=record.key,
                checkpoint_id=(target or {}).get("id"),
            )
            if not answer.get("ok"):
                raise KernelCallError(str(answer.get("error") or f"unexpected answer {answer}"))
            result = answer.get("result")
            if not isinstance(result, dict) or not isinstance(result.get("checkpoint_id"), int):
                raise KernelCallError(f"unexpected answer from the kernel: {answer}")
            result.pop("notebook", None)  # the notebook's absolute path: the record has its path
            record.timeline.add(
                "state_restored",
                how="files",
                checkpoint_id=result["checkpoint_id"],
                restored=result.get("restored", []),
                failed=restore_shortfall(result),
                **({"why": note} if note else {}),
            )
            await self._reopen_sharing(record, outcome.kernel_id)
            await self._finish(record, "files", result, started, note)
        except asyncio.CancelledError:
            if record.state not in ("resuming", "waiting-for-resources"):
                raise  # the server stops mid-restore: its start-up finds the checkpoint
            # Cancelled while it waited: the backend took back what it asked for.
            latest = (await sessions.inspect(record)).latest
            record.timeline.add("failed", what="resume: cancelled", recovery="still paused")
            sessions.set(
                record,
                "paused",
                "Resume cancelled; still paused." + intact_text(latest),
                progress=None,
                queue_position=None,
                error=None,
            )
            metrics.resume_finished("failed", None)
        except StillPaused as err:  # the backend left the session as it was: paused
            latest = (await sessions.inspect(record)).latest
            recovery = (intact_text(latest).strip() or "No data was changed.") + (
                " Resume again when the cause is fixed."
            )
            record.timeline.add("failed", what=f"resume: {err}", recovery=recovery)
            sessions.set(
                record,
                "paused",
                f"Resume failed: {err}. Still paused.",
                progress=None,
                queue_position=None,
                error={"what": f"resume failed: {err}", "recovery": recovery},
            )
            metrics.resume_finished("failed", None)
        except Exception as err:  # a backend's bug too: never leave the session "resuming"
            if not isinstance(err, BackendError | KernelCallError):
                log.exception("jupyter_pause: resuming %s failed", record.path)
            latest = (await sessions.inspect(record)).latest
            if restoring and latest is not None:
                # The kernel may hold part of the state: keep every checkpoint until it is
                # restored in full, or the user decides to carry on without it.
                missing = {"(everything)": f"the restore failed: {err}"}
                await holds.hold(sessions.store_for(record), record, latest["id"], missing)
            recovery = (intact_text(latest).strip() or "No data was changed.") + (
                " Resume again to restore from files, or run `%checkpoint restore` in a new kernel."
            )
            if record.hold:
                recovery += " " + holds.advice(record)
            record.timeline.add("failed", what=f"resume: {err}", recovery=recovery)
            sessions.set(
                record,
                "failed",
                f"Resume failed: {err}",
                progress=None,
                queue_position=None,
                error={"what": f"resume failed: {err}", "recovery": recovery},
            )
            metrics.resume_finished("failed", None)
        finally:
            sessions.tasks.pop(record.path, None)
            self._on_cpu.discard(record.path)
            if moved is not None:
                # Only now, the restore done (or failed): a notebook reconnected earlier could
                # run a cell in the kernel before its state is back.
                reconnect_notebooks(self.session_manager.kernel_manager, moved)

    async def note_restore_in_notebook(
        self, record: SessionRecord, kernel_id: str, result: Any
    ) -> None:
        """A restore typed into the notebook (``%checkpoint restore``). In a paused notebook's
        new kernel it is the resume, from files, as if Resume had been pressed; a restore of
        some variables by name leaves the rest missing (partial, held). In a running session
        it only goes on the timeline."""
        if not isinstance(result, dict) or not isinstance(result.get("checkpoint_id"), int):
            return
        async with self.sessions.lock(record.path):
            if record.kernel_id != kernel_id or record.path in self.sessions.tasks:
                return
            restored = [n for n in result.get("restored") or [] if isinstance(n, str)]
            result = {**result, "failed": dict(result.get("failed") or {})}
            if record.state not in ("paused", "failed"):
                record.timeline.add(
                    "checkpoint_restored",
                    by="notebook",
                    checkpoint_id=result["checkpoint_id"],
                    restored=restored,
                    failed=restore_shortfall(result),
                )
                self.sessions.save(record)
                return
            asked = f"`%checkpoint restore {result['checkpoint_id']} {' '.join(restored)}`"
            for name in result.get("not_asked") or []:
                result["failed"][name] = (
                    f"not asked for: {asked} restored only {', '.join(restored)}"
                )
            result.pop("notebook", None)
            started = time.time()
            record.timeline.add("resume_requested", by="notebook")
            record.timeline.add(
                "state_restored",
                how="files",
                by="notebook",
                checkpoint_id=result["checkpoint_id"],
                restored=restored,
                failed=restore_shortfall(result),
            )
            await self._finish(
                record,
                "files",
                result,
                started,
                "restored by `%checkpoint restore` in the notebook",
            )

    async def note_loading(
        self, record: SessionRecord, kernel_id: str, data: dict[str, Any]
    ) -> None:
        """A lazy restore's background load went on (``loading``: bytes in, in all) or ended
        (``loaded``: its outcome); the chip says how much is still loading until then."""
        checkpoint_id = data.get("checkpoint_id")
        if record.kernel_id != kernel_id or not isinstance(checkpoint_id, int):
            return
        loading = dict(record.loading or {})
        if loading.get("checkpoint_id") != checkpoint_id:
            loading = {"checkpoint_id": checkpoint_id}
        if data.get("action") == "loaded" and isinstance(data.get("outcome"), dict):
            outcome = data["outcome"]
            loading.update(
                done=int(outcome.get("bytes_done", 0)),
                total=int(outcome.get("bytes_total", 0)),
                outcome=outcome,
            )
        else:
            loading.update(done=int(data.get("done", 0)), total=int(data.get("total", 0)))
        record.loading = loading
        async with self.sessions.lock(record.path):
            await self._show_loading(record)

    async def _show_loading(self, record: SessionRecord) -> None:
        """Bring the state in line with the load of the restore it shows (if one runs)."""
        loading, restore = record.loading, record.restore
        if (
            not loading
            or not restore
            or restore.get("checkpoint_id") != loading.get("checkpoint_id")
            or record.state not in ("ready", "partial")
            or not restore.get("loading_bytes")
        ):
            return
        outcome = loading.get("outcome")
        base = _STILL_LOADING.sub("", record.message)
        if outcome is None:
            done = int(loading.get("done", 0))
            total = int(loading.get("total") or restore["loading_bytes"])
            record.progress = {"phase": "loading", "done": done, "total": total}
            record.message = (
                f"{base} {format_bytes(total - done)} of {format_bytes(total)} still loading."
            )
            self.sessions.save(record)
            return
        restore = {**restore, "loading_bytes": 0}
        taken = {n: w for n, w in (outcome.get("failed") or {}).items() if isinstance(n, str)}
        ready = record.timeline.last("kernel_ready")
        record.timeline.add(
            "fully_loaded",
            checkpoint_id=loading["checkpoint_id"],
            bytes=int(outcome.get("bytes_done", 0)),
            seconds=round(time.time() - ready.at, 3) if ready else None,
            failed=taken,
            stopped=bool(outcome.get("stopped")),
        )
        if taken:
            restore["failed"] = {**(restore.get("failed") or {}), **taken}
            restore["restored"] = [n for n in restore.get("restored") or [] if n not in taken]
            await holds.hold(
                self.sessions.store_for(record), record, restore["checkpoint_id"], taken
            )
            count = len(restore["restored"])
            self.sessions.set(
                record,
                "partial",
                f"Restored partially from files ({format_count(count, 'variable')}; "
                f"{len(taken)} taken back once loaded: {format_reasons(taken)}).",
                restore=restore,
                progress=None,
                error={"what": holds.what(record), "recovery": holds.advice(record)},
            )
            return
        self.sessions.set(record, record.state, base, restore=restore, progress=None)

    def note_first_cell(self, record: SessionRecord, data: dict[str, Any]) -> None:
        """The first cell after a resume ran: the time from Resume to work goes on record."""
        record.awaiting_first_cell = False
        event = record.timeline.add("first_cell_executed", **data)
        resumed = record.timeline.last("resume_requested")
        if resumed is not None:
            metrics.resume_to_next_cell(event.at - resumed.at)
        self.sessions.save(record)

    async def _hello_after_restore(
        self, record: SessionRecord, kernel_id: str, live: bool
    ) -> dict[str, Any]:
        """Who the kernel is. A process the backend restored may be in the middle of a cell:
        it is asked on its control channel, which the cell does not hold up."""
        if live:
            with contextlib.suppress(KernelCallError):
                return await self.bridge.control(kernel_id, "identify", timeout=30)
        return await self.bridge.call(kernel_id, "hello", timeout=300, key=record.key)

    async def _finish(
        self,
        record: SessionRecord,
        how: str,
        result: dict[str, Any] | None,
        started: float,
        note: str | None = None,
    ) -> None:
        ready = record.timeline.add("kernel_ready")
        record.awaiting_first_cell = True
        missing: dict[str, str] = {}
        if how == "live":
            message = "Ready: live session restored."
            if record.paused_during_cell is not None:
                message = (
                    f"Ready: live session restored; cell [{record.paused_during_cell}] runs on."
                )
        else:
            assert result is not None
            missing = restore_shortfall(result)
            count = len(result.get("restored") or [])
            message = f"Ready: restored from files ({format_count(count, 'variable')})."
            held = (record.hold or {}).get("checkpoints", {})
            if missing:
                await holds.hold(
                    self.sessions.store_for(record), record, result["checkpoint_id"], missing
                )
                message = (
                    f"Restored partially from files ({format_count(count, 'variable')}; "
                    f"{len(missing)} not "
                    f"restored: {format_reasons(missing)})."
                )
            elif (
                str(result["checkpoint_id"]) in held
                and held[str(result["checkpoint_id"])].get("kind") != "shrunk"
            ):  # all came back: that hold ends (a shrink's ends with a checkpoint)
                await holds.release(
                    self.sessions.store_for(record), record, result["checkpoint_id"]
                )
        if note:  # why it is (or is not) live, when the environment came back
            message += f" {note[:1].upper()}{note[1:]}."
        if record.hold and not holds.holds_missing_data(record):
            message += f" Retention {holds.what(record)}, until a checkpoint holds them again."
        state, error = "ready", None
        if holds.holds_missing_data(record):
            if not missing:
                message += f" Still {holds.what(record)}."
            state, error = "partial", {"what": holds.what(record), "recovery": holds.advice(record)}
        self.sessions.set(
            record,
            state,
            message,
            how=how,
            restore=result,
            progress=None,
            error=error,
            **RUNNING_AGAIN,
        )
        metrics.resume_finished("partial" if state == "partial" else how, ready.at - started)
        if result and result.get("loading_bytes"):  # ready before the bytes are in
            if (record.loading or {}).get("checkpoint_id") != result["checkpoint_id"]:
                record.loading = {"checkpoint_id": result["checkpoint_id"], "done": 0}
            await self._show_loading(record)

    async def _reopen_sharing(self, record: SessionRecord, kernel_id: str) -> None:
        """The notebooks that shared the paused kernel get the resumed one (their sessions
        ended with the old kernel); a notebook that meanwhile has a kernel of its own keeps
        it, and shares no more."""
        for path in list(record.sharing_notebooks):
            try:
                existing = await self.session_manager.get_session(path=path)
            except Exception:  # jupyter-server raises web.HTTPError(404) when there is none
                existing = None
            if existing is not None and (existing.get("kernel") or {}).get("id") != kernel_id:
                record.sharing_notebooks.remove(path)
                continue
            if existing is None:
                with contextlib.suppress(Exception):
                    await self.session_manager.create_session(
                        path=path,
                        name=os.path.basename(path),
                        type="notebook",
                        kernel_name=record.kernel_name,
                        kernel_id=kernel_id,
                    )
