"""The bottom of ``jupyter pause``: finding the server, its REST API, and the exit codes.

It uses only the standard library for HTTP (no tornado, no server imports) so that every
command starts fast and works from any shell, e.g. a login node where only the notebook's
files are visible. The server is found from its runtime files like ``jupyter server list``
does, or given with --url/--token. Every command module imports this one; it imports none.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_SERVER = 3
EXIT_UNKNOWN = 4
EXIT_CONFLICT = 5
EXIT_FORBIDDEN = 6
EXIT_TIMEOUT = 7
EXIT_INTERRUPTED = 130
#: What a shell reports for a program ended by SIGPIPE (`jupyter pause timeline | head -1`).
EXIT_BROKEN_PIPE = 141

#: HTTP statuses of the REST API and the exit codes they become.
HTTP_EXIT_CODES = {400: EXIT_USAGE, 403: EXIT_FORBIDDEN, 404: EXIT_UNKNOWN, 409: EXIT_CONFLICT}

API_PREFIX = "jupyter-pause"
#: How often a waiting pause/resume asks for the session state (the server updates progress
#: about every 0.25 s, so polling faster only costs requests).
POLL_SECONDS = 0.25
#: Requests that only read state must answer quickly; a checkpoint may legitimately take long.
READ_TIMEOUT_SECONDS = 60.0
#: States during which a pause or a resume is still in flight.
PAUSE_IN_FLIGHT = ("checkpointing", "pausing")
RESUME_IN_FLIGHT = ("resuming", "waiting-for-resources", "restoring")


class CliError(Exception):
    """A failure to report as one line on stderr, with the process exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ServerInfo:
    """Where the server is, how to authenticate, and its root (None when unknown)."""

    url: str
    token: str
    root_dir: str | None = None


def running_servers() -> list[dict[str, Any]]:
    """The servers of this user's runtime files, like ``jupyter server list``.

    Read here rather than through ``jupyter_server.serverapp.list_running_servers``: importing
    the server takes seconds, and a command typed in a loop must answer at once.
    """
    folder = runtime_dir()
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    servers = []
    for name in names:
        if not (name.startswith("jpserver-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                info = json.load(handle)
        except (OSError, ValueError):
            continue  # a file being written, or not one of a server's
        if isinstance(info, dict) and info.get("url") and _alive(info.get("pid")):
            servers.append(info)
    return servers


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # someone else's process, but alive
        return True
    except OSError:
        return False
    return True


def runtime_dir() -> str:
    """Where Jupyter servers write their runtime files (``jupyter --runtime-dir``)."""
    from jupyter_core.paths import jupyter_runtime_dir  # light, unlike jupyter_server

    return jupyter_runtime_dir()


def inside(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` as a server path, or None when it lies outside."""
    # abspath first (what the user typed), realpath second (a root reached via a symlink).
    for resolve in (os.path.abspath, os.path.realpath):
        try:
            rel = os.path.relpath(resolve(path), resolve(root))
        except ValueError:  # another drive (Windows)
            continue
        if rel != "." and rel != ".." and not rel.startswith(".." + os.sep):
            return rel.replace(os.sep, "/")
    return None


def contains(info: dict[str, Any], notebook: str) -> int:
    """How well a server's root matches a notebook: longer (deeper) roots win; -1: no match."""
    root = info.get("root_dir") or ""
    if not root:
        return -1
    if (os.path.isabs(notebook) or os.path.exists(notebook)) and inside(notebook, root):
        return len(os.path.abspath(root))  # nested roots: the innermost one serves it
    if not os.path.isabs(notebook) and os.path.exists(os.path.join(root, notebook)):
        return 0
    return -1


def pick_server(servers: list[dict[str, Any]], notebook: str | None) -> dict[str, Any]:
    """The server whose root contains the notebook, else the first one listed."""
    if notebook is not None:
        best = max(servers, key=lambda info: contains(info, notebook))
        if contains(best, notebook) >= 0:
            return best
    return servers[0]


def same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def find_server(args: argparse.Namespace) -> ServerInfo:
    """The server to talk to: --url/--token (or their env variables), else discovery."""
    notebook = getattr(args, "notebook", None)
    url = args.url or os.environ.get("JUPYTER_PAUSE_URL")
    token = args.token or os.environ.get("JUPYTER_PAUSE_TOKEN")
    if url:
        match: dict[str, Any] = {}
        if not token or (notebook and (os.path.isabs(notebook) or os.path.exists(notebook))):
            # A runtime file of the same server still tells its token and root (for file paths).
            match = next((s for s in running_servers() if same_url(s["url"], url)), {})
        return ServerInfo(url, token or match.get("token", ""), match.get("root_dir"))
    servers = running_servers()
    if not servers:
        raise CliError(
            f"No running Jupyter server found in {runtime_dir()}: start one (jupyter lab), "
            "or give --url and --token",
            EXIT_NO_SERVER,
        )
    info = pick_server(servers, notebook)
    return ServerInfo(info["url"], token or info.get("token", ""), info.get("root_dir"))


def server_path(notebook: str, root_dir: str | None) -> str:
    """The notebook path relative to the server root, from what the user typed."""
    if os.path.isabs(notebook):
        if root_dir is None:
            raise CliError(
                f"Cannot tell where {notebook} is for a server given by URL: "
                "give the path relative to the server root",
                EXIT_USAGE,
            )
        rel = inside(notebook, root_dir)
        if rel is None:
            raise CliError(f"{notebook} is not inside the server root {root_dir}", EXIT_USAGE)
        return rel
    if root_dir is not None and os.path.exists(notebook):
        rel = inside(notebook, root_dir)
        if rel is not None:
            return rel  # a file path from the current directory
    # Otherwise the user typed a server path, as shown by `jupyter pause status`.
    return posixpath.normpath(notebook.replace(os.sep, "/")).strip("/")


def quote_path(path: str) -> str:
    """URL-quote each segment of a notebook path (names may hold spaces, #, ?)."""
    return "/".join(urllib.parse.quote(part, safe="") for part in path.split("/"))


class Client:
    """The jupyter_pause REST API; every failure becomes a CliError with its exit code."""

    def __init__(self, server: ServerInfo) -> None:
        self.server = server
        self.base = server.url.rstrip("/") + f"/{API_PREFIX}/"

    def get(self, *parts: str) -> Any:
        return self.request("GET", parts, READ_TIMEOUT_SECONDS)

    def post(
        self,
        *parts: str,
        timeout: float | None = READ_TIMEOUT_SECONDS,
        body: dict[str, Any] | None = None,
    ) -> Any:
        return self.request("POST", parts, timeout, body)

    def request(
        self,
        method: str,
        parts: Sequence[str],
        timeout: float | None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        import urllib.error  # here, not at the top: `--help` and "no server" answer sooner
        import urllib.request

        url = self.base + "/".join(parts)
        request = urllib.request.Request(url, method=method)
        request.add_header("Authorization", f"token {self.server.token}")
        request.add_header("Accept", "application/json")
        if method == "POST":
            request.add_header("Content-Type", "application/json")
            request.data = json.dumps(body or {}).encode()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as err:
            raise self.http_error(err) from None
        except TimeoutError:
            raise CliError(
                f"The server at {self.server.url} did not answer", EXIT_TIMEOUT
            ) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise CliError(
                f"Cannot reach the Jupyter server at {self.server.url}: {reason}", EXIT_NO_SERVER
            ) from None
        try:
            return json.loads(body) if body else None
        except ValueError:
            raise CliError(
                f"{url} did not answer JSON (a web page?): is {self.server.url} a Jupyter server "
                "with jupyter_pause, with its base URL?",
                EXIT_NO_SERVER,
            ) from None

    def http_error(self, err: Any) -> CliError:
        """An ``urllib.error.HTTPError``: the server's JSON message, with the exit code its
        status means."""
        try:
            message = json.loads(err.read()).get("message") or err.reason
        except (ValueError, AttributeError, OSError):
            message = err.reason
        if err.code == 403:
            message = f"Not authorised by {self.server.url} ({message}): check the token"
        elif err.code == 404 and message in ("Not Found", None, ""):
            # Not one of our 404s (they always say which notebook): the URL is not ours.
            return CliError(
                f"{self.server.url} has no jupyter_pause API: is the extension enabled?",
                EXIT_NO_SERVER,
            )
        return CliError(str(message), HTTP_EXIT_CODES.get(err.code, EXIT_FAILED))
