"""``jupyter pause drill``: find (or start) the server, run the steps, write the report folder."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...formatting import format_bytes
from ..client import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_SERVER,
    EXIT_OK,
    CliError,
    ServerInfo,
    find_server,
)
from . import render, upgrade
from .client import DrillError, ServerClient
from .notebook import DATA_DIR, DATA_FILES
from .plan import CLEANUP_STEP, DRILL_NOTEBOOK, FOLDER, MAIN
from .server import OwnServer, default_server_dir
from .steps import Drill


@dataclass
class Target:
    """The server the drill runs against, and which one it is, in words."""

    info: ServerInfo
    where: str  # e.g. "the drill's own server on ~/.local/share/jupyter/jupyter_pause/drill-server"
    kept_in: Path | None = None  # the own server's stable folder (--keep, --upgrade-check)


def _server(args: argparse.Namespace, stack: contextlib.ExitStack, own: list[bool]) -> Target:
    """The server to drill: --url or a running one, else one of its own (--own-server, which
    sets ``own``)."""
    if not args.own_server:
        try:
            info = find_server(args)
            return Target(info, f"the server at {info.url}")
        except CliError as err:
            if err.code != EXIT_NO_SERVER or args.url:
                raise
    folder = Path(args.server_dir).expanduser() if args.server_dir else default_server_dir()
    kept: Path | None = None
    if args.upgrade_check:
        kept = folder if folder.is_dir() else None
    elif args.keep:
        _replace_kept(folder)
        kept = folder
    own.append(True)
    sys.stderr.write(
        "Starting a server of the drill's own" + (f" on {kept}" if kept else "") + "\n"
    )
    own = stack.enter_context(OwnServer(args.gpus, args.backend, args.timeout, kept))
    where = (
        f"the drill's own server on {kept}"
        if kept
        else f"the drill's own server (nothing kept in {folder})"
    )
    return Target(own.info, where, kept)


def _replace_kept(folder: Path) -> None:
    """Make way for a new kept drill: the one kept in ``folder`` before goes. A folder holding
    anything else than the root, store and log the drill's server made is never touched."""
    if not folder.exists():
        return
    foreign = sorted(
        p.name for p in folder.iterdir() if p.name not in ("root", "store", "server.log")
    )
    if foreign:
        raise CliError(
            f"{folder} holds files the drill did not write ({', '.join(foreign)}): "
            "name another folder with --server-dir",
            EXIT_FAILED,
        )
    sys.stderr.write(f"Replacing the drill kept in {folder}\n")
    shutil.rmtree(folder)


def run(args: argparse.Namespace) -> int:
    own: list[bool] = []  # set once the drill starts a server of its own
    try:
        return _run(args, own)
    except KeyboardInterrupt:
        if not own:
            raise  # a server that was running before the drill: it carries on
        print(
            "\njupyter pause drill: interrupted; the drill's own server stopped and its "
            "temporary folder removed",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace, own: list[bool]) -> int:
    out = Path(args.out)
    with contextlib.ExitStack() as stack:
        target = _server(args, stack, own)
        client = ServerClient(target.info)
        if args.upgrade_check:
            return _upgrade_check(client, args, out, target)
        drill = Drill(client, args)
        error = None
        try:
            drill.environment()
            drill.prepare()
            drill.pause_and_check()
            drill.resume_and_check()
            drill.compare()
            drill.probe_waiting()
            drill.rush()
        except DrillError as err:
            error = str(err)
        drill.numbers["stopped_early"] = error
        kept = False
        try:
            _clean_up(drill, client, keep=args.keep)
            if args.keep:
                upgrade.keep_session_file(client, out)
                kept = True
        except (DrillError, CliError) as err:
            error = error or f"clean-up: {err}"
        files = render.write(drill.findings, out, error)
    for check in drill.findings.failed:
        print(f"jupyter pause drill: FAILED {check.name}: {check.detail}", file=sys.stderr)
    if error:
        print(f"jupyter pause drill: stopped early: {error}", file=sys.stderr)
    print(f"Report: {', '.join(str(f) for f in files)}")
    if kept:
        print(_kept_text(args, target, out))
    return EXIT_FAILED if drill.findings.failed or error else EXIT_OK


def _kept_text(args: argparse.Namespace, target: Target, out: Path) -> str:
    """Where --keep left the drill notebook, and the command that checks it after the upgrade."""
    again = ["jupyter", "pause", "drill"]
    if target.kept_in is not None:
        again.append("--own-server")
        if args.server_dir:
            again += ["--server-dir", str(target.kept_in)]
    if args.backend:
        again += ["--backend", args.backend]
    if out != Path("pause-drill-report"):
        again += ["--out", str(out)]
    again.append("--upgrade-check")
    place = f"in {target.kept_in}" if target.kept_in is not None else f"on {target.where}"
    return (
        f"Kept {MAIN} (paused) with its checkpoint {place}, and its session file "
        f"{out / upgrade.SESSION_FILE}. After the upgrade: {shlex.join(again)}"
    )


def _clean_up(drill: Drill, client: ServerClient, keep: bool) -> None:
    """Delete what the drill made: its checkpoints (checking the storage is freed), kernels
    and files, and its folder once empty. ``keep``: all but the drill notebook, paused, and
    its data, which ``--upgrade-check`` reads."""
    paths = sorted(
        {s["path"] for s in client.get("sessions")["sessions"] if s["path"].startswith(FOLDER)}
    )
    if keep:
        paths = [p for p in paths if p != MAIN]
        if client.session(MAIN)["state"] != "paused":
            drill.pause(MAIN)
    for path in paths:
        client.close_notebook(path)
    freed = drill.delete_and_check(paths) if paths else 0
    kept = {MAIN, f"{FOLDER}/{DATA_DIR}"} if keep else set()
    left = _delete_drill_files(client, kept)
    own = [entry["name"] for entry in left if _drills_own(entry) and entry["path"] not in kept]
    if own:
        detail = f"{FOLDER}/ still holds {', '.join(own)}"
    elif keep:
        detail = f"kept {MAIN} (paused) and {FOLDER}/{DATA_DIR}/ for --upgrade-check"
    elif left:
        names = ", ".join(entry["name"] for entry in left)
        detail = f"{FOLDER}/ kept: it holds files the drill did not write ({names})"
    else:
        detail = f"{FOLDER}/ deleted"
    drill.check(CLEANUP_STEP, "drill's files deleted", not own, detail)
    drill.progress(
        CLEANUP_STEP,
        "Clean-up",
        f"deleted the drill's checkpoints ({format_bytes(freed)} freed), kernels and "
        + (f"files but {MAIN} and its data (--keep)" if keep else "files"),
    )


def _drills_own(entry: dict[str, Any]) -> bool:
    """A file or folder in FOLDER that the drill writes (its notebooks, their data folder)."""
    if entry["type"] == "directory":
        return entry["name"] == DATA_DIR
    return DRILL_NOTEBOOK.fullmatch(entry["name"]) is not None


def _delete_drill_files(client: ServerClient, kept: set[str]) -> list[dict[str, Any]]:
    """Delete the drill's notebooks and data in FOLDER but ``kept``, then FOLDER when nothing
    else is in it; what is left there (a user's own files are never touched)."""
    for entry in client.list_folder(FOLDER):
        if entry["path"] in kept or not _drills_own(entry):
            continue
        if entry["type"] == "directory":
            for inner in client.list_folder(entry["path"]):
                if inner["name"] in DATA_FILES:
                    client.delete_file(inner["path"])
            if client.list_folder(entry["path"]):
                continue  # someone else's file in it: the folder stays
        client.delete_file(entry["path"])
    left = client.list_folder(FOLDER)
    if not left:
        client.delete_file(FOLDER)
    return left


def _upgrade_check(
    client: ServerClient, args: argparse.Namespace, out: Path, target: Target
) -> int:
    sys.stderr.write(f"Upgrade check of {target.where}\n")
    try:
        found = upgrade.check(client, args.timeout, out)
    except DrillError as err:
        raise CliError(f"upgrade check of {target.where}: {err}") from None
    found["examined"] = target.where
    out.mkdir(parents=True, exist_ok=True)
    (out / "upgrade-check.json").write_text(json.dumps(found, indent=2) + "\n")
    print(f"{MAIN}: {found['verdict']}: {found['why']}")
    return EXIT_OK if found["verdict"] != upgrade.NOT_RESTORED else EXIT_FAILED
