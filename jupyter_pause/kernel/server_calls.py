"""What the jupyter_pause server asks of a kernel, over the kernel's own channels.

A request is a shell message of our own type (``CALL_MSG_TYPE``, content ``{op, args}``),
answered by the handler ``install`` puts in ipykernel's ``shell_handlers`` when the extension
loads: it queues behind a running cell like any shell request, lands in no history or output,
and works with no browser open. jupyter-server counts every execute request a kernel serves
as the user's activity (what its culler and the Hub's and Kubeflow's cullers read), so the
server's own requests are of a type it tells jupyter-server not to count.

A kernel without the handler yet (the extension not loaded: ``load_in_kernels`` off) is asked
once the old way: ``current.server_call(op, args_json)`` as a *user expression* of a silent
execute request, which loads the extension and so the handler. Every answer is JSON; failures
are answers too (``{"ok": false, "error": ...}``), so the server never has to parse a
traceback. This module imports nothing above it (the extension and ``current`` import it).
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

#: The server's request on the shell channel, and the kernel's reply.
CALL_MSG_TYPE = "jupyter_pause_call_request"
CALL_REPLY_MSG_TYPE = "jupyter_pause_call_reply"

#: What the server imports from here (the iopub message type is ``server_link``'s).
__all__ = ["CALL_MSG_TYPE", "CALL_REPLY_MSG_TYPE", "REQUEST_MSG_TYPE", "answer"]


def install(kernel: Any, checkpointer: Any) -> None:
    """Answer the server's shell requests in this kernel, with the extension's ``checkpointer``
    (a no-op outside a kernel)."""
    handlers = getattr(kernel, "shell_handlers", None)
    if isinstance(handlers, dict):
        handlers[CALL_MSG_TYPE] = _ShellHandler(kernel, checkpointer)


def uninstall(kernel: Any) -> None:
    handlers = getattr(kernel, "shell_handlers", None)
    if isinstance(handlers, dict) and isinstance(handlers.get(CALL_MSG_TYPE), _ShellHandler):
        del handlers[CALL_MSG_TYPE]


class _ShellHandler:
    """ipykernel calls it with (stream, idents, message) between cells, on the main thread."""

    def __init__(self, kernel: Any, checkpointer: Any) -> None:
        self.kernel = kernel
        self.checkpointer = checkpointer

    def __call__(self, stream: Any, idents: Any, request: dict[str, Any]) -> None:
        content = request.get("content") or {}
        try:
            reply = answer(self.checkpointer, str(content.get("op")), content.get("args") or {})
        except Exception as err:  # always answer: the server would wait for its timeout
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        self.kernel.session.send(stream, CALL_REPLY_MSG_TYPE, reply, request, idents)


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


def answer(checkpointer: Any, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one server request with this kernel's checkpointer; always a JSON-ready answer."""
    from .api import CheckpointError

    try:
        key = args.get("key")
        if key and checkpointer.key != key:
            checkpointer.set_key(key)  # the server knows the notebook path for certain
        reply: dict[str, Any] = {"ok": True, "token": process_token(), "pid": os.getpid()}
        if op == "hello":
            server_link.SERVER_ATTACHED = True
        elif op == "checkpoint":
            checkpointer.store.prepare()
            progress = _ProgressFile(checkpointer.store.path)
            result = checkpointer.checkpoint(reason=args.get("reason", "pause"), progress=progress)
            reply["result"] = result.to_json()
        elif op == "restore":
            result = checkpointer.restore(
                args.get("checkpoint_id"), args.get("names"), announce=False
            )
            reply["result"] = result.to_json()
        else:
            return {"ok": False, "error": f"unknown request {op!r}"}
        return reply
    except CheckpointError as err:
        return {"ok": False, "error": str(err)}
