"""``jupyter pause``: pause, resume and inspect notebook sessions from a terminal.

A thin client of the jupyter_pause REST API of a running jupyter-server. It uses only the
standard library for HTTP (no tornado, no server imports) so that it starts fast and works
from any shell, e.g. a login node where only the notebook's files are visible. The server is
found from its runtime files like ``jupyter server list`` does, or given with --url/--token.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from .formatting import format_bytes, format_duration, format_reasons

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

EPILOG = """\
server:
  The running Jupyter server is found from its runtime files, like `jupyter server list`
  (JUPYTER_RUNTIME_DIR is honoured); when several run, the one whose root contains the
  notebook is used. Or give --url and --token (or JUPYTER_PAUSE_URL, JUPYTER_PAUSE_TOKEN).
  NOTEBOOK is a path relative to the server root, or a file path inside the server root.

exit codes:
  0  success
  1  the operation failed (pause failed and the session kept running, resume failed or
     did not restore everything, checkpoint failed)
  2  usage error
  3  no server found, the server is unreachable, or it has no jupyter_pause API
  4  unknown notebook
  5  busy or conflicting (e.g. already paused, a pause/resume in progress)
  6  not authorised (wrong or missing token)
  7  timed out waiting (the operation continues on the server)
"""


class CliError(Exception):
    """A failure to report as one line on stderr, with the process exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- formatting -----------------------------------------------------------------------------------


def format_time(at: float | None, with_date: bool = True) -> str:
    """A Unix time in the user's local time zone (the server may be elsewhere)."""
    if not at:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(at))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns; the last one is not padded so long messages do not wrap early."""
    cells = [list(headers), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers) - 1)]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


# -- finding the server ---------------------------------------------------------------------------
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


# -- talking to the server ------------------------------------------------------------------------
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

    def post(self, *parts: str, timeout: float | None = READ_TIMEOUT_SECONDS) -> Any:
        return self.request("POST", parts, timeout)

    def request(self, method: str, parts: Sequence[str], timeout: float | None) -> Any:
        import urllib.error  # here, not at the top: `--help` and "no server" answer sooner
        import urllib.request

        url = self.base + "/".join(parts)
        request = urllib.request.Request(url, method=method)
        request.add_header("Authorization", f"token {self.server.token}")
        request.add_header("Accept", "application/json")
        if method == "POST":
            request.add_header("Content-Type", "application/json")
            request.data = b"{}"
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


# -- progress -------------------------------------------------------------------------------------
def describe(record: dict[str, Any], bar: bool) -> str:
    """One line of a session's state: phase, bytes done/total, percent, queue place."""
    state = record.get("state", "?")
    text = f"{record.get('path')}: {state}"
    if state == "waiting-for-resources":
        reason = (record.get("message") or "").removeprefix("Waiting for a GPU: ")
        place = record.get("queue_position")
        if place and "queue" not in reason:  # a backend's reason may already give the place
            reason = f"{reason}; " if reason else ""
            reason += f"place {place} in the queue"
        text += f" ({reason})" if reason else ""
    progress = record.get("progress") or {}
    if progress.get("phase"):
        text += f", {progress['phase']}"
    done, total = progress.get("done") or 0, progress.get("total") or 0
    if total:
        percent = min(100, int(100 * done / total))
        filled = "#" * (percent // 5)
        meter = f" [{filled:-<20}]" if bar else ""
        text += f"{meter} {format_bytes(done)}/{format_bytes(total)} {percent}%"
    return text


class Progress:
    """Shows the state on stderr: one rewritten line on a terminal, plain lines otherwise."""

    #: On a pipe, repeat a line of the same phase at most this often (logs stay short).
    PLAIN_EVERY_SECONDS = 2.0

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last_text = ""
        self.last_key: tuple[Any, ...] = ()
        self.last_print = 0.0

    def show(self, record: dict[str, Any]) -> None:
        text = describe(record, bar=self.tty)
        if text == self.last_text:
            return
        if self.tty:
            width = max(20, _terminal_width() - 1)
            self.stream.write("\r\x1b[K" + text[:width])
        else:
            key = (record.get("state"), (record.get("progress") or {}).get("phase"))
            if (
                key == self.last_key
                and time.monotonic() - self.last_print < self.PLAIN_EVERY_SECONDS
            ):
                return
            self.stream.write(text + "\n")
            self.last_key, self.last_print = key, time.monotonic()
        self.stream.flush()
        self.last_text = text

    def finish(self) -> None:
        if self.tty and self.last_text:
            self.stream.write("\n")
            self.stream.flush()


def _terminal_width() -> int:
    """Columns of the terminal on stderr; 80 where unknown (a pty may report 0)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or 80
    except (OSError, ValueError):
        return 80


def wait_until(
    client: Client,
    path: str,
    done: Callable[[dict[str, Any]], bool],
    timeout: float | None,
    progress: Progress,
) -> dict[str, Any]:
    """Poll the session until ``done``; CliError(EXIT_TIMEOUT) past the timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            record = client.get("sessions", quote_path(path))
            progress.show(record)
            if done(record):
                return record
            if deadline is not None and time.monotonic() >= deadline:
                raise CliError(
                    f"Timed out after {timeout:g} s waiting for {path} (now {record['state']}); "
                    "it continues on the server: follow it with `jupyter pause status`",
                    EXIT_TIMEOUT,
                )
            time.sleep(POLL_SECONDS)
    finally:
        progress.finish()


def failure_text(record: dict[str, Any], default: str, redundant: str = "") -> str:
    """The server's what + recovery of a failure, on one line (less a ``redundant`` prefix)."""
    error = record.get("error") or {}
    what = (error.get("what") or record.get("message") or default).removeprefix(redundant)
    recovery = error.get("recovery")
    return f"{what[:1].upper()}{what[1:]}. {recovery}" if recovery else what


# -- commands -------------------------------------------------------------------------------------
def cmd_status(client: Client, args: argparse.Namespace) -> int:
    # Sessions first: listing them makes the server adopt new kernels (and their GPUs), so
    # the status read next agrees with the session lines.
    sessions = client.get("sessions")["sessions"]
    status = client.get("status")
    if args.json:
        print_json({**status, "server": client.server.url, "sessions": sessions})
        return EXIT_OK
    resources = status.get("resources", {})
    queue = resources.get("queue") or []
    print(f"Server:   {client.server.url} (jupyter_pause {status.get('version')})")
    print(
        f"Backend:  {status.get('backend')}; GPUs: {resources.get('gpus_total', 0)} total, "
        f"{resources.get('gpus_free', 0)} free; queue: {', '.join(queue) or 'empty'}"
    )
    details = resources.get("details") or {}
    if details.get("problem"):
        fallback = f"; {details['fallback']}" if details.get("fallback") else ""
        print(
            f"Warning:  the {status.get('backend')} backend cannot work fully here: "
            f"{details['problem']}{fallback}"
        )
    if not sessions:
        print("Sessions: none")
        print_attention([], status.get("problems") or [])
        return EXIT_OK
    print("Sessions:")
    rows = [session_row(s) for s in sessions]
    print(table(("  PATH", "STATE", "GPUS", "MESSAGE"), [("  " + r[0], *r[1:]) for r in rows]))
    print_attention(sessions, status.get("problems") or [])
    return EXIT_OK


def print_attention(sessions: list[dict[str, Any]], problems: list[str]) -> None:
    """What needs the user: incomplete restores (and how to recover), damaged files."""
    for session in sessions:
        if session.get("hold"):
            error = session.get("error") or {}
            print(f"Held: {session['path']}: {error.get('recovery') or 'retention is held'}")
        for warning in session.get("warnings") or []:
            print(f"Warning: {session['path']}: {warning}")
    for problem in problems:
        print(f"Warning: {problem}")


def session_row(session: dict[str, Any]) -> tuple[str, str, str, str]:
    gpus = ",".join(str(g) for g in session.get("gpus") or []) or "-"
    return session["path"], session["state"], gpus, session.get("message") or ""


def cmd_checkpoint(client: Client, args: argparse.Namespace) -> int:
    try:
        # No socket timeout unless asked: a large checkpoint may take minutes to write.
        body = client.post("checkpoint", quote_path(args.path), timeout=args.timeout)
    except CliError as err:
        if err.code == EXIT_CONFLICT and str(err).startswith("Checkpoint failed"):
            err.code = EXIT_FAILED  # the kernel tried and failed, it was not busy
        raise
    if args.json:
        print_json(body)
        return EXIT_OK
    result = body["result"]
    print(
        f"Checkpoint {result['checkpoint_id']} of {args.path}: "
        f"{plural(len(result.get('saved', [])), 'variable')} saved, "
        f"{format_bytes(result.get('bytes_written', 0))} written, "
        f"{format_bytes(result.get('bytes_reused', 0))} reused "
        f"(took {format_duration(result.get('seconds'))})"
    )
    if result.get("skipped"):
        print("Not saved: " + format_reasons(result["skipped"]))
    return EXIT_OK


def cmd_pause(client: Client, args: argparse.Namespace) -> int:
    started = time.monotonic()
    record = client.post("pause", quote_path(args.path))
    if args.no_wait:
        return report_started(record, args)
    gpus = len(record.get("gpus") or [])  # held now; gone once paused
    record = follow(client, args, record, PAUSE_IN_FLIGHT)
    if record["state"] != "paused":
        raise CliError(
            f"Pause of {args.path} failed: " + failure_text(record, "unknown error"), EXIT_FAILED
        )
    if not args.json:
        print(pause_summary(args.path, record, gpus, time.monotonic() - started))
    return EXIT_OK


def pause_summary(path: str, record: dict[str, Any], gpus: int, seconds: float) -> str:
    """``Paused exp/train.ipynb: checkpoint 3, 1.2 GB saved, GPU released (took 4.1 s)``."""
    checkpoint = record.get("checkpoint") or {}
    bits = []
    if checkpoint.get("id") is not None:
        bits.append(f"checkpoint {checkpoint['id']}")
    bits.append(f"{format_bytes(checkpoint.get('bytes', 0))} saved")
    if gpus:
        bits.append("GPU released" if gpus == 1 else f"{gpus} GPUs released")
    else:
        bits.append("kernel stopped")
    return f"Paused {path}: {', '.join(bits)} (took {format_duration(seconds)})"


def cmd_resume(client: Client, args: argparse.Namespace) -> int:
    started = time.monotonic()
    record = client.post("resume", quote_path(args.path))
    if args.no_wait or record["state"] not in RESUME_IN_FLIGHT:
        # Nothing in flight: the server answered a running session (a harmless no-op).
        return report_started(record, args)
    record = follow(client, args, record, RESUME_IN_FLIGHT)
    if record["state"] == "partial":
        recovery = (record.get("error") or {}).get("recovery") or ""
        raise CliError(
            f"Resume of {args.path} incomplete: {record.get('message')} {recovery}".rstrip(),
            EXIT_FAILED,
        )
    if record["state"] != "ready":
        raise CliError(
            f"Resume of {args.path} failed: "
            + failure_text(record, record["state"], redundant="resume failed: "),
            EXIT_FAILED,
        )
    if not args.json:
        print(resume_summary(args.path, record, time.monotonic() - started))
    return EXIT_OK


def resume_summary(path: str, record: dict[str, Any], seconds: float) -> str:
    """``Resumed exp/train.ipynb: restored from files (12 variables; ...) in 6.3 s``."""
    took = format_duration(seconds)
    if record.get("how") == "live":
        return f"Resumed {path}: live session restored in {took}"
    restore = record.get("restore") or {}
    detail = plural(len(restore.get("restored") or []), "variable")
    failed = restore.get("failed") or {}
    if failed:
        reasons = format_reasons(failed)
        detail += f"; {len(failed)} not restored: {reasons}"
    return f"Resumed {path}: restored from files ({detail}) in {took}"


def cmd_accept(client: Client, args: argparse.Namespace) -> int:
    record = client.post("accept", quote_path(args.path))
    if args.json:
        print_json(record)
    else:
        print(
            f"{args.path}: carrying on without what was not restored; its old checkpoints are "
            "subject to retention again"
        )
    return EXIT_OK


def follow(
    client: Client, args: argparse.Namespace, record: dict[str, Any], in_flight: tuple[str, ...]
) -> dict[str, Any]:
    """Show progress until the session leaves the ``in_flight`` states; print its JSON if asked."""
    progress = Progress()
    progress.show(record)
    record = wait_until(
        client, args.path, lambda r: r["state"] not in in_flight, args.timeout, progress
    )
    if args.json:
        print_json(record)
    return record


def report_started(record: dict[str, Any], args: argparse.Namespace) -> int:
    """--no-wait: say what the server is doing now and return."""
    if args.json:
        print_json(record)
    else:
        print(f"{record['path']}: {record['state']} ({record.get('message') or 'running'})")
    return EXIT_OK


def cmd_list(client: Client, args: argparse.Namespace) -> int:
    if args.path is None:
        sessions = client.get("sessions")["sessions"]
        if args.json:
            print_json(sessions)
            return EXIT_OK
        if sessions:
            print(table(("PATH", "STATE", "GPUS", "MESSAGE"), [session_row(s) for s in sessions]))
        else:
            print("No notebook sessions.")
        print_snapshots(client.get("snapshots"))
        return EXIT_OK
    listing = client.get("checkpoints", quote_path(args.path))
    if args.json:
        print_json(listing)
        return EXIT_OK
    print_checkpoints(listing)
    return EXIT_OK


def print_snapshots(listing: dict[str, Any]) -> None:
    """The pod snapshots of a workspace (nothing on a backend that takes none)."""
    snapshots = listing.get("snapshots") or []
    if snapshots:
        print("Pod snapshots of this workspace:")
        rows = [
            (
                "  " + s["name"],
                s["created"],
                "ready" if s["ready"] else "not ready",
                "restored by the next resume" if s["pinned"] else "-",
            )
            for s in snapshots
        ]
        print(table(("  NAME", "CREATED", "STATE", "PINNED"), rows))
    if listing.get("problem"):
        print(f"Pod snapshots cannot be listed: {listing['problem']}")


def print_checkpoints(listing: dict[str, Any]) -> None:
    checkpoints = listing.get("checkpoints") or []
    if not checkpoints:
        print(f"No checkpoints of {listing['path']}.")
    else:
        print(
            table(
                ("ID", "CREATED", "REASON", "SIZE", "SKIPPED", "VARIABLES"),
                checkpoint_rows(listing),
            )
        )
    for torn in listing.get("interrupted") or []:
        print(
            f"Interrupted: checkpoint {torn.get('checkpoint_id')} started "
            f"{format_time(torn.get('started'))} by process {torn.get('pid')} was never finished"
        )


def checkpoint_rows(listing: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for c in listing.get("checkpoints") or []:
        if "damaged" in c:
            rows.append((c["id"], "-", "-", "-", "-", f"damaged: {c['damaged']}"))
            continue
        names = c.get("variables") or []
        shown = ", ".join(names[:8]) + (f", … (+{len(names) - 8})" if len(names) > 8 else "")
        shrunk = c.get("shrunk_from")
        if shrunk:  # a kernel without the session's state wrote it, or the notebook deleted most
            shown = f"{shown or '-'} (lacks {len(shrunk['missing'])} of checkpoint {shrunk['id']})"
        rows.append(
            (
                c["id"],
                format_time(c.get("created")),
                c.get("reason") or "-",
                format_bytes(c.get("bytes", 0)),
                len(c.get("skipped") or {}),
                shown or "-",
            )
        )
    return rows


def cmd_timeline(client: Client, args: argparse.Namespace) -> int:
    data = client.get("timeline", quote_path(args.path))
    if args.json:
        print_json(data)
        return EXIT_OK
    print(f"Timeline of {data['path']} (now {data['state']}):")
    events = data.get("events") or []
    first = events[0]["at"] if events else 0.0
    rows = [
        (format_time(e["at"]), f"+{format_duration(e['at'] - first)}", e["kind"], event_data(e))
        for e in events
    ]
    if rows:
        print(
            table(
                ("  TIME", "SINCE START", "EVENT", "DETAILS"), [("  " + r[0], *r[1:]) for r in rows]
            )
        )
    else:
        print("  no events yet")
    print(accounting_text(data.get("accounting") or {}))
    return EXIT_OK


def event_data(event: dict[str, Any]) -> str:
    """An event's data as short ``key=value`` pairs: one line per event stays readable."""
    return " ".join(f"{key}={short_value(key, value)}" for key, value in event["data"].items())


def short_value(key: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if key.startswith("bytes") and isinstance(value, int | float):
        return format_bytes(value).replace(" ", "")
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict):  # e.g. skipped/failed: the names; the reasons are in `list`
        value = list(value)
    if isinstance(value, list):
        shown = ",".join(str(v) for v in value[:5])
        return shown + (f",+{len(value) - 5}" if len(value) > 5 else "") if value else "-"
    return str(value)


def accounting_text(acc: dict[str, Any]) -> str:
    gpus = acc.get("gpus", 0)
    return "\n".join(
        (
            f"GPU time ({plural(gpus, 'GPU')}): "
            f"allocated {format_duration(acc.get('gpu_seconds_allocated', 0))}, "
            f"active {format_duration(acc.get('gpu_seconds_active', 0))}, "
            f"released {format_duration(acc.get('gpu_seconds_released', 0))}",
            f"Pauses: {acc.get('pauses', 0)}, resumes: {acc.get('resumes', 0)}; last resume to "
            f"ready {format_duration(acc.get('last_resume_to_ready_seconds'))}, "
            f"to next cell {format_duration(acc.get('last_resume_to_next_cell_seconds'))}",
            f"Checkpoint data written: {format_bytes(acc.get('bytes_saved', 0))}",
        )
    )


def cmd_gc(client: Client, args: argparse.Namespace) -> int:
    result = client.post("gc")
    if args.json:
        print_json(result)
        return EXIT_OK
    removed = result.get("removed") or {}
    for notebook in result.get("held") or []:
        print(f"Kept every checkpoint of {notebook}: its last restore was incomplete")
    for problem in result.get("problems") or []:
        print(f"Warning: {problem.get('folder')}: {problem.get('problem')}")
    snapshots = result.get("snapshots") or {}  # a workspace's pod snapshots, when it has any
    if snapshots.get("deleted"):
        print(f"Deleted pod snapshots: {', '.join(snapshots['deleted'])}")
    if snapshots.get("problem"):
        print(f"Warning: pod snapshots: {snapshots['problem']}")
    if not removed:
        print("Nothing to remove: every checkpoint is within the retention policy.")
        return EXIT_OK
    count = sum(len(ids) for ids in removed.values())
    print(
        f"Removed {plural(count, 'checkpoint')} of {plural(len(removed), 'notebook')}, "
        f"freed {format_bytes(result.get('bytes_freed', 0))}:"
    )
    for notebook, ids in sorted(removed.items()):
        print(f"  {notebook}: {', '.join(str(i) for i in ids)}")
    return EXIT_OK


# -- argument parsing -----------------------------------------------------------------------------
def positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``jupyter pause`` parser: global server options, one subparser per command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="server URL with its base URL (default: discover)")
    common.add_argument("--token", help="server token (default: from the runtime file)")
    common.add_argument("--json", action="store_true", help="print the data as JSON")
    parser = argparse.ArgumentParser(
        prog="jupyter pause",
        description="Pause a notebook session to storage (releasing its GPU) and resume it later.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, handler: Any, help_text: str, notebook: str = "") -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            parents=[common],
            help=help_text,
            description=help_text,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if notebook == "required":
            sub.add_argument("notebook", metavar="NOTEBOOK")
        elif notebook == "optional":
            sub.add_argument("notebook", metavar="NOTEBOOK", nargs="?")
        sub.set_defaults(handler=handler)
        return sub

    status = add("status", cmd_status, "the server, its GPUs and queue, and every session's state")
    checkpoint = add("checkpoint", cmd_checkpoint, "checkpoint a running notebook now", "required")
    pause = add("pause", cmd_pause, "checkpoint, stop the kernel and release its GPU", "required")
    resume = add(
        "resume",
        cmd_resume,
        "start a kernel and restore the checkpoint (or resume a whole paused Workspace)",
        "optional",
    )
    for sub in (status, resume):
        sub.add_argument(
            "--workspace",
            metavar="NAMESPACE/NAME",
            help="a Kubeflow Workspace, from outside its pod (kubeconfig, or in-cluster)",
        )
        sub.add_argument("--kubeconfig", help="with --workspace: this kubeconfig file")
        sub.add_argument("--context", help="with --workspace: this kubeconfig context")
    for sub in (checkpoint, pause, resume):
        sub.add_argument(
            "--timeout",
            type=positive_seconds,
            metavar="SECONDS",
            help="give up waiting after this long (exit 7)",
        )
    for sub in (pause, resume):
        sub.add_argument("--no-wait", action="store_true", help="return once it has started")
    add("list", cmd_list, "a notebook's checkpoints, or all sessions", "optional")
    add("timeline", cmd_timeline, "a notebook's pause/resume events and GPU time", "required")
    add("gc", cmd_gc, "apply the retention policy to every notebook's checkpoints")
    add(
        "accept",
        cmd_accept,
        "carry on after an incomplete restore: retention may delete old checkpoints again",
        "required",
    )
    add_report(
        add(
            "report",
            cmd_report,
            "GPU hours allocated, worked and released; storage; "
            "resume latency; an idle-threshold study (Markdown on stdout)",
        )
    )
    add_drill(
        add(
            "drill",
            cmd_drill,
            "pause and resume a drill notebook on this server's "
            "backend, probe its failure paths, and write a report folder",
        )
    )
    return parser


def non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def add_report(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--since", default="7d", help="window: 7d, 36h, 90m, 2w or all (default 7d)")
    sub.add_argument(
        "--by",
        choices=("notebook", "user", "kernelspec"),
        default="notebook",
        help="rows per notebook, user (owner of its store folder) or kernelspec",
    )
    sub.add_argument("--out", metavar="DIR", help="write report.md, report.json and PNG charts")
    sub.add_argument(
        "--store",
        nargs="?",
        const="",
        metavar="DIR",
        help="read the checkpoint store instead of a server (default: the server's; the "
        "default store when no server runs)",
    )
    sub.add_argument("--gpu-hour-price", type=non_negative, help="overrides the server's price")
    sub.add_argument(
        "--storage-gb-month-price", type=non_negative, help="overrides the server's price"
    )
    sub.set_defaults(finds_server=False)


def add_drill(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--out",
        metavar="DIR",
        default="pause-drill-report",
        help="folder of report.md, report.json and the charts (default: pause-drill-report)",
    )
    sub.add_argument(
        "--backend",
        help="backend of the server the drill starts (default: the server's own); "
        "with a running server, the drill stops unless it uses this backend",
    )
    sub.add_argument(
        "--model",
        default="seed",
        help="'seed' (a small MLP built from a fixed seed, offline), 'seed:MB' (about MB of "
        "weights), a file saved with torch.save, or hf:NAME from the local Hugging Face cache",
    )
    sub.add_argument(
        "--rush",
        type=int,
        default=3,
        metavar="N",
        help="notebooks resumed at once against fewer GPUs (default 3; 0 skips the rush)",
    )
    sub.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="K",
        help="GPUs the drill's own server hands out (c.PauseApp.gpu_count; default 1)",
    )
    sub.add_argument(
        "--own-server",
        action="store_true",
        help="start a server of its own (as `make lab` does) even when one is running",
    )
    sub.add_argument(
        "--keep",
        action="store_true",
        help="keep the drill notebook paused with its checkpoint, for --upgrade-check later",
    )
    sub.add_argument(
        "--upgrade-check",
        action="store_true",
        help="after an upgrade or migration: tell whether the drill notebook kept by --keep "
        "came back as the live process, from files, or not at all (a new session)",
    )
    sub.add_argument(
        "--timeout",
        type=positive_seconds,
        default=300.0,
        metavar="SECONDS",
        help="longest wait for any one step (default 300)",
    )
    sub.set_defaults(finds_server=False)


def cmd_report(args: argparse.Namespace) -> int:
    from .usage.command import run  # matplotlib and the store code: only for this command

    return run(args)


def cmd_drill(args: argparse.Namespace) -> int:
    from .drill.command import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    try:
        return _run(argv)
    except BrokenPipeError:
        if not _reader_gone():
            raise  # not our output's reader: a real error, with its traceback
        # The reader stopped reading (`| head`): end quietly as a program ended by SIGPIPE
        # does; what is still buffered goes nowhere, so Python's flush at exit cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(devnull, stream.fileno())
        return EXIT_BROKEN_PIPE


def _reader_gone() -> bool:
    """Whether stdout or stderr is a pipe nobody reads any more (poll says POLLERR)."""
    import select

    poller = select.poll()
    for stream in (sys.stdout, sys.stderr):
        poller.register(stream.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if getattr(args, "workspace", None):
            from . import workspace_cli  # imports the kubernetes client: only when asked

            return workspace_cli.run(args)
        if args.command == "resume" and args.notebook is None:
            parser.error("resume needs NOTEBOOK, or --workspace NAMESPACE/NAME")
        if not getattr(args, "finds_server", True):
            return args.handler(args)  # finds (or starts) its server itself
        server = find_server(args)
        notebook = getattr(args, "notebook", None)
        args.path = None if notebook is None else server_path(notebook, server.root_dir)
        return args.handler(Client(server), args)
    except CliError as err:
        print(f"jupyter pause: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        # Only the waiting stops: the server finishes what it started.
        print("\njupyter pause: stopped waiting; the server carries on", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    # As the package's module, not __main__: the --workspace commands import this module's
    # errors and helpers, which must be the ones main() catches.
    from jupyter_pause.cli import main as package_main

    sys.exit(package_main())
