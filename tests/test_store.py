"""The store, change tracking and schedule parsing, in-process (kernel behaviour is covered in
test_kernel_checkpoint.py with real kernels)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import time
from pathlib import Path

import pytest

from jupyter_pause.kernel import page_cache
from jupyter_pause.kernel import store as store_mod
from jupyter_pause.kernel import writer as writer_mod
from jupyter_pause.kernel.api import Checkpointer, CheckpointError
from jupyter_pause.kernel.arrays import Rebuilder
from jupyter_pause.kernel.schedule import parse_interval
from jupyter_pause.kernel.tracking import expand_through_functions, names_in_code
from jupyter_pause.policy import KERNEL_POLICY_ENV, Policy

from .test_datafile import resident_pages

np = pytest.importorskip("numpy")


def make(tmp_path: Path, namespace: dict, **traits) -> Checkpointer:
    return Checkpointer(
        namespace, key=str(tmp_path / "nb.ipynb"), store_root=str(tmp_path / "s"), **traits
    )


def test_default_root_follows_jupyter_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("JUPYTER_PAUSE_STORE", raising=False)
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    assert store_mod.default_store_root() == tmp_path / "data" / "jupyter_pause" / "checkpoints"
    monkeypatch.setenv("JUPYTER_PAUSE_STORE", str(tmp_path / "elsewhere"))
    assert store_mod.default_store_root() == tmp_path / "elsewhere"


def test_folder_names_are_readable_and_distinct() -> None:
    a = store_mod.notebook_folder_name("/home/ana/exp/train model.ipynb")
    b = store_mod.notebook_folder_name("/home/ana/other/train model.ipynb")
    assert a.startswith("train_model.ipynb-") and b.startswith("train_model.ipynb-") and a != b


def test_an_unused_folder_is_removed_and_one_with_a_checkpoint_stays(tmp_path: Path) -> None:
    # Given a folder only prepared, and another holding a checkpoint
    unused = store_mod.NotebookStore(tmp_path / "s", str(tmp_path / "placeholder"))
    unused.prepare()
    cp = make(tmp_path, {"x": 1})
    cp.checkpoint()
    kept = store_mod.NotebookStore(tmp_path / "s", str(tmp_path / "nb.ipynb"))

    # When both are asked to go
    unused.remove_if_unused()
    kept.remove_if_unused()
    unused.remove_if_unused()  # gone already: nothing to do

    # Then only the unused one went; the checkpoint is intact
    assert not unused.path.exists()
    assert kept.checkpoint_ids() == [cp.store.latest_id()]


def test_retention_by_count_age_and_bytes(tmp_path: Path) -> None:
    ns: dict = {}
    cp = make(tmp_path, ns, keep_last=0)
    for i in range(4):
        ns["data"] = np.full(300_000, float(i))  # 2.4 MB each, a blob of its own
        cp.checkpoint()
    assert cp.store.checkpoint_ids() == [1, 2, 3, 4]

    # max_bytes keeps the newest checkpoints whose data fits, never dropping the newest
    removed = cp.store.apply_retention(keep_last=0, max_bytes=5_000_000)
    assert removed == [1, 2]
    # max_age: back-date checkpoint 3, it goes; the newest stays even when old
    path = cp.store.manifest_path(3)
    manifest = json.loads(path.read_text())
    manifest["created"] = time.time() - 7200
    path.write_text(json.dumps(manifest))
    path4 = cp.store.manifest_path(4)
    manifest4 = json.loads(path4.read_text())
    manifest4["created"] = time.time() - 7200
    path4.write_text(json.dumps(manifest4))
    assert cp.store.apply_retention(keep_last=0, max_age_seconds=3600) == [3]
    assert cp.store.checkpoint_ids() == [4]
    assert data_bytes(cp) < 2_400_000 + 100_000  # only checkpoint 4's data is left


def data_files(cp: Checkpointer) -> list[Path]:
    folders = (cp.store.path / "blobs", cp.store.path / "packs")
    return [p for folder in folders for p in folder.rglob("*") if p.is_file()]


def data_bytes(cp: Checkpointer) -> int:
    return sum(p.stat().st_size for p in data_files(cp))


def test_a_process_image_is_owner_only_counted_and_never_outlives_its_checkpoint(
    tmp_path: Path,
) -> None:
    # Given three checkpoints, and a process image (the criu backend's) beside the newest
    ns: dict = {}
    cp = make(tmp_path, ns, keep_last=0)
    for i in range(3):
        ns["data"] = np.full(300_000, float(i))  # 2.4 MB each
        cp.checkpoint()
    image = cp.store.new_image_folder(3)
    (image / "pages-1.img").write_bytes(b"p" * 3_000_000)
    assert oct(image.stat().st_mode & 0o777) == "0o700"
    assert oct((image.parent).stat().st_mode & 0o777) == "0o700"

    # Then its bytes count for its checkpoint: 6 MB keep only the newest, with its image
    assert cp.store.apply_retention(keep_last=0, max_bytes=6_000_000) == [1, 2]
    assert cp.store.image_ids() == [3] and cp.store.image_bytes(3) == 3_000_000

    # And an image whose checkpoint is gone is collected with it
    orphan = cp.store.new_image_folder(2)
    (orphan / "pages-1.img").write_bytes(b"p")
    cp.store.apply_retention(keep_last=0)
    assert cp.store.image_ids() == [3] and not orphan.exists()
    ns["data"] = np.zeros(1)
    cp.checkpoint()
    cp.store.delete(3)
    assert cp.store.image_ids() == []


def test_large_buffers_get_files_and_mostly_dead_packs_are_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_mod, "LARGE_BUFFER_BYTES", 4_000_000)
    ns = {"static": np.full(125_000, 7.0), "moving": np.zeros(375_000), "huge": np.ones(600_000)}
    cp = make(tmp_path, ns, keep_last=2)
    cp.checkpoint()  # pack 1: static (1 MB) + moving (3 MB); huge (4.8 MB) has its own file
    assert len(list((cp.store.path / "blobs").rglob("*.*"))) == 0
    assert len([p for p in (cp.store.path / "blobs").rglob("*") if p.is_file()]) == 1
    for step in (1, 2):
        ns["moving"] = np.full(375_000, float(step))
        cp.checkpoint()
    # checkpoint 1 retired: pack 1 was 25% live (static), so static moved to a compact pack
    packs = sorted(p.name for p in (cp.store.path / "packs").iterdir())
    assert not any(name.startswith("000001-") and "compact" not in name for name in packs)
    assert any("compact" in name for name in packs)
    assert data_bytes(cp) < 4_800_000 + 1_000_000 + 2 * 3_000_000 + 200_000
    for checkpoint_id, moving in ((2, 1.0), (3, 2.0)):
        out: dict = {}
        make(tmp_path, out).restore(checkpoint_id)
        assert (
            out["static"][0] == 7.0 and out["moving"][-1] == moving and out["huge"].sum() == 600_000
        )


def test_write_failure_leaves_previous_checkpoint_and_no_partial_files(tmp_path: Path) -> None:
    ns = {"a": np.arange(10)}
    cp = make(tmp_path, ns)
    cp.checkpoint()

    class Exploding:
        def __reduce__(self):
            raise OSError(28, "No space left on device")

    ns["boom"] = Exploding()
    result = cp.checkpoint()  # a pickling error only skips that variable
    assert "No space left on device" in result.skipped["boom"]
    del ns["boom"]
    real_add = writer_mod.CheckpointWriter.add

    def failing_add(self, digest, data):
        raise OSError(28, "No space left on device", str(self.store.path / "tmp" / "x"))

    writer_mod.CheckpointWriter.add = failing_add
    try:
        ns["a"] = np.arange(20)
        with pytest.raises(
            CheckpointError, match=r"no space left .* Checkpoint 2 from .* is intact"
        ):
            cp.checkpoint()
    finally:
        writer_mod.CheckpointWriter.add = real_add
    assert os.listdir(cp.store.path / "tmp") == []
    assert cp.store.checkpoint_ids() == [1, 2]
    fresh: dict = {}
    make(tmp_path, fresh).restore()
    assert fresh["a"].tolist() == list(range(10))


def test_damaged_data_is_detected_on_restore(tmp_path: Path) -> None:
    ns = {"a": np.arange(1_000_000)}
    cp = make(tmp_path, ns)
    cp.checkpoint()
    blob = max(data_files(cp), key=lambda p: p.stat().st_size)
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # inside the array, wherever padding puts it
    blob.chmod(0o600)
    blob.write_bytes(bytes(raw))
    fresh: dict = {}
    # (read before ready; tests/test_lazy_restore.py has the lazy restore's finding)
    result = make(tmp_path, fresh, lazy_restore=False).restore()
    assert "does not match its hash: the file is damaged" in result.failed["a"]
    assert "a" not in fresh


def unmapped_pages(address: int, nbytes: int) -> int:
    """How many pages of this range are not in our page tables (/proc/self/pagemap)."""
    first, last = address // mmap.PAGESIZE, (address + nbytes - 1) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = pagemap.read((last - first + 1) * 8)
    present = [
        int.from_bytes(entries[i : i + 8], "little") >> 63 for i in range(0, len(entries), 8)
    ]
    return present.count(0)


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def buffer_addresses(store: store_mod.NotebookStore, manifest: dict) -> dict[str, tuple[int, int]]:
    addresses = {}
    for digest, location in manifest["buffers"].items():
        anchor = ctypes.c_char.from_buffer(store._map(location["file"]))
        addresses[digest] = (ctypes.addressof(anchor) + location["offset"], location["nbytes"])
        del anchor
    return addresses


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="needs Linux /proc")
def test_prefetch_maps_every_page_of_every_buffer_before_the_restore_reads_it(
    tmp_path: Path,
) -> None:
    ns = {"a": np.arange(9_000_000, dtype=np.float64), "small": np.ones(10), "x": {"k": 1}}
    cp = make(tmp_path, ns)
    cp.checkpoint()
    for path in data_files(cp):
        evict(path)
    store = make(tmp_path, {}).store
    manifest = store.read_manifest(store.latest_id())
    digests = list(manifest["buffers"])
    addresses = buffer_addresses(store, manifest)
    assert sum(unmapped_pages(*addresses[d]) for d in digests) > 0  # mapped, nothing touched
    prefetch = store.start_prefetch(manifest, digests)
    try:
        for digest in digests:
            prefetch.wait(digest)
            # mapped, not only read: the restore's first touch of a page costs no fault
            assert unmapped_pages(*addresses[digest]) == 0, digest
    finally:
        prefetch.join()
    store.release_maps()


def test_restore_falls_back_where_the_kernel_lacks_populate_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = {"a": np.arange(5_000_000), "b": np.arange(3)}
    make(tmp_path, ns).checkpoint()
    monkeypatch.setattr(page_cache, "MADV_POPULATE_READ", 0x7FFF)  # unknown advice: EINVAL
    store = make(tmp_path, {}).store
    manifest = store.read_manifest(store.latest_id())
    prefetch = store.start_prefetch(manifest, list(manifest["buffers"]))
    prefetch.join()
    assert prefetch._advice == page_cache.MADV_WILLNEED
    store.release_maps()
    fresh: dict = {}
    result = make(tmp_path, fresh).restore()
    assert result.failed == {} and fresh["a"].sum() == ns["a"].sum()


@pytest.mark.parametrize("direct_io", [True, False])
def test_direct_io_decides_whether_checkpoint_data_stays_in_the_page_cache(
    tmp_path: Path, direct_io: bool
) -> None:
    ns = {"big": np.arange(9_000_000)}  # 72 MB: a blob file of its own
    cp = make(tmp_path, ns, direct_io=direct_io)
    cp.checkpoint()
    blob = max(data_files(cp), key=lambda p: p.stat().st_size)
    pages = -(-blob.stat().st_size // mmap.PAGESIZE)
    resident = resident_pages(blob)
    if direct_io and resident == pages:
        pytest.skip("this filesystem refuses O_DIRECT: written through the page cache")
    # Around the cache, only the staged first/last pages pass through it; through it, all.
    assert resident < 64 if direct_io else resident == pages
    fresh: dict = {}
    make(tmp_path, fresh).restore()
    assert (fresh["big"] == ns["big"]).all()


def test_kernels_read_back_every_setting_the_server_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy(keep_last=2, max_age_hours=1.5, max_bytes=10**9, save_unmarked="none")
    policy.direct_io = True
    for env, value in policy.kernel_env().items():
        monkeypatch.setenv(env, value)
    cp = make(tmp_path, {})
    for trait, _env, _read in KERNEL_POLICY_ENV:
        assert getattr(cp, trait) == getattr(policy, trait), trait


def test_a_missing_data_file_fails_only_the_variables_that_need_it(tmp_path: Path) -> None:
    ns = {"big": np.arange(9_000_000), "plain": {"lr": 0.1}}  # big: a blob file of its own
    cp = make(tmp_path, ns)
    cp.checkpoint()
    blob = max(data_files(cp), key=lambda p: p.stat().st_size)
    blob.unlink()
    fresh: dict = {}
    result = make(tmp_path, fresh).restore()
    assert "is missing: the checkpoint is damaged" in result.failed["big"]
    assert fresh["plain"] == {"lr": 0.1} and "big" not in fresh


def test_cross_variable_cycles_and_aliases_keep_identity(tmp_path: Path) -> None:
    first: list = []
    second = [first]
    first.append(second)
    shared = {"k": 1}
    ns = {"first": first, "second": second, "alias": first, "holder": [shared], "shared": shared}
    make(tmp_path, ns).checkpoint()
    out: dict = {}
    make(tmp_path, out).restore()
    assert out["first"][0] is out["second"] and out["second"][0] is out["first"]
    assert out["alias"] is out["first"] and out["holder"][0] is out["shared"]


def test_tensors_from_a_missing_device_come_back_on_cpu_with_a_warning() -> None:
    torch = pytest.importorskip("torch")
    data = torch.arange(6, dtype=torch.float32)
    raw = memoryview(bytearray(data.numpy().tobytes()))
    rebuilder = Rebuilder(lambda key: raw)
    record = {
        "kind": "torch",
        "storage": "s0",
        "offset": 0,
        "shape": [2, 3],
        "stride": [3, 1],
        "dtype": "float32",
        "device": "cuda:7",
        "requires_grad": True,
        "parameter": True,
    }
    tensor = rebuilder.rebuild(record)
    assert tensor.device.type == "cpu" and tensor.shape == (2, 3)
    assert isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad
    assert tensor.sum().item() == 15
    assert (
        len(rebuilder.warnings) == 1
        and "saved on cuda:7 were restored on the CPU" in rebuilder.warnings[0]
    )


def test_cell_analysis_finds_names_and_gives_up_on_opaque_code() -> None:
    assert names_in_code("x = y + f(z)\nfor i in it: acc.append(i)") >= {"x", "y", "f", "z", "acc"}
    assert names_in_code("exec('a = 1')") is None
    assert names_in_code("globals()['a'] = 1") is None
    assert names_in_code("get_ipython().run_line_magic('checkpoint', 'list')") == set()
    assert names_in_code("get_ipython().run_line_magic('time', 'model.fit(x)')") >= {"model", "x"}
    assert names_in_code("get_ipython().run_line_magic('run', 'other.py')") is None

    ns: dict = {"__name__": "__main__"}  # as in a notebook: definitions belong to __main__
    exec(
        "history = []\ndef log(v):\n    history.append(v)\n"
        "class T:\n    def fit(self):\n        log(1)\nt = T()",
        ns,
    )
    assert {"log", "history"} <= expand_through_functions({"t"}, ns)
    assert "history" not in expand_through_functions({"T2"}, ns)


def test_interval_parsing() -> None:
    assert parse_interval("30m") == 1800
    assert parse_interval("90s") == 90
    assert parse_interval("2h") == 7200
    assert parse_interval("off") is None and parse_interval(None) is None
    with pytest.raises(ValueError, match="Not an interval"):
        parse_interval("soon")
    with pytest.raises(ValueError, match="shorter than 1 second"):
        parse_interval("0.1")
