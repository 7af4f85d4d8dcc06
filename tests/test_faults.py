"""Fault injection: each case of issue 11, against a real server, real kernels and a real store.

Every case ends the same way: once the dust settles, the notebook's data is compared (by
checksum) with what it was before the fault. Nothing lost, and never down.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import http.server
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tornado.httpclient import HTTPClientError

from jupyter_pause.kernel import store as store_mod
from jupyter_pause.kernel.api import Checkpointer, CheckpointError

from .cli_runner import Cli
from .servers import Server, pause_and_wait, pause_server_config

DATA_CELL = """
import hashlib, numpy as np
data = np.arange(200_000, dtype=np.float64) * 1.5
weights = {"w": np.linspace(0.0, 1.0, 5000)}
"""
CHECKSUM_CELL = (
    "import hashlib\nprint(hashlib.sha256(data.tobytes() + weights['w'].tobytes()).hexdigest())"
)


def checksum(namespace: dict[str, Any]) -> str:
    """What CHECKSUM_CELL prints, for a namespace restored here."""
    data, weights = namespace["data"], namespace["weights"]
    return hashlib.sha256(data.tobytes() + weights["w"].tobytes()).hexdigest() + "\n"


def sample() -> dict[str, Any]:
    """The data DATA_CELL makes, in this process."""
    return {
        "data": np.arange(200_000, dtype=np.float64) * 1.5,
        "weights": {"w": np.linspace(0.0, 1.0, 5000)},
    }


@pytest.fixture
def jp_server_config(pause_store: Path) -> dict:
    """Retention that bites quickly (2 checkpoints), so a wrong deletion would show."""
    return pause_server_config(pause_store, gpu_count=4, keep_last=2)


@pytest.fixture
def server(jp_fetch: Any, jp_serverapp: Any) -> Server:
    return Server(jp_fetch, jp_serverapp)


def folder_of(pause_store: Path, notebook: str) -> Path:
    (folder,) = pause_store.glob(f"{notebook}-*")
    return folder


async def resume_and_wait(server: Server, path: str) -> dict[str, Any]:
    code, _ = await server.call("POST", "resume", path)
    assert code == 202
    return await server.wait_state(path, "ready", "partial", "failed")


async def notebook_with_data(server: Server, path: str) -> tuple[str, str]:
    """A running notebook holding DATA_CELL's data: (kernel id, its checksum)."""
    kernel_id = await server.open_notebook(path)
    await server.run(kernel_id, DATA_CELL)
    return kernel_id, await server.run(kernel_id, CHECKSUM_CELL)


def checkpointer(pause_store: Path, root: Path, notebook: str, **values: Any) -> Checkpointer:
    """The kernel-side engine in this process, writing to the server's store."""
    cp = Checkpointer(values, key=str(root / notebook), store_root=str(pause_store))
    cp.keep_last = 10  # the test decides what retention does, not the server's environment
    return cp


# -- 1. a failed restore is never "ready", and retention keeps the data -------------------------
async def test_1_incomplete_restore_is_partial_and_retention_keeps_the_only_data(
    server: Server, pause_store: Path
) -> None:
    # Given a paused notebook whose data files the loader rightly refuses (writable by others)
    _, expected = await notebook_with_data(server, "one.ipynb")
    await pause_and_wait(server, "one.ipynb")
    packs = list(folder_of(pause_store, "one.ipynb").glob("packs/*.pack"))
    assert packs
    for pack in packs:
        pack.chmod(0o666)

    # When it is resumed
    record = await resume_and_wait(server, "one.ipynb")

    # Then it is not ready but partial: what failed, why, and how to recover
    assert record["state"] == "partial", record
    assert "writable by other users" in record["restore"]["failed"]["data"]
    assert record["message"].startswith("Restored partially from files (0 variables; ")
    assert list(record["hold"]["checkpoints"]) == ["1"]
    recovery = record["error"]["recovery"]
    # the session (imports, settings) sits in the same refused pack: a whole restore is advised
    assert "`%checkpoint restore 1`" in recovery and "`jupyter pause accept one.ipynb`" in recovery

    # When pause/resume cycles follow, and an idle auto-pause, with keep_last = 2
    for _ in range(2):
        await pause_and_wait(server, "one.ipynb")
        record = await resume_and_wait(server, "one.ipynb")
        assert record["state"] == "partial", record  # still not everything back
    server.orchestrator.policy.idle_pause_minutes = 0.0005
    await server.watched("one.ipynb")
    await asyncio.sleep(0.1)
    assert await server.orchestrator.check_idle() == ["one.ipynb"]
    await server.wait_state("one.ipynb", "paused")
    server.orchestrator.policy.idle_pause_minutes = 0.0
    code, collected = await server.call("POST", "gc")

    # Then no checkpoint was deleted: the one holding the data is there
    assert code == 200 and collected["held"] == ["one.ipynb"] and collected["removed"] == {}
    _, listing = await server.call("GET", "checkpoints", "one.ipynb")
    assert [c["id"] for c in listing["checkpoints"]] == [1, 2, 3, 4]

    # And once the cause is fixed, the data comes back whole; accepting ends the hold
    for pack in packs:
        pack.chmod(0o600)
    record = await resume_and_wait(server, "one.ipynb")
    assert record["state"] == "partial" and "Still not restored" in record["message"]
    await server.run(record["kernel_id"], "%checkpoint restore 1")
    assert await server.run(record["kernel_id"], CHECKSUM_CELL) == expected
    code, accepted = await server.call("POST", "accept", "one.ipynb")
    assert code == 200 and accepted["state"] == "ready" and accepted["hold"] is None
    assert (await server.error("POST", "accept", "one.ipynb"))[0] == 409


# -- 2. one bad file affects only its notebook ------------------------------------------------
@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("session-list", "session.json is unreadable"),
        ("session-string", "session.json is unreadable"),
        ("session-wrong-types", "session.json had unreadable fields (error, checkpoint)"),
        ("manifest-no-created", "checkpoint 2 cannot be used"),
    ],
)
async def test_2_one_bad_file_affects_only_its_notebook(
    server: Server, pause_store: Path, damage: str, named: str
) -> None:
    # Given two paused notebooks with data
    sums = {}
    for path in ("good.ipynb", "bad.ipynb"):
        _, sums[path] = await notebook_with_data(server, path)
        if damage == "manifest-no-created" and path == "bad.ipynb":
            assert (await server.call("POST", "checkpoint", path))[0] == 200
        await pause_and_wait(server, path)

    # When one file of bad.ipynb is damaged and the server restarts
    await server.orchestrator.writer.flush()  # the last state is on disk
    folder = folder_of(pause_store, "bad.ipynb")
    if damage == "manifest-no-created":
        manifest = folder / "manifests" / "000002.json"
        content = json.loads(manifest.read_text())
        del content["created"]
        manifest.write_text(json.dumps(content))
        session = json.loads((folder / "session.json").read_text())
        (folder / "session.json").write_text(json.dumps({**session, "state": "active"}))
    elif damage == "session-wrong-types":
        session = json.loads((folder / "session.json").read_text())
        wrong = {"error": {"what": 1}, "checkpoint": {"id": "two"}}
        (folder / "session.json").write_text(json.dumps({**session, **wrong}))
    else:
        (folder / "session.json").write_text("[]" if damage == "session-list" else '"hello"')
    await server.restart_extension()

    # Then the extension is up: every notebook is listed, the bad file named for its notebook
    _, listing = await server.call("GET", "sessions")
    sessions = {s["path"]: s for s in listing["sessions"]}
    assert sessions["good.ipynb"]["warnings"] == []
    assert sessions["bad.ipynb"]["state"] == "paused"
    assert any(named in warning for warning in sessions["bad.ipynb"]["warnings"]), sessions
    assert (
        'jupyter_pause_sessions{state="paused"} 2.0'
        in (await server.fetch("metrics")).body.decode()
    )

    # And both come back whole
    for path in ("good.ipynb", "bad.ipynb"):
        record = await resume_and_wait(server, path)
        assert record["state"] == "ready", record
        assert await server.run(record["kernel_id"], CHECKSUM_CELL) == sums[path]


# -- 3. gc waits for a kernel's lock off the event loop -----------------------------------------
async def test_3_gc_behind_a_kernels_lock_never_freezes_the_server(
    server: Server, pause_store: Path, jp_root_dir: Path
) -> None:
    # Given a notebook whose store lock a kernel holds (writing a long checkpoint)
    cp = checkpointer(pause_store, jp_root_dir, "locked.ipynb", **sample())
    cp.checkpoint()
    expected = checksum(cp.namespace)
    locked, release = threading.Event(), threading.Event()

    def kernel_writing() -> None:
        with cp.store.locked():
            locked.set()
            release.wait(10)

    writer = threading.Thread(target=kernel_writing)
    writer.start()
    assert locked.wait(5)

    # When gc runs, the server still answers at once
    collecting = asyncio.create_task(server.call("POST", "gc"))
    latencies = []
    for _ in range(8):
        started = time.monotonic()
        await server.fetch("api", "status")
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(0.1)
    assert not collecting.done()  # gc is still waiting for the lock, on its own thread
    release.set()
    code, collected = await collecting
    writer.join()

    # Then nothing was slow, gc finished, and the data is intact
    assert max(latencies) < 0.5, latencies
    assert code == 200 and collected["problems"] == []
    fresh = checkpointer(pause_store, jp_root_dir, "locked.ipynb")
    fresh.restore()
    assert checksum(fresh.namespace) == expected


# -- 4. a damaged newest manifest is skipped, moved aside, and blocks nothing ------------------
async def test_4_damaged_newest_manifest_is_skipped_and_moved_aside(
    server: Server, pause_store: Path
) -> None:
    # Given a notebook checkpointed, then changed and paused
    kernel_id, expected = await notebook_with_data(server, "four.ipynb")
    assert (await server.call("POST", "checkpoint", "four.ipynb"))[0] == 200
    await server.run(kernel_id, "data = data * 0")
    await pause_and_wait(server, "four.ipynb")

    # When the newest manifest is damaged and the server restarts
    folder = folder_of(pause_store, "four.ipynb")
    (folder / "manifests" / "000002.json").write_text('{"format": 1, "created": ')
    await server.restart_extension()

    # Then the notebook is still there, paused on the newest intact checkpoint
    _, listing = await server.call("GET", "sessions")
    (session,) = [s for s in listing["sessions"] if s["path"] == "four.ipynb"]
    assert session["state"] == "paused" and session["checkpoint"]["id"] == 1
    assert any("checkpoint 2 cannot be used" in w for w in session["warnings"])

    # And resuming restores it; the damaged manifest is moved aside, new checkpoints work
    record = await resume_and_wait(server, "four.ipynb")
    assert record["state"] == "ready" and record["restore"]["checkpoint_id"] == 1, record
    assert await server.run(record["kernel_id"], CHECKSUM_CELL) == expected
    assert (folder / "damaged" / "000002.json").exists()
    assert not (folder / "manifests" / "000002.json").exists()
    code, body = await server.call("POST", "checkpoint", "four.ipynb")
    assert code == 200 and body["result"]["checkpoint_id"] == 3
    _, checkpoints = await server.call("GET", "checkpoints", "four.ipynb")
    assert [(c["id"], "damaged" in c) for c in checkpoints["checkpoints"]] == [
        (1, False),
        (2, True),
        (3, False),
    ]


# -- 5. no store content yields a 5xx ---------------------------------------------------------
BAD_CONTENT = {
    "manifest-format-only": ("manifests/000002.json", '{"format": 1}'),
    "manifest-list": ("manifests/000002.json", "[]"),
    "torn-log": ("torn.json", "[{nonsense"),
    "torn-entries": ("torn.json", '[{"checkpoint_id": "x"}, 7]'),
    "notebook-info": ("notebook.json", "{garbled"),
}


@pytest.mark.parametrize("damage", list(BAD_CONTENT))
async def test_5_no_store_content_yields_a_5xx(
    server: Server, pause_store: Path, jp_root_dir: Path, damage: str
) -> None:
    # Given a notebook with a checkpoint and one damaged file, and a later notebook over
    # its retention limit (3 checkpoints, the admin keeps 2)
    cp = checkpointer(pause_store, jp_root_dir, "five.ipynb", **sample())
    cp.checkpoint()
    expected = checksum(cp.namespace)
    name, content = BAD_CONTENT[damage]
    (cp.store.path / name).write_text(content)
    later = checkpointer(pause_store, jp_root_dir, "later.ipynb", y=1)
    for _ in range(3):
        later.checkpoint()

    # When every endpoint is asked about it
    answers = {}
    for method, parts in [
        ("GET", ("sessions",)),
        ("GET", ("sessions", "five.ipynb")),
        ("GET", ("checkpoints", "five.ipynb")),
        ("GET", ("timeline", "five.ipynb")),
        ("GET", ("status",)),
        ("POST", ("gc",)),
    ]:
        answers[parts[0]] = await server.call(method, *parts)

    # Then none answers 5xx; gc went past the damaged folder to the later one
    assert {code for code, _ in answers.values()} == {200}
    collected = answers["gc"][1]
    assert collected["removed"] == {"later.ipynb": [1]}
    if damage == "notebook-info":
        assert "notebook.json is unreadable" in collected["problems"][0]["problem"]
    listing = answers["checkpoints"][1]["checkpoints"]
    assert listing[0]["id"] == 1 and "damaged" not in listing[0]
    if damage.startswith("manifest"):
        assert listing[1]["id"] == 2 and "damaged" in listing[1]

    # And the resume restores the intact checkpoint, whole; new checkpoints are not blocked
    record = await resume_and_wait(server, "five.ipynb")
    assert record["state"] == "ready", record
    assert await server.run(record["kernel_id"], CHECKSUM_CELL) == expected
    code, body = await server.call("POST", "checkpoint", "five.ipynb")
    assert code == 200 and body["result"]["saved"] == ["data", "weights"]


# -- 6. after a disk-full moment, the state is saved again ------------------------------------
async def test_6_state_is_saved_again_after_a_full_disk(server: Server, tiny_store: Path) -> None:
    # Given a running notebook on a small disk
    kernel_id = await server.open_notebook("six.ipynb")
    await server.run(kernel_id, "import hashlib, numpy as np\nx = np.arange(1000.0)")
    expected = await server.run(kernel_id, "print(hashlib.sha256(x.tobytes()).hexdigest())")
    await server.watched("six.ipynb")
    folder = folder_of(tiny_store, "six.ipynb")

    # When the disk fills up (to the last byte) while the session state is saved
    filler = tiny_store / "filler"
    fill_up(filler)
    code, _ = await server.error("POST", "checkpoint", "six.ipynb")
    assert code == 409
    await server.orchestrator.writer.flush()
    filler.unlink()

    # Then no temp file is left behind, and the next state change is saved again
    assert list(folder.glob(".session.json.*")) == []
    await pause_and_wait(server, "six.ipynb")
    await server.orchestrator.writer.flush()
    assert json.loads((folder / "session.json").read_text())["state"] == "paused"
    await server.restart_extension()
    record = await resume_and_wait(server, "six.ipynb")
    assert record["state"] == "ready", record
    code = "import hashlib\nprint(hashlib.sha256(x.tobytes()).hexdigest())"
    assert await server.run(record["kernel_id"], code) == expected
    await server.app.kernel_manager.shutdown_kernel(record["kernel_id"])  # frees the mount


def fill_up(filler: Path) -> None:
    """Write ``filler`` until not one more byte fits on its disk."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (64 << 10, 4096, 1):
            with pytest.raises(OSError) as full:
                while True:
                    os.write(fd, bytes(chunk))
            assert full.value.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_6_a_leftover_temp_file_does_not_block_writes(tmp_path: Path) -> None:
    # Given the temp file an earlier failed write of this thread left behind
    target = tmp_path / "session.json"
    leftover = tmp_path / f".session.json.{os.getpid()}.{threading.get_ident()}.tmp"
    leftover.write_bytes(b"half")

    # When the file is written
    store_mod.write_file_atomically(target, b'{"state": "paused"}')

    # Then it is written, and nothing is left over
    assert target.read_bytes() == b'{"state": "paused"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.json"]


# -- 7. concurrent pauses of a busy kernel answer at once -------------------------------------
async def test_7_a_second_pause_of_a_busy_kernel_answers_at_once(server: Server) -> None:
    # Given a busy kernel holding data, and a pause that waits up to 4 s for its cell
    kernel_id, expected = await notebook_with_data(server, "seven.ipynb")
    await server.run(kernel_id, "import time")
    await server.watched("seven.ipynb")
    server.orchestrator.policy.busy_wait_seconds = 4.0
    running = asyncio.create_task(server.run(kernel_id, "time.sleep(3)"))
    await server.wait_for("seven.ipynb", lambda r: r["busy"])
    first = asyncio.create_task(server.call("POST", "pause", "seven.ipynb"))
    await asyncio.sleep(0.3)

    # When two more pauses come
    started = time.monotonic()
    answers = await asyncio.gather(
        server.error("POST", "pause", "seven.ipynb"),
        server.error("POST", "checkpoint", "seven.ipynb"),
    )

    # Then both are refused at once, saying a pause already waits
    assert time.monotonic() - started < 1.0
    for code, message in answers:
        assert code == 409 and "a pause is already waiting" in message, message

    # And the first pause goes ahead once the cell ends, with the data whole
    await running
    code, _ = await first
    assert code == 202
    await server.wait_state("seven.ipynb", "paused")
    record = await resume_and_wait(server, "seven.ipynb")
    assert await server.run(record["kernel_id"], CHECKSUM_CELL) == expected


# -- 8. store folders are owner-only and never symbolic links ---------------------------------
def test_8_every_folder_created_is_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a fresh Jupyter data dir (the default store lives below it)
    data_dir = tmp_path / "data"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data_dir))

    # When a checkpoint is written to the default store
    cp = Checkpointer(sample(), key=str(tmp_path / "nb.ipynb"))
    cp.checkpoint()

    # Then every folder it created is 0700, the jupyter_pause one above the store too
    created = [data_dir, data_dir / "jupyter_pause", Path(cp.store_root), cp.store.path]
    created += [p for p in cp.store.path.rglob("*") if p.is_dir()]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in created} == {"0o700"}
    fresh = Checkpointer({}, key=str(tmp_path / "nb.ipynb"))
    fresh.restore()
    assert checksum(fresh.namespace) == checksum(cp.namespace)


def test_8_a_symlinked_store_folder_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    # Given a store root that is a symbolic link to someone's shared folder
    target = tmp_path / "shared"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    link = tmp_path / "store"
    link.symlink_to(target)

    # When a checkpoint is written there
    cp = Checkpointer(sample(), key=str(tmp_path / "nb.ipynb"), store_root=str(link))
    with pytest.raises(CheckpointError) as refused:
        cp.checkpoint()

    # Then it is refused with a clear message, and the target keeps its mode
    assert f"The checkpoint folder {link} is a symbolic link (to {target})" in str(refused.value)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755 and list(target.iterdir()) == []


async def test_8_a_symlinked_notebook_folder_is_named_and_not_followed(
    server: Server, pause_store: Path, jp_root_dir: Path, tmp_path: Path
) -> None:
    # Given a store with a notebook's data and a folder that is a link elsewhere
    cp = checkpointer(pause_store, jp_root_dir, "real.ipynb", **sample())
    cp.checkpoint()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    elsewhere.chmod(0o755)
    (pause_store / "evil-0123456789ab").symlink_to(elsewhere)

    # When the server starts and collects
    await server.restart_extension()
    _, status = await server.call("GET", "status")
    _, collected = await server.call("POST", "gc")

    # Then the link is named in both, never followed, and the real data is intact
    assert any("evil-0123456789ab is a symbolic link" in p for p in status["problems"])
    assert collected["problems"][0]["folder"] == "evil-0123456789ab"
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755
    fresh = checkpointer(pause_store, jp_root_dir, "real.ipynb")
    fresh.restore()
    assert checksum(fresh.namespace) == checksum(cp.namespace)


# -- 9. a full disk says "no space left" ------------------------------------------------------
def test_9_a_full_disk_is_reported_as_such_not_as_a_buffer_error(tmp_path: Path) -> None:
    # Given a checkpoint being written whose data file sits on a full device (/dev/full)
    store = store_mod.NotebookStore(tmp_path / "store", str(tmp_path / "nb.ipynb"))
    store.prepare()
    writer = store.begin(1, {})
    writer.add("ab" * 16, memoryview(b"x" * 5000))
    assert writer._pack is not None
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, writer._pack.fd)
    os.close(full)

    # When its files are flushed
    with pytest.raises(OSError) as failed:
        writer.finish_files()

    # Then the error is the disk's, and nothing is left in tmp/
    assert failed.value.errno == errno.ENOSPC
    assert list((store.path / "tmp").iterdir()) == []


def test_9_a_checkpoint_on_a_full_disk_says_no_space_left(tiny_store: Path, tmp_path: Path) -> None:
    # Given a checkpoint that fits, then data that does not (8 MB on 3 MB)
    cp = Checkpointer(sample(), key=str(tmp_path / "nb.ipynb"), store_root=str(tiny_store))
    cp.checkpoint()
    expected = checksum(cp.namespace)
    cp.namespace["big"] = np.ones(1_000_000)

    # When it is checkpointed
    with pytest.raises(CheckpointError) as failed:
        cp.checkpoint()

    # Then the message says so, and the earlier checkpoint is intact
    assert "no space left on the device" in str(failed.value) and "is intact" in str(failed.value)
    fresh = Checkpointer({}, key=str(tmp_path / "nb.ipynb"), store_root=str(tiny_store))
    fresh.restore()
    assert checksum(fresh.namespace) == expected


# -- 10. the CLI: clear errors, and no absolute server paths in answers ------------------------
class _HtmlHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html><body>Welcome to nginx!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


async def test_10_cli_says_what_is_wrong_with_a_url(server: Server, jp: Cli) -> None:
    # Given a web server that answers HTML, and a Jupyter server URL without the API
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    thread = threading.Thread(target=web.serve_forever, daemon=True)
    thread.start()
    try:
        html_url = f"http://127.0.0.1:{web.server_address[1]}/"
        # When the CLI is pointed at them
        code, out, err = await jp("status", "--url", html_url, "--token", "t", discover=True)
        no_api = await jp("status", "--url", jp.url + "not-jupyter-pause/")
    finally:
        web.shutdown()
        web.server_close()

    # Then each exits 3 with one clear line, no traceback
    assert (code, out) == (3, "") and "Traceback" not in err
    assert err == (
        f"jupyter pause: {html_url}jupyter-pause/sessions did not answer JSON (a web page?): "
        f"is {html_url} a Jupyter server with jupyter_pause, with its base URL?\n"
    )
    assert no_api[0] == 3 and "has no jupyter_pause API: is the extension enabled?" in no_api[2]


async def test_10_answers_carry_no_absolute_server_paths(
    server: Server, pause_store: Path, jp_root_dir: Path
) -> None:
    # Given a notebook with a damaged checkpoint and a paused session
    _, expected = await notebook_with_data(server, "sub/ten.ipynb")
    await pause_and_wait(server, "sub/ten.ipynb")
    folder = folder_of(pause_store, "ten.ipynb")
    (folder / "manifests" / "000009.json").write_text("[]")

    # When every read endpoint and an error are asked for
    answers = [
        (await server.call("GET", *parts))[1]
        for parts in [
            ("sessions",),
            ("sessions", "sub/ten.ipynb"),
            ("checkpoints", "sub/ten.ipynb"),
            ("timeline", "sub/ten.ipynb"),
            ("status",),
        ]
    ]
    with pytest.raises(HTTPClientError) as refused:
        await server.call("POST", "checkpoint", "sub/ten.ipynb")
    answers.append(json.loads(refused.value.response.body))

    # Then no string in them holds the server root or the store as an absolute path
    text = json.dumps(answers)
    for absolute in {str(jp_root_dir), str(pause_store), os.path.realpath(pause_store)}:
        assert absolute not in text
    assert "<store>/" + folder.name + "/manifests/000009.json" in text
    assert "key" not in answers[1] and answers[1]["path"] == "sub/ten.ipynb"

    # And the data is whole
    record = await resume_and_wait(server, "sub/ten.ipynb")
    assert await server.run(record["kernel_id"], CHECKSUM_CELL) == expected
