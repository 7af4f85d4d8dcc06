"""``jupyter pause drill``: find (or start) the server, run the steps, write the report folder."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from .. import cli
from . import render, upgrade
from .client import DrillError, ServerClient
from .server import OwnServer
from .steps import BASELINE, FOLDER, MAIN, Drill


def _server(args: argparse.Namespace, stack: contextlib.ExitStack) -> cli.ServerInfo:
    """The server to drill: --url or a running one, else one of its own (--own-server)."""
    if not args.own_server:
        try:
            return cli.find_server(args)
        except cli.CliError as err:
            if err.code != cli.EXIT_NO_SERVER or args.url:
                raise
    sys.stderr.write("Starting a server of the drill's own\n")
    return stack.enter_context(OwnServer(args.gpus, args.backend, args.timeout)).info


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    with contextlib.ExitStack() as stack:
        client = ServerClient(_server(args, stack))
        if args.upgrade_check:
            return _upgrade_check(client, args, out)
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
        try:
            _clean_up(drill, client, keep=args.keep)
        except (DrillError, cli.CliError) as err:
            error = error or f"clean-up: {err}"
        files = render.write(drill.findings, out, error)
    for check in drill.findings.failed:
        print(f"jupyter pause drill: FAILED {check.name}: {check.detail}", file=sys.stderr)
    if error:
        print(f"jupyter pause drill: stopped early: {error}", file=sys.stderr)
    print(f"Report: {', '.join(str(f) for f in files)}")
    return cli.EXIT_FAILED if drill.findings.failed or error else cli.EXIT_OK


def _clean_up(drill: Drill, client: ServerClient, keep: bool) -> None:
    """Delete the drill's checkpoints (checking the storage is freed), kernels and files."""
    paths = sorted(
        {s["path"] for s in client.get("sessions")["sessions"] if s["path"].startswith(FOLDER)}
    )
    if keep:
        paths = [p for p in paths if p != MAIN]
        if client.session(MAIN)["state"] != "paused":
            drill.pause(MAIN)
    for path in paths:
        client.close_notebook(path)
    if paths:
        drill.delete_and_check(paths)
    for path in paths:
        client.delete_file(path)
    if not keep and BASELINE not in paths:
        client.delete_file(BASELINE)


def _upgrade_check(client: ServerClient, args: argparse.Namespace, out: Path) -> int:
    try:
        found = upgrade.check(client, args.timeout)
    except DrillError as err:
        raise cli.CliError(f"upgrade check: {err}") from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "upgrade-check.json").write_text(json.dumps(found, indent=2) + "\n")
    print(f"{MAIN}: {found['verdict']}: {found['why']}")
    return cli.EXIT_OK if found["verdict"] != upgrade.NOT_RESTORED else cli.EXIT_FAILED
