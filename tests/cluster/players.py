"""The parts of a cluster the test API server lacks, played by the tests against it.

There is no controller-manager, scheduler, kubelet, Kubeflow Workspace controller or GKE
snapshot agent. ``PlayedCluster`` plays each of them on the real API objects, in one
background thread that reconciles every 50 ms:

* **Workspace controller**: ``spec.paused`` true -> the pod is deleted; false -> a pod is
  created from the Workspace (its ``podTemplate.podMetadata``, the snapshot pin included).
* **scheduler**: a pending pod fits when the node has its GPUs free, else it stays
  ``Pending`` with ``PodScheduled=False``, reason ``Unschedulable``.
* **kubelet**: a scheduled pod becomes a real ``jupyter server`` process on this machine with
  the pod's environment (``POD_NAME``, ``KUBERNETES_SERVICE_HOST``...) and a service-account
  token from the TokenRequest API; deleting the pod sends it SIGTERM, then SIGKILL after the
  grace period.
* **GKE snapshot agent**: a ``PodSnapshotManualTrigger`` makes a ``PodSnapshot``; a pod is
  "snapshotted" by keeping its processes: when it is deleted they are frozen (SIGSTOP)
  instead of ended, and a pod created with ``podsnapshot.gke.io/ps-name`` naming that
  snapshot thaws them (SIGCONT) with ``PodRestored=True``: a live restore. ``restore_mode``
  plays the failures: a snapshot that does not match (a cold start with ``PodRestored=False``)
  or a silent cold start (no condition at all).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
import tty
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..server_process import free_port, server_config, spawn_server, wait_serving
from .control_plane import AUDIENCE, ControlPlane
from .deploy_manifests import install_workspace_rbac

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
WORKSPACE_LABEL = "notebooks.kubeflow.org/workspace-name"
PIN_ANNOTATION = "podsnapshot.gke.io/ps-name"
MERGE = "application/merge-patch+json"


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_for(check: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@dataclass
class PodProcess:
    """One incarnation of a workspace's pod: a real jupyter server (and its kernels)."""

    pod_uid: str
    process: subprocess.Popen[bytes]
    port: int
    token: str
    workdir: Path  # ephemeral: runtime dir, service-account files (the pod's own disk)
    log: Path
    frozen: bool = False
    exit_seconds: float | None = None  # SIGTERM to exit, when it was stopped
    stopped: threading.Event = field(default_factory=threading.Event)  # the kubelet is done

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def freeze(self) -> None:
        for proc in self.tree():
            proc.suspend()
        self.frozen = True

    def thaw(self) -> None:
        for proc in self.tree():
            proc.resume()
        self.frozen = False

    def kill(self) -> None:
        for proc in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.process.wait()

    def terminate(self, grace: float) -> None:
        """The kubelet's stop: SIGTERM to the container's process, SIGKILL after ``grace``."""
        kernels = self.tree()[1:]
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
            self.exit_seconds = time.monotonic() - started
        except subprocess.TimeoutExpired:
            self.exit_seconds = None
        for proc in [*self.tree(), *kernels]:  # the container's end takes every process along
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.process.wait()
        self.stopped.set()


@dataclass
class Snapshot:
    name: str
    pod_uid: str
    trigger: str
    holds: PodProcess | None = None  # the frozen processes this snapshot "contains"


@dataclass
class WorkspacePlay:
    """What the players know of one Workspace: its home volume and its pods' processes."""

    namespace: str
    name: str
    home: Path  # the PVC: outlives every pod
    service_account: str
    gpus: int = 1
    grace_seconds: float = 30.0  # the pod's terminationGracePeriodSeconds
    api_port: int | None = None  # where its pods find the API server (None: the real one)
    extra_config: str = ""  # more jupyter_server_config.py lines for its pods
    pods_created: int = 0
    current: PodProcess | None = None
    stopped: list[PodProcess] = field(default_factory=list)
    jupyter_token: str = field(default_factory=lambda: os.urandom(12).hex())

    @property
    def pod_name(self) -> str:
        return f"ws-{self.name}-0"  # a StatefulSet's pod: the same name each time


class PlayedCluster:
    """Workspace controller, scheduler, kubelet and snapshot agent on a real API server."""

    def __init__(self, control_plane: ControlPlane, namespace: str) -> None:
        from kubernetes import client

        self.control_plane = control_plane
        self.namespace = namespace
        self.api = control_plane.admin.api_client()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.workspaces: dict[str, WorkspacePlay] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.node_gpus = 1  # the one GPU node of this little cluster
        self.blockers = 0  # GPUs another team's pods hold (the "GPU is scarce" case)
        self.restore_mode = "live"  # live | mismatch | silent
        self.fail_triggers = 0  # the snapshot agent fails this many triggers first
        self.trigger_outcomes: list[tuple[str, str]] = []  # (trigger, reason), as answered
        # What deploy/gvisor-admission-policy.yaml does on GKE (1.20 has no admission
        # policies): the Workspace's pods run in gVisor. False: a node pool without it.
        self.gvisor_admission = True
        self.errors: list[str] = []
        self.started_pods: list[str] = []  # uids, in order
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- setup ------------------------------------------------------------------------------------
    def create_namespace(self) -> None:
        from kubernetes import client

        self.core.create_namespace(client.V1Namespace(metadata={"name": self.namespace}))
        # GKE Sandbox's runtime class, as GKE has it (pods naming a missing one are refused).
        with contextlib.suppress(client.exceptions.ApiException):  # 409: made by another test
            client.NodeV1Api(self.api).create_runtime_class(
                {"metadata": {"name": "gvisor"}, "handler": "runsc"}
            )

    def create_policy(self, trigger: str = "manual") -> None:
        self.custom.create_namespaced_custom_object(
            "podsnapshot.gke.io",
            "v1",
            self.namespace,
            "podsnapshotpolicies",
            {
                "apiVersion": "podsnapshot.gke.io/v1",
                "kind": "PodSnapshotPolicy",
                "metadata": {"name": "jupyter-pause"},
                "spec": {
                    "storageConfigName": "jupyter-pause-snapshots",
                    "selector": {"matchLabels": {"jupyter-pause.io/snapshots": "manual"}},
                    "triggerConfig": {"type": trigger, "postCheckpoint": "resume"},
                },
            },
        )

    def create_workspace(
        self, name: str, home: Path, gpus: int = 1, grace: float = 30.0
    ) -> WorkspacePlay:

        account = f"ws-{name}"  # the Workspace controller's service account per Workspace
        # Its RBAC as shipped for the pod-snapshots mode (the ClusterRole bound to the
        # Workspace's own account, and deploy/modes/.../rbac-workspace.yaml stamped for it).
        install_workspace_rbac(self.control_plane, "pod-snapshots", self.namespace, name)
        self.custom.create_namespaced_custom_object(
            "kubeflow.org",
            "v1beta1",
            self.namespace,
            "workspaces",
            {
                "apiVersion": "kubeflow.org/v1beta1",
                "kind": "Workspace",
                "metadata": {"name": name},
                "spec": {
                    "paused": False,
                    "kind": "jupyterlab-pause",
                    "podTemplate": {
                        "volumes": {"home": f"{name}-home"},
                        "options": {"imageConfig": "jupyterlab-pause", "podConfig": "gpu-1"},
                    },
                },
            },
        )
        home.mkdir(parents=True, exist_ok=True)
        play = WorkspacePlay(self.namespace, name, home, account, gpus, grace)
        with self._lock:
            self.workspaces[name] = play
        return play

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="played-cluster", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for play in self.workspaces.values():
            for pod in [play.current, *play.stopped]:
                if pod is not None and pod.process.poll() is None:
                    if pod.frozen:
                        pod.thaw()
                    pod.kill()
        for snapshot in self.snapshots.values():
            if snapshot.holds is not None and snapshot.holds.process.poll() is None:
                snapshot.holds.thaw()
                snapshot.holds.kill()
        for play in self.workspaces.values():
            for pod in [play.current, *play.stopped]:
                if pod is not None:
                    shutil.rmtree(pod.workdir, ignore_errors=True)
        self.api.close()
        assert not self.errors, "\n".join(self.errors)

    # -- the loop ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:  # the gVisor agents add snapshots from their own threads
                    self.reconcile()
            except Exception:  # a player's bug must fail the test, not hang it
                self.errors.append(traceback.format_exc())
                return
            self._stop.wait(0.05)

    def reconcile(self) -> None:
        for play in list(self.workspaces.values()):
            workspace = self.custom.get_namespaced_custom_object(
                "kubeflow.org", "v1beta1", self.namespace, "workspaces", play.name
            )
            pod = self._pod(play)
            paused = bool(workspace["spec"].get("paused"))
            if paused and pod is not None:
                self._delete_pod(play, pod)
                self._workspace_state(play, "Paused")
            elif not paused and pod is None:
                self._create_pod(play, workspace)
                self._workspace_state(play, "Pending")
            elif pod is not None and not self._scheduled(pod):
                self._schedule(play, pod)
        self._snapshot_agent()

    def _pod(self, play: WorkspacePlay) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            answer = self.core.read_namespaced_pod(
                play.pod_name, self.namespace, _preload_content=False
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return json.loads(answer.data)

    def _workspace_state(self, play: WorkspacePlay, state: str) -> None:
        self.custom.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1beta1", self.namespace, "workspaces", play.name,
            {"status": {"state": state, "pauseTime": int(time.time()) if state == "Paused" else 0}},
            _content_type=MERGE,
        )  # fmt: skip

    # -- Workspace controller ---------------------------------------------------------------------
    def _create_pod(self, play: WorkspacePlay, workspace: dict[str, Any]) -> None:
        metadata = (workspace["spec"]["podTemplate"].get("podMetadata")) or {}
        labels = {
            **(metadata.get("labels") or {}),
            WORKSPACE_LABEL: play.name,
            "jupyter-pause.io/snapshots": "manual",  # from the WorkspaceKind's podMetadata
        }
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": play.pod_name,
                "labels": labels,
                "annotations": dict(metadata.get("annotations") or {}),
            },
            "spec": {
                **({"runtimeClassName": "gvisor"} if self.gvisor_admission else {}),
                "serviceAccountName": play.service_account,
                "terminationGracePeriodSeconds": int(play.grace_seconds),
                "containers": [
                    {
                        "name": "main",
                        "image": "jupyterlab-pause:test",
                        "resources": {"limits": {"nvidia.com/gpu": str(play.gpus)}},
                    }
                ],
            },
        }
        self.core.create_namespaced_pod(self.namespace, body)
        play.pods_created += 1

    def _delete_pod(self, play: WorkspacePlay, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        self.core.delete_namespaced_pod(play.pod_name, self.namespace, grace_period_seconds=0)
        running = play.current
        if running is None or running.pod_uid != uid:
            return
        play.current = None
        snapshot = next(
            (s for s in self.snapshots.values() if s.pod_uid == uid and s.holds is None), None
        )
        if snapshot is not None:
            # The snapshot holds this pod's processes: they wait, frozen, to be restored.
            running.freeze()
            snapshot.holds = running
            return
        play.stopped.append(running)
        # The kubelet's stop runs beside the loop: SIGTERM, then SIGKILL after the grace.
        threading.Thread(target=running.terminate, args=(play.grace_seconds,), daemon=True).start()

    # -- scheduler --------------------------------------------------------------------------------
    @staticmethod
    def _scheduled(pod: dict[str, Any]) -> bool:
        for entry in (pod.get("status") or {}).get("conditions") or []:
            if entry.get("type") == "PodScheduled" and entry.get("status") == "True":
                return True
        return False

    def gpus_in_use(self) -> int:
        return (
            sum(play.gpus for play in self.workspaces.values() if play.current is not None)
            + self.blockers
        )

    def _schedule(self, play: WorkspacePlay, pod: dict[str, Any]) -> None:
        free = self.node_gpus - self.gpus_in_use()
        if free < play.gpus:
            self._set_pod_status(
                play,
                {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": f"0/1 nodes are available: 1 Insufficient nvidia.com/gpu "
                            f"(wants {play.gpus}, {max(free, 0)} free).",
                            "lastTransitionTime": now_rfc3339(),
                        }
                    ],
                },
            )
            return
        self._kubelet_start(play, pod)

    def _set_pod_status(self, play: WorkspacePlay, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(
            play.pod_name, self.namespace, {"status": status}, _content_type=MERGE
        )

    # -- kubelet (and the snapshot agent's restore) -----------------------------------------------
    def _kubelet_start(self, play: WorkspacePlay, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        pin = (pod["metadata"].get("annotations") or {}).get(PIN_ANNOTATION)
        held = self.snapshots.get(pin) if pin else None
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}
        ]
        frozen = [s for s in self.snapshots.values() if s.holds is not None]
        if held is not None and held.holds is not None and self.restore_mode == "live":
            play.current = held.holds
            held.holds = None
            play.current.pod_uid = uid
            conditions.append(
                {
                    "type": "PodRestored",
                    "status": "True",
                    "reason": "Restored",
                    "message": f"restored from PodSnapshot {held.name}",
                    "lastTransitionTime": now_rfc3339(),
                }
            )
            self._set_pod_status(
                play, {"phase": "Running", "podIP": "127.0.0.1", "conditions": conditions}
            )
            play.current.thaw()
        else:
            for snapshot in frozen:  # never restored: what they held is gone
                assert snapshot.holds is not None
                snapshot.holds.thaw()
                snapshot.holds.kill()
                snapshot.holds = None
            if pin and self.restore_mode == "mismatch":
                conditions.append(
                    {
                        "type": "PodRestored",
                        "status": "False",
                        "reason": "NoMatchingSnapshot",
                        "message": f"PodSnapshot {pin} does not match this pod's spec hash",
                        "lastTransitionTime": now_rfc3339(),
                    }
                )
            self._set_pod_status(play, {"phase": "Pending", "conditions": conditions})
            play.current = self._start_server(play, uid)
            self._set_pod_status(
                play, {"phase": "Running", "podIP": "127.0.0.1", "conditions": conditions}
            )
        self.started_pods.append(uid)
        self._workspace_state(play, "Running")

    def service_account_token(self, play: WorkspacePlay) -> str:
        from kubernetes import client

        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
        )
        answer = self.core.create_namespaced_service_account_token(
            play.service_account, self.namespace, request
        )
        return answer.status.token

    def _start_server(self, play: WorkspacePlay, uid: str) -> PodProcess:
        workdir = Path(tempfile.mkdtemp(prefix="jp-pod-", dir="/tmp"))  # short: IPC socket paths
        accounts = workdir / "sa"
        accounts.mkdir()
        (accounts / "token").write_text(self.service_account_token(play))
        shutil.copy(self.control_plane.pki / "ca.crt", accounts / "ca.crt")
        (accounts / "namespace").write_text(self.namespace)
        port = free_port()
        # What /proc/gvisor/checkpoint is in GKE Sandbox: a file the workload opens once,
        # writes "1" to, then reads from; the read blocks until the checkpoint is done and
        # gives b"" or b"r". A pty's other end behaves so (raw: no echo, no line buffering).
        agent_end, pod_end = os.openpty()
        tty.setraw(pod_end)
        gvisor = Path(os.ttyname(pod_end))
        config = workdir / "jupyter_server_config.py"
        config.write_text(
            # deploy/jupyter_server_config.json, as the image's /etc/jupyter holds it (a
            # --config file is the only one jupyter_server reads, so it is merged here first)
            "import json\nfrom traitlets.config import Config\n"
            f"c.merge(Config(json.load(open({str(DEPLOY / 'jupyter_server_config.json')!r}))))\n"
            "import faulthandler, signal\n"  # SIGUSR2: every thread's stack in the log
            "faulthandler.register(signal.SIGUSR2, all_threads=True)\n"
            f"c.PauseApp.service_account_dir = {str(accounts)!r}\n"
            f"c.PauseApp.gvisor_checkpoint_file = {str(gvisor)!r}\n"
            "c.PauseApp.workspace_poll_seconds = 0.2\n"
            "c.PauseApp.monitor_interval_seconds = 3600.0\n"
            "c.PauseApp.busy_wait_seconds = 5.0\n"
            f"c.PauseApp.gpu_count = {play.gpus}\n"  # the GPU the pod's container is given
            + server_config(port, play.jupyter_token, play.home)
            + play.extra_config
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "KUBERNETES"))}
        env.update(
            HOME=str(play.home),
            POD_NAME=play.pod_name,
            POD_NAMESPACE=self.namespace,
            KUBERNETES_SERVICE_HOST="127.0.0.1",
            KUBERNETES_SERVICE_PORT=str(play.api_port or self.control_plane.port),
            JUPYTER_RUNTIME_DIR=str(workdir / "runtime"),
            JUPYTER_CONFIG_DIR=str(workdir / "config"),
        )
        log = workdir / "server.log"
        process = spawn_server(config, env, play.home, log)
        pod = PodProcess(uid, process, port, play.jupyter_token, workdir, log)
        wait_serving(process, pod.url, pod.token, log)
        threading.Thread(
            target=self._gvisor_agent, args=(play, pod, agent_end, pod_end), daemon=True
        ).start()
        return pod

    # -- snapshot agent ---------------------------------------------------------------------------
    def _gvisor_agent(
        self, play: WorkspacePlay, pod: PodProcess, agent_end: int, pod_end: int
    ) -> None:
        """gVisor's side of a workload trigger: a ``1`` from the pod, a snapshot, ``r``."""
        try:
            while not self._stop.is_set() and pod.process.poll() is None:
                ready, _, _ = select.select([agent_end], [], [], 0.2)
                if not ready:
                    continue
                if os.read(agent_end, 1) != b"1":
                    continue
                with self._lock:
                    name = self._take_snapshot(pod.pod_uid, play.pod_name, "workload")
                os.write(agent_end, b"r" if name else b"e")
        finally:
            os.close(agent_end)
            os.close(pod_end)

    def _take_snapshot(self, pod_uid: str, pod_name: str, trigger: str) -> str:
        """A ready PodSnapshot of the pod, labelled as GKE does with the trigger that asked
        for it and the pod it was taken of; the pod's processes are what it holds."""
        snapshot = f"{pod_uid[:8]}-{os.urandom(3).hex()}"
        self.custom.create_namespaced_custom_object(
            "podsnapshot.gke.io", "v1", self.namespace, "podsnapshots",
            {
                "apiVersion": "podsnapshot.gke.io/v1",
                "kind": "PodSnapshot",
                "metadata": {"name": snapshot, "labels": {"gke-pod-snapshot-triggered-by": trigger,
                                                          "podsnapshot.gke.io/origin-pod": pod_name}},
                "spec": {"policyName": "jupyter-pause"},
            },
        )  # fmt: skip
        self.custom.patch_namespaced_custom_object_status(
            "podsnapshot.gke.io", "v1", self.namespace, "podsnapshots", snapshot,
            {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                                        "lastTransitionTime": now_rfc3339()}]}},
            _content_type=MERGE,
        )  # fmt: skip
        self.snapshots[snapshot] = Snapshot(snapshot, pod_uid, trigger)
        return snapshot

    def _snapshot_agent(self) -> None:
        triggers = self.custom.list_namespaced_custom_object(
            "podsnapshot.gke.io", "v1", self.namespace, "podsnapshotmanualtriggers"
        )["items"]
        for trigger in triggers:
            if (trigger.get("status") or {}).get("conditions"):
                continue  # spent: a trigger never fires again
            name = trigger["metadata"]["name"]
            play = next(
                (p for p in self.workspaces.values() if p.pod_name == trigger["spec"]["targetPod"]),
                None,
            )
            pod = self._pod(play) if play is not None else None
            if pod is None or play is None or play.current is None:
                self._trigger_status(name, "False", "Failed", "the target pod is not running")
                continue
            if self.fail_triggers > 0:
                self.fail_triggers -= 1
                self._trigger_status(name, "False", "Error", "checkpoint of the sandbox failed")
                continue
            snapshot = self._take_snapshot(pod["metadata"]["uid"], play.pod_name, name)
            self._trigger_status(name, "True", "Complete", "snapshot taken", snapshot)

    def _trigger_status(
        self, name: str, status: str, reason: str, message: str, snapshot: str | None = None
    ) -> None:
        self.trigger_outcomes.append((name, reason))
        body: dict[str, Any] = {
            "status": {
                "conditions": [
                    {
                        "type": "Triggered",
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now_rfc3339(),
                    }
                ]
            }
        }
        if snapshot:
            body["status"]["snapshotCreated"] = {"name": snapshot}
        self.custom.patch_namespaced_custom_object_status(
            "podsnapshot.gke.io", "v1", self.namespace, "podsnapshotmanualtriggers", name, body,
            _content_type=MERGE,
        )  # fmt: skip

    # -- what tests do as the platform or the admin -----------------------------------------------
    def set_paused(self, name: str, paused: bool) -> None:
        """What Kubeflow's idle culler (or a user in the UI) does to a Workspace."""
        self.custom.patch_namespaced_custom_object(
            "kubeflow.org", "v1beta1", self.namespace, "workspaces", name,
            {"spec": {"paused": paused}}, _content_type=MERGE,
        )  # fmt: skip

    def workspace(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            "kubeflow.org", "v1beta1", self.namespace, "workspaces", name
        )

    def state_annotation(self, name: str) -> dict[str, Any]:
        raw = (self.workspace(name)["metadata"].get("annotations") or {}).get(
            "jupyter-pause.io/state"
        )
        return json.loads(raw) if raw else {}

    def user_kubeconfig(self, folder: Path) -> Path:
        """A kubeconfig of the unprivileged user, bound to deploy/rbac-user.yaml here."""
        path = folder / f"kubeconfig-{self.namespace}"
        if not path.exists():
            self.control_plane.apply_file(
                DEPLOY / "rbac-user.yaml", NAMESPACE=self.namespace, USER="pause-user"
            )
            self.control_plane.user.kubeconfig(path, self.namespace)
        return path

    def edit_role(self, play: WorkspacePlay, drop: dict[str, str]) -> None:
        """An admin takes verbs from the shipped RBAC (resource -> verb); returns once the API
        server refuses each of them to ``play``'s pod, asked with that pod's own token.

        Workspace verbs are in the Workspace's own Role; the snapshot verbs in the mode's
        ClusterRole, which every namespace shares: the admin binds a namespaced copy without
        the dropped verbs in its place."""
        from kubernetes import client

        rbac = client.RbacAuthorizationV1Api(self.api)

        def without(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
            kept = []
            for rule in rules:
                verbs = [v for v in rule["verbs"] if drop.get(rule["resources"][0]) != v]
                if verbs:
                    kept.append({**rule, "verbs": verbs})
            return kept

        own = f"jupyter-pause-ws-{play.name}"
        role = self.api.sanitize_for_serialization(rbac.read_namespaced_role(own, self.namespace))
        rbac.patch_namespaced_role(
            own, self.namespace, {"rules": without(role["rules"])}, _content_type=MERGE
        )
        if any(resource != "workspaces" for resource in drop):
            shared = "jupyter-pause-pod-snapshots"
            edited = f"{shared}-edited"
            cluster_role = self.api.sanitize_for_serialization(rbac.read_cluster_role(shared))
            rbac.create_namespaced_role(
                self.namespace,
                {"metadata": {"name": edited}, "rules": without(cluster_role["rules"])},
            )
            rbac.delete_namespaced_role_binding(
                f"{play.service_account}-{shared}"[:63], self.namespace
            )
            rbac.create_namespaced_role_binding(
                self.namespace,
                {
                    "metadata": {"name": edited},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": edited,
                    },
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "name": play.service_account,
                            "namespace": self.namespace,
                        }
                    ],
                },
            )
        # A SelfSubjectAccessReview sent with the token the pod's server calls with: the API
        # server judges exactly the identity (user and every group it authenticates to) that
        # the pause will use, which a SubjectAccessReview written by the admin only imitates.
        pod = play.current
        token = (
            (pod.workdir / "sa" / "token").read_text()
            if pod is not None
            else self.service_account_token(play)
        )
        with self.control_plane.credentials(token).api_client() as as_pod:
            authorization = client.AuthorizationV1Api(as_pod)
            for resource, verb in drop.items():
                group = "kubeflow.org" if resource == "workspaces" else "podsnapshot.gke.io"
                review = client.V1SelfSubjectAccessReview(
                    spec=client.V1SelfSubjectAccessReviewSpec(
                        resource_attributes=client.V1ResourceAttributes(
                            namespace=self.namespace,
                            verb=verb,
                            group=group,
                            resource=resource,
                            # the Workspace's own Role names it (resourceNames): ask by name
                            name=play.name if resource == "workspaces" else None,
                        )
                    )
                )
                wait_for(
                    lambda review=review: (
                        not authorization.create_self_subject_access_review(review).status.allowed
                    ),
                    30,
                    f"the API server to refuse {verb} {resource} to {play.service_account}",
                )

    def quota(self, resource: str, hard: int) -> None:
        """A ResourceQuota on ``resource``, its status set as the quota controller would."""
        body = {"metadata": {"name": "limits"}, "spec": {"hard": {resource: str(hard)}}}
        self.core.create_namespaced_resource_quota(self.namespace, body)
        status = {"status": {"hard": {resource: str(hard)}, "used": {resource: "0"}}}
        self.core.patch_namespaced_resource_quota_status(
            "limits", self.namespace, status, _content_type=MERGE
        )

    def snapshot_names(self) -> list[str]:
        items = self.custom.list_namespaced_custom_object(
            "podsnapshot.gke.io", "v1", self.namespace, "podsnapshots"
        )["items"]
        return sorted(i["metadata"]["name"] for i in items)
