"""``%checkpoint``: save, list, restore and schedule checkpoints from a notebook cell."""

from __future__ import annotations

import sys
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..formatting import format_bytes
from .api import Checkpointer, CheckpointError


class _ProgressLine:
    """A single, rewritten status line for checkpoints that take more than a moment."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()
        self.last = 0.0
        self.shown = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.started < 0.5 or now - self.last < 0.25:
            return
        self.last = now
        percent = f" ({100 * done / total:.0f}%)" if total else ""
        sys.stdout.write(
            f"\r{self.label}: {phase} {format_bytes(done)} / {format_bytes(total)}{percent}   "
        )
        sys.stdout.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stdout.write("\r")


def _failure(magic: str, message: str) -> UsageError:
    """Fails the cell (a Run All stops there) with one line, never a traceback."""
    return UsageError(f"%{magic}: {message}")


@magics_class
class CheckpointMagics(Magics):
    def __init__(self, shell: Any, checkpointer: Checkpointer) -> None:
        super().__init__(shell)
        self.checkpointer = checkpointer

    @magic_arguments()
    @argument(
        "words",
        nargs="*",
        help="Nothing to save now, or one of: keep NAME..., drop NAME..., marked, list, "
        "restore [ID] [NAME...], delete ID, every INTERVAL|off.",
    )
    @argument(
        "--full",
        action="store_true",
        help="Re-pickle every variable and re-hash every tensor/array, trusting no change "
        "tracking (the checkpoints taken for a pause always do).",
    )
    @line_magic
    def checkpoint(self, line: str = "") -> None:
        """Save the live state of this notebook and bring it back, in this or a new kernel.

        %checkpoint                     save now: the marked variables, or every variable
                                        that can be saved when none is marked
        %checkpoint keep NAME [NAME..]  mark variables to save (kept in the checkpoint)
        %checkpoint drop NAME [NAME..]  unmark variables
        %checkpoint marked              show the marked variables
        %checkpoint list                this notebook's checkpoints: id, time, size, variables
        %checkpoint restore [ID] [NAME..]
                                        load the latest (or ID) checkpoint, all or the named
                                        variables, into the namespace
        %checkpoint delete ID           delete one checkpoint
        %checkpoint every 30m           checkpoint at safe points (after a cell finishes or an
                                        optimizer step) every 30 minutes; units s, m, h
        %checkpoint every off           stop scheduled checkpoints

        Tensors and arrays are written as raw buffers, everything else with cloudpickle;
        unchanged data is never rewritten. Checkpoints live under $JUPYTER_PAUSE_STORE
        (default: <jupyter data dir>/jupyter_pause/checkpoints), one folder per notebook.
        The same operations are available as functions: jupyter_pause.checkpoint(),
        .keep(), .drop(), .restore(), .list_checkpoints(), .delete(), .every().
        """
        args = parse_argstring(self.checkpoint, line)
        words: list[str] = args.words
        action, rest = (words[0], words[1:]) if words else ("save", [])
        handler = getattr(self, f"_do_{action}", None)
        if handler is None:
            raise _failure(
                "checkpoint",
                f"unknown action {action!r}; use keep, drop, marked, list, restore, delete or "
                "every (see %checkpoint?)",
            )
        try:
            handler(rest, args)
        except (CheckpointError, ValueError) as err:
            raise _failure("checkpoint", str(err)) from None

    @line_magic
    def pause(self, line: str = "") -> None:
        """Pause this notebook: checkpoint it, stop the kernel and release its GPU.

        The jupyter_pause server does the work once this cell finishes, so it works with no
        browser open. Resume from the notebook toolbar or with `jupyter pause resume NOTEBOOK`.
        """
        from .server_link import request_from_server

        if line.strip():
            raise _failure("pause", "it takes no arguments")
        if not request_from_server("pause", notebook=self.checkpointer.key):
            raise _failure(
                "pause",
                "no jupyter_pause server is watching this kernel (is the server extension "
                "enabled?). %checkpoint still saves the state.",
            )
        print(
            "Pause requested: once this cell finishes, the server checkpoints this notebook, "
            "stops the kernel and releases its GPU."
        )

    # -- actions -----------------------------------------------------------------------------------
    def _do_save(self, rest: list[str], args: Any) -> None:
        progress = _ProgressLine("Checkpoint")
        try:
            result = self.checkpointer.checkpoint(full=args.full, progress=progress)
        finally:
            progress.close()
        print(result.summary())

    def _do_keep(self, rest: list[str], args: Any) -> None:
        if not rest:
            raise ValueError("keep needs variable names: %checkpoint keep model optimizer")
        marked = self.checkpointer.keep(*rest)
        missing = [n for n in rest if n not in self.shell.user_ns]
        line = f"Marked: {', '.join(marked)}"
        if missing:
            line += f" (not defined yet: {', '.join(missing)})"
        print(line)

    def _do_drop(self, rest: list[str], args: Any) -> None:
        if not rest:
            raise ValueError("drop needs variable names: %checkpoint drop data")
        marked = self.checkpointer.drop(*rest)
        print(
            f"Marked: {', '.join(marked)}" if marked else "Nothing marked: every variable is saved."
        )

    def _do_marked(self, rest: list[str], args: Any) -> None:
        marked = self.checkpointer.marked()
        print(
            f"Marked: {', '.join(marked)}" if marked else "Nothing marked: every variable is saved."
        )

    def _do_list(self, rest: list[str], args: Any) -> None:
        import os  # only the listing works with paths

        infos = self.checkpointer.list_checkpoints()
        torn = self.checkpointer.torn_checkpoints()
        # The notebook as the user knows it from the kernel's folder, not the absolute path
        # that keys the store: relative when it lies below the kernel's working directory,
        # else its name (the key is the working directory itself when no notebook is known).
        key = self.checkpointer.key
        relative = os.path.relpath(key, os.getcwd())
        if relative == os.curdir or relative.split(os.sep)[0] == os.pardir:
            relative = os.path.basename(key.rstrip(os.sep)) or key
        if not infos:
            print(f"No checkpoints yet for {relative}.")
        else:
            print(f"Checkpoints of {relative}:")
            print(f"{'id':>5}  {'saved at':19}  {'size':>9}  {'kind':9}  variables")
            for info in infos:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.created))
                names = ", ".join(info.variables[:6])
                if len(info.variables) > 6:
                    names += f" (+{len(info.variables) - 6})"
                print(
                    f"{info.checkpoint_id:>5}  {when}  {format_bytes(info.nbytes):>9}  "
                    f"{info.reason:9}  {names}"
                )
        for item in torn:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item.started))
            print(
                f"{item.checkpoint_id:>5}  {when}  interrupted: the kernel died while writing it; "
                "it was discarded, earlier checkpoints are intact"
            )

    def _do_restore(self, rest: list[str], args: Any) -> None:
        checkpoint_id = None
        if rest and rest[0].isdigit():
            checkpoint_id, rest = int(rest[0]), rest[1:]
        result = self.checkpointer.restore(checkpoint_id, rest or None)
        print(result.summary())

    def _do_delete(self, rest: list[str], args: Any) -> None:
        if len(rest) != 1 or not rest[0].isdigit():
            raise ValueError("delete needs one checkpoint id: %checkpoint delete 3")
        self.checkpointer.delete(int(rest[0]))
        print(f"Deleted checkpoint {rest[0]}.")

    def _do_every(self, rest: list[str], args: Any) -> None:
        if len(rest) != 1:
            raise ValueError("every needs an interval: %checkpoint every 30m (or: every off)")
        print(self.checkpointer.every(rest[0]).describe())
