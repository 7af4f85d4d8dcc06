"""This server's line of GPU resumes: first asked, first served, none overtaken.

The kernel-pod backend (``kernel_pods.py``) puts each resume that needs a GPU here. The cluster's
scheduler places the pods, but it retries the pods that wait in its own backoff order, not in the
order they were asked for: a later resume could take a GPU that an earlier one waits for.

The line's rules:

* **Pods in the making.** A resume makes its pod once every resume before it makes or has its
  own, the scheduler refused none of them, and fewer than ``launches_at_once`` are still without a
  node. With 1 (the default) each pod is made once the one before it has a node. More fill free
  GPUs sooner in a rush, at the price of that many launchers at once on the server's CPU
  (``bench/kernel_pods_rush.py`` measures both).
* **One pod waits.** Once the scheduler refuses a pod (``Unschedulable``), only the first resume
  without a node keeps a waiting pod. A later one that is refused withdraws: its pod is deleted,
  and it waits without one, keeping its place, until every resume before it has a node. So the
  next GPU freed can only go to the first in line. When this server's own pod frees one, the
  backend makes that waiting pod anew (``first_refused``): the scheduler tries a new pod at
  once, where it retries a refused one only once its backoff ends (up to 10 s).
* **No overtaking.** Pods made together are created in whatever order their launchers finish. A
  later resume whose pod gets a node stays in line until every resume before it has one or is
  refused. If one before it is refused, the later one gives its node back (its launch cancelled,
  or, once its kernel answered, ``give_back``: the pod deleted again), and the GPU goes to the
  earlier one.

A resume leaves the line once its pod has a node and every resume before it has one, or when its
launch fails or is cancelled. Plain asyncio: the backend supplies each resume's launch
(``attempt``) and how to read its pod (``look``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

#: A resume's pod as read now: whether it has a node, and the scheduler's reason while it is
#: refused one (None while it is not, or has no pod).
Placement = tuple[bool, str | None]


@dataclass
class _Resume:
    path: str
    launching: bool = False  # its pod is being made, or exists
    placed: bool = False  # its pod has a node
    refused: str | None = None  # the scheduler's reason, while its pod is refused a node
    withdrew: bool = False  # its last pod was withdrawn: the next waits for all before it


class ResumeLine:
    """The resumes waiting for a node, in the order they were asked (see the module docstring)."""

    def __init__(self, poll_seconds: float = 0.5, launches_at_once: int = 1) -> None:
        self.poll_seconds = poll_seconds
        #: How many pods may be in the making (no node, not refused) at once; 1 makes each pod
        #: once the one before it has a node.
        self.launches_at_once = max(1, launches_at_once)
        self._resumes: dict[str, _Resume] = {}  # key (kernel id) -> its resume, first asked first
        self._changed = asyncio.Event()  # set (and replaced) whenever the line changes

    # -- what it says -----------------------------------------------------------------------------
    def paths(self) -> list[str]:
        """The notebooks in line, first asked first."""
        return [resume.path for resume in self._resumes.values()]

    def __contains__(self, key: str) -> bool:
        return key in self._resumes

    def waiting(self, key: str) -> tuple[int, str | None] | None:
        """The place (1 for the first) and the scheduler's reason while ``key``'s resume waits
        for a GPU: refused by the scheduler, or held behind one that is; None while its pod is
        made alongside the ones before it, or once it has a node. A place only goes down."""
        resume = self._resumes.get(key)
        if resume is None or resume.placed or (resume.launching and resume.refused is None):
            return None
        # Every resume before it counts until it leaves the line, placed or not: one placed
        # while an earlier one has no node overtook it, and may give its node back.
        return 1 + len(self._ahead(key)), resume.refused

    def first_refused(self) -> str | None:
        """The key of the first resume in line without a node, when the scheduler refused its
        pod one (the pod a GPU freed now should go to); None while there is none, or that
        resume's pod is still being made."""
        for key, resume in self._resumes.items():
            if not resume.placed:
                return key if resume.launching and resume.refused is not None else None
        return None

    # -- what it does -----------------------------------------------------------------------------
    async def until_changed(self, launch: asyncio.Future[None] | None = None) -> None:
        """Returns once the line changes (a resume's place, pod or turn), ``launch`` ends, or
        ``poll_seconds`` pass (a pod's state is read again then)."""
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait(
                {changed} if launch is None else {changed, launch}, timeout=self.poll_seconds
            )
        finally:
            changed.cancel()

    def nudge(self) -> None:
        """Something about a pod changed (it got a node): the line looks again now."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def serve(
        self,
        key: str,
        path: str,
        attempt: Callable[[], Awaitable[None]],
        look: Callable[[], Awaitable[Placement]],
        give_back: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Take the last place for ``key`` and run its launch (``attempt``) by the line's rules,
        again each time it withdraws: cancelled while its pod waits, or, once it ended,
        ``give_back`` (its pod deleted again) when a resume before it was refused the node it
        took. Returns when a launch is kept (its error raised); ``key`` has left the line."""
        self._resumes[key] = _Resume(path)
        try:
            while True:
                while not self._may_launch(key):
                    await self._changed.wait()
                launch = asyncio.ensure_future(attempt())
                self._set(key, launching=True, withdrew=False)
                try:
                    kept = await self._follow(key, launch, look)
                finally:  # withdrawn, or the resume itself was cancelled: its pod is deleted
                    if not launch.done():
                        launch.cancel()
                        with contextlib.suppress(BaseException):
                            await launch
                if kept:
                    launch.result()  # a failed launch leaves the line with its error
                    if give_back is None or await self._settled(key):
                        return
                    await give_back()
                self._set(key, launching=False, placed=False, refused=None, withdrew=True)
        finally:
            self._leave(key)

    def _may_launch(self, key: str) -> bool:
        """Whether ``key``'s resume may make its pod: every one before it makes or has its own,
        the scheduler refused none of them, and fewer than ``launches_at_once`` are still in
        the making; after a withdrawal, every one before it has a node (else a pod made again
        behind one still in the making is refused and withdrawn again, over and over)."""
        withdrew = self._resumes[key].withdrew
        in_making = 0
        for resume in self._ahead(key):
            if not resume.launching or resume.refused is not None:
                return False
            if withdrew and not resume.placed:
                return False
            in_making += not resume.placed
        return in_making < self.launches_at_once

    async def _follow(
        self, key: str, launch: asyncio.Future[None], look: Callable[[], Awaitable[Placement]]
    ) -> bool:
        """Follow ``key``'s launch until it ends (True) or must withdraw (False): refused while
        a resume before it has no node either, or given a node an earlier one was refused."""
        while not launch.done():
            if key in self._resumes:
                placed, refused = await look()
                self._set(key, placed=placed, refused=None if placed else refused)
                ahead = self._ahead(key)
                if refused and not placed and not all(resume.placed for resume in ahead):
                    return False
                if placed and _overtaken(ahead):
                    return False
                if placed and all(resume.placed for resume in ahead):
                    self._leave(key)
            await self.until_changed(launch)
        return True

    async def _settled(self, key: str) -> bool:
        """Once ``key``'s launch ended on its node: True when every resume before it has a node
        (or left), False when one was refused meanwhile (the node was its)."""
        self._set(key, placed=True, refused=None)
        while True:
            ahead = self._ahead(key)
            if _overtaken(ahead):
                return False
            if all(resume.placed for resume in ahead):
                return True
            await self.until_changed()

    def _ahead(self, key: str) -> list[_Resume]:
        """The resumes before ``key``'s in line (none once it left)."""
        if key not in self._resumes:
            return []
        ahead = []
        for earlier, resume in self._resumes.items():
            if earlier == key:
                break
            ahead.append(resume)
        return ahead

    def _set(self, key: str, **changes: object) -> None:
        resume = self._resumes.get(key)
        if resume is None:
            return
        before = vars(resume).copy()
        for name, value in changes.items():
            setattr(resume, name, value)
        if vars(resume) != before:
            self.nudge()

    def _leave(self, key: str) -> None:
        if self._resumes.pop(key, None) is not None:
            self.nudge()


def _overtaken(ahead: list[_Resume]) -> bool:
    """Whether a resume before this one waits for a node it took: refused, or held without a
    pod behind a refused one."""
    return any(not r.placed and (r.refused is not None or not r.launching) for r in ahead)
