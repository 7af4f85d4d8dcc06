"""Markdown and PNG output shared by the drill's and the GPU-hours report's folders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; numbers right-aligned."""
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) for row in rows)
        for i in range(len(headers))
    ]
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join("---:" if n else "---" for n in numeric) + " |",
    ]
    for row in rows:
        cells = [f"{c:.2f}" if isinstance(c, float) else str(c) for c in row]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def pyplot() -> Any:
    """matplotlib's pyplot drawing to files only (no display needed); ImportError says how to
    get it: charts are optional, the reports are complete without them."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError(
            "charts need matplotlib (pip install matplotlib); the report is written without them"
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    figure.clf()
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path
