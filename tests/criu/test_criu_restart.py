"""A paused kernel process comes back live under a *restarted* server process."""

from __future__ import annotations

import time
from pathlib import Path

from ..server_process import start_server


def test_a_paused_process_comes_back_live_under_a_restarted_server(
    tmp_path: Path, criu_binary: str
) -> None:
    # Given a server with the criu backend, and a kernel holding a generator mid-iteration
    root = tmp_path / "notebooks"
    root.mkdir()
    config = (
        "c.PauseApp.backend = 'criu'\n"
        f"c.PauseApp.criu_binary = {criu_binary!r}\n"
        f"c.PauseApp.store_root = {str(tmp_path / 'store')!r}\n"
        "c.PauseApp.gpu_count = 0\n"
    )
    first = start_server(tmp_path / "first", root, config)
    try:
        kernel_id = first.server.open_notebook("nb.ipynb")
        first.server.run(kernel_id, "import os\nnumbers = iter(range(5))\nnext(numbers)")
        pid = int(first.server.run(kernel_id, "print(os.getpid())"))
        assert first.server.run(kernel_id, "print(os.getppid())") == f"{first.process.pid}\n"
        code, _ = first.server.request("POST", "/jupyter-pause/pause/nb.ipynb")
        assert code == 202
        paused = first.server.wait_state("nb.ipynb", "paused", "active")
        assert "process image" in paused["message"], paused

    # When that server process stops, and a new one serves the same notebooks and store
    finally:
        first.stop()
    second = start_server(tmp_path / "second", root, config)
    try:
        assert second.server.session("nb.ipynb")["state"] == "paused"
        second.server.request("POST", "/jupyter-pause/resume/nb.ipynb")
        ready = second.server.wait_state("nb.ipynb", "ready", "partial", "failed")

        # Then the very process is back, under its kernel id, a child of the new server
        assert ready["how"] == "live" and ready["kernel_id"] == kernel_id, ready
        check = "print(next(numbers), os.getpid(), os.getppid())"
        assert second.server.run(kernel_id, check) == f"1 {pid} {second.process.pid}\n"
        # and it stays: ipykernel's parent poller (once a second) follows the new server
        time.sleep(2.5)
        assert second.server.run(kernel_id, "print(next(numbers))") == "2\n"
    finally:
        second.stop()
