"""Fidelity benchmark: does a notebook resumed in a new kernel compute what it would have?

Each notebook of bench/notebooks runs twice uninterrupted (cells whose outputs differ between
the two are left out of the comparison), then, for each split point, runs to the split, saves
the session (jupyter_pause's %checkpoint, or dill.dump_session as the baseline), continues in a
new kernel after the restore and compares every output and a fingerprint of every variable
with the uninterrupted run. See bench/README.md ("Fidelity").

    python bench/fidelity.py                       # every notebook, every split, both methods
    python bench/fidelity.py --quick               # one split per notebook
    python bench/fidelity.py --notebooks own_globals,kishu_simple --methods jupyter_pause
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from notebook_fidelity.corpus import corpus, split_points
from notebook_fidelity.evaluate import NotebookResult, evaluate_notebook
from notebook_fidelity.methods import METHODS
from notebook_fidelity.report import categories, conditions, failures, table

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", help="comma-separated notebook names (file stems)")
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, from: {', '.join(METHODS)} (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="one split per notebook (n/2)")
    parser.add_argument(
        "--jobs", type=int, default=1, help="notebooks measured at once (default 1)"
    )
    parser.add_argument(
        "--cell-timeout", type=float, default=600, help="seconds before a cell is interrupted"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=RESULTS / "fidelity-work",
        help="scratch folders for the kernels (default bench/results/fidelity-work)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    notebooks = corpus(args.notebooks.split(",") if args.notebooks else None)
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        sys.exit(f"unknown method(s): {', '.join(unknown)}; known: {', '.join(METHODS)}")
    methods = [METHODS[m] for m in args.methods.split(",")]
    jobs = [
        (nb, args.workdir, split_points(len(nb.cells), args.quick), methods, args.cell_timeout)
        for nb in notebooks
    ]
    started = time.perf_counter()
    results: list[NotebookResult] = []
    # Worker processes are spawned, not forked: the parent may hold ZMQ sockets of kernels.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=context) as pool:
        for result in pool.map(evaluate_notebook, *zip(*jobs, strict=True)):
            results.append(result)
            print(f"{result.name}: {_line(result)}", file=sys.stderr, flush=True)

    summary = table(results, methods)
    print(summary)
    lost = failures(results)
    if lost:
        print("\nSplits that did not pass:\n" + lost)
    kinds = categories(results)
    print("\nFailure categories: " + json.dumps(kinds, indent=1))
    seconds = time.perf_counter() - started
    print(f"\n{len(results)} notebooks in {seconds:.0f} s")
    _write(results, summary, lost, kinds, vars(args), seconds)
    return 0


def _line(result: NotebookResult) -> str:
    verdicts = {}
    for outcome in result.outcomes:
        verdicts.setdefault(outcome.method, []).append(f"{outcome.split}:{outcome.verdict}")
    return "; ".join(f"{m} {' '.join(v)}" for m, v in verdicts.items())


def _write(
    results: list[NotebookResult],
    summary: str,
    lost: str,
    kinds: dict[str, dict[str, int]],
    args: dict,
    seconds: float,
) -> None:
    RESULTS.mkdir(exist_ok=True)
    document = {
        "conditions": conditions({k: str(v) for k, v in args.items()}),
        "seconds": seconds,
        "failure_categories": kinds,
        "notebooks": [result.to_json() for result in results],
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = json.dumps(document, indent=1)
    (RESULTS / f"fidelity-{stamp}.json").write_text(text)
    (RESULTS / "fidelity-latest.json").write_text(text)
    (RESULTS / "fidelity-latest.md").write_text(f"{summary}\n\n{lost}\n")
    print(f"Results: {RESULTS / f'fidelity-{stamp}.json'}")


if __name__ == "__main__":
    sys.exit(main())
