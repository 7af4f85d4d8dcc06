"""The checkpointer of this kernel: the one ``%load_ext jupyter_pause`` made, or one made now.

The package's functions (``jupyter_pause.checkpoint()``...) and the server's calls use it. In
IPython it loads the extension (magics, change tracking) when the notebook never did; in plain
Python it makes a checkpointer over ``__main__``. It sits above both ``api`` and ``extension``,
so that neither has to import the other back.
"""

from __future__ import annotations

import json
import sys

from . import api, server_calls


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


def server_call(op: str, args_json: str) -> str:
    """A server request in a kernel whose extension is not loaded yet, evaluated as the user
    expression of a silent execute request (``server_calls``): the checkpointer made here
    loads the extension, and with it the shell handler the server's next requests take."""
    return json.dumps(server_calls.answer(current(), op, json.loads(args_json)))
