"""The local backend: kernels on this machine, accelerators shared first come, first served.

Pause stops the kernel process, which frees its GPU memory; resume starts a new kernel for
the same notebook (so state always comes back "from files"). A big box with 4 GPUs for 10
users is the case this serves: the backend hands out at most the GPUs it knows about, and
a resume that needs one while none is free waits in a queue until a pause frees one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from .base import (
    Allocation,
    Backend,
    BackendError,
    QueueCallback,
    ResourceStatus,
    ResourcesUnavailable,
    RestoreOutcome,
    SessionSpec,
    StopOutcome,
)
from .kernels import running_kernel, start_kernel


def detect_gpus() -> int:
    """GPUs on this machine: NVML when importable, else ``nvidia-smi -L``, else 0."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library or no driver: try the command line
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def gpu_pids() -> set[int] | None:
    """PIDs holding GPU memory now, or None when this cannot be measured here."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {int(line) for line in out.stdout.split() if line.strip().isdigit()}


@dataclass
class _Waiter:
    path: str
    count: int
    future: asyncio.Future[list[int]]
    on_queued: QueueCallback


class GpuPool:
    """Device indices handed out first come, first served; waiters are served in order."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free: list[int] = list(range(total))
        self.holders: dict[str, list[int]] = {}
        self.waiters: deque[_Waiter] = deque()

    def queue(self) -> list[str]:
        return [w.path for w in self.waiters]

    async def acquire(self, path: str, count: int, on_queued: QueueCallback) -> list[int]:
        if count > self.total:
            raise ResourcesUnavailable(
                f"this notebook needs {count} GPU(s); this server has {self.total} in all"
            )
        if path in self.holders:
            return self.holders[path]
        if not self.waiters and len(self.free) >= count:
            return self._grant(path, count)
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self.waiters.append(_Waiter(path, count, future, on_queued))
        self._announce()
        try:
            return await future
        finally:
            self.waiters = deque(w for w in self.waiters if w.future is not future)
            self._announce()

    def _grant(self, path: str, count: int) -> list[int]:
        granted, self.free = self.free[:count], self.free[count:]
        self.holders[path] = granted
        return granted

    def adopt(self, path: str, count: int) -> list[int]:
        """A kernel started outside a resume: it holds GPUs whether or not we granted them."""
        if path in self.holders or count == 0:
            return self.holders.get(path, [])
        return self._grant(path, min(count, len(self.free)))

    def rename(self, old_path: str, new_path: str) -> None:
        if old_path in self.holders:
            self.holders[new_path] = self.holders.pop(old_path)

    def release(self, path: str) -> None:
        released = self.holders.pop(path, [])
        self.free = sorted(self.free + released)
        while self.waiters and len(self.free) >= self.waiters[0].count:
            waiter = self.waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(self._grant(waiter.path, waiter.count))
        self._announce()

    def _announce(self) -> None:
        for place, waiter in enumerate(self.waiters, start=1):
            busy = ", ".join(sorted(self.holders)) or "nobody"
            waiter.on_queued(
                place,
                f"all {self.total} GPU(s) are in use (by {busy}); you are number {place} in "
                "the queue and get the next one freed",
            )


class LocalBackend(Backend):
    """Kernels of this jupyter-server; GPUs counted by NVML/nvidia-smi or set by the admin."""

    name = "local"
    restores_on_cpu = True

    def __init__(
        self,
        kernel_manager: Any,
        session_manager: Any,
        gpu_count: int | None,
        gpu_release_timeout: float = 30.0,
    ) -> None:
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.pool = GpuPool(detect_gpus() if gpu_count is None else gpu_count)
        self.gpu_release_timeout = gpu_release_timeout

    def adopt(self, session: SessionSpec) -> list[int]:
        return self.pool.adopt(session.path, session.gpus)

    def rename(self, old_path: str, new_path: str) -> None:
        self.pool.rename(old_path, new_path)

    async def stop(self, session: SessionSpec) -> StopOutcome:
        kernel_id = session.kernel_id
        if kernel_id is None or kernel_id not in self.kernel_manager:
            raise BackendError("the notebook has no running kernel to stop")
        kernel = self.kernel_manager.get_kernel(kernel_id)
        pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
        await self.kernel_manager.shutdown_kernel(kernel_id)
        if pid is not None:
            await _wait_gone(pid, timeout=30)
        stopped_at = time.time()
        released_at, measured = stopped_at, False
        if session.gpus and pid is not None:
            released_at, measured = await self._wait_gpu_free(pid, stopped_at)
        self.pool.release(session.path)
        return StopOutcome(stopped_at, released_at, measured)

    async def _wait_gpu_free(self, pid: int, since: float) -> tuple[float, bool]:
        deadline = time.monotonic() + self.gpu_release_timeout
        while time.monotonic() < deadline:
            holders = await asyncio.to_thread(gpu_pids)
            if holders is None:
                return since, False
            if pid not in holders:
                return time.time(), True
            await asyncio.sleep(0.2)
        return time.time(), False

    async def request_resources(self, session: SessionSpec, on_queued: QueueCallback) -> Allocation:
        gpus = (
            await self.pool.acquire(session.path, session.gpus, on_queued) if session.gpus else []
        )
        return Allocation(gpus=gpus, granted_at=time.time())

    async def restore(self, session: SessionSpec, allocation: Allocation) -> RestoreOutcome:
        existing = await running_kernel(self.kernel_manager, self.session_manager, session.path)
        if existing is not None:
            # The user already opened the notebook with a new kernel: restore into that one.
            return RestoreOutcome(existing, live=False, details={"reused_kernel": True})
        env = {}
        if self.pool.total:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in allocation.gpus)
        try:
            kernel_id = await start_kernel(self.kernel_manager, self.session_manager, session, env)
        except BackendError:
            self.pool.release(session.path)
            raise
        return RestoreOutcome(kernel_id, live=False)

    async def release(self, session: SessionSpec) -> None:
        self.pool.release(session.path)

    def describe_resources(self) -> ResourceStatus:
        return ResourceStatus(
            backend=self.name,
            gpus_total=self.pool.total,
            gpus_free=len(self.pool.free),
            queue=self.pool.queue(),
            details={"holders": dict(self.pool.holders)},
        )


async def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        # A zombie still answers kill(0); jupyter_client reaps it shortly.
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(")")[-1].split()[0] == "Z":
                return
        await asyncio.sleep(0.05)
