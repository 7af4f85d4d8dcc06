"""A real ipykernel process driven over its ZMQ channels, for tests of the kernel side."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager


@dataclass
class CellOutput:
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # the exception a cell raised (not a UsageError: see status)
    status: str = "ok"  # the execute reply's: "error" for any failed cell
    payload: list[dict[str, Any]] = field(default_factory=list)


class Kernel:
    """One python3 kernel started in ``cwd`` with extra environment variables."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd), env={**os.environ, **env})
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 180) -> CellOutput:
        out = CellOutput()

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    out.stdout += content["text"]
                else:
                    out.stderr += content["text"]
            elif kind == "error":
                out.error = f"{content['ename']}: {content['evalue']}"

        reply = self.client.execute_interactive(code, output_hook=hook, timeout=timeout)
        out.payload = reply["content"].get("payload", [])
        out.status = reply["content"]["status"]
        return out

    def ok(self, code: str, timeout: float = 180) -> str:
        """Run code that must not raise; returns its stdout."""
        out = self.run(code, timeout)
        assert out.status == "ok", f"{out.error}\n{out.stderr}"
        return out.stdout

    def value(self, expression: str) -> Any:
        """Evaluate an expression in the kernel and bring its JSON value back."""
        text = self.ok(f"import json as _json\nprint(_json.dumps({expression}))")
        return json.loads(text.strip().splitlines()[-1])

    def send(self, code: str) -> str:
        """Start executing without waiting for the result."""
        return self.client.execute(code)

    def kill(self) -> None:
        """SIGKILL, like an out-of-memory kill or a node going away."""
        self.manager.signal_kernel(signal.SIGKILL)
        self.close()

    def close(self) -> None:
        """Stop the kernel; safe to call more than once."""
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)
        self.manager.cleanup_resources()


KernelFactory = Callable[..., Kernel]


def checkpoint(kernel: Kernel, args: str = "") -> dict:
    """Take a checkpoint through the Python API and return its structured result."""
    return kernel.value(f"__import__('jupyter_pause').checkpoint({args}).to_json()")


def restore(kernel: Kernel, args: str = "") -> dict:
    """Restore through the Python API (loading the extension) and return the result."""
    kernel.ok("%load_ext jupyter_pause")
    return kernel.value(f"__import__('jupyter_pause').restore({args}).to_json()")
