"""The checkpoint benchmark at several state sizes: cost against size, a table and a plot.

Runs ``bench_checkpoint.py`` (same rounds, same device reference, same peers, less those
whose memory need does not fit) once per size, keeps each run's report in
``bench/results/scaling-<GB>gb.{md,json}``, then fits seconds = fixed + per-GB x size for
every method and writes ``bench/results/scaling.md`` and the plot ``bench/scaling.png``.

    python bench/scaling.py --gb 0.25,1,4,8 --methods jupyter_pause,safetensors,pickle
    python bench/scaling.py --gb 0.25,1,4,8 --render-only    # table and plot from the runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_checkpoint  # noqa: E402

RESULTS = bench_checkpoint.RESULTS
PLOT = HERE / "scaling.png"
# (column, summary key, format); seconds and MB are medians over the rounds.
COLUMNS = [
    ("save s", "save_s", ".2f"),
    ("save / device", "save_frac", ".2f"),
    ("restore s", "restore_s", ".2f"),
    ("restore / device", "restore_frac", ".2f"),
    ("restore / fresh read", "fresh_frac", ".2f"),
    ("extra save MB", "extra_mb", ".0f"),
    ("extra restore MB", "restore_extra_mb", ".0f"),
    ("disk MB", "disk_mb", ".0f"),
    ("incr s", "incr_s", ".3f"),
]


def report_name(gb: float) -> str:
    return f"scaling-{gb:g}gb"


def run(sizes: list[float], argv: list[str]) -> None:
    for gb in sizes:
        print(f"[scaling] {gb:g} GB", file=sys.stderr, flush=True)
        args = bench_checkpoint.parse_args([*argv, "--gb", str(gb), "--report", report_name(gb)])
        bench_checkpoint.write_report(bench_checkpoint.orchestrate(args), args.report)


def load(sizes: list[float]) -> dict[float, dict[str, Any]]:
    return {gb: json.loads((RESULTS / f"{report_name(gb)}.json").read_text()) for gb in sizes}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = fixed + slope * x."""
    if len(points) < 2:
        return (points[0][1], 0.0) if points else (0.0, 0.0)
    slope, fixed = statistics.linear_regression(*zip(*points, strict=True))
    return fixed, slope


def render(runs: dict[float, dict[str, Any]]) -> str:
    methods = list(dict.fromkeys(m for found in runs.values() for m in found["results"]))
    lines = [
        "| state GB | method | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 2) + "|",
    ]
    for found in runs.values():
        state_gb = found["meta"]["state_gb"]
        for method in methods:
            summary = found["results"].get(method, {}).get("summary", {})
            if not summary.get("rounds"):
                continue
            cells = [
                format(summary[key][0], spec) if key in summary else "n/a"
                for _, key, spec in COLUMNS
            ]
            lines.append(f"| {state_gb:.3g} | {method} | " + " | ".join(cells) + " |")
    lines += ["", "Fits over the sizes each method ran at (seconds = fixed + per GB x size):", ""]
    lines += ["| method | save: fixed s, s per GB | restore: fixed s, s per GB | sizes |"]
    lines += ["|---|---|---|---|"]
    for method in methods:
        series = _series(runs, method)
        if len(series) < 2:
            continue
        save = fit([(gb, s["save_s"][0]) for gb, s in series])
        restore = fit([(gb, s["restore_s"][0]) for gb, s in series])
        sizes = ", ".join(f"{gb:.3g}" for gb, _ in series)
        lines.append(
            f"| {method} | {save[0]:.3f}, {save[1]:.3f} | {restore[0]:.3f}, {restore[1]:.3f} "
            f"| {sizes} |"
        )
    skipped = [
        f"- {gb:g} GB: {note[2:]}"
        for gb, found in runs.items()
        for note in found["meta"]["notes"]
        if "skipped" in note or "not installed" in note
    ]
    conditions = [
        f"- {gb:g} GB: {found['meta']['when']}, {found['meta']['rounds']} rounds, load average "
        f"{found['meta']['loadavg_1min'][0]:.2f} / {found['meta']['loadavg_1min'][1]:.2f}, "
        f"{found['meta']['mem_available_gb']:.1f} GB available"
        for gb, found in runs.items()
    ]
    return "\n".join([*lines, "", "Runs:", *conditions, *skipped]) + "\n"


def _series(runs: dict[float, dict[str, Any]], method: str) -> list[tuple[float, dict]]:
    out = []
    for found in runs.values():
        summary = found["results"].get(method, {}).get("summary", {})
        if summary.get("rounds"):
            out.append((found["meta"]["state_gb"], summary))
    return out


def plot(runs: dict[float, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(m for found in runs.values() for m in found["results"]))
    fig, (times, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in methods:
        series = _series(runs, method)
        sizes = [gb for gb, _ in series]
        style = {"linewidth": 2.5} if method == "jupyter_pause" else {"alpha": 0.8}
        if method == bench_checkpoint.REFERENCE:
            style = {"color": "black", "linestyle": ":"}
        for key, marker, label in (("save_s", "o", "save"), ("restore_s", "s", "restore")):
            line = times.plot(
                sizes,
                [s[key][0] for _, s in series],
                marker=marker,
                label=f"{method} {label}",
                **style,
            )
            style = {**style, "color": line[0].get_color()}
        if method != bench_checkpoint.REFERENCE:
            memory.plot(sizes, [s["extra_mb"][0] for _, s in series], marker="o", **style)
            memory.plot(
                sizes,
                [s["restore_extra_mb"][0] for _, s in series],
                marker="s",
                label=method,
                **style,
            )
    times.set(xlabel="state (GB)", ylabel="seconds (median)", title="save and restore time")
    memory.set(
        xlabel="state (GB)",
        ylabel="MB (median)",
        title="extra memory: save (o), restore beyond the state (s)",
    )
    times.legend(fontsize=7)
    memory.legend(fontsize=7)
    for axes in (times, memory):
        axes.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", default="0.25,1,4,8", help="comma list of state sizes in GB")
    p.add_argument("--render-only", action="store_true", help="table and plot from past runs")
    args, rest = p.parse_known_args()
    sizes = [float(x) for x in args.gb.split(",")]
    if not args.render_only:
        run(sizes, rest)
    runs = load(sizes)
    md = render(runs)
    (RESULTS / "scaling.md").write_text(md)
    plot(runs)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
