"""``export``, ``import`` and ``trust``: a session carried to another server as one file.

The file is made and read by the server (``GET /jupyter-pause/export/<path>``, ``POST
/jupyter-pause/import/<path>``): here it is only downloaded or uploaded, in chunks, with the
bytes done / in all on stderr, so memory stays flat however large the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from ..formatting import format_bytes
from ..session_file import SUFFIX
from .client import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Client, CliError, quote_path, server_path
from .output import print_json

CHUNK = 2**20


class _Progress:
    """``done / total`` on stderr, at most every half second, when stderr is a terminal or
    asked for; a last line at the end."""

    def __init__(self, what: str, total: int, quiet: bool) -> None:
        self.what, self.total, self.done = what, total, 0
        self.quiet = quiet
        self.shown = 0.0

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if not self.quiet and now - self.shown >= 0.5:
            self.shown = now
            print(f"{self.what}: {format_bytes(self.done)} / {format_bytes(self.total)}",
                  file=sys.stderr, flush=True)  # fmt: skip


def _open(client: Client, method: str, parts: list[str], body: Any = None, size: int = 0) -> Any:
    request = urllib.request.Request(client.base + "/".join(parts), method=method, data=body)
    request.add_header("Authorization", f"token {client.server.token}")
    if body is not None:
        request.add_header("Content-Type", "application/x-tar")
        request.add_header("Content-Length", str(size))
    try:
        return urllib.request.urlopen(request, timeout=None)
    except urllib.error.HTTPError as err:
        raise client.http_error(err) from None
    except (urllib.error.URLError, OSError) as err:
        raise CliError(f"Cannot reach the Jupyter server at {client.server.url}: "
                       f"{getattr(err, 'reason', err)}", 3) from None  # fmt: skip


def cmd_export(client: Client, args: argparse.Namespace) -> int:
    if args.all_into is not None:
        return _export_all(client, Path(args.all_into), args.json)
    target = Path(args.output or f"{Path(args.path).stem}{SUFFIX}")
    size, checkpoint = download(client, args.path, target, args.json)
    if args.json:
        print_json({"file": str(target), "bytes": size, "checkpoint_id": checkpoint})
    else:
        print(f"Exported {args.path} (checkpoint {checkpoint}) to {target}, {format_bytes(size)}")
    return EXIT_OK


def _export_all(client: Client, folder: Path, as_json: bool) -> int:
    """Every paused session, one file each named after its path; what failed is named and
    the others go on (exit 1 if any failed)."""
    folder.mkdir(parents=True, exist_ok=True)
    sessions = [s for s in client.get("sessions")["sessions"] if s["state"] == "paused"]
    done, failed = [], {}
    for session in sessions:
        path = session["path"]
        target = folder / (path.replace("/", "__") + SUFFIX)
        try:
            size, checkpoint = download(client, path, target, as_json)
        except CliError as err:
            failed[path] = str(err)
            continue
        done.append({"path": path, "file": str(target), "bytes": size, "checkpoint_id": checkpoint})
    if as_json:
        print_json({"exported": done, "failed": failed})
    else:
        for item in done:
            print(f"{item['path']}: {item['file']} ({format_bytes(item['bytes'])})")
        for path, why in failed.items():
            print(f"{path}: not exported: {why}", file=sys.stderr)
        print(f"{len(done)} of {len(sessions)} paused sessions exported to {folder}")
    return EXIT_FAILED if failed else EXIT_OK


def download(client: Client, path: str, target: Path, quiet: bool) -> tuple[int, str | None]:
    """The session file of ``path`` into ``target`` (complete, or not there at all)."""
    partial = target.with_name(f".{target.name}.part")
    with _open(client, "GET", ["export", quote_path(path)]) as response:
        total = int(response.headers.get("Content-Length") or 0)
        progress = _Progress(f"exporting {path}", total, quiet)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    progress.add(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, target)  # a complete file or none
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        checkpoint = response.headers.get("X-Checkpoint-Id")
    return progress.done, checkpoint


class _Upload:
    """A file read in chunks for urllib, counting the bytes sent."""

    def __init__(self, source: IO[bytes], progress: _Progress) -> None:
        self.source, self.progress = source, progress

    def read(self, size: int = -1) -> bytes:
        chunk = self.source.read(CHUNK if size < 0 else min(size, CHUNK))
        self.progress.add(len(chunk))
        return chunk


def upload(client: Client, source: Path, path: str, quiet: bool) -> dict[str, Any]:
    """Import the session file ``source`` as notebook ``path``: the server's answer."""
    size = source.stat().st_size
    progress = _Progress(f"importing {source.name}", size, quiet)
    with open(source, "rb") as stream:
        body = _Upload(stream, progress)
        with _open(client, "POST", ["import", quote_path(path)], body, size) as response:
            return json.loads(response.read())


def cmd_import(client: Client, args: argparse.Namespace) -> int:
    source = Path(args.file)
    if not source.is_file():
        raise CliError(f"{source} is not a file", EXIT_USAGE)
    name = args.as_path or Path(source.name).with_suffix(".ipynb").name
    path = server_path(name, client.server.root_dir)
    answer = upload(client, source, path, args.json)
    if args.trust:
        answer["session"] = client.post("trust", quote_path(path))
    if args.json:
        print_json(answer)
        return EXIT_OK
    print(f"Imported {source} as {path}: {answer['session']['message']}")
    return EXIT_OK


def cmd_trust(client: Client, args: argparse.Namespace) -> int:
    session = client.post("trust", quote_path(args.path))
    if args.json:
        print_json(session)
    else:
        print(f"{args.path}: {session['message']}")
    return EXIT_OK
