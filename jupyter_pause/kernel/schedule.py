"""Scheduled checkpoints for long runs, taken only at safe points.

Safe points are: right after a cell finishes, and - while a long cell trains - right after a
PyTorch optimizer step (a global optimizer step post-hook), so a checkpoint never holds
half-updated weights. The training loop pays for the checkpoint's write and nothing else: the
hook is one time comparison until a checkpoint is due.
"""

from __future__ import annotations

import importlib
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_INTERVAL_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|hr|hrs|hours?)?\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def parse_interval(text: str | float | int | None) -> float | None:
    """``"30m"``, ``"90s"``, ``"2h"``, seconds as a number; ``None``/``"off"`` -> None."""
    if text is None:
        return None
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        if text.strip().lower() in ("off", "none", "0"):
            return None
        match = _INTERVAL_RE.match(text.lower())
        if not match:
            raise ValueError(f"Not an interval: {text!r} (examples: 30m, 90s, 2h, off)")
        seconds = float(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "s")[0]]
    if seconds <= 0:
        return None
    if seconds < 1:
        raise ValueError("Checkpoint intervals shorter than 1 second would only slow the kernel")
    return seconds


@dataclass
class ScheduleState:
    interval: float | None
    next_due: float | None

    def describe(self) -> str:
        if self.interval is None:
            return "Scheduled checkpoints are off."
        due = time.strftime("%H:%M:%S", time.localtime(self.next_due or time.time()))
        return (
            f"Checkpoint every {format_interval(self.interval)} after a cell finishes or an "
            f"optimizer step; next at {due} or later."
        )


def format_interval(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


class Scheduler:
    """Takes a checkpoint at the first safe point after each interval."""

    def __init__(self, checkpointer: Any, shell: Any, announce: Callable[[str], None]) -> None:
        self.checkpointer = checkpointer
        self.shell = shell
        self.announce = announce
        self.interval: float | None = None
        self.next_due: float | None = None
        self._step_hook: Any = None
        self._busy = False
        self.clock = time.monotonic

    def set_interval(self, interval: str | float | None) -> ScheduleState:
        self.interval = parse_interval(interval)
        if self.interval is None:
            self.next_due = None
            self._remove_step_hook()
        else:
            self.next_due = self.clock() + self.interval
            self._install_step_hook()
        return self.state()

    def state(self) -> ScheduleState:
        wall_due = None
        if self.next_due is not None:
            wall_due = time.time() + (self.next_due - self.clock())
        return ScheduleState(self.interval, wall_due)

    # -- safe points -----------------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        if self.interval is not None:
            self._install_step_hook()  # torch may have been imported since `every` was set

    def post_run_cell(self, result: Any) -> None:
        if self._due():
            self._take("after the cell finished")

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._due() or not self._is_watched(optimizer):
            return
        self._take(f"after {type(optimizer).__name__}.step()")

    def _is_watched(self, optimizer: Any) -> bool:
        marked = self.checkpointer.marked()
        if not marked:
            return True
        namespace = self.checkpointer.namespace
        return any(namespace.get(name) is optimizer for name in marked)

    def _due(self) -> bool:
        return self.next_due is not None and not self._busy and self.clock() >= self.next_due

    def _take(self, where: str) -> None:
        from .api import CheckpointError

        self._busy = True
        try:
            result = self.checkpointer.checkpoint(reason="scheduled")
            self.announce(f"[jupyter_pause] scheduled, {where}: {result.summary()}")
        except CheckpointError as err:
            self.announce(f"[jupyter_pause] scheduled checkpoint failed, {where}: {err}")
        finally:
            self._busy = False
            if self.interval is not None:
                self.next_due = self.clock() + self.interval

    # -- optimizer hook --------------------------------------------------------------------------
    def _install_step_hook(self) -> None:
        if self._step_hook is not None or "torch" not in sys.modules:
            return  # never import torch ourselves: only a notebook that uses it gets the hook
        optimizer_module = importlib.import_module("torch.optim.optimizer")
        register = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
        if register is not None:
            self._step_hook = register(self._after_optimizer_step)

    def _remove_step_hook(self) -> None:
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
