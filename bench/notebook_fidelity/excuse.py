"""Whether every difference after a restore follows from what the restore said it lost.

A value that cannot cross processes (a generator, a socket) may fail the cells that use it,
and whatever those cells compute. Such a split is excused when the restore named the value
and every differing cell and variable is reached from it through the cells' names: a cell
that reads or changes a lost (or tainted) name taints every name it may change. A difference
that cannot be traced back to a named loss fails the split.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache

from IPython.core.inputtransformer2 import TransformerManager

from .digest import SHARED_MEMORY

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@lru_cache(maxsize=4096)
def cell_names(source: str) -> tuple[frozenset[str], frozenset[str]]:
    """(names the cell reads, names it may change), magics turned into Python first.

    Over-approximates changes: assignments anywhere (function bodies too), imports, and the
    objects of attribute/item assignments and method calls (``x.append(...)`` may change x).
    """
    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:  # not Python: every word may be read and changed
        words = frozenset(_IDENTIFIER.findall(source))
        return words, words
    read: set[str] = set()
    changed: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else changed).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            changed.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            changed.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Attribute | ast.Subscript) and not isinstance(node.ctx, ast.Load):
            changed.update(_base_names(node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            changed.update(_base_names(node.func.value))
    return frozenset(read), frozenset(changed)


def _base_names(node: ast.AST) -> set[str]:
    """``a`` for ``a``, ``a.b``, ``a[i].c``: the variable an expression starts from."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return {node.id} if isinstance(node, ast.Name) else set()


def excused(
    cells: tuple[str, ...],
    first_resumed: int,
    differing_cells: list[int],
    differing_variables: dict[str, str],
    lost: set[str],
) -> bool:
    """True when every difference is traced back to a value the restore named as lost."""
    if not lost:
        return False
    tainted = set(lost)
    for index in range(first_resumed, len(cells)):
        read, changed = cell_names(cells[index])
        touches = bool((read | changed) & tainted)
        if touches:
            tainted |= changed
        elif index in differing_cells:
            return False
    for name, how in differing_variables.items():
        # The shared-memory entry names the variables of its groups in how it differs.
        names = set(_IDENTIFIER.findall(how)) if name == SHARED_MEMORY else {name}
        if not names & tainted:
            return False
    return True
