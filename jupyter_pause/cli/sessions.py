"""``status``, ``pause``, ``resume``, ``cancel`` and ``accept``: a session's state, and following
it."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from ..formatting import format_bytes, format_duration, format_reasons
from .client import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TIMEOUT,
    PAUSE_IN_FLIGHT,
    POLL_SECONDS,
    RESUME_IN_FLIGHT,
    Client,
    CliError,
    quote_path,
)
from .output import Progress, plural, print_json, session_row, table


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
    held = status.get("held_by_maps") or 0
    if held:
        print(
            f"Disk:     {format_bytes(held)} of deleted checkpoints, still mapped by kernels "
            "(lazily restored arrays): freed when they are deleted or the kernels stop"
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
    options = {"accelerators": "none"} if args.cpu else None
    record = client.post("resume", quote_path(args.path), body=options)
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
        summary = resume_summary(args.path, record, time.monotonic() - started)
        if args.cpu:
            summary += ", on CPU: no GPU until it is paused and resumed again"
        print(summary)
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


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    record = client.post("cancel", quote_path(args.path))
    if args.json:
        print_json(record)
    else:
        print(f"{args.path}: {record['message']}")
    return EXIT_OK


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


def report_started(record: dict[str, Any], args: argparse.Namespace) -> int:
    """--no-wait: say what the server is doing now and return."""
    if args.json:
        print_json(record)
    else:
        print(f"{record['path']}: {record['state']} ({record.get('message') or 'running'})")
    return EXIT_OK
