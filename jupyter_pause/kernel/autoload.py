"""Load the kernel extension at kernel start when a jupyter_pause server launched the kernel.

IPython runs ``<sys.prefix>/etc/ipython/startup/50-jupyter-pause.py`` (installed with the
package) in every kernel of the environment, before the first cell, whoever asked for the
kernel (JupyterLab, the REST API, nbclient, a remote client). It calls ``load``, which acts
only in kernels whose server exported ``JUPYTER_PAUSE_AUTOLOAD=1``: a terminal IPython, or a
kernel of a server without the extension, stays as it was.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Exported by the server extension to every kernel it starts.
AUTOLOAD_ENV = "JUPYTER_PAUSE_AUTOLOAD"


def load(shell: Any) -> None:
    if os.environ.get(AUTOLOAD_ENV) != "1" or getattr(shell, "kernel", None) is None:
        return
    try:
        shell.extension_manager.load_extension("jupyter_pause")
    except Exception as err:  # a broken install must not stop the kernel from starting
        print(f"jupyter_pause: %checkpoint and %pause not loaded: {err}", file=sys.stderr)
