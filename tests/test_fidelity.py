"""The fidelity benchmark's CI subset: a notebook resumed in a new kernel computes what it would
have computed uninterrupted (bench/fidelity.py runs the whole corpus; this runs a few splits
through the same harness)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from bench.notebook_fidelity import digest
from bench.notebook_fidelity.corpus import corpus, load
from bench.notebook_fidelity.evaluate import EXCUSED, FAIL, PASS, evaluate_notebook
from bench.notebook_fidelity.kernel import REPOSITORY
from bench.notebook_fidelity.methods import JUPYTER_PAUSE, Method, names_reported_lost

pytest.importorskip("torch")

# (notebook, split points): each split pauses where a session is most likely to lose something.
SUBSET = [
    # Between the 2nd and 3rd of 4 backward() calls: the gradients are the state.
    ("own_grad_accumulation", [3]),
    # Functions, a lambda, a method and a closure that read and update globals after restore.
    ("own_globals", [4]),
    # After os.chdir, a local package on sys.path, os.environ changes and a half-read file.
    ("own_environment", [4]),
    # After aliased imports and from-imports, before more of them in later cells.
    ("own_imports", [5]),
]


def _explain(outcome) -> str:
    difference = outcome.first_difference
    where = (
        f"cell {difference.cell} `{difference.source}`: expected {difference.expected!r}, "
        f"got {difference.got!r}"
        if difference
        else "every output matched"
    )
    return (
        f"split {outcome.split} {outcome.verdict}: {where}; variables {outcome.variables}; "
        f"restore said: {outcome.restore_output!r}"
    )


@pytest.mark.parametrize(("name", "splits"), SUBSET, ids=[name for name, _ in SUBSET])
def test_resumed_notebook_computes_the_same(name: str, splits: list[int], tmp_path: Path) -> None:
    [notebook] = corpus([name])
    result = evaluate_notebook(notebook, tmp_path, splits, [JUPYTER_PAUSE], cell_timeout=120)
    assert [o.split for o in result.outcomes] == splits
    for outcome in result.outcomes:
        assert outcome.verdict in (PASS, EXCUSED), _explain(outcome)


def test_a_value_that_cannot_cross_is_named_and_excused(tmp_path: Path) -> None:
    """Kishu's generator test: the split after `gen = (...)` fails, but the restore says why."""
    [notebook] = corpus(["kishu_test_unserializable_var"])
    [outcome] = evaluate_notebook(notebook, tmp_path, [1], [JUPYTER_PAUSE], 60).outcomes
    assert outcome.verdict == EXCUSED, _explain(outcome)
    assert "gen" in outcome.reported_lost
    assert outcome.first_difference is not None
    assert outcome.first_difference.error == "NameError: name 'gen' is not defined"


def _write_notebook(path: Path, cells: list[str]) -> Path:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(notebook, path)
    return path


def test_a_restore_that_loses_the_session_fails(tmp_path: Path) -> None:
    """The harness itself: carrying nothing across must fail, naming the first cell that differs."""
    path = _write_notebook(
        tmp_path / "counting.ipynb", ["total = 40", "total += 2\nprint(total)", "done = True"]
    )
    nothing = Method(name="nothing", save="pass", restore="pass", reports_losses=False)
    [outcome] = evaluate_notebook(load(path), tmp_path / "work", [1], [nothing], 60).outcomes
    assert outcome.verdict == FAIL
    assert outcome.first_difference is not None
    assert outcome.first_difference.cell == 1
    assert outcome.first_difference.expected == "error: (none)"
    assert outcome.first_difference.got == "error: NameError: name 'total' is not defined"
    assert outcome.variables == {"total": "missing"}


def test_outputs_that_differ_between_uninterrupted_runs_are_not_compared(tmp_path: Path) -> None:
    path = _write_notebook(
        tmp_path / "clock.ipynb",
        ["stamp = __import__('time').time_ns()\nprint(stamp)", "print('same')", "value = 2"],
    )
    nothing = Method(name="nothing", save="pass", restore="pass", reports_losses=False)
    result = evaluate_notebook(load(path), tmp_path / "work", [2], [nothing], 60)
    assert result.unstable_cells == [0]
    assert result.unstable_variables == ["stamp"]
    [outcome] = result.outcomes
    # Only `value` is compared: `stamp` differed between the two uninterrupted runs.
    assert outcome.verdict == PASS, _explain(outcome)


# -- fingerprints, in this process -----------------------------------------------------------------
def _digests(namespace: dict) -> dict[str, str]:
    return digest.namespace_digests(namespace, hidden={})


def test_fingerprint_covers_gradients() -> None:
    import torch

    weight = torch.ones(2, requires_grad=True)
    before = _digests({"weight": weight})["weight"]
    (weight * 3).sum().backward()
    assert _digests({"weight": weight})["weight"] != before
    copy = weight.detach().clone().requires_grad_(True)
    assert _digests({"weight": copy})["weight"] == before  # same values, no .grad


def test_fingerprint_tells_a_function_on_copied_globals_from_a_live_one() -> None:
    namespace: dict = {"__name__": "__main__"}  # what a notebook's functions see
    exec("threshold = 1\ndef read():\n    return threshold\n", namespace)
    live = _digests(namespace)["read"]
    read = namespace["read"]
    copied = type(read)(read.__code__, dict(namespace), read.__name__)
    namespace["read"] = copied
    assert _digests(namespace)["read"] != live


def test_fingerprint_covers_sharing_between_variables() -> None:
    import numpy as np
    import torch

    model = torch.nn.Linear(2, 1)
    shared = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    copied = {
        "model": model,
        "optimizer": torch.optim.SGD(
            [p.detach().clone().requires_grad_(True) for p in model.parameters()], lr=0.1
        ),
    }
    assert _digests(shared)["optimizer"] != _digests(copied)["optimizer"]
    array = np.arange(6.0)
    views = _digests({"array": array, "tail": torch.from_numpy(array[1:])})
    copies = _digests({"array": array, "tail": torch.from_numpy(array[1:].copy())})
    assert views[digest.SHARED_MEMORY] == "[['array', 'tail']]"
    assert copies[digest.SHARED_MEMORY] == "[]"


def test_fingerprint_of_jax_arrays_and_keys_is_their_content() -> None:
    jax = pytest.importorskip("jax")

    key = jax.random.key(0)
    before = _digests({"key": key})["key"]
    # JAX's own bookkeeping of a key passed on (key reuse checks) is no state of the notebook
    key._consumed = True
    assert _digests({"key": key})["key"] == before
    assert _digests({"key": jax.random.key(1)})["key"] != before
    weights = jax.numpy.arange(4.0)
    assert _digests({"w": weights})["w"] == _digests({"w": jax.numpy.arange(4.0)})["w"]
    assert _digests({"w": weights})["w"] != _digests({"w": weights.at[0].set(9.0)})["w"]
    # A tracer leaked from a jitted function (JAX's "impure function" gotcha) has no value
    leaked = []
    jax.jit(lambda x: leaked.append(x) or x)(1.0)
    assert _digests({"leaked": leaked[0]})["leaked"].startswith("DynamicJaxprTracer:")


_BUILD_NAMESPACE = """
import json, sys
import jax, jax.numpy as jnp, numpy as np, pandas as pd
sys.path.insert(0, sys.argv[1])
from bench.notebook_fidelity.digest import namespace_digests

class Point:
    def __init__(self, x):
        self.x = x
        self.neighbours = []

def scaled(v, factor=2):
    return v * factor * len(points)

points = [Point(1), Point(2)]
points[0].neighbours.append(points[1])
namespace = {
    "numbers": [1, 2.5, {"a": (3, "x")}, None], "flags": {"b", "a", "c"},
    "array": np.arange(6).reshape(2, 3), "frame": pd.DataFrame({"k": ["u", "v"], "n": [1, 2]}),
    "points": points, "scaled": scaled, "sizes": {p: p.x for p in points},
    "key": jax.random.key(0), "old_key": jax.random.PRNGKey(1), "weights": jnp.arange(4.0),
}
print(json.dumps(namespace_digests(namespace, {})))
"""


def test_fingerprints_do_not_depend_on_the_process() -> None:
    """Two processes fingerprint the same values alike: content is hashed, never an address."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", _BUILD_NAMESPACE, str(REPOSITORY)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2)
    ]
    first, second = (json.loads(run) for run in runs)
    assert first == second
    assert not [name for name, value in first.items() if value.startswith("?")]


def test_restore_summary_losses_are_read_by_name() -> None:
    summary = (
        "Restored checkpoint 3: 2 variables (x, f), 1.0 KB, 0.01 s; not restored: model "
        "(RuntimeError: boom); not in the checkpoint: gen (generator/coroutine: its paused "
        "frame cannot be saved; create it again after restore); log (open file 'a.txt': ...)"
        "\nimports: np (numpy), F (torch.nn.functional)\nWarning: 1 tensor moved to the CPU"
    )
    assert names_reported_lost(summary) == {"model", "gen", "log"}
    assert names_reported_lost("Restored checkpoint 1: 1 variables (x), 1 KB, 0.01 s") == set()
