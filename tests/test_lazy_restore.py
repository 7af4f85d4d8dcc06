"""A lazy restore (issue 40): large arrays and tensors come back as copy-on-write maps of their
checkpoint files before their bytes are in, indistinguishable from the eager restore's, and
are loaded and checked behind the notebook."""

from __future__ import annotations

import json
import mmap
import pickle
from pathlib import Path

import pytest

from jupyter_pause.kernel.api import Checkpointer
from jupyter_pause.kernel.lazy import LAZY_AT_LEAST

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

MB = LAZY_AT_LEAST // 8  # float64 items in one lazy-sized buffer


def make(tmp_path: Path, namespace: dict, **traits) -> Checkpointer:
    return Checkpointer(
        namespace, key=str(tmp_path / "nb.ipynb"), store_root=str(tmp_path / "s"), **traits
    )


def saved(tmp_path: Path, namespace: dict) -> None:
    make(tmp_path, namespace).checkpoint()


def restored(tmp_path: Path, lazy: bool = True) -> tuple[dict, Checkpointer, object]:
    namespace: dict = {}
    checkpointer = make(tmp_path, namespace, lazy_restore=lazy)
    ends: list = []
    checkpointer.on_loaded.append(lambda checkpoint_id, outcome: ends.append(outcome))
    result = checkpointer.restore()
    checkpointer.ends = ends  # type: ignore[attr-defined]
    return namespace, checkpointer, result


def large_buffer(tmp_path: Path) -> tuple[Path, int, int]:
    """(data file, offset, size) of the checkpoint's one large buffer, as its manifest says."""
    [manifest] = (tmp_path / "s").rglob("manifests/*.json")
    buffers = json.loads(manifest.read_text())["buffers"].values()
    [found] = [b for b in buffers if b["nbytes"] >= LAZY_AT_LEAST]
    return manifest.parent.parent / found["file"], found["offset"], found["nbytes"]


def finished(checkpointer: Checkpointer):
    load = checkpointer.lazy_load
    assert load is not None and load.wait(60)
    [outcome] = checkpointer.ends  # type: ignore[attr-defined]
    return outcome


def test_mapped_arrays_and_tensors_are_the_eager_restores_own(tmp_path: Path) -> None:
    # Given a checkpoint of large arrays and tensors that share memory, and small ones
    big = np.arange(4 * MB, dtype=np.float64).reshape(4, MB)
    weights = torch.arange(3 * MB, dtype=torch.float64)
    saved(
        tmp_path,
        {
            "big": big,
            "rows": big[1:3],  # a view of it
            "weights": weights,
            "as_numpy": weights.numpy(),  # the tensor's memory, seen by numpy
            "small": np.ones(10),
        },
    )
    eager, _, _ = restored(tmp_path, lazy=False)

    # When it is restored lazily
    lazy, checkpointer, result = restored(tmp_path)

    # Then the large buffers are still coming, and every value is what the eager restore gives
    assert result.loading_bytes == big.nbytes + weights.numel() * 8, result.loading_bytes
    assert result.complete
    for name in ("big", "rows", "weights", "as_numpy", "small"):
        value, expected = lazy[name], eager[name]
        assert type(value) is type(expected), name
        if isinstance(value, np.ndarray):
            assert value.flags.writeable and value.flags.c_contiguous == expected.flags.c_contiguous
            assert value.flags.owndata == expected.flags.owndata
            np.testing.assert_array_equal(value, expected)
        else:
            assert torch.equal(value, expected)
    # views and sharing as before: one memory
    assert np.shares_memory(lazy["rows"], lazy["big"])
    assert np.shares_memory(lazy["as_numpy"], lazy["weights"].numpy())
    # pickling copies the values, as any array's
    assert np.array_equal(pickle.loads(pickle.dumps(lazy["big"])), big)
    # and the load ends with every byte in and checked
    outcome = finished(checkpointer)
    assert (outcome.bytes_done, outcome.failed, outcome.stopped) == (outcome.bytes_total, {}, False)


def test_a_write_after_the_restore_stays_in_the_kernel_and_the_file_never_changes(
    tmp_path: Path,
) -> None:
    saved(tmp_path, {"big": np.zeros((2, MB))})
    lazy, checkpointer, _ = restored(tmp_path)
    lazy["big"][0, :5] = 7.0  # in place, before its pages came in
    assert finished(checkpointer).failed == {}  # a write of the notebook's own is no damage
    assert lazy["big"][0, :6].tolist() == [7.0] * 5 + [0.0]
    again, other, _ = restored(tmp_path)  # the checkpoint's file is as it was written
    assert float(again["big"].sum()) == 0.0
    finished(other)


def test_an_unchanged_mapped_array_costs_nothing_in_the_next_checkpoint(tmp_path: Path) -> None:
    saved(tmp_path, {"big": np.ones((3, MB))})
    _lazy, checkpointer, _ = restored(tmp_path)
    finished(checkpointer)
    result = checkpointer.checkpoint()
    assert result.bytes_written < LAZY_AT_LEAST, result


def test_a_checkpoint_deleted_while_mapped_keeps_its_arrays(tmp_path: Path) -> None:
    saved(tmp_path, {"big": np.full((2, MB), 3.0)})
    lazy, checkpointer, _ = restored(tmp_path)
    # When retention deletes every data file the maps come from
    data_files = [p for p in (tmp_path / "s").rglob("*") if p.parent.name in ("packs", "blobs")]
    data_files += list((tmp_path / "s").rglob("blobs/*/*"))
    assert data_files
    for path in data_files:
        path.unlink()
    # Then the map keeps them: the values load and check as if nothing happened
    outcome = finished(checkpointer)
    assert outcome.failed == {}
    assert float(lazy["big"].sum()) == 3.0 * 2 * MB


def test_a_truncated_file_is_found_at_the_restore_not_by_a_crash(tmp_path: Path) -> None:
    saved(tmp_path, {"big": np.ones((2, MB))})
    path, offset, nbytes = large_buffer(tmp_path)
    with open(path, "r+b") as file:
        file.truncate(offset + nbytes // 2)
    lazy, checkpointer, result = restored(tmp_path)
    assert "shorter than recorded" in result.failed["big"], result.failed
    assert "big" not in lazy and checkpointer.lazy_load is None


def test_a_damaged_file_found_in_the_background_takes_its_variables_back(tmp_path: Path) -> None:
    saved(tmp_path, {"big": np.ones((2, MB)), "x": 1})
    path, offset, _nbytes = large_buffer(tmp_path)
    with open(path, "r+b") as file:  # same size, other bytes
        file.seek(offset + 100)
        file.write(b"\xff" * 8)
    lazy, checkpointer, result = restored(tmp_path)
    assert result.complete and "big" in lazy  # handed over before its bytes were checked
    outcome = finished(checkpointer)
    assert list(outcome.failed) == ["big"]
    assert "did not match its hash once loaded" in outcome.failed["big"]
    assert "big" not in lazy and lazy["x"] == 1


def test_a_buffer_of_several_pieces_is_checked_whole(tmp_path: Path) -> None:
    from jupyter_pause.kernel.page_cache import PREFETCH_CHUNK

    # Given an array of two and a half load pieces, its last piece damaged on disk
    items = (5 * PREFETCH_CHUNK // 2) // 8
    saved(tmp_path, {"big": np.ones(items), "x": 1})
    path, offset, nbytes = large_buffer(tmp_path)
    assert nbytes > 2 * PREFETCH_CHUNK
    with open(path, "r+b") as file:
        file.seek(offset + nbytes - 8)
        file.write(b"\xff" * 8)
    # When it is restored lazily and the load ends
    lazy, checkpointer, _ = restored(tmp_path)
    outcome = finished(checkpointer)
    # Then every byte was loaded, the damage in its last piece found, and the array taken back
    assert outcome.bytes_done == outcome.bytes_total == nbytes
    assert list(outcome.failed) == ["big"], outcome.failed
    assert "big" not in lazy and lazy["x"] == 1


def test_equal_arrays_come_back_as_maps_of_their_own_and_go_back_together(
    tmp_path: Path,
) -> None:
    # Given two arrays and a tensor of equal content (one buffer on disk), not sharing memory
    content = np.arange(2 * MB, dtype=np.float64)
    saved(
        tmp_path,
        {"a": content.copy(), "b": content.copy(), "t": torch.from_numpy(content.copy())},
    )
    # When restored lazily
    lazy, checkpointer, result = restored(tmp_path)
    assert result.complete, result.summary()
    # Then each is a map of its own, all three still to load (none read before ready)
    assert result.loading_bytes == 3 * content.nbytes, result.loading_bytes
    assert not np.shares_memory(lazy["a"], lazy["b"])
    assert not np.shares_memory(lazy["a"], lazy["t"].numpy())
    lazy["a"][0] = -1.0  # a write to one is that one's only
    assert lazy["b"][0] == 0.0 and float(lazy["t"][0]) == 0.0 and lazy["a"][0] == -1.0
    assert finished(checkpointer).failed == {}
    np.testing.assert_array_equal(lazy["b"], content)
    assert torch.equal(lazy["t"], torch.from_numpy(content))


def test_a_damaged_file_takes_back_every_copy_built_on_it(tmp_path: Path) -> None:
    content = np.ones((2, MB))
    saved(tmp_path, {"a": content.copy(), "b": content.copy(), "x": 1})
    path, offset, _nbytes = large_buffer(tmp_path)
    with open(path, "r+b") as file:
        file.seek(offset + 100)
        file.write(b"\xff" * 8)
    lazy, checkpointer, _ = restored(tmp_path)
    failed = finished(checkpointer).failed
    assert sorted(failed) == ["a", "b"], failed
    assert "a" not in lazy and "b" not in lazy and lazy["x"] == 1


def test_a_checkpoint_for_a_pause_stops_the_load_cleanly(tmp_path: Path) -> None:
    saved(tmp_path, {"big": np.ones((64, MB))})  # 64 MiB
    lazy, checkpointer, _ = restored(tmp_path)
    result = checkpointer.checkpoint(reason="pause")
    assert checkpointer.lazy_load is None
    [outcome] = checkpointer.ends  # type: ignore[attr-defined]
    assert outcome.failed == {} and outcome.bytes_done <= outcome.bytes_total
    assert result.bytes_written < LAZY_AT_LEAST  # the unchanged array is not written again
    assert float(lazy["big"][-1].sum()) == MB


def test_off_reads_everything_before_ready(tmp_path: Path) -> None:
    saved(tmp_path, {"big": np.ones((2, MB))})
    _eager, checkpointer, result = restored(tmp_path, lazy=False)
    assert result.loading_bytes == 0 and checkpointer.lazy_load is None


# -- through the server, with real kernels ----------------------------------------------------------
LAZY_SERVER = pytest.mark.parametrize("jp_server_config", [{"lazy_restore": True}], indirect=True)
STATE = "import numpy as np\nbig = np.arange(8 * 2**20, dtype=np.float64)  # 64 MiB\nx = 42"


async def paused_with_state(server, path: str = "lazy.ipynb") -> None:
    from .servers import pause_and_wait

    kernel_id = await server.open_notebook(path)
    await server.run(kernel_id, STATE)
    assert (await pause_and_wait(server, path))["state"] == "paused"


def events(timeline: dict, kind: str) -> list[dict]:
    return [e for e in timeline["events"] if e["kind"] == kind]


@LAZY_SERVER
async def test_a_resume_is_ready_before_the_bytes_and_the_timeline_says_when_all_came(
    server,
) -> None:
    await paused_with_state(server)
    code, _ = await server.call("POST", "resume", "lazy.ipynb")
    assert code == 202
    ready = await server.wait_state("lazy.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready" and ready["how"] == "files", ready
    # (64 MiB handed over as maps; the load may have ended by now: then it says 0)
    assert ready["restore"]["loading_bytes"] in (0, 64 * 2**20), ready["restore"]
    # The load ends on its own: on the timeline after ready, with every byte
    timeline = await server.wait_for(
        "lazy.ipynb", lambda r: not r["progress"] and "still loading" not in r["message"]
    )
    _, timeline = await server.call("GET", "timeline", "lazy.ipynb")
    [loaded] = events(timeline, "fully_loaded")
    assert loaded["data"]["bytes"] == 64 * 2**20 and loaded["data"]["failed"] == {}
    assert loaded["at"] >= events(timeline, "kernel_ready")[-1]["at"]
    kernel_id = (await server.call("GET", "sessions", "lazy.ipynb"))[1]["kernel_id"]
    assert await server.run(kernel_id, "print(int(big.sum()), type(big).__name__, x)") == (
        f"{sum(range(8 * 2**20))} ndarray 42\n"
    )


async def fully_loaded_then_back(server, kernel_id: str, path: str = "lazy.ipynb") -> dict:
    """The load's end on the timeline (every byte, nothing taken back), and the data in the
    kernel; that event."""
    await server.wait_for(path, lambda r: not r["progress"] and "still loading" not in r["message"])
    _, timeline = await server.call("GET", "timeline", path)
    [loaded] = events(timeline, "fully_loaded")
    assert loaded["data"]["bytes"] == 64 * 2**20 and loaded["data"]["failed"] == {}, loaded
    assert await server.run(kernel_id, "print(int(big.sum()), type(big).__name__, x)") == (
        f"{sum(range(8 * 2**20))} ndarray 42\n"
    )
    return loaded


@LAZY_SERVER
async def test_after_a_server_restart_the_reopened_notebook_resumes_lazily(server) -> None:
    # Given a paused notebook, then the server restarted (tomorrow: its memory gone)
    await paused_with_state(server)
    await server.restart_extension()
    # When the notebook is opened again and resumed
    fresh = await server.open_notebook("lazy.ipynb")
    await server.wait_for("lazy.ipynb", lambda r: r["watching"] and r["unrestored_kernel"])
    code, _ = await server.call("POST", "resume", "lazy.ipynb")
    assert code == 202
    ready = await server.wait_state("lazy.ipynb", "ready", "partial", "failed")
    # Then into the new kernel, from files, and the rest arrives behind it
    assert ready["state"] == "ready" and ready["kernel_id"] == fresh, ready
    await fully_loaded_then_back(server, fresh)


@LAZY_SERVER
async def test_checkpoint_restore_typed_into_the_reopened_notebook_loads_lazily_too(
    server,
) -> None:
    # Given a paused notebook opened again
    await paused_with_state(server)
    fresh = await server.open_notebook("lazy.ipynb")
    await server.wait_for("lazy.ipynb", lambda r: r["watching"] and r["unrestored_kernel"])
    # When the user types %checkpoint restore instead of pressing Resume
    out = await server.run(fresh, "%checkpoint restore")
    assert out.startswith("Restored checkpoint"), out
    # Then the session is back and the timeline has the load's end, as for a Resume
    ready = await server.wait_state("lazy.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready", ready
    await fully_loaded_then_back(server, fresh)


@LAZY_SERVER
async def test_a_pause_right_after_a_lazy_resume_stops_the_load_and_loses_nothing(server) -> None:
    from .servers import pause_and_wait

    await paused_with_state(server)
    await server.call("POST", "resume", "lazy.ipynb")
    await server.wait_state("lazy.ipynb", "ready", "partial", "failed")
    # %pause at once, the load perhaps still running
    again = await pause_and_wait(server, "lazy.ipynb")
    assert again["state"] == "paused", again
    await server.call("POST", "resume", "lazy.ipynb")
    ready = await server.wait_state("lazy.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready", ready
    kernel_id = ready["kernel_id"]
    assert await server.run(kernel_id, "print(int(big[-1]), x)") == f"{8 * 2**20 - 1} 42\n"


@LAZY_SERVER
async def test_a_file_damaged_after_the_pause_is_taken_back_once_loaded(
    server, pause_store
) -> None:
    await paused_with_state(server)
    [manifest] = sorted(pause_store.rglob("manifests/*.json"))[-1:]
    buffers = json.loads(manifest.read_text())["buffers"].values()
    [big] = [b for b in buffers if b["nbytes"] >= LAZY_AT_LEAST]
    with open(manifest.parent.parent / big["file"], "r+b") as file:
        file.seek(big["offset"] + 4096)
        file.write(b"\xff" * 8)
    await server.call("POST", "resume", "lazy.ipynb")
    ended = await server.wait_for(
        "lazy.ipynb", lambda r: r["state"] in ("partial", "failed"), timeout=120
    )
    assert ended["state"] == "partial", ended
    assert "taken back once loaded" in ended["message"], ended["message"]
    assert "big" in ended["restore"]["failed"] and "x" in ended["restore"]["restored"]
    kernel_id = ended["kernel_id"]
    assert await server.run(kernel_id, "print('big' in globals(), x)") == "False 42\n"


def test_the_most_recently_used_arrays_load_first(tmp_path: Path) -> None:
    from jupyter_pause.kernel.tracking import ChangeTracker

    class Shell:  # what the tracker asks of IPython: the namespace, the cell's code
        user_ns: dict = {}

        def transform_cell(self, raw: str) -> str:
            return raw

    # Given cells that used a, then b, then c, then a again
    shell = Shell()
    tracker = ChangeTracker(shell)
    namespace = shell.user_ns
    for cell, name in enumerate("abca"):
        tracker.pre_run_cell(type("Info", (), {"raw_cell": f"{name} = {name}"})())
        namespace[name] = np.full((2, MB), float(cell))
        tracker.post_run_cell(None)
    Checkpointer(
        namespace, key=str(tmp_path / "nb.ipynb"), store_root=str(tmp_path / "s"), tracker=tracker
    ).checkpoint()
    # When it is restored lazily
    _lazy, checkpointer, _ = restored(tmp_path)
    # Then the load goes a, c, b
    order = [sorted(b.users) for b in checkpointer.lazy_load.buffers]
    assert order == [["a"], ["c"], ["b"]], order
    finished(checkpointer)


@LAZY_SERVER
async def test_status_says_how_much_disk_deleted_checkpoints_hold_while_mapped(
    server, pause_store, jp
) -> None:
    await paused_with_state(server)
    await server.call("POST", "resume", "lazy.ipynb")
    await server.wait_state("lazy.ipynb", "ready", "partial", "failed")
    _, status = await server.call("GET", "status")
    assert status["held_by_maps"] == 0  # every file the kernel maps is still there
    # When retention deletes the data files the kernel's arrays map
    files = [*pause_store.rglob("packs/*.pack"), *pause_store.rglob("blobs/*/*")]
    assert files
    for path in files:
        path.unlink()
    # Then the status says what they still hold, until the kernel lets go
    _, status = await server.call("GET", "status")
    assert status["held_by_maps"] >= 64 * 2**20, status
    code, stdout, stderr = await jp("status")
    assert code == 0, stderr
    assert "of deleted checkpoints, still mapped by kernels" in stdout, stdout
    kernel_id = (await server.call("GET", "sessions", "lazy.ipynb"))[1]["kernel_id"]
    await server.run(kernel_id, "del big; import gc; gc.collect()")
    _, status = await server.call("GET", "status")
    assert status["held_by_maps"] < 2**20, status


def cold_maps(tmp_path: Path, names: str, size: int) -> list:
    """Copy-on-write maps of new data files on the disk, none of their pages in memory."""
    import os

    maps = []
    for name in names:
        path = tmp_path / name
        with path.open("wb") as file:
            file.write(name.encode() * size)
            file.flush()
            os.fsync(file.fileno())
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        with path.open("rb") as file:
            maps.append(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY))
    return maps


def read_like_a_cell(mapped, nbytes: int) -> None:
    """What a cell summing the array does to the pages: faults them in, in order."""
    pages = np.frombuffer(mapped, dtype=np.uint8)[: nbytes : mmap.PAGESIZE]
    try:
        assert int(pages.sum()) == int(pages[0]) * len(pages)
    finally:
        del pages


def prefetch_of(maps: list, names: str, **options):
    import ctypes

    from jupyter_pause.kernel import page_cache

    if page_cache.LIBC_MINCORE is None:
        pytest.skip("no mincore here (not Linux)")
    anchors = [ctypes.c_char.from_buffer(m) for m in maps]
    buffers = [
        (n, ctypes.addressof(a), len(m)) for n, a, m in zip(names, anchors, maps, strict=True)
    ]
    if any(page_cache.page_in_memory(address) for _n, address, _l in buffers):
        pytest.skip("this filesystem keeps the files in memory (tmpfs)")
    return page_cache.Prefetch(buffers, anchors, **options)


def test_the_load_goes_where_the_notebook_reads(tmp_path: Path) -> None:
    from jupyter_pause.kernel.page_cache import PREFETCH_CHUNK

    # Given three data files of two pieces each, on the disk and none of it in memory
    maps = cold_maps(tmp_path, "abc", 2 * PREFETCH_CHUNK)
    # and a load of them in that order, whose workers have not started
    prefetch = prefetch_of(maps, "abc", threads=0)
    try:
        assert prefetch.follow_once() is None  # nothing read yet
        assert prefetch.waiting() == ["a", "a", "b", "b", "c", "c"]
        # When the notebook reads the first piece of c (its own page faults)
        read_like_a_cell(maps[2], PREFETCH_CHUNK)
        # Then the load goes on with c first, the others after in their order
        assert prefetch.follow_once() == "c"
        assert prefetch.waiting() == ["c", "c", "a", "a", "b", "b"]
        # and, first already, it is not moved again
        assert prefetch.follow_once() is None
    finally:
        prefetch.cancel()
        prefetch.join()
        for m in maps:
            m.close()


def test_the_load_steps_aside_while_the_notebook_reads_and_stops_at_once_even_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from jupyter_pause.kernel import page_cache

    def until(condition, within: float = 10.0) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.001)
        return False

    # Given a following load of three cold files (no workers: nothing but the notebook reads)
    maps = cold_maps(tmp_path, "abc", 2 * page_cache.PREFETCH_CHUNK)
    prefetch = prefetch_of(maps, "abc", threads=0, follow_faults=True)
    try:
        # When the notebook's reads of b have only begun in each piece (the kernel's read-ahead
        # around a fault brings a few MiB in: the pages the load probes, not the whole piece)
        monkeypatch.setattr(page_cache, "FOLLOW_QUIET", 3600)
        pages = np.frombuffer(maps[1], dtype=np.uint8)
        try:
            for start in (0, page_cache.PREFETCH_CHUNK):
                assert pages[start + page_cache.FOLLOW_PROBE_AT] == ord("b")
        finally:
            del pages
        # Then the load steps aside for b, and stays aside while the rest of b is still to read
        assert until(lambda: prefetch.stepped_aside_for == "b"), prefetch.followed
        time.sleep(0.2)
        assert prefetch.stepped_aside_for == "b"
        # When the notebook reads all of b
        read_like_a_cell(maps[1], 2 * page_cache.PREFETCH_CHUNK)
        # Then the load goes on once b's last page is in (not waiting an hour to see it quiet)
        assert until(lambda: prefetch.followed == ["b"] and prefetch.stepped_aside_for is None)
        assert prefetch.waiting()[:2] == ["b", "b"]
        # When the notebook reads the first piece of a, then stops
        monkeypatch.setattr(page_cache, "FOLLOW_QUIET", 0.5)
        read_like_a_cell(maps[0], page_cache.PREFETCH_CHUNK)
        # Then the load goes on once a has been quiet for a while
        assert until(lambda: prefetch.followed == ["b", "a"] and prefetch.stepped_aside_for is None)
        # When the notebook reads c, and the load is stopped (a pause) while it steps aside
        monkeypatch.setattr(page_cache, "FOLLOW_QUIET", 3600)
        read_like_a_cell(maps[2], page_cache.PREFETCH_CHUNK)
        assert until(lambda: prefetch.stepped_aside_for == "c"), prefetch.followed
        started = time.monotonic()
        prefetch.cancel()
        prefetch.join()
        # Then it stops at once, and whoever waits for a buffer is woken
        assert time.monotonic() - started < 5
        prefetch.wait("a")
    finally:
        prefetch.cancel()
        prefetch.join()
        for m in maps:
            m.close()


def test_reading_a_buffer_to_its_end_is_not_taken_for_reading_the_next_one(
    tmp_path: Path,
) -> None:
    import ctypes
    import time

    from jupyter_pause.kernel import page_cache

    # Given a load of c, then a and b, where a and b lie one after the other in one cold file
    # (small arrays share a pack file), and no worker started
    [pack] = cold_maps(tmp_path, "p", 2 * page_cache.PREFETCH_CHUNK)
    [other] = cold_maps(tmp_path, "c", page_cache.PREFETCH_CHUNK)
    anchors = [ctypes.c_char.from_buffer(pack), ctypes.c_char.from_buffer(other)]
    start = ctypes.addressof(anchors[0])
    chunk = page_cache.PREFETCH_CHUNK
    buffers = [("c", ctypes.addressof(anchors[1]), chunk), ("a", start, chunk)]
    buffers.append(("b", start + chunk, chunk))
    if any(page_cache.page_in_memory(address) for _n, address, _l in buffers):
        pytest.skip("this filesystem keeps the files in memory (tmpfs)")
    prefetch = page_cache.Prefetch(buffers, anchors, threads=0)
    try:
        # When the notebook reads all of a
        read_like_a_cell(pack, chunk)
        # Then the load follows a, and the read-ahead past a's end does not pass for b's reads
        assert prefetch.follow_once() == "a"
        # (the read-ahead past a's end is asynchronous: it may land a moment after the cell)
        probe = start + chunk + page_cache.FOLLOW_PROBE_AT
        deadline = time.monotonic() + 5
        while not page_cache.page_in_memory(probe) and time.monotonic() < deadline:
            time.sleep(0.005)
        if not page_cache.page_in_memory(probe):
            pytest.skip("the read-ahead here does not reach 1 MiB into the next buffer")
        assert prefetch.follow_once() is None
        # When the notebook then reads b itself, past that read-ahead
        pages = np.frombuffer(pack, dtype=np.uint8)
        try:
            reach = chunk + page_cache.READ_AHEAD_REACH + (1 << 20)
            assert int(pages[chunk : reach : mmap.PAGESIZE].sum()) == ord("p") * len(
                range(chunk, reach, mmap.PAGESIZE)
            )
        finally:
            del pages
        # Then the load follows b
        assert prefetch.follow_once() == "b"
    finally:
        prefetch.cancel()
        prefetch.join()
        pack.close()
        other.close()
