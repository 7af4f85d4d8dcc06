"""A user's Restart Kernel while jupyter_pause brings that kernel back joins the resume; a
Shut Down Kernel ends it first.

A kernel-pod resume is jupyter-server's own restart of the paused kernel
(``backends/kernel_pods.py``), and it may wait a long time for a GPU. jupyter_client cannot run
a second restart of a kernel whose restart is still in flight: both drive one KernelManager (its
pending-state future resolved twice), the second deletes the first's pod and makes its own, and
the resume ends half done. Refusing it is no better: jupyter-server answers any error of a
restart with a 500. So a Restart pressed meanwhile (JupyterLab's toolbar, ``POST
/api/kernels/ID/restart``) waits for the resume and answers with the kernel it brought back:
the notebook gets the working kernel it asked for, with its state restored. A Restart once the
resume is done restarts the kernel as usual.

A shutdown meanwhile (Shut Down Kernel, a culler, a notebook closed with its kernel) ends the
resume first, as a cancel does: jupyter_client cannot shut down a kernel whose restart is in
flight either (its pending ``ready`` raises, a 500), and the notebook stays paused, its
checkpoint intact, saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


def join_restarts_to_resumes(
    kernel_manager: Any, join_resume: Callable[[str], Awaitable[bool]]
) -> None:
    """Make ``kernel_manager.restart_kernel`` wait for ``join_resume(kernel_id)`` instead of
    restarting a kernel whose resume is in flight (``join_resume`` answers True once it waited
    for one; the resume's own restart passes through)."""
    restart = kernel_manager.restart_kernel

    async def restart_unless_resuming(kernel_id: str, *args: Any, **kwargs: Any) -> Any:
        if await join_resume(kernel_id):
            log.info("jupyter_pause: Restart Kernel of %s joined its resume", kernel_id)
            return None
        return await restart(kernel_id, *args, **kwargs)

    kernel_manager.restart_kernel = restart_unless_resuming


def end_resumes_before_shutdowns(
    kernel_manager: Any, end_resume: Callable[[str], Awaitable[bool]]
) -> None:
    """Make ``kernel_manager.shutdown_kernel`` end the kernel's resume in flight first
    (``end_resume`` answers True once it ended one)."""
    shutdown = kernel_manager.shutdown_kernel

    async def shutdown_after_resume(kernel_id: str, *args: Any, **kwargs: Any) -> Any:
        if await end_resume(kernel_id):
            log.info("jupyter_pause: Shut Down Kernel of %s ended its resume", kernel_id)
        return await shutdown(kernel_id, *args, **kwargs)

    kernel_manager.shutdown_kernel = shutdown_after_resume
