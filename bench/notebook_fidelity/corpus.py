"""The notebooks the fidelity benchmark runs, and where each is split."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

#: bench/notebooks: upstream/ (other projects' test notebooks), tutorials/ (books, courses, library
#: tutorials) and own/; sources and licences in SOURCES.md.
CORPUS = Path(__file__).resolve().parents[1] / "notebooks"


@dataclass(frozen=True)
class Notebook:
    name: str  # file stem, unique across the corpus
    path: Path
    cells: tuple[str, ...]  # code cells only, in order

    @property
    def origin(self) -> str:
        return self.path.parent.name

    @property
    def uses_torch(self) -> bool:
        return any(re.search(r"\btorch\b", cell) for cell in self.cells)


def load(path: Path) -> Notebook:
    notebook = nbformat.read(path, as_version=4)
    cells = tuple(cell.source for cell in notebook.cells if cell.cell_type == "code")
    return Notebook(name=path.stem, path=path, cells=cells)


def corpus(names: list[str] | None = None, root: Path = CORPUS) -> list[Notebook]:
    """Every notebook under ``root`` (sorted by name), or those named (stems), in that order."""
    found = {path.stem: path for path in sorted(root.glob("*/*.ipynb"))}
    if names is None:
        return [load(found[name]) for name in sorted(found)]
    unknown = [name for name in names if name not in found]
    if unknown:
        raise ValueError(f"unknown notebook(s): {', '.join(unknown)} (known: {', '.join(found)})")
    return [load(found[name]) for name in names]


def split_points(cell_count: int, quick: bool = False) -> list[int]:
    """Where to pause: after n/3, n/2, 2n/3 and n-1 code cells (``quick``: n/2 only).

    Split ``k`` runs cells[:k] before the pause and cells[k:] after it.
    """
    n = cell_count
    wanted = [n // 2] if quick else [n // 3, n // 2, 2 * n // 3, n - 1]
    return sorted({k for k in wanted if 1 <= k <= n - 1})
