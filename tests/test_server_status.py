"""The ``GET /jupyter-pause/status`` endpoint of the server extension."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

import jupyter_pause


async def test_status_answers_version_and_backend(jp_fetch):
    # Given a server with jupyter_pause enabled
    # When an authenticated client asks for the status
    response = await jp_fetch("jupyter-pause", "status")

    # Then it answers the package version and the local backend
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    body = json.loads(response.body)
    assert body["version"] == jupyter_pause.__version__
    assert body["backend"] == "local"
    # and the accelerators the admin gave it, and the effective policy
    assert body["resources"]["gpus_total"] == 1 and body["resources"]["gpus_free"] == 1
    assert body["policy"]["gpus_per_kernel"] == 1 and body["policy"]["keep_last"] == 5


async def test_status_refuses_a_request_without_token(jp_fetch):
    # Given a server that requires a token
    # When a client calls the endpoint with no credentials
    with pytest.raises(HTTPClientError) as excinfo:
        await jp_fetch("jupyter-pause", "status", headers={"Authorization": ""})

    # Then the request is refused
    assert excinfo.value.code == 403


async def test_status_refuses_a_wrong_token(jp_fetch):
    # Given a server that requires a token
    # When a client presents a token the server did not issue
    with pytest.raises(HTTPClientError) as excinfo:
        await jp_fetch(
            "jupyter-pause", "status", headers={"Authorization": "token not-the-server-token"}
        )

    # Then the request is refused
    assert excinfo.value.code == 403


async def test_status_is_only_a_get_endpoint(jp_fetch):
    # Given the read-only status endpoint
    # When a client posts to it
    with pytest.raises(HTTPClientError) as excinfo:
        await jp_fetch("jupyter-pause", "status", method="POST", body="{}")

    # Then the method is not allowed
    assert excinfo.value.code == 405


async def test_server_extension_is_loaded(jp_serverapp):
    # Given the test server
    # Then jupyter_pause is among its enabled and loaded extensions
    manager = jp_serverapp.extension_manager
    assert "jupyter_pause" in manager.extensions
    assert manager.extensions["jupyter_pause"].enabled
    assert "jupyter_pause" in jp_serverapp.extension_manager.extension_apps
