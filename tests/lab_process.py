"""What the launchers of the galata tests' servers share (``python -m tests.hub_lab``,
``python -m tests.cluster.kernel_pods_lab``): they serve until Playwright's SIGTERM (or a
Ctrl-C), then stop what they started, in order."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from types import FrameType


def until_signalled() -> Callable[[], bool]:
    """SIGTERM and SIGINT no longer end this process: they set a flag, read by the result."""
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return lambda: stopping


def end(process: subprocess.Popen[bytes], grace: float = 60) -> None:
    """SIGTERM (the server stops what it runs first), SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
