"""Every way a user comes back to a paused notebook, end to end through the REST API.

Each test pauses a real kernel that holds data, comes back the way a user does (opens the
notebook again, waits, restarts the kernel, restarts the server, types ``%checkpoint
restore``, ...), and checks two things: the data is back in the kernel the notebook uses, and
the session says truthfully how (``how``: "live" only for the very process that paused; on
this backend a paused kernel's process ends, so every way back here is "files").

While a test waits it polls the session the way the notebook's chip does (every second): the
server talks to a kernel it sees for the first time during such a poll, which is what once
made a reopened notebook's empty kernel pass for the paused one.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import uuid
from typing import Any

import pytest

from jupyter_pause.usage.sources import read_store

from .servers import Server, pause_and_wait, pause_server_config

NOTEBOOK = "work.ipynb"


@pytest.fixture
def jp_server_config(pause_store: Any) -> dict:
    """Retention as tight as it goes (only the newest checkpoint is kept by policy): what a
    way back keeps, it keeps because it must."""
    return pause_server_config(pause_store, keep_last=1)


async def poll_like_the_chip(server: Server, path: str, seconds: float) -> dict[str, Any]:
    """Ask for the session every 0.1 s for ``seconds``, as open tabs do; the last answer."""
    _, record = await server.call("GET", "sessions", path)
    for _ in range(round(seconds * 10)):
        await asyncio.sleep(0.1)
        _, record = await server.call("GET", "sessions", path)
    return record


async def a_paused_notebook(server: Server, path: str = NOTEBOOK) -> dict[str, Any]:
    """A notebook whose kernel held ``weights`` and ``note``, paused; its record."""
    kernel_id = await server.open_notebook(path)
    await server.run(kernel_id, "weights = list(range(5))\nnote = 'before the pause'")
    running = await server.wait_for(path, lambda r: r["process_token"])
    paused = await pause_and_wait(server, path)
    assert paused["state"] == "paused", paused
    # The token recorded at the pause is the paused kernel's own.
    assert paused["paused_process_token"] == running["process_token"]
    assert paused["paused_checkpoint_id"] == paused["checkpoint"]["id"]
    return paused


async def reopen(server: Server, path: str = NOTEBOOK) -> str:
    """Open the paused notebook again, as JupyterLab does (a fresh kernel): its id, once
    the server watches it and knows it holds none of the saved state."""
    fresh = await server.open_notebook(path)
    await server.wait_for(path, lambda r: r["watching"] and r["unrestored_kernel"])
    return fresh


async def a_reopened_paused_notebook(server: Server, path: str = NOTEBOOK) -> str:
    """A paused notebook (``a_paused_notebook``), opened again: the fresh kernel's id."""
    await a_paused_notebook(server, path)
    return await reopen(server, path)


async def resume_and_wait(server: Server, path: str = NOTEBOOK) -> dict[str, Any]:
    code, _ = await server.call("POST", "resume", path)
    assert code == 202
    return await server.wait_state(path, "ready", "partial", "failed")


async def assert_data_back(server: Server, kernel_id: str) -> None:
    out = await server.run(kernel_id, "print(sum(weights), note)")
    assert out == "10 before the pause\n"


async def restored_events(server: Server, path: str = NOTEBOOK) -> list[dict[str, Any]]:
    _, timeline = await server.call("GET", "timeline", path)
    return [e["data"] for e in timeline["events"] if e["kind"] == "state_restored"]


@pytest.mark.parametrize("wait", [0, 3])
async def test_reopened_then_resumed_restores_from_files_into_the_new_kernel(
    server: Server, wait: int
) -> None:
    # Given a paused notebook, opened again: JupyterLab starts a fresh kernel for it
    paused = await a_paused_notebook(server)
    fresh = await server.open_notebook(NOTEBOOK)

    # When the user looks at it for a while (the chip polls), then presses Resume
    record = await poll_like_the_chip(server, NOTEBOOK, wait)
    await server.wait_for(
        NOTEBOOK, lambda r: r["process_token"] not in (None, paused["process_token"])
    )

    # Then it stays paused meanwhile, offering to restore what the checkpoint holds
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "paused" and record["unrestored_kernel"], record
    assert record["kernel_id"] == fresh
    assert record["checkpoint"]["variables"] == ["note", "weights"]
    assert "Resume restores note, weights (2 variables" in record["message"]
    # and the resume restores the checkpoint into that kernel, from files, never "live"
    ready = await resume_and_wait(server)
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] == fresh and not ready["unrestored_kernel"]
    assert ready["paused_process_token"] is None  # the session runs again
    await assert_data_back(server, fresh)
    (event,) = await restored_events(server)
    assert event["how"] == "files" and "token_matched" not in event
    assert server.app.kernel_manager.list_kernel_ids() == [fresh]


def stored_notebooks(server: Server) -> list[str]:
    """The notebooks the store keeps a session.json for (what the usage report lists)."""
    return [entry["path"] for entry in read_store(server.orchestrator.sessions.store_root)]


async def open_like_jupyterlab(server: Server, path: str = NOTEBOOK) -> str:
    """Open a notebook the way JupyterLab 4's SessionContext does (@jupyterlab/apputils 4.7.6,
    lib/sessioncontext.js, ``_startSession``, the version the galata tests run): the session
    starts under a placeholder path, ``<folder>/<uuid>``, and is moved to the notebook's path
    once its kernel runs. An open tab's chip asks in between, so the server sees the kernel
    under the placeholder first. The real JupyterLab does this in the galata ways-back tests,
    where it first showed. Returns the kernel's id."""
    placeholder = posixpath.join(posixpath.dirname(path), str(uuid.uuid4()))
    body = {"path": placeholder, "name": "", "type": "notebook", "kernel": {"name": "python3"}}
    response = await server.fetch("api", "sessions", method="POST", body=json.dumps(body))
    session = json.loads(response.body)
    seen = await server.wait_for(placeholder, lambda r: r["kernel_id"] == session["kernel"]["id"])
    assert seen["state"] == "active", seen
    await server.fetch(
        "api", "sessions", session["id"], method="PATCH", body=json.dumps({"path": path})
    )
    return session["kernel"]["id"]


async def test_reopened_through_a_placeholder_path_as_jupyterlab_does_stays_paused(
    server: Server,
) -> None:
    # Given a paused notebook
    paused = await a_paused_notebook(server)

    # When JupyterLab opens it again: a session under a placeholder path first, then moved
    fresh = await open_like_jupyterlab(server)

    # Then the notebook's own record takes the new kernel: still paused, offering its
    # checkpoint (never "Active", which once dropped the pause), and the placeholder is gone
    record = await server.wait_for(NOTEBOOK, lambda r: r["kernel_id"] == fresh)
    assert record["state"] == "paused" and record["unrestored_kernel"], record
    assert record["checkpoint"]["id"] == paused["checkpoint"]["id"]
    assert "Resume restores note, weights (2 variables" in record["message"]
    listed = [r["path"] for r in (await server.call("GET", "sessions"))[1]["sessions"]]
    assert listed == [NOTEBOOK], listed
    await server.orchestrator.sessions.writer.flush()
    assert stored_notebooks(server) == [NOTEBOOK]  # the usage report lists no phantom either
    # and Resume restores the checkpoint into that kernel
    ready = await resume_and_wait(server)
    assert ready["how"] == "files" and ready["kernel_id"] == fresh, ready
    await assert_data_back(server, fresh)


async def test_a_new_notebook_opened_through_a_placeholder_path_is_active_under_its_name(
    server: Server,
) -> None:
    # Given a notebook never paused, opened as JupyterLab does
    fresh = await open_like_jupyterlab(server)

    # Then its session is followed under the notebook's own path, its kernel watched
    record = await server.wait_for(NOTEBOOK, lambda r: r["watching"])
    assert record["state"] == "active" and record["kernel_id"] == fresh, record
    listed = [r["path"] for r in (await server.call("GET", "sessions"))[1]["sessions"]]
    assert listed == [NOTEBOOK], listed
    await server.orchestrator.sessions.writer.flush()
    assert stored_notebooks(server) == [NOTEBOOK]


async def test_a_new_tab_after_the_browser_closed_resumes_before_or_after_its_kernel(
    server: Server,
) -> None:
    # Given a notebook paused, and the browser closed (nothing of it is left on the server)
    await a_paused_notebook(server)
    await poll_like_the_chip(server, NOTEBOOK, 1.5)

    # When a new tab asks first (no kernel yet) and resumes
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "paused" and record["kernel_id"] is None
    assert not record["unrestored_kernel"]
    ready = await resume_and_wait(server)

    # Then the server started a kernel and restored into it; the tab's own session
    # request (JupyterLab's, for the notebook's path) finds that same kernel
    assert ready["how"] == "files", ready
    opened = await server.open_notebook(NOTEBOOK)
    assert opened == ready["kernel_id"]
    await assert_data_back(server, opened)


async def test_two_tabs_pressing_resume_on_a_reopened_notebook_make_one_restore(
    server: Server,
) -> None:
    # Given a paused notebook open in two tabs (one session, one fresh kernel)
    await a_paused_notebook(server)
    fresh = await server.open_notebook(NOTEBOOK)
    assert await server.open_notebook(NOTEBOOK) == fresh
    await poll_like_the_chip(server, NOTEBOOK, 1.5)

    # When both press Resume at the same moment
    answers = await asyncio.gather(
        server.call("POST", "resume", NOTEBOOK), server.call("POST", "resume", NOTEBOOK)
    )

    # Then one restore runs, from files, into the one kernel
    assert [code for code, _ in answers] == [202, 202]
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed")
    assert ready["how"] == "files" and ready["kernel_id"] == fresh, ready
    assert len(await restored_events(server)) == 1
    await assert_data_back(server, fresh)


async def test_after_a_server_restart_a_reopened_notebook_is_restored_from_files(
    server: Server,
) -> None:
    # Given a notebook paused, then the server restarted (its memory gone, the store kept)
    paused = await a_paused_notebook(server)
    await server.restart_extension()
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "paused"
    assert record["paused_process_token"] == paused["paused_process_token"]  # kept on disk

    # When the notebook is opened again and resumed after a while
    fresh = await server.open_notebook(NOTEBOOK)
    await poll_like_the_chip(server, NOTEBOOK, 2)
    ready = await resume_and_wait(server)

    # Then from files, into the new kernel
    assert ready["how"] == "files" and ready["kernel_id"] == fresh, ready
    await assert_data_back(server, fresh)


async def test_restart_kernel_on_a_paused_notebook_then_resume(server: Server) -> None:
    # Given a paused notebook opened again, whose new kernel the user then restarts
    await a_paused_notebook(server)
    fresh = await server.open_notebook(NOTEBOOK)
    await server.wait_for(NOTEBOOK, lambda r: r["watching"] and r["process_token"])
    await server.fetch("api", "kernels", fresh, "restart", method="POST", body="{}")
    record = await poll_like_the_chip(server, NOTEBOOK, 2)
    assert record["state"] == "paused" and record["unrestored_kernel"], record

    # When the user resumes
    ready = await resume_and_wait(server)

    # Then the restarted kernel (same id, new process) gets the state, from files
    assert ready["how"] == "files" and ready["kernel_id"] == fresh, ready
    await assert_data_back(server, fresh)


async def test_a_pause_of_a_kernel_two_notebooks_share_comes_back_for_both(
    server: Server,
) -> None:
    # Given a second notebook using the first one's kernel ("use the kernel of another
    # session" in JupyterLab)
    kernel_id = await server.open_notebook("first.ipynb")
    body = {"path": "second.ipynb", "type": "notebook", "kernel": {"id": kernel_id}}
    await server.fetch("api", "sessions", method="POST", body=json.dumps(body))
    await server.run(kernel_id, "weights = list(range(5))\nnote = 'before the pause'")
    _, shared = await server.call("GET", "sessions", "second.ipynb")
    assert shared["path"] == "first.ipynb" and shared["sharing_notebooks"] == ["second.ipynb"]
    _, listing = await server.call("GET", "sessions")
    assert [r["path"] for r in listing["sessions"]] == ["first.ipynb"]  # not taken for a rename

    # When it is paused from the second notebook, and resumed from the first after a while
    code, _ = await server.call("POST", "pause", "second.ipynb")
    assert code == 202
    await server.wait_state("first.ipynb", "paused")
    await poll_like_the_chip(server, "second.ipynb", 1.5)
    _, second = await server.call("GET", "sessions", "second.ipynb")
    assert second["state"] == "paused" and second["path"] == "first.ipynb"
    ready = await resume_and_wait(server, "first.ipynb")

    # Then both notebooks have the resumed kernel again, with the data, from files
    assert ready["how"] == "files", ready
    sessions = {
        s["path"]: s["kernel"]["id"] for s in await server.app.session_manager.list_sessions()
    }
    assert sessions == {"first.ipynb": ready["kernel_id"], "second.ipynb": ready["kernel_id"]}
    await assert_data_back(server, ready["kernel_id"])


async def test_checkpoint_restore_typed_into_the_reopened_notebook_resumes_it(
    server: Server,
) -> None:
    # Given a paused notebook opened again
    fresh = await a_reopened_paused_notebook(server)

    # When the user types %checkpoint restore instead of pressing Resume
    out = await server.run(fresh, "%checkpoint restore")
    assert out.startswith("Restored checkpoint 1: 2 variables (note, weights)")

    # Then the session is back, from files, and the timeline says who restored it
    ready = await server.wait_state(NOTEBOOK, "ready", "partial", "failed")
    assert ready["how"] == "files" and not ready["unrestored_kernel"], ready
    (event,) = await restored_events(server)
    assert event["by"] == "notebook" and event["restored"] == ["note", "weights"]
    await assert_data_back(server, fresh)


async def test_restoring_some_variables_by_name_in_the_reopened_notebook_is_partial(
    server: Server,
) -> None:
    # Given a paused notebook opened again
    fresh = await a_reopened_paused_notebook(server)

    # When only one variable is restored by name
    await server.run(fresh, "%checkpoint restore 1 weights")

    # Then the session runs again but says what it left out, and keeps the checkpoint
    partial = await server.wait_state(NOTEBOOK, "ready", "partial", "failed")
    assert partial["state"] == "partial", partial
    assert "note" in partial["hold"]["checkpoints"]["1"]["failed"]
    assert "not asked for" in partial["hold"]["checkpoints"]["1"]["failed"]["note"]


async def test_cells_run_in_the_reopened_kernel_are_kept_and_a_replaced_name_is_said(
    server: Server,
) -> None:
    # Given a paused notebook opened again, where the user defines variables before resuming
    fresh = await a_reopened_paused_notebook(server)
    await server.run(fresh, "scratch = 'mine'\nnote = 'typed after reopening'")

    # When they resume
    ready = await resume_and_wait(server)

    # Then their own variable is still there, and the name the checkpoint also holds was
    # replaced by the restore, which says so
    assert ready["how"] == "files" and ready["restore"]["replaced"] == ["note"], ready
    assert await server.run(fresh, "print(scratch)") == "mine\n"
    await assert_data_back(server, fresh)


async def test_an_empty_kernel_never_pushes_the_last_complete_checkpoint_out(
    server: Server,
) -> None:
    # Given a paused notebook (checkpoint 1 holds its state), opened again, whose empty
    # new kernel the user checkpoints twice before resuming
    fresh = await a_reopened_paused_notebook(server)
    out = await server.run(fresh, "%checkpoint")
    await server.run(fresh, "%checkpoint")

    # Then the first says what it lacks; both are kept beside checkpoint 1
    assert "Checkpoint 2: 0 variables saved" in out
    assert "checkpoint 2 lacks 2 of the 2 variables of checkpoint 1 (note, weights)" in out
    _, listing = await server.call("GET", "checkpoints", NOTEBOOK)
    assert [c["id"] for c in listing["checkpoints"]] == [1, 2, 3]
    assert listing["checkpoints"][1]["shrunk_from"] == {"id": 1, "missing": ["note", "weights"]}
    assert "shrunk_from" not in listing["checkpoints"][2]  # it lacks nothing of checkpoint 2
    assert listing["hold"]["checkpoints"]["1"]["kind"] == "shrunk"
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "paused" and record["checkpoint"]["id"] == 1  # what resume restores

    # When the user resumes: the pause's checkpoint comes back, not the newest (empty) one
    ready = await resume_and_wait(server)
    assert ready["state"] == "ready" and ready["restore"]["checkpoint_id"] == 1, ready
    await assert_data_back(server, fresh)

    # And the next checkpoint, complete again, ends the hold; retention applies again
    code, _ = await server.call("POST", "checkpoint", NOTEBOOK)
    assert code == 200
    _, listing = await server.call("GET", "checkpoints", NOTEBOOK)
    assert listing["hold"] is None and [c["id"] for c in listing["checkpoints"]] == [4]


async def test_a_reopened_kernel_nobody_resumes_is_stopped_when_idle_and_the_pause_stands(
    server: Server,
) -> None:
    # Given a paused notebook opened again, whose new kernel the user ran a cell in and then
    # left (it would hold its GPU all night)
    paused = await a_paused_notebook(server)
    fresh = await reopen(server)
    await server.run(fresh, "scratch = 'typed after reopening'")
    await server.wait_for(NOTEBOOK, lambda r: r["execution_count"] and not r["busy"])
    _, status = await server.call("GET", "status")
    assert status["resources"]["gpus_free"] == 0  # the new kernel took the GPU

    # When the idle policy runs
    server.orchestrator.policy.idle_pause_minutes = 0.0005
    await asyncio.sleep(0.1)
    await server.orchestrator.check_idle()

    # Then that kernel is stopped and its GPU back; the pause stands as it was
    _, record = await server.call("GET", "sessions", NOTEBOOK)
    assert record["state"] == "paused" and record["kernel_id"] is None, record
    assert not record["unrestored_kernel"]
    assert record["paused_process_token"] == paused["paused_process_token"]
    assert "opened without the saved state was idle" in record["message"]
    assert fresh not in server.app.kernel_manager
    _, status = await server.call("GET", "status")
    assert status["resources"]["gpus_free"] == 1
    # what the user made in it was saved first (beside the pause's checkpoint, kept)
    _, listing = await server.call("GET", "checkpoints", NOTEBOOK)
    assert [c["variables"] for c in listing["checkpoints"]] == [["note", "weights"], ["scratch"]]

    # And a resume still restores the pause's checkpoint
    server.orchestrator.policy.idle_pause_minutes = 0.0
    ready = await resume_and_wait(server)
    assert ready["how"] == "files" and ready["restore"]["checkpoint_id"] == 1, ready
    await assert_data_back(server, ready["kernel_id"])
