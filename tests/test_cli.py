"""The ``jupyter pause`` command line against a real jupyter-server with real kernels.

The test server runs on the test's event loop, so the CLI runs as an asyncio subprocess:
a blocking call would stop the very server it talks to.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.cli import client, output
from jupyter_pause.formatting import format_duration

from .cli_runner import Cli
from .servers import Server, pause_and_wait

#: A notebook file as JupyterLab writes it (the content is never read; the path matters).
EMPTY_NOTEBOOK = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture
def server(jp_fetch: Any, jp_serverapp: Any) -> Server:
    """The test server, driven like tests/test_server.py drives it (to set up and check)."""
    return Server(jp_fetch, jp_serverapp)


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- commands against a real server ---------------------------------------------------------------
async def test_output_piped_into_head_ends_quietly_when_head_stops_reading(
    server: Server, jp: Cli, tmp_path: Path
) -> None:
    # Given a notebook whose timeline is longer than a pipe holds (3,000 events, ~300 KB)
    await server.open_notebook("long.ipynb")
    record = await server.orchestrator.get("long.ipynb")
    for i in range(3000):
        record.timeline.add("idle_gap", at=1_700_000_000.0 + 600 * i, seconds=300.0)

    # When its timeline is piped into `head -1`, which closes the pipe after one line
    timeline = ["timeline", "long.ipynb", "--url", jp.url, "--token", jp.token]
    command = shlex.join([sys.executable, "-m", "jupyter_pause.cli", *timeline])
    stderr = tmp_path / "stderr"
    shell = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f'{command} 2>{shlex.quote(str(stderr))} | head -1; echo "exit ${{PIPESTATUS[0]}}"',
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(shell.communicate(), timeout=120)

    # Then head shows the first line, and the CLI ends as a program ended by SIGPIPE does:
    # no traceback, exit status 141
    assert out.decode().splitlines() == ["Timeline of long.ipynb (now active):", "exit 141"]
    assert stderr.read_text() == ""


async def test_status_shows_the_gpus_and_every_session(server: Server, jp: Cli) -> None:
    # Given a notebook whose kernel holds the only GPU
    kernel_id = await server.open_notebook("exp/train.ipynb")
    await server.run(kernel_id, "x = 1")

    # When the researcher asks for the status
    code, out, err = await jp("status")

    # Then it names the server, the GPUs, and the session's state on one line
    assert (code, err) == (0, "")
    assert f"Server:   {jp.url}" in out
    assert "Backend:  local; GPUs: 1 total, 0 free; queue: empty" in out
    (line,) = [line for line in out.splitlines() if "exp/train.ipynb" in line]
    assert line.split()[:3] == ["exp/train.ipynb", "active", "0"]

    # And --json is the same data, machine-readable
    code, out, _ = await jp("status", "--json")
    status = json.loads(out)
    assert code == 0 and status["server"] == jp.url and status["backend"] == "local"
    assert status["resources"]["gpus_free"] == 0
    assert [(s["path"], s["state"]) for s in status["sessions"]] == [("exp/train.ipynb", "active")]


async def test_checkpoint_then_list_shows_it(server: Server, jp: Cli) -> None:
    # Given a running notebook with an array
    kernel_id = await server.open_notebook("ckpt.ipynb")
    await server.run(kernel_id, "import numpy as np\narr = np.ones(1000)")

    # When it is checkpointed from the command line
    code, out, err = await jp("checkpoint", "ckpt.ipynb")

    # Then the checkpoint is reported and the kernel keeps running
    assert (code, err) == (0, "")
    assert re.fullmatch(
        r"Checkpoint 1 of ckpt\.ipynb: 1 variable saved, [\d.]+ KB written, 0 B reused "
        r"\(took [\d.]+ s\)\n",
        out,
    ), out
    assert await server.run(kernel_id, "print(arr.sum())") == "1000.0\n"

    # And the notebook's checkpoints are listed as a table
    code, out, _ = await jp("list", "ckpt.ipynb")
    header, row = out.splitlines()
    assert code == 0 and header.split() == [
        "ID",
        "CREATED",
        "REASON",
        "SIZE",
        "SKIPPED",
        "VARIABLES",
    ]
    assert re.fullmatch(r"1 +[\d-]+ [\d:]+ +manual +[\d.]+ KB +0 +arr", row), row
    code, out, _ = await jp("list", "ckpt.ipynb", "--json")
    assert [c["id"] for c in json.loads(out)["checkpoints"]] == [1]

    # And without a notebook, every session is listed
    code, out, _ = await jp("list")
    assert code == 0 and out.splitlines()[1].split()[:2] == ["ckpt.ipynb", "active"]


async def test_pause_then_resume_shows_progress_and_brings_the_variables_back(
    server: Server, jp: Cli
) -> None:
    # Given a notebook with data in its kernel
    kernel_id = await server.open_notebook("exp/train.ipynb")
    await server.run(kernel_id, "import numpy as np\ntable = np.arange(12.0)\nnote = 'kept'")

    # When it is paused from the command line
    code, out, err = await jp("pause", "exp/train.ipynb")

    # Then it waited until paused, showing the states on stderr, and says what it did
    assert code == 0, err
    assert out.startswith("Paused exp/train.ipynb: checkpoint 1, ")
    assert " saved, GPU released (took " in out
    lines = err.splitlines()
    assert lines[0].startswith("exp/train.ipynb: checkpointing")
    assert lines[-1] == "exp/train.ipynb: paused"
    _, record = await server.call("GET", "sessions", "exp/train.ipynb")
    assert record["state"] == "paused" and kernel_id not in server.app.kernel_manager

    # When it is resumed
    code, out, err = await jp("resume", "exp/train.ipynb")

    # Then the variables are back in a new kernel
    assert code == 0, err
    assert out.startswith("Resumed exp/train.ipynb: restored from files (")
    assert " variables) in " in out
    lines = err.splitlines()
    assert lines[0].split(": ")[1].startswith(("resuming", "restoring"))
    assert lines[-1] == "exp/train.ipynb: ready"
    _, ready = await server.call("GET", "sessions", "exp/train.ipynb")
    assert await server.run(ready["kernel_id"], "print(table.sum(), note)") == "66.0 kept\n"

    # And the timeline shows each step and the GPU time in hours/minutes
    code, out, _ = await jp("timeline", "exp/train.ipynb")
    assert code == 0 and out.startswith("Timeline of exp/train.ipynb (now ready):")
    for kind in ("pause_requested", "checkpoint_written", "gpu_released", "kernel_ready"):
        assert re.search(rf"\s{kind}(\s|$)", out, re.MULTILINE), kind
    assert "GPU time (1 GPU): allocated " in out and "Pauses: 1, resumes: 1;" in out
    code, out, _ = await jp("timeline", "exp/train.ipynb", "--json")
    timeline = json.loads(out)
    assert timeline["accounting"]["pauses"] == 1 and timeline["accounting"]["resumes"] == 1
    assert "first_cell_executed" in [e["kind"] for e in timeline["events"]]


async def test_resume_of_a_damaged_checkpoint_says_what_was_not_restored(
    server: Server, jp: Cli, pause_store: Path
) -> None:
    # Given a paused notebook whose array data was deleted from the store
    kernel_id = await server.open_notebook("damaged.ipynb")
    await server.run(kernel_id, "import numpy as np\nbig = np.ones(100_000)")
    await pause_and_wait(server, "damaged.ipynb")
    for data in [*pause_store.glob("*/packs/*"), *pause_store.glob("*/blobs/*")]:
        shutil.rmtree(data) if data.is_dir() else data.unlink()

    # When it is resumed
    code, out, err = await jp("resume", "damaged.ipynb")

    # Then the kernel is back, but an incomplete restore is no success: exit 1, and the last
    # line names what was not restored, why, and how to recover
    assert (code, out) == (1, ""), err
    last = err.splitlines()[-1]
    assert re.match(
        r"jupyter pause: Resume of damaged\.ipynb incomplete: Restored partially from files "
        r"\(\d+ variables?; 2 not restored: big \(StoreError: Data file <store>/damaged\.ipynb-"
        r"\w+/packs/\S+ is missing: the checkpoint is damaged\.\), session \(imports, "
        r"environment, settings\) \(StoreError: Data file .* is missing: the checkpoint is "
        r"damaged\.\)\)\. ",
        last,
    ), last
    # the session (imports) lives in the same pack: only a whole restore brings it back
    assert "`%checkpoint restore 1`" in last and "`jupyter pause accept damaged.ipynb`" in last
    _, record = await server.call("GET", "sessions", "damaged.ipynb")
    assert record["state"] == "partial" and list(record["hold"]["checkpoints"]) == ["1"]
    assert await server.run(record["kernel_id"], "print('big' in dir())") == "False\n"

    # And once the user accepts, the session is ready and retention applies again
    code, out, err = await jp("accept", "damaged.ipynb")
    assert (code, err) == (0, "") and "carrying on without" in out
    _, record = await server.call("GET", "sessions", "damaged.ipynb")
    assert record["state"] == "ready" and record["hold"] is None


async def test_a_failed_resume_exits_1_and_says_how_to_recover(server: Server, jp: Cli) -> None:
    # Given a paused notebook whose kernelspec has since been removed
    kernel_id = await server.open_notebook("gone.ipynb")
    await server.run(kernel_id, "a = 1")
    await pause_and_wait(server, "gone.ipynb")
    server.orchestrator.records["gone.ipynb"].kernel_name = "no-such-kernel"

    # When it is resumed
    code, out, err = await jp("resume", "gone.ipynb")

    # Then the exit code is 1 and stderr ends with one line: what failed and what to do
    assert (code, out) == (1, "")
    last = err.splitlines()[-1]
    assert last.startswith(
        "jupyter pause: Resume of gone.ipynb failed: Could not start a no-such-kernel kernel: "
    )
    assert "Your checkpoint 1 from " in last and "is intact. Resume again" in last
    assert "Traceback" not in err
    _, record = await server.call("GET", "sessions", "gone.ipynb")
    assert record["state"] == "failed"


async def test_gc_applies_the_retention_policy(server: Server, jp: Cli) -> None:
    # Given a notebook with two checkpoints, and an admin who now keeps only the last one
    kernel_id = await server.open_notebook("gc.ipynb")
    await server.run(kernel_id, "a = 1")
    assert (await jp("checkpoint", "gc.ipynb"))[0] == 0
    await server.run(kernel_id, "b = 2")
    assert (await jp("checkpoint", "gc.ipynb"))[0] == 0
    server.orchestrator.policy.keep_last = 1

    # When garbage is collected
    code, out, err = await jp("gc")

    # Then the older checkpoint is gone and the newer one kept
    assert (code, err) == (0, "")
    assert out.startswith("Removed 1 checkpoint of 1 notebook, freed ")
    assert out.splitlines()[1].endswith("gc.ipynb: 1")
    _, listing = await server.call("GET", "checkpoints", "gc.ipynb")
    assert [c["id"] for c in listing["checkpoints"]] == [2]

    # And a second run has nothing left to do
    code, out, _ = await jp("gc", "--json")
    assert code == 0 and json.loads(out) == {
        "removed": {},
        "bytes_freed": 0,
        "held": [],
        "problems": [],
    }


# -- failures and their exit codes ----------------------------------------------------------------
async def test_unknown_notebook_exits_4_with_the_servers_message(server: Server, jp: Cli) -> None:
    # Given a server that never saw nope.ipynb
    # When it is paused
    code, out, err = await jp("pause", "nope.ipynb")

    # Then the exit code is 4 and the server's message is the one line on stderr
    assert (code, out) == (4, "")
    assert err == (
        "jupyter pause: No session for 'nope.ipynb': "
        "open the notebook (start a kernel) or check the path\n"
    )
    assert (await jp("timeline", "nope.ipynb"))[0] == 4


async def test_pausing_a_paused_notebook_exits_5(server: Server, jp: Cli) -> None:
    # Given a paused notebook
    kernel_id = await server.open_notebook("twice.ipynb")
    await server.run(kernel_id, "a = 1")
    assert (await pause_and_wait(server, "twice.ipynb"))["state"] == "paused"

    # When it is paused again, or checkpointed
    code, out, err = await jp("pause", "twice.ipynb")

    # Then both are refused as conflicting, and it stays paused
    assert (code, out, err) == (5, "", "jupyter pause: twice.ipynb is already paused\n")
    code, _, err = await jp("checkpoint", "twice.ipynb")
    assert code == 5 and "it is paused, not running" in err
    _, record = await server.call("GET", "sessions", "twice.ipynb")
    assert record["state"] == "paused"


async def test_resume_waiting_for_a_gpu_shows_its_place_and_times_out_with_7(
    server: Server, jp: Cli
) -> None:
    # Given one GPU: a.ipynb was paused, and b.ipynb now holds the GPU
    a = await server.open_notebook("a.ipynb")
    await server.run(a, "who = 'a'")
    await pause_and_wait(server, "a.ipynb")
    b = await server.open_notebook("b.ipynb")
    await server.run(b, "who = 'b'")

    # When a.ipynb is resumed with a short timeout
    code, out, err = await jp("resume", "a.ipynb", "--timeout", "2")

    # Then it said why it waits and where it stands, and gave up with exit code 7
    assert (code, out) == (7, "")
    assert (
        "a.ipynb: waiting-for-resources (all 1 GPU(s) are in use (by b.ipynb); "
        "you are number 1 in the queue and get the next one freed)"
    ) in err
    assert err.splitlines()[-1].startswith("jupyter pause: Timed out after 2 s waiting for a.ipynb")
    # and the resume goes on in the server, still queued
    _, record = await server.call("GET", "sessions", "a.ipynb")
    assert record["state"] == "waiting-for-resources"

    # When it is cancelled
    code, out, err = await jp("cancel", "a.ipynb")

    # Then it is paused again, out of the queue, and a second cancel has nothing to cancel
    assert (code, err) == (0, "")
    assert out.startswith("a.ipynb: Resume cancelled; still paused. Your checkpoint 1"), out
    _, record = await server.call("GET", "sessions", "a.ipynb")
    assert record["state"] == "paused" and record["queue_position"] is None
    code, _, err = await jp("cancel", "a.ipynb")
    assert code == 5 and "no resume waits for resources (it is paused)" in err


async def test_wrong_token_exits_6(server: Server, jp: Cli) -> None:
    # Given a server with a token
    # When the CLI presents another one
    code, out, err = await jp("status", "--token", "not-the-token")

    # Then it is refused with exit code 6 and a hint
    assert (code, out) == (6, "")
    assert err.startswith(f"jupyter pause: Not authorised by {jp.url}") and "check the token" in err


async def test_unreachable_server_exits_3(jp: Cli, tmp_path: Path) -> None:
    # Given a URL where nothing listens
    url = f"http://127.0.0.1:{closed_port()}/"

    # When the CLI is pointed at it
    code, out, err = await jp("status", "--url", url, "--token", "t", discover=True)

    # Then it exits 3 with one line, no traceback
    assert (code, out) == (3, "")
    assert err.startswith(f"jupyter pause: Cannot reach the Jupyter server at {url}: ")
    assert len(err.splitlines()) == 1

    # And with no runtime file to discover, it says where it looked
    empty = tmp_path / "no-servers"
    code, _, err = await jp("status", discover=True, JUPYTER_RUNTIME_DIR=str(empty))
    assert code == 3 and f"No running Jupyter server found in {empty}" in err


# -- finding the server and the notebook ----------------------------------------------------------
async def test_the_server_is_found_from_its_runtime_file(
    server: Server, jp: Cli, jp_serverapp: Any
) -> None:
    # Given the server's runtime file, as `jupyter server list` reads it
    jp_serverapp.write_server_info_file()
    assert Path(jp_serverapp.info_file).parent == jp.runtime_dir

    # When the CLI runs with neither --url nor --token
    code, out, err = await jp("status", "--json", discover=True)

    # Then it found this server and its token
    assert (code, err) == (0, "")
    assert json.loads(out)["server"] == jp_serverapp.connection_url

    # And finding it never imported the server itself (seconds of imports for a typed command)
    code, _, imports = await jp("status", discover=True, PYTHONPROFILEIMPORTTIME="1")
    assert code == 0 and "jupyter_core.paths" in imports  # discovery did run
    assert " jupyter_server" not in imports and " tornado" not in imports


async def test_notebook_given_as_a_file_path(
    server: Server, jp: Cli, jp_serverapp: Any, jp_root_dir: Path
) -> None:
    # Given a discoverable server and a notebook file in a folder of its root
    jp_serverapp.write_server_info_file()
    notebook = jp_root_dir / "proj" / "nb.ipynb"
    notebook.parent.mkdir()
    notebook.write_text(EMPTY_NOTEBOOK)
    kernel_id = await server.open_notebook("proj/nb.ipynb")
    await server.run(kernel_id, "v = 5")

    # When it is named by its absolute path
    code, out, err = await jp("checkpoint", str(notebook), discover=True)

    # Then the CLI used the path relative to the server root
    assert (code, err) == (0, "")
    assert out.startswith("Checkpoint 1 of proj/nb.ipynb: ")

    # And a path relative to the current directory works as well
    code, out, err = await jp("list", "nb.ipynb", discover=True, cwd=notebook.parent)
    assert (code, err) == (0, "") and out.splitlines()[1].split()[0] == "1"

    # But a file outside the root is a usage error
    code, _, err = await jp("pause", "/etc/hosts", discover=True)
    assert code == 2 and "is not inside the server root" in err


# -- pieces without a server ----------------------------------------------------------------------
def test_server_path_conversions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a server root with a notebook in a subfolder
    root = tmp_path / "root"
    (root / "exp").mkdir(parents=True)
    (root / "exp" / "t.ipynb").write_text(EMPTY_NOTEBOOK)
    monkeypatch.chdir(root / "exp")

    # Then absolute paths, cwd-relative files and server paths all map to the server path
    assert client.server_path(str(root / "exp" / "t.ipynb"), str(root)) == "exp/t.ipynb"
    assert client.server_path("t.ipynb", str(root)) == "exp/t.ipynb"
    assert client.server_path("other/x.ipynb", str(root)) == "other/x.ipynb"
    assert client.server_path("./a//b.ipynb", None) == "a/b.ipynb"
    with pytest.raises(client.CliError) as info:
        client.server_path("/elsewhere/x.ipynb", None)
    assert info.value.code == client.EXIT_USAGE


def test_the_server_whose_root_contains_the_notebook_is_picked(tmp_path: Path) -> None:
    # Given two servers, one serving a folder inside the other's root
    outer = {"url": "http://a/", "root_dir": str(tmp_path)}
    inner = {"url": "http://b/", "root_dir": str(tmp_path / "inner")}
    servers = [outer, inner]

    # Then a notebook goes to the innermost root holding it, anything else to the first
    assert client.pick_server(servers, str(tmp_path / "inner" / "n.ipynb")) is inner
    assert client.pick_server(servers, str(tmp_path / "n.ipynb")) is outer
    assert client.pick_server(servers, "/elsewhere/n.ipynb") is outer
    assert client.pick_server(servers, None) is outer


def test_progress_line_on_a_terminal_has_a_bar() -> None:
    # Given a session halfway through writing its checkpoint
    record = {
        "path": "n.ipynb",
        "state": "checkpointing",
        "progress": {"phase": "writing", "done": 500_000, "total": 1_000_000},
    }

    # Then the terminal line has a bar, the bytes and the percent; a log line no bar
    assert output.describe(record, bar=True) == (
        "n.ipynb: checkpointing, writing [##########----------] 500.0 KB/1.0 MB 50%"
    )
    assert output.describe(record, bar=False) == (
        "n.ipynb: checkpointing, writing 500.0 KB/1.0 MB 50%"
    )


def test_durations_read_in_hours_and_minutes() -> None:
    assert format_duration(4.14) == "4.1 s"
    assert format_duration(125) == "2 min 5 s"
    assert format_duration(3 * 3600 + 120) == "3 h 02 min"
    assert format_duration(None) == "-"
