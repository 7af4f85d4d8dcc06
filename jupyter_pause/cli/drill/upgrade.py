"""``--upgrade-check``: after an upgrade or migration, how did the drill notebook come back?

The liveness token (``jupyter_pause.process_token()``) exists only in the memory of the
process that wrote the checkpoint (its manifest records it): a kernel with the same token is
that very process, restored live. A kernel with another token either has the drill's model
back, giving the saved output bit for bit (restored from files), or does not (a new session
that merely opened the old notebook: nothing came back).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ..client import RESUME_IN_FLIGHT, CliError, quote_path
from ..transfer import download, upload
from . import notebook
from .client import DrillError, ServerClient
from .plan import FOLDER, MAIN

LIVE, FILES, NOT_RESTORED = "live process", "restored from files", "not restored"


#: What ``--keep`` leaves in the report folder beside the paused notebook: its session file
#: and the drill's expected output, the fallback of a server that lost both (a new cluster).
SESSION_FILE = "drill-session.jpsession"
EXPECTED = "drill-expected.json"


def keep_session_file(client: ServerClient, out: Path) -> None:
    """The kept drill notebook exported into ``out``, with the output its model must give."""
    out.mkdir(parents=True, exist_ok=True)
    download(client, MAIN, out / SESSION_FILE, quiet=True)
    (out / EXPECTED).write_text(json.dumps({"digest": _expected_on_server(client)}) + "\n")


def _expected_on_server(client: ServerClient) -> str:
    result = f"{FOLDER}/{notebook.DATA_DIR}/result.json"
    saved = client.api("GET", f"contents/{quote_path(result)}?type=file&format=text")
    return json.loads(saved["content"])["digest"]


def check(
    client: ServerClient, timeout: float, out: Path, stream: TextIO = sys.stderr
) -> dict[str, Any]:
    """Find out how the drill notebook came back; resumes it first when it is paused. A
    server without it (a new cluster, a wiped store) gets it from the session file that
    ``--keep`` exported into ``out``."""
    from_file = False
    try:
        record = client.session(MAIN)
        expected = _expected_on_server(client)
    except CliError as err:
        if not (out / SESSION_FILE).is_file():
            raise DrillError(
                f"no drill notebook on this server ({err}), and no {out / SESSION_FILE}: run "
                "`jupyter pause drill --keep` before the upgrade"
            ) from None
        stream.write(f"{MAIN} is not on this server: importing {out / SESSION_FILE}\n")
        with contextlib.suppress(CliError):  # a notebook there without its session: replaced
            client.delete_file(MAIN)
        upload(client, out / SESSION_FILE, MAIN, quiet=True)
        client.post("trust", quote_path(MAIN))  # the operator's own drill, exported by them
        record = client.session(MAIN)
        expected = json.loads((out / EXPECTED).read_text())["digest"]
        from_file = True
    if record["kernel_id"] is None:
        stream.write(f"{MAIN} is {record['state']}: resuming it, as its user would\n")
        client.post("resume", quote_path(MAIN))
        record = _wait(client, timeout)
        if record["state"] not in ("ready", "partial"):
            raise DrillError(f"the resume ended {record['state']}: {record['message']}")
    found = client.run_cell(record["kernel_id"], notebook.LIVENESS, timeout).json_line()
    written_by = found["written_by"]  # the token of the process that wrote the checkpoint
    if written_by and found["token"] == written_by:
        verdict, why = (
            LIVE,
            "its liveness token is the one of the process that wrote the checkpoint",
        )
    elif found["has_model"] and found.get("digest") == expected:
        verdict, why = (
            FILES,
            (
                "a new process (another liveness token) whose model, rebuilt from "
                "the checkpoint, gives the saved output bit for bit"
            ),
        )
    else:
        verdict, why = (
            NOT_RESTORED,
            (
                "a new session that merely opened the old notebook: "
                "another liveness token and none of the saved state"
            ),
        )
    if from_file and verdict == FILES:
        why += f", imported from {SESSION_FILE} (the server had lost the drill notebook)"
    return {
        "verdict": verdict,
        "why": why,
        "from_session_file": from_file,
        "server_state": record["state"],
        "server_how": record.get("how"),
        "token_matches": found["token"] == written_by,
        "model_back": found["has_model"],
        "output_identical": found.get("digest") == expected,
    }


def _wait(client: ServerClient, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        record = client.session(MAIN)
        if record["state"] not in RESUME_IN_FLIGHT or time.monotonic() > deadline:
            return record
        time.sleep(0.2)
