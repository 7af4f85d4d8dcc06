"""``jupyter pause drill --own-server --keep``, then ``--own-server --upgrade-check``: two
processes on one machine, as before and after an upgrade, each starting a server of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MAIN = "pause-drill/drill.ipynb"


def run_drill(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``jupyter pause drill ARGS`` with its own temporary, data and config folders in
    ``home`` (config: ``home/config``, which a test may fill first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(
        TMPDIR=str(home / "tmp"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
    )
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", "drill", "--timeout", "60", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=600,
    )


def drill_left_in_tmp(home: Path) -> list[str]:
    """The ``pause-drill-*`` folders left in the drill's temporary folder."""
    return sorted(p.name for p in (home / "tmp").glob("pause-drill-*"))


def keep_then_check(home: Path, *options: str) -> tuple[str, str]:
    """The two commands in sequence; (the first's stdout, the check's stdout). Each must end
    well, and leave nothing in the temporary folder."""
    kept = run_drill(home, "--own-server", "--keep", "--rush", "0", *options)
    assert kept.returncode == 0, kept.stderr[-3000:] + kept.stdout
    assert drill_left_in_tmp(home) == []
    server_dir = home / "data" / "jupyter_pause" / "drill-server"
    assert f"Kept {MAIN} (paused) with its checkpoint in {server_dir}" in kept.stdout, kept.stdout
    assert (server_dir / "root" / MAIN).is_file()
    # (the session file, the fallback of a server that lost the notebook, is set aside: this
    # check must find the notebook where the first run kept it)
    (home / "pause-drill-report" / "drill-session.jpsession").unlink()
    checked = run_drill(home, "--own-server", "--upgrade-check", *options)
    assert checked.returncode == 0, checked.stderr[-3000:] + checked.stdout
    assert f"Upgrade check of the drill's own server on {server_dir}" in checked.stderr
    assert drill_left_in_tmp(home) == []
    return kept.stdout, checked.stdout
