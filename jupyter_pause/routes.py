"""REST handlers below ``/jupyter-pause/`` (thin HTTP glue over the orchestrator).

Every verb is authenticated and authorised like jupyter-server's own handlers; errors are
JSON ``{"message": ...}`` with 400 (bad input), 403, 404 (unknown notebook or checkpoint)
and 409 (busy, or conflicting with a pause/resume in flight).
"""

from __future__ import annotations

import posixpath
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler

from . import __version__
from .kernel import store as store_mod
from .orchestrator import Orchestrator, PauseError

#: URL namespace of the REST API, below the server's base URL.
API_PREFIX = "jupyter-pause"
#: Resource name checked by jupyter_server's authorizer for every handler here.
AUTH_RESOURCE = "jupyter_pause"
_PATH = r"(?P<path>.+)"


def clean_path(path: str) -> str:
    """A notebook path relative to the server root, or 400."""
    path = path.strip("/")
    normalized = posixpath.normpath(path) if path else ""
    if not normalized or normalized == "." or normalized.startswith("../") or normalized == "..":
        raise tornado.web.HTTPError(400, f"Not a notebook path inside the server root: {path!r}")
    return normalized


class PauseAPIHandler(APIHandler):
    """Base class: authorisation resource, the orchestrator, and PauseError -> HTTP status."""

    auth_resource = AUTH_RESOURCE

    @property
    def _track_activity(self) -> bool:  # type: ignore[override]
        """Reading state is not user activity: an open tab polling the status must never keep
        a GPU session "active" for idle cullers that read ``/api/status``'s last_activity."""
        return self.request.method not in ("GET", "HEAD")

    @property
    def orchestrator(self) -> Orchestrator:
        return self.settings["jupyter_pause_orchestrator"]

    async def run(self, coro: Any) -> Any:
        try:
            return await coro
        except PauseError as err:
            raise tornado.web.HTTPError(err.status, str(err)) from None


class StatusHandler(PauseAPIHandler):
    """``GET /jupyter-pause/status``: version, backend, accelerators, effective admin policy."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        resources = self.orchestrator.backend.describe_resources()
        self.finish(
            {
                "version": __version__,
                "backend": resources.backend,
                "resources": resources.to_json(),
                "policy": self.orchestrator.policy.to_json(),
            }
        )


class SessionsHandler(PauseAPIHandler):
    """``GET /jupyter-pause/sessions``: every notebook session jupyter_pause knows."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        await self.orchestrator.sync_sessions()
        self.finish({"sessions": [r.to_json() for r in self.orchestrator.list()]})


class SessionHandler(PauseAPIHandler):
    """``GET /jupyter-pause/sessions/<path>``: one session's state, progress and message."""

    @tornado.web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        record = await self.run(self.orchestrator.get(clean_path(path)))
        self.finish(record.to_json())


class CheckpointActionHandler(PauseAPIHandler):
    """``POST /jupyter-pause/checkpoint/<path>``: checkpoint now (200 with the result)."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        path = clean_path(path)
        result = await self.run(self.orchestrator.checkpoint(path))
        record = await self.run(self.orchestrator.get(path))
        self.finish({"result": result, "session": record.to_json()})


class PauseActionHandler(PauseAPIHandler):
    """``POST /jupyter-pause/pause/<path>``: start a pause (202; follow the session's state)."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        record = await self.run(self.orchestrator.pause(clean_path(path), reason="user"))
        self.set_status(202)
        self.finish(record.to_json())


class ResumeActionHandler(PauseAPIHandler):
    """``POST /jupyter-pause/resume/<path>``: start a resume, or join the one in flight (202)."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        record = await self.run(self.orchestrator.resume(clean_path(path)))
        self.set_status(202)
        self.finish(record.to_json())


class ActivityHandler(PauseAPIHandler):
    """``POST /jupyter-pause/activity/<path>``: the user edited the notebook (not idle)."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        try:
            self.orchestrator.note_user_activity(clean_path(path))
        except PauseError as err:
            raise tornado.web.HTTPError(err.status, str(err)) from None
        self.set_status(204)
        self.finish()


class CheckpointsHandler(PauseAPIHandler):
    """``GET /jupyter-pause/checkpoints/<path>``: the notebook's checkpoints, newest last."""

    @tornado.web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        path = clean_path(path)
        key = self.orchestrator.notebook_key(path)
        store = store_mod.NotebookStore(self.orchestrator.store_root, key)
        ids = store.checkpoint_ids()
        if not ids and path not in self.orchestrator.records:
            raise tornado.web.HTTPError(404, f"No session or checkpoints for {path!r}")
        checkpoints = []
        for checkpoint_id in ids:
            try:
                manifest = store.read_manifest(checkpoint_id)
            except store_mod.StoreError as err:
                checkpoints.append({"id": checkpoint_id, "damaged": str(err)})
                continue
            checkpoints.append(
                {
                    "id": checkpoint_id,
                    "created": manifest["created"],
                    "reason": manifest.get("reason"),
                    "bytes": store_mod.manifest_bytes(manifest),
                    "variables": store_mod.manifest_variables(manifest),
                    "skipped": manifest["skipped"],
                }
            )
        torn = [vars(t) for t in store.torn_history()] if store.exists() else []
        self.finish({"path": path, "checkpoints": checkpoints, "interrupted": torn})


class TimelineHandler(PauseAPIHandler):
    """``GET /jupyter-pause/timeline/<path>``: events and GPU-seconds of every pause/resume."""

    @tornado.web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        record = await self.run(self.orchestrator.get(clean_path(path)))
        self.finish(self.orchestrator.timeline(record))


class GCHandler(PauseAPIHandler):
    """``POST /jupyter-pause/gc``: apply the admin's retention to every notebook's checkpoints."""

    _track_activity = False  # maintenance, not anybody's work in a notebook

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        self.finish(self.orchestrator.gc())


def handlers() -> list[tuple[str, type[PauseAPIHandler]]]:
    base = f"/{API_PREFIX}"
    return [
        (f"{base}/status", StatusHandler),
        (f"{base}/sessions", SessionsHandler),
        (f"{base}/sessions/{_PATH}", SessionHandler),
        (f"{base}/checkpoint/{_PATH}", CheckpointActionHandler),
        (f"{base}/pause/{_PATH}", PauseActionHandler),
        (f"{base}/resume/{_PATH}", ResumeActionHandler),
        (f"{base}/activity/{_PATH}", ActivityHandler),
        (f"{base}/checkpoints/{_PATH}", CheckpointsHandler),
        (f"{base}/timeline/{_PATH}", TimelineHandler),
        (f"{base}/gc", GCHandler),
    ]
