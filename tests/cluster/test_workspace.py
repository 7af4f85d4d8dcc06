"""The workspace backend against a real Kubernetes API server, the cluster's other parts played.

Every "pod" is a real jupyter server with real kernels on this machine; it talks to the API
server with a service-account token from the TokenRequest API, bound only to the shipped
RBAC (deploy/modes/pod-snapshots/: the mode's ClusterRole and the Workspace's own Role). Given/When/Then; the data's checksum is compared after every return.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_pause.backends.workspace import NOT_DETECTED

from .control_plane import ControlPlane
from .notebooks import RemoteServer
from .players import PlayedCluster, WorkspacePlay, wait_for

DATA_CELL = """
import hashlib, os, numpy as np
os.environ["EXPERIMENT"] = "gpu-42"
data = np.arange(300_000, dtype=np.float64) * 1.5
weights = {"w": np.linspace(0.0, 1.0, 5000)}
"""
CHECKSUM_CELL = (
    "print(hashlib.sha256(data.tobytes() + weights['w'].tobytes()).hexdigest(), "
    "os.environ['EXPERIMENT'], np.__name__)"
)


def server_of(play: WorkspacePlay) -> RemoteServer:
    assert play.current is not None, "the workspace has no running pod"
    return RemoteServer(play.current.url, play.jupyter_token)


def running(
    cluster: PlayedCluster, play: WorkspacePlay, previous: str | None = None
) -> RemoteServer:
    """The server of the workspace's pod once it runs (another pod than ``previous``)."""
    wait_for(
        lambda: (
            play.current is not None
            and play.current.pod_uid != previous
            and not play.current.frozen
        ),
        120,
        "the workspace's pod to run",
    )
    return server_of(play)


def notebook_with_data(server: RemoteServer, path: str) -> tuple[str, str]:
    kernel_id = server.open_notebook(path)
    server.run(kernel_id, DATA_CELL)
    return kernel_id, server.run(kernel_id, CHECKSUM_CELL)


def store(play: WorkspacePlay) -> Path:
    """The checkpoint store on the workspace's home volume (the shipped config's store_root)."""
    return play.home / ".jupyter-pause" / "checkpoints"


def on_volume(play: WorkspacePlay) -> dict[str, dict]:
    """Each notebook's session record as the PVC holds it (readable while no pod runs)."""
    records = {}
    for path in store(play).glob("*/session.json"):
        record = json.loads(path.read_text())
        records[record["path"]] = record
    return records


def pause_workspace(cluster: PlayedCluster, play: WorkspacePlay, path: str) -> dict[str, dict]:
    """Pause a notebook (so the workspace); once its pod is gone, what the PVC says."""
    code, record = server_of(play).request("POST", f"/jupyter-pause/pause/{path}")
    assert code == 202 and record["state"] == "checkpointing", record
    wait_for(
        lambda: cluster.workspace(play.name)["spec"]["paused"] and play.current is None,
        120,
        "the workspace to pause and its pod to go",
    )
    return on_volume(play)


def cli(
    cluster: PlayedCluster, tmp_path: Path, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``jupyter pause ...`` as a user outside the cluster runs it (their own kubeconfig)."""
    kubeconfig = cluster.user_kubeconfig(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBERNETES"))}
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture(params=["manual"])
def workspace(
    cluster: PlayedCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> WorkspacePlay:
    """A Workspace whose pods a PodSnapshotPolicy selects (trigger: manual, or workload)."""
    cluster.create_policy(request.param)
    return cluster.create_workspace("lab", tmp_path / "home")


@pytest.mark.parametrize("workspace", ["manual", "workload"], indirect=True)
def test_pause_and_resume_live_from_a_pod_snapshot(
    cluster: PlayedCluster, workspace: WorkspacePlay, tmp_path: Path
) -> None:
    # Given a workspace pod whose two notebooks hold data (its policy: a manual trigger, or
    # the workload's own request to gVisor)
    server = running(cluster, workspace)
    first_pod = workspace.current.pod_uid
    kernel_a, expected = notebook_with_data(server, "a.ipynb")
    kernel_b = server.open_notebook("b.ipynb")
    server.run(kernel_b, "counter = 7")
    connection = json.loads(
        (workspace.current.workdir / "runtime" / f"kernel-{kernel_a}.json").read_text()
    )
    assert connection["transport"] == "ipc"  # the shipped config: Unix sockets, restorable

    # When one notebook is paused
    started = time.monotonic()
    paused = pause_workspace(cluster, workspace, "a.ipynb")
    pause_seconds = time.monotonic() - started

    # Then the whole workspace paused: both notebooks checkpointed, a pod snapshot, the pod gone
    (snapshot,) = cluster.snapshot_names()
    for path in ("a.ipynb", "b.ipynb"):
        assert paused[path]["state"] == "paused", paused[path]
        assert paused[path]["checkpoint"]["snapshot"] == snapshot
        assert f"pod snapshot {snapshot}" in paused[path]["message"]
    pinned = cluster.workspace("lab")["spec"]["podTemplate"]["podMetadata"]["annotations"]
    assert pinned["podsnapshot.gke.io/ps-name"] == snapshot  # never an older one silently
    recorded = cluster.state_annotation("lab")
    assert recorded["state"] == "paused" and recorded["snapshot"] == snapshot
    assert recorded["bytes"] == sum(r["checkpoint"]["bytes"] for r in paused.values())

    # When the user resumes the workspace from outside
    started = time.monotonic()
    done = cli(cluster, tmp_path, "resume", "--workspace", f"{cluster.namespace}/lab")
    resume_seconds = time.monotonic() - started

    # Then the same processes came back (proven), frozen for a while, and say so
    assert done.returncode == 0, done.stderr + done.stdout
    server = running(cluster, workspace, previous=first_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready" and ready["how"] == "live", ready
    assert "restored from snapshot" in ready["message"] and "frozen for" in ready["message"]
    assert ready["kernel_id"] == kernel_a
    assert server.session("b.ipynb")["how"] == "live"
    # And the kernels answer through the server after the freeze and thaw, state intact
    assert server.run(kernel_a, CHECKSUM_CELL) == expected
    assert server.run(kernel_b, "print(counter)") == "7\n"
    print(f"\nlive: pause {pause_seconds:.2f} s, resume (CLI) {resume_seconds:.2f} s")


def resume_from_outside(cluster: PlayedCluster, play: WorkspacePlay, tmp_path: Path) -> str:
    """``jupyter pause resume --workspace``; its output once the workspace is back."""
    done = cli(cluster, tmp_path, "resume", "--workspace", f"{cluster.namespace}/{play.name}")
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def kinds_since_pause(server: RemoteServer, path: str) -> list[str]:
    code, timeline = server.request("GET", f"/jupyter-pause/timeline/{path}")
    assert code == 200
    kinds = [e["kind"] for e in timeline["events"]]
    return kinds[len(kinds) - kinds[::-1].index("pause_requested") - 1 :]


@pytest.mark.parametrize(
    ("platform", "why"),
    [
        (
            "no-policy",
            "no pod snapshot was taken at the pause (no PodSnapshotPolicy in namespace",
        ),
        ("silent", "the pod started fresh: snapshot "),
        ("mismatch", "does not match this pod's spec hash"),
        ("older", "older than the last pause's (a-later-snapshot)"),
    ],
)
def test_resume_from_files_says_why_it_is_not_live(
    cluster: PlayedCluster, tmp_path: Path, platform: str, why: str
) -> None:
    # Given a workspace whose platform takes snapshots (or not) and cold-starts its pods
    if platform != "no-policy":
        cluster.create_policy("manual")
        # the platform cold-starts the pod (silently, or saying so), or restores a snapshot
        cluster.restore_mode = "live" if platform == "older" else platform
    play = cluster.create_workspace("lab", tmp_path / "home")
    server = running(cluster, play)
    first_pod = play.current.pod_uid
    kernel_id, expected = notebook_with_data(server, "exp/train.ipynb")

    # When it is paused and resumed from outside
    paused = pause_workspace(cluster, play, "exp/train.ipynb")
    assert paused["exp/train.ipynb"]["state"] == "paused"
    if platform == "older":
        # The volume says a later pause happened (its own snapshot) than the one the
        # platform restores: what a process restored from an older snapshot finds.
        state = json.loads((store(play) / "environment.json").read_text())
        state.update(pause_id="a-later-pause", snapshot="a-later-snapshot")
        (store(play) / "environment.json").write_text(json.dumps(state))
    output = resume_from_outside(cluster, play, tmp_path)

    # Then a new kernel holds the whole session again, rebuilt from the checkpoint ...
    server = running(cluster, play, previous=first_pod)
    ready = server.wait_state("exp/train.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] != kernel_id
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected  # imports, env, data
    # ... and the cold start is said, with why, never passed off as live
    assert ready["message"].startswith("Ready: restored from files (")
    assert why in ready["message"], ready["message"]
    assert platform == "older" or "Cold start: " in ready["message"]
    restored = [
        e
        for e in server.request("GET", "/jupyter-pause/timeline/exp/train.ipynb")[1]["events"]
        if e["kind"] == "state_restored"
    ]
    assert restored[-1]["data"]["how"] == "files" and why in restored[-1]["data"]["why"]
    recorded = cluster.state_annotation("lab")
    assert recorded["state"] == "ready" and recorded["how"] == "files" and why in recorded["reason"]
    assert why in output


def test_gpu_scarce_resume_waits_with_the_reason_and_two_resumes_make_one_restore(
    cluster: PlayedCluster, tmp_path: Path
) -> None:
    # Given a paused workspace (no snapshots here: the restore is from files)
    play = cluster.create_workspace("lab", tmp_path / "home")
    server = running(cluster, play)
    first_pod = play.current.pod_uid
    _, expected = notebook_with_data(server, "a.ipynb")
    pause_workspace(cluster, play, "a.ipynb")
    # and another team's job took the only GPU meanwhile
    cluster.blockers = 1
    kubeconfig = cluster.user_kubeconfig(tmp_path)

    # When two resumes start at once (two tabs, a retry)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBERNETES"))}
    env["KUBECONFIG"] = str(kubeconfig)
    target = f"{cluster.namespace}/lab"
    resumes = [
        subprocess.Popen(
            [sys.executable, "-m", "jupyter_pause.cli", "resume", "--workspace", target],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]

    # Then the workspace waits for resources, with the scheduler's reason and the time waited
    def waiting() -> dict | None:
        status = cli(cluster, tmp_path, "status", "--workspace", target, "--json")
        record = json.loads(status.stdout)
        return record if record["state"] == "waiting-for-resources" else None

    first = wait_for(waiting, 60, "waiting-for-resources", interval=0.3)
    assert "Insufficient nvidia.com/gpu" in first["message"], first
    time.sleep(1.5)
    later = waiting()
    assert later is not None and later["waited_seconds"] > first["waited_seconds"]
    text = cli(cluster, tmp_path, "status", "--workspace", target).stdout
    assert (
        "waiting-for-resources" in text
        and "Insufficient nvidia.com/gpu" in text
        and "waited" in text
    )

    # When the GPU is freed
    cluster.blockers = 0
    outputs = [process.communicate(timeout=240) for process in resumes]

    # Then both resumes end with the one restore, in one new pod
    assert [p.returncode for p in resumes] == [0, 0], outputs
    for out, err in outputs:
        assert "waiting-for-resources" in err and "Insufficient nvidia.com/gpu" in err
        assert out.startswith(f"Resumed {target} in ")
    assert play.pods_created == 2 and len(cluster.started_pods) == 2
    server = running(cluster, play, previous=first_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready", ready
    kinds = kinds_since_pause(server, "a.ipynb")
    assert kinds.count("resume_requested") == 1 and kinds.count("state_restored") == 1, kinds
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected


def test_platform_pause_sigterm_checkpoints_every_kernel_and_nothing_is_lost(
    cluster: PlayedCluster, tmp_path: Path
) -> None:
    # Given a workspace pod (grace period as shipped: Kubernetes' default 30 s) with a notebook
    # changed since its last checkpoint, and another one busy in a long cell
    cluster.create_policy("manual")
    play = cluster.create_workspace("lab", tmp_path / "home", grace=30.0)
    server = running(cluster, play)
    first_pod = play.current.pod_uid
    kernel_id, _ = notebook_with_data(server, "a.ipynb")
    assert server.request("POST", "/jupyter-pause/checkpoint/a.ipynb")[0] == 200
    server.run(kernel_id, "data[:10] = -1.0\nlate = 'after the last checkpoint'")
    expected = server.run(kernel_id, CHECKSUM_CELL)
    busy = server.open_notebook("b.ipynb")
    wait_for(lambda: server.session("b.ipynb")["watching"], 30, "the server to watch b.ipynb")
    server.start_cell(
        busy, "import time\nstep = 0\nwhile True:\n    step += 1\n    time.sleep(0.01)"
    )
    wait_for(lambda: server.session("b.ipynb")["busy"], 30, "the long cell to run")
    pod = play.current

    # When the platform pauses the workspace itself (Kubeflow's idle culler sets spec.paused)
    cluster.set_paused("lab", True)
    assert pod.stopped.wait(60), "the kubelet did not stop the pod"

    # Then the server checkpointed every kernel and exited by itself within the grace period
    assert pod.exit_seconds is not None and pod.exit_seconds < play.grace_seconds
    environment = json.loads((store(play) / "environment.json").read_text())
    assert environment["origin"] == "platform" and environment["snapshot"] is None
    assert sorted(environment["notebooks"]) == ["a.ipynb", "b.ipynb"]
    assert environment["checkpoint_seconds"] < 25.0  # PauseApp.platform_stop_seconds, shipped
    records = on_volume(play)
    for path in ("a.ipynb", "b.ipynb"):
        assert records[path]["state"] == "paused", records[path]
        assert records[path]["message"].startswith("Paused by the platform at "), records[path]
    events = records["a.ipynb"]["timeline"]
    requested = [e for e in events if e["kind"] == "pause_requested"][-1]
    assert requested["data"]["origin"] == "platform" and "SIGTERM" in requested["data"]["reason"]
    print(
        f"\nSIGTERM: checkpoints {environment['checkpoint_seconds']:.2f} s, server exit "
        f"{pod.exit_seconds:.2f} s after SIGTERM (grace {play.grace_seconds:.0f} s)"
    )

    # When the user resumes the workspace
    output = resume_from_outside(cluster, play, tmp_path)

    # Then a cold start restores both notebooks, saying the platform paused it: nothing lost
    server = running(cluster, play, previous=first_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert "the platform stopped the pod (SIGTERM" in ready["message"]
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    assert server.run(ready["kernel_id"], "print(late)") == "after the last checkpoint\n"
    resumed = server.wait_state("b.ipynb", "ready", "partial", "failed")
    assert int(server.run(resumed["kernel_id"], "print(step)")) > 0  # the cell's work so far
    assert "SIGTERM" in output


def test_a_forbidden_pause_names_the_rbac_verb_and_the_kernel_keeps_running(
    cluster: PlayedCluster, workspace: WorkspacePlay
) -> None:
    # Given a running workspace whose Role lost two verbs (an admin's edit)
    server = running(cluster, workspace)
    kernel_id, expected = notebook_with_data(server, "a.ipynb")
    cluster.edit_role(
        workspace, drop={"workspaces": "patch", "podsnapshotmanualtriggers": "create"}
    )

    # When the notebook is paused
    code, _ = server.request("POST", "/jupyter-pause/pause/a.ipynb")
    assert code == 202
    # (the records say "paused" on the volume just before the Workspace is patched, since the
    # pod may go right after; a refused patch sets them back: wait for where it ends)
    record = server.wait_state("a.ipynb", "active")

    # Then the pause fails, naming the verbs RBAC refused, and the session keeps running
    assert 'the verb "patch" on "workspaces" in API group "kubeflow.org"' in record["error"]["what"]
    assert "The session keeps running." in record["message"]
    _, timeline = server.request("GET", "/jupyter-pause/timeline/a.ipynb")
    assert not any(e["kind"] == "snapshot_taken" for e in timeline["events"])
    assert cluster.workspace("lab")["spec"]["paused"] is False
    assert server.run(kernel_id, CHECKSUM_CELL) == expected  # the kernel answers, data intact
    # And the snapshot step said why it took none
    env = json.loads((store(workspace) / "environment.json").read_text())
    assert 'the verb "create" on "podsnapshotmanualtriggers"' in env["snapshot_problem"]
    assert env["state"] == "running"


def test_an_unreachable_api_server_fails_the_pause_clearly_and_nothing_changes(
    cluster: PlayedCluster, tmp_path: Path
) -> None:
    from ..server_process import free_port

    # Given a workspace pod that cannot reach the API server (a closed port)
    play = cluster.create_workspace("lab", tmp_path / "home")
    play.api_port = free_port()
    server = running(cluster, play)
    kernel_id, expected = notebook_with_data(server, "a.ipynb")

    # When the notebook is paused
    assert server.request("POST", "/jupyter-pause/pause/a.ipynb")[0] == 202
    record = server.wait_state("a.ipynb", "active", "paused")

    # Then it says the API server cannot be reached; the kernel runs on, nothing was written
    assert record["state"] == "active" and "cannot be reached" in record["error"]["what"], record
    assert server.run(kernel_id, CHECKSUM_CELL) == expected
    assert not (store(play) / "environment.json").exists()
    code, status = server.request("GET", "/jupyter-pause/status")
    assert code == 200 and "cannot be reached" in status["resources"]["details"]["problem"]


def test_the_shipped_role_reaches_its_own_namespace_only(
    cluster: PlayedCluster, workspace: WorkspacePlay, control_plane: ControlPlane, tmp_path: Path
) -> None:
    from jupyter_pause.backends.kube import POLICIES, WORKSPACES, Kube, KubeError

    # Given another team's namespace with a Workspace and a pod snapshot
    other = PlayedCluster(control_plane, f"{cluster.namespace}-other")
    try:
        other.create_namespace()
        other.create_policy("manual")
        other.create_workspace("theirs", tmp_path / "their-home")
        other.custom.create_namespaced_custom_object(
            "podsnapshot.gke.io", "v1", other.namespace, "podsnapshots",
            {"apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshot",
             "metadata": {"name": "their-snapshot"}, "spec": {}},
        )  # fmt: skip
        # And the backend's client with the token a workspace pod gets (TokenRequest API)
        running(cluster, workspace)
        token = cluster.service_account_token(workspace)
        kube = Kube(control_plane.credentials(token).api_client(), cluster.namespace)
        own, theirs = cluster.namespace, other.namespace

        # Then in its own namespace it does what a pause needs
        assert kube.get_pod(own, workspace.pod_name)["metadata"]["name"] == workspace.pod_name
        kube.patch_workspace(own, "lab", {"metadata": {"annotations": {"probe": "ok"}}})
        assert [p["metadata"]["name"] for p in kube.list_policies(own)] == ["jupyter-pause"]
        assert kube.list_snapshots(own) == []

        # But nothing in the other namespace, and each refusal names the verb and where
        refused = [
            (lambda: kube.get_pod(theirs, "ws-theirs-0"), '"get" on "pods"'),
            (lambda: kube.patch_workspace(theirs, "theirs", {"spec": {"paused": True}}),
             '"patch" on "workspaces" in API group "kubeflow.org"'),
            (lambda: kube.list_policies(theirs), '"list" on "podsnapshotpolicies"'),
            (lambda: kube.create_trigger(theirs, "jp-x", "ws-theirs-0", {}),
             '"create" on "podsnapshotmanualtriggers"'),
            (lambda: kube.list_snapshots(theirs), '"list" on "podsnapshots"'),
            (lambda: kube.delete_snapshot(theirs, "their-snapshot"), '"delete" on "podsnapshots"'),
            # nor, in its own namespace, a verb the Role does not grant
            (lambda: kube._custom("delete", WORKSPACES, own, "lab"), '"delete" on "workspaces"'),
            (lambda: kube.list_pods(own, ""), '"list" on "pods"'),
            (lambda: kube._custom("delete", POLICIES, own, "jupyter-pause"),
             '"delete" on "podsnapshotpolicies"'),
        ]  # fmt: skip
        for call, named in refused:
            with pytest.raises(KubeError) as info:
                call()
            assert info.value.kind == "forbidden" and named in str(info.value), str(info.value)
        with pytest.raises(KubeError) as info:
            kube.list_snapshots(theirs)
        assert f"in namespace {theirs}" in str(info.value)

        # And the other team's objects are untouched
        assert other.workspace("theirs")["spec"]["paused"] is False
        assert other.snapshot_names() == ["their-snapshot"]
        kube.close()
    finally:
        other.close()


def test_pod_snapshots_are_listed_counted_and_expired_never_the_pinned_one(
    cluster: PlayedCluster, workspace: WorkspacePlay, tmp_path: Path
) -> None:
    # Given a snapshot agent whose first trigger fails (a spent trigger never fires again)
    cluster.fail_triggers = 1
    server = running(cluster, workspace)
    pod = workspace.current.pod_uid
    kernel_id, expected = notebook_with_data(server, "a.ipynb")

    # When the workspace is paused and resumed twice
    taken = []
    for _ in range(2):
        pause_workspace(cluster, workspace, "a.ipynb")
        taken.append(cluster.snapshot_names()[-1])
        resume_from_outside(cluster, workspace, tmp_path)
        server = running(cluster, workspace, previous=pod)
        pod = workspace.current.pod_uid
        assert server.wait_state("a.ipynb", "ready", "partial", "failed")["how"] == "live"

    # Then the failed trigger was replaced by a new one, each pause took a snapshot, and
    # every trigger, spent, was deleted (GKE keeps them)
    outcomes = sorted(reason for _trigger, reason in cluster.trigger_outcomes)
    assert outcomes == ["Complete", "Complete", "Error"], outcomes
    assert custom_objects(cluster, "podsnapshotmanualtriggers") == []
    _, timeline = server.request("GET", "/jupyter-pause/timeline/a.ipynb")
    assert timeline["accounting"]["snapshots"] == 2
    # And retention kept only the newest, the one the next resume restores
    code, listing = server.request("GET", "/jupyter-pause/snapshots")
    assert code == 200 and listing["problem"] is None
    assert [(s["name"], s["pinned"], s["ready"]) for s in listing["snapshots"]] == [
        (taken[-1], True, True)
    ]
    listed = cli(cluster, tmp_path, "list", "--url", server.url, "--token", server.token)
    assert "Pod snapshots of this workspace:" in listed.stdout and taken[-1] in listed.stdout

    # When an old snapshot of this workspace and one of another workspace are there
    for name, trigger in (("stale", "jp-lab-100-aaaa"), ("not-ours", "jp-other-100-bbbb")):
        cluster.custom.create_namespaced_custom_object(
            "podsnapshot.gke.io", "v1", cluster.namespace, "podsnapshots",
            {"apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshot",
             "metadata": {"name": name, "labels": {"gke-pod-snapshot-triggered-by": trigger}},
             "spec": {}},
        )  # fmt: skip
    collected = cli(cluster, tmp_path, "gc", "--url", server.url, "--token", server.token)

    # Then gc deletes this workspace's old one only: never the pinned one, never another's
    assert collected.returncode == 0 and "Deleted pod snapshots: stale\n" in collected.stdout
    assert cluster.snapshot_names() == sorted([taken[-1], "not-ours"])
    code, again = server.request("POST", "/jupyter-pause/gc")
    assert code == 200 and again["snapshots"] == {"deleted": [], "problem": None}
    assert server.run(kernel_id, CHECKSUM_CELL) == expected


def test_a_missing_crd_is_named(control_plane: ControlPlane) -> None:
    from jupyter_pause.backends.kube import Kube, KubeError, Resource

    # Given a cluster without the CRD of a kind (as one without GKE Pod Snapshots)
    kube = Kube(control_plane.admin.api_client(), "default")
    missing = Resource("snapshots.example.com", "v1", "podcheckpoints", "PodCheckpoint")

    # When it is listed, Then the error names the CRD to install
    with pytest.raises(KubeError) as info:
        kube._custom("list", missing, "default")
    assert info.value.kind == "missing-crd"
    assert "the CRD podcheckpoints.snapshots.example.com is not installed" in str(info.value)
    kube.close()


def test_a_quota_on_snapshot_triggers_is_named_and_the_pause_goes_on_with_the_checkpoints(
    cluster: PlayedCluster, workspace: WorkspacePlay, tmp_path: Path
) -> None:
    # Given a namespace whose ResourceQuota allows no snapshot trigger (the quota controller,
    # played: its status says what is used)
    cluster.quota("count/podsnapshotmanualtriggers.podsnapshot.gke.io", 0)
    server = running(cluster, workspace)
    first_pod = workspace.current.pod_uid
    _, expected = notebook_with_data(server, "a.ipynb")

    # When the notebook is paused
    paused = pause_workspace(cluster, workspace, "a.ipynb")

    # Then the pause went on without a snapshot, naming the quota; nothing is lost
    message = paused["a.ipynb"]["message"]
    assert "no pod snapshot: a ResourceQuota in namespace" in message, message
    assert "exceeded quota" in message and cluster.snapshot_names() == []
    resume_from_outside(cluster, workspace, tmp_path)
    server = running(cluster, workspace, previous=first_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["how"] == "files" and "exceeded quota" in ready["message"]
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected


def test_the_idle_policy_pauses_the_workspace_once_every_notebook_is_idle(
    cluster: PlayedCluster, tmp_path: Path
) -> None:
    # Given a workspace whose server pauses after 2 s without activity, with two notebooks,
    # one of them busy in a cell for a while
    cluster.create_policy("manual")
    play = cluster.create_workspace("lab", tmp_path / "home")
    play.extra_config = (
        "c.PauseApp.idle_pause_minutes = 2 / 60\nc.PauseApp.monitor_interval_seconds = 0.5\n"
    )
    server = running(cluster, play)
    notebook_with_data(server, "a.ipynb")
    busy = server.open_notebook("b.ipynb")
    wait_for(lambda: server.session("b.ipynb")["watching"], 30, "the server to watch b.ipynb")
    server.start_cell(busy, "import time\nfor step in range(40):\n    time.sleep(0.2)")
    started = time.monotonic()

    # When a.ipynb has long been idle, but b.ipynb still runs its cell
    time.sleep(4)
    # Then nothing pauses: the pod (and its GPU) serve b.ipynb
    assert play.current is not None and not cluster.workspace("lab")["spec"]["paused"]

    # When the cell ends and both stay idle, Then the whole workspace pauses, with a snapshot
    wait_for(lambda: play.current is None, 60, "the idle workspace to pause")
    assert time.monotonic() - started >= 8  # not before the cell's 8 s were over
    records = on_volume(play)
    assert {records[p]["state"] for p in ("a.ipynb", "b.ipynb")} == {"paused"}
    requested = [e for e in records["a.ipynb"]["timeline"] if e["kind"] == "pause_requested"]
    assert requested[-1]["data"]["reason"].startswith("idle for ")
    assert cluster.state_annotation("lab")["origin"] == "idle"
    assert len(cluster.snapshot_names()) == 1


def test_status_of_a_running_workspace_never_paused(
    cluster: PlayedCluster, workspace: WorkspacePlay, tmp_path: Path
) -> None:
    # Given a workspace that runs and was never paused
    running(cluster, workspace)
    target = f"{cluster.namespace}/lab"

    # When its status is asked for, and it is resumed
    status = cli(cluster, tmp_path, "status", "--workspace", target, "--json")
    resumed = cli(cluster, tmp_path, "resume", "--workspace", target)

    # Then it is running, and the resume has nothing to do
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "running"
    assert resumed.returncode == 0 and "is running" in resumed.stdout
    assert workspace.pods_created == 1


def custom_objects(cluster: PlayedCluster, plural: str) -> list[dict]:
    return cluster.custom.list_namespaced_custom_object(
        "podsnapshot.gke.io", "v1", cluster.namespace, plural
    )["items"]


def test_a_pod_outside_gvisor_is_named_and_paused_with_its_checkpoints_only(
    cluster: PlayedCluster, tmp_path: Path
) -> None:
    # Given a policy selecting the workspace's pods, on a node pool without GKE Sandbox:
    # the pod does not run in gVisor, so GKE cannot snapshot it
    cluster.create_policy("manual")
    cluster.gvisor_admission = False
    play = cluster.create_workspace("lab", tmp_path / "home")
    server = running(cluster, play)
    _, expected = notebook_with_data(server, "a.ipynb")

    # Then the status names the mode, and why, before anyone pauses (once the server has
    # read its pod, which it does in the background as it starts)
    def detected() -> dict | None:
        details = server.request("GET", "/jupyter-pause/status")[1]["resources"]["details"]
        return details if details["mode_reason"] != NOT_DETECTED else None

    details = wait_for(detected, 30, "the pause mode to be detected")
    assert details["mode"] == "no-snapshots", details
    assert "does not run in GKE Sandbox" in details["mode_reason"]

    # When it is paused
    pause_workspace(cluster, play, "a.ipynb")

    # Then no snapshot was asked for (no trigger, no PodSnapshot), the timeline says why
    assert custom_objects(cluster, "podsnapshotmanualtriggers") == []
    assert cluster.snapshot_names() == []
    recorded = cluster.state_annotation("lab")
    assert recorded["mode"] == "no-snapshots" and "gVisor" in recorded["snapshot_problem"]
    # and the resume restores from files
    resume_from_outside(cluster, play, tmp_path)
    server = running(cluster, play)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["how"] == "files", ready
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    after = cluster.state_annotation("lab")  # what jupyter pause status --workspace reads
    assert after["state"] == "ready" and after["mode"] == "no-snapshots", after
    assert "GKE Sandbox" in after["mode_reason"]
    # (written before the pod went: the timeline the new pod reads from the volume has it)
    (missing,) = [e for e in kinds_and_data(server, "a.ipynb") if e["kind"] == "snapshot_missing"]
    assert missing["data"]["mode"] == "no-snapshots" and "gVisor" in missing["data"]["why"]


def kinds_and_data(server: RemoteServer, path: str) -> list[dict]:
    code, timeline = server.request("GET", f"/jupyter-pause/timeline/{path}")
    assert code == 200
    return timeline["events"]


def test_spent_triggers_go_and_a_pause_without_a_snapshot_leaves_none_older_to_restore(
    cluster: PlayedCluster, workspace: WorkspacePlay, tmp_path: Path
) -> None:
    # Given a workspace paused once with a pod snapshot and resumed live from it
    server = running(cluster, workspace)
    first_pod = workspace.current.pod_uid
    kernel_id, expected = notebook_with_data(server, "a.ipynb")
    pause_workspace(cluster, workspace, "a.ipynb")
    (older,) = cluster.snapshot_names()
    assert custom_objects(cluster, "podsnapshotmanualtriggers") == []  # spent: deleted
    resume_from_outside(cluster, workspace, tmp_path)
    server = running(cluster, workspace, previous=first_pod)
    assert server.wait_state("a.ipynb", "ready", "partial", "failed")["how"] == "live"
    second_pod = workspace.current.pod_uid
    server.run(kernel_id, "data = data * 2\nmarker = 'after the first resume'")
    expected = server.run(kernel_id, CHECKSUM_CELL)

    # When the next pause's snapshot fails (both tries)
    cluster.fail_triggers = 2
    pause_workspace(cluster, workspace, "a.ipynb")

    # Then no pin is left (GKE would restore the newest matching snapshot into an unpinned
    # pod: the older one, from before the first resume), and that older one is gone too
    annotations = cluster.workspace("lab")["spec"]["podTemplate"]["podMetadata"].get("annotations")
    assert not (annotations or {}).get("podsnapshot.gke.io/ps-name"), annotations
    assert older not in cluster.snapshot_names()
    assert custom_objects(cluster, "podsnapshotmanualtriggers") == []
    # and the resume restores from files the state of the second pause, not the first's
    resume_from_outside(cluster, workspace, tmp_path)
    server = running(cluster, workspace, previous=second_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["how"] == "files", ready
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    assert server.run(ready["kernel_id"], "print(marker)") == "after the first resume\n"
