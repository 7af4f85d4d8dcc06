"""Zero to JupyterHub on the real control plane: the chart's own hub config with KubeSpawner.

Helm and the hub pod are played, the rest is real. Helm's part: the chart's defaults
(``z2jh/values.yaml``) merged with ``deploy/jupyterhub/values.yaml`` and a test's own values,
written where the chart's hub Secret and ConfigMap are mounted (``/usr/local/etc/jupyterhub``:
here a folder of the test's, which the loaded copies of the chart's two files name instead),
and the ``singleuser`` Secret of ``extraFiles`` rendered as the chart's template does. The hub
pod's part: its Services' addresses (``HUB_SERVICE_PORT``, ``PROXY_API_SERVICE_PORT``) on this
machine's loopback, the proxy started by the Hub (the chart runs it in a pod of its own), the
culler's ``--url`` at the Hub's port here, and a kubeconfig instead of the pod's service account.

Then the chart's ``jupyterhub_config.py`` runs in a real JupyterHub 6.1.1 with KubeSpawner 7.1.0
(the newest release; the chart's hub image pins the same), which creates the user's PVC and pod
on the real kube-apiserver; the real scheduler binds it, and the played kubelet
(``real_players.py``) runs the single-user image's ``jupyterhub-singleuser`` with jupyter_pause
at the pod's own loopback address.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from ..hub_process import PROXY, ROOT, Hub
from ..server_process import free_port
from .control_plane import wait_until
from .real_players import POOL_LABEL, RealPlayedCluster, core

CHART = Path(__file__).parent / "z2jh"
DEPLOY_VALUES = ROOT / "deploy" / "jupyterhub" / "values.yaml"
MOUNTED = "/usr/local/etc/jupyterhub"  # where the hub pod mounts the chart's Secret and ConfigMap
# The chart's resource names (_helpers-names.tpl): with no fullnameOverride, the short names.
NAMES = ("hub", "proxy-api", "proxy-public", "proxy-http", "singleuser", "user-scheduler",
         "image-pull-secret", "priority", "hub-existing-secret")  # fmt: skip


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of values files: maps merge key by key, anything else is replaced."""
    result = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def chart_values(cluster: RealPlayedCluster, values: dict[str, Any]) -> dict[str, Any]:
    """``.Values`` of a release installed with ``-f deploy/jupyterhub/values.yaml`` and a test's
    own values: what such a cluster differs in (its node pool; no user scheduler, whose image
    runs a kube-scheduler of its own; no cloud metadata to block, whose init container runs
    iptables) is said here, the rest is the shipped file's."""
    cluster_values = {
        "singleuser": {
            "nodeSelector": {POOL_LABEL: cluster.pool},
            "cloudMetadata": {"blockWithIptables": False},
        },
        "scheduling": {"userScheduler": {"enabled": False}},
    }
    layers = [yaml.safe_load((CHART / "values.yaml").read_text())]
    layers += [yaml.safe_load(DEPLOY_VALUES.read_text()), cluster_values, values]
    result: dict[str, Any] = {}
    for layer in layers:
        result = merged(result, layer)
    return result


def install(cluster: RealPlayedCluster, folder: Path, values: dict[str, Any]) -> Path:
    """The chart's files for the hub (``folder`` plays ``/usr/local/etc/jupyterhub``) and its
    ``singleuser`` Secret in the cluster; returns the hub config to load."""
    release = {"Name": "jhub", "Namespace": cluster.namespace, "Service": "Helm"}
    chart = {"Name": "jupyterhub", "Version": "0.0.1-set.by.chartpress", "AppVersion": "5.5.0"}
    (folder / "secret").mkdir(parents=True)
    (folder / "config").mkdir()
    (folder / "secret" / "values.yaml").write_text(
        yaml.safe_dump({**values, "Chart": chart, "Release": release})
    )
    for key in (
        "hub.config.ConfigurableHTTPProxy.auth_token",
        "hub.config.JupyterHub.cookie_secret",
    ):
        (folder / "secret" / key).write_text(secrets.token_hex(32))
    (folder / "secret" / "hub.config.CryptKeeper.keys").write_text(secrets.token_hex(32))
    for name in NAMES:
        (folder / "config" / name).write_text(name)
    for name in ("jupyterhub_config.py", "z2jh.py"):
        text = (CHART / name).read_text()
        assert MOUNTED in text or name == "jupyterhub_config.py", name
        (folder / name).write_text(text.replace(MOUNTED, str(folder)))
    files = values["singleuser"].get("extraFiles") or {}
    if files:  # templates/singleuser/secret.yaml: each file's data as its extension says
        string_data = {}
        for key, file in files.items():
            assert file["mountPath"].endswith(".json"), "only .json extraFiles are played here"
            string_data[key] = json.dumps(file["data"], separators=(",", ":")) + "\n"
        cluster.api.create(
            core(cluster.namespace, "secrets"),
            {"metadata": {"name": "singleuser"}, "type": "Opaque", "stringData": string_data},
        )
    return folder / "jupyterhub_config.py"


def home_volume(cluster: RealPlayedCluster, user: str, folder: Path) -> None:
    """The volume KubeSpawner's PVC ``claim-<user>`` binds to, as the cloud's provisioner
    would make it (none runs here): a hostPath volume of ``folder``, which the played kubelet
    mounts, pre-bound to that claim; the real PV controller binds the claim once it exists."""
    folder.mkdir(parents=True, exist_ok=True)
    cluster.api.create(
        core(None, "persistentvolumes"),
        {"metadata": {"name": f"{cluster.namespace}-claim-{user}"},
         "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"],
                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                  "hostPath": {"path": str(folder)},
                  "claimRef": {"namespace": cluster.namespace, "name": f"claim-{user}"}}},
    )  # fmt: skip


def start_z2jh_hub(
    cluster: RealPlayedCluster, workdir: Path, values: dict[str, Any], users=("alice", "bob")
) -> Hub:
    """A Hub on free loopback ports running the chart's hub config with ``values`` over the
    shipped ones, spawning into ``cluster``'s namespace; each of ``users`` has a home volume
    in ``workdir/home/<user>`` (``Hub.home``)."""
    assert PROXY.exists(), f"{PROXY} is missing: run `make setup` (jlpm install)"
    workdir.mkdir(parents=True, exist_ok=True)
    full = chart_values(cluster, values)
    config = install(cluster, workdir / "etc", full)
    for user in users:
        home_volume(cluster, user, workdir / "home" / user)
    token = secrets.token_hex(16)
    port, hub_port, api_port = free_port(), free_port(), free_port()
    kubeconfig = cluster.plane.admin.kubeconfig(workdir / "hub.kubeconfig", cluster.namespace)
    proxy_token = workdir / "etc" / "secret" / "hub.config.ConfigurableHTTPProxy.auth_token"
    hub_config = workdir / "jupyterhub_config.py"
    hub_config.write_text(
        f"load_subconfig({str(config)!r})\n"
        "# The hub pod's network, played on this machine's loopback\n"
        f"c.JupyterHub.bind_url = 'http://127.0.0.1:{port}'\n"
        f"c.JupyterHub.hub_bind_url = 'http://127.0.0.1:{hub_port}'\n"
        f"c.JupyterHub.hub_connect_url = 'http://127.0.0.1:{hub_port}'  # Service hub\n"
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{api_port}'  # Service proxy-api\n"
        "c.ConfigurableHTTPProxy.should_start = True  # the chart's proxy pod\n"
        f"c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]\n"
        f"c.ConfigurableHTTPProxy.pid_file = {str(workdir / 'proxy.pid')!r}\n"
        "for service in c.JupyterHub.services:\n"
        "    if service['name'] == 'jupyterhub-idle-culler':\n"
        "        service['command'] = [a.replace('localhost:8081', "
        f"'127.0.0.1:{hub_port}') for a in service['command']]\n"
        "# The tests' own service token, and the two users of the tests\n"
        f"c.JupyterHub.services.append({{'name': 'tests', 'api_token': {token!r}}})\n"
        "c.JupyterHub.load_roles.append({'name': 'tests', 'services': ['tests'], 'scopes': "
        "['admin:users', 'admin:servers', 'access:servers', 'read:users:activity']})\n"
        f"c.Authenticator.allowed_users = {set(users)!r}\n"
    )
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("JUPYTER", "KUBERNETES_", "CONFIGPROXY"))
    }  # fmt: skip
    env.update(
        POD_NAMESPACE=cluster.namespace,
        HUB_SERVICE_PORT=str(hub_port),
        PROXY_API_SERVICE_PORT=str(api_port),
        CONFIGPROXY_AUTH_TOKEN=proxy_token.read_text(),
        KUBECONFIG=str(kubeconfig),
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    )
    log = workdir / "hub.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(hub_config)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir,
        )  # fmt: skip
    hub = Hub(f"http://127.0.0.1:{port}", token, process, workdir, log)

    def answers() -> bool:
        assert process.poll() is None, f"the Hub exited:\n{hub.tail()}"
        try:
            return hub.request("GET", "/")[0] == 200
        except OSError:
            return False

    wait_until(answers, 90, f"the Hub to answer:\n{hub.tail}")
    return hub


def user_pod(cluster: RealPlayedCluster, user: str) -> dict[str, Any] | None:
    """The user's pod (KubeSpawner's ``jupyter-<user>``), None once it is gone."""
    return cluster.api.get(core(cluster.namespace, "pods", f"jupyter-{user}"))


def wait_pod_gone(cluster: RealPlayedCluster, user: str, timeout: float = 60) -> float:
    """Until the user's pod is deleted; returns when that was seen (time.time)."""
    wait_until(lambda: user_pod(cluster, user) is None, timeout, f"{user}'s pod to go")
    return time.time()
