"""A checkpoint killed at any point of its writing leaves a store that restores, and saves again.

Each case first saves an "old" state, then saves a "new" one in a process that SIGKILLs itself
at the Nth file-system step of the checkpoint (a data write, which it tears in half first, an
fsync, a syncfs, a rename), for every N the writer takes. After each kill, the newest checkpoint
must restore to exactly the old or exactly the new state (never a mix, never a failure); then
the same new state is saved again and must restore bit for bit. This holds for small buffers
(the checkpoint's pack) and for buffers of 64 MiB and more (files of their own), before and
after the manifest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jupyter_pause.kernel.api import Checkpointer

# Runs in a child process: build the state of one stage, and checkpoint it, optionally dying at
# step ``kill_at`` (counted over the calls below). Prints the steps it took, one JSON list.
CHILD = r"""
import json, os, signal, sys
import numpy as np
from jupyter_pause.kernel import files as files_mod
from jupyter_pause.kernel.api import Checkpointer
from tests.test_crash_points import stage_values

store_root, key, stage, kill_at, large = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
values = stage_values(stage, large)

steps = []

def die():
    sys.stdout.write(json.dumps(steps) + "\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

def counted(kind, real, tear=False):
    def step(*args, **kwargs):
        # a rename is named by the folder it lands in: manifests/ is the commit point
        steps.append(f"{kind}:{os.path.basename(os.path.dirname(args[1]))}" if kind in ("replace", "rename") else kind)
        if len(steps) - 1 == kill_at:
            if tear:  # half the bytes reach the file, then the process dies
                try:
                    data = memoryview(args[1]).cast("B")
                    half = (data.nbytes // 2) & ~4095
                    if half:
                        real(args[0], data[:half], *args[2:])
                except OSError:
                    pass
            die()
        return real(*args, **kwargs)
    return step

os.write = counted("write", os.write, tear=True)
os.pwrite = counted("pwrite", os.pwrite, tear=True)
if hasattr(os, "pwritev"):
    os.pwritev = counted("pwritev", os.pwritev)
os.fsync = counted("fsync", os.fsync)
os.fdatasync = counted("fdatasync", os.fdatasync)
os.replace = counted("replace", os.replace)
os.rename = counted("rename", os.rename)
files_mod.syncfs_of = counted("syncfs", files_mod.syncfs_of)

Checkpointer(values, key=key, store_root=store_root).checkpoint(full=True)
sys.stdout.write(json.dumps(steps) + "\n")
"""


ROOT = Path(__file__).resolve().parents[1]
VIEW_OFFSET = {False: 7, True: 4096}  # where ``view`` starts in its base


def stage_values(stage: int, large: bool) -> dict:
    """The notebook state of one stage (the child saves it, the parent checks against it)."""
    values = {
        "counter": stage,
        "text": f"stage {stage} " * 50,
        "table": {"rows": list(range(stage, stage + 100))},
        "small": np.full(3000, stage, dtype=np.int64),
    }
    if large:
        values["big"] = np.full((64 << 20) // 8 + 4096, float(stage))
    # shares its base's buffer, at an offset
    values["view"] = values["big" if large else "small"][VIEW_OFFSET[large] :]
    return values


def save(root: Path, stage: int, large: bool, kill_at: int = -1) -> list[str]:
    """Checkpoint ``stage`` in a child process; the steps it took (up to its death)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(root),
            str(root / "nb.ipynb"),
            str(stage),
            str(kill_at),
            "1" if large else "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,  # the child imports ``tests``
    )
    if kill_at < 0:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == -9, f"the child did not die at step {kill_at}: {done.stderr}"
    return json.loads(done.stdout.splitlines()[-1])


def restored_stage(root: Path, large: bool) -> int:
    """Restore the newest checkpoint in this process; which stage came back, entire."""
    namespace: dict = {}
    result = Checkpointer(namespace, key=str(root / "nb.ipynb"), store_root=str(root)).restore()
    assert result.complete, result.summary()
    stage = namespace["counter"]
    want = stage_values(stage, large)
    assert set(namespace) == set(want)
    for name, value in want.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(namespace[name], value, err_msg=name)
        else:
            assert namespace[name] == value, name
    # the view comes back as a view of its base, at its offset
    base = namespace["big" if large else "small"]
    assert np.shares_memory(namespace["view"], base)
    assert namespace["view"].__array_interface__["data"][0] == (
        base.__array_interface__["data"][0] + VIEW_OFFSET[large] * base.itemsize
    )
    return stage


@pytest.mark.parametrize("large", [False, True], ids=["small buffers", "64 MiB buffer"])
def test_a_checkpoint_killed_at_any_step_leaves_a_restorable_store(
    tmp_path: Path, large: bool
) -> None:
    # Given a store holding the old state, and the steps a checkpoint of the new state takes
    probe = tmp_path / "probe"
    save(probe, 1, large)
    steps = save(probe, 2, large)
    assert any(s in steps for s in ("write", "pwrite", "pwritev"))
    assert steps.count("replace:manifests") == 1, steps
    manifest_step = steps.index("replace:manifests")

    for kill_at in range(len(steps)):
        root = tmp_path / f"kill-{kill_at}"
        save(root, 1, large)
        # When the new checkpoint dies at this step
        taken = save(root, 2, large, kill_at)
        assert taken == steps[: kill_at + 1], "the checkpoint did not take the same steps"
        # Then the newest checkpoint is the old state or the new one, whole
        stage = restored_stage(root, large)
        # (the manifest's rename is the commit point: killed before it, the old state)
        assert stage == (2 if kill_at > manifest_step else 1), (kill_at, steps)
        # And the same new state saves again and restores bit for bit
        save(root, 2, large)
        assert restored_stage(root, large) == 2
        listing = Checkpointer({}, key=str(root / "nb.ipynb"), store_root=str(root))
        assert [c.checkpoint_id for c in listing.list_checkpoints()][-1] >= 2
