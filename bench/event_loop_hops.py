"""What gateway-provisioners' response manager costs the server's event loop, and its fix.

Every kernel-pod server runs upstream's ``ResponseManager`` from its first kernel pod on: the
listening socket where each pod's launcher sends its kernel's connection info. Upstream accepts
on it every 0.1 ms with a 10 ms socket timeout; ``unblock_responses``
(``backends/kernel_pod.py``, called by the kernel-pod provisioner) makes the socket non-blocking instead. Compared on one
tornado event loop, as jupyter-server runs it:

* ``none``: no response manager (a server before its first kernel pod);
* ``upstream``: the response manager as gateway-provisioners starts it;
* ``unblocked``: the same, after ``unblock_responses``.

Measured for each: one pass of the event loop (``await asyncio.sleep(0)``, ``--hops`` times;
each await of a server coroutine, each websocket message and each kernel output costs at least
one), and a small HTTP request to a handler on the same loop (``--requests`` times, tornado's
client, as a notebook's REST calls); then one launcher's connection info, sent to the socket and
decoded (the response manager's work, which must still happen). Methods run in rotated order
each round; the table gives medians (ranges) over ``--rounds`` rounds and ratios to ``none``.

    python bench/event_loop_hops.py --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.netutil import bind_sockets
from tornado.web import Application, RequestHandler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway_provisioners.response_manager import ResponseManager

from jupyter_pause.backends.kernel_pod import unblock_responses

METHODS = ("none", "upstream", "unblocked")


class Status(RequestHandler):
    def get(self) -> None:
        self.write({"ok": True})


async def loop_pass_us(hops: int) -> float:
    started = time.perf_counter()
    for _ in range(hops):
        await asyncio.sleep(0)
    return (time.perf_counter() - started) / hops * 1e6


async def request_ms(url: str, requests: int) -> float:
    client = AsyncHTTPClient()
    started = time.perf_counter()
    for _ in range(requests):
        await client.fetch(url)
    return (time.perf_counter() - started) / requests * 1e3


def send_connection_info(manager: Any, kernel_id: str) -> None:
    """What ``launch_ipykernel.py`` sends (payload version 1, as gateway-provisioners 0.4
    decodes it), from a thread as the launcher would from its pod."""
    from Cryptodome.Cipher import AES, PKCS1_v1_5
    from Cryptodome.PublicKey import RSA
    from Cryptodome.Util.Padding import pad

    info = {"kernel_id": kernel_id, "shell_port": 1, "iopub_port": 2, "stdin_port": 3}
    info.update({"control_port": 4, "hb_port": 5, "ip": "127.0.0.1", "key": "k"})
    info.update({"transport": "tcp", "signature_scheme": "hmac-sha256", "pid": 1})
    info.update({"pgid": 1, "comm_port": 6})
    aes_key = uuid.uuid4().hex[:16].encode()
    cipher = AES.new(aes_key, AES.MODE_ECB)
    payload = base64.b64encode(cipher.encrypt(pad(json.dumps(info).encode(), 16)))
    public = RSA.import_key(base64.b64decode(manager.public_key))
    key = base64.b64encode(PKCS1_v1_5.new(public).encrypt(aes_key))
    message = {"version": 1, "key": key.decode(), "conn_info": payload.decode()}
    host, port = manager.response_address.split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(base64.b64encode(json.dumps(message).encode()))


async def connection_info_ms(manager: Any) -> float:
    kernel_id = str(uuid.uuid4())
    manager.register_event(kernel_id)
    started = time.perf_counter()
    sent = asyncio.get_running_loop().run_in_executor(
        None, send_connection_info, manager, kernel_id
    )
    while True:  # as the provisioner asks: each wait is upstream's 5 ms
        try:
            info = await manager.get_connection_info(kernel_id)
            break
        except TimeoutError:
            await asyncio.sleep(0)
    await sent
    assert info["kernel_id"] == kernel_id, info
    return (time.perf_counter() - started) * 1e3


async def measure(method: str, url: str, hops: int, requests: int) -> dict[str, float]:
    manager = None
    if method != "none":
        manager = ResponseManager()  # its own socket and periodic callback, as instance() makes
        if method == "unblocked":
            unblock_responses(manager)
        await asyncio.sleep(0.2)  # its periodic callback runs
    try:
        result = {
            "loop pass (µs)": await loop_pass_us(hops),
            "HTTP request (ms)": await request_ms(url, requests),
        }
        if manager is not None:
            result["connection info (ms)"] = await connection_info_ms(manager)
        return result
    finally:
        if manager is not None:
            await retire(manager)


async def retire(manager: Any) -> None:
    """Stop a response manager and close its socket, once its call in flight returned (an
    empty connection ends one that waits for a connection)."""
    listening = manager._response_socket
    address = manager.response_address
    manager.stop_response_manager()
    manager.log.setLevel(logging.CRITICAL)  # the empty connection's "failure"
    host, port = address.split(":")
    await asyncio.get_running_loop().run_in_executor(
        None, lambda: socket.create_connection((host, int(port))).close()
    )
    await asyncio.sleep(0.1)
    listening.close()


def fmt(values: list[float]) -> str:
    median = statistics.median(values)
    return f"{median:.3g} ({min(values):.3g}-{max(values):.3g})"


async def main(args: argparse.Namespace) -> None:
    [listening] = bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
    server = HTTPServer(Application([("/status", Status)]))
    server.add_sockets([listening])
    url = f"http://127.0.0.1:{listening.getsockname()[1]}/status"
    results: dict[str, dict[str, list[float]]] = {m: {} for m in METHODS}
    for round_number in range(args.rounds):
        shift = round_number % len(METHODS)
        for method in METHODS[shift:] + METHODS[:shift]:
            measured = await measure(method, url, args.hops, args.requests)
            for name, value in measured.items():
                results[method].setdefault(name, []).append(value)
    server.stop()

    print(f"\n{args.rounds} rounds, methods in rotated order; median (range)\n")
    names = ["loop pass (µs)", "HTTP request (ms)", "connection info (ms)"]
    print("| Method | " + " | ".join(names) + " | loop pass vs none |")
    print("|---" * (len(names) + 2) + "|")
    base = statistics.median(results["none"]["loop pass (µs)"])
    for method in METHODS:
        cells = [fmt(results[method][n]) if n in results[method] else "-" for n in names]
        ratio = statistics.median(results[method]["loop pass (µs)"]) / base
        print(f"| {method} | " + " | ".join(cells) + f" | {ratio:.0f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hops", type=int, default=300)
    parser.add_argument("--requests", type=int, default=30)
    IOLoop.current().run_sync(lambda: main(parser.parse_args()))
