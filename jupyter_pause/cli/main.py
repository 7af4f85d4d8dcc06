"""``jupyter pause``: pause, resume and inspect notebook sessions from a terminal.

The parser and the dispatch. Each command lives in the module of its family (``sessions``,
``checkpoints``, ``timeline``); ``report``, ``drill`` and the ``--workspace`` commands import
matplotlib, the store or the kubernetes client, so they are imported only when asked.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from .checkpoints import cmd_checkpoint, cmd_gc, cmd_list
from .client import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Client,
    CliError,
    find_server,
    server_path,
)
from .sessions import cmd_accept, cmd_cancel, cmd_pause, cmd_resume, cmd_status
from .timeline import cmd_timeline
from .transfer import cmd_export, cmd_import, cmd_trust

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
    resume.add_argument(
        "--cpu",
        action="store_true",
        help="restore from files into a kernel without a GPU, now (a resume waiting for a GPU "
        "gives its place up)",
    )
    add("list", cmd_list, "a notebook's checkpoints, or all sessions", "optional")
    add("timeline", cmd_timeline, "a notebook's pause/resume events and GPU time", "required")
    export = add(
        "export",
        cmd_export,
        "one file with the notebook and its latest good checkpoint, to import on another "
        "server (a running session is checkpointed first); --all: every paused session",
        "optional",
    )
    export.add_argument("-o", "--output", metavar="FILE", help="the file (default: NAME.jpsession)")
    export.add_argument(
        "--all",
        metavar="DIR",
        dest="all_into",
        help="export every paused session of the server into DIR (before an upgrade or a "
        "move to another cluster)",
    )
    imported = add(
        "import",
        cmd_import,
        "a session file as a paused notebook of this server (checked before anything is "
        "written; restoring it needs trust)",
    )
    imported.add_argument("file", metavar="FILE")
    imported.add_argument(
        "--as",
        dest="as_path",
        metavar="NOTEBOOK",
        help="the notebook path here (default: FILE's name)",
    )
    imported.add_argument(
        "--trust",
        action="store_true",
        help="trust it now: restoring unpickles it, which runs code from it",
    )
    add(
        "trust",
        cmd_trust,
        "trust an imported session, so that Resume may restore it (restoring runs code from it)",
        "required",
    )
    add("gc", cmd_gc, "apply the retention policy to every notebook's checkpoints")
    add(
        "cancel",
        cmd_cancel,
        "cancel a resume that waits for resources (a GPU): the notebook stays paused",
        "required",
    )
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
        "--server-dir",
        metavar="DIR",
        help="with --own-server: where --keep keeps the drill notebook and its checkpoint "
        "(the root and store of the drill's server), and where --upgrade-check looks "
        "(default: jupyter_pause/drill-server in the Jupyter data folder)",
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
    from .report import run  # matplotlib and the store code: only for this command

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
            if getattr(args, "cpu", False):
                parser.error("--cpu resumes a notebook; a whole Workspace comes back as it paused")
            from . import workspace  # imports the kubernetes client: only when asked

            return workspace.run(args)
        if args.command == "resume" and args.notebook is None:
            parser.error("resume needs NOTEBOOK, or --workspace NAMESPACE/NAME")
        if args.command == "export" and (args.notebook is None) == (args.all_into is None):
            parser.error("export needs NOTEBOOK, or --all DIR")
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
