"""``%load_ext jupyter_pause``: wire the checkpoint engine into an IPython shell, and undo it."""

from __future__ import annotations

import contextlib
from typing import Any

from . import api, control, server_calls, server_link
from .magics import CheckpointMagics
from .schedule import Scheduler
from .session import Baseline
from .tracking import ChangeTracker

_ATTR = "_jupyter_pause"


def load(shell: Any) -> api.Checkpointer:
    existing = getattr(shell, _ATTR, None)
    if existing is not None:
        return existing
    tracker = ChangeTracker(shell)
    # Loaded before the first cell (at kernel start, or by the server's first call), the
    # environment as it is now is the kernel's own; loaded later, it may hold the notebook's
    # changes, which a restore must carry over.
    baseline = Baseline.take(late=len(shell.user_ns.get("In", ())) > 2, shell=shell)  # In[1]: now
    checkpointer = api.Checkpointer(
        shell.user_ns,
        hidden=shell.user_ns_hidden,
        tracker=tracker,
        shell=shell,
        baseline=baseline,
        parent=shell,
    )
    scheduler = Scheduler(checkpointer, shell, announce=print)
    checkpointer.scheduler = scheduler
    # The tracker must see a cell before the scheduler may checkpoint after it.
    for event, callback in _cell_hooks(checkpointer):
        shell.events.register(event, callback)
    shell.register_magics(CheckpointMagics(shell, checkpointer))
    checkpointer.on_checkpoint.append(_announce_to_server)
    checkpointer.on_restore.append(_announce_restore_to_server)
    checkpointer.on_loading.append(_announce_loading_to_server)
    checkpointer.on_loaded.append(_announce_loaded_to_server)
    shell.configurables.append(checkpointer)  # so `%config Checkpointer.keep_last = 10` works
    # The server's requests: on the shell channel, and on the control channel (answered even
    # while a cell runs: the criu backend pauses those).
    server_calls.install(getattr(shell, "kernel", None), checkpointer)
    control.install(getattr(shell, "kernel", None))
    setattr(shell, _ATTR, checkpointer)
    api.set_current(checkpointer)
    return checkpointer


def unload(shell: Any) -> None:
    checkpointer = getattr(shell, _ATTR, None)
    if checkpointer is None:
        return
    checkpointer.scheduler.set_interval(None)  # removes the optimizer step hook too
    for event, callback in _cell_hooks(checkpointer):
        with contextlib.suppress(ValueError):
            shell.events.unregister(event, callback)
    shell.magics_manager.magics["line"].pop("checkpoint", None)
    shell.magics_manager.registry.pop("CheckpointMagics", None)
    with contextlib.suppress(ValueError):
        shell.configurables.remove(checkpointer)
    server_calls.uninstall(getattr(shell, "kernel", None))
    control.uninstall(getattr(shell, "kernel", None))
    delattr(shell, _ATTR)
    api.set_current(None)


def _cell_hooks(checkpointer: api.Checkpointer) -> list[tuple[str, Any]]:
    tracker, scheduler = checkpointer.tracker, checkpointer.scheduler
    return [
        ("pre_run_cell", tracker.pre_run_cell),
        ("pre_run_cell", scheduler.pre_run_cell),
        ("post_run_cell", tracker.post_run_cell),
        ("post_run_cell", scheduler.post_run_cell),
    ]


def _announce_to_server(result: api.CheckpointResult) -> None:
    """Every checkpoint goes on the notebook's timeline, also those a cell takes."""
    server_link.request_from_server(
        "checkpointed",
        checkpoint_id=result.checkpoint_id,
        bytes_written=result.bytes_written,
        bytes_total=result.bytes_total,
        seconds=result.seconds,
        skipped=result.skipped,
        reason=result.reason,
    )


def _announce_restore_to_server(result: api.RestoreResult) -> None:
    """A restore the notebook makes (``%checkpoint restore`` typed into a reopened notebook
    instead of pressing Resume) brings a paused session back: the server must know."""
    if server_link.SERVER_ATTACHED:  # where no server follows this kernel, nothing to say
        server_link.request_from_server("restored", result=result.to_json())


def _announce_loading_to_server(checkpoint_id: int, done: int, total: int) -> None:
    """A lazy restore's load went on: the chip says how much is still to come."""
    server_link.request_from_server("loading", checkpoint_id=checkpoint_id, done=done, total=total)


def _announce_loaded_to_server(checkpoint_id: int, outcome: Any) -> None:
    """A lazy restore's load ended: on the timeline, and what a damaged file took back."""
    server_link.request_from_server(
        "loaded", checkpoint_id=checkpoint_id, outcome=outcome.to_json()
    )
