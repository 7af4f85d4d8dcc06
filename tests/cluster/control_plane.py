"""A real etcd + kube-apiserver on free loopback ports, for the cluster backend's tests; and, on
request, the real kube-controller-manager and kube-scheduler of the same release and the real
GKE Workspaces snapshot add-on.

TLS with a CA of its own, static tokens (an admin in ``system:masters`` and an unprivileged
user), RBAC, and ServiceAccount token signing: the TokenRequest API works in the apiserver
alone, so a test "pod" gets a real, signed service-account token.

``ControlPlane(..., controller_manager=..., scheduler=...)`` also runs those two, each as the
identity its bootstrap RBAC role is bound to (``system:kube-controller-manager`` with a service
account per controller, ``system:kube-scheduler``) and with the apiserver's service-account
signing key, so a StatefulSet becomes a Pod and the Pod is bound to a node as in a real
cluster. Nodes are registered by the tests (``register_node``: a GPU capacity, Ready, a Lease
renewed like a kubelet's), home volumes made bound (``provide_claim``: there is no
provisioner); no kubelet runs, the tests play it. ``start_snapshot_addon`` runs
gke-workspace-snapshot-addon with its own least RBAC and its webhooks registered by URL.

The binaries come from ``kube-apiserver.sh`` and ``gke-addon.sh`` (built once per machine,
then cached); etcd is Debian's ``etcd-server``.
"""

from __future__ import annotations

import base64
import datetime
import os
import secrets
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..built_tools import built
from ..server_process import free_port

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "kube-apiserver.sh"
ADDON_BUILD_SCRIPT = HERE / "gke-addon.sh"
#: Kubeflow Notebooks v2's own Workspace and WorkspaceKind CRDs (upstream-crds/README.md) and
#: GKE's podsnapshot.gke.io ones (GKE publishes no file: ours, checked against its reference).
UPSTREAM_CRDS = (
    *sorted((HERE / "upstream-crds").glob("*.yaml")),
    HERE / "crds" / "podsnapshot.gke.io.yaml",
)
#: API groups of the test CRDs (created through the custom objects API).
CUSTOM_GROUPS = ("kubeflow.org", "podsnapshot.gke.io")
#: Audience of the tokens the apiserver issues and accepts (as in a real cluster).
AUDIENCE = "https://kubernetes.default.svc"
GPU = "nvidia.com/gpu"
#: What GKE Sandbox puts on the nodes of a gVisor node pool (label, and taint with this value).
SANDBOX_KEY = "sandbox.gke.io/runtime"
#: The taint the TaintNodesByCondition admission puts on every new node; the node lifecycle
#: controller lifts it once it sees the node Ready.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
NODE_LEASE_SECONDS = 40  # a kubelet's default lease, renewed every 10 s
ADDON_NAME = "gke-workspace-snapshot-addon"
ADDON_NAMESPACE = "kubeflow-workspaces"  # where upstream deploys it (and holds its Lease)


def kube_binary(name: str) -> str:
    """The cached kube-apiserver, kube-controller-manager or kube-scheduler; all three are built
    first when this machine lacks one of them (~10-14 min)."""
    return built(
        BUILD_SCRIPT,
        "the cluster tests need a kube-apiserver, kube-controller-manager, kube-scheduler and "
        "etcd, built from Debian's source package",
        name,
    )


def apiserver_binary() -> str:
    return kube_binary("kube-apiserver")


def addon_binary() -> str:
    """The cached gke-workspace-snapshot-addon, built first when this machine has none (~3 min)."""
    return built(
        ADDON_BUILD_SCRIPT,
        "the cluster tests need GKE Workspaces' snapshot add-on, built offline from gke-addon/",
    )


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """A MicroTime, as a Lease's renewTime wants it."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """``check()``'s first truthy value; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def webhook_pki(folder: Path, name: str) -> Path:
    """A CA of its own and a serving certificate for the loopback address the API server calls a
    webhook at (in a cluster: cert-manager's Certificate for the webhook's Service), in
    ``folder``: ``ca.crt`` (the webhook configuration's caBundle), ``tls.crt`` and ``tls.key``."""
    folder.mkdir(parents=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "30", "-subj", f"/CN={name}-ca", cwd=folder)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
             "-subj", f"/CN={name}", cwd=folder)  # fmt: skip
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "tls.crt", "-days", "30", "-extfile", "ext.cnf",
             cwd=folder)  # fmt: skip
    return folder


@dataclass
class Credentials:
    url: str
    ca_file: str
    token: str

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig file for these credentials (what ``jupyter pause --workspace`` reads)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": self.ca_file},
                }
            ],
            "users": [{"name": "user", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def api_client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = self.ca_file
        configuration.api_key = {"authorization": f"Bearer {self.token}"}
        return client.ApiClient(configuration)


class ControlPlane:
    """etcd + kube-apiserver in ``workdir`` (and the controller-manager and scheduler when
    given); ``start`` returns once ``/readyz`` answers ok and each component is healthy."""

    def __init__(
        self,
        workdir: Path,
        apiserver: str,
        controller_manager: str | None = None,
        scheduler: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.apiserver = apiserver
        self.controller_manager = controller_manager
        self.scheduler = scheduler
        self.pki = workdir / "pki"
        self.port = 0
        self.admin_token = secrets.token_hex(16)
        self.user_token = secrets.token_hex(16)  # "pause-user": authenticated, no rights
        # The identities kube-apiserver's bootstrap RBAC gives the two controllers' rights to.
        self.controller_manager_token = secrets.token_hex(16)
        self.scheduler_token = secrets.token_hex(16)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []
        self.ready_seconds = 0.0
        self.health_ports: dict[str, int] = {}  # component -> its /healthz port
        self.heartbeat = NodeHeartbeat(self)
        self.addon: SnapshotAddon | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def admin(self) -> Credentials:
        return Credentials(self.url, str(self.pki / "ca.crt"), self.admin_token)

    @property
    def user(self) -> Credentials:
        return Credentials(self.url, str(self.pki / "ca.crt"), self.user_token)

    def credentials(self, token: str) -> Credentials:
        return Credentials(self.url, str(self.pki / "ca.crt"), token)

    def _make_pki(self) -> None:
        self.pki.mkdir(parents=True)
        pki = self.pki
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                 "ca.crt", "-days", "30", "-subj", "/CN=test-ca", cwd=pki)  # fmt: skip
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out",
                 "apiserver.csr", "-subj", "/CN=kube-apiserver", cwd=pki)  # fmt: skip
        (pki / "ext.cnf").write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
        )
        _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "apiserver.crt", "-days", "30", "-extfile", "ext.cnf",
                 cwd=pki)  # fmt: skip
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
        (pki / "tokens.csv").write_text(
            f'{self.admin_token},admin,admin-uid,"system:masters"\n'
            f"{self.user_token},pause-user,pause-uid\n"
            f"{self.controller_manager_token},system:kube-controller-manager,kcm-uid\n"
            f"{self.scheduler_token},system:kube-scheduler,scheduler-uid\n"
        )

    def start(self) -> None:
        self._make_pki()
        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        etcd_log = open(self.workdir / "etcd.log", "wb")  # noqa: SIM115 - lives with the process
        self.logs.append(etcd_log)
        self.processes.append(
            subprocess.Popen(
                ["etcd", "--name", "test", "--data-dir", str(self.workdir / "etcd"),
                 "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                 "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-cluster", f"test=http://127.0.0.1:{peer_port}",
                 "--log-level", "warn"],
                stdout=etcd_log, stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        started = time.monotonic()
        log = open(self.workdir / "apiserver.log", "wb")  # noqa: SIM115 - lives with the process
        self.logs.append(log)
        pki = self.pki
        self.processes.append(
            subprocess.Popen(
                [self.apiserver, "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
                 "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                 "--secure-port", str(self.port),
                 "--tls-cert-file", str(pki / "apiserver.crt"),
                 "--tls-private-key-file", str(pki / "apiserver.key"),
                 "--client-ca-file", str(pki / "ca.crt"),
                 "--token-auth-file", str(pki / "tokens.csv"),
                 "--authorization-mode", "Node,RBAC",
                 "--service-account-issuer", AUDIENCE,
                 "--service-account-key-file", str(pki / "sa.pub"),
                 "--service-account-signing-key-file", str(pki / "sa.key"),
                 "--api-audiences", AUDIENCE,
                 "--service-cluster-ip-range", "10.96.0.0/24", "--allow-privileged=true",
                 # Without a controller-manager nothing would create the token Secrets the
                 # ServiceAccount admission waits for; with one it runs, as in a real cluster.
                 *([] if self.controller_manager else
                   ["--disable-admission-plugins", "ServiceAccount"]),
                 "--enable-priority-and-fairness=false", "--v=1"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            )
        )  # fmt: skip
        self._wait_ready(started)
        if self.controller_manager:
            self._start_controller_manager(self.controller_manager)
        if self.scheduler:
            self._start_scheduler(self.scheduler)
        for component in self.health_ports:
            self._wait_healthy(component)

    def _wait_ready(self, started: float) -> None:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        request = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    tail = (self.workdir / "apiserver.log").read_text()[-3000:]
                    raise RuntimeError(f"{process.args[0]} exited ({process.returncode}):\n{tail}")
            try:
                with urllib.request.urlopen(request, context=context, timeout=2) as answer:
                    if answer.read() == b"ok":
                        self.ready_seconds = time.monotonic() - started
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError("kube-apiserver was not ready after 120 s")

    def stop(self) -> None:
        self.heartbeat.stop()
        if self.addon is not None:
            self.addon.stop()
        for process in reversed(self.processes):
            process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self.logs:
            log.close()

    def apply_file(self, path: Path, **values: str) -> list[dict[str, Any]]:
        """Create every object of a YAML file (``${NAME}`` placeholders filled from ``values``,
        as ``envsubst`` does for the README's install steps)."""
        from kubernetes import utils

        text = path.read_text()
        for name, value in values.items():
            text = text.replace("${" + name + "}", value)
        documents = [d for d in yaml.safe_load_all(text) if d]
        with self.admin.api_client() as api:
            for document in documents:
                group, _, version = document["apiVersion"].rpartition("/")
                if group in CUSTOM_GROUPS:  # the client's helper knows built-in kinds only
                    self._create_custom(api, document, group, version)
                else:
                    utils.create_from_dict(api, document)
        return documents

    @staticmethod
    def _create_custom(api: Any, document: dict[str, Any], group: str, version: str) -> None:
        from kubernetes import client

        custom = client.CustomObjectsApi(api)
        kind = document["kind"].lower()
        plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
        namespace = document["metadata"].get("namespace")
        if namespace:
            custom.create_namespaced_custom_object(group, version, namespace, plural, document)
        else:
            custom.create_cluster_custom_object(group, version, plural, document)

    # -- CRDs -------------------------------------------------------------------------------------
    def load_crds(self, paths: Iterable[Path]) -> None:
        """Create the CRDs of ``paths`` and return once the API server serves each of them.

        Created as ``kubectl create --validate=false`` would: the API server keeps what 1.20
        knows and drops the rest (upstream's CEL ``x-kubernetes-validations``).
        """
        from kubernetes import client

        names = [
            document["metadata"]["name"]
            for path in paths
            for document in self.apply_file(path)
            if document["kind"] == "CustomResourceDefinition"
        ]
        with self.admin.api_client() as api:
            extensions = client.ApiextensionsV1Api(api)

            def established() -> bool:
                for name in names:
                    crd = extensions.read_custom_resource_definition(name)
                    if not any(
                        c.type == "Established" and c.status == "True"
                        for c in crd.status.conditions or []
                    ):
                        return False
                return True

            wait_until(established, 30, f"the CRDs {names} to be established")

    # -- kube-controller-manager and kube-scheduler -----------------------------------------------
    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        path = self.workdir / f"{name}.log"
        log = open(path, "wb")  # noqa: SIM115 - lives with the process
        self.logs.append(log)
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env=env
        )
        return process, path

    def _start_component(self, name: str, argv: list[str]) -> None:
        """A kube-controller-manager or kube-scheduler: its own kubeconfig, its health endpoint
        on a free loopback port (never the fixed default ports another cluster may hold)."""
        token = (
            self.controller_manager_token
            if name == "kube-controller-manager"
            else self.scheduler_token
        )
        kubeconfig = str(self.credentials(token).kubeconfig(self.workdir / f"{name}.kubeconfig"))
        port = free_port()
        self.health_ports[name] = port
        process, _ = self._spawn(
            name,
            [*argv, "--kubeconfig", kubeconfig,
             # delegated authentication and authorization of its /healthz, /metrics callers
             "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
             "--bind-address", "127.0.0.1", "--secure-port", str(port),
             "--port", "0",  # no insecure port
             "--cert-dir", str(self.workdir / f"{name}-certs"),
             "--leader-elect=false",  # the only instance
             "--v=1"],
        )  # fmt: skip
        self.processes.append(process)

    def _start_controller_manager(self, binary: str) -> None:
        pki = self.pki
        self._start_component(
            "kube-controller-manager",
            [binary,
             # each controller as its own service account, bound to its bootstrap role
             "--use-service-account-credentials",
             # the token controller signs with the key the apiserver verifies with
             "--service-account-private-key-file", str(pki / "sa.key"),
             "--root-ca-file", str(pki / "ca.crt"),
             "--cluster-signing-cert-file", str(pki / "ca.crt"),
             "--cluster-signing-key-file", str(pki / "ca.key")],
        )  # fmt: skip

    def _start_scheduler(self, binary: str) -> None:
        self._start_component("kube-scheduler", [binary])

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _wait_healthy(self, name: str) -> None:
        # Its serving certificate is self-signed, on loopback: what is checked is the answer.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{self.health_ports[name]}/healthz"

        def healthy() -> bool:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{process.args[0]} exited ({process.returncode}):\n{self.log_tail(name)}"
                    )
            try:
                with urllib.request.urlopen(url, context=context, timeout=2) as answer:
                    return answer.read() == b"ok"
            except (urllib.error.URLError, OSError):
                return False

        wait_until(healthy, 60, f"{name} to answer /healthz ok")

    # -- nodes ------------------------------------------------------------------------------------
    def register_node(
        self,
        name: str,
        gpus: int = 1,
        *,
        sandbox: bool = False,
        labels: dict[str, str] | None = None,
        cpu: str = "16",
        memory: str = "64Gi",
    ) -> dict[str, Any]:
        """A Node as a kubelet registers it: Ready, ``gpus`` ``nvidia.com/gpu`` allocatable
        (what the scheduler counts), a Lease renewed every 10 s so the node lifecycle
        controller keeps it Ready; ``sandbox``: a GKE Sandbox (gVisor) node, with the label and
        the taint GKE puts on one. Returns once the scheduler may use it (the node lifecycle
        controller has lifted the not-ready taint every new node gets)."""
        from kubernetes import client

        resources = {"cpu": cpu, "memory": memory, "pods": "110", GPU: str(gpus)}
        now = now_rfc3339()

        def condition(kind: str, status: str, reason: str) -> dict[str, str]:
            return {"type": kind, "status": status, "reason": reason,
                    "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip

        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **({SANDBOX_KEY: "gvisor"} if sandbox else {}),
                    **(labels or {}),
                },
            },
            "spec": {
                "taints": (
                    [{"key": SANDBOX_KEY, "value": "gvisor", "effect": "NoSchedule"}]
                    if sandbox
                    else []
                )
            },
            # A node's status is written with its registration, as a kubelet does.
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                    condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                    condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                    condition("Ready", "True", "KubeletReady"),
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "machineID": name,
                    "systemUUID": name,
                    "bootID": name,
                    "kernelVersion": os.uname().release,
                    "osImage": "played by the tests",
                    "containerRuntimeVersion": "containerd://played",
                    "kubeletVersion": "v1.20.2",
                    "kubeProxyVersion": "v1.20.2",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        }
        with self.admin.api_client() as api:
            core = client.CoreV1Api(api)
            node = api.sanitize_for_serialization(core.create_node(body))
            self.heartbeat.add(name, node["metadata"]["uid"])
            if self.controller_manager:
                wait_until(
                    lambda: (
                        not any(
                            taint.key == NOT_READY_TAINT
                            for taint in core.read_node(name).spec.taints or []
                        )
                    ),
                    60,
                    f"the node lifecycle controller to lift {NOT_READY_TAINT} from node {name}",
                )
            return api.sanitize_for_serialization(core.read_node(name))

    def remove_node(self, name: str) -> None:
        """The node leaves the cluster: no more heartbeats; its Node (and, by garbage
        collection, its Lease) deleted."""
        from kubernetes import client

        self.heartbeat.remove(name)
        with self.admin.api_client() as api:
            client.CoreV1Api(api).delete_node(name)

    def provide_claim(
        self, namespace: str, claim: str, size: str = "1Gi", host_path: Path | None = None
    ) -> None:
        """A PersistentVolumeClaim ``claim`` (a Workspace's home volume) and a volume for it, bound
        by the real PV controller; returns once it is Bound. There is no provisioner here, and
        the scheduler refuses a pod whose claim is unbound; the volume is a hostPath, pre-bound to
        the claim as an admin would: ``host_path`` (a folder of the test's, which a played kubelet
        mounts, ``real_players.py``), else a path no kubelet mounts."""
        from kubernetes import client

        volume = f"{namespace}-{claim}"
        with self.admin.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_persistent_volume(
                {
                    "metadata": {"name": volume},
                    "spec": {
                        "capacity": {"storage": size},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": "",
                        # host_path: a folder of the test's, which a played kubelet mounts
                        "hostPath": {
                            "path": str(host_path or f"/var/lib/jupyter-pause-tests/{volume}")
                        },
                        "claimRef": {"namespace": namespace, "name": claim},
                    },
                }
            )
            core.create_namespaced_persistent_volume_claim(
                namespace,
                {
                    "metadata": {"name": claim},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "",
                        "volumeName": volume,
                        "resources": {"requests": {"storage": size}},
                    },
                },
            )
            wait_until(
                lambda: (
                    core.read_namespaced_persistent_volume_claim(claim, namespace).status.phase
                    == "Bound"
                ),
                60,
                f"the PV controller to bind claim {namespace}/{claim}",
            )

    def install_gvisor_runtime_class(self) -> None:
        """RuntimeClass ``gvisor`` (handler ``runsc``) as GKE Sandbox installs it: its pods get
        the sandbox node pool's node selector and toleration from the RuntimeClass admission."""
        from kubernetes import client

        with self.admin.api_client() as api:
            client.NodeV1Api(api).create_runtime_class(
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": "gvisor"},
                    "handler": "runsc",
                    "scheduling": {
                        "nodeSelector": {SANDBOX_KEY: "gvisor"},
                        "tolerations": [
                            {
                                "key": SANDBOX_KEY,
                                "operator": "Equal",
                                "value": "gvisor",
                                "effect": "NoSchedule",
                            }
                        ],
                    },
                }
            )

    # -- the GKE Workspaces snapshot add-on -------------------------------------------------------
    def start_snapshot_addon(
        self, binary: str, settle_grace_seconds: float | None = None
    ) -> SnapshotAddon:
        """gke-workspace-snapshot-addon against this API server, as upstream deploys it: its own
        service account in ``kubeflow-workspaces`` with upstream's least RBAC, leader election
        there, its mutating webhooks registered by URL with a CA of its own (what cert-manager
        does in a cluster). Returns once the webhooks mutate and the reconciler runs.

        Needs the podsnapshot.gke.io CRDs already served (else its reconciler waits, looking
        again every 10 s) and the RuntimeClass ``gvisor`` (made here when missing).
        ``settle_grace_seconds``: its ``--settle-grace-period`` (default: the add-on's, 3 s).
        """
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        assert self.addon is None, "one add-on per control plane"
        with self.admin.api_client() as api:
            try:
                client.NodeV1Api(api).read_runtime_class("gvisor")
            except ApiException as err:
                if err.status != 404:
                    raise
                self.install_gvisor_runtime_class()
            token = self._addon_identity(api)
        kubeconfig = self.credentials(token).kubeconfig(self.workdir / "gke-addon.kubeconfig")
        pki = webhook_pki(self.workdir / "gke-addon-pki", "gke-snapshot-webhook-service")
        webhook_port, health_port = free_port(), free_port()
        identity = f"{ADDON_NAME}-0"
        argv = [binary, "--kubeconfig", str(kubeconfig),
                "--webhook-listen", f"127.0.0.1:{webhook_port}",
                "--health-listen", f"127.0.0.1:{health_port}",
                "--webhook-cert", str(pki / "tls.crt"), "--webhook-key", str(pki / "tls.key"),
                "--lease-namespace", ADDON_NAMESPACE,
                "--snapshot-bucket", "jupyter-pause-test-snapshots"]  # fmt: skip
        if settle_grace_seconds is not None:
            argv += ["--settle-grace-period", f"{settle_grace_seconds}s"]
        # What the Deployment's downward API gives it: its name is its identity in the Lease.
        env = {**os.environ, "POD_NAME": identity, "POD_NAMESPACE": ADDON_NAMESPACE}
        process, log = self._spawn("gke-addon", argv, env)
        self.addon = SnapshotAddon(
            self, process, log, webhook_port, health_port, identity, (pki / "ca.crt").read_bytes()
        )
        self.addon.wait_serving()
        self.addon.register_webhooks()
        self.addon.wait_webhooks_effective()
        return self.addon

    @staticmethod
    def _addon_identity(api: Any) -> str:
        """Upstream's service account and RBAC for the add-on (providers/gke/manifests/snapshot/
        rbac.yaml at df69eff): what its code reads and writes, nothing more. Returns a token."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(api)
        rbac = client.RbacAuthorizationV1Api(api)
        try:
            core.create_namespace({"metadata": {"name": ADDON_NAMESPACE}})
        except ApiException as err:
            if err.status != 409:
                raise
        core.create_namespaced_service_account(ADDON_NAMESPACE, {"metadata": {"name": ADDON_NAME}})
        snapshot_kinds = ["podsnapshotstorageconfigs", "podsnapshotpolicies",
                          "podsnapshotmanualtriggers"]  # fmt: skip
        rules = [
            # Workspaces and WorkspaceKinds watched; a Workspace's annotations and spec.paused
            # patched (the pause and resume state machine)
            {
                "apiGroups": ["kubeflow.org"],
                "resources": ["workspacekinds"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["kubeflow.org"],
                "resources": ["workspaces"],
                "verbs": ["get", "list", "watch", "patch", "update"],
            },
            # Workspace Pods watched, their readiness gate condition written
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch", "update"]},
            # the jupyter-ipc-config ConfigMap of each tenant namespace
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "update", "patch"],
            },
            {
                "apiGroups": ["podsnapshot.gke.io"],
                "resources": snapshot_kinds,
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            },
            # PodSnapshots are GKE's: only watched, and deleted once consumed
            {
                "apiGroups": ["podsnapshot.gke.io"],
                "resources": ["podsnapshots"],
                "verbs": ["get", "list", "watch", "delete", "deletecollection"],
            },
            {
                "apiGroups": ["podmigration.gke.io"],
                "resources": ["podmigrations"],
                "verbs": ["get", "list", "watch", "create", "update", "patch"],
            },
        ]
        subject = [{"kind": "ServiceAccount", "name": ADDON_NAME, "namespace": ADDON_NAMESPACE}]
        rbac.create_cluster_role({"metadata": {"name": ADDON_NAME}, "rules": rules})
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": ADDON_NAME},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": ADDON_NAME,
                },
                "subjects": subject,
            }
        )
        # Leader election: only its own Lease is writable.
        leases = f"{ADDON_NAME}-leader-election"
        rbac.create_namespaced_role(
            ADDON_NAMESPACE,
            {
                "metadata": {"name": leases},
                "rules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "resources": ["leases"],
                        "verbs": ["create"],
                    },
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "resources": ["leases"],
                        "resourceNames": [ADDON_NAME],
                        "verbs": ["get", "update", "patch"],
                    },
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            ADDON_NAMESPACE,
            {
                "metadata": {"name": leases},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": leases,
                },
                "subjects": subject,
            },
        )
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=24 * 3600)
        )
        answer = core.create_namespaced_service_account_token(ADDON_NAME, ADDON_NAMESPACE, request)
        return answer.status.token


class NodeHeartbeat:
    """A kubelet's heartbeat for every registered node: its Lease in ``kube-node-lease``, renewed
    every 10 s (a 40 s lease), which is what the node lifecycle controller watches."""

    INTERVAL = 10.0

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.nodes: dict[str, str] = {}  # name -> uid
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, name: str, uid: str) -> None:
        from kubernetes import client

        with self.plane.admin.api_client() as api:
            client.CoordinationV1Api(api).create_namespaced_lease(
                "kube-node-lease",
                {
                    "metadata": {
                        "name": name,
                        # as the kubelet does: the Lease goes with its Node
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
                        ],
                    },
                    "spec": {
                        "holderIdentity": name,
                        "leaseDurationSeconds": NODE_LEASE_SECONDS,
                        "renewTime": now_micro(),
                    },
                },
            )
        with self._lock:
            self.nodes[name] = uid
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="node-heartbeat", daemon=True
                )
                self._thread.start()

    def remove(self, name: str) -> None:
        with self._lock:
            self.nodes.pop(name, None)

    def _run(self) -> None:
        from kubernetes import client

        with self.plane.admin.api_client() as api:
            leases = client.CoordinationV1Api(api)
            while not self._stop.wait(self.INTERVAL):
                with self._lock:
                    names = list(self.nodes)
                for name in names:
                    try:
                        leases.patch_namespaced_lease(
                            name, "kube-node-lease", {"spec": {"renewTime": now_micro()}}
                        )
                    except Exception as err:  # a missed beat shows in the test that needs it
                        self.errors.append(f"{name}: {err}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


@dataclass
class SnapshotAddon:
    """The running gke-workspace-snapshot-addon process of a control plane."""

    plane: ControlPlane
    process: subprocess.Popen[bytes]
    log_path: Path
    webhook_port: int
    health_port: int
    identity: str
    ca_bundle: bytes  # the CA of its webhook serving certificate
    webhook_configuration: str = "gke-workspace-snapshot-mutating-webhook"
    stopped: bool = field(default=False)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"gke-workspace-snapshot-addon exited ({self.process.returncode}):\n"
                + self.log()[-3000:]
            )

    def wait_serving(self) -> None:
        """``/readyz`` (its Workspace, WorkspaceKind, Pod and ConfigMap caches are warm), then
        its Lease held: the reconcile workers start when it is acquired, which is after the
        podsnapshot.gke.io caches are warm."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        def ready() -> bool:
            self._check_alive()
            try:
                url = f"http://127.0.0.1:{self.health_port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as answer:
                    return answer.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_until(ready, 60, "the snapshot add-on's /readyz")
        with self.plane.admin.api_client() as api:
            leases = client.CoordinationV1Api(api)

            def leading() -> bool:
                self._check_alive()
                try:
                    lease = leases.read_namespaced_lease(ADDON_NAME, ADDON_NAMESPACE)
                except ApiException as err:
                    if err.status == 404:
                        return False
                    raise
                return lease.spec.holder_identity == self.identity

            wait_until(leading, 60, f"the snapshot add-on to hold its Lease ({ADDON_NAMESPACE})")

    def register_webhooks(self) -> None:
        """Upstream's MutatingWebhookConfiguration (providers/gke/manifests/snapshot/
        webhook.yaml), pointed at the process by URL with its CA instead of a Service that
        cert-manager injects the CA for."""
        from kubernetes import client

        ca_bundle = base64.b64encode(self.ca_bundle).decode()
        url = f"https://127.0.0.1:{self.webhook_port}"
        common = {
            "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun",
            "failurePolicy": "Ignore",  # upstream's: Workspaces keep working without the add-on
            "timeoutSeconds": 10,
        }
        with self.plane.admin.api_client() as api:
            client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(
                {
                    "metadata": {"name": self.webhook_configuration},
                    "webhooks": [
                        {
                            **common,
                            "name": "mutate-workspace.podsnapshot.gke.kubeflow.org",
                            "reinvocationPolicy": "Never",
                            "clientConfig": {
                                "url": f"{url}/mutate-workspace",
                                "caBundle": ca_bundle,
                            },
                            "rules": [
                                {
                                    "apiGroups": ["kubeflow.org"],
                                    "apiVersions": ["v1beta1"],
                                    "operations": ["UPDATE"],
                                    "resources": ["workspaces"],
                                }
                            ],
                        },
                        {
                            **common,
                            "name": "mutate-pod.podsnapshot.gke.kubeflow.org",
                            "reinvocationPolicy": "IfNeeded",
                            "objectSelector": {
                                "matchExpressions": [
                                    {
                                        "key": "notebooks.kubeflow.org/workspace-name",
                                        "operator": "Exists",
                                    }
                                ]
                            },
                            "clientConfig": {"url": f"{url}/mutate-pod", "caBundle": ca_bundle},
                            "rules": [
                                {
                                    "apiGroups": [""],
                                    "apiVersions": ["v1"],
                                    "operations": ["CREATE"],
                                    "resources": ["pods"],
                                }
                            ],
                        },
                    ],
                }
            )

    def wait_webhooks_effective(self) -> None:
        """Until the API server calls the webhooks and applies what they answer: a dry-run Pod of
        an enabled Workspace, in a namespace of its own, comes back in gVisor. (The API server
        loads a new webhook configuration asynchronously, and ``failurePolicy: Ignore`` would
        let a request through unmutated meanwhile, or for good when TLS is wrong.)"""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        namespace, name = "gke-addon-probe", "webhook-probe"
        with self.plane.admin.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_namespace({"metadata": {"name": namespace}})
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "kubeflow.org", "v1beta1", namespace, "workspaces",
                {
                    "apiVersion": "kubeflow.org/v1beta1",
                    "kind": "Workspace",
                    "metadata": {"name": name,
                                 "annotations": {"podsnapshot.gke.kubeflow.org/enabled": "true"}},
                    "spec": {"kind": "probe",
                             "podTemplate": {"options": {"imageConfig": "probe",
                                                         "podConfig": "probe"},
                                             "volumes": {}}},
                },
            )  # fmt: skip
            pod = {
                "metadata": {
                    "name": "probe",
                    "labels": {"notebooks.kubeflow.org/workspace-name": name},
                },
                "spec": {"containers": [{"name": "main", "image": "probe"}]},
            }
            last_error: list[str] = []

            def mutated() -> bool:
                self._check_alive()
                try:
                    answer = core.create_namespaced_pod(namespace, pod, dry_run="All")
                except ApiException as err:  # e.g. the namespace's service account not made yet
                    last_error[:] = [f"{err.status} {err.reason}: {err.body}"]
                    return False
                return answer.spec.runtime_class_name == "gvisor"

            try:
                wait_until(mutated, 60, "the snapshot add-on's pod webhook to mutate a dry run")
            except AssertionError as err:
                raise AssertionError(
                    f"{err}; last error: {last_error}\n{self.log()[-3000:]}"
                ) from None
            core.delete_namespace(namespace)

    def stop(self) -> None:
        """Its webhooks unregistered (so nothing calls a process that is gone), then it ends."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        if self.stopped:
            return
        self.stopped = True
        try:
            with self.plane.admin.api_client() as api:
                client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
                    self.webhook_configuration
                )
        except (ApiException, OSError, urllib.error.URLError):
            pass  # not registered yet, or the API server already gone
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.plane.addon = None
