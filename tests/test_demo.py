"""The demo notebook keeps its promise: after a pause and a resume, training continues."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from .cli_runner import Cli
from .servers import Server

pytest.importorskip("torch")

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.ipynb"


def demo_cells() -> list[str]:
    notebook = json.loads(DEMO.read_text())
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def training_cell(cells: list[str]) -> str:
    return next(cell for cell in cells if "optimizer.step()" in cell)


async def run_all(server: Server, kernel_id: str, cells: list[str]) -> list[str]:
    return [await server.run(kernel_id, cell) for cell in cells]


@pytest.mark.parametrize("pause_with", ["toolbar", "magic", "cli"])
async def test_demo_continues_training_after_pause_and_resume(
    server: Server, jp: Cli, jp_root_dir: Path, pause_with: str
) -> None:
    cells = demo_cells()
    train = training_cell(cells)
    for folder in ("straight", "paused"):
        (jp_root_dir / folder).mkdir()
        shutil.copy(DEMO, jp_root_dir / folder / "demo.ipynb")

    # Given the demo run from top to bottom, then its training cell once more, without a pause
    straight = await server.open_notebook("straight/demo.ipynb")
    await run_all(server, straight, cells)
    expected = await server.run(straight, train)
    expected_steps = await server.run(straight, "print(config['steps_done'])")
    await server.fetch("api", "kernels", straight, method="DELETE")  # its GPU goes back

    # When the same demo is run to the end, paused (the toolbar's API or %pause) and resumed
    kernel_id = await server.open_notebook("paused/demo.ipynb")
    outputs = await run_all(server, kernel_id, cells)
    assert "Checkpoint 1: 5 variables saved" in outputs[cells.index("%checkpoint")]
    await server.watched("paused/demo.ipynb")
    if pause_with == "toolbar":
        code, _record = await server.call("POST", "pause", "paused/demo.ipynb")
        assert code == 202
    elif pause_with == "magic":
        assert "Pause requested" in await server.run(kernel_id, "%pause")
    else:
        code, _out, err = await jp("pause", "paused/demo.ipynb")
        assert code == 0, err
    await server.wait_for("paused/demo.ipynb", lambda record: record["state"] == "paused")
    await server.call("POST", "resume", "paused/demo.ipynb")
    ready: dict[str, Any] = await server.wait_state("paused/demo.ipynb", "ready", "failed")
    assert ready["state"] == "ready", ready

    # Then the training cell, run again as the demo says, continues exactly as without a pause
    assert await server.run(ready["kernel_id"], train) == expected
    assert await server.run(ready["kernel_id"], "print(config['steps_done'])") == expected_steps
    assert expected_steps.strip() == "40"
