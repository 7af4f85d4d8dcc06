"""The workspace backend's configuration: what happens outside a pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from .servers import Server


@pytest.fixture
def jp_server_config(pause_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The workspace backend asked for where no pod is (no downward API variables)."""
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}},
        "PauseApp": {
            "store_root": str(pause_store),
            "backend": "workspace",
            "service_account_dir": str(tmp_path / "no-service-account"),
            "monitor_interval_seconds": 3600.0,
        },
    }


async def test_a_workspace_backend_without_a_pod_falls_back_to_local_and_loads(
    server: Server,
) -> None:
    # When the server started with the workspace backend but no POD_NAME/POD_NAMESPACE
    code, status = await server.call("GET", "status")

    # Then the extension loaded all the same, on the local backend
    assert code == 200 and status["backend"] == "local"
    code, listing = await server.call("GET", "snapshots")
    assert code == 200 and listing == {"snapshots": [], "problem": None}
