"""Pause and come back under JupyterHub, beside the ``local`` backend, in the same run.

What a user waits for, each from their side, with a notebook holding ``--mb`` MB of numpy data:

* ``local``: jupyter_pause without a Hub (one jupyter server, ``backend = local``). Pause: POST
  pause until the kernel is gone (its GPU free). Back: POST resume until the notebook is ready,
  and until its next cell answers (there is no server to start).
* ``jupyterhub``: JupyterHub 6.1.1 on this machine as ``deploy/jupyterhub/jupyterhub_config.py``
  ships it (``tests/hub_process.py``: SimpleLocalProcessSpawner, configurable-http-proxy).
  Pause: POST pause until the Hub says the server is stopped and its process is gone. Back:
  the spawn (POST the user's server, as a login does) until the Hub says ready, then Resume,
  until the next cell answers.
* ``kubespawner``: Zero to JupyterHub's own hub config with ``deploy/jupyterhub/values.yaml``,
  KubeSpawner 7.1.0 on the tests' real kube-apiserver, scheduler and controller-manager
  (``tests/cluster/z2jh_hub.py``), the played kubelet running the single-user server at the
  pod's own address. Pause: until the pod is deleted. Back: spawn, a new pod on the same home
  volume, until ready, then Resume, until the next cell answers.
* ``sigterm``: the kubespawner setup stopped by an admin (the Hub deletes the pod with the
  shipped ``delete_grace_period`` of 30 s): the checkpoint time the server records on SIGTERM
  and the time from SIGTERM to its exit, what ``delete_grace_period`` must exceed.
* ``raw``: a write+fsync of the same bytes, the device's own speed (the ratio column).

Each round runs every method in an order rotated by one per round; the table gives medians
(ranges) over the rounds.

    python bench/hub_pause.py --mb 256 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.workspace_pause import data_cell, raw_write, spread  # noqa: E402
from tests.cluster.control_plane import (  # noqa: E402
    UPSTREAM_CRDS,
    ControlPlane,
    apiserver_binary,
    kube_binary,
)
from tests.cluster.notebooks import RemoteServer  # noqa: E402
from tests.cluster.real_players import RealPlayedCluster, real_played_cluster  # noqa: E402
from tests.cluster.z2jh_hub import start_z2jh_hub, user_pod  # noqa: E402
from tests.hub_process import Hub, start_hub  # noqa: E402
from tests.server_process import start_server  # noqa: E402

NOTEBOOK = "big.ipynb"
EMPTY = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
METHODS = ("local", "jupyterhub", "kubespawner")


def until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def fill(server: RemoteServer, mb: int) -> None:
    code, model = server.request(
        "PUT", f"/api/contents/{NOTEBOOK}", {"type": "notebook", "content": EMPTY}
    )
    assert code in (200, 201), model
    kernel = server.open_notebook(NOTEBOOK)
    server.run(kernel, data_cell(mb), timeout=600)


def back(server: RemoteServer) -> tuple[float, str, int]:
    """Resume until the next cell answers: (seconds, how, checkpoint bytes)."""
    started = time.monotonic()
    code, record = server.request("POST", f"/jupyter-pause/resume/{NOTEBOOK}")
    assert code == 202, record
    ready = server.wait_state(NOTEBOOK, "ready", "partial", "failed", timeout=900)
    assert ready["state"] == "ready", ready
    server.run(ready["kernel_id"], "print(data.size)", timeout=600)
    return time.monotonic() - started, ready["how"], (ready.get("checkpoint") or {}).get("bytes", 0)


def local(mb: int, folder: Path) -> dict:
    root = folder / "local-root"
    root.mkdir(parents=True)
    store = folder / "local-store"
    config = f"c.PauseApp.backend = 'local'\nc.PauseApp.store_root = {str(store)!r}\n"
    started = start_server(folder / "local", root, config)
    server = started.server
    try:
        fill(server, mb)
        begun = time.monotonic()
        code, answer = server.request("POST", f"/jupyter-pause/pause/{NOTEBOOK}")
        assert code == 202, answer
        server.wait_state(NOTEBOOK, "paused", "active", timeout=900)
        paused = time.monotonic() - begun
        resumed, how, written = back(server)
        return {"pause_s": paused, "spawn_s": 0.0, "back_s": resumed, "how": how,
                "bytes": written}  # fmt: skip
    finally:
        started.stop()


def spawn(hub: Hub, user: str) -> RemoteServer:
    code, answer = hub.request("POST", f"/users/{user}/server")
    assert code in (201, 202), (code, answer)
    until(lambda: (hub.server(user) or {}).get("ready"), 300, f"{user}'s server")
    return RemoteServer(f"{hub.url}/user/{user}", hub.token)


def through_hub(hub: Hub, mb: int, gone: Callable[[], bool]) -> dict:
    server = spawn(hub, "alice")
    fill(server, mb)
    begun = time.monotonic()
    code, answer = server.request("POST", f"/jupyter-pause/pause/{NOTEBOOK}")
    assert code == 202, answer
    until(gone, 900, "the server to go")
    paused = time.monotonic() - begun
    until(lambda: not hub.user("alice").get("pending"), 120, "the Hub's stop to end")
    begun = time.monotonic()
    server = spawn(hub, "alice")
    spawned = time.monotonic() - begun
    resumed, how, written = back(server)
    return {"pause_s": paused, "spawn_s": spawned, "back_s": spawned + resumed, "how": how,
            "bytes": written}  # fmt: skip


def jupyterhub(mb: int, folder: Path) -> dict:
    hub = start_hub(folder / "jupyterhub")
    try:

        def stopped() -> bool:  # the Hub's stop done: no server, no stop pending
            user = hub.user("alice")
            return not user.get("servers") and not user.get("pending")

        return through_hub(hub, mb, stopped)
    finally:
        hub.stop()


@contextlib.contextmanager
def z2jh(plane: ControlPlane, folder: Path) -> Iterator[tuple[RealPlayedCluster, Hub]]:
    """Zero to JupyterHub with the shipped values in a namespace of its own, one GPU node."""
    with real_played_cluster(plane, folder / "cluster") as chain:
        chain.node(gpus=1)
        chain.start()
        hub = start_z2jh_hub(chain, folder / "hub", {})
        try:
            yield chain, hub
        finally:
            hub.stop()


def kubespawner(plane: ControlPlane, mb: int, folder: Path) -> dict:
    with z2jh(plane, folder) as (chain, hub):
        return through_hub(hub, mb, lambda: user_pod(chain, "alice") is None)


def sigterm(plane: ControlPlane, mb: int, folder: Path) -> dict:
    with z2jh(plane, folder) as (chain, hub):
        server = spawn(hub, "alice")
        fill(server, mb)
        (known,) = [p for p in chain.pods.values() if p.name == "jupyter-alice"]
        container = known.container
        assert container is not None
        pod = user_pod(chain, "alice") or {}
        hub.request("DELETE", "/users/alice/server")
        assert container.stopped.wait(300), "the kubelet did not stop the pod"
        (store,) = hub.home("alice").rglob("environment.json")  # in JUPYTER_PAUSE_STORE
        environment = json.loads(store.read_text())
        return {
            "checkpoint_s": environment["checkpoint_seconds"],
            "exit_s": container.exit_seconds,
            "grace_s": pod.get("spec", {}).get("terminationGracePeriodSeconds"),
        }


def table(mb: int, rounds: list[dict[str, dict]]) -> str:
    head = ["method", "how", "pause: until released s", "spawn s", "back: until next cell s",
            "MiB written", "pause / raw write"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in METHODS:
        runs = [r for r in rounds if method in r]
        if not runs:
            continue
        lines.append("| " + " | ".join([
            method, "/".join(sorted({r[method]["how"] for r in runs})),
            spread([r[method]["pause_s"] for r in runs]),
            spread([r[method]["spawn_s"] for r in runs]),
            spread([r[method]["back_s"] for r in runs]),
            spread([r[method]["bytes"] / 2**20 for r in runs]),
            spread([r[method]["pause_s"] / r["raw"]["write_s"] for r in runs if "raw" in r]),
        ]) + " |")  # fmt: skip
    lines += ["", f"{mb} MB of notebook data; {len(rounds)} rounds, medians (ranges)."]
    raw = [r["raw"]["write_s"] for r in rounds if "raw" in r]
    if raw:
        lines.append(f"raw write+fsync of it: {spread(raw)} s")
    stops = [r["sigterm"] for r in rounds if "sigterm" in r]
    if stops:
        exits = [s["exit_s"] for s in stops if s["exit_s"] is not None]
        lines.append(
            f"sigterm (kubespawner, an admin's stop): checkpoint "
            f"{spread([s['checkpoint_s'] for s in stops])} s, server exit "
            f"{spread(exits) if exits else 'never'} s after SIGTERM, grace {stops[0]['grace_s']} s"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="MB of notebook data (default 256)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--methods", help=f"a comma-separated subset of raw, sigterm, {', '.join(METHODS)}"
    )
    args = parser.parse_args()
    methods = ["raw", "sigterm", *METHODS]
    if args.methods:
        wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = set(wanted) - set(methods)
        if unknown:
            parser.error(f"unknown methods: {sorted(unknown)}; of {methods}")
        methods = [m for m in methods if m in wanted]
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="jp-bench-hub-") as tmp:
        folder = Path(tmp)
        (folder / "control-plane").mkdir()
        plane = ControlPlane(
            folder / "control-plane",
            apiserver_binary(),
            controller_manager=kube_binary("kube-controller-manager"),
            scheduler=kube_binary("kube-scheduler"),
        )
        try:
            plane.start()
            plane.load_crds(UPSTREAM_CRDS)  # the played kubelet reads GKE's snapshots
            for number in range(args.rounds):
                shift = number % len(methods)
                row: dict[str, dict] = {}
                for method in methods[shift:] + methods[:shift]:
                    place = folder / f"round-{number}" / method
                    place.mkdir(parents=True)
                    if method == "raw":
                        row[method] = {"write_s": raw_write(args.mb, place)}
                    elif method == "local":
                        row[method] = local(args.mb, place)
                    elif method == "jupyterhub":
                        row[method] = jupyterhub(args.mb, place)
                    elif method == "kubespawner":
                        row[method] = kubespawner(plane, args.mb, place)
                    else:
                        row[method] = sigterm(plane, args.mb, place)
                    print(f"round {number + 1} {method}: {row[method]}", file=sys.stderr)
                rounds.append(row)
        finally:
            plane.stop()
    print(table(args.mb, rounds))


if __name__ == "__main__":
    main()
