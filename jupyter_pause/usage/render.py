"""The GPU-hours report as Markdown (stdout, ``report.md``) and PNG charts (``--out``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..formatting import format_bytes, format_duration
from ..markdown import md_table, pyplot, save
from .spans import LIVE_NOT_PROVEN
from .study import RELEASE_SHARE

#: The daily chart shows the last four weeks (the JSON has every day of the window).
CHART_DAYS = 28


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"


def _money(value: float) -> str:
    return f"{value:,.2f}"


def markdown(report: dict[str, Any], source: str, charts: list[Path]) -> str:
    """The whole report as Markdown."""
    window, totals = report["window"], report["totals"]
    allocated, active = totals["gpu_hours_allocated"], totals["gpu_hours_active"]
    out = [
        "# GPU hours report",
        "",
        f"From {_when(window['start'])} to {_when(window['end'])} "
        f"({format_duration(window['seconds'])}); {source}; {report['notebooks']} notebooks, "
        f"{report['gpu_notebooks']} with GPUs.",
        "",
    ]
    if not report.get("pauses_recorded"):
        out += ["**No pause has been recorded yet.**", ""]
    out += [
        "## Allocated vs worked",
        "",
        f"**{allocated:.1f} GPU hours allocated, {active:.1f} worked** "
        f"({_share(active, allocated)}): {totals['gpu_hours_idle']:.1f} GPU hours held idle. "
        f"Pausing gave {totals['gpu_hours_released']:.1f} GPU hours back to the pool.",
        "",
        "Worked: held, less the recorded idle gaps (no cell, no edit for 5 min or more, and "
        "from the last activity until a pause released the GPU).",
        "",
    ]
    by = report["by"]
    out.append(
        md_table(
            [
                by,
                "allocated GPU h",
                "worked GPU h",
                "idle GPU h",
                "released GPU h",
                "pauses",
                "resumes",
                "storage",
            ],
            [
                (
                    row[by],
                    row["gpu_hours_allocated"],
                    row["gpu_hours_active"],
                    row["gpu_hours_idle"],
                    row["gpu_hours_released"],
                    row["pauses"],
                    row["resumes"],
                    format_bytes(row["storage_bytes"]),
                )
                for row in report["groups"]
            ],
        )
    )
    out += [
        "",
        f"Pauses ({report['pauses']}) and resumes ({report['resumes']}) are requests, counted "
        "as `jupyter pause timeline` counts them: also a pause the kernel survived (it failed) "
        "and one of a kernel without a GPU. "
        f"{report.get('pauses_outside', 0)} of the pauses came from outside jupyter_pause (the "
        "dashboard, kubectl or a culler setting the Workspace's spec.paused, or the platform "
        "stopping the pod).",
    ]
    out += ["", "## Per week", ""]
    out.append(
        md_table(
            ["week", "allocated GPU h", "worked GPU h", "released GPU h"],
            [
                (
                    w["week"],
                    w["gpu_hours_allocated"],
                    w["gpu_hours_active"],
                    w["gpu_hours_released"],
                )
                for w in report["weeks"]
            ],
        )
    )
    out += ["", *_storage(report), "", *_resumes(report), "", *_prices(report)]
    out += ["", *_study(report)]
    if charts:
        out += ["", "## Charts", "", *[f"![{c.stem}]({c.name})" for c in charts]]
    return "\n".join(out) + "\n"


def _storage(report: dict[str, Any]) -> list[str]:
    storage = report["storage"]
    lines = [
        "## Storage",
        "",
        f"Checkpoints hold {format_bytes(storage['bytes'])} ({storage['checkpoints']} "
        f"checkpoints, {storage['snapshots']} platform snapshots).",
    ]
    store = storage.get("store")
    if store:
        lines.append(
            f"The store's file system has {format_bytes(store['free_bytes'])} free of "
            f"{format_bytes(store['total_bytes'])}."
        )
    return lines


def _resumes(report: dict[str, Any]) -> list[str]:
    latency = report["resume_latency_seconds"]
    rows = []
    for name, label in (
        ("queue", "waiting for resources"),
        ("to_ready", "resume to ready"),
        ("to_next_cell", "resume to next cell"),
    ):
        values = latency[name]
        rows.append(
            (
                label,
                values["count"],
                *(format_duration(values[p]) for p in ("p50", "p90", "p99", "max")),
            )
        )
    restores = report["restores"]
    return [
        "## Resumes",
        "",
        md_table(["latency", "resumes", "p50", "p90", "p99", "max"], rows),
        "",
        f"Restores: {restores['live']} live (the same process: its token matched the one "
        f"recorded at the pause), {restores['files']} from files, "
        f"{restores['partial']} partial, {restores['failed']} failed"
        + (f", {restores['in flight']} in flight" if restores["in flight"] else "")
        + (
            f", {restores[LIVE_NOT_PROVEN]} live, not proven (recorded before this check: "
            "these may have been new, empty kernels)"
            if restores.get(LIVE_NOT_PROVEN)
            else ""
        )
        + ".",
    ]


def _prices(report: dict[str, Any]) -> list[str]:
    money, prices = report["money"], report["prices"]
    if money is None:
        return [
            "## Money",
            "",
            "No prices set: `c.PauseApp.gpu_hour_price` and `c.PauseApp.storage_gb_month_price` "
            "on the server, or `--gpu-hour-price` and `--storage-gb-month-price`.",
        ]
    return [
        "## Money",
        "",
        f"At {_money(prices.get('gpu_hour') or 0)} per GPU hour and "
        f"{_money(prices.get('storage_gb_month') or 0)} per GB-month:",
        "",
        md_table(
            ["", "amount"],
            [
                ("GPUs allocated", _money(money["spent_on_allocated_gpus"])),
                ("of which held idle", _money(money["spent_on_idle_gpus"])),
                ("saved by pausing (GPU hours released)", _money(money["saved_by_pausing"])),
                ("checkpoint storage, per month", _money(money["storage_per_month"])),
            ],
        ),
    ]


def _study(report: dict[str, Any]) -> list[str]:
    study = report["idle_threshold_study"]
    costs = study["costs"]
    measured = (
        f"a pause keeps the GPU {format_duration(costs['pause_seconds'])} "
        f"(median of {costs['pauses_measured']}), a restore takes "
        f"{format_duration(costs['restore_seconds'])} (median of {costs['restores_measured']})"
    )
    if not costs["pauses_measured"] and not costs["restores_measured"]:
        measured = "no pause or restore was recorded: their costs are taken as 0"
    lines = [
        "## Idle-threshold study",
        "",
        f"{study['absences']} recorded absences replayed under each threshold; measured costs: "
        f"{measured}. At threshold 0 with no costs, {study['at_zero']['gpu_hours_released']:.1f} "
        "GPU hours are releasable.",
        "",
        md_table(
            ["threshold", "GPU h released", "pauses", "users waited", "wait (min)"],
            [
                (
                    format_duration(o["minutes"] * 60),
                    o["gpu_hours_released"],
                    o["pauses"],
                    o["waits"],
                    o["wait_minutes"],
                )
                for o in study["thresholds"]
            ],
        ),
        "",
        f"Recommended: the longest threshold that still releases {RELEASE_SHARE:.0%} of what "
        "the shortest does (shorter ones make users wait more often for little more).",
        "",
    ]
    rows = [
        (
            name,
            "-"
            if entry["recommended_minutes"] is None
            else format_duration(entry["recommended_minutes"] * 60),
            "-" if entry["outcome"] is None else f"{entry['outcome']['gpu_hours_released']:.1f}",
            "-" if entry["outcome"] is None else entry["outcome"]["waits"],
        )
        for name, entry in study["by_kernelspec"].items()
    ]
    lines.append(md_table(["kernelspec", "recommended threshold", "GPU h released", "waits"], rows))
    return lines


def charts(report: dict[str, Any], folder: Path) -> list[Path]:
    """``gpu-hours-per-day.png`` and ``idle-threshold-study.png`` in ``folder``."""
    plt = pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    days = report["days"][-CHART_DAYS:]
    if days:
        figure, axes = plt.subplots(figsize=(8, 3.2))
        x = range(len(days))
        width = 0.28
        for shift, key, label in (
            (-width, "gpu_hours_allocated", "allocated"),
            (0.0, "gpu_hours_active", "worked"),
            (width, "gpu_hours_released", "released"),
        ):
            axes.bar([i + shift for i in x], [d[key] for d in days], width, label=label)
        axes.set_xticks(list(x), [d["day"][5:] for d in days], rotation=45, ha="right")
        axes.set_ylabel("GPU hours")
        axes.set_title(f"GPU hours per day (the last {len(days)} days with GPU time)")
        axes.legend()
        written.append(save(figure, folder / "gpu-hours-per-day.png"))
    written.append(save(study_figure(report, plt), folder / "idle-threshold-study.png"))
    return written


def study_figure(report: dict[str, Any], plt: Any) -> Any:
    """The idle-threshold study's chart: GPU hours released and minutes users would wait,
    per threshold. Both axes start at 0; with nothing to show yet (no idle gap recorded, or
    none long enough) they run to 1 and the chart says why it is empty, instead of the axis
    of -0.04 to 0.04 that matplotlib draws around all-zero lines."""
    study = report["idle_threshold_study"]
    outcomes = study["thresholds"]
    figure, released_axes = plt.subplots(figsize=(8, 3.2))
    minutes = [o["minutes"] for o in outcomes]
    released = [o["gpu_hours_released"] for o in outcomes]
    waits = [o["wait_minutes"] for o in outcomes]
    released_axes.plot(minutes, released, "o-", label="GPU h released")
    released_axes.set_xlabel("idle threshold (minutes)")
    released_axes.set_ylabel("GPU hours released")
    wait_axes = released_axes.twinx()
    wait_axes.plot(minutes, waits, "s--", color="tab:red", label="minutes users wait")
    wait_axes.set_ylabel("minutes users would wait")
    for axes, values in ((released_axes, released), (wait_axes, waits)):
        axes.set_ylim(bottom=0, top=None if max(values, default=0) > 0 else 1)
    released_axes.set_title("Idle-threshold study")
    if not any(released) and not any(waits):
        released_axes.text(
            0.5,
            0.5,
            "no idle gaps yet"
            if not study["absences"]
            else "no idle gap long enough to release a GPU",
            transform=released_axes.transAxes,
            ha="center",
            va="center",
            color="grey",
        )
    recommended = study["recommended_minutes"]
    if recommended is not None:
        released_axes.axvline(recommended, color="grey", linestyle=":")
    return figure
