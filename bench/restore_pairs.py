"""Restore-only measurement: restores of each method alternating with the raw reference.

`bench_checkpoint.py` restores every checkpoint right after the process that wrote it. On a
virtual disk the host may still hold those bytes in its own memory, and then a sequential
`read()` runs far faster than it does for a file written an hour earlier. This script measures
both conditions with the same children as the main benchmark: it writes each method's
checkpoint and then the `raw` reference file (last, so raw is never the older file), waits
`--age` seconds (0: read right after writing; 900: the files have sat for 15 minutes, the
"next morning" case), then runs `--pairs` restore processes of each method alternating with
raw restore processes. Every restore starts from a dropped page cache. Each method restore is
compared with the raw restore right before it (which it cannot have disturbed) and with the
mean of the raw restores before and after it; the table shows the medians of both fractions
and marks the target on the lower one.

    python bench/restore_pairs.py --pairs 8              # files read right after writing
    python bench/restore_pairs.py --pairs 8 --age 900    # files 15 minutes old
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_checkpoint import METHODS, RESULTS, drop_page_cache, spawn, tree_files  # noqa: E402


def restore_seconds(args: argparse.Namespace, method: str, store: Path, work: Path) -> float:
    drop_page_cache(tree_files(work))
    result = spawn(args, "restore", method, store)
    if "error" in result:
        raise SystemExit(f"{method} restore: {result['error']}")
    return result["seconds"]


def measure(args: argparse.Namespace, methods: list[str], work: Path) -> dict[str, Any]:
    stores = {}
    for method in [*methods, "raw"]:
        stores[method] = work / method
        stores[method].mkdir(parents=True)
        saved = spawn(args, "save", method, stores[method])
        if "error" in saved:
            raise SystemExit(f"{method} save: {saved['error']}")
        state_bytes = saved["state_bytes"]
    time.sleep(args.age)
    raw = [restore_seconds(args, "raw", stores["raw"], work)]
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for i in range(args.pairs):
        for method in methods:
            seconds = restore_seconds(args, method, stores[method], work)
            raw.append(restore_seconds(args, "raw", stores["raw"], work))
            runs[method].append({"seconds": seconds, "raw_before": raw[-2], "raw_after": raw[-1]})
            print(
                f"[pairs] {i + 1}/{args.pairs} {method}: {seconds:.3f} s, raw before/after "
                f"{raw[-2]:.3f}/{raw[-1]:.3f} s",
                flush=True,
            )
    return {"state_bytes": state_bytes, "raw_seconds": raw, "runs": runs}


def render(found: dict[str, Any], args: argparse.Namespace) -> str:
    mb = found["state_bytes"] / 1e6
    raw_mbps = [mb / s for s in found["raw_seconds"]]
    lines = [
        f"## Restore pairs ({time.strftime('%Y-%m-%d %H:%M')}, {mb:.0f} MB of state, files "
        f"{args.age:.0f} s old when the first restore ran, {args.pairs} pairs per method)",
        "",
        f"Raw cold sequential read: median **{statistics.median(raw_mbps):.0f} MB/s** (range "
        f"{min(raw_mbps):.0f}-{max(raw_mbps):.0f}, {len(raw_mbps)} runs).",
        "All values are medians over the pairs.",
        "",
        "| method | restore s | raw s before | frac vs raw before (range) | raw s after | "
        "frac vs mean of before and after (range) | >= 0.65 |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, runs in found["runs"].items():
        before = [r["raw_before"] / r["seconds"] for r in runs]
        around = [(r["raw_before"] + r["raw_after"]) / 2 / r["seconds"] for r in runs]
        worst = min(statistics.median(before), statistics.median(around))
        lines.append(
            f"| {method} | {statistics.median(r['seconds'] for r in runs):.3f} | "
            f"{statistics.median(r['raw_before'] for r in runs):.3f} | "
            f"{statistics.median(before):.2f} ({min(before):.2f}-{max(before):.2f}) | "
            f"{statistics.median(r['raw_after'] for r in runs):.3f} | "
            f"{statistics.median(around):.2f} ({min(around):.2f}-{max(around):.2f}) | "
            f"{'PASS' if worst >= 0.65 else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="jupyter_pause", help=f"comma list of {','.join(METHODS)}")
    p.add_argument("--pairs", type=int, default=8, help="restores per method")
    p.add_argument("--age", type=float, default=0, help="seconds between writing and reading")
    p.add_argument("--scale", type=float, default=1.0, help="workload size (1.0 = ~710 MB)")
    p.add_argument("--workdir", default=str(RESULTS / "pairs-work"), help="scratch dir")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    p.add_argument("--verbose", action="store_true", help="print children's stderr on failure")
    args = p.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        p.error(f"unknown methods: {', '.join(unknown)}")
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    try:
        found = measure(args, methods, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    md = render(found, args)
    print(md)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"pairs_age{args.age:.0f}.md").write_text(md)
    (RESULTS / f"pairs_age{args.age:.0f}.json").write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
