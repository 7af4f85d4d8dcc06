"""Live pause with a real CRIU: the very same kernel process comes back, even mid-cell."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.backends.criu_tool import network_lock_table
from jupyter_pause.kernel.store import NotebookStore

from ..notebook_tab import NotebookTab
from ..servers import Server, pause_and_wait


async def resume_and_wait(server: Server, path: str) -> dict[str, Any]:
    await server.call("POST", "resume", path)
    return await server.wait_state(path, "ready", "partial", "failed")


async def test_a_paused_kernel_comes_back_as_the_same_process(
    server: Server, server_url: str, jp_serverapp: Any, pause_store: Path, tmp_path: Path
) -> None:
    # Given a notebook open in a tab, whose kernel holds what no checkpoint can carry: a
    # generator in the middle of its iteration and a file open at a position
    lines = tmp_path / "lines.txt"
    lines.write_text("first\nsecond\nthird\n")
    kernel_id = await server.open_notebook("live.ipynb")
    await server.wait_for("live.ipynb", lambda r: r["watching"] and r["process_token"])
    token = jp_serverapp.identity_provider.token
    tab = await NotebookTab.open(server_url, token, kernel_id)
    setup = (
        "import os\ncounter = iter(range(10))\nnext(counter)\n"
        f"log = open({str(lines)!r})\nlog.readline()\npid = os.getpid()\nprint(pid)"
    )
    pid = int(await tab.run(setup))
    ports = jp_serverapp.kernel_manager.get_kernel(kernel_id).ports

    running = await server.wait_for("live.ipynb", lambda r: r["process_token"])

    # When it is paused
    paused = await pause_and_wait(server, "live.ipynb")
    assert paused["paused_process_token"] == running["process_token"]

    # Then the process is gone, its image is in the store, owner-only, and on the timeline
    assert paused["state"] == "paused", paused
    assert "process image" in paused["message"], paused["message"]
    assert not os.path.exists(f"/proc/{pid}")
    assert kernel_id not in jp_serverapp.kernel_manager
    (images,) = pause_store.glob("live.ipynb-*/images/*")
    assert stat.S_IMODE(images.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) & 0o077 == 0 for f in images.iterdir())
    _, timeline = await server.call("GET", "timeline", "live.ipynb")
    (snapshot,) = [e["data"] for e in timeline["events"] if e["kind"] == "snapshot_taken"]
    assert snapshot["bytes"] > 10_000_000 and snapshot["pid"] == pid, snapshot

    # When it is resumed
    ready = await resume_and_wait(server, "live.ipynb")

    # Then it is the same process under the same kernel id, proven by its token
    assert ready["state"] == "ready" and ready["how"] == "live", ready
    assert ready["kernel_id"] == kernel_id and ready["restore"] is None
    assert ready["paused_process_token"] is None  # spent by this resume
    _, timeline = await server.call("GET", "timeline", "live.ipynb")
    (restored,) = [e["data"] for e in timeline["events"] if e["kind"] == "state_restored"]
    assert restored["how"] == "live" and restored["token_matched"] is True, restored
    # with the generator and the file where they were
    check = "print(next(counter), log.readline().strip(), os.getpid() == pid)"
    assert await server.run(kernel_id, check) == "1 second True\n"
    # answering the tab that stayed open through the pause, and a new one
    assert await tab.run("print(next(counter))") == "2\n"
    tab.close()
    new_tab = await NotebookTab.open(server_url, token, kernel_id)
    assert await new_tab.run("print(next(counter), os.getpid())") == f"3 {pid}\n"
    new_tab.close()
    # and the image, spent, is gone
    assert not images.exists()

    # jupyter-server knows the kernel again: its ports, its notebook session, its restart
    assert jp_serverapp.kernel_manager.get_kernel(kernel_id).ports == ports
    response = await server.fetch("api", "sessions")
    sessions = {s["path"]: s["kernel"]["id"] for s in json.loads(response.body)}
    assert sessions["live.ipynb"] == kernel_id
    # (a restart starts a new process: the restored one was the only one of its kind)
    await server.fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    assert await server.run(
        kernel_id, f"import os\nprint(os.getpid() != {pid}, 'counter' in dir())"
    ) == ("True False\n")


LOOP_CELL = """
import time
for i in range(25):
    print(i, flush=True)
    time.sleep(0.2)
print('done', sum(range(25)))
"""


async def test_a_cell_paused_mid_run_finishes_after_the_resume(
    server: Server, server_url: str, jp_serverapp: Any
) -> None:
    # Given a notebook with a checkpoint, open in a tab that runs a loop cell
    kernel_id = await server.open_notebook("loop.ipynb")
    await server.watched("loop.ipynb")
    tab = await NotebookTab.open(server_url, jp_serverapp.identity_provider.token, kernel_id)
    await tab.run("before = 'kept'")
    await server.call("POST", "checkpoint", "loop.ipynb")
    msg_id = tab.execute(LOOP_CELL)
    printed: list[str] = []
    # (lines, not messages: a loaded machine may send "2\n3\n" in one stream message)
    while "".join(printed).count("\n") < 4:
        msg = await tab.next_message(msg_id, 30)
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
    record = await server.wait_for("loop.ipynb", lambda r: r["busy"])
    cell = record["execution_count"]

    # When it is paused in the middle of the cell
    code, pausing = await server.call("POST", "pause", "loop.ipynb")

    # Then it pauses at once, with the checkpoint taken at a safe point as its fallback
    assert code == 202 and pausing["state"] == "pausing", pausing
    assert pausing["message"].startswith(f"Pausing during cell [{cell}]")
    assert "Checkpoint 1 from" in pausing["message"] and "safe point" in pausing["message"]
    paused = await server.wait_state("loop.ipynb", "paused", "active")
    assert paused["state"] == "paused" and paused["paused_during_cell"] == cell, paused
    assert paused["message"].startswith(f"Paused during cell [{cell}] since"), paused["message"]

    # When it is resumed
    ready = await resume_and_wait(server, "loop.ipynb")

    # Then the same cell runs on, and everything it prints reaches the tab, once, in order
    assert ready["how"] == "live" and ready["kernel_id"] == kernel_id, ready
    assert ready["message"] == f"Ready: live session restored; cell [{cell}] runs on."
    assert ready["paused_during_cell"] is None
    printed.append(await tab.output(msg_id, 60))
    expected = "".join(f"{i}\n" for i in range(25)) + f"done {sum(range(25))}\n"
    assert "".join(printed) == expected
    _, timeline = await server.call("GET", "timeline", "loop.ipynb")
    (restored,) = [e["data"] for e in timeline["events"] if e["kind"] == "state_restored"]
    assert restored["how"] == "live" and restored["during_cell"] == cell, restored
    # and the server sees the kernel idle again, with what came before the pause
    await server.wait_for("loop.ipynb", lambda r: not r["busy"])
    assert await tab.run("print(before, i)") == "kept 24\n"
    tab.close()


async def test_a_damaged_image_falls_back_to_the_checkpoint_and_says_why(
    server: Server, jp_serverapp: Any, pause_store: Path
) -> None:
    # Given a kernel paused with its process image
    kernel_id = await server.open_notebook("damaged.ipynb")
    await server.run(kernel_id, "answer = 41 + 1")
    paused = await pause_and_wait(server, "damaged.ipynb")
    assert "process image" in paused["message"], paused
    (images,) = pause_store.glob("damaged.ipynb-*/images/*")
    # (the server's connections to the kernel wait behind criu's network lock meanwhile)
    lock = network_lock_table(images)
    assert lock is not None and f"table {lock}\n" in nft_tables()

    # When the image is damaged before the resume (its process tree unreadable)
    (images / "pstree.img").write_bytes(b"\0garbage")
    ready = await resume_and_wait(server, "damaged.ipynb")

    # Then the resume restores the checkpoint into a new kernel, and says why
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] != kernel_id
    assert "Its process image could not be restored (criu restore failed:" in ready["message"]
    assert "restored from checkpoint 1, the last one taken at a safe point" in ready["message"]
    assert await server.run(ready["kernel_id"], "print(answer)") == "42\n"
    _, timeline = await server.call("GET", "timeline", "damaged.ipynb")
    (restored,) = [e["data"] for e in timeline["events"] if e["kind"] == "state_restored"]
    assert restored["how"] == "files" and "could not be restored" in restored["why"], restored
    # and the useless image is gone, its network lock lifted
    assert not images.exists()
    assert f"table {lock}\n" not in nft_tables()


async def test_an_image_deleted_with_its_checkpoint_lifts_its_network_lock(
    server: Server, jp_root_dir: Path, pause_store: Path
) -> None:
    # Given a kernel paused with its process image (its connections behind criu's lock)
    kernel_id = await server.open_notebook("gone.ipynb")
    await server.run(kernel_id, "x = 1")
    await pause_and_wait(server, "gone.ipynb")
    (images,) = pause_store.glob("gone.ipynb-*/images/*")
    lock = network_lock_table(images)
    assert lock is not None and f"table {lock}\n" in nft_tables()

    # When its checkpoint is deleted (as retention and gc delete it)
    NotebookStore(pause_store, str(jp_root_dir / "gone.ipynb")).delete(int(images.name))

    # Then the image goes with it, and so does its network lock
    assert not images.exists()
    assert f"table {lock}\n" not in nft_tables()


async def test_other_kernels_writing_the_shared_history_do_not_stop_a_live_resume(
    server: Server,
) -> None:
    # Given two notebooks whose kernels share IPython's history file, one of them paused
    kernel_id = await server.open_notebook("quiet.ipynb")
    await server.watched("quiet.ipynb")
    await server.run(kernel_id, "import os\nkept = iter(range(3))\nnext(kept)")
    history = (await server.run(kernel_id, "print(get_ipython().history_manager.hist_file)"))[:-1]
    await pause_and_wait(server, "quiet.ipynb")

    # When the other kernel grows that file while the first is away (criu restores no
    # process holding a file whose size changed)
    other = await server.open_notebook("busy.ipynb")
    size = os.path.getsize(history)
    await server.run(other, "padding = '" + "x" * 300_000 + "'")
    await until(lambda: os.path.getsize(history) > size)
    await server.watched("busy.ipynb")
    await pause_and_wait(server, "busy.ipynb")  # (its GPU back for the resume)

    # Then the paused kernel still comes back live, and writes its history again
    ready = await resume_and_wait(server, "quiet.ipynb")
    assert ready["how"] == "live" and ready["kernel_id"] == kernel_id, ready
    assert await server.run(kernel_id, "marker_after_resume = next(kept)") == ""
    await until(lambda: history_has(history, "marker_after_resume = next(kept)"))


async def until(check: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def history_has(history: str, source: str) -> bool:
    with contextlib.closing(sqlite3.connect(history)) as db:
        return bool(db.execute("SELECT 1 FROM history WHERE source = ?", (source,)).fetchone())


def nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


async def test_a_paused_process_comes_back_after_the_server_extension_restarts(
    server: Server,
) -> None:
    # Given a kernel paused with its process image, holding a generator mid-iteration
    kernel_id = await server.open_notebook("restart.ipynb")
    await server.watched("restart.ipynb")
    await server.run(kernel_id, "numbers = iter(range(5))\nnext(numbers)")
    await pause_and_wait(server, "restart.ipynb")

    # When the extension restarts (its memory gone; the store, and the image in it, remain)
    await server.restart_extension()
    _, record = await server.call("GET", "sessions", "restart.ipynb")
    assert record["state"] == "paused"
    ready = await resume_and_wait(server, "restart.ipynb")

    # Then the very process comes back, proven by the token recorded at the pause
    assert ready["how"] == "live" and ready["kernel_id"] == kernel_id, ready
    assert await server.run(kernel_id, "print(next(numbers))") == "1\n"


MAPPED_AT = """
import numpy as np
with open("/proc/self/maps") as maps:
    for line in maps:
        start, end = (int(a, 16) for a in line.split()[0].split("-"))
        if start <= big.ctypes.data < end:
            print(line.split(maxsplit=5)[-1].strip())
"""


@pytest.mark.parametrize("jp_server_config", [{"keep_last": 1}], indirect=True)
async def test_a_lazily_restored_kernel_pauses_live_with_its_maps_even_of_deleted_files(
    server: Server, pause_store: Path
) -> None:
    # Given a kernel restored from files (its image damaged), lazily: its 64 MiB array a
    # copy-on-write map of the checkpoint's data file
    kernel_id = await server.open_notebook("maps.ipynb")
    await server.run(kernel_id, "import numpy as np\nbig = np.arange(8 * 2**20, dtype=np.float64)")
    await pause_and_wait(server, "maps.ipynb")
    (images,) = pause_store.glob("maps.ipynb-*/images/*")
    (images / "pstree.img").write_bytes(b"\0garbage")
    ready = await resume_and_wait(server, "maps.ipynb")
    assert ready["how"] == "files" and ready["restore"]["loading_bytes"] > 0, ready
    kernel_id = ready["kernel_id"]
    await server.wait_for("maps.ipynb", lambda r: "still loading" not in r["message"])
    mapped = (await server.run(kernel_id, MAPPED_AT)).strip()
    assert mapped.startswith(str(pause_store)) and not mapped.endswith("(deleted)"), mapped
    # and then changed, checkpointed, and its first checkpoint gone by retention (keep_last
    # 1): the map now of a deleted file
    await server.run(kernel_id, "big[:4] = -1.0\n%checkpoint")
    assert (await server.run(kernel_id, MAPPED_AT)).strip() == f"{mapped} (deleted)"

    # When it is paused live, and resumed
    paused = await pause_and_wait(server, "maps.ipynb")
    assert paused["state"] == "paused" and "process image" in paused["message"], paused
    ready = await resume_and_wait(server, "maps.ipynb")

    # Then it is the same process, its array as it was: the changed pages and the others
    assert ready["state"] == "ready" and ready["how"] == "live", ready
    check = "print(big[:5].tolist(), int(big[4:].sum()) == sum(range(4, 8 * 2**20)))"
    assert await server.run(kernel_id, check) == "[-1.0, -1.0, -1.0, -1.0, 4.0] True\n"
