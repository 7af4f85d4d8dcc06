"""The kernel-pod provisioner: gateway-provisioners' ``KubernetesProvisioner`` that can pause.

Registered as the ``jupyter-pause-kernel-pod`` kernel provisioner (``pyproject.toml``), named by a
kernelspec's ``metadata.kernel_provisioner`` (``deploy/kernel-pods/``). Launching is upstream's:
the kernelspec's launcher renders the kernel pod template from ``KERNEL_*`` values and creates
the pod; the image's ``launch_ipykernel.py`` sends the kernel's connection info back to the
server's response address. Added here:

* **pause** (``pause()``, after the application checkpoint): the pod is deleted and gone (its GPU
  back to the scheduler) while the kernel keeps its id, its KernelManager and its launch
  arguments. ``poll()`` answers "running" while paused: a paused kernel is not dead, so
  jupyter_client's restarter never launches it again by itself.
* **resume** (``resume_kernel(manager)``): the KernelManager's own restart of the paused kernel,
  which this provisioner turns into a new pod under the same kernel id (nothing to stop: the pod
  went at the pause). While the scheduler has no room (``Pending`` + ``Unschedulable``) the
  launch waits with the scheduler's reason in ``waiting_reason``, and that wait does not count
  against the provisioners' launch timeout (``launch_timeout``, 30 s by default). A resume that
  fails or is cancelled deletes the pod it made and leaves the kernel paused.
* clear errors (``KernelPodError``) instead of tracebacks for failed API calls and launches.
* a server that stays responsive: upstream's response manager (where each launcher sends its
  kernel's connection info) is made to wait for connections without holding the event loop
  (``unblock_responses``).

gateway-provisioners is optional: importing this module without it raises a ``KernelPodError``
that says how to install it (jupyter_client loads a provisioner only when a kernelspec names it).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import IO, Any

import urllib3
from traitlets import Float

from .kernel_pod import (
    INSTALL_HINT,
    KernelPodError,
    api_detail,
    api_error,
    launcher_env,
    launcher_failure,
    pod_made_anew,
    unblock_responses,
    unschedulable_reason,
)

try:
    from gateway_provisioners.k8s import KubernetesProvisioner
    from kubernetes import client
    from kubernetes.client.rest import ApiException
except ImportError as missing:
    raise KernelPodError(
        f"the kernel-pod backend needs gateway-provisioners ({missing}): {INSTALL_HINT}"
    ) from missing
except Exception as no_config:  # k8s.py loads the cluster's config when imported
    raise KernelPodError(
        f"the kernel-pod backend could not load the Kubernetes configuration ({no_config}); "
        "outside a pod set GP_USE_INCLUSTER_CONFIG=false and KUBECONFIG"
    ) from no_config


#: The name kernelspecs give this provisioner (``metadata.kernel_provisioner``).
PROVISIONER_NAME = "jupyter-pause-kernel-pod"
#: The template values that give a kernel pod its GPUs (``kernel-pod.yaml.j2``).
GPU_VARIABLES = ("KERNEL_GPUS", "KERNEL_GPUS_LIMIT")
#: Set in a new kernel's environment by a resume on CPU: its pod asks for no GPU (the kernelspec's
#: own ``env``, which sets ``GPU_VARIABLES``, has the last word on a kernel's environment).
WITHOUT_GPUS_VARIABLE = "JUPYTER_PAUSE_KERNEL_WITHOUT_GPUS"
#: The template value that pins a pod snapshot on a kernel's new pod (``kernel-pod.yaml.j2``
#: renders GKE's ``podsnapshot.gke.io/ps-name`` and the label the snapshot policy selects).
SNAPSHOT_VARIABLE = "KERNEL_POD_SNAPSHOT"
#: The pod condition GKE's node agent sets on a pod it was asked to restore.
RESTORED_CONDITION = "PodRestored"
#: How long a running pod that pins a snapshot may go without GKE's ``PodRestored`` before its
#: launch is taken for a cold start (its kernel then sends its connection info as any does).
RESTORED_CONDITION_WAIT = 10.0


def pod_placement(namespace: str, kernel_id: str) -> tuple[bool, str | None]:
    """Whether the pod of kernel ``kernel_id`` has a node, and the scheduler's reason while it
    waits for one; (False, None) when there is no pod yet, or it cannot be read (the launch
    itself then says what went wrong)."""
    selector = f"kernel_id={kernel_id},component=kernel"
    try:
        pods = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=selector).items
    except (ApiException, urllib3.exceptions.HTTPError, OSError):
        return False, None
    for pod in pods:
        if pod.metadata.deletion_timestamp is None and pod.spec.node_name:
            return True, None
        reason = unschedulable_reason(client.ApiClient().sanitize_for_serialization(pod))
        if reason:
            return False, reason
    return False, None


class KernelPodProvisioner(KubernetesProvisioner):
    """A kernel in a pod of its own, which a pause deletes and a resume creates again."""

    pause_grace_seconds = Float(
        10.0,
        config=True,
        help="Seconds the kernel's process has to exit when a pause deletes its pod (the "
        "pod's deletion grace period); the application checkpoint is already taken. E.g. 10.",
    )
    pod_gone_timeout_seconds = Float(
        120.0,
        config=True,
        help="Seconds a pause waits for the deleted pod to be gone from the API server (its GPU "
        "free again) before it fails and the kernel runs on. E.g. 120.",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        unblock_responses(self.response_manager)
        self.paused = False  # the pod was deleted by a pause; the kernel waits for a resume
        self.resuming = False  # this launch is a resume of a paused kernel
        #: While a launch waits for the scheduler: its message, e.g. "0/2 nodes are available:
        #: 2 Insufficient nvidia.com/gpu."; None otherwise.
        self.waiting_reason: str | None = None
        #: Whether the launching pod has a node.
        self.placed = False
        #: Called (from the launch) once the launching pod has a node: the kernel-pod backend's
        #: line of resumes looks again at once (``resume_line.py``).
        self.on_placed: Callable[[], None] | None = None
        #: The next launch's pod asks for no GPU (a resume on CPU, asked by the user).
        self.without_gpus = False
        #: The pod snapshot taken at the pause, until a launch of this kernel succeeds.
        self.snapshot: str | None = None
        #: Deletes a snapshot once it is spent (restored, or passed over by a fresh process: a
        #: user's Restart Kernel, a shutdown); set by the backend with the snapshot.
        self.drop_snapshot: Callable[[str], Awaitable[None]] | None = None
        #: The snapshot the next launch's pod pins: set by a resume (``resume_kernel`` or the
        #: backend), never by a user's Restart Kernel, which asks for a fresh process.
        self.pin_snapshot: str | None = None
        #: The snapshot the last launch's pod was restored from (the same kernel process, live).
        self.restored_from: str | None = None
        #: What the kernel's launcher sent at its start (ports, key, its listener): a kernel
        #: restored from a pod snapshot is that very process, and sends nothing again.
        self._launch_info: dict[str, Any] | None = None
        self._pod_restored: bool | None = None  # the launching pod's PodRestored, when said
        self._launcher_stderr: IO[bytes] | None = None
        self._pinned: str | None = None  # the snapshot the launching pod pins
        #: Why the launching pod, deleted to be made anew (``requeue``), could not be: the
        #: launch fails with it rather than wait for a pod that will not come.
        self._requeue_failed: KernelPodError | None = None

    # -- launch -----------------------------------------------------------------------------------
    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        self.resuming, self.paused = self.paused, False
        self.waiting_reason = None
        self.placed = False
        without_gpus = bool(kwargs.get("env", {}).pop(WITHOUT_GPUS_VARIABLE, None))
        kwargs = await super().pre_launch(**kwargs)
        # jupyter_client's conventions for a kernelspec's argv, which remote provisioners skip:
        # "python" is the server's interpreter, {resource_dir} the kernelspec's folder.
        resource_dir = self.kernel_spec.resource_dir
        cmd = [arg.replace("{resource_dir}", resource_dir) for arg in kwargs["cmd"]]
        if cmd and cmd[0] in ("python", "python3"):
            cmd[0] = sys.executable
        kwargs["cmd"] = cmd
        kwargs["env"] = launcher_env(kwargs["env"], self.kernel_spec.env or {})
        kwargs["env"].pop(SNAPSHOT_VARIABLE, None)
        if self.without_gpus or without_gpus:  # the template asks for GPUs with KERNEL_GPUS
            self.without_gpus = False
            for name in GPU_VARIABLES:
                kwargs["env"].pop(name, None)
        elif self.resuming and self.pin_snapshot:  # a GPU process's snapshot needs its GPU
            kwargs["env"][SNAPSHOT_VARIABLE] = self.pin_snapshot
        self.pin_snapshot = None
        self._pinned = kwargs["env"].get(SNAPSHOT_VARIABLE)
        self.restored_from = None
        self._pod_restored = None
        self._requeue_failed = None
        # The launcher's stderr is kept to say why it failed (a 403 on the pod's creation).
        self._launcher_stderr = tempfile.TemporaryFile()  # noqa: SIM115 - read on failure
        kwargs["stderr"] = self._launcher_stderr
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        try:
            info = await super().launch_kernel(cmd, **kwargs)
            launcher, self.local_proc = self.local_proc, None
            if launcher is not None:
                # The launcher's job ended with the pod's creation (the kernel in it answered):
                # reaped here, the kernel's life is the pod's (poll() reads its phase).
                await asyncio.to_thread(launcher.wait, 30)
            await self._spend_snapshot()  # restored, or this process's state is newer
            return info
        except BaseException:
            await self._reap_launcher()
            # A failed or cancelled launch leaves no pod behind (waiting for a GPU, say).
            await asyncio.to_thread(self._delete_quietly, self.kernel_pod_name)
            if self.resuming:  # the checkpoint is intact: back to paused, with no pod
                self.paused = True
                self.container_name = self.kernel_pod_name
            raise
        finally:
            self.resuming = False
            self.waiting_reason = None
            if self._launcher_stderr is not None:
                self._launcher_stderr.close()
                self._launcher_stderr = None

    async def confirm_remote_startup(self) -> None:
        """Upstream's wait for the pod and the kernel's connection info; for a pod that pins a
        snapshot which GKE restored (``PodRestored`` True), the kernel is the process that
        paused: its connection info is the one it sent at its start, at the new pod's IP."""
        if not self._pinned:
            await super().confirm_remote_startup()
            return
        self.start_time = self.get_current_time()
        running_since = None
        attempt = 0
        while True:
            attempt += 1
            await self.handle_launch_timeout()
            status = self.get_container_status(str(attempt))
            if not status:
                self.detect_launch_failure()
                continue
            if status in self.get_error_states():
                raise KernelPodError(f"the kernel pod failed to start (its phase is {status})")
            if not self.assigned_host:
                continue
            running_since = running_since or time.monotonic()
            if self._pod_restored and self._launch_info is not None:
                self._setup_connection_info(dict(self._launch_info))
                self.pid = self.pgid = 0
                self.restored_from = self._pinned
                self.log.info(
                    "Kernel %s restored from pod snapshot %s", self.kernel_id, self._pinned
                )
                return
            if self._pod_restored is False or (
                time.monotonic() - running_since > RESTORED_CONDITION_WAIT
            ):
                break
        # A cold start: the kernel image's launcher runs and sends its connection info.
        self.log.info(
            "Kernel %s: pod snapshot %s not restored, a cold start", self.kernel_id, self._pinned
        )
        while not await self.receive_connection_info():
            await self.handle_launch_timeout()
        self.pid = self.pgid = 0

    def _setup_connection_info(self, connect_info: dict) -> None:
        # What the launcher sent, kept as sent: a restored kernel is the same process.
        self._launch_info = dict(connect_info)
        super()._setup_connection_info(connect_info)

    async def _reap_launcher(self) -> None:
        """A launch that failed or was cancelled: its launcher ends (and is waited for)."""
        launcher = self.local_proc
        if launcher is None:
            return
        if launcher.poll() is None:
            launcher.kill()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(launcher.wait, 30)

    def get_container_status(self, iteration: str | None) -> str:
        """Upstream's answer (the kernel pod's phase, its IP once running), read with clear
        errors, and ``waiting_reason`` kept up to date."""
        selector = f"kernel_id={self.kernel_id},component=kernel"
        pods = self._call(
            "list the kernel's pods",
            lambda: client.CoreV1Api().list_namespaced_pod(
                namespace=self.kernel_namespace, label_selector=selector
            ),
        ).items
        pods = [p for p in pods if p.metadata.deletion_timestamp is None] or pods
        if not pods:
            if self._requeue_failed is not None:
                failed, self._requeue_failed = self._requeue_failed, None
                raise failed
            return ""
        pod = pods[0]
        self.container_name = pod.metadata.name
        phase = (pod.status.phase or "").lower() if pod.status else ""
        if phase == "running" and not self.assigned_host:
            self.assigned_ip = pod.status.pod_ip
            self.assigned_host = self.container_name
            self.assigned_node_ip = pod.status.host_ip
        self.placed = bool(pod.spec.node_name)
        if self.placed and self.on_placed is not None:
            self.on_placed()
        tried = False  # the scheduler said whether the pod has a node
        for condition in (pod.status.conditions or []) if pod.status else []:
            if condition.type == RESTORED_CONDITION:
                self._pod_restored = condition.status == "True"
            tried = tried or condition.type == "PodScheduled"
        reason = unschedulable_reason(client.ApiClient().sanitize_for_serialization(pod))
        if reason is None and not self.placed and not tried:
            reason = self.waiting_reason  # a pod made anew (``requeue``): no verdict on it yet
        if reason != self.waiting_reason:
            if reason:
                self.log.info("Kernel pod %s waits for resources: %s", pod.metadata.name, reason)
            self.waiting_reason = reason
        return phase

    async def handle_launch_timeout(self) -> None:
        if self.waiting_reason is not None:
            # Time spent waiting for the scheduler is not the launch's: the launch timeout
            # counts from when the pod got a node (a resume may wait hours for a GPU).
            self.start_time = self.get_current_time()
        await super().handle_launch_timeout()

    def detect_launch_failure(self) -> None:
        """A launcher that exited with an error: why, from its stderr (the API's message)."""
        process = self.local_proc
        if process is None or not process.poll():
            return
        process.wait()
        self.local_proc = None
        text = ""
        if self._launcher_stderr is not None:
            self._launcher_stderr.seek(0)
            text = self._launcher_stderr.read().decode(errors="replace")
        status, detail = launcher_failure(text)
        if status is not None:
            raise api_error("create the kernel pod", self.kernel_namespace, status, detail)
        raise KernelPodError(
            f"the kernel pod launcher exited with status {process.returncode}: {detail}"
        )

    def requeue(self) -> bool:
        """Make the launching pod anew while the scheduler refuses it a node, so that the
        scheduler tries it at once: the GPU a pod of this server's just gave back goes to it
        now, not once the scheduler's backoff for a pod it refused ends (up to 10 s, counted
        from its last try; ``bench/kernel_pods_rush.py``). Nothing in it ran yet: the new pod
        is the same name, labels, owner and spec. Returns whether it was made anew: False when
        it got a node meanwhile (the delete is conditional on the pod as read), is gone, is not
        refused, or has finalizers (it would not be gone at once, and its name not free).
        Blocking API calls: run it in a thread."""
        name = self.container_name or self.kernel_pod_name
        if not name or self.paused:
            return False
        pod = self._read(name)
        if pod is None or pod.spec.node_name or pod.metadata.deletion_timestamp is not None:
            return False
        if pod.metadata.finalizers:
            return False
        manifest = client.ApiClient().sanitize_for_serialization(pod)
        if unschedulable_reason(manifest) is None:
            return False
        unchanged = client.V1Preconditions(
            uid=pod.metadata.uid, resource_version=pod.metadata.resource_version
        )
        api = client.CoreV1Api()
        options = client.V1DeleteOptions(grace_period_seconds=0, preconditions=unchanged)
        deleted = self._call(
            f"delete kernel pod {name} to make it anew",
            lambda: api.delete_namespaced_pod(name, self.kernel_namespace, body=options),
            tolerate=(404, 409),  # gone, or changed (placed) since it was read
        )
        if deleted is None:
            return False
        try:
            self._call(
                f"make kernel pod {name} anew",
                lambda: api.create_namespaced_pod(self.kernel_namespace, pod_made_anew(manifest)),
            )
        except KernelPodError as err:  # its launch ends with why, the kernel stays paused
            self._requeue_failed = err
            raise
        return True

    # -- pause ------------------------------------------------------------------------------------
    async def pause(self) -> None:
        """Delete the kernel's pod and wait until it is gone (its GPU free); the kernel keeps
        its id. Take the application checkpoint first: the pod's memory goes with it."""
        if self.paused:
            return
        name = self.container_name
        if not name:
            raise KernelPodError(f"kernel {self.kernel_id} has no pod to pause")
        self.paused = True  # first: from now on poll() says paused, and the restarter leaves it
        self.placed = False
        try:
            await asyncio.to_thread(self._delete, name, self.pause_grace_seconds)
            await self._wait_gone(name)
        except BaseException:
            self.paused = False
            raise
        # The launcher's listener went with the pod: nothing to signal until the resume.
        self.comm_port = 0
        self.assigned_ip = None
        self.assigned_host = ""

    async def poll(self) -> int | None:
        if self.paused:
            return None  # paused is not dead: nothing to restart
        return await super().poll()

    async def send_signal(self, signum: int) -> None:
        if self.paused:
            return  # no process to signal: its state is in the checkpoint
        await super().send_signal(signum)

    async def cleanup(self, restart: bool = False) -> None:
        if not restart:
            self.paused = False  # shut down: nothing left to resume
            await self._spend_snapshot()
        await super().cleanup(restart=restart)

    async def _spend_snapshot(self) -> None:
        spent, self.snapshot = self.snapshot, None
        if spent and self.drop_snapshot is not None:
            await self.drop_snapshot(spent)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info["paused"] = self.paused
        info["kernel_pod_name"] = self.kernel_pod_name
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.paused = bool(provisioner_info.get("paused"))
        self.kernel_pod_name = provisioner_info.get("kernel_pod_name")
        if self.paused:
            self.container_name = self.kernel_pod_name

    # -- the API calls ----------------------------------------------------------------------------
    def _call(self, action: str, call: Any, tolerate: tuple[int, ...] = ()) -> Any:
        """``call()``'s answer; None for an API error whose status is in ``tolerate``; else
        a ``KernelPodError`` that says what ``action`` was and why it failed."""
        try:
            return call()
        except ApiException as err:
            if err.status in tolerate:
                return None
            raise api_error(
                action, self.kernel_namespace, err.status, api_detail(err.body, err.reason)
            ) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise api_error(action, self.kernel_namespace, None, str(err)) from None

    def _delete(self, name: str, grace: float) -> None:
        options = client.V1DeleteOptions(grace_period_seconds=int(grace))
        try:
            self._call(
                f"delete kernel pod {name}",
                lambda: client.CoreV1Api().delete_namespaced_pod(
                    name, self.kernel_namespace, body=options
                ),
            )
        except KernelPodError:
            if self._read(name) is not None:
                raise  # a 404 means it is gone already: that is what was asked

    def _delete_quietly(self, name: str | None) -> None:
        if not name:
            return
        try:
            self._delete(name, 0)
        except KernelPodError as err:
            self.log.warning("Kernel pod %s of a failed resume is left: %s", name, err)

    def _read(self, name: str) -> Any:
        """The pod ``name`` as the API server has it; None when there is none."""
        return self._call(
            f"read kernel pod {name}",
            lambda: client.CoreV1Api().read_namespaced_pod(name, self.kernel_namespace),
            tolerate=(404,),
        )

    async def _wait_gone(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.pod_gone_timeout_seconds
        while await asyncio.to_thread(self._read, name) is not None:
            if loop.time() > deadline:
                raise KernelPodError(
                    f"kernel pod {name} was deleted but is still there after "
                    f"{self.pod_gone_timeout_seconds:g} s (its node's kubelet may be down)"
                )
            await asyncio.sleep(0.2)


async def resume_kernel(manager: Any) -> None:
    """Bring a paused kernel pod back: the (async) KernelManager's own restart, which the
    provisioner turns into a new pod under the same kernel id. Returns once the new kernel
    answers its launch (connection info back); ``manager.provisioner.waiting_reason`` says why
    meanwhile, while it waits for the scheduler."""
    provisioner = manager.provisioner
    if not isinstance(provisioner, KernelPodProvisioner):
        raise KernelPodError(f"kernel {manager.kernel_id} is not a kernel pod")
    if not provisioner.paused:
        raise KernelPodError(f"kernel {manager.kernel_id} is not paused: nothing to resume")
    provisioner.pin_snapshot = provisioner.snapshot
    await manager.restart_kernel(now=True)
