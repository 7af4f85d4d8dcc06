"""``jupyter pause resume|status --workspace NAMESPACE/NAME``: a Workspace, from outside its pod.

While a workspace is paused there is no server to ask: these commands read the cluster
instead (a kubeconfig, or the in-cluster service account), with the ``kubernetes`` client,
imported only here so that the other commands stay fast. What they show:

* the Workspace's ``spec.paused`` and the ``jupyter-pause.io/state`` annotation its server
  writes (how the last pause went; how the last restore went, for which pod);
* its pod, found by the ``notebooks.kubeflow.org/workspace-name`` label: ``Pending`` with
  ``PodScheduled=False``/``Unschedulable`` is ``waiting-for-resources``, with the scheduler's
  reason and how long the pod has waited;
* the Workspace's own ``status.state`` and ``status.stateMessage`` (the Notebooks controller's
  word: Running, Pending, Paused, Error...) and the pause **mode** the server recorded
  (``gke-workspaces``, ``pod-snapshots``, ``no-snapshots``).

An ``Error`` state (the controller's: ImagePullBackOff, CrashLoopBackOff, an invalid
WorkspaceKind; or the pod's own container waiting on one of those) is ``error``: nothing comes
of waiting for it until someone fixes the cause. The Errors that are a wait are not: a pod the
scheduler cannot place yet (no GPU free) is ``waiting-for-resources``, and a pod on its way
whose last warning event the controller still shows (none of its containers stuck) is
``restoring``, with that message.

``resume`` unpauses the Workspace (unless it already is: a second resume joins the first)
and follows the pod until the server in it reports the restore of every notebook; it stops at
once on ``error``, naming it (exit 1). A pause still in flight (``pausing``: the GKE Workspaces
add-on holding it while it snapshots the pod, or the pod being stopped) is waited for first.

Every state of a pause answers, whoever asked for it: the server's own record is read for the
pod it names only (a ``paused`` record of the pod that runs is a pause in flight).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..backends.gke_workspaces import (
    CHECKPOINT_STARTED_AT,
    CHECKPOINT_STATE,
    CHECKPOINTING,
    LAST_CHECKPOINT,
    READY,
)
from ..backends.kube import STATE_ANNOTATION, WORKSPACE_LABEL, Kube, KubeError, condition, epoch
from ..backends.workspace import facts_of
from ..formatting import format_bytes, format_duration
from .client import (
    EXIT_CONFLICT,
    EXIT_FAILED,
    EXIT_FORBIDDEN,
    EXIT_NO_SERVER,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    CliError,
)
from .output import format_time, print_json

#: KubeError kinds and the exit codes they become.
KUBE_EXIT_CODES = {
    "forbidden": EXIT_FORBIDDEN,
    "unauthorized": EXIT_FORBIDDEN,
    "not-found": EXIT_UNKNOWN,
    "unreachable": EXIT_NO_SERVER,
    "unconfigured": EXIT_NO_SERVER,
    "missing-crd": EXIT_NO_SERVER,
    "quota": EXIT_CONFLICT,
}
POLL_SECONDS = 0.5
DONE = ("ready", "partial", "failed")
#: The Workspace ``status.state`` (Kubeflow Notebooks v2) that no waiting will end.
WORKSPACE_ERROR = "Error"
#: Reasons a pod's container waits on that do not pass by themselves (the kubelet backs off and
#: tries again, the same way): the Notebooks controller's Error cases, and two it leaves Pending.
STUCK_REASONS = (
    "ImagePullBackOff",
    "CrashLoopBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
)


def connect(args: argparse.Namespace) -> tuple[Kube, str, str]:
    """The cluster (kubeconfig, else in-cluster) and the Workspace's namespace and name."""
    try:
        kube = Kube.from_kubeconfig(args.kubeconfig, args.context)
    except KubeError as err:
        try:
            kube = Kube.in_cluster()
        except KubeError:
            raise CliError(f"Cannot reach a cluster: {err}", EXIT_NO_SERVER) from None
    namespace, _, name = args.workspace.rpartition("/")
    namespace = namespace or kube.namespace or "default"
    if not name:
        raise CliError("--workspace takes NAMESPACE/NAME (or NAME)", EXIT_USAGE)
    return kube, namespace, name


def view(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """The Workspace's state as a session-like record: state, message, and the details."""
    workspace = kube.get_workspace(namespace, name)
    paused = bool((workspace.get("spec") or {}).get("paused"))
    annotations = (workspace.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(STATE_ANNOTATION)
    try:
        recorded = json.loads(raw) if raw else {}
    except ValueError:
        recorded = {}
    pods = [
        p
        for p in kube.list_pods(namespace, f"{WORKSPACE_LABEL}={name}")
        if not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)
    status = workspace.get("status") or {}
    record: dict[str, Any] = {
        "workspace": f"{namespace}/{name}",
        "paused": paused,
        "pod": None if pod is None else pod["metadata"]["name"],
        "recorded": recorded,
        "waited_seconds": None,
        # The Notebooks controller's own word on the Workspace, and how it pauses (the mode the
        # server recorded at the last pause).
        "workspace_state": status.get("state"),
        "workspace_message": status.get("stateMessage"),
        "mode": recorded.get("mode") or None,
        "mode_reason": recorded.get("mode_reason") or None,
    }
    if paused:
        if pod is not None:
            return {**record, "state": "pausing", "message": "The pod is being stopped."}
        if not recorded.get("snapshot") and annotations.get(CHECKPOINT_STATE) == READY:
            # GKE Workspaces: the add-on's snapshot stopped the pod before our server could
            # name it; the add-on names it on the Workspace
            taken = annotations.get(LAST_CHECKPOINT)
            if taken:
                recorded = {**recorded, "snapshot": f"{taken} (by the GKE Workspaces add-on)"}
        return {**record, "state": "paused", "message": paused_message(recorded)}
    uid = ((pod or {}).get("metadata") or {}).get("uid")
    ours = recorded.get("state") == "paused" and uid and recorded.get("instance") == uid
    if annotations.get(CHECKPOINT_STATE) == CHECKPOINTING or ours:
        # Asked, not done: the add-on holds spec.paused back while it snapshots the pod (our
        # server wrote its record of this pod's pause first, or has yet to).
        return {**record, "state": "pausing", "message": pausing_message(annotations, recorded)}
    phase = ((pod or {}).get("status") or {}).get("phase")
    scheduled = (condition(pod, "PodScheduled") if pod else None) or {}
    # Before the Workspace's Error: the Notebooks controller calls a pod the scheduler cannot
    # place yet an Error ("Workspace Pod is unschedulable: ..."), but a GPU freed elsewhere
    # ends that wait by itself, so a resume waits for it instead of giving up.
    if pod is not None and phase == "Pending" and scheduled.get("reason") == "Unschedulable":
        waited = time.time() - (epoch(pod["metadata"].get("creationTimestamp")) or time.time())
        return {
            **record,
            "state": "waiting-for-resources",
            "message": f"Waiting for resources: {scheduled.get('message') or 'unschedulable'}",
            "waited_seconds": waited,
        }
    error = error_message(status, pod)
    if error:
        return {**record, "state": "error", "message": error}
    if pod is None:
        return {**record, "state": "resuming", "message": "Waiting for the pod to be created."}
    facts = facts_of(pod)
    if phase == "Running" and not recorded:
        return {**record, "state": "running", "message": "Running; no pause is recorded."}
    if phase != "Running" or recorded.get("instance") != facts.instance:
        said = status.get("stateMessage") if status.get("state") == WORKSPACE_ERROR else ""
        message = "The pod is starting its server" + (
            f" (the controller says: {said})" if said else ""
        )
        return {**record, "state": "restoring", "message": message + "."}
    state = recorded.get("state") or "restoring"
    if state not in ("restoring", *DONE):  # the record of an older pause of an older pod
        return {**record, "state": "running", "message": "Running; no restore is recorded."}
    return {**record, "state": state, "message": restored_message(recorded)}


def error_message(status: dict[str, Any], pod: dict[str, Any] | None) -> str:
    """Why the Workspace cannot run, as the controller and the pod say it; "" when it can."""
    stuck = ""
    pod = pod or {}
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            detail = waiting.get("message") or ""
            stuck = f"container {container.get('name')}: {waiting['reason']}" + (
                f" ({detail})" if detail else ""
            )
            break
    if status.get("state") == WORKSPACE_ERROR:
        said = status.get("stateMessage") or "no message"
        if pod and not stuck:
            # The controller keeps a pod's last warning event as its Error until the pod is
            # Ready: the scheduler's FailedScheduling outlives the wait for a GPU, a slow mount
            # its retry. A pod whose containers are not stuck is still on its way.
            return ""
        return f"The Workspace is in Error: {said}" + (f"; {stuck}" if stuck else "") + "."
    if stuck:
        return f"The pod {(pod.get('metadata') or {}).get('name')} cannot start: {stuck}."
    return ""


def pausing_message(annotations: dict[str, str], recorded: dict[str, Any]) -> str:
    """A pause asked and not done yet: who holds it, since when, what was saved so far."""
    text = "Pausing"
    if annotations.get(CHECKPOINT_STATE) == CHECKPOINTING:
        since = epoch(annotations.get(CHECKPOINT_STARTED_AT))
        text = "The GKE Workspaces add-on holds the pause while it takes a pod snapshot" + (
            f" (since {format_time(since)})" if since else ""
        )
    if recorded.get("state") == "paused":
        text += f"; {format_bytes(recorded.get('bytes') or 0)} saved by jupyter_pause"
    return text + "."


def paused_message(recorded: dict[str, Any]) -> str:
    if recorded.get("state") != "paused":
        return "Paused (not by jupyter_pause: nothing is recorded about it)."
    snapshot = recorded.get("snapshot")
    origin = {"platform": "by the platform (SIGTERM)", "outside": "from outside jupyter_pause"}.get(
        recorded.get("origin") or "", ""
    )
    detail = (
        f"pod snapshot {snapshot}"
        if snapshot
        else (recorded.get("snapshot_problem") or "no pod snapshot")
    )
    return (
        f"Paused {origin + ' ' if origin else ''}since {format_time(recorded.get('paused_at'))}"
        f" ({format_bytes(recorded.get('bytes') or 0)} saved; {detail})."
    )


def restored_message(recorded: dict[str, Any]) -> str:
    state = recorded.get("state")
    if state == "restoring":
        return "The server restores the notebooks."
    notebooks = recorded.get("notebooks") or {}
    how = "live" if recorded.get("how") == "live" else "from files"
    counts = ", ".join(f"{path}: {s}" for path, s in sorted(notebooks.items())) or "no notebook"
    return f"Restored {how} ({counts}): {recorded.get('reason') or ''}".rstrip(": ")


def line(record: dict[str, Any]) -> str:
    text = f"{record['workspace']}: {record['state']} - {record['message']}"
    if record.get("waited_seconds") is not None:
        text += f" (waited {format_duration(record['waited_seconds'])})"
    return text


def details(record: dict[str, Any]) -> list[str]:
    """The lines ``status --workspace`` adds: the controller's state, the pause mode."""
    lines = []
    if record.get("workspace_state"):
        said = record.get("workspace_message")
        lines.append(
            f"  Workspace state: {record['workspace_state']}" + (f" ({said})" if said else "")
        )
    if record.get("mode"):
        why = record.get("mode_reason")
        lines.append(f"  Pause mode: {record['mode']}" + (f" ({why})" if why else ""))
    return lines


class Follower:
    """Prints each new state on stderr; a waiting line again every few seconds (its time)."""

    REPEAT_SECONDS = 5.0

    def __init__(self) -> None:
        self.last: tuple[str, str] = ("", "")
        self.printed = 0.0

    def show(self, record: dict[str, Any]) -> None:
        key = (record["state"], record["message"])
        if key == self.last and time.monotonic() - self.printed < self.REPEAT_SECONDS:
            return
        print(line(record), file=sys.stderr, flush=True)
        self.last, self.printed = key, time.monotonic()


def run(args: argparse.Namespace) -> int:
    """``status`` or ``resume`` with ``--workspace``; KubeErrors become exit codes."""
    kube, namespace, name = connect(args)
    try:
        if args.command == "status":
            record = view(kube, namespace, name)
            if args.json:
                print_json(record)
            else:
                print("\n".join([line(record), *details(record)]))
            return EXIT_OK
        return resume(kube, namespace, name, args)
    except KubeError as err:
        raise CliError(str(err), KUBE_EXIT_CODES.get(err.kind, EXIT_FAILED)) from None
    finally:
        kube.close()


def resume(kube: Kube, namespace: str, name: str, args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = None if args.timeout is None else started + args.timeout
    follower = Follower()
    record = view(kube, namespace, name)
    while record["state"] == "pausing":  # a pause in flight: resumed once it is done
        follower.show(record)
        wait_or_give_up(record, deadline, args)
        record = view(kube, namespace, name)
    if record["paused"]:
        kube.patch_workspace(namespace, name, {"spec": {"paused": False}})
    elif record["state"] == "error":
        return stuck(record, args)
    elif record["state"] in (*DONE, "running"):
        if not args.json:
            print(f"{record['workspace']} is running: {record['message']}")
        else:
            print_json(record)
        return EXIT_OK if record["state"] in ("ready", "running") else EXIT_FAILED
    # else: a resume is in flight (someone else's): join it
    while True:
        record = view(kube, namespace, name)
        follower.show(record)
        if record["state"] in DONE:
            break
        if record["state"] == "error":  # no waiting ends it: say so now, not at the timeout
            return stuck(record, args)
        wait_or_give_up(record, deadline, args)
    if args.json:
        print_json(record)
    else:
        took = format_duration(time.monotonic() - started)
        print(f"Resumed {record['workspace']} in {took}: {record['message']}")
    return EXIT_OK if record["state"] == "ready" else EXIT_FAILED


def wait_or_give_up(
    record: dict[str, Any], deadline: float | None, args: argparse.Namespace
) -> None:
    """Sleep until the next look, or end the command past ``--timeout`` (it carries on)."""
    if deadline is not None and time.monotonic() > deadline:
        raise CliError(
            f"Timed out after {args.timeout:g} s: {record['workspace']} is "
            f"{record['state']} ({record['message']}); it carries on",
            EXIT_TIMEOUT,
        )
    time.sleep(POLL_SECONDS)


def stuck(record: dict[str, Any], args: argparse.Namespace) -> int:
    """A resume that cannot finish (the Workspace is in Error): what is wrong, exit 1."""
    if args.json:
        print_json(record)
        return EXIT_FAILED
    namespace, _, name = record["workspace"].partition("/")
    look = (
        f"kubectl describe pod -n {namespace} {record['pod']}"
        if record["pod"]
        else f"kubectl describe workspace -n {namespace} {name}"
    )
    raise CliError(
        f"{record['workspace']} cannot resume: {record['message']} Waiting would not end it: "
        f"fix the cause ({look}), then resume again, or pause the Workspace.",
        EXIT_FAILED,
    )
