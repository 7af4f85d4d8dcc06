"""What the last pause of a whole environment did: ``environment.json``, and how to read it.

The file lies beside the notebooks' folders in the store (the home volume, which outlives the
pod). A pause writes it before the pod snapshot is taken, so that a copy restored from the
snapshot finds it; a new server process reads it to tell a live restore from a cold start,
and ``cold_start_reason`` says in words why it was not live. The same state is what the
Workspace's annotation carries (``jupyter pause status --workspace`` reads it there).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from ..backends.base import EnvironmentFacts, SnapshotOutcome
from ..kernel import store as store_mod
from ..records import SessionRecord

log = logging.getLogger(__name__)

#: What the last pause of the environment did, beside the notebooks' folders in the store.
ENVIRONMENT_FILE = "environment.json"
#: The origin of a pause asked outside jupyter_pause (the dashboard, kubectl, a culler).
OUTSIDE = "outside"


def pause_state(
    token: str,
    running: list[SessionRecord],
    reason: str,
    origin: str,
    instance: str,
    outcome: SnapshotOutcome,
    pause_id: str,
    at: float,
) -> dict[str, Any]:
    """What ``environment.json`` (and the Workspace's annotation) say about a pause made by
    the server process whose in-memory ``token`` this is."""
    return {
        "state": "paused",
        "pause_id": pause_id,
        "origin": origin,
        "reason": reason,
        "server_token": token,
        "instance": instance,
        "mode": outcome.mode,
        "mode_reason": outcome.mode_reason,
        "snapshot": outcome.name,
        "snapshot_problem": outcome.problem,
        "snapshot_seconds": round(outcome.seconds, 3),
        "notebooks": [r.path for r in running],
        "bytes": sum(int((r.checkpoint or {}).get("bytes", 0)) for r in running),
        "paused_at": at,
    }


def cold_start_reason(disk: dict[str, Any], facts: EnvironmentFacts | None, error: str = "") -> str:
    """Why a new server process restores from files: what the pause and the pod tell."""
    if disk.get("state") != "paused":
        return (
            "the server stopped without a pause (its pod was deleted or its node lost); "
            "the last checkpoints were restored"
        )
    if disk.get("origin") == "platform":
        return (
            "the platform stopped the pod (SIGTERM: an idle pause, a node drain or an upgrade) "
            "after every notebook was checkpointed; no pod snapshot is taken then"
        )
    why = _snapshot_reason(disk, facts, error)
    if disk.get("origin") == OUTSIDE:
        when = time.strftime("%H:%M", time.localtime(float(disk.get("paused_at") or 0)))
        return (
            f"the workspace was paused from outside jupyter_pause at {when} (the dashboard, "
            f"kubectl or a culler); {why}"
        )
    return why


def _snapshot_reason(disk: dict[str, Any], facts: EnvironmentFacts | None, error: str) -> str:
    """Why a pod snapshot taken at (or missing from) a pause did not bring the process back."""
    # The pod's pin names the snapshot where the pause could not write it down: a platform
    # that stops the pod right after its snapshot (the GKE Workspaces add-on) stopped this
    # server before it knew the snapshot's name.
    snapshot = disk.get("snapshot") or (facts.pinned_snapshot if facts else None)
    if not snapshot:
        return f"no pod snapshot was taken at the pause ({disk.get('snapshot_problem') or 'none'})"
    if facts is None:
        return f"the pod could not be inspected ({error}), so snapshot {snapshot} is not trusted"
    if facts.restored is None:
        return f"the pod started fresh: snapshot {snapshot} was not restored"
    if facts.restored is False:
        return f"restoring snapshot {snapshot} failed ({facts.restored_message or 'PodRestored=False'})"
    return (
        f"snapshot {snapshot} did not match this pod: the pod says it was restored, but the "
        "process that paused is not the one running"
    )


class EnvironmentFile:
    """``environment.json``: read and written off the event loop; unreadable means no pause."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.warning("jupyter_pause: %s is unreadable (%s); treated as no pause", self.path, err)
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        store_mod.write_file_atomically(self.path, json.dumps(state, sort_keys=True).encode())

    async def read(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._read)

    async def write(self, state: dict[str, Any]) -> None:
        await asyncio.to_thread(self._write, state)
