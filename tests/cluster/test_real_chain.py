"""The played parts of a GKE cluster (``real_players.py``) on the real components, end to end:
a Workspace (Kubeflow's own CRD) -> the played workspace controller's StatefulSet -> the real
controller-manager's Pod -> the real scheduler's binding -> the played kubelet's real jupyter
server; and, with the real GKE Workspaces add-on, a pause from the Kubeflow side that GKE's played
node agent snapshots and restores. Every wait has a deadline; nothing is timed.
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path
from typing import Any

import pytest

from .control_plane import GPU, SnapshotAddon
from .notebooks import RemoteServer
from .real_players import (
    ACTIVE_GATE,
    GVISOR,
    IMAGE,
    ORIGIN_POD,
    PIN_ANNOTATION,
    RESTORED,
    TRIGGERED_BY,
    Container,
    PlayedWorkspace,
    RealPlayedCluster,
    condition,
)

CHECKPOINT_STATE = "podsnapshot.gke.kubeflow.org/checkpoint-state"
LAST_CHECKPOINT = "podsnapshot.gke.kubeflow.org/last-checkpoint-name"
IMAGE_PULL_BACK_OFF = "Workspace Container is not running (ImagePullBackOff)"


def server_of(played: PlayedWorkspace, container: Container) -> RemoteServer:
    return RemoteServer(container.url, played.jupyter_token)


def pause_details(server: RemoteServer, chain: RealPlayedCluster) -> dict[str, Any]:
    """What jupyter_pause in the pod says of its pod and Workspace, once it has read its pod
    (with the pod's own token: the shipped Role, nothing more)."""

    def read() -> dict[str, Any] | None:
        code, status = server.request("GET", "/jupyter-pause/status")
        assert code == 200, status
        details = status["resources"]["details"]
        return details if details.get("workspace") or details.get("problem") else None

    return chain.wait(read, 60, "jupyter_pause to read its pod")


def test_a_workspace_becomes_a_running_pod_whose_jupyter_server_answers_with_its_token(
    real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a GPU node and a WorkspaceKind under Kubeflow's own CRDs
    node = real_chain.node("gpu", gpus=1)
    kind = real_chain.workspace_kind(gpus=1)

    # When a Workspace is created
    lab = real_chain.workspace("lab", kind, tmp_path / "home")

    # Then the chain runs it: a StatefulSet of the Workspace, its pod bound to the GPU node, a
    # jupyter server in it, and the Workspace Running, as upstream's controller reports it
    container = real_chain.running(lab)
    stateful_set = real_chain.stateful_set("lab")
    assert stateful_set is not None and stateful_set["metadata"]["name"].startswith("ws-lab-")
    assert stateful_set["spec"]["replicas"] == 1
    pod = real_chain.pod_of("lab")
    assert pod is not None
    assert pod["metadata"]["name"] == f"{stateful_set['metadata']['name']}-0"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    assert pod["spec"]["nodeName"] == node
    assert pod["spec"]["serviceAccountName"] == "ws-lab"  # upstream: one account per Workspace
    assert pod["spec"]["containers"][0]["resources"]["limits"][GPU] == "1"
    assert pod["status"]["phase"] == "Running" and condition(pod, "Ready")["status"] == "True"
    status = real_chain.status("lab")
    assert status["stateMessage"] == "Workspace is running"
    assert status["podTemplatePod"] == {
        "name": pod["metadata"]["name"],
        "nodeName": node,
        "serviceAccountName": "ws-lab",
        "containers": [{"name": "main"}],
    }
    assert status["pauseTime"] == 0
    assert abs(status["lastRunningTime"] - time.time() * 1000) < 600_000  # milliseconds

    # And the server answers with its token only
    server = server_of(lab, container)
    assert server.request("GET", "/api/status")[0] == 200
    assert RemoteServer(container.url, "wrong").request("GET", "/api/status")[0] == 403
    # And it found its pod and Workspace from the pod's env and token (the shipped Role)
    details = pause_details(server, real_chain)
    assert details["problem"] is None, details
    assert (details["pod"], details["workspace"], details["namespace"]) == (
        pod["metadata"]["name"],
        "lab",
        real_chain.namespace,
    )
    assert details["mode"] == "no-snapshots"  # no add-on, no policy
    # And its files land on the home volume (the PVC's volume, which outlives the pod)
    code, _ = server.request("PUT", "/api/contents/hello.txt",
                             {"type": "file", "format": "text", "content": "hi"})  # fmt: skip
    assert code == 201
    assert (tmp_path / "home" / "hello.txt").read_text() == "hi"


def test_a_pause_takes_the_pod_away_with_sigterm_and_reports_paused_in_milliseconds(
    real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a running Workspace
    real_chain.node("gpu", gpus=1)
    lab = real_chain.workspace("lab", real_chain.workspace_kind(), tmp_path / "home")
    container = real_chain.running(lab)
    first_pod = container.pod_uid
    before = int(time.time() * 1000)

    # When it is paused as the Kubeflow UI does
    real_chain.set_paused("lab", True)

    # Then its StatefulSet has no replica, its pod goes (its server stopped by SIGTERM within
    # the grace period), and the Workspace is Paused since a time in milliseconds
    real_chain.wait(
        lambda: (real_chain.stateful_set("lab") or {}).get("spec", {}).get("replicas") == 0,
        30,
        "the controller to scale the StatefulSet to 0",
    )
    real_chain.wait(lambda: real_chain.pod_of("lab") is None, 90, "the pod to go")
    assert container.signals == ["SIGTERM"], container.signals
    assert container.exit_seconds is not None and container.process.returncode is not None
    status = real_chain.wait(
        lambda: (s := real_chain.status("lab"))["state"] == "Paused" and s,
        30,
        "the Workspace to be Paused",
    )
    after = int(time.time() * 1000)
    assert status["stateMessage"] == "Workspace is paused"
    assert before <= status["pauseTime"] <= after, (before, status["pauseTime"], after)
    # (upstream's "" name and nodeName are left out: kube-apiserver 1.20 refuses "")
    assert status["podTemplatePod"] == {"serviceAccountName": "ws-lab"}
    assert lab.current is None

    # When it is resumed, then a new pod runs a new server, and pauseTime is 0 again
    real_chain.set_paused("lab", False)
    resumed = real_chain.running(lab, previous_pod=first_pod)
    assert resumed is not container and resumed.process.pid != container.process.pid
    status = real_chain.status("lab")
    assert status["pauseTime"] == 0 and status["lastRunningTime"] >= after


def test_an_unpullable_image_is_an_error_naming_image_pull_back_off_then_runs_once_pulled(
    real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given an image no registry serves
    real_chain.node("gpu", gpus=1)
    real_chain.make_unpullable(IMAGE)

    # When a Workspace of that image is created
    lab = real_chain.workspace("lab", real_chain.workspace_kind(), tmp_path / "home")

    # Then it is in Error, saying why, and no process runs for it
    status = real_chain.wait(
        lambda: (s := real_chain.status("lab")).get("stateMessage") == IMAGE_PULL_BACK_OFF and s,
        90,
        "the Workspace to report ImagePullBackOff",
    )
    assert status["state"] == "Error"
    pod = real_chain.pod_of("lab")
    assert pod is not None
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ImagePullBackOff"
    assert lab.current is None and lab.containers == []

    # When the image can be pulled again, then the kubelet's next try runs it
    real_chain.make_pullable(IMAGE)
    real_chain.running(lab)


def test_gpus_held_by_another_team_leave_the_workspace_unschedulable_until_one_frees(
    real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given the only GPU of the pool held by another team's pod
    real_chain.node("gpu", gpus=1)
    (training,) = real_chain.block_gpus(1)
    real_chain.wait(
        lambda: any(
            p.name == training and p.phase == "running" for p in list(real_chain.pods.values())
        ),
        60,
        "the other team's pod to run",
    )

    # When a Workspace wants it
    lab = real_chain.workspace("lab", real_chain.workspace_kind(gpus=1), tmp_path / "home")

    # Then it is in Error with the scheduler's reason
    status = real_chain.wait(
        lambda: (
            (s := real_chain.status("lab"))
            .get("stateMessage", "")
            .startswith("Workspace Pod is unschedulable: ")
            and s
        ),
        90,
        "the Workspace to report its pod unschedulable",
    )
    assert status["state"] == "Error"
    assert f"Insufficient {GPU}" in status["stateMessage"], status["stateMessage"]
    assert lab.current is None

    # When the other team's pod ends, then the Workspace gets the GPU and runs
    real_chain.release_gpus()
    real_chain.running(lab)


def enabled_workspace(
    chain: RealPlayedCluster, tmp_path: Path, extra_config: str = ""
) -> tuple[PlayedWorkspace, Container, dict[str, Any]]:
    """A running Workspace the GKE Workspaces add-on snapshots, on a GKE Sandbox node
    (``extra_config``: more server settings for its pods)."""
    chain.node("sandbox", gpus=1, sandbox=True)
    kind = chain.workspace_kind(mode="gke-workspaces")
    lab = chain.workspace("lab", kind, tmp_path / "home", enabled=True, extra_config=extra_config)
    container = chain.running(lab)  # Ready only once the add-on opened its readiness gate
    pod = chain.pod_of("lab")
    assert pod is not None
    assert pod["spec"]["runtimeClassName"] == GVISOR  # the add-on's pod webhook
    assert condition(pod, ACTIVE_GATE)["status"] == "True"
    return lab, container, pod


def pause_from_kubeflow(chain: RealPlayedCluster) -> tuple[str, dict[str, Any]]:
    """``spec.paused: true`` as the Kubeflow UI sends it; once the add-on let it through, the
    one PodSnapshot there is and the Workspace."""
    answer = chain.set_paused("lab", True)
    assert answer["spec"]["paused"] is False  # held back while GKE snapshots the pod
    assert answer["metadata"]["annotations"][CHECKPOINT_STATE] == "Checkpointing"
    workspace = chain.wait(
        lambda: (w := chain.workspace_object("lab"))["spec"]["paused"] and w,
        90,
        "the add-on to let the pause through",
    )
    (snapshot,) = chain.snapshot_names()  # exactly one: the add-on's
    return snapshot, workspace


@pytest.mark.parametrize("restore", ["live", "mismatch"])
def test_a_kubeflow_pause_on_gke_workspaces_makes_one_snapshot_that_the_resume_restores(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path, restore: str
) -> None:
    # Given a running Workspace the add-on snapshots
    lab, container, pod = enabled_workspace(real_chain, tmp_path)
    pod_name = pod["metadata"]["name"]

    if restore == "live":  # jupyter_pause in the pod sees the add-on (its RBAC, its config)
        details = pause_details(server_of(lab, container), real_chain)
        assert (details["mode"], details["problem"]) == ("gke-workspaces", None), details

    # When it is paused from the Kubeflow side
    snapshot, workspace = pause_from_kubeflow(real_chain)

    # Then GKE (played) made one snapshot, of this pod, on the add-on's trigger and policy
    found = real_chain.snapshot_object("podsnapshots", snapshot)
    assert found is not None
    assert found["metadata"]["labels"] == {TRIGGERED_BY: "ws-lab-trigger", ORIGIN_POD: pod_name}
    assert found["spec"]["policyName"] == "ws-lab-policy"
    assert condition(found, "Ready")["status"] == "True"
    trigger = real_chain.snapshot_object("podsnapshotmanualtriggers", "ws-lab-trigger")
    assert trigger is not None and trigger["status"]["snapshotCreated"] == {"name": snapshot}
    assert condition(trigger, "Triggered")["status"] == "True"
    assert workspace["metadata"]["annotations"][LAST_CHECKPOINT] == snapshot
    # And the pod went without a SIGTERM: its processes were stopped by the snapshot
    # (postCheckpoint: stop) and are what the snapshot holds
    real_chain.wait(lambda: real_chain.pod_of("lab") is None, 90, "the pod to go")
    assert container.signals == ["snapshot-stopped", "kept-frozen"], container.signals
    assert container.frozen and container.process.poll() is None
    real_chain.wait(lambda: real_chain.status("lab")["state"] == "Paused", 30, "Paused")

    # When it is resumed from the Kubeflow side
    real_chain.restore_mode = restore
    real_chain.set_paused("lab", False)

    # Then the new pod pins the snapshot (the add-on's webhook) and GKE restores it: the same
    # processes, thawed; or, where it no longer matches, a cold start that says why
    resumed = real_chain.running(lab, previous_pod=container.pod_uid)
    new_pod = real_chain.pod_of("lab")
    assert new_pod is not None
    assert new_pod["metadata"]["annotations"][PIN_ANNOTATION] == snapshot
    restored = condition(new_pod, RESTORED)
    assert snapshot in restored["message"], restored
    if restore == "live":
        assert restored["status"] == "True"
        assert resumed is container and container.signals[-1] == "restored"
        assert server_of(lab, resumed).request("GET", "/api/status")[0] == 200
    else:
        assert (restored["status"], restored["reason"]) == ("False", "NoMatchingSnapshot")
        assert resumed is not container and resumed.process.pid != container.process.pid
    # And the add-on, the pod Ready, deletes the snapshot and its trigger (whose processes end
    # with it where nothing restored them)
    real_chain.wait(
        lambda: (
            not real_chain.snapshot_names()
            and real_chain.snapshot_object("podsnapshotmanualtriggers", "ws-lab-trigger") is None
        ),
        60,
        "the add-on to retire the snapshot and its trigger",
    )
    annotations = real_chain.workspace_object("lab")["metadata"].get("annotations") or {}
    assert CHECKPOINT_STATE not in annotations and LAST_CHECKPOINT not in annotations
    if restore != "live":
        real_chain.wait(
            lambda: container.process.poll() is not None, 30, "the unrestored processes to end"
        )


def test_a_pod_without_a_pin_is_restored_from_the_newest_matching_snapshot(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a Workspace paused from the Kubeflow side, with the add-on's one snapshot
    lab, container, _pod = enabled_workspace(real_chain, tmp_path)
    snapshot, _workspace = pause_from_kubeflow(real_chain)
    real_chain.wait(lambda: real_chain.pod_of("lab") is None, 90, "the pod to go")

    # When its pin is dropped before the resume (the add-on then pins nothing)
    real_chain.api.merge(
        f"/apis/kubeflow.org/v1beta1/namespaces/{real_chain.namespace}/workspaces/lab",
        {"metadata": {"annotations": {LAST_CHECKPOINT: None}}},
    )
    real_chain.set_paused("lab", False)

    # Then GKE restores the newest snapshot that matches the pod anyway, and says which
    resumed = real_chain.running(lab, previous_pod=container.pod_uid)
    new_pod = real_chain.pod_of("lab")
    assert new_pod is not None
    assert PIN_ANNOTATION not in (new_pod["metadata"].get("annotations") or {})
    restored = condition(new_pod, RESTORED)
    assert restored["status"] == "True" and snapshot in restored["message"], restored
    assert resumed is container


def test_alone_the_addon_holds_a_pause_whose_snapshot_failed_with_the_pod_running(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a running Workspace the add-on snapshots, its server without jupyter_pause's
    # workspace backend (nothing follows the add-on: what it does alone), and GKE's next
    # snapshot failing
    alone = "c.PauseApp.backend = 'local'\n"
    lab, container, _pod = enabled_workspace(real_chain, tmp_path, extra_config=alone)
    real_chain.fail_next_trigger("the sandbox could not be checkpointed")

    # When it is paused from the Kubeflow side
    answer = real_chain.set_paused("lab", True)
    assert answer["spec"]["paused"] is False

    # Then the add-on's trigger made a PodSnapshot that failed, saying why
    trigger = real_chain.wait(
        lambda: (
            (t := real_chain.snapshot_object("podsnapshotmanualtriggers", "ws-lab-trigger"))
            and (t.get("status") or {}).get("snapshotCreated")
            and t
        ),
        60,
        "GKE to answer the add-on's trigger",
    )
    failed = real_chain.snapshot_object(
        "podsnapshots", trigger["status"]["snapshotCreated"]["name"]
    )
    assert failed is not None
    ready = condition(failed, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Failed")
    assert ready["message"] == "the sandbox could not be checkpointed"
    # And the add-on keeps holding the pause while the pod's processes keep running, out of
    # its Service: its readiness gate False, so the kubelet keeps it not Ready, and upstream's
    # controller, seeing a Running pod that is not Ready, reports the state as Unknown
    status = real_chain.wait(
        lambda: (s := real_chain.status("lab"))["state"] == "Unknown" and s,
        30,
        "the Workspace's state to follow its pod out of Ready",
    )
    assert status["stateMessage"] == "Workspace is in an unknown state"
    pod = real_chain.pod_of("lab")
    assert pod is not None and pod["status"]["phase"] == "Running"
    assert condition(pod, ACTIVE_GATE)["status"] == "False"
    assert condition(pod, "Ready")["status"] == "False"
    assert condition(pod, "ContainersReady")["status"] == "True"
    workspace = real_chain.workspace_object("lab")
    assert workspace["spec"]["paused"] is False
    assert workspace["metadata"]["annotations"][CHECKPOINT_STATE] == "Checkpointing"
    assert not container.frozen and container.signals == []
    assert server_of(lab, container).request("GET", "/api/status")[0] == 200


@pytest.mark.parametrize("mode", ["no-snapshots", "gke-workspaces"])
def test_a_shipped_workspace_kind_runs_and_its_server_finds_its_mode(
    request: pytest.FixtureRequest, mode: str, tmp_path: Path
) -> None:
    # Given the mode's shipped WorkspaceKind and RBAC (and the add-on, for its mode)
    if mode == "gke-workspaces":
        request.getfixturevalue("gke_addon")
    chain: RealPlayedCluster = request.getfixturevalue("real_chain")
    chain.node("gpu", gpus=1, sandbox=mode == "gke-workspaces")
    kind = chain.shipped_workspace_kind(mode)

    # When a Workspace of that kind is created
    lab = chain.workspace("lab", kind, tmp_path / "home")

    # Then it runs, and jupyter_pause in it reads its pod with the Workspace's own account and
    # names the mode it will pause in
    container = chain.running(lab)
    details = pause_details(server_of(lab, container), chain)
    assert (details["mode"], details["problem"], details["workspace"]) == (mode, None, "lab")
    pod = chain.pod_of("lab")
    assert pod is not None and pod["spec"]["serviceAccountName"] == "ws-lab"


def test_a_workload_checkpoint_through_gvisors_file_is_answered_once_its_snapshot_is_taken(
    gke_addon: SnapshotAddon, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a gVisor pod (the add-on's) that a workload-triggered policy of the namespace selects
    lab, container, pod = enabled_workspace(real_chain, tmp_path)
    real_chain.create_policy("workload", trigger="workload", post_checkpoint="resume")
    assert container.gvisor_file is not None

    # When the workload asks gVisor for a checkpoint, on one descriptor as gVisor documents it
    descriptor = os.open(container.gvisor_file, os.O_RDWR | os.O_NOCTTY)
    try:
        os.write(descriptor, b"1")
        # the read blocks until the checkpoint is done; a deadline keeps a silent agent from
        # hanging the test
        ready, _, _ = select.select([descriptor], [], [], 60)
        assert ready, "gVisor's checkpoint file gave no answer in 60 s"
        answer = os.read(descriptor, 1)
    finally:
        os.close(descriptor)

    # Then the answer came once a Ready PodSnapshot of this pod existed, under that policy, and
    # the pod runs on (postCheckpoint: resume)
    assert answer == b"r"
    (name,) = real_chain.snapshot_names()
    found = real_chain.snapshot_object("podsnapshots", name)
    assert found is not None
    assert found["metadata"]["labels"][ORIGIN_POD] == pod["metadata"]["name"]
    assert found["spec"]["policyName"] == "workload"
    assert condition(found, "Ready")["status"] == "True"
    assert not container.frozen
    assert server_of(lab, container).request("GET", "/api/status")[0] == 200
