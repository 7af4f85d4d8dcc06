"""A real JupyterHub for the galata test through the Hub (``ui-tests/tests/hub.spec.ts``).

``python -m tests.hub_lab`` (what ``ui-tests/playwright-hub.config.js`` starts, from the
repository root) runs JupyterHub with the shipped ``deploy/jupyterhub/jupyterhub_config.py``
in its demo mode, as ``make hub`` does: DummyAuthenticator (any name, the password below),
SimpleLocalProcessSpawner, configurable-http-proxy from the project's node_modules, the idle
culler as a Hub service, and each user's home in a throwaway folder with ``demo.ipynb`` (``x = 42``) in it.
A few lines after the shipped file's only add what a browser test needs: the Hub on the
port Playwright names (``UI_TESTS_PORT``), its inner ports free ones, and galata's in-page
helpers in the single-user JupyterLab (``window.galata``, ``window.jupyterapp``). It serves
until SIGTERM or SIGINT, then stops the Hub, which stops every user's server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import jupyterlab

from .hub_process import DEPLOY_CONFIG, PROXY
from .lab_process import end, until_signalled
from .server_process import free_port

#: The password every name logs in with (the spec reads the same variable, or this default).
PASSWORD = os.environ.get("JUPYTER_PAUSE_HUB_PASSWORD", "pause-ui-tests")
#: The Hub's public port, as the Playwright config chose it.
PORT = int(os.environ.get("UI_TESTS_PORT", "8765"))
#: galata's JupyterLab extension (its in-page helpers), shipped with JupyterLab.
GALATA = Path(jupyterlab.__file__).parent / "galata"

#: The notebook each new user finds in their home (the shipped demo hook copies it).
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "first",
            "metadata": {},
            "outputs": [],
            "source": "x = 42\nprint(x)",
        }
    ],
    "metadata": {
        "kernelspec": {
            "name": "python3",
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
        }
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


def hub_config(port: int) -> str:
    """The Hub's config: the shipped file, then what the browser test adds to it."""
    return (
        f"load_subconfig({str(DEPLOY_CONFIG)!r})\n"
        f"c.JupyterHub.bind_url = 'http://127.0.0.1:{port}'\n"
        f"c.JupyterHub.hub_bind_url = 'http://127.0.0.1:{free_port()}'\n"
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{free_port()}'\n"
        "c.Spawner.http_timeout = 60\n"
        "c.Spawner.start_timeout = 90\n"
        # galata's page helpers in each user's JupyterLab (nothing of jupyter_pause changes)
        f"c.Spawner.args.append('--LabServerApp.extra_labextensions_path={GALATA}')\n"
        "c.Spawner.args.append('--LabApp.expose_app_in_browser=True')\n"
    )


def wait_for_hub(url: str, hub: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the Hub answers through its proxy (``/hub/health``)."""
    deadline = time.monotonic() + timeout
    while hub.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/hub/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the Hub never answered at {url}/hub/health")


def main() -> int:
    assert PROXY.exists(), f"{PROXY} is missing: run `make setup` (jlpm install)"
    stopping = until_signalled()
    with tempfile.TemporaryDirectory(prefix="jp-hub-lab-") as tmp:
        workdir = Path(tmp)
        notebook = workdir / "demo.ipynb"
        notebook.write_text(json.dumps(NOTEBOOK))
        config = workdir / "jupyterhub_config.py"
        config.write_text(hub_config(PORT))
        bin_dir = Path(sys.executable).parent
        env = {
            **os.environ,
            "JUPYTER_PAUSE_HUB_DEMO": str(workdir),
            "JUPYTER_PAUSE_HUB_PASSWORD": PASSWORD,
            "JUPYTER_PAUSE_HUB_DEMO_NOTEBOOK": str(notebook),
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        }
        env.pop("JUPYTER_PAUSE_STORE", None)  # each user's store is in their own home
        # In a session of its own: the signal that ends this process (Playwright signals its
        # whole process group) reaches the Hub once, from here, and its shutdown runs to the end.
        hub = subprocess.Popen(
            [str(bin_dir / "jupyterhub"), "-f", str(config)],
            env=env,
            cwd=tmp,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{PORT}"
            wait_for_hub(url, hub)
            print(f"hub lab: {url}/hub/login (any name, password {PASSWORD!r})", flush=True)
            while not stopping() and hub.poll() is None:
                time.sleep(0.5)
        finally:
            end(hub)  # the Hub stops every user's server, then its proxy
        return 0 if stopping() else hub.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
