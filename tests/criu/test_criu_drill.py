"""The drill's upgrade check on a server of its own finds the kept drill notebook's process."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..drill_own_server import MAIN, keep_then_check

pytest.importorskip("torch")
pytest.importorskip("matplotlib")


def test_an_own_servers_kept_drill_comes_back_live_under_the_next_own_server(
    tmp_path: Path, criu_binary: str
) -> None:
    # Given the criu backend configured where both runs' servers read their config
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_server_config.py").write_text(
        f"c.PauseApp.criu_binary = {criu_binary!r}\n"
    )
    # When `drill --own-server --keep` runs, then `--own-server --upgrade-check` in another
    # process with another server on the same kept folder
    _kept, checked = keep_then_check(tmp_path, "--backend", "criu")
    # Then the kept notebook's process itself came back
    assert checked.startswith(f"{MAIN}: live process: its liveness token is the one of"), checked
