"""Pause and resume of a whole environment (a workspace pod): every notebook in it at once.

Plain asyncio, part of the orchestrator (it drives the same per-notebook transitions), split
out because the whole-pod story has steps of its own:

* **pause** (any notebook's pause, the idle policy, ``%pause``): checkpoint every running
  kernel to the home volume, snapshot the pod where the platform can, write what was done
  (``environment.json`` beside the checkpoints: paused, snapshot, bytes, this process's
  token), then ask the platform to stop the pod. The process then waits for its fate: the
  platform ends it (SIGTERM), or brings it back from the snapshot in a new pod.
* **live** is proven, never assumed: the new pod says it was restored (``PodRestored``), the
  in-memory token and pause id equal the ones written at the pause, and each kernel's token
  equals its checkpoint's. Frozen for how long is reported.
* **cold start** (a new server process in a new pod): every notebook that was paused, or
  running when the server died, is restored from its checkpoint into a new kernel *at once*
  (not when its notebook opens: the GPU is back already and the user resumed the workspace
  to work in it), one after another, and each says why it was not live.
* **platform stop** (SIGTERM: Kubeflow's idle pause, a node drain, an upgrade): every kernel
  is checkpointed before the server exits; the timeline says the platform paused it.
* **a pause from outside** (the dashboard's Pause, kubectl, a culler: ``spec.paused`` set by
  someone else), seen by the backend's watch. Where the platform holds it for a snapshot (the
  GKE Workspaces add-on), it is saved as ours is: every kernel checkpointed while the backend
  keeps the add-on from taking its snapshot (up to ``outside_hold_seconds``), then followed to
  its snapshot, recorded, and brought back live or from files, and said so. Elsewhere the pod
  is stopped: SIGTERM comes, and the platform stop above says who asked.
* **thawed unseen**: this process runs in another pod though it saw no pause (the platform
  snapshotted and restored it faster than it could look): nothing was checkpointed, the kernels
  are alive; the timeline says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..backends.base import (
    BackendError,
    EnvironmentBackend,
    EnvironmentFacts,
    PlatformPause,
    SnapshotOutcome,
)
from ..backends.workspace_modes import GKE_WORKSPACES
from ..formatting import format_bytes, format_duration
from ..kernel.token import process_token
from ..policy import Policy
from ..records import SessionRecord
from . import metrics
from .checkpoints import Checkpoints, cell_name
from .environment_file import (
    ENVIRONMENT_FILE,
    OUTSIDE,
    EnvironmentFile,
    cold_start_reason,
    pause_state,
)
from .kernel_bridge import KernelBridge
from .sessions import Sessions, intact_text
from .states import RUNNING_STATES, Conflict

log = logging.getLogger(__name__)

#: Seconds the SIGTERM checkpoint may take by default: under Kubernetes' default grace of 30 s.
PLATFORM_BUDGET_SECONDS = 25.0
#: The reason of a pause asked outside jupyter_pause (who set ``spec.paused`` the API server
#: does not say: a merge patch held back by the add-on's webhook leaves no trace of its author).
OUTSIDE_REASON = (
    "paused from outside jupyter_pause (the Workspace's spec.paused was set: the Kubeflow "
    "dashboard, kubectl or a culler)"
)
#: How often the add-on's hold is renewed while an outside pause writes its checkpoints (s).
HOLD_TICK_SECONDS = 1.0


class Environment:
    """The whole-environment pauses of an orchestrator whose backend is an EnvironmentBackend.

    It drives the same per-notebook parts as a single pause (the registry's records and
    locks, the checkpoints), and is handed them: it never reaches back into the orchestrator.
    """

    def __init__(
        self,
        backend: EnvironmentBackend,
        sessions: Sessions,
        checkpoints: Checkpoints,
        bridge: KernelBridge,
        policy: Policy,
        sync: Callable[[], Awaitable[None]],
        resume: Callable[[SessionRecord, bool, str], Awaitable[None]],
    ) -> None:
        self.backend = backend
        self.sessions = sessions
        self.checkpoints = checkpoints
        self.bridge = bridge
        self.policy = policy
        self.sync = sync  # match jupyter-server's sessions: kernels nobody asked about yet
        self.resume = resume  # one notebook, live where proven (``Resumes.for_environment``)
        self.file = EnvironmentFile(Path(sessions.store_root) / ENVIRONMENT_FILE)
        self.token = process_token()
        self.announced = False  # this pause is on the Workspace's state annotation already
        self.pausing: asyncio.Task[None] | None = None  # checkpoints, snapshot, stop request
        self.waiting: asyncio.Task[None] | None = None  # paused: waiting to be restored or ended
        self.paused_here: dict[str, Any] | None = None  # the pause this process made, in memory
        self.restoring: asyncio.Task[None] | None = None
        #: A pause asked outside jupyter_pause while the pod is being stopped (not held):
        #: when it was asked; the SIGTERM that follows is told as that pause.
        self.outside_asked_at: float | None = None
        #: The pod (its uid) this server last accounted for: a move to another one that no
        #: pause of its own explains was unseen.
        self.instance: str | None = None

    def status(self) -> dict[str, Any]:
        """What ``GET /status`` says about the environment (in its resources' details)."""
        if self.paused_here is not None:
            return {"state": "paused", "snapshot": self.paused_here.get("snapshot")}
        if self.pausing is not None and not self.pausing.done():
            return {"state": "pausing", "snapshot": None}
        if self.restoring is not None and not self.restoring.done():
            return {"state": "restoring", "snapshot": None}
        return {"state": "running", "snapshot": None}

    # -- pause ------------------------------------------------------------------------------------
    def running(self) -> list[SessionRecord]:
        return sorted(
            (
                r
                for r in self.sessions.records.values()
                if r.state in RUNNING_STATES and r.kernel_id
            ),
            key=lambda r: r.path,
        )

    def _pause_on(self) -> bool:
        """A pause of this server's is under way, or done and waiting for its fate."""
        return self.paused_here is not None or (
            self.pausing is not None and not self.pausing.done()
        )

    def _busy(self) -> bool:
        """A pause or restore of this server's is under way, or waits for its fate: what the
        platform does meanwhile is that one's own doing."""
        tasks = (self.pausing, self.waiting, self.restoring)
        return self.paused_here is not None or any(t is not None and not t.done() for t in tasks)

    async def pause(
        self, path: str, record: SessionRecord, reason: str, origin: str = "user"
    ) -> SessionRecord:
        """Pause the whole environment because of ``path`` (its ``record``: that of the
        notebook whose kernel it uses); returns at once, follow the states."""
        if self._pause_on():
            raise Conflict(
                f"Cannot pause {path}: the whole {self.backend.noun} is already pausing or paused"
            )
        running = self.running()
        async with contextlib.AsyncExitStack() as locks:
            for each in running:
                await locks.enter_async_context(self.sessions.lock(each.path))
            if record not in running:
                self.sessions.require_running(record, "pause")
            for each in running:
                self.checkpoints.refuse_if_waiting(each, "pause")
                self.sessions.require_running(each, f"pause the {self.backend.noun} with")
            for each in running:
                await self.checkpoints.wait_idle(each, "pause")
            self._begin(running, reason, origin, scope={"by": path})
        return record

    def _begin(
        self,
        running: list[SessionRecord],
        reason: str,
        origin: str,
        scope: dict[str, Any],
        asked_at: float | None = None,
    ) -> None:
        """Every running notebook's pause starts (on its timeline, in its state), in one task."""
        for each in running:
            each.timeline.add("last_activity", at=each.activity.last_activity or each.started)
            each.timeline.add(
                "pause_requested",
                at=asked_at,
                reason=reason,
                scope="workspace",
                origin=origin,
                **scope,
            )
            self.sessions.set(
                each, "checkpointing", "Saving the session state.", error=None, how=None
            )
        self.pausing = asyncio.create_task(self._run_pause(running, reason, origin))
        for each in running:
            self.sessions.tasks[each.path] = self.pausing

    async def platform_paused(self, pause: PlatformPause) -> None:
        """The platform began a pause (the backend's watch): one of ours goes on as it is; one
        from outside (the dashboard, kubectl, a culler) is saved as ours would be."""
        if self._busy():
            return
        log.warning("jupyter_pause: %s", OUTSIDE_REASON)
        if not pause.held:  # the pod is being stopped: the SIGTERM that comes saves every kernel
            self.outside_asked_at = pause.asked_at
            return
        with contextlib.suppress(Exception):  # kernels nobody asked about yet count too
            await self.sync()
        running = [r for r in self.running() if r.path not in self.sessions.tasks]
        async with contextlib.AsyncExitStack() as locks:
            for each in running:
                await locks.enter_async_context(self.sessions.lock(each.path))
            if self._pause_on():  # ours began while the locks were taken
                return
            self._begin(running, OUTSIDE_REASON, OUTSIDE, {"held": True}, pause.asked_at)

    async def _run_pause(self, running: list[SessionRecord], reason: str, origin: str) -> None:
        outside = origin == OUTSIDE  # the platform pauses anyway: nothing is aborted
        facts = EnvironmentFacts("", None)
        try:
            try:
                facts = await self.backend.environment_facts()
            except BackendError as err:
                if not outside:
                    await self._abort(running, f"the {self.backend.noun} cannot be paused: {err}")
                    return
            tokens: dict[str, str | None] = {}  # of each kernel, from its pause checkpoint
            unsaved: dict[str, str] = {}
            hold: dict[str, Any] = {}
            if outside:
                unsaved, hold = await self._checkpoint_in_the_hold(running, tokens, facts)
            else:
                for record in running:
                    try:
                        _result, tokens[record.path] = await self.checkpoints.take(
                            record, reason="pause", then="checkpointing"
                        )
                    except Conflict as err:
                        await self._abort(
                            running, f"{record.path} could not be checkpointed: {err}"
                        )
                        return
            for record in running:
                self.sessions.set(
                    record,
                    "pausing",
                    "Taking a pod snapshot.",
                    progress={"phase": "pod snapshot", "done": 0, "total": 0},
                )

            def on_phase(text: str) -> None:
                for record in running:
                    record.message = text
                    record.progress = {"phase": text, "done": 0, "total": 0}

            # Chosen before the snapshot, and on the volume before it is taken: a copy restored
            # from it knows them, and finds them there (a platform that stops the pod right
            # after its snapshot, as the GKE Workspaces add-on's policy does, restores the
            # process inside snapshot_environment, before anything after it was written).
            pause_id, at = secrets.token_hex(8), time.time()
            mode, why = await self.backend.pause_mode()
            unfinished = SnapshotOutcome(
                None,
                "the pod stopped before its snapshot was ready",
                mode=mode,
                mode_reason=why,
            )
            provisional = pause_state(
                self.token, running, reason, origin, facts.instance, unfinished, pause_id, at
            )
            await self.file.write(provisional)
            self.announced = False
            if mode == GKE_WORKSPACES:
                # The add-on stops the pod right after its snapshot, before this process can
                # say more: from here the Workspace says who paused it, what was saved and how
                # (`jupyter pause status --workspace` while it is paused).
                with contextlib.suppress(BackendError):
                    await self.backend.announce(provisional)
                    self.announced = True
            outcome = await self.backend.snapshot_environment(
                on_phase, ask=not outside, paused_in=facts.instance
            )
            state = pause_state(
                self.token, running, reason, origin, facts.instance, outcome, pause_id, at
            )
            if outcome.resumed_from_snapshot:
                # This is the restored copy: the pause happened (its kernels' tokens recorded
                # as at any pause), now prove what came back.
                self._mark_paused(running, state, outcome, tokens, unsaved, hold)
                self._stopped(running, outcome, at=outcome.details.get("stopped_at"))
                self.paused_here = state
                for record in running:  # the pause is over: its resume may begin
                    if self.sessions.tasks.get(record.path) is self.pausing:
                        self.sessions.tasks.pop(record.path)
                await self.file.write(state)  # what the provisional record could not say yet
                # (the node may post PodRestored a moment after this process was thawed)
                await self._after_restore(await self.backend.wait_until_moved(facts.instance))
                return
            await self.file.write(state)
            self._mark_paused(running, state, outcome, tokens, unsaved, hold)
            await self.sessions.writer.flush()
            if outcome.name:  # retention: older snapshots go before the pod does
                await self.expire_snapshots()
            # Paused before the stop is asked: the platform may end this process before it
            # answers (a Hub stops the server, then says so), and that end is this pause's.
            self.paused_here = state
            stops_first = self.backend.ends_before_answering
            if stops_first:
                self._stopped(running, outcome)
                for record in running:
                    self.sessions.save(record)
                await self.sessions.writer.flush()
            try:
                await self.backend.stop_environment(state)
            except BackendError as err:
                if not outside:
                    self.paused_here = None
                    await self._abort(
                        running, f"the {self.backend.noun} could not be paused: {err}"
                    )
                    return
                log.warning("jupyter_pause: the outside pause could not be recorded: %s", err)
            if not stops_first:
                self._stopped(running, outcome)
        except Exception as err:  # a bug must leave the sessions running, and say so
            log.exception("jupyter_pause: the workspace pause failed")
            await self._abort(running, f"unexpected error ({type(err).__name__}: {err})")
            return
        finally:
            for record in running:
                if self.sessions.tasks.get(record.path) is self.pausing:
                    self.sessions.tasks.pop(record.path)
        # Paused: the platform ends this process, or brings it back from the snapshot.
        self.waiting = asyncio.create_task(self._wait_for_restore(facts.instance))

    async def _checkpoint_in_the_hold(
        self,
        running: list[SessionRecord],
        tokens: dict[str, str | None],
        facts: EnvironmentFacts,
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """An outside pause's checkpoints, written while the backend keeps the platform's hold
        (the add-on takes no snapshot meanwhile), up to ``outside_hold_seconds``. Nothing
        stops the pause: a kernel whose cell runs on past ``busy_wait_seconds``, or whose
        checkpoint fails, is left to the snapshot, and said so. Returns those, with why, and
        what to say of the hold with the snapshot."""
        mode, why = await self.backend.pause_mode()
        early = SnapshotOutcome(
            None,
            "the pod was stopped before every kernel was checkpointed",
            mode=mode,
            mode_reason=why,
        )
        # On the volume before anything: a pod stopped in the middle of the checkpoints still
        # comes back knowing it was paused, and restores the checkpoints it has.
        started = time.time()
        await self.file.write(
            pause_state(
                self.token,
                running,
                OUTSIDE_REASON,
                OUTSIDE,
                facts.instance,
                early,
                secrets.token_hex(8),
                started,
            )
        )
        unsaved: dict[str, str] = {}
        work = asyncio.ensure_future(self._outside_checkpoints(running, tokens, unsaved))
        held_from = time.monotonic()
        holding = True
        while not work.done():
            if holding and time.monotonic() - held_from < self.policy.outside_hold_seconds:
                holding = await self.backend.hold_platform_pause()
            elif holding:
                holding = False
                log.warning(
                    "jupyter_pause: the outside pause's checkpoints took over %.0f s: the "
                    "platform's snapshot goes ahead",
                    self.policy.outside_hold_seconds,
                )
            await asyncio.wait([work], timeout=HOLD_TICK_SECONDS)
        await work
        # Said with the snapshot: how long the checkpoints took in the hold, and whether they
        # were written before the platform was let go on to its snapshot.
        hold = {"checkpoint_seconds": round(time.time() - started, 3), "checkpoints_first": holding}
        return unsaved, hold

    async def _outside_checkpoints(
        self,
        running: list[SessionRecord],
        tokens: dict[str, str | None],
        unsaved: dict[str, str],
    ) -> None:
        for record in running:
            deadline = time.monotonic() + self.policy.busy_wait_seconds
            while record.activity.busy and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if record.activity.busy:  # never interrupted: the snapshot takes it as it runs
                unsaved[record.path] = (
                    f"{cell_name(record)} was running; the pod snapshot holds it as it runs"
                    + intact_text(record.checkpoint)
                )
                continue
            try:
                _result, tokens[record.path] = await self.checkpoints.take(
                    record, reason="pause", then="checkpointing"
                )
            except Conflict as err:
                unsaved[record.path] = f"{err}; the pod snapshot holds it" + intact_text(
                    record.checkpoint
                )

    def _stopped(
        self, running: list[SessionRecord], outcome: SnapshotOutcome, at: float | None = None
    ) -> None:
        """The pod (and its GPUs) went: on each timeline, ``at`` the last moment this process
        ran before the platform stopped it, where it learnt that only once thawed."""
        for record in running:
            record.timeline.add(
                "kernel_stopped",
                at=at,
                scope="workspace",
                mode=outcome.mode,
                snapshot=outcome.name,
                **({"no_snapshot": outcome.problem} if outcome.problem else {}),
            )
            if record.gpus or record.gpus_needed:
                record.timeline.add("gpu_released", at=at, measured=False, gpus=record.gpus)
            metrics.pause_finished("paused")

    def _mark_paused(
        self,
        running: list[SessionRecord],
        state: dict[str, Any],
        outcome: SnapshotOutcome,
        tokens: dict[str, str | None],
        unsaved: dict[str, str],
        hold: dict[str, Any],
    ) -> None:
        when = time.strftime("%H:%M", time.localtime(state["paused_at"]))
        details = {**{k: v for k, v in outcome.details.items() if k != "stopped_at"}, **hold}
        if outcome.name:
            snapshot = f"pod snapshot {outcome.name}"
            for record in running:
                record.timeline.add(
                    "snapshot_taken",
                    name=outcome.name,
                    seconds=round(outcome.seconds, 3),
                    mode=outcome.mode,
                    **details,
                )
        else:
            snapshot = f"no pod snapshot: {outcome.problem}"
            for record in running:  # before the pod goes: a cold start reads it from the PVC
                record.timeline.add(
                    "snapshot_missing", mode=outcome.mode, why=outcome.problem, **hold
                )
        by = " from outside jupyter_pause" if state.get("origin") == OUTSIDE else ""
        for record in running:
            saved = format_bytes((record.checkpoint or {}).get("bytes", 0))
            record.checkpoint = {
                **(record.checkpoint or {}),
                **({"snapshot": outcome.name} if outcome.name else {}),
            }
            missing = unsaved.get(record.path)
            self.sessions.set(
                record,
                "paused",
                f"Paused{by} since {when} with the whole {self.backend.noun} ({saved} saved; "
                f"{snapshot})."
                + (f" Not checkpointed at this pause: {missing}." if missing else ""),
                progress=None,
                gpus=[],
                paused_process_token=tokens.get(record.path),
                paused_checkpoint_id=record.checkpoint.get("id"),
                unrestored_kernel=False,
            )

    async def _abort(self, running: list[SessionRecord], what: str) -> None:
        """A pause that cannot finish: every kernel keeps running, each record says why."""
        disk = await self.file.read()  # "paused" from before the snapshot on: no more
        if disk.get("state") == "paused":
            with contextlib.suppress(OSError):
                await self.file.write({**disk, "state": "running"})
        if self.announced:  # the Workspace no longer says paused either
            self.announced = False
            with contextlib.suppress(BackendError):
                await self.backend.announce({})
        for record in running:
            intact = intact_text(record.checkpoint)
            record.timeline.add("failed", what=f"pause: {what}")
            self.sessions.set(
                record,
                "active",
                f"Pause failed: {what}. The session keeps running.",
                progress=None,
                error={"what": f"pause failed: {what}", "recovery": "Nothing was lost." + intact},
            )
            metrics.pause_finished("failed")

    # -- coming back ------------------------------------------------------------------------------
    async def _wait_for_restore(self, instance: str) -> None:
        facts = await self.backend.wait_until_moved(instance)
        await self._after_restore(facts)

    async def _after_restore(self, facts: EnvironmentFacts) -> None:
        """This process runs again, in a new pod: prove a live restore, or restore from files."""
        mine = self.paused_here or {}
        self.paused_here = None
        self.instance = facts.instance
        disk = await self.file.read()
        frozen = time.time() - float(mine.get("paused_at") or time.time())
        snapshot = mine.get("snapshot")
        if (
            facts.restored
            and disk.get("pause_id") == mine.get("pause_id")
            and (disk.get("server_token") == self.token)
        ):
            note = (
                ("paused from outside jupyter_pause; " if mine.get("origin") == OUTSIDE else "")
                + f"the pod was restored from snapshot {snapshot}, frozen for "
                + format_duration(frozen)
            )
            await self.restore_all(mine.get("notebooks") or [], True, note, facts, frozen)
            return
        if not facts.restored:
            note = (
                f"this process came back in a new pod that the platform does not say it restored "
                f"({facts.restored_message or 'no PodRestored=True'}): its memory is not trusted"
            )
        else:
            note = (
                f"the platform restored snapshot {snapshot}, older than the last pause's "
                f"({disk.get('snapshot') or 'none'}): the newer checkpoints were restored instead"
            )
        # The kernels hold another moment's state: new kernels get the checkpoints.
        paths = list(
            dict.fromkeys([*(mine.get("notebooks") or []), *(disk.get("notebooks") or [])])
        )
        for path in paths:
            record = self.sessions.records.get(path)
            if record is not None and record.kernel_id in self.bridge.kernel_manager:
                with contextlib.suppress(Exception):
                    await self.bridge.kernel_manager.shutdown_kernel(record.kernel_id)
        await self.restore_all(paths, False, note, facts, frozen)

    async def on_start(self) -> None:
        """A new server process: restore what was paused, or running when the last one died;
        from then on, follow what the platform does by itself."""
        await self._restore_at_start()
        await self.backend.watch_platform(self.platform_paused, self.moved_unseen)

    async def _restore_at_start(self) -> None:
        disk = await self.file.read()
        paths = list(disk.get("notebooks") or []) if disk.get("state") == "paused" else []
        paths += [p for p in self.sessions.interrupted if p not in paths]
        paths = [p for p in paths if p in self.sessions.records]
        if not paths or not self.backend.restores_at_start:
            if paths:
                self._paused_at_start(paths, disk)
            if disk.get("state") == "paused":
                await self.file.write({**disk, "state": "running"})
            return
        facts, error = None, ""
        try:
            facts = await self.backend.environment_facts()
            self.instance = facts.instance
        except BackendError as err:
            error = str(err)
        note = "cold start: " + cold_start_reason(disk, facts, error)
        log.warning("jupyter_pause: %s", note)
        self.restoring = asyncio.create_task(self.restore_all(paths, False, note, facts, None))

    def _paused_at_start(self, paths: list[str], disk: dict[str, Any]) -> None:
        """A new server whose paused notebooks wait for the user's Resume: each says how its
        server ended and what a resume restores (from files, saved when)."""
        ended = time.strftime("%H:%M", time.localtime(float(disk.get("paused_at") or 0)))
        if disk.get("state") != "paused":
            how = f"{self.backend.stopper}, without a pause, while it ran"
            said = f"Paused: {how}"
        elif disk.get("origin") == "platform":
            how = f"{self.backend.stopper} at {ended}"
            said = f"Paused: {how}"
        else:
            reason = disk.get("reason") or ""
            how = (
                f"paused at {ended}"
                + ("" if reason in ("", "user") else f" ({reason})")
                + f"; the {self.backend.noun} was stopped"
            )
            said = how[0].upper() + how[1:]
        asked = self.backend.start_requested_at
        waited = None if asked is None else round(max(0.0, time.time() - asked), 3)
        for path in paths:
            record = self.sessions.records[path]
            if asked is not None:  # the spawn's wait: a GPU pod pending, an image pulled
                record.timeline.add("start_requested", at=asked)
            record.timeline.add("server_started", after=how, waited_seconds=waited)
            checkpoint = record.checkpoint
            restores = (
                "Resume restores it from files: checkpoint "
                f"{checkpoint['id']} from "
                f"{time.strftime('%H:%M', time.localtime(checkpoint['created']))} "
                f"({format_bytes(int(checkpoint.get('bytes', 0)))})."
                if checkpoint
                else "No checkpoint was written: a resume starts an empty kernel."
            )
            self.sessions.set(record, "paused", f"{said}. {restores}", progress=None)

    async def moved_unseen(self, facts: EnvironmentFacts) -> None:
        """This process runs in another pod, and no pause of this server's went with it: the
        platform paused and restored the pod faster than the watch saw (or while the API server
        was away). The kernels are the very processes (this one ran on with them), but nothing
        was checkpointed before: each timeline says so."""
        if self._busy() or not facts.instance or facts.instance == self.instance:
            return  # a move of this server's own pause, followed there
        self.instance = facts.instance
        with contextlib.suppress(Exception):  # kernels nobody asked about yet count too
            await self.sync()
        snapshot = facts.pinned_snapshot or "an unnamed snapshot"
        why = (
            f"the platform paused this workspace and restored it from {snapshot} by itself, "
            "unseen by jupyter_pause: no checkpoint was taken before the pause"
        )
        log.warning("jupyter_pause: %s", why)
        for record in self.running():
            record.timeline.add("state_restored", how="live", unseen=True, why=why)
            self.sessions.save(record)

    async def restore_all(
        self,
        paths: list[str],
        trust_live: bool,
        note: str,
        facts: EnvironmentFacts | None,
        frozen: float | None,
    ) -> None:
        """Resume each notebook in turn (live where proven), then say how it went outside."""
        instance = facts.instance if facts else ""
        with contextlib.suppress(BackendError):
            await self.backend.announce(
                {"state": "restoring", "instance": instance, "reason": note, "at": time.time()}
            )
        for path in paths:
            record = self.sessions.records.get(path)
            if record is None:
                continue
            try:
                await self.resume(record, trust_live, note)
            except Exception:  # one notebook must not stop the others
                log.exception("jupyter_pause: restoring %s failed", path)
        states = {p: self.sessions.records[p].state for p in paths if p in self.sessions.records}
        hows = {self.sessions.records[p].how for p in states}
        overall = (
            "ready"
            if set(states.values()) <= {"ready"}
            else ("failed" if "failed" in states.values() else "partial")
        )
        disk = await self.file.read()
        await self.file.write({**disk, "state": "running"})
        summary = {
            # how the pause that ended here was taken (a cold start after a SIGTERM: none)
            **{key: disk[key] for key in ("mode", "mode_reason") if disk.get(key)},
            "state": overall,
            "how": "live" if hows == {"live"} else "files",
            "reason": note,
            "instance": instance,
            "notebooks": states,
            "frozen_seconds": None if frozen is None else round(frozen, 1),
            "at": time.time(),
        }
        try:
            await self.backend.announce(summary)
        except BackendError as err:
            log.warning("jupyter_pause: could not publish the restore's outcome: %s", err)

    # -- snapshot hygiene -------------------------------------------------------------------------
    async def snapshots(self) -> dict[str, Any]:
        """The pod snapshots this workspace made, the pinned one (restored next) marked."""
        pinned = (await self.file.read()).get("snapshot")
        try:
            found = await self.backend.list_snapshots()
        except BackendError as err:
            return {"snapshots": [], "problem": str(err)}
        listed = []
        for snapshot in found:
            snapshot.pinned = snapshot.name == pinned
            listed.append(asdict(snapshot))
        return {"snapshots": listed, "problem": None}

    async def expire_snapshots(self) -> dict[str, Any]:
        """Retention for pod snapshots: the pinned one stays, then the newest ``keep_last``."""
        pinned = (await self.file.read()).get("snapshot")
        policy = self.policy
        try:
            deleted = await self.backend.expire_snapshots(
                policy.snapshots_keep_last, policy.max_age_hours, pinned
            )
        except BackendError as err:
            return {"deleted": [], "problem": str(err)}
        return {"deleted": deleted, "problem": None}

    # -- the platform's own stop ------------------------------------------------------------------
    async def give_back_empty(self, why: str) -> bool:
        """No notebook runs here and nothing was done for the idle pause's time (an open tab
        on paused notebooks, say): give the whole server back, with nothing to save. The
        record of the last pause stays as it was: the notebooks paused then still say so."""
        if self._pause_on():
            return False
        self.paused_here = {"reason": why}  # this process's end is then no one else's
        log.warning("jupyter_pause: giving this %s back: %s", self.backend.noun, why)
        try:
            await self.backend.stop_environment({})
        except BackendError as err:
            self.paused_here = None
            log.warning(
                "jupyter_pause: this %s could not be given back: %s", self.backend.noun, err
            )
            return False
        return True

    async def platform_stop(
        self, budget: float = PLATFORM_BUDGET_SECONDS, signal_name: str = "SIGTERM"
    ) -> None:
        """SIGTERM (a Hub's spawner: SIGINT first): checkpoint every running kernel within
        ``budget`` seconds, then let go."""
        if self.paused_here is not None:
            return  # our own pause: the pod goes away as planned
        deadline = time.monotonic() + budget
        if self.pausing is not None and not self.pausing.done():
            with contextlib.suppress(Exception):  # its checkpoints are the ones needed
                await asyncio.wait_for(asyncio.shield(self.pausing), budget)
            return
        with contextlib.suppress(Exception):  # kernels nobody asked about yet count too
            await asyncio.wait_for(self.sync(), max(0.1, deadline - time.monotonic()))
        running = [r for r in self.running() if r.path not in self.sessions.tasks]
        if not running:
            return
        started = time.time()
        stopper = self.backend.stopper
        reason, origin, who = f"{stopper} ({signal_name})", "platform", f"as {stopper}"
        if self.outside_asked_at is not None:  # the watch saw who: a pause from outside
            reason, origin = f"{OUTSIDE_REASON}; the pod was stopped ({signal_name})", OUTSIDE
            who = "from outside jupyter_pause"
        for record in running:
            record.timeline.add("last_activity", at=record.activity.last_activity or record.started)
            record.timeline.add(
                "pause_requested", at=self.outside_asked_at, reason=reason, origin=origin
            )
        jobs = {asyncio.ensure_future(self._platform_checkpoint(r)): r for r in running}
        done, late = await asyncio.wait(jobs, timeout=max(0.0, deadline - time.monotonic()))
        saved = 0
        when = time.strftime("%H:%M", time.localtime(started))
        for job, record in jobs.items():
            failed = job not in done or job.exception() is not None or not job.result()
            if not failed:
                saved += int((record.checkpoint or {}).get("bytes", 0))
            why = "not saved in time" if job in late else "could not be checkpointed"
            intact = intact_text(record.checkpoint)
            record.timeline.add("kernel_stopped", origin=origin)
            self.sessions.set(
                record,
                "paused",
                f"Paused {who} at {when} ({signal_name})"
                + ("." if not failed else f"; the latest state {why}.{intact}"),
                progress=None,
                gpus=[],
            )
        for job in late:
            job.cancel()
        none = SnapshotOutcome(None, f"{stopper} ({signal_name})")
        state = pause_state(
            self.token, running, reason, origin, "", none, secrets.token_hex(8), started
        )
        state.update(bytes=saved, checkpoint_seconds=round(time.time() - started, 3))
        await self.file.write(state)
        await self.sessions.writer.flush()
        log.warning(
            "jupyter_pause: %s: %d notebook(s) checkpointed in %.2f s (budget %.0f s)",
            signal_name,
            len(done),
            time.time() - started,
            budget,
        )
        with contextlib.suppress(BackendError, TimeoutError):
            await asyncio.wait_for(
                self.backend.announce(state), max(0.5, deadline - time.monotonic())
            )

    async def _platform_checkpoint(self, record: SessionRecord) -> bool:
        """Checkpoint one kernel for a SIGTERM: a running cell would die with the pod anyway,
        so it is interrupted first (what it computed so far is saved)."""
        if record.activity.busy and record.kernel_id:
            with contextlib.suppress(Exception):
                await self.bridge.kernel_manager.interrupt_kernel(record.kernel_id)
            while record.activity.busy:
                await asyncio.sleep(0.05)
        try:
            await self.checkpoints.take(record, reason="pause", then="checkpointing")
        except Conflict:
            return False
        return True
