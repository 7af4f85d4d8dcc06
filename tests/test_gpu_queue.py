"""The local backend's GPU queue: first come, first served, whatever the number of waiters."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_pause.backends.base import ResourcesUnavailable
from jupyter_pause.backends.local import GpuPool


class Notebook:
    """A resume waiting for GPUs, and what the queue told it."""

    def __init__(self, pool: GpuPool, path: str, count: int = 1) -> None:
        self.path = path
        self.places: list[int] = []
        self.task = asyncio.create_task(
            pool.acquire(path, count, lambda place, _reason: self.places.append(place))
        )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def granted(notebook: Notebook) -> list[int]:
    """The GPUs a notebook got; fails (never waits) when it is still waiting."""
    assert notebook.task.done(), f"{notebook.path} is still waiting"
    return notebook.task.result()


@pytest.mark.parametrize("waiters", [2, 3])
async def test_waiters_are_served_in_the_order_they_came(waiters: int) -> None:
    # Given one GPU held, and N resumes arriving one after the other
    pool = GpuPool(1)
    assert await pool.acquire("holder", 1, lambda *_: None) == [0]
    queue = []
    for index in range(waiters):
        queue.append(Notebook(pool, f"n{index}.ipynb"))
        await settle()

    # Then each knows its place, and the status lists them in arrival order
    assert pool.queue() == [n.path for n in queue]
    assert [n.places[-1] for n in queue] == list(range(1, waiters + 1))

    # When the GPU is freed again and again, it goes to them in that same order
    previous = "holder"
    for index, notebook in enumerate(queue):
        pool.release(previous)
        await settle()
        assert granted(notebook) == [0]
        assert all(not later.task.done() for later in queue[index + 1 :])
        assert [later.places[-1] for later in queue[index + 1 :]] == list(range(1, waiters - index))
        previous = notebook.path
    assert pool.queue() == []


async def test_a_later_small_request_does_not_overtake_an_earlier_big_one() -> None:
    # Given 2 GPUs, one held; A needs 2 and waits; B needs 1, which is free now
    pool = GpuPool(2)
    await pool.acquire("holder", 1, lambda *_: None)
    big = Notebook(pool, "big.ipynb", count=2)
    await settle()
    small = Notebook(pool, "small.ipynb", count=1)
    await settle()

    # Then B waits behind A (first come, first served), and A goes first once 2 are free
    assert not big.task.done() and not small.task.done()
    assert pool.queue() == ["big.ipynb", "small.ipynb"]
    pool.release("holder")
    await settle()
    assert granted(big) == [0, 1] and not small.task.done()
    pool.release("big.ipynb")
    await settle()
    assert granted(small) == [0]


async def test_more_than_the_machine_has_is_refused_at_once() -> None:
    with pytest.raises(ResourcesUnavailable, match="needs 3 GPU"):
        await GpuPool(2).acquire("huge.ipynb", 3, lambda *_: None)
