"""The ways back to a notebook the criu backend paused that cannot be live: each restores
from files, and says so (a live restore is proven in test_criu.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..servers import Server, pause_and_wait
from ..test_ways_back import assert_data_back, poll_like_the_chip, resume_and_wait

NOTEBOOK = "work.ipynb"


async def a_notebook_paused_with_its_process_image(server: Server, pause_store: Path) -> Path:
    kernel_id = await server.open_notebook(NOTEBOOK)
    await server.run(kernel_id, "weights = list(range(5))\nnote = 'before the pause'")
    paused = await pause_and_wait(server, NOTEBOOK)
    assert "process image" in paused["message"], paused
    (image,) = pause_store.glob(f"{NOTEBOOK}-*/images/*")
    return image


async def test_a_reopened_notebook_is_restored_from_files_not_from_its_old_process(
    server: Server, pause_store: Path
) -> None:
    # Given a notebook paused with its process image, opened again (a fresh kernel)
    image = await a_notebook_paused_with_its_process_image(server, pause_store)
    fresh = await server.open_notebook(NOTEBOOK)

    # When the user waits a few seconds (the chip polling), then resumes
    record = await poll_like_the_chip(server, NOTEBOOK, 3)
    assert record["state"] == "paused" and record["unrestored_kernel"], record
    ready = await resume_and_wait(server, NOTEBOOK)

    # Then the checkpoint is restored into that kernel, which is never called live
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] == fresh
    assert "A new kernel was started for the notebook while it was paused" in ready["message"]
    await assert_data_back(server, fresh)
    assert not image.exists()  # two processes of one notebook must never run


async def test_a_paused_process_whose_image_is_gone_comes_back_from_files(
    server: Server, pause_store: Path
) -> None:
    # Given a notebook paused with its process image, which is then lost (deleted by hand,
    # a store restored from a backup without it): the paused process is gone for good
    image = await a_notebook_paused_with_its_process_image(server, pause_store)
    shutil.rmtree(image)

    # When it is resumed
    ready = await resume_and_wait(server, NOTEBOOK)

    # Then from the checkpoint, into a new kernel, and not called live
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    await assert_data_back(server, ready["kernel_id"])
