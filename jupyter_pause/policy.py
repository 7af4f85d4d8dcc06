"""The admin's pause policy as plain data (the traitlets live on the server extension)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


def _flag(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


# The policy a kernel must know (retention, what to save, how to write): trait of the kernel's
# Checkpointer (and field of Policy), the environment variable the server sets, and how to
# read it back.
KERNEL_POLICY_ENV: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("keep_last", "JUPYTER_PAUSE_KEEP_LAST", int),
    ("max_age_hours", "JUPYTER_PAUSE_MAX_AGE_HOURS", float),
    ("max_bytes", "JUPYTER_PAUSE_MAX_BYTES", int),
    ("save_unmarked", "JUPYTER_PAUSE_SAVE_UNMARKED", str),
    ("direct_io", "JUPYTER_PAUSE_DIRECT_IO", _flag),
    ("lazy_restore", "JUPYTER_PAUSE_LAZY_RESTORE", _flag),
)


@dataclass
class KernelPolicy:
    """The policy for one kernelspec, after per-kernelspec overrides."""

    auto_pause: bool
    idle_minutes: float
    min_running_minutes: float
    gpus: int


@dataclass
class Policy:
    idle_pause_minutes: float = 0.0  # 0: no automatic pause
    min_running_minutes: float = 0.0
    busy_wait_seconds: float = 30.0
    kernel_call_timeout_seconds: float = 1800.0
    gpus_per_kernel: int = 0
    keep_last: int = 5
    max_age_hours: float = 0.0
    max_bytes: int = 0
    save_unmarked: str = "all"
    direct_io: bool = True
    lazy_restore: bool = True
    snapshots_keep_last: int = 1  # pod snapshots kept per workspace, the pinned one first
    #: A pause asked outside jupyter_pause that the platform holds for its snapshot: how long
    #: the checkpoints written meanwhile may keep the platform's snapshot waiting (seconds).
    outside_hold_seconds: float = 600.0
    kernelspec_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    def for_kernelspec(self, name: str) -> KernelPolicy:
        override = self.kernelspec_overrides.get(name, {})
        return KernelPolicy(
            auto_pause=bool(override.get("auto_pause", self.idle_pause_minutes > 0)),
            idle_minutes=float(override.get("idle_pause_minutes", self.idle_pause_minutes)),
            min_running_minutes=float(
                override.get("min_running_minutes", self.min_running_minutes)
            ),
            gpus=int(override.get("gpus", self.gpus_per_kernel)),
        )

    def kernel_env(self) -> dict[str, str]:
        """What kernels must know of the policy (retention and what to save)."""
        return {env: str(getattr(self, name)) for name, env, _read in KERNEL_POLICY_ENV}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
