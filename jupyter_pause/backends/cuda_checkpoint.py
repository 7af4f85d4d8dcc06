"""A kernel's CUDA context around a process snapshot: NVIDIA's ``cuda-checkpoint``.

criu cannot dump GPU memory or the driver's device files. ``cuda-checkpoint --toggle --pid P``
(NVIDIA driver >= 550) first locks the process's CUDA calls, copies its device memory into the
process's host memory and releases the GPU; criu then dumps an ordinary process. After the
restore, the same toggle copies the memory back to the GPU and lets CUDA calls run again.
Blocking calls (worker threads).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class CudaError(Exception):
    """The CUDA state cannot be suspended or resumed; the message says why."""


def cuda_processes(pid: int) -> list[int]:
    """The processes of the tree rooted at ``pid`` that hold the NVIDIA driver's device files
    (open or mapped): each has a CUDA context criu cannot dump by itself."""
    return [p for p in _tree(pid) if _holds_driver(p)]


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue  # ended meanwhile
    return found


def _holds_driver(pid: int) -> bool:
    try:
        if "/dev/nvidia" in Path(f"/proc/{pid}/maps").read_text(errors="replace"):
            return True
        fds = Path(f"/proc/{pid}/fd")
        return any(os.readlink(fds / fd).startswith("/dev/nvidia") for fd in os.listdir(fds))
    except OSError:
        return False


class CudaCheckpoint:
    """One ``cuda-checkpoint`` binary (NVIDIA's, from github.com/NVIDIA/cuda-checkpoint)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def problem(self) -> str | None:
        if shutil.which(self.binary) is None:
            return (
                f"the kernel holds a CUDA context and NVIDIA's cuda-checkpoint is not installed "
                f"({self.binary!r} not found; it needs driver >= 550; set "
                "c.PauseApp.cuda_checkpoint_binary)"
            )
        return None

    def state(self, pid: int) -> str:
        """``running``, ``locked``, ``checkpointed`` (or CudaError naming why not)."""
        return self._run("--get-state", "--pid", str(pid)).strip()

    def suspend(self, pid: int) -> None:
        """Move the process's device memory to the host and release the GPU."""
        if self.state(pid) != "running":
            raise CudaError(f"CUDA in process {pid} is {self.state(pid)!r}, not running")
        self._run("--toggle", "--pid", str(pid))

    def resume(self, pid: int) -> None:
        """Give a restored process its GPU memory back and let its CUDA calls run."""
        if self.state(pid) == "checkpointed":
            self._run("--toggle", "--pid", str(pid))

    def _run(self, *args: str) -> str:
        problem = self.problem()
        if problem:
            raise CudaError(problem)
        try:
            done = subprocess.run(
                [self.binary, *args], capture_output=True, text=True, timeout=600, check=False
            )
        except (OSError, subprocess.SubprocessError) as err:
            raise CudaError(f"cuda-checkpoint {' '.join(args)} could not run: {err}") from err
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise CudaError(f"cuda-checkpoint {' '.join(args)} failed: {said}")
        return done.stdout
