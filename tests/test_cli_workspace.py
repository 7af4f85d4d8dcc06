"""``jupyter pause --workspace``: its usage, a fast CLI for everything else, and against a real
API server with Kubeflow Notebooks v2's CRDs: the Workspace's own state and the pause mode
shown, and a resume that meets an Error state stopping at once instead of waiting for ever."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.backends.kube import STATE_ANNOTATION

from .built_tools import CannotRun
from .cluster.control_plane import UPSTREAM_CRDS, ControlPlane, apiserver_binary, wait_until
from .cluster.deploy_manifests import (
    DEPLOY,
    create_once,
    mode_file,
    pod_labels,
    workspace_kind,
)


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBE"))}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )


def test_commands_without_workspace_never_import_the_kubernetes_client() -> None:
    # When the CLI asks a (missing) server for its status, as a user types it in a loop
    code = (
        "import sys\n"
        "from jupyter_pause import cli\n"
        "rc = cli.main(['status', '--url', 'http://127.0.0.1:9', '--token', 't'])\n"
        "print(rc, 'kubernetes' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    # Then it answered (no server: 3) without loading the kubernetes client (~1 s of imports)
    assert done.stdout.split() == ["3", "False"], done.stdout + done.stderr


def test_resume_needs_a_notebook_or_a_workspace() -> None:
    done = run_cli("resume")
    assert done.returncode == 2
    assert "resume needs NOTEBOOK, or --workspace NAMESPACE/NAME" in done.stderr


def test_workspace_without_any_cluster_says_so(tmp_path: Path) -> None:
    # Given no kubeconfig and no service account (not in a pod)
    missing = tmp_path / "no-kubeconfig"

    # When a workspace's status is asked for
    done = run_cli("status", "--workspace", "team/lab", KUBECONFIG=str(missing))

    # Then it says it cannot reach a cluster, with the exit code of "no server"
    assert done.returncode == 3, done.stderr
    assert "Cannot reach a cluster" in done.stderr and "kubeconfig" in done.stderr


# -- against a real API server with Kubeflow Notebooks v2's CRDs ----------------------------------
# The Notebooks controller and the kubelet do not run here: where they would write the
# Workspace's status and the pod's, the test does, through the same API (the status subresource),
# with what upstream's workspace_controller.go writes.
#: What upstream's controller writes for a pod in ImagePullBackOff (stateMsgErrorPodImagePullBackOff).
ERROR_MESSAGE = "Workspace Pod is not running (ImagePullBackOff)"
IMAGE = "REGISTRY/jupyterlab-pause:0.1.0"  # the shipped WorkspaceKind's
_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver with the upstream CRDs (no controllers: the test plays them)."""
    try:
        binary = apiserver_binary()
    except CannotRun as err:
        pytest.skip(f"CLUSTER TESTS SKIPPED: {err}")
    control = ControlPlane(tmp_path_factory.mktemp("cli-plane"), binary)
    try:
        control.start()
        control.load_crds(UPSTREAM_CRDS)
        create_once(control, mode_file("no-snapshots", "workspacekind.yaml"))
        yield control
    finally:
        control.stop()


class Corner:
    """A profile namespace, its user (deploy/rbac-user.yaml: what the CLI may do), and the
    Workspaces in it, written as the Kubeflow UI, the Notebooks controller and the kubelet do."""

    def __init__(self, plane: ControlPlane, tmp_path: Path) -> None:
        from kubernetes import client

        self.plane = plane
        self.namespace = f"cli-{next(_numbers)}"
        self.api = plane.admin.api_client()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.core.create_namespace({"metadata": {"name": self.namespace}})
        plane.apply_file(DEPLOY / "rbac-user.yaml", NAMESPACE=self.namespace, USER="pause-user")
        self.kubeconfig = plane.user.kubeconfig(tmp_path / "kubeconfig", self.namespace)
        self.kind = workspace_kind("no-snapshots")

    def close(self) -> None:
        self.core.delete_namespace(self.namespace)
        self.api.close()

    def workspace(self, name: str, paused: bool, annotations: dict[str, str]) -> None:
        options = self.kind["spec"]["podTemplate"]["options"]
        self.custom.create_namespaced_custom_object(
            "kubeflow.org", "v1beta1", self.namespace, "workspaces",
            {"apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
             "metadata": {"name": name, "annotations": annotations},
             "spec": {"kind": self.kind["metadata"]["name"], "paused": paused,
                      "podTemplate": {"options": {
                          "imageConfig": options["imageConfig"]["spawner"]["default"],
                          "podConfig": options["podConfig"]["spawner"]["default"]},
                          "volumes": {}}}},
        )  # fmt: skip

    def read(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            "kubeflow.org", "v1beta1", self.namespace, "workspaces", name
        )

    def controller_status(self, name: str, state: str, message: str, pod: str = "") -> None:
        """The Notebooks controller's status of the Workspace (every field its CRD requires).
        Where it has no pod (or node) the controller writes "" there; this 1.20 API server
        refuses an empty string in those required fields (it reads it as null), so "-" is
        written instead (the CLI reads neither)."""
        options = self.kind["spec"]["podTemplate"]["options"]
        self.custom.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1beta1", self.namespace, "workspaces", name,
            {"status": {"activity": {"lastActivity": 0, "lastUpdate": 0},
                        "lastRunningTime": 0, "pauseTime": 0, "pendingRestart": False,
                        "podTemplateOptions": {
                            "imageConfig": {"desired": options["imageConfig"]["spawner"]["default"]},
                            "podConfig": {"desired": options["podConfig"]["spawner"]["default"]}},
                        "podTemplatePod": {"name": pod or "-", "nodeName": "-"},
                        "state": state, "stateMessage": message}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip

    def pod(self, workspace: str) -> str:
        """The Workspace's pod, as its StatefulSet makes it (Pending: no node runs it)."""
        name = f"ws-{workspace}-x1y2z-0"
        self.core.create_namespaced_pod(
            self.namespace,
            {"metadata": {"name": name, "labels": pod_labels("no-snapshots", workspace)},
             "spec": {"containers": [{"name": "main", "image": IMAGE}]}},
        )  # fmt: skip
        return name

    def kubelet_cannot_pull(self, pod: str) -> None:
        """The kubelet's word on the pod: its image cannot be pulled, and it backs off."""
        self.core.patch_namespaced_pod_status(
            pod, self.namespace,
            {"status": {"phase": "Pending", "containerStatuses": [{
                "name": "main", "ready": False, "restartCount": 0, "image": IMAGE,
                "imageID": "", "state": {"waiting": {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{IMAGE}"'}}}]}},
        )  # fmt: skip

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "jupyter_pause.cli", *args]

    def env(self) -> dict[str, str]:
        environ = {
            k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBE"))
        }
        return {**environ, "KUBECONFIG": str(self.kubeconfig)}


@pytest.fixture
def corner(plane: ControlPlane, tmp_path: Path) -> Iterator[Corner]:
    made = Corner(plane, tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_a_resume_whose_pod_cannot_pull_its_image_says_so_and_exits_at_once(
    corner: Corner,
) -> None:
    # Given a paused Workspace (the controller says Paused)
    corner.workspace("lab", paused=True, annotations={})
    corner.controller_status("lab", "Paused", "Workspace is paused")
    target = f"{corner.namespace}/lab"

    # When the user resumes it (a timeout far beyond what the test waits: a CLI that kept
    # waiting would be stopped by it, exit 7, and fail here)
    resume = subprocess.Popen(
        corner.cli("resume", "--workspace", target, "--timeout", "120"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=corner.env(),
    )  # fmt: skip
    try:
        wait_until(lambda: corner.read("lab")["spec"]["paused"] is False, 30, "the unpause")
        # and its pod is created and Pending (the controller says so too)
        pod = corner.pod("lab")
        corner.controller_status("lab", "Pending", "Workspace is pending", pod)
        time.sleep(1.5)  # three of the CLI's looks
        waited = resume.poll() is None
        # and the kubelet cannot pull the image (before the controller says Error)
        corner.kubelet_cannot_pull(pod)
        said = time.monotonic()
        _out, err = resume.communicate(timeout=30)
    finally:
        if resume.poll() is None:
            resume.kill()

    # Then it waited while the pod was Pending, and stopped at once (it looks every 0.5 s)
    # when the pod could not start: exit 1, naming the pod, the reason and what to look at
    assert waited, err
    assert resume.returncode == 1 and time.monotonic() - said < 10, err
    assert f"{target} cannot resume: The pod {pod} cannot start: container main: " in err, err
    assert f'ImagePullBackOff (Back-off pulling image "{IMAGE}")' in err, err
    assert f"kubectl describe pod -n {corner.namespace} {pod}" in err, err

    # When the controller catches up (Error, as upstream says it for ImagePullBackOff)
    corner.controller_status("lab", "Error", ERROR_MESSAGE, pod)

    # Then a second resume says so at once too, in the controller's words and the kubelet's
    started = time.monotonic()
    again = subprocess.run(
        corner.cli("resume", "--workspace", target, "--json"),
        capture_output=True, text=True, env=corner.env(), timeout=60,
    )  # fmt: skip
    assert again.returncode == 1 and time.monotonic() - started < 30, again.stderr
    record = json.loads(again.stdout)
    assert record["state"] == "error", record
    assert record["message"].startswith(f"The Workspace is in Error: {ERROR_MESSAGE}; "), record
    assert (record["workspace_state"], record["workspace_message"]) == ("Error", ERROR_MESSAGE)
    # and the status shows it (the status itself answered: exit 0)
    status = subprocess.run(
        corner.cli("status", "--workspace", target),
        capture_output=True, text=True, env=corner.env(), timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].startswith(f"{target}: error - The Workspace is in Error: {ERROR_MESSAGE}")
    assert lines[1:] == [f"  Workspace state: Error ({ERROR_MESSAGE})"]


def test_a_resume_waits_through_pending_and_stops_on_the_controllers_error(corner: Corner) -> None:
    # Given a paused Workspace, and a resume under way
    corner.workspace("lab", paused=True, annotations={})
    corner.controller_status("lab", "Paused", "Workspace is paused")
    resume = subprocess.Popen(
        corner.cli("resume", "--workspace", f"{corner.namespace}/lab", "--timeout", "120"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=corner.env(),
    )  # fmt: skip
    try:
        wait_until(lambda: corner.read("lab")["spec"]["paused"] is False, 30, "the unpause")
        # When the controller says Pending a while (no pod yet: the StatefulSet is being made)
        corner.controller_status("lab", "Pending", "Workspace is pending")
        time.sleep(1.5)
        # Then the resume waits
        assert resume.poll() is None
        # When the controller says Error (an invalid WorkspaceKind: no pod at all)
        message = "Workspace has invalid WorkspaceKind: kind not found"
        corner.controller_status("lab", "Error", message)
        said_error = time.monotonic()
        _out, err = resume.communicate(timeout=30)
    finally:
        if resume.poll() is None:
            resume.kill()

    # Then it stops at once, exit 1, with the controller's words
    assert resume.returncode == 1 and time.monotonic() - said_error < 10, err
    assert f"The Workspace is in Error: {message}" in err, err
    assert f"kubectl describe workspace -n {corner.namespace} lab" in err, err


def test_status_shows_the_workspaces_state_and_the_mode_of_its_pause(corner: Corner) -> None:
    from jupyter_pause.backends.base import SnapshotOutcome
    from jupyter_pause.server.environment_file import pause_state

    # Given a Workspace paused by its server in the pod-snapshots mode (the annotation written
    # by the server's own code), which the controller says is Paused
    outcome = SnapshotOutcome("snap-1", None, seconds=12.5, mode="pod-snapshots")
    state = pause_state("t", [], "idle", "user", "uid-1", outcome, "p1", time.time())
    assert state["mode"] == "pod-snapshots"  # what the server writes, read as the CLI reads it
    corner.workspace("lab", paused=True, annotations={STATE_ANNOTATION: json.dumps(state)})
    corner.controller_status("lab", "Paused", "Workspace is paused")
    target = f"{corner.namespace}/lab"

    # When its status is asked for
    text = subprocess.run(
        corner.cli("status", "--workspace", target),
        capture_output=True, text=True, env=corner.env(), timeout=60,
    )  # fmt: skip
    as_json = subprocess.run(
        corner.cli("status", "--workspace", target, "--json"),
        capture_output=True, text=True, env=corner.env(), timeout=60,
    )  # fmt: skip

    # Then it says the Workspace's state in the controller's words, and the mode
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"{target}: paused - Paused since "), lines
    assert "pod snapshot snap-1" in lines[0]
    assert lines[1:] == [
        "  Workspace state: Paused (Workspace is paused)",
        "  Pause mode: pod-snapshots",
    ]
    record = json.loads(as_json.stdout)
    assert record["workspace_state"] == "Paused"
    assert record["workspace_message"] == "Workspace is paused"
    assert (record["mode"], record["mode_reason"]) == ("pod-snapshots", None)

    # And a reason for the mode, where the server records one, is shown with it
    reason = "GKE Pod Snapshots: PodSnapshotPolicy jupyter-pause (manual trigger) selects this pod"
    corner.custom.patch_namespaced_custom_object(
        "kubeflow.org", "v1beta1", corner.namespace, "workspaces", "lab",
        {"metadata": {"annotations": {STATE_ANNOTATION: json.dumps({**state, "mode_reason": reason})}}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    text = subprocess.run(
        corner.cli("status", "--workspace", target),
        capture_output=True, text=True, env=corner.env(), timeout=60,
    )  # fmt: skip
    assert f"  Pause mode: pod-snapshots ({reason})" in text.stdout.splitlines()
