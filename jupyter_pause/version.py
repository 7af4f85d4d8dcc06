"""The package's version: written by the build into ``_version.py``, unknown in a tree never built.

A module of its own so that the server (``/status``, the 404 text) can say it without importing
the package's ``__init__``, which names the server as its extension point.
"""

from __future__ import annotations

try:
    from ._version import __version__
except ImportError:  # running from a source tree that was never built
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
