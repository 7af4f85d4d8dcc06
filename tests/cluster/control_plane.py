"""A real etcd + kube-apiserver on free loopback ports, for the cluster backend's tests.

TLS with a CA of its own, static tokens (an admin in ``system:masters`` and an unprivileged
user), RBAC, and ServiceAccount token signing: the TokenRequest API works in the apiserver
alone, so a test "pod" gets a real, signed service-account token. There is no
controller-manager, scheduler or kubelet: the tests play those parts (``players.py``).

The binary comes from ``kube-apiserver.sh`` (built once per machine from Debian's source
package, then cached); etcd is Debian's ``etcd-server``.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..built_tools import built
from ..server_process import free_port

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "kube-apiserver.sh"
#: API groups of the test CRDs (created through the custom objects API).
CUSTOM_GROUPS = ("kubeflow.org", "podsnapshot.gke.io")
#: Audience of the tokens the apiserver issues and accepts (as in a real cluster).
AUDIENCE = "https://kubernetes.default.svc"


def apiserver_binary() -> str:
    """The cached kube-apiserver, built first when this machine has none (~10-14 min)."""
    return built(
        BUILD_SCRIPT,
        "the cluster tests need a kube-apiserver and etcd, built from Debian's source package",
    )


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


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
    """etcd + kube-apiserver in ``workdir``; ``start`` returns once ``/readyz`` answers ok."""

    def __init__(self, workdir: Path, apiserver: str) -> None:
        self.workdir = workdir
        self.apiserver = apiserver
        self.pki = workdir / "pki"
        self.port = 0
        self.admin_token = secrets.token_hex(16)
        self.user_token = secrets.token_hex(16)  # "pause-user": authenticated, no rights
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []
        self.ready_seconds = 0.0

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
                 # no controller-manager: nothing would create the token Secrets it waits for
                 "--disable-admission-plugins", "ServiceAccount",
                 "--enable-priority-and-fairness=false", "--v=1"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            )
        )  # fmt: skip
        self._wait_ready(started)

    def _wait_ready(self, started: float) -> None:
        import ssl
        import urllib.error
        import urllib.request

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
