"""Run a notebook uninterrupted twice, then split, carried across kernels and resumed.

A split at ``k`` runs cells[:k] in one kernel, saves the session with a method, shuts that
kernel down, restores into a new kernel started in the same folder with the same store, and
runs cells[k:]. It passes when every cell whose outputs were the same in both uninterrupted
runs shows them again, and every variable whose fingerprint was the same in both has it
again at the end. A failing split is excused when every difference traces back to a value the
restore reported as not coming back (excuse.py).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import digest
from .corpus import Notebook
from .excuse import excused
from .kernel import NotebookKernel, kernel_environment
from .methods import Method, names_reported_lost
from .outputs import UNSTABLE, CellOutput, describe_difference, same_output, stability

PASS, EXCUSED, FAIL = "pass", "excused", "fail"

_DIGEST_MARK = "@@fidelity-digests@@"


@dataclass
class Run:
    outputs: list[CellOutput]
    digests: dict[str, str]
    seconds: float


@dataclass
class Reference:
    """What an uninterrupted run shows, and which parts of it are reproducible."""

    outputs: list[CellOutput]
    stability: list[str]  # per code cell: strict, loose or unstable
    digests: dict[str, str]  # reproducible fingerprints ("?why": presence only)
    unstable_variables: list[str]
    seconds: float

    @classmethod
    def from_runs(cls, first: Run, second: Run) -> Reference:
        levels = [stability(a, b) for a, b in zip(first.outputs, second.outputs, strict=True)]
        stable, unstable = {}, []
        for name in sorted(set(first.digests) | set(second.digests)):
            a, b = first.digests.get(name), second.digests.get(name)
            if a is not None and b is not None and (a == b or (a[0] == "?" and b[0] == "?")):
                stable[name] = a
            else:
                unstable.append(name)
        seconds = max(first.seconds, second.seconds)
        return cls(first.outputs, levels, stable, unstable, seconds)

    @property
    def unstable_cells(self) -> list[int]:
        return [i for i, level in enumerate(self.stability) if level == UNSTABLE]


@dataclass
class Difference:
    cell: int
    source: str  # first line of the cell
    expected: str  # the first part of its outputs that differs: "stdout: ...", "error: ..."
    got: str
    error: str | None  # the error the resumed cell raised, if any


@dataclass
class SplitOutcome:
    split: int
    method: str
    verdict: str
    save_output: str
    save_error: str | None  # the save raised this (nothing was saved, or not all)
    restore_output: str
    restore_error: str | None
    reported_lost: list[str]
    first_difference: Difference | None
    differing_cells: list[int]
    variables: dict[str, str]  # name -> missing / differs / extra
    seconds: float


@dataclass
class NotebookResult:
    name: str
    origin: str
    cells: int
    splits: list[int]
    unstable_cells: list[int] = field(default_factory=list)
    unstable_variables: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)  # names bound to modules in the reference
    reference_seconds: float = 0.0
    outcomes: list[SplitOutcome] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_notebook(
    notebook: Notebook,
    workdir: Path,
    splits: list[int],
    methods: list[Method],
    cell_timeout: float = 600,
) -> NotebookResult:
    """One notebook's whole measurement (a top-level function, for worker processes)."""
    return NotebookBench(notebook, workdir, cell_timeout).evaluate(splits, methods)


class NotebookBench:
    """The runs of one notebook, in its own scratch folder under ``workdir``."""

    def __init__(self, notebook: Notebook, workdir: Path, cell_timeout: float = 600) -> None:
        self.notebook = notebook
        self.cell_timeout = cell_timeout
        self.root = workdir / notebook.name
        # Every run uses the same paths, so a printed path is the same in every run.
        self.cwd = self.root / "cwd"
        self.store = self.root / "store"
        self.logs = self.root / "logs"
        self.env = kernel_environment(
            {
                "JUPYTER_PAUSE_STORE": str(self.store),
                "JUPYTER_PAUSE_NOTEBOOK": str(self.cwd / notebook.path.name),
            }
        )
        self._kernels = 0

    def evaluate(self, splits: list[int], methods: list[Method]) -> NotebookResult:
        """Two uninterrupted runs, then every split with every method (in rotated order)."""
        reference = Reference.from_runs(self.run_through(), self.run_through())
        result = NotebookResult(
            name=self.notebook.name,
            origin=self.notebook.origin,
            cells=len(self.notebook.cells),
            splits=splits,
            unstable_cells=reference.unstable_cells,
            unstable_variables=reference.unstable_variables,
            modules=[n for n, d in reference.digests.items() if d.startswith("module:")],
            reference_seconds=reference.seconds,
        )
        for i, split in enumerate(splits):
            turn = i % len(methods)
            for method in methods[turn:] + methods[:turn]:
                result.outcomes.append(self.split(split, method, reference))
        return result

    # -- runs ------------------------------------------------------------------------------------
    def run_through(self) -> Run:
        """One uninterrupted run of every cell."""
        started = time.perf_counter()
        self._fresh_folders()
        kernel = self._start(seed=True)
        try:
            outputs = [self._cell(kernel, cell) for cell in self.notebook.cells]
            digests = self._digests(kernel)
        finally:
            kernel.close()
        return Run(outputs, digests, time.perf_counter() - started)

    def split(self, k: int, method: Method, reference: Reference) -> SplitOutcome:
        """Run to ``k``, carry the session across with ``method``, run the rest, compare."""
        started = time.perf_counter()
        saved, restored, resumed = self._run_split(k, method)
        restore_text = _transcript(restored)
        lost = names_reported_lost(restore_text) if method.reports_losses else set()
        differing = self._differing_cells(k, resumed.outputs, reference)
        variables = compare_variables(
            reference.digests, resumed.digests, reference.unstable_variables
        )
        if not differing and not variables:
            verdict = PASS
        elif excused(self.notebook.cells, k, differing, variables, lost):
            verdict = EXCUSED
        else:
            verdict = FAIL
        first = None
        if differing:
            first = self._difference(differing[0], resumed.outputs[differing[0] - k], reference)
        return SplitOutcome(
            split=k,
            method=method.name,
            verdict=verdict,
            save_output=_transcript(saved),
            save_error=saved.error,
            restore_output=restore_text,
            restore_error=restored.error,
            reported_lost=sorted(lost),
            first_difference=first,
            differing_cells=differing,
            variables=variables,
            seconds=time.perf_counter() - started,
        )

    def _run_split(self, k: int, method: Method) -> tuple[CellOutput, CellOutput, Run]:
        """(what the save showed, what the restore showed, the resumed cells and variables)."""
        started = time.perf_counter()
        self._fresh_folders()
        before = self._start(seed=True)
        try:
            for cell in self.notebook.cells[:k]:
                self._cell(before, cell)
            saved = before.run(method.save_code(self.store), self.cell_timeout, history=False)
        finally:
            before.close()
        after = self._start(seed=False)
        try:
            restored = after.run(method.restore_code(self.store), self.cell_timeout, history=False)
            outputs = [self._cell(after, cell) for cell in self.notebook.cells[k:]]
            digests = self._digests(after)
        finally:
            after.close()
        resumed = Run(outputs, digests, time.perf_counter() - started)
        return saved, restored, resumed

    # -- comparing -------------------------------------------------------------------------------
    @staticmethod
    def _differing_cells(k: int, outputs: list[CellOutput], reference: Reference) -> list[int]:
        """The resumed cells whose reproducible outputs did not come out as in the reference."""
        return [
            index
            for index, resumed in enumerate(outputs, start=k)
            if reference.stability[index] != UNSTABLE
            and not same_output(reference.outputs[index], resumed, reference.stability[index])
        ]

    def _difference(self, index: int, resumed: CellOutput, reference: Reference) -> Difference:
        source = self.notebook.cells[index].strip().splitlines() or [""]
        level = reference.stability[index]
        expected, got = describe_difference(reference.outputs[index], resumed, level)
        return Difference(index, source[0], expected, got, resumed.error)

    # -- plumbing --------------------------------------------------------------------------------
    def _fresh_folders(self) -> None:
        for folder in (self.cwd, self.store):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.notebook.path, self.cwd / self.notebook.path.name)

    def _start(self, *, seed: bool) -> NotebookKernel:
        self._kernels += 1
        kernel = NotebookKernel(self.cwd, self.env, self.logs / f"kernel-{self._kernels}.log")
        if seed:
            # Notebooks that never seed still compute the same in every run.
            kernel.run(_seed_code(self.notebook.uses_torch), 120, history=False)
        return kernel

    def _cell(self, kernel: NotebookKernel, source: str) -> CellOutput:
        if not kernel.alive:
            return CellOutput(error="KernelDied: the kernel process exited", status="dead")
        return kernel.run(source, self.cell_timeout)

    def _digests(self, kernel: NotebookKernel) -> dict[str, str]:
        if not kernel.alive:
            return {}
        output = kernel.run(_digest_code(), self.cell_timeout, history=False)
        for line in output.stdout.splitlines():
            if line.startswith(_DIGEST_MARK):
                return json.loads(line[len(_DIGEST_MARK) :])
        raise RuntimeError(f"fingerprinting the variables failed: {_transcript(output)}")


def compare_variables(
    reference: dict[str, str], resumed: dict[str, str], unstable: Iterable[str] = ()
) -> dict[str, str]:
    """name -> how it differs, for every reproducible variable that did not come back as it was.

    ``unstable``: the variables left out of ``reference`` because the two uninterrupted runs
    fingerprinted them differently; the resumed run having them is no difference.
    """
    problems = {}
    for name, expected in reference.items():
        got = resumed.get(name)
        if got is None:
            problems[name] = "missing"
        elif expected.startswith("?"):
            continue  # no fingerprint: being there is all that can be checked
        elif got != expected:
            kind = expected.split(":", 1)[0]
            now = got[1:] if got.startswith("?") else got.split(":", 1)[0]
            problems[name] = "differs" if now == kind else f"differs ({kind} -> {now})"
    for name in resumed.keys() - reference.keys() - set(unstable):
        problems[name] = "extra"
    return problems


def _transcript(output: CellOutput) -> str:
    parts = [output.stdout.strip(), output.stderr.strip(), output.error or ""]
    return "\n".join(part for part in parts if part)


def _seed_code(torch: bool) -> str:
    lines = ["import random", "random.seed(0)", "import numpy", "numpy.random.seed(0)"]
    if torch:
        lines += ["import torch", "torch.manual_seed(0)"]
    body = "".join(f"    {line}\n" for line in lines)
    return f"def _fidelity_seed():\n{body}_fidelity_seed()\ndel _fidelity_seed\n"


def _digest_code() -> str:
    return (
        "def _fidelity_digests():\n"
        "    import importlib.util, json\n"
        f"    spec = importlib.util.spec_from_file_location('_fidelity_digest', {digest.__file__!r})\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "    shell = get_ipython()\n"
        "    digests = module.namespace_digests(shell.user_ns, shell.user_ns_hidden)\n"
        f"    print({_DIGEST_MARK!r} + json.dumps(digests))\n"
        "_fidelity_digests()\n"
        "del _fidelity_digests\n"
    )
