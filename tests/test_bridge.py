"""How the kernel watcher reads iopub: what counts as the user's activity and as busy."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jupyter_pause.records import KernelActivity
from jupyter_pause.server.kernel_bridge import KernelBridge, KernelCallError

from .servers import Server


def status(state: str, session: str, parent_type: str = "execute_request") -> dict[str, Any]:
    return {
        "msg_type": "status",
        "content": {"execution_state": state},
        "parent_header": {"session": session, "msg_type": parent_type},
    }


async def feed(bridge: KernelBridge, activity: KernelActivity, *messages: dict) -> list:
    events: list = []

    async def on_event(kind: str, data: dict) -> None:
        events.append((kind, data))

    for message in messages:
        await bridge._on_iopub(message, activity, on_event)
    return events


async def test_our_requests_are_not_activity_but_end_an_inferred_busy() -> None:
    bridge = KernelBridge(kernel_manager=None)
    bridge._own_sessions.add("server")
    activity = KernelActivity()
    # Our own silent request: neither busy nor activity
    await feed(bridge, activity, status("busy", "server"), status("idle", "server"))
    assert not activity.busy and activity.last_activity == 0.0

    # Attached while the kernel ran our restore: busy was inferred; our idle ends it
    activity.busy, activity.busy_since = True, 1.0
    await feed(bridge, activity, status("idle", "server"))
    assert not activity.busy

    # A user cell: busy until its idle, then activity with the time spent
    await feed(bridge, activity, status("busy", "browser"))
    assert activity.busy
    # a debugger request on the control channel while the cell runs changes nothing
    await feed(bridge, activity, status("idle", "browser", parent_type="debug_request"))
    assert activity.busy
    await feed(bridge, activity, status("idle", "browser"))
    assert not activity.busy and activity.last_activity > 0 and activity.busy_seconds >= 0


async def test_cells_and_pause_requests_are_reported() -> None:
    bridge = KernelBridge(kernel_manager=None)
    activity = KernelActivity()
    events = await feed(
        bridge,
        activity,
        {
            "msg_type": "execute_input",
            "content": {"execution_count": 7},
            "parent_header": {"session": "browser"},
        },
        {
            "msg_type": "jupyter_pause_request",
            "content": {"action": "pause"},
            "parent_header": {"session": "browser"},
        },
    )
    # the cell says since when the kernel had been idle (here: never active before)
    assert events == [
        ("cell", {"execution_count": 7, "idle_since": 0.0}),
        ("request", {"action": "pause"}),
    ]
    assert activity.execution_count == 7 and activity.cells_executed == 1


def test_timeline_keeps_events_in_time_order_and_sums_gpu_time() -> None:
    from jupyter_pause.timeline import Timeline

    timeline = Timeline()
    timeline.add("gpu_acquired", at=100.0)
    timeline.add("pause_requested", at=200.0)
    timeline.add("last_activity", at=150.0)  # known only when the pause comes
    timeline.add("gpu_released", at=210.0)
    timeline.add("resume_requested", at=1000.0)
    timeline.add("resources_acquired", at=1010.0)
    timeline.add("kernel_ready", at=1015.0)
    timeline.add("first_cell_executed", at=1060.0)
    assert [e.kind for e in timeline.events][:3] == [
        "gpu_acquired",
        "last_activity",
        "pause_requested",
    ]
    accounting = timeline.accounting(gpus=2, busy_seconds=30.0, now=1110.0)
    assert accounting.gpu_seconds_allocated == 2 * (110.0 + 100.0)
    assert accounting.gpu_seconds_released == 2 * 800.0
    assert accounting.gpu_seconds_active == 2 * 30.0
    assert accounting.last_resume_to_ready_seconds == 15.0
    assert accounting.last_resume_to_next_cell_seconds == 60.0


def test_only_idle_gaps_long_enough_for_an_idle_policy_are_recorded() -> None:
    from jupyter_pause.timeline import IDLE_GAP_MIN_SECONDS, Timeline

    timeline = Timeline()
    # a 4-minute pause between cells is work; a 5-minute one is an idle gap
    assert timeline.add_idle_gap(1000.0, now=1000.0 + IDLE_GAP_MIN_SECONDS - 60) is None
    gap = timeline.add_idle_gap(2000.0, now=2000.0 + IDLE_GAP_MIN_SECONDS)
    assert gap is not None and (gap.kind, gap.at) == ("idle_gap", 2000.0)
    assert gap.data == {"seconds": IDLE_GAP_MIN_SECONDS}
    # a kernel never active (no activity time) has no gap to record
    assert timeline.add_idle_gap(0.0, now=5000.0) is None
    assert [e.kind for e in timeline.events] == ["idle_gap"]


async def test_a_kernel_shut_down_after_our_request_leaves_no_activity_to_take_back(
    server: Server,
) -> None:
    """A pause shuts the kernel down right after the server's last request to it; taking back
    the activity that request added then finds no kernel (jupyter-server answers HTTPError 404
    for it, not KeyError) and must do nothing, and a new request says the kernel is gone."""
    # Given a watched kernel the server has just asked something
    kernel_id = await server.open_notebook("gone.ipynb")
    await server.watched("gone.ipynb")
    bridge = server.orchestrator.bridge
    before = server.app.kernel_manager.get_kernel(kernel_id).last_activity
    asked_at = time.time()
    answer = await bridge.call(kernel_id, "hello", timeout=60)
    assert answer["ok"]
    # When the kernel is shut down before the take-back runs
    await server.app.kernel_manager.shutdown_kernel(kernel_id)
    assert kernel_id not in server.app.kernel_manager
    # Then the take-back is a no-op and a further request fails in words, not with a 404
    assert bridge._forget_own_activity(kernel_id, before, asked_at) is None
    with pytest.raises(KernelCallError, match="is not running"):
        await bridge.call(kernel_id, "hello", timeout=60)
