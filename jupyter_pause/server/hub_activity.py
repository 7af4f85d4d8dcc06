"""What a JupyterHub's idle culler reads as this server's activity: the user's work only.

jupyterhub-singleuser reports ``web_app.last_activity()`` to the Hub (``/api/status`` says the
same), and jupyter-server counts in it every authenticated API request: JupyterLab's polls of
``/api/kernels``, ``/api/sessions`` and ``/api/contents`` from a tab left open, and any tool's
reads. An open tab on a paused notebook would keep the server, and its GPU, for ever, and
the Hub's culler could never stop it. Under the jupyterhub backend the server's activity is:

* a request that changes something (any method but GET/HEAD/OPTIONS, answered without an
  error): a save, a kernel started, a cell sent through the REST API, an edit reported by the
  toolbar;
* the kernels' messages (jupyter-server's ``last_kernel_activity``: a cell, its output;
  jupyter_pause's own kernel messages are not counted there, see ``kernel_bridge``);
* now, while a kernel is busy: a cell that runs for hours without output keeps its server;
* terminals, and whatever other extension counts its own ``*_last_activity``;
* the server's start.
"""

from __future__ import annotations

import datetime
from typing import Any

#: The settings key of the last request that changed something (jupyter-server's own
#: ``last_activity`` counts every ``*_last_activity`` key too).
CHANGES_KEY = "jupyter_pause_changes_last_activity"
#: jupyter-server's key of the last authenticated API request, reads included: not counted.
READS_KEY = "api_last_activity"
READ_METHODS = ("GET", "HEAD", "OPTIONS")


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def install(web_app: Any, kernel_manager: Any) -> None:
    """Count only the user's work as ``web_app``'s activity (see the module's text)."""
    settings = web_app.settings
    log_request = settings.get("log_function") or (lambda handler: None)

    def log_and_note_changes(handler: Any) -> None:
        request = handler.request
        if (
            request.method not in READ_METHODS
            and handler.get_status() < 400
            and getattr(handler, "_jupyter_current_user", None)
            and getattr(handler, "_track_activity", True)
        ):
            settings[CHANGES_KEY] = utcnow()
        log_request(handler)

    def last_work() -> datetime.datetime:
        if any(
            getattr(kernel_manager.get_kernel(kernel_id), "execution_state", "") == "busy"
            for kernel_id in kernel_manager.list_kernel_ids()
        ):
            return utcnow()
        sources = [settings["started"], kernel_manager.last_kernel_activity]
        sources += [
            value
            for key, value in settings.items()
            if key.endswith("_last_activity") and key != READS_KEY and value
        ]
        sources += settings.get("last_activity_times", {}).values()
        return max(sources)

    settings["log_function"] = log_and_note_changes
    web_app.last_activity = last_work
