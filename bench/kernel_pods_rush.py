"""The morning rush on the kernel-pod backend: N paused GPU notebooks resumed at once on K < N GPUs.

The cluster is ``tests/cluster``'s: a real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, this machine playing the kubelet (a kernel pod the scheduler puts on a node
becomes a real ipykernel process here, launched by the kernel image's command). The server is a
real ``jupyter_server`` process with ``c.PauseApp.backend = "kernel-pod"``, the shipped
``deploy/kernel-pods/`` kernelspec and RBAC, in a namespace of its own each round, on one node
of ``--gpus`` GPUs.

Each round: ``--notebooks`` notebooks are opened (each kernel a pod on a GPU), given a value,
and paused one after the other; then all are resumed at once, in the order a, b, c, ... (one
``POST resume`` each, as users pressing Resume). Each notebook, once ready, works ``--work``
seconds and pauses again, which frees its GPU for the next in line. Measured from the user's
side, polling the server's REST API and the API server every 0.1 s:

* time to ready of each place in the request order (from its ``POST resume``); the ratio
  column against the first place's (a resume that found a GPU free, in the same round);
* whether the notebooks were served in request order, and how many pods each resume made;
* GPU idle while someone waits: GPU-seconds with a GPU free (no kernel pod on it) while a
  resume waits for one, summed over the round, counted two ways: while a resume is
  ``waiting-for-resources`` (held in this server's line, or its pod unschedulable), and while
  any resume is not ready without a pod on a node (this adds the time a pod takes to be made:
  the launcher's start, the API server, the scheduler). The second is split by what the free
  GPU waited for: a resume's pod that exists without a node (the scheduler's turn), or a resume
  with no pod yet (its launcher's, or held behind one that waits).

The methods are values of ``c.PauseApp.kernel_pod_launches_at_once`` (how many resumes' pods
may be in the making at once, ``backends/resume_line.py``), and the same with ``:backoff``
after it: the server's hand-off turned off in that server's config (a pause of this server's
then leaves the refused pod of the first in line to the scheduler's backoff, instead of making
it anew: ``KernelPodBackend._hand_off``). Each is a fresh server and namespace, in rotated
order each round; the tables give medians (ranges) over the rounds, and each place's time to
ready against the first method in the same round.

    python bench/kernel_pods_rush.py --notebooks 4 --gpus 2 --rounds 3 --methods 1,1:backoff,2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster.kernel_pod_server import (  # noqa: E402
    KERNEL_NAME,
    kernel_pod_server,
    kernel_pod_server_env,
    started_plane,
)
from tests.cluster.notebooks import RemoteServer  # noqa: E402
from tests.cluster.real_players import RealPlayedCluster, core, real_played_cluster  # noqa: E402

NOT_READY = ("resuming", "waiting-for-resources")


def call(server: RemoteServer, method: str, action: str, path: str) -> dict[str, Any]:
    code, record = server.request(method, f"/jupyter-pause/{action}/{path}")
    assert code in (200, 202), (action, path, code, record)
    return record


def rush(chain: RealPlayedCluster, server: RemoteServer, notebooks: int, gpus: int,
         work: float) -> dict[str, Any]:  # fmt: skip
    """One round's rush (see the module docstring): times to ready in request order, the order
    served, pods per resume, GPU-seconds idle while someone waited."""
    paths = [f"{chr(ord('a') + i)}.ipynb" for i in range(notebooks)]
    kernels = {}
    for path in paths:  # each opened, given a value and paused: one GPU at a time
        kernels[path] = server.open_notebook(path, KERNEL_NAME)
        server.run(kernels[path], f"who = {path!r}")
        while not server.session(path)["watching"]:  # it sees each busy/idle change
            time.sleep(0.1)
        call(server, "POST", "pause", path)
        assert server.wait_state(path, "paused", "active")["state"] == "paused"
    by_kernel = {kernel_id: path for path, kernel_id in kernels.items()}  # ids are kept
    requested: dict[str, float] = {}
    for path in paths:
        call(server, "POST", "resume", path)
        requested[path] = time.monotonic()
    ready: dict[str, float] = {}
    pods_seen: dict[str, set[str]] = {path: set() for path in paths}
    paused_again: set[str] = set()
    idle = idle_unplaced = idle_pending = 0.0
    last = time.monotonic()
    deadline = last + 600
    while len(paused_again) < notebooks:
        assert time.monotonic() < deadline, f"the rush did not end: ready {sorted(ready)}"
        chain.check()
        states = {path: server.session(path) for path in paths}
        pods = chain.api.list(core(chain.namespace, "pods"), labelSelector="component=kernel")
        placed = set()  # notebooks whose pod is on a node
        pending = set()  # notebooks whose pod has no node yet
        for pod in pods:
            path = by_kernel.get(pod["metadata"]["labels"]["kernel_id"])
            if path is None or pod["metadata"].get("deletionTimestamp"):
                continue
            pods_seen[path].add(pod["metadata"]["uid"])
            (placed if pod["spec"].get("nodeName") else pending).add(path)
        now = time.monotonic()
        on_gpus = sum(1 for p in pods if p["spec"].get("nodeName"))  # held until deleted
        free = max(gpus - on_gpus, 0)
        held = [p for p in paths if states[p]["state"] == "waiting-for-resources"]
        unplaced = [p for p in paths if states[p]["state"] in NOT_READY and p not in placed]
        idle += min(free, len(held)) * (now - last)
        idle_unplaced += min(free, len(unplaced)) * (now - last)
        idle_pending += min(free, len(pending & set(unplaced))) * (now - last)
        last = now
        for path in paths:
            state = states[path]["state"]
            if path not in ready and state in ("ready", "partial", "failed"):
                assert state == "ready", states[path]
                ready[path] = now
            if path in ready and path not in paused_again and now - ready[path] >= work:
                call(server, "POST", "pause", path)
                paused_again.add(path)
        time.sleep(0.1)
    served = sorted(paths, key=lambda p: ready[p])
    return {
        "ready_s": [ready[p] - requested[p] for p in paths],
        "in_order": served == paths,
        "pods": [len(pods_seen[p]) for p in paths],
        "idle_gpu_s": idle,
        "idle_unplaced_gpu_s": idle_unplaced,
        "idle_pending_gpu_s": idle_pending,  # of idle_unplaced: a pod there, without a node
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


#: Put in a method's server config for ``:backoff``: the hand-off off (a bench peer only).
WITHOUT_HAND_OFF = (
    "from jupyter_pause.backends.kernel_pods import KernelPodBackend\n"
    "KernelPodBackend._hand_off = lambda self: None\n"
)


def server_config(method: str) -> str:
    """The server config of a method: ``N`` or ``N:backoff`` (see the module docstring)."""
    launches, _, variant = method.partition(":")
    assert variant in ("", "backoff"), f"unknown method {method!r}"
    config = f"c.PauseApp.kernel_pod_launches_at_once = {int(launches)}\n"
    return config + (WITHOUT_HAND_OFF if variant else "")


def table(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]]) -> str:
    rounds = len(next(iter(results.values())))
    lines = [
        f"Morning rush: {args.notebooks} notebooks resumed at once on {args.gpus} GPU(s), each "
        f"working {args.work:g} s once ready; {rounds} rounds, methods in rotated order, "
        f"medians (ranges); ratios against {next(iter(results))} in the same round",
        "",
        f"| method | place | time to ready, s | vs {next(iter(results))} | pods per resume |",
        "|---|---|---|---|---|",
    ]
    base = next(iter(results.values()))
    for method, runs in results.items():
        for place in range(args.notebooks):
            times = [r["ready_s"][place] for r in runs]
            pairs = zip(runs, base, strict=True)
            ratio = spread([r["ready_s"][place] / b["ready_s"][place] for r, b in pairs]) + "x"
            pods = sorted({r["pods"][place] for r in runs})
            lines.append(
                f"| {method} | {place + 1} | {spread(times)} | {ratio} | "
                f"{', '.join(map(str, pods))} |"
            )
    lines += ["", "| method | served in request order | GPU idle while a resume "
              "waited (waiting-for-resources), GPU-s | GPU idle while a resume had no pod on a "
              "node, GPU-s | of which its pod was there without a node | of which it had no "
              "pod yet |", "|---|---|---|---|---|---|"]  # fmt: skip
    for method, runs in results.items():
        podless = [r["idle_unplaced_gpu_s"] - r["idle_pending_gpu_s"] for r in runs]
        lines.append(
            f"| {method} | {sum(r['in_order'] for r in runs)} of {len(runs)} | "
            f"{spread([r['idle_gpu_s'] for r in runs])} | "
            f"{spread([r['idle_unplaced_gpu_s'] for r in runs])} | "
            f"{spread([r['idle_pending_gpu_s'] for r in runs])} | {spread(podless)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--work", type=float, default=3.0, help="s each works once ready")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--methods",
        default="1,1:backoff,2",
        help="values of c.PauseApp.kernel_pod_launches_at_once to compare, each with "
        "':backoff' for the same without the hand-off, e.g. 1,1:backoff,2",
    )
    args = parser.parse_args()
    assert args.gpus < args.notebooks, "a rush needs fewer GPUs than notebooks"
    methods = args.methods.split(",")
    for method in methods:
        server_config(method)  # an unknown method fails before the first round
    results: dict[str, list[dict[str, Any]]] = {method: [] for method in methods}
    with tempfile.TemporaryDirectory(prefix="jp-bench-") as tmp:
        folder = Path(tmp)
        plane = started_plane(folder / "control-plane")
        try:
            for number in range(args.rounds):
                shift = number % len(methods)  # each method first in turn
                for method in methods[shift:] + methods[:shift]:
                    # named without ':', where KUBECONFIG splits its list of files
                    place = folder / f"round-{number}-{method.replace(':', '-')}"
                    with real_played_cluster(plane, place) as chain:
                        chain.node("gpu", gpus=args.gpus)
                        process, server = kernel_pod_server(
                            kernel_pod_server_env(chain, place),
                            place,
                            server_config(method),
                        )
                        try:
                            row = rush(chain, server, args.notebooks, args.gpus, args.work)
                        finally:
                            process.terminate()
                            process.wait(60)
                    print(f"round {number + 1}, {method}: {row}", file=sys.stderr)
                    results[method].append(row)
        finally:
            plane.stop()
    print(table(args, results))


if __name__ == "__main__":
    main()
