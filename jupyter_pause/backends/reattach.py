"""A kernel process restored by criu, known again to jupyter-server under its own kernel id.

jupyter-server's kernel manager only knows kernels it started. A restored one comes in through
that same door: ``register_restored`` calls ``start_kernel`` with the paused kernel's id, name,
working directory and environment, but the kernel manager it creates gets the paused kernel's
connection info (ports, key) and a provisioner whose first "launch" adopts the process criu
has just restored. So
everything a started kernel gets, a restored one gets too: its connection file, its activity
tracking, its restarter, its metrics, and a culler that sees it. A later restart of the kernel
(Kernel > Restart) starts a new process the ordinary way, with the same ports.

The restored process is a child of the server (criu's ``--restore-sibling``), so it is waited
for like any kernel; ``RestoredProcess`` gives it the ``subprocess.Popen`` face the provisioner
expects.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Int


class RestoredProcess:
    """``subprocess.Popen``'s face for a child process this server did not spawn itself."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it ended, how is unknown
                self.returncode = 0
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"process {self.pid} still runs after {timeout} s")
            time.sleep(0.05)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # never signal a PID after it was reaped (it may be reused)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class RestoredProvisioner(LocalProvisioner):
    """Its first launch adopts the restored process ``adopt_pid``; later launches (a restart
    of the kernel) start a new kernel process as LocalProvisioner does."""

    adopt_pid = Int(help="PID of the restored kernel process, a child of this server")
    restored = False

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        if self.restored:
            return await super().pre_launch(**kwargs)
        km = self.parent
        # The paused kernel's ports and key (loaded into the manager): no new ones.
        km.write_connection_file(jupyter_session=kwargs.get("env", {}).get("JPY_SESSION_NAME", ""))
        self.connection_info = km.get_connection_info()
        self.ports_cached = True  # a later restart keeps these ports, as for a started kernel
        return await KernelProvisionerBase.pre_launch(self, cmd=km.format_kernel_cmd(), **kwargs)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:
        if self.restored:
            return await super().launch_kernel(cmd, **kwargs)
        pid = self.adopt_pid
        self.restored = True
        self.process = RestoredProcess(pid)
        self.pid = pid
        with contextlib.suppress(OSError):
            self.pgid = os.getpgid(pid)
        self.cwd = kwargs.get("cwd")
        return self.connection_info


async def register_restored(
    kernel_manager: Any,
    kernel_id: str,
    kernel_name: str,
    path: str,
    env: dict[str, str],
    connection_info: dict[str, Any],
    pid: int,
) -> None:
    """Make the restored process ``pid`` kernel ``kernel_id`` of jupyter-server's manager."""
    make_manager = kernel_manager.kernel_manager_factory

    def factory(**kwargs: Any) -> Any:
        # For this one kernel only: start_kernel asks for its manager before it awaits
        # anything, so no other kernel start can come in between.
        kernel_manager.kernel_manager_factory = make_manager
        km = make_manager(**kwargs)
        km.load_connection_info(connection_info)
        km.provisioner = RestoredProvisioner(
            kernel_id=kernel_id, kernel_spec=km.kernel_spec, parent=km, adopt_pid=pid
        )
        return km

    kernel_manager.kernel_manager_factory = factory
    try:
        await kernel_manager.start_kernel(
            kernel_id=kernel_id, kernel_name=kernel_name, path=path, env=env
        )
    finally:
        if kernel_manager.kernel_manager_factory is factory:
            kernel_manager.kernel_manager_factory = make_manager
