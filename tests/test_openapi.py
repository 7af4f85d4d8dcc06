"""The REST API as a contract: ``openapi.json`` is valid, served, complete, and holds under fuzzing.

Every answer the other tests get is checked against the document (``openapi_contract``);
here schemathesis generates requests for every endpoint against a real server process with
real kernels: no answer may be a 5xx or differ from what the document describes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from tornado.httpclient import HTTPClientError

from jupyter_pause.contract import openapi_document
from jupyter_pause.server.routes import handlers
from jupyter_pause.server.states import STATES

from . import openapi_contract
from .server_process import free_port

#: Requests schemathesis makes per endpoint and phase: bounded, so the suite stays fast.
FUZZ_EXAMPLES = 100
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def test_the_document_is_valid_openapi_and_names_every_endpoint() -> None:
    document = openapi_document()
    validate(document)
    routes = {
        re.sub(r"\(\?P<path>\.\+\)", "{path}", pattern)
        for pattern, _handler in handlers()
        if "(/.*)?" not in pattern  # the JSON 404 for everything else
    }
    assert routes == set(document["paths"])


def test_the_documented_states_are_the_servers() -> None:
    session = openapi_document()["components"]["schemas"]["Session"]
    assert session["properties"]["state"]["enum"] == list(STATES)


async def test_the_document_is_served_to_authenticated_callers(jp_fetch: Any) -> None:
    response = await jp_fetch("jupyter-pause", "openapi.json")
    served = json.loads(response.body)
    assert served["servers"] == [{"url": "/a%40b"}]  # pytest-jupyter's base URL
    assert {k: v for k, v in served.items() if k != "servers"} == {
        k: v for k, v in openapi_document().items() if k != "servers"
    }
    openapi_contract.check("GET", "/jupyter-pause/openapi.json", 200, served)
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("jupyter-pause", "openapi.json", headers={"Authorization": ""})
    assert refused.value.code == 403


async def test_unknown_endpoints_answer_json_404(jp_fetch: Any) -> None:
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("jupyter-pause", "sessions/")
    assert missing.value.code == 404
    assert json.loads(missing.value.response.body)["message"].startswith(
        "No jupyter_pause endpoint '/a%40b/jupyter-pause/sessions/'"
    )


# -- fuzzing a real server ------------------------------------------------------------------------
def _request(url: str, token: str, method: str = "GET", body: Any = None) -> Any:
    request = urllib.request.Request(url, method=method)
    request.add_header("Authorization", f"token {token}")
    if body is not None:
        request.data = json.dumps(body).encode()
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``jupyter server`` in its own process with jupyter_pause, one notebook's kernel running."""
    port, token = free_port(), secrets.token_hex(16)
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}},
                "PauseApp": {
                    "store_root": str(tmp_path / "store"),
                    "gpu_count": 1,
                    "busy_wait_seconds": 1.0,
                },
            }
        )
    )
    (tmp_path / "root").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_PAUSE_")}
    env.update(
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
    )
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path / 'root'}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _request(url + "jupyter-pause/status", token)
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, (tmp_path / "server.log").read_text()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        # A notebook with a real kernel: the document's example path, so the fuzzer's
        # pauses, checkpoints and resumes act on it.
        _request(
            url + "api/sessions",
            token,
            "POST",
            {"path": "fuzz.ipynb", "name": "fuzz.ipynb", "type": "notebook", "kernel": {}},
        )
        yield url, token
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_fuzzing_every_endpoint_finds_no_5xx_and_no_schema_violation(
    live_server: tuple[str, str], tmp_path: Path
) -> None:
    url, token = live_server
    report = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            url + "jupyter-pause/openapi.json",
            "--header",
            f"Authorization: token {token}",
            "--checks",
            CHECKS,
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            str(FUZZ_EXAMPLES),
            "--seed",
            "11",
            "--generation-database",
            "none",
            "--request-timeout",
            "60",
            "--workers",
            "1",
            "--no-color",
            "--report",
            "json",
            "--report-json-path",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    summary = json.loads(report.read_text())
    operations = summary["operations"]
    # Every operation but the document's own URL, which schemathesis leaves out.
    assert operations["tested"] == operations["total"] == len(openapi_document()["paths"]) - 1
    assert summary["test_cases"]["generated"] >= 500
    assert summary["test_cases"]["with_failures"] == summary["test_cases"]["errored"] == 0
