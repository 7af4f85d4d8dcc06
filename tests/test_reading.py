"""Restores that read data files into fresh memory (``reading``, ``loading``), stream CUDA
storages through staging buffers (``device_reads``, run on the CPU here) and restore warnings
filters without importing the libraries that added them. Real files, no mocks."""

from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from jupyter_pause.kernel import reading, session_settings
from jupyter_pause.kernel import store as store_mod
from jupyter_pause.kernel.arrays import content_hash
from jupyter_pause.kernel.datafile import DataFileWriter
from jupyter_pause.kernel.device_reads import PIECE, pieces, read_to_device
from jupyter_pause.kernel.reading import ALIGN, FileReads, ReadError
from jupyter_pause.kernel.state import buffers_in_load_order, load_order

from .test_datafile import pattern, resident_pages
from .test_store import data_files, evict, make

np = pytest.importorskip("numpy")
MB = 1 << 20


def write_file(path: Path, buffers: list[bytes]) -> list[tuple[int, int]]:
    """Write buffers back to back at unaligned offsets (as packs hold them); their places."""
    placed, offset = [], 0
    with open(path, "wb") as handle:
        for data in buffers:
            offset += 3  # nothing lands on a block boundary by luck
            handle.seek(offset)
            handle.write(data)
            placed.append((offset, len(data)))
            offset += len(data)
        os.fsync(handle.fileno())  # clean pages: evict() can then drop them
    return placed


def opener(folder: Path):
    def open_file(name: str) -> tuple[int, bool]:
        try:
            return reading.open_for_reading(folder / name)
        except FileNotFoundError:
            raise ReadError(f"{name} is missing") from None

    return open_file


def test_buffers_come_back_exactly_in_memory_of_their_own(tmp_path: Path) -> None:
    buffers = [pattern(n, seed) for seed, n in enumerate([100, 3 * MB + 5, 70, 20 * MB + 1, 5])]
    placed = write_file(tmp_path / "data", buffers)
    evict(tmp_path / "data")
    reads = FileReads(opener(tmp_path))
    keys = [f"b{i}" for i in range(len(buffers))]
    reads.schedule([(key, "data", *where) for key, where in zip(keys, placed, strict=True)])
    views = {key: reads.get(key) for key in keys}
    direct = reads.file("data")[1]
    reads.close()
    for key, data in zip(keys, buffers, strict=True):
        assert views[key].tobytes() == data, key
    # Large buffers: their own writable memory, read around the page cache (O_DIRECT).
    assert views["b3"].obj is not views["b1"].obj and not views["b3"].readonly
    assert resident_pages(tmp_path / "data") == 0 or not direct
    # Small ones were read together, then copied out: changing one touches no neighbour.
    views["b0"][:3] = b"xyz"
    assert views["b2"].tobytes() == buffers[2]
    assert views["b0"].obj is not views["b2"].obj


def test_a_buffer_asked_for_again_is_read_again(tmp_path: Path) -> None:
    """The reader keeps no memory it handed out: a frame's is freed once it is unpickled."""
    ((offset, nbytes),) = write_file(tmp_path / "data", [pattern(3 * MB, 5)])
    reads = FileReads(opener(tmp_path))
    reads.schedule([("big", "data", offset, nbytes)])
    first = reads.get("big")
    with pytest.raises(KeyError):
        reads.get("big")  # not kept: schedule it again to read it again
    reads.schedule([("big", "data", offset, nbytes)])
    second = reads.get("big")
    reads.close()
    assert first.tobytes() == second.tobytes() == pattern(3 * MB, 5)
    assert first.obj is not second.obj


def test_storages_with_equal_content_come_back_apart(tmp_path: Path) -> None:
    """One buffer on disk (content addressing), two memories after a cold restore."""
    ns = {"zeros": np.zeros(500_000), "more_zeros": np.zeros(500_000), "plain": 1}
    cp = make(tmp_path, ns)
    cp.checkpoint()
    manifest = cp.store.read_manifest(cp.store.latest_id())
    assert len({s["buffer"] for s in manifest["storages"].values()}) == 1
    for path in data_files(cp):
        evict(path)
    fresh: dict = {}
    assert make(tmp_path, fresh).restore().failed == {}
    fresh["zeros"][0] = 7.0
    assert fresh["more_zeros"][0] == 0.0 and fresh["zeros"].sum() == 7.0
    assert not np.shares_memory(fresh["zeros"], fresh["more_zeros"])


def test_pieces_arrive_in_order_and_hash_like_the_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Requests of 1 MiB instead of 64: the same arithmetic on a file 64 times smaller
    monkeypatch.setattr(reading, "REQUEST", MB)
    data = pattern(2 * MB + 12345, 7)
    ((offset, nbytes),) = write_file(tmp_path / "data", [data])
    reads = FileReads(opener(tmp_path))
    reads.schedule([("big", "data", offset, nbytes)])
    seen: list[bytes] = []
    view = reads.get("big", lambda piece: seen.append(piece.tobytes()))
    reads.close()
    assert len(seen) == 3 and b"".join(seen) == data == view.tobytes()
    hasher = __import__("xxhash").xxh3_128()
    for piece in seen:
        hasher.update(piece)
    assert hasher.hexdigest() == content_hash(memoryview(data))


def test_a_missing_or_short_file_fails_only_its_buffers(tmp_path: Path) -> None:
    (good,) = write_file(tmp_path / "good", [pattern(2 * MB, 1)])
    (cut,) = write_file(tmp_path / "cut", [pattern(2 * MB, 2)])
    os.truncate(tmp_path / "cut", cut[0] + MB)  # half the buffer is gone
    reads = FileReads(opener(tmp_path))
    reads.schedule(
        [
            ("good", "good", *good),
            ("cut", "cut", *cut),
            ("gone", "gone", 0, 10),
            ("g2", "gone", 20, 2 * MB),
        ]
    )
    assert reads.get("good").tobytes() == pattern(2 * MB, 1)
    with pytest.raises(ReadError, match="cut is shorter than recorded"):
        reads.get("cut")
    for key in ("gone", "g2"):
        with pytest.raises(ReadError, match="gone is missing"):
            reads.get(key)
    reads.close()


def test_cold_files_are_read_and_cached_files_are_mapped(tmp_path: Path) -> None:
    """The restore reads a file that is not in the page cache around it, into anonymous
    memory; a file wholly in the page cache is mapped (no disk, no copy)."""
    ns = {"big": np.arange(9_000_000, dtype=np.float64)}  # 72 MB: a blob file of its own
    make(tmp_path, ns, direct_io=False).checkpoint()  # through the page cache: all resident
    (blob,) = [p for p in data_files(make(tmp_path, {})) if p.stat().st_size > MB]
    assert resident_pages(blob) == -(-blob.stat().st_size // ALIGN)
    cached: dict = {}
    # (the eager restore's paths; a lazy restore maps either way: tests/test_lazy_restore.py)
    eager = {"lazy_restore": False}
    assert make(tmp_path, cached, **eager).restore().failed == {}
    assert memory_of(cached["big"]) == str(blob)  # a map of the data file
    assert (cached["big"] == ns["big"]).all()
    del cached  # its map would keep the pages in the cache
    gc.collect()
    evict(blob)
    assert resident_pages(blob) == 0
    cold: dict = {}
    assert make(tmp_path, cold, **eager).restore().failed == {}
    assert memory_of(cold["big"]) == "anonymous"
    fd, direct = reading.open_for_reading(blob)
    os.close(fd)
    assert resident_pages(blob) <= 2 or not direct
    assert (cold["big"] == ns["big"]).all()
    cold["big"][0] = -1.0  # restored memory is the kernel's own: writable
    assert cold["big"][0] == -1.0


def test_the_session_frame_is_fetched_before_any_variable_data(tmp_path: Path) -> None:
    """A whole restore applies the session's settings (working directory, imports) before it
    loads a variable, so their frame leads the fetch; behind all the tensor data it held up
    every variable until the whole checkpoint had arrived (0.5 s at 0.71 GB, mapped)."""
    ns = {"weights": np.arange(300_000, dtype=np.float64), "rows": [{"i": 1}]}
    checkpointer = make(tmp_path, ns)
    checkpointer.checkpoint()
    manifest = checkpointer.store.read_manifest(checkpointer.store.latest_id())
    order = buffers_in_load_order(manifest, load_order(manifest, ["rows", "weights"]))
    assert order[0] == manifest["session"]["before"]
    frames = {name: frame for frame in manifest["frames"] for name in frame["names"]}
    weights = order.index(frames["weights"]["frame"])
    assert order.index(frames["rows"]["frame"]) < weights  # plain values first
    assert sorted(order) == sorted(manifest["buffers"])


def memory_of(array: object) -> str:
    """What backs an array's first byte: a file's path, or "anonymous" (/proc/self/maps)."""
    address = array.__array_interface__["data"][0]  # type: ignore[attr-defined]
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start <= address < end:
            return fields[5] if len(fields) == 6 and fields[5].startswith("/") else "anonymous"
    raise AssertionError("address not mapped")


def test_a_damaged_cold_buffer_is_caught_piece_by_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reading, "REQUEST", 8 * MB)  # requests of 8 MiB instead of 64
    ns = {"a": np.arange(3_000_000), "plain": [1, 2]}  # 24 MB: three read requests
    cp = make(tmp_path, ns)
    cp.checkpoint()
    manifest = cp.store.read_manifest(cp.store.latest_id())
    (where,) = [loc for loc in manifest["buffers"].values() if loc["nbytes"] == ns["a"].nbytes]
    blob = cp.store.path / where["file"]
    raw = bytearray(blob.read_bytes())
    raw[where["offset"] + where["nbytes"] - 5] ^= 0xFF  # in the last of its pieces
    blob.write_bytes(bytes(raw))
    os.sync()
    evict(blob)
    fresh: dict = {}
    result = make(tmp_path, fresh, lazy_restore=False).restore()  # found before ready
    assert "does not match its hash: the file is damaged" in result.failed["a"]
    assert fresh["plain"] == [1, 2] and "a" not in fresh


# -- CUDA path, run on the CPU -------------------------------------------------------------


def test_device_pieces_cover_the_buffer_with_aligned_reads() -> None:
    for offset, nbytes in [(0, 1), (4095, 2), (8192, 3 * PIECE), (100, 2 * PIECE + 7)]:
        plan = pieces(offset, nbytes)
        assert all(start % ALIGN == 0 and length % ALIGN == 0 for start, length, _ in plan)
        assert plan[0][0] <= offset and plan[-1][0] + plan[-1][1] >= offset + nbytes
        covered = sum(min(s + n, offset + nbytes) - max(s, offset) for s, n, _ in plan)
        assert covered == nbytes and all(n <= PIECE for _s, n, _k in plan)


@pytest.mark.parametrize("damage", [None, "flip", "cut"])
def test_streaming_to_a_device_copies_checks_and_fails_cleanly(
    tmp_path: Path, damage: str | None
) -> None:
    torch = pytest.importorskip("torch")
    data = pattern(2 * PIECE + 999, 3)
    writer = DataFileWriter(tmp_path / "data")
    writer.append(memoryview(b"x" * 77), 64)
    offset = writer.append(memoryview(bytearray(data)), ALIGN)
    writer.finish()
    writer.close()
    if damage == "flip":
        raw = bytearray((tmp_path / "data").read_bytes())
        raw[offset + PIECE + 1] ^= 1
        (tmp_path / "data").write_bytes(bytes(raw))
    elif damage == "cut":
        os.truncate(tmp_path / "data", offset + PIECE)
    reads = FileReads(opener(tmp_path))
    digest = content_hash(memoryview(data))
    try:
        if damage is None:
            storage = read_to_device(reads, "data", offset, len(data), "cpu", digest)
            got = torch.empty(0, dtype=torch.uint8).set_(storage)
            assert got.numpy().tobytes() == data
        else:
            message = "does not match its hash" if damage == "flip" else "shorter than recorded"
            with pytest.raises(ReadError, match=message):
                read_to_device(reads, "data", offset, len(data), "cpu", digest)
    finally:
        reads.close()


def test_cuda_tensors_restore_on_the_cpu_where_there_is_no_gpu(tmp_path: Path) -> None:
    """A checkpoint whose tensors were on a CUDA device (its manifest says so), restored in a
    process without it: the streaming path stays off, every tensor lands on the CPU with
    its bytes, and the restore says so. The device is one past this machine's last (cuda:0
    without a GPU), so a GPU machine runs the test too."""
    torch = pytest.importorskip("torch")
    missing = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    model = torch.nn.Linear(512, 512)
    ns = {"model": model, "big": torch.arange(2_000_000, dtype=torch.float32)}
    cp = make(tmp_path, ns)
    cp.checkpoint()
    path = cp.store.manifest_path(cp.store.latest_id())
    manifest = json.loads(path.read_text())
    for record in [*manifest["objects"].values(), *manifest["storages"].values()]:
        if record.get("device") == "cpu" and "within" not in record:
            record["device"] = missing
    path.write_text(json.dumps(manifest))
    assert store_mod.manifest_bytes(manifest) > 8 * MB
    fresh: dict = {}
    result = make(tmp_path, fresh).restore()
    assert result.failed == {}
    assert any(f"saved on {missing} were restored on the CPU" in w for w in result.warnings)
    assert fresh["big"].device.type == "cpu" and torch.equal(fresh["big"], ns["big"])
    assert torch.equal(fresh["model"].weight, model.weight)


# -- warnings filters ----------------------------------------------------------------------


def test_warning_filters_of_libraries_come_back_without_importing_them(tmp_path: Path) -> None:
    """A library that adds a filter when imported (sympy, which torch's optimizers import)
    must not be imported by a restore just to set that filter: its own import does."""
    (tmp_path / "noisylib.py").write_text(
        textwrap.dedent(
            """
            import warnings
            class NoisyWarning(UserWarning):
                pass
            warnings.filterwarnings("ignore", category=NoisyWarning)
            """
        )
    )
    script = textwrap.dedent(
        f"""
        import pickle, sys, warnings
        sys.path.insert(0, {str(tmp_path)!r})
        from jupyter_pause.kernel import session_settings as s
        if sys.argv[1] == "save":
            import noisylib
            warnings.filterwarnings("error", category=DeprecationWarning)
            open({str(tmp_path / "filters")!r}, "wb").write(pickle.dumps(s._capture_warnings(None)))
        else:
            filters = pickle.loads(open({str(tmp_path / "filters")!r}, "rb").read())
            s._apply_warnings(filters, None)
            print("noisylib" in sys.modules, warnings.filters[0][0], warnings.filters[0][2].__name__)
            import noisylib
            print(any(f[2] is noisylib.NoisyWarning for f in warnings.filters))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(session_settings.__file__).parents[2])}
    run = [sys.executable, "-c", script]
    subprocess.run([*run, "save"], check=True, env=env)
    out = subprocess.run([*run, "restore"], check=True, env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "error", "DeprecationWarning", "True"]


class ExampleWarning(UserWarning):
    """A library's warning category (its module, this one, is imported)."""


def test_warning_filters_keep_categories_of_imported_modules() -> None:
    saved = list(warnings.filters)
    try:
        warnings.filterwarnings("ignore", category=ExampleWarning)
        captured = pickle.loads(pickle.dumps(session_settings._capture_warnings(None)))
        assert captured[0][2] == (__name__, "ExampleWarning")
        warnings.resetwarnings()
        session_settings._apply_warnings(captured, None)
        assert warnings.filters[0][2] is ExampleWarning
    finally:
        warnings.filters[:] = saved
        warnings._filters_mutated()  # type: ignore[attr-defined]
