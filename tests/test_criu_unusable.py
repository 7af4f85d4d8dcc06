"""The criu backend where criu cannot run: pauses are the local backend's, and say why."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from .cli_runner import Cli
from .servers import Server, pause_and_wait, pause_server_config


@pytest.fixture
def jp_server_config(pause_store: Path, tmp_path: Path) -> dict:
    missing = tmp_path / "no-such-criu"
    return pause_server_config(pause_store, backend="criu", criu_binary=str(missing))


async def test_without_criu_idle_kernels_pause_from_files_and_busy_ones_wait(
    server: Server,
) -> None:
    # Given the criu backend on a machine where its criu binary is missing
    await server.start_extension()
    kernel_id = await server.open_notebook("plain.ipynb")
    await server.run(kernel_id, "import time\nkept = 'yes'")
    await server.watched("plain.ipynb")

    # Then the status says so, naming the binary
    _, status = await server.call("GET", "status")
    details: dict[str, Any] = status["resources"]["details"]
    assert status["backend"] == "criu" and details["process_snapshots"] is None
    assert "no criu binary at" in details["problem"] and "no-such-criu" in details["problem"]
    assert details["fallback"].startswith("pauses checkpoint and stop idle kernels")

    # And a running cell is not interrupted: the pause waits for it, then refuses
    running = asyncio.create_task(server.run(kernel_id, "time.sleep(3)"))
    await server.wait_for("plain.ipynb", lambda r: r["busy"])
    code, message = await server.error("POST", "pause", "plain.ipynb")
    assert code == 409 and "never interrupted" in message
    await running

    # When the idle kernel is paused, it is stopped after its checkpoint, and the pause says
    # why there is no process image
    paused = await pause_and_wait(server, "plain.ipynb")
    assert paused["state"] == "paused" and paused["paused_during_cell"] is None, paused
    assert "No process image (no criu binary at" in paused["message"], paused["message"]
    _, timeline = await server.call("GET", "timeline", "plain.ipynb")
    (stopped,) = [e["data"] for e in timeline["events"] if e["kind"] == "kernel_stopped"]
    assert "no criu binary at" in stopped["no_snapshot"]

    # And the resume restores the checkpoint into a new kernel
    await server.call("POST", "resume", "plain.ipynb")
    ready = await server.wait_state("plain.ipynb", "ready", "partial", "failed")
    assert ready["how"] == "files" and ready["kernel_id"] != kernel_id, ready
    assert await server.run(ready["kernel_id"], "print(kept)") == "yes\n"


async def test_jupyter_pause_status_says_the_criu_backend_falls_back_and_why(
    server: Server, jp: Cli
) -> None:
    # Given the criu backend on a machine where its criu binary is missing, checked at start
    await server.start_extension()
    assert "no criu binary at" in await server.orchestrator.backend.usable()

    # When the user asks for the status
    code, out, err = await jp("status")

    # Then the backend line is followed by why it cannot snapshot processes, and what a pause
    # does instead
    assert code == 0, err
    backend, warning = [line for line in out.splitlines() if line.startswith(("Backend", "Warn"))]
    assert backend.startswith("Backend:  criu;")
    assert warning.startswith("Warning:  the criu backend cannot work fully here: no criu binary")
    assert "no-such-criu" in warning
    assert warning.endswith(
        "; pauses checkpoint and stop idle kernels, and resume them from their checkpoints; "
        "busy kernels wait for their cell"
    )
