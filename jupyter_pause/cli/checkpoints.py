"""``checkpoint``, ``list`` and ``gc``: a notebook's checkpoints, a workspace's pod snapshots."""

from __future__ import annotations

import argparse
from typing import Any

from ..formatting import format_bytes, format_duration, format_reasons
from .client import EXIT_CONFLICT, EXIT_FAILED, EXIT_OK, Client, CliError, quote_path
from .output import format_time, plural, print_json, session_row, table


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
