"""``python -m jupyter_pause.cli`` run against the test server, as a user runs it.

The test server runs on the test's event loop, so the CLI runs as an asyncio subprocess:
a blocking call would stop the very server it talks to.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path


class Cli:
    """Runs ``python -m jupyter_pause.cli`` against the test server."""

    def __init__(self, url: str, token: str, runtime_dir: Path) -> None:
        self.url = url
        self.token = token
        self.runtime_dir = runtime_dir

    async def __call__(
        self, *args: str, discover: bool = False, cwd: Path | None = None, **env: str
    ) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); ``discover`` leaves out --url/--token."""
        command = list(args)
        for option, value in (("--url", self.url), ("--token", self.token)):
            if not discover and option not in command:
                command += [option, value]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_PAUSE_")}
        environ["JUPYTER_RUNTIME_DIR"] = str(self.runtime_dir)
        environ.update(env)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "jupyter_pause.cli",
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environ,
            cwd=cwd,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()
