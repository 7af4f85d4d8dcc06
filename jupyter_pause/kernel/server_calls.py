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

from . import server_link
from .files import write_private
from .server_link import REQUEST_MSG_TYPE
from .token import process_token

#: What the server imports from here (the message type is ``server_link``'s).
__all__ = ["REQUEST_MSG_TYPE", "call"]


def _checkpointer(key: str | None) -> Any:
    from IPython import get_ipython

    from .current import current
    from .extension import load

    shell = get_ipython()
    checkpointer = load(shell) if shell is not None else current()
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
    from .api import CheckpointError

    args = json.loads(args_json)
    try:
        checkpointer = _checkpointer(args.get("key"))
        answer: dict[str, Any] = {"ok": True, "token": process_token(), "pid": os.getpid()}
        if op == "hello":
            server_link.SERVER_ATTACHED = True
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
