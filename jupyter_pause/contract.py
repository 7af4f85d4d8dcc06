"""The REST API's contract: ``openapi.json`` beside this module, and checks against it.

``routes`` serves the document; ``records`` checks what it reads back from a session file
against the very schemas the API promises, so a damaged file can never make an answer break
them; the tests check every answer they get.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

#: The OpenAPI 3.1 description of every endpoint below ``/jupyter-pause/``.
OPENAPI_FILE = Path(__file__).with_name("openapi.json")
_URN = "urn:jupyter-pause-openapi"


@cache
def openapi_document() -> dict[str, Any]:
    return json.loads(OPENAPI_FILE.read_text())


@cache
def _registry() -> Registry:
    resource = Resource.from_contents(openapi_document(), default_specification=DRAFT202012)
    return Registry().with_resource(_URN, resource)


def json_pointer(*parts: str) -> str:
    """``/paths/~1jupyter-pause~1status/get``: a JSON pointer to a place in the document."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


@cache
def validator(pointer: str) -> Draft202012Validator:
    """A validator for the schema at ``pointer`` in the document, its references resolved."""
    return Draft202012Validator({"$ref": f"{_URN}#{pointer}"}, registry=_registry())


def session_field_conforms(name: str, value: Any) -> bool:
    """Whether ``value`` is what the API promises for the session field ``name``."""
    pointer = json_pointer("components", "schemas", "Session", "properties", name)
    return validator(pointer).is_valid(value)
