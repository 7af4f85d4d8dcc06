"""The rules of the kernel-pod backend's line of resumes (``backends/resume_line.py``).

What the line decides from what it reads of each pod: when a resume may make its pod, when it
must withdraw it, and the place it says. The pods here are a plain table that hands free GPUs to
pods in the order they were created, with launchers of chosen speeds, so that the orders the real
scheduler makes only sometimes (a later launcher finishing first) happen every time. How the real
kube-scheduler and kernel pods behave in a rush is the cluster tests' part
(``tests/cluster/test_kernel_pods_server.py``) and ``bench/kernel_pods_rush.py``'s.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from jupyter_pause.backends.resume_line import Placement, ResumeLine


@dataclass
class Pods:
    """Pods on ``gpus`` GPUs: a new or waiting pod gets a free GPU in creation order."""

    gpus: int
    placed: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)  # every pod made, in order
    most_waiting: int = 0  # the most pods refused a GPU at once

    def create(self, key: str) -> None:
        self.made.append(key)
        self.waiting.append(key)
        self.schedule()

    def delete(self, key: str) -> None:
        for pods in (self.placed, self.waiting):
            if key in pods:
                pods.remove(key)
        self.schedule()

    def schedule(self) -> None:
        while self.waiting and len(self.placed) < self.gpus:
            self.placed.append(self.waiting.pop(0))
        self.most_waiting = max(self.most_waiting, len(self.waiting))

    def placement(self, key: str) -> Placement:
        if key in self.placed:
            return True, None
        return False, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." if (
            key in self.waiting
        ) else None


def resume(
    pods: Pods, key: str, launcher_seconds: float, served: list[str], look_seconds: float = 0.0
):
    """A resume's launch: the launcher makes the pod, which waits for a node, then the kernel
    starts; a cancelled launch deletes its pod, and so does giving back a started one. Reading
    the pod takes ``look_seconds`` (an API call)."""

    async def attempt() -> None:
        try:
            await asyncio.sleep(launcher_seconds)
            pods.create(key)
            while key not in pods.placed:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the kernel starts
        except asyncio.CancelledError:
            pods.delete(key)
            raise
        served.append(key)

    async def look() -> Placement:
        await asyncio.sleep(look_seconds)
        return pods.placement(key)

    async def give_back() -> None:
        served.remove(key)
        pods.delete(key)

    return attempt, look, give_back


async def rush(
    line: ResumeLine,
    pods: Pods,
    launchers: dict[str, float],
    served: list[str],
    look_seconds: float = 0.0,
):
    return [
        asyncio.create_task(
            line.serve(key, f"{key}.ipynb", *resume(pods, key, seconds, served, look_seconds))
        )
        for key, seconds in launchers.items()
    ]


async def test_a_rush_on_free_gpus_makes_every_pod_at_once_and_none_waits() -> None:
    line, pods, served = ResumeLine(poll_seconds=0.01, launches_at_once=3), Pods(gpus=3), []
    tasks = await rush(line, pods, {"a": 0.2, "b": 0.2, "c": 0.2}, served)
    await asyncio.sleep(0.1)  # the three launchers run side by side
    assert [line.waiting(key) for key in "abc"] == [None, None, None]
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert sorted(served) == ["a", "b", "c"] and pods.made == ["a", "b", "c"]
    assert line.paths() == []


async def until(done, timeout: float = 30.0) -> None:
    """Until the line reaches the state ``done`` checks: a state, not a speed (run after the
    cluster tests in one process, a starved event loop took over 5 s here once)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "the line did not settle"
        await asyncio.sleep(0.01)


async def test_launchers_that_finish_out_of_order_still_serve_the_gpus_in_request_order() -> None:
    # The launchers finish in reverse order: d's and c's pods would take the two GPUs
    line, pods, served = ResumeLine(poll_seconds=0.01, launches_at_once=4), Pods(gpus=2), []
    tasks = await rush(line, pods, {"a": 0.2, "b": 0.15, "c": 0.1, "d": 0.05}, served)

    # Then a and b are served; c's pod is the one that waits, d waits without one
    await until(
        lambda: (
            len(served) == 2 and pods.waiting == ["c"] and line.waiting("c") and line.waiting("d")
        )
    )
    assert sorted(served) == ["a", "b"] and sorted(pods.placed) == ["a", "b"], pods
    assert line.waiting("c") == (1, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    assert line.waiting("d") == (2, None) and line.paths() == ["c.ipynb", "d.ipynb"]

    # When a's and then b's GPU is freed, c and then d get it
    pods.delete(served[0])
    await until(lambda: len(served) == 3)
    pods.delete(served[1])
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert served[2:] == ["c", "d"], served
    assert pods.placed == ["c", "d"] and pods.waiting == [], pods


async def test_one_launch_at_a_time_makes_each_pod_once_the_one_before_has_a_node() -> None:
    line, pods, served = ResumeLine(poll_seconds=0.01), Pods(gpus=3), []
    tasks = await rush(line, pods, {"a": 0.2, "b": 0.01, "c": 0.01}, served)
    await asyncio.sleep(0.1)
    assert pods.made == [] and [line.waiting(key) for key in "bc"] == [(2, None), (3, None)]
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert pods.made == ["a", "b", "c"] and served == ["a", "b", "c"]


async def test_behind_a_refused_pod_a_resume_waits_without_one_and_keeps_its_place() -> None:
    line, pods, served = ResumeLine(poll_seconds=0.01), Pods(gpus=0), []
    first = await rush(line, pods, {"a": 0.01}, served)
    await asyncio.sleep(0.1)
    later = await rush(line, pods, {"b": 0.01, "c": 0.01}, served)
    await asyncio.sleep(0.2)
    assert pods.made == ["a"] and pods.waiting == ["a"], pods
    assert [line.waiting(key)[0] for key in "abc"] == [1, 2, 3]

    # When a GPU frees, a gets it; b's pod is made, and c waits behind it
    pods.gpus = 1
    pods.schedule()
    await asyncio.wait_for(first[0], 5)
    await asyncio.sleep(0.2)
    assert pods.waiting == ["b"] and line.waiting("c") == (2, None), pods

    # When the resumes are cancelled, their pods go
    for task in later:
        task.cancel()
    await asyncio.gather(*later, return_exceptions=True)
    assert pods.waiting == [] and line.paths() == [] and served == ["a"]


async def test_a_freed_gpu_is_for_the_first_in_line_and_only_once_its_pod_is_refused() -> None:
    # a's launcher is slow: b's pod is made and refused while a's is still being made
    line, pods, served = ResumeLine(poll_seconds=0.01, launches_at_once=2), Pods(gpus=0), []
    tasks = await rush(line, pods, {"a": 0.3, "b": 0.01}, served)
    await asyncio.sleep(0.1)
    assert pods.made == ["b"] and line.first_refused() is None

    # Once a's pod is refused, a freed GPU should go to it
    await until(lambda: (line.waiting("a") or (0, None))[1] is not None)
    assert line.first_refused() == "a"

    # When a GPU frees, a gets it; then b's pod, made again, is the one refused
    pods.gpus = 1
    pods.schedule()
    await asyncio.wait_for(tasks[0], 5)
    await until(lambda: line.first_refused() == "b")
    assert served == ["a"] and pods.waiting == ["b"], pods
    tasks[1].cancel()
    await asyncio.gather(tasks[1], return_exceptions=True)
    assert line.first_refused() is None


async def test_a_launch_that_fails_leaves_the_line_and_the_next_goes_on() -> None:
    line, pods, served = ResumeLine(poll_seconds=0.01), Pods(gpus=1), []

    async def refused() -> None:
        raise RuntimeError("pods is forbidden")

    async def nowhere() -> Placement:
        return False, None

    failing = asyncio.create_task(line.serve("a", "a.ipynb", refused, nowhere))
    later = await rush(line, pods, {"b": 0.01}, served)
    with pytest.raises(RuntimeError, match="forbidden"):
        await failing
    await asyncio.wait_for(later[0], 5)
    assert served == ["b"] and line.paths() == []


async def test_a_place_in_line_never_goes_up_when_a_later_pod_overtakes_and_gives_its_gpu_back() -> (
    None
):
    # Two pods in the making at once on one GPU: b's launcher is quicker, so b's pod takes the
    # GPU that a, asked first, waits for; c waits behind both without a pod
    line, pods, served = ResumeLine(poll_seconds=0.01, launches_at_once=2), Pods(gpus=1), []
    tasks = await rush(line, pods, {"a": 0.2, "b": 0.01, "c": 0.01}, served, look_seconds=0.03)
    places: list[int] = []

    async def watch_c() -> None:
        while "c" not in served:
            waiting = line.waiting("c")
            if waiting is not None and places[-1:] != [waiting[0]]:
                places.append(waiting[0])
            await asyncio.sleep(0)  # every pass of the event loop

    watching = asyncio.create_task(watch_c())
    await until(lambda: served == ["a"] and pods.waiting == ["b"])

    # When the GPU frees twice
    pods.delete("a")
    await until(lambda: served == ["a", "b"])
    await until(lambda: (line.waiting("c") or (0,))[0] == 1)  # its pod refused, first in line
    pods.delete("b")
    await asyncio.wait_for(asyncio.gather(*tasks, watching), 5)

    # Then each was served in request order, and c's place only went down: b's pod, placed
    # for a while ahead of a, still stood before c until it gave the GPU back and was served
    assert served == ["a", "b", "c"], served
    assert places == [3, 2, 1], places
