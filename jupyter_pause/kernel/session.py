"""The session around the variables: where the code runs, what it imported, how it set libraries up.

The variables alone do not make the notebook's next cell run: it also needs ``np`` and ``F``
bound again, the working directory and ``sys.path`` it relied on, the environment variables
it set, and the library settings that change results or output (torch's default dtype,
numpy's print options, pandas options, warnings filters, the matplotlib backend, ``%config``).

Each of those is a small registered ``SessionSetting``: ``capture`` in the kernel that takes
the checkpoint, ``apply`` in the kernel that restores it. A whole restore applies them in
registration order, before the variables are unpickled (so ``sys.path`` and imports are in
place for them), except settings marked ``after_variables`` (a registered magic refers to a
notebook function, which is a variable). Adding one touches nothing else::

    register(SessionSetting("mylib options", "settings", capture_fn, apply_fn))
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import shown_warnings
from .capture import Import


@dataclass
class Baseline:
    """What the kernel had before the notebook changed anything, to tell the changes apart."""

    environ: dict[str, str]
    extensions: frozenset[str] = frozenset()  # IPython extensions loaded by the kernel itself
    # The notebook's folder: a kernel starts in it, so a working directory inside it is saved
    # relative to it and comes back inside the folder the notebook is in now (moved, copied).
    home: str = ""

    @classmethod
    def take(cls, late: bool, shell: Any = None) -> Baseline:
        """``late``: the notebook ran cells before this (``%load_ext`` after some work), so
        what is set now may hold the notebook's changes: the environment the process was
        started with (``/proc/self/environ``) is the baseline then, and of the extensions
        only IPython's default one; the notebook's folder is the one the server names, else
        the working directory (the notebook may have left its folder by then)."""
        environ = dict(os.environ)
        loaded = getattr(getattr(shell, "extension_manager", None), "loaded", ())
        extensions = frozenset(loaded)
        home = os.getcwd()
        if late:
            environ = _launch_environ() or environ
            extensions = frozenset(name for name in loaded if name.endswith("storemagic"))
            named = os.environ.get("JUPYTER_PAUSE_NOTEBOOK")
            home = os.path.dirname(os.path.realpath(named)) if named else home
        return cls(environ=environ, extensions=extensions, home=home)


def _launch_environ() -> dict[str, str] | None:
    try:
        with open("/proc/self/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    pairs = (os.fsdecode(item).partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _sep, value in pairs}


@dataclass
class SessionContext:
    """What settings capture from and apply to."""

    namespace: dict[str, Any]
    shell: Any | None  # the IPython shell, None outside IPython
    baseline: Baseline
    imports: list[Import] = field(default_factory=list)  # found by capture.select_variables


#: What ``apply`` returns when it wants to report parts: restored labels, failed label -> why.
Outcome = tuple[list[str], dict[str, str]]


@dataclass(frozen=True)
class SessionSetting:
    """One piece of session state a restore brings back.

    ``capture(context)`` returns a picklable state, or None when there is nothing to bring
    back (the library was never imported, nothing was changed). ``apply(state, context)``
    puts it back; it returns None when the whole setting was applied, or an ``Outcome`` to
    report its parts; an exception fails the whole setting with its message.
    """

    name: str
    group: str  # "environment" | "imports" | "settings": how summaries list it
    capture: Callable[[SessionContext], Any]
    apply: Callable[[Any, SessionContext], Outcome | None]
    after_variables: bool = False
    # Run with the library's warnings silenced; off for the setting that is those filters.
    quiet: bool = True


_REGISTRY: list[SessionSetting] = []


def register(setting: SessionSetting) -> SessionSetting:
    """Add a setting; it is captured by every later checkpoint and applied in this order."""
    if any(existing.name == setting.name for existing in _REGISTRY):
        raise ValueError(f"a session setting named {setting.name!r} is already registered")
    _REGISTRY.append(setting)
    return setting


def registered() -> list[SessionSetting]:
    """The settings registered so far, in order. Saving and restoring import
    ``session_settings`` (its built-in settings register on import) before they ask."""
    return list(_REGISTRY)


@dataclass
class SessionReport:
    """What a checkpoint saved of the session, or what a restore brought back, by group."""

    done: dict[str, list[str]] = field(default_factory=dict)  # group -> labels
    failed: dict[str, str] = field(default_factory=dict)  # label -> why

    def add(self, group: str, labels: list[str]) -> None:
        if labels:
            self.done.setdefault(group, []).extend(labels)

    def merge(self, other: SessionReport) -> None:
        for group, labels in other.done.items():
            self.add(group, labels)
        self.failed.update(other.failed)

    def to_json(self) -> dict[str, Any]:
        return {"done": self.done, "failed": self.failed}

    def describe(self) -> str:
        """``imports: np, pd; environment: working directory; settings: torch``."""
        return "; ".join(f"{group}: {', '.join(labels)}" for group, labels in self.done.items())


def _quietly(setting: SessionSetting, function: Callable[..., Any], *args: Any) -> Any:
    # Reading or setting a library's settings must not print its deprecation warnings into
    # the notebook (torch warns about its older TF32 switches, pandas about old options).
    if not setting.quiet:
        return function(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args)


def capture_session(
    context: SessionContext, pickles: Callable[[Any], object]
) -> tuple[dict[str, Any], dict[str, Any], SessionReport]:
    """The states of every setting: (applied before the variables, after them, report).

    ``pickles(state)`` raises when a state cannot be saved: that setting alone is left out.
    """
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    report = SessionReport()
    with shown_warnings.keeping_shown():  # silencing the libraries must not reset them
        for setting in registered():
            try:
                state = _quietly(setting, setting.capture, context)
                if state is not None:
                    pickles(state)
            except Exception as err:  # one setting never fails a checkpoint; it is named
                report.failed[setting.name] = f"not saved ({type(err).__name__}: {err})"
                continue
            if state is None:
                continue
            (after if setting.after_variables else before)[setting.name] = state
            report.add(setting.group, _labels(setting, state))
    return before, after, report


def _labels(setting: SessionSetting, state: Any) -> list[str]:
    if setting.group == "imports":
        return [imp.name for imp in state]
    return [setting.name]


def apply_session(states: dict[str, Any], context: SessionContext) -> SessionReport:
    """Apply saved states, in registration order; one failure never stops the others."""
    report = SessionReport()
    with shown_warnings.keeping_shown():
        for setting in registered():
            if setting.name not in states:
                continue
            state = states[setting.name]
            try:
                outcome = _quietly(setting, setting.apply, state, context)
            except Exception as err:
                report.failed[setting.name] = f"{type(err).__name__}: {err}"
                continue
            if outcome is None:
                report.add(setting.group, _labels(setting, state))
            else:
                restored, failed = outcome
                report.add(setting.group, restored)
                report.failed.update(failed)
    return report
