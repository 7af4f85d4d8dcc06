"""The checkpointer of this kernel: the one ``%load_ext jupyter_pause`` made, or one made now.

The package's functions (``jupyter_pause.checkpoint()``...) and the server's calls use it. In
IPython it loads the extension (magics, change tracking) when the notebook never did; in plain
Python it makes a checkpointer over ``__main__``. It sits above both ``api`` and ``extension``,
so that neither has to import the other back.
"""

from __future__ import annotations

import sys

from . import api


def current() -> api.Checkpointer:
    """The checkpointer of this kernel (created by ``%load_ext jupyter_pause``)."""
    checkpointer = api.installed()
    if checkpointer is None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            from .extension import load

            load(shell)
        else:
            api.set_current(api.Checkpointer(sys.modules["__main__"].__dict__))
        checkpointer = api.installed()
    assert checkpointer is not None
    return checkpointer
