"""A restore brings back the whole session, in a new real kernel: the next cell computes the same.

Each test runs a notebook up to a point in one ipykernel process, checkpoints, and restores into
a brand-new process; then it checks what the next cells see: notebook functions bound to the
live namespace, tensors of every layout with their gradients and memory sharing, imports,
working directory, sys.path, environment, library settings, reopened files, and values found
unloadable at checkpoint time instead of at restore.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .kernels import KernelFactory, checkpoint, restore

torch = pytest.importorskip("torch")


def test_notebook_functions_see_the_live_namespace(start_kernel: KernelFactory) -> None:
    # Given notebook functions, a lambda, a method and a closure that read and write globals
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import torch
g = 1
counter = 0
model = torch.nn.Linear(2, 1, bias=False)
torch.nn.init.constant_(model.weight, 1.0)
def read_g():
    return g
def bump():
    global counter
    counter += 1
    return counter
scaled = lambda x: x * g
class Reader:
    def value(self):
        return g + counter
reader = Reader()
def make_adder(step):
    def add(x):
        return x + step + g
    return add
add_two = make_adder(2)
def train_step():
    with torch.no_grad():
        model.weight.add_(1.0)
    return model.weight.sum().item()
"""
    )
    checkpoint(first)

    # When a new kernel restores it and the notebook changes those globals
    second = start_kernel()
    result = restore(second)
    assert result["failed"] == {}
    second.ok("g = 5\nbump(); bump()\nmodel = torch.nn.Linear(2, 1, bias=False)")
    second.ok("torch.nn.init.constant_(model.weight, 10.0)")

    # Then every function sees the new values and writes land in the notebook's namespace
    assert second.value(
        "[read_g(), counter, scaled(2), reader.value(), add_two(1), train_step(),"
        " read_g.__globals__ is globals(), type(__builtins__).__name__]"
    ) == [5, 2, 10, 7, 8, 22.0, True, "module"]


def test_tensors_of_every_layout_are_saved_exactly(start_kernel: KernelFactory) -> None:
    # Given sparse, quantized, lazily conjugated and negated tensors, some inside a dict
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import torch
dense = torch.arange(12.0).reshape(3, 4)
holder = {
    "coo": dense.to_sparse(),
    "csr": dense.to_sparse_csr(),
    "quantized": torch.quantize_per_tensor(dense / 4, 0.1, 3, torch.quint8),
}
base = torch.tensor([1 + 2j, 3 - 4j])
conjugated = base.conj()
negated = torch._neg_view(torch.tensor([1.0, -2.0]))
"""
    )
    result = checkpoint(first)

    # When the checkpoint is taken and restored in a new kernel
    assert {"holder", "conjugated", "negated", "base"} <= set(result["saved"])
    second = start_kernel()
    assert restore(second)["failed"] == {}

    # Then values, layouts and the lazy bits are exact, and a conjugate view still views base
    assert second.value(
        "[torch.equal(holder['coo'].to_dense(), dense), holder['coo'].layout == torch.sparse_coo,"
        " torch.equal(holder['csr'].to_dense(), dense), holder['csr'].layout == torch.sparse_csr,"
        " holder['quantized'].int_repr().tolist(), holder['quantized'].q_scale(),"
        " conjugated.is_conj(), negated.is_neg(), negated.tolist()]"
    ) == [
        True,
        True,
        True,
        True,
        first.value("holder['quantized'].int_repr().tolist()"),
        0.1,
        True,
        True,
        [-1.0, 2.0],
    ]
    second.ok("base[0] = 5 + 6j")
    assert second.value("[conjugated[0].real.item(), conjugated[0].imag.item()]") == [5.0, -6.0]


GRADIENT_SETUP = """
%load_ext jupyter_pause
import hashlib, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
leaf = torch.ones(4, requires_grad=True)
batches = [torch.randn(5, 8) for _ in range(3)]
def accumulate(batch):
    loss = model(batch).pow(2).mean() + (leaf * 2).sum()
    loss.backward()
accumulate(batches[0])
accumulate(batches[1])   # two micro-batches accumulated, no step yet
"""

FINISH_STEP = """
accumulate(batches[2])
optimizer.step()
digest = hashlib.sha256()
for p in model.parameters():
    digest.update(p.detach().numpy().tobytes())
result = [digest.hexdigest(), leaf.grad.tolist()]
"""


def test_gradients_come_back_and_accumulation_continues(start_kernel: KernelFactory) -> None:
    # Given gradients accumulated over two micro-batches of a model and of a leaf tensor
    first = start_kernel()
    first.ok(GRADIENT_SETUP)
    checkpoint(first)
    first.ok(FINISH_STEP)
    expected = first.value("result")

    # When a new kernel restores and accumulates the third micro-batch, then steps
    second = start_kernel()
    assert restore(second)["failed"] == {}
    grads = second.value("[p.grad is not None for p in model.parameters()]")
    second.ok(FINISH_STEP)
    got = second.value("result")

    # Then every gradient was there and the weights after the step are bit-identical
    assert grads == [True, True, True, True]
    assert got == expected
    assert expected[1] == [6.0, 6.0, 6.0, 6.0]


def test_views_across_libraries_keep_sharing_memory(start_kernel: KernelFactory) -> None:
    # Given torch tensors viewing part of numpy arrays, one pair only partly overlapping
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import numpy as np, torch
arr = np.arange(10.0)
tail = torch.from_numpy(arr[1:])
back = tail.numpy()[2:5]
hidden = np.arange(10.0)
left = torch.from_numpy(hidden[0:6])
right = torch.from_numpy(hidden[4:10])
del hidden
zeros_a = np.zeros(4)
zeros_b = np.zeros(4)     # same bytes as zeros_a: one buffer on disk, two arrays in memory
view_b = zeros_b[1:]
"""
    )
    checkpoint(first)

    # When restored in a new kernel and written through one view
    second = start_kernel()
    assert restore(second)["failed"] == {}
    second.ok("tail[0] = 100\nback[0] = 300\nleft[5] = -1\nview_b[0] = 1")

    # Then the others see the write, at the right offsets
    assert second.value(
        "[arr[1].item(), arr[3].item(), tail[2].item(), right[1].item(), right[0].item(),"
        " arr.tolist()[5:], zeros_b[1].item(), zeros_a[1].item()]"
    ) == [100.0, 300.0, 300.0, -1.0, 4.0, [5.0, 6.0, 7.0, 8.0, 9.0], 1.0, 0.0]


def test_imports_come_back_in_order_and_a_gone_module_is_named(
    start_kernel: KernelFactory, tmp_path: Path
) -> None:
    # Given aliases, from-imports and the notebook's own modules on an added sys.path entry
    src = tmp_path / "project" / "src"
    src.mkdir(parents=True)
    (src / "helpers.py").write_text("VALUE = 42\ndef twice(x):\n    return 2 * x\n")
    (src / "scratch.py").write_text("GONE = True\n")
    first = start_kernel()
    first.ok(
        f"""
%load_ext jupyter_pause
import sys
sys.path.insert(0, {str(src)!r})
import numpy as np
import torch.nn.functional as F
from collections import OrderedDict as OD
from math import sqrt
import helpers
from helpers import twice
import scratch
"""
    )
    saved = checkpoint(first)
    assert {"np", "F", "OD", "sqrt", "helpers", "twice"}.isdisjoint(saved["saved"])
    (src / "scratch.py").unlink()

    # When a new kernel restores
    second = start_kernel()
    result = restore(second)

    # Then each name is imported again, in the order first imported, and the gone one named
    imports = result["session"]["done"]["imports"]
    assert imports.index("np") < imports.index("F") and imports.index("helpers") < imports.index(
        "twice"
    )
    assert "import scratch" in result["session"]["failed"]
    assert "No module named 'scratch'" in result["session"]["failed"]["import scratch"]
    assert second.value(
        "[float(np.sqrt(4)), float(F.relu(F.torch.tensor(-1.0))), list(OD(a=1)), sqrt(9),"
        " helpers.VALUE, twice(4), 'scratch' in globals()]"
    ) == [2.0, 0.0, ["a"], 3.0, 42, 8, False]
    summary = second.ok("%checkpoint restore")
    assert "imports: sys, " in summary and "session not restored: import scratch (" in summary


def test_numpy_random_stream_continues_from_its_first_use(start_kernel: KernelFactory) -> None:
    # Given a notebook that drew from numpy's global generator
    first = start_kernel()
    first.ok(
        "%load_ext jupyter_pause\nimport numpy as np\nnp.random.seed(3)\n_ = np.random.rand(5)"
    )
    checkpoint(first)
    expected = first.value("list(np.random.rand(4))")

    # When a new kernel restores it
    second = start_kernel()
    result = restore(second)

    # Then the restore did not import numpy.random (numpy 2 imports it at first use), and its
    # first use continues the stream
    imported = "'numpy.random' in __import__('sys').modules"
    assert "numpy" in result["rng"]
    assert second.value(imported) is False
    assert second.value("list(np.random.rand(4))") == expected

    # And a checkpoint of a notebook that never used numpy.random does not import it either
    never = start_kernel()
    never.ok("%load_ext jupyter_pause\nimport numpy as np\nx = np.arange(3)")
    checkpoint(never)
    assert never.value(imported) is False


SAVING_SIDE = {
    "cloudpickle",
    "jupyter_pause.kernel.datafile",
    "jupyter_pause.kernel.describing",
    "jupyter_pause.kernel.snapshot",
    "jupyter_pause.kernel.writer",
}


def test_a_restore_loads_only_what_restoring_needs(start_kernel: KernelFactory) -> None:
    # Given a checkpointed notebook with a model and plain values
    first = start_kernel()
    first.ok(
        "%load_ext jupyter_pause\nimport torch\n"
        "model = torch.nn.Linear(4, 2)\nrows = [{'i': i} for i in range(3)]"
    )
    checkpoint(first)

    # When a new kernel restores it
    second = start_kernel()
    result = restore(second)
    assert sorted(result["restored"]) == ["model", "rows"]

    # Then the saving side (pickling, describing tensors, writing files) stayed unloaded: a
    # restore's memory holds no code for saving
    loaded = f"sorted(set(__import__('sys').modules) & set({sorted(SAVING_SIDE)!r}))"
    assert second.value(loaded) == []

    # And the next checkpoint loads it and saves the notebook as it is now
    second.ok("rows.append({'i': 3})")
    checkpoint(second)
    assert second.value(loaded) == sorted(SAVING_SIDE)
    third = start_kernel()
    restore(third)
    assert third.value("[r['i'] for r in rows]") == [0, 1, 2, 3]
    assert third.value("model.weight.shape[1]") == 4


def test_working_directory_path_and_environment_come_back(
    start_kernel: KernelFactory, tmp_path: Path
) -> None:
    # Given a kernel launched with some variables, whose notebook changes its surroundings
    notebook = str(tmp_path / "work" / "train.ipynb")
    first = start_kernel(
        FROM_LAUNCH="1",
        KEPT_LAUNCH="a",
        JPY_SESSION_NAME="first.ipynb",
        JUPYTER_PAUSE_NOTEBOOK=notebook,
    )
    first.ok(
        """
%load_ext jupyter_pause
import os, sys
os.makedirs("data/run1", exist_ok=True)
os.chdir("data/run1")
sys.path.insert(0, "/opt/notebook-libs")
os.environ["EXPERIMENT"] = "resnet"
os.environ["KEPT_LAUNCH"] = "b"
del os.environ["FROM_LAUNCH"]
"""
    )
    checkpoint(first)

    # When a kernel launched the same way (but for another session) restores
    second = start_kernel(
        FROM_LAUNCH="1",
        KEPT_LAUNCH="a",
        JPY_SESSION_NAME="second.ipynb",
        JUPYTER_PAUSE_NOTEBOOK=notebook,
    )
    result = restore(second)

    # Then the notebook's changes are back and the launch variables of this kernel stay its own
    assert result["session"]["failed"] == {}
    assert second.value(
        "[os.getcwd(), sys.path[0], os.environ.get('EXPERIMENT'), os.environ.get('KEPT_LAUNCH'),"
        " 'FROM_LAUNCH' in os.environ, os.environ['JPY_SESSION_NAME']]"
    ) == [
        str(tmp_path / "work" / "data" / "run1"),
        "/opt/notebook-libs",
        "resnet",
        "b",
        False,
        "second.ipynb",
    ]


def test_library_and_ipython_settings_come_back(start_kernel: KernelFactory) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    # Given a notebook that changed settings that alter results or output
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import warnings
import numpy as np, pandas as pd, torch, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
torch.set_default_dtype(torch.float64)
torch.use_deterministic_algorithms(True, warn_only=True)
torch.set_float32_matmul_precision("medium")
torch.backends.cudnn.benchmark = True
np.set_printoptions(precision=3)
np.seterr(divide="raise")
pd.set_option("display.max_rows", 7)
warnings.filterwarnings("error", message="boom", category=UserWarning)
plt.rcParams["lines.linewidth"] = 7.0
%config ZMQInteractiveShell.ast_node_interactivity = "all"
%load_ext autoreload
%autoreload 2
from IPython.core.magic import register_cell_magic
@register_cell_magic
def shout(line, cell):
    print(cell.upper().strip() + line)
"""
    )
    checkpoint(first)
    first.ok("torch.set_grad_enabled(False)")
    assert checkpoint(first)["session"]["failed"] == {}

    # When a new kernel restores
    second = start_kernel()
    result = restore(second)
    assert result["session"]["failed"] == {}

    # Then each setting is as the notebook left it
    assert second.value(
        "[str(torch.get_default_dtype()), torch.is_grad_enabled(),"
        " torch.are_deterministic_algorithms_enabled(),"
        " torch.is_deterministic_algorithms_warn_only_enabled(),"
        " torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark,"
        " np.get_printoptions()['precision'], np.geterr()['divide'],"
        " pd.get_option('display.max_rows'), matplotlib.get_backend().lower(),"
        " plt.rcParams['lines.linewidth'],"
        " get_ipython().ast_node_interactivity,"
        " any(n.endswith('autoreload') for n in get_ipython().extension_manager.loaded),"
        " get_ipython().magics_manager.registry['AutoreloadMagics']._reloader.check_all]"
    ) == [
        "torch.float64",
        False,
        True,
        True,
        "medium",
        True,
        3,
        "raise",
        7,
        "agg",
        7.0,
        "all",
        True,
        True,
    ]
    assert second.run("warnings.warn('boom now')").error == "UserWarning: boom now"
    assert second.ok("%%shout !\nprint('hello')") == "PRINT('HELLO')!\n"
    assert "matplotlib" in result["session"]["done"]["settings"]
    assert "%%shout" in result["session"]["done"]["settings"]


def test_open_files_and_databases_are_reopened(start_kernel: KernelFactory, tmp_path: Path) -> None:
    # Given files open for writing, reading, appending and in binary, and a sqlite database
    work = tmp_path / "work"
    (work / "input.txt").write_text("line one\nline two\nline three\n")
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import sqlite3
log = open("log.txt", "w")
log.write("epoch 1\\n")
reader = open("input.txt")
reader.readline()
journal = open("journal.txt", "a")
journal.write("a")
blob = open("blob.bin", "wb")
blob.write(b"\\x00\\x01")
with open("done.txt", "w") as finished:
    finished.write("x")
doomed = open("doomed.txt", "w")
db = sqlite3.connect("runs.db")
db.execute("create table runs (loss real)")
db.execute("insert into runs values (0.5)")
db.commit()
"""
    )
    checkpoint(first)
    first.close()
    (work / "doomed.txt").unlink()

    # When a new kernel restores and keeps using them
    second = start_kernel()
    result = restore(second)
    second.ok(
        'log.write("epoch 2\\n"); log.flush()\n'
        'journal.write("b"); journal.flush()\n'
        'blob.write(b"\\x02"); blob.flush()\n'
        "db.execute('insert into runs values (0.25)'); db.commit()"
    )

    # Then nothing written before the pause is lost and each continues where it was
    assert (work / "log.txt").read_text() == "epoch 1\nepoch 2\n"
    assert (work / "journal.txt").read_text() == "ab"
    assert (work / "blob.bin").read_bytes() == b"\x00\x01\x02"
    assert second.value(
        "[log.mode, reader.readline(), finished.closed, blob.mode,"
        " [row[0] for row in db.execute('select loss from runs')]]"
    ) == ["r+", "line two\n", True, "rb+", [0.5, 0.25]]
    assert "doomed.txt" in result["failed"]["doomed"]
    assert "no longer exists" in result["failed"]["doomed"]


def test_values_that_cannot_load_back_are_found_at_checkpoint_time(
    start_kernel: KernelFactory,
) -> None:
    # Given an object whose pickle round trip recurses on load (a __getattr__ that forwards)
    kernel = start_kernel()
    kernel.ok(
        """
%load_ext jupyter_pause
class Simulator:
    def __init__(self):
        self.inner = {"steps": 3}
    def __getattr__(self, name):
        return getattr(self.inner, name)
    def steps(self):
        return self.inner["steps"]
sim = Simulator()
keep = [1, 2, 3]
method_before = Simulator.steps
"""
    )

    # When a checkpoint is taken
    result = checkpoint(kernel)

    # Then that value is skipped now, with why; the rest is saved; the live class is untouched
    assert "loading it back recurses" in result["skipped"]["sim"]
    assert "keep" in result["saved"]
    assert kernel.value("[Simulator.steps is method_before, sim.steps()]") == [True, 3]


def test_summaries_list_every_group(start_kernel: KernelFactory) -> None:
    first = start_kernel()
    out = first.ok(
        "%load_ext jupyter_pause\nimport os, numpy as np\nos.environ['RUN'] = '1'\nx = np.ones(3)"
        "\n%checkpoint"
    )
    assert "1 variable saved" in out
    assert "with the session: working directory, sys.path, environment variables" in out
    assert "2 imports" in out and "numpy" in out
    second = start_kernel()
    out = second.ok("%load_ext jupyter_pause\n%checkpoint restore")
    assert "Restored checkpoint 1: 1 variable (x)" in out
    assert "environment: working directory" in out and "environment variables (RUN)" in out
    assert "imports: os, np" in out and "settings: " in out
    assert os.environ.get("RUN") is None  # the test process itself is untouched


def test_a_tensor_computed_with_autograd_comes_back_detached_and_named(
    start_kernel: KernelFactory,
) -> None:
    # Given an output and a loss computed from a layer (their graph reaches the layer's weights)
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import torch
layer = torch.nn.Linear(2, 1)
output = layer(torch.tensor([[1.0, 2.0]]))
loss = (output - 1).pow(2).sum()
leaf = torch.ones(2, requires_grad=True)
"""
    )
    saved = first.ok("%checkpoint")
    assert "autograd graph not saved: " in saved and "loss (computed by SumBackward0" in saved

    # When a new kernel restores
    second = start_kernel()
    out = second.ok("%load_ext jupyter_pause\n%checkpoint restore")

    # Then their values are back, detached, and the summary says so and what to do
    assert "autograd graph not restored: " in out
    assert "output (computed by AddmmBackward0; detached, so output.backward()" in out
    assert second.value(
        "[output.requires_grad, loss.requires_grad, leaf.requires_grad, "
        "round(loss.item(), 6) == round(float((output - 1).pow(2).sum()), 6)]"
    ) == [False, False, True, True]
    # a backward() through them fails loudly instead of silently missing the layer's weights
    failed = second.run("loss.backward()")
    assert failed.error is not None and "does not require grad" in failed.error
    result = restore(start_kernel())
    assert set(result["detached"]) == {"output", "loss"} and result["failed"] == {}
