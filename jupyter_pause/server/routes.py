"""REST handlers below ``/jupyter-pause/`` (thin HTTP glue over the orchestrator).

Every verb is authenticated and authorised like jupyter-server's own handlers; errors are
JSON ``{"message": ...}`` with 400 (bad input), 403, 404 (unknown notebook or checkpoint)
and 409 (busy, conflicting with a pause/resume in flight, or a store that cannot be used).
``openapi.json`` (served at ``/jupyter-pause/openapi.json``) is the contract. Answers carry
paths relative to the server root, and ``<store>/...`` for files of the checkpoint store:
never the server's absolute paths.
"""

from __future__ import annotations

import asyncio
import json
import os
import posixpath
from functools import cache
from http.client import responses
from pathlib import Path
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from ..contract import openapi_document
from ..kernel import store as store_mod
from ..version import __version__
from . import transfer
from .orchestrator import Orchestrator
from .states import RUNNING_STATES, PauseError

#: URL namespace of the REST API, below the server's base URL.
API_PREFIX = "jupyter-pause"
#: Resource name checked by jupyter_server's authorizer for every handler here.
AUTH_RESOURCE = "jupyter_pause"
_PATH = r"(?P<path>.+)"
#: Largest session file an import takes (1 TiB: a checkpoint of a large model and more).
MAX_IMPORT_BYTES = 2**40
CHUNK = 2**20


def clean_path(path: str) -> str:
    """A notebook path relative to the server root, or 400."""
    path = path.strip("/")
    normalized = posixpath.normpath(path) if path else ""
    if not normalized or normalized == "." or normalized.startswith("../") or normalized == "..":
        raise tornado.web.HTTPError(400, f"Not a notebook path inside the server root: {path!r}")
    if "\x00" in normalized:  # no file system takes it
        raise tornado.web.HTTPError(400, f"Not a notebook path (a NUL character): {path!r}")
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
        """Await the orchestrator; what it refuses, or a store it cannot use, is a 4xx."""
        try:
            return await coro
        except PauseError as err:
            raise tornado.web.HTTPError(err.status, str(err)) from None
        except (store_mod.StoreError, OSError) as err:
            raise tornado.web.HTTPError(
                409, f"The checkpoint store cannot be used: {err}"
            ) from None

    def finish(self, chunk: Any = None, **kwargs: Any) -> Any:
        if isinstance(chunk, dict):
            chunk = relative_paths(chunk, self._path_prefixes())
        return super().finish(chunk, **kwargs)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """``{"message": ...}`` like jupyter-server's API errors, without absolute paths."""
        error = (kwargs.get("exc_info") or (None, None, None))[1]
        message = responses.get(status_code, "Unknown HTTP Error")
        if isinstance(error, tornado.web.HTTPError) and error.log_message:
            message = error.log_message % error.args  # tornado doubled each % to log it
        elif error is not None:
            message = "Unhandled error"
        self.log.warning("wrote error: %r", message)
        self.finish({"message": message, "reason": getattr(error, "reason", None)})

    def _path_prefixes(self) -> list[tuple[str, str]]:
        orchestrator = self.settings.get("jupyter_pause_orchestrator")
        if orchestrator is None:
            return []
        return path_prefixes(str(orchestrator.store_root), orchestrator.root_dir)


@cache
def path_prefixes(store_root: str, root_dir: str) -> list[tuple[str, str]]:
    """(absolute prefix, what it becomes in an answer), longest first."""
    pairs = []
    for resolve in (os.path.abspath, os.path.realpath):
        pairs.append((resolve(store_root).rstrip(os.sep), "<store>"))
        pairs.append((resolve(root_dir).rstrip(os.sep) + os.sep, ""))
    return sorted(set(pairs), key=lambda pair: -len(pair[0]))


def relative_paths(value: Any, prefixes: list[tuple[str, str]]) -> Any:
    """``value`` with the server's absolute paths cut to the root / the store in every string."""
    if isinstance(value, str):
        for prefix, replacement in prefixes:
            if prefix and prefix != os.sep:
                value = value.replace(prefix, replacement)
        return value
    if isinstance(value, dict):
        return {relative_paths(k, prefixes): relative_paths(v, prefixes) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [relative_paths(v, prefixes) for v in value]
    return value


class OpenAPIHandler(PauseAPIHandler):
    """``GET /jupyter-pause/openapi.json``: the OpenAPI 3 description of this API."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        document = dict(openapi_document())
        document["servers"] = [{"url": url_path_join(self.base_url, "/").rstrip("/") or "/"}]
        self.finish(document)


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
                "restores_on_cpu": self.orchestrator.backend.restores_on_cpu,
                "resources": resources.to_json(),
                "policy": self.orchestrator.policy.to_json(),
                "problems": list(self.orchestrator.problems),
                "held_by_maps": await self.orchestrator.held_by_maps(),
            }
        )


class SessionsHandler(PauseAPIHandler):
    """``GET /jupyter-pause/sessions``: every notebook session jupyter_pause knows."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        await self.run(self.orchestrator.sync_sessions())
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


class ExportHandler(PauseAPIHandler):
    """``GET /jupyter-pause/export/<path>``: the session file of the notebook's latest good
    checkpoint (a running session is checkpointed first), streamed as a download with its
    exact length: a thread writes the tar into a small queue this handler sends from, so
    neither memory nor the disk holds a copy."""

    @tornado.web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        path = clean_path(path)
        orchestrator = self.orchestrator
        record = await self.run(orchestrator.get(path))
        if record.state in RUNNING_STATES and record.kernel_id is not None:
            await self.run(orchestrator.checkpoint(path))
        notebook_file = Path(orchestrator.sessions.notebook_key(path))
        export = await self.run(
            asyncio.to_thread(
                transfer.prepare_export, orchestrator.sessions, record, notebook_file, path
            )
        )
        chunks = transfer.ChunkQueue()
        writer = asyncio.get_running_loop().run_in_executor(None, chunks.fill, export)
        try:
            self.set_header("Content-Type", "application/x-tar")
            self.set_header("Content-Length", str(export.size))
            self.set_header("Content-Disposition", f'attachment; filename="{export.name}"')
            self.set_header("X-Checkpoint-Id", str(export.index.checkpoint_id))
            while (chunk := await asyncio.to_thread(chunks.get)) is not None:
                self.write(chunk)
                await self.flush()
            await super(PauseAPIHandler, self).finish()
        finally:
            chunks.cancel()  # a download broken off: the writer stops at its next chunk
            await writer
            export.close()


@tornado.web.stream_request_body
class ImportHandler(PauseAPIHandler):
    """``POST /jupyter-pause/import/<path>``: a session file in the body becomes notebook
    ``<path>``, paused and untrusted (201). The user and the path are checked before a byte of
    the body is taken; the body is read and checked by a thread as it arrives (into a staging
    folder of the store), never held in memory nor copied whole first."""

    async def prepare(self) -> None:
        await super().prepare()
        if not self.current_user:
            raise tornado.web.HTTPError(403)
        if not self.authorizer.is_authorized(self, self.current_user, "write", AUTH_RESOURCE):
            raise tornado.web.HTTPError(403, "Not authorised to import sessions")
        path = clean_path(self.path_kwargs["path"])
        sessions = self.orchestrator.sessions
        await self.run(
            asyncio.to_thread(
                transfer.require_new, sessions, path, Path(sessions.notebook_key(path))
            )
        )
        self.request.connection.set_max_body_size(MAX_IMPORT_BYTES)
        self._body = transfer.ChunkReader()
        loop = asyncio.get_running_loop()
        self._staging = loop.run_in_executor(None, self._stage, sessions)

    def _stage(self, sessions: Any) -> Any:
        try:
            return transfer.stage(sessions, self._body)
        finally:
            self._body.close()  # refused early: the rest of the body is dropped, not waited on

    async def data_received(self, chunk: bytes) -> None:
        await asyncio.to_thread(self._body.put, chunk)

    def on_connection_close(self) -> None:
        body = getattr(self, "_body", None)
        if body is not None:  # the upload broken off: the reader sees a truncated file
            body.break_off()
        super().on_connection_close()

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        path = clean_path(path)
        sessions = self.orchestrator.sessions
        await asyncio.to_thread(self._body.put, None)
        staged = await self.run(self._staging)
        record, differs = await self.run(
            asyncio.to_thread(
                transfer.place_import, sessions, staged, path, Path(sessions.notebook_key(path))
            )
        )
        self.set_status(201)
        self.finish({"session": record.to_json(), "differences": differs})


class TrustHandler(PauseAPIHandler):
    """``POST /jupyter-pause/trust/<path>``: the user trusts an imported session; its resume
    may now unpickle it."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        orchestrator = self.orchestrator
        record = await self.run(orchestrator.get(clean_path(path)))
        record = await self.run(
            asyncio.to_thread(transfer.trust_session, orchestrator.sessions, record)
        )
        self.finish(record.to_json())


class PauseActionHandler(PauseAPIHandler):
    """``POST /jupyter-pause/pause/<path>``: start a pause (202; follow the session's state)."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        record = await self.run(self.orchestrator.pause(clean_path(path), reason="user"))
        self.set_status(202)
        self.finish(record.to_json())


class ResumeActionHandler(PauseAPIHandler):
    """``POST /jupyter-pause/resume/<path>``: start a resume, or join the one in flight (202).
    The body may say ``{"accelerators": "none"}``: restore from files on CPU now, giving up the
    place of a resume that waits for a GPU."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        on_cpu = resume_on_cpu(self.request.body)
        record = await self.run(self.orchestrator.resume(clean_path(path), on_cpu))
        self.set_status(202)
        self.finish(record.to_json())


def resume_on_cpu(body: bytes) -> bool:
    """Whether a resume's body asks for no accelerators; a 400 saying what is accepted for any
    other body than none, ``{}`` or ``{"accelerators": "default" | "none"}``."""
    if not body.strip():
        return False
    try:
        options = json.loads(body)
    except ValueError:
        options = None
    if not isinstance(options, dict) or set(options) - {"accelerators"}:
        raise tornado.web.HTTPError(
            400, 'A resume\'s body is {} or {"accelerators": "none"} (restore on CPU now)'
        )
    accelerators = options.get("accelerators", "default")
    if accelerators not in ("default", "none"):
        raise tornado.web.HTTPError(
            400, f'"accelerators" is "default" or "none" (restore on CPU now), not {accelerators!r}'
        )
    return accelerators == "none"


class CancelHandler(PauseAPIHandler):
    """``POST /jupyter-pause/cancel/<path>``: cancel a resume that waits for resources (200);
    the session stays paused."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        record = await self.run(self.orchestrator.cancel(clean_path(path)))
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


class AcceptHandler(PauseAPIHandler):
    """``POST /jupyter-pause/accept/<path>``: carry on after an incomplete restore (200)."""

    @tornado.web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        record = await self.run(self.orchestrator.accept(clean_path(path)))
        self.finish(record.to_json())


class CheckpointsHandler(PauseAPIHandler):
    """``GET /jupyter-pause/checkpoints/<path>``: the notebook's checkpoints, newest last."""

    @tornado.web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        self.finish(await self.run(self.orchestrator.checkpoints(clean_path(path))))


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
        self.finish(await self.run(self.orchestrator.gc()))


class UsageHandler(PauseAPIHandler):
    """``GET /jupyter-pause/usage``: every notebook's timeline and storage, and the admin's
    prices (what ``jupyter pause report`` and ``jupyter pause drill`` read)."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        from ..usage import sources  # the report's code: loaded when first asked for

        await self.run(self.orchestrator.sync_sessions())
        prices = self.settings.get("jupyter_pause_prices") or {}
        listing = await self.run(sources.server_listing(self.orchestrator, prices))
        self.finish(listing)


class SnapshotsHandler(PauseAPIHandler):
    """``GET /jupyter-pause/snapshots``: the pod snapshots this workspace made, if any."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(await self.run(self.orchestrator.snapshots()))


class NotFoundHandler(PauseAPIHandler):
    """Any other URL below ``/jupyter-pause/``: a JSON 404 naming what exists."""

    async def prepare(self) -> None:
        await super().prepare()
        if not self.current_user:
            raise tornado.web.HTTPError(403)
        raise tornado.web.HTTPError(
            404,
            f"No jupyter_pause endpoint {self.request.path!r} (jupyter_pause {__version__}): "
            "see /jupyter-pause/openapi.json",
        )


def handlers() -> list[tuple[str, type[PauseAPIHandler]]]:
    base = f"/{API_PREFIX}"
    return [
        (f"{base}/status", StatusHandler),
        (f"{base}/sessions", SessionsHandler),
        (f"{base}/sessions/{_PATH}", SessionHandler),
        (f"{base}/checkpoint/{_PATH}", CheckpointActionHandler),
        (f"{base}/pause/{_PATH}", PauseActionHandler),
        (f"{base}/export/{_PATH}", ExportHandler),
        (f"{base}/import/{_PATH}", ImportHandler),
        (f"{base}/trust/{_PATH}", TrustHandler),
        (f"{base}/resume/{_PATH}", ResumeActionHandler),
        (f"{base}/cancel/{_PATH}", CancelHandler),
        (f"{base}/activity/{_PATH}", ActivityHandler),
        (f"{base}/accept/{_PATH}", AcceptHandler),
        (f"{base}/checkpoints/{_PATH}", CheckpointsHandler),
        (f"{base}/timeline/{_PATH}", TimelineHandler),
        (f"{base}/gc", GCHandler),
        (f"{base}/usage", UsageHandler),
        (f"{base}/snapshots", SnapshotsHandler),
        (f"{base}/openapi.json", OpenAPIHandler),
        (f"{base}(/.*)?", NotFoundHandler),
    ]
