"""``jupyter pause --workspace``: its usage, and a fast CLI for everything else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_PAUSE", "KUBE"))}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "jupyter_pause.cli", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )


def test_commands_without_workspace_never_import_the_kubernetes_client() -> None:
    # When the CLI asks a (missing) server for its status, as a user types it in a loop
    code = (
        "import sys\n"
        "from jupyter_pause import cli\n"
        "rc = cli.main(['status', '--url', 'http://127.0.0.1:9', '--token', 't'])\n"
        "print(rc, 'kubernetes' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    # Then it answered (no server: 3) without loading the kubernetes client (~1 s of imports)
    assert done.stdout.split() == ["3", "False"], done.stdout + done.stderr


def test_resume_needs_a_notebook_or_a_workspace() -> None:
    done = run_cli("resume")
    assert done.returncode == 2
    assert "resume needs NOTEBOOK, or --workspace NAMESPACE/NAME" in done.stderr


def test_workspace_without_any_cluster_says_so(tmp_path: Path) -> None:
    # Given no kubeconfig and no service account (not in a pod)
    missing = tmp_path / "no-kubeconfig"

    # When a workspace's status is asked for
    done = run_cli("status", "--workspace", "team/lab", KUBECONFIG=str(missing))

    # Then it says it cannot reach a cluster, with the exit code of "no server"
    assert done.returncode == 3, done.stderr
    assert "Cannot reach a cluster" in done.stderr and "kubeconfig" in done.stderr
