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

# A restore summary is a list of groups, "heading: entry; entry" separated by "; " or new
# lines, each entry "name (why)", and the headings of what did not come back say so ("not
# restored", "not in the checkpoint", "skipped", ...). Reasons may hold ":" and ";" too, but
# only inside their parentheses.
_LOSS_HEADING = re.compile(
    r"not restored|not in the checkpoint|skipped|not saved|could not|did not|failed", re.I
)
_ENTRY_NAME = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\(")


def names_reported_lost(restore_output: str) -> set[str]:
    """The names a restore's output lists under a heading of what did not come back."""
    lost: set[str] = set()
    losing = False
    for item in _top_level_split(restore_output, ";\n"):
        colon = _top_level_split(item, ":", limit=1)
        if len(colon) == 2:  # a new group: "heading: first entry"
            losing = bool(_LOSS_HEADING.search(colon[0]))
            item = colon[1]
        name = _ENTRY_NAME.match(item)
        if losing and name:
            lost.add(name.group(1))
    return lost


def _top_level_split(text: str, separators: str, limit: int = -1) -> list[str]:
    """``text`` cut at ``separators`` that are outside parentheses."""
    pieces, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char in separators and depth == 0 and len(pieces) != limit:
            pieces.append(text[start:index])
            start = index + 1
    pieces.append(text[start:])
    return pieces
