"""The server's side of talking to a kernel: requests over the kernel's own ZMQ channels.

Requests are shell messages of our own type (``kernel.server_calls``; control messages for
what cannot wait for a running cell, ``kernel.control``): no history entry, no output in the
notebook, no browser needed. A watcher per kernel listens on iopub for what the orchestrator
needs to know: busy/idle, cells executed, and ``%pause`` requests.

None of it is the user's activity. jupyter-server takes every iopub message of a kernel for
activity unless its type, or its parent request's, is one of the kernel manager's
``untracked_message_types`` (the clock its culler, JupyterHub's idle culler and Kubeflow's
culler read): ``untrack_own_messages`` adds ours there.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import zmq
from jupyter_client.session import Session

from ..kernel import control
from ..kernel.server_calls import CALL_MSG_TYPE, REQUEST_MSG_TYPE
from ..records import KernelActivity

log = logging.getLogger(__name__)

#: How long a new iopub subscriber waits for ipykernel's greeting (``iopub_welcome``, sent
#: by ipykernel >= 7 also while a cell runs) before it asks over the shell channel instead.
WELCOME_SECONDS = 3.0
#: How long after our own request its last messages (the kernel's "idle") have reached
#: jupyter-server's activity tracking, before we take that activity back (a kernel asked the
#: old way only: an execute request always counts).
ACTIVITY_SETTLE_SECONDS = 0.5
#: The messages the server's own work makes a kernel publish on iopub, by their type or their
#: parent request's: our shell and control requests, the kernel's requests to the server, and
#: ipykernel's greeting of each new iopub subscriber (ours, and a browser tab reconnecting:
#: an open tab is not activity either).
OWN_MESSAGE_TYPES = (CALL_MSG_TYPE, control.REQUEST_MSG_TYPE, REQUEST_MSG_TYPE, "iopub_welcome")


def untrack_own_messages(kernel_manager: Any) -> None:
    """Tell jupyter-server not to count the server's own kernel messages as activity (its
    ``untracked_message_types``, the admin's own list kept)."""
    untracked = getattr(kernel_manager, "untracked_message_types", None)
    if untracked is None:  # a kernel manager that tracks no activity
        return
    missing = [kind for kind in OWN_MESSAGE_TYPES if kind not in untracked]
    if missing:
        kernel_manager.untracked_message_types = [*untracked, *missing]


class KernelCallError(Exception):
    """The kernel could not answer; the message says why in words a user can act on."""


class KernelBridge:
    """Calls into kernels and watches them, given jupyter-server's kernel manager."""

    def __init__(self, kernel_manager: Any) -> None:
        self.kernel_manager = kernel_manager
        self._own_sessions: set[str] = set()  # our clients' session ids: not user activity
        self._watched: dict[str, KernelActivity] = {}  # kernel id -> what its watcher saw

    def _client(self, kernel_id: str) -> Any:
        # jupyter-server's kernel manager answers an unknown id with tornado's HTTPError 404,
        # jupyter_client's with KeyError: ask whether it is there instead of catching either.
        if kernel_id not in self.kernel_manager:
            raise KernelCallError(f"kernel {kernel_id} is not running")
        kernel = self.kernel_manager.get_kernel(kernel_id)
        # A session id of our own: the server's other clients share the kernel manager's, and
        # our silent requests must never count as the user's activity.
        session = Session(
            key=kernel.session.key,
            signature_scheme=kernel.session.signature_scheme,
            username="jupyter_pause",
        )
        client = kernel.client(session=session)
        self._own_sessions.add(session.session)
        return client

    async def call(self, kernel_id: str, op: str, timeout: float, **args: Any) -> dict[str, Any]:
        """Run ``server_calls.answer(op, args)`` in the kernel; returns its JSON answer."""
        client = self._client(kernel_id)
        client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        try:
            answer = await _shell_call(client, op, args, timeout)
            if answer is None:  # no handler yet: the old way loads the extension, and so it
                answer = await self._execute_call(client, kernel_id, op, args, timeout)
        finally:
            client.stop_channels()
        return answer

    async def _execute_call(
        self, client: Any, kernel_id: str, op: str, args: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        """The call as a user expression of a silent execute request, for a kernel whose
        extension is not loaded yet. jupyter-server counts an execute request as activity
        whatever it carries: taken back a moment later (``_forget_own_activity``)."""
        before = getattr(self.kernel_manager.get_kernel(kernel_id), "last_activity", None)
        asked_at = time.time()
        expression = (
            "__import__('jupyter_pause.kernel.current', fromlist=['server_call'])"
            f".server_call({op!r}, {json.dumps(args)!r})"
        )
        try:
            msg_id = client.execute(
                "",
                silent=True,
                store_history=False,
                user_expressions={"r": expression},
                allow_stdin=False,
            )
            reply = await _reply_to(client.get_shell_msg, msg_id, timeout)
        finally:
            if before is not None and kernel_id in self._watched:
                asyncio.get_running_loop().call_later(
                    ACTIVITY_SETTLE_SECONDS, self._forget_own_activity, kernel_id, before, asked_at
                )
        if reply is None:
            raise KernelCallError(f"the kernel did not answer within {timeout:.0f} s")
        return _parse_reply(reply)

    async def control(self, kernel_id: str, op: str, timeout: float = 10.0) -> dict[str, Any]:
        """Ask the kernel extension over the control channel (``kernel.control``): answered
        at once, even while a cell runs. KernelCallError when no answer comes."""
        client = self._client(kernel_id)
        client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
        try:
            request = client.session.msg(control.REQUEST_MSG_TYPE, {"op": op})
            client.control_channel.send(request)
            reply = await _reply_to(
                client.control_channel.get_msg, request["header"]["msg_id"], timeout
            )
        finally:
            client.stop_channels()
        if reply is None:
            raise KernelCallError(
                f"the kernel did not answer on its control channel within {timeout:.0f} s"
                " (jupyter_pause not loaded in it, or an ipykernel older than 6)"
            )
        answer = reply["content"]
        if not answer.get("ok"):
            raise KernelCallError(str(answer.get("error") or answer))
        return answer

    def _forget_own_activity(self, kernel_id: str, before: datetime, asked_at: float) -> None:
        """jupyter-server counts an execute request as activity (its ``/api/status``, its
        culler and external idle cullers read it): take back what our own one added, unless
        the watcher saw the user do something meanwhile (then it stays as it is)."""
        activity = self._watched.get(kernel_id)
        # Runs a moment after our request: a pause may have shut the kernel down meanwhile,
        # and then there is no activity left to take back.
        if kernel_id not in self.kernel_manager:
            return
        kernel = self.kernel_manager.get_kernel(kernel_id)
        if activity is None or activity.busy or activity.last_activity >= asked_at:
            return
        if kernel.last_activity > before:
            kernel.last_activity = before
            latest = [
                self.kernel_manager.get_kernel(other).last_activity
                for other in self.kernel_manager.list_kernel_ids()
            ]
            if hasattr(self.kernel_manager, "last_kernel_activity") and latest:
                self.kernel_manager.last_kernel_activity = max(latest)

    async def watch(
        self,
        kernel_id: str,
        activity: KernelActivity,
        on_event: Callable[[str, dict[str, Any]], Awaitable[None]],
    ) -> None:
        """Follow a kernel's iopub until it goes away (run as a task; cancel to stop)."""
        client = self._client(kernel_id)
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            # Returns once iopub delivers: from then on no busy/idle message is missed.
            first = await _iopub_ready(client)
            kernel = self.kernel_manager.get_kernel(kernel_id)
            if getattr(kernel, "execution_state", None) == "busy" and not activity.busy:
                activity.busy, activity.busy_since = True, time.time()  # busy since before we came
            activity.watching = True
            self._watched[kernel_id] = activity
            if first is not None:
                await self._on_iopub(first, activity, on_event)
            while True:
                try:
                    msg = await client.get_iopub_msg(timeout=5)
                except asyncio.CancelledError:
                    raise
                except zmq.ZMQError:  # the kernel and its sockets are gone
                    return
                except Exception:  # no message within the timeout: is the kernel still there?
                    if kernel_id not in self.kernel_manager:
                        return
                    continue
                await self._on_iopub(msg, activity, on_event)
        except RuntimeError as err:  # wait_for_ready: the kernel died before answering
            log.info("jupyter_pause: stopped watching kernel %s: %s", kernel_id, err)
        finally:
            activity.watching = False
            self._watched.pop(kernel_id, None)
            with contextlib.suppress(Exception):
                client.stop_channels()

    async def _on_iopub(
        self,
        msg: dict[str, Any],
        activity: KernelActivity,
        on_event: Callable[[str, dict[str, Any]], Awaitable[None]],
    ) -> None:
        kind = msg["msg_type"]
        parent = msg.get("parent_header") or {}
        ours = parent.get("session") in self._own_sessions
        now = time.time()
        if kind == "status":
            state = msg["content"].get("execution_state")
            execute = parent.get("msg_type") == "execute_request"
            shell = execute or parent.get("msg_type") == CALL_MSG_TYPE
            if state == "busy" and execute and not ours and not activity.busy:
                activity.busy, activity.busy_since = True, now
            elif state == "idle" and shell and activity.busy:
                # The shell runs one request at a time: idle after an execute request or one
                # of our calls means no cell is running, also when busy was only inferred at
                # attach.
                # (Control-channel requests, e.g. the debugger's, run beside a cell: ignored.)
                activity.busy_seconds += now - (activity.busy_since or now)
                activity.busy, activity.busy_since = False, None
                activity.last_activity = now
        elif kind == "execute_input" and not ours:
            idle_since = activity.last_activity
            activity.execution_count = msg["content"].get("execution_count")
            activity.cells_executed += 1
            activity.last_activity = now
            await on_event(
                "cell", {"execution_count": activity.execution_count, "idle_since": idle_since}
            )
        elif kind == REQUEST_MSG_TYPE:
            await on_event("request", dict(msg["content"]))


async def _shell_call(
    client: Any, op: str, args: dict[str, Any], timeout: float
) -> dict[str, Any] | None:
    """The kernel's answer to our shell request, or None when it has no handler for it.

    A kernel serves one shell request at a time, in order: a ``kernel_info_request`` sent right
    after ours is answered after ours where a handler answers it, and first where none does
    (ipykernel drops a message type it does not know, with no reply). No timing is involved.
    """
    request = client.session.msg(CALL_MSG_TYPE, {"op": op, "args": args})
    client.shell_channel.send(request)
    probe = client.kernel_info()
    reply = await _reply_to(client.get_shell_msg, (request["header"]["msg_id"], probe), timeout)
    if reply is None:
        raise KernelCallError(f"the kernel did not answer within {timeout:.0f} s")
    if reply["parent_header"].get("msg_id") == probe:
        return None
    return dict(reply["content"])


async def _reply_to(
    receive: Callable[..., Awaitable[dict[str, Any]]],
    msg_ids: str | tuple[str, ...],
    timeout: float,
) -> dict[str, Any] | None:
    """The first reply to one of ``msg_ids`` that ``receive`` (a channel's get) brings within
    ``timeout`` seconds; None when none came."""
    wanted = (msg_ids,) if isinstance(msg_ids, str) else msg_ids
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            reply = await receive(timeout=remaining)
        except Exception:  # queue.Empty from jupyter_client: a timeout
            continue
        if reply["parent_header"].get("msg_id") in wanted:
            return reply
    return None


async def _iopub_ready(client: Any) -> dict[str, Any] | None:
    """Return once the client's iopub subscription delivers; with a message it got meanwhile
    that the watcher must still see (None when there is none).

    ipykernel >= 7 greets every new subscriber (``iopub_welcome``) from its iopub thread, also
    while a cell runs (a kernel restored in the middle of one); older kernels are asked over
    the shell channel, which answers once the running cell is done.
    """
    deadline = time.monotonic() + WELCOME_SECONDS
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = await client.get_iopub_msg(timeout=remaining)
        except Exception:  # queue.Empty: no greeting
            break
        # Anything that arrives means the subscription is in place.
        return None if msg["msg_type"] == "iopub_welcome" else msg
    await client.wait_for_ready(timeout=120)
    return None


def _parse_reply(reply: dict[str, Any]) -> dict[str, Any]:
    content = reply["content"]
    if content.get("status") != "ok":
        raise KernelCallError(f"the kernel refused the request: {content.get('evalue', content)}")
    result = content.get("user_expressions", {}).get("r")
    if result is None:
        raise KernelCallError("the kernel returned no answer")
    if result.get("status") != "ok":
        ename, evalue = result.get("ename", "Error"), result.get("evalue", "")
        if ename == "ModuleNotFoundError":
            raise KernelCallError(
                "jupyter_pause is not installed in this kernel's environment: "
                "pip install jupyter_pause there, then restart the kernel"
            )
        raise KernelCallError(f"{ename}: {evalue}")
    text = result["data"]["text/plain"]
    return json.loads(ast.literal_eval(text))
