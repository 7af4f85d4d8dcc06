"""The state names of a notebook session and the errors a request can meet.

Every part of the server imports this module; it imports none of theirs (so the orchestrator's
parts and the whole-environment pause never import each other to learn a name). Per notebook::

    active -> checkpointing -> pausing -> paused -> resuming -> waiting-for-resources
           -> restoring -> ready            (and failed, from any step)
    resuming / waiting-for-resources -> paused   (cancelled, or the backend refused: StillPaused)
"""

from __future__ import annotations

from typing import Any

STATES = (
    "active",
    "checkpointing",
    "pausing",
    "paused",
    "resuming",
    "waiting-for-resources",
    "restoring",
    "ready",
    "partial",  # running, but the restore did not bring everything back: see ``error``
    "failed",
)
RUNNING_STATES = ("active", "ready", "partial")
IN_FLIGHT_STATES = ("checkpointing", "pausing", "resuming", "waiting-for-resources", "restoring")
# What a finished resume (or a restore typed into the notebook) clears: the session runs again.
RUNNING_AGAIN: dict[str, Any] = {
    "paused_during_cell": None,
    "paused_process_token": None,
    "paused_checkpoint_id": None,
    "unrestored_kernel": False,
}


class PauseError(Exception):
    """A request that cannot be carried out; ``status`` is the HTTP status to answer with."""

    status = 400


class UnknownSession(PauseError):
    status = 404


class Conflict(PauseError):
    status = 409
