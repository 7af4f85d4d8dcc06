"""The workspace backend in mode ``pod-snapshots`` (GKE Pod Snapshots without the GKE Workspaces
add-on, our trigger and our pin) and ``no-snapshots``, end to end on the real chain.

Real: etcd, kube-apiserver, kube-controller-manager (StatefulSets, RBAC, quota, garbage
collection) and kube-scheduler, Kubeflow Notebooks v2's own CRDs, and what ``deploy/`` ships for
the mode (its WorkspaceKind, ClusterRole, per-Workspace Role and PodSnapshotPolicy, applied as
the README says). Played (``real_players.py``): the Notebooks workspace controller (its real
binary cannot run against kube-apiserver 1.20), the kubelet (every pod a real jupyter server
with real kernels on this machine, its service-account token from the TokenRequest API, bound
to the pod) and GKE's node agent for Pod Snapshots; and ``deploy/modes/pod-snapshots/
gvisor-admission-policy.yaml`` (``gvisor_admission.py``: 1.20 has no admission policies).

Each test is Given/When/Then; the data's checksum is compared after every return; every wait has
a deadline and nothing is timed. Where the real chain differs from what the project's own
players did, the real behaviour is followed and said where it matters (the pod's name comes
from its StatefulSet's generateName; a failed snapshot is a PodSnapshot whose Ready is False;
a ResourceQuota is counted by the real quota controller; the Workspace's RBAC is bound by the
workspace controller).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.backends.workspace import NOT_DETECTED

from ..server_process import free_port
from .control_plane import GPU, SANDBOX_KEY, ControlPlane
from .gvisor_admission import GvisorAdmission
from .notebooks import RemoteServer
from .real_players import (
    GVISOR,
    ORIGIN_POD,
    RESTORED,
    SNAPSHOTS,
    TRIGGERED_BY,
    PlayedWorkspace,
    RealPlayedCluster,
    condition,
    group,
    real_played_cluster,
)

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
POLICY = "jupyter-pause"  # the shipped PodSnapshotPolicy's name
MODE = "pod-snapshots"
TRIGGERS = "podsnapshotmanualtriggers"


# -- the cluster as a test sets it up ---------------------------------------------------------
def sandbox_node(chain: RealPlayedCluster, gpus: int = 1) -> str:
    """A GKE Sandbox (gVisor) node with room for ``gpus`` Workspaces of the shipped kind (each
    asks for 8 CPUs and 48 GiB besides its GPU)."""
    return chain.node("sandbox", gpus=gpus, sandbox=True, cpu=str(16 * gpus),
                      memory=f"{64 * gpus}Gi")  # fmt: skip


def shipped_workspace(
    chain: RealPlayedCluster, home: Path, name: str = "lab", **kwargs: Any
) -> PlayedWorkspace:
    """A Workspace of the shipped ``deploy/modes/pod-snapshots/workspacekind.yaml``."""
    return chain.workspace(name, chain.shipped_workspace_kind(MODE), home, **kwargs)


@pytest.fixture(params=["manual"])
def workspace(
    gvisor_admission: GvisorAdmission,
    real_chain: RealPlayedCluster,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> PlayedWorkspace:
    """A Workspace of the shipped kind on a GKE Sandbox node, the shipped gVisor admission
    policy in force, and the shipped PodSnapshotPolicy (its trigger: manual, or workload)."""
    sandbox_node(real_chain)
    real_chain.shipped_policy(request.param)
    return shipped_workspace(real_chain, tmp_path / "home")


# -- what a test does and reads ---------------------------------------------------------------
def server_of(played: PlayedWorkspace) -> RemoteServer:
    assert played.current is not None, "the workspace has no running pod"
    return RemoteServer(played.current.url, played.jupyter_token)


def running(
    chain: RealPlayedCluster, played: PlayedWorkspace, previous: str | None = None
) -> RemoteServer:
    """The server of the Workspace's pod once it runs (another pod than ``previous``, a uid)
    and the Workspace is Running."""
    return RemoteServer(chain.running(played, previous_pod=previous).url, played.jupyter_token)


def pod_name(chain: RealPlayedCluster, name: str = "lab") -> str:
    """The Workspace's pod: ``<its StatefulSet's generated name>-0`` on the real chain (the
    project's own players named it ``ws-<name>-0``)."""
    pod = chain.pod_of(name)
    assert pod is not None, f"Workspace {name} has no pod"
    return pod["metadata"]["name"]


def notebook_with_data(server: RemoteServer, path: str, scale: int = 1) -> tuple[str, str]:
    kernel_id = server.open_notebook(path)
    server.run(kernel_id, DATA_CELL + ("" if scale == 1 else f"data = data * {scale}\n"))
    return kernel_id, server.run(kernel_id, CHECKSUM_CELL)


def store(played: PlayedWorkspace) -> Path:
    """The checkpoint store on the workspace's home volume (the shipped config's store_root)."""
    return played.home / ".jupyter-pause" / "checkpoints"


def on_volume(played: PlayedWorkspace) -> dict[str, dict]:
    """Each notebook's session record as the PVC holds it (readable while no pod runs)."""
    records = {}
    for path in store(played).glob("*/session.json"):
        record = json.loads(path.read_text())
        records[record["path"]] = record
    return records


def gone(chain: RealPlayedCluster, played: PlayedWorkspace) -> bool:
    """The Workspace is paused and its pod gone (from the API server and from the node)."""
    return bool(
        chain.workspace_object(played.name)["spec"]["paused"]
        and played.current is None
        and chain.pod_of(played.name) is None
    )


def pause_workspace(chain: RealPlayedCluster, played: PlayedWorkspace, path: str) -> dict:
    """Pause a notebook (so the workspace); once its pod is gone, what the PVC says."""
    code, record = server_of(played).request("POST", f"/jupyter-pause/pause/{path}")
    assert code == 202 and record["state"] == "checkpointing", record
    chain.wait(lambda: gone(chain, played), 120, "the workspace to pause and its pod to go")
    return on_volume(played)


def user_env(chain: RealPlayedCluster, folder: Path) -> dict[str, str]:
    """The environment of a user outside the cluster: their own kubeconfig, nothing else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBERNETES"))}
    env["KUBECONFIG"] = str(chain.user_kubeconfig(folder))
    return env


def cli(
    chain: RealPlayedCluster, folder: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``jupyter pause ...`` as a user outside the cluster runs it (their own kubeconfig)."""
    return subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", *args],
        capture_output=True,
        text=True,
        env=user_env(chain, folder),
        timeout=timeout,
    )


def resume_from_outside(chain: RealPlayedCluster, played: PlayedWorkspace, folder: Path) -> str:
    """``jupyter pause resume --workspace``; its output once the workspace is back."""
    done = cli(chain, folder, "resume", "--workspace", f"{chain.namespace}/{played.name}")
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def resume_in_background(
    chain: RealPlayedCluster, folder: Path, name: str
) -> subprocess.Popen[str]:
    """``jupyter pause resume --workspace`` started, not waited for (its output piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_pause.cli", "resume", "--workspace",
         f"{chain.namespace}/{name}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(chain, folder),
    )  # fmt: skip


def events(server: RemoteServer, path: str) -> list[dict[str, Any]]:
    code, timeline = server.request("GET", f"/jupyter-pause/timeline/{path}")
    assert code == 200
    return timeline["events"]


def kinds_since_pause(server: RemoteServer, path: str) -> list[str]:
    kinds = [e["kind"] for e in events(server, path)]
    return kinds[len(kinds) - kinds[::-1].index("pause_requested") - 1 :]


def triggers(chain: RealPlayedCluster) -> list[str]:
    return [t["metadata"]["name"] for t in chain.snapshot_objects(TRIGGERS)]


# -- the tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("workspace", ["manual", "workload"], indirect=True)
def test_pause_and_resume_live_from_a_pod_snapshot(
    real_chain: RealPlayedCluster, workspace: PlayedWorkspace, tmp_path: Path
) -> None:
    # Given a workspace pod in gVisor (the shipped admission policy) whose two notebooks hold
    # data (its policy: a manual trigger, or the workload's own request to gVisor)
    server = running(real_chain, workspace)
    assert workspace.current is not None
    first_pod, first = workspace.current.pod_uid, workspace.current
    pod = real_chain.pod_of("lab")
    assert pod is not None and pod["spec"]["runtimeClassName"] == GVISOR
    # (the RuntimeClass admission ran again after the policy's change: GKE Sandbox's node)
    assert pod["spec"]["nodeSelector"][SANDBOX_KEY] == "gvisor"
    kernel_a, expected = notebook_with_data(server, "a.ipynb")
    kernel_b = server.open_notebook("b.ipynb")
    server.run(kernel_b, "counter = 7")
    connection = json.loads(
        (workspace.current.workdir / "runtime" / f"kernel-{kernel_a}.json").read_text()
    )
    assert connection["transport"] == "ipc"  # the shipped config: Unix sockets, restorable

    # When one notebook is paused
    started = time.monotonic()
    paused = pause_workspace(real_chain, workspace, "a.ipynb")
    pause_seconds = time.monotonic() - started

    # Then the whole workspace paused: both notebooks checkpointed, one pod snapshot of this
    # pod under the shipped policy, the pod gone (its processes kept by the snapshot, never
    # sent a SIGTERM)
    (snapshot,) = real_chain.snapshot_names()
    found = real_chain.snapshot_object("podsnapshots", snapshot)
    assert found is not None
    assert found["metadata"]["labels"][ORIGIN_POD] == pod["metadata"]["name"]
    assert found["spec"]["policyName"] == POLICY
    asked_by = found["metadata"]["labels"][TRIGGERED_BY]
    policy = real_chain.snapshot_object("podsnapshotpolicies", POLICY)
    assert policy is not None
    if policy["spec"]["triggerConfig"]["type"] == "manual":
        assert asked_by.startswith("jp-lab-"), asked_by  # our trigger, deleted once spent
    else:
        assert asked_by == "workload"
    assert triggers(real_chain) == []
    assert first.signals == ["kept-frozen"], first.signals
    for path in ("a.ipynb", "b.ipynb"):
        assert paused[path]["state"] == "paused", paused[path]
        assert paused[path]["checkpoint"]["snapshot"] == snapshot
        assert f"pod snapshot {snapshot}" in paused[path]["message"]
    assert real_chain.pinned("lab") == snapshot  # never an older one silently
    recorded = real_chain.state_annotation("lab")
    assert recorded["state"] == "paused" and recorded["snapshot"] == snapshot
    assert recorded["mode"] == MODE
    assert recorded["bytes"] == sum(r["checkpoint"]["bytes"] for r in paused.values())

    # When the user resumes the workspace from outside
    started = time.monotonic()
    done = cli(real_chain, tmp_path, "resume", "--workspace", f"{real_chain.namespace}/lab")
    resume_seconds = time.monotonic() - started

    # Then GKE restored the pinned snapshot into the new pod, and said so
    assert done.returncode == 0, done.stderr + done.stdout
    server = running(real_chain, workspace, previous=first_pod)
    new_pod = real_chain.pod_of("lab")
    assert new_pod is not None and new_pod["metadata"]["uid"] != first_pod
    restored = condition(new_pod, RESTORED)
    assert restored["status"] == "True" and snapshot in restored["message"], restored
    # And the same processes came back (proven), frozen for a while, and say so
    assert workspace.current is first
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready" and ready["how"] == "live", ready
    assert "restored from snapshot" in ready["message"] and "frozen for" in ready["message"]
    assert ready["kernel_id"] == kernel_a
    assert server.session("b.ipynb")["how"] == "live"
    # And the kernels answer through the server after the freeze and thaw, state intact
    assert server.run(kernel_a, CHECKSUM_CELL) == expected
    assert server.run(kernel_b, "print(counter)") == "7\n"
    print(f"\nlive: pause {pause_seconds:.2f} s, resume (CLI) {resume_seconds:.2f} s")


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
    gvisor_admission: GvisorAdmission,
    real_chain: RealPlayedCluster,
    tmp_path: Path,
    platform: str,
    why: str,
) -> None:
    # Given a workspace in gVisor whose platform takes snapshots (or has no policy to) and
    # cold-starts its pods (silently, or saying so), or restores a snapshot
    sandbox_node(real_chain)
    if platform != "no-policy":
        real_chain.shipped_policy("manual")
        real_chain.restore_mode = "live" if platform == "older" else platform
    play = shipped_workspace(real_chain, tmp_path / "home")
    server = running(real_chain, play)
    assert play.current is not None
    first_pod = play.current.pod_uid
    kernel_id, expected = notebook_with_data(server, "exp/train.ipynb")

    # When it is paused and resumed from outside
    paused = pause_workspace(real_chain, play, "exp/train.ipynb")
    assert paused["exp/train.ipynb"]["state"] == "paused"
    assert len(real_chain.snapshot_names()) == (0 if platform == "no-policy" else 1)
    if platform == "older":
        # The volume says a later pause happened (its own snapshot) than the one the
        # platform restores: what a process restored from an older snapshot finds.
        state = json.loads((store(play) / "environment.json").read_text())
        state.update(pause_id="a-later-pause", snapshot="a-later-snapshot")
        (store(play) / "environment.json").write_text(json.dumps(state))
    output = resume_from_outside(real_chain, play, tmp_path)

    # Then a new kernel holds the whole session again, rebuilt from the checkpoint ...
    server = running(real_chain, play, previous=first_pod)
    ready = server.wait_state("exp/train.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert ready["kernel_id"] != kernel_id
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected  # imports, env, data
    # ... and the cold start is said, with why, never passed off as live
    assert ready["message"].startswith("Ready: restored from files (")
    assert why in ready["message"], ready["message"]
    assert platform == "older" or "Cold start: " in ready["message"]
    restored = [e for e in events(server, "exp/train.ipynb") if e["kind"] == "state_restored"]
    assert restored[-1]["data"]["how"] == "files" and why in restored[-1]["data"]["why"]
    recorded = real_chain.state_annotation("lab")
    assert recorded["state"] == "ready" and recorded["how"] == "files" and why in recorded["reason"]
    assert why in output


def test_gpu_scarce_resume_waits_with_the_reason_and_two_resumes_make_one_restore(
    gvisor_admission: GvisorAdmission, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a paused workspace on the only GPU of its pool (no policy here: the restore is
    # from files)
    sandbox_node(real_chain)
    play = shipped_workspace(real_chain, tmp_path / "home")
    server = running(real_chain, play)
    assert play.current is not None
    first_pod = play.current.pod_uid
    _, expected = notebook_with_data(server, "a.ipynb")
    pause_workspace(real_chain, play, "a.ipynb")
    # and another team's job took that GPU meanwhile (the real scheduler placed it)
    (training,) = real_chain.block_gpus(1, sandbox=True)
    real_chain.wait(
        lambda: any(
            p.name == training and p.phase == "running" for p in list(real_chain.pods.values())
        ),
        60,
        "the other team's job to run",
    )

    # When two resumes start at once (two tabs, a retry)
    target = f"{real_chain.namespace}/lab"
    resumes = [resume_in_background(real_chain, tmp_path, "lab") for _ in range(2)]
    try:
        # Then the workspace waits for resources, with the scheduler's reason and the time
        # it has waited, which grows
        def waiting() -> dict | None:
            status = cli(real_chain, tmp_path, "status", "--workspace", target, "--json")
            record = json.loads(status.stdout)
            # upstream's controller says Error ("Workspace Pod is unschedulable"): a wait
            assert record["state"] != "error", record
            return record if record["state"] == "waiting-for-resources" else None

        first = real_chain.wait(waiting, 60, "waiting-for-resources")
        assert f"Insufficient {GPU}" in first["message"], first
        waiting_pod = real_chain.pod_of("lab")
        assert waiting_pod is not None
        later = real_chain.wait(
            lambda: (w := waiting()) and w["waited_seconds"] > first["waited_seconds"] and w,
            30,
            "the time waited to grow",
        )
        assert f"Insufficient {GPU}" in later["message"]
        text = cli(real_chain, tmp_path, "status", "--workspace", target).stdout
        assert "waiting-for-resources" in text and f"Insufficient {GPU}" in text
        assert "waited" in text

        # When the other team's job ends
        real_chain.release_gpus()
        outputs = [process.communicate(timeout=240) for process in resumes]
    finally:
        for process in resumes:
            if process.poll() is None:
                process.kill()
                process.communicate()

    # Then both resumes end with the one restore, in the one pod that waited
    assert [p.returncode for p in resumes] == [0, 0], outputs
    for out, err in outputs:
        assert "waiting-for-resources" in err and f"Insufficient {GPU}" in err
        assert out.startswith(f"Resumed {target} in ")
    server = running(real_chain, play, previous=first_pod)
    assert real_chain.pods_of(play) == [first_pod, waiting_pod["metadata"]["uid"]]
    assert len(play.containers) == 2
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready", ready
    kinds = kinds_since_pause(server, "a.ipynb")
    assert kinds.count("resume_requested") == 1 and kinds.count("state_restored") == 1, kinds
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected


def test_platform_pause_sigterm_checkpoints_every_kernel_and_nothing_is_lost(
    workspace: PlayedWorkspace, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a workspace pod (grace period as shipped: Kubernetes' default 30 s) with a notebook
    # changed since its last checkpoint, and another one busy in a long cell
    server = running(real_chain, workspace)
    container = workspace.current
    assert container is not None
    first_pod = container.pod_uid
    pod = real_chain.pod_of("lab")
    assert pod is not None
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace == 30
    kernel_id, _ = notebook_with_data(server, "a.ipynb")
    assert server.request("POST", "/jupyter-pause/checkpoint/a.ipynb")[0] == 200
    server.run(kernel_id, "data[:10] = -1.0\nlate = 'after the last checkpoint'")
    expected = server.run(kernel_id, CHECKSUM_CELL)
    busy = server.open_notebook("b.ipynb")
    real_chain.wait(lambda: server.session("b.ipynb")["watching"], 30, "the server to watch b")
    server.start_cell(
        busy, "import time\nstep = 0\nwhile True:\n    step += 1\n    time.sleep(0.01)"
    )
    real_chain.wait(lambda: server.session("b.ipynb")["busy"], 30, "the long cell to run")

    # When the platform pauses the workspace itself (Kubeflow's culler sets spec.paused): the
    # StatefulSet goes to 0 and the real StatefulSet controller deletes the pod, so the kubelet
    # sends SIGTERM (after the server's watch saw spec.paused set: a pause from outside)
    real_chain.set_paused("lab", True)
    assert container.stopped.wait(90), "the kubelet did not stop the pod"

    # Then the server checkpointed every kernel and exited by itself within the grace period
    assert container.signals == ["SIGTERM"], container.signals  # no SIGKILL
    assert container.exit_seconds is not None and container.exit_seconds < grace
    environment = json.loads((store(workspace) / "environment.json").read_text())
    assert environment["origin"] == "outside" and environment["snapshot"] is None
    assert sorted(environment["notebooks"]) == ["a.ipynb", "b.ipynb"]
    assert environment["checkpoint_seconds"] < 25.0  # PauseApp.platform_stop_seconds, shipped
    records = on_volume(workspace)
    for path in ("a.ipynb", "b.ipynb"):
        assert records[path]["state"] == "paused", records[path]
        assert records[path]["message"].startswith("Paused from outside jupyter_pause at ")
    requested = [e for e in records["a.ipynb"]["timeline"] if e["kind"] == "pause_requested"][-1]
    assert requested["data"]["origin"] == "outside", requested
    assert "spec.paused was set" in requested["data"]["reason"], requested
    assert "SIGTERM" in requested["data"]["reason"], requested
    assert real_chain.snapshot_names() == []
    print(
        f"\nSIGTERM: checkpoints {environment['checkpoint_seconds']:.2f} s, server exit "
        f"{container.exit_seconds:.2f} s after SIGTERM (grace {grace} s)"
    )

    # When the user resumes the workspace
    real_chain.wait(lambda: gone(real_chain, workspace), 60, "the pod to go")
    output = resume_from_outside(real_chain, workspace, tmp_path)

    # Then a cold start restores both notebooks, saying who paused it and how: nothing lost
    server = running(real_chain, workspace, previous=first_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    assert "paused from outside jupyter_pause" in ready["message"], ready["message"]
    assert "the platform stopped the pod (SIGTERM" in ready["message"], ready["message"]
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    assert server.run(ready["kernel_id"], "print(late)") == "after the last checkpoint\n"
    resumed = server.wait_state("b.ipynb", "ready", "partial", "failed")
    assert int(server.run(resumed["kernel_id"], "print(step)")) > 0  # the cell's work so far
    assert "SIGTERM" in output


def test_a_forbidden_pause_names_the_rbac_verb_and_the_kernel_keeps_running(
    workspace: PlayedWorkspace, real_chain: RealPlayedCluster
) -> None:
    # Given a running workspace whose RBAC lost two verbs (an admin's edit: its own Role, and
    # the mode's ClusterRole its kind names, which the workspace controller binds)
    server = running(real_chain, workspace)
    kernel_id, expected = notebook_with_data(server, "a.ipynb")
    real_chain.edit_role(workspace, drop={"workspaces": "patch", TRIGGERS: "create"})

    # When the notebook is paused
    code, _ = server.request("POST", "/jupyter-pause/pause/a.ipynb")
    assert code == 202
    # (the records say "paused" on the volume just before the Workspace is patched, since the
    # pod may go right after; a refused patch sets them back: wait for where it ends)
    record = server.wait_state("a.ipynb", "active")

    # Then the pause fails, naming the verbs RBAC refused, and the session keeps running
    assert 'the verb "patch" on "workspaces" in API group "kubeflow.org"' in record["error"]["what"]
    assert "The session keeps running." in record["message"]
    assert not any(e["kind"] == "snapshot_taken" for e in events(server, "a.ipynb"))
    assert real_chain.workspace_object("lab")["spec"]["paused"] is False
    assert real_chain.pod_of("lab") is not None and real_chain.snapshot_names() == []
    assert server.run(kernel_id, CHECKSUM_CELL) == expected  # the kernel answers, data intact
    # And the snapshot step said why it took none
    env = json.loads((store(workspace) / "environment.json").read_text())
    assert f'the verb "create" on "{TRIGGERS}"' in env["snapshot_problem"]
    assert env["state"] == "running"


def test_an_unreachable_api_server_fails_the_pause_clearly_and_nothing_changes(
    gvisor_admission: GvisorAdmission, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a workspace pod that cannot reach the API server (its kubernetes Service env
    # points at a closed port: a NetworkPolicy, a broken CNI)
    sandbox_node(real_chain)
    real_chain.shipped_policy("manual")
    play = shipped_workspace(real_chain, tmp_path / "home", api_port=free_port())
    server = running(real_chain, play)
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
    assert real_chain.workspace_object("lab")["spec"]["paused"] is False
    assert real_chain.snapshot_names() == [] and triggers(real_chain) == []


def test_the_shipped_role_reaches_its_own_namespace_only(
    workspace: PlayedWorkspace,
    real_chain: RealPlayedCluster,
    upstream_control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    from jupyter_pause.backends.kube import POLICIES, WORKSPACES, Kube, KubeError

    # Given another team's namespace with a Workspace (its pod waits for a node of theirs) and
    # a pod snapshot
    with real_played_cluster(upstream_control_plane, tmp_path / "other-team") as other:
        other.shipped_policy("manual")
        shipped_workspace(other, tmp_path / "their-home", "theirs")
        their_pod = other.wait(lambda: other.pod_of("theirs"), 60, "their Workspace's pod")
        their_pod_name = their_pod["metadata"]["name"]
        other.api.create(
            group(SNAPSHOTS, other.namespace, "podsnapshots"),
            {"apiVersion": SNAPSHOTS, "kind": "PodSnapshot",
             "metadata": {"name": "their-snapshot"}, "spec": {"policyName": POLICY}},
        )  # fmt: skip
        # And the backend's client with the token a workspace pod gets (TokenRequest API,
        # bound to the pod)
        running(real_chain, workspace)
        pod = real_chain.pod_of("lab")
        assert pod is not None
        own_pod = pod["metadata"]["name"]
        token = real_chain.service_account_token(pod)
        kube = Kube(upstream_control_plane.credentials(token).api_client(), real_chain.namespace)
        own, theirs = real_chain.namespace, other.namespace
        try:
            # Then in its own namespace it does what a pause needs
            assert kube.get_pod(own, own_pod)["metadata"]["name"] == own_pod
            kube.patch_workspace(own, "lab", {"metadata": {"annotations": {"probe": "ok"}}})
            assert [p["metadata"]["name"] for p in kube.list_policies(own)] == [POLICY]
            assert kube.list_snapshots(own) == []

            # But nothing in the other namespace, and each refusal names the verb and where
            refused = [
                (lambda: kube.get_pod(theirs, their_pod_name), '"get" on "pods"'),
                (lambda: kube.patch_workspace(theirs, "theirs", {"spec": {"paused": True}}),
                 '"patch" on "workspaces" in API group "kubeflow.org"'),
                (lambda: kube.list_policies(theirs), '"list" on "podsnapshotpolicies"'),
                (lambda: kube.create_trigger(theirs, "jp-x", their_pod_name, {}),
                 f'"create" on "{TRIGGERS}"'),
                (lambda: kube.list_snapshots(theirs), '"list" on "podsnapshots"'),
                (lambda: kube.delete_snapshot(theirs, "their-snapshot"),
                 '"delete" on "podsnapshots"'),
                # nor, in its own namespace, a verb the shipped RBAC does not grant
                (lambda: kube._custom("delete", WORKSPACES, own, "lab"),
                 '"delete" on "workspaces"'),
                (lambda: kube.list_pods(own, ""), '"list" on "pods"'),
                (lambda: kube._custom("delete", POLICIES, own, POLICY),
                 '"delete" on "podsnapshotpolicies"'),
            ]  # fmt: skip
            for call, named in refused:
                with pytest.raises(KubeError) as info:
                    call()
                assert info.value.kind == "forbidden" and named in str(info.value), str(info.value)
            with pytest.raises(KubeError) as info:
                kube.list_snapshots(theirs)
            assert f"in namespace {theirs}" in str(info.value)
        finally:
            kube.close()

        # And the other team's objects are untouched
        assert other.workspace_object("theirs")["spec"]["paused"] is False
        assert other.snapshot_names() == ["their-snapshot"]
        assert other.pod_of("theirs") is not None


def test_pod_snapshots_are_listed_counted_and_expired_never_the_pinned_one(
    real_chain: RealPlayedCluster, workspace: PlayedWorkspace, tmp_path: Path
) -> None:
    # Given GKE's node agent failing the first snapshot (a PodSnapshot whose Ready is False,
    # as GKE reports it; a spent trigger never fires again)
    real_chain.fail_next_trigger("the sandbox could not be checkpointed")
    server = running(real_chain, workspace)
    assert workspace.current is not None
    pod = workspace.current.pod_uid
    kernel_id, expected = notebook_with_data(server, "a.ipynb")

    # When the workspace is paused and resumed twice
    taken = []
    for _ in range(2):
        pause_workspace(real_chain, workspace, "a.ipynb")
        pinned = real_chain.pinned("lab")
        assert pinned is not None
        taken.append(pinned)
        resume_from_outside(real_chain, workspace, tmp_path)
        server = running(real_chain, workspace, previous=pod)
        assert workspace.current is not None
        pod = workspace.current.pod_uid
        assert server.wait_state("a.ipynb", "ready", "partial", "failed")["how"] == "live"

    # Then the failed snapshot's trigger was replaced by a new one, each pause took a snapshot,
    # and every trigger, spent, was deleted (GKE keeps them)
    fired = real_chain.fired
    assert [failure for _trigger, _snapshot, failure in fired] == [
        "the sandbox could not be checkpointed", None, None,
    ], fired  # fmt: skip
    assert len({trigger for trigger, _snapshot, _failure in fired}) == 3
    assert all(trigger.startswith("jp-lab-") for trigger, _snapshot, _failure in fired)
    assert [snapshot for _trigger, snapshot, _failure in fired][1:] == taken
    assert triggers(real_chain) == []
    _, timeline = server.request("GET", "/jupyter-pause/timeline/a.ipynb")
    assert timeline["accounting"]["snapshots"] == 2
    # And retention kept only the newest, the one the next resume restores (the failed one
    # and the first are gone)
    assert real_chain.snapshot_names() == [taken[-1]]
    code, listing = server.request("GET", "/jupyter-pause/snapshots")
    assert code == 200 and listing["problem"] is None
    assert [(s["name"], s["pinned"], s["ready"]) for s in listing["snapshots"]] == [
        (taken[-1], True, True)
    ]
    listed = cli(real_chain, tmp_path, "list", "--url", server.url, "--token", server.token)
    assert "Pod snapshots of this workspace:" in listed.stdout and taken[-1] in listed.stdout

    # When an old snapshot of this workspace and one of another workspace are there
    own_pod = pod_name(real_chain)
    for name, trigger, origin in (
        ("stale", "jp-lab-100-aaaa", own_pod),
        ("not-ours", "jp-other-100-bbbb", "ws-other-x7k2p-0"),
    ):
        real_chain.api.create(
            group(SNAPSHOTS, real_chain.namespace, "podsnapshots"),
            {"apiVersion": SNAPSHOTS, "kind": "PodSnapshot",
             "metadata": {"name": name, "labels": {TRIGGERED_BY: trigger, ORIGIN_POD: origin}},
             "spec": {"policyName": POLICY}},
        )  # fmt: skip
    collected = cli(real_chain, tmp_path, "gc", "--url", server.url, "--token", server.token)

    # Then gc deletes this workspace's old one only: never the pinned one, never another's
    assert collected.returncode == 0 and "Deleted pod snapshots: stale\n" in collected.stdout
    assert real_chain.snapshot_names() == sorted([taken[-1], "not-ours"])
    code, again = server.request("POST", "/jupyter-pause/gc")
    assert code == 200 and again["snapshots"] == {"deleted": [], "problem": None}
    assert server.run(kernel_id, CHECKSUM_CELL) == expected


def test_a_missing_crd_is_named(upstream_control_plane: ControlPlane) -> None:
    from jupyter_pause.backends.kube import Kube, KubeError, Resource

    # Given a cluster without the CRD of a kind (as one without GKE Pod Snapshots)
    kube = Kube(upstream_control_plane.admin.api_client(), "default")
    missing = Resource("snapshots.example.com", "v1", "podcheckpoints", "PodCheckpoint")

    # When it is listed, Then the error names the CRD to install
    try:
        with pytest.raises(KubeError) as info:
            kube._custom("list", missing, "default")
    finally:
        kube.close()
    assert info.value.kind == "missing-crd"
    assert "the CRD podcheckpoints.snapshots.example.com is not installed" in str(info.value)


def test_a_quota_on_snapshot_triggers_is_named_and_the_pause_goes_on_with_the_checkpoints(
    real_chain: RealPlayedCluster, workspace: PlayedWorkspace, tmp_path: Path
) -> None:
    # Given a namespace whose ResourceQuota allows no snapshot trigger (counted by the real
    # quota controller)
    real_chain.quota(f"count/{TRIGGERS}.podsnapshot.gke.io", 0)
    server = running(real_chain, workspace)
    assert workspace.current is not None
    first_pod = workspace.current.pod_uid
    _, expected = notebook_with_data(server, "a.ipynb")

    # When the notebook is paused
    paused = pause_workspace(real_chain, workspace, "a.ipynb")

    # Then the pause went on without a snapshot, naming the quota; nothing is lost
    message = paused["a.ipynb"]["message"]
    assert "no pod snapshot: a ResourceQuota in namespace" in message, message
    assert "exceeded quota" in message and real_chain.snapshot_names() == []
    assert real_chain.fired == [] and real_chain.pinned("lab") is None
    resume_from_outside(real_chain, workspace, tmp_path)
    server = running(real_chain, workspace, previous=first_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["how"] == "files" and "exceeded quota" in ready["message"]
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected


def test_the_idle_policy_pauses_the_workspace_once_every_notebook_is_idle(
    gvisor_admission: GvisorAdmission, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a workspace whose server pauses after 2 s without activity, with two notebooks,
    # one of them busy in a cell for a while
    sandbox_node(real_chain)
    real_chain.shipped_policy("manual")
    play = shipped_workspace(
        real_chain,
        tmp_path / "home",
        extra_config=(
            "c.PauseApp.idle_pause_minutes = 2 / 60\nc.PauseApp.monitor_interval_seconds = 0.5\n"
        ),
    )
    server = running(real_chain, play)
    notebook_with_data(server, "a.ipynb")
    busy = server.open_notebook("b.ipynb")
    real_chain.wait(lambda: server.session("b.ipynb")["watching"], 30, "the server to watch b")
    server.start_cell(busy, "import time\nfor step in range(40):\n    time.sleep(0.2)")
    started = time.monotonic()

    # When a.ipynb has long been idle, but b.ipynb still runs its cell
    time.sleep(4)
    # Then nothing pauses: the pod (and its GPU) serve b.ipynb
    assert play.current is not None and not real_chain.workspace_object("lab")["spec"]["paused"]

    # When the cell ends and both stay idle, Then the whole workspace pauses, with a snapshot
    real_chain.wait(lambda: gone(real_chain, play), 60, "the idle workspace to pause")
    assert time.monotonic() - started >= 8  # not before the cell's 8 s were over
    records = on_volume(play)
    assert {records[p]["state"] for p in ("a.ipynb", "b.ipynb")} == {"paused"}
    requested = [e for e in records["a.ipynb"]["timeline"] if e["kind"] == "pause_requested"]
    assert requested[-1]["data"]["reason"].startswith("idle for ")
    assert real_chain.state_annotation("lab")["origin"] == "idle"
    (snapshot,) = real_chain.snapshot_names()
    assert real_chain.pinned("lab") == snapshot


def test_status_of_a_running_workspace_never_paused(
    workspace: PlayedWorkspace, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given a workspace that runs and was never paused
    running(real_chain, workspace)
    target = f"{real_chain.namespace}/lab"

    # When its status is asked for, and it is resumed
    status = cli(real_chain, tmp_path, "status", "--workspace", target, "--json")
    resumed = cli(real_chain, tmp_path, "resume", "--workspace", target)

    # Then it is running, and the resume has nothing to do: the same one pod, one container
    assert status.returncode == 0, status.stderr
    record = json.loads(status.stdout)
    assert record["state"] == "running" and record["workspace_state"] == "Running", record
    assert resumed.returncode == 0 and "is running" in resumed.stdout
    assert len(real_chain.pods_of(workspace)) == 1 and len(workspace.containers) == 1
    assert real_chain.workspace_object("lab")["spec"]["paused"] is False


def test_a_pod_outside_gvisor_is_named_and_paused_with_its_checkpoints_only(
    real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given the shipped policy selecting the workspace's pods, but not the shipped admission
    # policy that puts them in gVisor (GKE before 1.36, or never applied): the pod runs on an
    # ordinary node, not in GKE Sandbox, so GKE cannot snapshot it
    real_chain.node("gpu", gpus=1)
    real_chain.shipped_policy("manual")
    play = shipped_workspace(real_chain, tmp_path / "home")
    server = running(real_chain, play)
    assert play.current is not None
    first_pod = play.current.pod_uid
    pod = real_chain.pod_of("lab")
    assert pod is not None and not pod["spec"].get("runtimeClassName")
    _, expected = notebook_with_data(server, "a.ipynb")

    # Then the status names the mode, and why, before anyone pauses (once the server has
    # read its pod, which it does in the background as it starts)
    def detected() -> dict | None:
        details = server.request("GET", "/jupyter-pause/status")[1]["resources"]["details"]
        return details if details["mode_reason"] != NOT_DETECTED else None

    details = real_chain.wait(detected, 30, "the pause mode to be detected")
    assert details["mode"] == "no-snapshots", details
    assert "does not run in GKE Sandbox" in details["mode_reason"]

    # When it is paused
    pause_workspace(real_chain, play, "a.ipynb")

    # Then no snapshot was asked for (no trigger, no PodSnapshot), the timeline says why
    assert triggers(real_chain) == [] and real_chain.fired == []
    assert real_chain.snapshot_names() == []
    recorded = real_chain.state_annotation("lab")
    assert recorded["mode"] == "no-snapshots" and "gVisor" in recorded["snapshot_problem"]
    # and the resume restores from files
    resume_from_outside(real_chain, play, tmp_path)
    server = running(real_chain, play, previous=first_pod)
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["how"] == "files", ready
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    after = real_chain.state_annotation("lab")  # what jupyter pause status --workspace reads
    assert after["state"] == "ready" and after["mode"] == "no-snapshots", after
    assert "GKE Sandbox" in after["mode_reason"]
    # (written before the pod went: the timeline the new pod reads from the volume has it)
    (missing,) = [e for e in events(server, "a.ipynb") if e["kind"] == "snapshot_missing"]
    assert missing["data"]["mode"] == "no-snapshots" and "gVisor" in missing["data"]["why"]


def test_spent_triggers_go_and_a_pause_without_a_snapshot_leaves_none_older_to_restore(
    real_chain: RealPlayedCluster, workspace: PlayedWorkspace, tmp_path: Path
) -> None:
    # Given a workspace paused once with a pod snapshot and resumed live from it
    server = running(real_chain, workspace)
    container = workspace.current
    assert container is not None
    first_pod = container.pod_uid
    kernel_id, expected = notebook_with_data(server, "a.ipynb")
    pause_workspace(real_chain, workspace, "a.ipynb")
    assert len(real_chain.snapshot_names()) == 1
    assert triggers(real_chain) == []  # spent: deleted
    resume_from_outside(real_chain, workspace, tmp_path)
    server = running(real_chain, workspace, previous=first_pod)
    assert server.wait_state("a.ipynb", "ready", "partial", "failed")["how"] == "live"
    second_pod = container.pod_uid  # the restored processes, in the new pod
    assert second_pod != first_pod and workspace.current is container
    server.run(kernel_id, "data = data * 2\nmarker = 'after the first resume'")
    expected = server.run(kernel_id, CHECKSUM_CELL)

    # When the next pause's snapshot fails (both tries: two PodSnapshots whose Ready is False)
    real_chain.fail_next_trigger()
    real_chain.fail_next_trigger()
    pause_workspace(real_chain, workspace, "a.ipynb")

    # Then no pin is left (GKE would restore the newest matching snapshot into an unpinned
    # pod: the older one, from before the first resume), and that older one is gone too, as
    # are the failed ones and every trigger
    assert [failure is not None for _t, _s, failure in real_chain.fired] == [False, True, True]
    assert real_chain.pinned("lab") is None
    assert real_chain.snapshot_names() == []
    assert triggers(real_chain) == []
    # and with no snapshot holding them, the pod's processes got their SIGTERM
    assert container.signals[-1] == "SIGTERM", container.signals
    # and the resume restores from files the state of the second pause, not the first's
    resume_from_outside(real_chain, workspace, tmp_path)
    server = running(real_chain, workspace, previous=second_pod)
    new_pod = real_chain.pod_of("lab")
    assert new_pod is not None and not condition(new_pod, RESTORED)  # nothing to restore
    ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
    assert ready["how"] == "files", ready
    assert server.run(ready["kernel_id"], CHECKSUM_CELL) == expected
    assert server.run(ready["kernel_id"], "print(marker)") == "after the first resume\n"


def test_two_workspaces_paused_at_once_each_get_their_own_snapshot_and_their_own_data_back(
    gvisor_admission: GvisorAdmission, real_chain: RealPlayedCluster, tmp_path: Path
) -> None:
    # Given two workspaces of the shipped kind on one GKE Sandbox node with two GPUs, under the
    # one shipped policy, each with its own data
    sandbox_node(real_chain, gpus=2)
    real_chain.shipped_policy("manual")
    names = ("alpha", "beta")
    labs = {n: shipped_workspace(real_chain, tmp_path / n, n) for n in names}
    servers = {n: running(real_chain, labs[n]) for n in names}
    containers = {n: labs[n].current for n in names}
    pods = {n: pod_name(real_chain, n) for n in names}
    kernels, expected = {}, {}
    for scale, name in enumerate(names, start=2):
        kernels[name], expected[name] = notebook_with_data(servers[name], "a.ipynb", scale)
    assert expected["alpha"] != expected["beta"]

    # When both are paused at once
    for name in names:
        code, record = servers[name].request("POST", "/jupyter-pause/pause/a.ipynb")
        assert code == 202, record
    real_chain.wait(
        lambda: all(gone(real_chain, labs[n]) for n in names), 180, "both workspaces to pause"
    )

    # Then each got its own snapshot, of its own pod, on its own trigger, and pins it
    assert len(real_chain.fired) == 2 and not any(f for _t, _s, f in real_chain.fired)
    pinned = {n: real_chain.pinned(n) or "" for n in names}
    assert all(pinned.values()) and pinned["alpha"] != pinned["beta"], pinned
    assert real_chain.snapshot_names() == sorted(pinned.values())
    for name in names:
        found = real_chain.snapshot_object("podsnapshots", pinned[name])
        assert found is not None
        assert found["metadata"]["labels"][ORIGIN_POD] == pods[name]
        assert found["metadata"]["labels"][TRIGGERED_BY].startswith(f"jp-{name}-")
        recorded = real_chain.state_annotation(name)
        assert recorded["state"] == "paused" and recorded["snapshot"] == pinned[name]
        assert on_volume(labs[name])["a.ipynb"]["checkpoint"]["snapshot"] == pinned[name]
    assert triggers(real_chain) == []

    # When both are resumed at once
    resumes = [resume_in_background(real_chain, tmp_path, name) for name in names]
    outputs = [process.communicate(timeout=300) for process in resumes]
    assert [p.returncode for p in resumes] == [0, 0], outputs

    # Then each comes back live from its own snapshot, with its own data
    for name in names:
        server = running(real_chain, labs[name])
        assert labs[name].current is containers[name]
        new_pod = real_chain.pod_of(name)
        assert new_pod is not None
        restored = condition(new_pod, RESTORED)
        assert restored["status"] == "True" and pinned[name] in restored["message"], restored
        ready = server.wait_state("a.ipynb", "ready", "partial", "failed")
        assert ready["how"] == "live" and ready["kernel_id"] == kernels[name], ready
        assert f"restored from snapshot {pinned[name]}" in ready["message"], ready["message"]
        assert server.run(kernels[name], CHECKSUM_CELL) == expected[name]
