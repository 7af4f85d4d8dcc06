"""The checkpoint engine in real ipykernel processes: what is saved must come back exactly."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from .kernels import Kernel, KernelFactory, checkpoint

pytest.importorskip("torch")


TORCH_SETUP = """
%load_ext jupyter_pause
import hashlib, random
import numpy as np, torch
torch.manual_seed(0); np.random.seed(0); random.seed(0)

class TiedNet(torch.nn.Module):
    # defined in the notebook: must travel by value
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(16, 16, bias=False)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        self.head = torch.nn.Linear(16, 16, bias=False)
        self.head.weight = self.embed.weight  # tied weights
    def forward(self, x):
        return self.head(self.body(self.embed(x)))

model = TiedNet()
stock = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.Adam(list(model.parameters()) + list(stock.parameters()), lr=1e-2)
inputs = torch.randn(64, 16)

def train_step():
    optimizer.zero_grad()
    loss = stock(model(inputs)).pow(2).mean() + torch.randn(1).abs().sum() * 0
    loss.backward()
    optimizer.step()
    return loss

for _ in range(3):
    train_step()

def fingerprint():
    loss = train_step()
    digest = hashlib.sha256()
    for p in list(model.parameters()) + list(stock.parameters()):
        digest.update(p.detach().numpy().tobytes())
    return {"loss": loss.item().hex(), "weights": digest.hexdigest(),
            "rand": [random.random(), float(np.random.rand()), torch.rand(1).item()]}
"""


def test_torch_model_and_optimizer_continue_bit_identically(start_kernel: KernelFactory) -> None:
    # Given a notebook that trained a notebook-defined model with tied weights, a stock model
    # and one Adam optimizer over both
    first = start_kernel()
    first.ok(TORCH_SETUP)
    saved = checkpoint(first)
    assert {"model", "stock", "optimizer", "inputs", "TiedNet", "train_step"} <= set(saved["saved"])
    expected = first.value("fingerprint()")

    # When a brand-new kernel restores the checkpoint and takes the same step
    second = start_kernel()
    out = second.ok("%load_ext jupyter_pause\n%checkpoint restore")
    assert "Restored checkpoint 1" in out
    got = second.value("fingerprint()")

    # Then loss, weights and every random stream continue exactly as in the original process
    assert got == expected
    sharing = second.value(
        "[model.head.weight is model.embed.weight,"
        " all(a is b for a, b in zip(optimizer.param_groups[0]['params'],"
        "     list(model.parameters()) + list(stock.parameters()))),"
        " all(p in optimizer.state for p in model.parameters()),"
        " isinstance(model, TiedNet), type(model).__module__]"
    )
    assert sharing == [True, True, True, True, "__main__"]


def test_numpy_pandas_objects_functions_roundtrip(start_kernel: KernelFactory) -> None:
    pd = pytest.importorskip("pandas")
    assert pd
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import numpy as np, pandas as pd
big = np.random.default_rng(1).random((2048, 2048))      # 32 MiB, restored memory-mapped
window = big[100:200, 5:50]                                # a view must stay a view of big
table = pd.DataFrame({"a": np.arange(1000), "b": np.linspace(0, 1, 1000), "c": ["x"] * 1000})
records = [{"id": i, "name": f"n{i}", "tags": (i % 7, "t")} for i in range(100_000)]
square = lambda v: v * v
def cube(v):
    return square(v) * v
class Point:
    def __init__(self, x, y): self.x, self.y = x, y
    def norm(self): return (self.x ** 2 + self.y ** 2) ** 0.5
point = Point(3, 4)
gen_state = np.random.default_rng(7)
cfg = {"lr": 0.1}
trainer = {"cfg": cfg, "history": []}
"""
    )
    expected = first.value(
        "[float(big.sum()), float(table.b.sum()), len(records), records[-1]['name'],"
        " cube(3), point.norm(), float(gen_state.random())]"
    )
    first.ok("gen_state = np.random.default_rng(7)")  # rewind: the restore must see this state
    checkpoint(first)

    second = start_kernel()
    second.ok("%load_ext jupyter_pause\n%checkpoint restore")
    got = second.value(
        "[float(big.sum()), float(table.b.sum()), len(records), records[-1]['name'],"
        " cube(3), point.norm(), float(gen_state.random())]"
    )
    assert got == expected
    checks = second.value(
        "[window.base is big or window.base is big.base,"
        " not big.flags.owndata, type(big.base).__name__,"
        " trainer['cfg'] is cfg, isinstance(point, Point),"
        " records[5] == {'id': 5, 'name': 'n5', 'tags': (5, 't')}]"
    )
    assert checks == [True, True, "mmap", True, True, True]
    second.ok("import numpy as np, pandas as pd")
    second.ok(
        "pd.testing.assert_frame_equal(table, pd.DataFrame({'a': np.arange(1000), "
        "'b': np.linspace(0, 1, 1000), 'c': ['x'] * 1000}))"
    )
    # and the restored memory is writable: training or editing goes on in place
    second.ok("big[0, 0] = -1.0\nassert big[0, 0] == -1.0")


def test_unsavable_values_are_skipped_with_specific_reasons(start_kernel: KernelFactory) -> None:
    kernel = start_kernel()
    kernel.ok(
        """
%load_ext jupyter_pause
import os, socket, sqlite3, threading
pipe = os.fdopen(os.pipe()[1], "w")
memory_db = sqlite3.connect(":memory:")
conn = socket.socket()
counter = (i for i in range(3))
guard = threading.Lock()
class Holder:
    def __init__(self): self.lock = threading.Lock()
holder = Holder()
fine = [1, 2, 3]
"""
    )
    result = checkpoint(kernel)
    skipped = result["skipped"]
    assert "is not a regular file on disk" in skipped["pipe"]
    assert "in-memory database" in skipped["memory_db"]
    assert "socket" in skipped["conn"]
    assert "generator" in skipped["counter"]
    assert "lock" in skipped["guard"]
    assert "_thread.lock" in skipped["holder"]
    assert "fine" in result["saved"] and "Holder" in result["saved"]
    out = kernel.ok("%checkpoint")
    assert "Checkpoint 2: " in out and "skipped: " in out and "memory_db (in-memory database" in out


def test_incremental_checkpoint_rewrites_nothing_unchanged(start_kernel: KernelFactory) -> None:
    kernel = start_kernel()
    kernel.ok(
        "%load_ext jupyter_pause\nimport numpy as np, torch\n"
        "weights = torch.randn(1024, 1024)\narray = np.ones((1024, 1024))\n"
        "objects = [{'i': i} for i in range(50_000)]\nlr = 0.1"
    )
    first = checkpoint(kernel)
    data_bytes = 1024 * 1024 * (4 + 8)
    assert first["bytes_written"] >= data_bytes
    # nothing changed: nothing is written, not even the random generators' states
    assert checkpoint(kernel)["bytes_written"] == 0

    kernel.ok("lr = 0.2")
    second = checkpoint(kernel)
    # only the new lr frame and RNG states (if anything drew random numbers) are written
    assert second["bytes_written"] < 64 * 1024
    assert second["bytes_reused"] >= data_bytes

    # an in-place update of a tensor the cell names is re-hashed and written
    kernel.ok("weights.add_(1.0)")
    third = checkpoint(kernel)
    assert 4 * 1024 * 1024 <= third["bytes_written"] < 4 * 1024 * 1024 + 64 * 1024

    # a mutation through a notebook function that the cell does not name is still seen
    kernel.ok("def grow():\n    objects.append({'i': -1})")
    checkpoint(kernel)
    kernel.ok("grow()")
    checkpoint(kernel)
    fresh = start_kernel()
    fresh.ok("%load_ext jupyter_pause\n%checkpoint restore")
    assert fresh.value("[len(objects), objects[-1], lr]") == [50_001, {"i": -1}, 0.2]
    assert fresh.value("weights.sum().item()") == kernel.value("weights.sum().item()")


def test_changes_behind_the_cell_analysis(start_kernel: KernelFactory, tmp_path: Path) -> None:
    """Buffers only unchanged variables reference keep their hash without being re-read:
    PyTorch's version counters catch in-place changes the cells do not show; numpy arrays
    have none, so a checkpoint for a pause (or --full) re-hashes everything."""
    (tmp_path / "behind.py").write_text(
        "import __main__\n"
        "def step():\n    __main__.weights.mul_(2)\n"
        "def poke(i):\n    __main__.array[i, i] = 42.0 + i\n"
    )
    kernel = start_kernel()
    kernel.ok(
        f"%load_ext jupyter_pause\nimport sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "import behind, jupyter_pause, numpy as np, torch\n"
        "from jupyter_pause.kernel.current import current\n"
        "weights = torch.ones(1024, 1024)\narray = np.zeros((512, 512))"
    )

    def save(call: str = "jupyter_pause.checkpoint()") -> dict:
        # A cell calling __import__ would defeat the cell analysis; these are plain calls.
        return kernel.value(f"{call}.to_json()")

    save()
    tensor_bytes, array_bytes = 4 * 1024 * 1024, 8 * 512 * 512
    kernel.ok("behind.step()")  # names neither variable; the tensor's version counter moves
    assert save()["bytes_written"] >= tensor_bytes

    kernel.ok("behind.poke(0)")
    assert save()["bytes_written"] < 64 * 1024  # the documented trade-off: not re-read
    assert save("jupyter_pause.checkpoint(full=True)")["bytes_written"] >= array_bytes

    kernel.ok("behind.poke(1)")
    assert save("current().checkpoint(reason='pause')")["bytes_written"] >= array_bytes

    fresh = start_kernel()
    fresh.ok("%load_ext jupyter_pause\n%checkpoint restore")
    assert fresh.value("[weights[0, 0].item(), array[0, 0], array[1, 1]]") == [2.0, 42.0, 43.0]


def test_list_names_the_notebook_from_the_kernels_folder_not_by_its_absolute_path(
    start_kernel: KernelFactory, tmp_path: Path
) -> None:
    # Given a kernel whose notebook lies below its working directory
    workdir = tmp_path / "work"
    notebook = workdir / "exp" / "train.ipynb"
    kernel = start_kernel(JUPYTER_PAUSE_NOTEBOOK=str(notebook))
    kernel.ok("%load_ext jupyter_pause\nweights = [1, 2]")
    # Then the listing names it relative to that folder, before and after a checkpoint
    empty = kernel.ok("%checkpoint list")
    assert empty == "No checkpoints yet for exp/train.ipynb.\n"
    checkpoint(kernel)
    listing = kernel.ok("%checkpoint list")
    assert listing.startswith("Checkpoints of exp/train.ipynb:\n")
    assert str(tmp_path) not in listing

    # And a notebook elsewhere by its name
    elsewhere = start_kernel(JUPYTER_PAUSE_NOTEBOOK=str(tmp_path / "other" / "eval.ipynb"))
    elsewhere.ok("%load_ext jupyter_pause")
    assert elsewhere.ok("%checkpoint list") == "No checkpoints yet for eval.ipynb.\n"


def test_marks_list_restore_named_and_delete(start_kernel: KernelFactory) -> None:
    kernel = start_kernel()
    kernel.ok("%load_ext jupyter_pause\na = 1\nb = [2]\nc = 'three'")
    assert "Marked: a, b" in kernel.ok("%checkpoint keep a b")
    assert "Marked: a" in kernel.ok("%checkpoint drop b")
    kernel.ok("%checkpoint keep b")
    first = checkpoint(kernel)
    assert first["saved"] == ["a", "b"]
    kernel.ok("a = 10\nb.append(20)")
    checkpoint(kernel)
    listing = kernel.ok("%checkpoint list")
    assert "    1  " in listing and "    2  " in listing and "a, b" in listing

    fresh = start_kernel()
    fresh.ok("%load_ext jupyter_pause")
    out = fresh.ok("%checkpoint restore 1 b nope")
    assert "Restored checkpoint 1: 1 variable (b)" in out
    assert "nope (not in checkpoint 1 (it has: a, b))" in out
    assert fresh.value("b") == [2]
    assert fresh.value("'a' in globals()") is False
    fresh.ok("%checkpoint restore")
    assert fresh.value("[a, b]") == [10, [2, 20]]
    assert "Marked: a, b" in fresh.ok("%checkpoint marked")  # the marked set came back too
    fresh.ok("%checkpoint delete 1")
    assert [
        c["checkpoint_id"]
        for c in fresh.value(
            "[c.to_json() for c in __import__('jupyter_pause').list_checkpoints()]"
        )
    ] == [2]
    err = fresh.run("%checkpoint delete 1")
    assert "No checkpoint 1" in err.stderr and err.status == "error"


def test_help_and_bad_input_are_clear(start_kernel: KernelFactory) -> None:
    kernel = start_kernel()
    kernel.ok("%load_ext jupyter_pause")
    help_page = kernel.run("%checkpoint?").payload[0]["data"]["text/plain"]
    for needle in ("keep NAME", "restore [ID]", "every 30m", "--full"):
        assert needle in help_page
    out = kernel.run("%checkpoint frobnicate")
    assert (
        out.status == "error"
        and "UsageError: %checkpoint: unknown action 'frobnicate'" in out.stderr
    )
    out = kernel.run("%checkpoint restore")
    assert "No checkpoint yet" in out.stderr and "Traceback" not in out.stderr
    out = kernel.run("%checkpoint every soon")
    assert "Not an interval: 'soon'" in out.stderr


def test_kill_during_checkpoint_keeps_previous_and_reports_torn(
    start_kernel: KernelFactory, store: Path
) -> None:
    # Given a checkpoint of the first state, then much more data
    kernel = start_kernel()
    kernel.ok("%load_ext jupyter_pause\nimport numpy as np\nsmall = np.arange(10)")
    checkpoint(kernel)
    kernel.ok(
        "import numpy as np\nparts = [np.random.default_rng(i).random(8_000_000) for i in range(6)]"
    )

    # When the kernel is SIGKILLed while the second checkpoint is being written
    kernel.send("%checkpoint")
    tmp_dirs = list(store.glob("*/tmp"))
    assert len(tmp_dirs) == 1
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".partial") for p in tmp_dirs[0].iterdir()):
        assert time.monotonic() < deadline, "the checkpoint never started writing"
        time.sleep(0.002)
    kernel.kill()

    # Then a new kernel restores the previous checkpoint and is told about the torn one
    fresh = start_kernel()
    fresh.ok("%load_ext jupyter_pause")
    listing = fresh.ok("%checkpoint list")
    assert "interrupted: the kernel died while writing it" in listing
    assert fresh.ok("%checkpoint restore").startswith("Restored checkpoint 1: 1 variable (small)")
    assert not [p for p in tmp_dirs[0].iterdir()]  # partial files were removed
    # and the torn id is never reused
    assert checkpoint(fresh)["checkpoint_id"] == 3


def test_store_layout_permissions_and_retention(start_kernel: KernelFactory, store: Path) -> None:
    kernel = start_kernel(JUPYTER_PAUSE_KEEP_LAST="2")
    kernel.ok("%load_ext jupyter_pause\nimport numpy as np")
    for i in range(4):
        kernel.ok(f"data = np.full(1_000_000, {i}.0)")
        checkpoint(kernel)
    folder = next(store.iterdir())
    manifests = sorted(p.name for p in (folder / "manifests").iterdir())
    assert manifests == ["000003.json", "000004.json"]
    data_files = {
        p.relative_to(folder).as_posix()
        for p in [*(folder / "blobs").rglob("*"), *(folder / "packs").rglob("*")]
        if p.is_file()
    }
    referenced = {
        loc["file"]
        for name in manifests
        for loc in json.loads((folder / "manifests" / name).read_text())["buffers"].values()
    }
    assert data_files == referenced  # the data of checkpoints 1 and 2 was collected
    assert sum((folder / f).stat().st_size for f in data_files) < 2 * 8_000_000 + 200_000
    for path in [store, *store.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), path
    assert json.loads((folder / "notebook.json").read_text())["key"] == str(store.parent / "work")
    # The admin's policy is the default; a user may change it for the session with %config.
    kernel.ok("%config Checkpointer.keep_last = 1")
    checkpoint(kernel)
    assert sorted(p.name for p in (folder / "manifests").iterdir()) == ["000005.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the store to another user")
def test_store_owned_by_someone_else_is_refused(start_kernel: KernelFactory, store: Path) -> None:
    kernel = start_kernel()
    kernel.ok("%load_ext jupyter_pause\nx = 1")
    checkpoint(kernel)
    manifest = next(store.glob("*/manifests/*.json"))
    os.chown(manifest, 65534, 65534)
    out = kernel.run("%checkpoint restore")
    assert "belongs to user id 65534" in out.stderr and "refusing" in out.stderr
    os.chown(manifest, 0, 0)
    os.chmod(manifest, 0o666)
    out = kernel.run("%checkpoint restore")
    assert "writable by other users" in out.stderr


def test_process_token_and_notebook_key(start_kernel: KernelFactory, tmp_path: Path) -> None:
    notebook_dir = tmp_path / "project"
    notebook_dir.mkdir()
    a = start_kernel(cwd=notebook_dir, JPY_SESSION_NAME="project/analysis.ipynb")
    a.ok("%load_ext jupyter_pause\nv = 1")
    token = a.value("__import__('jupyter_pause').process_token()")
    assert len(token) == 32 and token == a.value("__import__('jupyter_pause').process_token()")
    result = checkpoint(a)
    assert result["notebook"] == str(notebook_dir / "analysis.ipynb")
    same = a.value("__import__('jupyter_pause').restore().to_json()")
    assert same["same_process"] is True and same["saved_by_token"] == token

    b = start_kernel(cwd=notebook_dir, JPY_SESSION_NAME="project/analysis.ipynb")
    b.ok("%load_ext jupyter_pause")
    other = b.value("__import__('jupyter_pause').restore().to_json()")
    assert other["same_process"] is False and other["saved_by_token"] == token
    assert other["restored"] == ["v"]

    # a plain kernel (no notebook) keys on its working directory
    c = start_kernel(cwd=notebook_dir)
    c.ok("%load_ext jupyter_pause")
    assert "No checkpoint yet for " + str(notebook_dir) in c.run("%checkpoint restore").stderr


def test_scheduled_checkpoints_happen_after_optimizer_steps(start_kernel: KernelFactory) -> None:
    kernel = start_kernel()
    kernel.ok(
        "%load_ext jupyter_pause\nimport time, torch\nnet = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\nx = torch.randn(8, 4)\n"
        "%checkpoint keep net opt"
    )
    assert "Checkpoint every 1 s" in kernel.ok("%checkpoint every 1s")
    out = kernel.ok(
        "seen = []\nfor step in range(6):\n"
        "    opt.zero_grad(); net(x).pow(2).mean().backward(); opt.step()\n"
        "    seen.append(net.weight.detach().clone())\n    time.sleep(0.4)"
    )
    assert "scheduled, after SGD.step(): Checkpoint 1:" in out
    kernel.ok("%checkpoint every off")
    infos = kernel.value("[c.to_json() for c in __import__('jupyter_pause').list_checkpoints()]")
    assert infos and all(i["reason"] == "scheduled" for i in infos)
    # the checkpoint holds the weights exactly as one of the steps left them, never half-updated
    fresh = start_kernel()
    fresh.ok("%load_ext jupyter_pause\n%checkpoint restore " + str(infos[0]["checkpoint_id"]))
    fresh.ok("import torch")
    weights = fresh.value("net.weight.detach().flatten().tolist()")
    steps = kernel.value("[s.flatten().tolist() for s in seen]")
    assert weights in steps


def _mount_tiny_store(path: Path, size: str) -> bool:
    path.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
    )
    return done.returncode == 0


def test_disk_full_leaves_kernel_running_and_previous_intact(
    start_kernel: KernelFactory, store: Path
) -> None:
    if os.geteuid() != 0 or not _mount_tiny_store(store, "4m"):
        pytest.skip("needs permission to mount a small tmpfs to fill up")
    kernels: list[Kernel] = []
    try:
        kernel = start_kernel()
        kernels.append(kernel)
        kernel.ok("%load_ext jupyter_pause\nimport numpy as np\nkept = np.arange(1000)")
        checkpoint(kernel)
        kernel.ok("huge = np.ones(2_000_000)")  # 16 MB: cannot fit
        out = kernel.run("%checkpoint")
        assert out.status == "error" and "Traceback" not in out.stderr
        assert "Checkpoint not saved: no space left on the device" in out.stderr
        assert "Checkpoint 1 from" in out.stderr and "is intact" in out.stderr
        assert kernel.value("int(huge.sum())") == 2_000_000  # the session keeps running
        assert not list(store.glob("*/tmp/*"))  # the torn attempt cleaned up after itself
        fresh = start_kernel()
        kernels.append(fresh)
        fresh.ok("%load_ext jupyter_pause\n%checkpoint restore")
        assert fresh.value("int(kept.sum())") == 499500
        subprocess.run(["mount", "-o", "remount,ro", str(store)], check=True)
        out = kernel.run("kept2 = 1\n%checkpoint")
        assert "Checkpoint not saved: no permission to write" in out.stderr
        assert "Read-only file system" in out.stderr
    finally:
        for kernel in kernels:  # their memory maps keep the mount busy
            kernel.close()
        subprocess.run(["umount", str(store)], check=True)


def test_pause_without_a_server_and_unloading(start_kernel: KernelFactory) -> None:
    kernel = start_kernel()
    kernel.ok("%load_ext jupyter_pause")
    out = kernel.run("%pause")
    assert out.status == "error" and "%pause: no jupyter_pause server is watching" in out.stderr
    kernel.ok("%checkpoint every 1h")
    kernel.ok("%unload_ext jupyter_pause")
    out = kernel.run("%checkpoint")
    assert "Line magic function `%checkpoint` not found" in out.stderr  # the magic is gone
    hooks = kernel.value(
        "[getattr(cb, '__qualname__', '') for cbs in get_ipython().events.callbacks.values()"
        " for cb in cbs if 'jupyter_pause' in getattr(cb, '__module__', '')]"
    )
    assert hooks == []


def test_views_at_offsets_come_back_with_their_values_and_sharing(
    start_kernel: KernelFactory,
) -> None:
    # Given slices, strided and transposed views of tensors and arrays, at non-zero offsets,
    # some whose base is no variable of the notebook
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import numpy as np, torch
base = torch.arange(10.0)
middle = base[2:5]
every_third = base[1::3]
grid = torch.arange(12.0).reshape(3, 4)
column = grid.t()[2]
orphan = torch.arange(100.0)[40:43]
table = np.arange(20.0).reshape(4, 5)
window = table[1:3, 2:4]
stride = table[:, 1]
lone = np.arange(50.0)[7:10]
"""
    )
    expected = first.value(
        "[t.tolist() for t in (middle, every_third, column, orphan, window, stride, lone)]"
    )
    assert expected[0] == [2.0, 3.0, 4.0] and expected[3] == [40.0, 41.0, 42.0]
    checkpoint(first)

    # When a new kernel restores, and writes through the views
    second = start_kernel()
    second.ok("%load_ext jupyter_pause\n%checkpoint restore")
    got = second.value(
        "[t.tolist() for t in (middle, every_third, column, orphan, window, stride, lone)]"
    )
    second.ok("middle[0] = -1\nevery_third[1] = -4\ncolumn[1] = -6\nwindow[0, 0] = -7")

    # Then every value is where it was, and each write lands in its base at the right place
    assert got == expected
    assert second.value(
        "[base[2].item(), base[4].item(), grid[1, 2].item(), table[1, 2].item(),"
        " stride.tolist(), middle.storage_offset(), orphan.storage_offset()]"
    ) == [-1.0, -4.0, -6.0, -7.0, [1.0, 6.0, 11.0, 16.0], 2, 40]
