"""Which variables may have changed since the last checkpoint, without looking at their data.

Each executed cell is parsed; every name it mentions is "touched", and so is every global a
notebook-defined function or method it can reach mentions. A variable not touched since the
last checkpoint and still bound to the same object keeps its frame from that checkpoint, so
an incremental checkpoint re-pickles only what the cells worked on. Anything the analysis
cannot follow (``exec``, ``globals()``, most magics) marks every variable as touched.
The buffers such a variable references also keep their content hash unless a PyTorch version
counter moved (``Checkpointer.trust_change_tracking``); checkpoints for a pause re-hash all.
"""

from __future__ import annotations

import ast
import types
from typing import Any

# Calls that can rebind or mutate any global behind the analysis's back.
_OPAQUE_CALLS = frozenset({"exec", "eval", "globals", "vars", "locals", "__import__", "setattr"})
# Magics known not to change user variables (their arguments are not code).
_INERT_MAGICS = frozenset(
    {
        "checkpoint",
        "pause",
        "load_ext",
        "reload_ext",
        "matplotlib",
        "pip",
        "conda",
        "who",
        "whos",
        "pwd",
        "ls",
        "env",
        "config",
        "lsmagic",
        "history",
        "precision",
        "pinfo",
        "pinfo2",
        "pdoc",
    }
)
# Magics whose argument is Python code run in the namespace.
_CODE_MAGICS = frozenset({"time", "timeit", "prun", "capture"})


class _NameCollector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.opaque = False

    def visit_Name(self, node: ast.Name) -> None:
        self.names.add(node.id)
        if node.id in _OPAQUE_CALLS:
            self.opaque = True

    def visit_Global(self, node: ast.Global) -> None:
        self.names.update(node.names)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in ("run_line_magic", "run_cell_magic")
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "get_ipython"
        ):
            self._magic(node)
            return
        self.generic_visit(node)

    def _magic(self, node: ast.Call) -> None:
        args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        name = args[0] if args else None
        if name in _INERT_MAGICS:
            return
        if name in _CODE_MAGICS and all(isinstance(a, str) for a in args[1:]):
            for code in args[1:]:
                inner = names_in_code(code)
                if inner is None:
                    self.opaque = True
                    return
                self.names.update(inner)
            return
        self.opaque = True


def names_in_code(code: str) -> set[str] | None:
    """The names a piece of Python code mentions, or None if it cannot be analysed."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    collector = _NameCollector()
    collector.visit(tree)
    return None if collector.opaque else collector.names


def _code_names(code: types.CodeType, seen: set[int]) -> set[str]:
    if id(code) in seen:
        return set()
    seen.add(id(code))
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const, seen)
    return names


def _reachable_code(value: Any) -> list[types.CodeType]:
    """Code that calling or using ``value`` may run, when the notebook defined it."""
    if isinstance(value, types.FunctionType | types.MethodType):
        func = getattr(value, "__func__", value)
        if func.__module__ == "__main__":
            return [func.__code__]
        return []
    cls = value if isinstance(value, type) else type(value)
    if cls.__module__ != "__main__":
        return []
    codes = []
    for klass in cls.__mro__:
        if klass.__module__ != "__main__":
            continue
        for attr in vars(klass).values():
            target = getattr(attr, "__func__", attr)
            if isinstance(target, property):
                target = target.fget
            if isinstance(target, types.FunctionType):
                codes.append(target.__code__)
    return codes


def expand_through_functions(names: set[str], namespace: dict[str, Any]) -> set[str]:
    """Add the globals that notebook-defined functions/classes among ``names`` mention."""
    result = set(names)
    pending = list(names)
    seen_code: set[int] = set()
    while pending:
        name = pending.pop()
        if name not in namespace:
            continue
        for code in _reachable_code(namespace[name]):
            for found in _code_names(code, seen_code) - result:
                result.add(found)
                pending.append(found)
    return result


class ChangeTracker:
    """Listens to IPython's cell events and answers "which names may have changed?"."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.touched: set[str] = set()
        self.everything = True  # nothing is known before the first checkpoint
        self.running: set[str] | None = set()  # the cell executing now (None: opaque)
        # name -> the cell that last mentioned it (counted from 1; earlier sessions' order is
        # carried over by a restore as counts below 1): a lazy restore loads the most
        # recently used first.
        self.last_used: dict[str, int] = {}
        self.cells = 0

    def pre_run_cell(self, info: Any) -> None:
        raw = getattr(info, "raw_cell", "") or ""
        try:
            code = self.shell.transform_cell(raw)
        except Exception:  # a cell IPython itself cannot transform: assume the worst
            code = None
        names = names_in_code(code) if code is not None else None
        if names is None:
            self.running = None
            self.everything = True
            return
        names = expand_through_functions(names, self.shell.user_ns)
        self.running = names
        self.touched |= names
        self.cells += 1
        for name in names:
            self.last_used[name] = self.cells

    def recent_first(self, names: list[str]) -> list[str]:
        """``names``, the most recently used first (those never seen last, in their order)."""
        never = -(2**62)
        return sorted(names, key=lambda name: -self.last_used.get(name, never))

    def carry_order(self, recent: list[str]) -> None:
        """Adopt the order of use of the session a restore brought back (most recent first)."""
        for rank, name in enumerate(recent):
            self.last_used.setdefault(name, -rank)

    def post_run_cell(self, result: Any) -> None:
        # Names bound by the cell are known only now (a def inside the cell, say): re-expand.
        if self.running:
            self.touched |= expand_through_functions(self.running, self.shell.user_ns)
        self.running = set()

    def maybe_changed(self, name: str) -> bool:
        return self.everything or name in self.touched

    def reset(self) -> None:
        """A checkpoint was taken (or restored): start counting again from here.

        The cell still running (a scheduled checkpoint after an optimizer step) keeps its names
        touched, since it goes on changing them.
        """
        if self.running is None:
            self.everything, self.touched = True, set()
        else:
            self.everything, self.touched = False, set(self.running)
