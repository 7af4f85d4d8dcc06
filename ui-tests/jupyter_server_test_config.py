"""JupyterLab server for the galata ui-tests: a throwaway root and checkpoint store, 1 GPU.

Start it with ``jlpm start`` (Playwright does so itself, see playwright.config.js).
"""

from tempfile import mkdtemp

from jupyterlab.galata import configure_jupyter_server

configure_jupyter_server(c)  # noqa: F821 - `c` is the config object jupyter provides
c.ServerApp.allow_root = True  # noqa: F821
# Checkpoints go to a fresh folder each run; one GPU is "handed out" (no real GPU needed).
c.PauseApp.store_root = mkdtemp(prefix="jupyter-pause-ui-store-")  # noqa: F821
c.PauseApp.gpu_count = 1  # noqa: F821
