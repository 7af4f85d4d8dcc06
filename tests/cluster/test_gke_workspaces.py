"""GKE Workspaces mode, end to end: our pause button on a Workspace the real snapshot add-on
snapshots, on the real chain (real controller-manager and scheduler, upstream CRDs; the
Notebooks controller, kubelet and GKE's node agent played: ``real_players.py``).

What a user on GKE Workspaces must get from our pause button: exactly one snapshot (the
add-on's), nothing of ours beside it (no policy, trigger or pin), a timeline that says which
mode, what was saved and how it came back, and the same data after the resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .control_plane import SnapshotAddon
from .notebooks import RemoteServer
from .real_players import (
    ORIGIN_POD,
    PIN_ANNOTATION,
    RESTORED,
    TRIGGERED_BY,
    Container,
    PlayedWorkspace,
    RealPlayedCluster,
    condition,
)
from .test_real_chain import CHECKPOINT_STATE, LAST_CHECKPOINT, enabled_workspace, pause_details
from .test_workspace import (
    CHECKSUM_CELL,
    DATA_CELL,
    cli,
    notebook_with_data,
    resume_in_background,
)

ADDON_TRIGGER = "ws-lab-trigger"


def server_of(played: PlayedWorkspace, container: Container) -> RemoteServer:
    return RemoteServer(container.url, played.jupyter_token)


def ours(chain: RealPlayedCluster, plural: str) -> list[str]:
    """Objects of ``plural`` a pause of ours would have made (``jp-`` names): none here."""
    return [
        item["metadata"]["name"]
        for item in chain.api.list(
            f"/apis/podsnapshot.gke.io/v1/namespaces/{chain.namespace}/{plural}"
        )
        if item["metadata"]["name"].startswith("jp-")
    ]


def events(server: RemoteServer, path: str) -> list[dict[str, Any]]:
    code, timeline = server.request("GET", f"/jupyter-pause/timeline/{path}")
    assert code == 200
    return timeline["events"]


def paused_by_our_button(
    chain: RealPlayedCluster, lab: PlayedWorkspace, container: Container
) -> tuple[RemoteServer, str, str]:
    """A notebook with data, paused from our button: (server, kernel, checksum); returns once
    the add-on let the pause through and the pod went."""
    server = server_of(lab, container)
    details = pause_details(server, chain)
    assert (details["mode"], details["problem"]) == ("gke-workspaces", None), details
    kernel_id = server.open_notebook("a.ipynb")
    server.run(kernel_id, DATA_CELL)
    expected = server.run(kernel_id, CHECKSUM_CELL)
    code, record = server.request("POST", "/jupyter-pause/pause/a.ipynb")
    assert code == 202, record
    chain.wait(
        lambda: chain.workspace_object("lab")["spec"]["paused"] and chain.pod_of("lab") is None,
        120,
        "the add-on to let the pause through and the pod to go",
    )
    return server, kernel_id, expected


@pytest.mark.parametrize("restore", ["live", "mismatch"])
def test_our_pause_button_makes_exactly_the_addons_one_snapshot_and_comes_back(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path, restore: str
) -> None:
    # Given a Workspace the add-on snapshots, our server in its pod, a notebook with data
    lab, container, pod = enabled_workspace(real_chain, tmp_path)
    first_pod = container.pod_uid  # (a restored container takes the new pod's uid)

    # When the notebook is paused from our button
    server, kernel_id, expected = paused_by_our_button(real_chain, lab, container)

    # Then exactly one snapshot was taken: the add-on's, of this pod; nothing of ours beside it
    (snapshot,) = real_chain.snapshot_names()
    found = real_chain.snapshot_object("podsnapshots", snapshot)
    assert found is not None
    labels = found["metadata"]["labels"]
    assert labels["gke-pod-snapshot-triggered-by"] == ADDON_TRIGGER
    assert labels["podsnapshot.gke.io/origin-pod"] == pod["metadata"]["name"]
    assert ours(real_chain, "podsnapshotmanualtriggers") == []
    assert ours(real_chain, "podsnapshotpolicies") == []
    workspace = real_chain.workspace_object("lab")
    assert workspace["metadata"]["annotations"][LAST_CHECKPOINT] == snapshot
    template = workspace["spec"]["podTemplate"].get("podMetadata") or {}
    assert PIN_ANNOTATION not in (template.get("annotations") or {})  # the add-on pins, not us
    # (the pod was stopped by its snapshot, as the add-on's policy says: our process with it)
    assert container.frozen and "snapshot-stopped" in container.signals
    # And while it is paused, the Workspace says who paused it, what was saved, how and which
    # snapshot (our server was stopped by the add-on's snapshot before it could say more)
    status = cli(real_chain, tmp_path, "status", "--workspace", f"{real_chain.namespace}/lab")
    line = status.stdout
    assert status.returncode == 0 and f"{real_chain.namespace}/lab: paused - Paused since" in line
    assert f"pod snapshot {snapshot} (by the GKE Workspaces add-on)" in line, line
    assert "0 B saved" not in line and "gke-workspaces" in line, line

    # When the user resumes it from outside (as the Kubeflow UI's Start does)
    real_chain.restore_mode = restore
    done = cli(real_chain, tmp_path, "resume", "--workspace", f"{real_chain.namespace}/lab")

    # Then the add-on pinned its snapshot on the new pod, GKE restored it (or could not), and
    # we say which: live only for the very process that paused, proven
    assert done.returncode == 0, done.stderr + done.stdout
    resumed = real_chain.running(lab, previous_pod=first_pod)
    new_pod = real_chain.pod_of("lab")
    assert new_pod is not None and new_pod["metadata"]["annotations"][PIN_ANNOTATION] == snapshot
    server = server_of(lab, resumed)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    if restore == "live":
        assert resumed is container
        assert ready["how"] == "live" and ready["kernel_id"] == kernel_id, ready
        assert f"restored from snapshot {snapshot}" in ready["message"], ready["message"]
    else:
        assert resumed is not container
        assert ready["how"] == "files", ready
        assert "does not match this pod's spec hash" in ready["message"], ready["message"]
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    # And the timeline says which snapshot, and how it came back (a cold start's timeline is
    # the volume's: its server was stopped by the snapshot before it could write it there)
    timeline = events(server, "a.ipynb")
    (restored,) = [e["data"] for e in timeline if e["kind"] == "state_restored"]
    assert snapshot in restored["why"], restored
    if restore == "live":
        (taken,) = [e["data"] for e in timeline if e["kind"] == "snapshot_taken"]
        assert (taken["mode"], taken["name"]) == ("gke-workspaces", snapshot), taken
        assert restored["how"] == "live" and restored["token_matched"] is True
    else:
        assert restored["how"] == "files" and "NoMatchingSnapshot" not in restored["why"]
    assert cli(real_chain, tmp_path, "status", "--workspace", f"{real_chain.namespace}/lab")
    recorded = real_chain.workspace_object("lab")["metadata"]["annotations"]
    assert '"mode": "gke-workspaces"' in recorded["jupyter-pause.io/state"]
    # And the add-on retires its snapshot and trigger once the pod is Ready: nothing is left
    real_chain.wait(
        lambda: (
            not real_chain.snapshot_names()
            and real_chain.snapshot_object("podsnapshotmanualtriggers", ADDON_TRIGGER) is None
        ),
        90,
        "the add-on to retire the snapshot and its trigger",
    )
    assert RESTORED in {c["type"] for c in new_pod["status"]["conditions"]}


def test_a_snapshot_the_addon_cannot_take_still_pauses_and_comes_back_cold_saying_why(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a Workspace the add-on snapshots, and GKE's next snapshot failing
    lab, container, _pod = enabled_workspace(real_chain, tmp_path)
    first_pod = container.pod_uid
    real_chain.fail_next_trigger("the sandbox could not be checkpointed")

    # When the notebook is paused from our button: the add-on alone would hold the pause
    # for ever; ours lets it through without a snapshot once GKE said it failed
    server, _kernel_id, expected = paused_by_our_button(real_chain, lab, container)
    annotations = real_chain.workspace_object("lab")["metadata"]["annotations"]
    assert annotations[CHECKPOINT_STATE] == "Ready" and LAST_CHECKPOINT not in annotations
    assert not container.frozen  # its processes were stopped, not kept: no snapshot holds them

    # When it is resumed
    done = cli(real_chain, tmp_path, "resume", "--workspace", f"{real_chain.namespace}/lab")

    # Then a cold start: no pin, nothing restored by GKE, the checkpoint restored from files,
    # and the timeline (read from the volume) says the mode and why there was no snapshot
    assert done.returncode == 0, done.stderr + done.stdout
    resumed = real_chain.running(lab, previous_pod=first_pod)
    new_pod = real_chain.pod_of("lab")
    assert new_pod is not None
    assert PIN_ANNOTATION not in (new_pod["metadata"].get("annotations") or {})
    server = server_of(lab, resumed)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert ready["how"] == "files", ready
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    (missing,) = [e["data"] for e in events(server, "a.ipynb") if e["kind"] == "snapshot_missing"]
    assert missing["mode"] == "gke-workspaces", missing
    assert "the sandbox could not be checkpointed" in missing["why"], missing
    # And the add-on cleans up after the start, as after any pause of its own
    real_chain.wait(
        lambda: (
            not real_chain.snapshot_names()
            and CHECKPOINT_STATE
            not in (real_chain.workspace_object("lab")["metadata"].get("annotations") or {})
        ),
        90,
        "the add-on to clean up",
    )


def test_with_the_addon_present_a_workspace_not_enabled_is_paused_our_way(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given the add-on in the cluster, and a Workspace that is not enabled for it (no policy
    # of ours either)
    real_chain.node("gpu", gpus=1)
    kind = real_chain.workspace_kind(gpus=1)
    lab = real_chain.workspace("lab", kind, tmp_path / "home")
    container = real_chain.running(lab)
    first_pod = container.pod_uid
    server = server_of(lab, container)

    # Then the server does not take it for the add-on's: no snapshots, and it says so
    details = pause_details(server, real_chain)
    assert details["mode"] == "no-snapshots", details

    # When it is paused from our button, the add-on leaves it alone: no snapshot at all, and
    # the pod goes at once
    kernel_id = server.open_notebook("a.ipynb")
    server.run(kernel_id, DATA_CELL)
    expected = server.run(kernel_id, CHECKSUM_CELL)
    assert server.request("POST", "/jupyter-pause/pause/a.ipynb")[0] == 202
    real_chain.wait(lambda: real_chain.pod_of("lab") is None, 120, "the pod to go")
    assert real_chain.snapshot_names() == []
    assert CHECKPOINT_STATE not in (
        real_chain.workspace_object("lab")["metadata"].get("annotations") or {}
    )
    done = cli(real_chain, tmp_path, "resume", "--workspace", f"{real_chain.namespace}/lab")
    assert done.returncode == 0, done.stderr + done.stdout
    server = server_of(lab, real_chain.running(lab, previous_pod=first_pod))
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
    assert ready["how"] == "files" and server.run(ready["kernel_id"], CHECKSUM_CELL) == expected


def test_two_workspaces_paused_at_once_each_get_the_addons_own_snapshot_and_their_data_back(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given two Workspaces the add-on snapshots, on one GKE Sandbox node with two GPUs, our
    # server in each pod, each with its own data
    real_chain.node("sandbox", gpus=2, sandbox=True)
    kind = real_chain.workspace_kind(mode="gke-workspaces")
    names = ("alpha", "beta")
    labs = {n: real_chain.workspace(n, kind, tmp_path / n, enabled=True) for n in names}
    containers = {n: real_chain.running(labs[n]) for n in names}
    first_pods = {n: containers[n].pod_uid for n in names}  # (a restored one takes the new uid)
    pods = {n: (real_chain.pod_of(n) or {})["metadata"]["name"] for n in names}
    servers = {n: server_of(labs[n], containers[n]) for n in names}
    kernels, expected = {}, {}
    for scale, name in enumerate(names, start=2):
        details = pause_details(servers[name], real_chain)
        assert (details["mode"], details["workspace"]) == ("gke-workspaces", name), details
        kernels[name], expected[name] = notebook_with_data(servers[name], "a.ipynb", scale)
    assert expected["alpha"] != expected["beta"]

    # When both notebooks are paused from our button at once
    for name in names:
        code, record = servers[name].request("POST", "/jupyter-pause/pause/a.ipynb")
        assert code == 202, record
    real_chain.wait(
        lambda: all(
            real_chain.workspace_object(n)["spec"]["paused"] and real_chain.pod_of(n) is None
            for n in names
        ),
        180,
        "the add-on to let both pauses through and both pods to go",
    )

    # Then each Workspace got exactly one snapshot, the add-on's, of its own pod, on its own
    # trigger; nothing of ours beside them
    taken = {
        n: real_chain.workspace_object(n)["metadata"]["annotations"][LAST_CHECKPOINT] for n in names
    }
    assert taken["alpha"] != taken["beta"]
    assert real_chain.snapshot_names() == sorted(taken.values())
    for name in names:
        found = real_chain.snapshot_object("podsnapshots", taken[name])
        assert found is not None
        assert found["metadata"]["labels"][TRIGGERED_BY] == f"ws-{name}-trigger"
        assert found["metadata"]["labels"][ORIGIN_POD] == pods[name]
        assert containers[name].frozen  # stopped by its own snapshot
    assert ours(real_chain, "podsnapshotmanualtriggers") == []
    assert ours(real_chain, "podsnapshotpolicies") == []

    # When the user resumes both from outside at once
    resumes = [resume_in_background(real_chain, tmp_path, name) for name in names]
    outputs = [process.communicate(timeout=300) for process in resumes]
    assert [p.returncode for p in resumes] == [0, 0], outputs

    # Then each came back live from its own snapshot (the add-on pinned it on the new pod, GKE
    # restored it and said which), the very process that paused, with its own data
    for name in names:
        resumed = real_chain.running(labs[name], previous_pod=first_pods[name])
        assert resumed is containers[name]
        new_pod = real_chain.pod_of(name)
        assert new_pod is not None
        assert new_pod["metadata"]["annotations"][PIN_ANNOTATION] == taken[name]
        restored = condition(new_pod, RESTORED)
        assert restored["status"] == "True" and taken[name] in restored["message"], restored
        server = server_of(labs[name], resumed)
        ready = server.wait_state("a.ipynb", "ready", "partial", "failed", timeout=180)
        assert ready["how"] == "live" and ready["kernel_id"] == kernels[name], ready
        assert f"restored from snapshot {taken[name]}" in ready["message"], ready["message"]
        assert server.run(kernels[name], CHECKSUM_CELL) == expected[name]
    # And the add-on retires both snapshots and both triggers
    real_chain.wait(
        lambda: (
            not real_chain.snapshot_names()
            and not real_chain.snapshot_objects("podsnapshotmanualtriggers")
        ),
        90,
        "the add-on to retire both snapshots and their triggers",
    )
