"""``jupyter pause``: the command line, a client of a running server's REST API.

``client`` (finding the server, the HTTP client, exit codes) is the bottom layer that every
command imports; ``main`` is the parser and dispatch; ``sessions``, ``checkpoints``,
``timeline``, ``workspace``, ``report`` and ``drill`` hold the commands, ``output`` how they
print.
"""

from .main import main

__all__ = ["main"]
