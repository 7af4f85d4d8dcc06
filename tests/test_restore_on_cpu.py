"""Restore on CPU now: a resume that waits for a GPU gives its place up and the session comes
back from files in a kernel without a GPU (``POST resume`` with ``{"accelerators": "none"}``,
``jupyter pause resume --cpu``, the chip's button while waiting). Real jupyter_server, real
ipykernel kernels, the local backend's GPU queue of one GPU."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from .cli_runner import Cli
from .servers import Server, pause_and_wait

ON_CPU = {"accelerators": "none"}


async def a_waits_while_b_holds_the_gpu(server: Server) -> None:
    """One GPU: notebook A paused with ``who = 'a'``; B holds the GPU; A's resume waits."""
    a = await server.open_notebook("a.ipynb")
    await server.run(a, "who = 'a'")
    await pause_and_wait(server, "a.ipynb")
    b = await server.open_notebook("b.ipynb")
    await server.run(b, "who = 'b'")
    await server.call("POST", "resume", "a.ipynb")
    await server.wait_state("a.ipynb", "waiting-for-resources")


async def test_a_resume_waiting_for_a_gpu_restores_on_cpu_now_when_asked(server: Server) -> None:
    # Given A's resume waiting for the GPU B holds
    await a_waits_while_b_holds_the_gpu(server)

    # When the user asks for A on CPU now
    code, record = await server.call("POST", "resume", "a.ipynb", body=ON_CPU)
    assert code == 202, record

    # Then A is back from files in a kernel that sees no GPU, out of the queue, and says so
    ready = await server.wait_state("a.ipynb", "ready", "partial", "failed", "paused")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["gpus"] == [] and "On CPU, as asked" in ready["message"], ready
    kernel = ready["kernel_id"]
    code_line = "import os; print(who, repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    assert await server.run(kernel, code_line) == "a ''\n"
    _, status = await server.call("GET", "status")
    assert status["resources"]["queue"] == [] and status["resources"]["gpus_free"] == 0
    # B keeps its GPU
    _, b = await server.call("GET", "sessions", "b.ipynb")
    assert b["state"] == "active" and b["gpus"] == [0], b
    # and the timeline tells the two resumes apart: the GPU one given up, the CPU one
    _, timeline = await server.call("GET", "timeline", "a.ipynb")
    events = timeline["events"]
    asked = [e for e in events if e["kind"] == "resume_requested"]
    assert [e["data"].get("on_cpu", False) for e in asked] == [False, True], asked
    assert any(e["kind"] == "failed" and "cancelled" in e["data"]["what"] for e in events)
    restored = [e for e in events if e["kind"] == "state_restored"]
    assert len(restored) == 1 and "on CPU" in restored[0]["data"]["why"], restored

    # When B pauses, the GPU is free; A's next pause and resume get it back
    await pause_and_wait(server, "b.ipynb")
    await pause_and_wait(server, "a.ipynb")
    await server.call("POST", "resume", "a.ipynb")
    again = await server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert again["state"] == "ready" and again["gpus"] == [0], again
    assert await server.run(again["kernel_id"], "print(who)") == "a\n"


async def test_a_paused_notebook_resumes_on_cpu_from_the_command_line(
    server: Server, jp: Cli
) -> None:
    # Given A's resume waiting for the GPU B holds
    await a_waits_while_b_holds_the_gpu(server)

    # When `jupyter pause resume --cpu a.ipynb` runs
    code, out, err = await jp("resume", "--cpu", "a.ipynb")

    # Then it waits until A is ready on CPU, and says so
    assert code == 0, err
    assert out.startswith("Resumed a.ipynb: restored from files") and "on CPU" in out, out
    # --cpu is a notebook's: a whole Workspace comes back as it paused
    code, _, err = await jp("resume", "--cpu", "--workspace", "ns/lab")
    assert code == 2 and "--cpu resumes a notebook" in err, err
    _, record = await server.call("GET", "sessions", "a.ipynb")
    assert record["state"] == "ready" and record["gpus"] == [], record


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1]",
        b'{"accelerators": "gpu"}',
        b'{"accelerators": "none", "gpus": 0}',
    ],
)
async def test_a_resume_body_it_does_not_understand_is_a_400_saying_what_is(
    server: Server, body: bytes
) -> None:
    await server.open_notebook("a.ipynb")
    with pytest.raises(HTTPClientError) as info:
        await server.fetch("jupyter-pause", "resume", "a.ipynb", method="POST", body=body)
    assert info.value.code == 400
    assert info.value.response is not None
    message = json.loads(info.value.response.body)["message"]
    assert '"accelerators"' in message and "none" in message, message
