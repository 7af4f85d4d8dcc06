"""The ways of carrying a session across kernels that the benchmark compares."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Method:
    name: str
    save: str  # code run in the first kernel after the split cell; {store} is its folder
    restore: str  # code run first in the new kernel
    #: Whether its restore output names what did not come back (only then can a split be
    #: excused).
    reports_losses: bool

    def save_code(self, store: Path) -> str:
        return self.save.format(store=str(store))

    def restore_code(self, store: Path) -> str:
        return self.restore.format(store=str(store))


JUPYTER_PAUSE = Method(
    name="jupyter_pause",
    save="%load_ext jupyter_pause\n%checkpoint",
    restore="%load_ext jupyter_pause\n%checkpoint restore",
    reports_losses=True,
)

# What a user without jupyter_pause does: dill's whole-session pickle of __main__. Called
# through __import__ so that no name `dill` joins the session being measured.
DILL = Method(
    name="dill",
    save="__import__('dill').dump_session({store!r} + '/dill-session.pkl')",
    restore="__import__('dill').load_session({store!r} + '/dill-session.pkl')",
    reports_losses=False,
)

METHODS = {method.name: method for method in (JUPYTER_PAUSE, DILL)}

# A restore summary lists what came back first, then what did not, under headings such as
# "not restored:", "not in the checkpoint:" or "skipped:", each entry "name (why)".
_LOSS_HEADING = re.compile(
    r"not restored|not in the checkpoint|skipped|not saved|could not|did not|failed", re.I
)
_LOSS_ENTRY = re.compile(r"(?:^|[:;,]\s*)([A-Za-z_][\w.]*) \(", re.M)


def names_reported_lost(restore_output: str) -> set[str]:
    """The names a restore's output says did not come back (after its first loss heading)."""
    heading = _LOSS_HEADING.search(restore_output)
    if heading is None:
        return set()
    tail = restore_output[heading.start() :]
    return {match.group(1) for match in _LOSS_ENTRY.finditer(tail)}
