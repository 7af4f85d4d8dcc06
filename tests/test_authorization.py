"""Every verb of jupyter_pause is authorised like jupyter-server's own handlers.

A deployment's Authorizer (JupyterHub's RBAC, a read-only role) decides per resource and
action; jupyter_pause's resource is ``jupyter_pause``, and a GET is a ``read``, any other
verb a ``write``. A user refused on that resource must be refused on every verb of every
endpoint, while the rest of the server keeps working for them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from jupyter_server.auth.authorizer import Authorizer
from tornado.httpclient import HTTPClientError

from jupyter_pause.server.routes import AUTH_RESOURCE, NotFoundHandler, handlers

from .servers import pause_server_config

VERBS = ("get", "post", "put", "patch", "delete")


class RefusePause(Authorizer):
    """Everything is allowed but jupyter_pause."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != AUTH_RESOURCE


class ReadOnlyPause(Authorizer):
    """jupyter_pause may be read (status, timelines), never acted on."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != AUTH_RESOURCE or action == "read"


def endpoints() -> list[tuple[str, str]]:
    """(verb, URL path) of every verb every handler defines, with a notebook path filled in."""
    found = []
    for pattern, handler in handlers():
        if handler is NotFoundHandler:
            continue
        url = re.sub(r"\(\?P<path>[^)]*\)", "nb.ipynb", pattern)
        for verb in VERBS:
            if verb in vars(handler):
                found.append((verb.upper(), url.lstrip("/")))
    return found


async def status_of(jp_fetch: Any, verb: str, url: str) -> int:
    body = None if verb == "GET" else json.dumps({})
    try:
        response = await jp_fetch(*url.split("/"), method=verb, body=body)
    except HTTPClientError as err:
        return err.code
    return response.code


def test_the_routes_cover_every_endpoint() -> None:
    # The tests below walk the routes: they must see the whole API (no endpoint forgotten)
    assert {url.split("/")[1] for _, url in endpoints()} == {
        "status",
        "sessions",
        "checkpoint",
        "pause",
        "resume",
        "activity",
        "accept",
        "cancel",
        "checkpoints",
        "timeline",
        "gc",
        "openapi.json",
        "usage",
        "snapshots",
        "export",
        "import",
        "trust",
    }


class TestRefused:
    @pytest.fixture
    def jp_server_config(self, pause_store: Any) -> dict:
        config = pause_server_config(pause_store)
        config["ServerApp"]["authorizer_class"] = RefusePause
        return config

    async def test_every_verb_is_refused_but_the_server_still_serves(self, jp_fetch: Any) -> None:
        for verb, url in endpoints():
            assert await status_of(jp_fetch, verb, url) == 403, (verb, url)
        assert await status_of(jp_fetch, "GET", "api/status") == 200


class TestReadOnly:
    @pytest.fixture
    def jp_server_config(self, pause_store: Any) -> dict:
        config = pause_server_config(pause_store)
        config["ServerApp"]["authorizer_class"] = ReadOnlyPause
        return config

    async def test_reading_is_allowed_acting_is_refused(self, jp_fetch: Any) -> None:
        for verb, url in endpoints():
            code = await status_of(jp_fetch, verb, url)
            if verb == "GET":
                # allowed: an answer about the (unknown) notebook, never a refusal
                assert code in (200, 404), (verb, url, code)
            else:
                assert code == 403, (verb, url, code)
