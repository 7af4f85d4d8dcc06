"""What unseen tutorial notebooks showed a restore got wrong (issue 28), each in a real kernel.

A notebook's folder moved or copied, settings whose value is ``None``, ufuncs that have no
``__module__`` once ``multiprocessing`` is imported, structured arrays with sub-array fields,
ndarray subclass views, tensors that come back detached from their autograd graph; then what
the widened fidelity corpus found: a figure showing a view of a held array, objects held by two
variables (the Axes array of ``plt.subplots(1, 2)``), float constants imported from a module.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .kernels import Kernel, KernelFactory, checkpoint, restore

CHECKPOINTER = "__import__('jupyter_pause.kernel.api').kernel.api.installed()"


def _restore_from(kernel: Kernel, key: str) -> dict:
    """Restore the checkpoints of notebook ``key`` (as the server does when it names it)."""
    kernel.ok(f"%load_ext jupyter_pause\n{CHECKPOINTER}.set_key({key!r})")
    return restore(kernel)


def test_working_directory_follows_a_copied_notebook_folder(
    start_kernel: KernelFactory, tmp_path: Path
) -> None:
    # Given a notebook in project/ that works in its data/ subfolder
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "params.txt").write_text("old")
    first = start_kernel(cwd=project)
    first.ok("%load_ext jupyter_pause\nimport os\nos.chdir('data')")
    key = first.value(f"{CHECKPOINTER}.key")
    checkpoint(first)

    # When the project is copied, the copy's params.txt edited, and a kernel started there
    copy = tmp_path / "project-copy"
    shutil.copytree(project, copy)
    (copy / "params.txt").write_text("new")
    second = start_kernel(cwd=copy)
    result = _restore_from(second, key)

    # Then the kernel works in the copy's data/, and reads the copy's files
    assert result["session"]["failed"] == {}
    assert second.value("[os.getcwd(), open('../params.txt').read()]") == [
        str(copy / "data"),
        "new",
    ]


def test_working_directory_outside_the_notebook_folder_stays_absolute_and_a_gone_one_is_said(
    start_kernel: KernelFactory, tmp_path: Path
) -> None:
    # Given a notebook in project/ that changed into a folder outside it
    project, outside = tmp_path / "project", tmp_path / "data" / "run3"
    (project / "scratch").mkdir(parents=True)
    outside.mkdir(parents=True)
    first = start_kernel(cwd=project)
    first.ok(f"%load_ext jupyter_pause\nimport os\nos.chdir({str(outside)!r})")
    key = first.value(f"{CHECKPOINTER}.key")
    checkpoint(first)

    # When a kernel started in a copy of project/ restores: the outside folder is kept
    copy = tmp_path / "project-copy"
    shutil.copytree(project, copy)
    second = start_kernel(cwd=copy)
    assert _restore_from(second, key)["session"]["failed"] == {}
    assert second.value("os.getcwd()") == str(outside)

    # And a subfolder of the notebook's folder that the copy lacks is named in the summary
    first.ok(f"os.chdir({str(project / 'scratch')!r})")
    checkpoint(first)
    shutil.rmtree(copy / "scratch")
    third = start_kernel(cwd=copy)
    third.ok(f"%load_ext jupyter_pause\n{CHECKPOINTER}.set_key({key!r})")
    out = third.ok("%checkpoint restore")
    assert "session not restored: working directory (" in out and "scratch" in out
    assert third.value("__import__('os').getcwd()") == str(copy)


def test_settings_whose_value_is_none_come_back(start_kernel: KernelFactory) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    # Given a pandas option and a matplotlib rcParam set to None (the classic style's legend)
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import matplotlib
matplotlib.use("Agg")
import pandas as pd, matplotlib.pyplot as plt
pd.set_option("display.max_rows", None)
plt.rcParams["legend.framealpha"] = None
"""
    )
    checkpoint(first)

    # When a new kernel restores
    second = start_kernel()
    result = restore(second)

    # Then both are None again, not the defaults
    assert result["session"]["failed"] == {}
    assert second.value(
        "[pd.get_option('display.max_rows'), plt.rcParams['legend.framealpha']]"
    ) == [None, None]


def test_scipy_ufuncs_after_multiprocessing_come_back_as_imports(
    start_kernel: KernelFactory,
) -> None:
    pytest.importorskip("scipy")
    # Given ufuncs imported from scipy.special after multiprocessing (torch, sklearn import it)
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import multiprocessing
import numpy as np
from scipy.special import expit, erf, gammaln
activations = {"sigmoid": expit}
"""
    )
    assert first.value("[getattr(expit, '__module__', None), type(expit).__name__]") == [
        None,
        "ufunc",
    ]
    saved = checkpoint(first)
    assert saved["skipped"] == {}

    # When a new kernel restores
    second = start_kernel()
    result = restore(second)

    # Then they are imports again, the very objects of scipy.special, also inside a container
    assert result["failed"] == {}
    assert {"expit", "erf", "gammaln"} <= set(result["session"]["done"]["imports"])
    assert second.value(
        "[expit is __import__('scipy.special').special.expit, activations['sigmoid'] is expit,"
        " float(expit(0.0)), float(erf(0.0)), float(gammaln(1.0))]"
    ) == [True, True, 0.5, 0.0, 0.0]


STRUCTURED = """
%load_ext jupyter_pause
import hashlib
import numpy as np
data = np.zeros(4, dtype=[("id", "i4"), ("pos", "f8", (3, 3)), ("tag", [("a", "u1"), ("b", "S3")])])
data["id"] = np.arange(4)
data["pos"] = np.arange(36.0).reshape(4, 3, 3)
data["tag"]["b"] = b"xyz"
digest = hashlib.sha256(data.tobytes()).hexdigest()
"""


def test_structured_array_with_a_sub_array_field_comes_back_bit_identical(
    start_kernel: KernelFactory,
) -> None:
    # Given a structured array whose fields hold a 3x3 sub-array and a nested structure
    first = start_kernel()
    first.ok(STRUCTURED)
    saved = checkpoint(first)
    assert "data" in saved["saved"], saved["skipped"]

    # When a new kernel restores
    second = start_kernel()
    assert restore(second)["failed"] == {}

    # Then its dtype and bytes are identical
    assert second.value(
        "[str(data.dtype) == {!r}, hashlib.sha256(data.tobytes()).hexdigest() == digest,"
        " data['pos'].shape]".format(first.value("str(data.dtype)"))
    ) == [True, True, [4, 3, 3]]


def test_ndarray_subclass_views_keep_sharing_memory(start_kernel: KernelFactory) -> None:
    # Given a recarray, a masked array and a matrix viewing plain arrays
    first = start_kernel()
    first.ok(
        STRUCTURED
        + """
records = data.view(np.recarray)
values = np.arange(6.0)
masked = np.ma.masked_array(values, mask=[0, 1, 0, 0, 1, 0], fill_value=-9.0)
grid = np.arange(4.0)
square = grid.reshape(2, 2).view(np.matrix)
"""
    )
    checkpoint(first)

    # When a new kernel restores and writes through the plain arrays
    second = start_kernel()
    assert restore(second)["failed"] == {}
    second.ok("data['id'][0] = 40\nvalues[0] = 100.0\ngrid[3] = 30.0")

    # Then each view sees the write and keeps its own type, mask and fill value
    assert second.value(
        "[type(records).__name__, int(records.id[0]), records.pos.shape,"
        " type(masked).__name__, float(masked[0]), masked.mask.tolist(),"
        " float(masked.fill_value), type(square).__name__, float(square[1, 1])]"
    ) == [
        "recarray",
        40,
        [4, 3, 3],
        "MaskedArray",
        100.0,
        [False, True, False, False, True, False],
        -9.0,
        "matrix",
        30.0,
    ]


def test_a_detached_tensor_is_named_with_the_backward_that_will_fail(
    start_kernel: KernelFactory,
) -> None:
    pytest.importorskip("torch")
    # Given a loss computed by a forward pass, checkpointed before its backward()
    first = start_kernel()
    first.ok(
        "%load_ext jupyter_pause\nimport torch\nlayer = torch.nn.Linear(2, 1)\n"
        "loss = layer(torch.ones(1, 2)).pow(2).sum()"
    )
    checkpoint(first)

    # When a new kernel restores
    second = start_kernel()
    out = second.ok("%load_ext jupyter_pause\n%checkpoint restore")

    # Then the summary names loss, the backward() that would fail and what to do
    assert "loss.backward() or any backward() through it raises" in out
    assert "does not require grad" in out
    assert "re-run the forward pass" in out
    assert "does not require grad" in second.run("loss.backward()").error


FIGURE_OF_HELD_ARRAYS = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
images = np.random.default_rng(0).random((4, 8, 8))
fig, ax = plt.subplots()
ax.imshow(images[0])
ax.set_title("first image")
"""


def test_a_figure_showing_a_view_of_a_held_array_is_saved_with_the_rest(
    start_kernel: KernelFactory,
) -> None:
    pytest.importorskip("matplotlib")
    # Given a figure that shows a view of an array the notebook holds, and its Axes
    first = start_kernel()
    first.ok(FIGURE_OF_HELD_ARRAYS)

    # When it is checkpointed: nothing is skipped, no variable aborts the others
    saved = checkpoint(first)
    assert {"images", "fig", "ax"} <= set(saved["saved"]), saved["skipped"]

    # Then a new kernel gets the figure back with its image, title and the Axes of that figure
    second = start_kernel()
    assert restore(second)["failed"] == {}
    assert second.value(
        "[ax.figure is fig, ax.get_title(), bool((ax.images[0].get_array() == images[0]).all()),"
        " images.shape]"
    ) == [True, "first image", True, [4, 8, 8]]


def test_the_axes_array_of_subplots_stays_the_figures_axes(start_kernel: KernelFactory) -> None:
    pytest.importorskip("matplotlib")
    # Given a figure with two Axes, held by the notebook both as `fig` and as the array `axes`
    first = start_kernel()
    first.ok(
        'import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt\n'
        "fig, axes = plt.subplots(1, 2)\naxes[0].plot([1, 2, 3])"
    )
    checkpoint(first)

    # When a new kernel restores and draws on the second Axes through the array
    second = start_kernel()
    assert restore(second)["failed"] == {}
    second.ok("axes[1].plot([3, 2, 1])")

    # Then the array holds the figure's own Axes, so the figure shows what was drawn
    assert second.value(
        "[axes[0] is fig.axes[0], axes[1] is fig.axes[1], [len(a.lines) for a in fig.axes]]"
    ) == [True, True, [1, 1]]


SHARED_PARTS = """
class Part:
    def __init__(self, size):
        self.size = size
class Whole:
    def __init__(self):
        self.first, self.second = Part(1), Part(2)
whole = Whole()
"""


def test_a_part_shared_by_two_variables_stays_one_object_also_when_only_one_changed(
    start_kernel: KernelFactory,
) -> None:
    # Given a checkpoint of `whole`, then a new variable holding two of its parts (not
    # variables themselves), found through gc so that the cell leaves `whole` clean: its
    # frame would be reused as it was
    first = start_kernel()
    first.ok("%load_ext jupyter_pause\n" + SHARED_PARTS)
    first.ok("%checkpoint")
    first.ok(
        "import gc\n"
        "parts = sorted((o for o in gc.get_objects() if type(o).__name__ == 'Part'),"
        " key=lambda part: part.size)"
    )
    first.ok("%checkpoint")

    # When a new kernel restores and changes a part through the list
    second = start_kernel()
    assert restore(second)["failed"] == {}
    second.ok("parts[0].size = 10")

    # Then `whole` sees it: the list holds its parts, not copies
    assert second.value(
        "[parts[0] is whole.first, whole.first.size, parts[1] is whole.second]"
    ) == [
        True,
        10,
        True,
    ]


def test_a_float_constant_imported_from_a_module_comes_back_as_that_constant(
    start_kernel: KernelFactory,
) -> None:
    # Given constants imported from numpy and math, and floats the notebook computed
    first = start_kernel()
    first.ok(
        "from numpy import nan, inf\nfrom math import pi\nimport numpy as np\n"
        "ratio = float('nan')\nscale = 2.5"
    )
    checkpoint(first)

    # When a new kernel restores
    second = start_kernel()
    assert restore(second)["failed"] == {}

    # Then the imported ones are the modules' own objects again, the computed ones values
    assert second.value(
        "[nan is np.nan, inf is np.inf, pi is __import__('math').pi, ratio != ratio, scale]"
    ) == [True, True, True, True, 2.5]
