"""Every answer a test gets from ``/jupyter-pause/`` is checked against ``openapi.json``.

The document is the contract the frontend, the CLI and anyone's scripts rely on: an answer
with a status, a field or a type it does not describe fails the test that received it.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from jupyter_pause.contract import json_pointer, openapi_document, validator


@cache
def _templates() -> list[tuple[re.Pattern[str], str]]:
    """(regex of the URL path, the document's path template), ``{path}`` spanning slashes."""
    return [
        (re.compile("^" + re.escape(template).replace(r"\{path\}", ".+") + "$"), template)
        for template in openapi_document()["paths"]
    ]


def check(method: str, url_path: str, status: int, body: Any) -> None:
    """Raise AssertionError unless the document describes this answer exactly."""
    document = openapi_document()
    matches = [t for pattern, t in _templates() if pattern.match(url_path)]
    assert matches, f"{url_path} is not in openapi.json"
    template = min(matches, key=len)  # a literal path over a template that also matches
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
    if "application/json" not in response.get("content", {}):
        assert body is None, f"{method} {template} {status} has a body the document lacks"
        return
    schema = validator(json_pointer(*where, "content", "application/json", "schema"))
    errors = sorted(schema.iter_errors(body), key=lambda e: list(e.absolute_path))
    assert not errors, f"{method} {url_path} {status}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]
    )
