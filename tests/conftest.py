"""Shared pytest fixtures: a real Jupyter server with the jupyter_pause extension enabled."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.policy import KERNEL_POLICY_ENV

from .cli_runner import Cli
from .kernels import Kernel, KernelFactory
from .servers import Server, pause_server_config

pytest_plugins = ("pytest_jupyter.jupyter_server",)

#: Variables the server extension exports to kernels; each test starts without them.
_EXPORTED = (
    "JUPYTER_PAUSE_STORE",
    *(env for _trait, env, _read in KERNEL_POLICY_ENV),  # the policy, however it grows
    "JUPYTER_PAUSE_NOTEBOOK",
    "JUPYTER_PAUSE_AUTOLOAD",
)


@pytest.fixture(autouse=True)
def _isolated_pause_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo what a test server exported to os.environ, so tests cannot leak policy."""
    for name in _EXPORTED:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def pause_store(tmp_path: Path) -> Path:
    return tmp_path / "pause-store"


@pytest.fixture
def jp_server_config(pause_store: Path, request: pytest.FixtureRequest) -> dict:
    """The test server's config; a test parametrizes it indirectly with PauseApp settings."""
    return pause_server_config(pause_store, **getattr(request, "param", {}))


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def start_kernel(tmp_path: Path, store: Path) -> Iterator[KernelFactory]:
    """Start real ipykernel processes writing to ``store``; all are stopped afterwards."""
    kernels: list[Kernel] = []
    workdir = tmp_path / "work"
    workdir.mkdir()

    def start(cwd: Path | None = None, **env: str) -> Kernel:
        kernel = Kernel(cwd or workdir, {"JUPYTER_PAUSE_STORE": str(store), **env})
        kernels.append(kernel)
        return kernel

    yield start
    for kernel in kernels:
        kernel.close()


@pytest.fixture
def server(jp_fetch: Any, jp_serverapp: Any) -> Server:
    return Server(jp_fetch, jp_serverapp)


@pytest.fixture
def jp(jp_serverapp: Any, jp_http_port: int, jp_base_url: str, jp_runtime_dir: Path) -> Cli:
    url = f"http://localhost:{jp_http_port}{jp_base_url}"
    return Cli(url, jp_serverapp.identity_provider.token, jp_runtime_dir)


def _mount_tiny(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


@pytest.fixture
def tiny_store(pause_store: Path) -> Any:
    if os.geteuid() != 0 or not _mount_tiny(pause_store):
        pytest.skip("needs permission to mount a small tmpfs to fill up")
    yield pause_store
    subprocess.run(["umount", "-l", str(pause_store)], check=False)


# -- skips are loud -------------------------------------------------------------------------------
#: The only skips a run may have and still pass, each with why it is acceptable there.
#: Any other skip fails the session (set JUPYTER_PAUSE_ALLOW_SKIPS=1 to run a partial suite
#: on purpose, e.g. without root for the tmpfs tests).
ALLOWED_SKIPS = {
    "this filesystem refuses O_DIRECT": (
        "a store on tmpfs or a network filesystem cannot take O_DIRECT; the page-cache path "
        "those files then use is tested everywhere"
    ),
}

_skips: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and isinstance(report.longrepr, tuple):
        _skips.append((report.nodeid, str(report.longrepr[2]).removeprefix("Skipped: ")))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("JUPYTER_PAUSE_ALLOW_SKIPS") == "1":
        return
    unexpected = [
        (test, why)
        for test, why in _skips
        if not any(why.startswith(allowed) for allowed in ALLOWED_SKIPS)
    ]
    if unexpected:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "skips that are not allowed (tests/conftest.py ALLOWED_SKIPS)")
            for test, why in unexpected:
                reporter.write_line(f"{test}: {why}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
