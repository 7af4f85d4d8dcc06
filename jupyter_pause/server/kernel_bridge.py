"""The server's side of talking to a kernel: requests over the kernel's own ZMQ channels.

Requests are silent execute requests carrying one *user expression* (see
``kernel.server_calls``): no history entry, no output in the notebook, no browser needed.
A watcher per kernel listens on iopub for what the orchestrator needs to know: busy/idle,
cells executed, and ``%pause`` requests.
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
from ..kernel.server_calls import REQUEST_MSG_TYPE
from ..records import KernelActivity

log = logging.getLogger(__name__)

#: How long a new iopub subscriber waits for ipykernel's greeting (``iopub_welcome``, sent
#: by ipykernel >= 7 also while a cell runs) before it asks over the shell channel instead.
WELCOME_SECONDS = 3.0
#: How long after our own request its last messages (the kernel's "idle") have reached
#: jupyter-server's activity tracking, before we take that activity back.
ACTIVITY_SETTLE_SECONDS = 0.5


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
        """Evaluate ``server_calls.call(op, args)`` in the kernel; returns its JSON answer."""
        client = self._client(kernel_id)
        before = getattr(self.kernel_manager.get_kernel(kernel_id), "last_activity", None)
        asked_at = time.time()
        client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        expression = (
            "__import__('jupyter_pause.kernel.server_calls', fromlist=['call'])"
            f".call({op!r}, {json.dumps(args)!r})"
        )
        try:
            msg_id = client.execute(
                "",
                silent=True,
                store_history=False,
                user_expressions={"r": expression},
                allow_stdin=False,
            )
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KernelCallError(f"the kernel did not answer within {timeout:.0f} s")
                try:
                    reply = await client.get_shell_msg(timeout=remaining)
                except Exception:  # queue.Empty from jupyter_client: a timeout
                    continue
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
        finally:
            client.stop_channels()
            if before is not None and kernel_id in self._watched:
                asyncio.get_running_loop().call_later(
                    ACTIVITY_SETTLE_SECONDS, self._forget_own_activity, kernel_id, before, asked_at
                )
        return _parse_reply(reply)

    async def control(self, kernel_id: str, op: str, timeout: float = 10.0) -> dict[str, Any]:
        """Ask the kernel extension over the control channel (``kernel.control``): answered
        at once, even while a cell runs. KernelCallError when no answer comes."""
        client = self._client(kernel_id)
        client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
        try:
            request = client.session.msg(control.REQUEST_MSG_TYPE, {"op": op})
            client.control_channel.send(request)
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KernelCallError(
                        f"the kernel did not answer on its control channel within {timeout:.0f} s"
                        " (jupyter_pause not loaded in it, or an ipykernel older than 6)"
                    )
                try:
                    reply = await client.control_channel.get_msg(timeout=remaining)
                except Exception:  # queue.Empty from jupyter_client: a timeout
                    continue
                if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                    break
        finally:
            client.stop_channels()
        answer = reply["content"]
        if not answer.get("ok"):
            raise KernelCallError(str(answer.get("error") or answer))
        return answer

    def _forget_own_activity(self, kernel_id: str, before: datetime, asked_at: float) -> None:
        """jupyter-server counts every message of a kernel as activity (its ``/api/status``,
        its culler and external idle cullers read it): take back what our own request added,
        unless the watcher saw the user do something meanwhile (then it stays as it is)."""
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
            if state == "busy" and execute and not ours and not activity.busy:
                activity.busy, activity.busy_since = True, now
            elif state == "idle" and execute and activity.busy:
                # The shell runs one execute request at a time: idle after any of them (ours
                # too) means no cell is running, also when busy was only inferred at attach.
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
