"""The package's version, importable by any module without importing the package's facade.

The build writes ``_version.py`` from package.json (hatch's version hook).
"""

try:
    from ._version import __version__
except ImportError:  # running from a source tree that was never built
    __version__ = "0.0.0+unknown"
