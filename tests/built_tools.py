"""Real tools the tests need that no package provides ready-made: built once per machine by a
script of ours, then cached (``~/.cache/jupyter-pause``; ``.ci/run`` builds them up front).

A script prints the path of its binary; with ``JUPYTER_PAUSE_CACHE_ONLY=1`` it only answers
from the cache (exit 3: not built), so asking never starts a build by surprise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class CannotRun(Exception):
    """The recipe cannot run on this machine at all (the reason says why)."""


def built(script: Path, needs: str, *args: str) -> str:
    """The cached binary of ``script``, built first when this machine has none.

    ``needs`` says what the tests need it for (the reason given when it cannot be built);
    ``args`` go to the script (which of the binaries it builds to print).
    """
    cached = subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "JUPYTER_PAUSE_CACHE_ONLY": "1"},
    )
    if cached.returncode == 0 and cached.stdout.strip():
        return cached.stdout.strip().splitlines()[-1]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise CannotRun(
            f"{needs}, built by {script.relative_to(Path(__file__).parent.parent)}, which needs "
            f"root and apt-get (uid {os.geteuid()}, "
            f"apt-get {'found' if shutil.which('apt-get') else 'missing'})"
        )
    done = subprocess.run(["bash", str(script), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]
