"""The kernel of a notebook in this jupyter-server: find the one running, or start a new one.

Shared by the backends whose kernels run beside the server (``local``; ``workspace`` and
``jupyterhub``, where the server and its kernels pause as one and share its GPUs).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any

from .base import (
    Allocation,
    BackendError,
    QueueCallback,
    RestoreOutcome,
    SessionSpec,
    StopOutcome,
)


async def running_kernel(kernel_manager: Any, session_manager: Any, path: str) -> str | None:
    """The kernel of the notebook's jupyter-server session, when it runs."""
    with contextlib.suppress(Exception):
        model = await session_manager.get_session(path=path)
        kernel_id = model["kernel"]["id"]
        if kernel_id in kernel_manager:
            return kernel_id
    return None


async def start_kernel(
    kernel_manager: Any,
    session_manager: Any,
    session: SessionSpec,
    env: dict[str, str],
    kernel_id: str | None = None,
) -> str:
    """Start a kernel for the notebook (its session points at it), under ``kernel_id`` when
    given; BackendError if it cannot."""
    kernel_id = kernel_id or str(uuid.uuid4())
    try:
        await kernel_manager.start_kernel(
            path=os.path.dirname(session.path),
            kernel_name=session.kernel_name,
            env=kernel_env(session_manager, session, env),
            kernel_id=kernel_id,
        )
    except asyncio.CancelledError:  # a resume given up while its kernel pod waited
        forget_unfinished_start(kernel_manager, kernel_id)
        raise
    except Exception as err:  # no such kernelspec, kernel crashed on start, ...
        forget_unfinished_start(kernel_manager, kernel_id)
        raise BackendError(f"could not start a {session.kernel_name} kernel: {err}") from err
    await open_session(session_manager, session, kernel_id)
    return kernel_id


def forget_unfinished_start(kernel_manager: Any, kernel_id: str) -> None:
    """What jupyter_client leaves of a start or restart of ``kernel_id`` that failed or was
    cancelled, and on which any later shutdown of it, or the server's own shutdown_all at its
    stop, fails (so the server never exits): a kernel it never added stays among its pending
    kernels for good (jupyter-server: "Kernel does not exist", a 404), and a kernel it has
    keeps a ``ready`` future that a cancel leaves pending (InvalidStateError). The kernel is
    as before that start: nothing is starting."""
    if kernel_id in kernel_manager:
        ready = kernel_manager.get_kernel(kernel_id).ready
        if not ready.done():
            ready.set_result(None)
        return
    pending = getattr(kernel_manager, "_pending_kernels", None)
    if isinstance(pending, dict):
        pending.pop(kernel_id, None)


def kernel_env(session_manager: Any, session: SessionSpec, env: dict[str, str]) -> dict[str, str]:
    """What a kernel of the notebook starts with: jupyter-server's, and the notebook's key."""
    kernel_env = session_manager.get_kernel_env(session.path)
    kernel_env.update({"JUPYTER_PAUSE_NOTEBOOK": session.key, "JPY_SESSION_NAME": session.key})
    kernel_env.update(env)
    return kernel_env


async def open_session(session_manager: Any, session: SessionSpec, kernel_id: str) -> None:
    """The notebook's jupyter-server session, pointing at ``kernel_id`` (JupyterLab finds it)."""
    await session_manager.create_session(
        path=session.path,
        name=os.path.basename(session.path),
        type="notebook",
        kernel_name=session.kernel_name,
        kernel_id=kernel_id,
    )


class ServerKernels:
    """The kernels of an environment that pauses as a whole (a workspace pod, a JupyterHub
    server): they run beside the server and see all of its GPUs; none stops on its own."""

    def __init__(self, kernel_manager: Any, session_manager: Any, gpus: int = 0) -> None:
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.gpus = gpus

    async def stop(self, session: SessionSpec) -> StopOutcome:
        raise BackendError("this environment pauses as a whole: pause the environment instead")

    async def request_resources(self, session: SessionSpec, on_queued: QueueCallback) -> Allocation:
        # The environment holds its GPUs; every kernel in it sees them all.
        return Allocation(
            gpus=list(range(self.gpus)) if session.gpus else [], granted_at=time.time()
        )

    async def restore(self, session: SessionSpec, allocation: Allocation) -> RestoreOutcome:
        existing = await running_kernel(self.kernel_manager, self.session_manager, session.path)
        if existing is not None:  # the kernel that paused (alive after a live restore) or a new one
            return RestoreOutcome(existing, live=False, details={"reused_kernel": True})
        kernel_id = await start_kernel(self.kernel_manager, self.session_manager, session, {})
        return RestoreOutcome(kernel_id, live=False)

    async def release(self, session: SessionSpec) -> None:
        return None

    def adopt(self, session: SessionSpec) -> list[int]:
        return list(range(self.gpus)) if session.gpus else []
