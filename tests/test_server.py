"""Pause, checkpoint and resume through the REST API of a real jupyter-server with real kernels."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_pause.backends.base import SessionSpec, StopOutcome
from jupyter_pause.backends.local import LocalBackend

from .servers import Server, pause_and_wait

MODEL_CELL = """
import numpy as np, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
data = torch.randn(32, 8)
table = np.arange(12.0).reshape(3, 4)
loss = model(data).pow(2).mean(); loss.backward(); optimizer.step()
"""


async def test_pause_then_resume_restores_the_model_from_files(server: Server) -> None:
    pytest.importorskip("torch")  # the only test here that needs it: a model on the kernel
    # Given a notebook whose kernel holds a trained model and data
    kernel_id = await server.open_notebook("exp/train.ipynb")
    # (The active time counted below is what the server sees: cells run before it watches the
    # kernel are not seen, on a loaded machine all of them.)
    await server.watched("exp/train.ipynb")
    await server.run(kernel_id, MODEL_CELL)
    expected = await server.run(kernel_id, "print(model(data).sum().item(), table.sum())")

    # When the researcher pauses it
    paused = await pause_and_wait(server, "exp/train.ipynb")

    # Then the kernel process is gone and the state says what was saved
    assert paused["state"] == "paused", paused
    assert paused["message"].startswith("Paused since ") and " saved)" in paused["message"]
    assert paused["kernel_id"] is None and kernel_id not in server.app.kernel_manager
    assert paused["checkpoint"]["id"] == 1 and paused["checkpoint"]["bytes"] > 0

    # When they resume it
    code, record = await server.call("POST", "resume", "exp/train.ipynb")
    assert code == 202 and record["state"] in ("resuming", "restoring")
    ready = await server.wait_state("exp/train.ipynb", "ready", "failed")

    # Then a new kernel has the same model and data, rebuilt from the application checkpoint
    assert ready["state"] == "ready", ready
    assert ready["how"] == "files"
    assert {"model", "optimizer", "data", "table"} <= set(ready["restore"]["restored"])
    assert ready["message"].startswith("Ready: restored from files (")
    assert ready["kernel_id"] != kernel_id
    assert (
        await server.run(ready["kernel_id"], "print(model(data).sum().item(), table.sum())")
        == expected
    )

    # And the timeline accounts for every step, the next cell included
    _, timeline = await server.call("GET", "timeline", "exp/train.ipynb")
    kinds = [e["kind"] for e in timeline["events"]]
    for kind in (
        "gpu_acquired",
        "last_activity",
        "pause_requested",
        "checkpoint_written",
        "kernel_stopped",
        "gpu_released",
        "resume_requested",
        "resources_acquired",
        "state_restored",
        "kernel_ready",
        "first_cell_executed",
    ):
        assert kind in kinds, kinds
    assert (
        kinds.index("pause_requested")
        < kinds.index("kernel_stopped")
        < kinds.index("resume_requested")
        < kinds.index("kernel_ready")
        < kinds.index("first_cell_executed")
    )
    accounting = timeline["accounting"]
    assert accounting["pauses"] == 1 and accounting["resumes"] == 1 and accounting["gpus"] == 1
    assert accounting["gpu_seconds_released"] > 0
    assert accounting["gpu_seconds_allocated"] > accounting["gpu_seconds_active"] > 0
    assert (
        0
        < accounting["last_resume_to_ready_seconds"]
        <= accounting["last_resume_to_next_cell_seconds"]
    )
    assert accounting["bytes_saved"] == paused["checkpoint"]["bytes"]


async def test_twenty_concurrent_resumes_make_one_restore(server: Server) -> None:
    kernel_id = await server.open_notebook("shared.ipynb")
    await server.run(kernel_id, "value = 41 + 1")
    await pause_and_wait(server, "shared.ipynb")

    answers = await asyncio.gather(
        *(server.call("POST", "resume", "shared.ipynb") for _ in range(20))
    )
    assert {code for code, _ in answers} == {202}
    ready = await server.wait_state("shared.ipynb", "ready", "failed")
    assert ready["state"] == "ready"

    _, timeline = await server.call("GET", "timeline", "shared.ipynb")
    kinds = [e["kind"] for e in timeline["events"]]
    assert kinds.count("resume_requested") == 1 and kinds.count("state_restored") == 1
    sessions = json.loads((await server.fetch("api", "sessions")).body)
    assert [s["path"] for s in sessions] == ["shared.ipynb"]
    assert len(server.app.kernel_manager.list_kernel_ids()) == 1
    assert await server.run(ready["kernel_id"], "print(value)") == "42\n"
    # a late retry gets the finished session, not a second restore
    code, again = await server.call("POST", "resume", "shared.ipynb")
    assert code == 202 and again["state"] == "ready" and again["kernel_id"] == ready["kernel_id"]


async def test_resume_after_the_extension_restarts(server: Server) -> None:
    kernel_id = await server.open_notebook("restart.ipynb")
    await server.run(kernel_id, "kept = {'epoch': 7}")
    await pause_and_wait(server, "restart.ipynb")

    # The server's memory is gone; only the store on disk remains
    await server.restart_extension()

    _, record = await server.call("GET", "sessions", "restart.ipynb")
    assert record["state"] == "paused"
    await server.call("POST", "resume", "restart.ipynb")
    ready = await server.wait_state("restart.ipynb", "ready", "failed")
    assert ready["state"] == "ready"
    assert await server.run(ready["kernel_id"], "print(kept['epoch'])") == "7\n"


async def test_busy_kernel_is_not_paused_and_the_reason_is_given(server: Server) -> None:
    kernel_id = await server.open_notebook("busy.ipynb")
    await server.run(kernel_id, "import time")
    await server.watched("busy.ipynb")
    running = asyncio.create_task(server.run(kernel_id, "time.sleep(4)"))
    await server.wait_for("busy.ipynb", lambda r: r["busy"])

    code, message = await server.error("POST", "pause", "busy.ipynb")
    assert code == 409
    assert "kernel busy running cell [2] for 0 min" in message and "never interrupted" in message
    # nor by the idle policy, however short
    server.orchestrator.policy.idle_pause_minutes = 0.0001
    assert await server.orchestrator.check_idle() == []
    await running
    _, record = await server.call("GET", "sessions", "busy.ipynb")
    assert record["state"] == "active" and record["kernel_id"] == kernel_id


async def test_idle_sessions_are_paused_by_policy(server: Server) -> None:
    policy = server.orchestrator.policy
    policy.idle_pause_minutes = 0.0005  # 30 ms
    policy.kernelspec_overrides = {}
    kernel_id = await server.open_notebook("idle.ipynb")
    await server.watched("idle.ipynb")
    await server.run(kernel_id, "x = 1")
    # an open connection is not activity: only cells, busy kernels and edits are
    await asyncio.sleep(0.1)
    assert await server.orchestrator.check_idle() == ["idle.ipynb"]
    record = await server.wait_state("idle.ipynb", "paused")
    events = (await server.call("GET", "timeline", "idle.ipynb"))[1]["events"]
    assert [e["data"]["reason"] for e in events if e["kind"] == "pause_requested"] == [
        "idle for 0 min"
    ]
    assert record["checkpoint"]["id"] == 1

    # a kernelspec the admin exempts is never auto-paused
    policy.kernelspec_overrides = {"python3": {"auto_pause": False}}
    other = await server.open_notebook("cpu.ipynb")
    await server.watched("cpu.ipynb")
    await server.run(other, "y = 2")
    await asyncio.sleep(0.1)
    assert await server.orchestrator.check_idle() == []


async def test_pause_from_a_cell_with_no_browser(server: Server) -> None:
    kernel_id = await server.open_notebook("magic.ipynb")
    await server.run(kernel_id, "z = 3")
    await server.call("GET", "sessions", "magic.ipynb")  # the server introduces itself
    deadline = time.monotonic() + 30
    while "attached" not in await server.run(
        kernel_id,
        "import jupyter_pause.kernel.server_link as s\n"
        "print('attached' if s.SERVER_ATTACHED else 'not yet')",
    ):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    out = await server.run(kernel_id, "%pause")
    assert "Pause requested" in out
    record = await server.wait_state("magic.ipynb", "paused")
    assert record["checkpoint"]["id"] == 1
    events = (await server.call("GET", "timeline", "magic.ipynb"))[1]["events"]
    assert [e["data"]["reason"] for e in events if e["kind"] == "pause_requested"] == [
        "%pause in the notebook"
    ]


async def test_checkpoint_endpoint_and_checkpoint_list(server: Server) -> None:
    kernel_id = await server.open_notebook("ckpt.ipynb")
    await server.run(kernel_id, "import numpy as np\narr = np.ones(1000)")
    code, body = await server.call("POST", "checkpoint", "ckpt.ipynb")
    assert code == 200 and body["result"]["checkpoint_id"] == 1
    assert body["result"]["saved"] == ["arr"] and body["session"]["state"] == "active"
    assert body["session"]["message"] == "Running." and body["session"]["progress"] is None
    _, listing = await server.call("GET", "checkpoints", "ckpt.ipynb")
    assert [c["id"] for c in listing["checkpoints"]] == [1]
    assert listing["checkpoints"][0]["variables"] == ["arr"]
    assert await server.run(kernel_id, "print(arr.sum())") == "1000.0\n"  # still running


async def test_errors_are_clear_json(server: Server) -> None:
    assert await server.error("GET", "sessions", "nope.ipynb") == (
        404,
        "No session for 'nope.ipynb': open the notebook (start a kernel) or check the path",
    )
    code, message = await server.error("POST", "pause", "../../etc/passwd")
    assert code == 400 and "inside the server root" in message
    assert (await server.error("GET", "checkpoints", "nope.ipynb"))[0] == 404
    kernel_id = await server.open_notebook("err.ipynb")
    await server.run(kernel_id, "a = 1")
    # a resume of a running notebook joins it: never a second kernel
    code, record = await server.call("POST", "resume", "err.ipynb")
    assert code == 202 and record["kernel_id"] == kernel_id and record["state"] == "active"
    await pause_and_wait(server, "err.ipynb")
    code, message = await server.error("POST", "pause", "err.ipynb")
    assert (code, message) == (409, "err.ipynb is already paused")
    code, message = await server.error("POST", "checkpoint", "err.ipynb")
    assert code == 409 and "it is paused, not running" in message


@pytest.mark.parametrize(
    ("method", "parts"),
    [
        ("GET", ("status",)),
        ("GET", ("sessions",)),
        ("GET", ("sessions", "a.ipynb")),
        ("POST", ("pause", "a.ipynb")),
        ("POST", ("resume", "a.ipynb")),
        ("POST", ("checkpoint", "a.ipynb")),
        ("GET", ("checkpoints", "a.ipynb")),
        ("GET", ("timeline", "a.ipynb")),
        ("POST", ("gc",)),
        ("POST", ("activity", "a.ipynb")),
    ],
)
async def test_every_endpoint_refuses_unauthenticated_requests(
    jp_fetch: Any, method: str, parts: tuple[str, ...]
) -> None:
    kwargs: dict[str, Any] = {"method": method, "headers": {"Authorization": ""}}
    if method == "POST":
        kwargs["body"] = "{}"
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("jupyter-pause", *parts, **kwargs)
    assert info.value.code == 403


async def test_resume_waits_for_a_gpu_first_come_first_served(server: Server) -> None:
    # Given one GPU: notebook A ran and was paused; notebook B now holds the GPU
    a = await server.open_notebook("a.ipynb")
    await server.run(a, "who = 'a'")
    await pause_and_wait(server, "a.ipynb")
    b = await server.open_notebook("b.ipynb")
    await server.run(b, "who = 'b'")
    _, b_record = await server.call("GET", "sessions", "b.ipynb")
    assert b_record["gpus"] == [0]

    # When A resumes, it waits, and says why and where it stands
    await server.call("POST", "resume", "a.ipynb")
    waiting = await server.wait_state("a.ipynb", "waiting-for-resources")
    assert waiting["queue_position"] == 1
    assert "all 1 GPU(s) are in use (by b.ipynb)" in waiting["message"]
    _, timeline = await server.call("GET", "timeline", "a.ipynb")
    (queued,) = [e["data"] for e in timeline["events"] if e["kind"] == "waiting_for_resources"]
    assert queued["place"] == 1 and "in use (by b.ipynb)" in queued["reason"], queued
    _, status = await server.call("GET", "status")
    assert status["resources"]["queue"] == ["a.ipynb"] and status["resources"]["gpus_free"] == 0

    # Then pausing B hands the GPU to A
    await pause_and_wait(server, "b.ipynb")
    ready = await server.wait_state("a.ipynb", "ready", "failed")
    assert ready["state"] == "ready" and ready["gpus"] == [0]
    assert await server.run(ready["kernel_id"], "print(who)") == "a\n"


async def test_a_resume_waiting_for_a_gpu_can_be_cancelled_and_stays_paused(
    server: Server,
) -> None:
    # Given one GPU: notebook A paused, notebook B holding the GPU, and A's resume waiting
    a = await server.open_notebook("a.ipynb")
    await server.run(a, "who = 'a'")
    await pause_and_wait(server, "a.ipynb")
    b = await server.open_notebook("b.ipynb")
    await server.run(b, "who = 'b'")
    status, message = await server.error("POST", "cancel", "a.ipynb")
    assert status == 409 and "no resume waits for resources (it is paused)" in message
    await server.call("POST", "resume", "a.ipynb")
    await server.wait_state("a.ipynb", "waiting-for-resources")

    # When the resume is cancelled
    code, record = await server.call("POST", "cancel", "a.ipynb")

    # Then A is paused again, out of the queue, its checkpoint intact; B keeps the GPU
    assert code == 200 and record["state"] == "paused", record
    assert record["queue_position"] is None and record["error"] is None
    assert record["message"].startswith("Resume cancelled; still paused. Your checkpoint 1")
    _, status_json = await server.call("GET", "status")
    assert status_json["resources"]["queue"] == [] and status_json["resources"]["gpus_free"] == 0
    _, b_record = await server.call("GET", "sessions", "b.ipynb")
    assert b_record["state"] == "active" and b_record["gpus"] == [0]
    # and nothing is left to cancel; a later resume still brings A back once B pauses
    status, message = await server.error("POST", "cancel", "a.ipynb")
    assert status == 409
    await server.call("POST", "resume", "a.ipynb")
    await pause_and_wait(server, "b.ipynb")
    ready = await server.wait_state("a.ipynb", "ready", "failed")
    assert await server.run(ready["kernel_id"], "print(who)") == "a\n"


async def test_full_disk_during_pause_keeps_the_session_running(
    server: Server, tiny_store: Path
) -> None:
    kernel_id = await server.open_notebook("full.ipynb")
    await server.run(kernel_id, "import numpy as np\nsmall = np.arange(100)")
    code, _ = await server.call("POST", "checkpoint", "full.ipynb")
    assert code == 200
    await server.run(kernel_id, "big = np.ones(1_000_000)")  # 8 MB > 3 MB

    await server.call("POST", "pause", "full.ipynb")
    record = await server.wait_state("full.ipynb", "active", "paused")
    assert record["state"] == "active", record
    assert "no space left on the device" in record["error"]["what"]
    assert "still running; nothing was lost" in record["error"]["recovery"]
    assert "checkpoint 1 from" in record["error"]["recovery"]
    assert record["kernel_id"] == kernel_id
    assert await server.run(kernel_id, "print(int(big.sum()))") == "1000000\n"
    _, listing = await server.call("GET", "checkpoints", "full.ipynb")
    assert [c["id"] for c in listing["checkpoints"]] == [1]
    await server.app.kernel_manager.shutdown_kernel(kernel_id)  # frees the mount


async def test_metrics_and_gc(server: Server) -> None:
    kernel_id = await server.open_notebook("m.ipynb")
    await server.run(kernel_id, "q = 1")
    await pause_and_wait(server, "m.ipynb")
    text = (await server.fetch("metrics")).body.decode()
    assert 'jupyter_pause_sessions{state="paused"} 1.0' in text
    assert "jupyter_pause_gpus_total 1.0" in text
    assert 'jupyter_pause_pauses_total{outcome="paused"}' in text
    assert 'jupyter_pause_gpu_seconds{kind="released"}' in text
    code, gc = await server.call("POST", "gc")
    assert code == 200 and gc == {"removed": {}, "bytes_freed": 0, "held": [], "problems": []}


async def test_idle_kernels_are_checkpointed_before_the_culler_kills_them(server: Server) -> None:
    # Given jupyter-server culling idle kernels (here: after 50 ms) and no pause policy
    server.orchestrator.cull_idle_seconds = 0.05
    kernel_id = await server.open_notebook("cull.ipynb")
    await server.watched("cull.ipynb")
    await server.run(kernel_id, "precious = [1, 2, 3]")
    await asyncio.sleep(0.1)

    # When the idle monitor runs, the state is saved while the kernel still lives
    assert await server.orchestrator.check_idle() == []
    _, listing = await server.call("GET", "checkpoints", "cull.ipynb")
    assert [(c["id"], c["reason"]) for c in listing["checkpoints"]] == [(1, "before-cull")]
    assert "precious" in listing["checkpoints"][0]["variables"]
    # and not again while nothing happens
    await server.orchestrator.check_idle()
    _, listing = await server.call("GET", "checkpoints", "cull.ipynb")
    assert len(listing["checkpoints"]) == 1


@pytest.mark.parametrize(
    "culler",
    ["--MappingKernelManager.cull_idle_timeout=600", "--PauseApp.hub_culler_timeout_seconds=600"],
)
def test_culling_before_the_pause_policy_is_warned_about(
    jp_configurable_serverapp: Any, capfd: pytest.CaptureFixture[str], culler: str
) -> None:
    jp_configurable_serverapp(argv=[culler, "--PauseApp.idle_pause_minutes=60"])
    warning = capfd.readouterr().err
    assert "stops idle kernels after 600 s before the pause policy (3600 s)" in warning
    assert "Set PauseApp.idle_pause_minutes below 10 " in warning


async def test_a_renamed_notebook_keeps_its_gpu_and_gives_it_back(server: Server) -> None:
    # Given a notebook holding the only GPU
    kernel_id = await server.open_notebook("Untitled.ipynb")
    await server.run(kernel_id, "w = 1")
    _, record = await server.call("GET", "sessions", "Untitled.ipynb")
    assert record["gpus"] == [0]
    sessions = json.loads((await server.fetch("api", "sessions")).body)

    # When it is renamed while the kernel runs (what JupyterLab does on rename)
    await server.fetch(
        "api",
        "sessions",
        sessions[0]["id"],
        method="PATCH",
        body=json.dumps({"path": "flow.ipynb", "name": "flow.ipynb"}),
    )

    # Then the session and its GPU follow the new name, and a pause frees the GPU
    _, record = await server.call("GET", "sessions", "flow.ipynb")
    assert record["kernel_id"] == kernel_id and record["gpus"] == [0]
    assert (await server.error("GET", "sessions", "Untitled.ipynb"))[0] == 404
    await pause_and_wait(server, "flow.ipynb")
    _, status = await server.call("GET", "status")
    assert status["resources"]["gpus_free"] == 1


async def test_a_kernel_shut_down_outside_a_pause_gives_its_gpu_back(server: Server) -> None:
    kernel_id = await server.open_notebook("gone.ipynb")
    await server.run(kernel_id, "v = 2")
    code, _ = await server.call("POST", "checkpoint", "gone.ipynb")
    assert code == 200
    sessions = json.loads((await server.fetch("api", "sessions")).body)
    await server.fetch("api", "sessions", sessions[0]["id"], method="DELETE")

    _, status = await server.call("GET", "status")
    await server.call("GET", "sessions")  # any look at the sessions notices the end
    _, status = await server.call("GET", "status")
    assert status["resources"]["gpus_free"] == 1
    _, record = await server.call("GET", "sessions", "gone.ipynb")
    assert record["state"] == "paused" and record["kernel_id"] is None
    assert "ended outside jupyter_pause" in record["message"]
    # and it can be resumed from its checkpoint
    await server.call("POST", "resume", "gone.ipynb")
    ready = await server.wait_state("gone.ipynb", "ready", "failed")
    assert await server.run(ready["kernel_id"], "print(v)") == "2\n"


async def test_checkpoints_taken_in_the_notebook_are_on_its_timeline(server: Server) -> None:
    # Given a notebook the server watches and has introduced itself to
    kernel_id = await server.open_notebook("cells.ipynb")
    await server.wait_for("cells.ipynb", lambda r: r["watching"] and r["process_token"])

    # When a cell checkpoints, and then the toolbar does
    await server.run(kernel_id, "x = 1\n%checkpoint")
    await server.wait_for(
        "cells.ipynb", lambda r: r["checkpoint"] is not None and r["checkpoint"]["id"] == 1
    )
    code, _answer = await server.call("POST", "checkpoint", "cells.ipynb")
    assert code == 200

    # Then both are on the timeline, each once, with who took it
    _, timeline = await server.call("GET", "timeline", "cells.ipynb")
    written = [e["data"] for e in timeline["events"] if e["kind"] == "checkpoint_written"]
    assert [(d["checkpoint_id"], d["reason"]) for d in written] == [(1, "manual"), (2, "manual")]
    assert timeline["accounting"]["bytes_saved"] == sum(d["bytes_written"] for d in written)


async def test_twenty_resumes_at_once_while_waiting_for_a_gpu_make_one_restore(
    server: Server, jp_http_port: int, jp_base_url: str, jp_auth_header: dict[str, str]
) -> None:
    # Given one GPU: A paused, B holding the GPU
    a = await server.open_notebook("a.ipynb")
    await server.run(a, "who = 'a'")
    await pause_and_wait(server, "a.ipynb")
    await server.open_notebook("b.ipynb")

    # When 20 resumes of A arrive at the same moment, on 20 connections of their own (the
    # test server's client would send at most 10 at once), while A must wait for the GPU
    client = AsyncHTTPClient(force_instance=True, max_clients=32)
    url = f"http://localhost:{jp_http_port}{jp_base_url}jupyter-pause/resume/a.ipynb"
    try:
        answers = await asyncio.gather(
            *(
                client.fetch(url, method="POST", body="{}", headers=jp_auth_header)
                for _ in range(20)
            )
        )
    finally:
        client.close()

    # Then all joined one resume, waiting once in the queue
    assert {answer.code for answer in answers} == {202}
    waiting = await server.wait_state("a.ipynb", "waiting-for-resources")
    _, status = await server.call("GET", "status")
    assert status["resources"]["queue"] == ["a.ipynb"] and waiting["queue_position"] == 1

    # And once B is paused, A is restored exactly once, into one kernel
    await pause_and_wait(server, "b.ipynb")
    ready = await server.wait_state("a.ipynb", "ready", "failed")
    assert ready["state"] == "ready", ready
    _, timeline = await server.call("GET", "timeline", "a.ipynb")
    kinds = [e["kind"] for e in timeline["events"]]
    assert kinds.count("resume_requested") == 1 and kinds.count("state_restored") == 1
    assert server.app.kernel_manager.list_kernel_ids() == [ready["kernel_id"]]
    assert await server.run(ready["kernel_id"], "print(who)") == "a\n"


def metric_values(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, from a Prometheus text exposition."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def test_each_metric_moves_by_what_happened(server: Server) -> None:
    # Given the metrics before anything happens (the registry is shared: read the movement)
    async def scrape() -> dict[str, float]:
        return metric_values((await server.fetch("metrics")).body.decode())

    kernel_id = await server.open_notebook("counted.ipynb")
    await server.run(kernel_id, "import numpy as np\nblock = np.ones(250_000)")
    before = await scrape()

    # When the notebook is paused once and resumed once
    paused = await pause_and_wait(server, "counted.ipynb")
    await server.call("POST", "resume", "counted.ipynb")
    await server.wait_state("counted.ipynb", "ready")
    after = await scrape()

    # Then each counter moved by exactly that, and the checkpoint's bytes were counted
    def moved(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    _, timeline = await server.call("GET", "timeline", "counted.ipynb")
    written = sum(
        e["data"]["bytes_written"] for e in timeline["events"] if e["kind"] == "checkpoint_written"
    )
    assert paused["state"] == "paused" and written >= 2_000_000
    assert moved('jupyter_pause_pauses_total{outcome="paused"}') == 1
    assert moved('jupyter_pause_resumes_total{how="files"}') == 1
    assert moved("jupyter_pause_checkpoint_bytes_written_total") == written
    assert moved("jupyter_pause_resume_to_ready_seconds_count") == 1
    assert moved("jupyter_pause_checkpoint_failures_total") == 0
    assert after['jupyter_pause_sessions{state="ready"}'] == 1


async def test_the_culler_checkpoint_comes_at_80_percent_of_its_timeout(server: Server) -> None:
    # Given a culler timeout of 1000 s and an idle notebook (the clock is passed in)
    server.orchestrator.cull_idle_seconds = 1000.0
    kernel_id = await server.open_notebook("edge.ipynb")
    await server.watched("edge.ipynb")
    await server.run(kernel_id, "kept = 1")
    await server.wait_for("edge.ipynb", lambda r: not r["busy"])  # the cell's idle has arrived
    record = server.orchestrator.records["edge.ipynb"]
    quiet_since = max(record.activity.last_activity, record.started)

    async def checkpoints() -> list[str]:
        _, listing = await server.call("GET", "checkpoints", "edge.ipynb")
        return [c["reason"] for c in listing["checkpoints"]]

    # When the monitor looks at 79% of the timeout: nothing yet
    await server.orchestrator.check_idle(now=quiet_since + 790)
    assert await checkpoints() == []
    # At 81%: the state is saved before the culler may strike
    await server.orchestrator.check_idle(now=quiet_since + 810)
    assert await checkpoints() == ["before-cull"]


async def test_young_sessions_are_not_auto_paused(server: Server) -> None:
    # Given a pause after 1 idle minute, but never within the first 10 minutes of a session
    policy = server.orchestrator.policy
    policy.idle_pause_minutes = 1.0
    policy.min_running_minutes = 10.0
    policy.kernelspec_overrides = {}
    kernel_id = await server.open_notebook("young.ipynb")
    await server.watched("young.ipynb")
    await server.run(kernel_id, "y = 1")
    await server.wait_for("young.ipynb", lambda r: not r["busy"])  # the cell's idle has arrived
    record = server.orchestrator.records["young.ipynb"]

    # When it has been idle 5 minutes, 6 minutes after it started: not paused
    assert await server.orchestrator.check_idle(now=record.started + 6 * 60) == []
    # When it has been idle longer, 11 minutes after it started: paused
    assert await server.orchestrator.check_idle(now=record.started + 11 * 60) == ["young.ipynb"]
    await server.wait_state("young.ipynb", "paused")


class BrokenStopBackend(LocalBackend):
    """A backend with a bug: stopping raises what it was never meant to."""

    def __init__(self, local: LocalBackend) -> None:
        super().__init__(local.kernel_manager, local.session_manager, local.pool.total)

    async def stop(self, session: SessionSpec) -> StopOutcome:
        raise RuntimeError("the platform answered nonsense")


async def test_a_backend_bug_never_leaves_a_pause_half_done(server: Server) -> None:
    server.orchestrator.backend = BrokenStopBackend(server.orchestrator.backend)
    kernel_id = await server.open_notebook("bug.ipynb")
    await server.run(kernel_id, "alive = 'yes'")
    record = await pause_and_wait(server, "bug.ipynb")
    assert record["state"] == "active", record
    assert "the platform answered nonsense" in record["message"]
    assert record["error"]["recovery"].startswith("Nothing was lost.")
    assert await server.run(kernel_id, "print(alive)") == "yes\n"
