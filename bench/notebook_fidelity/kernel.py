"""A real ipykernel process that runs a notebook's cells one at a time and keeps their outputs."""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path
from typing import IO, Any

from jupyter_client.manager import KernelManager

from .outputs import CellOutput

#: The checkout whose jupyter_pause the kernels must use (not an installed copy elsewhere).
REPOSITORY = Path(__file__).resolve().parents[2]


def kernel_environment(extra: dict[str, str]) -> dict[str, str]:
    """The launch environment of every kernel of a measurement: the same in all of them."""
    path = os.pathsep.join(p for p in (str(REPOSITORY), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        # Same string hashes in every kernel: set iteration orders then match across processes.
        "PYTHONHASHSEED": "0",
        # One thread per kernel: the runs share a small machine, and float reductions then
        # add up in one order.
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        **extra,
    }


class NotebookKernel:
    """One python3 kernel started in ``cwd``; its own log goes to ``log``."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self._log: IO[bytes] = log.open("ab")
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd), env=env, stdout=self._log, stderr=self._log)
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float, *, history: bool = True) -> CellOutput:
        """Execute one cell; a cell past ``timeout`` is interrupted and reported as such."""
        output = CellOutput()
        msg_id = self.client.execute(
            code, store_history=history, allow_stdin=False, stop_on_error=False
        )
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and output.status != "timeout":
                output.status, output.error = "timeout", f"Timeout: cell ran over {timeout:.0f} s"
                self.manager.interrupt_kernel()
                deadline = time.monotonic() + 30  # let the interrupt land
                continue
            if remaining <= 0:
                output.status = "dead"
                break
            try:
                message = self.client.get_iopub_msg(timeout=min(1.0, remaining))
            except queue.Empty:
                if not self.manager.is_alive():
                    output.status, output.error = "dead", "KernelDied: the kernel process exited"
                    break
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "status" and content["execution_state"] == "idle":
                break
            if output.status != "timeout":
                output.add_message(kind, content)
        self._drain_reply(msg_id)
        return output

    def _drain_reply(self, msg_id: str) -> None:
        """Take this cell's execute_reply off the shell channel, so replies never pile up."""
        while True:
            try:
                reply: dict[str, Any] = self.client.get_shell_msg(timeout=5)
            except queue.Empty:
                return
            if reply["parent_header"].get("msg_id") == msg_id:
                return

    @property
    def alive(self) -> bool:
        return self.manager.is_alive()

    def close(self) -> None:
        """Shut the kernel down, as a user stopping it would; safe to call twice."""
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=False)
        self.manager.cleanup_resources()
        self._log.close()
