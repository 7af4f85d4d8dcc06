"""Pause and resume times of a workspace pod, per pause mode, on the tests' real chain.

The cluster is ``tests/cluster``'s: a real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler with Kubeflow Notebooks v2's own CRDs, what ``deploy/`` ships for each mode, and
the parts that cannot run here played (``tests/cluster/real_players.py``: the Notebooks
workspace controller, the kubelet, GKE's node agent; ``gvisor_admission.py``: the gVisor
admission policy). A "pod" is a real jupyter server on this machine; a live restore is its
processes frozen and thawed, so a live resume here costs no snapshot upload or download. A
notebook holds ``--mb`` MB of numpy data. Measured, each from the user's side:

* ``pod-snapshots`` (live): pause (POST pause until the pod is gone: checkpoint, our pod
  snapshot, the Workspace patched), then ``jupyter pause resume --workspace`` until the server
  reports the notebook ready, and until its first cell answers; the bytes written;
* ``no-snapshots`` (files): the same without a PodSnapshotPolicy (a cold start restores the
  checkpoint);
* ``gke-workspaces``: the same on a Workspace the real GKE Workspaces add-on snapshots (when
  ``tests/cluster/gke-addon.sh`` can build it);
* ``gke-workspaces from the dashboard``: the same Workspace paused from outside jupyter_pause, as the
  Kubeflow dashboard does it (``spec.paused: true``, which the add-on holds): the server
  checkpoints in the add-on's hold, keeping the add-on from its snapshot meanwhile; also
  measured, how long those checkpoints took in the hold, and whether they were done before
  the snapshot;
* SIGTERM: the platform pauses the Workspace itself; the checkpoint time the server records,
  and the time from SIGTERM to its exit, against the pod's grace period.

Each round runs every mode, the SIGTERM pause and a raw write+fsync of the same bytes (the
device's speed, the reference of the ratio column) in an order rotated by one per round, each
mode in a namespace of its own; the table gives medians (ranges) over the rounds.

    python bench/workspace_pause.py --mb 1024 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.built_tools import CannotRun  # noqa: E402
from tests.cluster.control_plane import (  # noqa: E402
    UPSTREAM_CRDS,
    ControlPlane,
    addon_binary,
    apiserver_binary,
    kube_binary,
)
from tests.cluster.gvisor_admission import GvisorAdmission  # noqa: E402
from tests.cluster.notebooks import RemoteServer  # noqa: E402
from tests.cluster.real_players import (  # noqa: E402
    PlayedWorkspace,
    RealPlayedCluster,
    real_played_cluster,
)


def data_cell(mb: int) -> str:
    return f"import numpy as np\ndata = np.random.default_rng(0).random({mb * 2**20 // 8})\n"


#: The dashboard's pause of a GKE Workspaces workspace: a method of its own, in that mode.
DASHBOARD = "gke-workspaces from the dashboard"


def workspace(chain: RealPlayedCluster, mode: str, folder: Path) -> PlayedWorkspace:
    """A Workspace of ``mode``'s shipped kind (and policy), on a node it can run on."""
    chain.node("gpu", gpus=1, sandbox=mode != "no-snapshots")
    if mode == "pod-snapshots":
        chain.shipped_policy("manual")
    return chain.workspace("lab", chain.shipped_workspace_kind(mode), folder / chain.namespace)


def resume(chain: RealPlayedCluster, played: PlayedWorkspace, folder: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBE"))}
    env["KUBECONFIG"] = str(chain.user_kubeconfig(folder))
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", "resume", "--workspace",
         f"{chain.namespace}/{played.name}"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def cycle(plane: ControlPlane, method: str, mb: int, folder: Path) -> dict:
    dashboard = method == DASHBOARD
    mode = "gke-workspaces" if dashboard else method
    with real_played_cluster(plane, folder / method.replace(" ", "-")) as chain:
        played = workspace(chain, mode, folder)
        container = chain.running(played, timeout=300)
        first = container.pod_uid
        server = RemoteServer(container.url, played.jupyter_token)
        kernel = server.open_notebook("big.ipynb")
        server.run(kernel, data_cell(mb), timeout=600)
        started = time.monotonic()
        if dashboard:  # from outside: the Workspace's spec.paused, as the Kubeflow UI sets it
            chain.set_paused("lab", True)
        else:
            code, _ = server.request("POST", "/jupyter-pause/pause/big.ipynb")
            assert code == 202
        chain.wait(lambda: played.current is None and chain.pod_of("lab") is None, 900, "pause")
        paused = time.monotonic() - started
        written = chain.state_annotation("lab").get("bytes", 0)
        started = time.monotonic()
        resume(chain, played, folder)
        resumed = time.monotonic() - started
        server = RemoteServer(
            chain.running(played, previous_pod=first, timeout=300).url, played.jupyter_token
        )
        record = server.wait_state("big.ipynb", "ready", "partial", "failed", timeout=900)
        assert record["state"] == "ready", record
        server.run(record["kernel_id"], "print(data.size)", timeout=600)
        first_cell = time.monotonic() - started
        result = {"pause_s": paused, "resume_s": resumed, "first_cell_s": first_cell,
                  "bytes": written, "how": record["how"]}  # fmt: skip
        if dashboard:  # the checkpoints in the add-on's hold: how long, and before its snapshot?
            _, timeline = server.request("GET", "/jupyter-pause/timeline/big.ipynb")
            (taken,) = [e["data"] for e in timeline["events"] if e["kind"] == "snapshot_taken"]
            result.update(hold_s=taken["checkpoint_seconds"], first=taken["checkpoints_first"])
        return result


def sigterm(plane: ControlPlane, mb: int, folder: Path) -> dict:
    with real_played_cluster(plane, folder / "sigterm") as chain:
        played = workspace(chain, "no-snapshots", folder)
        container = chain.running(played, timeout=300)
        server = RemoteServer(container.url, played.jupyter_token)
        kernel = server.open_notebook("big.ipynb")
        server.run(kernel, data_cell(mb), timeout=600)
        pod = chain.pod_of("lab") or {}
        chain.set_paused("lab", True)
        assert container.stopped.wait(300), "the kubelet did not stop the pod"
        store = played.home / ".jupyter-pause" / "checkpoints" / "environment.json"
        environment = json.loads(store.read_text())
        return {
            "checkpoint_s": environment["checkpoint_seconds"],
            "exit_s": container.exit_seconds,
            "grace_s": pod["spec"]["terminationGracePeriodSeconds"],
        }


def raw_write(mb: int, folder: Path) -> float:
    """Seconds to write and fsync ``mb`` MB on the disk the checkpoints go to: the device's
    own speed, measured in the same round as the modes it is held against."""
    path = folder / "raw-write.bin"
    block = os.urandom(2**20)
    started = time.monotonic()
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.monotonic() - started
    path.unlink()
    return elapsed


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(mb: int, rounds: list[dict[str, dict]]) -> str:
    head = ["mode", "how", "pause s", "resume s", "first cell s", "MiB written",
            "pause / raw write"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode in MODES:
        runs = [r for r in rounds if mode in r]
        if not runs:
            continue
        hows = sorted({r[mode]["how"] for r in runs})
        lines.append("| " + " | ".join([
            mode, "/".join(hows),
            spread([r[mode]["pause_s"] for r in runs]),
            spread([r[mode]["resume_s"] for r in runs]),
            spread([r[mode]["first_cell_s"] for r in runs]),
            spread([r[mode]["bytes"] / 2**20 for r in runs]),
            spread([r[mode]["pause_s"] / r["raw"]["write_s"] for r in runs]),
        ]) + " |")  # fmt: skip
    held = [r[DASHBOARD] for r in rounds if DASHBOARD in r]
    if held:
        first = sum(1 for h in held if h["first"])
        lines += [
            "",
            f"{DASHBOARD}: the checkpoints took {spread([h['hold_s'] for h in held])} s in the "
            f"add-on's hold (its own settle grace: 3 s), written before its snapshot in "
            f"{first} of {len(held)} rounds.",
        ]
    stops = [r["sigterm"] for r in rounds if "sigterm" in r]
    raw = [r["raw"]["write_s"] for r in rounds]
    lines += [
        "",
        f"{mb} MB of notebook data; raw write+fsync of it: {spread(raw)} s; "
        f"{len(rounds)} rounds, medians (ranges).",
    ]
    if stops:
        lines.append(
            f"SIGTERM (platform pause, no-snapshots): checkpoint "
            f"{spread([s['checkpoint_s'] for s in stops])} s, server exit "
            f"{spread([s['exit_s'] for s in stops])} s after SIGTERM, grace "
            f"{stops[0]['grace_s']} s"
        )
    return "\n".join(lines)


MODES = ("gke-workspaces", DASHBOARD, "pod-snapshots", "no-snapshots")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of notebook data (default 1024)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--methods",
        help="a comma-separated subset of raw, sigterm and the modes (default: all), e.g. "
        "'raw,gke-workspaces,gke-workspaces from the dashboard' for a pause from the "
        "dashboard against our button's",
    )
    args = parser.parse_args()
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="jp-bench-") as tmp:
        folder = Path(tmp)
        (folder / "control-plane").mkdir()
        plane = ControlPlane(
            folder / "control-plane",
            apiserver_binary(),
            controller_manager=kube_binary("kube-controller-manager"),
            scheduler=kube_binary("kube-scheduler"),
        )
        admission = GvisorAdmission(plane, folder)
        try:
            plane.start()
            plane.load_crds(UPSTREAM_CRDS)
            plane.install_gvisor_runtime_class()
            admission.start()
            admission.register()
            methods = ["raw", "sigterm", *MODES]
            if args.methods:
                wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
                unknown = set(wanted) - set(methods)
                if unknown:
                    parser.error(f"unknown methods: {sorted(unknown)}; of {methods}")
                methods = [m for m in methods if m in wanted]
            try:
                plane.start_snapshot_addon(addon_binary())
            except CannotRun as err:
                print(f"gke-workspaces skipped: {err}", file=sys.stderr)
                methods = [m for m in methods if m not in ("gke-workspaces", DASHBOARD)]
            for number in range(args.rounds):
                shift = number % len(methods)
                row: dict[str, dict] = {}
                for method in methods[shift:] + methods[:shift]:
                    place = folder / f"round-{number}"
                    if method == "raw":
                        place.mkdir(exist_ok=True)
                        row[method] = {"write_s": raw_write(args.mb, place)}
                    elif method == "sigterm":
                        row[method] = sigterm(plane, args.mb, place)
                    else:
                        row[method] = cycle(plane, method, args.mb, place)
                    print(f"round {number + 1} {method}: {row[method]}", file=sys.stderr)
                rounds.append(row)
        finally:
            admission.stop()
            plane.stop()
    print(f"kube-apiserver ready in {plane.ready_seconds:.1f} s")
    print(table(args.mb, rounds))


if __name__ == "__main__":
    main()
