"""What differs between the environment a checkpoint was made in and this one.

A checkpoint's manifest records its ``environment`` (``saving._environment``): Python, the
platform, the version of each package its objects and imports come from, torch's CUDA
build and the GPU. Comparing it with this process, without importing anything, says in
words what a restore may not bring back the same: a package missing or at another version
(an object pickled under scikit-learn 1.9 here on 1.5), another Python, a CPU build of torch
where CUDA was used (CUDA tensors come back on the CPU).
"""

from __future__ import annotations

import contextlib
import platform
import sys
from functools import cache
from importlib import metadata
from typing import Any


@cache
def _distributions() -> dict[str, list[str]]:
    try:
        return metadata.packages_distributions()
    except Exception:  # a broken installation's metadata: compare what can be read
        return {}


def installed_version(top_level: str) -> str | None:
    """The version of module ``top_level`` here: its ``__version__`` when it is imported (as
    the checkpoint recorded it), else its distribution's from the installation's metadata
    (nothing imported); None when none is installed."""
    version = getattr(sys.modules.get(top_level), "__version__", None)
    if isinstance(version, str):
        return version
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(top_level)  # most distributions are named as their module
    for distribution in _distributions().get(top_level, []):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def differences(saved: dict[str, Any]) -> list[str]:
    """Each difference that may change what a restore brings back, in words."""
    found = []
    python = platform.python_version()
    there = str(saved.get("python") or "")
    if there and there.split(".")[:2] != python.split(".")[:2]:
        found.append(f"Python {there} made it, this is Python {python}")
    here_platform = f"{platform.system()} {platform.machine()}"
    if saved.get("platform") and saved["platform"] != here_platform:
        found.append(f"made on {saved['platform']}, this is {here_platform}")
    for package, version in sorted((saved.get("packages") or {}).items()):
        here = installed_version(package)
        if here is None:
            found.append(
                f"{package} {version} is not installed here: objects of it cannot be restored"
            )
        elif here != version:
            found.append(f"{package} {version} made it, {here} is installed here")
    cuda = saved.get("torch_cuda")
    if cuda and installed_version("torch") is not None:
        here_cuda = _torch_cuda()
        if here_cuda is None:
            found.append(
                f"made with CUDA {cuda}, this torch is a CPU build: CUDA tensors come back on the CPU"
            )
        elif here_cuda != cuda:
            found.append(f"made with CUDA {cuda}, this torch is built for CUDA {here_cuda}")
    return found


def _torch_cuda() -> str | None:
    """torch's CUDA build: from torch when it is imported, else from its installed version
    file (not importing torch)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        return getattr(torch.version, "cuda", None)
    try:
        files = metadata.files("torch") or []
    except metadata.PackageNotFoundError:
        return None
    for path in files:
        if str(path).replace("\\", "/") == "torch/version.py":
            text = path.read_text()
            for line in text.splitlines():
                if line.startswith("cuda") and "=" in line:
                    value = line.split("=", 1)[1].strip().strip("'\"")
                    return None if value in ("None", "") else value
    return None
