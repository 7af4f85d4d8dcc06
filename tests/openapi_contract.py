"""Every answer a test gets from ``/jupyter-pause/`` is checked against ``openapi.json``.

The document is the contract the frontend, the CLI and anyone's scripts rely on: an answer
with a status, a field or a type it does not describe fails the test that received it.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from jupyter_pause.routes import openapi_document

_URN = "urn:jupyter-pause-openapi"


@cache
def _registry() -> Registry:
    resource = Resource.from_contents(openapi_document(), default_specification=DRAFT202012)
    return Registry().with_resource(_URN, resource)


@cache
def _templates() -> list[tuple[re.Pattern[str], str]]:
    """(regex of the URL path, the document's path template), ``{path}`` spanning slashes."""
    return [
        (re.compile("^" + re.escape(template).replace(r"\{path\}", ".+") + "$"), template)
        for template in openapi_document()["paths"]
    ]


def _pointer(*parts: str) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def check(method: str, url_path: str, status: int, body: Any) -> None:
    """Raise AssertionError unless the document describes this answer exactly."""
    document = openapi_document()
    matches = [t for pattern, t in _templates() if pattern.match(url_path)]
    assert matches, f"{url_path} is not in openapi.json"
    template = min(matches, key=len)  # /sessions/{path} over nothing, literal paths first
    operation = document["paths"][template].get(method.lower())
    assert operation is not None, f"{method} {template} is not in openapi.json"
    responses = operation["responses"]
    assert str(status) in responses, f"{method} {template} answered {status}, not documented"
    response = responses[str(status)]
    where = ("paths", template, method.lower(), "responses", str(status))
    if "$ref" in response:
        name = response["$ref"].rsplit("/", 1)[1]
        response = document["components"]["responses"][name]
        where = ("components", "responses", name)
    schema = response.get("content", {}).get("application/json", {}).get("schema")
    if schema is None:
        assert body is None, f"{method} {template} {status} has a body the document lacks"
        return
    pointer = _pointer(*where, "content", "application/json", "schema")
    validator = Draft202012Validator({"$ref": f"{_URN}#{pointer}"}, registry=_registry())
    errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    assert not errors, f"{method} {url_path} {status}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]
    )
