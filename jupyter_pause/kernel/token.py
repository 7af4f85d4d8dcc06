"""The process-only liveness token.

A random value created once per process and never written anywhere but into the manifests
this process writes. After a resume, the server compares the token the kernel reports with
the one in the last manifest: equal means the very same process came back (a memory
snapshot was restored); different means a new process was rebuilt from the files.
"""

from __future__ import annotations

import secrets

_TOKEN = secrets.token_hex(16)


def process_token() -> str:
    """This process's liveness token (32 hex characters)."""
    return _TOKEN
