"""The jupyterhub backend: a JupyterHub single-user server, given back to the Hub at a pause.

Under JupyterHub (KubeSpawner's pod per user, LocalProcessSpawner or SystemdSpawner on one
machine) the server and its kernels hold the GPU until the Hub stops the server. A pause of
any notebook pauses the whole server: the orchestrator checkpoints every kernel to the user's
storage, then this backend asks the Hub to stop this very server with the server's own token
(``DELETE /hub/api/users/{name}/server``, or ``/servers/{name}`` for a named server), and the
spawner frees the pod, the process and the GPU. JupyterHub keeps no memory snapshot: the next
spawn is a new process, and each paused notebook is restored from its checkpoint when the
user resumes it (``restores_at_start`` False: a spawn is a login, not a resume).

The token may stop its own server only when the admin grants ``delete:servers!server``
(``c.Spawner.server_token_scopes``, JupyterHub >= 4). The scopes are read once when the
server starts (``token_scopes``): without that scope the extension runs as ``local`` does and
says what the admin must add (``app.py``).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient

from .base import (
    BackendError,
    EnvironmentBackend,
    EnvironmentFacts,
    PhaseCallback,
    ResourceStatus,
    SnapshotInfo,
    SnapshotOutcome,
)
from .kernels import ServerKernels
from .local import LocalBackend

#: The environment of every JupyterHub single-user server (what ``auto`` looks for).
HUB_ENVIRONMENT = ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_USER")
#: The scope a server's token needs to stop its own server, as the admin grants it.
STOP_SCOPE = "delete:servers!server"
#: The admin's line, in the words of the Hub's configuration (JupyterHub >= 4).
SCOPE_SNIPPET = (
    'c.Spawner.server_token_scopes = ["access:servers!server", "users:activity!user", '
    f'"{STOP_SCOPE}", "read:servers!server"]'
)
#: How long a stop request waits for the Hub's answer (s).
STOP_ANSWER_SECONDS = 60.0
#: How a pause is taken here: no memory snapshot, the checkpoints only.
HUB_MODE = "jupyterhub"
NO_SNAPSHOT = "JupyterHub keeps no memory snapshot: the session comes back from its checkpoints"


def detect(environ: dict[str, str]) -> bool:
    """Whether this server was spawned by a JupyterHub (auto-detection)."""
    return all(environ.get(name) for name in HUB_ENVIRONMENT)


@dataclass(frozen=True)
class HubSettings:
    """Who this server is to the Hub, from the environment the spawner gave it."""

    api_url: str  # e.g. http://hub:8081/hub/api
    token: str
    user: str
    server_name: str = ""  # "" for the default server
    timeout_seconds: float = 10.0

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> HubSettings:
        missing = [name for name in HUB_ENVIRONMENT if not environ.get(name)]
        if missing:
            raise BackendError(
                f"the jupyterhub backend needs {', '.join(missing)}: this server was not "
                "spawned by a JupyterHub"
            )
        return cls(
            environ["JUPYTERHUB_API_URL"].rstrip("/"),
            environ["JUPYTERHUB_API_TOKEN"],
            environ["JUPYTERHUB_USER"],
            environ.get("JUPYTERHUB_SERVER_NAME", ""),
        )

    @property
    def server_path(self) -> str:
        """This server in the Hub's REST API."""
        user = urllib.parse.quote(self.user, safe="")
        if not self.server_name:
            return f"/users/{user}/server"
        return f"/users/{user}/servers/{urllib.parse.quote(self.server_name, safe='')}"

    @property
    def server_label(self) -> str:
        """This server as the Hub's scopes and pages name it (user/name)."""
        return f"{self.user}/{self.server_name}"


def _answer(status: int, raw: bytes) -> tuple[int, Any]:
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:  # a proxy's error page
        return status, None


def hub_request(settings: HubSettings, method: str, path: str) -> tuple[int, Any]:
    """One call to the Hub's REST API with the server's token, blocking (at the server's
    start). Returns (status, JSON body or None); BackendError when the Hub cannot be reached."""
    request = urllib.request.Request(
        settings.api_url + path,
        method=method,
        headers={"Authorization": f"token {settings.token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.timeout_seconds) as answer:
            return _answer(answer.status, answer.read())
    except urllib.error.HTTPError as err:
        return _answer(err.code, err.read())
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise BackendError(f"the Hub cannot be reached at {settings.api_url} ({reason})") from None


async def hub_request_async(
    settings: HubSettings, method: str, path: str, timeout: float | None = None
) -> tuple[int, Any]:
    """``hub_request`` on the event loop. No worker thread: a stop request is answered only
    once this very process has ended, and a thread waiting for it would hold the exit."""
    client = AsyncHTTPClient()
    try:
        answer = await client.fetch(
            settings.api_url + path,
            method=method,
            headers={"Authorization": f"token {settings.token}"},
            allow_nonstandard_methods=True,
            request_timeout=timeout or settings.timeout_seconds,
            raise_error=False,
        )
    except OSError as err:
        raise BackendError(f"the Hub cannot be reached at {settings.api_url} ({err})") from None
    if answer.code == 599:  # tornado's word for no answer (timeout, connection refused)
        raise BackendError(f"the Hub cannot be reached at {settings.api_url} ({answer.error})")
    return _answer(answer.code, answer.body or b"")


def can_stop_own_server(scopes: list[str], settings: HubSettings) -> bool:
    """Whether these (expanded) token scopes let the token stop this server."""
    granted = {
        "delete:servers",
        f"delete:servers!user={settings.user}",
        f"delete:servers!server={settings.server_label}",
    }
    return any(scope in granted for scope in scopes)


def token_model(settings: HubSettings) -> dict[str, Any]:
    """What the Hub says of this server's token (``GET /user``): its expanded ``scopes``, and
    with ``read:servers!server`` this server's model; BackendError when the Hub cannot say."""
    status, model = hub_request(settings, "GET", "/user")
    if status != 200 or not isinstance(model, dict):
        raise BackendError(f"the Hub did not say what this server's token may do (HTTP {status})")
    return model


def token_scopes(model: dict[str, Any]) -> list[str]:
    return [str(scope) for scope in model.get("scopes") or []]


def start_requested_at(model: dict[str, Any], settings: HubSettings) -> float | None:
    """When the Hub began this server's spawn (its ``started``), where the token may read
    its own server (``read:servers!server``); None where it may not."""
    server = (model.get("servers") or {}).get(settings.server_name)
    started = (server or {}).get("started") if isinstance(server, dict) else None
    if not isinstance(started, str):
        return None
    try:
        return datetime.datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def missing_scope_problem(settings: HubSettings) -> str:
    """What the chip and the status say when the token may not stop its own server."""
    return (
        f"this server's JupyterHub token may not stop its own server ({STOP_SCOPE} is not "
        "granted), so a pause stops the notebook's kernel but the server, and its GPU, stay "
        "held until the Hub stops it (its idle culler, an admin). The admin adds the scope in "
        f"the Hub's configuration: {SCOPE_SNIPPET}"
    )


class HubBackend(ServerKernels, EnvironmentBackend):
    """Kernels beside this server; a pause gives the whole server back to the Hub."""

    name = "jupyterhub"
    noun = "server"
    restores_at_start = False
    stopper = "the Hub stopped this server (its idle culler, an admin, or the user's Stop)"
    ends_before_answering = True

    def __init__(
        self,
        kernel_manager: Any,
        session_manager: Any,
        settings: HubSettings,
        gpus: int,
        start_requested_at: float | None = None,
    ) -> None:
        super().__init__(kernel_manager, session_manager, gpus)
        self.settings = settings
        self.started_at = time.time()
        self.start_requested_at = start_requested_at

    def describe_resources(self) -> ResourceStatus:
        return ResourceStatus(
            backend=self.name,
            gpus_total=self.gpus,
            gpus_free=0 if self.kernel_manager.list_kernel_ids() else self.gpus,
            queue=[],
            details={
                "user": self.settings.user,
                "server": self.settings.server_name,
                "hub": self.settings.api_url,
                "mode": HUB_MODE,
                "mode_reason": NO_SNAPSHOT,
                "problem": None,
            },
        )

    async def pause_mode(self) -> tuple[str, str]:
        return HUB_MODE, NO_SNAPSHOT

    async def snapshot_environment(
        self, on_phase: PhaseCallback, ask: bool = True, paused_in: str = ""
    ) -> SnapshotOutcome:
        return SnapshotOutcome(None, NO_SNAPSHOT, mode=HUB_MODE, mode_reason=NO_SNAPSHOT)

    async def stop_environment(self, state: dict[str, Any]) -> None:
        """Ask the Hub to stop this server. The Hub answers once the spawner has stopped it
        (or after its slow_stop_timeout): this process is usually ended before the answer
        comes, which the orchestrator expects (the pause is recorded before the request)."""
        # The Hub answers after the spawner's stop (KubeSpawner: the pod deleted) or its
        # slow_stop_timeout (10 s by default): wait well past that.
        status, body = await hub_request_async(
            self.settings, "DELETE", self.settings.server_path, timeout=STOP_ANSWER_SECONDS
        )
        if status in (202, 204):
            return
        if status == 403:
            raise BackendError(missing_scope_problem(self.settings))
        message = body.get("message") if isinstance(body, dict) else None
        raise BackendError(
            f"the Hub refused to stop this server (HTTP {status}: {message or 'no reason given'})"
        )

    async def environment_facts(self) -> EnvironmentFacts:
        # Every spawn is a new process: this one is its own instance, never restored live.
        return EnvironmentFacts(
            instance=f"{self.settings.server_label}@{self.started_at}", restored=False
        )

    async def wait_until_moved(self, instance: str) -> EnvironmentFacts:
        """A stopped server never comes back as the same process: the spawner ends it."""
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def announce(self, state: dict[str, Any]) -> None:
        """The pause is recorded on the user's storage (``environment.json``) only."""

    async def list_snapshots(self) -> list[SnapshotInfo]:
        return []

    async def expire_snapshots(
        self, keep_last: int, max_age_hours: float, pinned: str | None
    ) -> list[str]:
        return []


class HubWithoutStop(LocalBackend):
    """Under a Hub whose token may not stop its own server: pauses as ``local`` does (each
    notebook's kernel stopped), and says what the admin must grant for the GPU to go back."""

    name = "jupyterhub"
    # The Hub's stop (its culler, an admin, the user's Stop) ends the server: every notebook
    # is paused first, its checkpoint on the user's storage, to resume on the next spawn.
    pauses_on_server_stop = True

    def __init__(
        self,
        kernel_manager: Any,
        session_manager: Any,
        gpu_count: int | None,
        settings: HubSettings,
        problem: str,
    ) -> None:
        super().__init__(kernel_manager, session_manager, gpu_count)
        self.settings = settings
        self.problem = problem

    def describe_resources(self) -> ResourceStatus:
        status = super().describe_resources()
        status.details.update(
            user=self.settings.user,
            server=self.settings.server_name,
            hub=self.settings.api_url,
            problem=self.problem,
            fallback="a pause stops the notebook's kernel only, as the local backend does",
        )
        return status
