"""What the jupyter_pause server asks of a kernel, over the kernel's own channels.

The server evaluates ``call(op, args_json)`` as a *user expression* of a silent execute
request: nothing lands in the notebook's history or outputs, and it works with no browser
open. Every answer is a JSON string; failures are answers too (``{"ok": false, "error": ...}``),
so the server never has to parse a traceback.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .files import write_private
from .token import process_token

#: Set once a server has introduced itself: ``%pause`` then knows someone is listening.
SERVER_ATTACHED = False
#: iopub message type a kernel uses to ask the server for something (``%pause``).
REQUEST_MSG_TYPE = "jupyter_pause_request"


def _checkpointer(key: str | None) -> Any:
    from IPython import get_ipython

    from . import api
    from .extension import load

    shell = get_ipython()
    checkpointer = load(shell) if shell is not None else api.current()
    if key and checkpointer.key != key:
        checkpointer.set_key(key)  # the server knows the notebook path for certain
    return checkpointer


class _ProgressFile:
    """Progress for the server to poll: a tiny JSON file next to the checkpoints."""

    def __init__(self, folder: Any) -> None:
        self.path = folder / "progress.json"
        self.last = 0.0

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < 0.2 and done < total:
            return
        self.last = now
        tmp = self.path.with_name(".progress.json.tmp")
        write_private(tmp, json.dumps({"phase": phase, "done": done, "total": total}).encode())
        os.replace(tmp, self.path)  # no fsync: progress is not worth a disk flush


def call(op: str, args_json: str) -> str:
    """Run one server request; always returns a JSON string."""
    global SERVER_ATTACHED
    from .api import CheckpointError

    args = json.loads(args_json)
    try:
        checkpointer = _checkpointer(args.get("key"))
        answer: dict[str, Any] = {"ok": True, "token": process_token(), "pid": os.getpid()}
        if op == "hello":
            SERVER_ATTACHED = True
        elif op == "checkpoint":
            checkpointer.store.prepare()
            progress = _ProgressFile(checkpointer.store.path)
            result = checkpointer.checkpoint(reason=args.get("reason", "pause"), progress=progress)
            answer["result"] = result.to_json()
        elif op == "restore":
            result = checkpointer.restore(
                args.get("checkpoint_id"), args.get("names"), announce=False
            )
            answer["result"] = result.to_json()
        else:
            return json.dumps({"ok": False, "error": f"unknown request {op!r}"})
        return json.dumps(answer)
    except CheckpointError as err:
        return json.dumps({"ok": False, "error": str(err)})


def request_from_server(action: str, **data: Any) -> bool:
    """Ask the server (over iopub) to act on this kernel; False when no server listens."""
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if not SERVER_ATTACHED or kernel is None:
        return False
    content = {"action": action, **data}
    kernel.session.send(
        kernel.iopub_socket, REQUEST_MSG_TYPE, content, parent=kernel.get_parent("shell")
    )
    return True
