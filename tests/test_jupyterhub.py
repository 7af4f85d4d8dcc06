"""JupyterHub on one machine, with the real parts: JupyterHub 6.1.1 and its REST API,
configurable-http-proxy 5.3.0, jupyterhub-idle-culler 2.0.0 run as a Hub service, and each
user's jupyterhub-singleuser with jupyter_pause, spawned as deploy/jupyterhub ships it.

What users meet: a pause gives the server (and its GPU) back to the Hub, and the next spawn
shows the notebook paused and restores it from files on Resume; the culler stops an idle
server, however many tabs poll it, and nothing is lost; a running cell keeps its server; a
server killed at once keeps what its last checkpoint held, and says from when; a token without
the scope pauses as `local` does and says what the admin must add; and no server's token can
stop another user's server.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from jupyter_pause.usage import report

from .cluster.notebooks import RemoteServer
from .hub_process import Hub, start_hub

pytestmark = pytest.mark.timeout(420)

EMPTY_NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def hubs(tmp_path: Path):
    started: list[Hub] = []

    def start(cull_seconds: int = 3600, extra: str = "") -> Hub:
        hub = start_hub(tmp_path / f"hub{len(started)}", cull_seconds, extra)
        started.append(hub)
        return hub

    yield start
    for hub in started:
        hub.stop()


def notebook(hub: Hub, user: str, name: str = "train.ipynb") -> str:
    home = hub.home(user)
    home.mkdir(parents=True, exist_ok=True)
    (home / name).write_text(json.dumps(EMPTY_NOTEBOOK))
    return name


def server_pid(hub: Hub, user: str) -> int:
    return int(((hub.server(user) or {}).get("state") or {})["pid"])


def server_token(hub: Hub, user: str) -> str:
    """The token the Hub gave the user's server (its JUPYTERHUB_API_TOKEN)."""
    environ = Path(f"/proc/{server_pid(hub, user)}/environ").read_bytes().split(b"\0")
    found = dict(line.decode().split("=", 1) for line in environ if b"=" in line)
    return found["JUPYTERHUB_API_TOKEN"]


@contextlib.contextmanager
def open_tab(server: RemoteServer, *urls: str):
    """A tab left open: what JupyterLab and the toolbar ask of the server every second (the
    proxy's error page, once the server has gone, is answered too)."""
    polling = threading.Event()

    def poll() -> None:
        while not polling.is_set():
            for url in urls:
                with contextlib.suppress(OSError, ValueError):
                    server.request("GET", url, timeout=5)
            polling.wait(1.0)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        yield
    finally:
        polling.set()
        poller.join(10)


def timeline_kinds(server: RemoteServer, path: str) -> list[str]:
    code, timeline = server.request("GET", f"/jupyter-pause/timeline/{path}")
    assert code == 200, timeline
    return [event["kind"] for event in timeline["events"]]


def test_a_pause_gives_the_server_back_and_the_next_spawn_restores_from_files(hubs) -> None:
    hub = hubs()
    server = hub.spawn("alice")
    path = notebook(hub, "alice")
    kernel = server.open_notebook(path)
    server.run(kernel, "import numpy as np\nx = 42\nweights = np.arange(1000.0)")
    code, status = server.request("GET", "/jupyter-pause/status")
    assert (code, status["backend"]) == (200, "jupyterhub"), status
    assert status["resources"]["details"]["problem"] is None, status

    # When the user pauses the notebook
    code, record = server.request("POST", f"/jupyter-pause/pause/{path}")
    assert code == 202, record
    # Then the Hub stops the server (its process gone: the GPU with it)
    pid = server_pid(hub, "alice")
    hub.wait_stopped("alice")
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "the server's process outlived its stop"
        time.sleep(0.1)
    # and the checkpoint is on the user's storage, readable by them only
    store = hub.home("alice") / ".local/share/jupyter/jupyter_pause/checkpoints"
    data = [p for p in store.rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert data, list(store.rglob("*"))
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in data), data

    # When the user logs in again: the notebook is paused, and says what a resume restores
    server = hub.spawn("alice")
    paused = server.session(path)
    assert paused["state"] == "paused", paused
    assert paused["message"].startswith("Paused at "), paused["message"]
    assert "the server was stopped" in paused["message"], paused["message"]
    assert "Resume restores it from files: checkpoint 1 from" in paused["message"], paused
    # Then Resume restores it from files and says so, the values equal
    code, record = server.request("POST", f"/jupyter-pause/resume/{path}")
    assert code == 202, record
    ready = server.wait_state(path, "ready", "partial", "failed")
    assert (ready["state"], ready["how"]) == ("ready", "files"), ready
    kernel = server.session(path)["kernel_id"]
    assert server.run(kernel, "print(x, weights.sum())").split() == ["42", "499500.0"]
    # and the timeline spans the server's stop; the report counts the pause
    kinds = timeline_kinds(server, path)
    for kind in ("pause_requested", "checkpoint_written", "kernel_stopped", "server_started"):
        assert kind in kinds, kinds
    assert kinds.index("server_started") < kinds.index("state_restored"), kinds
    # with the spawn's wait: from the Hub's start of it (read:servers!server) to this server
    assert kinds.index("start_requested") < kinds.index("server_started"), kinds
    code, timeline = server.request("GET", f"/jupyter-pause/timeline/{path}")
    (started,) = [e for e in timeline["events"] if e["kind"] == "server_started"]
    assert 0 < started["data"]["waited_seconds"] < 60, started
    code, listing = server.request("GET", "/jupyter-pause/usage")
    assert code == 200, listing
    assert report.build(listing, since_seconds=None)["pauses"] == 1


#: The Hub reads activity every 5 s (the proxy's routes, the servers' reports), not 300.
QUICK_ACTIVITY = (
    "c.JupyterHub.last_activity_interval = 5\n"
    "c.Spawner.environment = {'JUPYTERHUB_ACTIVITY_INTERVAL': '5'}\n"
    "c.Spawner.args.append('--PauseApp.monitor_interval_seconds=2')\n"
)


def test_the_culler_stops_an_idle_server_nothing_is_lost_and_a_running_cell_stays(hubs) -> None:
    # The Hub's culler with a 24 s timeout (checked every 5 s); jupyter_pause is told it
    hub = hubs(cull_seconds=24, extra=QUICK_ACTIVITY)
    alice = hub.spawn("alice")
    bob = hub.spawn("bob")
    path = notebook(hub, "alice")
    kernel = alice.open_notebook(path)
    alice.run(kernel, "x = 42")
    # Bob's cell runs quietly for longer than the culler's timeout
    bob_path = notebook(hub, "bob")
    bob_kernel = bob.open_notebook(bob_path)
    bob.start_cell(bob_kernel, "import time\ntime.sleep(75)\ny = 7")

    # Then the culler stops alice's idle server within its timeout and a round or two
    started = time.monotonic()
    hub.wait_stopped("alice", timeout=90)
    assert time.monotonic() - started < 60
    # and bob's server, whose cell still runs, is up
    assert (hub.server("bob") or {}).get("ready"), hub.user("bob")

    # When alice comes back: the notebook says the Hub stopped it, and from when it restores
    alice = hub.spawn("alice")
    paused = alice.session(path)
    assert paused["state"] == "paused", paused
    assert "the Hub stopped this server" in paused["message"], paused["message"]
    assert "Resume restores it from files" in paused["message"], paused["message"]
    code, _ = alice.request("POST", f"/jupyter-pause/resume/{path}")
    assert code == 202
    assert alice.wait_state(path, "ready", "partial", "failed")["state"] == "ready"
    assert alice.run(alice.session(path)["kernel_id"], "print(x)").strip() == "42"
    # The checkpoint before the cull came first (at 80 % of its timeout), then the stop's
    code, timeline = alice.request("GET", f"/jupyter-pause/timeline/{path}")
    events = timeline["events"]
    reasons = [e["data"].get("reason") for e in events if e["kind"] == "checkpoint_written"]
    assert reasons[:1] == ["before-cull"], events
    asked = [e["data"].get("reason") for e in events if e["kind"] == "pause_requested"]
    assert any("the Hub stopped this server" in (r or "") for r in asked), events


def idle_pausing_hub(hubs) -> tuple[Hub, RemoteServer, str]:
    """A Hub whose servers pause notebooks idle for 18 s; alice's server, her notebook with
    ``x = 42``."""
    hub = hubs(
        extra=QUICK_ACTIVITY + "c.Spawner.args.append('--PauseApp.idle_pause_minutes=0.3')\n"
    )
    alice = hub.spawn("alice")
    path = notebook(hub, "alice")
    alice.run(alice.open_notebook(path), "x = 42")
    return hub, alice, path


def test_polls_and_an_open_tab_do_not_keep_a_server_jupyter_pause_pauses_it(hubs) -> None:
    # The Hub counts every request through its proxy as activity (its routes' last_activity):
    # an open tab keeps the Hub's culler away. jupyter_pause's idle pause counts work only.
    hub, alice, path = idle_pausing_hub(hubs)
    ran_at = time.time()

    with open_tab(alice, "/api/kernels", "/api/sessions", "/jupyter-pause/status"):
        # The server's own activity (what it reports to the Hub) stays at the cell
        time.sleep(6)
        _code, status = alice.request("GET", "/api/status")
        reported = datetime.fromisoformat(status["last_activity"].replace("Z", "+00:00"))
        assert reported.timestamp() < ran_at + 1, (status, ran_at)
        # and jupyter_pause pauses the idle notebook: the server is given back
        hub.wait_stopped("alice", timeout=90)
    alice = hub.spawn("alice")
    assert alice.session(path)["state"] == "paused"


def test_a_server_left_with_paused_notebooks_and_an_open_tab_is_given_back(hubs) -> None:
    # The user came back, did not resume, and left the tab open: no kernel runs, the tab polls
    hub, alice, path = idle_pausing_hub(hubs)
    code, _ = alice.request("POST", f"/jupyter-pause/pause/{path}")
    assert code == 202
    hub.wait_stopped("alice")
    spawned = time.monotonic()
    alice = hub.spawn("alice")
    assert alice.session(path)["state"] == "paused"

    with open_tab(alice, "/api/kernels", "/api/sessions", f"/jupyter-pause/sessions/{path}"):
        # Then jupyter_pause gives the server back once nothing was done for the idle time
        hub.wait_stopped("alice", timeout=120)
        assert time.monotonic() - spawned >= 18, "given back before the idle time (0.3 min)"
    assert "giving this server back: no notebook runs in it" in hub.tail(400), hub.tail()
    # and the notebook is still paused with what its pause saved
    alice = hub.spawn("alice")
    paused = alice.session(path)
    assert paused["state"] == "paused", paused
    assert "Resume restores it from files: checkpoint 1 from" in paused["message"], paused
    code, _ = alice.request("POST", f"/jupyter-pause/resume/{path}")
    assert code == 202
    assert alice.wait_state(path, "ready", "partial", "failed")["state"] == "ready"
    assert alice.run(alice.session(path)["kernel_id"], "print(x)").strip() == "42"


def test_a_server_killed_at_once_keeps_what_its_last_checkpoint_held(hubs) -> None:
    # As KubeSpawner's delete_grace_period of 1 s: the server gets no time to checkpoint
    hub = hubs(
        extra="c.LocalProcessSpawner.interrupt_timeout = 0\nc.LocalProcessSpawner.term_timeout = 0\n"
    )
    server = hub.spawn("alice")
    path = notebook(hub, "alice")
    kernel = server.open_notebook(path)
    server.run(kernel, "x = 42")
    assert server.request("POST", f"/jupyter-pause/checkpoint/{path}")[0] == 200
    checkpoint = server.session(path)["checkpoint"]
    server.run(kernel, "late = 'never saved'")

    # When an admin stops the server (the Hub's REST API, as its admin page does)
    code, _ = hub.request("DELETE", "/users/alice/server")
    assert code in (202, 204)
    hub.wait_stopped("alice")

    # Then the next spawn restores what the checkpoint held, and says from when
    server = hub.spawn("alice")
    paused = server.session(path)
    assert paused["state"] == "paused", paused
    when = time.strftime("%H:%M", time.localtime(checkpoint["created"]))
    assert f"checkpoint {checkpoint['id']} from {when}" in paused["message"], paused["message"]
    code, _ = server.request("POST", f"/jupyter-pause/resume/{path}")
    assert code == 202
    assert server.wait_state(path, "ready", "partial", "failed")["state"] == "ready"
    kernel = server.session(path)["kernel_id"]
    assert server.run(kernel, "print(x, 'late' in globals())").split() == ["42", "False"]


def test_without_the_scope_a_pause_stops_the_kernel_and_says_what_the_admin_must_add(
    hubs,
) -> None:
    hub = hubs(
        extra="c.Spawner.server_token_scopes = ['access:servers!server', 'users:activity!user']\n"
    )
    server = hub.spawn("alice")
    code, status = server.request("GET", "/jupyter-pause/status")
    assert status["backend"] == "jupyterhub", status
    problem = status["resources"]["details"]["problem"]
    assert "delete:servers!server" in problem and "c.Spawner.server_token_scopes" in problem
    assert "GPU" in problem and "stay" in problem, problem

    path = notebook(hub, "alice")
    kernel = server.open_notebook(path)
    server.run(kernel, "x = 42")
    code, _ = server.request("POST", f"/jupyter-pause/pause/{path}")
    assert code == 202
    assert server.wait_state(path, "paused", "active")["state"] == "paused"
    # The kernel is gone, the server stays (the Hub was never asked)
    code, kernels = server.request("GET", "/api/kernels")
    assert kernel not in [k["id"] for k in kernels], kernels
    assert (hub.server("alice") or {}).get("ready"), hub.user("alice")
    code, _ = server.request("POST", f"/jupyter-pause/resume/{path}")
    assert server.wait_state(path, "ready", "partial", "failed")["state"] == "ready"
    kernel = server.session(path)["kernel_id"]
    assert server.run(kernel, "print(x)").strip() == "42"

    # When the Hub stops the server (an admin; the culler alike): every notebook is paused
    # on its signal, and the next spawn resumes it from files
    server.run(kernel, "y = 7")
    code, _ = hub.request("DELETE", "/users/alice/server")
    assert code in (202, 204)
    hub.wait_stopped("alice")
    server = hub.spawn("alice")
    paused = server.session(path)
    assert paused["state"] == "paused", paused
    code, _ = server.request("POST", f"/jupyter-pause/resume/{path}")
    assert server.wait_state(path, "ready", "partial", "failed")["state"] == "ready"
    assert server.run(server.session(path)["kernel_id"], "print(x, y)").split() == ["42", "7"]


def test_a_servers_token_stops_its_own_server_only(hubs) -> None:
    hub = hubs()
    hub.spawn("alice")
    hub.spawn("bob")
    token = server_token(hub, "alice")
    # The token holds its own server's scopes, and nothing of anyone else's
    code, me = hub.request("GET", "/user", token=token)
    assert code == 200, me
    assert "delete:servers!server=alice/" in me["scopes"], me["scopes"]
    others = [s for s in me["scopes"] if "!" not in s or "alice" not in s.split("!", 1)[1]]
    assert others == [], me["scopes"]
    # The Hub refuses it bob's server; bob's server runs on
    code, body = hub.request("DELETE", "/users/bob/server", token=token)
    assert code in (403, 404), (code, body)
    assert (hub.server("bob") or {}).get("ready"), hub.user("bob")
    assert os.path.exists(f"/proc/{server_pid(hub, 'bob')}")
