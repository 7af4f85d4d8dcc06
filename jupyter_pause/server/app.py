"""The jupyter_pause server extension: the admin's policy as traitlets, and its start/stop.

Configure in ``jupyter_server_config.py``, e.g.::

    c.PauseApp.idle_pause_minutes = 60          # pause notebooks idle for an hour
    c.PauseApp.gpu_count = 4                    # 4 GPUs on this box, shared by everyone
    c.PauseApp.kernelspec_overrides = {"python3-cpu": {"auto_pause": False, "gpus": 0}}
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Enum, Float, Int, Unicode, default, validate

from ..backends.base import Backend, BackendError
from ..backends.kube import SERVICE_ACCOUNT_DIR
from ..backends.local import LocalBackend, detect_gpus
from ..kernel.autoload import AUTOLOAD_ENV
from ..kernel.store import default_store_root
from ..policy import Policy
from . import hub_activity, metrics
from .kernel_bridge import KernelBridge, untrack_own_messages
from .orchestrator import Orchestrator
from .routes import handlers

BACKENDS = ("auto", "local", "workspace", "criu", "kernel-pod", "jupyterhub")


class PauseApp(ExtensionApp):
    """Pause notebook sessions to storage, release their GPUs, and resume them later."""

    name = "jupyter_pause"
    description = "Pause a notebook session to storage and resume it later."
    load_other_extensions = True

    backend = Enum(
        list(BACKENDS),
        "auto",
        help="Where paused sessions go. 'local': stop the kernel process on this machine. "
        "'workspace': this server runs in a Kubeflow Workspace pod (GKE Workspaces too); a "
        "pause checkpoints every kernel, snapshots the pod where a GKE PodSnapshotPolicy "
        "selects it, and pauses the Workspace. 'criu': on this machine (root, or "
        "CAP_CHECKPOINT_RESTORE), snapshot the kernel process itself with CRIU and resume the "
        "very same process, even in the middle of a running cell; where `criu check` fails, "
        "pauses are the local backend's and say why. 'kernel-pod': each kernel of a kernelspec "
        "whose provisioner is jupyter-pause-kernel-pod runs in a pod of its own (needs "
        "gateway-provisioners[k8s]); a pause checkpoints it and deletes the pod (its GPU back to "
        "the scheduler) while the kernel keeps its id, and a resume creates the pod again and "
        "restores the checkpoint; other kernels are stopped and started as 'local' does. "
        "'jupyterhub': this is a JupyterHub single-user server (KubeSpawner, "
        "LocalProcessSpawner, SystemdSpawner); a pause checkpoints every kernel and asks the Hub "
        "to stop this server (its pod or process, and its GPU, go back), with the server's own "
        "token, which needs the scope delete:servers!server (c.Spawner.server_token_scopes); "
        "the next spawn shows the notebooks paused, and Resume restores them from files. "
        "'auto': 'workspace' in a pod with a "
        "service account token and POD_NAME/POD_NAMESPACE from the downward API, 'jupyterhub' "
        "in a server a JupyterHub spawned (JUPYTERHUB_API_TOKEN, _API_URL, _USER), else 'local'.",
    ).tag(config=True)

    criu_binary = Unicode(
        "criu",
        help="The criu backend's CRIU binary (a path, or a name on PATH). CRIU >= 4.1 on "
        "Linux >= 6.13 (Debian bookworm's 3.17 fails there); tests/criu/criu.sh builds one.",
    ).tag(config=True)

    cuda_checkpoint_binary = Unicode(
        "cuda-checkpoint",
        help="The criu backend's NVIDIA cuda-checkpoint (driver >= 550): suspends a kernel's "
        "CUDA context around its process snapshot. Without it, a kernel holding a CUDA context "
        "is paused from files only.",
    ).tag(config=True)

    service_account_dir = Unicode(
        SERVICE_ACCOUNT_DIR,
        help="Folder of the pod's service-account token, ca.crt and namespace (the workspace "
        "backend; the API server comes from KUBERNETES_SERVICE_HOST/_PORT).",
    ).tag(config=True)

    pod_snapshots = Bool(
        True,
        help="Workspace and kernel-pod backends: snapshot the pod at a pause where a "
        "PodSnapshotPolicy selects it (live restores). False: pause with the application "
        "checkpoints only.",
    ).tag(config=True)

    snapshot_timeout_seconds = Float(
        900.0,
        help="How long a pause waits for a pod snapshot (seconds; 8 GiB took ~2 min on a T4). "
        "Past it, the pause goes on with the application checkpoints only.",
    ).tag(config=True)

    snapshots_keep_last = Int(
        1,
        help="Pod snapshots kept per workspace by retention and gc, the one the next resume "
        "restores counted first (it is never deleted); 1 keeps that one only. max_age_hours "
        "applies to the others too.",
    ).tag(config=True)

    outside_pause_hold_seconds = Float(
        600.0,
        help="Workspace backend, GKE Workspaces: a pause asked outside jupyter_pause (the "
        "Kubeflow dashboard's Pause, kubectl, a culler) is held by the snapshot add-on while it "
        "snapshots the pod. jupyter_pause checkpoints every kernel first and keeps the add-on "
        "from taking its snapshot until they are written, for up to this many seconds; past "
        "it the snapshot goes ahead, and the pause says its checkpoints were not complete.",
    ).tag(config=True)

    hub_culler_timeout_seconds = Float(
        0.0,
        help="JupyterHub: the --timeout of the Hub's idle culler (jupyterhub-idle-culler), in "
        "seconds. Idle kernels are checkpointed at 80% of it, before the culler stops the "
        "server (as for MappingKernelManager.cull_idle_timeout). 0: no culler is known.",
    ).tag(config=True)

    platform_stop_seconds = Float(
        25.0,
        help="On SIGTERM (the platform's idle pause, a node drain; a Hub's spawner: SIGINT "
        "first) the workspace and jupyterhub backends checkpoint every kernel, and the "
        "kernel-pod backend pauses every notebook, within this many seconds before the server "
        "exits. Keep it under the pod's terminationGracePeriodSeconds (Kubernetes' default: "
        "30; KubeSpawner's delete_grace_period: 1) or LocalProcessSpawner's interrupt_timeout "
        "(10).",
    ).tag(config=True)

    gvisor_checkpoint_file = Unicode(
        "/proc/gvisor/checkpoint",
        help="Workspace backend, PodSnapshotPolicy of type 'workload': the file gVisor takes "
        "a checkpoint request from (write 1, read resume, restore or error).",
    ).tag(config=True)

    workspace_poll_seconds = Float(
        1.0, help="How often the workspace backend asks the API server while it waits (s)."
    ).tag(config=True)

    kernel_pod_launches_at_once = Int(
        1,
        help="Kernel-pod backend: how many resumes' pods may be in the making at once (created, "
        "no node yet, not refused by the scheduler). 1 makes each once the one before it has a "
        "node; more fills free GPUs sooner in a rush but runs that many launchers at once on "
        "this server's CPU (see bench/README.md, kernel_pods_rush.py).",
    ).tag(config=True)

    store_root = Unicode(
        help="Folder of the application checkpoints, one subfolder per notebook. Default: "
        "$JUPYTER_PAUSE_STORE, else <jupyter data dir>/jupyter_pause/checkpoints. A leading ~ "
        "is the server user's home (so a JSON config can put it on a pod's home volume).",
    ).tag(config=True)

    idle_pause_minutes = Float(
        0.0,
        help="Pause a notebook after this many minutes without activity (a cell run, a busy "
        "kernel, an edit; an open browser tab is not activity). 0 turns automatic pauses off. "
        "A busy kernel is never paused automatically.",
    ).tag(config=True)

    min_running_minutes = Float(
        0.0, help="Never pause automatically a session that has run for less than this (minutes)."
    ).tag(config=True)

    busy_wait_seconds = Float(
        30.0,
        help="A pause or checkpoint of a busy kernel waits this many seconds for the running "
        "cell to finish, then is refused (409): running cells are never interrupted.",
    ).tag(config=True)

    kernel_call_timeout_seconds = Float(
        1800.0, help="How long a checkpoint or restore inside the kernel may take (seconds)."
    ).tag(config=True)

    gpu_count = Int(
        None,
        allow_none=True,
        help="GPUs the local backend may hand out (e.g. 4 for 10 users on one box). "
        "Default: detected with NVML or nvidia-smi (0 when there are none).",
    ).tag(config=True)

    gpus_per_kernel = Int(
        None,
        allow_none=True,
        help="GPUs each notebook kernel holds while it runs. Default: 1 when the backend has "
        "GPUs, else 0. Per kernelspec: kernelspec_overrides.",
    ).tag(config=True)

    kernelspec_overrides = Dict(
        help="Per-kernelspec policy, e.g. {'python3-cpu': {'auto_pause': False, 'gpus': 0}}. "
        "Keys: auto_pause (bool), idle_pause_minutes, min_running_minutes, gpus.",
    ).tag(config=True)

    keep_last = Int(5, help="Checkpoints kept per notebook; older ones are deleted.").tag(
        config=True
    )

    max_age_hours = Float(
        0.0, help="Delete checkpoints older than this many hours (0: no limit; the newest stays)."
    ).tag(config=True)

    max_bytes = Int(
        0, help="Checkpoint bytes kept per notebook (0: no limit; the newest checkpoint stays)."
    ).tag(config=True)

    save_unmarked = Enum(
        ["all", "none"],
        "all",
        help="What a checkpoint saves when the user marked no variable: 'all' that can be "
        "saved, or 'none'.",
    ).tag(config=True)

    direct_io = Bool(
        True,
        help="Kernels write checkpoint data with O_DIRECT, straight from the tensors' memory "
        "(on by default: 2-6x faster saves on this project's VMs, and multi-GB checkpoints "
        "neither fill the page cache nor count against a container's memory limit while "
        "written back). Off: through the page cache, where a resume on the same machine soon "
        "after can find the data (see the README's store section).",
    ).tag(config=True)

    lazy_restore = Bool(
        True,
        help="A resume from files is ready before the bytes are in: kernels give CPU arrays "
        "and tensors of at least 1 MiB back as copy-on-write maps of their checkpoint files "
        "(pages load on first touch) and load and check them right after, the chip saying "
        "how much is still loading (c.Checkpointer.lazy_restore in every kernel). Off: "
        "every byte is read and checked before the kernel is ready.",
    ).tag(config=True)

    load_in_kernels = Bool(
        True,
        help="Give every kernel this server starts %checkpoint and %pause from its first "
        "cell, whoever starts it (JupyterLab, the REST API, nbclient). Off: kernels get them "
        "when the server first talks to them, or by %load_ext jupyter_pause.",
    ).tag(config=True)

    gpu_hour_price = Float(
        0.0,
        help="What one GPU-hour costs, in the currency the admin reports in (e.g. 2.5): "
        "`jupyter pause report` shows what pausing saved and what idle GPUs cost. 0: not shown.",
    ).tag(config=True)

    storage_gb_month_price = Float(
        0.0,
        help="What keeping one GB (10^9 bytes) of checkpoints for a month costs, in the same "
        "currency (e.g. 0.02): `jupyter pause report` shows what the store costs. 0: not shown.",
    ).tag(config=True)

    monitor_interval_seconds = Float(
        30.0, help="How often idle sessions are looked for (seconds)."
    ).tag(config=True)

    @default("store_root")
    def _default_store_root(self) -> str:
        return str(default_store_root())

    @validate("store_root")
    def _expand_store_root(self, proposal: Any) -> str:
        # JSON config cannot call os.path.expanduser; "~/..." is expanded here instead.
        return os.path.expanduser(proposal["value"])

    def policy(self, gpus_total: int) -> Policy:
        per_kernel = self.gpus_per_kernel
        if per_kernel is None:
            per_kernel = 1 if gpus_total else 0
        return Policy(
            idle_pause_minutes=self.idle_pause_minutes,
            min_running_minutes=self.min_running_minutes,
            busy_wait_seconds=self.busy_wait_seconds,
            kernel_call_timeout_seconds=self.kernel_call_timeout_seconds,
            gpus_per_kernel=per_kernel,
            keep_last=self.keep_last,
            max_age_hours=self.max_age_hours,
            max_bytes=self.max_bytes,
            save_unmarked=self.save_unmarked,
            direct_io=self.direct_io,
            lazy_restore=self.lazy_restore,
            snapshots_keep_last=self.snapshots_keep_last,
            outside_hold_seconds=self.outside_pause_hold_seconds,
            kernelspec_overrides=dict(self.kernelspec_overrides),
        )

    def initialize_settings(self) -> None:
        serverapp = self.serverapp
        assert serverapp is not None
        backend, gpus = self._backend(serverapp)
        policy = self.policy(gpus)
        # Kernels inherit the server's environment: every kernel, whoever starts it, writes
        # to the admin's store with the admin's retention.
        os.environ["JUPYTER_PAUSE_STORE"] = self.store_root
        os.environ.update(policy.kernel_env())
        if self.load_in_kernels:
            os.environ[AUTOLOAD_ENV] = "1"
        # Nothing the extension does by itself may look like the user's work to a culler.
        untrack_own_messages(serverapp.kernel_manager)
        self.orchestrator = Orchestrator(
            backend=backend,
            bridge=KernelBridge(serverapp.kernel_manager),
            session_manager=serverapp.session_manager,
            policy=policy,
            store_root=Path(self.store_root),
            root_dir=serverapp.root_dir,
            cull_idle_seconds=self._cull_seconds(serverapp.kernel_manager),
        )
        self.settings["jupyter_pause_orchestrator"] = self.orchestrator
        self.settings["jupyter_pause_prices"] = {
            "gpu_hour": self.gpu_hour_price,
            "storage_gb_month": self.storage_gb_month_price,
        }
        self._collector = metrics.register(self.orchestrator.metrics_snapshot)
        self._warn_about_culling(serverapp.kernel_manager, policy)
        self._stop_signal: str | None = None
        if backend.name == "jupyterhub":
            # The Hub asks the server's last_activity: only the user's work counts.
            hub_activity.install(serverapp.web_app, serverapp.kernel_manager)
            self.orchestrator.idle.when_empty = self._give_back_if_no_work
        if self.orchestrator.environment is not None or backend.pauses_on_server_stop:
            self._watch_stop_signals(hub=backend.name == "jupyterhub")

    async def _give_back_if_no_work(self, threshold_seconds: float) -> None:
        """No kernel runs in this server: once nothing was done in it for the idle pause's
        threshold, it goes back to the Hub (the Hub's culler never comes while a tab polls)."""
        environment = self.orchestrator.environment
        if environment is None or self.serverapp.kernel_manager.list_kernel_ids():
            return  # a console's kernel, say: not a notebook's, still work
        idle_for = (hub_activity.utcnow() - self.serverapp.web_app.last_activity()).total_seconds()
        if idle_for >= threshold_seconds:
            await environment.give_back_empty(
                f"no notebook runs in it and nothing was done for {idle_for / 60:.0f} min"
            )

    def _backend(self, serverapp: Any) -> tuple[Backend, int]:
        """The configured backend (auto-detected in a pod) and the GPUs it has."""
        from ..backends import jupyterhub, workspace

        name = self.backend
        if name == "auto":
            if workspace.detect(self.service_account_dir, dict(os.environ)):
                name = "workspace"
            else:
                name = "jupyterhub" if jupyterhub.detect(dict(os.environ)) else "local"
        if name == "jupyterhub":
            found = self._hub_backend(serverapp)
            if found is not None:
                return found
            name = "local"
        if name == "criu":
            return self._criu_backend(serverapp)
        if name == "kernel-pod":
            found = self._kernel_pod_backend(serverapp)
            if found is not None:
                return found
            name = "local"
        settings = None
        if name == "workspace":
            try:
                settings = workspace.workspace_settings(
                    self.service_account_dir,
                    snapshots=self.pod_snapshots,
                    snapshot_timeout_seconds=self.snapshot_timeout_seconds,
                    poll_seconds=self.workspace_poll_seconds,
                    gvisor_checkpoint=self.gvisor_checkpoint_file,
                )
            except BackendError as err:  # the extension always loads: say why, run locally
                self.log.error("jupyter_pause: no workspace backend: %s; using 'local'", err)
        if settings is None:
            local = LocalBackend(
                serverapp.kernel_manager, serverapp.session_manager, self.gpu_count
            )
            return local, local.pool.total
        backend = workspace.WorkspaceBackend(
            serverapp.kernel_manager, serverapp.session_manager, settings
        )
        backend.gpus = detect_gpus() if self.gpu_count is None else self.gpu_count
        self.log.info(
            "jupyter_pause: workspace backend (pod %s/%s)", settings.namespace, settings.pod_name
        )
        return backend, backend.gpus

    def _hub_backend(self, serverapp: Any) -> tuple[Backend, int] | None:
        """Under a JupyterHub: give the server back at a pause where its token may stop it
        (asked of the Hub once, now: a token's scopes are fixed for its spawn)."""
        from ..backends import jupyterhub

        try:
            settings = jupyterhub.HubSettings.from_environ(dict(os.environ))
        except BackendError as err:  # the extension always loads: say why, run locally
            self.log.error("jupyter_pause: no jupyterhub backend: %s; using 'local'", err)
            return None
        requested_at = None
        try:
            model = jupyterhub.token_model(settings)
            may_stop = jupyterhub.can_stop_own_server(jupyterhub.token_scopes(model), settings)
            problem = None if may_stop else jupyterhub.missing_scope_problem(settings)
            requested_at = jupyterhub.start_requested_at(model, settings)
        except BackendError as err:
            # The Hub answers every spawn's first requests; if it is away now, a pause asks it
            # again and says so if it still cannot be reached.
            self.log.warning("jupyter_pause: %s; pauses will ask the Hub to stop the server", err)
            problem = None
        kernel_manager, session_manager = serverapp.kernel_manager, serverapp.session_manager
        if problem is not None:
            self.log.warning("jupyter_pause: %s", problem)
            fallback = jupyterhub.HubWithoutStop(
                kernel_manager, session_manager, self.gpu_count, settings, problem
            )
            return fallback, fallback.pool.total
        self.log.info("jupyter_pause: jupyterhub backend (server %s)", settings.server_label)
        gpus = detect_gpus() if self.gpu_count is None else self.gpu_count
        backend = jupyterhub.HubBackend(
            kernel_manager, session_manager, settings, gpus, requested_at
        )
        return backend, gpus

    def _criu_backend(self, serverapp: Any) -> tuple[Backend, int]:
        from ..backends.criu import CriuBackend, CriuSettings

        backend = CriuBackend(
            serverapp.kernel_manager,
            serverapp.session_manager,
            self.gpu_count,
            Path(self.store_root),
            CriuSettings(self.criu_binary, self.cuda_checkpoint_binary),
        )
        self.log.info("jupyter_pause: criu backend (%s)", self.criu_binary)
        return backend, backend.pool.total

    def _kernel_pod_backend(self, serverapp: Any) -> tuple[Backend, int] | None:
        from ..backends.kernel_pod import KernelPodError

        try:
            from ..backends.kernel_pods import KernelPodBackend
        except KernelPodError as err:  # the extension always loads: say why, run locally
            self.log.error("jupyter_pause: no kernel-pod backend: %s; using 'local'", err)
            return None
        from ..backends.kernel_pod_snapshots import KernelPodSnapshots
        from .kernel_restarts import end_resumes_before_shutdowns, join_restarts_to_resumes

        snapshots = KernelPodSnapshots(self.pod_snapshots, self.snapshot_timeout_seconds)
        kernel_manager = serverapp.kernel_manager
        backend = KernelPodBackend(
            kernel_manager,
            serverapp.session_manager,
            launches_at_once=self.kernel_pod_launches_at_once,
            snapshots=snapshots,
        )
        join_restarts_to_resumes(kernel_manager, backend.join_resume)
        end_resumes_before_shutdowns(kernel_manager, backend.end_resume)
        backend.follow_shutdowns(serverapp.event_logger)
        self.log.info("jupyter_pause: kernel-pod backend (kernels in pods of their own)")
        # Each kernel pod asks the scheduler for its GPU: gpus_per_kernel defaults to 1.
        return backend, 1

    def _watch_stop_signals(self, hub: bool) -> None:
        """Note a SIGTERM (the platform stopping the pod) before jupyter-server stops: its
        cleanup stops the extensions before the kernels, so ``stop_extension`` can save them.
        ``hub``: a JupyterHub's spawner stops its server with SIGINT first (LocalProcessSpawner;
        jupyterhub-singleuser stops on it as on SIGTERM), so SIGINT is the same stop."""
        serverapp = self.serverapp
        assert serverapp is not None
        for signum in (signal.SIGTERM, signal.SIGINT) if hub else (signal.SIGTERM,):
            # SIGINT: not a terminal's confirm-on-Ctrl-C, but a stop, as the Hub means it
            previous = (
                serverapp._signal_stop if signum == signal.SIGINT else signal.getsignal(signum)
            )

            def on_signal(signum: int, frame: Any, previous: Any = previous) -> None:
                if self._stop_signal is None:
                    self._stop_signal = signal.Signals(signum).name
                if callable(previous):
                    previous(signum, frame)

            try:
                signal.signal(signum, on_signal)
            except ValueError:  # not the main thread (an embedding application)
                self.log.warning("jupyter_pause: stop signals cannot be watched from this thread")
                return

    def _cull_seconds(self, kernel_manager: Any) -> float:
        """The soonest culler's timeout (jupyter-server's kernel culler, the Hub's idle
        culler): idle kernels are checkpointed at 80% of it."""
        timeouts = [
            float(getattr(kernel_manager, "cull_idle_timeout", 0) or 0),
            self.hub_culler_timeout_seconds,
        ]
        return min((t for t in timeouts if t > 0), default=0.0)

    def _warn_about_culling(self, kernel_manager: Any, policy: Policy) -> None:
        cull = self._cull_seconds(kernel_manager)
        if not cull:
            return
        pause = policy.idle_pause_minutes * 60
        if not pause or cull <= pause:
            self.log.warning(
                "jupyter_pause: a culler (MappingKernelManager.cull_idle_timeout, or the Hub's "
                "idle culler: PauseApp.hub_culler_timeout_seconds) stops idle kernels after "
                "%.0f s %s; jupyter_pause checkpoints idle kernels at 80%% of that timeout, but changes "
                "made after that checkpoint are lost. Set PauseApp.idle_pause_minutes below %.0f "
                "so idle notebooks are paused first, or turn culling off.",
                cull,
                "and automatic pauses are off"
                if not pause
                else f"before the pause policy ({pause:.0f} s)",
                cull / 60,
            )

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        await self.orchestrator.start(self.monitor_interval_seconds)

    async def stop_extension(self) -> None:
        if getattr(self, "_collector", None) is not None:
            metrics.unregister(self._collector)
            self._collector = None
        if getattr(self, "_stop_signal", None):
            await self.orchestrator.platform_stop(self.platform_stop_seconds, self._stop_signal)
        await self.orchestrator.stop()
