"""Pauses the platform starts by itself, on the real chain: the Kubeflow / GKE Workspaces
dashboard's Pause (``spec.paused: true`` from outside the pod, as the UI sends it), held by the
real GKE Workspaces snapshot add-on while GKE's played agent snapshots the pod, then its Start.

What a user must get, as from our own button: every kernel checkpointed before the snapshot
(in the add-on's hold, which the server keeps while it writes), the pause on each timeline and
in the GPU-hours accounting, the same data back (live where GKE restores the snapshot, from
the checkpoints where it cannot), each told truthfully; and nothing read before a freeze
trusted after it (the next pause from our button follows the add-on to its own outcome).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.cli.main import main as cli_main
from jupyter_pause.usage import report

from .control_plane import SnapshotAddon
from .notebooks import RemoteServer
from .real_players import (
    ACTIVE_GATE,
    GVISOR,
    PIN_ANNOTATION,
    Container,
    PlayedWorkspace,
    RealPlayedCluster,
    condition,
)
from .test_real_chain import CHECKPOINT_STATE, LAST_CHECKPOINT, pause_details
from .test_workspace import CHECKSUM_CELL, DATA_CELL, cli, resume_in_background, user_env

ADDON_TRIGGER = "ws-lab-trigger"
STARTED_AT = "podsnapshot.gke.kubeflow.org/checkpoint-started-at"
#: A variable whose checkpoint takes ``seconds``: longer than the add-on's settle grace (3 s).
SLOW_CELL = """
import time
class Slow:
    def __init__(self, seconds):
        self.seconds = seconds
    def __reduce__(self):
        time.sleep(self.seconds)
        return (Slow, (self.seconds,))
slow = Slow({seconds})
"""


def enabled_lab(
    chain: RealPlayedCluster, folder: Path, extra_config: str = ""
) -> tuple[PlayedWorkspace, Container, RemoteServer]:
    """A running Workspace the add-on snapshots, our server in it having read its pod."""
    chain.node("sandbox", gpus=1, sandbox=True)
    kind = chain.workspace_kind(mode="gke-workspaces")
    lab = chain.workspace("lab", kind, folder / "home", enabled=True, extra_config=extra_config)
    container = chain.running(lab)
    pod = chain.pod_of("lab")
    assert pod is not None and pod["spec"]["runtimeClassName"] == GVISOR
    assert condition(pod, ACTIVE_GATE)["status"] == "True"
    server = RemoteServer(container.url, lab.jupyter_token)
    details = pause_details(server, chain)
    assert (details["mode"], details["problem"]) == ("gke-workspaces", None), details
    assert details["watch_problem"] is None, details  # the shipped Role lets it watch
    return lab, container, server


def with_data(server: RemoteServer, path: str = "a.ipynb") -> tuple[str, str]:
    kernel_id = server.open_notebook(path)
    server.run(kernel_id, DATA_CELL)
    return kernel_id, server.run(kernel_id, CHECKSUM_CELL)


def events(server: RemoteServer, path: str) -> list[dict[str, Any]]:
    code, timeline = server.request("GET", f"/jupyter-pause/timeline/{path}")
    assert code == 200, timeline
    return timeline["events"]


def of_kind(timeline: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in timeline if e["kind"] == kind]


def paused_from_dashboard(chain: RealPlayedCluster) -> dict[str, Any]:
    """``spec.paused: true`` as the Kubeflow UI sends it; the Workspace once the add-on let it
    through and the pod went."""
    answer = chain.set_paused("lab", True)
    assert answer["spec"]["paused"] is False  # held back while GKE snapshots the pod
    assert answer["metadata"]["annotations"][CHECKPOINT_STATE] == "Checkpointing"
    chain.wait(
        lambda: chain.workspace_object("lab")["spec"]["paused"] and chain.pod_of("lab") is None,
        120,
        "the add-on to let the dashboard's pause through and the pod to go",
    )
    return chain.workspace_object("lab")


def workspace_status(chain: RealPlayedCluster, folder: Path) -> str:
    done = cli(chain, folder, "status", "--workspace", f"{chain.namespace}/lab")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr + done.stdout
    return done.stdout


def test_a_dashboard_pause_is_checkpointed_in_the_hold_comes_back_live_and_is_told(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a Workspace the add-on snapshots, our server in its pod, a notebook with data
    lab, container, server = enabled_lab(real_chain, tmp_path)
    first_pod = container.pod_uid
    kernel_id, expected = with_data(server)

    # When the user pauses it from the dashboard (not from our button)
    workspace = paused_from_dashboard(real_chain)

    # Then the add-on took exactly one snapshot, its own, and the server checkpointed the
    # notebook in the add-on's hold, before that snapshot was asked for
    (snapshot,) = real_chain.snapshot_names()
    assert workspace["metadata"]["annotations"][LAST_CHECKPOINT] == snapshot
    assert container.frozen and "snapshot-stopped" in container.signals
    recorded = real_chain.state_annotation("lab")
    assert (recorded["state"], recorded["origin"]) == ("paused", "outside"), recorded
    assert recorded["notebooks"] == ["a.ipynb"] and recorded["bytes"] > 2_400_000, recorded
    # And the Workspace says so while it is paused
    line = workspace_status(real_chain, tmp_path)
    assert "lab: paused - Paused from outside jupyter_pause since" in line, line
    assert f"pod snapshot {snapshot} (by the GKE Workspaces add-on)" in line, line

    # When the user starts it again from the dashboard
    real_chain.set_paused("lab", False)

    # Then GKE restored the snapshot, and the server proves the very process came back, with
    # its data, and says the pause came from outside
    resumed = real_chain.running(lab, previous_pod=first_pod)
    assert resumed is container
    server = RemoteServer(resumed.url, lab.jupyter_token)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert (ready["how"], ready["kernel_id"]) == ("live", kernel_id), ready
    assert "paused from outside jupyter_pause" in ready["message"].lower(), ready["message"]
    assert f"restored from snapshot {snapshot}" in ready["message"], ready["message"]
    assert server.run(kernel_id, CHECKSUM_CELL) == expected
    # And the timeline has the whole pause: who asked, the checkpoint written first (in the
    # hold), the add-on's snapshot, the GPU back in the pool, the live restore
    timeline = events(server, "a.ipynb")
    (asked,) = of_kind(timeline, "pause_requested")
    assert (asked["data"]["origin"], asked["data"]["held"]) == ("outside", True), asked
    assert "the Kubeflow dashboard, kubectl or a culler" in asked["data"]["reason"]
    (written,) = [e for e in of_kind(timeline, "checkpoint_written") if e["at"] > asked["at"]]
    assert written["data"]["reason"] == "pause" and written["data"]["bytes_written"] > 0
    (taken,) = of_kind(timeline, "snapshot_taken")
    assert (taken["data"]["name"], taken["data"]["mode"]) == (snapshot, "gke-workspaces")
    assert taken["data"]["checkpoints_first"] is True, taken
    (stopped,) = of_kind(timeline, "kernel_stopped")
    (released,) = of_kind(timeline, "gpu_released")
    (restored,) = of_kind(timeline, "state_restored")
    assert written["at"] < stopped["at"] == released["at"] < restored["at"]
    assert (restored["data"]["how"], restored["data"]["token_matched"]) == ("live", True)
    # And the GPU-hours accounting counts it: one pause, the GPU released while paused, and
    # the report (`jupyter pause report`, from the server's usage listing) says from outside
    code, whole = server.request("GET", "/jupyter-pause/timeline/a.ipynb")
    assert code == 200
    assert whole["accounting"]["pauses"] == 1, whole["accounting"]
    assert whole["accounting"]["gpu_seconds_released"] > 0, whole["accounting"]
    code, listing = server.request("GET", "/jupyter-pause/usage")
    assert code == 200, listing
    numbers = report.build(listing, since_seconds=None)
    assert (numbers["pauses"], numbers["pauses_outside"]) == (1, 1), numbers
    assert numbers["totals"]["gpu_hours_released"] > 0, numbers["totals"]

    # When the notebook is then paused from our button, and this time GKE fails the snapshot
    real_chain.wait(lambda: not real_chain.snapshot_names(), 90, "the add-on to retire it")
    real_chain.fail_next_trigger("the sandbox could not be checkpointed")
    second_pod = resumed.pod_uid
    code, record = server.request("POST", "/jupyter-pause/pause/a.ipynb")
    assert code == 202, record

    # Then the server follows the add-on to that outcome (it read the new pod afresh: nothing
    # of the pod before the freeze is trusted) and lets the pause through without a snapshot
    real_chain.wait(
        lambda: (
            real_chain.workspace_object("lab")["spec"]["paused"]
            and real_chain.pod_of("lab") is None
        ),
        120,
        "the pause to go through without a snapshot",
    )
    annotations = real_chain.workspace_object("lab")["metadata"]["annotations"]
    assert annotations[CHECKPOINT_STATE] == "Ready" and LAST_CHECKPOINT not in annotations
    line = workspace_status(real_chain, tmp_path)
    assert "the sandbox could not be checkpointed" in line, line
    assert snapshot not in line, line  # never the spent snapshot of the dashboard's pause

    # When it is resumed: a cold start restored from the checkpoint, saying why
    done = cli(real_chain, tmp_path, "resume", "--workspace", f"{real_chain.namespace}/lab")
    assert done.returncode == 0, done.stderr + done.stdout
    assert snapshot not in done.stdout, done.stdout
    again = real_chain.running(lab, previous_pod=second_pod)
    server = RemoteServer(again.url, lab.jupyter_token)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert ready["how"] == "files", ready
    assert "the sandbox could not be checkpointed" in ready["message"], ready["message"]
    assert snapshot not in ready["message"], ready["message"]
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    new_pod = real_chain.pod_of("lab")
    assert new_pod is not None
    assert PIN_ANNOTATION not in (new_pod["metadata"].get("annotations") or {})


def test_a_dashboard_pause_gke_cannot_restore_comes_back_from_the_checkpoint_of_the_hold(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a notebook with data in a Workspace the add-on snapshots, paused from the dashboard
    lab, container, server = enabled_lab(real_chain, tmp_path)
    first_pod = container.pod_uid
    _kernel_id, expected = with_data(server)
    paused_from_dashboard(real_chain)
    (snapshot,) = real_chain.snapshot_names()

    # When it is started again on a node where GKE cannot restore the snapshot
    real_chain.restore_mode = "mismatch"
    real_chain.set_paused("lab", False)

    # Then a new server restores the checkpoint taken in the add-on's hold, and says why: the
    # pause from outside, and the restore GKE could not do
    resumed = real_chain.running(lab, previous_pod=first_pod)
    assert resumed is not container
    server = RemoteServer(resumed.url, lab.jupyter_token)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert ready["how"] == "files", ready
    message = ready["message"]
    assert "paused from outside jupyter_pause" in message.lower(), message
    assert f"restoring snapshot {snapshot} failed" in message, message
    assert "does not match this pod's spec hash" in message, message
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    # And `status --workspace` tells the same once the server has said it
    real_chain.wait(
        lambda: real_chain.state_annotation("lab").get("state") == "ready", 60, "the outcome"
    )
    line = workspace_status(real_chain, tmp_path)
    assert "lab: ready - Restored from files (a.ipynb: ready)" in line, line
    assert "paused from outside jupyter_pause" in line, line


def test_a_dashboard_pause_whose_snapshot_gke_fails_goes_through_and_comes_back_from_files(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a notebook with data in a Workspace the add-on snapshots, and GKE's next snapshot
    # failing (alone, the add-on would hold the pause for ever, the pod out of its Service:
    # test_real_chain.py shows it)
    lab, container, server = enabled_lab(real_chain, tmp_path)
    first_pod = container.pod_uid
    _kernel_id, expected = with_data(server)
    real_chain.fail_next_trigger("the sandbox could not be checkpointed")

    # When it is paused from the dashboard
    real_chain.set_paused("lab", True)

    # Then, the notebook checkpointed in the hold, the server lets the pause through without a
    # snapshot, as after its own pause: the pod goes, with its GPU
    real_chain.wait(
        lambda: (
            real_chain.workspace_object("lab")["spec"]["paused"]
            and real_chain.pod_of("lab") is None
        ),
        120,
        "the pause to go through without a snapshot",
    )
    annotations = real_chain.workspace_object("lab")["metadata"]["annotations"]
    assert annotations[CHECKPOINT_STATE] == "Ready" and LAST_CHECKPOINT not in annotations
    assert not container.frozen  # its processes stopped with the pod: no snapshot holds them
    recorded = real_chain.state_annotation("lab")
    assert (recorded["origin"], recorded["snapshot"]) == ("outside", None), recorded
    assert "the sandbox could not be checkpointed" in recorded["snapshot_problem"], recorded
    line = workspace_status(real_chain, tmp_path)
    assert "lab: paused - Paused from outside jupyter_pause since" in line, line
    assert "the sandbox could not be checkpointed" in line, line

    # When it is started again from the dashboard
    real_chain.set_paused("lab", False)

    # Then a cold start restores the checkpoint of the hold, saying who paused it and why there
    # was no snapshot
    resumed = real_chain.running(lab, previous_pod=first_pod)
    server = RemoteServer(resumed.url, lab.jupyter_token)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert ready["how"] == "files", ready
    assert "paused from outside jupyter_pause" in ready["message"].lower(), ready["message"]
    assert "the sandbox could not be checkpointed" in ready["message"], ready["message"]
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    (missing,) = of_kind(events(server, "a.ipynb"), "snapshot_missing")
    assert missing["data"]["checkpoints_first"] is True, missing


@pytest.mark.parametrize("hold_seconds", [600.0, 2.0])
def test_a_checkpoint_slower_than_the_addons_grace_holds_its_snapshot_up_to_the_limit(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path, hold_seconds: float
) -> None:
    # Given a notebook whose checkpoint takes 6 s, longer than the add-on's 3 s settle grace,
    # and the admin's limit on how long the server may hold the add-on
    config = f"c.PauseApp.outside_pause_hold_seconds = {hold_seconds}\n"
    lab, container, server = enabled_lab(real_chain, tmp_path, extra_config=config)
    first_pod = container.pod_uid
    kernel_id, expected = with_data(server)
    server.run(kernel_id, SLOW_CELL.format(seconds=6))

    # When it is paused from the dashboard
    asked = time.time()
    real_chain.set_paused("lab", True)
    trigger = real_chain.wait(
        lambda: real_chain.snapshot_object("podsnapshotmanualtriggers", ADDON_TRIGGER),
        120,
        "the add-on's trigger",
    )
    triggered_after = time.time() - asked
    real_chain.wait(lambda: real_chain.pod_of("lab") is None, 120, "the pod to go")

    # Then within the limit the add-on asked GKE only once the checkpoint was written (6 s,
    # not its own 3 s); past the limit, it went ahead at the limit with the checkpoint unwritten
    stamp = trigger["metadata"]["annotations"][STARTED_AT]
    if hold_seconds > 6:
        assert triggered_after >= 6.0, triggered_after
    else:
        assert triggered_after < 6.0, triggered_after
    assert stamp  # the add-on's own stamp, as our hold last moved it

    # When it is started again, and comes back live
    real_chain.set_paused("lab", False)
    resumed = real_chain.running(lab, previous_pod=first_pod)
    assert resumed is container
    server = RemoteServer(resumed.url, lab.jupyter_token)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert ready["how"] == "live", ready
    assert server.run(kernel_id, CHECKSUM_CELL) == expected
    # Then the timeline says whether the checkpoint came before the snapshot
    (taken,) = of_kind(events(server, "a.ipynb"), "snapshot_taken")
    assert taken["data"]["checkpoints_first"] is (hold_seconds > 6), taken
    assert taken["data"]["checkpoint_seconds"] >= 6.0, taken


def test_status_and_resume_answer_in_every_state_of_the_addons_cycle(
    gke_addon: SnapshotAddon,
    real_chain: RealPlayedCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same ``view`` answers both commands: each state of a pause is asked as a user
    would, at the moment it is there (in this process, so that a short state is not missed)."""
    # Given a notebook whose checkpoint takes 4 s, in a Workspace the add-on snapshots
    lab, container, server = enabled_lab(real_chain, tmp_path)
    first_pod = container.pod_uid
    kernel_id, expected = with_data(server)
    server.run(kernel_id, SLOW_CELL.format(seconds=4))
    # (the kubernetes client reads KUBECONFIG once, when imported: named here instead)
    kubeconfig = user_env(real_chain, tmp_path)["KUBECONFIG"]
    workspace = f"{real_chain.namespace}/lab"

    def status() -> str:
        assert cli_main(["status", "--workspace", workspace, "--kubeconfig", kubeconfig]) == 0
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err, out + err
        return out

    def held() -> dict[str, Any]:
        return real_chain.workspace_object("lab")["metadata"].get("annotations") or {}

    # Running, nothing recorded yet
    assert f"{workspace}: running - Running; no pause is recorded." in status()

    # When it is paused from the dashboard: held by the add-on while the server checkpoints
    real_chain.set_paused("lab", True)
    assert held()[CHECKPOINT_STATE] == "Checkpointing"
    line = status()
    assert f"{workspace}: pausing - The GKE Workspaces add-on holds the pause" in line, line
    # (and a resume asked now waits for the pause to be done, then undoes it)
    resume = resume_in_background(real_chain, tmp_path, "lab")

    # Then, the checkpoints written, the server's record of this pod's pause is on the
    # Workspace while the add-on still holds it (the state `status` crashed in)
    pod_uid = (real_chain.pod_of("lab") or {})["metadata"]["uid"]
    real_chain.wait(
        lambda: (
            held().get(CHECKPOINT_STATE) == "Checkpointing"
            and real_chain.state_annotation("lab").get("instance") == pod_uid
        ),
        60,
        "the server's record of the pause, in the add-on's hold",
    )
    line = status()
    assert f"{workspace}: pausing - The GKE Workspaces add-on holds the pause" in line, line
    assert "saved by jupyter_pause" in line, line

    # Then paused, and resumed by the resume asked during the hold, back live, ready
    out, err = resume.communicate(timeout=300)
    assert resume.returncode == 0, out + err
    assert "pausing - " in err and "Resumed " in out, out + err
    resumed = real_chain.running(lab, previous_pod=first_pod)
    assert resumed is container
    line = status()
    assert f"{workspace}: ready - Restored live (a.ipynb: ready)" in line, line
    server = RemoteServer(resumed.url, lab.jupyter_token)
    assert server.run(kernel_id, CHECKSUM_CELL) == expected


def test_a_pause_the_server_never_saw_is_said_and_nothing_of_the_old_pod_is_trusted(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a notebook with data in a Workspace the add-on snapshots, and its server stalled
    # (stopped) from before a pause from the dashboard until GKE restores the pod: it sees
    # neither the pause nor the snapshot, only the changes it missed, late
    lab, container, server = enabled_lab(real_chain, tmp_path)
    first_pod = container.pod_uid
    kernel_id, expected = with_data(server)
    os.kill(container.process.pid, signal.SIGSTOP)
    paused_from_dashboard(real_chain)
    real_chain.set_paused("lab", False)
    resumed = real_chain.running(lab, previous_pod=first_pod)  # GKE's restore thaws it all
    assert resumed is container

    # Then the server finds itself in another pod: it says so on the timeline (the kernel is
    # the very process; nothing was checkpointed first), and starts no pause of its own from
    # the stale changes of a pause that is over
    server = RemoteServer(resumed.url, lab.jupyter_token)
    timeline = real_chain.wait(
        lambda: of_kind(events(server, "a.ipynb"), "state_restored") and events(server, "a.ipynb"),
        60,
        "the server to say it was restored unseen",
    )
    (restored,) = of_kind(timeline, "state_restored")
    assert (restored["data"]["how"], restored["data"]["unseen"]) == ("live", True), restored
    assert "no checkpoint was taken before the pause" in restored["data"]["why"], restored
    assert not of_kind(timeline, "pause_requested")
    assert server.session("a.ipynb")["state"] == "active"
    assert server.run(kernel_id, CHECKSUM_CELL) == expected

    # When the notebook is then paused from our button, and resumed
    real_chain.wait(lambda: not real_chain.snapshot_names(), 90, "the add-on to retire it")
    code, record = server.request("POST", "/jupyter-pause/pause/a.ipynb")
    assert code == 202, record
    real_chain.wait(lambda: real_chain.pod_of("lab") is None, 120, "the pause to go through")
    real_chain.set_paused("lab", False)

    # Then it follows the add-on as always (its pod read afresh): back live, proven
    again = real_chain.running(lab, previous_pod=resumed.pod_uid)
    assert again is container
    server = RemoteServer(again.url, lab.jupyter_token)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert (ready["how"], ready["kernel_id"]) == ("live", kernel_id), ready
    assert server.run(kernel_id, CHECKSUM_CELL) == expected


def test_past_the_hold_limit_a_cold_start_restores_the_checkpoint_before_and_says_why(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a notebook checkpointed once (state A), changed since (state B), whose next
    # checkpoint takes 60 s, and an admin who lets the server hold the add-on 2 s only
    # (60 s: longer than the add-on's snapshot can take on a loaded machine, so the pod is
    # frozen before that checkpoint is complete; with 6 s, a slow snapshot let it complete,
    # and the cold start rightly restored state B)
    config = "c.PauseApp.outside_pause_hold_seconds = 2.0\n"
    lab, container, server = enabled_lab(real_chain, tmp_path, extra_config=config)
    first_pod = container.pod_uid
    kernel_id, before = with_data(server)
    assert server.request("POST", "/jupyter-pause/checkpoint/a.ipynb")[0] == 200
    server.run(kernel_id, "data[:10] = -1.0\n" + SLOW_CELL.format(seconds=60))
    assert server.run(kernel_id, CHECKSUM_CELL) != before

    # When it is paused from the dashboard (the snapshot taken before the checkpoint was
    # written) and started again where GKE cannot restore that snapshot
    paused_from_dashboard(real_chain)
    real_chain.restore_mode = "mismatch"
    real_chain.set_paused("lab", False)

    # Then a new server restores the last complete checkpoint (state A), and says why: the
    # pause from outside stopped the pod before every kernel was checkpointed
    resumed = real_chain.running(lab, previous_pod=first_pod)
    assert resumed is not container
    server = RemoteServer(resumed.url, lab.jupyter_token)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert ready["how"] == "files", ready
    message = ready["message"]
    assert "paused from outside jupyter_pause" in message.lower(), message
    assert "does not match this pod's spec hash" in message, message
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == before
    print("MESSAGE", message)
