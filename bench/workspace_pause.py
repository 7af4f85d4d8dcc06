"""Pause and resume times of a workspace pod, against the tests' real kube-apiserver.

The cluster's other parts are played as in ``tests/cluster`` (a "pod" is a real jupyter server
on this machine; a live restore is its processes frozen and thawed). A notebook holds
``--mb`` MB of numpy data. Measured, each from the user's side:

* live: pause (POST pause until the pod is gone: checkpoint, pod snapshot, Workspace patch),
  then ``jupyter pause resume --workspace`` until the server reports the notebook ready;
* files: the same with no PodSnapshotPolicy (a cold start restores the checkpoint);
* SIGTERM: the platform pauses the Workspace itself; the checkpoint time the server records,
  and the time from SIGTERM to its exit, against the 30 s grace period it ships for.

    python bench/workspace_pause.py --mb 1024
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster.conftest import CRDS, _wait_established  # noqa: E402
from tests.cluster.control_plane import ControlPlane, apiserver_binary  # noqa: E402
from tests.cluster.notebooks import RemoteServer  # noqa: E402
from tests.cluster.players import PlayedCluster, WorkspacePlay, wait_for  # noqa: E402


def data_cell(mb: int) -> str:
    return f"import numpy as np\ndata = np.random.default_rng(0).random({mb * 2**20 // 8})\n"


def served(play: WorkspacePlay, previous: str | None = None) -> RemoteServer:
    wait_for(
        lambda: (
            play.current is not None
            and play.current.pod_uid != previous
            and not play.current.frozen
        ),
        300,
        "the pod",
    )
    assert play.current is not None
    return RemoteServer(play.current.url, play.jupyter_token)


def resume(cluster: PlayedCluster, play: WorkspacePlay, folder: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBE"))}
    env["KUBECONFIG"] = str(cluster.user_kubeconfig(folder))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", "resume", "--workspace",
         f"{cluster.namespace}/{play.name}"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return time.monotonic() - started


def cycle(plane: ControlPlane, namespace: str, mb: int, snapshots: bool, folder: Path) -> dict:
    cluster = PlayedCluster(plane, namespace)
    cluster.create_namespace()
    cluster.start()
    try:
        if snapshots:
            cluster.create_policy("manual")
        play = cluster.create_workspace("lab", folder / namespace)
        server = served(play)
        first = play.current.pod_uid if play.current else None
        kernel = server.open_notebook("big.ipynb")
        server.run(kernel, data_cell(mb), timeout=600)
        started = time.monotonic()
        code, _ = server.request("POST", "/jupyter-pause/pause/big.ipynb")
        assert code == 202
        wait_for(lambda: play.current is None, 900, "the pod to go", interval=0.05)
        paused = time.monotonic() - started
        resumed = resume(cluster, play, folder)
        record = served(play, first).wait_state(
            "big.ipynb", "ready", "partial", "failed", timeout=900
        )
        assert record["state"] == "ready", record
        return {"pause_s": paused, "resume_s": resumed, "how": record["how"]}
    finally:
        cluster.close()


def sigterm(plane: ControlPlane, namespace: str, mb: int, folder: Path) -> dict:
    cluster = PlayedCluster(plane, namespace)
    cluster.create_namespace()
    cluster.start()
    try:
        play = cluster.create_workspace("lab", folder / namespace, grace=30.0)
        server = served(play)
        kernel = server.open_notebook("big.ipynb")
        server.run(kernel, data_cell(mb), timeout=600)
        pod = play.current
        assert pod is not None
        cluster.set_paused("lab", True)
        assert pod.stopped.wait(120), "the kubelet did not stop the pod"
        store = play.home / ".jupyter-pause" / "checkpoints" / "environment.json"
        environment = json.loads(store.read_text())
        return {
            "checkpoint_s": environment["checkpoint_seconds"],
            "exit_s": pod.exit_seconds,
            "grace_s": play.grace_seconds,
        }
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of notebook data (default 1024)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jp-bench-") as tmp:
        folder = Path(tmp)
        plane = ControlPlane(folder / "control-plane", apiserver_binary())
        (folder / "control-plane").mkdir()
        plane.start()
        try:
            for crd in sorted(CRDS.glob("*.yaml")):
                plane.apply_file(crd)
            _wait_established(plane)
            live = cycle(plane, "bench-live", args.mb, True, folder)
            files = cycle(plane, "bench-files", args.mb, False, folder)
            stop = sigterm(plane, "bench-sigterm", args.mb, folder)
        finally:
            plane.stop()
    print(f"{args.mb} MB of notebook data, kube-apiserver ready in {plane.ready_seconds:.1f} s")
    for name, result in (("live", live), ("files", files)):
        print(
            f"  {name:5}: pause {result['pause_s']:.2f} s (until the pod is gone), resume "
            f"{result['resume_s']:.2f} s (CLI until ready, how={result['how']})"
        )
    print(
        f"  SIGTERM: checkpoint {stop['checkpoint_s']:.2f} s, server exit {stop['exit_s']:.2f} s "
        f"after SIGTERM, grace {stop['grace_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
