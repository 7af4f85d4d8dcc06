"""The GPU-hours report on synthetic timelines with known answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jupyter_pause.records import SessionRecord
from jupyter_pause.timeline import Timeline
from jupyter_pause.usage import render, report, sources
from jupyter_pause.usage.spans import percentile

from .cli_runner import Cli

H = 3600.0
MONDAY = 1_700_438_400.0  # 2023-11-20 00:00 UTC, a Monday


def ev(kind: str, at: float, **data: Any) -> dict[str, Any]:
    return {"kind": kind, "at": at, "data": data}


def worked_week(kernel: str = "python3", user: str = "ana") -> dict[str, Any]:
    """A GPU held all week (168 h), worked 9:00-17:00 Monday to Friday (40 h), never paused."""
    events = [ev("gpu_acquired", MONDAY, gpus=[0]), ev("idle_gap", MONDAY, seconds=9 * H)]
    for day in range(4):  # the evenings and nights from Monday to Thursday
        events.append(ev("idle_gap", MONDAY + day * 24 * H + 17 * H, seconds=16 * H))
    return {
        "path": f"{user}/week.ipynb",
        "user": user,
        "kernel_name": kernel,
        "gpus_needed": 1,
        "state": "active",
        "last_activity": MONDAY + 4 * 24 * H + 17 * H,  # Friday 17:00, idle since
        "events": events,
        "storage_bytes": 0,
        "checkpoints": 0,
        "snapshots": 0,
    }


def paused_night(start: float, gpus: int = 2) -> dict[str, Any]:
    """Worked 1 h, idle 30 min, paused (60 s to release) for the night, resumed in 20 s."""
    return {
        "path": "night.ipynb",
        "user": "bo",
        "kernel_name": "big",
        "gpus_needed": gpus,
        "state": "ready",
        "last_activity": None,
        "events": [
            ev("gpu_acquired", start, gpus=list(range(gpus))),
            ev("last_activity", start + H),
            ev("pause_requested", start + 1.5 * H, reason="idle"),
            ev("checkpoint_written", start + 1.5 * H + 30, bytes_written=10**9),
            ev("kernel_stopped", start + 1.5 * H + 60),
            ev("gpu_released", start + 1.5 * H + 60, gpus=list(range(gpus))),
            ev("resume_requested", start + 12 * H),
            ev("resources_acquired", start + 12 * H + 5, gpus=list(range(gpus))),
            ev("state_restored", start + 12 * H + 15, how="files", restored=["m"], failed={}),
            ev("kernel_ready", start + 12 * H + 20),
            ev("first_cell_executed", start + 12 * H + 80),
        ],
        "storage_bytes": 2 * 10**9,
        "checkpoints": 2,
        "snapshots": 0,
    }


def listing(*notebooks: dict[str, Any], now: float, **prices: float) -> dict[str, Any]:
    return {"now": now, "prices": prices, "store": None, "notebooks": list(notebooks)}


def test_a_worked_week_gives_128_hours_releasable_at_threshold_zero() -> None:
    # Given a week of 168 GPU hours allocated, 40 of them worked
    data = listing(worked_week(), now=MONDAY + 168 * H)

    # When the report is built over the whole week
    numbers = report.build(data, since_seconds=7 * 24 * H)

    # Then the "168 h allocated vs 40 h worked" view, and 128 h releasable at threshold 0
    assert numbers["totals"] == {
        "gpu_hours_allocated": 168.0,
        "gpu_hours_active": 40.0,
        "gpu_hours_idle": 128.0,
        "gpu_hours_released": 0.0,
    }
    study = numbers["idle_threshold_study"]
    assert study["at_zero"]["gpu_hours_released"] == 128.0
    # the six absences (the first morning, four nights, the weekend) under a 4 h threshold
    # each give back their length less 4 h; nothing was measured, so no costs
    at_4h = study["thresholds"][-1]
    assert (at_4h["minutes"], at_4h["gpu_hours_released"], at_4h["pauses"]) == (240, 104.0, 6)
    # 5 of the 6 absences ended with the user's return: 5 waits (of 0 s: no restore measured)
    assert (at_4h["waits"], at_4h["wait_minutes"]) == (5, 0.0)
    # 90% of what 5 min releases (127.5 h) is 114.75 h: 2 h (116 h) is the longest that does
    assert study["recommended_minutes"] == 120
    assert study["by_kernelspec"]["python3"]["recommended_minutes"] == 120
    assert numbers["money"] is None


def test_a_paused_night_counts_released_hours_latency_and_measured_costs() -> None:
    # Given a two-GPU notebook paused for the night, and a CPU-only notebook beside it
    night = paused_night(MONDAY)
    cpu = {**worked_week(), "path": "cpu.ipynb", "events": [], "gpus_needed": 0}
    data = listing(night, cpu, now=MONDAY + 13 * H, gpu_hour=2.0, storage_gb_month=0.05)

    numbers = report.build(data, since_seconds=None)

    held = 2 * (1.5 * H + 60 + (13 * H - 12 * H - 5))  # 2 GPUs until the pause, and since
    idle = 2 * (0.5 * H + 60)  # from the last activity to the release
    assert numbers["totals"]["gpu_hours_allocated"] == pytest.approx(held / H)
    assert numbers["totals"]["gpu_hours_idle"] == pytest.approx(idle / H)
    assert numbers["totals"]["gpu_hours_released"] == pytest.approx(2 * (10.5 * H - 55) / H)
    assert (numbers["notebooks"], numbers["gpu_notebooks"]) == (2, 1)
    latency = numbers["resume_latency_seconds"]
    assert (latency["queue"]["p50"], latency["to_ready"]["p50"]) == (5, 20)
    assert latency["to_next_cell"]["max"] == 80
    assert numbers["restores"] == {
        "live": 0,
        "live not proven": 0,
        "files": 1,
        "partial": 0,
        "failed": 0,
        "in flight": 0,
    }
    assert numbers["storage"]["bytes"] == 2 * 10**9 and numbers["storage"]["checkpoints"] == 2
    # money at 2.0 per GPU hour and 0.05 per GB-month
    money = numbers["money"]
    assert money["saved_by_pausing"] == pytest.approx(2.0 * 2 * (10.5 * H - 55) / H)
    assert money["storage_per_month"] == pytest.approx(2 * 0.05)  # only night.ipynb's 2 GB
    # the measured costs: 60 s from the pause request to the release, 20 s to ready
    study = numbers["idle_threshold_study"]
    assert study["costs"] == {
        "pause_seconds": 60.0,
        "restore_seconds": 20.0,
        "pauses_measured": 1,
        "restores_measured": 1,
    }
    # at 10 min: the night's absence (last activity to the resume, 11 h) pauses once, keeps
    # the GPUs 10 min + 60 s, and its user waits 20 s
    at_10 = next(o for o in study["thresholds"] if o["minutes"] == 10)
    assert at_10["gpu_hours_released"] == pytest.approx(2 * (11 * H - 600 - 60) / H)
    assert (at_10["pauses"], at_10["waits"]) == (1, 1)
    assert at_10["wait_minutes"] == pytest.approx(20 / 60)


def test_rows_by_user_kernelspec_and_the_window() -> None:
    data = listing(
        worked_week("python3", "ana"), paused_night(MONDAY, gpus=1), now=MONDAY + 168 * H
    )
    by_user = report.build(data, None, by="user")
    assert [row["user"] for row in by_user["groups"]] == ["ana", "bo"]
    by_kernel = report.build(data, None, by="kernelspec")
    assert [row["kernelspec"] for row in by_kernel["groups"]] == ["big", "python3"]
    # the last day only: ana's GPU was held and idle all Sunday
    last_day = report.build(data, 24 * H, by="user")
    ana = last_day["groups"][0]
    assert ana["gpu_hours_allocated"] == 24.0 and ana["gpu_hours_active"] == 0.0
    assert [w["week"] for w in by_user["weeks"]] == sorted(w["week"] for w in by_user["weeks"])


def test_since_and_percentiles() -> None:
    assert report.parse_since("7d") == 7 * 24 * H
    assert report.parse_since("90m") == 5400.0
    for bad in ("7", "0d", "-1h", "7y"):
        with pytest.raises(ValueError):
            report.parse_since(bad)
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0, 10.0], 0.5) == 2.0
    assert percentile([3.0, 1.0, 2.0, 10.0], 0.9) == 10.0


async def test_report_reads_a_store_without_a_server(tmp_path: Path, jp: Cli) -> None:
    # Given a store with one notebook's session record (as the server writes it)
    store = tmp_path / "store"
    record = SessionRecord("exp/week.ipynb", str(tmp_path / "exp" / "week.ipynb"))
    week = worked_week()
    record.timeline = Timeline.from_json(week["events"])
    record.gpus, record.gpus_needed, record.state = [0], 1, "paused"
    record.timeline.add("last_activity", at=MONDAY + 4 * 24 * H + 17 * H)  # Friday 17:00
    record.timeline.add("pause_requested", at=MONDAY + 168 * H - 60, reason="idle")
    record.timeline.add("gpu_released", at=MONDAY + 168 * H, gpus=[0])
    from jupyter_pause.records import RecordWriter

    RecordWriter(store)._write_file(record.key, json.dumps(record.persisted()).encode(), "x")
    assert [e["path"] for e in sources.read_store(store)] == ["exp/week.ipynb"]

    # When the report reads that store, with prices given on the command line
    out = tmp_path / "out"
    code, stdout, err = await jp(
        "report",
        "--store",
        str(store),
        "--since",
        "all",
        "--out",
        str(out),
        "--gpu-hour-price",
        "3",
        discover=True,
    )

    # Then its Markdown tells the allocated and worked hours, and the folder has the charts
    assert code == 0, err
    assert "**168.0 GPU hours allocated, 40.0 worked** (24 %)" in stdout
    assert f"store {store}" in stdout
    assert "| GPUs allocated | 504.00 |" in stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu-hours-per-day.png",
        "idle-threshold-study.png",
        "report.json",
        "report.md",
    ]
    saved = json.loads((out / "report.json").read_text())
    assert saved["totals"]["gpu_hours_allocated"] == 168.0


def paused_without_gpu(cycles: int, start: float = MONDAY) -> dict[str, Any]:
    """A kernel on a machine without a GPU, paused and resumed ``cycles`` times (an hour each)."""
    events = []
    for cycle in range(cycles):
        at = start + cycle * 2 * H
        events += [
            ev("last_activity", at),
            ev("pause_requested", at + 60, reason="toolbar"),
            ev("checkpoint_written", at + 61, bytes_written=1000),
            ev("kernel_stopped", at + 62),
            ev("gpu_released", at + 62, measured=False, gpus=[]),
            ev("resume_requested", at + H),
            ev("resources_acquired", at + H + 1, gpus=[]),
            ev("state_restored", at + H + 2, how="files", restored=["x"], failed={}),
            ev("kernel_ready", at + H + 3),
        ]
    return {**worked_week(), "path": "cpu.ipynb", "gpus_needed": 0, "events": events}


def test_pauses_are_counted_as_the_timeline_counts_them_also_without_a_gpu() -> None:
    # Given a notebook on a machine without a GPU, paused and resumed five times
    notebook = paused_without_gpu(5)
    data = listing(notebook, now=MONDAY + 24 * H)

    # When the report is built
    numbers = report.build(data, since_seconds=None)

    # Then it counts five pauses and five resumes, as the notebook's timeline does
    accounting = Timeline.from_json(notebook["events"]).accounting(gpus=0, busy_seconds=0)
    assert (accounting.pauses, accounting.resumes) == (5, 5)
    (row,) = numbers["groups"]
    assert (row["pauses"], row["resumes"]) == (5, 5)
    assert (numbers["pauses"], numbers["resumes"]) == (5, 5)
    # and says plainly what it counts; no GPU time was held, none released
    text = render.markdown(numbers, "test", [])
    assert "| cpu.ipynb | 0.00 | 0.00 | 0.00 | 0.00 | 5 | 5 | 0 B |" in text
    assert "Pauses (5) and resumes (5) are requests, counted as `jupyter pause timeline`" in text
    assert "No pause has been recorded yet" not in text
    # a window that starts after the third cycle holds the last two pauses
    since_third = report.build(data, since_seconds=24 * H - 5 * H)
    assert since_third["groups"][0]["pauses"] == 2 and since_third["pauses_recorded"] == 5


def test_pauses_from_outside_jupyter_pause_are_counted_and_said_apart() -> None:
    # Given five pauses: the second from the dashboard (origin outside), the fourth the
    # platform's own stop of the pod (SIGTERM), the others from the toolbar
    notebook = paused_without_gpu(5)
    origins = iter(["user", "outside", "user", "platform", "user"])
    for event in notebook["events"]:
        if event["kind"] == "pause_requested":
            event["data"]["origin"] = next(origins)
    data = listing(notebook, now=MONDAY + 24 * H)

    # When the report is built, over everything and over the last two cycles
    numbers = report.build(data, since_seconds=None)
    since_third = report.build(data, since_seconds=24 * H - 5 * H)

    # Then all five are pauses, two of them from outside jupyter_pause, and the text says so
    assert (numbers["pauses"], numbers["pauses_outside"]) == (5, 2)
    assert (since_third["pauses"], since_third["pauses_outside"]) == (2, 1)
    text = render.markdown(numbers, "test", [])
    assert "2 of the pauses came from outside jupyter_pause (the dashboard, kubectl" in text


def restored(how: str, at: float, **proof: Any) -> list[dict[str, Any]]:
    """One pause and resume ending in a ``state_restored`` event saying ``how``."""
    return [
        ev("pause_requested", at, reason="toolbar"),
        ev("kernel_stopped", at + 1),
        ev("resume_requested", at + 10),
        ev("state_restored", at + 11, how=how, restored=["x"], failed={}, **proof),
        ev("kernel_ready", at + 12),
    ]


def test_a_restore_counts_as_live_only_when_the_token_recorded_at_the_pause_matched() -> None:
    # Given restores the timeline calls live: one proven (the token recorded at the pause
    # matched), one written before that check existed, one whose token did not match
    events = [
        *restored("live", MONDAY, token_matched=True),
        *restored("live", MONDAY + H),
        *restored("live", MONDAY + 2 * H, token_matched=False),
        *restored("files", MONDAY + 3 * H),
    ]
    notebook = {**worked_week(), "path": "lab.ipynb", "gpus_needed": 0, "events": events}

    # When the report is built
    numbers = report.build(listing(notebook, now=MONDAY + 5 * H), since_seconds=None)

    # Then only the proven one is live; the others are counted apart, never as live
    assert numbers["restores"] == {
        "live": 1,
        "live not proven": 2,
        "files": 1,
        "partial": 0,
        "failed": 0,
        "in flight": 0,
    }
    text = render.markdown(numbers, "test", [])
    assert (
        "Restores: 1 live (the same process: its token matched the one recorded at the pause)"
        in text
    )
    assert ", 2 live, not proven (recorded before this check: " in text


async def test_a_report_before_any_pause_is_empty_and_says_so(tmp_path: Path) -> None:
    # Given no server running and no checkpoint store yet (nothing was ever paused here)
    no_server = Cli("http://127.0.0.1:9", "-", tmp_path / "runtime")
    store = tmp_path / "never-made"

    # When the report is asked for
    code, stdout, stderr = await no_server(
        "report", "--out", str(tmp_path / "out"), discover=True, JUPYTER_PAUSE_STORE=str(store)
    )

    # Then it prints an empty report that says no pause has been recorded yet, and exits 0
    assert code == 0, stderr
    assert "**No pause has been recorded yet.**" in stdout
    assert f"no store at {store} yet (the first checkpoint makes it); 0 notebooks" in stdout
    assert "reading the store instead" in stderr
    assert not store.exists()  # a report never makes a store
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (saved["notebooks"], saved["pauses"], saved["pauses_recorded"]) == (0, 0, 0)


def test_the_idle_threshold_chart_of_nothing_runs_from_0_to_1_and_says_why() -> None:
    from jupyter_pause.markdown import pyplot

    plt = pyplot()
    # Given a report without any idle gap, and one of a worked week
    empty = report.build(listing(now=MONDAY), since_seconds=None)
    week = report.build(listing(worked_week(), now=MONDAY + 168 * H), since_seconds=None)

    # When their idle-threshold charts are drawn
    empty_figure = render.study_figure(empty, plt)
    week_figure = render.study_figure(week, plt)
    try:
        # Then the empty one's axes run from 0 to 1 and it says there is nothing yet
        assert [axes.get_ylim() for axes in empty_figure.axes] == [(0.0, 1.0), (0.0, 1.0)]
        assert [t.get_text() for t in empty_figure.axes[0].texts] == ["no idle gaps yet"]
        # and the week's start at 0 and reach its 127.5 GPU hours released at 5 min
        released_axes = week_figure.axes[0]
        assert released_axes.get_ylim()[0] == 0.0 and released_axes.get_ylim()[1] > 127.5
        assert list(released_axes.texts) == []
    finally:
        plt.close(empty_figure)
        plt.close(week_figure)
