"""The fidelity table, the failure list, and the conditions a run was measured under."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from collections import Counter
from importlib import metadata
from typing import Any

from .evaluate import EXCUSED, FAIL, PASS, NotebookResult, SplitOutcome
from .kernel import REPOSITORY
from .methods import Method

_PACKAGES = ("ipykernel", "dill", "numpy", "pandas", "torch", "scikit-learn", "matplotlib", "scipy")
_NAME_ERROR = re.compile(r"NameError: name '(\w+)' is not defined")


def verdict_counts(result: NotebookResult, method: str) -> Counter[str]:
    return Counter(o.verdict for o in result.outcomes if o.method == method)


def table(results: list[NotebookResult], methods: list[Method]) -> str:
    """Markdown: per notebook, how many splits each method passed, excused and failed."""
    header = ["notebook", "code cells", "unstable cells", "splits"]
    for method in methods:
        kinds = (PASS, EXCUSED, FAIL) if method.reports_losses else (PASS, FAIL)
        header += [f"{method.name} {kind}" for kind in kinds]
    rows = [header, ["---"] * len(header)]
    totals: Counter[str] = Counter()
    for result in results:
        row = [result.name, str(result.cells), str(len(result.unstable_cells))]
        row.append(str(len(result.splits)))
        totals["splits"] += len(result.splits)
        for method in methods:
            counts = verdict_counts(result, method.name)
            kinds = (PASS, EXCUSED, FAIL) if method.reports_losses else (PASS, FAIL)
            for kind in kinds:
                row.append(str(counts[kind]))
                totals[f"{method.name} {kind}"] += counts[kind]
        rows.append(row)
    rows.append(["**total**", "", "", str(totals["splits"])] + [str(totals[h]) for h in header[4:]])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def category(outcome: SplitOutcome, modules: set[str]) -> str:
    """What kind of failure: the save or restore that raised, else the error the first
    differing cell raised, or what differed."""
    for step, error in _step_errors(outcome):
        return f"{step} raised {error.split(':', 1)[0]}"
    difference = outcome.first_difference
    if difference is None:
        return "variables differ, every output matches"
    if difference.error is None:
        return "different output, no error"
    match = _NAME_ERROR.match(difference.error)
    if match:
        return "NameError on a module" if match.group(1) in modules else "NameError on a variable"
    return difference.error.split(":", 1)[0]


def _step_errors(outcome: SplitOutcome) -> list[tuple[str, str]]:
    """The save or restore steps that raised, with their errors."""
    steps = (("save", outcome.save_error), ("restore", outcome.restore_error))
    return [(step, error) for step, error in steps if error]


def failures(results: list[NotebookResult]) -> str:
    """Markdown list of every split that did not pass, with its first difference."""
    lines = []
    for result in results:
        for outcome in result.outcomes:
            if outcome.verdict == PASS:
                continue
            head = f"- {result.name} @ {outcome.split} {outcome.method}: **{outcome.verdict}**"
            for step, error in _step_errors(outcome):
                head += f"; {step} raised `{error[:100]}`"
            difference = outcome.first_difference
            if difference is not None:
                head += (
                    f"; cell {difference.cell} `{difference.source[:60]}`: expected "
                    f"`{difference.expected[:80]}`, got `{difference.got[:100]}`"
                )
            if outcome.variables:
                shown = [f"{n} {why}" for n, why in sorted(outcome.variables.items())[:6]]
                more = len(outcome.variables) - len(shown)
                head += "; variables: " + ", ".join(shown) + (f" (+{more})" if more > 0 else "")
            if outcome.reported_lost:
                head += "; restore named: " + ", ".join(outcome.reported_lost)
            lines.append(head)
    return "\n".join(lines)


def categories(results: list[NotebookResult]) -> dict[str, dict[str, int]]:
    """method -> failure category -> number of failed splits."""
    counted: dict[str, Counter[str]] = {}
    for result in results:
        for outcome in result.outcomes:
            if outcome.verdict == FAIL:
                kind = category(outcome, set(result.modules))
                counted.setdefault(outcome.method, Counter())[kind] += 1
    return {method: dict(kinds.most_common()) for method, kinds in counted.items()}


def conditions(args: dict[str, Any]) -> dict[str, Any]:
    """Versions, commit and machine of this measurement."""

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    def git(*words: str) -> str:
        done = subprocess.run(
            ["git", *words], cwd=REPOSITORY, capture_output=True, text=True, check=False
        )
        return done.stdout.strip()

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": git("rev-parse", "HEAD"),
        "uncommitted_changes": bool(git("status", "--porcelain")),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "packages": {name: version(name) for name in _PACKAGES},
        "arguments": args,
    }
