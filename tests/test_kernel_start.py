"""Kernels a jupyter_pause server starts have the magics from their first cell; reading the
extension's state never counts as the user's activity."""

from __future__ import annotations

import asyncio
import json

import pytest

from jupyter_pause.server.kernel_bridge import ACTIVITY_SETTLE_SECONDS

from .kernels import KernelFactory
from .servers import Server


async def test_a_kernel_started_by_any_client_has_the_magics_in_its_first_cell(
    server: Server,
) -> None:
    # Given a kernel started through the sessions API (as JupyterLab or nbclient would) and
    # one started through the bare kernels API (as a remote client would)
    session_kernel = await server.open_notebook("first-cell.ipynb")
    response = await server.fetch("api", "kernels", method="POST", body=json.dumps({}))
    bare_kernel = json.loads(response.body)["id"]

    # When their very first cell uses the magics, before the server ever talked to them
    first = await server.run(session_kernel, "%checkpoint marked")
    bare = await server.run(
        bare_kernel,
        "%checkpoint\nshell = get_ipython()\n"
        "print(callable(shell.find_line_magic('pause')),"
        " 'jupyter_pause' in shell.extension_manager.loaded)",
    )

    # Then both magics are there, loaded by the kernel's startup (the server's first call
    # would load them without the extension manager knowing)
    assert "Nothing marked: every variable is saved." in first
    assert "Checkpoint 1:" in bare and bare.strip().endswith("True True")


def test_a_kernel_of_another_server_is_left_alone(start_kernel: KernelFactory) -> None:
    # A kernel not launched by a jupyter_pause server runs the same startup file, which does nothing
    kernel = start_kernel()
    out = kernel.run("%checkpoint")
    assert out.stderr == "UsageError: Line magic function `%checkpoint` not found.\n"


async def _last_activity(server: Server) -> str:
    response = await server.fetch("api", "status", method="GET")
    return json.loads(response.body)["last_activity"]


async def _settled(server: Server, path: str) -> None:
    """Wait until the kernel is idle and the server's own startup requests to it (the process
    token) have been answered and their activity taken back (``ACTIVITY_SETTLE_SECONDS``)."""
    await server.wait_for(path, lambda r: r["watching"] and r["process_token"] and not r["busy"])
    await asyncio.sleep(ACTIVITY_SETTLE_SECONDS + 0.3)


async def test_reading_state_is_not_activity_but_work_is(server: Server) -> None:
    # Given a notebook with a kernel, and the time of the last activity the server reports
    kernel_id = await server.open_notebook("idle.ipynb")
    await _settled(server, "idle.ipynb")
    before = await _last_activity(server)

    # When an open tab polls every read-only endpoint, again and again
    for _ in range(3):
        for parts in (
            ("status",),
            ("sessions",),
            ("sessions", "idle.ipynb"),
            ("checkpoints", "idle.ipynb"),
            ("timeline", "idle.ipynb"),
        ):
            await server.call("GET", *parts)
        await asyncio.sleep(0.02)

    # Then the server's last activity has not moved
    assert await _last_activity(server) == before

    # But an edit reported by the frontend, and a cell run, are activity: for the server, and
    # for the idle clock of the notebook's session that auto-pause reads
    session_before = (await server.call("GET", "sessions", "idle.ipynb"))[1]["last_activity"]
    await server.call("POST", "activity", "idle.ipynb")
    after_edit = await _last_activity(server)
    assert after_edit > before
    session_after = (await server.call("GET", "sessions", "idle.ipynb"))[1]["last_activity"]
    assert session_after > session_before
    await asyncio.sleep(0.05)
    await server.run(kernel_id, "x = 1")
    assert await _last_activity(server) > after_edit


async def test_the_servers_own_kernel_requests_are_not_activity(server: Server) -> None:
    # Given an idle notebook the server watches, and jupyter-server's idea of its last activity
    kernel_id = await server.open_notebook("quiet.ipynb")
    await _settled(server, "quiet.ipynb")
    await server.run(kernel_id, "data = list(range(1000))")
    await _settled(server, "quiet.ipynb")
    before = await _last_activity(server)
    kernel = server.app.kernel_manager.get_kernel(kernel_id)
    kernel_before = kernel.last_activity

    # When the server itself checkpoints the idle kernel (before jupyter-server's culler would)
    server.orchestrator.cull_idle_seconds = 1000.0
    record = server.orchestrator.records["quiet.ipynb"]
    quiet_since = max(record.activity.last_activity, record.started)
    await server.orchestrator.check_idle(now=quiet_since + 900)
    _, listing = await server.call("GET", "checkpoints", "quiet.ipynb")
    assert [c["reason"] for c in listing["checkpoints"]] == ["before-cull"]
    await asyncio.sleep(ACTIVITY_SETTLE_SECONDS + 0.5)

    # Then neither the kernel's nor the server's last activity moved: cullers still see it idle
    assert kernel.last_activity == kernel_before
    assert await _last_activity(server) == before

    # But the user's next cell is activity
    await server.run(kernel_id, "data.append(1)")
    assert kernel.last_activity > kernel_before


async def _activity_clocks(server: Server, kernel_ids: list[str]) -> tuple[str, ...]:
    """What cullers read: the server's last activity and each kernel's (jupyter-server's own
    ``/api/kernels`` answer, asked without counting as activity itself)."""
    clocks = [await _last_activity(server)]
    for kernel_id in kernel_ids:
        response = await server.fetch("api", "kernels", kernel_id, params={"no_track_activity": 1})
        clocks.append(json.loads(response.body)["last_activity"])
    return tuple(clocks)


@pytest.mark.parametrize("jp_server_config", [{"monitor_interval_seconds": 0.2}], indirect=True)
async def test_nothing_the_extension_does_by_itself_moves_any_activity_a_culler_reads(
    server: Server,
) -> None:
    # Given a server whose monitor looks at its notebooks every 0.2 s, two idle notebooks, one
    # with a checkpoint schedule, and the clocks every culler reads
    await server.start_extension()
    kernels = [await server.open_notebook(path) for path in ("a.ipynb", "b.ipynb")]
    await server.run(kernels[0], "weights = list(range(1000))\n%checkpoint every 1s")
    await server.run(kernels[1], "notes = 'idle'")
    for path in ("a.ipynb", "b.ipynb"):
        await _settled(server, path)
    before = await _activity_clocks(server, kernels)

    # When the server works by itself for many monitor intervals: it checkpoints both idle
    # kernels before jupyter-server's culler would (at 80 % of its timeout), reads their state,
    # asks each kernel who it is on its control channel, and a tab polls every read endpoint
    server.orchestrator.cull_idle_seconds = 2.0
    bridge = server.orchestrator.bridge
    seen = set()
    deadline = asyncio.get_running_loop().time() + 6.0
    while asyncio.get_running_loop().time() < deadline:
        for parts in (("sessions",), ("checkpoints", "a.ipynb"), ("timeline", "b.ipynb")):
            await server.call("GET", *parts)
        await bridge.control(kernels[1], "identify")
        seen.add(await _activity_clocks(server, kernels))
        await asyncio.sleep(0.1)
    for path in ("a.ipynb", "b.ipynb"):
        _, listing = await server.call("GET", "checkpoints", path)
        assert "before-cull" in [c["reason"] for c in listing["checkpoints"]], listing

    # Then no culler's clock moved, not even for a moment (sampled every 0.1 s)
    assert seen == {before}, (before, seen)

    # But the user's next cell moves the server's clock and that kernel's, and only its
    await server.run(kernels[1], "notes += '!'")
    after = await _activity_clocks(server, kernels)
    assert after[0] > before[0] and after[2] > before[2] and after[1] == before[1]


@pytest.mark.parametrize("jp_server_config", [{"load_in_kernels": False}], indirect=True)
async def test_a_kernel_without_the_extension_is_asked_the_old_way_once_then_quietly(
    server: Server,
) -> None:
    # Given a kernel that did not load jupyter_pause at its start (the admin turned it off)
    kernel_id = await server.open_notebook("late.ipynb")
    await server.run(kernel_id, "x = 1")
    bridge = server.orchestrator.bridge
    undefined = await server.run(
        kernel_id, "print(callable(get_ipython().find_line_magic('checkpoint')))"
    )
    assert undefined.strip() == "False"

    # When the server asks it something: the first request loads the extension (a silent
    # execute request, the only way into a kernel without it)
    first = await bridge.call(kernel_id, "hello", timeout=60)
    assert first["ok"]
    loaded = await server.run(
        kernel_id, "print(callable(get_ipython().find_line_magic('checkpoint')))"
    )
    assert loaded.strip() == "True"
    await _settled(server, "late.ipynb")
    kernel = server.app.kernel_manager.get_kernel(kernel_id)
    quiet = kernel.last_activity

    # Then the next requests take the kernel's own handler: not activity, at no moment
    for _ in range(3):
        answer = await bridge.call(kernel_id, "hello", timeout=60)
        assert answer["ok"] and answer["token"] == first["token"]
        await asyncio.sleep(0.2)
        assert kernel.last_activity == quiet
