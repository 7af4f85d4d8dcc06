"""JupyterLab server for the galata ui-tests: a throwaway root and checkpoint store, 1 GPU.

Start it with ``jlpm start`` (Playwright does so itself, see playwright.config.js, which picks
a free port and passes it as ``UI_TESTS_PORT``).
"""

import os
import shutil
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

configure_jupyter_server(c)  # noqa: F821 - `c` is the config object jupyter provides
c.ServerApp.allow_root = True  # noqa: F821
c.ServerApp.port = int(os.environ.get("UI_TESTS_PORT", "8888"))  # noqa: F821
# Checkpoints go to one folder emptied at each run (never a new one left behind per run);
# one GPU is "handed out" (no real GPU needed).
store = Path(__file__).resolve().parent / ".pause-store"
shutil.rmtree(store, ignore_errors=True)
store.mkdir(mode=0o700)
c.PauseApp.store_root = str(store)  # noqa: F821
c.PauseApp.gpu_count = 1  # noqa: F821
