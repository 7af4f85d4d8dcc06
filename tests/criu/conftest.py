"""The criu backend's tests: a real CRIU (built once per machine by criu.sh) and a real server."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
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
def jp_server_config(pause_store: Path, criu_binary: str, request: pytest.FixtureRequest) -> dict:
    """The criu backend; a test parametrizes it indirectly with more PauseApp settings."""
    return pause_server_config(
        pause_store, backend="criu", criu_binary=criu_binary, **getattr(request, "param", {})
    )


@pytest.fixture
def server_url(jp_http_port: int, jp_base_url: str) -> str:
    return f"http://localhost:{jp_http_port}{jp_base_url}".rstrip("/")


def criu_lock_tables() -> set[str]:
    if shutil.which("nft") is None:  # (criu.sh installs it with criu)
        return set()
    done = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    return {line.split()[-1] for line in done.stdout.splitlines() if " CRIU-" in line}


@pytest.fixture(autouse=True)
def no_network_lock_left() -> Iterator[None]:
    """A test that leaves a kernel paused (its image goes with tmp_path) leaves criu's
    network lock of it behind: lifted here, so no test drops another's packets."""
    before = criu_lock_tables()
    yield
    for table in criu_lock_tables() - before:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)
