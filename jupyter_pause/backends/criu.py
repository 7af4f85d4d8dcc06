"""The criu backend: a live pause on one machine, by snapshotting the kernel process itself.

A pause (after the application checkpoint, when the kernel is idle: the safety net) dumps the
kernel's whole process tree with CRIU into the store, beside the checkpoint it belongs to
(``images/000007/``): the process ends, its memory and GPU go back. A resume restores that
image: the same PID, the same objects (generators mid-iteration, open files at their
positions, half-built state), and a cell that was running when the pause came runs on. The
server knows the kernel again under its own id (``reattach.py``); the kernel's in-memory
token proves it is the process that paused.

A busy kernel is paused too: the cell stops where it stands. Its fallback is the last
checkpoint taken at a safe point. Whatever stops a restore (a damaged image, a PID taken,
criu missing) makes the resume restore that checkpoint into a new kernel, and say why.

Kernels with a CUDA context are suspended with NVIDIA's cuda-checkpoint around the dump.
Where criu cannot be used (``criu check`` fails, not root), pauses are the local backend's
(checkpoint, then stop) and say why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..kernel import store as store_mod
from .base import Allocation, BackendError, RestoreOutcome, SessionSpec, StopOutcome
from .criu_tool import (
    Criu,
    CriuError,
    OutsideFile,
    append_to_logs,
    image_bytes,
    outside_files,
    pid_gone,
    unlock_network,
)
from .cuda_checkpoint import CudaCheckpoint, CudaError, cuda_processes
from .kernels import open_session, running_kernel
from .local import LocalBackend
from .reattach import register_restored

log = logging.getLogger(__name__)

#: What the image folder says about the kernel it holds, beside criu's own files.
KERNEL_FILE = "kernel.json"


@dataclass
class ProcessImage:
    """The kernel a process image holds: what jupyter-server needs to know it again."""

    checkpoint_id: int  # the safety net: the checkpoint this image belongs to
    kernel_id: str
    kernel_name: str
    pid: int
    connection: dict[str, Any]  # ports, key, transport: the server reconnects with these
    env: dict[str, str]  # the kernel's launch environment (for a later restart of it)
    execution_state: str  # "busy" when paused during a cell
    outside: list[OutsideFile] = field(default_factory=list)
    cuda: list[int] = field(default_factory=list)  # PIDs of the tree holding a CUDA context
    gpus: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["outside"] = [o.to_json() for o in self.outside]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessImage:
        data = dict(data)
        data["outside"] = [OutsideFile.from_json(o) for o in data.get("outside", [])]
        return cls(**data)


@dataclass
class CriuSettings:
    criu_binary: str = "criu"
    cuda_checkpoint_binary: str = "cuda-checkpoint"


class CriuBackend(LocalBackend):
    """Kernels of this server, paused as live processes with CRIU (see the module docstring)."""

    name = "criu"
    restores_on_cpu = False  # its restore brings the process back, with its GPU state

    def __init__(
        self,
        kernel_manager: Any,
        session_manager: Any,
        gpu_count: int | None,
        store_root: Path,
        settings: CriuSettings,
    ) -> None:
        super().__init__(kernel_manager, session_manager, gpu_count)
        self.store_root = Path(store_root)
        self.criu = Criu(settings.criu_binary)
        self.cuda = CudaCheckpoint(settings.cuda_checkpoint_binary)
        self.problem: str | None = None  # why criu cannot be used here, once checked
        self._checked: asyncio.Future[str | None] | None = None

    async def start(self) -> None:
        self._checked = asyncio.ensure_future(self._check())

    async def _check(self) -> str | None:
        problem = self.problem = await asyncio.to_thread(self.criu.check)
        if problem:
            log.error(
                "jupyter_pause: no process snapshots: %s. Pauses stop idle kernels and "
                "resume them from their checkpoints; busy kernels wait for their cell.",
                problem,
            )
        return problem

    async def usable(self) -> str | None:
        """None when criu works here (``criu check`` passed); else why not."""
        if self._checked is None:
            await self.start()
        assert self._checked is not None
        self.problem = await asyncio.shield(self._checked)
        return self.problem

    async def pauses_running_cells(self) -> bool:
        return await self.usable() is None

    def describe_resources(self) -> Any:
        status = super().describe_resources()
        checked = self._checked is not None and self._checked.done()
        status.details["process_snapshots"] = "criu" if checked and self.problem is None else None
        status.details["problem"] = self.problem
        if self.problem:
            # Said where users look (the status bar's tooltip, `jupyter pause status`): the
            # backend is still called criu, but pauses are the local backend's.
            status.details["fallback"] = (
                "pauses checkpoint and stop idle kernels, and resume them from their "
                "checkpoints; busy kernels wait for their cell"
            )
        return status

    # -- pause ------------------------------------------------------------------------------------
    async def stop(self, session: SessionSpec) -> StopOutcome:
        kernel_id = session.kernel_id
        if kernel_id is None or kernel_id not in self.kernel_manager:
            raise BackendError("the notebook has no running kernel to stop")
        problem = await self.usable()
        if problem is None:
            try:
                return await self._snapshot(session, kernel_id)
            except (CriuError, CudaError, BackendError, OSError) as err:
                problem = str(err)
        if session.busy:  # only a snapshot pauses a running cell: the kernel runs on
            raise BackendError(f"no process snapshot of the running cell: {problem}")
        outcome = await super().stop(session)  # the checkpoint alone brings the state back
        outcome.details["snapshot_problem"] = problem
        return outcome

    async def _snapshot(self, session: SessionSpec, kernel_id: str) -> StopOutcome:
        if session.checkpoint_id is None:
            raise BackendError("the notebook has no checkpoint for a process image to belong to")
        km = self.kernel_manager.get_kernel(kernel_id)
        pid = km.provisioner.pid
        image = ProcessImage(
            checkpoint_id=session.checkpoint_id,
            kernel_id=kernel_id,
            kernel_name=session.kernel_name,
            pid=pid,
            connection=_json_safe(km.get_connection_info()),
            env=await asyncio.to_thread(_environ, pid),
            execution_state="busy" if session.busy else "idle",
            cuda=await asyncio.to_thread(cuda_processes, pid),
            gpus=list(self.pool.holders.get(session.path, [])),
        )
        if image.cuda and (problem := self.cuda.problem()):
            raise CudaError(problem)
        km.stop_restarter()  # the process is about to end: it must not be started again
        try:
            folder, seconds = await asyncio.to_thread(self._dump, session.key, image)
        except BaseException:
            km.start_restarter()
            raise
        # The process is gone (criu ended it): jupyter-server forgets the kernel, and its
        # PID is free for the restore.
        await self.kernel_manager.shutdown_kernel(kernel_id, now=True)
        stopped_at = time.time()
        await asyncio.to_thread(pid_gone, pid, 10.0)
        released_at, measured = stopped_at, False
        if session.gpus:
            released_at, measured = await self._wait_gpu_free(pid, stopped_at)
        self.pool.release(session.path)
        size = await asyncio.to_thread(image_bytes, folder)
        return StopOutcome(
            stopped_at,
            released_at,
            measured,
            snapshot=f"process image of checkpoint {image.checkpoint_id}",
            details={
                "checkpoint_id": image.checkpoint_id,
                "bytes": size,
                "seconds": round(seconds, 3),
                "pid": pid,
                "cuda": image.cuda,
            },
        )

    def _dump(self, key: str, image: ProcessImage) -> tuple[Path, float]:
        store = store_mod.NotebookStore(self.store_root, key)
        # Under the store's lock: the kernel is never caught writing a checkpoint, and gc
        # never sees a half-written image.
        with store.locked():
            folder = store.new_image_folder(image.checkpoint_id)
            try:
                image.outside = outside_files(image.pid)
                if changed := append_to_logs():
                    log.info("jupyter_pause: the server's %s now appends (criu)", changed)
                store_mod.write_private(folder / KERNEL_FILE, json.dumps(image.to_json()).encode())
                suspended = []
                try:
                    for pid in image.cuda:
                        self.cuda.suspend(pid)
                        suspended.append(pid)
                    seconds = self.criu.dump(image.pid, folder, image.outside)
                except (CriuError, CudaError):
                    for pid in suspended:  # the process runs on: give it its GPU memory back
                        self.cuda.resume(pid)
                    raise
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
        return folder, seconds

    # -- resume -----------------------------------------------------------------------------------
    async def restore(self, session: SessionSpec, allocation: Allocation) -> RestoreOutcome:
        found = await asyncio.to_thread(self._newest_image, session.key)
        existing = await running_kernel(self.kernel_manager, self.session_manager, session.path)
        if found is None:
            return await super().restore(session, allocation)
        folder, image = found
        why = None
        if existing is not None:
            why = (
                "a new kernel was started for the notebook while it was paused, so the paused "
                "process was not brought back"
            )
        elif image.cuda and sorted(allocation.gpus) != sorted(image.gpus):
            why = (
                f"the paused process used GPU {image.gpus} and this resume was granted GPU "
                f"{allocation.gpus}; a CUDA process comes back only on its own GPU"
            )
        elif problem := await self.usable():
            why = f"criu cannot be used here: {problem}"
        if why is None:
            try:
                return await self._restore(session, folder, image)
            except (CriuError, CudaError, BackendError, OSError) as err:
                why = f"its process image could not be restored ({err})"
        await asyncio.to_thread(_discard, folder)
        outcome = await super().restore(session, allocation)
        outcome.details["why"] = (
            f"{why}; restored from checkpoint {image.checkpoint_id}, the last one taken at a "
            "safe point"
        )
        return outcome

    async def _restore(self, session: SessionSpec, folder: Path, image: ProcessImage) -> Any:
        pid, seconds = await asyncio.to_thread(self._restore_process, folder, image)
        try:
            await register_restored(
                self.kernel_manager,
                image.kernel_id,
                image.kernel_name,
                os.path.dirname(session.path),
                image.env,
                image.connection,
                pid,
            )
            km = self.kernel_manager.get_kernel(image.kernel_id)
            km.execution_state = image.execution_state  # busy: the paused cell runs on
            await open_session(self.session_manager, session, image.kernel_id)
            for cuda_pid in image.cuda:  # the same PIDs: criu restores the whole tree as it was
                await asyncio.to_thread(self.cuda.resume, cuda_pid)
        except BaseException as err:
            await self._end(image.kernel_id, pid)
            if isinstance(err, Exception) and not isinstance(err, CudaError):
                raise BackendError(f"the restored kernel could not be registered: {err}") from err
            raise
        await asyncio.to_thread(shutil.rmtree, folder, True)  # spent: it ran on from here
        return RestoreOutcome(
            image.kernel_id,
            live=True,
            details={
                "pid": pid,
                "seconds": round(seconds, 3),
                "checkpoint_id": image.checkpoint_id,
            },
        )

    def _restore_process(self, folder: Path, image: ProcessImage) -> tuple[int, float]:
        if not pid_gone(image.pid, 5.0):
            raise CriuError(
                f"PID {image.pid} of the paused kernel is taken by another process now "
                f"({_command(image.pid)}); a process comes back only under its own PID"
            )
        pid, seconds = self.criu.restore(folder, image.outside, folder / "restored.pid")
        if pid != image.pid:
            raise CriuError(f"criu restored PID {pid}, not the paused kernel's {image.pid}")
        return pid, seconds

    async def _end(self, kernel_id: str, pid: int) -> None:
        """Undo a restore that cannot be used: the process ends, the kernel is forgotten."""
        if kernel_id in self.kernel_manager:
            with contextlib.suppress(Exception):
                await self.kernel_manager.shutdown_kernel(kernel_id, now=True)
                return
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            await asyncio.to_thread(os.waitpid, pid, 0)

    def _newest_image(self, key: str) -> tuple[Path, ProcessImage] | None:
        """The image the last pause left, if any (an unreadable one is discarded)."""
        store = store_mod.NotebookStore(self.store_root, key)
        ids = store.image_ids()
        if not ids:
            return None
        folder = store.image_path(ids[-1])
        try:
            image = ProcessImage.from_json(json.loads((folder / KERNEL_FILE).read_bytes()))
        except (OSError, ValueError, TypeError, KeyError):
            _discard(folder)
            return None
        return folder, image


def _discard(folder: Path) -> None:
    """An image that will never be restored: lift its network lock, delete it."""
    unlock_network(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone since"


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    """Connection info as JSON: the session key (and CurveZMQ keys) are bytes."""
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in info.items()}
