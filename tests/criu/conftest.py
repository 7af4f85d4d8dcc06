"""The criu backend's tests: a real CRIU (built once per machine by criu.sh) and a real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..built_tools import CannotRun, built
from ..servers import pause_server_config

BUILD_SCRIPT = Path(__file__).resolve().parent / "criu.sh"


@pytest.fixture(scope="session")
def criu_binary() -> str:
    try:
        return built(
            BUILD_SCRIPT,
            "the criu backend's tests need CRIU 4.1.1 (Debian bookworm's 3.17 fails on Linux "
            ">= 6.13), built from Debian trixie's source package",
        )
    except CannotRun as err:
        pytest.skip(f"CRIU TESTS SKIPPED: {err}")


@pytest.fixture
def jp_server_config(pause_store: Path, criu_binary: str) -> dict:
    return pause_server_config(pause_store, backend="criu", criu_binary=criu_binary)


@pytest.fixture
def server_url(jp_http_port: int, jp_base_url: str) -> str:
    return f"http://localhost:{jp_http_port}{jp_base_url}".rstrip("/")
