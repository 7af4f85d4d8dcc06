"""The drill's report folder: ``report.md``, ``report.json`` and PNG charts."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ...formatting import format_bytes
from ...markdown import md_table, pyplot, save
from .plan import Findings

WAYS = {"live": "live process", "files": "restore from files", "rerun": "new kernel, re-run"}


def write(findings: Findings, out: Path, stopped: str | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    try:
        charts = _charts(findings.numbers, out)
    except ImportError as err:
        print(f"jupyter pause drill: {err}", file=sys.stderr)
        charts = []
    data = findings.to_json()
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "report.md").write_text(markdown(findings, stopped, charts))
    return [out / "report.md", out / "report.json", *charts]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def markdown(findings: Findings, stopped: str | None, charts: list[Path]) -> str:
    n = findings.numbers
    env = n.get("environment", {})
    verdict = "FAILED" if findings.failed or stopped else "passed"
    lines = [
        f"# Pause drill: {verdict}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')} on {env.get('host', '?')} ({env.get('platform', '?')}), "
        f"Python {env.get('python', '?')}, jupyter_pause {env.get('jupyter_pause', '?')}; "
        f"server {env.get('server', '?')}, {env.get('backend', '?')} backend, "
        f"{env.get('gpus_total', 0)} GPU(s) to hand out, {env.get('gpus_per_kernel', 0)} per kernel.",
        "",
    ]
    gpu = env.get("gpu_inventory")
    lines.append(
        "GPUs here: "
        + "; ".join(f"{g['name']} (driver {g['driver']}, {g['memory_total']})" for g in gpu["gpus"])
        if gpu
        else "GPUs here: none visible (no nvidia-smi): GPU memory is not measurable here."
    )
    store = env.get("store") or {}
    if store:
        lines.append(
            f"Store: {format_bytes(store['free_bytes'])} free of "
            f"{format_bytes(store['total_bytes'])}."
        )
    if stopped:
        lines += ["", f"**Stopped early:** {stopped}"]
    lines += [
        "",
        "## Checks",
        "",
        md_table(
            ["step", "check", "result", "detail"],
            [(c.step, c.name, c.status, c.detail) for c in findings.checks],
        ),
    ]
    lines += _measurements(n)
    if charts:
        lines += ["", "## Charts", "", *[f"![{c.stem}]({c.name})" for c in charts]]
    return "\n".join(lines) + "\n"


def _measurements(n: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if "pause" in n:
        p = n["pause"]
        lines += [
            "",
            "## Pause",
            "",
            md_table(
                ["measure", "value"],
                [
                    ("request to paused (client)", _seconds(p["seconds"])),
                    ("request to kernel stopped (timeline)", _seconds(p["to_kernel_stopped"])),
                    ("request to GPU released (timeline)", _seconds(p["to_gpu_released"])),
                    ("checkpoints kept", p["checkpoints_kept"]),
                    ("latest checkpoint", format_bytes(p["checkpoint_bytes"])),
                    ("store folder", format_bytes(p["storage_bytes"])),
                ],
            ),
        ]
    if "resume" in n:
        r = n["resume"]
        lines += [
            "",
            "## Resume",
            "",
            md_table(
                ["measure", "value"],
                [
                    ("how", r["how"]),
                    ("request to ready (client)", _seconds(r["to_ready_seconds"])),
                    ("request to ready (timeline)", _seconds(r["timeline_to_ready"])),
                    (
                        "request to next cell started (timeline)",
                        _seconds(r["timeline_to_first_cell"]),
                    ),
                    (
                        "request to next cell done (client)",
                        _seconds(r["to_next_cell_done_seconds"]),
                    ),
                ],
            ),
        ]
    if "compare" in n:
        ways, notes = n["compare"]["ways"], n["compare"]["notes"]
        rows = []
        for key, label in WAYS.items():
            way = ways.get(key)
            rows.append(
                (
                    label,
                    _seconds(way["to_ready_seconds"]) if way else "-",
                    _seconds(way["to_next_cell_done_seconds"]) if way else "-",
                    notes.get(key, "measured"),
                )
            )
        lines += [
            "",
            "## Side by side",
            "",
            md_table(["way back", "to a ready kernel", "to the next cell done", ""], rows),
        ]
    if "probe" in n:
        p = n["probe"]
        lines += [
            "",
            "## Failure probe",
            "",
            f"Reason shown: {p['reason']} (place {p['queue_position']}); waited "
            f"{_seconds(p['waited_seconds'])}; ready {_seconds(p['ready_after_release_seconds'])}"
            " after the resources came back.",
        ]
    if "rush" in n:
        rush = n["rush"]
        lines += [
            "",
            f"## Morning rush: {rush['notebooks']} notebooks, {rush['gpus']} GPU(s)",
            "",
            md_table(
                ["notebook", "waited", "to ready", "restores", "reason", "outcome"],
                [
                    (
                        r["path"],
                        _seconds(r.get("waited_seconds")),
                        _seconds(r.get("to_ready_seconds")),
                        r["restores"],
                        r["reason"] or "-",
                        r["outcome"],
                    )
                    for r in rush["rows"]
                ],
            ),
        ]
    if "storage" in n:
        s = n["storage"]
        lines += [
            "",
            "## Clean-up",
            "",
            md_table(
                ["notebook", "before", "after", "checkpoints left"],
                [
                    (
                        r["path"],
                        format_bytes(r["bytes_before"]),
                        format_bytes(r["bytes_after"]),
                        r["checkpoints_after"],
                    )
                    for r in s["rows"]
                ],
            ),
        ]
        lines.append(f"\nFreed {format_bytes(s['bytes_freed'])}.")
    return lines


def _charts(n: dict[str, Any], out: Path) -> list[Path]:
    charts = []
    if "compare" in n:
        plt = pyplot()
        ways = [(WAYS[k], v) for k, v in n["compare"]["ways"].items() if v]
        figure, axes = plt.subplots(figsize=(7, 2.6))
        labels = [label for label, _ in ways]
        axes.barh(
            labels,
            [v["to_next_cell_done_seconds"] for _, v in ways],
            color="tab:blue",
            label="to the next cell done",
        )
        axes.barh(
            labels,
            [v["to_ready_seconds"] for _, v in ways],
            color="tab:green",
            label="to a ready kernel",
        )
        axes.set_xlabel("seconds from the request")
        axes.set_title("Back to work: resume vs re-running the notebook")
        axes.legend(loc="lower right")
        charts.append(save(figure, out / "resume-vs-rerun.png"))
    rows = [r for r in (n.get("rush") or {}).get("rows", []) if r.get("requested")]
    if rows:
        plt = pyplot()
        start = min(r["requested"] for r in rows)
        figure, axes = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rows)))
        for i, r in enumerate(rows):
            acquired = r["acquired"] or r["requested"]
            axes.barh(i, acquired - r["requested"], left=r["requested"] - start, color="tab:orange")
            if r["ready"]:
                axes.barh(i, r["ready"] - acquired, left=acquired - start, color="tab:green")
        axes.set_yticks(range(len(rows)), [r["path"].rsplit("/", 1)[-1] for r in rows])
        axes.invert_yaxis()
        axes.set_xlabel(
            "seconds since the rush began (orange: waiting for a GPU, green: restoring)"
        )
        axes.set_title(f"Morning rush: {len(rows)} notebooks, {n['rush']['gpus']} GPU(s)")
        charts.append(save(figure, out / "morning-rush.png"))
    return charts
